//! Small helpers shared by the tasks: where the workspace is, who we run as, and running
//! commands so that the user sees exactly what was run and why it failed.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context as _, Result};
use serde::Deserialize;

/// The workspace root: xtask lives one level below it. Taken from the compile-time manifest
/// directory so that `cargo xtask` works from any subdirectory.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| manifest_dir.to_path_buf())
}

/// Whether we run with euid 0. Root decides whether setup may install packages and whether the
/// privileged tests must pass rather than skip.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `cargo` through the rustup proxy on PATH, started in the workspace root. The proxy honours
/// the RUSTUP_TOOLCHAIN that `cargo xtask` itself was started with, so nested builds use the
/// same toolchain as the xtask.
pub fn cargo() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(workspace_root());
    cmd
}

/// `$XDG_CACHE_HOME/vmtrace/SUB`, or `~/.cache/vmtrace/SUB`: outside the repository, so a clean
/// clone and `cargo clean` keep what the tasks fetched or recorded there.
pub fn cache_dir(sub: &str) -> PathBuf {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("HOME")
            .map_or_else(|| PathBuf::from("/root"), PathBuf::from)
            .join(".cache"),
    };
    base.join("vmtrace").join(sub)
}

/// Prints a step banner, so a long log can be scanned for where each step starts.
pub fn banner(title: &str) {
    println!();
    println!("==> {title}");
}

/// Renders a command as a shell would read it, with the environment it sets explicitly, so a
/// failing step can be re-run by hand.
pub fn display(cmd: &Command) -> String {
    let mut parts = Vec::new();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            parts.push(format!("{}={}", key.to_string_lossy(), quote(value)));
        }
    }
    parts.push(quote(cmd.get_program()));
    parts.extend(cmd.get_args().map(quote));
    let mut line = parts.join(" ");
    if let Some(dir) = cmd.get_current_dir() {
        if dir != workspace_root() {
            line = format!("(cd {} && {line})", quote(dir.as_os_str()));
        }
    }
    line
}

fn quote(s: &OsStr) -> String {
    let s = s.to_string_lossy();
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Runs a command with inherited stdio after echoing it, and fails when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = display(cmd);
    println!("$ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs a command quietly and returns its stdout; on failure the error carries its stderr.
pub fn stdout_of(cmd: &mut Command) -> Result<String> {
    let out = output_of(cmd)?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            display(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{}` printed non-UTF-8", display(cmd)))
}

/// Runs a command quietly and returns everything it produced, whatever its exit status.
pub fn output_of(cmd: &mut Command) -> Result<Output> {
    cmd.output()
        .with_context(|| format!("cannot start `{}`", display(cmd)))
}

/// Where `program` would be found on PATH, if anywhere.
pub fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// The part of `cargo metadata` the tasks need.
#[derive(Debug, Deserialize)]
pub struct Metadata {
    pub target_directory: PathBuf,
    pub packages: Vec<Package>,
    /// Package ids of `default-members`: the user-space crates. The eBPF crate is not among
    /// them because it only builds for `bpfel-unknown-none`.
    pub workspace_default_members: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct Package {
    pub id: String,
    pub name: String,
    pub targets: Vec<Target>,
}

#[derive(Debug, Deserialize)]
pub struct Target {
    pub name: String,
    pub kind: Vec<String>,
}

impl Metadata {
    /// The packages `cargo build` and `cargo test` act on when given no package flags.
    pub fn default_members(&self) -> impl Iterator<Item = &Package> {
        self.packages
            .iter()
            .filter(|p| self.workspace_default_members.contains(&p.id))
    }
}

/// Reads the workspace layout from `cargo metadata`, which also resolves CARGO_TARGET_DIR and
/// `build.target-dir`, so the tasks find binaries wherever cargo put them.
pub fn metadata() -> Result<Metadata> {
    let json = stdout_of(cargo().args(["metadata", "--format-version", "1", "--no-deps"]))?;
    serde_json::from_str(&json).context("cannot parse the output of `cargo metadata`")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_quotes_only_what_needs_it() {
        let mut cmd = Command::new("bpftrace");
        cmd.args(["-e", "tracepoint:vmalloc:* { @[probe] = count(); }"])
            .env("LLVM_PREFIX", "/x/llvm");
        assert_eq!(
            display(&cmd),
            "LLVM_PREFIX=/x/llvm bpftrace -e 'tracepoint:vmalloc:* { @[probe] = count(); }'"
        );
    }

    #[test]
    fn workspace_root_holds_the_workspace_manifest() {
        assert!(workspace_root().join("Cargo.toml").is_file());
        assert!(workspace_root().join("xtask").is_dir());
    }
}
