//! `vmtrace stress`: user-space vmalloc workloads shaped like `lib/test_vmalloc.c`.
//!
//! No kernel module can be loaded on the machines vmtrace runs on, so the kernel's own vmalloc test
//! cannot run. Two user-space levers reach vmalloc with sizes we control:
//!
//! - **BPF array maps** with `BPF_F_MMAPABLE` ([`bpfmap`]): always vmalloc'ed, exact in pages,
//!   freed (lazily) when the fd is closed. A map of N data pages is a vmap area of N + 2 pages.
//! - **Thread creation**: kernel stacks are vmalloc'ed (`CONFIG_VMAP_STACK`), 16 KiB + guard.
//!
//! [`patterns`] lists the patterns and the vmap area sizes each produces; `docs/stress.md` is the
//! user documentation. The public entry points are [`run_stress`] (library, used by tests) and
//! [`run`] (the CLI), and [`fix_size_area_bytes`] / [`area_bytes`] for the sizes to expect.

pub mod bpfmap;
pub mod error;
pub mod limits;
pub mod patterns;
pub mod report;
pub mod rng;

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;

pub use bpfmap::{map_areas, ArrayMap, MapAreas, MapSizing, VaReservation};
pub use error::WorkloadError;
pub use patterns::{
    area_bytes, fix_size_area_bytes, full_fit_default_pairs, thread_stack_area_bytes, Count, Held,
    Pattern, Prepared, Shape, Workload,
};
pub use report::{StressReport, ThreadReport};
pub use rng::SplitMix64;

/// Loops per worker when neither --loops nor --duration is given (map patterns): a fraction of a
/// second at the ~70k maps/s one CPU manages.
pub const DEFAULT_LOOPS: u64 = 20_000;
/// Loops (batches) per worker for thread-churn when neither --loops nor --duration is given.
pub const DEFAULT_THREAD_CHURN_LOOPS: u64 = 1_000;
/// Most worker threads.
pub const MAX_THREADS: u32 = 1024;
/// Runs shorter than this print no progress line.
const PROGRESS_AFTER: Duration = Duration::from_secs(2);
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Arguments of `vmtrace stress`.
#[derive(Debug, Clone, Args)]
#[command(
    after_help = "An op is one vmap-area allocation and its free: one BPF array map \
    created and closed, or one thread started and joined. Sizes each pattern produces, and how \
    they were verified, are in docs/stress.md. Needs root or CAP_BPF, except thread-churn."
)]
pub struct StressArgs {
    /// Workload shape (after lib/test_vmalloc.c).
    #[arg(value_enum)]
    pub pattern: Pattern,

    /// Data pages per map: fix-size (default 16), upper bound of random-size (default 100),
    /// long-busy-list's large churned map (default 100). A map of N pages is a vmap area of N + 2
    /// pages.
    #[arg(short = 'p', long, value_name = "N")]
    pub pages: Option<u64>,

    /// long-busy-list: 1-page maps kept alive during the run (default 15000; one fd each).
    #[arg(long, value_name = "K")]
    pub keep: Option<u64>,

    /// full-fit: pairs of 1-page maps to fill with (default lazy_max_pages = fls(online CPUs) ×
    /// 32 MiB / page size, lowered to fit RLIMIT_NOFILE; two fds per pair during the fill).
    #[arg(long, value_name = "P")]
    pub pairs: Option<u64>,

    /// thread-churn: threads alive at once per loop (default 16).
    #[arg(long, value_name = "B")]
    pub batch: Option<u64>,

    /// Worker threads.
    #[arg(short = 't', long, default_value_t = 1, value_name = "T",
          value_parser = clap::value_parser!(u32).range(1..=MAX_THREADS as i64))]
    pub threads: u32,

    /// Loop iterations per worker (default 20000; thread-churn 1000).
    #[arg(short = 'l', long, value_name = "L", conflicts_with = "duration",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub loops: Option<u64>,

    /// Run for this long instead of a loop count (e.g. `10s`, `500ms`).
    #[arg(short = 'd', long, value_name = "D", value_parser = crate::value_parsers::parse_duration)]
    pub duration: Option<Duration>,

    /// Seed of the PRNG (random-size); the same seed gives the same sizes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Print the result as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// When a worker stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopAt {
    /// After this many loop iterations.
    Loops(u64),
    /// After this much time from the common start.
    Duration(Duration),
}

