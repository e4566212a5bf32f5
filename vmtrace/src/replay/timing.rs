//! Timing and contention model: what an operation costs, and how long it waits for locks.
//!
//! Pure arithmetic, no I/O, deterministic (kept out of `model` because it speaks the trace's
//! lock classes; the model depends on nothing else in the crate). `vmtrace synth` uses [`Costs`] to lay out per-CPU
//! operation streams in time; free-running replay feeds every critical section the model enters
//! to a [`Contention`] accumulator, which predicts queueing waits per lock instance from the
//! sections' arrival rate in the trace's timestamps. `docs/model.md` ("Contention model") gives
//! the formula and its limits.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::trace::LockClass;

/// Documented default costs, in nanoseconds. They are round figures of the order measured for
/// small vmalloc calls on a current x86_64 server, not fitted to any machine: predictions built
/// on them are comparisons between variants, not absolute forecasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Costs {
    /// `vmalloc` of N pages, uncontended: fixed part (vm_struct, `alloc_vmap_area`).
    pub alloc_base_ns: u64,
    /// Per mapped page (page allocation and PTE set-up).
    pub alloc_per_page_ns: u64,
    /// `vfree` of N pages, uncontended: fixed part (lookup, lazy free).
    pub free_base_ns: u64,
    /// Per mapped page (unmap, page freeing).
    pub free_per_page_ns: u64,
    /// Critical section of `free_vmap_area_lock` for one search-and-split or one merge.
    pub free_area_lock_ns: u64,
    /// Per area merged back while a purge holds `free_vmap_area_lock`.
    pub merge_per_area_ns: u64,
    /// `vn->busy.lock` (or the global `vmap_area_lock`): one insert or unlink.
    pub busy_lock_ns: u64,
    /// `vn->lazy.lock` (or `purge_vmap_area_lock`): one insert or a detach.
    pub lazy_lock_ns: u64,
    /// `vn->pool_lock`: one head take or push.
    pub pool_lock_ns: u64,
    /// `init_mm.page_table_lock`: one new page-table page.
    pub page_table_lock_ns: u64,
    /// `vmap_purge_lock` held by one purge: fixed part (TLB flush) ...
    pub purge_base_ns: u64,
    /// ... plus this per purged object.
    pub purge_per_object_ns: u64,
}

impl Default for Costs {
    fn default() -> Self {
        Self {
            alloc_base_ns: 1000,
            alloc_per_page_ns: 200,
            free_base_ns: 400,
            free_per_page_ns: 50,
            free_area_lock_ns: 250,
            merge_per_area_ns: 100,
            busy_lock_ns: 80,
            lazy_lock_ns: 60,
            pool_lock_ns: 40,
            page_table_lock_ns: 150,
            purge_base_ns: 2000,
            purge_per_object_ns: 100,
        }
    }
}

impl Costs {
    /// Uncontended time of one allocation mapping `pages` pages.
    pub fn alloc_ns(&self, pages: u64) -> u64 {
        self.alloc_base_ns + self.alloc_per_page_ns * pages
    }

    /// Uncontended time of one free of an area mapping `pages` pages.
    pub fn free_ns(&self, pages: u64) -> u64 {
        self.free_base_ns + self.free_per_page_ns * pages
    }

    /// Section cost of one ordinary (non-purge) section of a lock class.
    pub fn section_ns(&self, class: LockClass) -> u64 {
        match class {
            LockClass::FreeAreaLock => self.free_area_lock_ns,
            LockClass::NodeBusyLock => self.busy_lock_ns,
            LockClass::NodeLazyLock => self.lazy_lock_ns,
            LockClass::NodePoolLock => self.pool_lock_ns,
            LockClass::PageTableLock => self.page_table_lock_ns,
            LockClass::PurgeMutex => self.purge_base_ns,
            LockClass::Other => 0,
        }
    }
}

/// Predicted waits of one lock class.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassWait {
    pub class: LockClass,
    /// Lock instances of this class that saw at least one section.
    pub instances: u32,
    pub sections: u64,
    /// Sum of section costs: time the locks of this class were held.
    pub held_ns: u64,
    /// Predicted queueing wait, all sections together.
    pub wait_ns: u64,
    /// Highest utilisation of one instance in one window (can exceed 1: more demand than the
    /// lock can serve, the wait is then the bounded-queue cap).
    pub max_utilisation: f64,
    /// Distribution of the predicted wait of one section, in exp2 buckets (empty until the
    /// timing model produces per-section waits). Charts and `--json` consumers read it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub wait_histogram: Vec<HistBucket>,
}

/// One exp2 bucket of a wait distribution: `count` sections waited at most `le_ns` (and more
/// than the previous bucket's bound). Prometheus-style upper bounds, so the exporter's and the
/// model's distributions read the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HistBucket {
    pub le_ns: u64,
    pub count: u64,
}

/// Accumulator of critical sections per lock instance, in time windows.
#[derive(Clone, Debug)]
pub struct Contention {
    window_ns: u64,
    /// CPUs that can queue on one lock: a spinning waiter has at most `cpus - 1` sections ahead
    /// of it (qspinlock is FIFO), which bounds the wait when the utilisation reaches 1.
    cpus: u32,
    instances: BTreeMap<(LockClass, u32), Window>,
    classes: BTreeMap<LockClass, ClassWait>,
}

