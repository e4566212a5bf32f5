//! Per-node batches from `purge_vmap_node`'s own count (docs/inference.md, "Per-node batches
//! from `nr_purged`").
//!
//! - **Observes** the `work` records of the richer rungs: `decay_va_pool_node`, whose argument
//!   is each `struct vmap_node`, and `purge_vmap_node`, whose argument is `&vn->purge_work` and
//!   whose exit reads `vn->nr_purged`, the areas that node's purge took. Both come before the
//!   purge's own event.
//! - **Infers**, in the causal replay only, the purge as the kernel ran it: started at the
//!   drain item's `work_start` record, each node decayed at its decay's record, and each node's
//!   batch, its `nr_purged` oldest lazy areas, purged at its `purge_vmap_node` record. The
//!   kernel detaches each node's whole list, node after node, so the batch is per node;
//!   without the counts the purge takes the oldest areas of all nodes together at its event,
//!   after the allocations that already took from the pools those batches filled.
//! - **Parameters**: none. Which node a record belongs to comes from the `vmap_node`
//!   addresses the decays showed: every purge decays every node, in node order. Until one
//!   purge has shown them all, the decays after a drain item's `work_start` are placed by their
//!   position (the first is node 0's), on a trace whose header lists the decay probe on a
//!   richer rung, so the first purge is followed node by node too.
//! - **Counter**: `purges_by_node_counts` in the replay report.
//!
//! The purge's `npurged` is scored against a prediction that does not use the counts, which
//! add up to it: what each node held lazy when its decay's record came.

use rustc_hash::FxHashSet;

use crate::replay::Replayer;
use crate::trace::Work;

/// `decay_va_pool_node`'s name in `work` records.
const DECAY_FUNCTION: &str = "decay_va_pool_node";

/// What one `work` record timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::replay) enum Seen {
    /// The end of a node's pool decay, right before the kernel detaches its lazy list.
    Decay(u32),
    /// The end of a node's `purge_vmap_node`, with its `nr_purged`.
    Purged(u32, u64),
}

/// What the records since the last purge event showed about each node.
#[derive(Clone, Debug, Default)]
pub(in crate::replay) struct NodeCounts {
    /// Each node's `struct vmap_node` address, in node order, once one purge's decays showed
    /// them all.
    vns: Vec<u64>,
    /// The decays' `vmap_node` addresses since the last purge event.
    decays: Vec<u64>,
    /// `(node, nr_purged)` of each `purge_vmap_node` since the last purge event.
    counts: Vec<(u32, u64)>,
    /// Purges whose batch the counts set.
    pub(in crate::replay) used: u64,
    /// Areas moved into or out of a batch the model had already taken, to match the counts.
    pub(in crate::replay) moved: u64,
    /// Purges the causal replay started at their drain item's `work_start` record.
    pub(in crate::replay) started: u64,
    /// Each node's lazy areas in the model when its decay's record came, since the last purge
    /// event: the kernel detaches the node's list right after, so these are its batch.
    at_detach: Vec<Option<usize>>,
    /// The trace's header lists `decay_va_pool_node` on a rung that records each call.
    pub(in crate::replay) recorded: bool,
    /// A drain item started before the nodes' addresses were known: its decays are nodes 0,
    /// 1, … in the order they come, until the purge's event.
    positional: bool,
    /// Areas whose node the replay guessed: the snapshot's, whose allocating CPU it does not
    /// give. The kernel's per-node counts move them first.
    guessed: FxHashSet<u64>,
    /// Guessed areas the counts moved to another node.
    pub(in crate::replay) retagged: u64,
}

/// Whether `header` lists the per-node decay probe on a rung that records each call (fentry or
/// kprobe): the tracepoint rung has no such record.
pub(in crate::replay) fn decays_recorded(header: &crate::trace::Header) -> bool {
    header.probes.iter().any(|p| {
        p.probe.split('+').any(|f| f == DECAY_FUNCTION)
            && matches!(p.rung.as_str(), "fentry" | "kprobe")
    })
}

