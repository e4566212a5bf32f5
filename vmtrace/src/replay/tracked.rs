//! The model as observed-timing replay drives it: the kernel's allocator ([`Model`]), plus what
//! replay learned from the trace that the kernel's algorithm cannot know.
//!
//! The model stays the kernel's algorithm alone. Three kinds of trace state live here instead:
//! - **hidden ranges**: space the kernel showed to be unavailable while the model had it free
//!   or pooled (pool entries from before the trace, areas still lazy in the kernel, entries a
//!   purge loop had not reached yet), withdrawn from the model until the kernel uses them;
//! - **subtractions held back**: pages of nodes the model purged that a free's backlog shows
//!   still counted in `vmap_lazy_nr` (`purge_vmap_node` subtracts only after its loop);
//! - **untracked lazy pages**: frees of areas the model holds nothing for, counted in the
//!   backlog until the next purge ends.
//!
//! Reads go straight to the model (this type derefs to it); every change goes through a method
//! here, which applies it to the model through the model's surgery interface and keeps the
//! trace state beside it in step. The detach-race moves between a purge's batch and the lazy
//! trees (`swap_purged`, `move_batch_tail`) are here too, as they must take hidden ranges back.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};
use std::ops::Deref;

use crate::model::{
    AllocFailed, AllocRequest, Allocated, Freed, LazyArea, Model, ModelError, ModelStats,
    Placement, PurgeInProgress, Purged, PurgedArea,
};

/// How many purges must have given a hidden range back, each time followed by the kernel
/// showing it unavailable again, before purges stop giving it back
/// ([`TrackedModel::unhide_after_purge`]). A low threshold learns pool entries from before the
/// trace sooner (random-size gains most) but also keeps ranges that were only lazy in the
/// kernel hidden too long (fix-size loses); 10 keeps most of the gain at little cost.
pub const STICKY_AFTER: u32 = 10;

/// Most ranges remembered as given back by a purge: the bound on that memory whatever the
/// trace.
const RELEASED_CAP: usize = 1 << 16;

/// [`Model`] plus replay's trace state (see the module).
pub struct TrackedModel {
    model: Model,
    /// Hidden ranges: start → size. Neither free nor allocatable in the model until the kernel
    /// uses them ([`TrackedModel::unhide`]), a purge gives them back, or a full decay empties
    /// every pool.
    hidden: BTreeMap<u64, u64>,
    /// How often a purge gave each hidden range back ([`TrackedModel::unhide_after_purge`]),
    /// and the ranges hidden again after [`STICKY_AFTER`] of them: the kernel still did not use
    /// them after all those purges, so they are not areas lazy in the kernel (the detach race)
    /// but space it holds for good (pool entries from before the trace: pools of one to three
    /// entries never decay before v6.16). Purges keep those hidden; the kernel using them, or a
    /// full decay, still gives them back.
    released_by_purge: FxHashMap<(u64, u64), u32>,
    sticky: FxHashSet<(u64, u64)>,
    /// Nodes purged whose pages are still in `vmap_lazy_nr`, with those pages
    /// ([`TrackedModel::defer_subtraction`]).
    unsubtracted: Vec<(u32, u64)>,
    /// Whether a node purged now leaves its pages in the backlog until
    /// [`TrackedModel::settle_subtractions`].
    defer_sub: bool,
    /// Pages in `vmap_lazy_nr` of lazy frees the model holds no area for
    /// ([`TrackedModel::free_untracked`]), until the next purge ends.
    untracked_lazy: u64,
    /// Frees whose backlog, with the pages above, exceeded `lazy_max_pages`.
    drains_triggered: u64,
}

impl Deref for TrackedModel {
    type Target = Model;
    fn deref(&self) -> &Model {
        &self.model
    }
}

impl TrackedModel {
    pub fn new(model: Model) -> Self {
        Self {
            model,
            hidden: BTreeMap::new(),
            released_by_purge: FxHashMap::default(),
            sticky: FxHashSet::default(),
            unsubtracted: Vec::new(),
            defer_sub: false,
            untracked_lazy: 0,
            drains_triggered: 0,
        }
    }

