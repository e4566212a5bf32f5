//! `vmtrace whatif`: the command-line edge (anyhow lives here, not below).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;

use super::{parallel, run_point, Point, Row, Sweep, TracePoint, WhatifError};
use crate::model::Variant;
use crate::replay::charts::{escape_html, write_line_chart, LineChart};
use crate::replay::free_run::{free_run, FreeRunOptions};
use crate::synth::{module_scaled, SynthParams};

/// long_busy_list_alloc_test's live areas in the module.
const MODULE_BUSY_LIST: u64 = 15_000;

/// Options of `vmtrace whatif`.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  vmtrace whatif --mask 127 --threads 64,128,256 --cpus 128 --variant nodes --variant nodes-capped
  vmtrace whatif --mask 1 --threads 8 --cpus 2,8,32,128 --json
  vmtrace whatif --trace fix16.jsonl.zst --cpus 2,16,64 --report sweep/

Each row is one free-running replay: the model picks every address and purges on its own
threshold, and the lock simulation predicts the waits (docs/whatif.md). The synthetic stream
is the one `vmtrace synth` writes for the same options, so a row can be checked with
`vmtrace synth ... | vmtrace replay --free-running -`.")]
pub struct WhatifArgs {
    /// Tests of lib/test_vmalloc.c, as its run_test_mask (bit i enables test i; see
    /// `vmtrace synth --help`). Decimal or 0x hex.
    #[arg(long, default_value = "7", value_parser = crate::synth::cli::parse_mask, conflicts_with = "trace")]
    pub mask: u64,

    /// Worker threads (nr_threads), comma-separated: one sweep point each.
    #[arg(long, value_delimiter = ',', default_value = "64,128,256", value_parser = clap::value_parser!(u32).range(1..=65535), conflicts_with = "trace")]
    pub threads: Vec<u32>,

    /// CPUs of the imagined machine, comma-separated (default 128): the vmap nodes, zone size
    /// and lazy_max_pages follow the kernel's rules. With --trace: the machines to replay the
    /// recording on (its tasks keep their recorded CPUs; default: as recorded).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub cpus: Vec<u32>,

    /// With --trace: vmap node counts to replay the recording with, comma-separated
    /// (everything else as recorded).
    #[arg(long, value_delimiter = ',', requires = "trace", value_parser = clap::value_parser!(u32).range(1..=128))]
    pub nodes: Vec<u32>,

    /// Iterations of each test's loop (test_loop_count; the module's own is 1,000,000). By the
    /// default purges, and mask 7's pool and lock figures, have settled; mask 127's need about
    /// 10,000 (docs/whatif.md, "Loop count").
    #[arg(long, default_value_t = DEFAULT_LOOPS)]
    pub loops: u64,

    /// Pages for fix_size, vm_map_ram and no_block_alloc (nr_pages).
    #[arg(long, default_value_t = 1)]
    pub nr_pages: u64,

    /// full_fit_alloc_test's junk pairs per thread. Default: the module's (lazy_max_pages of
    /// the point's CPUs) scaled by --loops / 1,000,000, so that a shorter run keeps the
    /// module's mix of setup bursts and looped allocations (docs/whatif.md, "Setup sizes").
    #[arg(long, value_name = "N")]
    pub junk: Option<u64>,

    /// long_busy_list_alloc_test's live areas. Default: the module's 15000 scaled like --junk.
    #[arg(long, value_name = "N")]
    pub busy_list: Option<u64>,

    /// Keep the module's full setup sizes (junk = lazy_max_pages, 15000 busy areas) at any
    /// --loops, as `vmtrace synth` does by default; below the module's loop count the setup
    /// bursts then dominate the allocations.
    #[arg(long, conflicts_with_all = ["junk", "busy_list"])]
    pub module_sizes: bool,

    /// Allocator designs to compare (repeat): `nodes`, `nodes-capped`, `global`. Default: all.
    #[arg(long = "variant", value_name = "V", value_parser = crate::replay::cli::parse_variant)]
    pub variants: Vec<Variant>,

