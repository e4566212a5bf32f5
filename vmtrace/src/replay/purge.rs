//! How replay follows a purge in observed timing: the drain item that runs it, the detach of
//! each node's lazy list and the frees that race it, the decays, a purge applied before its
//! event when the trace shows its effect early, and the pace of `purge_vmap_node`'s loops.

use super::detach::Detach;
use super::{DrainLookup, Replayer};

impl<'o> Replayer<'o> {
    /// The drain work item that runs the coming purge event started before `ts`: the kernel
    /// decayed the pools and detached the lazy lists right after (`__purge_vmap_area_lazy`
    /// begins with them), so events from here on see the decayed pools and their frees go to
    /// the next batch. Starts the model's purge there.
    pub(super) fn start_at_work(&mut self, ts: u64, ahead: &dyn DrainLookup) {
        self.decay_due(ts);
        if self.early.is_some() || self.pending_failure.is_some() {
            return;
        }
        let Some(event) = ahead.next_purge() else {
            return;
        };
        // Looked up once per purge event, not on every allocation and free before it (a miss
        // is asked again: the item's record may not have been read ahead yet).
        let item = match self.next_item {
            Some((e, item)) if e == event => item,
            _ => {
                let Some(item) = ahead.drain_holding(event.0, event.1) else {
                    return;
                };
                self.next_item = Some((event, item));
                item
            }
        };
        let start = item.start_ns;
        if start > ts || start < self.last_purge_ts {
            return;
        }
        self.restore_hidden_pools();
        self.early_lazy_before = Some(self.model.lazy().objects());
        let d = Detach {
            start,
            flush: item.flush_ns.filter(|&f| f >= start),
            decays: ahead.decays_in(&item),
            step: self.step_fit.step(),
        };
        self.start_lazy = self.early_lazy_before;
        self.detach_frees.clear();
        self.detach = Some(d);
        self.early_is_split = false;
        let limit = ahead
            .next_npurged()
            .map(|n| n.saturating_sub(self.foreign_lazy) as usize);
        // Every node's decay follows the kernel's clock (`decay_due`): its pools are cut right
        // after the previous node's detach (node 0: at the start), and the cut entries reach
        // the free tree at its own detach. Decaying every node at the start cuts a later
        // node's pool from the wrong length, and freeing the cut entries at once offers the
        // free tree space the kernel has not merged back yet; both mispredict placements.
        let mut early = self.model.purge_start_deferring(limit);
        self.plan_joins(&mut early, ahead);
        self.early = Some(early);
        self.work_starts += 1;
        self.decay_due(ts);
    }

    /// Decays the pools of the started purge's nodes whose decay time has come by `ts`.
    pub(super) fn decay_due(&mut self, ts: u64) {
        let (Some(p), Some(d)) = (self.early.as_mut(), self.detach.as_ref()) else {
            return;
        };
        let nodes = self.model.params().layout.nr_nodes();
        let due: Vec<u32> = p
            .undecayed()
            .iter()
            .copied()
            .filter(|&n| d.decay_at(n, nodes, self.opts) <= ts)
            .collect();
        for node in due {
            self.model.decay_begin(p, node);
        }
        for node in self.model.decaying_nodes() {
            if d.at(node, nodes, self.opts) <= ts {
                self.model.decay_end(p, node);
            }
        }
    }

    /// Which frees after the start join the purge's batches. The kernel took `npurged` areas:
    /// what was lazy at the start, and the frees whose list insertions beat their node's
    /// detach. Without more, those are the next frees in order; with the item's times, the
    /// frees read ahead are ranked by how long before their node's predicted detach
    /// ([`Detach::at`]) their events came, and the first ones join, node by node
    /// (`joins_left`; applied in `free`).
    pub(super) fn plan_joins(
        &mut self,
        p: &mut crate::model::PurgeInProgress,
        ahead: &dyn DrainLookup,
    ) {
        self.joins_left.clear();
        let want = p.joiners();
        let nodes = self.model.params().layout.nr_nodes();
        // From the start alone the detach is too loose a guess to beat free order: ranking by
        // it mispredicts more backlogs than taking the next frees in order.
        let Some(d) = self
            .detach
            .as_ref()
            .filter(|d| d.flush.is_some() || d.timed(nodes))
        else {
            return;
        };
        if want == 0 {
            return;
        }
        let mut ranked: Vec<(i128, u32)> = ahead
            .frees_ahead_timed(self.opts.infer.join_span)
            .into_iter()
            .filter_map(|(va, ts)| {
                let node = self.model.lazy_node_of(va)?;
                Some((
                    i128::from(ts) - i128::from(d.at(node, nodes, self.opts)),
                    node,
                ))
            })
            .collect();
        if ranked.len() < want {
            return;
        }
        ranked.sort_by_key(|&(lead, _)| lead);
        self.joins_left = vec![0; nodes as usize];
        for &(_, node) in ranked.iter().take(want) {
            if let Some(n) = self.joins_left.get_mut(node as usize) {
                *n += 1;
            }
        }
        p.hold_joins();
    }

