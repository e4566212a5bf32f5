//! `vmtrace replay`: the command-line edge of the replay (anyhow lives here, not below).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use super::charts::{write_report, ReportInput};
use super::free_run::{fit_costs, free_run, FreeRunOptions};
use super::infer::InferenceParams;
use super::{render_comparison, render_fit, render_text, replay, ReplayOptions};
use crate::model::Variant;
use crate::sim::calibration::{self, Calibration, Machine, Scan, TraceTiming, STALL_NS};
use crate::trace::TraceReader;
use crate::value_parsers::parse_duration;

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

    /// Observed timing: override one inference rule's tuned parameter, NAME=N, e.g.
    /// `top_picks_to_split=3` (repeatable; docs/inference.md gives each rule's). For sweeps on
    /// the train split of `cargo xtask fidelity`: a change is judged on its test split.
    #[arg(long = "infer", value_name = "NAME=N", value_parser = parse_infer)]
    pub infer: Vec<(String, u64)>,

    /// Observed timing: turn one inference rule off (repeatable), to see what it contributes.
    /// The explained figures with it off, beside the strict ones, say how much of the gap
    /// between the two it makes; docs/inference.md describes each rule.
    #[arg(long = "without", value_name = "RULE", value_enum)]
    pub without: Vec<super::infer::Rule>,

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

    /// Size the lock holds from the recorded waits alone, even where the traces carry holds
    /// timed by the `lock_holds` probe or waiters' own sections (the lazy and free-area
    /// locks: from a wait's end to the waiter's next event), which are used otherwise: to
    /// check the wait estimator against what the kernel shows.
    #[arg(long)]
    pub holds_from_waits: bool,
}

fn parse_cost(s: &str) -> Result<(String, u64), String> {
    crate::sim::timing::Costs::parse_override(s).map_err(|e| e.to_string())
}

fn parse_infer(s: &str) -> Result<(String, u64), String> {
    InferenceParams::parse_override(s).map_err(|e| e.to_string())
}

pub(crate) fn parse_variant(s: &str) -> Result<crate::model::Variant, String> {
    s.parse()
}

/// The calibration measured on the 2-CPU reference machine, regenerated by the command in
/// docs/model.md ("Calibration").
const BUILTIN_CALIBRATION: &str = include_str!("../../assets/calibration.json");

/// `--costs`: a calibration file, `builtin` or `none`.
pub fn load_calibration(spec: &str) -> anyhow::Result<Option<Calibration>> {
    match spec {
        "none" => Ok(None),
        "builtin" => Calibration::parse(BUILTIN_CALIBRATION)
            .map(Some)
            .context("the built-in calibration"),
        path => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
            Calibration::parse(&text)
                .map(Some)
                .with_context(|| format!("{path}: not a usable calibration"))
        }
    }
}

/// Says when the calibration comes from a machine with another vmap node count than the
/// trace's: drain and purge timing change with the nodes a purge walks (calibrated on 16-CPU
/// recordings, the median purge span was 499 µs and drain latency 395 µs, against 89 µs and
/// 24 µs on the 2-CPU machine the built-in calibration comes from).
fn warn_other_machine(c: &Calibration, trace: &std::path::Path) {
    if trace.as_os_str() == "-" {
        return;
    }
    let Ok(header) = open(trace).and_then(|r| Ok(TraceReader::new(r).read_header()?)) else {
        return;
    };
    let nodes = header.vmap.nr_vmap_nodes;
    if c.machine.vmap_nodes != 0 && c.machine.vmap_nodes != nodes {
        eprintln!(
            "vmtrace replay: WARNING: the calibration was measured on a machine with {} vmap nodes ({} CPUs, {}), this trace has {nodes}; its timing inputs may not transfer. Calibrate on a recording of this machine: vmtrace calibrate TRACE -o cal.json, then --costs cal.json",
            c.machine.vmap_nodes, c.machine.possible_cpus, c.machine.kernel_release
        );
    }
}

