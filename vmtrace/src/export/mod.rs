//! `vmtrace serve`: the live probe pipeline as Prometheus metrics.
//!
//! [`Metrics`] is the registry: plain atomics that the event thread bumps per record, and that
//! a scrape renders ([`Metrics::render`]) without ever blocking that thread. [`serve`] is the
//! daemon (probes, HTTP, signals, capabilities); [`http`] its small HTTP/1.1 responder;
//! [`rotate`] its optional rotating trace files.

pub mod caps;
pub mod expo;
pub mod http;
pub mod rotate;
pub mod serve;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use expo::{header, sample, Exp2Histogram};

use crate::trace::{LockClass, ProbeInfo, PtLevel, Record};

/// Every metric family name the exporter can emit (histograms by base name): the dashboard test
/// checks every panel's expressions against this list.
pub const FAMILIES: &[&str] = &[
    "vmtrace_build_info",
    "vmtrace_probe_info",
    "vmtrace_allocations_total",
    "vmtrace_allocation_failures_total",
    "vmtrace_frees_total",
    "vmtrace_purges_total",
    "vmtrace_purged_areas_total",
    "vmtrace_page_table_pages_allocated_total",
    "vmtrace_events_lost_total",
    "vmtrace_lazy_pages",
    "vmtrace_lazy_threshold_pages",
    "vmtrace_vmalloc_used_bytes",
    "vmtrace_page_tables_bytes",
    "vmtrace_vmap_nodes",
    "vmtrace_allocation_size_bytes",
    "vmtrace_purge_work_duration_seconds",
    "vmtrace_lock_wait_seconds",
    "vmtrace_allocation_latency_seconds",
];

/// Page-table levels in the order their counters are kept.
const LEVELS: [(PtLevel, &str); 4] = [
    (PtLevel::Pte, "pte"),
    (PtLevel::Pmd, "pmd"),
    (PtLevel::Pud, "pud"),
    (PtLevel::P4d, "p4d"),
];

/// Which optional families apply: a histogram for a probe that is not attached would read as
/// "no purges" rather than "not measured", so it is left out instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    pub purge_work: bool,
    pub lock_waits: bool,
    pub alloc_latency: bool,
    pub page_tables: bool,
}

impl Features {
    /// Every optional family (unit tests and the dashboard check).
    pub const ALL: Features = Features {
        purge_work: true,
        lock_waits: true,
        alloc_latency: true,
        page_tables: true,
    };

    /// The families the attached probes can feed.
    pub fn from_probes(infos: &[ProbeInfo]) -> Self {
        let has = |name: &str| {
            infos
                .iter()
                .any(|i| i.logical.as_deref() == Some(name) && i.rung != "none")
        };
        Features {
            purge_work: has("purge_work"),
            lock_waits: has("lock_waits"),
            alloc_latency: has("alloc_latency"),
            page_tables: has("page_tables"),
        }
    }
}

/// The metrics registry. Updates are relaxed atomic adds and stores (one writer, the event
/// thread); the only lock, on the per-CPU lost counters, is taken once a second by that thread
/// for a copy and by a scrape for a read, never across I/O.
#[derive(Debug)]
pub struct Metrics {
    version: String,
    features: Features,
    probes: OnceLock<Vec<(String, String, String)>>,
    allocations: AtomicU64,
    failures: AtomicU64,
    frees: AtomicU64,
    purges: AtomicU64,
    purged_areas: AtomicU64,
    pt_pages: [AtomicU64; 4],
    lazy_pages: AtomicU64,
    lazy_threshold: AtomicU64,
    vmalloc_used_bytes: AtomicU64,
    page_tables_bytes: AtomicU64,
    meminfo_seen: AtomicBool,
    nodes: AtomicU64,
    alloc_size: Exp2Histogram,
    purge_duration: Exp2Histogram,
    lock_wait: Vec<Exp2Histogram>,
    alloc_latency: Exp2Histogram,
    lost_by_cpu: Mutex<Vec<u64>>,
}

/// Smallest allocation-size bucket: one page (vmalloc rounds every area up to pages, plus a
/// guard page); 22 buckets reach 8 GiB.
const SIZE_FIRST: u64 = 4096;
const SIZE_BUCKETS: u32 = 22;
/// Smallest duration bucket, in nanoseconds (256 ns); 24 buckets reach about 2.1 s.
const TIME_FIRST_NS: u64 = 256;
const TIME_BUCKETS: u32 = 24;

