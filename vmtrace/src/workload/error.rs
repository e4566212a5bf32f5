//! Errors of the stress workload, for callers that match on them (the CLI maps them to a message
//! and a non-zero exit status).

use std::io;

/// Everything `vmtrace stress` can fail with.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A command-line value is out of range or does not apply to the chosen pattern.
    #[error("{0}")]
    InvalidArgs(String),

    /// `bpf(2)` refused to create a map: the process lacks CAP_BPF (or CAP_SYS_ADMIN).
    #[error(
        "bpf(BPF_MAP_CREATE) was refused with EPERM: `vmtrace stress` needs root or CAP_BPF \
         (kernel.unprivileged_bpf_disabled = {unprivileged_bpf_disabled})"
    )]
    NotPermitted {
        /// The value of `/proc/sys/kernel/unprivileged_bpf_disabled`, or `unknown`.
        unprivileged_bpf_disabled: String,
    },

    /// `bpf(BPF_MAP_CREATE)` failed for another reason (ENOMEM, EMFILE, ...).
    #[error("bpf(BPF_MAP_CREATE) of an array map with {pages} data pages failed")]
    MapCreate {
        /// Data pages asked for.
        pages: u64,
        #[source]
        source: io::Error,
    },

    /// The pattern needs more open file descriptors (one per live map) than RLIMIT_NOFILE allows.
    #[error(
        "{what} needs {needed} open file descriptors (one per live BPF map), but only {available} \
         are available under RLIMIT_NOFILE (soft {soft}, hard {hard}; raising the hard limit needs \
         CAP_SYS_RESOURCE): lower the count or raise the limit with `ulimit -Hn`"
    )]
    FdLimit {
        /// The option that asked for the areas, e.g. `--keep 30000`.
        what: String,
        needed: u64,
        available: u64,
        soft: u64,
        hard: u64,
    },

    /// A system value could not be read.
    #[error("cannot read {what}")]
    System {
        what: &'static str,
        #[source]
        source: io::Error,
    },

    /// A worker or churn thread could not be started.
    #[error("cannot start a thread")]
    Spawn(#[source] io::Error),

    /// A worker thread panicked (a bug in vmtrace).
    #[error("stress worker thread {0} panicked")]
    WorkerPanicked(u32),
}
