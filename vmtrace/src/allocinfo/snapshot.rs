//! Reading the live /proc/allocinfo, explaining its absence, and saving captures safely.

use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::error::{AllocinfoError, Unavailable};

pub const PROC_ALLOCINFO: &str = "/proc/allocinfo";
const PROC_CONFIG_GZ: &str = "/proc/config.gz";
const SYSCTL_MEM_PROFILING: &str = "/proc/sys/vm/mem_profiling";
const CONFIG_OPTION: &str = "CONFIG_MEM_ALLOC_PROFILING";

/// Reads an allocinfo file. For the kernel's own file, a failure is turned into the reason the
/// file is unavailable (feature not built, disabled at boot, or no permission), because "No such
/// file or directory" does not tell a user what to do.
pub fn read(path: &Path) -> Result<Vec<u8>, AllocinfoError> {
    match fs::read(path) {
        Ok(bytes) => Ok(bytes),
        Err(source) if path == Path::new(PROC_ALLOCINFO) => match source.kind() {
            ErrorKind::NotFound => Err(AllocinfoError::Unavailable(diagnose_missing(
                path,
                kernel_config().as_ref(),
            ))),
            ErrorKind::PermissionDenied => {
                Err(AllocinfoError::Unavailable(Unavailable::PermissionDenied {
                    path: path.to_path_buf(),
                }))
            }
            _ => Err(AllocinfoError::Read {
                path: path.to_path_buf(),
                source,
            }),
        },
        Err(source) => Err(AllocinfoError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The kernel configuration and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelConfig {
    pub source: String,
    pub text: String,
}

/// Why `path` is missing, judged from the kernel configuration when there is one.
pub fn diagnose_missing(path: &Path, config: Option<&KernelConfig>) -> Unavailable {
    let path = path.to_path_buf();
    let Some(config) = config else {
        return Unavailable::Missing { path };
    };
    let enabled = format!("{CONFIG_OPTION}=y");
    let disabled = format!("# {CONFIG_OPTION} is not set");
    let mut lines = config.text.lines().map(str::trim);
    if lines.any(|l| l == enabled) {
        Unavailable::DisabledAtBoot {
            path,
            config_source: config.source.clone(),
        }
    } else if config.text.lines().any(|l| l.trim() == disabled) {
        Unavailable::NotBuilt {
            path,
            config_source: config.source.clone(),
            detail: format!("`{disabled}`"),
        }
    } else {
        Unavailable::NotBuilt {
            path,
            config_source: config.source.clone(),
            detail: format!("no {CONFIG_OPTION} line at all: the kernel predates Linux 6.10"),
        }
    }
}

/// The running kernel's configuration, from /proc/config.gz (decompressed with the system's
/// `gzip`, to avoid a compression library for one diagnostic) or /boot/config-$(uname -r).
pub fn kernel_config() -> Option<KernelConfig> {
    let from_proc = Command::new("gzip")
        .args(["-dc", PROC_CONFIG_GZ])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|text| KernelConfig {
            source: PROC_CONFIG_GZ.to_string(),
            text,
        });
    from_proc.or_else(|| {
        let release = fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
        let path = format!("/boot/config-{}", release.trim());
        let text = fs::read_to_string(&path).ok()?;
        Some(KernelConfig { source: path, text })
    })
}

/// Warnings about a live file that exists: with `vm.mem_profiling` at 0 the counters are frozen,
/// so a diff or watch would show nothing happening.
pub fn live_warnings() -> Vec<String> {
    match fs::read_to_string(SYSCTL_MEM_PROFILING) {
        Ok(value) if value.trim() == "0" => vec![format!(
            "profiling is off ({SYSCTL_MEM_PROFILING} is 0): the counters are not updating; \
             enable it with `sysctl vm.mem_profiling=1`"
        )],
        _ => Vec::new(),
    }
}

/// Writes `data` to `path` so that readers see the old file or the whole new one, never a
/// partial capture: a temporary file in the same directory, flushed, then renamed over.
///
/// The file is created mode 0600, like the kernel's 0400 /proc/allocinfo: call-site activity
/// can reveal what a system is doing.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), AllocinfoError> {
    let write_error = |source| AllocinfoError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "allocinfo".to_string());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(data)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(source) = result {
        let _ = fs::remove_file(&tmp);
        return Err(write_error(source));
    }
    // Make the rename itself durable; failing to sync a directory is not worth an error.
    if let Ok(d) = fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> KernelConfig {
        KernelConfig {
            source: "/proc/config.gz".into(),
            text: text.into(),
        }
    }

    #[test]
    fn diagnosis_from_config() {
        let p = Path::new(PROC_ALLOCINFO);
        let not_set = diagnose_missing(
            p,
            Some(&config(
                "CONFIG_X=y\n# CONFIG_MEM_ALLOC_PROFILING is not set\n",
            )),
        );
        assert!(matches!(not_set, Unavailable::NotBuilt { .. }));
        assert_eq!(
            not_set.to_string(),
            "/proc/allocinfo does not exist: this kernel was built without CONFIG_MEM_ALLOC_PROFILING \
             (/proc/config.gz has `# CONFIG_MEM_ALLOC_PROFILING is not set`). Memory allocation \
             profiling needs a kernel built with CONFIG_MEM_ALLOC_PROFILING=y; `vmtrace allocinfo \
             show` and `diff` still work on files saved elsewhere"
        );
        let on = diagnose_missing(p, Some(&config("CONFIG_MEM_ALLOC_PROFILING=y\n")));
        assert!(matches!(on, Unavailable::DisabledAtBoot { .. }));
        assert!(on.to_string().contains("sysctl.vm.mem_profiling=never"));
        let old = diagnose_missing(p, Some(&config("CONFIG_X=y\n")));
        assert!(old.to_string().contains("predates Linux 6.10"), "{old}");
        let unknown = diagnose_missing(p, None);
        assert!(matches!(unknown, Unavailable::Missing { .. }));
        assert!(unknown.to_string().contains("vm.mem_profiling=never"));
    }

    #[test]
    fn other_paths_report_plain_io_errors() {
        let e = read(Path::new("/nonexistent/allocinfo")).expect_err("missing");
        assert!(matches!(e, AllocinfoError::Read { .. }));
    }

    #[test]
    fn atomic_write_replaces_the_whole_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("snap.txt");
        write_atomic(&path, b"old").expect("write");
        write_atomic(&path, b"new contents").expect("rewrite");
        assert_eq!(fs::read(&path).expect("read"), b"new contents");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &fs::metadata(&path).expect("stat").permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let leftovers = fs::read_dir(dir.path()).expect("list").count();
        assert_eq!(leftovers, 1, "no temporary file left behind");
        let e = write_atomic(&dir.path().join("missing/dir/x"), b"x").expect_err("no dir");
        assert!(e.to_string().contains("missing/dir/x"), "{e}");
    }
}