impl NodeCounts {
    /// Takes in one `work` record; says which node's decay or purge it timed, once the nodes
    /// are known.
    pub(in crate::replay) fn observe(&mut self, w: &Work, nodes: u32) -> Option<Seen> {
        if w.function == DECAY_FUNCTION {
            self.decays.push(w.work.0);
            let ordered = self.decays.windows(2).all(|p| p[0] < p[1]);
            if self.vns.is_empty() && self.positional {
                self.positional = ordered && self.decays.len() <= nodes as usize;
            }
            if self.decays.len() == nodes as usize && ordered {
                self.vns.clone_from(&self.decays);
            }
            if self.positional {
                return Some(Seen::Decay(self.decays.len() as u32 - 1));
            }
            self.node_of(w.work.0).map(Seen::Decay)
        } else if let Some(n) = w.nr_purged {
            let node = self.node_of(w.work.0)?;
            self.counts.push((node, n));
            Some(Seen::Purged(node, n))
        } else {
            None
        }
    }

    /// The batch the decays' records predict for the coming purge event: the sum of each
    /// node's lazy areas when its decay ended, once every node's was seen; cleared either way.
    pub(in crate::replay) fn take_predicted(&mut self) -> Option<usize> {
        let at = std::mem::take(&mut self.at_detach);
        if at.is_empty() {
            return None;
        }
        at.iter().copied().sum()
    }

    /// An area whose node tag the replay had to guess.
    pub(in crate::replay) fn guessed_tag(&mut self, addr: u64) {
        self.guessed.insert(addr);
    }

    /// The kernel allocated at `addr`: whatever area was there before, the one there now has
    /// its allocating CPU's node.
    pub(in crate::replay) fn known_tag(&mut self, addr: u64) {
        if !self.guessed.is_empty() {
            self.guessed.remove(&addr);
        }
    }

    /// A drain item's `work_start` record: before the nodes' addresses are known, its decays
    /// will be placed by their position.
    pub(in crate::replay) fn item_started(&mut self) {
        if self.recorded && self.vns.is_empty() {
            self.decays.clear();
            self.positional = true;
        }
    }

    /// Whether the trace times every node's decay and purge: the nodes' addresses are known,
    /// or a drain item's decays are being placed by position.
    pub(in crate::replay) fn timed(&self) -> bool {
        !self.vns.is_empty() || self.positional
    }

    /// The node whose `struct vmap_node` holds `addr`: the last one at or below it, if `addr`
    /// lies no further past it than the nodes are apart.
    fn node_of(&self, addr: u64) -> Option<u32> {
        let i = self.vns.partition_point(|&vn| vn <= addr).checked_sub(1)?;
        let stride = match self.vns.get(1) {
            Some(&second) => second - self.vns[0],
            None => return Some(0),
        };
        (addr - self.vns[i] < stride).then_some(i as u32)
    }

    /// Each node's count for the purge whose event reports `npurged`, when every node that
    /// purged was seen once and the counts add up to it; cleared for the next purge either way.
    pub(in crate::replay) fn take(&mut self, npurged: u32, nodes: u32) -> Option<Vec<u64>> {
        self.decays.clear();
        self.positional = false;
        self.at_detach.clear();
        let counts = std::mem::take(&mut self.counts);
        if counts.is_empty() {
            return None;
        }
        let mut per_node = vec![None; nodes as usize];
        for (node, n) in counts {
            let slot = per_node.get_mut(node as usize)?;
            if slot.replace(n).is_some() {
                return None;
            }
        }
        let per_node: Vec<u64> = per_node.into_iter().map(|n| n.unwrap_or(0)).collect();
        (per_node.iter().sum::<u64>() == u64::from(npurged)).then_some(per_node)
    }
}

