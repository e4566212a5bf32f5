//! `vmtrace whatif`: the what-if at the published scale. A sweep over thread and CPU counts
//! streams `vmtrace synth`'s records straight into each variant's free-running model and lock
//! simulation ([`FreeRunner`]), with no trace file, so a point costs the model's time and
//! memory for the live areas only. With a recorded trace instead of a mask it sweeps the
//! recording over CPU or node counts. `docs/whatif.md` describes the sweep and its figures.

pub mod cli;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use crate::model::{lazy_max_pages, Variant};
use crate::replay::free_run::{FreeRunOptions, FreeRunner, WhatIf};
use crate::replay::{params_for, ReplayError, ReplayOptions};
use crate::synth::workload::{Shape, Test};
use crate::synth::{module_scaled, stream, Sink, SynthError, SynthParams};
use crate::trace::{Header, LockClass, Record};

#[derive(Debug, thiserror::Error)]
pub enum WhatifError {
    #[error("{threads} threads on {cpus} CPUs, variant {variant}: {source}")]
    Point {
        threads: u32,
        cpus: u32,
        variant: &'static str,
        #[source]
        source: SynthError,
    },
    #[error("{what}, variant {variant}: {source}")]
    Trace {
        what: String,
        variant: &'static str,
        #[source]
        source: ReplayError,
    },
    #[error("the synthetic stream has no header or start snapshot before its events")]
    NoHeader,
    #[error("{0}")]
    Params(String),
}

/// One point of a sweep: the workload's threads on a machine of `cpus` CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Point {
    pub cpus: u32,
    pub threads: u32,
}

/// What one variant predicts at one point: the sweep's table row and `--json` object.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Worker threads of the synthetic workload; `None` when sweeping a recorded trace.
    pub threads: Option<u32>,
    pub cpus: u32,
    pub variant: Variant,
    pub nodes: u32,
    pub lazy_max_pages: u64,
    pub allocs: u64,
    pub frees: u64,
    pub alloc_failures: u64,
    /// Page-table pages allocated on demand for vmalloc space, all levels, and per level.
    pub page_table_pages: u64,
    pub pte_pages: u64,
    pub pmd_pages: u64,
    pub pud_pages: u64,
    /// Bytes from VMALLOC_START to the highest end ever allocated.
    pub high_water_bytes: u64,
    pub purges: u64,
    pub npurged_mean: f64,
    /// Allocations served from a vmap node pool, as a share of all.
    pub pool_hit_share: f64,
    /// Predicted lock wait over wait plus work, every class and actor.
    pub lock_wait_share: f64,
    /// The class with the most predicted wait, and its share of all the wait.
    pub top_wait_class: Option<LockClass>,
    pub top_wait_class_share: f64,
    pub throughput_ops_per_s: f64,
    pub makespan_ns: u64,
    /// Seeds the row is the mean of (`--seeds`): each seed is another workload (random sizes,
    /// test orders) and other simulation samples.
    pub seeds: u32,
    /// The lowest and highest value over the seeds, when there were several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spread: Option<Spread>,
}

/// The lowest and highest of a figure over a point's seeds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Range {
    pub min: f64,
    pub max: f64,
}

impl Range {
    fn of(v: impl Iterator<Item = f64>) -> Self {
        v.fold(
            Range {
                min: f64::INFINITY,
                max: f64::NEG_INFINITY,
            },
            |r, x| Range {
                min: r.min.min(x),
                max: r.max.max(x),
            },
        )
    }
}

/// How far the seeds of one point and variant spread: page-table counts in particular move a
/// lot from seed to seed (a few areas placed high set them), so one seed's figure is a sample.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub page_table_pages: Range,
    pub high_water_bytes: Range,
    pub purges: Range,
    pub pool_hit_share: Range,
    pub lock_wait_share: Range,
    pub throughput_ops_per_s: Range,
}

