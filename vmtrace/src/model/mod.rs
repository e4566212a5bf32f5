//! Reference model of the kernel's vmap-area allocator (`mm/vmalloc.c`, node design of v6.9+).
//!
//! The model is a plain state machine with no I/O and no randomness: the same calls give the same
//! answers. It depends on nothing else in the crate, so the replay driver, the free-running
//! simulator and the tests all feed it the same way. The comments name the kernel functions each
//! part follows. `docs/model.md` lists what is exact and what is approximated.
//!
//! One [`Model`] holds the free space ([`free_space`]), per-node busy and lazy sets ([`lazy`]), the
//! size-segregated pools ([`pools`]), the page-table slots ([`pagetable`]) and lock counts
//! ([`locks`]). Addresses are `u64` byte addresses; sizes include the guard page, as the kernel's
//! `alloc_vmap_area` sees them.

pub mod free_space;
pub mod lazy;
pub mod locks;
pub mod nodes;
pub mod pagetable;
pub mod pools;

use std::collections::BTreeMap;

pub use free_space::{FitFailure, FitType, FreeSpace};
pub use lazy::{lazy_max_pages, purge_helpers, LazyArea, LazyLists};
pub use locks::{LockCounts, NodeLock};
pub use nodes::NodeLayout;
pub use pagetable::{PageTableSlots, SlotCounts};
pub use pools::{pool_index, DecayRule, PoolLookup, Pools, MAX_VA_SIZE_PAGES};

/// Which allocator design to model.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// The current kernel (v6.9+): vmap nodes with per-node busy/lazy trees and size pools.
    #[default]
    Nodes,
    /// The Feb 2024 proposal: like `nodes`, but a purge does not pool an area when the pool
    /// already holds more than `lazy_max_pages` objects (the high-priority purge workqueue half of
    /// the proposal only matters to the timing model, which does not exist yet).
    NodesCapped,
    /// The v6.2–v6.8 design (before the vmap nodes of v6.9): one busy tree (`vmap_area_lock`),
    /// one merging lazy tree (`purge_vmap_area_lock`), no pools.
    Global,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Nodes => "nodes",
            Variant::NodesCapped => "nodes-capped",
            Variant::Global => "global",
        }
    }

    /// Every variant, in the order the CLI lists them.
    pub const ALL: [Variant; 3] = [Variant::Nodes, Variant::NodesCapped, Variant::Global];

    /// Whether the design has per-node pools (every one since v6.9; not the global lock).
    pub fn has_pools(self) -> bool {
        !matches!(self, Variant::Global)
    }
}

impl std::str::FromStr for Variant {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| format!("unknown variant `{s}`: expected nodes, nodes-capped or global"))
    }
}

/// Allocator parameters, normally read from the trace header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    pub page_size: u64,
    pub layout: NodeLayout,
    /// `lazy_max_pages()`, in pages: the drain threshold.
    pub lazy_max_pages: u64,
    /// `VMALLOC_START`.
    pub vmalloc_start: u64,
    /// `VMALLOC_END`: the kernel's **inclusive** last byte.
    pub vmalloc_end: u64,
    /// Whether PUD tables are allocated on demand (5-level paging).
    pub five_level: bool,
    /// How a partial pool decay is sized: the kernel's rule for its release.
    pub decay: DecayRule,
    pub variant: Variant,
}

impl Params {
    /// The paging mode, from the VMALLOC base (`__VMALLOC_BASE_L4`/`_L5` in
    /// arch/x86/include/asm/pgtable_64_types.h): a 5-level base (0xffa0… before KASLR
    /// moves it down) lies below the 4-level kernel half, a 4-level base (0xffffc9…) inside it.
    pub fn five_level_base(vmalloc_start: u64) -> bool {
        vmalloc_start < crate::trace::addr::KERNEL_HALF_4LEVEL
    }

    /// End (exclusive) of the space the model manages: the last page below `VMALLOC_END` can
    /// never be used because the allocation must end at or below the inclusive end (`va_alloc`
    /// refuses `nva + size > vend`, and `VMALLOC_END` ends in …fff).
    pub fn range_end(&self) -> u64 {
        self.vmalloc_end & !(self.page_size - 1)
    }

    fn check(&self) -> Result<(), ModelError> {
        if !self.page_size.is_power_of_two() {
            return Err(ModelError::BadParams(format!(
                "page size {} is not a power of two",
                self.page_size
            )));
        }
        if !self.vmalloc_start.is_multiple_of(self.page_size)
            || self.range_end() <= self.vmalloc_start
        {
            return Err(ModelError::BadParams(format!(
                "VMALLOC range {:#x}..={:#x} is empty or not page aligned",
                self.vmalloc_start, self.vmalloc_end
            )));
        }
        if self.lazy_max_pages == 0 {
            return Err(ModelError::BadParams("lazy_max_pages is 0".into()));
        }
        Ok(())
    }
}

/// Errors of the model's own API: calls that the state does not allow.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("bad parameters: {0}")]
    BadParams(String),
    #[error("bad request: size {size:#x} or alignment {align:#x} (size must be a non-zero multiple of the page size, alignment a power of two)")]
    BadRequest { size: u64, align: u64 },
    #[error("{addr:#x} (+{size:#x}) is not free in the model")]
    NotFree { addr: u64, size: u64 },
    #[error("{addr:#x} (+{size:#x}) overlaps a free block")]
    Overlap { addr: u64, size: u64 },
    #[error("{addr:#x} is not a busy area in the model")]
    UnknownAddress { addr: u64 },
    #[error("{addr:#x} (+{size:#x}) lies outside the modelled range")]
    OutOfRange { addr: u64, size: u64 },
}

/// One `alloc_vmap_area` attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocRequest {
    /// Bytes, guard included.
    pub size: u64,
    pub align: u64,
    pub vstart: u64,
    /// Inclusive, as the kernel passes it.
    pub vend: u64,
    /// CPU the attempt ran on: picks the node whose pools are tried.
    pub cpu: u32,
    /// A retry after a failed attempt and a purge: pools are not consulted again (the retry in
    /// `alloc_vmap_area` goes to the global free tree only).
    pub retry: bool,
    /// Whether the last page is an unmapped guard page (false for `vm_map_ram` and vmap blocks).
    pub guard: bool,
}

/// Where an allocation came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "from", content = "fit")]
pub enum Placement {
    Pool,
    FreeTree(FitType),
}