impl Replayer<'_> {
    /// A drain item's `work_start` record, causal replay only, on a trace that times each
    /// node's decay and purge: the kernel starts the purge here, so the model does too. Each
    /// node's pools decay at its decay's record and its batch is purged at its
    /// `purge_vmap_node` record; until then an allocation still finds the node's pools as they
    /// were. Without the timed records the start alone placed worse than waiting for the
    /// event (docs/model.md, "Strict and explained figures").
    pub(in crate::replay) fn causal_start_at_work(&mut self) {
        if !self.causal
            || !self.rules.node_counts.timed()
            || !self.opts.rule_on(super::Rule::NodeCounts)
            || self.rules.early.is_some()
            || self.pending_failure.is_some()
        {
            return;
        }
        self.restore_hidden_pools();
        self.rules.early_lazy_before = Some(self.model.lazy().objects());
        self.rules.early_is_split = false;
        self.rules.early = Some(self.model.purge_start_deferring(None));
        self.rules.node_counts.started += 1;
    }

    /// A node's decay ended, causal replay only: its pools are cut and the cut merged back
    /// now, when a purge the model started is under way, and what the node holds lazy now is
    /// its predicted batch (the kernel detaches its list next).
    pub(in crate::replay) fn node_decayed(&mut self, node: u32) {
        if !self.causal {
            return;
        }
        let nodes = self.model.params().layout.nr_nodes() as usize;
        let at = &mut self.rules.node_counts.at_detach;
        if at.len() != nodes {
            *at = vec![None; nodes];
        }
        let purged = self
            .rules
            .early
            .as_ref()
            .is_some_and(|p| !p.remaining().contains(&node));
        if !purged {
            let page = self.model.params().page_size;
            let lazy = self.model.lazy().seqs_before(node, u64::MAX, page).len();
            if let Some(slot) = self.rules.node_counts.at_detach.get_mut(node as usize) {
                *slot = Some(lazy);
            }
        }
        if let Some(p) = self.rules.early.as_mut() {
            self.model.decay_begin(p, node);
            self.model.decay_end(p, node);
        }
    }

    /// A `purge_vmap_node` record, causal replay only: the kernel has purged `node`'s batch of
    /// `count` areas by now (the record is written at its end), so the model does too, rather
    /// than at the purge's event, which comes after every node's and, under load, after the
    /// allocations that took from the pools those batches filled. The first such record of a
    /// purge starts it (decays and detaches); the event then finishes it.
    pub(in crate::replay) fn node_purged(&mut self, node: u32, count: u64) {
        if !self.causal || self.pending_failure.is_some() {
            return;
        }
        let mut p = match self.rules.early.take() {
            Some(p) => p,
            None => {
                self.rules.early_lazy_before = Some(self.model.lazy().objects());
                self.rules.early_is_split = false;
                self.model.purge_start(false, Some(0))
            }
        };
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        self.retag_lazy_to_count(&p, node, count);
        self.model.purge_node_count(&mut p, node, count);
        self.rules.early = Some(p);
    }

    /// Before `node`'s batch of `count` is purged: when its list at the detach held more
    /// areas than that, its guessed ones go to a node not purged yet (their own, whose count
    /// is still to come); when fewer, guessed areas of the nodes not purged yet join it.
    fn retag_lazy_to_count(&mut self, p: &crate::model::PurgeInProgress, node: u32, count: usize) {
        let Some(Some(have)) = self.rules.node_counts.at_detach.get(node as usize).copied() else {
            return;
        };
        if have == count || self.rules.node_counts.guessed.is_empty() {
            return;
        }
        let others: Vec<u32> = p
            .remaining()
            .iter()
            .copied()
            .filter(|&n| n != node)
            .collect();
        let guessed_on = |r: &Self, n: u32| -> Vec<u64> {
            r.model
                .lazy()
                .iter()
                .filter(|&(m, addr, _)| m == n && r.rules.node_counts.guessed.contains(&addr))
                .map(|(_, addr, _)| addr)
                .collect()
        };
        if have > count {
            let Some(&to) = others.last() else { return };
            for addr in guessed_on(self, node).into_iter().take(have - count) {
                self.move_guessed(addr, node, to);
            }
        } else {
            let mut short = count - have;
            for from in others {
                for addr in guessed_on(self, from).into_iter().take(short) {
                    if self.move_guessed(addr, from, node) {
                        short -= 1;
                    }
                }
                if short == 0 {
                    break;
                }
            }
        }
    }

    /// Moves a guessed lazy area between two nodes' lists, and its place in what each list held
    /// at its detach: the lists were detached before any node is purged, so the sum, the
    /// strict `npurged` prediction, stays the same.
    fn move_guessed(&mut self, addr: u64, from: u32, to: u32) -> bool {
        if !self.model.retag_lazy(addr, from, to) {
            return false;
        }
        self.rules.node_counts.retagged += 1;
        let at = &mut self.rules.node_counts.at_detach;
        if let [Some(Some(f)), Some(Some(t))] = [from, to].map(|n| at.get(n as usize).copied()) {
            at[from as usize] = Some(f.saturating_sub(1));
            at[to as usize] = Some(t + 1);
        }
        true
    }

    /// Guessed areas of a batch the model already took, moved from a node over its count to
    /// one under it, and into that node's pool.
    fn repool_guessed(&mut self, got: &mut crate::model::Purged, counts: &[u64]) {
        if self.rules.node_counts.guessed.is_empty() {
            return;
        }
        let want: Vec<usize> = counts
            .iter()
            .map(|&c| usize::try_from(c).unwrap_or(usize::MAX))
            .collect();
        let mut have = vec![0usize; want.len()];
        for b in &got.batch {
            if let Some(h) = have.get_mut(b.node as usize) {
                *h += 1;
            }
        }
        for i in 0..got.batch.len() {
            let from = got.batch[i].node as usize;
            if from >= want.len()
                || have[from] <= want[from]
                || !self.rules.node_counts.guessed.contains(&got.batch[i].addr)
            {
                continue;
            }
            let Some(to) = (0..want.len()).find(|&n| have[n] < want[n]) else {
                break;
            };
            if self.model.repool(&mut got.batch[i], to as u32) {
                have[from] -= 1;
                have[to] += 1;
                self.rules.node_counts.retagged += 1;
            }
        }
    }

    /// The batch of a purge whose nodes' counts are known: each node's `count` oldest lazy
    /// areas.
    pub(in crate::replay) fn purge_by_node_counts(
        &mut self,
        full: bool,
        counts: &[u64],
    ) -> crate::model::Purged {
        self.rules.node_counts.used += 1;
        let mut p = self.model.purge_start(full, Some(0));
        for (node, &count) in counts.iter().enumerate() {
            let count = usize::try_from(count).unwrap_or(usize::MAX);
            self.model.purge_node_count(&mut p, node as u32, count);
        }
        self.model.purge_finish(p)
    }

    /// Brings each node's part of a batch the model already took (a purge started before its
    /// event) to the kernel's count: a node's newest areas beyond it go back to its lazy list,
    /// and a node short of it has its oldest lazy areas join.
    pub(in crate::replay) fn match_node_counts(
        &mut self,
        got: &mut crate::model::Purged,
        counts: &[u64],
    ) {
        self.rules.node_counts.used += 1;
        self.repool_guessed(got, counts);
        let page = self.model.params().page_size;
        for (node, &want) in counts.iter().enumerate() {
            let node = node as u32;
            let want = usize::try_from(want).unwrap_or(usize::MAX);
            let mut mine: Vec<crate::model::PurgedArea> = got
                .batch
                .iter()
                .filter(|b| b.node == node)
                .cloned()
                .collect();
            if mine.len() > want {
                mine.sort_unstable_by_key(|b| std::cmp::Reverse(b.area.seq));
                for b in &mine[..mine.len() - want] {
                    if self.model.unpurge(b) {
                        got.batch.retain(|x| x.addr != b.addr);
                        got.npurged -= 1;
                        got.pages = got.pages.saturating_sub(b.area.size / page);
                        self.rules.node_counts.moved += 1;
                    }
                }
            } else if mine.len() < want {
                let mut lazy: Vec<(u64, u64)> = self
                    .model
                    .lazy()
                    .iter()
                    .filter(|&(n, _, _)| n == node)
                    .map(|(_, addr, a)| (a.seq, addr))
                    .collect();
                lazy.sort_unstable();
                for &(_, addr) in lazy.iter().take(want - mine.len()) {
                    if let Some(b) = self.model.purge_late_area(addr) {
                        got.npurged += 1;
                        got.pages += b.area.size / page;
                        got.batch.push(b);
                        self.rules.node_counts.moved += 1;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::testkit::{lazy_areas, replayer};
    use crate::replay::ReplayOptions;
    use crate::trace::{Ctx, KAddr};

    fn work(function: &str, addr: u64, nr_purged: Option<u64>) -> Work {
        Work {
            ctx: Ctx {
                ts_ns: 1,
                cpu: 0,
                tgid: 1,
                pid: 1,
                comm: "k".into(),
            },
            function: function.into(),
            function_addr: KAddr(0),
            work: KAddr(addr),
            start_ns: 0,
            duration_ns: 1,
            start_cpu: 0,
            nr_purged,
            flush_ns: None,
        }
    }

    const VN: u64 = 0xffff_0000_0007_0000;
    const STRIDE: u64 = 0x1880;
    const PURGE_WORK: u64 = 0x1858;

    fn decayed(c: &mut NodeCounts, nodes: u32) {
        decays_of(c, nodes, nodes);
    }

    /// `seen` decays of a purge on `nodes` nodes.
    fn decays_of(c: &mut NodeCounts, seen: u32, nodes: u32) {
        for n in 0..u64::from(seen) {
            c.observe(&work(DECAY_FUNCTION, VN + n * STRIDE, None), nodes);
        }
    }

    /// The counts of a purge are placed on their nodes by the decays' addresses, and are used
    /// only when they add up to the event's `npurged`.
    #[test]
    fn counts_go_to_the_node_whose_struct_holds_the_work() {
        let mut c = NodeCounts::default();
        decayed(&mut c, 4);
        c.observe(&work("0x0", VN + PURGE_WORK, Some(3)), 4);
        c.observe(&work("0x0", VN + 2 * STRIDE + PURGE_WORK, Some(5)), 4);
        assert_eq!(c.take(8, 4), Some(vec![3, 0, 5, 0]));
        assert_eq!(c.take(8, 4), None, "used up by its purge");
        c.observe(&work("0x0", VN + 3 * STRIDE + PURGE_WORK, Some(2)), 4);
        assert_eq!(
            c.take(3, 4),
            None,
            "another area raced in: not the kernel's sum"
        );
        c.observe(&work("0x0", VN + 4 * STRIDE + PURGE_WORK, Some(2)), 4);
        assert_eq!(c.take(2, 4), None, "past the last node");
    }

    /// Without every node's decay seen, no record can be placed.
    #[test]
    fn no_counts_before_the_nodes_are_known() {
        let mut c = NodeCounts::default();
        decays_of(&mut c, 3, 4);
        c.observe(&work("0x0", VN + PURGE_WORK, Some(3)), 4);
        assert_eq!(c.take(3, 4), None);
        assert!(!c.timed());
        decayed(&mut c, 4);
        c.observe(&work("0x0", VN + PURGE_WORK, Some(3)), 4);
        assert_eq!(c.take(3, 4), Some(vec![3, 0, 0, 0]));
    }

    /// Causal replay on a trace that times each node: the purge starts at the drain item's
    /// start, and a node's `purge_vmap_node` record purges its oldest `nr_purged` areas then,
    /// before the purge's event; frees after the node's detach stay lazy. The event's count
    /// then finds the batch already right.
    #[test]
    fn causal_replay_purges_each_node_at_its_record() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        r.causal = true;
        let nodes = r.model.params().layout.nr_nodes();
        decayed(&mut r.rules.node_counts, nodes);
        r.rules.node_counts.take(0, nodes);
        let before = lazy_areas(&mut r, 3, 2);
        r.causal_start_at_work();
        assert!(r.rules.early.is_some(), "started at the item");
        assert_eq!(r.rules.node_counts.started, 1);
        let after = lazy_areas(&mut r, 2, 2);
        r.node_decayed(0);
        let w = work("0x0", VN + PURGE_WORK, Some(4));
        let Some(Seen::Purged(node, n)) = r.rules.node_counts.observe(&w, nodes) else {
            panic!("placed on node 0");
        };
        r.node_purged(node, n);
        for a in before.iter().chain(&after[..1]) {
            assert!(r.model.lazy().find(*a).is_none(), "{a:#x} in the batch");
        }
        assert!(r.model.lazy().find(after[1]).is_some(), "after the detach");
        assert_eq!(r.model.lazy_pages(), 2);
        let counts = r.rules.node_counts.take(4, nodes).expect("adds up");
        let mut got = r
            .model
            .purge_finish(r.rules.early.take().expect("under way"));
        r.match_node_counts(&mut got, &counts);
        assert_eq!((got.npurged, r.rules.node_counts.moved), (4, 0));
    }

    /// Before any purge has shown every node's address, a drain item's decays are nodes 0, 1,
    /// … in the order they come, on a trace whose header lists the decay probe; not on one
    /// whose header does not, nor for decays seen before any item started (the trace may have
    /// started inside a purge), nor once they come out of order.
    #[test]
    fn an_items_decays_are_placed_by_position_before_the_nodes_are_known() {
        let mut c = NodeCounts {
            recorded: true,
            ..NodeCounts::default()
        };
        let decay = |n: u64| work(DECAY_FUNCTION, VN + n * STRIDE, None);
        assert_eq!(c.observe(&decay(2), 4), None, "no item started");
        c.item_started();
        assert!(c.timed());
        for n in 0..4 {
            assert_eq!(c.observe(&decay(n), 4), Some(Seen::Decay(n as u32)));
        }
        let counted = work("0x0", VN + STRIDE + PURGE_WORK, Some(2));
        assert_eq!(c.observe(&counted, 4), Some(Seen::Purged(1, 2)));
        assert_eq!(c.take(2, 4), Some(vec![0, 2, 0, 0]));

        let mut untimed = NodeCounts::default();
        untimed.item_started();
        assert!(!untimed.timed(), "the header lists no decay probe");
        assert_eq!(untimed.observe(&decay(0), 4), None);

        let mut shuffled = NodeCounts {
            recorded: true,
            ..NodeCounts::default()
        };
        shuffled.item_started();
        assert_eq!(shuffled.observe(&decay(1), 4), Some(Seen::Decay(0)));
        assert_eq!(shuffled.observe(&decay(0), 4), None, "out of order");
        assert!(!shuffled.timed());
    }

    /// The snapshot does not say which CPU allocated an area, so its node is a guess. When the
    /// kernel's counts put one more area on node 1 and one fewer on node 0 than the model's
    /// batch, the guessed area moves to node 1's pool; nothing else leaves or joins the batch.
    #[test]
    fn the_counts_move_a_guessed_area_to_its_nodes_pool() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        r.causal = true;
        let addrs = lazy_areas(&mut r, 3, 2);
        r.rules.node_counts.guessed_tag(addrs[0]);
        let mut got = r.model.purge_oldest(false, usize::MAX);
        assert_eq!(got.npurged, 3);
        r.match_node_counts(&mut got, &[2, 1]);
        assert_eq!(got.npurged, 3);
        assert_eq!(r.rules.node_counts.moved, 0, "no area left or joined");
        assert_eq!(r.rules.node_counts.retagged, 1);
        let pooled: Vec<(u32, u64)> = r.model.pools().iter().map(|(n, a, _)| (n, a)).collect();
        assert!(pooled.contains(&(1, addrs[0])), "{pooled:x?}");
        assert!(pooled.contains(&(0, addrs[1])) && pooled.contains(&(0, addrs[2])));

        // A known area is not moved: the counts are then matched as before.
        let mut r = replayer(&opts);
        r.causal = true;
        lazy_areas(&mut r, 3, 2);
        let mut got = r.model.purge_oldest(false, usize::MAX);
        r.match_node_counts(&mut got, &[2, 1]);
        assert_eq!(r.rules.node_counts.retagged, 0);
        assert_eq!(r.rules.node_counts.moved, 1);
    }

    /// Followed node by node: node 0's decay found three areas and its count says two, so its
    /// guessed area (the oldest, as the snapshot's are) goes to node 1, whose purge then takes
    /// it, and node 0's batch is its two known areas.
    #[test]
    fn a_nodes_surplus_guessed_area_waits_for_another_nodes_purge() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        r.causal = true;
        r.rules.node_counts.recorded = true;
        let addrs = lazy_areas(&mut r, 3, 2);
        r.rules.node_counts.guessed_tag(addrs[0]);
        r.rules.node_counts.item_started();
        r.causal_start_at_work();
        let nodes = r.model.params().layout.nr_nodes();
        for n in 0..u64::from(nodes) {
            let Some(Seen::Decay(node)) = r
                .rules
                .node_counts
                .observe(&work(DECAY_FUNCTION, VN + n * STRIDE, None), nodes)
            else {
                panic!("decay {n} placed");
            };
            r.node_decayed(node);
        }
        r.node_purged(0, 2);
        assert!(r.model.lazy().find(addrs[1]).is_none() && r.model.lazy().find(addrs[2]).is_none());
        assert_eq!(r.model.lazy().find(addrs[0]).map(|(n, _)| n), Some(1));
        r.node_purged(1, 1);
        assert!(r.model.lazy().find(addrs[0]).is_none());
        assert_eq!(
            r.rules.node_counts.take_predicted(),
            Some(3),
            "the sum is kept"
        );
        assert_eq!(r.rules.node_counts.retagged, 1);
    }

    /// Without the nodes' addresses the causal replay waits for the purge's event.
    #[test]
    fn no_start_at_the_item_without_timed_nodes() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        r.causal = true;
        lazy_areas(&mut r, 3, 2);
        r.causal_start_at_work();
        assert!(r.rules.early.is_none());
    }

    /// The strict `npurged` prediction on a trace that times each node: what each node held
    /// lazy when its decay's record came (its list is detached right after), summed once
    /// every node's decay was seen. A free after its node's decay is not counted.
    #[test]
    fn the_decays_predict_the_batch() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        r.causal = true;
        let nodes = r.model.params().layout.nr_nodes();
        lazy_areas(&mut r, 3, 2);
        r.node_decayed(0);
        assert_eq!(
            r.rules.node_counts.take_predicted(),
            None,
            "a node not seen"
        );
        r.node_decayed(0);
        lazy_areas(&mut r, 2, 2);
        for node in 1..nodes {
            r.node_decayed(node);
        }
        assert_eq!(r.rules.node_counts.take_predicted(), Some(3));
        assert_eq!(r.rules.node_counts.take_predicted(), None, "used up");
    }
}
