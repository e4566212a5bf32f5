//! The workload patterns, shaped like the tests of `lib/test_vmalloc.c` that user space can reach,
//! and the vmap area sizes each one produces.
//!
//! Sizes below assume value size = one page and the [`MapSizing::Exact`] case (root, or
//! CAP_PERFMON); with 4 KiB pages. A map of N data pages is one vmap area of (N + 2) pages: the
//! `struct bpf_array` header page, the N data pages and the guard page (see [`super::bpfmap`]).
//!
//! | pattern          | one loop does                                    | vmap areas (4 KiB pages)            |
//! |------------------|--------------------------------------------------|-------------------------------------|
//! | `fix-size`       | create + close one map of `--pages` N (16)       | (N+2)·4096: 73728 for 16            |
//! | `random-size`    | same, N uniform in 1..=`--pages` (100)           | (n+2)·4096 for n in 1..=N           |
//! | `long-busy-list` | keeps `--keep` 1-page maps; per loop a `--pages` (100) map and a 1-page map | 12288 kept; 417792 + 12288 churned |
//! | `full-fit`       | keeps `--pairs` 1-page maps with 3-page holes between them; per loop one 1-page map | 12288 |
//! | `thread-churn`   | starts `--batch` (16) threads that all live at once, then joins them | 20480 (16 KiB stack + guard) |
//!
//! From 512 data pages on, a map also has a second area for its page-pointer array (see
//! [`MapAreas`]).

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use serde::Serialize;

use super::bpfmap::{map_areas, ArrayMap, MapAreas, MapSizing, MAX_MAP_PAGES};
use super::error::WorkloadError;
use super::limits;
use super::rng::SplitMix64;

/// The workload shapes `vmtrace stress` can generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Create and close BPF array maps of --pages data pages (test_vmalloc fix_size_alloc_test).
    FixSize,
    /// Like fix-size with 1..=--pages data pages, uniform, seeded (random_size_alloc_test).
    RandomSize,
    /// Keep --keep 1-page maps alive, churn a --pages map and a 1-page map
    /// (long_busy_list_alloc_test).
    LongBusyList,
    /// Fill with --pairs pairs of 1-page maps, free every other one, churn 1-page maps into the
    /// holes (full_fit_alloc_test).
    FullFit,
    /// Start --batch threads that live at the same time, then join them: kernel stacks.
    ThreadChurn,
}

impl Pattern {
    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FixSize => "fix-size",
            Self::RandomSize => "random-size",
            Self::LongBusyList => "long-busy-list",
            Self::FullFit => "full-fit",
            Self::ThreadChurn => "thread-churn",
        }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Default `--pages` of fix-size.
pub const DEFAULT_FIX_SIZE_PAGES: u64 = 16;
/// Default `--pages` (upper bound) of random-size, as test_vmalloc's 1..=100.
pub const DEFAULT_RANDOM_SIZE_PAGES: u64 = 100;
/// Default `--pages` of long-busy-list's large churned map, as test_vmalloc's 100.
pub const DEFAULT_LONG_BUSY_LIST_PAGES: u64 = 100;
/// Default `--keep` of long-busy-list, as test_vmalloc's 15000.
pub const DEFAULT_KEEP: u64 = 15_000;
/// Default `--batch` of thread-churn: well above the kernel's 2 cached stacks per CPU.
pub const DEFAULT_BATCH: u64 = 16;
/// The smallest map: one data page (the vmalloc analogue of test_vmalloc's 1-page requests).
pub const MIN_MAP_PAGES: u64 = 1;
/// Kernel stack size (`THREAD_SIZE`) on x86_64 without KASAN.
pub const KERNEL_STACK_BYTES: u64 = 16 * 1024;
/// Stack size of the user-space threads thread-churn starts (they only wait and exit).
const CHURN_THREAD_STACK: usize = 64 * 1024;

/// The vmap area, in bytes, of one `fix-size --pages PAGES` map as root: header page + PAGES data
/// pages + guard page, `(pages + 2) * page_size`. This is the size of every alloc event
/// `vmtrace stress fix-size --pages PAGES` makes (plus, from 512 pages on, one page-array area
/// per map; see [`map_areas`]).
pub fn fix_size_area_bytes(pages: u64, page_size: u64) -> u64 {
    map_areas(pages, page_size, MapSizing::Exact).main
}

