//! Inputs of the what-if simulation measured from recordings, so that a prediction rests on
//! what a kernel showed rather than on round figures.
//!
//! A recording carries three kinds of timing: `contention` records (every lock wait, with its
//! length and class), `work` records (when each drain work item started, and how long it ran)
//! and, on the richer probe rungs, `latency` records. [`Scan`] collects them from one trace; the
//! caller adds how many critical sections each lock instance saw, which the observed-timing
//! replay counts; [`calibrate`] turns one or more traces into a [`Calibration`]:
//!
//! - **Hold times per lock class**, from the waits, by the residual-life estimator written out
//!   in `docs/model.md` ("Calibration"). Two identities of a FIFO lock with independent
//!   arrivals give the first two moments of the hold time: an arrival waits when another CPU
//!   holds the lock, so the number of waits gives the mean hold; a waiter waits out the rest of
//!   the holder's section, so the mean wait gives the second moment, and the mean square wait
//!   the third. The hold is then the two-point mixture with those three moments: a base
//!   section, and a rare long hold (the holder interrupted, or its vCPU descheduled) that
//!   carries the tail.
//! - **Drain latency**, the delay from the free that crosses `lazy_max_pages` to the start of
//!   the `drain_vmap_area_work` item, as its empirical distribution: free-running replay samples
//!   it per purge.
//! - **Purge cost**, a least-squares line of the drain item's run time against its `npurged`.
//! - **`alloc_vmap_area` outside its locks**, from `latency` records when the trace has them.
//!
//! Everything else keeps its documented default, and the calibration says which ones those are.
//! Pure arithmetic over records: no I/O, no clock.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::after_wait::{self, AfterWait};
use super::drain_queue::{DrainQueue, QueueScan, QueuedDrain};
use super::timing::Costs;
use crate::model::LockCounts;
use crate::replay::lookahead::DRAIN_FUNCTION;
use crate::trace::{LockClass, Record};

/// A wait this long is a holder or waiter that stopped running (preempted, interrupted, its
/// vCPU descheduled), not the rest of a section: the same bound as a waiter's own section
/// ([`after_wait::WINDOW_NS`]). The estimator counts such waits but leaves them out of the
/// moments it fits the hold to.
pub const STALL_WAIT_NS: u64 = after_wait::WINDOW_NS;

/// Frees kept to find a drain's drop: longer than a drain item runs.
const RECENT_FREES_NS: u64 = 50_000_000;

/// The drop lies between the last free that still exceeded the threshold and the first that
/// did not: its midpoint, from the drain item's start.
fn rearm_delay(start: u64, last_high: u64, first_low: u64) -> u64 {
    (last_high / 2 + first_low / 2).saturating_sub(start)
}

/// A drain item counts as started among concurrent frees when at least two CPUs freed within
/// this long before it: the CPU the worker does not take goes on freeing, and its frees exceed
/// the threshold until the purge subtracts its pages, which queues the item again. Chosen on
/// the `train` recordings of `cargo xtask fidelity` from 50 µs, 200 µs and 1 ms, as the window
/// whose follow-up share varied least between workloads and thread counts.
pub const FOLLOW_UP_WINDOW_NS: u64 = 1_000_000;

/// No allocation or free on any CPU for this long is a time the workload did not run: the
/// machine stalled (its vCPUs descheduled by the host, a TLB-flush IPI waited out) or the
/// workload was idle. Free-running replay holds a purge's batch back for a sampled span while
/// the replayed workload keeps its recorded times, so what the span must carry is the
/// workload's time that passed, not the wall clock: a 20 ms stall sampled into a purge at
/// another time lets the backlog and the VA high-water grow where the kernel's stood still.
/// Such silences are therefore taken out of drain latencies, purge spans and runs, and
/// follow-up delays. Under a running stress workload events come microseconds apart; silences
/// of 0.1–1 ms inside the worker's intervals are common and can be real (the purge holding
/// `free_vmap_area_lock`), so they are kept: 1 ms is above most of them and far below the
/// stalls that wrecked a held-out high-water. `vmtrace calibrate` prints what it took out.
pub const STALL_NS: u64 = 1_000_000;

/// At most this many points of the drain-latency distribution are kept: enough to sample its
/// shape, little enough to read in a calibration file.
const DRAIN_QUANTILES: usize = 201;

/// Timing facts of one trace, read record by record.
#[derive(Clone, Debug, Default)]
pub struct Scan {
    first_ts: Option<u64>,
    last_ts: u64,
    events_per_cpu: BTreeMap<u32, u64>,
    waits: BTreeMap<LockClass, Vec<u64>>,
    /// `free_vmap_area_lock` waits not yet known to lie outside every drain item: `(end, wait)`.
    free_area_pending: VecDeque<(u64, u64)>,
    /// `free_vmap_area_lock` waits that overlapped a drain item. The purge's own sections on
    /// that lock (a decay's merged runs, the areas `purge_vmap_node` returns) are long and
    /// free-running replay builds them from the purge, so these waits are not evidence of a
    /// long hold any section may draw: over the corpus nearly every free-area wait above 2 µs
    /// lay inside a drain item (docs/model.md, "Calibration").
    pub free_area_in_drains: u64,
    /// Timestamps of frees above the threshold since the last drain item started: the first
    /// one queued the next item (`schedule_work` is a no-op while the item is pending).
    over_threshold: VecDeque<u64>,
    last_drain_start: Option<u64>,
    drain_latencies: Vec<u64>,
    /// Recent frees: `(ts, above the threshold)`, to find when each drain's purge took its
    /// pages out of the backlog.
    recent_frees: VecDeque<(u64, u32, bool)>,
    /// The last drain item: its start, its end, and whether it started among concurrent
    /// frees; classified as followed up or not when the next item shows what queued it.
    prev_item: Option<(u64, u64, bool)>,
    follow_ups: FollowUpCounts,
    /// Follow-up items: from the item they followed's start, and from its end, to theirs.
    follow_up_delays: Vec<u64>,
    follow_up_gaps: Vec<u64>,
    /// A drain item whose drop no free has shown yet: its start and the last free above the
    /// threshold seen since.
    rearm_pending: Option<(u64, u64)>,
    rearm_delays: Vec<u64>,
    /// Frees inside drain items, and the items' run time: the freeing tasks share CPUs with
    /// the drain, so their rate drops while it runs.
    frees_in_drains: u64,
    drain_run_ns: u64,
    frees: u64,
    /// The last purge event: `(ts, npurged)`, to pair with the drain item that ran it.
    last_purge: Option<(u64, u32)>,
    purge_runs: Vec<PurgeRun>,
    /// From a drain item's start to its purge's event, per item that ran one.
    purge_spans: Vec<u64>,
    latencies: Vec<u64>,
    /// Silences of [`STALL_NS`] or more between consecutive allocations and frees, in order.
    stalls: Vec<(u64, u64)>,
    stalls_cut: StallsCut,
    /// The time of the record being read.
    now: u64,
    /// Holds the `lock_holds` probe timed, from the footer: per class, the exp2 histogram
    /// (`ClassHolds::histogram`) and the sum.
    holds: BTreeMap<LockClass, MeasuredHolds>,
    /// Waits paired with the event that ends the waiter's section.
    pub after_wait: after_wait::Pairs,
    /// The frees queued ahead of each drain on the unbound workqueue.
    pub queue: QueueScan,
}

/// Lock holds timed by the hold probe, pooled over traces.
#[derive(Clone, Debug, Default)]
pub struct MeasuredHolds {
    pub count: u64,
    pub sum_ns: u64,
    pub histogram: Vec<u64>,
}

impl MeasuredHolds {
    fn add(&mut self, count: u64, sum_ns: u64, histogram: &[u64]) {
        self.count += count;
        self.sum_ns += sum_ns;
        if self.histogram.len() < histogram.len() {
            self.histogram.resize(histogram.len(), 0);
        }
        for (a, b) in self.histogram.iter_mut().zip(histogram) {
            *a += b;
        }
    }

    /// E\[S²\] and E\[S³\] from the histogram, each bucket `[2^(k-1), 2^k)` at its geometric
    /// middle, scaled so that the same points give the exact mean: the buckets are a factor of
    /// two wide, and the sum keeps the first moment exact.
    fn moments(&self) -> (f64, f64, f64) {
        let n = self.count.max(1) as f64;
        let mid = |k: usize| {
            if k == 0 {
                0.0
            } else {
                2f64.powi(k as i32 - 1) * std::f64::consts::SQRT_2
            }
        };
        let raw: f64 = self
            .histogram
            .iter()
            .enumerate()
            .map(|(k, &c)| c as f64 * mid(k))
            .sum();
        let scale = if raw > 0.0 {
            self.sum_ns as f64 / raw
        } else {
            1.0
        };
        let moment = |p: i32| {
            self.histogram
                .iter()
                .enumerate()
                .map(|(k, &c)| c as f64 * (mid(k) * scale).powi(p))
                .sum::<f64>()
                / n
        };
        (self.sum_ns as f64 / n, moment(2), moment(3))
    }
}

/// Machine stalls the calibration took out of the worker's intervals (drain latencies, purge
/// spans and runs, follow-up delays).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StallsCut {
    /// Silences of [`STALL_NS`] or more in the traces.
    pub stalls: u64,
    /// Intervals that held part of one.
    pub intervals: u64,
    /// Time taken out of them.
    pub ns: u64,
}

impl StallsCut {
    fn merge(&mut self, o: StallsCut) {
        self.stalls += o.stalls;
        self.intervals += o.intervals;
        self.ns += o.ns;
    }
}

