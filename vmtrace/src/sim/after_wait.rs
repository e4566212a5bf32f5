//! Lock sections measured from the waiter's own next event: a direct measurement of how long
//! a section runs, where the kernel fires a vmalloc tracepoint right after it.
//!
//! The wait estimator (`calibration::estimate_hold`) infers a hold from how often and how long
//! the CPUs waited, assuming their sections arrive independently. On the reference machine it
//! gives the lazy lock 8 ns on one recording and 1,212 ns on another, so that assumption fails
//! there. Two of the vmap locks need no such assumption, because `mm/vmalloc.c` fires a
//! tracepoint of the same task as soon as their section ends:
//!
//! - `free_vmap_area_noflush` unlocks `vn->lazy.lock` after inserting the area into the lazy
//!   tree, then fires `vmalloc:free_vmap_area_noflush`;
//! - `alloc_vmap_area` unlocks `free_vmap_area_lock` after `__alloc_vmap_area`, or the node's
//!   `pool_lock` inside `node_alloc`, then fires `vmalloc:alloc_vmap_area`.
//!
//! A `contention` record's `ts_ns` is when the waiter got the lock. From there to the same
//! task's next `free` (lazy lock) or `alloc` (free-area and pool locks) is the waiter's own
//! section plus the probes' own cost: the rest of the `contention_end` program after its stamp,
//! and the tracepoint's dispatch up to the next program's stamp. The pool lock's section is a
//! list pop, a few dozen ns, so the low end of its pairs is that probe cost (`overhead_ns`,
//! [`OVERHEAD_QUANTILE`]); each other class's section is its pairs' median less it.
//!
//! What it measures is the section of a task that has just waited: the lock's cache line and
//! the tree it guards were last written by another CPU. It is the measured section of the
//! calibration where it exists; the busy lock has no tracepoint after its sections and keeps
//! the estimator.
//!
//! The same tracepoint marks when the holder let go. A lazy-lock waiter whose wait ends just
//! after another CPU's last `free` (`since_release`) entered as that holder's section ended: its
//! arrival lies somewhere before, unseen. Free-running replay places a free by its tracepoint,
//! so it cannot put such a waiter inside the holder's section, whatever the holds; this
//! measures how many of the kernel's waits are of that kind (docs/model.md). Only the lazy lock
//! is measured so: an allocation's tracepoint comes after its busy-tree insert, well after it
//! let go of the free-area or pool lock.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use serde::{Deserialize, Serialize};

use crate::trace::{LockClass, Record};

/// A pair longer than this is a waiter preempted or interrupted between its section and the
/// tracepoint, not a section: every class's pairs have their 90th percentile below 3 µs on the
/// reference machine.
pub const WINDOW_NS: u64 = 20_000;

/// Pairs a trace needs before its median counts for a class.
pub const MIN_PAIRS: usize = 20;

/// The pool-lock pairs' quantile taken as the probes' own cost.
pub const OVERHEAD_QUANTILE: f64 = 0.05;