/// The vmap area of one kernel thread stack: `THREAD_SIZE` (16 KiB on x86_64) + guard page.
pub fn thread_stack_area_bytes(page_size: u64) -> u64 {
    KERNEL_STACK_BYTES + page_size
}

/// test_vmalloc's full-fit `junk` count, equal to `lazy_max_pages()`:
/// `fls(online_cpus) * (32 MiB / page_size)`.
pub fn full_fit_default_pairs(online_cpus: u64, page_size: u64) -> u64 {
    let fls = u64::from(u64::BITS - online_cpus.max(1).leading_zeros());
    fls * ((32 << 20) / page_size.max(1))
}

/// A count that came from the command line (`explicit`) or from a default. Defaults that exceed
/// the file-descriptor budget are lowered with a note; explicit ones are an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    pub n: u64,
    pub explicit: bool,
}

/// A pattern with its resolved parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    FixSize { pages: u64 },
    RandomSize { max_pages: u64 },
    LongBusyList { keep: Count, pages: u64 },
    FullFit { pairs: Count },
    ThreadChurn { batch: u64 },
}

impl Shape {
    /// The pattern this shape belongs to.
    pub fn pattern(&self) -> Pattern {
        match self {
            Self::FixSize { .. } => Pattern::FixSize,
            Self::RandomSize { .. } => Pattern::RandomSize,
            Self::LongBusyList { .. } => Pattern::LongBusyList,
            Self::FullFit { .. } => Pattern::FullFit,
            Self::ThreadChurn { .. } => Pattern::ThreadChurn,
        }
    }

    /// Ops (one allocation + its free) per loop iteration.
    pub fn ops_per_loop(&self) -> u64 {
        match *self {
            Self::FixSize { .. } | Self::RandomSize { .. } | Self::FullFit { .. } => 1,
            Self::LongBusyList { .. } => 2,
            Self::ThreadChurn { batch } => batch,
        }
    }

    /// Whether the pattern creates BPF maps (and so needs CAP_BPF).
    pub fn uses_bpf(&self) -> bool {
        !matches!(self, Self::ThreadChurn { .. })
    }

    /// What one op is, for the output.
    pub fn op_description(&self) -> String {
        match *self {
            Self::FixSize { pages } => {
                format!("create + close one BPF array map of {pages} data pages")
            }
            Self::RandomSize { max_pages } => {
                format!("create + close one BPF array map of 1..={max_pages} data pages")
            }
            Self::LongBusyList { pages, .. } => format!(
                "create + close one BPF array map (per loop: one of {pages} data pages and one of \
                 {MIN_MAP_PAGES}, while the kept maps stay alive)"
            ),
            Self::FullFit { .. } => format!(
                "create + close one BPF array map of {MIN_MAP_PAGES} data page, sized to fit a hole \
                 between kept maps"
            ),
            Self::ThreadChurn { batch } => format!(
                "start + join one thread (one kernel stack; {batch} threads alive at once per loop)"
            ),
        }
    }
}

/// The vmap area sizes, in bytes, sorted and without repeats, that a run of `shape` produces:
/// data pages + map header page + guard page for maps (plus their page-array areas from 512
/// pages), `THREAD_SIZE` + guard page for thread stacks.
pub fn area_bytes(shape: &Shape, page_size: u64, sizing: MapSizing) -> Vec<u64> {
    let areas = |pages: u64| map_areas(pages, page_size, sizing).iter();
    let mut v: Vec<u64> = match *shape {
        Shape::FixSize { pages } => areas(pages).collect(),
        Shape::RandomSize { max_pages } => (1..=max_pages).flat_map(areas).collect(),
        Shape::LongBusyList { pages, .. } => areas(pages).chain(areas(MIN_MAP_PAGES)).collect(),
        Shape::FullFit { .. } => areas(MIN_MAP_PAGES).collect(),
        Shape::ThreadChurn { .. } => vec![thread_stack_area_bytes(page_size)],
    };
    v.sort_unstable();
    v.dedup();
    v
}

