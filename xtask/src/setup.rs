//! `cargo xtask setup`: make this machine able to build, lint and test vmtrace.
//!
//! Every check is cheap and every install happens only when its check fails, so a second run is
//! a no-op that takes about a second. The recipe for bpf-linker is the one docs/development.md
//! ("What setup installs, and where") describes: build it against the nightly rustc's own
//! libLLVM, found through symlinks in a durable prefix, because the linker must speak the same
//! LLVM as the rustc that produced the bitcode.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::cmd::{self, banner, find_on_path, is_root, output_of, stdout_of};
use crate::elf;

/// The toolchain aya-build compiles the eBPF crate with (`rustup run nightly cargo build`).
const NIGHTLY: &str = "nightly";
/// The bpf-linker release that matches the pinned aya 0.14 line.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Debian packages the tests and benchmarks use, with the reason each is needed.
const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    ("stress-ng", "thread-stack churn workloads"),
    ("bpftrace", "overhead benchmark baseline"),
    ("bpftool", "inspecting loaded probes"),
    ("linux-perf", "overhead benchmark baseline (perf record)"),
    ("tmux", "driving the TUI in tests"),
    ("jq", "checking JSON output in scripts"),
    ("util-linux", "setpriv, for the unprivileged-run tests"),
    ("prometheus", "promtool, for the exporter tests"),
    (
        "qemu-system-x86",
        "the test box guest (cargo xtask testbox)",
    ),
    ("busybox-static", "the test box guest's userland"),
    ("cpio", "packing the test box initramfs"),
    ("xz-utils", "unpacking the test box kernel's modules"),
    (
        "debootstrap",
        "the build root for the test box's test_vmalloc module",
    ),
];

/// Runs every setup check, installing whatever is missing.
pub fn setup() -> Result<()> {
    banner("setup");
    let sysroot = ensure_nightly()?;
    ensure_host_components()?;
    ensure_bpf_linker(&sysroot)?;
    ensure_debian_packages()?;
    ensure_tracefs();
    Ok(())
}

fn rustup() -> Command {
    Command::new("rustup")
}

/// Component names as `rustup component list --installed` prints them, target suffix removed
/// (`clippy-x86_64-unknown-linux-gnu` becomes `clippy`), so they compare with what we need.
fn installed_components(listing: &str) -> Vec<String> {
    listing
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(
            |l| match l.find("-x86_64-").or_else(|| l.find("-aarch64-")) {
                Some(i) => l[..i].to_string(),
                None => l.to_string(),
            },
        )
        .collect()
}

/// Ensures the nightly toolchain exists with rust-src (for `-Z build-std=core`) and clippy (to
/// lint the eBPF crate), and returns its sysroot.
fn ensure_nightly() -> Result<PathBuf> {
    let listing =
        output_of(rustup().args(["component", "list", "--toolchain", NIGHTLY, "--installed"]))
            .context(
            "rustup is needed to manage the nightly toolchain; install it from https://rustup.rs",
        )?;
    if listing.status.success() {
        let have = installed_components(&String::from_utf8_lossy(&listing.stdout));
        let missing: Vec<&str> = ["rust-src", "clippy"]
            .into_iter()
            .filter(|c| !have.iter().any(|h| h == c))
            .collect();
        for c in ["rust-src", "clippy"] {
            let state = if missing.contains(&c) {
                "missing, installing"
            } else {
                "present"
            };
            println!("{NIGHTLY} {c}: {state}");
        }
        if !missing.is_empty() {
            let mut cmd = rustup();
            cmd.args(["component", "add"])
                .args(&missing)
                .args(["--toolchain", NIGHTLY]);
            cmd::run(&mut cmd)?;
        }
    } else {
        println!("{NIGHTLY} toolchain: missing, installing");
        cmd::run(rustup().args([
            "toolchain",
            "install",
            NIGHTLY,
            "--profile",
            "minimal",
            "--component",
            "rust-src,clippy",
        ]))?;
    }
    let sysroot = stdout_of(Command::new("rustc").args([
        format!("+{NIGHTLY}").as_str(),
        "--print",
        "sysroot",
    ]))?;
    Ok(PathBuf::from(sysroot.trim()))
}