impl Row {
    /// The mean of `rows` (one point and variant, one row per seed; at least one), with their
    /// spread when there are several. Counts are rounded to the nearest; the top wait class is
    /// the one most rows name.
    pub fn mean(rows: &[Row]) -> Option<Row> {
        let first = rows.first()?;
        if rows.len() == 1 {
            return Some(first.clone());
        }
        let n = rows.len() as f64;
        let f = |g: &dyn Fn(&Row) -> f64| rows.iter().map(g).sum::<f64>() / n;
        let u = |g: &dyn Fn(&Row) -> u64| {
            (rows.iter().map(|r| g(r) as f64).sum::<f64>() / n).round() as u64
        };
        let range = |g: &dyn Fn(&Row) -> f64| Range::of(rows.iter().map(g));
        let top = rows
            .iter()
            .map(|r| r.top_wait_class)
            .max_by_key(|c| rows.iter().filter(|r| r.top_wait_class == *c).count())
            .flatten();
        let with_top: Vec<&Row> = rows.iter().filter(|r| r.top_wait_class == top).collect();
        Some(Row {
            threads: first.threads,
            cpus: first.cpus,
            variant: first.variant,
            nodes: first.nodes,
            lazy_max_pages: first.lazy_max_pages,
            allocs: u(&|r| r.allocs),
            frees: u(&|r| r.frees),
            alloc_failures: u(&|r| r.alloc_failures),
            page_table_pages: u(&|r| r.page_table_pages),
            pte_pages: u(&|r| r.pte_pages),
            pmd_pages: u(&|r| r.pmd_pages),
            pud_pages: u(&|r| r.pud_pages),
            high_water_bytes: u(&|r| r.high_water_bytes),
            purges: u(&|r| r.purges),
            npurged_mean: f(&|r| r.npurged_mean),
            pool_hit_share: f(&|r| r.pool_hit_share),
            lock_wait_share: f(&|r| r.lock_wait_share),
            top_wait_class: top,
            top_wait_class_share: with_top.iter().map(|r| r.top_wait_class_share).sum::<f64>()
                / with_top.len().max(1) as f64,
            throughput_ops_per_s: f(&|r| r.throughput_ops_per_s),
            makespan_ns: u(&|r| r.makespan_ns),
            seeds: rows.iter().map(|r| r.seeds).sum(),
            spread: Some(Spread {
                page_table_pages: range(&|r| r.page_table_pages as f64),
                high_water_bytes: range(&|r| r.high_water_bytes as f64),
                purges: range(&|r| r.purges as f64),
                pool_hit_share: range(&|r| r.pool_hit_share),
                lock_wait_share: range(&|r| r.lock_wait_share),
                throughput_ops_per_s: range(&|r| r.throughput_ops_per_s),
            }),
        })
    }

    pub fn new(threads: Option<u32>, cpus: u32, w: &WhatIf) -> Self {
        let top = w
            .lock_waits
            .iter()
            .filter(|c| c.wait_ns > 0)
            .max_by_key(|c| c.wait_ns);
        Self {
            threads,
            cpus,
            variant: w.variant,
            nodes: w.nodes,
            lazy_max_pages: w.lazy_max_pages,
            allocs: w.allocs,
            frees: w.frees,
            alloc_failures: w.alloc_failures,
            page_table_pages: w.page_table_pages,
            pte_pages: w.slots.pte_tables,
            pmd_pages: w.slots.pmd_tables,
            pud_pages: w.slots.pud_tables,
            high_water_bytes: w.high_water_bytes,
            purges: w.purges,
            npurged_mean: if w.purges == 0 {
                0.0
            } else {
                w.purged_objects as f64 / w.purges as f64
            },
            pool_hit_share: w.pool_hit_share,
            lock_wait_share: w.lock_wait_share,
            top_wait_class: top.map(|c| c.class),
            top_wait_class_share: top.map_or(0.0, |c| c.wait_ns as f64 / w.wait_ns.max(1) as f64),
            throughput_ops_per_s: w.throughput_ops_per_s,
            makespan_ns: w.makespan_ns,
            seeds: 1,
            spread: None,
        }
    }
}

