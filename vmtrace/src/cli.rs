//! Command-line interface: one subcommand per job. Each subcommand's module owns its `Args`
//! and its `run`; this module only assembles them into the command enum.

use clap::{Parser, Subcommand};

use crate::probe::table::ProbesArgs;
use crate::record::RecordArgs;
use crate::replay::cli::{CalibrateArgs, ReplayArgs};
use crate::summary::SummaryArgs;

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
    /// Replay a trace through the allocator model and report how well it predicts the kernel.
    ///
    /// The model is seeded from the trace's vmallocinfo snapshot, then every allocation, lazy
    /// free and purge after it is replayed in observed timing: purges happen where the trace shows
    /// them. Each successful allocation's predicted address is compared with the kernel's, each
    /// free's lazy backlog (nr_lazy) and each purge's object count (npurged). Agreement is given
    /// overall and after warm-up, with the first divergences and the model state around them.
    /// With --report DIR it also writes charts (SVG, PNG) and an index.html there.
    /// See docs/model.md for what the model does and does not know.
    Replay(ReplayArgs),
    /// Measure the what-if simulation's inputs from recordings and write them as a calibration.
    ///
    /// From each trace's `contention` records (`--probes lock_waits`) it sizes the hold time of
    /// each vmap lock class: from holds timed by `lock_holds` where the kernel allows fentry;
    /// for the lazy and free-area locks from each waiter's own section (its wait's end to its
    /// next free or alloc, which the kernel fires right after the unlock); otherwise from the
    /// waits' counts and lengths. From its `work` records (`--probes purge_work`) the drain
    /// latency distribution and the purge cost, and where the items were timed at their TLB
    /// flush, how long a decay runs per pool entry (reported, not used: docs/model.md). What
    /// no trace shows keeps its documented default, and the file says which ones those are.
    /// `vmtrace replay --costs FILE` and `vmtrace synth --costs FILE` use it. Calibrate on
    /// some recordings and validate on others (docs/model.md, "Calibration").
    Calibrate(CalibrateArgs),
    /// Turn text output of the vmalloc tracepoints from another tool (`perf script`,
    /// `trace-cmd report`, the tracefs `trace` file) into a vmtrace trace that `summary`,
    /// `replay` and `top --replay` read. Facts the text lacks are inferred and listed in the
    /// header (docs/import.md).
    Import(crate::import::cli::ImportArgs),
    /// Compare two recordings side by side, like `perf diff`: rates, sizes, latency, lock
    /// waits per class, purges, backlog, footprint, page tables and tasks, each as A, B and
    /// B/A, flagged when B/A is outside the recordings' own noise (docs/compare.md).
    ///
    /// Each recording is cut into time windows; a bootstrap over the windows gives a 95 %
    /// interval for B/A, and a row is flagged when it leaves out 1 and the change is beyond
    /// ±10 %. Recordings of different kernels or CPU counts are allowed: the header
    /// differences are listed first.
    Compare(crate::compare::cli::CompareArgs),
    /// Generate a synthetic trace shaped like lib/test_vmalloc.c, with addresses chosen by the
    /// allocator model and timestamps from a per-CPU timing model (docs/synth.md).
    Synth(crate::synth::cli::SynthArgs),
    /// What-if at the published scale: sweep lib/test_vmalloc.c workloads (or a recorded
    /// trace) over thread and CPU counts through each allocator design's free-running model
    /// and lock simulation, with no trace file; a table, --json or --report charts
    /// (docs/whatif.md).
    Whatif(crate::whatif::cli::WhatifArgs),
    /// Show how each probe attaches on this kernel: the chosen rung of the strategy ladder
    /// (fentry, kprobe, tracepoint) and why each richer rung was refused. Needs root.
    Probes(ProbesArgs),
    /// Snapshot, show, diff and watch /proc/allocinfo (memory allocation profiling).
    #[command(subcommand)]
    Allocinfo(crate::allocinfo::cli::AllocinfoCommand),
    /// Watch vmalloc live in a terminal UI (rates, sizes, lazy backlog, nodes, footprint,
    /// locks, callers, model), or replay a trace through it with --replay.
    ///
    /// Without privileges or BPF it replays the bundled sample trace, with a banner saying why.
    /// When stdout is not a terminal (or with -b) it prints the screen as text every --interval.
    Top(crate::tui::TopArgs),
    /// Serve live vmalloc metrics to Prometheus (/metrics, /healthz) until SIGTERM.
    ///
    /// Attaches the probes, drops every capability, then counts events into counters, gauges
    /// and histograms that each scrape renders. Binds loopback unless told otherwise.
    /// See docs/serve.md and dashboards/.
    Serve(crate::export::serve::ServeArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }
}

#[cfg(test)]
mod probe_selection_tests {
    use super::*;

    fn record(args: &[&str]) -> RecordArgs {
        let mut argv = vec!["vmtrace", "record"];
        argv.extend_from_slice(args);
        match Cli::parse_from(argv).command {
            Command::Record(r) => r,
            other => panic!("not a record command: {other:?}"),
        }
    }

    #[test]
    fn default_probes_leave_out_the_page_allocator_hooks() {
        let wanted = record(&[]).wanted_probes().unwrap();
        assert_eq!(wanted, ["alloc_latency", "lock_waits", "purge_work"]);
        assert!(!wanted.contains(&"page_tables") && !wanted.contains(&"backing_pages"));
    }

    #[test]
    fn all_none_and_lists() {
        assert_eq!(
            record(&["--probes", "all"]).wanted_probes().unwrap().len(),
            6
        );
        // The hold probe times only the locks the wait probe classified: it brings it along.
        assert_eq!(
            record(&["--probes", "lock_holds"]).wanted_probes().unwrap(),
            ["lock_holds", "lock_waits"]
        );
        assert!(record(&["--probes", "none"])
            .wanted_probes()
            .unwrap()
            .is_empty());
        assert_eq!(
            record(&["--probes", "page_tables,lock_waits,page_tables"])
                .wanted_probes()
                .unwrap(),
            ["lock_waits", "page_tables"]
        );
        let err = record(&["--probes", "locks"]).wanted_probes().unwrap_err();
        assert!(
            err.contains("`locks`") && err.contains("lock_waits"),
            "{err}"
        );
    }
}