impl Scan {
    /// Takes one record of the trace, in trace order.
    pub fn record(&mut self, rec: &Record) {
        if let Record::Footer(f) = rec {
            for h in f.ladder.iter().flat_map(|l| &l.lock_holds) {
                self.holds
                    .entry(h.class)
                    .or_default()
                    .add(h.count, h.hold_ns, &h.histogram);
            }
            return;
        }
        self.after_wait.record(rec);
        let ctx = match rec {
            Record::Alloc(a) => &a.ctx,
            Record::Free(f) => &f.ctx,
            Record::Purge(p) => &p.ctx,
            Record::Contention(c) => &c.ctx,
            Record::Work(w) => &w.ctx,
            Record::Latency(l) => &l.ctx,
            _ => return,
        };
        self.now = self.now.max(ctx.ts_ns);
        if matches!(rec, Record::Alloc(_) | Record::Free(_)) {
            if self.first_ts.is_some() && ctx.ts_ns >= self.last_ts.saturating_add(STALL_NS) {
                self.stalls.push((self.last_ts, ctx.ts_ns));
                self.stalls_cut.stalls += 1;
            }
            self.first_ts.get_or_insert(ctx.ts_ns);
            self.last_ts = self.last_ts.max(ctx.ts_ns);
            *self.events_per_cpu.entry(ctx.cpu).or_default() += 1;
        }
        match rec {
            Record::Alloc(a) if a.failed == 0 => self.queue.alloc(a.addr.0, a.ctx.ts_ns),
            Record::Free(f) => self.queue.free(f.va_start.0, f.ctx.ts_ns, &f.ctx.comm),
            _ => {}
        }
        match rec {
            Record::Free(f) if f.nr_lazy_max > 0 => {
                let high = f.nr_lazy > f.nr_lazy_max;
                if high {
                    self.over_threshold.push_back(f.ctx.ts_ns);
                }
                self.free_seen(f.ctx.ts_ns, f.ctx.cpu, high);
            }
            Record::Contention(c) if c.wait_ns > 0 && c.class == LockClass::FreeAreaLock => {
                self.free_area_pending.push_back((c.ctx.ts_ns, c.wait_ns));
            }
            Record::Contention(c) if c.wait_ns > 0 => {
                self.waits.entry(c.class).or_default().push(c.wait_ns);
            }
            Record::Purge(p) => self.last_purge = Some((p.ctx.ts_ns, p.npurged)),
            Record::Work(w) if w.function == DRAIN_FUNCTION => self.drain_item(w),
            Record::Latency(l) if l.function == "alloc_vmap_area" => {
                self.latencies.push(l.latency_ns);
            }
            _ => {}
        }
    }

    /// A drain item's record comes at its end. The free that queued it is the first one above
    /// the threshold after the previous item started (its pending bit cleared then) and before
    /// this one started; its purge is the purge event inside the item's run.
    fn drain_item(&mut self, w: &crate::trace::Work) {
        let start = w.start_ns;
        let after = self.last_drain_start.unwrap_or(0);
        while self.over_threshold.front().is_some_and(|&t| t < after) {
            self.over_threshold.pop_front();
        }
        let trigger = self.over_threshold.front().copied().filter(|&t| t <= start);
        self.queue.item(&w.ctx.comm);
        if let Some(t) = trigger {
            let latency = self.active(t, start);
            self.drain_latencies.push(latency);
            self.queue.drain(t, latency);
        }
        let end = start.saturating_add(w.duration_ns);
        self.settle_free_area_waits(start, end);
        // The previous item was followed up when this one was queued while it still ran: the
        // pending bit had cleared at its start, and its purge had not yet taken its pages out.
        if let Some((p_start, p_end, p_active)) = self.prev_item.take() {
            let followed = trigger.is_some_and(|t| t < p_end);
            self.follow_ups.add(p_active, followed);
            if followed {
                let delay = self.active(p_start, start);
                let gap = self.active(p_end.min(start), start);
                self.follow_up_delays.push(delay);
                self.follow_up_gaps.push(gap);
            }
        }
        let window_start = start.saturating_sub(FOLLOW_UP_WINDOW_NS);
        let mut cpus = self
            .recent_frees
            .iter()
            .filter(|&&(t, _, _)| t >= window_start && t < start)
            .map(|&(_, cpu, _)| cpu);
        let active = cpus
            .next()
            .is_some_and(|first| cpus.any(|cpu| cpu != first));
        self.prev_item = Some((start, end, active));
        while self.over_threshold.front().is_some_and(|&t| t <= start) {
            self.over_threshold.pop_front();
        }
        self.last_drain_start = Some(start);
        self.find_drop(start);
        self.frees_in_drains += self
            .recent_frees
            .iter()
            .filter(|&&(t, _, _)| t >= start && t <= end)
            .count() as u64;
        self.drain_run_ns += w.duration_ns;
        if let Some((ts, npurged)) = self.last_purge.take() {
            if ts >= start && ts <= end {
                let run_ns = self.active(start, end);
                let span = self.active(start, ts);
                // The flush comes after every node's decay and lazy detach, and before any
                // `purge_vmap_node`.
                let decay_ns = w
                    .flush_ns
                    .filter(|&f| f >= start && f <= ts)
                    .map(|f| (f - start).saturating_sub(self.stalled(start, f)));
                self.purge_runs.push(PurgeRun {
                    ts,
                    npurged,
                    run_ns,
                    decay_ns,
                });
                self.purge_spans.push(span);
            }
        }
    }

    /// Sorts the pending free-area waits against a drain item that ran `[start, end]`: one
    /// that ended before it started lies outside every item (later items start later), one
    /// that overlaps it is the purge's, and the rest wait for the next item.
    fn settle_free_area_waits(&mut self, start: u64, end: u64) {
        let mut keep = VecDeque::new();
        while let Some((at, wait)) = self.free_area_pending.pop_front() {
            if at < start {
                self.waits
                    .entry(LockClass::FreeAreaLock)
                    .or_default()
                    .push(wait);
            } else if at.saturating_sub(wait) <= end {
                self.free_area_in_drains += 1;
            } else {
                keep.push_back((at, wait));
            }
        }
        self.free_area_pending = keep;
    }

    /// The waits of `class` that size its holds: every recorded one, less the free-area waits
    /// inside drain items ([`Scan::free_area_in_drains`]).
    fn class_waits(&self, class: LockClass) -> impl Iterator<Item = u64> + '_ {
        let pending = (class == LockClass::FreeAreaLock)
            .then(|| self.free_area_pending.iter().map(|&(_, w)| w))
            .into_iter()
            .flatten();
        self.waits
            .get(&class)
            .into_iter()
            .flatten()
            .copied()
            .chain(pending)
    }

    /// `to - from` less the stalls inside it, counted in [`Scan::stalls_cut`].
    fn active(&mut self, from: u64, to: u64) -> u64 {
        let stalled = self.stalled(from, to);
        if stalled > 0 {
            self.stalls_cut.intervals += 1;
            self.stalls_cut.ns += stalled;
        }
        to.saturating_sub(from).saturating_sub(stalled)
    }

    /// The stalls inside `[from, to]`.
    fn stalled(&self, from: u64, to: u64) -> u64 {
        let first = self.stalls.partition_point(|&(_, end)| end <= from);
        // The silence since the last allocation or free, which lasts at least until the
        // record being read: a `work` record comes at the item's end, and a stall under the
        // worker can end after it.
        let open =
            (self.now >= self.last_ts.saturating_add(STALL_NS)).then_some((self.last_ts, self.now));
        self.stalls[first..]
            .iter()
            .chain(open.iter())
            .take_while(|&&(begin, _)| begin < to)
            .map(|&(begin, end)| end.min(to).saturating_sub(begin.max(from)))
            .sum()
    }

    /// A free, for the drop after each drain. Frees older than [`RECENT_FREES_NS`] cannot
    /// belong to a drain item whose record is still to come.
    fn free_seen(&mut self, ts: u64, cpu: u32, high: bool) {
        if let Some((start, last_high)) = self.rearm_pending {
            if high {
                self.rearm_pending = Some((start, ts));
            } else {
                self.rearm_delays.push(rearm_delay(start, last_high, ts));
                self.rearm_pending = None;
            }
        }
        self.frees += 1;
        self.recent_frees.push_back((ts, cpu, high));
        while self
            .recent_frees
            .front()
            .is_some_and(|&(t, _, _)| t.saturating_add(RECENT_FREES_NS) < ts)
        {
            self.recent_frees.pop_front();
        }
    }

    /// The drain item that started at `start` has ended: the first free after it that no
    /// longer exceeds the threshold shows that its purge's pages left the backlog.
    fn find_drop(&mut self, start: u64) {
        let mut last_high = start;
        for &(t, _, high) in self.recent_frees.iter().filter(|&&(t, _, _)| t >= start) {
            if high {
                last_high = t;
            } else {
                self.rearm_delays.push(rearm_delay(start, last_high, t));
                return;
            }
        }
        self.rearm_pending = Some((start, last_high));
    }

    /// The free rate inside drain items over the trace's whole rate; `None` without items.
    pub fn drain_free_rate_ratio(&self) -> Option<f64> {
        let whole = self.frees as f64 / self.duration_ns().max(1) as f64;
        (self.drain_run_ns > 0 && whole > 0.0)
            .then(|| self.frees_in_drains as f64 / self.drain_run_ns as f64 / whole)
    }

    /// First to last allocation or free.
    pub fn duration_ns(&self) -> u64 {
        self.last_ts - self.first_ts.unwrap_or(self.last_ts)
    }

    /// Lock waits the trace recorded, all classes.
    pub fn waits(&self) -> u64 {
        self.waits.values().map(|w| w.len() as u64).sum::<u64>()
            + self.free_area_pending.len() as u64
            + self.free_area_in_drains
    }

    /// Drain items whose queueing free was found.
    pub fn drain_latencies(&self) -> &[u64] {
        &self.drain_latencies
    }

    /// Drain items followed up, by whether they started among concurrent frees.
    pub fn follow_ups(&self) -> FollowUpCounts {
        self.follow_ups
    }
}