/// A sweep of the synthetic workload: `base` gives everything but the threads and CPUs.
#[derive(Clone, Debug)]
pub struct Sweep {
    pub base: SynthParams,
    pub threads: Vec<u32>,
    pub cpus: Vec<u32>,
    pub variants: Vec<Variant>,
    pub free_run: FreeRunOptions,
    /// When `base.junk` is not given, scale full_fit's junk pairs from the module's
    /// (`lazy_max_pages` of the point's CPUs) down with the loops ([`module_scaled`]), so that
    /// the point keeps the module's mix; `false`: the module's full size at any loop count.
    pub scale_setup: bool,
}

impl Sweep {
    /// Every (point, variant) job, the largest first so that parallel workers finish together.
    pub fn jobs(&self) -> Vec<(Point, Variant)> {
        let mut jobs: Vec<(Point, Variant)> = self
            .cpus
            .iter()
            .flat_map(|&cpus| {
                self.threads
                    .iter()
                    .map(move |&threads| Point { cpus, threads })
            })
            .flat_map(|p| self.variants.iter().map(move |&v| (p, v)))
            .collect();
        jobs.sort_by_key(|(p, _)| std::cmp::Reverse(self.expected_allocs(*p)));
        jobs
    }

    /// The allocations `vmtrace synth` makes at `p`, from the tests' scripts (for progress).
    pub fn expected_allocs(&self, p: Point) -> u64 {
        let shape = Shape {
            loops: self.base.loops,
            nr_pages: self.base.nr_pages,
            junk: self.junk(p.cpus),
            busy_list: self.base.busy_list,
            page_size: 4096,
        };
        let per_thread: u64 = Test::from_mask(self.base.mask)
            .iter()
            .map(|t| {
                let (setup, looped) = t.allocs_per_thread(&shape);
                setup + looped
            })
            .sum();
        per_thread * u64::from(p.threads)
    }

    /// The same sweep with another seed, for the workload and the simulation alike.
    pub fn with_seed(&self, seed: u64) -> Sweep {
        let mut s = self.clone();
        s.base.seed = seed;
        s.free_run.seed = seed;
        s
    }

    pub fn params(&self, p: Point) -> SynthParams {
        SynthParams {
            threads: p.threads,
            cpus: p.cpus,
            junk: Some(self.junk(p.cpus)),
            ..self.base.clone()
        }
    }

    /// full_fit's junk pairs per thread on a machine of `cpus` CPUs.
    pub fn junk(&self, cpus: u32) -> u64 {
        let module = lazy_max_pages(cpus, 4096);
        match self.base.junk {
            Some(j) => j,
            None if self.scale_setup => module_scaled(module, self.base.loops),
            None => module,
        }
    }
}

/// Replays the synthetic workload of `sweep` at `p` free-running with `variant`, streaming
/// the generator's records into the model; `progress` counts the allocations as they pass.
pub fn run_point(
    sweep: &Sweep,
    p: Point,
    variant: Variant,
    progress: &AtomicU64,
) -> Result<WhatIf, WhatifError> {
    let opts = ReplayOptions {
        variant,
        ..ReplayOptions::default()
    };
    let mut feed = Feed {
        opts: &opts,
        free_run: &sweep.free_run,
        header: None,
        runner: None,
        line: 0,
        unreported: 0,
        progress,
    };
    let point_err = |source| WhatifError::Point {
        threads: p.threads,
        cpus: p.cpus,
        variant: variant.name(),
        source,
    };
    stream(
        &sweep.params(p),
        vec!["vmtrace".into(), "whatif".into()],
        &mut feed,
    )
    .map_err(point_err)?;
    progress.fetch_add(feed.unreported, Ordering::Relaxed);
    feed.runner
        .ok_or(WhatifError::NoHeader)?
        .finish()
        .map_err(|e| point_err(SynthError::Sink(Box::new(e))))
}

