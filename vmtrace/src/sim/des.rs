//! Discrete-event simulation of the allocator's lock contention.
//!
//! Actors are the trace's CPUs, each running its operation stream in trace order, and one purge
//! worker (the drain work item). An operation is a sequence of [`Step`]s: critical sections on
//! lock instances, lock-free work, and a mutex held across several sections (a purge). Every lock
//! instance is a FIFO queue (qspinlock and the purge mutex both hand over in arrival order), so a
//! waiter's wait is exactly the time until the holders ahead of it are done. An event queue
//! ordered by (time, actor) advances simulated time; ties go to the lower actor index, so a run
//! is a pure function of its input.
//!
//! **Streams.** The gap between a CPU's consecutive operations in the trace, beyond the first
//! operation's uncontended service time, is think time: it stays fixed, so every wait delays the
//! rest of that CPU's stream (a closed loop per CPU). A simulated start is therefore never
//! earlier than the trace's timestamp, which is what lets the driver feed operations as it reads
//! the trace: everything before the last timestamp read, shifted by a CPU's accumulated delay,
//! is final. Memory holds the operations read but not yet started, which depends on how unequally
//! the CPUs are delayed, not on the trace's length; a cap ([`Des::with_max_pending`]) bounds it
//! even then, at the price of starting late arrivals at the current time (counted).
//!
//! No I/O, no clock, no randomness. `docs/model.md` ("Timing and contention model") gives the
//! assumptions and limits.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rustc_hash::FxHashMap;

use serde::Serialize;

use super::timing::{exp2_bucket, exp2_histogram, ClassWait};
use crate::trace::LockClass;

/// A lock instance interned by [`Des::lock`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockRef(u32);

/// One step of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Take the lock (behind its holder and earlier waiters), hold it `ns`, release it.
    Section {
        lock: LockRef,
        ns: u64,
    },
    /// `times` sections of `ns` each on one lock, one after another, each taken anew behind
    /// the waiters queued meanwhile: the same as that many [`Step::Section`]s, in one step. A
    /// purge takes a pool lock once per area it pools and twice per pool it decays, thousands
    /// of sections at 128 nodes, and the purges held pending were most of a long what-if
    /// run's memory as one step each.
    ///
    /// `gap_ns` of work come before each section: a purge pools its areas one by one, each
    /// after unlinking it from the purge list (`purge_vmap_node`), so its pool sections are as
    /// far apart as its work on each area, not back to back.
    Sections {
        lock: LockRef,
        ns: u32,
        times: u32,
        gap_ns: u32,
    },
    /// Take the lock and keep it across the following steps until [`Step::Release`]: the purge
    /// mutex, held through a whole purge.
    Acquire(LockRef),
    Release(LockRef),
    /// CPU time outside any allocator lock.
    Work(u64),
    /// End of `alloc_vmap_area` within an allocation: the time since the operation's start is
    /// the predicted latency that the trace's `latency` events measure.
    Mark,
    /// Queue the operation's next `n` [`Op::helpers`], each on a helper worker that starts it
    /// after the worker latency (`schedule_work_on` of a purge helper).
    Fork(u32),
    /// Wait until every helper forked so far has finished (`flush_work`).
    Join,
}

/// What an operation is, for the per-operation wait figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Alloc,
    Free,
    /// A purge run by the drain worker (a failure-path purge is part of its allocation).
    Purge,
}

/// One operation: its steps, whether it queues the drain work when it ends, and the helper
/// operations its [`Step::Fork`]s hand out, in order.
#[derive(Clone, Debug)]
pub struct Op {
    pub kind: OpKind,
    pub steps: Vec<Step>,
    pub triggers_drain: bool,
    /// How long after this operation's end the drain work it queues starts; `None`: the
    /// simulator's worker latency. Free-running replay samples it per purge from a measured
    /// distribution.
    pub drain_latency_ns: Option<u64>,
    pub helpers: Vec<Op>,
}

impl Op {
    /// An operation of these steps that queues no drain and forks nothing.
    pub fn new(kind: OpKind, steps: Vec<Step>) -> Self {
        Self {
            kind,
            steps,
            triggers_drain: false,
            drain_latency_ns: None,
            helpers: Vec::new(),
        }
    }

    /// Uncontended duration: every section's hold and every piece of work.
    pub fn service_ns(&self) -> u64 {
        service_of(&self.steps)
    }
}

/// The most an operation is placed before its timestamp ([`Des::push_traced_op`]): later
/// operations can then start up to this much before the last timestamp read, so the
/// simulation holds back that much more.
pub const MAX_TRACED_NS: u64 = 20_000;

/// Uncontended duration of `steps`: every section's hold and every piece of work.
pub fn service_of(steps: &[Step]) -> u64 {
    steps
        .iter()
        .map(|s| match *s {
            Step::Section { ns, .. } | Step::Work(ns) => ns,
            Step::Sections {
                ns, times, gap_ns, ..
            } => (u64::from(ns) + u64::from(gap_ns)) * u64::from(times),
            _ => 0,
        })
        .sum()
}

/// Waits of one lock class by the kind of operation that waited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OpWaits {
    pub alloc_ns: u64,
    pub free_ns: u64,
    pub purge_ns: u64,
}

/// One window of the wait and throughput series.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct WaitSample {
    /// Start of the window, simulated time.
    pub ts_ns: u64,
    pub window_ns: u64,
    /// Allocations and frees that ended in the window.
    pub ops: u64,
    /// Lock waits granted in the window, every actor.
    pub wait_ns: u64,
    /// Uncontended time of the operations that ended in the window.
    pub work_ns: u64,
    /// wait / (wait + work) in the window; 0 when both are 0.
    pub wait_share: f64,
    pub throughput_ops_per_s: f64,
}

/// What a simulation measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DesResult {
    /// Per lock class that saw a section, in [`LockClass::ALL`] order.
    pub classes: Vec<ClassWait>,
    /// First start to last end of the CPUs' operations, simulated (the drain worker may run
    /// on after the last of them).
    pub makespan_ns: u64,
    pub first_start_ns: u64,
    pub last_end_ns: u64,
    /// Allocations and frees completed (the CPUs' operations).
    pub ops: u64,
    pub purge_jobs: u64,
    /// Uncontended time of every operation, worker included.
    pub work_ns: u64,
    /// Lock waits of every actor.
    pub wait_ns: u64,
    /// Predicted `alloc_vmap_area` latency: count and total (from [`Step::Mark`]).
    pub alloc_vmap_area_count: u64,
    pub alloc_vmap_area_ns: u64,
    /// At most [`SERIES_POINTS`] windows, of equal width, from the first start.
    pub series: Vec<WaitSample>,
    /// Most operations read and not yet started at one time (the memory the streams take).
    pub peak_pending_ops: u64,
    /// Operations started later than their stream asked, because the pending cap forced the
    /// simulation ahead or the trace's timestamps went backwards.
    pub late_starts: u64,
    /// Operations still queued or blocked when the input ended (a lock never released): 0
    /// unless the steps were inconsistent.
    pub unfinished_ops: u64,
}