/// A successful allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocated {
    pub addr: u64,
    pub placement: Placement,
    /// Encoded node id stored in `va->flags` (`id + 1`, 0 = none).
    pub tag: u32,
    /// The pool head was misaligned and rotated before the fall-back.
    pub rotated: bool,
}

/// A failed attempt, with the pool side effects that still happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocFailed {
    pub reason: FitFailure,
    pub rotated: bool,
}

/// Result of a lazy free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Freed {
    /// `nr_lazy` as the trace event reports it: the backlog including this area, in pages.
    pub nr_lazy: u64,
    /// `nr_lazy > lazy_max_pages`: this free schedules the drain work.
    pub drain: bool,
    /// Node whose lazy tree took the area.
    pub node: u32,
    pub size: u64,
}

/// Result of one `__purge_vmap_area_lazy`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Purged {
    /// `npurged` of the trace event: lazy objects purged, pooled ones included.
    pub npurged: u32,
    pub pages: u64,
    /// Objects moved into pools.
    pub pooled: u32,
    /// Objects returned to the free tree (including decayed pool entries).
    pub to_free_tree: u32,
    /// Pool entries decayed back to the free tree.
    pub decayed: u32,
    /// Per node, the runs of adjacent ranges its decay handed to the free tree: the kernel
    /// merges a node's decayed entries into a local tree outside any lock and walks only the
    /// merged runs under `free_vmap_area_lock`, so this, not `decayed`, sizes that section.
    #[serde(skip)]
    pub decay_runs: Vec<u32>,
    pub helpers: u32,
    pub nodes_with_work: u32,
    /// Nodes into whose pools at least one area was put.
    pub nodes_pooled: u32,
    /// Union of the purged ranges (the flush range), if anything was lazy.
    pub range: Option<(u64, u64)>,
    /// Every area this purge took, so that replay can give back the ones the kernel's purge
    /// turned out not to include ([`Model::unpurge`]).
    #[serde(skip)]
    pub batch: Vec<PurgedArea>,
}

impl Purged {
    fn add_decay(&mut self, node: u32, entries: u32, runs: u32) {
        self.decayed += entries;
        let i = node as usize;
        if self.decay_runs.len() <= i {
            self.decay_runs.resize(i + 1, 0);
        }
        self.decay_runs[i] += runs;
    }
}

/// Runs of adjacent ranges among `cut`: what `merge_or_add_vmap_area` leaves of them in a
/// local tree, each run one merged block.
fn merged_runs(cut: &[(u64, u64)]) -> u32 {
    let mut sorted: Vec<(u64, u64)> = cut.to_vec();
    sorted.sort_unstable();
    let mut runs = 0;
    let mut end = None;
    for (a, s) in sorted {
        if end != Some(a) {
            runs += 1;
        }
        end = Some(a + s);
    }
    runs
}

/// A purge between [`Model::purge_start`] and [`Model::purge_finish`]: pools decayed, every
/// node's batch fixed, some nodes' batches not purged yet.
#[derive(Clone, Debug)]
pub struct PurgeInProgress {
    full: bool,
    /// Lazy areas with a free order below this are in a batch (see [`LazyArea::seq`]).
    cutoff: u64,
    /// Nodes whose batch is not purged yet, ascending.
    remaining: Vec<u32>,
    /// Every area lazy at the start has a free order below this.
    start_cutoff: u64,
    /// One past the free order of the last free before the start.
    lazy_end: u64,
    /// The objects the whole purge takes (`npurged`), when known.
    limit: Option<usize>,
    /// Per-node cutoffs that replace `cutoff` once [`PurgeInProgress::hold_joins`] ran: the
    /// frees after the start join their node's batch one by one ([`Model::join_last_free`]).
    node_cutoff: Option<Vec<u64>>,
    /// Nodes whose pools are still to decay ([`Model::purge_start_deferring`]).
    undecayed: Vec<u32>,
    out: Purged,
}

impl PurgeInProgress {
    /// Nodes not purged yet, ascending.
    pub fn remaining(&self) -> &[u32] {
        &self.remaining
    }

    /// Nodes whose pools have not decayed yet ([`Model::purge_start_deferring`]).
    pub fn undecayed(&self) -> &[u32] {
        &self.undecayed
    }

    /// Whether every node's batch has been purged.
    pub fn is_done(&self) -> bool {
        self.remaining.is_empty()
    }

    /// What the purge did so far (`to_free_tree` without the decayed areas until it finishes).
    pub fn so_far(&self) -> &Purged {
        &self.out
    }

    /// How many frees after the start the purge takes beyond what was lazy then (its `npurged`
    /// less the lazy areas at the start; 0 when unknown).
    pub fn joiners(&self) -> usize {
        let joined = self.cutoff.saturating_sub(self.lazy_end);
        if self.limit.is_some() {
            joined as usize
        } else {
            0
        }
    }

    /// From now on no free joins a batch unless [`Model::join_last_free`] adds it to its
    /// node's: the caller chooses which of the frees racing the detach were on each node's
    /// list before it, instead of the next ones in free order.
    pub fn hold_joins(&mut self) {
        let nodes = self.remaining.iter().max().map_or(0, |&n| n as usize + 1);
        self.node_cutoff = Some(vec![self.cutoff.min(self.lazy_end); nodes]);
    }

    /// Surgery on the batch: `back` leaves it and `instead` joins it (the caller moved the
    /// areas themselves, see [`Model::unpurge`] and [`Model::place_purged`]).
    pub fn rebatch(&mut self, back: &PurgedArea, instead: PurgedArea, page_size: u64) {
        self.out.batch.retain(|a| a.addr != back.addr);
        self.out.batch.push(instead);
        self.out.pages =
            self.out.pages - back.area.size / page_size + instead.area.size / page_size;
    }

    fn cutoff_of(&self, node: u32) -> u64 {
        match &self.node_cutoff {
            Some(c) => c.get(node as usize).copied().unwrap_or(self.cutoff),
            None => self.cutoff,
        }
    }
}

/// One area a purge took off a lazy tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PurgedArea {
    pub addr: u64,
    pub node: u32,
    pub area: LazyArea,
}

/// A busy area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BusyArea {
    pub size: u64,
    pub tag: u32,
    pub guard: bool,
}

