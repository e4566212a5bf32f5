//! Free-running replay: the trace's allocations and frees drive the model, but the model picks
//! every address and decides when to purge, from its own threshold and a purge-worker latency.
//! The trace's purge events are ignored. This is the what-if mode: the same workload under
//! another design (variant), node count or threshold.
//!
//! Every critical section the model enters is fed, at the event's timestamp, to the contention
//! model ([`super::timing::Contention`]), which predicts lock waits from the arrival rate per
//! lock instance. `docs/model.md` ("Free-running replay", "Contention model") describes both.

use std::collections::{BTreeSet, HashMap};
use std::io::BufRead;

use serde::Serialize;

use super::timing::{ClassWait, Contention, Costs};
use super::{ReplayError, ReplayOptions, Replayer};
use crate::model::{AllocRequest, LockCounts, Model, SlotCounts, Variant};
use crate::trace::{LockClass, Record};

/// Worker latencies of the purge (the drain work's queueing delay).
#[derive(Clone, Copy, Debug)]
pub struct FreeRunOptions {
    /// From the free that crosses the threshold to the purge, on the default system workqueue.
    pub purge_latency_ns: u64,
    /// The same on `system_highpri_wq`, as the `nodes-capped` proposal queues it.
    pub highpri_latency_ns: u64,
    /// Contention-model window.
    pub window_ns: u64,
    pub costs: Costs,
}

impl Default for FreeRunOptions {
    fn default() -> Self {
        Self {
            purge_latency_ns: 1_000_000,
            highpri_latency_ns: 50_000,
            window_ns: Contention::DEFAULT_WINDOW_NS,
            costs: Costs::default(),
        }
    }
}

/// One point of the footprint and backlog series (for charts).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Sample {
    pub ts_ns: u64,
    /// Bytes from VMALLOC_START to the highest end ever allocated.
    pub high_water_bytes: u64,
    pub lazy_pages: u64,
}

/// What one variant predicts for the trace's workload.
#[derive(Clone, Debug, Serialize)]
pub struct WhatIf {
    pub variant: Variant,
    pub nodes: u32,
    pub lazy_max_pages: u64,
    pub purge_latency_ns: u64,
    pub allocs: u64,
    pub frees: u64,
    /// Allocations the model could not place even after a full purge.
    pub alloc_failures: u64,
    /// Frees of addresses the model does not hold (allocated before the trace, not in the
    /// snapshot, or in another window).
    pub frees_unknown: u64,
    pub cpus: u32,
    /// First to last event.
    pub duration_ns: u64,
    /// VA footprint: bytes from VMALLOC_START to the highest end ever allocated.
    pub high_water_bytes: u64,
    pub slots: SlotCounts,
    /// Page-table pages allocated on demand (PTE + PMD, + PUD on 5-level).
    pub page_table_pages: u64,
    pub purges: u64,
    pub purged_objects: u64,
    pub drains_triggered: u64,
    /// Critical sections per lock instance.
    pub locks: LockCounts,
    /// Per lock class: sections, time held, predicted wait.
    pub lock_waits: Vec<ClassWait>,
    /// Uncontended time of every operation (the timing model's costs).
    pub work_ns: u64,
    pub wait_ns: u64,
    /// wait / (wait + work).
    pub lock_wait_share: f64,
    /// Allocations and frees per second once waits stretch the CPUs' streams.
    pub throughput_ops_per_s: f64,
    /// At most 500 points, evenly spaced in events.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<Sample>,
    pub purge_times_ns: Vec<u64>,
    /// Allocations per node of the CPU that made them (pool choice), for the per-node share.
    pub allocs_per_node: Vec<u64>,
}

/// Replays `input` free-running with `opts.variant`.
pub fn free_run<R: BufRead>(
    input: R,
    opts: &ReplayOptions,
    fr: &FreeRunOptions,
) -> Result<WhatIf, ReplayError> {
    let super::Opened {
        mut reader,
        header,
        snapshot,
        params,
    } = super::open(input, opts)?;
    let (vstart, vend) = (params.vmalloc_start, params.vmalloc_end);
    let lazy_max = params.lazy_max_pages;
    let layout = params.layout;
    // Seed exactly as observed-timing replay does.
    let mut seeder = Replayer::new(Model::new(params)?, opts);
    seeder.seed(&snapshot);
    let latency = if opts.variant == Variant::NodesCapped {
        fr.highpri_latency_ns
    } else {
        fr.purge_latency_ns
    };
    let cpus = header.system.online_cpus.max(1);
    let prev = seeder.model.locks().clone();
    let mut run = Run {
        prev,
        model: seeder.model,
        costs: fr.costs,
        contention: Contention::new(fr.window_ns, cpus),
        latency,
        map: HashMap::new(),
        purge_at: None,
        first_ts: None,
        last_ts: 0,
        cpus_seen: BTreeSet::new(),
        high: 0,
        work_ns: 0,
        allocs: 0,
        frees: 0,
        failures: 0,
        frees_unknown: 0,
        purges: 0,
        purged_objects: 0,
        samples: Vec::new(),
        purge_times: Vec::new(),
        per_node: vec![0; layout.nr_nodes() as usize],
        strict: opts.strict,
        line: 2,
    };
    while let Some(rec) = reader.next() {
        let rec = rec?;
        run.line = reader.line();
        match rec {
            Record::Alloc(a) => {
                run.due(a.ctx.ts_ns);
                if a.failed != 0 {
                    continue;
                }
                if a.vstart.0 < vstart || a.vend.0 > vend {
                    continue;
                }
                run.alloc(&a)?;
            }
            Record::Free(f) => {
                run.due(f.ctx.ts_ns);
                run.free(&f)?;
            }
            _ => {}
        }
    }
    if let Some(at) = run.purge_at {
        run.purge(at);
    }
    Ok(run.finish(opts, lazy_max))
}