/// Runs `jobs` on `workers` threads (at least one), calling `job` for each; returns the
/// results in the order of `jobs`.
pub fn parallel<J: Sync, T: Send>(
    jobs: &[J],
    workers: usize,
    job: impl Fn(&J) -> T + Sync,
) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<T>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..workers.clamp(1, jobs.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(j) = jobs.get(i) else { break };
                let r = job(j);
                if let Ok(mut o) = out.lock() {
                    o[i] = Some(r);
                }
            });
        }
    });
    out.into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .into_iter()
        .flatten()
        .collect()
}

/// The generator's records into one free-running model: the header and snapshot set it up,
/// as they do when a trace file is replayed.
struct Feed<'a> {
    opts: &'a ReplayOptions,
    free_run: &'a FreeRunOptions,
    header: Option<Header>,
    runner: Option<FreeRunner>,
    line: usize,
    unreported: u64,
    progress: &'a AtomicU64,
}

impl Sink for Feed<'_> {
    fn put(&mut self, r: Record) -> Result<(), SynthError> {
        self.line += 1;
        let boxed = |e: ReplayError| SynthError::Sink(Box::new(e));
        match r {
            Record::Header(h) => self.header = Some(*h),
            Record::Vmallocinfo(s) => {
                let header = self
                    .header
                    .as_ref()
                    .ok_or_else(|| SynthError::Sink(Box::new(WhatifError::NoHeader)))?;
                let params = params_for(header, &s, self.opts).map_err(boxed)?;
                self.runner = Some(
                    FreeRunner::new(header, &s, params, self.opts, self.free_run).map_err(boxed)?,
                );
            }
            other => {
                if matches!(other, Record::Alloc(_)) {
                    self.unreported += 1;
                    if self.unreported == 65_536 {
                        self.progress.fetch_add(self.unreported, Ordering::Relaxed);
                        self.unreported = 0;
                    }
                }
                let runner = self
                    .runner
                    .as_mut()
                    .ok_or_else(|| SynthError::Sink(Box::new(WhatifError::NoHeader)))?;
                runner.feed(other, self.line).map_err(boxed)?;
            }
        }
        Ok(())
    }
}

/// A sweep of a recorded trace: each point replays it free-running with the node count (and,
/// for a CPU count, `lazy_max_pages`) of another machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TracePoint {
    /// The trace's own machine.
    AsRecorded,
    /// A machine of this many CPUs: nodes and `lazy_max_pages` by the kernel's rules.
    Cpus(u32),
    /// This many vmap nodes, everything else as recorded.
    Nodes(u32),
}

impl TracePoint {
    pub fn options(self, variant: Variant, page_size: u64) -> ReplayOptions {
        let (nodes, lazy_max) = match self {
            TracePoint::AsRecorded => (None, None),
            TracePoint::Cpus(c) => (Some(c.clamp(1, 128)), Some(lazy_max_pages(c, page_size))),
            TracePoint::Nodes(n) => (Some(n), None),
        };
        ReplayOptions {
            variant,
            nodes,
            lazy_max_pages: lazy_max,
            ..ReplayOptions::default()
        }
    }