/// Running counts of what the model did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ModelStats {
    pub allocs: u64,
    pub alloc_failures: u64,
    pub pool_hits: u64,
    /// Areas [`Model::claim`] took from a pool: pool hits of the kernel's that the model did not
    /// predict (`pool_hits` counts only its own). Together they are the kernel's pool hits as
    /// replay attributes them; without these the share counted only agreeing predictions.
    pub pool_claims: u64,
    /// Pool lookups that found a misaligned head and rotated it.
    pub pool_rotations: u64,
    pub fit_fl: u64,
    pub fit_le: u64,
    pub fit_re: u64,
    /// NE splits: each consumes a per-CPU preload object.
    pub fit_ne: u64,
    pub frees: u64,
    pub purges: u64,
    pub drains_triggered: u64,
}

/// The allocator state.
#[derive(Clone, Debug)]
pub struct Model {
    params: Params,
    free: FreeSpace,
    busy: BTreeMap<u64, BusyArea>,
    lazy: LazyLists,
    pools: Pools,
    slots: PageTableSlots,
    locks: LockCounts,
    /// Per-node lock sections in the order they were entered, kept only when asked for
    /// ([`Model::log_locks`]): free-running replay turns each operation's sections into
    /// simulated ones, and finding them by comparing every node's count costs O(nodes) per
    /// operation (most of the time at 128 nodes).
    lock_log: Option<Vec<(NodeLock, u32)>>,
    stats: ModelStats,
    /// Scratch for pool decay, kept to avoid an allocation per purge.
    scratch: Vec<(u64, u64)>,
    /// Order stamp of the last lazy area (see [`LazyArea::seq`]).
    free_seq: u64,
    /// Nodes whose decay is under way ([`Model::decay_begin`]), with the entries cut from their
    /// pools on their way to the free tree.
    decaying: Vec<(u32, Vec<(u64, u64)>)>,
}

impl Model {
    /// An empty allocator: the whole VMALLOC range free.
    pub fn new(params: Params) -> Result<Self, ModelError> {
        params.check()?;
        let nodes = params.layout.nr_nodes();
        let pools = params.variant.has_pools();
        let lazy_nodes = if pools { nodes } else { 1 };
        let mut free = FreeSpace::new();
        free.release(
            params.vmalloc_start,
            params.range_end() - params.vmalloc_start,
        )?;
        Ok(Self {
            free,
            busy: BTreeMap::new(),
            lazy: LazyLists::new(lazy_nodes, !pools),
            pools: Pools::new(if pools { nodes } else { 0 }, params.page_size),
            slots: PageTableSlots::new(),
            locks: LockCounts::new(lazy_nodes as usize, pools),
            lock_log: None,
            stats: ModelStats::default(),
            scratch: Vec::new(),
            free_seq: 0,
            decaying: Vec::new(),
            params,
        })
    }

    pub fn params(&self) -> &Params {
        &self.params
    }
    pub fn free_space(&self) -> &FreeSpace {
        &self.free
    }
    pub fn busy(&self) -> &BTreeMap<u64, BusyArea> {
        &self.busy
    }
    pub fn lazy(&self) -> &LazyLists {
        &self.lazy
    }
    pub fn pools(&self) -> &Pools {
        &self.pools
    }
    /// Indexes the pooled areas from here on, or stops ([`Pools::index_members`]): on for
    /// observed-timing replay, whose resynchronisation looks areas up in the pools.
    pub fn index_pools(&mut self, on: bool) {
        self.pools.index_members(on);
    }
    pub fn slots(&self) -> &PageTableSlots {
        &self.slots
    }
    pub fn locks(&self) -> &LockCounts {
        &self.locks
    }

    /// Keeps a log of the per-node lock sections from now on ([`Model::take_lock_log`]).
    pub fn log_locks(&mut self) {
        self.lock_log.get_or_insert_with(Vec::new);
    }

    /// Appends the sections logged since the last call to `out`, oldest first.
    pub fn take_lock_log(&mut self, out: &mut Vec<(NodeLock, u32)>) {
        if let Some(log) = &mut self.lock_log {
            out.append(log);
        }
    }

    /// One critical section on `node`'s lock of kind `lock`.
    fn enter(&mut self, lock: NodeLock, node: u32) {
        let v = match lock {
            NodeLock::Busy => &mut self.locks.busy,
            NodeLock::Lazy => &mut self.locks.lazy,
            NodeLock::Pool => &mut self.locks.pool,
        };
        LockCounts::bump(v, node);
        if let Some(log) = &mut self.lock_log {
            log.push((lock, node));
        }
    }
    pub fn stats(&self) -> &ModelStats {
        &self.stats
    }
    /// `vmap_lazy_nr`, in pages.
    pub fn lazy_pages(&self) -> u64 {
        self.lazy.pages()
    }

    fn pages(&self, size: u64) -> u64 {
        size / self.params.page_size
    }

    /// Busy (and global-variant lazy) trees collapse to one lock in the `global` variant.
    #[inline]
    fn busy_node(&self, addr: u64) -> u32 {
        if self.params.variant.has_pools() {
            self.params.layout.addr_to_node(addr)
        } else {
            0
        }
    }

    /// Whether a request may use the pools: the exact VMALLOC window and more than one node.
    #[inline]
    pub fn pool_eligible(&self, req: &AllocRequest) -> bool {
        self.params.variant.has_pools()
            && self.params.layout.nr_nodes() > 1
            && req.vstart == self.params.vmalloc_start
            && req.vend == self.params.vmalloc_end
    }

    fn validate(&self, req: &AllocRequest) -> Result<(), ModelError> {
        if req.size == 0
            || !req.size.is_multiple_of(self.params.page_size)
            || !req.align.is_power_of_two()
        {
            return Err(ModelError::BadRequest {
                size: req.size,
                align: req.align,
            });
        }
        Ok(())
    }

