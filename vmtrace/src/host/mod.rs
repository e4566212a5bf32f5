//! Facts about the running kernel: everything vmtrace detects instead of assuming.
//!
//! Nothing here attaches probes; `probe/` uses these facts to load, and `record` writes them into
//! the trace header so a replay knows the machine the trace came from.

pub mod btf;
pub mod kallsyms;
pub mod kptr;
pub mod meminfo;
pub mod system;
pub mod tracefs;
pub mod vmallocinfo;

use std::path::PathBuf;

/// Errors while reading kernel facts. Each names the file involved so the user can look at it.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error(
        "tracefs is not mounted and could not be mounted at /sys/kernel/tracing ({reason}); \
         mount it with `mount -t tracefs nodev /sys/kernel/tracing`"
    )]
    NoTracefs { reason: String },
    #[error(
        "tracepoint {category}:{name} does not exist on this kernel ({path} is missing); \
         the vmalloc tracepoints need Linux 6.2 or later"
    )]
    MissingTracepoint {
        category: String,
        name: String,
        path: PathBuf,
    },
}

pub(crate) fn read_to_string(path: impl Into<PathBuf>) -> Result<String, HostError> {
    let path = path.into();
    std::fs::read_to_string(&path).map_err(|source| HostError::Read { path, source })
}