    /// The first free after a purge event reports the kernel's backlog after the purge (unless
    /// its add came before the purge's last subtractions, or after frees still to come: see
    /// [`Replayer::last_purge_nodes_explain`]; those are scored, not reconciled here). When
    /// the model keeps a different number of pages lazy, its batch (right in count, see the
    /// top-up) held other areas than the kernel's: the detach race decides which of the frees
    /// around the detach a node's batch takes, and with mixed sizes that shows in pages. One
    /// lazy area and one batch area whose sizes differ by exactly the difference are swapped,
    /// the newest of each first (the frees around the detach). Nothing is done when no pair
    /// fits, or when the free's area is neither in the model nor allocated in the records read
    /// ahead.
    pub(super) fn reconcile_batch(
        &mut self,
        got: &mut crate::model::Purged,
        ahead: &dyn DrainLookup,
    ) {
        let page = self.model.params().page_size;
        let Some(&(va, nr)) = ahead.frees_ahead(1).first() else {
            return;
        };
        // The area may be allocated after the purge event, and not be in the model yet; a batch
        // left unreconciled for want of its size leaves every free until the next purge off.
        let size = self
            .model
            .busy()
            .get(&va)
            .map(|b| b.size)
            .or_else(|| ahead.size_allocated_ahead(va));
        let Some(own) = size.map(|s| s / page) else {
            return;
        };
        let Some(kernel_left) = nr.checked_sub(own) else {
            return;
        };
        let model_left = self.model.lazy_pages();
        if model_left == kernel_left {
            return;
        }
        let delta = model_left as i64 - kernel_left as i64;
        let mut lazy: Vec<(u64, u64, u64)> = self
            .model
            .lazy()
            .iter()
            .map(|(_, a, l)| (l.seq, a, l.size / page))
            .collect();
        lazy.sort_unstable_by_key(|&(seq, _, _)| std::cmp::Reverse(seq));
        let mut batch: Vec<crate::model::PurgedArea> = got.batch.clone();
        batch.sort_unstable_by_key(|b| std::cmp::Reverse(b.area.seq));
        for &(_, a, a_pages) in lazy.iter().take(self.opts.infer.reconcile_span) {
            for b in batch.iter().take(self.opts.infer.reconcile_span) {
                if a_pages as i64 - (b.area.size / page) as i64 != delta {
                    continue;
                }
                let Some((node, area)) = self.model.lazy().find(a) else {
                    continue;
                };
                if self.model.swap_purged_sized(a, b) {
                    self.reconciled += 1;
                    got.batch.retain(|x| x.addr != b.addr);
                    got.batch.push(crate::model::PurgedArea {
                        addr: a,
                        node,
                        area,
                    });
                    return;
                }
            }
        }
        if self.shift_between_nodes(got, delta) {
            self.shifted += 1;
        }
    }

    /// The backlog after a purge differs from the model's by `delta` pages (model minus
    /// kernel) and no single pair of areas explains it: the detach race split the frees
    /// between the nodes otherwise than predicted. Each node's batch is what its list held at
    /// the start plus its frees up to its own detach, so a node detached earlier than predicted
    /// gave back its newest joined areas and one detached later took its next lazy ones, as
    /// many as the count (right already) allows. The smallest such shift whose pages make up
    /// `delta` exactly, between any two nodes, is applied (without it, a three-area shift left
    /// undone leaves every free until the next purge off by its pages).
    fn shift_between_nodes(&mut self, got: &mut crate::model::Purged, delta: i64) -> bool {
        let page = self.model.params().page_size;
        let nodes = self.model.params().layout.nr_nodes() as usize;
        // Per node, once: its batch newest first and its lazy areas oldest first.
        let mut back: Vec<Vec<crate::model::PurgedArea>> = vec![Vec::new(); nodes];
        for b in &got.batch {
            if let Some(v) = back.get_mut(b.node as usize) {
                v.push(*b);
            }
        }
        let mut take: Vec<Vec<crate::model::PurgedArea>> = vec![Vec::new(); nodes];
        for (node, addr, area) in self.model.lazy().iter() {
            if let Some(v) = take.get_mut(node as usize) {
                v.push(crate::model::PurgedArea { addr, node, area });
            }
        }
        for v in &mut back {
            v.sort_unstable_by_key(|b| std::cmp::Reverse(b.area.seq));
        }
        for v in &mut take {
            v.sort_unstable_by_key(|t| t.area.seq);
        }
        let mut best: Option<(usize, usize, usize)> = None;
        for (from, back) in back.iter().enumerate() {
            for (to, take) in take.iter().enumerate().filter(|&(n, _)| n != from) {
                let mut diff = 0i64;
                for (j, (t, b)) in take
                    .iter()
                    .zip(back)
                    .take(self.opts.infer.shift_span)
                    .enumerate()
                {
                    diff += (t.area.size / page) as i64 - (b.area.size / page) as i64;
                    if diff == delta {
                        if best.is_none_or(|(k, _, _)| j + 1 < k) {
                            best = Some((j + 1, from, to));
                        }
                        break;
                    }
                }
            }
        }
        let Some((count, from, to)) = best else {
            return false;
        };
        // Stops at an area not where it should be; what moved so far stays moved.
        let mut moved = 0;
        for (b, t) in back[from].iter().zip(&take[to]).take(count) {
            if !self.model.swap_purged_sized(t.addr, b) {
                break;
            }
            got.batch.retain(|x| x.addr != b.addr);
            got.batch.push(*t);
            moved += 1;
        }
        moved > 0
    }