/// Upper bound of the series' length.
pub const SERIES_POINTS: usize = 500;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ActorKind {
    Cpu,
    Worker,
    /// A purge helper's kworker: runs one forked operation at a time.
    Helper,
}

/// When a pending operation may start.
#[derive(Clone, Copy, Debug)]
enum StartRule {
    /// First operation of a stream: at its trace timestamp.
    At(u64),
    /// Think time after the previous operation's end.
    After(u64),
}

#[derive(Debug)]
struct Pending {
    op: Op,
    rule: StartRule,
}

#[derive(Debug)]
struct Running {
    op: Op,
    idx: usize,
    /// Sections of the current [`Step::Sections`] already entered.
    rep: u32,
    /// The work before the current [`Step::Sections`] repetition is done.
    gap_done: bool,
    start: u64,
    /// Lock to release when the current hold ends.
    release: Option<LockRef>,
    /// When the actor joined a lock's queue, while it waits.
    waiting_since: Option<u64>,
    /// Helpers forked and not finished; whether the actor waits for them at a Join.
    forked: u32,
    joining: bool,
    /// The actor that forked this operation (helpers).
    parent: Option<usize>,
}

#[derive(Debug)]
struct Actor {
    kind: ActorKind,
    pending: VecDeque<Pending>,
    running: Option<Running>,
    scheduled: bool,
    /// End of the last finished operation.
    ready_at: u64,
    /// Helper actors: the forking actor of each queued operation.
    parents: VecDeque<usize>,
    /// Trace timestamp and uncontended service of the last operation pushed: the next one's
    /// think time, and, once the stream is idle, the earliest start of an operation not yet
    /// read (`ready_at + (next_ts - last_ts - last_service)`, with `next_ts` at least the last
    /// timestamp read).
    last_ts: Option<u64>,
    last_service: u64,
}

impl Actor {
    fn new(kind: ActorKind) -> Self {
        Self {
            kind,
            pending: VecDeque::new(),
            parents: VecDeque::new(),
            running: None,
            scheduled: false,
            ready_at: 0,
            last_ts: None,
            last_service: 0,
        }
    }
}

#[derive(Debug)]
struct Lock {
    class: LockClass,
    holder: Option<usize>,
    held_since: u64,
    queue: VecDeque<usize>,
    used: bool,
    /// Utilisation window: index and time held in it.
    window: u64,
    held_in_window: u64,
}

/// Per-class accumulators.
#[derive(Clone, Debug)]
struct ClassAcc {
    sections: u64,
    held_ns: u64,
    wait_ns: u64,
    waits: u64,
    by_op: OpWaits,
    hist: [u64; 64],
    max_utilisation: f64,
}

impl Default for ClassAcc {
    fn default() -> Self {
        Self {
            sections: 0,
            held_ns: 0,
            wait_ns: 0,
            waits: 0,
            by_op: OpWaits::default(),
            hist: [0; 64],
            max_utilisation: 0.0,
        }
    }
}

/// Fixed-capacity series whose windows double in width when time outgrows them, so that its
/// memory stays constant however long the run.
#[derive(Clone, Debug)]
struct Series {
    origin: Option<u64>,
    width: u64,
    slots: Vec<(u64, u64, u64)>,
}

impl Series {
    fn new(width: u64) -> Self {
        Self {
            origin: None,
            width: width.max(1),
            slots: Vec::new(),
        }
    }

    fn slot(&mut self, t: u64) -> &mut (u64, u64, u64) {
        let origin = *self.origin.get_or_insert(t);
        let off = t.saturating_sub(origin);
        while off / self.width >= SERIES_POINTS as u64 {
            self.width *= 2;
            let old = std::mem::take(&mut self.slots);
            for (i, s) in old.into_iter().enumerate() {
                let j = i / 2;
                if self.slots.len() <= j {
                    self.slots.resize(j + 1, (0, 0, 0));
                }
                let d = &mut self.slots[j];
                d.0 += s.0;
                d.1 += s.1;
                d.2 += s.2;
            }
        }
        let i = (off / self.width) as usize;
        if self.slots.len() <= i {
            self.slots.resize(i + 1, (0, 0, 0));
        }
        &mut self.slots[i]
    }

    fn samples(&self) -> Vec<WaitSample> {
        let origin = self.origin.unwrap_or(0);
        self.slots
            .iter()
            .enumerate()
            .map(|(i, &(ops, wait, work))| WaitSample {
                ts_ns: origin.saturating_add(i as u64 * self.width),
                window_ns: self.width,
                ops,
                wait_ns: wait,
                work_ns: work,
                wait_share: share(wait, work),
                throughput_ops_per_s: ops as f64 * 1e9 / self.width as f64,
            })
            .collect()
    }
}

/// wait / (wait + work), 0 when both are 0.
pub fn share(wait: u64, work: u64) -> f64 {
    if wait + work == 0 {
        0.0
    } else {
        wait as f64 / (wait + work) as f64
    }
}

/// The simulator. Feed it with [`Des::push_op`] and [`Des::push_job`] in trace order, tell it
/// how far the trace has been read with [`Des::advance`], and call [`Des::finish`] at the end.
#[derive(Debug)]
pub struct Des {
    now: u64,
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    actors: Vec<Actor>,
    /// Trace CPU id → actor index.
    cpus: FxHashMap<u32, usize>,
    /// CPUs the trace may still introduce: until all of them appeared, an unseen CPU can start
    /// an operation at the last timestamp read.
    expected_cpus: u32,
    worker: usize,
    /// Start times of queued drain work, in order; each takes the next job.
    worker_starts: VecDeque<u64>,
    worker_latency: u64,
    locks: Vec<Lock>,
    lock_ids: FxHashMap<(LockClass, u32), LockRef>,
    classes: [ClassAcc; 7],
    window_ns: u64,
    /// Last trace timestamp read: no later operation has an earlier one.
    read_ts: u64,
    input_done: bool,
    pending_ops: u64,
    max_pending: u64,
    spare: Vec<Vec<Step>>,
    /// Helper actors without work.
    idle_helpers: Vec<usize>,
    res: DesResult,
    series: Series,
    first_start: Option<u64>,
    /// Added to every spinlock wait ([`Des::with_spin_handoff`]).
    spin_handoff_ns: u64,
}