/// A fully resolved stress run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StressConfig {
    pub shape: Shape,
    pub threads: u32,
    pub stop: StopAt,
    pub seed: u64,
}

fn online_cpus() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u64::try_from(n).unwrap_or(1).max(1)
}

impl StressConfig {
    /// Resolves the command line: pattern defaults, options that do not apply, ranges.
    pub fn from_args(args: &StressArgs) -> Result<Self, WorkloadError> {
        let pattern = args.pattern;
        let not_for = |flag: &str, given: bool| {
            if given {
                Err(WorkloadError::InvalidArgs(format!(
                    "{flag} does not apply to {pattern}"
                )))
            } else {
                Ok(())
            }
        };
        let pages = |default: u64| args.pages.unwrap_or(default);
        let count = |v: Option<u64>, default: u64| match v {
            Some(n) => Count { n, explicit: true },
            None => Count {
                n: default,
                explicit: false,
            },
        };
        not_for(
            "--keep",
            args.keep.is_some() && pattern != Pattern::LongBusyList,
        )?;
        not_for(
            "--pairs",
            args.pairs.is_some() && pattern != Pattern::FullFit,
        )?;
        not_for(
            "--batch",
            args.batch.is_some() && pattern != Pattern::ThreadChurn,
        )?;
        let shape = match pattern {
            Pattern::FixSize => Shape::FixSize {
                pages: pages(patterns::DEFAULT_FIX_SIZE_PAGES),
            },
            Pattern::RandomSize => Shape::RandomSize {
                max_pages: pages(patterns::DEFAULT_RANDOM_SIZE_PAGES),
            },
            Pattern::LongBusyList => Shape::LongBusyList {
                keep: count(args.keep, patterns::DEFAULT_KEEP),
                pages: pages(patterns::DEFAULT_LONG_BUSY_LIST_PAGES),
            },
            Pattern::FullFit => {
                not_for("--pages (full-fit uses 1-page maps)", args.pages.is_some())?;
                let page_size = bpfmap::page_size()?;
                Shape::FullFit {
                    pairs: count(args.pairs, full_fit_default_pairs(online_cpus(), page_size)),
                }
            }
            Pattern::ThreadChurn => {
                not_for("--pages", args.pages.is_some())?;
                Shape::ThreadChurn {
                    batch: args.batch.unwrap_or(patterns::DEFAULT_BATCH),
                }
            }
        };
        patterns::validate(&shape)?;
        if !(1..=MAX_THREADS).contains(&args.threads) {
            return Err(WorkloadError::InvalidArgs(format!(
                "--threads {} is out of range: expected 1..={MAX_THREADS}",
                args.threads
            )));
        }
        let stop = match (args.loops, args.duration) {
            (Some(_), Some(_)) => {
                return Err(WorkloadError::InvalidArgs(
                    "give either --loops or --duration, not both".into(),
                ))
            }
            (Some(0), None) => {
                return Err(WorkloadError::InvalidArgs(
                    "--loops 0: expected at least 1".into(),
                ))
            }
            (Some(n), None) => StopAt::Loops(n),
            (None, Some(d)) if d.is_zero() => {
                return Err(WorkloadError::InvalidArgs(
                    "--duration 0: expected a positive duration such as `500ms`".into(),
                ))
            }
            (None, Some(d)) => StopAt::Duration(d),
            (None, None) if pattern == Pattern::ThreadChurn => {
                StopAt::Loops(DEFAULT_THREAD_CHURN_LOOPS)
            }
            (None, None) => StopAt::Loops(DEFAULT_LOOPS),
        };
        Ok(Self {
            shape,
            threads: args.threads,
            stop,
            seed: args.seed,
        })
    }
}