    /// Puts every pool hidden whole since the last purge back, in its order, before a purge
    /// decays the pools: the kernel decays `len >> 2` entries from each pool's head, so a pool
    /// the model holds shorter than the kernel's decays other entries.
    pub(super) fn restore_hidden_pools(&mut self) {
        for h in std::mem::take(&mut self.hidden_pools) {
            if h.back_before_decay {
                self.pools_restored +=
                    u64::from(self.model.restore_pooled(h.node, h.size, &h.entries));
            }
        }
    }

    /// Whether the pending purge may still be (further) applied early: not started, or some
    /// nodes' batches not purged yet.
    pub(super) fn early_open(&self) -> bool {
        self.early.as_ref().is_none_or(|e| !e.is_done())
    }

    /// Whether an allocation at `addr` shows a pending purge already at work in the kernel:
    /// it reuses a range the model still holds lazy.
    pub(super) fn reuse_shows_purge(&self, addr: u64, size: u64) -> bool {
        (self.drain_pending || self.early.is_some())
            && self.early_open()
            && self.lazy_overlaps(addr, size)
    }

    /// The trace showed a pending purge's effect before its event: start it now (decay, fix
    /// every node's batch), unless the drain item that runs the coming purge event is known
    /// (read ahead) and has not started yet. Then the kernel has not purged: the lower backlog
    /// or the reused lazy range has another cause (a diverged state), and purging now would
    /// move a whole batch of frees to the wrong purge, which every later `nr_lazy` and
    /// `npurged` comparison would inherit. False when refused.
    pub(super) fn start_early(&mut self, ahead: &dyn DrainLookup) -> bool {
        if self.early.is_some() {
            return true;
        }
        let item = ahead
            .next_purge()
            .and_then(|(pid, ts)| ahead.drain_holding(pid, ts));
        if item.is_some_and(|d| self.last_ts < d.start_ns) {
            self.drain_work.early_refused += 1;
            return false;
        }
        self.early_lazy_before = Some(self.model.lazy().objects());
        self.early_is_split = false;
        let limit = ahead
            .next_npurged()
            .map(|n| n.saturating_sub(self.foreign_lazy) as usize);
        self.early = Some(self.model.purge_start(false, limit));
        self.early_purges += 1;
        true
    }