/// Position of `c` in [`LockClass::ALL`] (`Other` for anything else).
pub fn class_index(c: LockClass) -> usize {
    LockClass::ALL.iter().position(|&k| k == c).unwrap_or(6)
}

impl Des {
    /// Default cap on operations read but not started (about 40 MiB of steps).
    pub const DEFAULT_MAX_PENDING: u64 = 1 << 18;

    /// A simulator whose drain work starts `worker_latency_ns` after the operation that queues
    /// it ends; `window_ns` is the utilisation window (and the series' narrowest window);
    /// `expected_cpus` is how many CPUs the trace can show (the header's possible CPUs).
    pub fn new(window_ns: u64, worker_latency_ns: u64, expected_cpus: u32) -> Self {
        let actors = vec![Actor::new(ActorKind::Worker)];
        Self {
            now: 0,
            heap: BinaryHeap::new(),
            actors,
            cpus: FxHashMap::default(),
            expected_cpus: expected_cpus.max(1),
            worker: 0,
            worker_starts: VecDeque::new(),
            worker_latency: worker_latency_ns,
            locks: Vec::new(),
            lock_ids: FxHashMap::default(),
            classes: Default::default(),
            window_ns: window_ns.max(1),
            read_ts: 0,
            input_done: false,
            pending_ops: 0,
            max_pending: Self::DEFAULT_MAX_PENDING,
            spare: Vec::new(),
            idle_helpers: Vec::new(),
            res: DesResult::default(),
            series: Series::new(window_ns.max(1) / 100),
            first_start: None,
            spin_handoff_ns: 0,
        }
    }

    /// A contended spinlock passes to its next waiter `ns` after the holder's release (the
    /// queued lock's handoff, as `Costs::spin_handoff_ns` measures it): the waiter waits that
    /// much longer, and no one else takes the lock meanwhile (its `held_ns` still counts the
    /// sections alone). An uncontended take pays nothing, and the purge mutex, which sleeps, is
    /// not a spinlock.
    pub fn with_spin_handoff(mut self, ns: u64) -> Self {
        self.spin_handoff_ns = ns;
        self
    }

    /// Caps the operations held before their start (memory); beyond it the simulation runs
    /// ahead of what the trace has proven final.
    pub fn with_max_pending(mut self, max: u64) -> Self {
        self.max_pending = max.max(1);
        self
    }

    /// The lock instance `instance` of `class`, created on first use.
    pub fn lock(&mut self, class: LockClass, instance: u32) -> LockRef {
        if let Some(&r) = self.lock_ids.get(&(class, instance)) {
            return r;
        }
        let r = LockRef(self.locks.len() as u32);
        self.locks.push(Lock {
            class,
            holder: None,
            held_since: 0,
            queue: VecDeque::new(),
            used: false,
            window: 0,
            held_in_window: 0,
        });
        self.lock_ids.insert((class, instance), r);
        r
    }

    /// An empty step list, recycled from finished operations.
    pub fn steps(&mut self) -> Vec<Step> {
        self.spare.pop().unwrap_or_default()
    }

    /// The next operation of CPU `cpu`'s stream, with its trace timestamp.
    pub fn push_op(&mut self, cpu: u32, ts: u64, op: Op) {
        self.push_traced_op(cpu, ts, 0, op);
    }

    /// [`Des::push_op`] for an operation whose trace event marks a point inside it: the
    /// kernel fires `alloc_vmap_area` after the pool and free-tree sections, before the busy
    /// insert, and `free_vmap_area_noflush` after the lazy insert, with the busy unlink and the
    /// unmap before it. The first `traced_ns` of its uncontended service (at most
    /// [`MAX_TRACED_NS`]) come before that point, so its stream places it that much before its
    /// timestamp; without this a free's busy section came a microsecond after an allocation's
    /// that the kernel ran beside it.
    pub fn push_traced_op(&mut self, cpu: u32, ts: u64, traced_ns: u64, op: Op) {
        let raw = ts;
        let ts = ts.saturating_sub(traced_ns.min(MAX_TRACED_NS));
        let a = match self.cpus.get(&cpu) {
            Some(&a) => a,
            None => {
                self.actors.push(Actor::new(ActorKind::Cpu));
                let a = self.actors.len() - 1;
                self.cpus.insert(cpu, a);
                a
            }
        };
        let service = op.service_ns();
        let actor = &mut self.actors[a];
        let rule = match actor.last_ts {
            None => StartRule::At(ts),
            Some(prev) => {
                StartRule::After(ts.saturating_sub(prev).saturating_sub(actor.last_service))
            }
        };
        actor.last_ts = Some(ts);
        actor.last_service = service;
        actor.pending.push_back(Pending { op, rule });
        self.pending_ops += 1;
        self.res.peak_pending_ops = self.res.peak_pending_ops.max(self.pending_ops);
        self.read_ts = self.read_ts.max(raw.saturating_sub(MAX_TRACED_NS));
        if self.actors[a].running.is_none() && !self.actors[a].scheduled {
            self.schedule_start(a);
        }
    }

    /// The next drain-work purge, in the order the model ran them; it starts when the
    /// operation that queued it has ended, plus the worker latency.
    pub fn push_job(&mut self, op: Op) {
        self.actors[self.worker].pending.push_back(Pending {
            op,
            rule: StartRule::After(0),
        });
        self.pending_ops += 1;
        self.res.peak_pending_ops = self.res.peak_pending_ops.max(self.pending_ops);
        let w = self.worker;
        if self.actors[w].running.is_none()
            && !self.actors[w].scheduled
            && !self.worker_starts.is_empty()
        {
            let t = self.worker_starts[0].max(self.now);
            self.schedule(w, t);
        }
    }

    /// The trace has been read up to `ts`: simulates everything that no later record can
    /// change.
    pub fn advance(&mut self, ts: u64) {
        self.read_ts = self.read_ts.max(ts.saturating_sub(MAX_TRACED_NS));
        self.run();
    }

    /// No more input: simulates to the end and returns the figures.
    pub fn finish(mut self) -> DesResult {
        self.input_done = true;
        self.run();
        self.collect()
    }

    fn schedule(&mut self, a: usize, t: u64) {
        debug_assert!(!self.actors[a].scheduled);
        self.actors[a].scheduled = true;
        self.heap.push(Reverse((t, a)));
    }

    /// Schedules the start of a CPU's next pending operation after its last one ended.
    fn schedule_start(&mut self, a: usize) {
        let actor = &self.actors[a];
        let Some(p) = actor.pending.front() else {
            return;
        };
        let want = match p.rule {
            StartRule::At(ts) => ts,
            StartRule::After(think) => actor.ready_at.saturating_add(think),
        };
        if want < self.now {
            self.res.late_starts += 1;
        }
        let t = want.max(self.now);
        self.schedule(a, t);
    }