/// Checks ranges that do not depend on the machine.
pub fn validate(shape: &Shape) -> Result<(), WorkloadError> {
    let check = |what: &str, v: u64, max: u64| {
        if (1..=max).contains(&v) {
            Ok(())
        } else {
            Err(WorkloadError::InvalidArgs(format!(
                "{what} {v} is out of range: expected 1..={max}"
            )))
        }
    };
    match *shape {
        Shape::FixSize { pages } => check("--pages", pages, MAX_MAP_PAGES),
        Shape::RandomSize { max_pages } => check("--pages", max_pages, MAX_MAP_PAGES),
        Shape::LongBusyList { keep, pages } => {
            check("--pages", pages, MAX_MAP_PAGES)?;
            check("--keep", keep.n, 1 << 20)
        }
        Shape::FullFit { pairs } => check("--pairs", pairs.n, 1 << 20),
        Shape::ThreadChurn { batch } => check("--batch", batch, 4096),
    }
}

/// Areas a pattern keeps alive for the whole run, set up before the timed part.
#[derive(Debug, Default)]
pub struct Prepared {
    live: Vec<ArrayMap>,
    /// Adjustments made (e.g. a default lowered to fit RLIMIT_NOFILE), for the user.
    pub notes: Vec<String>,
}

impl Prepared {
    /// Number of maps kept alive.
    pub fn live_areas(&self) -> u64 {
        self.live.len() as u64
    }
}

/// The areas one loop iteration allocated; dropping it frees them (closes the maps, or lets the
/// threads exit and joins them).
#[derive(Debug)]
pub struct Held {
    maps: Vec<ArrayMap>,
    threads: Option<ThreadBatch>,
}

impl Held {
    /// Ops this iteration counts for: maps created or threads started.
    pub fn ops(&self) -> u64 {
        self.maps.len() as u64 + self.threads.as_ref().map_or(0, |t| t.handles.len() as u64)
    }

    /// Data pages of the maps this iteration created, in creation order.
    pub fn map_pages(&self) -> impl Iterator<Item = u64> + '_ {
        self.maps.iter().map(ArrayMap::pages)
    }
}

/// A pattern ready to run on this machine.
#[derive(Debug, Clone)]
pub struct Workload {
    shape: Shape,
    page_size: u64,
    sizing: MapSizing,
}