    /// `alloc_vmap_area` for one attempt: the pool head of the CPU's node, else the lowest fit.
    ///
    /// The outer `Err` is a request the kernel would refuse before trying (`-EINVAL`); the inner
    /// one is an attempt that failed, as a trace's `failed=1` event.
    pub fn alloc(
        &mut self,
        req: &AllocRequest,
    ) -> Result<Result<Allocated, AllocFailed>, ModelError> {
        self.validate(req)?;
        let eligible = self.pool_eligible(req);
        let node = self.params.layout.cpu_to_node(req.cpu);
        let tag = if eligible { node + 1 } else { 0 };
        let mut rotated = false;
        let mut placement = None;
        if eligible && !req.retry {
            match self.pools.take_head(node, req.size, req.align) {
                PoolLookup::Empty => {}
                PoolLookup::Hit(addr) => {
                    self.enter(NodeLock::Pool, node);
                    placement = Some((addr, Placement::Pool));
                }
                PoolLookup::Rotated => {
                    self.enter(NodeLock::Pool, node);
                    rotated = true;
                    self.stats.pool_rotations += 1;
                }
            }
        }
        let (addr, placement) = match placement {
            Some(p) => {
                self.stats.pool_hits += 1;
                p
            }
            None => {
                self.locks.free_vmap_area_lock += 1;
                match self.free.alloc(
                    req.size,
                    req.align,
                    req.vstart,
                    req.vend,
                    self.adjusts_search(req),
                ) {
                    Ok((addr, fit)) => {
                        self.count_fit(fit);
                        (addr, Placement::FreeTree(fit))
                    }
                    Err(reason) => {
                        self.stats.alloc_failures += 1;
                        return Ok(Err(AllocFailed { reason, rotated }));
                    }
                }
            }
        };
        self.insert_busy(addr, req, tag);
        Ok(Ok(Allocated {
            addr,
            placement,
            tag,
            rotated,
        }))
    }

    fn count_fit(&mut self, fit: FitType) {
        match fit {
            FitType::Fl => self.stats.fit_fl += 1,
            FitType::Le => self.stats.fit_le += 1,
            FitType::Re => self.stats.fit_re += 1,
            FitType::Ne => self.stats.fit_ne += 1,
        }
    }

    fn insert_busy(&mut self, addr: u64, req: &AllocRequest, tag: u32) {
        self.stats.allocs += 1;
        self.busy.insert(
            addr,
            BusyArea {
                size: req.size,
                tag,
                guard: req.guard,
            },
        );
        let bn = self.busy_node(addr);
        self.enter(NodeLock::Busy, bn);
        let mapped_end = addr + req.size - if req.guard { self.params.page_size } else { 0 };
        let new_tables = self.slots.map(addr, mapped_end);
        self.locks.page_table_lock += u64::from(new_tables);
    }

    /// Undoes an allocation this model just made (replay: the kernel chose another address).
    /// The area goes back where it came from: the pool head, or merged into the free tree. The
    /// page-table slots it touched stay marked, as in the kernel where tables are never freed.
    pub fn undo_alloc(&mut self, a: &Allocated) -> Result<(), ModelError> {
        let area = self
            .busy
            .remove(&a.addr)
            .ok_or(ModelError::UnknownAddress { addr: a.addr })?;
        self.stats.allocs -= 1;
        match a.placement {
            Placement::Pool => {
                let node = a.tag.saturating_sub(1);
                self.pools.push_front_restore(node, a.addr, area.size);
                self.stats.pool_hits -= 1;
            }
            Placement::FreeTree(_) => self.free.release(a.addr, area.size)?,
        }
        Ok(())
    }

    /// Places an area exactly at `addr` (replay: what the kernel did), taking it from a pool
    /// (any node's, any position) or from the free tree.
    pub fn claim(&mut self, req: &AllocRequest, addr: u64) -> Result<Placement, ModelError> {
        self.validate(req)?;
        let eligible = self.pool_eligible(req);
        let node = self.params.layout.cpu_to_node(req.cpu);
        let tag = if eligible { node + 1 } else { 0 };
        let placement = if let Some(from) = self.pools.remove(addr, req.size, node) {
            // `node_alloc` only ever looks in the allocating CPU's own pool, for a first try
            // in the exact VMALLOC window: an area the model held in another pool was, in the
            // kernel, free-tree space however the model had it.
            if eligible && !req.retry && from == node {
                self.stats.pool_claims += 1;
            }
            Placement::Pool
        } else {
            if addr < self.params.vmalloc_start
                || addr.saturating_add(req.size) > self.params.range_end()
            {
                return Err(ModelError::OutOfRange {
                    addr,
                    size: req.size,
                });
            }
            Placement::FreeTree(self.free.claim(addr, req.size)?)
        };
        self.insert_busy(addr, req, tag);
        Ok(placement)
    }

    /// `adjust_search_size` of `__alloc_vmap_area`: the search descends by `size + align - 1`
    /// when the alignment exceeds a page, unless the range is exactly the request.
    pub fn adjusts_search(&self, req: &AllocRequest) -> bool {
        req.align > self.params.page_size && req.vend.saturating_sub(req.vstart) != req.size
    }

    /// Seeds a busy area from a snapshot. `tag` is the encoded node, usually unknown (0).
    pub fn seed_busy(
        &mut self,
        addr: u64,
        size: u64,
        tag: u32,
        guard: bool,
    ) -> Result<(), ModelError> {
        let req = AllocRequest {
            size,
            align: 1,
            vstart: self.params.vmalloc_start,
            vend: self.params.vmalloc_end,
            cpu: 0,
            retry: true,
            guard,
        };
        self.validate(&req)?;
        self.check_range(addr, size)?;
        self.free.claim(addr, size)?;
        self.insert_busy(addr, &req, tag);
        self.stats.allocs -= 1;
        Ok(())
    }

    /// Seeds a lazily freed (`unpurged`) area from a snapshot.
    pub fn seed_lazy(&mut self, addr: u64, size: u64, tag: u32) -> Result<(), ModelError> {
        if size == 0 || !size.is_multiple_of(self.params.page_size) {
            return Err(ModelError::BadRequest { size, align: 1 });
        }
        self.check_range(addr, size)?;
        self.free.claim(addr, size)?;
        let node = self.lazy_node(addr, tag);
        let seq = self.next_seq();
        self.lazy.insert(
            node,
            addr,
            LazyArea { size, tag, seq },
            self.params.page_size,
        );
        Ok(())
    }

    /// Takes an area seeded lazy out of the lazy lists as a purge would have: pooled on its
    /// node, or back in the free tree. For a snapshot that lists as unpurged an area whose
    /// purge the records before it show. False when the area is not lazy.
    pub fn seed_purged(&mut self, addr: u64) -> bool {
        self.purge_area(addr).is_some()
    }

    fn check_range(&self, addr: u64, size: u64) -> Result<(), ModelError> {
        if addr < self.params.vmalloc_start || addr.saturating_add(size) > self.params.range_end() {
            return Err(ModelError::OutOfRange { addr, size });
        }
        Ok(())
    }