/// Which event ends a waiter's section of `class`, for the classes that have one.
fn follower(class: LockClass) -> Option<Follower> {
    match class {
        LockClass::NodeLazyLock => Some(Follower::Free),
        LockClass::FreeAreaLock | LockClass::NodePoolLock => Some(Follower::Alloc),
        _ => None,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Follower {
    Alloc,
    Free,
}

/// The pairing state of one trace.
#[derive(Clone, Debug, Default)]
pub struct Pairs {
    /// Per task: the class of its last wait and when it got the lock.
    open: FxHashMap<u32, (LockClass, u64)>,
    /// Per class, from a wait's end to the event that ended the waiter's section.
    pub deltas: BTreeMap<LockClass, Vec<u64>>,
    /// Per CPU, the time of its last `free`.
    last_free: FxHashMap<u32, u64>,
    /// Lazy-lock waits: from another CPU's last `free` to the wait's end, within [`WINDOW_NS`].
    pub since_release: Vec<u64>,
}

impl Pairs {
    /// Takes one record, in trace order.
    pub fn record(&mut self, rec: &Record) {
        let (ctx, kind) = match rec {
            Record::Contention(c) => {
                if c.wait_ns > 0 && c.class == LockClass::NodeLazyLock {
                    let end = c.ctx.ts_ns;
                    let holder = self
                        .last_free
                        .iter()
                        .filter(|&(&cpu, &t)| cpu != c.ctx.cpu && t <= end)
                        .map(|(_, &t)| t)
                        .max();
                    if let Some(gap) = holder.map(|t| end - t).filter(|&g| g < WINDOW_NS) {
                        self.since_release.push(gap);
                    }
                }
                if c.wait_ns > 0 && follower(c.class).is_some() {
                    self.open.insert(c.ctx.pid, (c.class, c.ctx.ts_ns));
                } else {
                    // A later wait of another kind: what follows is not the first one's section.
                    self.open.remove(&c.ctx.pid);
                }
                return;
            }
            Record::Alloc(a) => (&a.ctx, Follower::Alloc),
            Record::Free(f) => {
                self.last_free.insert(f.ctx.cpu, f.ctx.ts_ns);
                (&f.ctx, Follower::Free)
            }
            _ => return,
        };
        let Some((class, end)) = self.open.remove(&ctx.pid) else {
            return;
        };
        let delta = ctx.ts_ns.saturating_sub(end);
        if follower(class) == Some(kind) && delta < WINDOW_NS {
            self.deltas.entry(class).or_default().push(delta);
        }
    }
}

/// One class's measured section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassSection {
    pub class: LockClass,
    /// Pairs over all traces, and the traces with [`MIN_PAIRS`] or more.
    pub pairs: u64,
    pub traces: u32,
    /// The median over those traces of each trace's median pair: each recording counts once,
    /// whatever its number of waits.
    pub median_pair_ns: u64,
    /// `median_pair_ns` less the probes' cost.
    pub section_ns: u64,
    /// Lazy lock only: the waits that ended within [`WINDOW_NS`] of another CPU's last `free`,
    /// and the 10th and 50th percentiles of that gap over all traces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_release: Option<SinceRelease>,
}

/// How soon after the holder's tracepoint the lazy-lock waiters got the lock.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SinceRelease {
    pub waits: u64,
    pub p10_ns: u64,
    pub p50_ns: u64,
}

/// What the waiters' own sections measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AfterWait {
    /// The probes' cost inside a pair: [`OVERHEAD_QUANTILE`] of the pool-lock pairs, pooled.
    pub overhead_ns: u64,
    pub overhead_pairs: u64,
    /// The free-area and lazy locks; the pool lock's pairs are the overhead itself.
    pub classes: Vec<ClassSection>,
}

impl AfterWait {
    pub fn section(&self, class: LockClass) -> Option<&ClassSection> {
        self.classes.iter().find(|c| c.class == class)
    }
}

fn quantile(sorted: &[u64], q: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    let n = v.len();
    (v[(n - 1) / 2] + v[n / 2]) / 2
}