impl Metrics {
    pub fn new(features: Features) -> Self {
        let time = || Exp2Histogram::new(TIME_FIRST_NS, TIME_BUCKETS);
        Metrics {
            version: env!("CARGO_PKG_VERSION").to_string(),
            features,
            probes: OnceLock::new(),
            allocations: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            purges: AtomicU64::new(0),
            purged_areas: AtomicU64::new(0),
            pt_pages: Default::default(),
            lazy_pages: AtomicU64::new(0),
            lazy_threshold: AtomicU64::new(0),
            vmalloc_used_bytes: AtomicU64::new(0),
            page_tables_bytes: AtomicU64::new(0),
            meminfo_seen: AtomicBool::new(false),
            nodes: AtomicU64::new(0),
            alloc_size: Exp2Histogram::new(SIZE_FIRST, SIZE_BUCKETS),
            purge_duration: time(),
            lock_wait: LockClass::ALL.iter().map(|_| time()).collect(),
            alloc_latency: time(),
            lost_by_cpu: Mutex::new(Vec::new()),
        }
    }

    /// Records which probe attached on which rung (once; later calls are ignored). Several
    /// programs of one probe on one rung give one series.
    pub fn set_probes(&self, infos: &[ProbeInfo]) {
        let set: BTreeSet<(String, String, String)> = infos
            .iter()
            .map(|i| {
                let logical = i.logical.clone().unwrap_or_else(|| "core".into());
                (logical, i.probe.clone(), i.rung.clone())
            })
            .collect();
        let _ = self.probes.set(set.into_iter().collect());
    }

    /// Sets the number of vmap nodes (constant for a boot).
    pub fn set_nodes(&self, n: u32) {
        self.nodes.store(u64::from(n), Ordering::Relaxed);
    }

    /// Sets the lazy threshold before any free has reported the kernel's own value.
    pub fn set_lazy_threshold(&self, pages: u64) {
        self.lazy_threshold.store(pages, Ordering::Relaxed);
    }

    /// Replaces the per-CPU lost counts (the probes' totals over every event kind).
    pub fn set_lost(&self, per_cpu: Vec<u64>) {
        if let Ok(mut l) = self.lost_by_cpu.lock() {
            *l = per_cpu;
        }
    }