/// Drain items, and how many of them were followed up by another item queued while they ran,
/// split by whether two or more CPUs freed in the [`FOLLOW_UP_WINDOW_NS`] before them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowUpCounts {
    pub concurrent_items: u64,
    pub concurrent_followed: u64,
    pub lone_items: u64,
    pub lone_followed: u64,
}

impl FollowUpCounts {
    fn add(&mut self, concurrent: bool, followed: bool) {
        if concurrent {
            self.concurrent_items += 1;
            self.concurrent_followed += u64::from(followed);
        } else {
            self.lone_items += 1;
            self.lone_followed += u64::from(followed);
        }
    }

    fn merge(&mut self, o: FollowUpCounts) {
        self.concurrent_items += o.concurrent_items;
        self.concurrent_followed += o.concurrent_followed;
        self.lone_items += o.lone_items;
        self.lone_followed += o.lone_followed;
    }
}

/// How often a drain item is followed by another, and when that one starts.
///
/// `__purge_vmap_area_lazy` detaches every node's lazy list first and subtracts a node's pages
/// from `vmap_lazy_nr` only at the end of its `purge_vmap_node`. A free in between still finds
/// the backlog above `lazy_max_pages` and calls `schedule_work`, which queues the item again
/// because its pending bit cleared when it started. The follow-up purges what was freed in the
/// meantime, a few areas. Whether such a free comes depends on a CPU the worker does not occupy
/// going on freeing, so the share is kept apart for items that started among frees of two or
/// more CPUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FollowUp {
    pub window_ns: u64,
    pub counts: FollowUpCounts,
    /// From the followed item's start to the follow-up's start (trace time).
    pub delay: DrainLatency,
    /// From the followed item's end to the follow-up's start (the worker's queueing delay).
    pub gap: DrainLatency,
}

impl FollowUp {
    /// The chance that an item is followed up, given whether it started among concurrent
    /// frees.
    pub fn probability(&self, concurrent: bool) -> f64 {
        let c = self.counts;
        let (n, k) = if concurrent {
            (c.concurrent_items, c.concurrent_followed)
        } else {
            (c.lone_items, c.lone_followed)
        };
        if n == 0 {
            0.0
        } else {
            k as f64 / n as f64
        }
    }
}

/// One trace's scan and the critical sections its observed-timing replay counted.
#[derive(Clone, Debug)]
pub struct TraceTiming {
    pub scan: Scan,
    pub sections: LockCounts,
    /// Pool entries each purge's decay took in the observed-timing replay, by the purge
    /// event's time: the trace shows how long a decay ran, the model how much it decayed.
    pub decayed: BTreeMap<u64, u32>,
}

/// The decay's part of drain items: `base_ns + per_entry_ns × decayed` ([`decay_line`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecayFit {
    /// Items timed at their flush whose purge the observed-timing replay matched.
    pub items: u64,
    pub base_ns: f64,
    pub per_entry_ns: f64,
}

/// One drain item that ran a purge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct PurgeRun {
    /// The purge event's time.
    ts: u64,
    npurged: u32,
    /// The item's run, stalls taken out.
    run_ns: u64,
    /// From the item's start to its TLB flush, stalls taken out, where the item was timed at
    /// its flush: the decay of every node's pools and the lazy lists' detach.
    decay_ns: Option<u64>,
}

/// Where a cost came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    pub cost: String,
    pub ns: u64,
    /// `measured` or `default`.
    pub source: String,
    /// What it was measured from, or why it could not be.
    pub basis: String,
}

/// The hold-time distribution of one lock class's ordinary sections: `base_ns`, and with
/// probability `tail_share` a long hold of `tail_ns` instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HoldTail {
    pub tail_ns: u64,
    pub tail_share: f64,
}

/// The estimate for one lock class, with the figures it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HoldEstimate {
    pub class: LockClass,
    /// Sections the observed-timing replay counted, all traces.
    pub sections: u64,
    pub waits: u64,
    /// waits / sections: the share of arrivals that found the lock held.
    pub p_wait: f64,
    pub mean_wait_ns: f64,
    pub median_wait_ns: f64,
    /// E\[S\] and E\[S²\] of the hold time (ns, ns²).
    pub mean_hold_ns: f64,
    pub second_moment_ns2: f64,
    /// E\[S²\] / E\[S\]²: 1 for a fixed hold; far above 1 when rare long holds carry the waits.
    pub dispersion: f64,
    pub base_ns: u64,
    pub tail: HoldTail,
    /// Waits of [`STALL_WAIT_NS`] or more: counted as waits, left out of the moments (and of
    /// `mean_wait_ns`).
    #[serde(default)]
    pub stalled_waits: u64,
    /// Holds the `lock_holds` probe timed (`waits` and the wait figures are then only
    /// reported): the traces' own holds, used instead of the wait estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_holds: Option<u64>,
    /// The wait estimator's mean hold, beside a measured one, as its check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_estimate_ns: Option<f64>,
    /// Waiters' own sections measured (`sim::after_wait`), which set `base_ns` instead of
    /// the wait estimate; the long-hold tail stays the estimator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sections_after_wait: Option<u64>,
}

/// The empirical distribution of the drain latency, as evenly spaced quantiles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DrainLatency {
    pub count: u64,
    pub p10_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub max_ns: u64,
    /// Quantiles 0, 1/(n-1), …, 1 of the measured latencies, ascending.
    pub quantiles_ns: Vec<u64>,
}

impl DrainLatency {
    /// The distribution of `samples`; `None` when there are none.
    pub fn from_samples(samples: &[u64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_unstable();
        let n = DRAIN_QUANTILES.min(s.len()).max(2);
        let quantiles_ns = (0..n)
            .map(|i| quantile(&s, i as f64 / (n - 1) as f64))
            .collect();
        Some(Self {
            count: s.len() as u64,
            p10_ns: quantile(&s, 0.1),
            p50_ns: quantile(&s, 0.5),
            p90_ns: quantile(&s, 0.9),
            max_ns: *s.last().unwrap_or(&0),
            quantiles_ns,
        })
    }

    /// The latency at uniform `u` in [0, 1): linear between neighbouring quantiles.
    pub fn sample(&self, u: f64) -> u64 {
        let q = &self.quantiles_ns;
        match q.len() {
            0 => 0,
            1 => q[0],
            n => {
                let x = u.clamp(0.0, 1.0) * (n - 1) as f64;
                let i = (x.floor() as usize).min(n - 2);
                let f = x - i as f64;
                (q[i] as f64 + f * (q[i + 1] as f64 - q[i] as f64)).round() as u64
            }
        }
    }
}

/// The `q`-quantile of sorted `s` (nearest rank).
fn quantile(s: &[u64], q: f64) -> u64 {
    if s.is_empty() {
        return 0;
    }
    let i = ((s.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
    s[i]
}

/// The machine and kernel the traces were recorded on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    pub kernel_release: String,
    pub hostname: String,
    pub possible_cpus: u32,
    pub online_cpus: u32,
    pub vmap_nodes: u32,
}

/// One calibrated trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CalibratedTrace {
    pub path: String,
    pub duration_ns: u64,
    pub waits: u64,
    pub drain_items: u64,
    /// Mean wait of each class with at least [`WAIT_SCALE_MIN`] waits, stalls left out. Set
    /// beside each other they show how much of a wait's length is the recording's rather than
    /// the lock's (docs/model.md, "Wait lengths belong to the recording more than to the lock").
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mean_wait_ns: BTreeMap<LockClass, f64>,
}

/// Waits a class needs in one trace before its mean wait is reported.
pub const WAIT_SCALE_MIN: usize = 30;

impl Scan {
    /// See [`CalibratedTrace::mean_wait_ns`].
    pub fn mean_waits(&self) -> BTreeMap<LockClass, f64> {
        let pending = (!self.free_area_pending.is_empty()).then_some(LockClass::FreeAreaLock);
        let classes: std::collections::BTreeSet<LockClass> =
            self.waits.keys().copied().chain(pending).collect();
        classes
            .into_iter()
            .filter(|&c| c != LockClass::Other)
            .filter_map(|c| {
                let body: Vec<f64> = self
                    .class_waits(c)
                    .filter(|&x| x < STALL_WAIT_NS)
                    .map(|x| x as f64)
                    .collect();
                (body.len() >= WAIT_SCALE_MIN)
                    .then(|| (c, body.iter().sum::<f64>() / body.len() as f64))
            })
            .collect()
    }
}

/// What `vmtrace calibrate` writes and `--costs FILE` reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub format: String,
    pub version: u32,
    pub tool: String,
    pub machine: Machine,
    pub traces: Vec<CalibratedTrace>,
    pub costs: Costs,
    /// Long holds per lock class ([`LockClass::ALL`] names); absent classes hold `costs` alone.
    #[serde(default)]
    pub tails: BTreeMap<LockClass, HoldTail>,
    #[serde(default)]
    pub drain_latency: Option<DrainLatency>,
    /// Drains queued behind deferred frees on the unbound workqueue (`sim::drain_queue`):
    /// where present, free-running replay samples `unblocked` instead of `drain_latency` and
    /// starts each drain no earlier than the frees queued ahead of it allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_queue: Option<DrainQueue>,
    /// From a drain item's start to the drop of `vmap_lazy_nr` by its purge: until then every
    /// free still exceeds the threshold and queues the drain again.
    #[serde(default)]
    pub drop_delay: Option<DrainLatency>,
    /// The free rate while a drain item runs, over the rate outside: a free that a running
    /// drain would have held back past its drop cannot queue it again.
    #[serde(default)]
    pub drain_free_rate_ratio: Option<f64>,
    /// From a drain item's start to its purge's trace event, which fires at the end of
    /// `__purge_vmap_area_lazy`: the detach at its start takes the lazy areas off their lists,
    /// and they reach the pools or the free tree only in `purge_vmap_node`, after the TLB
    /// flush. Allocations in between find neither, and go higher in the free tree.
    #[serde(default)]
    pub purge_span: Option<DrainLatency>,
    /// How long drain items' decays ran against the pool entries they took, where the items
    /// were timed at their TLB flush. Reported beside `merge_per_area_ns`, not put in it: set
    /// as that cost, it lowered the held-out figures on two corpora (docs/fidelity.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay: Option<DecayFit>,
    /// Machine stalls taken out of the measured intervals above.
    #[serde(default)]
    pub stalls: StallsCut,
    /// Drain items queued again while they ran; `None` from traces without `work` records.
    #[serde(default)]
    pub follow_up: Option<FollowUp>,
    pub holds: Vec<HoldEstimate>,
    /// Sections measured from the waiters' own next events; absent where the traces have too
    /// few pool-lock waits to size the probes' cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_wait: Option<AfterWait>,
    /// Every cost, measured or default, and why.
    pub provenance: Vec<Provenance>,
}