/// Ensures the toolchain running the xtask (normally stable) has rustfmt and clippy, which
/// `cargo xtask test` runs on the user-space crates.
fn ensure_host_components() -> Result<()> {
    let toolchain =
        std::env::var("RUSTUP_TOOLCHAIN").unwrap_or_else(|_| "default toolchain".into());
    let listing = stdout_of(
        rustup()
            .args(["component", "list", "--installed"])
            .current_dir(cmd::workspace_root()),
    )?;
    let have = installed_components(&listing);
    let missing: Vec<&str> = ["rustfmt", "clippy"]
        .into_iter()
        .filter(|c| !have.iter().any(|h| h == c))
        .collect();
    if missing.is_empty() {
        println!("{toolchain} rustfmt, clippy: present");
        return Ok(());
    }
    println!("{toolchain} {}: missing, installing", missing.join(", "));
    let mut cmd = rustup();
    cmd.args(["component", "add"])
        .args(&missing)
        .current_dir(cmd::workspace_root());
    cmd::run(&mut cmd)
}

/// The libLLVM shared objects a nightly toolchain ships, and their LLVM major version.
#[derive(Debug)]
struct NightlyLlvm {
    /// `<sysroot>/lib/libLLVM.so.*`, sorted; in practice exactly one.
    libs: Vec<PathBuf>,
    major: u32,
}

/// `libLLVM.so.22.1-rust-1.97.0-nightly` → 22. bpf-linker selects its LLVM with a cargo
/// feature named after the major version, so it comes from the file name rather than a
/// hard-coded value that a nightly update would silently invalidate.
fn llvm_major(file_name: &str) -> Option<u32> {
    let rest = file_name.strip_prefix("libLLVM.so.")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn nightly_llvm(sysroot: &Path) -> Result<NightlyLlvm> {
    let lib_dir = sysroot.join("lib");
    let mut libs = Vec::new();
    for entry in
        fs::read_dir(&lib_dir).with_context(|| format!("cannot list {}", lib_dir.display()))?
    {
        let entry = entry.with_context(|| format!("cannot list {}", lib_dir.display()))?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("libLLVM.so.")
        {
            libs.push(entry.path());
        }
    }
    libs.sort();
    let first = libs.first().with_context(|| {
        format!(
            "the {NIGHTLY} toolchain ships no libLLVM.so.* in {}, so bpf-linker cannot be built against its LLVM",
            lib_dir.display()
        )
    })?;
    let name = file_name(first);
    let major = llvm_major(&name)
        .with_context(|| format!("cannot read the LLVM major version from `{name}`"))?;
    Ok(NightlyLlvm { libs, major })
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `$XDG_DATA_HOME/vmtrace/llvm`, by default `~/.local/share/vmtrace/llvm`. bpf-linker's rpath
/// points here, so it must outlive the build (a temporary directory would break the linker
/// once cleaned).
fn llvm_prefix() -> Result<PathBuf> {
    let data_home = match std::env::var_os("XDG_DATA_HOME").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir,
        _ => {
            PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".local/share")
        }
    };
    Ok(data_home.join("vmtrace/llvm"))
}

/// Where `cargo install` puts binaries: $CARGO_INSTALL_ROOT/bin, else $CARGO_HOME/bin, else
/// ~/.cargo/bin.
pub fn install_bin_dir() -> Result<PathBuf> {
    if let Some(root) = std::env::var_os("CARGO_INSTALL_ROOT") {
        return Ok(PathBuf::from(root).join("bin"));
    }
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        return Ok(PathBuf::from(home).join("bin"));
    }
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cargo/bin"))
}

