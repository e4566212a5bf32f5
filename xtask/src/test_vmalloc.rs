//! The kernel's own vmalloc test module, `lib/test_vmalloc.c`, built for a test box kernel.
//!
//! Debian's kernels do not ship it (`CONFIG_TEST_VMALLOC` is off), so it is built out of tree
//! from the kernel's source package against its headers package, with the suite's own
//! compiler: the headers carry flags of the compiler the kernel was built with (gcc 14 for
//! trixie), which the host's may not know. The compiler and headers live in a minimal
//! debootstrap root of the kernel's suite under the cache folder, made once; the module is
//! cached beside the kernel, so later runs need no network and no build.
//!
//! One change is made to the source: `__vmalloc_node_noprof` is exported only to an in-tree
//! `CONFIG_TEST_VMALLOC=m` build, so the tests that call `__vmalloc_node` (the aligned ones)
//! call it through an address a kprobe registration resolves before they start
//! (`test_vmalloc_shim.h`). Every allocation still goes through the kernel's own code.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::cmd::{self, banner, find_on_path};
use crate::testbox::{cache_dir, host_debian_mirror, Kernel, KernelSpec, PrivateApt};

const SHIM: &str = include_str!("test_vmalloc_shim.h");
const SOURCE_FILE: &str = "lib/test_vmalloc.c";

/// The module's path in the kernel's cache, building it first when it is missing.
pub fn ensure_module(spec: &KernelSpec, kernel: &Kernel) -> Result<PathBuf> {
    let module = cache_dir()
        .join("kernels")
        .join(spec.name)
        .join("test_vmalloc.ko");
    if module.is_file() {
        println!(
            "testbox: test_vmalloc.ko from the cache {}",
            module.display()
        );
        return Ok(module);
    }
    banner(&format!(
        "testbox: build lib/test_vmalloc.c for {}",
        kernel.release
    ));
    if find_on_path("debootstrap").is_none() {
        bail!("building test_vmalloc needs debootstrap (`cargo xtask setup` installs it as root)");
    }
    let version = kernel
        .release
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()
        .context("odd kernel release")?;
    let major_minor: Vec<&str> = version.split('.').take(2).collect();
    let series = major_minor.join(".");
    let source = extract_source(spec, &series)?;
    let root = build_root(spec, &kernel.release)?;
    let build = root.join("build");
    if build.exists() {
        fs::remove_dir_all(&build)?;
    }
    fs::create_dir_all(&build)?;
    fs::write(build.join("test_vmalloc.c"), patch_source(&source)?)?;
    fs::write(build.join("shim.h"), SHIM)?;
    fs::write(
        build.join("Kbuild"),
        "obj-m := test_vmalloc.o\nccflags-y := -include $(src)/shim.h\n",
    )?;
    cmd::run(Command::new("chroot").arg(&root).args([
        "make",
        "-C",
        &format!("/usr/src/linux-headers-{}", kernel.release),
        "M=/build",
        "modules",
    ]))?;
    fs::copy(build.join("test_vmalloc.ko"), &module).with_context(|| {
        format!(
            "the build left no {}",
            build.join("test_vmalloc.ko").display()
        )
    })?;
    println!("testbox: test_vmalloc.ko cached in {}", module.display());
    Ok(module)
}

/// Renames the two things the shim takes over: the unexported allocator and the init call.
fn patch_source(source: &str) -> Result<String> {
    let init = "module_init(vmalloc_test_init)";
    if !source.contains(init) || !source.contains("__vmalloc_node(") {
        bail!(
            "{SOURCE_FILE} no longer has `{init}` and `__vmalloc_node(`: the shim needs updating"
        );
    }
    Ok(source
        .replace("__vmalloc_node(", "vmtrace_vmalloc_node(")
        .replace(init, "module_init(vmtrace_shim_init)"))
}

/// `lib/test_vmalloc.c` from the suite's `linux-source-<series>` package.
fn extract_source(spec: &KernelSpec, series: &str) -> Result<String> {
    let apt = PrivateApt::new(spec.suite)?;
    let package = format!("linux-source-{series}");
    let downloads = apt.archives();
    let existing = |dir: &Path| -> Option<PathBuf> {
        fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
            })
    };
    let deb = match existing(&downloads) {
        Some(deb) => deb,
        None => {
            cmd::run(apt.command("apt-get").args(["-q", "update"]))?;
            cmd::run(
                apt.command("apt-get")
                    .args(["-q", "download", &package])
                    .current_dir(&downloads),
            )?;
            existing(&downloads).with_context(|| format!("apt-get download left no {package}"))?
        }
    };
    // The package holds one tarball; only the test's source is read out of it.
    let script = format!(
        "dpkg-deb --fsys-tarfile \"$0\" | tar -xO ./usr/src/{package}.tar.xz | xz -dc | tar -xO {package}/{SOURCE_FILE}"
    );
    let out = cmd::output_of(Command::new("sh").arg("-c").arg(&script).arg(&deb))?;
    if !out.status.success() || out.stdout.is_empty() {
        bail!(
            "cannot read {SOURCE_FILE} from {}: {}",
            deb.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    fs::remove_file(&deb).ok();
    String::from_utf8(out.stdout).context("test_vmalloc.c is not UTF-8")
}

/// A minimal root of the suite with gcc, make and the kernel's headers.
fn build_root(spec: &KernelSpec, release: &str) -> Result<PathBuf> {
    let root = cache_dir().join("buildroot").join(spec.suite);
    let headers = root
        .join("usr/src")
        .join(format!("linux-headers-{release}"));
    if headers.is_dir() && root.join("usr/bin/make").is_file() {
        return Ok(root);
    }
    if root.exists() {
        fs::remove_dir_all(&root)?;
    }
    fs::create_dir_all(&root)?;
    let (uri, _) = host_debian_mirror()?;
    cmd::run(
        Command::new("debootstrap")
            .args(["--variant=minbase"])
            .arg(format!(
                "--include=gcc,make,libc6-dev,xz-utils,linux-headers-{release}"
            ))
            .arg(spec.suite)
            .arg(&root)
            .arg(&uri),
    )
    .with_context(|| {
        format!(
            "debootstrap of {} with linux-headers-{release} failed; if the archive has moved on \
             to a newer kernel, remove {} to fetch it",
            spec.suite,
            cache_dir().join("kernels").join(spec.name).display()
        )
    })?;
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_renames_the_allocator_and_the_init() {
        let src = "ptr = __vmalloc_node(size, align, GFP_KERNEL, 0, x);\nmodule_init(vmalloc_test_init)\n";
        let patched = patch_source(src).unwrap();
        assert!(patched.contains("vmtrace_vmalloc_node(size"));
        assert!(patched.contains("module_init(vmtrace_shim_init)"));
        assert!(!patched.contains("__vmalloc_node("));
        assert!(patch_source("module_init(other)\n").is_err());
    }
}
