//! The drain work queued behind deferred frees.
//!
//! The free that lifts the lazy backlog over the threshold queues `drain_vmap_area_work`, and
//! on the recording kernel that item runs on the unbound workqueue's pool (its `work` records
//! name `kworker/u…` tasks). A workload can fill that same queue: a BPF map's memory is freed
//! by a work item (`bpf_map_free_deferred`), so every map a workload closes puts one item on
//! the pool's list before its area reaches `free_vmap_area_noflush`. The pool runs its list in
//! order, so a drain queued behind a burst of such items starts only once they have been taken
//! up, which can be milliseconds later; with nothing ahead it starts within tens of
//! microseconds. That split is what makes the measured drain latency two-humped, and sampling
//! it blindly puts long latencies where the queue was empty and short ones where it was full.
//!
//! The trace shows what was queued ahead: the frees run by unbound workers after the crossing,
//! of areas allocated before it. Each queued item had to be closed, so allocated, before the
//! drain was queued. Not all of those frees come before the drain's start: the pool runs items
//! on several workers at once, and the last few taken up before the drain can still be running
//! beside it. How many is the `allowance`, chosen by the calibration as the count that best
//! predicts the calibration traces' own drain starts; the latencies of the drains that had
//! nothing ahead become the base distribution. Free-running replay then starts each drain at
//! the later of a base sample and the time the frees queued ahead of it, less the allowance,
//! have run ([`ahead_of`]).
//!
//! The workload's frees are inputs of free-running replay (it replays them at their recorded
//! times), so reading the frees after a crossing uses no observed purge or drain.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use serde::{Deserialize, Serialize};

use super::calibration::DrainLatency;
use crate::trace::Record;

/// The task-name prefix of the unbound workqueue's workers.
pub const UNBOUND_WORKER: &str = "kworker/u";

/// The most frees a drain may run beside that the calibration tries (0 to this).
pub const MAX_ALLOWANCE: u32 = 8;

/// How far after a crossing the calibration collects frees: the horizon it then uses is the
/// longest drain latency measured, which is far below this on any recording seen (≤ 7 ms).
pub const WINDOW_NS: u64 = 50_000_000;

/// A predicted start agrees with the recorded one within this share of the recorded latency…
const AGREE_SHARE: f64 = 0.3;
/// …or within this, for the short latencies where the share is below the timer's grain.
const AGREE_FLOOR_NS: u64 = 20_000;

/// One recorded drain: its latency and the frees queued ahead of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedDrain {
    /// From the crossing free to the item's start, as the calibration measures it.
    pub latency_ns: u64,
    /// Unbound-worker frees of areas allocated before the crossing, within [`WINDOW_NS`]
    /// after it: their offsets from the crossing, ascending.
    pub ahead_ns: Vec<u64>,
}

/// When the frees queued ahead of a drain let it start: the offset of the last one that must
/// run before it, the `allowance` latest ones running beside it; 0 when no more than
/// `allowance` were ahead. `ahead_ns` ascending.
pub fn ahead_of(ahead_ns: &[u64], allowance: u32) -> u64 {
    let n = ahead_ns.len();
    let k = allowance as usize;
    if n > k {
        ahead_ns[n - 1 - k]
    } else {
        0
    }
}

/// Whether a task is one of the unbound workqueue's workers.
pub fn unbound(comm: &str) -> bool {
    comm.starts_with(UNBOUND_WORKER)
}

/// The calibration's account of the drain queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DrainQueue {
    /// Frees queued ahead of a drain that may still run beside it.
    pub allowance: u32,
    /// Frees later than this after the crossing are not looked at: the longest drain latency
    /// measured, at most [`WINDOW_NS`].
    pub horizon_ns: u64,
    /// Latencies of the drains with nothing queued ahead (at `allowance`): sampled for each
    /// drain, and the start is the later of the sample and [`ahead_of`].
    pub unblocked: DrainLatency,
    /// Drains measured, and how many of them had frees queued ahead.
    pub drains: u64,
    pub queued_behind: u64,
    /// Drains whose start the rule put within the agreement tolerance (30 % or 20 µs) of the
    /// recorded one, at `allowance`; and with a base sample alone for every drain.
    pub agreed: u64,
    pub agreed_without: u64,
}

