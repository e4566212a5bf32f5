//! Frees that race a purge's detach (docs/inference.md, "Frees that join the batch" and "Late
//! joins").
//!
//! - **Observes** the purge's `npurged` (read ahead) against the areas lazy at the drain item's
//!   start, and the frees after that start with the backlogs they report.
//! - **Infers** which of those frees were on their node's lazy list before its detach, and
//!   joins them to that node's batch; a free whose event follows the purge event that took it
//!   joins that batch late.
//! - **Parameters**: `InferenceParams::join_span`.
//! - **Counter**: `purged_late` in the replay report (areas added late, with the top-up's).

use crate::replay::lookahead::DrainLookup;
use crate::replay::Replayer;

impl Replayer<'_> {
    /// Top-up at the event: the batch came out smaller than the kernel's `npurged`
    /// (`in_model`, the areas outside the model left out): a free that was to join it went to a
    /// node already purged. The oldest lazy areas make up the count.
    pub(in crate::replay) fn top_up(&mut self, got: &mut crate::model::Purged, in_model: u32) {
        if got.npurged >= in_model {
            return;
        }
        let more = self
            .model
            .purge_late_oldest((in_model - got.npurged) as usize);
        self.rules.late_purged += u64::from(more.npurged);
        got.npurged += more.npurged;
        got.pages += more.pages;
        got.pooled += more.pooled;
        got.to_free_tree += more.to_free_tree;
        got.batch.extend(more.batch);
    }

    /// Which frees after the start join the purge's batches. The kernel took `npurged` areas:
    /// what was lazy at the start, and the frees whose list insertions beat their node's
    /// detach. Without more, those are the next frees in order; with the item's times, the
    /// frees read ahead are ranked by how long before their node's predicted detach
    /// ([`Detach::at`]) their events came, and the first ones join, node by node
    /// (`joins_left`; applied in `free`).
    pub(in crate::replay) fn plan_joins(
        &mut self,
        p: &mut crate::model::PurgeInProgress,
        ahead: &dyn DrainLookup,
    ) {
        if !self.opts.rule_on(super::Rule::Joins) {
            return;
        }
        self.rules.joins_left.clear();
        let want = p.joiners();
        let nodes = self.model.params().layout.nr_nodes();
        // From the start alone the detach is too loose a guess to beat free order: ranking by
        // it mispredicts more backlogs than taking the next frees in order.
        let Some(d) = self
            .rules
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
        self.rules.joins_left = vec![0; nodes as usize];
        for &(_, node) in ranked.iter().take(want) {
            if let Some(n) = self.rules.joins_left.get_mut(node as usize) {
                *n += 1;
            }
        }
        p.hold_joins();
    }

    /// A purge's batch came out short of the kernel's `npurged` with no lazy area left in the
    /// model to make it up: some area the kernel purged had not reached the model yet. In
    /// `free_vmap_area_noflush` the free adds its pages to `vmap_lazy_nr` and inserts its area
    /// in the lazy tree before its tracepoint fires, so a vCPU descheduled in between sends its
    /// free's event after a purge that took the area (4 ms later on a test_vmalloc recording
    /// in the 4-vCPU TCG guest). Such a free shows it: the `nr_lazy` it reports still holds
    /// the purge's pages (at least those pages plus its own), while the model's backlog before
    /// it is below them. Its area joins the purge's batch; without that it stayed lazy in the
    /// model through every later purge (each takes exactly `npurged` areas), and every later
    /// free reported a backlog one area below the model's.
    pub(in crate::replay) fn join_owed(
        &mut self,
        addr: u64,
        size: u64,
        predicted: u64,
        reported: u64,
    ) {
        if !self.opts.rule_on(super::Rule::Joins) {
            return;
        }
        let Some((left, pages)) = self.rules.owed_joins.as_mut() else {
            return;
        };
        let own = size / self.model.params().page_size;
        let before = predicted.saturating_sub(own);
        if reported < *pages + own || before >= *pages {
            return;
        }
        if let Some(area) = self.model.purge_late_area(addr) {
            self.rules.late_purged += 1;
            self.rules.last_batch.push(area);
            *left -= 1;
        }
        if *left == 0 {
            self.rules.owed_joins = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::replay::testkit::{trace, with_late_free};
    use crate::replay::{replay, ReplayOptions};

    /// `join_owed`: a free whose event comes after the purge that took its area joins that
    /// purge's batch when its `nr_lazy` still holds the purge's pages, and the backlog agrees
    /// on every later free as on the trace in order. The same free reporting a backlog from
    /// after the subtraction does not join: the area stays lazy in the model through every
    /// later purge, and the later frees disagree.
    #[test]
    fn a_free_whose_event_follows_the_purge_that_took_it_joins_that_batch() {
        let opts = ReplayOptions::default();
        let plain = replay(&trace()[..], &opts).expect("replay");
        let joined = replay(&with_late_free(true)[..], &opts).expect("replay");
        let stuck = replay(&with_late_free(false)[..], &opts).expect("replay");
        assert_eq!(plain.strict.nr_lazy.agreed, plain.strict.nr_lazy.compared);
        // The moved free itself reports the backlog before the purge: one miss.
        assert_eq!(
            joined.strict.nr_lazy.agreed + 1,
            joined.strict.nr_lazy.compared
        );
        // Its purge is predicted one area short (the model had not seen the free), no other.
        assert_eq!(
            joined.strict.npurged.agreed + 1,
            plain.strict.npurged.agreed
        );
        assert!(
            stuck.strict.nr_lazy.agreed + 10 < joined.strict.nr_lazy.agreed,
            "{:?} against {:?}",
            stuck.strict.nr_lazy,
            joined.strict.nr_lazy
        );
    }
}