    /// Earliest time at which a CPU without a known next operation could start one: an
    /// unseen CPU at the last timestamp read, a seen one at its end plus the part of the gap to
    /// the last timestamp read that exceeds its last operation's service.
    fn bound(&self) -> u64 {
        let mut b = u64::MAX;
        if (self.cpus.len() as u32) < self.expected_cpus {
            b = self.read_ts;
        }
        for actor in &self.actors {
            if actor.kind == ActorKind::Cpu && actor.running.is_none() && !actor.scheduled {
                b = b.min(self.idle_bound(actor));
            }
        }
        b
    }

    fn idle_bound(&self, actor: &Actor) -> u64 {
        let gap = self
            .read_ts
            .saturating_sub(actor.last_ts.unwrap_or(0))
            .saturating_sub(actor.last_service);
        actor.ready_at.saturating_add(gap)
    }

    fn run(&mut self) {
        let mut bound = if self.input_done {
            u64::MAX
        } else {
            self.bound()
        };
        while let Some(&Reverse((t, a))) = self.heap.peek() {
            let forced = self.pending_ops > self.max_pending;
            if !self.input_done && !forced {
                if t >= bound {
                    break;
                }
                // The drain work's start is known before the purge it runs: wait for the model.
                if a == self.worker
                    && self.actors[a].running.is_none()
                    && self.actors[a].pending.is_empty()
                {
                    break;
                }
            }
            self.heap.pop();
            self.actors[a].scheduled = false;
            self.now = t;
            self.resume(a, t);
            let actor = &self.actors[a];
            if !self.input_done
                && actor.kind == ActorKind::Cpu
                && actor.running.is_none()
                && !actor.scheduled
            {
                bound = bound.min(self.idle_bound(actor));
            }
        }
    }

    /// Runs actor `a` from time `t` until it blocks, works or finishes.
    fn resume(&mut self, a: usize, t: u64) {
        if self.actors[a].running.is_none() && !self.start_next(a, t) {
            return;
        }
        loop {
            let (release, step, start) = match self.actors[a].running.as_mut() {
                None => return,
                Some(run) => (
                    run.release.take(),
                    run.op.steps.get(run.idx).copied(),
                    run.start,
                ),
            };
            if let Some(l) = release {
                self.release(l, t);
                continue;
            }
            let Some(step) = step else {
                self.end_op(a, t);
                return;
            };
            match step {
                Step::Work(ns) => {
                    self.bump(a);
                    self.schedule(a, t.saturating_add(ns));
                    return;
                }
                Step::Mark => {
                    self.bump(a);
                    self.res.alloc_vmap_area_count += 1;
                    self.res.alloc_vmap_area_ns += t - start;
                }
                Step::Release(l) => {
                    self.bump(a);
                    self.release(l, t);
                }
                Step::Fork(n) => {
                    self.bump(a);
                    self.fork(a, n, t);
                }
                Step::Join => {
                    let Some(run) = self.actors[a].running.as_mut() else {
                        return;
                    };
                    if run.forked > 0 {
                        // Woken by the last helper's end, which moves past the Join.
                        run.joining = true;
                        return;
                    }
                    run.idx += 1;
                }
                Step::Sections { times: 0, .. } => self.bump(a),
                Step::Sections { gap_ns, .. }
                    if gap_ns > 0
                        && self.actors[a].running.as_ref().is_some_and(|r| !r.gap_done) =>
                {
                    if let Some(run) = self.actors[a].running.as_mut() {
                        run.gap_done = true;
                    }
                    self.schedule(a, t.saturating_add(u64::from(gap_ns)));
                    return;
                }
                Step::Section { lock, .. } | Step::Sections { lock, .. } | Step::Acquire(lock) => {
                    let li = lock.0 as usize;
                    debug_assert_ne!(self.locks[li].holder, Some(a), "lock taken twice");
                    if self.locks[li].holder.is_some() {
                        self.locks[li].queue.push_back(a);
                        if let Some(run) = self.actors[a].running.as_mut() {
                            run.waiting_since = Some(t);
                        }
                        return;
                    }
                    if self.grant(a, lock, t) {
                        return;
                    }
                }
            }
        }
    }

    fn bump(&mut self, a: usize) {
        if let Some(run) = self.actors[a].running.as_mut() {
            run.idx += 1;
        }
    }

    /// Starts the actor's next operation at `t`; false when it has none.
    fn start_next(&mut self, a: usize, t: u64) -> bool {
        if self.actors[a].kind == ActorKind::Worker {
            if self.worker_starts.is_empty() {
                return false;
            }
            if self.actors[a].pending.is_empty() {
                if self.input_done {
                    // The input ended with a drain queued and no purge: nothing to run.
                    self.worker_starts.clear();
                }
                // Otherwise `push_job` schedules the worker again when the purge arrives.
                return false;
            }
            self.worker_starts.pop_front();
        }
        let Some(p) = self.actors[a].pending.pop_front() else {
            return false;
        };
        // A queue keeps its largest capacity, and which CPUs lag furthest behind the input
        // changes over a run, so without this the queues' capacities together grew with the
        // events although their lengths together stay under the pending cap.
        let queue = &mut self.actors[a].pending;
        if queue.capacity() > 1024 && queue.len() < queue.capacity() / 4 {
            queue.shrink_to(queue.capacity() / 2);
        }
        let parent = self.actors[a].parents.pop_front();
        if self.actors[a].kind != ActorKind::Helper {
            self.pending_ops -= 1;
        }
        if self.actors[a].kind == ActorKind::Cpu {
            self.first_start = Some(self.first_start.map_or(t, |f| f.min(t)));
        }
        self.actors[a].running = Some(Running {
            op: p.op,
            idx: 0,
            rep: 0,
            gap_done: false,
            start: t,
            release: None,
            waiting_since: None,
            forked: 0,
            joining: false,
            parent,
        });
        true
    }

    /// Hands the next `n` helper operations of actor `a`'s operation to helper workers, which
    /// start them after the worker latency.
    fn fork(&mut self, a: usize, n: u32, t: u64) {
        for _ in 0..n {
            let Some(run) = self.actors[a].running.as_mut() else {
                return;
            };
            if run.op.helpers.is_empty() {
                return;
            }
            let op = run.op.helpers.remove(0);
            run.forked += 1;
            let h = match self.idle_helpers.pop() {
                Some(h) => h,
                None => {
                    self.actors.push(Actor::new(ActorKind::Helper));
                    self.actors.len() - 1
                }
            };
            let helper = &mut self.actors[h];
            helper.pending.push_back(Pending {
                op,
                rule: StartRule::After(0),
            });
            helper.parents.push_back(a);
            self.schedule(h, t.saturating_add(self.worker_latency));
        }
    }