/// The sections measured over `traces`; `None` without enough pool-lock pairs to size the
/// probes' cost (kernels before the per-node pools, or a recording without `lock_waits`).
pub fn measure<'a>(traces: impl Iterator<Item = &'a Pairs>) -> Option<AfterWait> {
    let mut pool = Vec::new();
    let mut medians: BTreeMap<LockClass, (u64, Vec<u64>)> = BTreeMap::new();
    let mut since = Vec::new();
    for t in traces {
        since.extend_from_slice(&t.since_release);
        for (&class, d) in &t.deltas {
            if class == LockClass::NodePoolLock {
                pool.extend_from_slice(d);
                continue;
            }
            let e = medians.entry(class).or_default();
            e.0 += d.len() as u64;
            if d.len() >= MIN_PAIRS {
                e.1.push(median(&mut d.clone()));
            }
        }
    }
    if pool.len() < MIN_PAIRS {
        return None;
    }
    pool.sort_unstable();
    since.sort_unstable();
    let overhead_ns = quantile(&pool, OVERHEAD_QUANTILE);
    let classes = medians
        .into_iter()
        .filter(|(_, (_, m))| !m.is_empty())
        .map(|(class, (pairs, mut m))| {
            let median_pair_ns = median(&mut m);
            ClassSection {
                class,
                pairs,
                traces: m.len() as u32,
                median_pair_ns,
                section_ns: median_pair_ns.saturating_sub(overhead_ns),
                since_release: (class == LockClass::NodeLazyLock && !since.is_empty()).then(|| {
                    SinceRelease {
                        waits: since.len() as u64,
                        p10_ns: quantile(&since, 0.1),
                        p50_ns: quantile(&since, 0.5),
                    }
                }),
            }
        })
        .collect();
    Some(AfterWait {
        overhead_ns,
        overhead_pairs: pool.len() as u64,
        classes,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::trace::{Alloc, Contention, Ctx, Free, KAddr};

    fn ctx(ts: u64, pid: u32) -> Ctx {
        Ctx {
            ts_ns: ts,
            cpu: pid % 2,
            tgid: pid,
            pid,
            comm: "t".into(),
        }
    }

    pub(crate) fn wait(ts: u64, pid: u32, class: LockClass) -> Record {
        Record::Contention(Box::new(Contention {
            ctx: ctx(ts, pid),
            lock: KAddr(0x1000),
            flags: 1,
            wait_ns: 150,
            ret: 0,
            class,
            node: None,
            stack_id: i64::MIN,
            stack: Vec::new(),
            probe_ns: None,
        }))
    }

    pub(crate) fn alloc(ts: u64, pid: u32) -> Record {
        Record::Alloc(Alloc {
            ctx: ctx(ts, pid),
            addr: KAddr(0x2000),
            size: 8192,
            align: 1,
            vstart: KAddr(0),
            vend: KAddr(u64::MAX),
            failed: 0,
        })
    }

    pub(crate) fn free(ts: u64, pid: u32) -> Record {
        Record::Free(Free {
            ctx: ctx(ts, pid),
            va_start: KAddr(0x2000),
            nr_lazy: 1,
            nr_lazy_max: 100,
        })
    }

    /// One trace: 40 pool waits whose allocations follow 280–319 ns later, and 40 lazy waits
    /// whose frees follow `lazy` ns later.
    pub(crate) fn trace(lazy: u64) -> Pairs {
        let mut p = Pairs::default();
        for i in 0..40u64 {
            let t = i * 100_000;
            p.record(&wait(t, 1, LockClass::NodePoolLock));
            p.record(&alloc(t + 280 + i, 1));
            p.record(&wait(t + 50_000, 2, LockClass::NodeLazyLock));
            p.record(&free(t + 50_000 + lazy, 2));
        }
        p
    }

    #[test]
    fn a_section_is_the_waiters_next_event_less_the_pool_locks_floor() {
        let m = measure([trace(600)].iter()).unwrap();
        assert_eq!(m.overhead_pairs, 40);
        assert_eq!(m.overhead_ns, 282, "5th percentile of 280..=319");
        let lazy = m.section(LockClass::NodeLazyLock).unwrap();
        assert_eq!((lazy.pairs, lazy.traces), (40, 1));
        assert_eq!(lazy.section_ns, 600 - 282);
        assert!(m.section(LockClass::NodePoolLock).is_none());
        // Perturbed: sections twice as long after the probe's cost measure twice as long.
        let doubled = measure([trace(282 + 2 * 318)].iter()).unwrap();
        assert_eq!(
            doubled.section(LockClass::NodeLazyLock).unwrap().section_ns,
            2 * 318
        );
    }

    /// Only the event the kernel fires after the section pairs: a free after a free-area wait
    /// is another operation, and so is an event after a later wait or past the window.
    #[test]
    fn only_the_event_that_ends_the_section_pairs() {
        let mut p = Pairs::default();
        p.record(&wait(0, 1, LockClass::FreeAreaLock));
        p.record(&free(500, 1));
        p.record(&wait(1_000, 1, LockClass::NodeLazyLock));
        p.record(&wait(1_200, 1, LockClass::NodeBusyLock));
        p.record(&free(1_900, 1));
        p.record(&wait(2_000, 1, LockClass::NodeLazyLock));
        p.record(&free(2_000 + WINDOW_NS, 1));
        p.record(&wait(30_000, 1, LockClass::NodeLazyLock));
        p.record(&alloc(30_100, 2));
        p.record(&free(30_400, 1));
        assert_eq!(
            p.deltas,
            BTreeMap::from([(LockClass::NodeLazyLock, vec![400])])
        );
    }

    /// A lazy-lock wait is timed from the last free of another CPU (the holder's tracepoint),
    /// not of its own, and only within the window; the gap moves with the holder's free.
    #[test]
    fn since_release_is_timed_from_another_cpus_last_free() {
        let run = |holder_at: u64| {
            let mut p = trace(600);
            let t = 10_000_000;
            // pid 2 runs on CPU 0, pid 1 and 3 on CPU 1.
            p.record(&free(t + holder_at, 2));
            p.record(&free(t + 900, 3));
            p.record(&wait(t + 1_000, 1, LockClass::NodeLazyLock));
            p.record(&free(t + 1_800, 1));
            // Another CPU's free too long before: no holder of this wait.
            p.record(&free(t + 100_000, 2));
            p.record(&wait(t + 100_000 + WINDOW_NS, 1, LockClass::NodeLazyLock));
            p
        };
        let p = run(800);
        assert_eq!(p.since_release.last(), Some(&200));
        let m = measure([p].iter()).unwrap();
        let s = m
            .section(LockClass::NodeLazyLock)
            .unwrap()
            .since_release
            .unwrap();
        // trace()'s lazy waits are on CPU 0, and only CPU 0 frees there: none has a holder.
        assert_eq!((s.waits, s.p50_ns), (1, 200));
        assert_eq!(
            run(300).since_release,
            vec![700],
            "perturbed: the holder freed earlier"
        );
        assert!(m
            .section(LockClass::FreeAreaLock)
            .is_none_or(|c| c.since_release.is_none()));
    }

    /// Each trace counts once: one with many waits does not outvote the others, and a trace
    /// with too few pairs gives no median of its own.
    #[test]
    fn traces_count_once_each() {
        let mut big = trace(1_000);
        for i in 0..200u64 {
            big.record(&wait(10_000_000 + i * 10_000, 3, LockClass::NodeLazyLock));
            big.record(&free(10_000_000 + i * 10_000 + 1_000, 3));
        }
        let small = Pairs {
            deltas: BTreeMap::from([(LockClass::NodeLazyLock, vec![9_000; MIN_PAIRS - 1])]),
            ..Pairs::default()
        };
        let m = measure([trace(400), big, trace(500), small].iter()).unwrap();
        let lazy = m.section(LockClass::NodeLazyLock).unwrap();
        assert_eq!(lazy.traces, 3);
        assert_eq!(lazy.pairs, 40 + 240 + 40 + 19);
        assert_eq!(lazy.median_pair_ns, 500);
        // Without pool-lock pairs there is nothing to take the probes' cost from.
        let no_pool = Pairs {
            deltas: BTreeMap::from([(LockClass::NodeLazyLock, vec![500; 100])]),
            ..Pairs::default()
        };
        assert_eq!(measure([no_pool].iter()), None);
    }
}
