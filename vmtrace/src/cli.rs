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
    /// From each trace's `contention` records (`--probes lock_waits`) it estimates the hold time
    /// of each vmap lock class; from its `work` records (`--probes purge_work`) the drain
    /// latency distribution and the purge cost. What no trace shows keeps its documented
    /// default, and the file says which ones those are. `vmtrace replay --costs FILE` and
    /// `vmtrace synth --costs FILE` use it. Calibrate on some recordings and validate on
    /// others (docs/model.md, "Calibration").
    Calibrate(CalibrateArgs),
    /// Generate a synthetic trace shaped like lib/test_vmalloc.c, with addresses chosen by the
    /// allocator model and timestamps from a per-CPU timing model (docs/synth.md).
    Synth(crate::synth::cli::SynthArgs),
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

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Output trace file (JSON Lines). `-` writes to stdout.
    #[arg(short, long, default_value = "vmtrace.jsonl")]
    pub output: PathBuf,

    /// Stop after this long (e.g. `10s`, `1m30s`). Without it, record until Ctrl-C, SIGTERM or
    /// the end of COMMAND.
    #[arg(short, long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Total size of the BPF ring buffers in MiB (a power of two), split into one ring per CPU (up
    /// to eight). Bigger absorbs longer reader stalls.
    #[arg(long, default_value_t = 64)]
    pub ring_mib: u32,

    /// Do not print the end-of-recording summary on stderr.
    #[arg(short, long)]
    pub quiet: bool,

    /// Print the end-of-recording summary as JSON on stdout (ignored with `-o -`).
    #[arg(long)]
    pub json: bool,

    /// How often to sample /proc/meminfo PageTables and VmallocUsed into the trace; `0` turns
    /// sampling off.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub meminfo_interval: Option<Duration>,

    /// Sample /proc/allocinfo (memory allocation profiling) into the trace this often: totals,
    /// page-table pages (`pagetable_alloc`) and the vmalloc allocator's own tags, so a replay can
    /// put observed page-table growth beside the model's. Off unless given; when the file is
    /// missing vmtrace says why once and records without it.
    #[arg(long, value_parser = parse_duration)]
    pub allocinfo_interval: Option<Duration>,

    /// The allocinfo file to sample (tests point it at a fixture).
    #[arg(long, default_value = "/proc/allocinfo", hide = true)]
    pub allocinfo_path: PathBuf,

    /// Optional probes to attach besides the three vmalloc tracepoints, comma-separated:
    /// lock_waits, purge_work, page_tables, backing_pages, alloc_latency, `all` or `none`.
    /// page_tables and backing_pages hook kmem:mm_page_alloc, which fires for every page the
    /// kernel allocates, so they cost the most (see docs/probes.md); `vmtrace probes` shows
    /// which rung each would use here.
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_PROBES)]
    pub probes: Vec<String>,

    /// Command to run while recording, like `perf record -- cmd`. Recording stops when it exits.
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Trace file recorded by `vmtrace record` (`-` for stdin).
    pub trace: PathBuf,

    /// Allocator design to replay with: `nodes` (the current kernel, default), `nodes-capped`
    /// (pool length capped at lazy_max_pages, the Feb 2024 proposal) or `global` (v6.2–v6.8: one
    /// lock, merging lazy tree, no pools). Repeat to compare several.
    #[arg(long = "variant", value_name = "V", value_parser = parse_variant)]
    pub variants: Vec<crate::model::Variant>,

    /// Print the reports as JSON (an array, one object per variant).
    #[arg(long)]
    pub json: bool,

    /// Fail on the first warning (free of an unknown address, timestamps going backwards, bad
    /// request) instead of counting it.
    #[arg(long)]
    pub strict: bool,

    /// Replay causally only: read no record ahead and score every event before using it, so
    /// that every figure is a strict one (see "Strict and explained figures" in
    /// docs/model.md). Without it the strict figures are still computed, beside the explained
    /// ones, in the same read of the trace.
    #[arg(long)]
    pub causal: bool,

    /// What-if: number of vmap nodes instead of the trace header's (the zone size follows the
    /// kernel's rule: 16 pages, or 1 byte for a single node).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=128))]
    pub nodes: Option<u32>,

    /// What-if: vmap zone size in pages instead of the trace header's (or the kernel's 16 with
    /// --nodes). addr_to_node deals zones of this size to the nodes round-robin, so it decides
    /// which node's busy and lazy lists, and locks, an area belongs to.
    #[arg(long, value_name = "PAGES", value_parser = clap::value_parser!(u64).range(1..=(1 << 40)))]
    pub zone_pages: Option<u64>,

    /// What-if: lazy_max_pages (drain threshold, in pages) instead of the trace header's.
    #[arg(long, value_name = "PAGES", value_parser = clap::value_parser!(u64).range(1..))]
    pub lazy_max: Option<u64>,

    /// Write charts (SVG and PNG) and an index.html with the summary tables into DIR, created
    /// if missing: footprint over time, lazy backlog against the threshold with purges, per-node
    /// allocation share, lock-wait distribution per class and the variant comparison. Runs the
    /// free-running what-if for every --variant given (all three when none is) so the charts
    /// have something to compare.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,

    /// How many divergences to list with their context.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub divergences: usize,

    /// Observed timing: predicted delay from a drain work item's start (the `purge_work`
    /// probe's records) to the purge's detach of node 0's lazy list. Frees whose events come
    /// sooner are predicted in that purge's `npurged`. The defaults of this and
    /// --detach-node-step are the best pair measured on the 2-CPU 6.18 reference machine
    /// (docs/model.md).
    #[arg(long, value_parser = parse_duration, default_value = "15us")]
    pub detach_delay: Duration,

    /// Observed timing: added to --detach-delay for each node after node 0 (the kernel decays
    /// a node's pools before it detaches that node's list, one node after another); with a
    /// recorded TLB flush, each node before the last detaches this long before the next. Replay
    /// refits it to the trace from the purges already seen, starting from this value, unless
    /// --no-detach-fit; the report gives the fitted step.
    #[arg(long, value_parser = parse_duration, default_value = "20us")]
    pub detach_node_step: Duration,

    /// Observed timing: keep --detach-node-step fixed instead of refitting it from the
    /// trace's purges (each purge event shows which steps would have predicted its npurged).
    #[arg(long)]
    pub no_detach_fit: bool,

    /// Free-running what-if replay: the model picks every address and purges on its own
    /// threshold after --purge-latency, ignoring the trace's purges; prints footprint,
    /// page-table slots, purges, lock sections and predicted lock waits per variant. Also done,
    /// after the fidelity reports, whenever more than one --variant is given.
    #[arg(long)]
    pub free_running: bool,

    /// Free-running: delay from the free that crosses the threshold to the drain work's purge
    /// (`nodes-capped` queues it on the high-priority workqueue: 50 µs).
    #[arg(long, value_parser = parse_duration, default_value = "1ms")]
    pub purge_latency: Duration,

    /// Free-running: override one cost of the contention simulation, NAME=NANOSECONDS, e.g.
    /// `free_area_lock_ns=300` (repeatable; the names and defaults are in docs/model.md).
    #[arg(long = "cost", value_name = "NAME=NS", value_parser = parse_cost)]
    pub costs: Vec<(String, u64)>,

    /// Free-running: the simulation's inputs, from a `vmtrace calibrate` file; `builtin` (the
    /// default) is the calibration shipped for the 2-CPU reference machine, `none` the
    /// documented round-figure defaults. --cost overrides single costs on top.
    #[arg(
        long = "costs",
        value_name = "FILE|builtin|none",
        default_value = "builtin"
    )]
    pub calibration: String,

    /// Free-running: seed of the sampled drain latencies and long lock holds.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Fit the lock costs to the trace's own `contention` (and `latency`) events before the
    /// what-if comparison, starting from the defaults and any --cost; prints what was fitted.
    /// Reads the trace once per round, so it needs a file.
    #[arg(long)]
    pub fit_costs: bool,
}

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Traces recorded by `vmtrace record` with `--probes lock_waits,purge_work` (the
    /// default probes); several are pooled.
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,

    /// Where to write the calibration (JSON); `-` writes it to stdout.
    #[arg(short, long, default_value = "vmtrace-calibration.json")]
    pub output: PathBuf,

    /// Print the calibration as JSON on stdout instead of the summary table.
    #[arg(long)]
    pub json: bool,
}

