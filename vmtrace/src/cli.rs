//! Command-line interface: one subcommand per job.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Observe and explain the Linux kernel's vmalloc allocator.
///
/// vmtrace attaches eBPF probes to the kernel's vmalloc tracepoints, records every vmap-area
/// allocation, lazy free and purge to a JSON Lines trace, and (offline) explains it.
#[derive(Debug, Parser)]
#[command(name = "vmtrace", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// More log output on stderr (-v: info, -vv: debug, -vvv: trace). RUST_LOG overrides it.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Record vmalloc events to a JSON Lines trace, optionally while running a command.
    ///
    /// Recording stops when --duration ends, on Ctrl-C or SIGTERM, or when COMMAND exits,
    /// whichever comes first. The trace always ends with a footer that counts events per kind and
    /// lost events per CPU, except after SIGKILL, when it is still readable up to its last line.
    Record(RecordArgs),
    /// Generate real vmalloc traffic from user space (BPF array maps, thread stacks).
    Stress(crate::workload::StressArgs),
    /// Summarise a recorded trace: event counts, sizes, lazy backlog, purges, lost events.
    Summary(SummaryArgs),
    /// Snapshot, show, diff and watch /proc/allocinfo (memory allocation profiling).
    #[command(subcommand)]
    Allocinfo(crate::allocinfo::cli::AllocinfoCommand),
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Output trace file (JSON Lines). `-` writes to stdout.
    #[arg(short, long, default_value = "vmtrace.jsonl")]
    pub output: PathBuf,

    /// Stop after this long (e.g. `10s`, `1m30s`). Without it, record until Ctrl-C, SIGTERM or
    /// the end of COMMAND.
    #[arg(short, long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Size of the BPF ring buffer in MiB (a power of two). Bigger absorbs longer reader stalls.
    #[arg(long, default_value_t = 64)]
    pub ring_mib: u32,

    /// Do not print the end-of-recording summary on stderr.
    #[arg(short, long)]
    pub quiet: bool,

    /// Print the end-of-recording summary as JSON on stdout (ignored with `-o -`).
    #[arg(long)]
    pub json: bool,

    /// Command to run while recording, like `perf record -- cmd`. Recording stops when it exits.
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SummaryArgs {
    /// Trace file to summarise (`-` for stdin).
    pub trace: PathBuf,

    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Parses durations such as `10s`, `500ms` or `1m30s`; a bare number means seconds, as in perf.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!(
            "`{s}` is not a valid duration: expected a non-negative number"
        ));
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a valid duration ({e}); try `10s`, `500ms` or `1m30s`"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("ten").unwrap_err().contains("`ten`"));
        assert!(parse_duration("-1").is_err());
    }
}