    /// The model alone, for a run that follows no trace from here: free-running replay seeds
    /// its model through replay's snapshot handling, which leaves no trace state.
    pub fn into_model(self) -> Model {
        debug_assert!(self.hidden.is_empty() && self.held_pages() == 0);
        self.model
    }

    /// The model's counters, with the drains counted on the backlog replay follows.
    pub fn stats(&self) -> ModelStats {
        ModelStats {
            drains_triggered: self.drains_triggered,
            ..self.model.stats().clone()
        }
    }

    /// `vmap_lazy_nr`, in pages: the model's lazy pages, the subtractions held back and the
    /// untracked frees.
    pub fn lazy_pages(&self) -> u64 {
        self.model.lazy_pages() + self.held_pages()
    }

    fn held_pages(&self) -> u64 {
        self.unsubtracted.iter().map(|&(_, p)| p).sum::<u64>() + self.untracked_lazy
    }

    /// Coverage and the model's other invariants, with the hidden ranges counted.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.model.check_invariants_with(&self.hidden)
    }

    // The model's own operations, passed through.

    pub fn index_pools(&mut self, on: bool) {
        self.model.index_pools(on);
    }

    pub fn alloc(
        &mut self,
        req: &AllocRequest,
    ) -> Result<Result<Allocated, AllocFailed>, ModelError> {
        self.model.alloc(req)
    }

    pub fn undo_alloc(&mut self, a: &Allocated) -> Result<(), ModelError> {
        self.model.undo_alloc(a)
    }

    pub fn claim(&mut self, req: &AllocRequest, addr: u64) -> Result<Placement, ModelError> {
        self.model.claim(req, addr)
    }

    pub fn seed_busy(
        &mut self,
        addr: u64,
        size: u64,
        tag: u32,
        guard: bool,
    ) -> Result<(), ModelError> {
        self.model.seed_busy(addr, size, tag, guard)
    }

    pub fn seed_lazy(&mut self, addr: u64, size: u64, tag: u32) -> Result<(), ModelError> {
        self.model.seed_lazy(addr, size, tag)
    }

    pub fn seed_purged(&mut self, addr: u64) -> bool {
        self.model.seed_purged(addr)
    }

    /// [`Model::free`], its backlog with the pages held here.
    pub fn free(&mut self, addr: u64) -> Result<Freed, ModelError> {
        let mut got = self.model.free(addr)?;
        got.nr_lazy += self.held_pages();
        got.drain = self.crossed(got.nr_lazy);
        Ok(got)
    }

    fn crossed(&mut self, nr_lazy: u64) -> bool {
        let drain = nr_lazy > self.model.params().lazy_max_pages;
        if drain {
            self.drains_triggered += 1;
        }
        drain
    }

    /// `free_vmap_area_noflush` for an area of `size` bytes the model holds nothing for: one
    /// outside the modelled range (the module area), or one the kernel placed where the model
    /// had no room. `vmap_lazy_nr` counts every lazy free whatever its address, so its pages
    /// join the backlog, and may schedule the drain, like any other's; without them every free
    /// until the next purge reports fewer pages than the kernel's. They leave at the end of the
    /// next purge, which the kernel's detach took them into. Returns the backlog and whether
    /// it crossed `lazy_max_pages`.
    pub fn free_untracked(&mut self, size: u64) -> (u64, bool) {
        self.untracked_lazy += size / self.model.params().page_size;
        let nr_lazy = self.lazy_pages();
        (nr_lazy, self.crossed(nr_lazy))
    }

    /// [`Model::purge_oldest`]. A full purge (the failure path) empties every kernel pool,
    /// where hidden ranges are assumed to sit, so they come back first.
    pub fn purge_oldest(&mut self, full: bool, limit: usize) -> Purged {
        if full {
            self.unhide_all();
        }
        let out = self.model.purge_oldest(full, limit);
        self.hold_subtractions(&out.batch);
        self.untracked_lazy = 0;
        out
    }

    /// [`Model::purge_start`]; hidden ranges come back on a full purge as in
    /// [`TrackedModel::purge_oldest`].
    pub fn purge_start(&mut self, full: bool, limit: Option<usize>) -> PurgeInProgress {
        if full {
            self.unhide_all();
        }
        self.model.purge_start(full, limit)
    }

    pub fn purge_start_deferring(&mut self, limit: Option<usize>) -> PurgeInProgress {
        self.model.purge_start_deferring(limit)
    }

    pub fn decay_begin(&mut self, p: &mut PurgeInProgress, node: u32) {
        self.model.decay_begin(p, node);
    }

    pub fn decay_end(&mut self, p: &mut PurgeInProgress, node: u32) {
        self.model.decay_end(p, node);
    }

    pub fn purge_node(&mut self, p: &mut PurgeInProgress, node: u32) {
        let from = p.so_far().batch.len();
        self.model.purge_node(p, node);
        self.hold_subtractions(&p.so_far().batch[from..]);
    }

    pub fn purge_node_pages(&mut self, p: &mut PurgeInProgress, node: u32, pages: u64) -> bool {
        let from = p.so_far().batch.len();
        let done = self.model.purge_node_pages(p, node, pages);
        self.hold_subtractions(&p.so_far().batch[from..]);
        done
    }

    pub fn purge_node_count(&mut self, p: &mut PurgeInProgress, node: u32, count: usize) {
        let from = p.so_far().batch.len();
        self.model.purge_node_count(p, node, count);
        self.hold_subtractions(&p.so_far().batch[from..]);
    }

    pub fn join_last_free(&mut self, p: &mut PurgeInProgress, node: u32) {
        self.model.join_last_free(p, node);
    }

    /// [`Model::purge_finish`]; the untracked frees leave the backlog with it.
    pub fn purge_finish(&mut self, p: PurgeInProgress) -> Purged {
        let from = p.so_far().batch.len();
        let out = self.model.purge_finish(p);
        self.hold_subtractions(&out.batch[from..]);
        self.untracked_lazy = 0;
        out
    }

    // Subtractions held back.

    /// From now on (until turned off) a node purged keeps its pages in the backlog
    /// (`vmap_lazy_nr`) until [`TrackedModel::settle_subtractions`]: `purge_vmap_node` pools
    /// each area as it goes, so the kernel can hand one out again while the loop still runs,
    /// and subtracts the node's pages only at its end (replay: a reuse seen before the drop).
    pub fn defer_subtraction(&mut self, on: bool) {
        self.defer_sub = on;
    }

    /// While subtractions are deferred, holds the pages of each node's run in `purged` (a
    /// purge takes node after node, so each node's areas are one run).
    fn hold_subtractions(&mut self, purged: &[PurgedArea]) {
        if !self.defer_sub {
            return;
        }
        let page = self.model.params().page_size;
        for run in purged.chunk_by(|a, b| a.node == b.node) {
            let pages = run.iter().map(|a| a.area.size / page).sum();
            self.unsubtracted.push((run[0].node, pages));
        }
    }

    /// Nodes purged whose pages are still counted, with those pages.
    pub fn unsubtracted(&self) -> &[(u32, u64)] {
        &self.unsubtracted
    }

    /// Subtracts the held pages of `nodes` (every node with `None`).
    pub fn settle_subtractions(&mut self, nodes: Option<&[u32]>) {
        match nodes {
            None => self.unsubtracted.clear(),
            Some(ns) => self.unsubtracted.retain(|(n, _)| !ns.contains(n)),
        }
    }

    // Hidden ranges.

    pub fn hidden(&self) -> &BTreeMap<u64, u64> {
        &self.hidden
    }

    /// Marks `[addr, addr+size)`, free or pooled in the model, as hidden: replay found that
    /// the kernel does not have it available. False if it is neither free nor pooled.
    pub fn hide(&mut self, addr: u64, size: u64, node: u32) -> bool {
        let ok = self.model.withdraw(addr, size, node);
        if ok {
            self.hidden.insert(addr, size);
            if self
                .released_by_purge
                .get(&(addr, size))
                .is_some_and(|&n| n >= STICKY_AFTER)
            {
                self.sticky.insert((addr, size));
            }
        }
        ok
    }

    /// Takes the hidden range `[addr, addr+size)` out of hiding, exactly that range, for a
    /// caller that puts it elsewhere. False if no such range is hidden.
    fn take_hidden(&mut self, addr: u64, size: u64) -> bool {
        if self.hidden.get(&addr) != Some(&size) {
            return false;
        }
        self.hidden.remove(&addr);
        self.sticky.remove(&(addr, size));
        true
    }

    /// Splits the hidden range starting at `addr` into hidden ranges of `piece` bytes each, for
    /// replay to read them as pool entries one by one. The pieces are not sticky, even if the
    /// range was (a purge gives them back): the kernel was just seen using the range. False,
    /// and nothing changes, unless that range is longer than `piece` and a whole number of
    /// pieces.
    pub fn split_hidden(&mut self, addr: u64, piece: u64) -> bool {
        let Some(&len) = self.hidden.get(&addr) else {
            return false;
        };
        if piece == 0 || len <= piece || len % piece != 0 {
            return false;
        }
        self.sticky.remove(&(addr, len));
        for s in (addr..addr + len).step_by(piece as usize) {
            self.hidden.insert(s, piece);
        }
        true
    }

    /// Returns every hidden range overlapping `[addr, addr+size)` to the free tree (the kernel
    /// just used that space, so it was free or pooled there after all). True if any was.
    pub fn unhide(&mut self, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size);
        // Hidden ranges are disjoint (each was free or pooled space), so their ends rise with
        // their starts: walking down from `end`, the first one that ends at or below `addr`
        // has only such ones below it. Scanning every range below `end` instead made replay
        // quadratic in the hidden ranges (minutes on a test_vmalloc recording).
        let hit: Vec<(u64, u64)> = self
            .hidden
            .range(..end)
            .rev()
            .take_while(|(&s, &z)| s + z > addr)
            .map(|(&s, &z)| (s, z))
            .collect();
        for &(s, z) in &hit {
            self.hidden.remove(&s);
            self.sticky.remove(&(s, z));
            self.model.release_free(s, z);
        }
        !hit.is_empty()
    }

    /// Takes the pooled entry `addr` out of `node`'s pool of `size` into hiding, for replay to
    /// put back at the head later ([`TrackedModel::restore_pooled`]): an entry
    /// `purge_vmap_node`'s loop had not reached yet. False if it is not pooled there.
    pub fn withhold_pooled(&mut self, addr: u64, size: u64, node: u32) -> bool {
        if !self.model.withdraw_pooled(addr, size, node) {
            return false;
        }
        self.hidden.insert(addr, size);
        true
    }

    /// Puts hidden ranges back in `node`'s pool of `size`, the first of `addrs` at the head
    /// (replay: a pool it hid as missing in the kernel turned out to be there). Returns how many
    /// were.
    pub fn restore_pooled(&mut self, node: u32, size: u64, addrs: &[u64]) -> u32 {
        let mut n = 0;
        for &a in addrs.iter().rev() {
            if self.hidden.get(&a) == Some(&size) && self.model.return_pooled(node, a, size) {
                self.hidden.remove(&a);
                n += 1;
            }
        }
        n
    }

    /// Returns the hidden ranges to the free tree after a purge (what was hidden may have been
    /// lazy in the kernel, waiting for this purge, while the model had purged it already),
    /// except those hidden again after [`STICKY_AFTER`] purges gave them back.
    pub fn unhide_after_purge(&mut self) {
        let hidden = std::mem::take(&mut self.hidden);
        for (s, z) in hidden {
            if self.sticky.contains(&(s, z)) {
                self.hidden.insert(s, z);
            } else {
                *self.released_by_purge.entry((s, z)).or_insert(0) += 1;
                self.model.release_free(s, z);
            }
        }
        if self.released_by_purge.len() > RELEASED_CAP {
            self.released_by_purge.clear();
        }
    }

    /// Returns every hidden range to the free tree: a full decay (the failure path) has
    /// emptied every kernel pool, where hidden ranges are assumed to sit.
    fn unhide_all(&mut self) {
        self.sticky.clear();
        for (s, z) in std::mem::take(&mut self.hidden) {
            self.model.release_free(s, z);
        }
    }

    /// Whether `[addr, addr+size)` overlaps a pooled area (slow: replay diagnostics only).
    pub fn overlaps_pooled(&self, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size);
        self.model
            .pools()
            .iter()
            .any(|(_, s, z)| s < end && addr < s + z)
    }

    /// Returns the pooled areas overlapping `[addr, addr+size)` to the free tree, as a decay
    /// would (replay: the kernel had that range free while the model held it pooled). Returns
    /// how many there were.
    pub fn decay_overlapping(&mut self, addr: u64, size: u64) -> u32 {
        let end = addr.saturating_add(size);
        let hit: Vec<(u32, u64, u64)> = self
            .model
            .pools()
            .iter()
            .filter(|&(_, s, z)| s < end && addr < s + z)
            .collect();
        for &(node, s, z) in &hit {
            if self.model.withdraw_pooled(s, z, node) {
                self.model.release_free(s, z);
            }
        }
        hit.len() as u32
    }

    // Purges the model made differently from the kernel's.

    /// Purges the `n` oldest lazy areas (in free order, on any node) without a decay: replay's
    /// top-up of a purge whose batch came out smaller than the observed `npurged`. They go to
    /// the pools or the free tree as `purge_vmap_node` would put them. Returns what it did.
    pub fn purge_late_oldest(&mut self, n: usize) -> Purged {
        if n == 0 {
            return Purged::default();
        }
        let mut seqs: Vec<u64> = self.model.lazy().iter().map(|(_, _, a)| a.seq).collect();
        seqs.sort_unstable();
        let cutoff = seqs.get(n).copied().unwrap_or(u64::MAX);
        let out = self.model.purge_lazy_before(cutoff);
        self.hold_subtractions(&out.batch);
        out
    }

    /// Purges the one lazy area at `addr` as `purge_vmap_node` would: replay's join of an area
    /// to a purge that has already ended in the model, when the kernel's batch held it. None,
    /// with nothing done, if `addr` is not lazy.
    pub fn purge_late_area(&mut self, addr: u64) -> Option<PurgedArea> {
        self.model.purge_area(addr)
    }

    /// Moves a purged area to `node`: out of the pool or free tree where the purge put it, and
    /// into `node`'s pool as that node's `purge_vmap_node` would have put it (replay: the area's
    /// node was a guess, and the kernel's per-node counts place it elsewhere). False, with
    /// nothing changed, when it is in neither (already reused).
    pub fn repool(&mut self, p: &mut PurgedArea, node: u32) -> bool {
        if !self.model.withdraw(p.addr, p.area.size, p.node) {
            return false;
        }
        p.area.tag = node + 1;
        p.node = node;
        if !self.model.place_purged(node, p.addr, p.area) {
            let _ = self.model.release_free(p.addr, p.area.size);
        }
        true
    }

    /// Moves the lazy area at `addr` from `from`'s lazy tree to `to`'s, keeping its free order
    /// (replay: its node was a guess). False when `from` holds no area there.
    pub fn retag_lazy(&mut self, addr: u64, from: u32, to: u32) -> bool {
        let Some(mut area) = self.model.take_lazy(from, addr) else {
            return false;
        };
        area.tag = to + 1;
        self.model.put_lazy(to, addr, area);
        true
    }

    /// Gives a purged area back to the lazy tree it came from (replay: the kernel's purge did
    /// not include it, see [`Model::purge_oldest`]). It is taken out of the pool or the free
    /// tree where the purge put it, or out of hiding: replay hides what the kernel shows it
    /// does not have available, which an area still lazy there is. False when it is in none of
    /// those (already reused).
    pub fn unpurge(&mut self, p: &PurgedArea) -> bool {
        if self.model.unpurge(p) {
            return true;
        }
        if self.take_hidden(p.addr, p.area.size) {
            self.model.put_lazy(p.node, p.addr, p.area);
            return true;
        }
        false
    }

    /// What [`TrackedModel::move_batch_tail`] would move: the newest areas of `from`'s batch
    /// adding up to exactly `pages`, and as many of `to`'s oldest lazy areas
    /// (`(seq, addr, area)`, oldest first). None when it could not.
    #[allow(clippy::type_complexity)]
    fn plan_batch_tail(
        &self,
        p: &PurgeInProgress,
        from: u32,
        pages: u64,
        to: u32,
    ) -> Option<(Vec<PurgedArea>, Vec<(u64, u64, LazyArea)>)> {
        let page = self.model.params().page_size;
        let held = |n: u32| {
            self.unsubtracted
                .iter()
                .find(|&&(k, _)| k == n)
                .map(|&(_, p)| p)
        };
        if from == to || held(to).is_none() || held(from).is_none_or(|h| h <= pages) {
            return None;
        }
        let mut newest: Vec<PurgedArea> = p
            .so_far()
            .batch
            .iter()
            .filter(|a| a.node == from)
            .copied()
            .collect();
        newest.sort_unstable_by_key(|a| std::cmp::Reverse(a.area.seq));
        let mut sum = 0;
        let k = newest.iter().position(|a| {
            sum += a.area.size / page;
            sum >= pages
        })?;
        if sum != pages {
            return None;
        }
        newest.truncate(k + 1);
        let mut oldest: Vec<(u64, u64, LazyArea)> = self
            .model
            .lazy()
            .iter()
            .filter(|&(n, _, _)| n == to)
            .map(|(_, addr, a)| (a.seq, addr, a))
            .collect();
        if oldest.len() < newest.len() {
            return None;
        }
        oldest.sort_unstable_by_key(|&(seq, _, _)| seq);
        oldest.truncate(newest.len());
        Some((newest, oldest))
    }

    /// The pages node `to`'s held batch would gain from [`TrackedModel::move_batch_tail`] with
    /// these arguments, without moving anything; None when the move could not be made.
    pub fn batch_tail_gain(
        &self,
        p: &PurgeInProgress,
        from: u32,
        pages: u64,
        to: u32,
    ) -> Option<u64> {
        let page = self.model.params().page_size;
        self.plan_batch_tail(p, from, pages, to)
            .map(|(_, oldest)| oldest.iter().map(|(_, _, a)| a.size / page).sum())
    }

    /// The detach race decided the other way between two nodes, while the purge's count is
    /// right: the kernel detached `from`'s list before the newest frees the model put in its
    /// batch, and node `to`'s after as many more of its own. Replay sees it when the backlog
    /// drop that ended one node's loop differs from that node's deferred batch: `from`'s drop
    /// below its batch, or `to`'s above its own. The newest areas of `from`'s batch that add up
    /// to `pages` go back to its lazy tree, and as many of `to`'s oldest lazy areas join `to`'s
    /// batch, pooled as its loop would, with the backlog held for `from` shrunk and for `to`
    /// grown by their pages.
    /// Both nodes must be purged with their subtraction deferred
    /// ([`TrackedModel::unsubtracted`]). Returns how many areas moved each way; 0 when none
    /// could, or when not all could (an area already reused: those that could have moved).
    pub fn move_batch_tail(
        &mut self,
        p: &mut PurgeInProgress,
        from: u32,
        pages: u64,
        to: u32,
    ) -> usize {
        let page = self.model.params().page_size;
        let Some((newest, oldest)) = self.plan_batch_tail(p, from, pages, to) else {
            return 0;
        };
        let mut moved = 0;
        for (back, &(_, addr, area)) in newest.iter().zip(&oldest) {
            if !self.unpurge(back) {
                break;
            }
            let taken = self.model.take_lazy(to, addr);
            debug_assert!(taken.is_some(), "listed above");
            if !self.model.place_purged(to, addr, area) {
                // Cannot happen for a lazy area (its range is neither free nor busy); undo.
                self.model.put_lazy(to, addr, area);
                let _ = self.model.take_lazy(back.node, back.addr);
                self.model.release_free(back.addr, back.area.size);
                break;
            }
            p.rebatch(
                back,
                PurgedArea {
                    addr,
                    node: to,
                    area,
                },
                page,
            );
            for (n, h) in self.unsubtracted.iter_mut() {
                if *n == from {
                    *h -= back.area.size / page;
                } else if *n == to {
                    *h += area.size / page;
                }
            }
            moved += 1;
        }
        // A partial move leaves the model consistent, but not settled by this drop.
        if moved == newest.len() {
            moved
        } else {
            0
        }
    }

    /// [`TrackedModel::swap_purged`] for areas of any sizes (replay: the backlog after a purge
    /// shows by how many pages the kernel's batch differed): `instead` comes back to its lazy
    /// tree, and the lazy area at `addr` is purged in its place, into its node's pool (at
    /// `instead`'s place when they share a pool) or the free tree. False, with nothing changed,
    /// when either is not where it should be.
    pub fn swap_purged_sized(&mut self, addr: u64, instead: &PurgedArea) -> bool {
        let Some((node, area)) = self.model.lazy().find(addr) else {
            return false;
        };
        if addr == instead.addr {
            return false;
        }
        if area.size == instead.area.size {
            return self.swap_purged(addr, instead);
        }
        if !self.unpurge(instead) {
            return false;
        }
        let taken = self.model.take_lazy(node, addr);
        debug_assert!(taken.is_some(), "found above");
        if !self.model.place_purged(node, addr, area) {
            // Cannot happen for a lazy area (its range is neither free nor busy); undo.
            self.model.put_lazy(node, addr, area);
            let _ = self.model.take_lazy(instead.node, instead.addr);
            self.model.release_free(instead.addr, instead.area.size);
            return false;
        }
        true
    }

    /// The kernel's purge took the lazy area at `addr` where the model's took `instead`, an
    /// area of the same size: the detach race picked a different set than free order says (the
    /// kernel detaches the nodes' lazy lists one after another, so a node detached later has
    /// newer frees in its batch and the other node fewer). Swaps them: `instead` comes back to
    /// its lazy tree from the pool or free tree its purge put it in, and `addr` leaves its lazy
    /// tree for the free tree, so the backlog and the purge's count are unchanged. False, with
    /// nothing changed, when either is not where it should be.
    pub fn swap_purged(&mut self, addr: u64, instead: &PurgedArea) -> bool {
        let Some((node, area)) = self.model.lazy().find(addr) else {
            return false;
        };
        if area.size != instead.area.size || addr == instead.addr {
            return false;
        }
        // Where the model's purge pooled `instead`, the kernel's pooled `addr`: it takes
        // `instead`'s place in the pool, so that the kernel's pick of it is a pool hit.
        if self.model.replace_pooled(instead.addr, addr, area.size) {
            self.model
                .put_lazy(instead.node, instead.addr, instead.area);
            let taken = self.model.take_lazy(node, addr);
            debug_assert!(taken.is_some(), "found above");
            return true;
        }
        if !self.unpurge(instead) {
            return false;
        }
        let taken = self.model.take_lazy(node, addr);
        debug_assert!(taken.is_some(), "found above");
        if !self.model.release_free(addr, area.size) {
            // Cannot happen for a lazy area (its range is neither free nor busy); undo.
            self.model.put_lazy(node, addr, area);
            let _ = self.model.take_lazy(instead.node, instead.addr);
            self.model.release_free(instead.addr, instead.area.size);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests;