    pub fn describe(self) -> String {
        match self {
            TracePoint::AsRecorded => "as recorded".into(),
            TracePoint::Cpus(c) => format!("{c} CPUs"),
            TracePoint::Nodes(n) => format!("{n} nodes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::free_run::free_run;

    fn sweep(seed: u64, variants: Vec<Variant>) -> Sweep {
        Sweep {
            base: SynthParams {
                mask: 0x7f,
                loops: 30,
                junk: Some(64),
                busy_list: 40,
                seed,
                ..SynthParams::default()
            },
            threads: vec![3],
            cpus: vec![4],
            variants,
            free_run: FreeRunOptions {
                seed,
                ..FreeRunOptions::default()
            },
            scale_setup: true,
        }
    }

    /// Streaming the generator into the model is the same computation as writing the trace
    /// and replaying the file: every figure of the prediction agrees exactly, for every
    /// variant; another seed gives another workload and another prediction.
    #[test]
    fn a_point_matches_synth_then_free_running_replay() {
        let variants = vec![Variant::Nodes, Variant::NodesCapped, Variant::Global];
        let s = sweep(5, variants.clone());
        let p = Point {
            cpus: 4,
            threads: 3,
        };
        let mut trace = Vec::new();
        crate::synth::generate(
            &s.params(p),
            vec!["vmtrace".into(), "whatif".into()],
            &mut trace,
        )
        .expect("synth");
        let progress = AtomicU64::new(0);
        for v in variants {
            let streamed = run_point(&s, p, v, &progress).expect("whatif");
            let opts = ReplayOptions {
                variant: v,
                ..ReplayOptions::default()
            };
            let replayed = free_run(&trace[..], &opts, &s.free_run).expect("replay");
            assert!(streamed.allocs > 1000, "{} allocations", streamed.allocs);
            assert_eq!(
                serde_json::to_value(&streamed).unwrap(),
                serde_json::to_value(&replayed).unwrap(),
                "variant {}",
                v.name()
            );
            let other = run_point(&sweep(6, vec![v]), p, v, &progress).expect("whatif");
            assert_ne!(
                serde_json::to_value(&streamed).unwrap(),
                serde_json::to_value(&other).unwrap(),
                "another seed must change the prediction"
            );
        }
        assert!(progress.load(Ordering::Relaxed) > 6000);
    }

    /// The parallel runner returns every job's result in the jobs' order, whatever the
    /// number of workers.
    #[test]
    fn parallel_keeps_the_order() {
        let jobs: Vec<u64> = (0..37).collect();
        for workers in [1, 2, 5, 64] {
            let out = parallel(&jobs, workers, |&j| j * j);
            assert_eq!(out, jobs.iter().map(|j| j * j).collect::<Vec<_>>());
        }
    }

    /// The mean of several seeds' rows keeps each figure between its lowest and highest, and
    /// says how far they spread; one row is its own mean.
    #[test]
    fn the_mean_over_seeds_carries_the_spread() {
        let s = sweep(1, vec![Variant::Nodes]);
        let p = Point {
            cpus: 4,
            threads: 3,
        };
        let progress = AtomicU64::new(0);
        let rows: Vec<Row> = (1..4)
            .map(|seed| {
                let w = run_point(&s.with_seed(seed), p, Variant::Nodes, &progress).unwrap();
                Row::new(Some(3), 4, &w)
            })
            .collect();
        let one = Row::mean(&rows[..1]).unwrap();
        assert_eq!(one.page_table_pages, rows[0].page_table_pages);
        assert!(one.spread.is_none());
        let m = Row::mean(&rows).unwrap();
        assert_eq!(m.seeds, 3);
        let spread = m.spread.clone().unwrap();
        for (v, r) in [
            (m.page_table_pages as f64, spread.page_table_pages),
            (m.lock_wait_share, spread.lock_wait_share),
            (m.pool_hit_share, spread.pool_hit_share),
            (m.throughput_ops_per_s, spread.throughput_ops_per_s),
        ] {
            assert!(r.min <= v + 0.5 && v <= r.max + 0.5, "{v} outside {r:?}");
        }
        assert!(
            spread.throughput_ops_per_s.max > spread.throughput_ops_per_s.min,
            "three seeds, three workloads: {spread:?}"
        );
        assert!(Row::mean(&[]).is_none());
    }

    /// Jobs run largest first, and the expected allocation count follows the threads.
    #[test]
    fn jobs_are_ordered_by_size() {
        let mut s = sweep(1, vec![Variant::Nodes]);
        s.threads = vec![2, 8, 4];
        let jobs = s.jobs();
        let threads: Vec<u32> = jobs.iter().map(|(p, _)| p.threads).collect();
        assert_eq!(threads, vec![8, 4, 2]);
        let one = s.expected_allocs(Point {
            cpus: 4,
            threads: 1,
        });
        assert_eq!(
            s.expected_allocs(Point {
                cpus: 4,
                threads: 8
            }),
            8 * one
        );
    }
}