/// Progress of a running stress, handed to the observer of [`run_stress`] once a second on runs
/// longer than two seconds.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub pattern: Pattern,
    pub elapsed: Duration,
    pub total_ops: u64,
    /// Ops per second since the previous call.
    pub recent_ops_per_sec: f64,
}

/// A per-worker op counter on its own cache line, read by the progress loop.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Counter(AtomicU64);

struct WorkerResult {
    ops: u64,
    elapsed: Duration,
}

fn worker(
    workload: &Workload,
    cfg: &StressConfig,
    index: u32,
    gate: &patterns::Gate,
    start: &std::sync::OnceLock<Instant>,
    abort: &AtomicBool,
    counter: &Counter,
) -> Result<WorkerResult, WorkloadError> {
    let mut rng = SplitMix64::for_worker(cfg.seed, index);
    gate.wait();
    let start = *start.get_or_init(Instant::now);
    let mut ops = 0u64;
    let mut loops = 0u64;
    loop {
        if abort.load(Ordering::Relaxed) {
            break;
        }
        match cfg.stop {
            StopAt::Loops(n) if loops >= n => break,
            StopAt::Duration(d) if start.elapsed() >= d => break,
            _ => {}
        }
        match workload.run_loop(&mut rng) {
            Ok(held) => {
                ops += held.ops();
                drop(held);
            }
            Err(e) => {
                abort.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
        loops += 1;
        counter.0.store(ops, Ordering::Relaxed);
    }
    Ok(WorkerResult {
        ops,
        elapsed: start.elapsed(),
    })
}

/// Runs a stress workload: checks privileges, sets up what the pattern keeps alive, runs
/// `cfg.threads` workers from a common start until `cfg.stop`, and reports ops per thread and in
/// total. `progress` is called about once a second on runs longer than two seconds.
pub fn run_stress(
    cfg: &StressConfig,
    progress: &mut dyn FnMut(&Progress),
) -> Result<StressReport, WorkloadError> {
    let workload = Workload::new(cfg.shape)?;
    run_workload(&workload, cfg, progress)
}

/// [`run_stress`] on an already checked [`Workload`].
pub fn run_workload(
    workload: &Workload,
    cfg: &StressConfig,
    progress: &mut dyn FnMut(&Progress),
) -> Result<StressReport, WorkloadError> {
    let setup_start = Instant::now();
    let mut prepared = workload.prepare(cfg.threads)?;
    let setup = setup_start.elapsed();

    let gate = patterns::Gate::default();
    let start = std::sync::OnceLock::new();
    let abort = AtomicBool::new(false);
    let counters: Vec<Counter> = (0..cfg.threads).map(|_| Counter::default()).collect();

    let (results, elapsed) = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(counters.len());
        for (i, counter) in (0u32..).zip(&counters) {
            let (gate, start, abort) = (&gate, &start, &abort);
            let spawned = std::thread::Builder::new()
                .name(format!("stress-{i}"))
                .spawn_scoped(s, move || {
                    worker(workload, cfg, i, gate, start, abort, counter)
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    abort.store(true, Ordering::Relaxed);
                    gate.open();
                    for h in handles {
                        let _ = h.join();
                    }
                    return (vec![Err(WorkloadError::Spawn(e))], Duration::ZERO);
                }
            }
        }
        let t0 = *start.get_or_init(Instant::now);
        gate.open();

        let (mut last_t, mut last_ops) = (Duration::ZERO, 0u64);
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
            let now = t0.elapsed();
            if now >= PROGRESS_AFTER && now - last_t >= PROGRESS_EVERY {
                let total: u64 = counters.iter().map(|c| c.0.load(Ordering::Relaxed)).sum();
                progress(&Progress {
                    pattern: cfg.shape.pattern(),
                    elapsed: now,
                    total_ops: total,
                    recent_ops_per_sec: report::rate(total.saturating_sub(last_ops), now - last_t),
                });
                (last_t, last_ops) = (now, total);
            }
        }
        let results: Vec<Result<WorkerResult, WorkloadError>> = (0u32..)
            .zip(handles)
            .map(|(i, h)| h.join().unwrap_or(Err(WorkloadError::WorkerPanicked(i))))
            .collect();
        // Elapsed of the whole run: until the last worker finished.
        let elapsed = results
            .iter()
            .filter_map(|r| r.as_ref().ok().map(|w| w.elapsed))
            .max()
            .unwrap_or_default();
        (results, elapsed)
    });

    let mut per_thread = Vec::with_capacity(results.len());
    for (i, r) in (0u32..).zip(results) {
        let w = r?;
        per_thread.push(ThreadReport {
            thread: i,
            ops: w.ops,
            ops_per_sec: report::rate(w.ops, w.elapsed),
            elapsed_s: w.elapsed.as_secs_f64(),
        });
    }
    let total_ops = per_thread.iter().map(|t| t.ops).sum();
    let live_areas = prepared.live_areas();
    let notes = std::mem::take(&mut prepared.notes);
    drop(prepared);
    Ok(StressReport {
        pattern: cfg.shape.pattern(),
        threads: cfg.threads,
        elapsed_s: elapsed.as_secs_f64(),
        total_ops,
        ops_per_sec: report::rate(total_ops, elapsed),
        per_thread,
        area_bytes: workload.area_bytes(),
        page_size: workload.page_size(),
        op: cfg.shape.op_description(),
        seed: cfg.seed,
        live_areas,
        setup_s: setup.as_secs_f64(),
        map_sizing: workload.sizing(),
        notes,
    }
    .with_notes(workload, &cfg.shape))
}