    /// Gives lock `l` to actor `a` at `t`; true when the actor is now holding it for a timed
    /// section (and scheduled), false when it continues with its next step at once.
    fn grant(&mut self, a: usize, l: LockRef, t: u64) -> bool {
        let li = l.0 as usize;
        let lock = &mut self.locks[li];
        lock.holder = Some(a);
        lock.held_since = t;
        lock.used = true;
        let ci = class_index(lock.class);
        let Some(run) = self.actors[a].running.as_mut() else {
            return false;
        };
        let kind = run.op.kind;
        let waited = run.waiting_since.take().map(|since| t - since);
        let step = run.op.steps.get(run.idx).copied();
        run.gap_done = false;
        match step {
            Some(Step::Sections { times, .. }) if run.rep + 1 < times => run.rep += 1,
            _ => {
                run.idx += 1;
                run.rep = 0;
            }
        }
        if let Some(release) = match step {
            Some(Step::Section { ns, .. }) => {
                run.release = Some(l);
                Some(ns)
            }
            Some(Step::Sections { ns, .. }) => {
                run.release = Some(l);
                Some(u64::from(ns))
            }
            _ => None,
        } {
            self.schedule(a, t.saturating_add(release));
            self.account(ci, kind, waited, t);
            return true;
        }
        self.account(ci, kind, waited, t);
        false
    }

    /// One section of class `ci` entered at `t` after waiting `waited`.
    fn account(&mut self, ci: usize, kind: OpKind, waited: Option<u64>, t: u64) {
        let c = &mut self.classes[ci];
        c.sections += 1;
        let Some(wait) = waited.filter(|&w| w > 0) else {
            return;
        };
        c.wait_ns += wait;
        c.waits += 1;
        c.hist[exp2_bucket(wait)] += 1;
        match kind {
            OpKind::Alloc => c.by_op.alloc_ns += wait,
            OpKind::Free => c.by_op.free_ns += wait,
            OpKind::Purge => c.by_op.purge_ns += wait,
        }
        self.res.wait_ns += wait;
        self.series.slot(t).1 += wait;
    }

    fn release(&mut self, l: LockRef, t: u64) {
        let li = l.0 as usize;
        let window = self.window_ns;
        let lock = &mut self.locks[li];
        let ci = class_index(lock.class);
        let since = lock.held_since;
        lock.holder = None;
        self.classes[ci].held_ns += t - since;
        // Utilisation per window: split the hold over the windows it spans.
        let mut from = since;
        while from < t {
            let w = from / window;
            let end = (w + 1).saturating_mul(window).min(t);
            if w != lock.window {
                let u = lock.held_in_window as f64 / window as f64;
                let c = &mut self.classes[ci];
                c.max_utilisation = c.max_utilisation.max(u);
                lock.window = w;
                lock.held_in_window = 0;
            }
            lock.held_in_window += end - from;
            from = end;
        }
        if let Some(next) = lock.queue.pop_front() {
            let at = if lock.class == LockClass::PurgeMutex {
                t
            } else {
                t.saturating_add(self.spin_handoff_ns)
            };
            let timed = self.grant(next, l, at);
            if !timed {
                // An Acquire: the waiter goes on with its next step once it holds the lock.
                self.schedule(next, at);
            }
        }
    }

    fn end_op(&mut self, a: usize, t: u64) {
        let Some(run) = self.actors[a].running.take() else {
            return;
        };
        let service = run.op.service_ns();
        self.res.work_ns += service;
        let slot = self.series.slot(t);
        slot.2 += service;
        match run.op.kind {
            OpKind::Purge => {
                if self.actors[a].kind == ActorKind::Worker {
                    self.res.purge_jobs += 1;
                }
            }
            OpKind::Alloc | OpKind::Free => {
                slot.0 += 1;
                self.res.ops += 1;
                self.res.last_end_ns = self.res.last_end_ns.max(t);
            }
        }
        if run.op.triggers_drain {
            let latency = run.op.drain_latency_ns.unwrap_or(self.worker_latency);
            self.worker_starts.push_back(t.saturating_add(latency));
            let w = self.worker;
            // A purge that queues the next one is the worker itself: it is scheduled below.
            if w != a && self.actors[w].running.is_none() && !self.actors[w].scheduled {
                let at = self.worker_starts[0].max(t);
                self.schedule(w, at);
            }
        }
        if let Some(p) = run.parent {
            if let Some(pr) = self.actors[p].running.as_mut() {
                pr.forked -= 1;
                if pr.forked == 0 && pr.joining {
                    pr.joining = false;
                    pr.idx += 1;
                    self.schedule(p, t);
                }
            }
        }
        let mut steps = run.op.steps;
        steps.clear();
        // Only small lists come back: a purge's long one would sit in every pending operation
        // that reused it.
        if self.spare.len() < 1024 && steps.capacity() <= 16 {
            self.spare.push(steps);
        }
        let actor = &mut self.actors[a];
        actor.ready_at = t;
        match actor.kind {
            ActorKind::Worker => {
                if let Some(&next) = self.worker_starts.front() {
                    self.schedule(a, next.max(t));
                }
            }
            ActorKind::Helper => self.idle_helpers.push(a),
            ActorKind::Cpu => self.schedule_start(a),
        }
    }

