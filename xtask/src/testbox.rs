//! `cargo xtask testbox`: run a command as root in a virtual machine with another kernel.
//!
//! The machines vmtrace is developed on have one kernel with 2 CPUs, no kprobes and a verifier
//! that refuses fentry, so the richer probe rungs, any vmap node count but 2 and 5-level paging
//! never meet a real kernel there. The test box boots a distribution kernel under QEMU's TCG
//! (KVM guests stop early in boot on these hosts), with a busybox initramfs that carries the
//! host-built `vmtrace`, and runs one command in it. The guest's working directory is a 9p share
//! of a host folder, so whatever the command writes there comes back.
//!
//! Kernels come from Debian's archive through a private apt configuration under the cache
//! folder: nothing is installed on the host, and the host's own apt lists are left alone. The
//! mirror and its key are the ones the host's apt sources already use. After the first run the
//! kernel is cached and a run needs no network.
//!
//! Time inside the guest is emulated: the box is for events, attach rungs, node counts and
//! paging modes, never for calibrating lock costs.

use std::fs;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::cmd::{self, banner, find_on_path, stdout_of};

/// A guest kernel that `--kernel` can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSpec {
    /// The name `--kernel` takes.
    pub name: &'static str,
    /// The Debian suite whose archive holds it.
    pub suite: &'static str,
    /// Binary packages whose name starts with this and ends with `suffix` are candidates; the
    /// one with the highest version is taken.
    prefix: &'static str,
    suffix: &'static str,
}

/// The kernels the box knows. Unsigned images, because the box boots them directly with
/// `-kernel` and signatures only matter to a firmware that checks them.
pub const KERNELS: &[KernelSpec] = &[
    KernelSpec {
        // The node-based vmap allocator (6.9+), with kprobes, fentry and BTF.
        name: "debian-6.12",
        suite: "trixie",
        prefix: "linux-image-6.12.",
        suffix: "+deb13-amd64-unsigned",
    },
    KernelSpec {
        // The global-lock allocator from before the node design; no vmalloc tracepoints.
        name: "debian-6.1",
        suite: "bookworm",
        prefix: "linux-image-6.1.",
        suffix: "-amd64-unsigned",
    },
];

/// Modules the guest needs to mount the host's share; their dependencies (`depends=` in each
/// module's modinfo: netfs on 6.12, virtio and virtio_pci on 6.1, where they are not built in)
/// are found and loaded first. Those a kernel builds in are simply not in its tree.
const SHARE_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p"];
/// The modules, in load order, one name a line, written when the kernel is cached.
const MODULE_ORDER: &str = "modules.order";

/// Markers the guest's init writes into the share; they are removed before each run.
const BOOTED_MARKER: &str = ".testbox-booted";
const STATUS_MARKER: &str = ".testbox-rc";

#[derive(Debug, Args)]
pub struct TestboxArgs {
    /// The guest kernel: debian-6.12 (trixie, the node-based allocator) or debian-6.1
    /// (bookworm, the global-lock allocator).
    #[arg(long, default_value = "debian-6.12", value_parser = kernel_names())]
    pub kernel: String,
    /// Virtual CPUs; the kernel makes one vmap node per possible CPU (up to its limit).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub cpus: u32,
    /// Guest memory, as QEMU's -m takes it.
    #[arg(long, default_value = "2G")]
    pub mem: String,
    /// Paging mode: 5 offers LA57 to the guest (5-level page tables, the VMALLOC range at
    /// 0xff..), 4 hides it (the 0xffffc9.. range).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(4..=5))]
    pub paging: u8,
    /// Host folder shared with the guest as its working directory; files the command writes
    /// there come back. Default: target/testbox/out.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Where the guest's kernel console log goes. Default: target/testbox/console.log.
    #[arg(long, value_name = "FILE")]
    pub console: Option<PathBuf>,
    /// Seconds the guest may take to reach its init before it is killed.
    #[arg(long, default_value_t = 180)]
    pub boot_timeout: u64,
    /// Seconds the whole run (boot and command) may take before the guest is killed.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Use this vmtrace binary instead of building one (release) from the workspace.
    #[arg(long, value_name = "PATH")]
    pub vmtrace: Option<PathBuf>,
    /// More executables to put on the guest's PATH (with the shared libraries they need).
    #[arg(long = "bin", value_name = "PATH")]
    pub bins: Vec<PathBuf>,
    /// Build the kernel's own `lib/test_vmalloc.c` for the guest kernel (once; cached) and put
    /// it in the guest as /lib/test_vmalloc.ko, to load as test_vmalloc.sh does:
    /// `insmod /lib/test_vmalloc.ko run_test_mask=7 nr_threads=4`. Needs root (chroot).
    #[arg(long)]
    pub test_vmalloc: bool,
    /// Extra kernel command-line arguments.
    #[arg(long, default_value = "")]
    pub append: String,
    /// The command to run in the guest, as root, in the shared folder; it is handed to the
    /// guest's shell as words. Default: `vmtrace probes`.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
}