impl DrainQueue {
    /// The allowance that predicts the recorded drain starts best; `None` where no drain had
    /// frees queued ahead, or where the queue explains no more starts than the base latency
    /// alone.
    pub fn fit(drains: &[QueuedDrain]) -> Option<Self> {
        // Frees were collected for WINDOW_NS only; replay holds this much trace in memory.
        let horizon_ns = drains.iter().map(|d| d.latency_ns).max()?.min(WINDOW_NS);
        let within: Vec<&[u64]> = drains
            .iter()
            .map(|d| {
                let n = d.ahead_ns.partition_point(|&x| x <= horizon_ns);
                &d.ahead_ns[..n]
            })
            .collect();
        let agree = |predicted: u64, recorded: u64| {
            predicted.abs_diff(recorded)
                <= ((AGREE_SHARE * recorded as f64) as u64).max(AGREE_FLOOR_NS)
        };
        let score = |blocks: &[u64]| -> Option<(u64, Vec<u64>)> {
            let base: Vec<u64> = drains
                .iter()
                .zip(blocks)
                .filter(|(_, &b)| b == 0)
                .map(|(d, _)| d.latency_ns)
                .collect();
            let median = DrainLatency::from_samples(&base)?.p50_ns;
            let agreed = drains
                .iter()
                .zip(blocks)
                .filter(|(d, &b)| agree(median.max(b), d.latency_ns))
                .count() as u64;
            Some((agreed, base))
        };
        let (agreed_without, _) = score(&vec![0; drains.len()])?;
        let mut best: Option<(u64, u32, Vec<u64>, u64)> = None;
        for allowance in 0..=MAX_ALLOWANCE {
            let blocks: Vec<u64> = within.iter().map(|a| ahead_of(a, allowance)).collect();
            let Some((agreed, base)) = score(&blocks) else {
                continue;
            };
            if best.as_ref().is_none_or(|b| agreed > b.0) {
                let queued = blocks.iter().filter(|&&b| b > 0).count() as u64;
                best = Some((agreed, allowance, base, queued));
            }
        }
        let (agreed, allowance, base, queued_behind) = best?;
        (queued_behind > 0 && agreed > agreed_without).then(|| Self {
            allowance,
            horizon_ns,
            unblocked: DrainLatency::from_samples(&base).expect("scored with a base"),
            drains: drains.len() as u64,
            queued_behind,
            agreed,
            agreed_without,
        })
    }
}

/// What the calibration reads of the queue, record by record.
#[derive(Clone, Debug, Default)]
pub struct QueueScan {
    /// Live areas and when they were allocated.
    live: FxHashMap<u64, u64>,
    /// Unbound-worker frees of areas whose allocation was seen: `(freed, allocated)`.
    frees: VecDeque<(u64, u64)>,
    /// Drains whose window has not yet passed: `(crossing, latency)`.
    pending: VecDeque<(u64, u64)>,
    pub drains: Vec<QueuedDrain>,
    /// Drain items seen, and how many ran on unbound workers.
    pub items: u64,
    pub unbound_items: u64,
}

impl QueueScan {
    pub fn alloc(&mut self, addr: u64, ts: u64) {
        self.live.insert(addr, ts);
    }

    pub fn free(&mut self, addr: u64, ts: u64, comm: &str) {
        let allocated = self.live.remove(&addr);
        if let Some(a) = allocated.filter(|_| unbound(comm)) {
            self.frees.push_back((ts, a));
        }
        self.settle(ts);
    }

    /// A drain item started `latency_ns` after the free at `crossing` queued it.
    pub fn drain(&mut self, crossing: u64, latency_ns: u64) {
        self.pending.push_back((crossing, latency_ns));
    }

    /// A drain item ran, on a task named `comm`.
    pub fn item(&mut self, comm: &str) {
        self.items += 1;
        self.unbound_items += u64::from(unbound(comm));
    }

    /// Every drain measured, those whose window runs past the trace's end with what it holds.
    pub fn finished(&self) -> Vec<QueuedDrain> {
        let mut s = self.clone();
        s.finish();
        s.drains
    }

    /// Ends the scan: drains whose window runs past the trace's end see what it holds.
    pub fn finish(&mut self) {
        while let Some((t, l)) = self.pending.pop_front() {
            self.measure(t, l);
        }
        self.frees.clear();
    }

    fn settle(&mut self, now: u64) {
        while let Some(&(t, l)) = self.pending.front() {
            if t.saturating_add(WINDOW_NS) >= now {
                break;
            }
            self.pending.pop_front();
            self.measure(t, l);
        }
        // A drain's record comes at the item's end, after its crossing: keep two windows.
        let keep_from = self
            .pending
            .front()
            .map_or(now, |&(t, _)| t)
            .min(now.saturating_sub(2 * WINDOW_NS));
        while self.frees.front().is_some_and(|&(f, _)| f < keep_from) {
            self.frees.pop_front();
        }
    }