/// What is wrong with the prefix's symlinks, if anything: each must point at the current
/// nightly's libLLVM, and no link to another (older, maybe deleted) LLVM may remain.
fn prefix_problems(lib_dir: &Path, llvm: &NightlyLlvm) -> Vec<String> {
    let mut problems = Vec::new();
    let mut wanted: Vec<(PathBuf, &Path)> = llvm
        .libs
        .iter()
        .map(|lib| (lib_dir.join(file_name(lib)), lib.as_path()))
        .collect();
    if let Some(last) = llvm.libs.last() {
        wanted.push((lib_dir.join("libLLVM.so"), last.as_path()));
    }
    for (link, target) in &wanted {
        match fs::read_link(link) {
            Ok(actual) if actual == *target && target.exists() => {}
            Ok(actual) => problems.push(format!(
                "{} points at {}, not at {}",
                link.display(),
                actual.display(),
                target.display()
            )),
            Err(_) => problems.push(format!("{} is missing", link.display())),
        }
    }
    if let Ok(entries) = fs::read_dir(lib_dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if file_name(&path).starts_with("libLLVM") && !wanted.iter().any(|(l, _)| *l == path) {
                problems.push(format!("{} is left from another LLVM", path.display()));
            }
        }
    }
    problems
}

/// Recreates the prefix's symlinks for the current nightly, removing stale ones. Only symlinks
/// are removed: a regular file there was not put there by us.
fn fix_prefix(lib_dir: &Path, llvm: &NightlyLlvm) -> Result<()> {
    fs::create_dir_all(lib_dir).with_context(|| format!("cannot create {}", lib_dir.display()))?;
    for entry in
        fs::read_dir(lib_dir).with_context(|| format!("cannot list {}", lib_dir.display()))?
    {
        let path = entry
            .with_context(|| format!("cannot list {}", lib_dir.display()))?
            .path();
        if !file_name(&path).starts_with("libLLVM") {
            continue;
        }
        let meta = fs::symlink_metadata(&path)
            .with_context(|| format!("cannot stat {}", path.display()))?;
        if !meta.file_type().is_symlink() {
            bail!(
                "{} is a regular file, not a symlink made by setup; remove it and rerun",
                path.display()
            );
        }
        fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    }
    for lib in &llvm.libs {
        for name in [file_name(lib), "libLLVM.so".to_string()] {
            let link = lib_dir.join(&name);
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(lib, &link)
                .with_context(|| format!("cannot link {} to {}", link.display(), lib.display()))?;
        }
    }
    Ok(())
}