/// Runs one replay per requested variant and prints the reports; with `--free-running`, with
/// several variants, or with `--report`, the free-running what-if comparison as well. With
/// `--report DIR`, writes the charts and index.html there and says so on stderr.
pub fn run(args: &ReplayArgs) -> anyhow::Result<ExitCode> {
    let variants = if args.variants.is_empty() {
        vec![Variant::Nodes]
    } else {
        args.variants.clone()
    };
    // A report compares the designs: all three unless the user chose.
    let what_if_variants = if args.variants.is_empty() && args.report.is_some() {
        Variant::ALL.to_vec()
    } else {
        variants.clone()
    };
    let compare =
        args.free_running || variants.len() > 1 || args.report.is_some() || args.fit_costs;
    // The charts' observed side (footprint, backlog, purges) comes from an observed-timing
    // replay, so a report makes one even with --free-running (not printed then).
    let observed_passes = if args.free_running {
        usize::from(args.report.is_some())
    } else {
        variants.len()
    };
    let passes = observed_passes
        + if compare { what_if_variants.len() } else { 0 }
        + if args.fit_costs { FIT_ROUNDS + 1 } else { 0 };
    if args.trace.as_os_str() == "-" && passes > 1 {
        anyhow::bail!(
            "this replay reads the trace {passes} times (several variants, --free-running, --report or --fit-costs), which stdin cannot give; pass the trace as a file"
        );
    }
    let mut reports = Vec::new();
    let mut chart_only = Vec::new();
    let mut what_ifs = Vec::new();
    let mut fr = FreeRunOptions {
        purge_latency_ns: u64::try_from(args.purge_latency.as_nanos()).unwrap_or(u64::MAX),
        seed: args.seed,
        ..FreeRunOptions::default()
    };
    if let Some(c) = load_calibration(&args.calibration)? {
        if compare {
            warn_other_machine(&c, &args.trace);
        }
        fr = fr.calibrated(&c);
    }
    for (name, ns) in &args.costs {
        fr.costs
            .set(name, *ns)
            .with_context(|| format!("--cost {name}={ns}"))?;
    }
    let mut infer = InferenceParams::default();
    for (name, value) in &args.infer {
        infer
            .set(name, *value)
            .with_context(|| format!("--infer {name}={value}"))?;
    }
    let options = |variant| ReplayOptions {
        variant,
        strict: args.strict,
        nodes: args.nodes,
        zone_pages: args.zone_pages,
        lazy_max_pages: args.lazy_max,
        max_divergences: args.divergences,
        detach_delay_ns: u64::try_from(args.detach_delay.as_nanos()).unwrap_or(u64::MAX),
        detach_step_ns: u64::try_from(args.detach_node_step.as_nanos()).unwrap_or(u64::MAX),
        fit_detach_step: !args.no_detach_fit,
        causal: args.causal,
        infer,
        without: args.without.clone(),
    };
    let context = |variant: Variant, mode: &str| {
        format!(
            "replaying {} with variant {} ({mode})",
            args.trace.display(),
            variant.name()
        )
    };
    let progress = |variant: Variant, mode: &str| {
        if args.report.is_some() {
            eprintln!("vmtrace replay: {}", context(variant, mode));
        }
    };
    for &variant in variants.iter().take(observed_passes) {
        progress(variant, "observed timing");
        let report = replay(open(&args.trace)?, &options(variant))
            .with_context(|| context(variant, "observed timing"))?;
        if args.free_running {
            chart_only.push(report);
        } else {
            reports.push(report);
        }
    }
    let fit = if args.fit_costs {
        progress(Variant::Nodes, "fitting costs");
        let fit = fit_costs(
            || open(&args.trace),
            &options(Variant::Nodes),
            &fr,
            FIT_ROUNDS,
        )
        .with_context(|| context(Variant::Nodes, "fitting costs"))?;
        fr.costs = fit.fitted;
        Some(fit)
    } else {
        None
    };
    if compare {
        // A free-running `nodes` on the trace's own parameters predicts the kernel that
        // recorded it: its figures are checked against the trace's.
        let own_kernel =
            args.nodes.is_none() && args.zone_pages.is_none() && args.lazy_max.is_none();
        for &variant in &what_if_variants {
            progress(variant, "free-running");
            let mut w = free_run(open(&args.trace)?, &options(variant), &fr)
                .with_context(|| context(variant, "free-running"))?;
            if own_kernel && variant == Variant::Nodes {
                let fidelity = match reports
                    .iter()
                    .chain(&chart_only)
                    .find(|r| r.variant == variant)
                {
                    Some(r) => r.clone(),
                    None => {
                        progress(variant, "observed timing, for the validation");
                        replay(open(&args.trace)?, &options(variant))
                            .with_context(|| context(variant, "observed timing"))?
                    }
                };
                w.validation = super::validate::validate(&w, Some(&fidelity));
            }
            what_ifs.push(w);
        }
    }
    let check = super::checked::CalibrationCheck::for_costs(
        &args.calibration,
        !args.costs.is_empty() || args.fit_costs,
    );
    let mut out = std::io::stdout().lock();
    if args.json {
        if compare {
            let mut doc = serde_json::json!({ "fidelity": reports, "what_if": what_ifs });
            if let Some(c) = &check {
                doc["calibration_check"] = serde_json::to_value(c)?;
            }
            if let Some(fit) = &fit {
                doc["cost_fit"] = serde_json::to_value(fit)?;
            }
            serde_json::to_writer_pretty(&mut out, &doc)?;
        } else {
            serde_json::to_writer_pretty(&mut out, &reports)?;
        }
        writeln!(out)?;
    } else {
        for (i, r) in reports.iter().enumerate() {
            if i > 0 {
                writeln!(out)?;
            }
            out.write_all(render_text(r).as_bytes())?;
        }
        if compare {
            if !reports.is_empty() {
                writeln!(out)?;
            }
            if let Some(fit) = &fit {
                out.write_all(render_fit(fit).as_bytes())?;
                writeln!(out)?;
            }
            out.write_all(render_comparison(&what_ifs).as_bytes())?;
            for w in what_ifs.iter().filter(|w| !w.validation.is_empty()) {
                writeln!(out)?;
                out.write_all(super::validate::render(w).as_bytes())?;
            }
            if let Some(c) = &check {
                writeln!(out)?;
                out.write_all(c.render("").as_bytes())?;
            }
        }
    }
    out.flush()?;
    if let Some(dir) = &args.report {
        let trace = args.trace.display().to_string();
        let input = ReportInput {
            trace: &trace,
            fidelity: if reports.is_empty() {
                &chart_only
            } else {
                &reports
            },
            what_if: &what_ifs,
        };
        let files = write_report(dir, &input)
            .with_context(|| format!("cannot write the report into {}", dir.display()))?;
        eprintln!(
            "vmtrace replay: wrote {} charts (SVG and PNG) and {} to {}",
            files.len().saturating_sub(1) / 2,
            dir.join("index.html").display(),
            dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `vmtrace calibrate`: per trace an observed-timing replay (for the critical sections each
/// lock instance saw) and a scan of its timing records, then one calibration over all of them.
pub fn calibrate(args: &CalibrateArgs) -> anyhow::Result<ExitCode> {
    let mut timings = Vec::new();
    let mut machine = None;
    let total = args.traces.len();
    for (i, path) in args.traces.iter().enumerate() {
        eprintln!(
            "vmtrace calibrate: [{}/{total}] {}: replaying for the lock sections",
            i + 1,
            path.display()
        );
        let opts = ReplayOptions {
            max_divergences: 0,
            ..ReplayOptions::default()
        };
        let report =
            replay(open(path)?, &opts).with_context(|| format!("replaying {}", path.display()))?;
        eprintln!(
            "vmtrace calibrate: [{}/{total}] {}: reading the timing records",
            i + 1,
            path.display()
        );
        let mut reader = TraceReader::new(open(path)?);
        let header = reader
            .read_header()
            .with_context(|| format!("{}", path.display()))?;
        if header.synthetic.is_some() {
            anyhow::bail!(
                "{}: a synthetic trace (vmtrace synth) shows no kernel's timing; calibrate from recordings",
                path.display()
            );
        }
        machine.get_or_insert_with(|| Machine {
            kernel_release: header.system.kernel_release.clone(),
            hostname: header.system.hostname.clone(),
            possible_cpus: header.system.possible_cpus,
            online_cpus: header.system.online_cpus,
            vmap_nodes: header.vmap.nr_vmap_nodes,
        });
        let mut scan = Scan::default();
        for rec in reader.by_ref() {
            let rec = rec.with_context(|| format!("{}", path.display()))?;
            scan.record(&rec);
        }
        timings.push(TraceTiming {
            scan,
            decayed: report.purges.iter().map(|p| (p.ts_ns, p.decayed)).collect(),
            sections: report.locks,
        });
    }
    let mut cal = calibration::calibrate_with(
        &timings,
        crate::sim::timing::Costs::default(),
        machine.unwrap_or_default(),
        format!("vmtrace {}", env!("CARGO_PKG_VERSION")),
        !args.holds_from_waits,
    )?;
    for (t, path) in cal.traces.iter_mut().zip(&args.traces) {
        t.path = path.display().to_string();
    }
    let text = serde_json::to_string_pretty(&cal)? + "\n";
    if args.output.as_os_str() == "-" {
        std::io::stdout().lock().write_all(text.as_bytes())?;
        return Ok(ExitCode::SUCCESS);
    }
    std::fs::write(&args.output, &text)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        out.write_all(text.as_bytes())?;
    } else {
        out.write_all(render_calibration(&cal).as_bytes())?;
    }
    eprintln!("vmtrace calibrate: wrote {}", args.output.display());
    Ok(ExitCode::SUCCESS)
}

/// The calibration as a table: each cost, where it came from, and the hold estimates.
fn render_calibration(c: &Calibration) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Calibration from {} trace(s) on {} ({} CPUs, {} vmap nodes)",
        c.traces.len(),
        c.machine.kernel_release,
        c.machine.online_cpus,
        c.machine.vmap_nodes
    );
    let _ = writeln!(s, "  {:<22} {:>9}  {:<8}  basis", "cost", "ns", "source");
    for p in &c.provenance {
        let _ = writeln!(
            s,
            "  {:<22} {:>9}  {:<8}  {}",
            p.cost, p.ns, p.source, p.basis
        );
    }
    match &c.drain_latency {
        Some(d) => {
            let _ = writeln!(
                s,
                "  drain latency: {} items, p10 {} ns, median {} ns, p90 {} ns, max {} ns (sampled per purge)",
                d.count, d.p10_ns, d.p50_ns, d.p90_ns, d.max_ns
            );
        }
        None => {
            let _ = writeln!(
                s,
                "  drain latency: not measured (needs --probes purge_work); the fixed --purge-latency is used"
            );
        }
    }
    match &c.drain_queue {
        Some(q) => {
            let _ = writeln!(
                s,
                "  drain queue: {} of {} drains waited for deferred frees queued ahead on the unbound pool (all but {} of them run first, looked for up to {} ns after the crossing); the rule puts {} starts within 30 % or 20 µs of the recorded, the latency alone {}; base latency of the others: median {} ns, p90 {} ns",
                q.queued_behind,
                q.drains,
                q.allowance,
                q.horizon_ns,
                q.agreed,
                q.agreed_without,
                q.unblocked.p50_ns,
                q.unblocked.p90_ns
            );
        }
        None => {
            let _ = writeln!(
                s,
                "  drain queue: none (no drain items on the unbound pool, or no frees queued ahead of them that explain their latency)"
            );
        }
    }
    match &c.follow_up {
        Some(f) => {
            let n = f.counts;
            let _ = writeln!(
                s,
                "  follow-up drains (queued again while running): {} of {} items that started among frees of 2+ CPUs ({:.1} %), {} of {} that did not ({:.1} %); {} ns median from the followed item's start (sampled per purge)",
                n.concurrent_followed,
                n.concurrent_items,
                100.0 * f.probability(true),
                n.lone_followed,
                n.lone_items,
                100.0 * f.probability(false),
                f.delay.p50_ns
            );
        }
        None => {
            let _ = writeln!(
                s,
                "  follow-up drains: not measured (needs --probes purge_work); free-running replay runs none"
            );
        }
    }
    match &c.purge_span {
        Some(d) => {
            let _ = writeln!(
                s,
                "  purge span (drain start to its purge's event): {} items, median {} ns, p90 {} ns, max {} ns (sampled per purge: its batch is held back until then)",
                d.count, d.p50_ns, d.p90_ns, d.max_ns
            );
        }
        None => {
            let _ = writeln!(
                s,
                "  purge span: not measured (needs --probes purge_work); free-running purges return their batch at once"
            );
        }
    }
    for t in c.traces.iter().filter(|t| !t.mean_wait_ns.is_empty()) {
        let classes: Vec<String> = t
            .mean_wait_ns
            .iter()
            .map(|(class, ns)| format!("{} {ns:.0}", class.name()))
            .collect();
        let _ = writeln!(
            s,
            "  mean wait (ns, waits under {} µs) in {}: {}",
            crate::sim::calibration::STALL_WAIT_NS / 1000,
            if t.path.is_empty() {
                "a trace"
            } else {
                &t.path
            },
            classes.join(", ")
        );
    }
    let st = c.stalls;
    let _ = writeln!(
        s,
        "  machine stalls (no allocation or free on any CPU for {} ms or more): {}; {} ns taken out of {} of the intervals above",
        STALL_NS / 1_000_000,
        st.stalls,
        st.ns,
        st.intervals
    );
    if let Some(d) = &c.decay {
        let _ = writeln!(
            s,
            "  decays, item start to TLB flush over {} items: {:.0} ns + {:.0} ns per decayed pool entry (measured, not used: docs/model.md)",
            d.items, d.base_ns, d.per_entry_ns
        );
    }
    if let Some(d) = &c.drop_delay {
        let _ = writeln!(
            s,
            "  drain start to backlog drop: median {} ns, p90 {} ns; free rate during drains {:.2} of the rest (measured, not used: docs/model.md)",
            d.p50_ns,
            d.p90_ns,
            c.drain_free_rate_ratio.unwrap_or(f64::NAN)
        );
    }
    s
}

/// Most rounds of `--fit-costs` after the first simulation (each one a pass over the trace).
const FIT_ROUNDS: usize = 8;

/// Opens a trace, plain or compressed; only one pass can read stdin (`-`), and `run` refuses
/// more before the first.
fn open(path: &std::path::Path) -> anyhow::Result<Box<dyn BufRead + Send>> {
    crate::trace::compress::open(path).with_context(|| format!("cannot open {}", path.display()))
}
