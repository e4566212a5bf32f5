//! A purge's batch against the backlog it left (docs/inference.md, "Batch reconciliation" and
//! "Shift between nodes").
//!
//! - **Observes** the backlog the first free after a purge reports against the model's.
//! - **Infers** by how many pages the kernel's batch differed from the model's, and which newest
//!   lazy and batch areas to trade (`TrackedModel::swap_purged_sized`), within a node or between
//!   two nodes.
//! - **Parameters**: `InferenceParams::reconcile_span`, `InferenceParams::shift_span`.
//! - **Counters**: `batches_reconciled`, `batches_shifted` in the replay report.

use crate::replay::lookahead::DrainLookup;
use crate::replay::Replayer;

impl Replayer<'_> {
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
    pub(in crate::replay) fn reconcile_batch(
        &mut self,
        got: &mut crate::model::Purged,
        ahead: &dyn DrainLookup,
    ) {
        if !self.opts.rule_on(super::Rule::Reconcile) {
            return;
        }
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
                    self.rules.reconciled += 1;
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
            self.rules.shifted += 1;
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
    pub(in crate::replay) fn shift_between_nodes(
        &mut self,
        got: &mut crate::model::Purged,
        delta: i64,
    ) -> bool {
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
}

#[cfg(test)]
mod tests {
    use crate::replay::testkit::{replayer, request, Ahead};
    use crate::replay::ReplayOptions;

    /// The first free after the purge event, read ahead: `(va_start, nr_lazy)`.
    fn next_free(va: u64, nr_lazy: u64) -> Ahead {
        Ahead {
            frees: vec![(va, nr_lazy)],
            ..Ahead::default()
        }
    }

    /// The model's purge took the older, 1-page area where the kernel's took the newer, 3-page
    /// one (right count, other areas): the next free's backlog is 2 pages below the model's,
    /// and the two areas are swapped. A backlog that matches changes nothing.
    #[test]
    fn a_batch_that_left_other_pages_lazy_swaps_the_areas_that_explain_it() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        let small = r.model.alloc(&request(&r, 1, 0)).unwrap().unwrap().addr;
        let big = r.model.alloc(&request(&r, 3, 0)).unwrap().unwrap().addr;
        let next = r.model.alloc(&request(&r, 1, 0)).unwrap().unwrap().addr;
        r.model.free(small).unwrap();
        r.model.free(big).unwrap();
        let mut got = r.model.purge_oldest(false, 1);
        assert_eq!(r.model.lazy_pages(), 3, "the model left the big one");
        r.reconcile_batch(&mut got, &next_free(next, 3 + 1));
        assert_eq!(r.rules.reconciled, 0, "the kernel left as many pages");
        r.reconcile_batch(&mut got, &next_free(next, 1 + 1));
        assert_eq!(r.rules.reconciled, 1);
        assert_eq!(r.model.lazy_pages(), 1, "the small one is lazy now");
        assert!(r.model.lazy().find(small).is_some());
        assert_eq!(got.batch.len(), 1);
        assert_eq!(got.batch[0].addr, big, "and the batch holds the big one");
        r.model.check_invariants().unwrap();
    }
}