/// What is wrong with the installed bpf-linker, if anything: it must exist, run, report the
/// pinned version, need the current nightly's libLLVM and load it from the durable prefix.
fn linker_problems(bin: &Path, lib_dir: &Path, llvm: &NightlyLlvm) -> Vec<String> {
    if !bin.is_file() {
        return vec![format!("not installed at {}", bin.display())];
    }
    let mut problems = Vec::new();
    match Command::new(bin).arg("--version").output() {
        Err(err) => problems.push(format!("cannot be started: {err}")),
        Ok(out) if !out.status.success() => problems.push(format!(
            "`bpf-linker --version` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(out) => {
            let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if version != format!("bpf-linker {BPF_LINKER_VERSION}") {
                problems.push(format!("version is `{version}`, want {BPF_LINKER_VERSION}"));
            }
        }
    }
    match fs::read(bin)
        .map_err(anyhow::Error::from)
        .and_then(|image| elf::dynamic_info(&image))
    {
        Err(err) => problems.push(format!("cannot read its dynamic section: {err:#}")),
        Ok(info) => {
            let wanted: Vec<String> = llvm.libs.iter().map(|l| file_name(l)).collect();
            let linked: Vec<&String> = info
                .needed
                .iter()
                .filter(|n| n.starts_with("libLLVM"))
                .collect();
            if !linked.iter().any(|n| wanted.contains(n)) {
                problems.push(format!(
                    "linked against {linked:?}, but {NIGHTLY} ships {wanted:?}"
                ));
            }
            let lib_dir = lib_dir.to_string_lossy();
            if !info.search_path.iter().any(|p| *p == lib_dir) {
                problems.push(format!(
                    "loads LLVM from {:?}, not from {lib_dir}",
                    info.search_path
                ));
            }
        }
    }
    problems
}

/// Ensures bpf-linker 0.13.0, built against the nightly rustc's own LLVM, is installed, and
/// that the binary aya-build will find on PATH is that one.
fn ensure_bpf_linker(sysroot: &Path) -> Result<()> {
    let llvm = nightly_llvm(sysroot)?;
    let prefix = llvm_prefix()?;
    let lib_dir = prefix.join("lib");
    let bin_dir = install_bin_dir()?;
    let bin = bin_dir.join("bpf-linker");
    let label = format!("bpf-linker {BPF_LINKER_VERSION} (LLVM {})", llvm.major);

    let prefix_issues = prefix_problems(&lib_dir, &llvm);
    let mut issues = prefix_issues.clone();
    if prefix_issues.is_empty() {
        // With broken symlinks the binary is stale by definition; only check it otherwise.
        issues.extend(linker_problems(&bin, &lib_dir, &llvm));
    }
    if issues.is_empty() {
        println!("{label}: present ({})", bin.display());
    } else {
        println!("{label}: needs a (re)build:");
        for issue in &issues {
            println!("    - {issue}");
        }
        fix_prefix(&lib_dir, &llvm)?;
        println!(
            "LLVM prefix {}: links to {}",
            prefix.display(),
            sysroot.join("lib").display()
        );
        let mut install = Command::new("cargo");
        install
            .env("LLVM_PREFIX", &prefix)
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
            .args(["--no-default-features", "--features"])
            .arg(format!("llvm-{}", llvm.major))
            .args(["--locked", "--force"]);
        cmd::run(&mut install).with_context(|| {
            format!(
                "building bpf-linker against LLVM {} failed; does bpf-linker {BPF_LINKER_VERSION} have an `llvm-{}` feature?",
                llvm.major, llvm.major
            )
        })?;
        let remaining = linker_problems(&bin, &lib_dir, &llvm);
        if !remaining.is_empty() {
            bail!(
                "bpf-linker at {} is still not usable after installing it: {}",
                bin.display(),
                remaining.join("; ")
            );
        }
        println!("{label}: installed ({})", bin.display());
    }

    // aya-build finds bpf-linker on PATH. Put the install directory first for everything this
    // xtask starts, and warn when a plain `cargo build` outside it would pick another linker.
    let first_on_path = find_on_path("bpf-linker");
    if first_on_path.as_deref() != Some(bin.as_path()) {
        match &first_on_path {
            Some(other) => println!(
                "warning: `bpf-linker` on PATH is {}, not {}; cargo xtask uses the latter",
                other.display(),
                bin.display()
            ),
            None => println!(
                "note: {} is not on PATH; add it so that plain `cargo build` finds bpf-linker",
                bin_dir.display()
            ),
        }
        prepend_to_path(&bin_dir)?;
    }
    Ok(())
}

/// Puts `dir` first on this process's PATH, which every command the xtask starts inherits.
fn prepend_to_path(dir: &Path) -> Result<()> {
    let old = std::env::var_os("PATH").unwrap_or_default();
    let joined =
        std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&old)))
            .context("cannot add the cargo install directory to PATH")?;
    // Safe to mutate the environment here: the xtask is single-threaded at this point.
    std::env::set_var("PATH", joined);
    Ok(())
}

/// Which of `packages` dpkg reports as installed, from
/// `dpkg-query -W -f='${Package} ${Status}\n'` output.
fn installed_packages(listing: &str) -> Vec<&str> {
    listing
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, status)| status.trim() == "install ok installed")
        .map(|(name, _)| name.split(':').next().unwrap_or(name))
        .collect()
}

