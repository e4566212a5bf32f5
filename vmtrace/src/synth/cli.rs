//! `vmtrace synth`: the command-line edge (anyhow lives here, not below).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use super::workload::{Shape, Test};
use super::{generate, module_scaled, SynthParams, MODULE_LOOPS};
use crate::model::lazy_max_pages;

/// Options of `vmtrace synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Tests to run, as lib/test_vmalloc.c's run_test_mask: bit i enables test i (0 fix_size,
    /// 1 full_fit, 2 long_busy_list, 3 random_size, 4 fix_align, 5 random_size_align,
    /// 6 align_shift, 7 pcpu_alloc (skipped: not an alloc_vmap_area user), 8/9 kvfree_rcu,
    /// 10 vm_map_ram, 11 no_block_alloc, 12 vrealloc). Decimal or 0x hex.
    #[arg(long, default_value = "7", value_parser = parse_mask)]
    pub mask: u64,

    /// Worker threads (nr_threads), dealt to CPUs round-robin.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65535))]
    pub threads: u32,

    /// CPUs of the imagined machine: sets the vmap nodes, zone size and lazy_max_pages in the
    /// header by the kernel's rules.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub cpus: u32,

    /// Iterations of each test's loop (test_loop_count; the module's 1,000,000 makes billions
    /// of events with many threads).
    #[arg(long, default_value_t = 1000)]
    pub loops: u64,

    /// Pages for fix_size, vm_map_ram and no_block_alloc (nr_pages; 0 means 1).
    #[arg(long, default_value_t = 1)]
    pub nr_pages: u64,

    /// Seed of the random sizes, alignments and test orders.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Scale-down: full_fit_alloc_test's pairs instead of lazy_max_pages (the module's value,
    /// 57,344 at 64 CPUs, per thread).
    #[arg(long, value_name = "N")]
    pub junk: Option<u64>,

    /// Scale-down: long_busy_list_alloc_test's live areas instead of the module's 15000.
    #[arg(long, value_name = "N", default_value_t = 15000)]
    pub busy_list: u64,

    /// Delay from a free that crosses the threshold to the drain work's purge.
    #[arg(long, value_parser = crate::value_parsers::parse_duration, default_value = "1ms")]
    pub purge_latency: std::time::Duration,

    /// The per-CPU timing's costs from a `vmtrace calibrate` file (`builtin`: the one shipped
    /// for the reference machine; `none`, the default: the documented round figures, so that
    /// a seed keeps giving the same trace).
    #[arg(
        long = "costs",
        value_name = "FILE|builtin|none",
        default_value = "none"
    )]
    pub calibration: String,

    /// Output trace file (JSON Lines); a name ending in `.zst` or `.gz` compresses it; `-` writes
    /// to stdout.
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
}

pub(crate) fn parse_mask(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("`{s}` is not a mask ({e}); give a number such as 7 or 0x1f"))
}

/// Writes the trace and a one-line summary on stderr.
pub fn run(args: &SynthArgs) -> anyhow::Result<ExitCode> {
    let p = SynthParams {
        mask: args.mask,
        threads: args.threads,
        cpus: args.cpus,
        loops: args.loops,
        nr_pages: args.nr_pages,
        seed: args.seed,
        junk: args.junk,
        busy_list: args.busy_list,
        purge_latency_ns: u64::try_from(args.purge_latency.as_nanos()).unwrap_or(u64::MAX),
        ..SynthParams::default()
    };
    let p = match crate::replay::cli::load_calibration(&args.calibration)? {
        Some(c) => SynthParams {
            costs: c.costs,
            ..p
        },
        None => p,
    };
    let argv: Vec<String> = std::env::args().collect();
    let out: Box<dyn Write> = if args.output.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        crate::trace::compress::create(&args.output)
            .with_context(|| format!("cannot create {}", args.output.display()))?
    };
    let s = generate(&p, argv, out).context("generating the synthetic trace")?;
    if s.tests.is_empty() {
        eprintln!("vmtrace synth: mask {:#x} enables no test that goes through alloc_vmap_area; the trace has no events", args.mask);
    }
    if let Some(note) = setup_note(&p) {
        eprintln!("{note}");
    }
    eprintln!(
        "vmtrace synth: {} lines, {} alloc ({} failed attempts), {} free, {} purge over {:.3} ms; tests: {}",
        s.lines,
        s.events.alloc,
        s.failed_attempts,
        s.events.free,
        s.events.purge,
        s.duration_ns as f64 / 1e6,
        s.tests.join(", ")
    );
    Ok(ExitCode::SUCCESS)
}

/// A warning when the setup bursts of full_fit and long_busy_list (which no vmap-node pool can
/// serve) are most of the trace's allocations: `--loops` scales the loops down from the
/// module's 1,000,000 but `--junk` and `--busy-list` default to the module's full sizes, so a
/// what-if comparison of such a trace says little about the module's own mix.
fn setup_note(p: &SynthParams) -> Option<String> {
    let full_junk = lazy_max_pages(p.cpus, 4096);
    let shape = |loops: u64, junk: u64, busy_list: u64| Shape {
        loops,
        nr_pages: p.nr_pages,
        junk,
        busy_list,
        page_size: 4096,
    };
    let share = |s: &Shape| {
        let (setup, looped) = Test::from_mask(p.mask)
            .iter()
            .map(|t| t.allocs_per_thread(s))
            .fold((0u64, 0u64), |a, b| (a.0 + b.0, a.1 + b.1));
        setup as f64 / (setup + looped).max(1) as f64
    };
    let here = share(&shape(p.loops, p.junk.unwrap_or(full_junk), p.busy_list));
    if here <= 0.5 || p.loops >= MODULE_LOOPS {
        return None;
    }
    let module = share(&shape(MODULE_LOOPS, full_junk, 15000));
    let scaled = |n: u64| module_scaled(n, p.loops);
    let tests = Test::from_mask(p.mask);
    let mut flags = Vec::new();
    if tests.contains(&Test::FullFit) {
        flags.push(format!("--junk {}", scaled(full_junk)));
    }
    if tests.contains(&Test::LongBusyList) {
        flags.push(format!("--busy-list {}", scaled(15000)));
    }
    Some(format!(
        "vmtrace synth: note: {:.0} % of the allocations are setup bursts (full_fit's arrays and junk pairs, long_busy_list's live list), which the vmap-node pools can serve only from what earlier purges left in them; with the module's {MODULE_LOOPS} loops they would be {:.1} %. To keep the module's mix at --loops {}, add {} (or raise --loops)",
        100.0 * here,
        100.0 * module,
        p.loops,
        flags.join(" "),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_note_flags_the_default_mask_7_mix() {
        let p = SynthParams {
            mask: 7,
            threads: 64,
            cpus: 64,
            loops: 1000,
            ..SynthParams::default()
        };
        let note = setup_note(&p).expect("97 % setup must be flagged");
        assert!(note.contains("97 %"), "{note}");
        assert!(note.contains("--junk 58 --busy-list 15"), "{note}");
        // Scaled as suggested, or fix_size alone: no note.
        let scaled = SynthParams {
            junk: Some(58),
            busy_list: 15,
            ..p.clone()
        };
        assert!(setup_note(&scaled).is_none());
        assert!(setup_note(&SynthParams { mask: 1, ..p }).is_none());
    }
}