    /// The node whose lazy tree the busy area at `addr` goes to when it is freed.
    pub fn lazy_node_of(&self, addr: u64) -> Option<u32> {
        self.busy.get(&addr).map(|a| self.lazy_node(addr, a.tag))
    }

    /// The lazy tree an area goes to: its tagged node if valid, else `addr_to_node`
    /// (`free_vmap_area_noflush`).
    fn lazy_node(&self, addr: u64, tag: u32) -> u32 {
        if !self.params.variant.has_pools() {
            return 0;
        }
        let n = self.params.layout.nr_nodes();
        if tag >= 1 && tag <= n {
            tag - 1
        } else {
            self.params.layout.addr_to_node(addr)
        }
    }

    /// `vfree` → `free_vmap_area_noflush`: busy → the lazy tree, backlog grows.
    pub fn free(&mut self, addr: u64) -> Result<Freed, ModelError> {
        let area = self
            .busy
            .remove(&addr)
            .ok_or(ModelError::UnknownAddress { addr })?;
        let bn = self.busy_node(addr);
        for _ in 0..self.params.layout.lookup_locks(addr) {
            self.enter(NodeLock::Busy, bn);
        }
        let node = self.lazy_node(addr, area.tag);
        self.enter(NodeLock::Lazy, node);
        let seq = self.next_seq();
        let nr_lazy = self.lazy.insert(
            node,
            addr,
            LazyArea {
                size: area.size,
                tag: area.tag,
                seq,
            },
            self.params.page_size,
        );
        self.stats.frees += 1;
        let drain = nr_lazy > self.params.lazy_max_pages;
        if drain {
            self.stats.drains_triggered += 1;
        }
        Ok(Freed {
            nr_lazy,
            drain,
            node,
            size: area.size,
        })
    }

    /// `__purge_vmap_area_lazy(ULONG_MAX, 0, full)`: decay every node's pools, detach every
    /// lazy tree, then pool (unless `full`) or return each area. `full` is the allocation-failure
    /// path (`reclaim_and_purge_vmap_areas`); the drain work and `vm_unmap_aliases` use `false`.
    pub fn purge(&mut self, full: bool) -> Purged {
        self.purge_before(full, u64::MAX)
    }

    /// A purge whose detach took only the `limit` oldest lazy areas: the others were freed
    /// after the kernel detached the lazy lists (between the detach and the trace event, which
    /// fires at the end of `__purge_vmap_area_lazy`) and wait for the next purge, still counted
    /// in `vmap_lazy_nr`. Replay uses it to align a purge with the observed `npurged`.
    pub fn purge_oldest(&mut self, full: bool, limit: usize) -> Purged {
        let mut seqs: Vec<u64> = self.lazy.iter().map(|(_, _, a)| a.seq).collect();
        if limit >= seqs.len() {
            return self.purge(full);
        }
        seqs.sort_unstable();
        self.purge_before(full, seqs[limit])
    }

    fn next_seq(&mut self) -> u64 {
        self.free_seq += 1;
        self.free_seq
    }

    // The surgery interface. Observed-timing replay follows a kernel whose every step it does
    // not see: where the trace shows the kernel's state differs from the model's, replay puts
    // the model's state right with these, one range or area at a time. Each is a state change
    // the kernel's own algorithm also makes somewhere (a range leaves the free tree or a pool,
    // an area moves between a lazy tree and its purged place); none decides anything.

    /// Takes `[addr, addr+size)` out of `node`'s pools (or any node's) or the free tree, to be
    /// held outside the model by the caller, which must give it back
    /// ([`Model::release_free`], [`Model::return_pooled`], [`Model::relazy_withdrawn`]) before
    /// the model's invariants hold again. False, with nothing changed, if it is neither
    /// pooled nor free.
    pub fn withdraw(&mut self, addr: u64, size: u64, node: u32) -> bool {
        self.pools.remove(addr, size, node).is_some() || self.free.claim(addr, size).is_ok()
    }

    /// [`Model::withdraw`] of a pool entry only: false unless it is pooled.
    pub fn withdraw_pooled(&mut self, addr: u64, size: u64, node: u32) -> bool {
        self.pools.remove(addr, size, node).is_some()
    }

    /// Merges a withdrawn range back into the free tree. False if it overlaps free space.
    pub fn release_free(&mut self, addr: u64, size: u64) -> bool {
        self.free.release(addr, size).is_ok()
    }

    /// Puts a withdrawn range at the head of `node`'s pool of `size`. False if there is no
    /// such pool.
    pub fn return_pooled(&mut self, node: u32, addr: u64, size: u64) -> bool {
        self.pools.push_head(node, addr, size)
    }

    /// Puts the pooled area `old` out and `new` in its place, at its position. False, with
    /// nothing changed, if `old` is not pooled at `size`.
    pub fn replace_pooled(&mut self, old: u64, new: u64, size: u64) -> bool {
        self.pools.replace(old, new, size).is_some()
    }

    /// Takes the lazy area at `addr` off `node`'s lazy tree (and its pages out of the backlog),
    /// leaving its range withdrawn.
    pub fn take_lazy(&mut self, node: u32, addr: u64) -> Option<LazyArea> {
        self.lazy.remove(node, addr, self.params.page_size)
    }

    /// Puts a withdrawn range on `node`'s lazy tree as `area`, its pages into the backlog.
    pub fn put_lazy(&mut self, node: u32, addr: u64, area: LazyArea) {
        self.lazy.insert(node, addr, area, self.params.page_size);
    }

    /// `purge_vmap_node`'s step for one area taken off a lazy tree ([`Model::take_lazy`]):
    /// into `node`'s pool, or the free tree. False if neither took it.
    pub fn place_purged(&mut self, node: u32, addr: u64, area: LazyArea) -> bool {
        self.try_pool(node, addr, area, false) || self.free.release(addr, area.size).is_ok()
    }

    /// Purges the one lazy area at `addr` now, as `purge_vmap_node` would (to its node's pool,
    /// or the free tree). None, with nothing done, if `addr` is not lazy.
    pub fn purge_area(&mut self, addr: u64) -> Option<PurgedArea> {
        let (node, _) = self.lazy.find(addr)?;
        let area = self.take_lazy(node, addr)?;
        if !self.try_pool(node, addr, area, false) {
            let _ = self.free.release(addr, area.size);
        }
        Some(PurgedArea { addr, node, area })
    }