fn kernel_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(KERNELS.iter().map(|k| k.name))
}

pub fn testbox(args: &TestboxArgs) -> Result<ExitCode> {
    let spec = KERNELS
        .iter()
        .find(|k| k.name == args.kernel)
        .copied()
        .context("unknown kernel")?;
    ensure_host_tools()?;
    let kernel = ensure_kernel(&spec)?;
    let vmtrace = match &args.vmtrace {
        Some(path) => path.clone(),
        None => crate::run::build_release()?,
    };
    let work = cmd::metadata()?.target_directory.join("testbox");
    let out = args.out.clone().unwrap_or_else(|| work.join("out"));
    let console = args
        .console
        .clone()
        .unwrap_or_else(|| work.join("console.log"));
    let command = if args.command.is_empty() {
        vec!["vmtrace".to_string(), "probes".to_string()]
    } else {
        args.command.clone()
    };
    let mut bins = vec![vmtrace];
    bins.extend(args.bins.iter().cloned());
    let test_module = if args.test_vmalloc {
        Some(crate::test_vmalloc::ensure_module(&spec, &kernel)?)
    } else {
        None
    };
    let initramfs = build_initramfs(&work, &kernel, &bins, test_module.as_deref(), &command)?;
    let guest = Guest {
        kernel: &kernel,
        initramfs: &initramfs,
        cpus: args.cpus,
        mem: &args.mem,
        paging: args.paging,
        out: &out,
        console: &console,
        append: &args.append,
        boot_timeout: Duration::from_secs(args.boot_timeout),
        timeout: Duration::from_secs(args.timeout),
    };
    let status = guest.run()?;
    Ok(ExitCode::from(u8::try_from(status).unwrap_or(1)))
}

/// Makes sure the default kernel is cached and the host tools are there, so the guest tests can
/// tell a box that cannot boot here (said once, then skipped) from a guest that failed.
pub fn prepare_default() -> Result<Kernel> {
    ensure_host_tools()?;
    ensure_kernel(&KERNELS[0])
}

/// The host programs the box needs. Setup installs them from Debian's packages; this check
/// names whatever is still missing rather than failing inside QEMU.
fn ensure_host_tools() -> Result<()> {
    let missing: Vec<&str> = [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("busybox", "busybox-static"),
        ("cpio", "cpio"),
        ("xz", "xz-utils"),
        ("dpkg-deb", "dpkg"),
        ("apt-get", "apt"),
        ("ldd", "libc-bin"),
    ]
    .into_iter()
    .filter(|(program, _)| find_on_path(program).is_none())
    .map(|(_, package)| package)
    .collect();
    if !missing.is_empty() {
        bail!(
            "the test box needs these Debian packages: {} (`cargo xtask setup` installs them as root)",
            missing.join(" ")
        );
    }
    Ok(())
}

/// Where downloaded kernels live: outside the repository, so a clean clone and `cargo clean`
/// keep them, and a second run needs no network.
pub fn cache_dir() -> PathBuf {
    crate::cmd::cache_dir("testbox")
}

