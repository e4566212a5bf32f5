//! The order of additions to `vmap_lazy_nr` (docs/inference.md, "Add order"): two CPUs' frees
//! add their pages in one order and may emit their events in the other, so a free's backlog
//! can hold a neighbour's pages or lack them. Explained figures only.
//!
//! - **Observes** a free's reported `nr_lazy` against the model's, and the frees around it.
//! - **Infers** that the difference is the pages of frees within the span on either side, and
//!   counts the free as agreeing.
//! - **Parameters**: `InferenceParams::add_order_span`, `InferenceParams::drop_order_span`.
//! - **Counter**: `nr_lazy_reordered`.

use super::super::lookahead::DrainLookup;
use crate::replay::Replayer;

impl Replayer<'_> {
    /// Whether the kernel's order of `vmap_lazy_nr` additions explains a free's `observed`
    /// backlog against the model's `predicted` one. The trace orders frees by their events,
    /// but the backlog a free reports is the return of its `atomic_long_add_return`, which can
    /// come well before its event (a task preempted in between, a lazy-lock wait): the other
    /// CPU's frees meanwhile report a backlog that already includes it, and it reports one
    /// without theirs. Between two purge decrements the counter only grows, so the reported
    /// values themselves give the add order: a free reporting less was added earlier. The
    /// prediction agrees in add order when `observed - predicted` is exactly the pages of the
    /// frees read ahead (up to `span`, before the next purge event) that report
    /// less, the closest below `observed` first, or `predicted - observed` those of the frees
    /// since the model's last purge step that reported more, the closest above first. Only the
    /// closest count: a node's decrement comes before the purge's event, so frees read ahead
    /// past it report far less without having been added earlier, and counting every free that
    /// reported less would leave such reorders unexplained. Counted as agreement
    /// (`nr_lazy_reordered` says how often).
    pub(in crate::replay) fn add_order_explains(
        &self,
        observed: u64,
        predicted: u64,
        ahead: &dyn DrainLookup,
        span: usize,
    ) -> bool {
        if !self.opts.rule_on(super::Rule::AddOrder) {
            return observed == predicted;
        }
        let page = self.model.params().page_size;
        match observed.cmp(&predicted) {
            std::cmp::Ordering::Equal => true,
            std::cmp::Ordering::Greater => {
                let mut earlier: Vec<(u64, u64)> = ahead
                    .frees_ahead(span)
                    .into_iter()
                    .filter(|&(_, nr)| nr < observed)
                    .map(|(va, nr)| (nr, self.model.busy().get(&va).map_or(0, |b| b.size / page)))
                    .collect();
                // Closest to this free's add first: a free read ahead that reports far less
                // came after a purge's decrement (before its event), not before this add.
                earlier.sort_unstable_by_key(|&(nr, _)| std::cmp::Reverse(nr));
                prefix_sums_reach(
                    earlier.iter().map(|&(_, pages)| pages),
                    observed - predicted,
                )
            }
            std::cmp::Ordering::Less => {
                let mut later: Vec<(u64, u64)> = self
                    .rules
                    .recent_frees
                    .iter()
                    .rev()
                    .take(span)
                    .copied()
                    .filter(|&(nr, _)| nr > observed)
                    .collect();
                later.sort_unstable();
                prefix_sums_reach(later.iter().map(|&(_, pages)| pages), predicted - observed)
            }
        }
    }
}

/// Whether some prefix of `pages` adds up to exactly `want`.
fn prefix_sums_reach(pages: impl Iterator<Item = u64>, want: u64) -> bool {
    let mut sum = 0;
    for p in pages {
        sum += p;
        if sum == want {
            return true;
        }
        if sum > want {
            return false;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_prefix_of_the_closest_frees_explains_a_difference() {
        assert!(prefix_sums_reach([2, 3, 4].into_iter(), 5));
        assert!(prefix_sums_reach([2, 3, 4].into_iter(), 2));
        assert!(
            !prefix_sums_reach([2, 3, 4].into_iter(), 6),
            "2 + 4 skips the 3"
        );
        assert!(!prefix_sums_reach([2, 3, 4].into_iter(), 10));
        assert!(!prefix_sums_reach(std::iter::empty(), 1));
    }
}