impl Workload {
    /// Validates `shape`, reads the page size and map sizing, and, for map patterns, checks that
    /// `bpf(BPF_MAP_CREATE)` is allowed by creating (and closing) one small map.
    pub fn new(shape: Shape) -> Result<Self, WorkloadError> {
        validate(&shape)?;
        let page_size = super::bpfmap::page_size()?;
        let sizing = MapSizing::detect();
        if shape.uses_bpf() {
            drop(ArrayMap::create(MIN_MAP_PAGES, page_size)?);
        }
        Ok(Self {
            shape,
            page_size,
            sizing,
        })
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    pub fn sizing(&self) -> MapSizing {
        self.sizing
    }

    /// The vmap area sizes this workload produces on this machine (see [`area_bytes`]).
    pub fn area_bytes(&self) -> Vec<u64> {
        area_bytes(&self.shape, self.page_size, self.sizing)
    }

    /// The areas of one map of `pages` data pages on this machine.
    pub fn map_areas(&self, pages: u64) -> MapAreas {
        map_areas(pages, self.page_size, self.sizing)
    }

    fn map(&self, pages: u64) -> Result<ArrayMap, WorkloadError> {
        ArrayMap::create(pages, self.page_size)
    }

    /// Sets up what the pattern keeps alive, for `threads` workers: long-busy-list's kept maps,
    /// full-fit's pairs with every other one freed. Raises RLIMIT_NOFILE as needed; a default count
    /// that does not fit is lowered (with a note), an explicit one is an error.
    pub fn prepare(&self, threads: u32) -> Result<Prepared, WorkloadError> {
        let threads = u64::from(threads);
        // Descriptors the workers hold at once, per worker.
        let per_worker = match self.shape {
            Shape::ThreadChurn { .. } => 0,
            Shape::LongBusyList { .. } => 2,
            _ => 1,
        };
        let (what, wanted, per_unit) = match self.shape {
            Shape::LongBusyList { keep, .. } => ("--keep", keep, 1),
            Shape::FullFit { pairs } => ("--pairs", pairs, 2),
            _ => (
                "",
                Count {
                    n: 0,
                    explicit: false,
                },
                1,
            ),
        };
        let needed = wanted.n * per_unit + threads * per_worker;
        let budget = limits::ensure_fds(needed).map_err(|source| WorkloadError::System {
            what: "or set RLIMIT_NOFILE",
            source,
        })?;
        let available = budget.available();
        let mut prepared = Prepared::default();
        let mut count = wanted.n;
        if needed > available {
            let fd_error = || WorkloadError::FdLimit {
                what: if wanted.n == 0 {
                    format!("--threads {threads}")
                } else {
                    format!("{} {what} {}", self.shape.pattern(), wanted.n)
                },
                needed,
                available,
                soft: budget.soft,
                hard: budget.hard,
            };
            let room = available.saturating_sub(threads * per_worker) / per_unit;
            if wanted.explicit || wanted.n == 0 || room == 0 {
                return Err(fd_error());
            }
            prepared.notes.push(format!(
                "{}: the default {what} {} needs {needed} file descriptors but RLIMIT_NOFILE leaves \
                 {available} (soft {}, hard {}); using {what} {room}",
                self.shape.pattern(),
                wanted.n,
                budget.soft,
                budget.hard
            ));
            count = room;
        }
        match self.shape {
            Shape::LongBusyList { .. } => {
                prepared.live.reserve_exact(count as usize);
                for _ in 0..count {
                    prepared.live.push(self.map(MIN_MAP_PAGES)?);
                }
            }
            Shape::FullFit { .. } => {
                // Alternate kept and junk maps so that consecutive areas sit next to each other,
                // then free the junk: every kept area gets a hole of exactly one minimal area
                // next to it (once the lazily freed junk is purged).
                prepared.live.reserve_exact(count as usize);
                let mut junk = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    prepared.live.push(self.map(MIN_MAP_PAGES)?);
                    junk.push(self.map(MIN_MAP_PAGES)?);
                }
                drop(junk);
            }
            _ => {}
        }
        Ok(prepared)
    }

    /// One loop iteration: allocates its areas and returns them held. The caller frees them by
    /// dropping the result (the stress loop does so at once; tests hold them to look at
    /// `/proc/vmallocinfo`).
    pub fn run_loop(&self, rng: &mut SplitMix64) -> Result<Held, WorkloadError> {
        let mut maps = Vec::new();
        let mut threads = None;
        match self.shape {
            Shape::FixSize { pages } => maps.push(self.map(pages)?),
            Shape::RandomSize { max_pages } => maps.push(self.map(rng.in_range(1, max_pages))?),
            Shape::LongBusyList { pages, .. } => {
                maps.reserve_exact(2);
                maps.push(self.map(pages)?);
                maps.push(self.map(MIN_MAP_PAGES)?);
            }
            Shape::FullFit { .. } => maps.push(self.map(MIN_MAP_PAGES)?),
            Shape::ThreadChurn { batch } => threads = Some(ThreadBatch::spawn(batch)?),
        }
        Ok(Held { maps, threads })
    }
}

/// A one-shot gate: threads wait until it is opened.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    pub(crate) fn wait(&self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        while !*open {
            open = self.cv.wait(open).unwrap_or_else(PoisonError::into_inner);
        }
    }

    pub(crate) fn open(&self) {
        *self.open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.cv.notify_all();
    }
}

/// Threads that are all alive until the batch is dropped, so their kernel stacks are allocated at
/// the same time (the kernel caches only 2 freed stacks per CPU).
#[derive(Debug)]
struct ThreadBatch {
    gate: Arc<Gate>,
    handles: Vec<JoinHandle<()>>,
}

impl ThreadBatch {
    fn spawn(n: u64) -> Result<Self, WorkloadError> {
        let mut batch = Self {
            gate: Arc::new(Gate::default()),
            handles: Vec::new(),
        };
        batch.handles.reserve_exact(n as usize);
        for _ in 0..n {
            let gate = Arc::clone(&batch.gate);
            let handle = std::thread::Builder::new()
                .stack_size(CHURN_THREAD_STACK)
                .spawn(move || gate.wait())
                .map_err(WorkloadError::Spawn)?; // dropping `batch` releases the ones started
            batch.handles.push(handle);
        }
        Ok(batch)
    }
}