    fn measure(&mut self, crossing: u64, latency_ns: u64) {
        let end = crossing.saturating_add(WINDOW_NS);
        let ahead_ns = self
            .frees
            .iter()
            .filter(|&&(f, a)| f > crossing && f <= end && a < crossing)
            .map(|&(f, _)| f - crossing)
            .collect();
        self.drains.push(QueuedDrain {
            latency_ns,
            ahead_ns,
        });
    }
}

/// Free-running replay's view ahead of the record it is at: the records of the next
/// `horizon_ns`, to find the frees queued ahead of a drain it queues now. Replay takes records
/// from [`QueueAhead::push`] once that much trace time has followed them.
#[derive(Debug)]
pub struct QueueAhead {
    queue: DrainQueue,
    held: VecDeque<(Record, usize)>,
    /// Live areas (trace addresses) of the records handed out, and when they were allocated.
    live: FxHashMap<u64, u64>,
    last_ts: u64,
}

impl QueueAhead {
    pub fn new(queue: DrainQueue) -> Self {
        Self {
            queue,
            held: VecDeque::new(),
            live: FxHashMap::default(),
            last_ts: 0,
        }
    }

    pub fn queue(&self) -> &DrainQueue {
        &self.queue
    }

    /// Holds `rec`, the newest record read.
    pub fn push(&mut self, rec: Record, line: usize) {
        self.last_ts = self.last_ts.max(rec.ts_ns().unwrap_or(0));
        self.held.push_back((rec, line));
    }

    /// The oldest record held, once `horizon_ns` of trace has been read after it; at the end
    /// of the trace (`end`), any.
    pub fn pop(&mut self, end: bool) -> Option<(Record, usize)> {
        let (front, _) = self.held.front()?;
        let ts = front.ts_ns().unwrap_or(self.last_ts);
        (end || ts.saturating_add(self.queue.horizon_ns) < self.last_ts)
            .then(|| self.held.pop_front())
            .flatten()
    }

    /// Replay handed `rec` out: its allocation or free changes what is live.
    pub fn handed_out(&mut self, rec: &Record) {
        match rec {
            Record::Alloc(a) if a.failed == 0 => {
                self.live.insert(a.addr.0, a.ctx.ts_ns);
            }
            Record::Free(f) => {
                self.live.remove(&f.va_start.0);
            }
            _ => {}
        }
    }