    /// Inputs of the timing model and lock simulation: a `vmtrace calibrate` file, `builtin`
    /// (the shipped calibration, the default) or `none` (documented round figures). The
    /// synthetic workload's timestamps use the same costs.
    #[arg(
        long = "costs",
        value_name = "FILE|builtin|none",
        default_value = "builtin"
    )]
    pub calibration: String,

    /// Seed of the workload's random sizes and orders and of the simulation's samples.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Run every point with this many seeds (--seed, --seed + 1, …) and give the mean, with
    /// the lowest and highest value of the main figures (page-table counts move a lot from
    /// seed to seed; docs/whatif.md, "Loop count"). With --trace only the simulation's
    /// samples change.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub seeds: u32,

    /// Replay this recorded trace instead of a synthetic workload, over --cpus or --nodes.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,

    /// Print the rows as a JSON array instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Write charts (page-table pages against threads, lock-wait share against CPUs, per
    /// variant) and an index.html with the table into DIR.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,

    /// Sweep points run in parallel on this many threads (default: every CPU).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
}

/// The default `--loops`: see docs/whatif.md ("Loop count") for the figures against it.
pub const DEFAULT_LOOPS: u64 = 1000;

pub fn run(args: &WhatifArgs) -> anyhow::Result<ExitCode> {
    let variants = if args.variants.is_empty() {
        vec![Variant::Nodes, Variant::NodesCapped, Variant::Global]
    } else {
        args.variants.clone()
    };
    let calibration = crate::replay::cli::load_calibration(&args.calibration)?;
    let mut fr = FreeRunOptions {
        seed: args.seed,
        ..FreeRunOptions::default()
    };
    if let Some(c) = &calibration {
        fr = fr.calibrated(c);
    }
    let workers = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let started = Instant::now();
    let rows = match &args.trace {
        Some(trace) => sweep_trace(args, trace, &variants, &fr, workers)?,
        None => sweep_synthetic(args, &variants, &fr, calibration.as_ref(), workers)?,
    };
    let elapsed = started.elapsed();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", render_table(&rows));
    }
    if let Some(c) = crate::replay::checked::CalibrationCheck::for_costs(&args.calibration, false) {
        eprint!("{}", c.render("vmtrace whatif: "));
    }
    let allocs: u64 = rows.iter().map(|r| r.allocs * u64::from(r.seeds)).sum();
    eprintln!(
        "vmtrace whatif: {} rows, {} allocations replayed in {:.1} s ({:.2} M allocations/s on {} worker threads)",
        rows.len(),
        allocs,
        elapsed.as_secs_f64(),
        allocs as f64 / elapsed.as_secs_f64().max(1e-9) / 1e6,
        workers
    );
    if let Some(dir) = &args.report {
        let files = write_report(dir, &rows, args)
            .with_context(|| format!("writing the report into {}", dir.display()))?;
        eprintln!(
            "vmtrace whatif: report: {} files in {}; open {}",
            files.len(),
            dir.display(),
            dir.join("index.html").display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn sweep_synthetic(
    args: &WhatifArgs,
    variants: &[Variant],
    fr: &FreeRunOptions,
    calibration: Option<&crate::sim::calibration::Calibration>,
    workers: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut base = SynthParams {
        mask: args.mask,
        loops: args.loops,
        nr_pages: args.nr_pages,
        seed: args.seed,
        junk: args.junk,
        busy_list: match (args.busy_list, args.module_sizes) {
            (Some(n), _) => n,
            (None, true) => MODULE_BUSY_LIST,
            (None, false) => module_scaled(MODULE_BUSY_LIST, args.loops),
        },
        ..SynthParams::default()
    };
    if let Some(c) = calibration {
        base.costs = c.costs;
    }
    if crate::synth::workload::Test::from_mask(args.mask).is_empty() {
        anyhow::bail!(
            "mask {:#x} enables no test that goes through alloc_vmap_area",
            args.mask
        );
    }
    let sweep = Sweep {
        base,
        threads: args.threads.clone(),
        cpus: if args.cpus.is_empty() {
            vec![128]
        } else {
            args.cpus.clone()
        },
        variants: variants.to_vec(),
        free_run: fr.clone(),
        scale_setup: !args.module_sizes,
    };
    let junks: Vec<String> = sweep
        .cpus
        .iter()
        .map(|&c| format!("{} at {c} CPUs", sweep.junk(c)))
        .collect();
    eprintln!(
        "vmtrace whatif: {} loops; full_fit junk pairs per thread: {}; long_busy_list areas: {}{}",
        args.loops,
        junks.join(", "),
        sweep.base.busy_list,
        if args.module_sizes || args.junk.is_some() || args.busy_list.is_some() {
            ""
        } else {
            " (the module's sizes scaled by loops / 1,000,000; --module-sizes keeps them whole)"
        }
    );
    if let Some(c) = calibration {
        let nodes: Vec<u32> = sweep.cpus.iter().map(|&c| c.clamp(1, 128)).collect();
        if c.machine.vmap_nodes != 0 && nodes.iter().any(|&n| n != c.machine.vmap_nodes) {
            eprintln!(
                "vmtrace whatif: note: the costs were calibrated on a machine with {} vmap nodes ({} CPUs); drain and purge timing change with the nodes a purge walks, so predictions for other CPU counts carry that machine's timing",
                c.machine.vmap_nodes, c.machine.possible_cpus
            );
        }
    }
    let seeds: Vec<u64> = (0..u64::from(args.seeds))
        .map(|i| args.seed.wrapping_add(i))
        .collect();
    let sweeps: Vec<Sweep> = seeds.iter().map(|&s| sweep.with_seed(s)).collect();
    let jobs: Vec<(Point, Variant, usize)> = sweep
        .jobs()
        .into_iter()
        .flat_map(|(p, v)| (0..sweeps.len()).map(move |i| (p, v, i)))
        .collect();
    let total: u64 = jobs.iter().map(|(p, _, _)| sweep.expected_allocs(*p)).sum();
    let done = AtomicU64::new(0);
    let results = with_progress(total, &done, || {
        parallel(&jobs, workers, |&(p, v, i)| {
            run_point(&sweeps[i], p, v, &done).map(|w| Row::new(Some(p.threads), p.cpus, &w))
        })
    });
    let rows = results
        .into_iter()
        .collect::<Result<Vec<_>, WhatifError>>()?;
    let order = |v: Variant| variants.iter().position(|&x| x == v);
    Ok(mean_per_point(rows.into_iter().map(|r| {
        let key = (
            Point {
                cpus: r.cpus,
                threads: r.threads.unwrap_or(0),
            },
            order(r.variant),
        );
        (key, r)
    })))
}

/// One row per key (point and variant), the mean over its seeds, in key order.
fn mean_per_point<K: Ord>(rows: impl Iterator<Item = (K, Row)>) -> Vec<Row> {
    let mut groups: std::collections::BTreeMap<K, Vec<Row>> = std::collections::BTreeMap::new();
    for (k, r) in rows {
        groups.entry(k).or_default().push(r);
    }
    groups.values().filter_map(|g| Row::mean(g)).collect()
}

fn sweep_trace(
    args: &WhatifArgs,
    trace: &std::path::Path,
    variants: &[Variant],
    fr: &FreeRunOptions,
    workers: usize,
) -> anyhow::Result<Vec<Row>> {
    let header = crate::trace::TraceReader::new(open(trace)?)
        .read_header()
        .with_context(|| format!("reading the header of {}", trace.display()))?;
    let page = header.system.page_size;
    let mut points: Vec<TracePoint> = args.cpus.iter().map(|&c| TracePoint::Cpus(c)).collect();
    points.extend(args.nodes.iter().map(|&n| TracePoint::Nodes(n)));
    if points.is_empty() {
        points.push(TracePoint::AsRecorded);
    }
    let seeds = u64::from(args.seeds);
    let jobs: Vec<(usize, Variant, u64)> = (0..points.len())
        .flat_map(|p| variants.iter().map(move |&v| (p, v)))
        .flat_map(|(p, v)| (0..seeds).map(move |i| (p, v, i)))
        .collect();
    let recorded_cpus = header.system.possible_cpus;
    let results = parallel(
        &jobs,
        workers,
        |&(pi, v, i)| -> anyhow::Result<(usize, Row)> {
            let p = points[pi];
            let fr = FreeRunOptions {
                seed: args.seed.wrapping_add(i),
                ..fr.clone()
            };
            let w = free_run(open(trace)?, &p.options(v, page), &fr).map_err(|source| {
                WhatifError::Trace {
                    what: format!("{} on {}", trace.display(), p.describe()),
                    variant: v.name(),
                    source,
                }
            })?;
            let cpus = match p {
                TracePoint::Cpus(c) => c,
                _ => recorded_cpus,
            };
            Ok((pi, Row::new(None, cpus, &w)))
        },
    );
    let rows = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let order = |v: Variant| variants.iter().position(|&x| x == v);
    Ok(mean_per_point(
        rows.into_iter().map(|(pi, r)| ((pi, order(r.variant)), r)),
    ))
}

fn open(path: &std::path::Path) -> anyhow::Result<Box<dyn std::io::BufRead + Send>> {
    crate::trace::compress::open(path).with_context(|| format!("cannot open {}", path.display()))
}

/// Runs `work` with a progress bar on stderr (drawn only on a terminal) fed by `done`.
fn with_progress<T>(total: u64, done: &AtomicU64, work: impl FnOnce() -> T) -> T {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {human_pos}/{human_len} allocations ({per_sec}, {eta} left)",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let stop = AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                bar.set_position(done.load(Ordering::Relaxed).min(total));
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let out = work();
        stop.store(true, Ordering::Relaxed);
        out
    });
    bar.finish_and_clear();
    out
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// The sweep as a text table, one row per (point, variant); with several seeds, the range of
/// page-table pages and lock-wait share over them beside the means.
pub fn render_table(rows: &[Row]) -> String {
    let spread = rows.iter().any(|r| r.spread.is_some());
    let mut s = String::new();
    if let Some(r) = rows.iter().find(|r| r.seeds > 1) {
        let _ = writeln!(
            s,
            "means over {} seeds; [lowest-highest] beside them",
            r.seeds
        );
    }
    let _ = write!(
        s,
        "{:>7} {:>5} {:<12} {:>9} {:>8} {:>6} ",
        "threads", "cpus", "variant", "PT pages", "PTE", "PMD"
    );
    if spread {
        let _ = write!(s, "{:>13} ", "[PT range]");
    }
    let _ = write!(
        s,
        "{:>10} {:>7} {:>8} {:>6} {:>7} ",
        "VA MiB", "purges", "npurged", "pool%", "wait%"
    );
    if spread {
        let _ = write!(s, "{:>13} ", "[wait% range]");
    }
    let _ = writeln!(
        s,
        " {:<22} {:>9} {:>10}",
        "top wait class", "Mops/s", "makespan"
    );
    for r in rows {
        let top = match r.top_wait_class {
            Some(c) => format!("{} ({:.0} %)", c.name(), 100.0 * r.top_wait_class_share),
            None => "-".into(),
        };
        let _ = write!(
            s,
            "{:>7} {:>5} {:<12} {:>9} {:>8} {:>6} ",
            r.threads.map_or("trace".into(), |t| t.to_string()),
            r.cpus,
            r.variant.name(),
            r.page_table_pages,
            r.pte_pages,
            r.pmd_pages,
        );
        if spread {
            let range = r.spread.as_ref().map_or(String::new(), |sp| {
                format!(
                    "[{:.0}-{:.0}]",
                    sp.page_table_pages.min, sp.page_table_pages.max
                )
            });
            let _ = write!(s, "{range:>13} ");
        }
        let _ = write!(
            s,
            "{:>10.1} {:>7} {:>8.0} {:>6.1} {:>7.2} ",
            mib(r.high_water_bytes),
            r.purges,
            r.npurged_mean,
            100.0 * r.pool_hit_share,
            100.0 * r.lock_wait_share,
        );
        if spread {
            let range = r.spread.as_ref().map_or(String::new(), |sp| {
                format!(
                    "[{:.1}-{:.1}]",
                    100.0 * sp.lock_wait_share.min,
                    100.0 * sp.lock_wait_share.max
                )
            });
            let _ = write!(s, "{range:>13} ");
        }
        let _ = writeln!(
            s,
            " {:<22} {:>9.3} {:>8.1}ms",
            top,
            r.throughput_ops_per_s / 1e6,
            r.makespan_ns as f64 / 1e6
        );
    }
    s
}

/// Charts of the sweep and an index.html with its table.
fn write_report(
    dir: &std::path::Path,
    rows: &[Row],
    args: &WhatifArgs,
) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut files = Vec::new();
    let variants: Vec<Variant> = {
        let mut v: Vec<Variant> = rows.iter().map(|r| r.variant).collect();
        v.dedup();
        v.sort_by_key(|x| rows.iter().position(|r| r.variant == *x));
        v.dedup();
        v
    };
    let max_cpus = rows.iter().map(|r| r.cpus).max().unwrap_or(0);
    let max_threads = rows.iter().filter_map(|r| r.threads).max();
    let lines = |pick: &dyn Fn(&Row) -> Option<(f64, f64)>| -> Vec<(Variant, Vec<(f64, f64)>)> {
        variants
            .iter()
            .map(|&v| {
                let mut pts: Vec<(f64, f64)> = rows
                    .iter()
                    .filter(|r| r.variant == v)
                    .filter_map(pick)
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                (v, pts)
            })
            .collect()
    };
    let charts = [
        (
            "page_tables_vs_threads",
            LineChart {
                title: format!("Page-table pages against threads ({max_cpus} CPUs)"),
                x_desc: "worker threads".into(),
                y_desc: "page-table pages (PTE + PMD)".into(),
                log2_x: true,
                lines: lines(&|r| {
                    (r.cpus == max_cpus)
                        .then_some(r.threads)
                        .flatten()
                        .map(|t| (f64::from(t), r.page_table_pages as f64))
                }),
            },
        ),
        (
            "lock_wait_vs_cpus",
            LineChart {
                title: match max_threads {
                    Some(t) => format!("Lock-wait share against CPUs ({t} threads)"),
                    None => "Lock-wait share against CPUs (recorded trace)".into(),
                },
                x_desc: "CPUs".into(),
                y_desc: "predicted lock wait / (wait + work), %".into(),
                log2_x: true,
                lines: lines(&|r| {
                    (r.threads == max_threads)
                        .then(|| (f64::from(r.cpus), 100.0 * r.lock_wait_share))
                }),
            },
        ),
        (
            "throughput_vs_threads",
            LineChart {
                title: format!("Predicted throughput against threads ({max_cpus} CPUs)"),
                x_desc: "worker threads".into(),
                y_desc: "allocations and frees per second (millions)".into(),
                log2_x: true,
                lines: lines(&|r| {
                    (r.cpus == max_cpus)
                        .then_some(r.threads)
                        .flatten()
                        .map(|t| (f64::from(t), r.throughput_ops_per_s / 1e6))
                }),
            },
        ),
    ];
    for (stem, chart) in &charts {
        write_line_chart(dir, stem, chart, &mut files)?;
    }
    let mut html = String::from(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>vmtrace whatif</title>\n<style>body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;padding:1em}img{max-width:100%}</style></head><body>\n<h1>vmtrace whatif</h1>\n",
    );
    let argv: Vec<String> = std::env::args().collect();
    let _ = writeln!(html, "<p><code>{}</code></p>", escape_html(&argv.join(" ")));
    let _ = writeln!(
        html,
        "<p>Loops {}, mask {:#x}{}. Each row is one free-running replay (docs/whatif.md).</p>",
        args.loops,
        args.mask,
        args.trace
            .as_ref()
            .map(|t| format!(", trace {}", escape_html(&t.display().to_string())))
            .unwrap_or_default()
    );
    let _ = writeln!(html, "<pre>{}</pre>", escape_html(&render_table(rows)));
    if let Some(c) = crate::replay::checked::CalibrationCheck::for_costs(&args.calibration, false) {
        let _ = writeln!(html, "<pre>{}</pre>", escape_html(&c.render("")));
    }
    for (stem, chart) in &charts {
        let _ = writeln!(
            html,
            "<figure><img src=\"{stem}.svg\" alt=\"{t}\"><figcaption>{t} (<a href=\"{stem}.png\">PNG</a>)</figcaption></figure>",
            t = escape_html(&chart.title)
        );
    }
    html.push_str("</body></html>\n");
    let path = dir.join("index.html");
    std::fs::write(&path, html).with_context(|| format!("cannot write {}", path.display()))?;
    files.push(path);
    Ok(files)
}