    /// `purge_vmap_node` on every node for its lazy areas freed before `cutoff` (see
    /// [`LazyArea::seq`]), now, with no decay and no detach: the areas go to the pools or the
    /// free tree as the kernel's loop puts them. Returns what it did.
    pub fn purge_lazy_before(&mut self, cutoff: u64) -> Purged {
        let nodes = self.lazy.nodes();
        let mut p = PurgeInProgress {
            full: false,
            cutoff,
            remaining: (0..nodes).collect(),
            start_cutoff: cutoff,
            lazy_end: cutoff,
            limit: None,
            node_cutoff: None,
            undecayed: Vec::new(),
            out: Purged::default(),
        };
        for node in 0..nodes {
            self.purge_node(&mut p, node);
        }
        p.out
    }

    /// Gives a purged area back to the lazy tree it came from (the kernel's purge did not
    /// include it, see [`Model::purge_oldest`]): it is taken out of the pool or the free tree
    /// where the purge put it. False, with nothing changed, when it is in neither (already
    /// reused, or withdrawn).
    pub fn unpurge(&mut self, p: &PurgedArea) -> bool {
        let taken = self.withdraw(p.addr, p.area.size, p.node);
        if taken {
            self.put_lazy(p.node, p.addr, p.area);
        }
        taken
    }

    fn purge_before(&mut self, full: bool, cutoff: u64) -> Purged {
        let mut p = self.purge_start_at(full, cutoff, true);
        for node in 0..self.lazy.nodes() {
            self.purge_node(&mut p, node);
        }
        self.purge_finish(p)
    }

    /// The first half of `__purge_vmap_area_lazy`, as [`Model::purge_oldest`] (`limit`
    /// `None`: every lazy area) would do it: decay every node's pools, fix each node's detached
    /// batch, count the helpers. No area leaves a lazy tree yet: each node's batch is purged by
    /// [`Model::purge_node`], as the kernel's per-node `purge_vmap_node` does (on the caller or
    /// a helper), each subtracting its own pages from `vmap_lazy_nr` when it finishes; areas
    /// freed after this call are not in any batch (the kernel's detach took the lists here).
    /// Replay uses the split to follow a purge node by node when the trace shows one node's
    /// decrement before the other's. [`Model::purge_finish`] purges the rest and returns what
    /// [`Model::purge_oldest`] would have.
    pub fn purge_start(&mut self, full: bool, limit: Option<usize>) -> PurgeInProgress {
        self.purge_start_with(full, limit, true)
    }

    /// [`Model::purge_start`], except that no node's pools decay yet: the kernel decays node
    /// after node, each right before its detach, so allocations between the purge's start and
    /// a node's decay still take from its whole pool, and its `len >> 2` is counted after
    /// them. The caller decays each node with [`Model::decay_begin`] and [`Model::decay_end`];
    /// whatever is left decays before the first node is purged. The batches are fixed at once
    /// as before.
    pub fn purge_start_deferring(&mut self, limit: Option<usize>) -> PurgeInProgress {
        self.purge_start_with(false, limit, false)
    }

    fn purge_start_with(
        &mut self,
        full: bool,
        limit: Option<usize>,
        decay_now: bool,
    ) -> PurgeInProgress {
        let cutoff = match limit {
            Some(limit) => {
                let mut seqs: Vec<u64> = self.lazy.iter().map(|(_, _, a)| a.seq).collect();
                if limit >= seqs.len() {
                    // The kernel's detach took more than is lazy now: the next frees join the
                    // batch (they were on the lists before the detach, their events after).
                    self.free_seq + 1 + (limit - seqs.len()) as u64
                } else {
                    seqs.sort_unstable();
                    seqs[limit]
                }
            }
            None => self.free_seq + 1,
        };
        let mut p = self.purge_start_at(full, cutoff, decay_now);
        p.limit = limit;
        p.start_cutoff = p.start_cutoff.max(cutoff);
        p
    }

    /// Every decay of `p` still deferred or under way: the kernel finishes all decays and
    /// detaches before any node is purged.
    fn decay_all_deferred(&mut self, p: &mut PurgeInProgress) {
        for node in std::mem::take(&mut p.undecayed) {
            let (n, runs) = self.decay_node(node, p.full);
            p.out.add_decay(node, n, runs);
        }
        for node in self.decaying.iter().map(|d| d.0).collect::<Vec<_>>() {
            self.decay_end(p, node);
        }
    }

    /// `decay_va_pool_node` for a node `p` deferred, up to its last step: the pools are cut
    /// now (`len >> 2` from each head), and the cut entries reach the free tree only at
    /// [`Model::decay_end`], as the kernel merges them into the global tree in one
    /// `reclaim_list_global` at the end of the node's decay, right before its detach.
    pub fn decay_begin(&mut self, p: &mut PurgeInProgress, node: u32) {
        let Some(i) = p.undecayed.iter().position(|&n| n == node) else {
            return;
        };
        p.undecayed.remove(i);
        if !self.params.variant.has_pools() {
            return;
        }
        let mut cut = Vec::new();
        self.cut_pools(node, p.full, &mut cut);
        self.decaying.push((node, cut));
    }

    /// The end of a decay [`Model::decay_begin`] started: the cut entries reach the free tree.
    pub fn decay_end(&mut self, p: &mut PurgeInProgress, node: u32) {
        let Some(i) = self.decaying.iter().position(|d| d.0 == node) else {
            return;
        };
        let (_, cut) = self.decaying.remove(i);
        let runs = self.release_cut(&cut);
        p.out.add_decay(node, cut.len() as u32, runs);
    }

    /// A node whose decay under way holds part of `[addr, addr + size)` among its cut entries.
    pub fn decaying_holding(&self, addr: u64, size: u64) -> Option<u32> {
        let end = addr.saturating_add(size);
        self.decaying.iter().find_map(|(node, cut)| {
            cut.iter()
                .any(|&(a, z)| a < end && addr < a + z)
                .then_some(*node)
        })
    }

    /// Nodes whose decay is under way.
    pub fn decaying_nodes(&self) -> Vec<u32> {
        self.decaying.iter().map(|d| d.0).collect()
    }

    /// `decay_va_pool_node` for one node: returns the entries put back in the free tree and
    /// the merged runs they made.
    fn decay_node(&mut self, node: u32, full: bool) -> (u32, u32) {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        self.cut_pools(node, full, &mut scratch);
        let runs = self.release_cut(&scratch);
        let n = scratch.len() as u32;
        self.scratch = scratch;
        (n, runs)
    }