    /// How long after `crossing` a drain queued then waits for the frees ahead of it
    /// ([`ahead_of`]): unbound-worker frees in the held records, of areas live now and
    /// allocated before the crossing.
    pub fn wait_after(&self, crossing: u64) -> u64 {
        let end = crossing.saturating_add(self.queue.horizon_ns);
        let mut fresh = std::collections::HashSet::new();
        let mut ahead = Vec::new();
        for (rec, _) in &self.held {
            match rec {
                Record::Alloc(a) if a.failed == 0 => {
                    fresh.insert(a.addr.0);
                }
                Record::Free(f) => {
                    let t = f.ctx.ts_ns;
                    if t > end {
                        break;
                    }
                    let queued = t > crossing
                        && unbound(&f.ctx.comm)
                        && !fresh.contains(&f.va_start.0)
                        && self.live.get(&f.va_start.0).is_some_and(|&a| a < crossing);
                    if queued {
                        ahead.push(t - crossing);
                    }
                }
                _ => {}
            }
        }
        ahead_of(&ahead, self.queue.allowance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::KAddr;

    fn alloc(ts: u64, addr: u64) -> Record {
        Record::Alloc(crate::trace::Alloc {
            ctx: ctx(ts, "stress"),
            addr: KAddr(addr),
            size: 0x2000,
            align: 0x1000,
            vstart: KAddr(0),
            vend: KAddr(u64::MAX),
            failed: 0,
        })
    }

    fn free(ts: u64, addr: u64, comm: &str) -> Record {
        Record::Free(crate::trace::Free {
            ctx: ctx(ts, comm),
            va_start: KAddr(addr),
            nr_lazy: 1,
            nr_lazy_max: 100,
        })
    }

    fn ctx(ts: u64, comm: &str) -> crate::trace::Ctx {
        crate::trace::Ctx {
            ts_ns: ts,
            cpu: 0,
            tgid: 1,
            pid: 1,
            comm: comm.into(),
        }
    }

    /// Replay sees a record only once the horizon after it has been read, and then finds the
    /// unbound frees of areas live before the crossing; an area freed and allocated again
    /// inside the window counts once, by its first free.
    #[test]
    fn replay_reads_the_frees_queued_ahead_of_a_crossing() {
        let queue = DrainQueue {
            allowance: 1,
            horizon_ns: 1_000,
            unblocked: DrainLatency::from_samples(&[10]).expect("samples"),
            drains: 1,
            queued_behind: 1,
            agreed: 1,
            agreed_without: 0,
        };
        let mut q = QueueAhead::new(queue);
        let trace = [
            alloc(10, 0xa000),
            alloc(20, 0xb000),
            alloc(30, 0xc000),
            free(100, 0xd000, "kworker/u8:0"), // the crossing (its own area is not ahead)
            free(300, 0xa000, "kworker/u8:0"),
            alloc(350, 0xa000),
            free(400, 0xb000, "stress"),
            free(500, 0xa000, "kworker/u8:0"), // allocated after the crossing
            free(700, 0xc000, "kworker/u8:1"),
            free(2_000, 0xe000, "stress"),
        ];
        let mut handed = Vec::new();
        for (i, rec) in trace.into_iter().enumerate() {
            q.push(rec, i);
            while let Some((r, _)) = q.pop(false) {
                if r.ts_ns() == Some(100) {
                    // The crossing comes out only once the record at 2,000 is read.
                    assert_eq!(i, 9);
                    // Ahead: 300 and 700 (allowance 1: the one at 700 runs beside the drain).
                    assert_eq!(q.wait_after(100), 200);
                }
                handed.push(r.ts_ns().expect("ts"));
                q.handed_out(&r);
            }
        }
        assert_eq!(handed, [10, 20, 30, 100, 300, 350, 400, 500, 700]);
        assert!(q.pop(true).is_some() && q.pop(true).is_none());
    }

    #[test]
    fn the_allowance_runs_beside_the_drain() {
        let ahead = [10, 20, 30, 40];
        assert_eq!(ahead_of(&ahead, 0), 40);
        assert_eq!(ahead_of(&ahead, 2), 20);
        assert_eq!(ahead_of(&ahead, 4), 0);
        assert_eq!(ahead_of(&[], 0), 0);
    }

    /// Drains behind three frees start after the first of them (two run beside); the rest
    /// start in 10 µs, but for one 5 ms start that no free explains, which sets the horizon.
    /// The fit finds the allowance and keeps the latencies of the drains with nothing ahead.
    #[test]
    fn the_fit_finds_the_allowance_the_recorded_starts_show() {
        let mut drains = vec![QueuedDrain {
            latency_ns: 5_000_000,
            ahead_ns: vec![4_999_000],
        }];
        for i in 0..40u64 {
            if i % 4 == 0 {
                let first = 2_000_000 + i * 1000;
                drains.push(QueuedDrain {
                    latency_ns: first + 5_000,
                    ahead_ns: vec![first, first + 1_000_000, first + 2_000_000],
                });
            } else {
                drains.push(QueuedDrain {
                    latency_ns: 10_000 + i,
                    ahead_ns: vec![],
                });
            }
        }
        let q = DrainQueue::fit(&drains).expect("a queue");
        assert_eq!(q.allowance, 2);
        assert_eq!(q.horizon_ns, 5_000_000);
        assert_eq!(q.queued_behind, 10);
        assert_eq!((q.agreed, q.agreed_without), (40, 30));
        assert!(q.unblocked.p50_ns < 20_000, "{:?}", q.unblocked);
    }

    /// Frees ahead that never delay anything (they come while the drain has long started) do
    /// not make a queue.
    #[test]
    fn frees_that_explain_nothing_make_no_queue() {
        let drains: Vec<QueuedDrain> = (0..20)
            .map(|i| QueuedDrain {
                latency_ns: 10_000 + i,
                ahead_ns: if i % 2 == 0 { vec![5_000] } else { vec![] },
            })
            .collect();
        assert_eq!(DrainQueue::fit(&drains), None);
    }

    #[test]
    fn the_scan_counts_only_unbound_frees_of_areas_allocated_before_the_crossing() {
        let mut s = QueueScan::default();
        s.alloc(0x1000, 100);
        s.alloc(0x2000, 150);
        s.free(0x2000, 190, "stress"); // freed by the workload's own task: not queued
        s.alloc(0x3000, 300); // after the crossing at 200
        s.free(0x1000, 400, "kworker/u8:3");
        s.free(0x3000, 500, "kworker/u8:3");
        s.drain(200, 450);
        s.finish();
        assert_eq!(
            s.drains,
            vec![QueuedDrain {
                latency_ns: 450,
                ahead_ns: vec![200]
            }]
        );
    }
}