impl Drop for ThreadBatch {
    fn drop(&mut self) {
        self.gate.open();
        for h in self.handles.drain(..) {
            // The threads only wait on the gate; a join error (a panic) cannot happen.
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: u64 = 4096;
    const EXACT: MapSizing = MapSizing::Exact;

    #[test]
    fn fix_size_formula() {
        assert_eq!(fix_size_area_bytes(16, PS), 73728);
        assert_eq!(fix_size_area_bytes(1, PS), 3 * PS);
        assert_eq!(fix_size_area_bytes(256, PS), 1056768);
        assert_eq!(fix_size_area_bytes(16, 16384), 18 * 16384);
    }

    #[test]
    fn documented_areas_per_pattern() {
        let fix = Shape::FixSize { pages: 16 };
        assert_eq!(area_bytes(&fix, PS, EXACT), vec![73728]);
        let big = Shape::FixSize { pages: 1024 };
        assert_eq!(area_bytes(&big, PS, EXACT), vec![16384, 4202496]);
        let rnd = Shape::RandomSize { max_pages: 100 };
        let r = area_bytes(&rnd, PS, EXACT);
        assert_eq!(r.len(), 100);
        assert_eq!((r[0], r[99]), (3 * PS, 102 * PS));
        let keep = Count {
            n: 15000,
            explicit: false,
        };
        let lbl = Shape::LongBusyList { keep, pages: 100 };
        assert_eq!(area_bytes(&lbl, PS, EXACT), vec![12288, 417792]);
        let ff = Shape::FullFit { pairs: keep };
        assert_eq!(area_bytes(&ff, PS, EXACT), vec![12288]);
        let tc = Shape::ThreadChurn { batch: 16 };
        assert_eq!(area_bytes(&tc, PS, EXACT), vec![20480]);
        // Without CAP_PERFMON the 100-page map is a 128-page one.
        assert_eq!(
            area_bytes(&lbl, PS, MapSizing::PowerOfTwo),
            vec![12288, 130 * PS]
        );
    }

    #[test]
    fn ops_per_loop() {
        assert_eq!(Shape::FixSize { pages: 3 }.ops_per_loop(), 1);
        let keep = Count {
            n: 1,
            explicit: true,
        };
        assert_eq!(Shape::LongBusyList { keep, pages: 3 }.ops_per_loop(), 2);
        assert_eq!(Shape::ThreadChurn { batch: 7 }.ops_per_loop(), 7);
    }

    #[test]
    fn full_fit_pairs_follow_lazy_max_pages() {
        assert_eq!(full_fit_default_pairs(1, PS), 8192);
        assert_eq!(full_fit_default_pairs(2, PS), 16384);
        assert_eq!(full_fit_default_pairs(3, PS), 16384);
        assert_eq!(full_fit_default_pairs(4, PS), 24576);
        assert_eq!(full_fit_default_pairs(0, PS), 8192);
        assert_eq!(full_fit_default_pairs(2, 16384), 4096);
    }

    #[test]
    fn validation_quotes_the_bad_value() {
        let err = validate(&Shape::FixSize { pages: 0 })
            .unwrap_err()
            .to_string();
        assert!(err.contains("--pages 0") && err.contains("1..="), "{err}");
        let err = validate(&Shape::ThreadChurn { batch: 5000 })
            .unwrap_err()
            .to_string();
        assert!(err.contains("--batch 5000"), "{err}");
        assert!(validate(&Shape::FixSize {
            pages: MAX_MAP_PAGES
        })
        .is_ok());
        assert!(validate(&Shape::FixSize {
            pages: MAX_MAP_PAGES + 1
        })
        .is_err());
    }

    #[test]
    fn thread_batch_counts_and_joins() {
        let w = Workload {
            shape: Shape::ThreadChurn { batch: 5 },
            page_size: PS,
            sizing: EXACT,
        };
        let held = w
            .run_loop(&mut SplitMix64::new(1))
            .expect("spawn 5 threads");
        assert_eq!(held.ops(), 5);
        drop(held); // must not hang
    }
}
