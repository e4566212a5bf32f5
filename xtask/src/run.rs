//! `cargo xtask run`: set up, build vmtrace in release mode and run it.
//!
//! Without arguments it runs the project's main job, so that `cargo xtask run` on a fresh
//! machine shows vmtrace doing its work: a short live capture of a built-in stress workload and
//! its summary. Where live capture cannot work (not root, no BPF) it says so and summarises the
//! bundled sample trace instead, so the command still shows something real.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::cmd::{self, banner, is_root};
use crate::setup::setup;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Arguments for vmtrace, e.g. `cargo xtask run -- record -o t.jsonl --duration 5s`.
    /// Without any, runs the demo job: a 10 s live capture of `vmtrace stress fix-size` and its
    /// summary (root), or a summary of the bundled sample trace (otherwise).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub args: Vec<String>,
}

/// The bundled trace that the demo summarises when it cannot record live.
const SAMPLE_TRACE: &str = "vmtrace/assets/sample-trace.jsonl";

pub fn run(args: &RunArgs) -> Result<ExitCode> {
    setup()?;
    let vmtrace = build_release()?;
    if !args.args.is_empty() {
        banner(&format!("vmtrace {}", args.args.join(" ")));
        return exit_code(Command::new(&vmtrace).args(&args.args));
    }
    match live_capture_unavailable() {
        None => demo_live(&vmtrace),
        Some(reason) => demo_sample(&vmtrace, &reason),
    }
}

/// Builds the vmtrace binary in release mode (this also builds the eBPF probes through
/// aya-build) and returns its path.
pub fn build_release() -> Result<PathBuf> {
    banner("build vmtrace (release)");
    cmd::run(cmd::cargo().args(["build", "--release", "--package", "vmtrace"]))?;
    let bin = cmd::metadata()?.target_directory.join("release/vmtrace");
    if !bin.is_file() {
        bail!("the build succeeded but {} does not exist", bin.display());
    }
    Ok(bin)
}

/// Why a live capture cannot work here, or `None` when it can: it needs root (CAP_BPF and
/// CAP_PERFMON in practice) and a kernel with BPF.
fn live_capture_unavailable() -> Option<String> {
    if !is_root() {
        return Some("not root".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() && !Path::new("/sys/fs/bpf").exists() {
        return Some(
            "this kernel has neither BTF (/sys/kernel/btf/vmlinux) nor bpffs (/sys/fs/bpf)".into(),
        );
    }
    None
}

fn demo_live(vmtrace: &Path) -> Result<ExitCode> {
    let trace = cmd::metadata()?.target_directory.join("vmtrace-demo.jsonl");
    banner(&format!(
        "live capture: 10 s of vmalloc events while `vmtrace stress fix-size` runs, into {}",
        trace.display()
    ));
    let mut record = Command::new(vmtrace);
    record
        .args(["record", "-o"])
        .arg(&trace)
        .args(["--duration", "10s", "--"])
        .arg(vmtrace)
        .args(["stress", "fix-size", "--pages", "16", "--duration", "3s"]);
    let code = status_of(&mut record)?;
    if code != 0 {
        return Ok(ExitCode::from(code));
    }
    banner(&format!("summary of {}", trace.display()));
    exit_code(Command::new(vmtrace).arg("summary").arg(&trace))
}

fn demo_sample(vmtrace: &Path, reason: &str) -> Result<ExitCode> {
    let sample = cmd::workspace_root().join(SAMPLE_TRACE);
    let rule = "*".repeat(78);
    println!();
    println!("{rule}");
    println!("*  {reason}: playing the bundled trace instead");
    println!("*  (a live capture needs root and a kernel with BPF; try `sudo cargo xtask run`)");
    println!("{rule}");
    if !sample.is_file() {
        bail!(
            "the bundled trace {} is missing, so there is nothing to show without a live capture",
            sample.display()
        );
    }
    banner(&format!("summary of {SAMPLE_TRACE}"));
    exit_code(Command::new(vmtrace).arg("summary").arg(&sample))
}

/// Runs vmtrace and hands its exit status on, so `cargo xtask run -- ...` can be scripted like
/// vmtrace itself.
fn exit_code(cmd: &mut Command) -> Result<ExitCode> {
    status_of(cmd).map(ExitCode::from)
}

/// Runs a command with inherited stdio and returns its exit status as a shell would see it
/// (128 + signal number when a signal killed it).
fn status_of(cmd: &mut Command) -> Result<u8> {
    use std::os::unix::process::ExitStatusExt as _;
    let line = cmd::display(cmd);
    println!("$ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{line}`"))?;
    let code = match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    };
    Ok(u8::try_from(code).unwrap_or(1))
}