/// Sections of one lock instance in the current window.
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    index: u64,
    n: u64,
    sum: f64,
    sum_sq: f64,
}

impl ClassWait {
    fn new(class: LockClass) -> Self {
        Self {
            class,
            instances: 0,
            sections: 0,
            held_ns: 0,
            wait_ns: 0,
            max_utilisation: 0.0,
            wait_histogram: Vec::new(),
        }
    }
}

impl Contention {
    /// Default window: 1 ms, long against a section (tens of ns to µs), short against the
    /// phases of a workload (a purge, a burst of frees).
    pub const DEFAULT_WINDOW_NS: u64 = 1_000_000;

    pub fn new(window_ns: u64, cpus: u32) -> Self {
        Self {
            window_ns: window_ns.max(1),
            cpus: cpus.max(1),
            instances: BTreeMap::new(),
            classes: BTreeMap::new(),
        }
    }

    /// Changes the CPU count that bounds a queue (free-running replay learns it as it goes).
    pub fn set_cpus(&mut self, cpus: u32) {
        self.cpus = cpus.max(1);
    }

    /// One critical section of `cost_ns` on lock `instance` of `class`, entered at `ts_ns`.
    pub fn section(&mut self, class: LockClass, instance: u32, ts_ns: u64, cost_ns: u64) {
        let index = ts_ns / self.window_ns;
        let w = self.instances.entry((class, instance)).or_default();
        if w.n > 0 && w.index != index {
            let done = std::mem::take(w);
            Self::flush(&mut self.classes, self.window_ns, self.cpus, class, &done);
        }
        let w = self.instances.entry((class, instance)).or_default();
        w.index = index;
        w.n += 1;
        let c = cost_ns as f64;
        w.sum += c;
        w.sum_sq += c * c;
        let cw = self
            .classes
            .entry(class)
            .or_insert_with(|| ClassWait::new(class));
        cw.sections += 1;
        cw.held_ns += cost_ns;
    }

    /// Pollaczek–Khinchine (M/G/1) mean queueing wait for the window, bounded by the FIFO cap.
    fn flush(
        classes: &mut BTreeMap<LockClass, ClassWait>,
        window_ns: u64,
        cpus: u32,
        class: LockClass,
        w: &Window,
    ) {
        if w.n == 0 {
            return;
        }
        let span = window_ns as f64;
        let rho = w.sum / span;
        let mean = w.sum / w.n as f64;
        // The drain work is one work item and free-running replay runs purges one after the
        // other, so nothing queues on `vmap_purge_lock` there; every other lock can have a
        // waiter on each other CPU.
        let waiters = if class == LockClass::PurgeMutex {
            0
        } else {
            cpus - 1
        };
        let cap = f64::from(waiters) * mean;
        let wq = if rho < 1.0 {
            ((w.sum_sq / span) / (2.0 * (1.0 - rho))).min(cap)
        } else {
            cap
        };
        let cw = classes
            .entry(class)
            .or_insert_with(|| ClassWait::new(class));
        cw.wait_ns += (wq * w.n as f64).round() as u64;
        if rho > cw.max_utilisation {
            cw.max_utilisation = rho;
        }
    }

    /// Closes every open window and returns the per-class figures, in [`LockClass::ALL`] order.
    pub fn finish(mut self) -> Vec<ClassWait> {
        let open: Vec<((LockClass, u32), Window)> =
            std::mem::take(&mut self.instances).into_iter().collect();
        let mut counted: BTreeMap<LockClass, u32> = BTreeMap::new();
        for ((class, _), w) in &open {
            *counted.entry(*class).or_default() += 1;
            Self::flush(&mut self.classes, self.window_ns, self.cpus, *class, w);
        }
        let mut out: Vec<ClassWait> = self.classes.into_values().collect();
        for cw in &mut out {
            cw.instances = counted.get(&cw.class).copied().unwrap_or(0);
        }
        out.sort_by_key(|c| LockClass::ALL.iter().position(|&k| k == c.class));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn light_load_waits_little_and_saturation_hits_the_cap() {
        // 10 sections of 100 ns in 1 ms: rho = 0.001, wait ~ 0.005 ns each.
        let mut c = Contention::new(1_000_000, 4);
        for i in 0..10 {
            c.section(LockClass::FreeAreaLock, 0, i * 1000, 100);
        }
        let light = c.finish();
        assert!(light[0].wait_ns < 10, "{light:?}");
        // 20,000 sections of 100 ns in 1 ms: rho = 2, every section waits the cap (3 x 100 ns).
        let mut c = Contention::new(1_000_000, 4);
        for i in 0..20_000 {
            c.section(LockClass::FreeAreaLock, 0, i * 50, 100);
        }
        let heavy = c.finish();
        assert_eq!(heavy[0].wait_ns, 20_000 * 300);
        assert!(heavy[0].max_utilisation > 1.9);
    }

    #[test]
    fn instances_queue_separately() {
        // The same load spread over 8 instances waits far less than on one.
        let run = |instances: u32| {
            let mut c = Contention::new(1_000_000, 64);
            for i in 0..8_000u64 {
                c.section(
                    LockClass::NodeBusyLock,
                    (i % u64::from(instances)) as u32,
                    i * 100,
                    80,
                );
            }
            c.finish()[0].wait_ns
        };
        assert!(run(8) * 10 < run(1));
    }
}