fn parse_cost(s: &str) -> Result<(String, u64), String> {
    crate::sim::timing::Costs::parse_override(s).map_err(|e| e.to_string())
}

fn parse_variant(s: &str) -> Result<crate::model::Variant, String> {
    s.parse()
}

#[derive(Debug, Args)]
pub struct ProbesArgs {
    /// Print the table as JSON (the trace header's `probes` array).
    #[arg(long)]
    pub json: bool,
}

/// The optional probes `record` attaches unless told otherwise: the ones whose cost stays small
/// next to the vmalloc tracepoints (measured in docs/probes.md).
pub const DEFAULT_PROBES: &str = "lock_waits,purge_work,alloc_latency";

impl RecordArgs {
    /// `--probes` resolved to logical probe names, refusing unknown ones with the list of valid
    /// names.
    pub fn wanted_probes(&self) -> Result<Vec<&'static str>, String> {
        resolve_probes(&self.probes)
    }
}

/// A `--probes` list resolved to logical probe names (shared by `record` and `top`), refusing
/// unknown ones with the list of valid names.
pub fn resolve_probes(names: &[String]) -> Result<Vec<&'static str>, String> {
    let known = crate::probe::ladder::logical_names();
    let mut wanted = Vec::new();
    for name in names {
        match name.trim() {
            "all" => wanted.extend(known.iter().copied()),
            "none" | "" => {}
            other => match known.iter().find(|k| **k == other) {
                Some(k) => wanted.push(*k),
                None => {
                    return Err(format!(
                        "unknown probe `{other}` in --probes; valid: {}, all, none",
                        known.join(", ")
                    ))
                }
            },
        }
    }
    wanted.sort_unstable();
    wanted.dedup();
    Ok(wanted)
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
            5
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
