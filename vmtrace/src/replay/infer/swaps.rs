//! Purge swaps (docs/inference.md, "Purge swaps").
//!
//! - **Observes** the kernel allocating exactly an area the model still holds lazy, with no purge
//!   of it pending.
//! - **Infers** that the kernel's last purge took it and left lazy one the model's purge took
//!   (the detach race), and trades it for the newest area of the same size in the recent
//!   batches, then in each older one.
//! - **Parameters**: `InferenceParams::older_batches`.
//! - **Counters**: `purge_swaps`, `purge_swaps_older` in the replay report.

use std::collections::VecDeque;

use crate::replay::Replayer;

impl Replayer<'_> {
    /// The kernel allocated exactly an area the model still holds lazy, with no purge of it
    /// pending: the kernel's last purge took it, and left lazy one the model's purge took (the
    /// detach race: the kernel detaches the nodes' lazy lists one after another, while the
    /// model's batch follows free order). Swaps it for the newest area of the same size in the
    /// model's last batch (the in-progress early purge's included) that is still pooled or
    /// free, so the model's lazy set follows the kernel's from here on; without the swap the
    /// area stayed outside the model, and its free went missing from every later backlog.
    pub(in crate::replay) fn swap_purged(&mut self, addr: u64, size: u64) -> bool {
        if !self.opts.rule_on(super::Rule::Swaps) {
            return false;
        }
        // The kernel may reuse the start of the purged area for a smaller one (a 9-page area
        // reused for 8 pages): the swap is by the lazy area's size, or every free until the
        // next purge disagrees.
        let size = match self.model.lazy().find(addr) {
            Some((_, a)) if a.size >= size => a.size,
            _ => return false,
        };
        let in_progress = self
            .rules
            .early
            .as_ref()
            .map(|e| e.so_far().batch.as_slice());
        let recent = self
            .rules
            .last_batch
            .iter()
            .chain(&self.rules.prev_batch)
            .chain(in_progress.unwrap_or_default());
        let model = &mut self.model;
        let Some((older, c)) = swap_candidates(recent, &self.rules.older_batches, size)
            .find(|(_, c)| model.swap_purged(addr, c))
        else {
            return false;
        };
        self.rules.last_batch.retain(|p| p.addr != c.addr);
        self.rules.prev_batch.retain(|p| p.addr != c.addr);
        if let Some(i) = older {
            self.rules.older_batches[i].retain(|p| p.addr != c.addr);
            self.rules.swapped_older += 1;
        }
        true
    }
}

/// The purged areas of `size` that [`Replayer::swap_purged`] tries, in order: those of the last
/// two batches (and the purge in progress), newest first, then those of each older batch in
/// turn (with its index in `older`), newest first. The older ones are a last resort: a reused
/// area can have its counterpart only there, and without it every free until the next purge
/// disagrees.
pub(in crate::replay) fn swap_candidates<'a>(
    recent: impl Iterator<Item = &'a crate::model::PurgedArea>,
    older: &'a VecDeque<Vec<crate::model::PurgedArea>>,
    size: u64,
) -> impl Iterator<Item = (Option<usize>, crate::model::PurgedArea)> + 'a {
    fn newest_first(
        mut v: Vec<(Option<usize>, crate::model::PurgedArea)>,
    ) -> Vec<(Option<usize>, crate::model::PurgedArea)> {
        v.sort_by_key(|(_, p)| std::cmp::Reverse(p.area.seq));
        v
    }
    let first = newest_first(
        recent
            .filter(|p| p.area.size == size)
            .map(|p| (None, *p))
            .collect(),
    );
    // Each older batch is gathered and sorted only when the ones before it had no candidate
    // that fits: when the model has drifted, the batches hold tens of thousands of areas.
    first
        .into_iter()
        .chain(older.iter().enumerate().flat_map(move |(i, batch)| {
            newest_first(
                batch
                    .iter()
                    .filter(|p| p.area.size == size)
                    .map(|p| (Some(i), *p))
                    .collect(),
            )
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_candidates_try_the_recent_batches_first_then_each_older_one() {
        let area = |addr: u64, size: u64, seq: u64| crate::model::PurgedArea {
            addr,
            node: 0,
            area: crate::model::LazyArea { size, tag: 1, seq },
        };
        let recent = [area(1, 8, 5), area(2, 4, 6), area(3, 8, 9)];
        let older: VecDeque<_> = vec![
            vec![area(4, 8, 3), area(5, 4, 4), area(6, 8, 4)],
            vec![area(7, 8, 1)],
        ]
        .into();
        let got: Vec<(Option<usize>, u64)> = swap_candidates(recent.iter(), &older, 8)
            .map(|(i, p)| (i, p.addr))
            .collect();
        assert_eq!(
            got,
            vec![
                (None, 3),
                (None, 1),
                (Some(0), 6),
                (Some(0), 4),
                (Some(1), 7)
            ]
        );
    }
}
