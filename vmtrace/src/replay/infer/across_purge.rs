//! Backlogs read across a purge event (docs/inference.md, "Across a purge's subtraction"): a
//! free soon after a purge event may report a backlog that still holds some nodes' batches, or
//! that lacks the pages of frees added after the subtraction. Explained figures only.
//!
//! - **Observes** a free's reported `nr_lazy` against the model's, the frees since the purge
//!   event and the last purge's batch per node.
//! - **Infers** that the difference is exactly some nodes' batches, or the pages of frees read
//!   ahead, and counts the free as agreeing.
//! - **Parameters**: `InferenceParams::since_purge_span`.
//! - **Counter**: none of its own; `nr_lazy_reordered` counts every free an order rule explained.

use super::super::lookahead::DrainLookup;
use super::{node_sets, nodes_summing_to};
use crate::replay::Replayer;

impl Replayer<'_> {
    /// Whether `observed` exceeds `predicted` by exactly the pages of some nodes' batches in the
    /// last purge: the backlog of a free whose add came before those nodes subtracted. `since`
    /// are the frees between the purge event and this one (observed backlog, pages). Those that
    /// reported less were added after the subtraction, so after this free, and the kernel's
    /// backlog for it lacks their pages, which the model's holds: the difference is looked for
    /// with and without them (a free two after the purge event can report the backlog from
    /// before the subtraction, behind one added after it).
    pub(in crate::replay) fn last_purge_nodes_explain(
        &self,
        observed: u64,
        predicted: u64,
        since: &[(u64, u64)],
    ) -> bool {
        if !self.opts.rule_on(super::Rule::AcrossPurge) {
            return false;
        }
        let later: u64 = since
            .iter()
            .filter(|&&(nr, _)| nr < observed)
            .map(|&(_, pages)| pages)
            .sum();
        let per_node = self.last_batch_per_node();
        [0, later].iter().any(|&l| {
            observed
                .checked_add(l)
                .and_then(|o| o.checked_sub(predicted))
                .is_some_and(|d| d > 0 && nodes_summing_to(&per_node, d).is_some())
        })
    }

    /// The last purge's batch as `(node, pages)`.
    pub(in crate::replay) fn last_batch_per_node(&self) -> Vec<(u32, u64)> {
        let page = self.model.params().page_size;
        let mut per_node: Vec<(u32, u64)> = Vec::new();
        for a in &self.rules.last_batch {
            match per_node.iter_mut().find(|(n, _)| *n == a.node) {
                Some((_, pages)) => *pages += a.area.size / page,
                None => per_node.push((a.node, a.area.size / page)),
            }
        }
        per_node
    }

    /// The other side of [`Replayer::last_purge_nodes_explain`]: a free soon after a purge
    /// event, added after the purge's subtraction, whose backlog exceeds the model's by the
    /// pages of frees read ahead that were added before the subtraction (so before this free).
    /// Those report the backlog from before it, and their adds chain exactly: with `b` the
    /// batches of a set of the purge's nodes, the closest reports `b` more than this free's
    /// backlog without its own `pages`, the next `b` more than that less the closest's pages,
    /// and so on. Anything looser let a steady offset after a purge pass (a free simply next in
    /// order reports more, and less than `b` above). It reads, for instance, the free right
    /// before one that [`Replayer::last_purge_nodes_explain`] reads.
    pub(in crate::replay) fn added_before_across_purge(
        &self,
        observed: u64,
        predicted: u64,
        pages: u64,
        ahead: &dyn DrainLookup,
    ) -> bool {
        if !self.opts.rule_on(super::Rule::AcrossPurge) {
            return false;
        }
        let Some(d) = observed.checked_sub(predicted).filter(|&d| d > 0) else {
            return false;
        };
        let Some(before_own) = observed.checked_sub(pages) else {
            return false;
        };
        let page = self.model.params().page_size;
        let ahead: Vec<(u64, u64)> = ahead
            .frees_ahead(self.opts.infer.since_purge_span)
            .into_iter()
            .filter(|&(_, nr)| nr >= observed)
            .map(|(va, nr)| (nr, self.model.busy().get(&va).map_or(0, |b| b.size / page)))
            .collect();
        let per_node = self.last_batch_per_node();
        let chains = node_sets(&per_node).any(|(_, b)| {
            let (mut want, mut sum) = (before_own, 0u64);
            let mut used = vec![false; ahead.len()];
            while sum < d {
                let Some(k) =
                    (0..ahead.len()).find(|&k| !used[k] && ahead[k].0.checked_sub(b) == Some(want))
                else {
                    return false;
                };
                used[k] = true;
                sum += ahead[k].1;
                let Some(w) = want.checked_sub(ahead[k].1) else {
                    return false;
                };
                want = w;
            }
            sum == d
        });
        chains
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{LazyArea, PurgedArea};
    use crate::replay::testkit::{replayer, PAGE};
    use crate::replay::ReplayOptions;

    fn area(addr: u64, node: u32, pages: u64) -> PurgedArea {
        PurgedArea {
            addr,
            node,
            area: LazyArea {
                size: pages * PAGE,
                tag: node + 1,
                seq: addr,
            },
        }
    }

    /// A backlog above the model's by exactly some nodes' batches in the last purge is a free
    /// added before those nodes subtracted; any other difference is not, and a later free that
    /// reported less (added after the subtraction) is looked through.
    #[test]
    fn a_backlog_above_by_some_nodes_batches_was_added_before_they_subtracted() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        r.rules.last_batch = vec![area(0x1000, 0, 2), area(0x9000, 0, 1), area(0x5000, 1, 5)];
        assert_eq!(r.last_batch_per_node(), vec![(0, 3), (1, 5)]);
        for (diff, explained) in [(3, true), (5, true), (8, true), (4, false), (0, false)] {
            assert_eq!(
                r.last_purge_nodes_explain(100 + diff, 100, &[]),
                explained,
                "{diff} pages above"
            );
        }
        assert!(
            r.last_purge_nodes_explain(104, 100, &[(90, 1)]),
            "4 above, with a 1-page free after the subtraction that reported less"
        );
        assert!(
            !r.last_purge_nodes_explain(104, 100, &[(120, 1)]),
            "that one reported more"
        );
    }
}
