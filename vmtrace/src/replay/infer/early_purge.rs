//! Purges applied before their event (docs/inference.md, "Early purges", "Early purge node by
//! node", "Deferred subtraction after a reuse" and "Batch tails moved").
//!
//! - **Observes** a backlog drop a free reports, or the kernel reusing an area the model still
//!   holds lazy, before the purge event that explains it.
//! - **Infers** that the purge's node loops ran already: the nodes whose batches add up to the
//!   drop are purged now, or, on a reuse, every node with its subtraction held until a drop
//!   shows it; a drop that matches no batch moves the newest areas between two nodes' batches.
//! - **Parameters**: none of their own; the batches come from the detach prediction.
//! - **Counters**: `early_purges` (refusals in `drain_work.early_refused`),
//!   `early_split_purges` and `batch_tails_moved` in the replay report.

use super::nodes_summing_to;
use crate::replay::lookahead::DrainLookup;
use crate::replay::Replayer;

impl Replayer<'_> {
    /// A free's backlog below what it would be without a purge, while one is pending or under
    /// way: the purge already subtracted its pages, node by node. Nodes purged on a reuse keep
    /// their pages in the backlog until the kernel's subtraction shows
    /// (`TrackedModel::defer_subtraction`), even once every node is purged: without this the
    /// drop goes unseen until the purge event, and every free in between disagrees. A drop that
    /// is some held nodes' pages settles them; one that matches a batch tail moved between two
    /// nodes settles that; anything else settles every node and purges what the drop shows.
    pub(in crate::replay) fn backlog_drop_seen(
        &mut self,
        nr_lazy: u64,
        own: u64,
        ahead: &dyn DrainLookup,
    ) {
        let settling = !self.model.unsubtracted().is_empty();
        if !((self.drain_pending || self.rules.early.is_some()) && (self.early_open() || settling))
        {
            return;
        }
        let expected = self.model.lazy_pages() + own;
        if nr_lazy >= expected
            || self.add_order_explains(nr_lazy, expected, ahead, self.opts.infer.drop_order_span)
        {
            return;
        }
        let dropped = expected - nr_lazy;
        let held = self.model.unsubtracted().to_vec();
        match nodes_summing_to(&held, dropped) {
            // Nodes already purged on a reuse, whose loops have now ended.
            Some(nodes) => self.model.settle_subtractions(Some(&nodes)),
            None if self.move_batch_tail(dropped, &held) => {}
            None => {
                self.model.settle_subtractions(None);
                let expected = self.model.lazy_pages() + own;
                if nr_lazy < expected {
                    self.purge_early_dropped(expected - nr_lazy, ahead);
                }
            }
        }
    }

    /// Whether the pending purge may still be (further) applied early: not started, or some
    /// nodes' batches not purged yet.
    pub(in crate::replay) fn early_open(&self) -> bool {
        self.rules.early.as_ref().is_none_or(|e| !e.is_done())
    }

    /// Whether an allocation at `addr` shows a pending purge already at work in the kernel:
    /// it reuses a range the model still holds lazy.
    pub(in crate::replay) fn reuse_shows_purge(&self, addr: u64, size: u64) -> bool {
        (self.drain_pending || self.rules.early.is_some())
            && self.early_open()
            && self.lazy_overlaps(addr, size)
    }

    /// The trace showed a pending purge's effect before its event: start it now (decay, fix
    /// every node's batch), unless the drain item that runs the coming purge event is known
    /// (read ahead) and has not started yet. Then the kernel has not purged: the lower backlog
    /// or the reused lazy range has another cause (a diverged state), and purging now would
    /// move a whole batch of frees to the wrong purge, which every later `nr_lazy` and
    /// `npurged` comparison would inherit. False when refused.
    pub(in crate::replay) fn start_early(&mut self, ahead: &dyn DrainLookup) -> bool {
        if !self.opts.rule_on(super::Rule::EarlyPurge) {
            return false;
        }
        if self.rules.early.is_some() {
            return true;
        }
        let item = ahead
            .next_purge()
            .and_then(|(pid, ts)| ahead.drain_holding(pid, ts));
        if item.is_some_and(|d| self.last_ts < d.start_ns) {
            self.drain_work.early_refused += 1;
            return false;
        }
        self.rules.early_lazy_before = Some(self.model.lazy().objects());
        self.rules.early_is_split = false;
        let limit = ahead
            .next_npurged()
            .map(|n| n.saturating_sub(self.rules.foreign_lazy) as usize);
        self.rules.early = Some(self.model.purge_start(false, limit));
        self.rules.early_purges += 1;
        true
    }

    /// Purges `nodes` of the early purge (every remaining one when `None`), and the nodes
    /// whose batch is empty (the kernel runs no `purge_vmap_node` for them).
    pub(in crate::replay) fn purge_early_nodes(&mut self, nodes: Option<Vec<u32>>) {
        let Some(mut e) = self.rules.early.take() else {
            return;
        };
        let empty: Vec<u32> = e
            .remaining()
            .iter()
            .copied()
            .filter(|&n| self.model.purge_batch_pages(&e, n) == 0)
            .collect();
        let part = nodes.unwrap_or_else(|| e.remaining().to_vec());
        for n in part.into_iter().chain(empty) {
            self.model.purge_node(&mut e, n);
        }
        self.rules.recent_frees.clear();
        if !e.is_done() && !self.rules.early_is_split {
            // Not the whole purge at one point: one node finished before the other.
            self.rules.early_is_split = true;
            self.rules.early_split += 1;
        }
        self.rules.early = Some(e);
    }

    /// A free reported `dropped` pages less backlog than the model holds: the kernel's purge
    /// has finished `purge_vmap_node` on some nodes, each subtracting its own batch. Purge the
    /// nodes whose batches add up to exactly `dropped` (the kernel subtracts per node, so a
    /// free between two nodes' ends sees only the first node's decrement); when no set of nodes
    /// does, the whole purge, as before.
    pub(in crate::replay) fn purge_early_dropped(&mut self, dropped: u64, ahead: &dyn DrainLookup) {
        if !self.start_early(ahead) {
            return;
        }
        let Some(e) = &self.rules.early else { return };
        let nodes: Vec<(u32, u64)> = e
            .remaining()
            .iter()
            .map(|&n| (n, self.model.purge_batch_pages(e, n)))
            .filter(|&(_, p)| p > 0)
            .collect();
        let mut part = nodes_summing_to(&nodes, dropped);
        if part.is_none() {
            // No set of the common estimate's batches: one node's detach came earlier or later
            // than the estimate. A node whose oldest areas add up to the drop finished alone.
            let Some(mut e) = self.rules.early.take() else {
                return;
            };
            let one = nodes
                .iter()
                .find(|&&(n, _)| self.model.purge_node_pages(&mut e, n, dropped));
            if one.is_some() {
                self.rules.recent_frees.clear();
                if !e.is_done() && !self.rules.early_is_split {
                    self.rules.early_is_split = true;
                    self.rules.early_split += 1;
                }
                part = Some(Vec::new());
            }
            self.rules.early = Some(e);
        }
        self.purge_early_nodes(part);
    }

    /// The kernel allocated inside a range the model still holds lazy: its purge has run far
    /// enough to pool or free it. Every remaining node is purged now. Purging only the node
    /// whose batch holds the range (the kernel's nodes do finish one by one) predicts worse:
    /// when the purge worker competes with the workload for the CPUs, it leaves the other
    /// node's batch lazy for long stretches, and placement and `nr_lazy` follow it. A split is
    /// made only on the stronger evidence of a backlog drop that matches some nodes' batches
    /// exactly ([`Replayer::purge_early_dropped`]).
    pub(in crate::replay) fn purge_early_reused(&mut self, ahead: &dyn DrainLookup) {
        if self.start_early(ahead) {
            // The reuse shows a node's loop under way, not ended: its pages leave the backlog
            // at the drop a later free reports, or at the event, not at the reuse, which the
            // kernel's `purge_vmap_node` subtracts only after its loop.
            let from = self
                .rules
                .early
                .as_ref()
                .map_or(0, |e| e.so_far().batch.len());
            self.model.defer_subtraction(true);
            self.purge_early_nodes(None);
            self.model.defer_subtraction(false);
            self.loop_progress(from, ahead);
        }
    }

    /// A node's loop ended with a drop below its deferred batch, while the purge's count is
    /// right: the detach race went the other way for its newest frees
    /// ([`tracked::TrackedModel::move_batch_tail`], with the one other node still held). Without it every node
    /// is subtracted and each free until the purge event disagrees by the other node's batch.
    /// The race also goes the other way round: a drop above the node's batch and below both
    /// nodes' together is that node's batch grown by its next frees, and the other's shrunk by
    /// as many of its newest. That is settled only when the areas that would join add up to the
    /// difference exactly (one small area of the other node's batch that was the finishing
    /// node's otherwise leaves every free until the event thousands of pages off). True when
    /// the drop is settled either way.
    pub(in crate::replay) fn move_batch_tail(&mut self, dropped: u64, held: &[(u32, u64)]) -> bool {
        let (Some(p), [a, b]) = (self.rules.early.as_mut(), held) else {
            return false;
        };
        for &((from, pages), (to, _)) in &[(*a, *b), (*b, *a)] {
            if pages > dropped && self.model.move_batch_tail(p, from, pages - dropped, to) > 0 {
                self.model.settle_subtractions(Some(&[from]));
                self.rules.batch_tails_moved += 1;
                return true;
            }
        }
        for &((ended, pages), (other, other_pages)) in &[(*a, *b), (*b, *a)] {
            let Some(more) = dropped
                .checked_sub(pages)
                .filter(|&m| m > 0 && m < other_pages)
            else {
                continue;
            };
            if self.model.batch_tail_gain(p, other, more, ended) == Some(more)
                && self.model.move_batch_tail(p, other, more, ended) > 0
            {
                self.model.settle_subtractions(Some(&[ended]));
                self.rules.batch_tails_moved += 1;
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use crate::replay::lookahead::Blind;
    use crate::replay::testkit::{lazy_areas, one_drain, replayer, request, PAGE};
    use crate::replay::ReplayOptions;

    /// The kernel reusing a range the model holds lazy shows a pending purge at work; the
    /// purge starts then, unless the drain item read ahead has not started yet (then the
    /// kernel has not purged, and starting would move a batch to the wrong purge).
    #[test]
    fn a_reuse_starts_the_pending_purge_unless_its_item_is_still_ahead() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        let addrs = lazy_areas(&mut r, 3, 2);
        assert!(!r.reuse_shows_purge(addrs[0], 2 * PAGE), "no purge pending");
        r.drain_pending = true;
        assert!(r.reuse_shows_purge(addrs[0], 2 * PAGE));
        assert!(
            !r.reuse_shows_purge(addrs[2] + 64 * PAGE, 2 * PAGE),
            "not lazy there"
        );
        let ahead = one_drain(1_000, 5_000, 3);
        r.last_ts = 900;
        assert!(!r.start_early(&ahead));
        assert_eq!((r.drain_work.early_refused, r.rules.early_purges), (1, 0));
        r.last_ts = 1_100;
        assert!(r.start_early(&ahead));
        assert_eq!(r.rules.early_purges, 1);
        assert!(r.start_early(&Blind), "already started");
        assert_eq!(r.rules.early_purges, 1);
    }

    /// A backlog drop that is exactly one node's batch purges that node alone, the other
    /// node's batch staying lazy until its own drop.
    #[test]
    fn a_drop_of_one_nodes_batch_purges_that_node_alone() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        lazy_areas(&mut r, 2, 2);
        let on1 = request(&r, 3, 1);
        let b = r.model.alloc(&on1).unwrap().unwrap().addr;
        r.model.free(b).unwrap();
        assert_eq!(r.model.lazy_pages(), 7);
        r.drain_pending = true;
        assert!(r.start_early(&Blind));
        r.purge_early_dropped(3, &Blind);
        assert_eq!(r.model.lazy_pages(), 4, "node 0's batch is still lazy");
        assert!(r.model.lazy().find(b).is_none());
        r.model.check_invariants().unwrap();
    }
}
