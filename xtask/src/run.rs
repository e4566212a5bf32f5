//! `cargo xtask run`: set up, build vmtrace in release mode and run it.
//!
//! Without arguments it runs the project's main job, `vmtrace top`, so that `cargo xtask run` on
//! a fresh machine shows vmalloc live. Where live capture cannot work (not root, no BPF) it says
//! so and `vmtrace top` replays the bundled sample trace under a banner giving the reason, so
//! the command still shows something real. When stdout is not a terminal, top prints a few text
//! screens (`top -b`) and exits, so scripts and CI logs get a bounded output.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::cmd::{self, banner, is_root};
use crate::setup::setup;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Arguments for vmtrace, e.g. `cargo xtask run -- record -o t.jsonl --duration 5s`.
    /// Without any, runs `vmtrace top`: live (root with BPF), or a replay of the bundled sample
    /// trace with a banner saying why (otherwise).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub args: Vec<String>,
}

pub fn run(args: &RunArgs) -> Result<ExitCode> {
    setup()?;
    let vmtrace = build_release()?;
    if !args.args.is_empty() {
        banner(&format!("vmtrace {}", args.args.join(" ")));
        return exit_code(Command::new(&vmtrace).args(&args.args));
    }
    top(&vmtrace, live_capture_unavailable())
}

/// Screens printed by `vmtrace top -b` when `cargo xtask run` is not on a terminal.
const BATCH_SCREENS: &str = "3";

/// Runs `vmtrace top`, live or (with `unavailable`) on the bundled trace.
fn top(vmtrace: &Path, unavailable: Option<String>) -> Result<ExitCode> {
    use std::io::IsTerminal as _;
    let mut cmd = Command::new(vmtrace);
    cmd.arg("top");
    match &unavailable {
        None => banner("vmtrace top (live; q quits)"),
        Some(reason) => {
            banner(&format!(
                "{reason}: vmtrace top replays the bundled trace (try `sudo cargo xtask run`)"
            ));
            // No --replay: top finds out itself that probes cannot attach and shows the
            // kernel's own reason in its banner, over the trace built into the binary.
        }
    }
    if !std::io::stdout().is_terminal() {
        cmd.args(["--batch", "--iterations", BATCH_SCREENS, "--interval", "1s"]);
    }
    exit_code(&mut cmd)
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