/// A kernel unpacked into the cache.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub release: String,
    pub vmlinuz: PathBuf,
    /// The share modules, decompressed, in load order.
    pub modules: Vec<PathBuf>,
}

/// Returns the cached kernel, fetching and unpacking it first when the cache lacks it.
pub fn ensure_kernel(spec: &KernelSpec) -> Result<Kernel> {
    let dir = cache_dir().join("kernels").join(spec.name);
    let ready = dir.join("release");
    // A cache from before the module order was kept is fetched again.
    let complete = dir.join(MODULE_ORDER).is_file();
    if let Some(release) = fs::read_to_string(&ready).ok().filter(|_| complete) {
        let kernel = cached_kernel(&dir, release.trim())?;
        println!(
            "testbox: kernel {} ({}) from the cache {}",
            spec.name,
            kernel.release,
            dir.display()
        );
        return Ok(kernel);
    }
    banner(&format!("testbox: fetch kernel {}", spec.name));
    let deb = download_kernel_package(spec)?;
    unpack_kernel(&deb, &dir)?;
    // The package is only a means to the unpacked kernel; 100 MB per kernel is not kept.
    fs::remove_file(&deb).ok();
    let release =
        fs::read_to_string(&ready).with_context(|| format!("cannot read {}", ready.display()))?;
    cached_kernel(&dir, release.trim())
}

fn cached_kernel(dir: &Path, release: &str) -> Result<Kernel> {
    let vmlinuz = dir.join("vmlinuz");
    if !vmlinuz.is_file() {
        bail!(
            "the kernel cache {} is incomplete (no vmlinuz); remove it and run again",
            dir.display()
        );
    }
    let order = fs::read_to_string(dir.join(MODULE_ORDER)).unwrap_or_default();
    let modules = order
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|m| dir.join("modules").join(format!("{}.ko", m.trim())))
        .collect();
    Ok(Kernel {
        release: release.to_string(),
        vmlinuz,
        modules,
    })
}

/// A module's name as modinfo's `depends=` spells it: the file name without `.ko[.xz]`, with
/// `-` read as `_`.
fn module_name(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let stem = file
        .strip_suffix(".ko.xz")
        .or_else(|| file.strip_suffix(".ko"))?;
    Some(stem.replace('-', "_"))
}

/// Every `.ko` and `.ko.xz` under `root`, by module name.
fn index_modules(root: &Path) -> std::collections::HashMap<String, PathBuf> {
    let mut index = std::collections::HashMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Some(name) = module_name(&path) {
                index.insert(name, path);
            }
        }
    }
    index
}

/// The `depends=` list of a module image's modinfo.
fn module_depends(image: &[u8]) -> Vec<String> {
    image
        .split(|&b| b == 0)
        .find_map(|field| field.strip_prefix(b"depends="))
        .map(|list| {
            String::from_utf8_lossy(list)
                .split(',')
                .filter(|d| !d.is_empty())
                .map(|d| d.replace('-', "_"))
                .collect()
        })
        .unwrap_or_default()
}

/// Reads a module, decompressing `.ko.xz`.
fn read_module(path: &Path) -> Result<Vec<u8>> {
    if path.extension().is_some_and(|e| e == "xz") {
        let out = Command::new("xz").arg("-dc").arg(path).output()?;
        if !out.status.success() {
            bail!("cannot decompress {}", path.display());
        }
        Ok(out.stdout)
    } else {
        Ok(fs::read(path)?)
    }
}

/// Orders `wanted` and their dependencies so that each module comes after what it needs.
/// Modules absent from the tree are built in and skipped; `images` receives each one's
/// decompressed image.
fn resolve_modules(
    wanted: &[&str],
    index: &std::collections::HashMap<String, PathBuf>,
    images: &mut Vec<(String, Vec<u8>)>,
) -> Result<()> {
    fn visit(
        name: &str,
        index: &std::collections::HashMap<String, PathBuf>,
        images: &mut Vec<(String, Vec<u8>)>,
        seen: &mut std::collections::HashSet<String>,
    ) -> Result<()> {
        if !seen.insert(name.to_string()) {
            return Ok(());
        }
        let Some(path) = index.get(name) else {
            return Ok(());
        };
        let image = read_module(path)?;
        for dep in module_depends(&image) {
            visit(&dep, index, images, seen)?;
        }
        images.push((name.to_string(), image));
        Ok(())
    }
    let mut seen = std::collections::HashSet::new();
    for name in wanted {
        visit(name, index, images, &mut seen)?;
    }
    Ok(())
}