    /// The cut of a decay: [`pools::decay_count`] from the head of each of `node`'s
    /// pools into `out`, with a pool-lock section per non-empty pool to detach it and one more
    /// per pool left non-empty to attach it back ([`pools::decay_sections`]).
    fn cut_pools(&mut self, node: u32, full: bool, out: &mut Vec<(u64, u64)>) {
        if !self.params.variant.has_pools() {
            return;
        }
        let sections = self.pools.decay(node, full, self.params.decay, out);
        for _ in 0..sections {
            self.enter(NodeLock::Pool, node);
        }
    }

    /// The end of a decay: the cut entries merged into the free tree in one
    /// `free_vmap_area_lock` section (`reclaim_list_global`). Returns the runs of adjacent
    /// entries, which is what that section walks (see [`Purged::decay_runs`]).
    fn release_cut(&mut self, cut: &[(u64, u64)]) -> u32 {
        if !cut.is_empty() {
            self.locks.free_vmap_area_lock += 1;
        }
        for &(a, s) in cut {
            // The area was pooled, so it cannot overlap a free block; if the state were
            // corrupt the overlap is caught by the invariant checks, not here.
            let _ = self.free.release(a, s);
        }
        merged_runs(cut)
    }

    fn purge_start_at(&mut self, full: bool, cutoff: u64, decay_now: bool) -> PurgeInProgress {
        let mut out = Purged::default();
        self.stats.purges += 1;
        self.locks.vmap_purge_lock += 1;
        let lazy_nodes = self.lazy.nodes();
        // Step 1: decay, per node, before the detach (or later, node by node, when deferred).
        let nodes = self.params.layout.nr_nodes();
        if decay_now {
            for node in 0..nodes {
                let (n, runs) = self.decay_node(node, full);
                out.add_decay(node, n, runs);
            }
        }
        // The detach of every lazy tree: each node's batch is fixed here.
        let mut batch_pages = vec![0; lazy_nodes as usize];
        for node in 0..lazy_nodes {
            self.enter(NodeLock::Lazy, node);
            batch_pages[node as usize] =
                self.lazy.pages_before(node, cutoff, self.params.page_size);
        }
        out.nodes_with_work = batch_pages.iter().filter(|&&p| p > 0).count() as u32;
        out.helpers = purge_helpers(
            self.lazy.pages(),
            self.params.lazy_max_pages,
            out.nodes_with_work,
        );
        PurgeInProgress {
            full,
            cutoff,
            remaining: (0..lazy_nodes).collect(),
            start_cutoff: self.free_seq + 1,
            lazy_end: self.free_seq + 1,
            limit: None,
            node_cutoff: None,
            undecayed: if decay_now {
                Vec::new()
            } else {
                (0..nodes).collect()
            },
            out,
        }
    }

    /// Pages of `node`'s batch in `p` not purged yet (0 once [`Model::purge_node`] ran for it).
    pub fn purge_batch_pages(&self, p: &PurgeInProgress, node: u32) -> u64 {
        if p.remaining.contains(&node) {
            self.lazy
                .pages_before(node, p.cutoff_of(node), self.params.page_size)
        } else {
            0
        }
    }

    /// `purge_vmap_node` for one node of a purge in progress: its batch (the areas of its
    /// lazy tree detached at [`Model::purge_start`]) goes to the pools in address order, or
    /// back to the free tree, and its pages leave `vmap_lazy_nr`. A no-op for a node already
    /// purged.
    pub fn purge_node(&mut self, p: &mut PurgeInProgress, node: u32) {
        let cutoff = p.cutoff_of(node);
        self.purge_node_before(p, node, cutoff);
    }

    /// [`Model::purge_node`] with another batch for `node`: its oldest lazy areas (those lazy
    /// at [`Model::purge_start`] first, then later frees) adding up to exactly `pages`, the
    /// batch of a node whose detach came earlier or later than the purge's common estimate.
    /// The nodes not purged yet then share what is left of the purge's object count, oldest
    /// first. False, and nothing done, when no run of `node`'s oldest areas adds up to `pages`.
    pub fn purge_node_pages(&mut self, p: &mut PurgeInProgress, node: u32, pages: u64) -> bool {
        if !p.remaining.contains(&node) {
            return false;
        }
        let page = self.params.page_size;
        // Frees after the start count too, after those lazy at it: the node's detach may have
        // come after some of them (a last node's drop then holds one such free more than what
        // was lazy at the start).
        let mut areas = self.lazy.seqs_before(node, u64::MAX, page);
        areas.sort_unstable();
        let mut sum = 0;
        let mut cutoff = None;
        for (i, &(_, pg)) in areas.iter().enumerate() {
            sum += pg;
            if sum == pages {
                let after_all = self.free_seq + 1;
                cutoff = Some(areas.get(i + 1).map_or(after_all, |&(seq, _)| seq));
                break;
            }
            if sum > pages {
                break;
            }
        }
        let Some(cutoff) = cutoff else {
            return false;
        };
        self.purge_node_before(p, node, cutoff);
        if let Some(limit) = p.limit {
            let left = limit.saturating_sub(p.out.npurged as usize);
            let mut seqs: Vec<u64> = p
                .remaining
                .iter()
                .flat_map(|&n| self.lazy.seqs_before(n, p.start_cutoff, page))
                .map(|(seq, _)| seq)
                .collect();
            seqs.sort_unstable();
            p.cutoff = seqs.get(left).copied().unwrap_or(p.start_cutoff);
            p.node_cutoff = None;
        }
        true
    }

    /// [`Model::purge_node`] with the batch the kernel reported for `node`: its `count` oldest
    /// lazy areas, whatever the purge's own cutoff (`vn->nr_purged` after `purge_vmap_node`,
    /// which the richer rungs record). All of them when it holds fewer. A no-op for a node
    /// already purged.
    pub fn purge_node_count(&mut self, p: &mut PurgeInProgress, node: u32, count: usize) {
        if !p.remaining.contains(&node) {
            return;
        }
        let mut seqs: Vec<u64> = self
            .lazy
            .seqs_before(node, u64::MAX, self.params.page_size)
            .into_iter()
            .map(|(seq, _)| seq)
            .collect();
        seqs.sort_unstable();
        let cutoff = seqs.get(count).copied().unwrap_or(self.free_seq + 1);
        self.purge_node_before(p, node, cutoff);
    }