    /// Counts one record from the probes.
    pub fn observe(&self, rec: &Record) {
        let add = |c: &AtomicU64, n: u64| {
            c.fetch_add(n, Ordering::Relaxed);
        };
        match rec {
            Record::Alloc(a) => {
                add(&self.allocations, 1);
                if a.failed != 0 {
                    add(&self.failures, 1);
                } else {
                    self.alloc_size.observe(a.size);
                }
            }
            Record::Free(f) => {
                add(&self.frees, 1);
                self.lazy_pages.store(f.nr_lazy, Ordering::Relaxed);
                if f.nr_lazy_max > 0 {
                    self.lazy_threshold.store(f.nr_lazy_max, Ordering::Relaxed);
                }
            }
            Record::Purge(p) => {
                add(&self.purges, 1);
                add(&self.purged_areas, u64::from(p.npurged));
                // A purge empties the lazy list it drained; the next free reports the rest.
            }
            Record::Contention(c) => {
                if let Some(i) = LockClass::ALL.iter().position(|k| *k == c.class) {
                    self.lock_wait[i].observe(c.wait_ns);
                }
            }
            // A pool decay is a step inside a purge, not a purge's run: it would be counted twice.
            Record::Work(w) if w.function == crate::probe::ladder::DECAY_FUNCTION => {}
            Record::Work(w) => self.purge_duration.observe(w.duration_ns),
            Record::Latency(l) => self.alloc_latency.observe(l.latency_ns),
            Record::PtPage(p) => {
                if let Some(i) = LEVELS.iter().position(|(l, _)| *l == p.level) {
                    add(&self.pt_pages[i], 1);
                }
            }
            Record::Meminfo(m) => {
                self.vmalloc_used_bytes
                    .store(m.vmalloc_used_kb.saturating_mul(1024), Ordering::Relaxed);
                self.page_tables_bytes
                    .store(m.page_tables_kb.saturating_mul(1024), Ordering::Relaxed);
                self.meminfo_seen.store(true, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Allocations counted so far (tests and the shutdown log line).
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }

    /// The whole exposition, rendered from the current values.
    pub fn render(&self) -> String {
        let mut o = String::with_capacity(16 * 1024);
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64;

        header(
            &mut o,
            "vmtrace_build_info",
            "gauge",
            "vmtrace build, always 1.",
        );
        sample(
            &mut o,
            "vmtrace_build_info",
            &[("version", &self.version)],
            1.0,
        );
        header(
            &mut o,
            "vmtrace_probe_info",
            "gauge",
            "Attached probe programs and the rung each attached on (fentry, kprobe, tracepoint), always 1.",
        );
        for (logical, probe, rung) in self.probes.get().into_iter().flatten() {
            sample(
                &mut o,
                "vmtrace_probe_info",
                &[("logical", logical), ("probe", probe), ("rung", rung)],
                1.0,
            );
        }

        let counters: [(&str, &str, &AtomicU64); 5] = [
            (
                "vmtrace_allocations_total",
                "alloc_vmap_area calls seen (successful and failed).",
                &self.allocations,
            ),
            (
                "vmtrace_allocation_failures_total",
                "alloc_vmap_area calls that failed.",
                &self.failures,
            ),
            (
                "vmtrace_frees_total",
                "vmap areas freed lazily (free_vmap_area_noflush).",
                &self.frees,
            ),
            (
                "vmtrace_purges_total",
                "Lazy purges (purge_vmap_area_lazy).",
                &self.purges,
            ),
            (
                "vmtrace_purged_areas_total",
                "vmap areas released by lazy purges.",
                &self.purged_areas,
            ),
        ];
        for (name, help, c) in counters {
            header(&mut o, name, "counter", help);
            sample(&mut o, name, &[], get(c));
        }
        if self.features.page_tables {
            let name = "vmtrace_page_table_pages_allocated_total";
            header(
                &mut o,
                name,
                "counter",
                "Kernel page-table pages allocated while mapping vmalloc space, by level.",
            );
            for (i, (_, level)) in LEVELS.iter().enumerate() {
                sample(&mut o, name, &[("level", level)], get(&self.pt_pages[i]));
            }
        }
        let name = "vmtrace_events_lost_total";
        header(
            &mut o,
            name,
            "counter",
            "Events the probes could not hand over (ring buffer full), by CPU.",
        );
        if let Ok(lost) = self.lost_by_cpu.lock() {
            for (cpu, n) in lost.iter().enumerate() {
                sample(&mut o, name, &[("cpu", &cpu.to_string())], *n as f64);
            }
        }

        let gauges: [(&str, &str, &AtomicU64); 3] = [
            (
                "vmtrace_lazy_pages",
                "Lazily freed pages awaiting a purge (nr_lazy at the last free).",
                &self.lazy_pages,
            ),
            (
                "vmtrace_lazy_threshold_pages",
                "Lazy pages that trigger a purge (lazy_max_pages).",
                &self.lazy_threshold,
            ),
            (
                "vmtrace_vmap_nodes",
                "vmap nodes (nr_vmap_nodes).",
                &self.nodes,
            ),
        ];
        for (name, help, g) in gauges {
            header(&mut o, name, "gauge", help);
            sample(&mut o, name, &[], get(g));
        }
        if self.meminfo_seen.load(Ordering::Relaxed) {
            let name = "vmtrace_vmalloc_used_bytes";
            header(&mut o, name, "gauge", "VmallocUsed from /proc/meminfo.");
            sample(&mut o, name, &[], get(&self.vmalloc_used_bytes));
            let name = "vmtrace_page_tables_bytes";
            header(&mut o, name, "gauge", "PageTables from /proc/meminfo.");
            sample(&mut o, name, &[], get(&self.page_tables_bytes));
        }

        let name = "vmtrace_allocation_size_bytes";
        header(
            &mut o,
            name,
            "histogram",
            "Size of successful vmap-area allocations.",
        );
        self.alloc_size.render(&mut o, name, &[], 1.0);
        if self.features.purge_work {
            let name = "vmtrace_purge_work_duration_seconds";
            header(&mut o, name, "histogram", "Duration of purge work items.");
            self.purge_duration.render(&mut o, name, &[], 1e9);
        }
        if self.features.lock_waits {
            let name = "vmtrace_lock_wait_seconds";
            header(
                &mut o,
                name,
                "histogram",
                "Contended lock waits on vmap paths, by lock class.",
            );
            for (k, h) in LockClass::ALL.iter().zip(&self.lock_wait) {
                h.render(&mut o, name, &[("class", k.name())], 1e9);
            }
        }
        if self.features.alloc_latency {
            let name = "vmtrace_allocation_latency_seconds";
            header(
                &mut o,
                name,
                "histogram",
                "Entry-to-exit latency of alloc_vmap_area.",
            );
            self.alloc_latency.render(&mut o, name, &[], 1e9);
        }
        o
    }
}

#[cfg(test)]
mod tests;