/// A calibration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("line {line}, column {column}: {message}")]
    Parse {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("not a vmtrace calibration (format `{0}`, expected `{FORMAT}`)")]
    Format(String),
    #[error("calibration version {0} is newer than this vmtrace reads ({VERSION})")]
    Version(u32),
    #[error("no trace to calibrate from")]
    NoTraces,
}

pub const FORMAT: &str = "vmtrace-calibration";
pub const VERSION: u32 = 1;

impl Calibration {
    /// Parses a calibration file's text.
    pub fn parse(text: &str) -> Result<Self, CalibrationError> {
        let c: Calibration = serde_json::from_str(text).map_err(|e| CalibrationError::Parse {
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
        if c.format != FORMAT {
            return Err(CalibrationError::Format(c.format));
        }
        if c.version > VERSION {
            return Err(CalibrationError::Version(c.version));
        }
        Ok(c)
    }

    /// The long-hold mixture of `class`, if the calibration measured one.
    pub fn tail(&self, class: LockClass) -> HoldTail {
        self.tails.get(&class).copied().unwrap_or_default()
    }
}

/// Sections of `class` per lock instance.
fn instances(s: &LockCounts, class: LockClass) -> Vec<u64> {
    match class {
        LockClass::FreeAreaLock => vec![s.free_vmap_area_lock],
        LockClass::PageTableLock => vec![s.page_table_lock],
        LockClass::NodeBusyLock => s.busy.clone(),
        LockClass::NodeLazyLock => s.lazy.clone(),
        LockClass::NodePoolLock => s.pool.clone(),
        LockClass::PurgeMutex | LockClass::Other => Vec::new(),
    }
}

/// The classes whose ordinary sections the estimator sizes, with the cost each sets.
const ESTIMATED: [(LockClass, &str); 5] = [
    (LockClass::FreeAreaLock, "free_area_lock_ns"),
    (LockClass::NodeBusyLock, "busy_lock_ns"),
    (LockClass::NodeLazyLock, "lazy_lock_ns"),
    (LockClass::NodePoolLock, "pool_lock_ns"),
    (LockClass::PageTableLock, "page_table_lock_ns"),
];

/// Per-class inputs of the estimator, pooled over traces.
#[derive(Default)]
struct ClassInput {
    sections: u64,
    waits: Vec<u64>,
    /// Σ over traces and instances of n_i² (1 − Σ_cpu share²) / T: the waits per ns of hold
    /// that independent CPUs produce.
    exposure: f64,
    holds: MeasuredHolds,
}

/// The hold-time estimate of one class from its pooled waits (see the module docs and
/// `docs/model.md`, "Calibration"). `None` when the class saw no section or no wait.
pub fn estimate_hold(
    class: LockClass,
    sections: u64,
    exposure: f64,
    waits: &[u64],
) -> Option<HoldEstimate> {
    if waits.is_empty() || sections == 0 || exposure <= 0.0 {
        return None;
    }
    let mut w = waits.to_vec();
    w.sort_unstable();
    let n = w.len() as f64;
    let median = quantile(&w, 0.5) as f64;
    let p_wait = (n / sections as f64).min(0.99);
    // Every wait counts as an arrival that found the lock held, but only the waits of the
    // body give the moments: one stall of milliseconds outweighs thousands of microsecond
    // waits in the third moment, and the mixture then spends its tail on it.
    let body = w.partition_point(|&x| x < STALL_WAIT_NS);
    let body = if body == 0 { &w[..] } else { &w[..body] };
    let nb = body.len() as f64;
    // Waits = E[S] × exposure; a waiter's mean wait is the residual E[S²] / (2 E[S]),
    // stretched by 1 / (1 − ρ) for the waiters queued ahead (M/G/1, ρ ≈ p_wait).
    let mean_wait = body.iter().map(|&x| x as f64).sum::<f64>() / nb;
    let mean_sq_wait = body.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / nb;
    let mean_hold = n / exposure;
    // The residual R of a hold S has E[R] = E[S²] / (2 E[S]) and E[R²] = E[S³] / (3 E[S]).
    let second = 2.0 * mean_hold * (1.0 - p_wait) * mean_wait;
    let third = 3.0 * mean_hold * (1.0 - p_wait) * mean_sq_wait;
    let dispersion = second / (mean_hold * mean_hold);
    let (base_ns, tail) = mixture(mean_hold, second, third);
    Some(HoldEstimate {
        class,
        sections,
        waits: w.len() as u64,
        p_wait,
        mean_wait_ns: mean_wait,
        median_wait_ns: median,
        mean_hold_ns: mean_hold,
        second_moment_ns2: second,
        dispersion,
        base_ns,
        tail,
        stalled_waits: (w.len() - body.len()) as u64,
        measured_holds: None,
        wait_estimate_ns: None,
        sections_after_wait: None,
    })
}

/// The hold estimate of one class from the holds the probe timed: the same two-point mixture
/// as [`estimate_hold`], from the holds' own moments instead of the waits'.
fn measured_hold(class: LockClass, sections: u64, m: &MeasuredHolds) -> Option<HoldEstimate> {
    if m.count == 0 {
        return None;
    }
    let (mean, second, third) = m.moments();
    let (base_ns, tail) = mixture(mean, second, third);
    Some(HoldEstimate {
        class,
        sections,
        waits: 0,
        p_wait: 0.0,
        mean_wait_ns: 0.0,
        median_wait_ns: 0.0,
        mean_hold_ns: mean,
        second_moment_ns2: second,
        dispersion: second / (mean * mean),
        base_ns,
        tail,
        stalled_waits: 0,
        measured_holds: Some(m.count),
        wait_estimate_ns: None,
        sections_after_wait: None,
    })
}

/// Waits below which [`spin_handoff`] estimates nothing: its 1st percentile would rest on one
/// wait.
const HANDOFF_MIN_WAITS: usize = 100;

/// The spinlock handoff ([`Costs::spin_handoff_ns`]) from the observed waits of every spinlock
/// class, and how many waits it rests on. A recorded wait is W = R + H: the rest R of the
/// holder's section, then the handoff H (the queued lock passing its cache line to the waiter,
/// with the probes' cost at both ends). R has its density at 0 (a waiter can arrive at any
/// point of a section), so W's lowest quantile estimates H, high by R's own 1st percentile: a
/// few ns for holds of a few hundred. The classes are pooled because H is the lock's mechanism,
/// not the section's: their floors agree within 20 ns on the reference machine, and a class
/// with a few dozen waits has no floor of its own.
fn spin_handoff<'a>(classes: impl Iterator<Item = &'a [u64]>) -> Option<(u64, usize)> {
    let mut all: Vec<u64> = classes.flatten().copied().collect();
    if all.len() < HANDOFF_MIN_WAITS {
        return None;
    }
    all.sort_unstable();
    Some((quantile(&all, 0.01), all.len()))
}

/// The base hold and long-hold tail of the [`two_points`] distribution with these moments; a
/// fixed hold of the mean when there is none.
fn mixture(mean: f64, second: f64, third: f64) -> (u64, HoldTail) {
    match two_points(mean, second, third) {
        None => (mean.round().max(1.0) as u64, HoldTail::default()),
        Some((base, tail_ns, share)) => (
            base.round() as u64,
            HoldTail {
                tail_ns: tail_ns.round() as u64,
                tail_share: share,
            },
        ),
    }
}

/// The two-point distribution (a with probability 1 − p, b with p) with moments `m1`, `m2`,
/// `m3`: a and b are the roots of x² = c1·x + c0, where E\[X^(k+2)\] = c1·E\[X^(k+1)\] +
/// c0·E\[X^k\] for k = 0, 1. Where no such pair with 0 ≤ a < m1 < b exists (a third moment
/// too small for the second), a = 0 keeps the first two moments. `None` for a fixed hold
/// (m2 ≤ m1²).
fn two_points(m1: f64, m2: f64, m3: f64) -> Option<(f64, f64, f64)> {
    let var = m2 - m1 * m1;
    if m1 <= 0.0 || var <= 0.0 {
        return None;
    }
    let c1 = (m3 - m1 * m2) / var;
    let c0 = m2 - c1 * m1;
    let disc = c1 * c1 + 4.0 * c0;
    if disc >= 0.0 {
        let (a, b) = ((c1 - disc.sqrt()) / 2.0, (c1 + disc.sqrt()) / 2.0);
        if a >= 0.0 && a < m1 && b > m1 {
            return Some((a, b, ((m1 - a) / (b - a)).clamp(0.0, 1.0)));
        }
    }
    Some((0.0, m2 / m1, (m1 * m1 / m2).clamp(0.0, 1.0)))
}

/// Fewest drain items timed at their flush, with a decayed count, to measure the decay's
/// cost per entry from.
const MIN_DECAY_ITEMS: usize = 20;

/// The decay's cost per pool entry: `decay_ns = a + b × decayed`, fitted to the median decay
/// time of each decayed count, weighted by its items. Medians, because a decay phase lasts
/// 8-40 µs and one interrupt or preemption inside it adds as much: on the be0ae92 corpus plain
/// least squares gave 67 ns per entry with the slowest 2 % of items left out and 121 ns with
/// them, the medians 119 ns on its `train` split and 105 ns on `test`. `None` with fewer than
/// [`MIN_DECAY_ITEMS`] items or one decayed count.
fn decay_line(points: &[(u32, u64)]) -> Option<(f64, f64)> {
    if points.len() < MIN_DECAY_ITEMS {
        return None;
    }
    let mut by_count: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for &(decayed, ns) in points {
        by_count.entry(decayed).or_default().push(ns);
    }
    let bins: Vec<(f64, f64, f64)> = by_count
        .into_iter()
        .map(|(decayed, mut v)| {
            v.sort_unstable();
            (f64::from(decayed), quantile(&v, 0.5) as f64, v.len() as f64)
        })
        .collect();
    let w: f64 = bins.iter().map(|b| b.2).sum();
    let mx = bins.iter().map(|b| b.0 * b.2).sum::<f64>() / w;
    let my = bins.iter().map(|b| b.1 * b.2).sum::<f64>() / w;
    let sxx: f64 = bins.iter().map(|b| b.2 * (b.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = bins.iter().map(|b| b.2 * (b.0 - mx) * (b.1 - my)).sum();
    let b = sxy / sxx;
    Some((my - b * mx, b))
}

/// Least squares `duration = a + b × npurged`; `None` with fewer than 3 runs or one `npurged`.
fn purge_line(runs: &[(u32, u64)]) -> Option<(f64, f64)> {
    if runs.len() < 3 {
        return None;
    }
    let n = runs.len() as f64;
    let mx = runs.iter().map(|r| f64::from(r.0)).sum::<f64>() / n;
    let my = runs.iter().map(|r| r.1 as f64).sum::<f64>() / n;
    let sxx: f64 = runs.iter().map(|r| (f64::from(r.0) - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = runs
        .iter()
        .map(|r| (f64::from(r.0) - mx) * (r.1 as f64 - my))
        .sum();
    let b = sxy / sxx;
    Some((my - b * mx, b))
}

/// Builds a calibration from the traces' timing, starting from `base` for what they cannot
/// show.
pub fn calibrate(
    traces: &[TraceTiming],
    base: Costs,
    machine: Machine,
    tool: String,
) -> Result<Calibration, CalibrationError> {
    calibrate_with(traces, base, machine, tool, true)
}

/// [`calibrate`], where `use_holds` false sizes the holds from the waits even when the traces
/// carry timed holds (to check the estimator against them).
pub fn calibrate_with(
    traces: &[TraceTiming],
    base: Costs,
    machine: Machine,
    tool: String,
    use_holds: bool,
) -> Result<Calibration, CalibrationError> {
    if traces.is_empty() {
        return Err(CalibrationError::NoTraces);
    }
    let mut inputs: BTreeMap<LockClass, ClassInput> = BTreeMap::new();
    let mut drain = Vec::new();
    let mut runs = Vec::new();
    let mut decay_points = Vec::new();
    let mut latencies = Vec::new();
    let mut rearm = Vec::new();
    let mut spans = Vec::new();
    let mut follow_counts = FollowUpCounts::default();
    let mut stalls = StallsCut::default();
    let (mut follow_delays, mut follow_gaps) = (Vec::new(), Vec::new());
    let (mut in_drains, mut run_ns, mut frees, mut span) = (0u64, 0u64, 0u64, 0u64);
    for t in traces {
        in_drains += t.scan.frees_in_drains;
        run_ns += t.scan.drain_run_ns;
        frees += t.scan.frees;
        span += t.scan.duration_ns();
        let dur = t.scan.duration_ns().max(1) as f64;
        let total: u64 = t.scan.events_per_cpu.values().sum();
        let concentration: f64 = t
            .scan
            .events_per_cpu
            .values()
            .map(|&e| (e as f64 / total.max(1) as f64).powi(2))
            .sum();
        for (class, _) in ESTIMATED {
            let inst = instances(&t.sections, class);
            let e = inputs.entry(class).or_default();
            if let Some(m) = t.scan.holds.get(&class) {
                e.holds.add(m.count, m.sum_ns, &m.histogram);
            }
            e.sections += inst.iter().sum::<u64>();
            e.exposure += inst
                .iter()
                .map(|&n| (n as f64).powi(2) * (1.0 - concentration) / dur)
                .sum::<f64>();
            e.waits.extend(t.scan.class_waits(class));
        }
        drain.extend_from_slice(&t.scan.drain_latencies);
        rearm.extend_from_slice(&t.scan.rearm_delays);
        follow_counts.merge(t.scan.follow_ups);
        stalls.merge(t.scan.stalls_cut);
        follow_delays.extend_from_slice(&t.scan.follow_up_delays);
        follow_gaps.extend_from_slice(&t.scan.follow_up_gaps);
        for r in &t.scan.purge_runs {
            let decayed = t.decayed.get(&r.ts).copied();
            if let (Some(d), Some(ns)) = (decayed, r.decay_ns) {
                decay_points.push((d, ns));
            }
            runs.push((r.npurged, r.run_ns));
        }
        spans.extend_from_slice(&t.scan.purge_spans);
        latencies.extend_from_slice(&t.scan.latencies);
    }
    let mut costs = base;
    let mut provenance: BTreeMap<&str, (String, String)> = BTreeMap::new();
    let handoff = spin_handoff(inputs.values().map(|e| e.waits.as_slice()));
    match handoff {
        Some((ns, n)) => {
            costs.spin_handoff_ns = ns;
            provenance.insert(
                "spin_handoff_ns",
                (
                    "measured".into(),
                    format!(
                        "1st percentile of {n} spinlock waits, every class pooled; the hold estimates use the waits less it"
                    ),
                ),
            );
        }
        None => {
            provenance.insert(
                "spin_handoff_ns",
                (
                    "default".into(),
                    format!(
                        "fewer than {HANDOFF_MIN_WAITS} spinlock waits recorded (needs --probes lock_waits)"
                    ),
                ),
            );
        }
    }
    let handoff = handoff.map_or(0, |(ns, _)| ns);
    let after_wait = use_holds
        .then(|| after_wait::measure(traces.iter().map(|t| &t.scan.after_wait)))
        .flatten();
    let mut holds = Vec::new();
    let mut tails = BTreeMap::new();
    for (class, name) in ESTIMATED {
        let e = &inputs[&class];
        let residuals: Vec<u64> = e.waits.iter().map(|w| w.saturating_sub(handoff)).collect();
        let from_waits = estimate_hold(class, e.sections, e.exposure, &residuals).map(|mut h| {
            if let Some(own) = after_wait.as_ref().and_then(|a| a.section(class)) {
                h.wait_estimate_ns = Some(h.mean_hold_ns);
                h.base_ns = own.section_ns;
                h.sections_after_wait = Some(own.pairs);
            }
            h
        });
        let timed = use_holds
            .then(|| measured_hold(class, e.sections, &e.holds))
            .flatten()
            .map(|mut h| {
                h.wait_estimate_ns = from_waits.as_ref().map(|w| w.mean_hold_ns);
                h.waits = residuals.len() as u64;
                h
            });
        match timed.or(from_waits) {
            Some(h) => {
                let _ = costs.set(name, h.base_ns);
                let own = after_wait
                    .as_ref()
                    .and_then(|a| Some((a, a.section(class)?)))
                    .filter(|_| h.measured_holds.is_none());
                let basis = match h.measured_holds {
                    None if own.is_some() => {
                        let (a, o) = own.expect("checked");
                        format!(
                            "{} waiters' own sections over {} trace(s), wait end to the task's next {}: median {} ns less {} ns of probe cost (pool-lock pairs); {:.3} % of holds {} ns from the {} waits, whose estimator gave {:.0} ns",
                            o.pairs,
                            o.traces,
                            if class == LockClass::NodeLazyLock { "free" } else { "alloc" },
                            o.median_pair_ns,
                            a.overhead_ns,
                            100.0 * h.tail.tail_share,
                            h.tail.tail_ns,
                            h.waits,
                            h.wait_estimate_ns.unwrap_or(h.mean_hold_ns),
                        )
                    }
                    Some(n) => format!(
                        "{n} holds timed (lock_holds) against {} sections: mean hold {:.0} ns, dispersion {:.1}; base {} ns, {:.3} % of holds {} ns; the {} waits gave {}",
                        h.sections,
                        h.mean_hold_ns,
                        h.dispersion,
                        h.base_ns,
                        100.0 * h.tail.tail_share,
                        h.tail.tail_ns,
                        h.waits,
                        h.wait_estimate_ns
                            .map_or("no estimate".into(), |w| format!("{w:.0} ns")),
                    ),
                    None => format!(
                        "{} waits over {} sections ({} of them {} µs or more, left out of the moments as stalls): mean hold {:.0} ns, dispersion {:.1}; base {} ns, {:.3} % of holds {} ns",
                        h.waits,
                        h.sections,
                        h.stalled_waits,
                        STALL_WAIT_NS / 1000,
                        h.mean_hold_ns,
                        h.dispersion,
                        h.base_ns,
                        100.0 * h.tail.tail_share,
                        h.tail.tail_ns
                    ),
                };
                provenance.insert(name, ("measured".into(), basis));
                if h.tail.tail_share > 0.0 {
                    tails.insert(class, h.tail);
                }
                holds.push(h);
            }
            None => {
                provenance.insert(
                    name,
                    (
                        "default".into(),
                        format!(
                            "no {} waits recorded (needs --probes lock_waits)",
                            class.name()
                        ),
                    ),
                );
            }
        }
    }
    let decay = decay_line(&decay_points).map(|(a, b)| DecayFit {
        items: decay_points.len() as u64,
        base_ns: a.round(),
        per_entry_ns: b.round(),
    });
    match purge_line(&runs) {
        Some((a, b)) => {
            let per_object = (b - base.merge_per_area_ns as f64).max(0.0).round() as u64;
            costs.purge_base_ns = a.max(0.0).round() as u64;
            costs.purge_per_object_ns = per_object;
            let basis = format!(
                "least squares over {} drain items: {:.0} ns + {:.0} ns per object (less merge_per_area_ns)",
                runs.len(),
                a,
                b
            );
            provenance.insert("purge_base_ns", ("measured".into(), basis.clone()));
            provenance.insert("purge_per_object_ns", ("measured".into(), basis));
        }
        None => {
            for name in ["purge_base_ns", "purge_per_object_ns"] {
                provenance.insert(
                    name,
                    (
                        "default".into(),
                        "fewer than 3 drain items with a purge (needs --probes purge_work)".into(),
                    ),
                );
            }
        }
    }
    if latencies.is_empty() {
        provenance.insert(
            "alloc_vmap_area_ns",
            (
                "default".into(),
                "no alloc_vmap_area latency records (fentry/kprobe rungs only)".into(),
            ),
        );
    } else {
        latencies.sort_unstable();
        let median = quantile(&latencies, 0.5);
        let locked = costs.pool_lock_ns + costs.free_area_lock_ns + costs.busy_lock_ns;
        costs.alloc_vmap_area_ns = median.saturating_sub(locked);
        provenance.insert(
            "alloc_vmap_area_ns",
            (
                "measured".into(),
                format!(
                    "median of {} latency records ({median} ns) less the base pool, free-tree and busy sections",
                    latencies.len()
                ),
            ),
        );
    }
    let drain_latency = DrainLatency::from_samples(&drain);
    // The queue applies where the drain items themselves ran on the unbound pool.
    let (items, unbound_items) = traces.iter().fold((0, 0), |(a, b), t| {
        (a + t.scan.queue.items, b + t.scan.queue.unbound_items)
    });
    let drain_queue = (2 * unbound_items > items)
        .then(|| {
            let drains: Vec<QueuedDrain> = traces
                .iter()
                .flat_map(|t| t.scan.queue.finished())
                .collect();
            DrainQueue::fit(&drains)
        })
        .flatten();
    let provenance = Costs::NAMES
        .iter()
        .map(|&name| {
            let (source, basis) = provenance.get(name).cloned().unwrap_or_else(|| {
                (
                    "default".into(),
                    "not visible in a recording; docs/model.md gives the default".into(),
                )
            });
            Provenance {
                cost: name.to_string(),
                ns: costs.get(name).unwrap_or(0),
                source,
                basis,
            }
        })
        .collect();
    Ok(Calibration {
        format: FORMAT.to_string(),
        version: VERSION,
        tool,
        machine,
        traces: traces
            .iter()
            .map(|t| CalibratedTrace {
                path: String::new(),
                duration_ns: t.scan.duration_ns(),
                waits: t.scan.waits(),
                drain_items: t.scan.drain_latencies.len() as u64,
                mean_wait_ns: t.scan.mean_waits(),
            })
            .collect(),
        costs,
        tails,
        drain_latency,
        drain_queue,
        drop_delay: DrainLatency::from_samples(&rearm),
        purge_span: DrainLatency::from_samples(&spans),
        decay,
        stalls,
        follow_up: match (
            DrainLatency::from_samples(&follow_delays),
            DrainLatency::from_samples(&follow_gaps),
        ) {
            (Some(delay), Some(gap)) => Some(FollowUp {
                window_ns: FOLLOW_UP_WINDOW_NS,
                counts: follow_counts,
                delay,
                gap,
            }),
            _ => None,
        },
        drain_free_rate_ratio: (run_ns > 0 && frees > 0)
            .then(|| (in_drains as f64 / run_ns as f64) / (frees as f64 / span.max(1) as f64)),
        holds,
        after_wait,
        provenance,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Ctx, Free, KAddr, Work};

    fn ctx(ts: u64, cpu: u32) -> Ctx {
        Ctx {
            ts_ns: ts,
            cpu,
            tgid: 1,
            pid: 1,
            comm: "t".into(),
        }
    }

    /// Waits that are a handoff of 100 ns after a residual uniform on [0, 200) give back 100
    /// ns within R's own 1st percentile (2 ns), pooled over classes; too few waits give none.
    #[test]
    fn spin_handoff_is_the_floor_of_the_pooled_waits() {
        let busy: Vec<u64> = (0..1000u64).map(|i| 100 + (i * 37) % 200).collect();
        let pool: Vec<u64> = (0..200u64).map(|i| 100 + (i * 53) % 200).collect();
        let (ns, n) = spin_handoff([busy.as_slice(), pool.as_slice()].into_iter()).unwrap();
        assert_eq!(n, 1200);
        assert!((100..=102).contains(&ns), "{ns}");
        assert_eq!(spin_handoff([&busy[..99]].into_iter()), None);
    }

    /// A wait of `wait_ns` on `class` that ended at `ts`.
    fn wait(ts: u64, class: LockClass, wait_ns: u64) -> Record {
        Record::Contention(Box::new(crate::trace::Contention {
            ctx: ctx(ts, 0),
            lock: KAddr(0x10),
            flags: 1,
            wait_ns,
            ret: 0,
            class,
            node: None,
            stack_id: 0,
            stack: Vec::new(),
            probe_ns: None,
        }))
    }

    /// Free-area waits that overlap a drain item are the purge's sections, which free-running
    /// replay builds itself: they stay counted as the trace's waits but do not size the hold,
    /// and waits before, between and after the items do.
    #[test]
    fn free_area_waits_inside_a_drain_item_do_not_size_the_hold() {
        let mut s = Scan::default();
        let fa = LockClass::FreeAreaLock;
        s.record(&wait(900, fa, 300)); // before the item
        s.record(&wait(1_050, fa, 100)); // started before, ended inside
        s.record(&wait(1_500, fa, 8_000)); // began before the item, ended inside
        s.record(&wait(2_100, fa, 200)); // began inside, ended after
        s.record(&wait(1_600, LockClass::NodeBusyLock, 400));
        s.record(&work(2_000, 1_000));
        s.record(&wait(2_500, fa, 150)); // after the item, no later item
        let sizing: Vec<u64> = s.class_waits(fa).collect();
        assert_eq!(sizing, vec![300, 150]);
        assert_eq!(s.free_area_in_drains, 3);
        assert_eq!(s.waits(), 6, "every wait is still the trace's");
        assert_eq!(
            s.class_waits(LockClass::NodeBusyLock).collect::<Vec<_>>(),
            vec![400]
        );
    }

    /// Each trace's mean wait per class: stalls left out, classes with too few waits and
    /// `other` left out.
    #[test]
    fn mean_waits_per_class_leave_out_stalls_and_thin_classes() {
        let mut s = Scan::default();
        for i in 0..WAIT_SCALE_MIN as u64 {
            s.record(&wait(i, LockClass::NodeBusyLock, 1_000 + 100 * (i % 2)));
            s.record(&wait(i, LockClass::Other, 500));
        }
        s.record(&wait(100, LockClass::NodeBusyLock, 5 * STALL_WAIT_NS));
        for i in 0..WAIT_SCALE_MIN as u64 - 1 {
            s.record(&wait(200 + i, LockClass::NodePoolLock, 300));
        }
        let m = s.mean_waits();
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(m[&LockClass::NodeBusyLock], 1_050.0);
        s.record(&wait(300, LockClass::NodePoolLock, 300));
        assert_eq!(s.mean_waits()[&LockClass::NodePoolLock], 300.0);
    }

    /// A free on `cpu` reporting `nr_lazy` against a threshold of 100.
    fn free_on(ts: u64, cpu: u32, nr_lazy: u64) -> Record {
        Record::Free(Free {
            ctx: ctx(ts, cpu),
            va_start: KAddr(0x1000),
            nr_lazy,
            nr_lazy_max: 100,
        })
    }

    /// A drain item's record, written at its end.
    fn work(end: u64, start: u64) -> Record {
        Record::Work(Box::new(Work {
            ctx: ctx(end, 0),
            function: DRAIN_FUNCTION.into(),
            function_addr: KAddr(1),
            work: KAddr(2),
            start_ns: start,
            duration_ns: end - start,
            start_cpu: 0,
            nr_purged: None,
            flush_ns: None,
        }))
    }

    /// `traces` calibrated from the default costs.
    fn calibrated(traces: &[TraceTiming], use_holds: bool) -> Calibration {
        calibrate_with(
            traces,
            Costs::default(),
            Machine::default(),
            "test".into(),
            use_holds,
        )
        .unwrap()
    }

    /// The histogram and sum the hold probe writes for `holds`.
    fn timed(holds: &[u64]) -> MeasuredHolds {
        let mut m = MeasuredHolds::default();
        let mut hist = vec![0u64; vmtrace_common::HOLD_BUCKETS as usize];
        for &h in holds {
            hist[vmtrace_common::hold_bucket(h) as usize] += 1;
        }
        m.add(holds.len() as u64, holds.iter().sum(), &hist);
        m
    }

    #[test]
    fn timed_holds_give_their_mean_and_their_long_tail() {
        // 99.9 % of holds 300 ns, 0.1 % 2 ms (a preempted vCPU).
        let holds: Vec<u64> = (0..100_000u64)
            .map(|i| if i % 1000 == 0 { 2_000_000 } else { 300 })
            .collect();
        let mean = holds.iter().sum::<u64>() as f64 / holds.len() as f64;
        let h = measured_hold(LockClass::NodeLazyLock, 100_000, &timed(&holds)).unwrap();
        assert_eq!(h.measured_holds, Some(100_000));
        assert!((h.mean_hold_ns - mean).abs() < 1e-6, "{h:?}");
        // The buckets are a factor of two wide: the base and the tail land within it.
        assert!((150..=600).contains(&h.base_ns), "{h:?}");
        assert!(
            (1_000_000..=4_000_000).contains(&h.tail.tail_ns) && h.tail.tail_share > 0.0003,
            "{h:?}"
        );
        // Perturbed: every hold twice as long moves the mean and the base with it.
        let doubled: Vec<u64> = holds.iter().map(|h| 2 * h).collect();
        let d = measured_hold(LockClass::NodeLazyLock, 100_000, &timed(&doubled)).unwrap();
        assert!((d.mean_hold_ns / h.mean_hold_ns - 2.0).abs() < 1e-9);
        assert!(d.base_ns >= 2 * h.base_ns - 2, "{d:?} against {h:?}");
    }

    #[test]
    fn timed_holds_win_over_the_wait_estimate_unless_told() {
        let mut scan = Scan::default();
        let holds = timed(&vec![400u64; 10_000]);
        scan.holds.insert(LockClass::NodeBusyLock, holds);
        // Waits that alone would size the busy lock at some other hold.
        scan.first_ts = Some(0);
        scan.last_ts = 1_000_000_000;
        scan.events_per_cpu = BTreeMap::from([(0, 5_000), (1, 5_000)]);
        scan.waits.insert(
            LockClass::NodeBusyLock,
            (0..200).map(|i| 10 + i * 5).collect(),
        );
        let sections = LockCounts {
            busy: vec![5_000, 5_000],
            ..LockCounts::default()
        };
        let traces = [TraceTiming {
            scan,
            sections,
            decayed: BTreeMap::new(),
        }];
        let cal = |use_holds| calibrated(&traces, use_holds);
        let timed = cal(true);
        let h = timed
            .holds
            .iter()
            .find(|h| h.class == LockClass::NodeBusyLock)
            .unwrap();
        assert_eq!(h.measured_holds, Some(10_000));
        assert_eq!(timed.costs.busy_lock_ns, 400);
        let estimate = h
            .wait_estimate_ns
            .expect("the wait estimate is kept beside it");
        let waits = cal(false);
        let w = waits
            .holds
            .iter()
            .find(|h| h.class == LockClass::NodeBusyLock)
            .unwrap();
        assert_eq!(w.measured_holds, None);
        assert!((w.mean_hold_ns - estimate).abs() < 1e-6);
        assert_ne!(waits.costs.busy_lock_ns, 400);
    }

    /// Where waiters' own sections were measured they size the class's base hold, the wait
    /// estimate stays beside it, and timed holds still come first; `--holds-from-waits`
    /// (`use_holds` false) goes back to the estimator.
    #[test]
    fn waiters_own_sections_size_the_hold_between_timed_holds_and_the_estimate() {
        let mut scan = Scan {
            first_ts: Some(0),
            last_ts: 1_000_000_000,
            events_per_cpu: BTreeMap::from([(0, 5_000), (1, 5_000)]),
            // Lazy sections of 600 - 282 ns after the probes' cost (see `after_wait`'s tests).
            after_wait: crate::sim::after_wait::tests::trace(600),
            ..Scan::default()
        };
        for class in [LockClass::NodeLazyLock, LockClass::NodeBusyLock] {
            scan.waits
                .insert(class, (0..200).map(|i| 10 + i * 5).collect());
        }
        let sections = LockCounts {
            busy: vec![5_000, 5_000],
            lazy: vec![5_000, 5_000],
            ..LockCounts::default()
        };
        let run = |scan: Scan, use_holds| {
            let sections = sections.clone();
            calibrated(
                &[TraceTiming {
                    scan,
                    sections,
                    decayed: BTreeMap::new(),
                }],
                use_holds,
            )
        };
        let hold = |c: &Calibration, class| c.holds.iter().find(|h| h.class == class).cloned();
        let own = run(scan.clone(), true);
        assert_eq!(own.costs.lazy_lock_ns, 318);
        let lazy = hold(&own, LockClass::NodeLazyLock).unwrap();
        assert_eq!(lazy.sections_after_wait, Some(40));
        let estimate = lazy.wait_estimate_ns.expect("kept beside it");
        assert!(own
            .provenance
            .iter()
            .any(|p| p.cost == "lazy_lock_ns" && p.basis.contains("waiters' own sections")));
        // The busy lock has no event after its sections: still the estimate.
        let busy = hold(&own, LockClass::NodeBusyLock).unwrap();
        assert_eq!(busy.sections_after_wait, None);
        assert_eq!(own.costs.busy_lock_ns, busy.base_ns);

        let waits = run(scan.clone(), false);
        let lazy = hold(&waits, LockClass::NodeLazyLock).unwrap();
        assert_eq!(lazy.sections_after_wait, None);
        assert!((lazy.mean_hold_ns - estimate).abs() < 1e-6);
        assert_ne!(waits.costs.lazy_lock_ns, 318);
        assert!(waits.after_wait.is_none());

        let mut with_holds = scan;
        with_holds
            .holds
            .insert(LockClass::NodeLazyLock, timed(&vec![900u64; 10_000]));
        assert_eq!(run(with_holds, true).costs.lazy_lock_ns, 900);
    }

    #[test]
    fn a_fixed_hold_comes_back_without_a_tail() {
        // Two CPUs, each 50 % of the sections, one lock, hold 200 ns over 1 s: 100k sections.
        let (n, t, hold) = (100_000u64, 1e9, 200.0);
        let exposure = (n as f64).powi(2) * 0.5 / t;
        let waits_count = (hold * exposure).round() as usize;
        // Residuals of a fixed hold: uniform on [0, 200].
        let waits: Vec<u64> = (0..waits_count)
            .map(|i| 1 + (i as u64 * 199) / waits_count as u64)
            .collect();
        let h = estimate_hold(LockClass::NodeBusyLock, n, exposure, &waits).unwrap();
        assert!((h.mean_hold_ns - hold).abs() < 2.0, "{h:?}");
        assert!((h.dispersion - 1.0).abs() < 0.05, "{h:?}");
        assert!(h.tail.tail_share < 0.01, "{h:?}");
        assert!((h.base_ns as f64 - hold).abs() <= 4.0, "{h:?}");
    }

    #[test]
    fn long_waits_become_a_rare_long_hold_with_the_same_moments() {
        let exposure = 5.0; // waits per ns of mean hold
        let mut waits = vec![50u64; 900];
        waits.extend(std::iter::repeat_n(5_000u64, 100));
        let h = estimate_hold(LockClass::FreeAreaLock, 1_000_000, exposure, &waits).unwrap();
        let (a, b, p) = (h.base_ns as f64, h.tail.tail_ns as f64, h.tail.tail_share);
        let mean = (1.0 - p) * a + p * b;
        let second = (1.0 - p) * a * a + p * b * b;
        assert!((mean / h.mean_hold_ns - 1.0).abs() < 0.02, "{h:?}");
        assert!((second / h.second_moment_ns2 - 1.0).abs() < 0.02, "{h:?}");
        assert!(b > 10.0 * a && p < 0.2, "{h:?}");
    }

    /// A few stalls of milliseconds must not take the long-hold tail away from the body: with
    /// them in the moments, the tail goes to the stalls and the body's 2 µs holds vanish.
    #[test]
    fn stalled_waits_count_but_do_not_set_the_tail() {
        // 98 % of holds 100 ns, 2 % 2000 ns: residuals uniform over each hold, weighted by
        // its length, as a waiter arriving at a random time meets them.
        let exposure = 10.0;
        let mut body = Vec::new();
        for i in 0..980u64 {
            body.push(1 + i * 99 / 980);
        }
        for i in 0..2_000u64 {
            body.push(1 + i * 1_999 / 2_000);
        }
        let clean = estimate_hold(LockClass::NodeBusyLock, 10_000_000, exposure, &body).unwrap();
        let mut stalled = body.clone();
        stalled.extend([3_000_000, 5_000_000]);
        let h = estimate_hold(LockClass::NodeBusyLock, 10_000_000, exposure, &stalled).unwrap();
        assert_eq!(h.stalled_waits, 2, "{h:?}");
        assert_eq!(h.waits, clean.waits + 2, "the stalls are still waits");
        assert!(
            (h.tail.tail_ns as f64 / clean.tail.tail_ns as f64 - 1.0).abs() < 0.01,
            "{h:?} against {clean:?}"
        );
        assert!(
            (1_000..4_000).contains(&h.tail.tail_ns),
            "the body's long holds: {h:?}"
        );
        // Without the cut the third moment belongs to the stalls: the input would set a tail
        // of milliseconds, which the body cannot.
        let all: Vec<f64> = stalled.iter().map(|&x| x as f64).collect();
        let n = all.len() as f64;
        let m1 = n / exposure;
        let p = n / 10_000_000.0;
        let m2 = 2.0 * m1 * (1.0 - p) * all.iter().sum::<f64>() / n;
        let m3 = 3.0 * m1 * (1.0 - p) * all.iter().map(|x| x * x).sum::<f64>() / n;
        let (_, b, _) = two_points(m1, m2, m3).unwrap();
        assert!(b > 1e6, "uncut, the tail is the stalls: {b}");
    }

    #[test]
    fn two_points_recover_a_known_mixture() {
        // 98 % of holds 40 ns, 2 % 3000 ns.
        let (a, b, p) = (40.0f64, 3000.0f64, 0.02f64);
        let m = |k: i32| (1.0 - p) * a.powi(k) + p * b.powi(k);
        let (a2, b2, p2) = two_points(m(1), m(2), m(3)).unwrap();
        assert!((a2 - a).abs() < 1e-6 && (b2 - b).abs() < 1e-6 && (p2 - p).abs() < 1e-9);
        assert!(two_points(100.0, 10_000.0, 1e6).is_none(), "a fixed hold");
    }

    #[test]
    fn drain_latency_pairs_the_first_crossing_free_with_the_next_item() {
        let free = |ts, nr_lazy| free_on(ts, 0, nr_lazy);
        let mut s = Scan::default();
        for r in [
            free(1_000, 50),
            free(2_000, 101), // queues the first item
            free(2_500, 120), // pending: no new item
            work(9_000, 3_000),
            free(8_000, 130), // after the first item started: queues the second
            free(10_000, 40),
            work(20_000, 12_000),
        ] {
            s.record(&r);
        }
        assert_eq!(s.drain_latencies(), &[1_000, 4_000]);
        let d = DrainLatency::from_samples(s.drain_latencies()).unwrap();
        assert_eq!((d.count, d.max_ns), (2, 4_000));
        assert_eq!(d.sample(0.0), 1_000);
        assert_eq!(d.sample(0.5), 2_500);
        assert_eq!(d.sample(0.999_999), 4_000);
    }

    /// Frees every 100 µs on two CPUs, a drain item queued at 1 ms that starts at 6 ms and
    /// purges at 9.5 ms, with the silences in `gaps` (no allocation or free): the drain
    /// latency and the purge span the scan measures.
    fn latency_and_span_with_silences(gaps: &[(u64, u64)]) -> (Vec<u64>, Vec<u64>, StallsCut) {
        let us = 1_000;
        let mut recs: Vec<Record> = (0..110u64)
            .map(|i| i * 100 * us)
            .filter(|t| !gaps.iter().any(|&(a, b)| *t > a && *t < b))
            .map(|t| {
                let nr_lazy = match t {
                    t if t < 1_000 * us => 50,
                    t if t < 9_500 * us => 120,
                    _ => 10,
                };
                free_on(t, (t / (100 * us) % 2) as u32, nr_lazy)
            })
            .collect();
        recs.push(Record::Purge(crate::trace::Purge {
            ctx: ctx(9_500 * us, 0),
            start: KAddr(0x1000),
            end: KAddr(0x9000),
            npurged: 40,
        }));
        recs.push(work(10_000 * us, 6_000 * us));
        recs.sort_by_key(|r| match r {
            Record::Free(f) => f.ctx.ts_ns,
            Record::Purge(p) => p.ctx.ts_ns,
            Record::Work(w) => w.ctx.ts_ns,
            _ => unreachable!(),
        });
        let mut s = Scan::default();
        for r in &recs {
            s.record(r);
        }
        (s.drain_latencies, s.purge_spans, s.stalls_cut)
    }

    /// A silence of the whole machine inside a drain latency or a purge span is taken out of
    /// it; the same intervals with the workload running through them are kept whole, and so is
    /// a silence shorter than [`STALL_NS`].
    #[test]
    fn a_machine_stall_is_taken_out_of_the_workers_intervals() {
        let ms = 1_000_000;
        let (lat, span, cut) = latency_and_span_with_silences(&[]);
        assert_eq!((lat, span), (vec![5 * ms], vec![3 * ms + ms / 2]));
        assert_eq!(cut, StallsCut::default());

        // 3 ms silent inside the latency, 2.5 ms inside the purge span.
        let (lat, span, cut) =
            latency_and_span_with_silences(&[(2 * ms, 5 * ms), (6 * ms + ms / 2, 9 * ms)]);
        assert_eq!((lat, span), (vec![2 * ms], vec![ms]));
        assert_eq!(cut.stalls, 2);
        // The latency, the span, and the item's run (which holds the second stall too).
        assert_eq!(cut.intervals, 3);
        assert_eq!(cut.ns, 3 * ms + 2 * (2 * ms + ms / 2));

        // 0.9 ms without an event is a gap of the workload, not a stall.
        let (lat, _, cut) = latency_and_span_with_silences(&[(2 * ms, 2 * ms + 850_000)]);
        assert_eq!(lat, vec![5 * ms]);
        assert_eq!(cut.stalls, 0);
    }

    #[test]
    fn an_item_queued_while_the_previous_ran_is_its_follow_up() {
        let free = free_on;
        let ms = 1_000_000;
        let mut s = Scan::default();
        for r in [
            // Item 1 starts at 10 ms among frees of CPUs 0 and 1; CPU 1 frees above the
            // threshold while it runs: item 2 follows it.
            free(9 * ms, 0, 90),
            free(9 * ms + 500_000, 1, 101),
            free(10 * ms + 20_000, 1, 103),
            work(10 * ms + 100_000, 10 * ms),
            // Item 2 starts at 10.15 ms: nothing queues anything while it runs.
            free(10 * ms + 140_000, 1, 104),
            work(10 * ms + 200_000, 10 * ms + 150_000),
            free(10 * ms + 300_000, 1, 10),
            // Item 3, 40 ms later, among frees of CPU 1 alone (CPU 0's are older than the
            // window): queued well after item 2 ended, so item 2 was not followed up.
            free(48 * ms, 0, 50),
            free(50 * ms - 200_000, 1, 120),
            free(50 * ms - 100_000, 1, 121),
            work(50 * ms + 90_000, 50 * ms),
            // Item 4, queued after item 3 ended.
            free(50 * ms + 95_000, 1, 130),
            work(50 * ms + 200_000, 50 * ms + 100_000),
        ] {
            s.record(&r);
        }
        let c = s.follow_ups();
        assert_eq!(
            c,
            FollowUpCounts {
                concurrent_items: 1,
                concurrent_followed: 1,
                lone_items: 2,
                lone_followed: 0,
            }
        );
        assert_eq!(s.follow_up_delays, vec![150_000]);
        assert_eq!(s.follow_up_gaps, vec![50_000]);
        let cal = from_scan(s, BTreeMap::new());
        let fu = cal.follow_up.expect("a follow-up was measured");
        assert_eq!(fu.probability(true), 1.0);
        assert_eq!(fu.probability(false), 0.0);
        assert_eq!(fu.delay.sample(0.5), 150_000);
    }

    /// Forty drain items timed at their flush: each decays `i % 8` entries at `per_entry`
    /// ns each after 10 µs, then purges `100 + 10 i` objects at 80 ns each after 20 µs. With
    /// `interrupts`, four decays of four different counts run 50 µs longer.
    fn timed_decays(per_entry: u64, interrupts: bool) -> Calibration {
        let us = 1_000;
        let mut s = Scan::default();
        let mut decayed = BTreeMap::new();
        for i in 0..40u64 {
            let start = (i + 1) * 1_000 * us;
            for k in 0..10 {
                s.record(&free_on(start - 900 * us + k * 100 * us, 1, 10));
            }
            let interrupted = if interrupts && [3, 12, 21, 30].contains(&i) {
                50 * us
            } else {
                0
            };
            let flush = start + 10 * us + per_entry * (i % 8) + interrupted;
            let npurged = 100 + 10 * i;
            let purge = flush + 20 * us + 80 * npurged;
            s.record(&Record::Purge(crate::trace::Purge {
                ctx: ctx(purge, 0),
                start: KAddr(0x1000),
                end: KAddr(0x9000),
                npurged: npurged as u32,
            }));
            let Record::Work(mut w) = work(purge + us, start) else {
                unreachable!()
            };
            w.flush_ns = Some(flush);
            s.record(&Record::Work(w));
            decayed.insert(purge, (i % 8) as u32);
        }
        from_scan(s, decayed)
    }

    /// One trace's scan calibrated from the default costs, with no lock sections.
    fn from_scan(scan: Scan, decayed: BTreeMap<u64, u32>) -> Calibration {
        calibrate(
            &[TraceTiming {
                scan,
                sections: LockCounts::default(),
                decayed,
            }],
            Costs::default(),
            Machine::default(),
            "t".into(),
        )
        .unwrap()
    }

    #[test]
    fn the_decay_cost_per_entry_comes_from_the_items_start_to_their_flush() {
        for per_entry in [150, 400] {
            // Medians per count: the interrupted decays do not move the slope.
            let c = timed_decays(per_entry, true);
            let d = c.decay.expect("forty timed decays");
            assert_eq!(d.items, 40);
            assert_eq!(d.per_entry_ns, per_entry as f64, "{d:?}");
            assert_eq!(d.base_ns, 10_000.0, "{d:?}");
            // Reported, not used: the cost keeps its default.
            assert_eq!(
                c.costs.merge_per_area_ns,
                Costs::default().merge_per_area_ns
            );
        }
        // Four interrupted decays, of four counts, leave the medians' slope where it was.
        let mut points: Vec<(u32, u64)> = (0..40u64)
            .map(|i| ((i % 8) as u32, 10_000 + 150 * (i % 8)))
            .collect();
        for i in [3, 12, 21, 30] {
            points[i].1 += 50_000;
        }
        assert_eq!(decay_line(&points).map(|l| l.1.round()), Some(150.0));
        // Without the replay's decayed counts there is nothing to set the times against.
        assert_eq!(from_scan(Scan::default(), BTreeMap::new()).decay, None);
        let few: Vec<(u32, u64)> = points[..MIN_DECAY_ITEMS - 1].to_vec();
        assert_eq!(decay_line(&few), None);
    }

    #[test]
    fn a_calibration_file_round_trips_and_bad_ones_say_where() {
        let c = calibrate(
            &[TraceTiming {
                scan: Scan::default(),
                sections: LockCounts::new(2, true),
                decayed: BTreeMap::new(),
            }],
            Costs::default(),
            Machine::default(),
            "vmtrace test".into(),
        )
        .unwrap();
        assert!(c.provenance.iter().all(|p| p.source == "default"));
        assert_eq!(c.provenance.len(), Costs::NAMES.len());
        let text = serde_json::to_string_pretty(&c).unwrap();
        assert_eq!(Calibration::parse(&text).unwrap(), c);
        let err = Calibration::parse("{\n  \"format\": 3\n}").unwrap_err();
        assert!(err.to_string().starts_with("line 2"), "{err}");
        let other = text.replace(FORMAT, "something-else");
        assert!(matches!(
            Calibration::parse(&other),
            Err(CalibrationError::Format(_))
        ));
    }
}