/// A private apt configuration: its own source list, lists and archive cache, so fetching a
/// package of another suite changes nothing in the host's apt state.
pub struct PrivateApt {
    root: PathBuf,
}

impl PrivateApt {
    pub fn new(suite: &str) -> Result<Self> {
        let root = cache_dir().join("apt").join(suite);
        for sub in ["lists/partial", "archives/partial", "parts"] {
            fs::create_dir_all(root.join(sub))
                .with_context(|| format!("cannot create {}", root.join(sub).display()))?;
        }
        let (uri, key) = host_debian_mirror()?;
        let signed_by = key.map(|k| format!("[signed-by={k}] ")).unwrap_or_default();
        fs::write(
            root.join("sources.list"),
            format!("deb {signed_by}{uri} {suite} main\n"),
        )?;
        Ok(PrivateApt { root })
    }

    /// Where downloaded packages land.
    pub fn archives(&self) -> PathBuf {
        self.root.join("archives")
    }

    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        let opt = |key: &str, value: &Path| format!("{key}={}", value.display());
        c.args([
            "-o",
            &opt("Dir::Etc::SourceList", &self.root.join("sources.list")),
            "-o",
            &opt("Dir::Etc::SourceParts", &self.root.join("parts")),
            "-o",
            &opt("Dir::State::Lists", &self.root.join("lists")),
            "-o",
            &opt("Dir::Cache", &self.root),
            "-o",
            &opt("Dir::Cache::Archives", &self.root.join("archives")),
            // The lists are ours alone, and root downloads into a folder _apt cannot enter.
            "-o",
            "Debug::NoLocking=1",
            "-o",
            "APT::Sandbox::User=root",
        ])
        .env("DEBIAN_FRONTEND", "noninteractive");
        c
    }
}

/// The Debian mirror and key the host's apt already uses, from its deb822 `.sources` files or
/// one-line `.list` files: the first `…/debian` URI (not the security archive).
pub fn host_debian_mirror() -> Result<(String, Option<String>)> {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(entries) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut parts: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        parts.sort();
        files.extend(parts);
    }
    for file in files {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        let name = file.to_string_lossy();
        let found = if name.ends_with(".sources") {
            mirror_in_deb822(&text)
        } else if name.ends_with(".list") {
            mirror_in_one_line(&text)
        } else {
            None
        };
        if found.is_some() {
            return found.context("unreachable");
        }
    }
    bail!("no Debian archive found in the host's apt sources (/etc/apt/sources.list{{,.d/*}})")
}

fn is_debian_archive(uri: &str) -> bool {
    uri.trim_end_matches('/').ends_with("/debian")
}

fn mirror_in_deb822(text: &str) -> Option<(String, Option<String>)> {
    for stanza in text.split("\n\n") {
        let field = |key: &str| {
            stanza.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim().eq_ignore_ascii_case(key)).then(|| v.trim().to_string())
            })
        };
        let Some(uris) = field("URIs") else {
            continue;
        };
        if let Some(uri) = uris.split_whitespace().find(|u| is_debian_archive(u)) {
            return Some((uri.to_string(), field("Signed-By")));
        }
    }
    None
}

fn mirror_in_one_line(text: &str) -> Option<(String, Option<String>)> {
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("deb") {
            continue;
        }
        let mut key = None;
        let mut rest: Vec<&str> = words.collect();
        if rest.first().is_some_and(|w| w.starts_with('[')) {
            let end = rest.iter().position(|w| w.ends_with(']')).unwrap_or(0);
            for opt in &rest[..=end] {
                let opt = opt.trim_matches(|c| c == '[' || c == ']');
                if let Some(k) = opt.strip_prefix("signed-by=") {
                    key = Some(k.to_string());
                }
            }
            rest.drain(..=end);
        }
        if let Some(uri) = rest.first().filter(|u| is_debian_archive(u)) {
            return Some((uri.to_string(), key));
        }
    }
    None
}