    fn collect(mut self) -> DesResult {
        self.res.unfinished_ops = self
            .actors
            .iter()
            .map(|a| a.pending.len() as u64 + u64::from(a.running.is_some()))
            .sum();
        // Close the utilisation windows still open.
        for lock in &self.locks {
            if lock.used {
                let u = lock.held_in_window as f64 / self.window_ns as f64;
                let c = &mut self.classes[class_index(lock.class)];
                c.max_utilisation = c.max_utilisation.max(u);
            }
        }
        let mut instances = [0u32; 7];
        for lock in &self.locks {
            if lock.used {
                instances[class_index(lock.class)] += 1;
            }
        }
        let mut classes = Vec::new();
        for (i, &class) in LockClass::ALL.iter().enumerate() {
            let c = &self.classes[i];
            if c.sections == 0 {
                continue;
            }
            classes.push(ClassWait {
                class,
                instances: instances[i],
                sections: c.sections,
                held_ns: c.held_ns,
                wait_ns: c.wait_ns,
                max_utilisation: c.max_utilisation,
                wait_histogram: exp2_histogram(&c.hist),
                waits: c.waits,
                wait_by_op: c.by_op,
                wait_per_op_ns: if self.res.ops == 0 {
                    0.0
                } else {
                    c.wait_ns as f64 / self.res.ops as f64
                },
            });
        }
        let first = self.first_start.unwrap_or(0);
        let mut res = std::mem::take(&mut self.res);
        res.first_start_ns = first;
        res.makespan_ns = res.last_end_ns.saturating_sub(first);
        res.classes = classes;
        res.series = self.series.samples();
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::timing::HistBucket;

    fn op(kind: OpKind, steps: Vec<Step>) -> Op {
        Op {
            kind,
            steps,
            triggers_drain: false,
            drain_latency_ns: None,
            helpers: Vec::new(),
        }
    }

    fn class(r: &DesResult, c: LockClass) -> ClassWait {
        r.classes
            .iter()
            .find(|w| w.class == c)
            .cloned()
            .unwrap_or_else(|| panic!("no {c:?} in {r:?}"))
    }

    /// The handoff lengthens each contended wait by exactly its length, and no one takes the
    /// lock meanwhile; an uncontended take pays nothing, nor does a waiter for the purge mutex.
    #[test]
    fn the_spin_handoff_is_added_to_each_wait_only() {
        let run = |k: LockClass, handoff: u64, second_at: u64| {
            let mut des = Des::new(1_000_000, 0, 2).with_spin_handoff(handoff);
            let l = des.lock(k, 0);
            des.push_op(
                0,
                0,
                op(OpKind::Alloc, vec![Step::Section { lock: l, ns: 100 }]),
            );
            des.push_op(
                1,
                second_at,
                op(OpKind::Alloc, vec![Step::Section { lock: l, ns: 100 }]),
            );
            des.advance(second_at);
            let r = des.finish();
            (class(&r, k), r.makespan_ns)
        };
        let (c, makespan) = run(LockClass::NodeBusyLock, 30, 10);
        assert_eq!(
            (c.waits, c.wait_ns),
            (1, 90 + 30),
            "the rest of the hold, then the handoff"
        );
        assert_eq!(c.held_ns, 200, "held_ns counts the sections alone");
        assert_eq!(makespan, 230);
        let (c, makespan) = run(LockClass::NodeBusyLock, 30, 500);
        assert_eq!((c.waits, c.wait_ns, makespan), (0, 0, 600), "uncontended");
        let (c, _) = run(LockClass::PurgeMutex, 30, 10);
        assert_eq!(c.wait_ns, 90, "a mutex is no spinlock");
    }

    /// Two CPUs, no think time, every operation one 100 ns section of the same lock: the lock
    /// is never idle and FIFO hand-over makes every operation but the very first wait exactly
    /// one section (the other CPU's), so the waits are (2n - 1) x 100 ns and the makespan
    /// 2n x 100 ns.
    #[test]
    fn two_cpus_on_one_lock_wait_one_section_each() {
        let n = 50u64;
        let mut des = Des::new(1_000_000, 0, 2);
        let l = des.lock(LockClass::FreeAreaLock, 0);
        for i in 0..n {
            for cpu in 0..2 {
                des.push_op(
                    cpu,
                    i * 100,
                    op(OpKind::Alloc, vec![Step::Section { lock: l, ns: 100 }]),
                );
            }
            des.advance(i * 100);
        }
        let r = des.finish();
        let c = class(&r, LockClass::FreeAreaLock);
        assert_eq!(c.sections, 2 * n);
        assert_eq!(c.waits, 2 * n - 1);
        assert_eq!(c.wait_ns, (2 * n - 1) * 100);
        assert_eq!(c.held_ns, 2 * n * 100);
        assert_eq!(r.makespan_ns, 2 * n * 100);
        assert_eq!(r.ops, 2 * n);
        assert_eq!(r.work_ns, 2 * n * 100);
        assert_eq!(c.wait_by_op.alloc_ns, c.wait_ns);
        // Every wait was exactly 100 ns: one bucket, le 128.
        assert_eq!(
            c.wait_histogram,
            vec![HistBucket {
                le_ns: 128,
                count: 2 * n - 1
            }]
        );
        assert!((c.max_utilisation - 0.01).abs() < 1e-9, "{c:?}");
        assert_eq!((r.late_starts, r.unfinished_ops), (0, 0));
    }

    /// `Sections` is the same as as many `Section`s: between two of its sections a CPU queued
    /// meanwhile takes the lock, and every figure comes out as with the steps written out. Zero
    /// repetitions are no section.
    #[test]
    fn repeated_sections_queue_like_single_ones() {
        let run = |compact: bool| {
            let mut des = Des::new(1_000_000, 0, 3).with_spin_handoff(7);
            let l = des.lock(LockClass::NodePoolLock, 0);
            let fa = des.lock(LockClass::FreeAreaLock, 0);
            let mut purge = vec![Step::Work(10)];
            if compact {
                purge.push(Step::Sections {
                    lock: l,
                    ns: 40,
                    times: 5,
                    gap_ns: 0,
                });
                purge.push(Step::Sections {
                    lock: fa,
                    ns: 1,
                    times: 0,
                    gap_ns: 0,
                });
            } else {
                purge.extend((0..5).map(|_| Step::Section { lock: l, ns: 40 }));
            }
            purge.push(Step::Section { lock: fa, ns: 300 });
            des.push_op(0, 0, op(OpKind::Purge, purge));
            pool_pops(&mut des, l, &[(1, 15), (2, 60), (1, 130)]);
            des.finish()
        };
        let (compact, written) = (run(true), run(false));
        let pool = class(&written, LockClass::NodePoolLock);
        assert_eq!(pool.sections, 8);
        assert!(
            pool.waits >= 3,
            "the allocations queue between the purge's sections: {pool:?}"
        );
        assert_eq!(format!("{compact:?}"), format!("{written:?}"));
    }

    /// Allocations that pop the pool behind `lock`, `(cpu, at)` each, fed as a trace would.
    fn pool_pops(des: &mut Des, lock: LockRef, at: &[(u32, u64)]) {
        for &(cpu, at) in at {
            des.push_op(
                cpu,
                at,
                op(
                    OpKind::Alloc,
                    vec![Step::Section { lock, ns: 25 }, Step::Work(5)],
                ),
            );
            des.advance(at);
        }
    }

    /// Sections with work before each are the same as the work and the section written out,
    /// and the allocations that come while the purge works between two sections take the lock
    /// without waiting.
    #[test]
    fn sections_with_work_between_queue_like_written_out_ones() {
        let run = |compact: bool, gap: u32| {
            let mut des = Des::new(1_000_000, 0, 3).with_spin_handoff(7);
            let l = des.lock(LockClass::NodePoolLock, 0);
            let mut purge = vec![Step::Work(10)];
            if compact {
                purge.push(Step::Sections {
                    lock: l,
                    ns: 40,
                    times: 6,
                    gap_ns: gap,
                });
            } else {
                for _ in 0..6 {
                    purge.push(Step::Work(u64::from(gap)));
                    purge.push(Step::Section { lock: l, ns: 40 });
                }
            }
            des.push_op(0, 0, op(OpKind::Purge, purge));
            pool_pops(
                &mut des,
                l,
                &[(1, 15), (2, 60), (1, 130), (2, 200), (1, 290)],
            );
            des.finish()
        };
        for gap in [0, 30, 100] {
            assert_eq!(
                format!("{:?}", run(true, gap)),
                format!("{:?}", run(false, gap)),
                "gap {gap}"
            );
        }
        let waits = |gap| class(&run(true, gap), LockClass::NodePoolLock).waits;
        assert!(waits(100) < waits(0), "{} then {}", waits(0), waits(100));
    }

    /// A lock taken and never released leaves its waiters unfinished, and the result says so.
    #[test]
    fn a_lock_never_released_is_reported() {
        let mut des = Des::new(1_000_000, 0, 2);
        let m = des.lock(LockClass::PurgeMutex, 0);
        des.push_op(0, 0, op(OpKind::Alloc, vec![Step::Acquire(m)]));
        des.push_op(
            1,
            10,
            op(OpKind::Alloc, vec![Step::Acquire(m), Step::Release(m)]),
        );
        des.push_op(1, 20, op(OpKind::Alloc, vec![Step::Work(5)]));
        let r = des.finish();
        assert_eq!((r.ops, r.unfinished_ops), (1, 2));
    }

    /// An operation whose event marks the end of its section runs that section right before
    /// its timestamp: an allocation (section, then the tracepoint) and a free (work, section,
    /// then the tracepoint) stamped together met on the lock in the kernel, and meet here only
    /// when each is placed by its traced point.
    #[test]
    fn the_traced_point_lands_on_the_timestamp() {
        let run = |traced: bool| {
            let mut des = Des::new(1_000_000, 0, 2);
            let l = des.lock(LockClass::NodeBusyLock, 0);
            let alloc = vec![Step::Section { lock: l, ns: 100 }, Step::Work(50)];
            let free = vec![Step::Work(300), Step::Section { lock: l, ns: 100 }];
            let (ta, tf) = if traced { (100, 400) } else { (0, 0) };
            des.push_traced_op(0, 1_000, ta, op(OpKind::Alloc, alloc));
            des.push_traced_op(1, 1_000, tf, op(OpKind::Free, free));
            des.finish()
        };
        let placed = run(true);
        assert_eq!(class(&placed, LockClass::NodeBusyLock).waits, 1);
        assert_eq!(placed.first_start_ns, 600);
        let at_start = run(false);
        assert_eq!(class(&at_start, LockClass::NodeBusyLock).waits, 0);
        assert_eq!(at_start.first_start_ns, 1_000);
        // No operation is placed more than MAX_TRACED_NS early.
        let mut des = Des::new(1_000_000, 0, 1);
        des.push_traced_op(0, 100_000, 1_000_000, op(OpKind::Free, vec![Step::Work(1)]));
        assert_eq!(des.finish().first_start_ns, 100_000 - MAX_TRACED_NS);
    }

    /// Think time stays fixed: CPU 1 waits 100 ns once, its stream then runs 100 ns behind
    /// the trace and never meets CPU 0 again.
    #[test]
    fn think_time_is_kept_and_a_wait_shifts_the_rest_of_the_stream() {
        let mut des = Des::new(1_000_000, 0, 2);
        let l = des.lock(LockClass::NodeBusyLock, 0);
        for i in 0..10u64 {
            for cpu in 0..2 {
                des.push_op(
                    cpu,
                    i * 1000,
                    op(OpKind::Free, vec![Step::Section { lock: l, ns: 100 }]),
                );
            }
        }
        let r = des.finish();
        let c = class(&r, LockClass::NodeBusyLock);
        assert_eq!((c.waits, c.wait_ns), (1, 100));
        assert_eq!(c.wait_by_op.free_ns, 100);
        // CPU 1's last operation starts at 9000 + 100 and ends 100 ns later.
        assert_eq!(r.makespan_ns, 9200);
    }

    #[test]
    fn separate_instances_do_not_queue() {
        let mut des = Des::new(1_000_000, 0, 2);
        let locks = [
            des.lock(LockClass::NodePoolLock, 0),
            des.lock(LockClass::NodePoolLock, 1),
        ];
        for i in 0..100u64 {
            for cpu in 0..2u32 {
                let lock = locks[cpu as usize];
                des.push_op(
                    cpu,
                    i * 40,
                    op(OpKind::Alloc, vec![Step::Section { lock, ns: 40 }]),
                );
            }
        }
        let r = des.finish();
        let c = class(&r, LockClass::NodePoolLock);
        assert_eq!((c.instances, c.sections, c.wait_ns), (2, 200, 0));
        assert!(c.wait_histogram.is_empty());
        assert_eq!(r.makespan_ns, 4000);
    }

    /// The drain worker holds the purge mutex through its purge; an allocation's failure-path
    /// purge that needs the mutex meanwhile waits for the release, and the purge's own section
    /// on the free tree queues behind a CPU like any other.
    #[test]
    fn a_mutex_holder_blocks_until_its_release() {
        let mut des = Des::new(1_000_000, 50, 2);
        let m = des.lock(LockClass::PurgeMutex, 0);
        let fa = des.lock(LockClass::FreeAreaLock, 0);
        // CPU 0 frees at 0 for 10 ns and queues the drain: the worker starts at 10 + 50.
        des.push_op(
            0,
            0,
            Op {
                kind: OpKind::Free,
                steps: vec![Step::Work(10)],
                triggers_drain: true,
                drain_latency_ns: None,
                helpers: Vec::new(),
            },
        );
        // CPU 1 holds the free-tree lock from 100 to 400.
        des.push_op(
            1,
            100,
            op(OpKind::Alloc, vec![Step::Section { lock: fa, ns: 300 }]),
        );
        // CPU 0 at 500: a failure path that needs the mutex.
        des.push_op(
            0,
            500,
            op(
                OpKind::Alloc,
                vec![Step::Acquire(m), Step::Work(20), Step::Release(m)],
            ),
        );
        des.advance(500);
        // The purge: mutex from 60; 100 ns of work; the free-tree lock is busy until 400
        // (waits 240); holds it 200 ns, to 600; 400 ns more work; releases the mutex at 1000.
        des.push_job(op(
            OpKind::Purge,
            vec![
                Step::Acquire(m),
                Step::Work(100),
                Step::Section { lock: fa, ns: 200 },
                Step::Work(400),
                Step::Release(m),
            ],
        ));
        let r = des.finish();
        let fa_w = class(&r, LockClass::FreeAreaLock);
        assert_eq!((fa_w.wait_ns, fa_w.wait_by_op.purge_ns), (240, 240));
        let m_w = class(&r, LockClass::PurgeMutex);
        assert_eq!(m_w.sections, 2);
        // CPU 0 asked for the mutex at 500 and got it at 1000.
        assert_eq!((m_w.wait_ns, m_w.wait_by_op.alloc_ns), (500, 500));
        assert_eq!(m_w.held_ns, (1000 - 60) + 20);
        assert_eq!(r.purge_jobs, 1);
        // CPU 0's failure path ends at 1020: the last CPU operation.
        assert_eq!(r.last_end_ns, 1020);
    }

    /// A purge that forks two helpers holds the mutex until both ran: they start after the
    /// worker latency, queue on the free-tree lock like anyone, and the Join waits for the later.
    #[test]
    fn forked_helpers_are_joined_before_the_mutex_is_released() {
        let mut des = Des::new(1_000_000, 1000, 1);
        let m = des.lock(LockClass::PurgeMutex, 0);
        let fa = des.lock(LockClass::FreeAreaLock, 0);
        let pool = des.lock(LockClass::NodePoolLock, 1);
        let mut trigger = op(OpKind::Free, vec![Step::Work(10)]);
        trigger.triggers_drain = true;
        des.push_op(0, 0, trigger);
        let helper = |ns| {
            Op::new(
                OpKind::Purge,
                vec![
                    Step::Section { lock: pool, ns: 5 },
                    Step::Section { lock: fa, ns },
                ],
            )
        };
        // Drain starts at 1010; helpers at 2010; the inline part (100 ns) is done by 1110.
        des.push_job(Op {
            kind: OpKind::Purge,
            steps: vec![
                Step::Acquire(m),
                Step::Fork(2),
                Step::Work(100),
                Step::Join,
                Step::Release(m),
            ],
            triggers_drain: false,
            drain_latency_ns: None,
            helpers: vec![helper(300), helper(200)],
        });
        let r = des.finish();
        // Helper 1: pool 2010-2015, free tree 2015-2315. Helper 2: pool waits until 2015, free
        // tree waits from 2020 to 2315, holds it until 2515. Join at 2515.
        let m_w = class(&r, LockClass::PurgeMutex);
        assert_eq!(m_w.held_ns, 2515 - 1010);
        let fa_w = class(&r, LockClass::FreeAreaLock);
        assert_eq!((fa_w.sections, fa_w.wait_ns), (2, 2315 - 2020));
        let pool_w = class(&r, LockClass::NodePoolLock);
        assert_eq!((pool_w.sections, pool_w.wait_ns), (2, 5));
        assert_eq!(fa_w.wait_by_op.purge_ns, fa_w.wait_ns);
        assert_eq!(r.purge_jobs, 1);
        // The helpers' work counts: 10 + 100 + (5 + 300) + (5 + 200).
        assert_eq!(r.work_ns, 620);
    }

    /// A small pseudo-random workload: several CPUs, shared and per-node locks, think times.
    fn workload(des: &mut Des, feed_every: usize) {
        let mut locks: Vec<LockRef> = (0..4)
            .map(|i| des.lock(LockClass::NodeBusyLock, i))
            .collect();
        locks.push(des.lock(LockClass::FreeAreaLock, 0));
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut ts = 0;
        for i in 0..4000 {
            ts += rnd(60);
            let cpu = rnd(8) as u32;
            let mut steps = vec![Step::Work(rnd(200))];
            for _ in 0..1 + rnd(3) {
                let lock = locks[rnd(locks.len() as u64) as usize];
                steps.push(Step::Section {
                    lock,
                    ns: 10 + rnd(150),
                });
            }
            steps.push(Step::Mark);
            des.push_op(
                cpu,
                ts,
                Op {
                    kind: if i % 2 == 0 {
                        OpKind::Alloc
                    } else {
                        OpKind::Free
                    },
                    steps,
                    triggers_drain: i % 500 == 0,
                    drain_latency_ns: None,
                    helpers: Vec::new(),
                },
            );
            if i % 500 == 0 {
                des.push_job(op(
                    OpKind::Purge,
                    vec![
                        Step::Acquire(locks[0]),
                        Step::Section {
                            lock: locks[4],
                            ns: 500,
                        },
                        Step::Release(locks[0]),
                    ],
                ));
            }
            if i % feed_every == 0 {
                des.advance(ts);
            }
        }
    }

    /// Same input, same result; and the result does not depend on how often the driver lets
    /// the simulation advance, because nothing is simulated before it is final.
    #[test]
    fn deterministic_and_independent_of_feeding() {
        let run = |feed_every: usize| {
            let mut des = Des::new(10_000, 1000, 8);
            workload(&mut des, feed_every);
            let r = des.finish();
            assert_eq!(r.late_starts, 0);
            format!(
                "{:?}",
                (
                    r.classes,
                    r.makespan_ns,
                    r.wait_ns,
                    r.work_ns,
                    r.series,
                    r.alloc_vmap_area_ns
                )
            )
        };
        let a = run(1);
        assert_eq!(a, run(1));
        assert_eq!(a, run(7));
        assert_eq!(a, run(100_000));
        assert!(a.contains("wait_ns"));
    }

    /// A tiny pending cap bounds memory; the run still finishes every operation.
    #[test]
    fn pending_cap_bounds_memory() {
        let mut des = Des::new(10_000, 1000, 8).with_max_pending(4);
        workload(&mut des, 1);
        let r = des.finish();
        assert_eq!(r.ops, 4000);
        assert_eq!(r.purge_jobs, 8);
        // The cap, plus what one step of the driver pushes before it advances (an operation and
        // a purge).
        assert!(r.peak_pending_ops <= 6, "{}", r.peak_pending_ops);
    }

    #[test]
    fn series_stays_short_and_adds_up() {
        let mut des = Des::new(100, 0, 1);
        let l = des.lock(LockClass::PageTableLock, 0);
        for i in 0..100_000u64 {
            des.push_op(
                0,
                i * 10,
                op(OpKind::Alloc, vec![Step::Section { lock: l, ns: 10 }]),
            );
            des.advance(i * 10);
        }
        let r = des.finish();
        assert!(!r.series.is_empty() && r.series.len() <= SERIES_POINTS);
        assert_eq!(r.series.iter().map(|s| s.ops).sum::<u64>(), 100_000);
        assert_eq!(r.series.iter().map(|s| s.work_ns).sum::<u64>(), 1_000_000);
        let w = r.series[0].window_ns;
        assert!(r.series.iter().all(|s| s.window_ns == w));
        assert!(r.peak_pending_ops <= 2);
    }
}