/// Ensures the Debian packages the tests use are installed: one `apt-get update` and one
/// `apt-get install` for whatever is missing, and nothing at all when none is.
fn ensure_debian_packages() -> Result<()> {
    let names: Vec<&str> = DEBIAN_PACKAGES.iter().map(|(name, _)| *name).collect();
    let Some(dpkg_query) = find_on_path("dpkg-query") else {
        println!(
            "debian packages: dpkg-query not found (not a Debian system?); install the equivalents of: {}",
            names.join(" ")
        );
        return Ok(());
    };
    // dpkg-query exits non-zero when some package is unknown to dpkg; its stdout still lists
    // the known ones, which is all we need.
    let out = output_of(
        Command::new(dpkg_query)
            .args(["-W", "-f=${Package} ${Status}\\n"])
            .args(&names),
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let installed = installed_packages(&stdout);
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !installed.contains(n))
        .collect();
    if missing.is_empty() {
        println!("debian packages: present ({})", names.join(", "));
        return Ok(());
    }
    for name in &missing {
        let why = DEBIAN_PACKAGES
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, why)| why);
        println!("debian package {name}: missing ({why})");
    }
    if !is_root() {
        println!(
            "warning: not root, so not installing them; run: sudo apt-get install -y --no-install-recommends {}",
            missing.join(" ")
        );
        return Ok(());
    }
    cmd::run(
        Command::new("apt-get")
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    cmd::run(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    println!("debian packages: installed {}", missing.join(", "));
    Ok(())
}

/// Mounts tracefs when it is not mounted: vmtrace reads tracepoint `format` files from it and
/// the tests compare the trace header with it. Failure is only a warning because vmtrace
/// itself explains the problem when it runs.
fn ensure_tracefs() {
    let tracing = Path::new("/sys/kernel/tracing");
    if tracing.join("events").is_dir() {
        println!("tracefs: mounted at {}", tracing.display());
        return;
    }
    if !is_root() {
        println!(
            "warning: tracefs is not mounted; as root run: mount -t tracefs nodev {}",
            tracing.display()
        );
        return;
    }
    println!("tracefs: not mounted, mounting");
    let result = cmd::run(
        Command::new("mount")
            .args(["-t", "tracefs", "nodev"])
            .arg(tracing),
    );
    if let Err(err) = result {
        println!("warning: cannot mount tracefs: {err:#}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_comes_from_the_file_name() {
        assert_eq!(llvm_major("libLLVM.so.22.1-rust-1.97.0-nightly"), Some(22));
        assert_eq!(llvm_major("libLLVM.so.19-rust-1.83.0-nightly"), Some(19));
        assert_eq!(llvm_major("libLLVM-22-rust-1.97.0-nightly.so"), None);
        assert_eq!(llvm_major("libLLVM.so."), None);
    }

    #[test]
    fn component_names_lose_their_target() {
        let listing = "cargo-x86_64-unknown-linux-gnu\nclippy-x86_64-unknown-linux-gnu\nrust-src\n";
        assert_eq!(
            installed_components(listing),
            ["cargo", "clippy", "rust-src"]
        );
    }

    #[test]
    fn only_fully_installed_packages_count() {
        let listing = "jq install ok installed\ntmux deinstall ok config-files\nlibc6:amd64 install ok installed\n";
        assert_eq!(installed_packages(listing), ["jq", "libc6"]);
    }

    #[test]
    fn prefix_links_are_checked_against_the_nightly() {
        let dir = std::env::temp_dir().join(format!("xtask-prefix-test-{}", std::process::id()));
        let sysroot_lib = dir.join("sysroot");
        let lib_dir = dir.join("prefix/lib");
        fs::create_dir_all(&sysroot_lib).expect("mkdir");
        let old = sysroot_lib.join("libLLVM.so.21.1-rust-1.96.0-nightly");
        let new = sysroot_lib.join("libLLVM.so.22.1-rust-1.97.0-nightly");
        fs::write(&new, b"").expect("write fake lib");

        let old_llvm = NightlyLlvm {
            libs: vec![old.clone()],
            major: 21,
        };
        let new_llvm = NightlyLlvm {
            libs: vec![new.clone()],
            major: 22,
        };
        assert!(
            !prefix_problems(&lib_dir, &new_llvm).is_empty(),
            "empty prefix"
        );

        // Links made for an LLVM that is gone are stale, and are replaced cleanly.
        fs::create_dir_all(&lib_dir).expect("mkdir");
        std::os::unix::fs::symlink(&old, lib_dir.join(file_name(&old))).expect("symlink");
        std::os::unix::fs::symlink(&old, lib_dir.join("libLLVM.so")).expect("symlink");
        assert!(
            !prefix_problems(&lib_dir, &old_llvm).is_empty(),
            "dangling links"
        );
        let problems = prefix_problems(&lib_dir, &new_llvm);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("left from another LLVM")),
            "{problems:?}"
        );

        fix_prefix(&lib_dir, &new_llvm).expect("fix prefix");
        assert_eq!(prefix_problems(&lib_dir, &new_llvm), Vec::<String>::new());
        assert!(!lib_dir.join(file_name(&old)).exists());
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