/// Downloads the newest kernel package matching `spec` into the private apt's archive folder.
fn download_kernel_package(spec: &KernelSpec) -> Result<PathBuf> {
    let apt = PrivateApt::new(spec.suite)?;
    cmd::run(apt.command("apt-get").args(["-q", "update"]))?;
    let names = stdout_of(apt.command("apt-cache").args(["pkgnames", spec.prefix]))?;
    let package = newest_package(&names, spec).with_context(|| {
        format!(
            "no package {}*{} in Debian {}",
            spec.prefix, spec.suffix, spec.suite
        )
    })?;
    let downloads = apt.root.join("archives");
    cmd::run(
        apt.command("apt-get")
            .args(["-q", "download", &package])
            .current_dir(&downloads),
    )?;
    let deb = fs::read_dir(&downloads)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
        })
        .with_context(|| format!("apt-get download left no {package}_*.deb"))?;
    Ok(deb)
}

/// The candidate with the highest version among `apt-cache pkgnames` output; the version is
/// the part between the prefix and the suffix (digits, dots and dashes only), compared number
/// by number.
fn newest_package(names: &str, spec: &KernelSpec) -> Option<String> {
    let key = |name: &str| -> Option<Vec<u64>> {
        let middle = name.strip_prefix(spec.prefix)?.strip_suffix(spec.suffix)?;
        // Flavours (`-rt`, `-cloud`) put letters in the middle; only the plain image counts.
        if !middle
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == '-')
        {
            return None;
        }
        middle
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().ok())
            .collect()
    };
    names
        .lines()
        .map(str::trim)
        .filter_map(|n| key(n).map(|k| (k, n)))
        .max()
        .map(|(_, n)| n.to_string())
}