struct Run {
    model: Model,
    costs: Costs,
    contention: Contention,
    /// Lock counts after the last operation, to find the sections the next one entered.
    prev: LockCounts,
    latency: u64,
    /// Observed address → the model's address for the same area.
    map: HashMap<u64, u64>,
    /// When the queued drain work runs.
    purge_at: Option<u64>,
    first_ts: Option<u64>,
    last_ts: u64,
    cpus_seen: BTreeSet<u32>,
    high: u64,
    work_ns: u64,
    allocs: u64,
    frees: u64,
    failures: u64,
    frees_unknown: u64,
    purges: u64,
    purged_objects: u64,
    samples: Vec<Sample>,
    purge_times: Vec<u64>,
    per_node: Vec<u64>,
    strict: bool,
    line: usize,
}

impl Run {
    fn tick(&mut self, ts: u64, cpu: u32) {
        self.first_ts.get_or_insert(ts);
        self.last_ts = self.last_ts.max(ts);
        if self.cpus_seen.insert(cpu) {
            self.contention.set_cpus(self.cpus_seen.len() as u32);
        }
    }

    /// Runs the queued drain if its time has come.
    fn due(&mut self, ts: u64) {
        if let Some(at) = self.purge_at {
            if at <= ts {
                self.purge(at);
            }
        }
    }

    /// Feeds the sections entered since the last call to the contention model, each at `ts` and
    /// with its class's cost; `free_area_extra` is added to the free-tree lock's sections (a
    /// purge merging areas back holds it longer).
    fn sections(&mut self, ts: u64, free_area_extra: u64, purge_ns: u64) {
        let before = &self.prev;
        let after = self.model.locks();
        let c = self.costs;
        let free_new = after.free_vmap_area_lock - before.free_vmap_area_lock;
        for _ in 0..free_new {
            let extra = free_area_extra / free_new.max(1);
            self.contention
                .section(LockClass::FreeAreaLock, 0, ts, c.free_area_lock_ns + extra);
        }
        for _ in 0..after.vmap_purge_lock - before.vmap_purge_lock {
            self.contention
                .section(LockClass::PurgeMutex, 0, ts, purge_ns);
        }
        for _ in 0..after.page_table_lock - before.page_table_lock {
            self.contention
                .section(LockClass::PageTableLock, 0, ts, c.page_table_lock_ns);
        }
        for (class, b, a) in [
            (LockClass::NodeBusyLock, &before.busy, &after.busy),
            (LockClass::NodeLazyLock, &before.lazy, &after.lazy),
            (LockClass::NodePoolLock, &before.pool, &after.pool),
        ] {
            for (i, (&x, &y)) in b.iter().zip(a.iter()).enumerate() {
                for _ in x..y {
                    self.contention
                        .section(class, i as u32, ts, c.section_ns(class));
                }
            }
        }
        self.prev.clone_from(self.model.locks());
    }

    fn alloc(&mut self, a: &crate::trace::Alloc) -> Result<(), ReplayError> {
        self.tick(a.ctx.ts_ns, a.ctx.cpu);
        let p = self.model.params().clone();
        let guard = !(a.align == a.size && a.size > p.page_size);
        let mut req = AllocRequest {
            size: a.size,
            align: a.align.max(1),
            vstart: a.vstart.0,
            vend: a.vend.0,
            cpu: a.ctx.cpu,
            retry: false,
            guard,
        };
        let mut got = match self.model.alloc(&req) {
            Ok(g) => g,
            Err(e) => return self.warn(format!("alloc: {e}")),
        };
        self.sections(a.ctx.ts_ns, 0, 0);
        if got.is_err() {
            // The failure path: a full purge at once, then one retry without the pools.
            self.purge_now(a.ctx.ts_ns, true);
            req.retry = true;
            got = match self.model.alloc(&req) {
                Ok(g) => g,
                Err(e) => return self.warn(format!("alloc: {e}")),
            };
            self.sections(a.ctx.ts_ns, 0, 0);
        }
        let pages = a.size / p.page_size - u64::from(guard);
        self.work_ns += self.costs.alloc_ns(pages);
        match got {
            Ok(g) => {
                self.allocs += 1;
                self.map.insert(a.addr.0, g.addr);
                self.high = self.high.max(g.addr + a.size - p.vmalloc_start);
                let node = p.layout.cpu_to_node(a.ctx.cpu) as usize;
                if let Some(n) = self.per_node.get_mut(node) {
                    *n += 1;
                }
                if self.allocs.is_multiple_of(64) {
                    self.sample(a.ctx.ts_ns);
                }
            }
            Err(_) => self.failures += 1,
        }
        Ok(())
    }