    /// Adds the area of the last free to its node's batch in `p` (after
    /// [`PurgeInProgress::hold_joins`]): its list insertion came before that node's detach,
    /// its event after the purge's start. No-op for a node already purged.
    pub fn join_last_free(&mut self, p: &mut PurgeInProgress, node: u32) {
        if !p.remaining.contains(&node) {
            return;
        }
        let seq = self.free_seq + 1;
        if let Some(c) = p
            .node_cutoff
            .as_mut()
            .and_then(|c| c.get_mut(node as usize))
        {
            *c = (*c).max(seq);
        }
    }

    fn purge_node_before(&mut self, p: &mut PurgeInProgress, node: u32, cutoff: u64) {
        let Some(i) = p.remaining.iter().position(|&n| n == node) else {
            return;
        };
        self.decay_all_deferred(p);
        p.remaining.remove(i);
        let tree = self.lazy.detach_before(node, cutoff);
        let (Some((&first, _)), Some((&last, la))) =
            (tree.first_key_value(), tree.last_key_value())
        else {
            return;
        };
        let end = last + la.size;
        let out = &mut p.out;
        out.range = Some(match out.range {
            None => (first, end),
            Some((s, e)) => (s.min(first), e.max(end)),
        });
        let mut node_pages = 0;
        let mut pooled_here = 0;
        let mut returned = 0;
        for (addr, area) in tree {
            node_pages += area.size / self.params.page_size;
            p.out.npurged += 1;
            p.out.batch.push(PurgedArea { addr, node, area });
            if self.try_pool(node, addr, area, p.full) {
                pooled_here += 1;
            } else {
                let _ = self.free.release(addr, area.size);
                returned += 1;
            }
        }
        self.lazy.subtract(node_pages);
        let out = &mut p.out;
        out.pages += node_pages;
        out.pooled += pooled_here;
        out.to_free_tree += returned;
        if pooled_here > 0 {
            out.nodes_pooled += 1;
        }
        if returned > 0 {
            self.locks.free_vmap_area_lock += 1;
        }
    }

    /// Purges every node of `p` not purged yet and returns the whole purge's result.
    pub fn purge_finish(&mut self, mut p: PurgeInProgress) -> Purged {
        self.decay_all_deferred(&mut p);
        while let Some(&node) = p.remaining.first() {
            self.purge_node(&mut p, node);
        }
        let mut out = p.out;
        out.to_free_tree += out.decayed;
        out
    }

    /// The `vmap-node` shrinker (`vmap_node_shrink_scan`): every pool of every node fully
    /// decayed into the free tree, under `vmap_purge_lock`. It emits no trace event. Returns the
    /// objects returned.
    pub fn shrink(&mut self) -> u32 {
        self.locks.vmap_purge_lock += 1;
        (0..self.params.layout.nr_nodes())
            .map(|node| self.decay_node(node, true).0)
            .sum()
    }

    /// `node_pool_add_va` as called from `purge_vmap_node`.
    fn try_pool(&mut self, node: u32, addr: u64, area: LazyArea, full: bool) -> bool {
        if full || !self.params.variant.has_pools() {
            return false;
        }
        let n = self.params.layout.nr_nodes();
        if area.tag == 0 || area.tag > n {
            return false;
        }
        if self.params.variant == Variant::NodesCapped
            && self.pools.len(node, area.size) as u64 > self.params.lazy_max_pages
        {
            return false;
        }
        if self.pools.push_head(node, addr, area.size) {
            self.enter(NodeLock::Pool, node);
            true
        } else {
            false
        }
    }

    /// Checks the model's invariants: nothing overlaps, free + busy + lazy + pooled cover the
    /// range exactly, the lazy counter equals the lazy pages, and every mapped page lies in a
    /// counted page-table slot. Returns the first violation found.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.check_invariants_with(&BTreeMap::new())
    }

    /// [`Model::check_invariants`] with the ranges a caller holds withdrawn
    /// ([`Model::withdraw`]; start → size) counted in the coverage.
    pub fn check_invariants_with(&self, withdrawn: &BTreeMap<u64, u64>) -> Result<(), String> {
        let mut spans: Vec<(u64, u64, &'static str)> = Vec::new();
        spans.extend(self.free.iter().map(|(s, e)| (s, e, "free")));
        spans.extend(self.busy.iter().map(|(&s, a)| (s, s + a.size, "busy")));
        let mut lazy_pages = 0;
        for (_, s, a) in self.lazy.iter() {
            lazy_pages += self.pages(a.size);
            spans.push((s, s + a.size, "lazy"));
        }
        spans.extend(self.pools.iter().map(|(_, s, z)| (s, s + z, "pooled")));
        spans.extend(withdrawn.iter().map(|(&s, &z)| (s, s + z, "withdrawn")));
        for (_, cut) in &self.decaying {
            spans.extend(cut.iter().map(|&(s, z)| (s, s + z, "decaying")));
        }
        spans.sort_unstable();
        let mut at = self.params.vmalloc_start;
        for &(s, e, what) in &spans {
            if s != at {
                return Err(if s < at {
                    format!("{what} {s:#x}..{e:#x} overlaps the span ending at {at:#x}")
                } else {
                    format!("{at:#x}..{s:#x} is neither free, busy, lazy nor pooled")
                });
            }
            at = e;
        }
        if at != self.params.range_end() {
            return Err(format!(
                "coverage ends at {at:#x}, not at {:#x}",
                self.params.range_end()
            ));
        }
        if lazy_pages != self.lazy.pages() {
            return Err(format!(
                "lazy counter {} != {} lazy pages",
                self.lazy.pages(),
                lazy_pages
            ));
        }
        for (&s, a) in &self.busy {
            let mapped = a.size - if a.guard { self.params.page_size } else { 0 };
            let mut p = s;
            while p < s + mapped {
                if !self.slots.covers(p) {
                    return Err(format!("mapped page {p:#x} lies in no counted slot"));
                }
                p += self.params.page_size;
            }
        }
        Ok(())
    }
}

impl Pools {
    /// Puts back an area taken from the head a moment ago (undo of a predicted pool hit).
    fn push_front_restore(&mut self, node: u32, addr: u64, size: u64) {
        self.push_head(node, addr, size);
    }
}

#[cfg(test)]
pub(crate) mod tests;