    /// Purges `nodes` of the early purge (every remaining one when `None`), and the nodes
    /// whose batch is empty (the kernel runs no `purge_vmap_node` for them).
    pub(super) fn purge_early_nodes(&mut self, nodes: Option<Vec<u32>>) {
        let Some(mut e) = self.early.take() else {
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
        self.recent_frees.clear();
        if !e.is_done() && !self.early_is_split {
            // Not the whole purge at one point: one node finished before the other.
            self.early_is_split = true;
            self.early_split += 1;
        }
        self.early = Some(e);
    }

    /// A free reported `dropped` pages less backlog than the model holds: the kernel's purge
    /// has finished `purge_vmap_node` on some nodes, each subtracting its own batch. Purge the
    /// nodes whose batches add up to exactly `dropped` (the kernel subtracts per node, so a
    /// free between two nodes' ends sees only the first node's decrement); when no set of nodes
    /// does, the whole purge, as before.
    pub(super) fn purge_early_dropped(&mut self, dropped: u64, ahead: &dyn DrainLookup) {
        if !self.start_early(ahead) {
            return;
        }
        let Some(e) = &self.early else { return };
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
            let Some(mut e) = self.early.take() else {
                return;
            };
            let one = nodes
                .iter()
                .find(|&&(n, _)| self.model.purge_node_pages(&mut e, n, dropped));
            if one.is_some() {
                self.recent_frees.clear();
                if !e.is_done() && !self.early_is_split {
                    self.early_is_split = true;
                    self.early_split += 1;
                }
                part = Some(Vec::new());
            }
            self.early = Some(e);
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
    pub(super) fn purge_early_reused(&mut self, ahead: &dyn DrainLookup) {
        if self.start_early(ahead) {
            // The reuse shows a node's loop under way, not ended: its pages leave the backlog
            // at the drop a later free reports, or at the event, not at the reuse, which the
            // kernel's `purge_vmap_node` subtracts only after its loop.
            let from = self.early.as_ref().map_or(0, |e| e.so_far().batch.len());
            self.model.defer_subtraction(true);
            self.purge_early_nodes(None);
            self.model.defer_subtraction(false);
            self.loop_progress(from, ahead);
        }
    }

    /// `purge_vmap_node` pushes its node's batch into the pools one area at a time, in address
    /// order, node after node (the drain worker runs them itself below two full backlogs), from
    /// right after the TLB flush; the model has just pushed the batch entries from `from` on at
    /// once. The pooled ones the loops had not reached by now are withheld until their time,
    /// at one pace from the flush to the purge event. An allocation in the meantime finds the
    /// pools as the loops left them, which spares wrong pool hits and the hiding they would
    /// lead to. Half or twice that pace predicts worse. The exact entry the kernel takes
    /// mid-loop still differs often: its pace jitters by more than the gap between two areas
    /// (about 90 ns).
    pub(super) fn loop_progress(&mut self, from: usize, ahead: &dyn DrainLookup) {
        let (Some(e), Some(flush), Some((_, end))) = (
            self.early.as_ref(),
            self.detach.as_ref().and_then(|d| d.flush),
            ahead.next_purge(),
        ) else {
            return;
        };
        let batch = &e.so_far().batch;
        let Some(fresh) = batch.get(from..).filter(|b| !b.is_empty()) else {
            return;
        };
        if end <= flush {
            return;
        }
        let mut order: Vec<(u32, u64, u64)> = fresh
            .iter()
            .map(|p| (p.node, p.addr, p.area.size))
            .collect();
        order.sort_unstable();
        let per_area = (end - flush) / order.len() as u64;
        let now = self.last_ts;
        for (i, &(node, addr, size)) in order.iter().enumerate() {
            let at = flush.saturating_add((i as u64 + 1).saturating_mul(per_area));
            if at > now && self.model.withhold_pooled(addr, size, node) {
                self.loop_pending.push_back((at, node, addr, size));
                self.loop_withheld += 1;
            }
        }
    }

    /// Pushes the withheld loop entries whose time has come by `ts` (all with `u64::MAX`).
    pub(super) fn loop_advance(&mut self, ts: u64) {
        while let Some(&(at, node, addr, size)) = self.loop_pending.front() {
            if at > ts {
                break;
            }
            self.loop_pending.pop_front();
            self.model.restore_pooled(node, size, &[addr]);
        }
    }

    /// The kernel took `addr`: if the loops' pace had not reached it, they had, and every
    /// entry before it is pushed now.
    pub(super) fn loop_catch_up(&mut self, addr: u64) {
        let Some(i) = self.loop_pending.iter().position(|&(_, _, a, _)| a == addr) else {
            return;
        };
        self.loop_caught_up += 1;
        for (_, node, a, size) in self.loop_pending.drain(..=i) {
            self.model.restore_pooled(node, size, &[a]);
        }
    }
}

/// Every non-empty set of `nodes` (`(node, batch pages)`) as a bit mask over their indices,
/// with its pages; none when there are too many nodes to try every set.
pub(in crate::replay) fn node_sets(nodes: &[(u32, u64)]) -> impl Iterator<Item = (u32, u64)> + '_ {
    let sets = if nodes.len() > 16 {
        0
    } else {
        1u32 << nodes.len()
    };
    (1u32..sets).map(move |mask| {
        let sum = (0..nodes.len())
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| nodes[i].1)
            .sum();
        (mask, sum)
    })
}

/// The nodes among `(node, batch pages)` whose pages add up to exactly `pages`: the smallest
/// such set (the lowest node ids among equals), or `None` when none does or there are too many
/// nodes to try every set.
pub(in crate::replay) fn nodes_summing_to(nodes: &[(u32, u64)], pages: u64) -> Option<Vec<u32>> {
    node_sets(nodes)
        .filter(|&(_, sum)| sum == pages)
        .map(|(mask, _)| mask)
        .min_by_key(|mask| (mask.count_ones(), *mask))
        .map(|mask| {
            (0..nodes.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| nodes[i].0)
                .collect()
        })
}