/// Unpacks the image package and keeps the kernel, its config and the share modules with
/// their dependencies, decompressed (busybox's insmod does not read `.ko.xz`).
fn unpack_kernel(deb: &Path, dir: &Path) -> Result<()> {
    let staging = dir.with_file_name(format!(
        "{}.unpack",
        dir.file_name().and_then(|n| n.to_str()).unwrap_or("kernel")
    ));
    if staging.exists() {
        fs::remove_dir_all(&staging)?;
    }
    fs::create_dir_all(&staging)?;
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&staging))?;
    let boot = staging.join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .with_context(|| format!("{} has no boot/", deb.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .with_context(|| format!("{} has no boot/vmlinuz-*", deb.display()))?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .context("odd vmlinuz name")?
        .to_string();
    let modules_root = ["usr/lib/modules", "lib/modules"]
        .iter()
        .map(|p| staging.join(p).join(&release).join("kernel"))
        .find(|p| p.is_dir())
        .with_context(|| format!("{} has no modules for {release}", deb.display()))?;

    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    fs::create_dir_all(dir.join("modules"))?;
    fs::copy(&vmlinuz, dir.join("vmlinuz"))?;
    fs::copy(boot.join(format!("config-{release}")), dir.join("config")).ok();
    let mut images = Vec::new();
    resolve_modules(SHARE_MODULES, &index_modules(&modules_root), &mut images)?;
    let mut order = String::new();
    for (name, image) in &images {
        fs::write(dir.join("modules").join(format!("{name}.ko")), image)?;
        order.push_str(name);
        order.push('\n');
    }
    fs::write(dir.join(MODULE_ORDER), order)?;
    // Written last: its presence is what marks the cache complete.
    fs::write(dir.join("release"), format!("{release}\n"))?;
    fs::remove_dir_all(&staging).ok();
    println!("testbox: kernel {release} cached in {}", dir.display());
    Ok(())
}

/// The guest's init: mount what vmtrace reads, mount the share, run the command with its
/// output on the second serial port (the host's stdout), and report its status in the share.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin HOME=/tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
for m in /lib/testbox/*.ko; do insmod "$m" || echo "testbox: insmod $m failed"; done
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 out /out; then
    echo "testbox: cannot mount the host share"; poweroff -f
fi
stty -F /dev/ttyS1 raw -echo 2>/dev/null
cd /out
echo booted > .testbox-booted
sh /testbox-command > /dev/ttyS1 2>&1 < /dev/null
echo $? > /out/.testbox-rc
cd /
sync
umount /out
poweroff -f
"#;

/// Quotes a word for the guest's shell.
fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Builds the initramfs: busybox, the binaries with their shared libraries at the host's
/// paths, the share modules, init and the command.
fn build_initramfs(
    work: &Path,
    kernel: &Kernel,
    bins: &[PathBuf],
    test_module: Option<&Path>,
    command: &[String],
) -> Result<PathBuf> {
    let root = work.join("initramfs");
    if root.exists() {
        fs::remove_dir_all(&root)?;
    }
    for d in [
        "bin",
        "proc",
        "sys",
        "dev",
        "tmp",
        "out",
        "lib/testbox",
        "etc",
    ] {
        fs::create_dir_all(root.join(d))?;
    }
    let busybox = find_on_path("busybox").context("busybox is not on PATH")?;
    fs::copy(&busybox, root.join("bin/busybox"))?;
    for bin in bins {
        let name = bin.file_name().context("a --bin path has no file name")?;
        fs::copy(bin, root.join("bin").join(name))
            .with_context(|| format!("cannot copy {}", bin.display()))?;
        for lib in shared_libraries(bin)? {
            let target = root.join(lib.strip_prefix("/").unwrap_or(&lib));
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::copy(&lib, &target).with_context(|| format!("cannot copy {}", lib.display()))?;
        }
    }
    for (i, module) in kernel.modules.iter().enumerate() {
        let name = module.file_name().context("module without a name")?;
        // The numeric prefix keeps the glob in init in dependency order.
        fs::copy(
            module,
            root.join("lib/testbox")
                .join(format!("{i:02}-{}", name.to_string_lossy())),
        )?;
    }
    if let Some(module) = test_module {
        // Not in lib/testbox: init loads those at boot, and this one runs its tests on load.
        fs::copy(module, root.join("lib/test_vmalloc.ko"))?;
    }
    fs::write(root.join("etc/passwd"), "root:x:0:0:root:/tmp:/bin/sh\n")?;
    fs::write(root.join("etc/group"), "root:x:0:\n")?;
    write_executable(&root.join("init"), INIT)?;
    let line: Vec<String> = command.iter().map(|w| shell_word(w)).collect();
    write_executable(
        &root.join("testbox-command"),
        &format!("{}\n", line.join(" ")),
    )?;

    let image = work.join("initramfs.cpio");
    let status = Command::new("sh")
        .arg("-c")
        .arg("find . -print0 | cpio --null -o -H newc --quiet > \"$0\"")
        .arg(&image)
        .current_dir(&root)
        .status()
        .context("cannot run cpio")?;
    if !status.success() {
        bail!("building {} failed", image.display());
    }
    Ok(image)
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::write(path, text)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The shared libraries `ldd` resolves for a binary, the dynamic loader included; none for a
/// static one.
fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = cmd::output_of(Command::new("ldd").arg(bin))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(parse_ldd(&text))
}

fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// One boot of the guest.
struct Guest<'a> {
    kernel: &'a Kernel,
    initramfs: &'a Path,
    cpus: u32,
    mem: &'a str,
    paging: u8,
    out: &'a Path,
    console: &'a Path,
    append: &'a str,
    boot_timeout: Duration,
    timeout: Duration,
}

impl Guest<'_> {
    fn qemu(&self) -> Command {
        let mut c = Command::new("qemu-system-x86_64");
        let cpu = if self.paging == 5 {
            "max"
        } else {
            "max,la57=off"
        };
        let append = format!("console=ttyS0 panic=-1 quiet {}", self.append);
        c.args(["-accel", "tcg,thread=multi", "-cpu", cpu])
            .args(["-smp", &self.cpus.to_string(), "-m", self.mem])
            .args(["-nodefaults", "-display", "none", "-no-reboot"])
            .arg("-kernel")
            .arg(&self.kernel.vmlinuz)
            .arg("-initrd")
            .arg(self.initramfs)
            .args(["-append", append.trim()])
            .arg("-serial")
            .arg(format!("file:{}", self.console.display()))
            .args([
                "-chardev",
                "stdio,id=command,signal=off",
                "-serial",
                "chardev:command",
            ])
            .arg("-virtfs")
            .arg(format!(
                "local,path={},mount_tag=out,security_model=none,id=out",
                self.out.display()
            ))
            .stdin(Stdio::null());
        c
    }

    /// Boots, waits, and returns the command's exit status.
    ///
    /// A guest whose kernel dies before its init runs has not run anything of ours: under TCG
    /// the 6.12 guest very occasionally takes a fatal exception in an interrupt while its CPUs
    /// come up (seen once in CI, a NULL dereference on a secondary CPU at 2.8 s). Such a boot
    /// is tried again, at most `BOOT_TRIES` times in all, and each failed boot is said loudly
    /// and its console log kept beside the new one. Anything that goes wrong after the init has
    /// started is the guest's own result and is never retried.
    fn run(&self) -> Result<i32> {
        for attempt in 1..=BOOT_TRIES {
            match self.boot()? {
                Boot::Finished(status) => return Ok(status),
                Boot::DiedBeforeInit(why) if attempt < BOOT_TRIES => {
                    let kept = self.console.with_extension(format!("boot{attempt}.log"));
                    fs::rename(self.console, &kept).ok();
                    eprintln!(
                        "testbox: WARNING: the guest kernel died before its init ({why}); its console log is kept in {}; booting again (try {} of {BOOT_TRIES})",
                        kept.display(),
                        attempt + 1
                    );
                }
                Boot::DiedBeforeInit(why) => bail!(
                    "the guest kernel died before its init on all {BOOT_TRIES} tries; the last ({why}) ends its console log {}:\n{}",
                    self.console.display(),
                    console_tail(self.console)
                ),
            }
        }
        unreachable!("the loop returns or bails on its last try")
    }

    fn boot(&self) -> Result<Boot> {
        fs::create_dir_all(self.out)
            .with_context(|| format!("cannot create {}", self.out.display()))?;
        if let Some(parent) = self.console.parent() {
            fs::create_dir_all(parent)?;
        }
        for marker in [BOOTED_MARKER, STATUS_MARKER] {
            fs::remove_file(self.out.join(marker)).ok();
        }
        let mut qemu = self.qemu();
        banner(&format!(
            "testbox: {} on {} vCPUs, {}-level paging (console log: {})",
            self.kernel.release,
            self.cpus,
            self.paging,
            self.console.display()
        ));
        println!("$ {}", cmd::display(&qemu));
        let mut child = qemu.spawn().context("cannot start qemu-system-x86_64")?;
        let started = Instant::now();
        let mut booted = false;
        let exit = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if !booted && self.out.join(BOOTED_MARKER).exists() {
                booted = true;
                println!(
                    "testbox: guest booted in {:.1} s",
                    started.elapsed().as_secs_f64()
                );
            }
            let limit = if booted {
                self.timeout
            } else {
                self.boot_timeout.min(self.timeout)
            };
            if started.elapsed() > limit {
                child.kill().ok();
                child.wait().ok();
                bail!(
                    "the guest {} within {} s and was killed; the end of its console log {}:\n{}",
                    if booted {
                        "did not finish"
                    } else {
                        "did not reach its init"
                    },
                    limit.as_secs(),
                    self.console.display(),
                    console_tail(self.console)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if !booted && !self.out.join(BOOTED_MARKER).exists() {
            return Ok(Boot::DiedBeforeInit(format!(
                "qemu ended ({exit}) after {:.1} s",
                started.elapsed().as_secs_f64()
            )));
        }
        let status_file = self.out.join(STATUS_MARKER);
        let Ok(text) = fs::read_to_string(&status_file) else {
            bail!(
                "the guest ended ({exit}) after {:.1} s without reporting the command's status; the end of its console log {}:\n{}",
                started.elapsed().as_secs_f64(),
                self.console.display(),
                console_tail(self.console)
            );
        };
        let status: i32 = text
            .trim()
            .parse()
            .with_context(|| format!("{} holds `{}`", status_file.display(), text.trim()))?;
        println!(
            "testbox: the command exited with {status} after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Ok(Boot::Finished(status))
    }
}

/// How many times a guest that dies before its init is booted in all.
const BOOT_TRIES: u32 = 3;

/// How one boot ended.
enum Boot {
    /// The init ran the command, which exited with this status.
    Finished(i32),
    /// QEMU ended before the init wrote its marker: the kernel panicked or stopped in boot.
    DiedBeforeInit(String),
}

fn console_tail(path: &Path) -> String {
    let Ok(file) = fs::File::open(path) else {
        return "(no console log)".into();
    };
    let lines: Vec<String> = BufReader::new(file).lines().map_while(Result::ok).collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_package_compares_versions_as_numbers() {
        let names = "linux-image-6.12.9+deb13-amd64-unsigned\n\
                     linux-image-6.12.117+deb13-amd64-unsigned\n\
                     linux-image-6.12.117+deb13-cloud-amd64-unsigned\n\
                     linux-image-6.12.38+deb13-amd64-unsigned\n";
        assert_eq!(
            newest_package(names, &KERNELS[0]).as_deref(),
            Some("linux-image-6.12.117+deb13-amd64-unsigned")
        );
        let bookworm = "linux-image-6.1.0-9-amd64-unsigned\nlinux-image-6.1.0-37-amd64-unsigned\nlinux-image-6.1.0-37-rt-amd64-unsigned\n";
        assert_eq!(
            newest_package(bookworm, &KERNELS[1]).as_deref(),
            Some("linux-image-6.1.0-37-amd64-unsigned")
        );
        assert_eq!(newest_package("linux-image-amd64\n", &KERNELS[0]), None);
    }

    #[test]
    fn the_mirror_comes_from_either_source_format() {
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\nSigned-By: /k.gpg\n\n\
                      Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n";
        assert_eq!(
            mirror_in_deb822(deb822),
            Some(("http://mirror.example/debian".into(), Some("/k.gpg".into())))
        );
        let security_only = "Types: deb\nURIs: http://mirror.example/debian-security\n";
        assert_eq!(mirror_in_deb822(security_only), None);
        let list = "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main\n";
        assert_eq!(
            mirror_in_one_line(list),
            Some((
                "http://mirror.example/debian/".into(),
                Some("/k.gpg".into())
            ))
        );
        assert_eq!(
            mirror_in_one_line("deb http://mirror.example/debian bookworm main\n"),
            Some(("http://mirror.example/debian".into(), None))
        );
    }

    #[test]
    fn ldd_output_gives_libraries_and_the_loader() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tnot a dynamic executable\n").is_empty());
    }

    #[test]
    fn modules_come_after_their_dependencies() {
        let dir = tempfile_dir();
        let module = |name: &str, depends: &str| {
            let body = format!("\0license=GPL\0depends={depends}\0name={name}\0");
            fs::write(dir.join(format!("{name}.ko")), body).unwrap();
        };
        module("9p", "9pnet,netfs");
        module("9pnet", "netfs");
        module("netfs", "");
        module("9pnet_virtio", "9pnet,virtio_ring");
        let index = index_modules(&dir);
        let mut images = Vec::new();
        // virtio_pci and virtio_ring are not in the tree: built in.
        resolve_modules(&["virtio_pci", "9pnet_virtio", "9p"], &index, &mut images).unwrap();
        let names: Vec<&str> = images.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["netfs", "9pnet", "9pnet_virtio", "9p"]);
        fs::remove_dir_all(&dir).ok();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-modules-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn command_words_are_quoted_for_the_guest_shell() {
        assert_eq!(shell_word("vmtrace"), "vmtrace");
        assert_eq!(shell_word("--duration=5s"), "--duration=5s");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
    }
}