impl StressReport {
    fn with_notes(mut self, workload: &Workload, shape: &Shape) -> Self {
        if workload.sizing() == MapSizing::PowerOfTwo && shape.uses_bpf() {
            self.notes.push(
                "no CAP_PERFMON: the kernel rounds map sizes up to a power of two pages \
                 (Spectre v1 hardening); area_bytes accounts for it"
                    .into(),
            );
        }
        self
    }
}

/// `vmtrace stress`: runs the workload and prints the result (text, or one JSON object with
/// `--json`). Progress goes to stderr once a second on runs over two seconds, only when stderr is
/// a terminal.
pub fn run(args: &StressArgs) -> anyhow::Result<ExitCode> {
    let cfg = StressConfig::from_args(args)?;
    let workload = Workload::new(cfg.shape)?;
    let tty = std::io::stderr().is_terminal();
    let mut printed = false;
    let mut on_progress = |p: &Progress| {
        if tty {
            let line =
                report::progress_line(p.pattern, p.elapsed, p.total_ops, p.recent_ops_per_sec);
            eprint!("\r\x1b[K{line}");
            printed = true;
        }
    };
    let result = run_workload(&workload, &cfg, &mut on_progress);
    if printed {
        eprint!("\r\x1b[K");
    }
    let report = result?;
    for note in &report.notes {
        eprintln!("vmtrace stress: note: {note}");
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let json = serde_json::to_string(&report).context("serialising the report")?;
        writeln!(out, "{json}").context("writing the report to stdout")?;
    } else {
        write!(out, "{}", report.to_text()).context("writing the report to stdout")?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    /// `stress`'s arguments on their own, as the subcommand parses them.
    #[derive(Debug, clap::Parser)]
    struct Stress {
        #[command(flatten)]
        args: StressArgs,
    }

    fn parse(args: &[&str]) -> Result<StressConfig, String> {
        let argv = std::iter::once("stress").chain(args.iter().copied());
        let cli = Stress::try_parse_from(argv).map_err(|e| e.to_string())?;
        StressConfig::from_args(&cli.args).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_per_pattern() {
        let c = parse(&["fix-size"]).expect("parse");
        assert_eq!(c.shape, Shape::FixSize { pages: 16 });
        assert_eq!(
            (c.threads, c.stop, c.seed),
            (1, StopAt::Loops(DEFAULT_LOOPS), 1)
        );
        let c = parse(&["random-size"]).expect("parse");
        assert_eq!(c.shape, Shape::RandomSize { max_pages: 100 });
        let c = parse(&["long-busy-list"]).expect("parse");
        assert_eq!(
            c.shape,
            Shape::LongBusyList {
                keep: Count {
                    n: 15000,
                    explicit: false
                },
                pages: 100
            }
        );
        let c = parse(&["full-fit"]).expect("parse");
        let Shape::FullFit { pairs } = c.shape else {
            panic!("{c:?}")
        };
        assert!(!pairs.explicit && pairs.n >= 8192, "{pairs:?}");
        let c = parse(&["thread-churn"]).expect("parse");
        assert_eq!(c.shape, Shape::ThreadChurn { batch: 16 });
        assert_eq!(c.stop, StopAt::Loops(DEFAULT_THREAD_CHURN_LOOPS));
    }

    #[test]
    fn options_are_read() {
        let c = parse(&[
            "fix-size", "--pages", "3", "-t", "2", "--loops", "7", "--seed", "9",
        ])
        .expect("parse");
        assert_eq!(
            c,
            StressConfig {
                shape: Shape::FixSize { pages: 3 },
                threads: 2,
                stop: StopAt::Loops(7),
                seed: 9
            }
        );
        let c = parse(&["thread-churn", "--batch", "4", "--duration", "1.5s"]).expect("parse");
        assert_eq!(c.shape, Shape::ThreadChurn { batch: 4 });
        assert_eq!(c.stop, StopAt::Duration(Duration::from_millis(1500)));
        let c = parse(&["long-busy-list", "--keep", "10", "--pages", "5"]).expect("parse");
        assert_eq!(
            c.shape,
            Shape::LongBusyList {
                keep: Count {
                    n: 10,
                    explicit: true
                },
                pages: 5
            }
        );
        let c = parse(&["full-fit", "--pairs", "100"]).expect("parse");
        assert_eq!(
            c.shape,
            Shape::FullFit {
                pairs: Count {
                    n: 100,
                    explicit: true
                }
            }
        );
    }

    #[test]
    fn bad_arguments_are_refused_with_the_value() {
        for (args, needle) in [
            (&["fix-size", "--pages", "0"][..], "--pages 0"),
            (
                &["fix-size", "--keep", "5"][..],
                "--keep does not apply to fix-size",
            ),
            (
                &["random-size", "--pairs", "5"][..],
                "--pairs does not apply",
            ),
            (&["full-fit", "--pages", "2"][..], "--pages"),
            (
                &["thread-churn", "--pages", "2"][..],
                "--pages does not apply",
            ),
            (&["fix-size", "--batch", "2"][..], "--batch does not apply"),
            (&["fix-size", "--loops", "0"][..], "0"),
            (&["fix-size", "--duration", "0s"][..], "--duration 0"),
            (&["fix-size", "--duration", "ten"][..], "`ten`"),
            (&["fix-size", "--threads", "0"][..], "0"),
            (
                &["fix-size", "--loops", "5", "--duration", "1s"][..],
                "--duration",
            ),
            (&["no-such-pattern"][..], "no-such-pattern"),
            (&["long-busy-list", "--keep", "0"][..], "--keep 0"),
        ] {
            let err = parse(args).expect_err(&format!("{args:?} should be refused"));
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn worker_loop_counts_ops_without_the_kernel() {
        // thread-churn needs no BPF, so this runs unprivileged.
        let cfg = StressConfig {
            shape: Shape::ThreadChurn { batch: 3 },
            threads: 2,
            stop: StopAt::Loops(4),
            seed: 1,
        };
        let report = run_stress(&cfg, &mut |_| {}).expect("thread-churn runs");
        assert_eq!(report.total_ops, 2 * 4 * 3);
        assert_eq!(report.per_thread.len(), 2);
        assert!(report.per_thread.iter().all(|t| t.ops == 12));
        assert!(report.elapsed_s > 0.0 && report.ops_per_sec > 0.0);
        assert_eq!(
            report.area_bytes,
            vec![thread_stack_area_bytes(report.page_size)]
        );
    }
}