    fn free(&mut self, f: &crate::trace::Free) -> Result<(), ReplayError> {
        self.tick(f.ctx.ts_ns, f.ctx.cpu);
        let obs = f.va_start.0;
        let addr = self.map.remove(&obs).unwrap_or(obs);
        let Some(size) = self.model.busy().get(&addr).map(|b| b.size) else {
            self.frees_unknown += 1;
            if self.strict {
                return self.warn(format!("free of {obs:#x}, which the model does not hold"));
            }
            return Ok(());
        };
        let got = match self.model.free(addr) {
            Ok(g) => g,
            Err(e) => return self.warn(e.to_string()),
        };
        self.sections(f.ctx.ts_ns, 0, 0);
        self.frees += 1;
        self.work_ns += self.costs.free_ns(size / self.model.params().page_size - 1);
        if got.drain && self.purge_at.is_none() {
            self.purge_at = Some(f.ctx.ts_ns + self.latency);
        }
        Ok(())
    }

    fn warn(&self, message: String) -> Result<(), ReplayError> {
        if self.strict {
            return Err(ReplayError::Strict {
                line: self.line,
                message,
            });
        }
        Ok(())
    }

    /// The drain work: one purge in the node design; the pre-node design's drain loop repeats
    /// it while the backlog stays above the threshold (§9.3).
    fn purge(&mut self, at: u64) {
        self.purge_at = None;
        self.purge_now(at, false);
        if self.model.params().variant == Variant::Global {
            while self.model.lazy_pages() > self.model.params().lazy_max_pages {
                if self.purge_now(at, false) == 0 {
                    break;
                }
            }
        }
    }

    fn purge_now(&mut self, at: u64, full: bool) -> u32 {
        let got = self.model.purge(full);
        let merged = u64::from(got.to_free_tree);
        let purge_ns = self.costs.purge_base_ns
            + self.costs.purge_per_object_ns * u64::from(got.npurged + got.decayed);
        self.sections(at, merged * self.costs.merge_per_area_ns, purge_ns);
        self.purges += 1;
        self.purged_objects += u64::from(got.npurged);
        self.purge_times.push(at);
        self.sample(at);
        got.npurged
    }

    fn sample(&mut self, ts: u64) {
        self.samples.push(Sample {
            ts_ns: ts,
            high_water_bytes: self.high,
            lazy_pages: self.model.lazy_pages(),
        });
    }

    fn finish(self, opts: &ReplayOptions, lazy_max: u64) -> WhatIf {
        let p = self.model.params();
        let slots = self.model.slots().counts();
        let duration = self.last_ts - self.first_ts.unwrap_or(self.last_ts);
        let cpus = self.cpus_seen.len().max(1) as u32;
        let lock_waits = self.contention.finish();
        let wait_ns: u64 = lock_waits.iter().map(|c| c.wait_ns).sum();
        let share = if wait_ns + self.work_ns == 0 {
            0.0
        } else {
            wait_ns as f64 / (wait_ns + self.work_ns) as f64
        };
        let ops = self.allocs + self.frees;
        // Waits stretch the CPUs' streams: spread evenly, they add wait / cpus to the span.
        let stretched = duration as f64 + wait_ns as f64 / f64::from(cpus);
        let throughput = if stretched > 0.0 {
            ops as f64 * 1e9 / stretched
        } else {
            0.0
        };
        let step = (self.samples.len() / 500).max(1);
        WhatIf {
            variant: opts.variant,
            nodes: p.layout.nr_nodes(),
            lazy_max_pages: lazy_max,
            purge_latency_ns: self.latency,
            allocs: self.allocs,
            frees: self.frees,
            alloc_failures: self.failures,
            frees_unknown: self.frees_unknown,
            cpus,
            duration_ns: duration,
            high_water_bytes: self.high,
            slots,
            page_table_pages: slots.pages(p.five_level),
            purges: self.purges,
            purged_objects: self.purged_objects,
            drains_triggered: self.model.stats().drains_triggered,
            locks: self.model.locks().clone(),
            lock_waits,
            work_ns: self.work_ns,
            wait_ns,
            lock_wait_share: share,
            throughput_ops_per_s: throughput,
            series: self.samples.into_iter().step_by(step).collect(),
            purge_times_ns: self.purge_times,
            allocs_per_node: self.per_node,
        }
    }
}
