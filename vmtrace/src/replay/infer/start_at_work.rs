//! A purge started at its drain item, and its pools decayed node by node (docs/inference.md,
//! "Purge started at its drain item" and "Decay node by node").
//!
//! - **Observes** the `work` record of the drain item that ran the coming purge event (read
//!   ahead: the kernel writes it after the item), its start, TLB-flush time and decay times.
//! - **Infers** that the kernel decayed the pools and detached the lazy lists from the item's
//!   start, and cuts each node's pools when the kernel's clock says that node's decay began.
//! - **Parameters**: the detach step fitted by `StepFit` (`replay/infer/detach.rs`).
//! - **Counter**: `purges_started_at_work` in the replay report.

use super::detach::Detach;
use crate::model::{AllocRequest, ModelError, Placement};
use crate::replay::lookahead::DrainLookup;
use crate::replay::Replayer;

impl Replayer<'_> {
    /// The kernel placed an area in a range whose decay the model still holds under way: the
    /// kernel's decay of that node had ended already. The decays holding it end now, each
    /// followed by the claim tried again; the last claim, or None when no decay held it.
    pub(in crate::replay) fn end_decays_holding(
        &mut self,
        req: &AllocRequest,
        addr: u64,
    ) -> Option<Result<Placement, ModelError>> {
        let mut claimed = None;
        while let (Some(node), Some(p)) = (
            self.model.decaying_holding(addr, req.size),
            self.rules.early.as_mut(),
        ) {
            self.model.decay_end(p, node);
            claimed = Some(self.model.claim(req, addr));
        }
        claimed
    }

    /// The drain work item that runs the coming purge event started before `ts`: the kernel
    /// decayed the pools and detached the lazy lists right after (`__purge_vmap_area_lazy`
    /// begins with them), so events from here on see the decayed pools and their frees go to
    /// the next batch. Starts the model's purge there.
    pub(in crate::replay) fn start_at_work(&mut self, ts: u64, ahead: &dyn DrainLookup) {
        if !self.opts.rule_on(super::Rule::WorkStart) {
            return;
        }
        self.decay_due(ts);
        if self.rules.early.is_some() || self.pending_failure.is_some() {
            return;
        }
        let Some(event) = ahead.next_purge() else {
            return;
        };
        // Looked up once per purge event, not on every allocation and free before it (a miss
        // is asked again: the item's record may not have been read ahead yet).
        let item = match self.rules.next_item {
            Some((e, item)) if e == event => item,
            _ => {
                let Some(item) = ahead.drain_holding(event.0, event.1) else {
                    return;
                };
                self.rules.next_item = Some((event, item));
                item
            }
        };
        let start = item.start_ns;
        if start > ts || start < self.last_purge_ts {
            return;
        }
        self.restore_hidden_pools();
        self.rules.early_lazy_before = Some(self.model.lazy().objects());
        let d = Detach {
            start,
            flush: item.flush_ns.filter(|&f| f >= start),
            decays: ahead.decays_in(&item),
            step: self.rules.step_fit.step(),
        };
        self.rules.start_lazy = self.rules.early_lazy_before;
        self.rules.detach_frees.clear();
        self.rules.detach = Some(d);
        self.rules.early_is_split = false;
        let limit = ahead
            .next_npurged()
            .map(|n| n.saturating_sub(self.rules.foreign_lazy) as usize);
        // Every node's decay follows the kernel's clock (`decay_due`): its pools are cut right
        // after the previous node's detach (node 0: at the start), and the cut entries reach
        // the free tree at its own detach. Decaying every node at the start cuts a later
        // node's pool from the wrong length, and freeing the cut entries at once offers the
        // free tree space the kernel has not merged back yet; both mispredict placements.
        let mut early = self.model.purge_start_deferring(limit);
        self.plan_joins(&mut early, ahead);
        self.rules.early = Some(early);
        self.rules.work_starts += 1;
        self.decay_due(ts);
    }

    /// Decays the pools of the started purge's nodes whose decay time has come by `ts`.
    pub(in crate::replay) fn decay_due(&mut self, ts: u64) {
        let (Some(p), Some(d)) = (self.rules.early.as_mut(), self.rules.detach.as_ref()) else {
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
}

#[cfg(test)]
mod tests {
    use crate::replay::testkit::{lazy_areas, one_drain, replayer};
    use crate::replay::ReplayOptions;

    /// The model's purge starts at the first event after the drain item's start, and only
    /// then; with the purge's `npurged` read ahead as its batch.
    #[test]
    fn the_purge_starts_at_the_first_event_after_its_drain_item() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        lazy_areas(&mut r, 3, 2);
        let ahead = one_drain(1_000, 5_000, 2);
        r.start_at_work(999, &ahead);
        assert!(r.rules.early.is_none(), "the item has not started");
        r.start_at_work(1_200, &ahead);
        assert_eq!(r.rules.work_starts, 1);
        let early = r.rules.early.as_ref().expect("started");
        assert_eq!(
            r.model.lazy().objects(),
            3,
            "no area leaves before its node's loop"
        );
        let finished = r.model.purge_finish(early.clone());
        assert_eq!(finished.npurged, 2, "the batch is npurged's oldest areas");
        r.start_at_work(1_300, &ahead);
        assert_eq!(r.rules.work_starts, 1, "one start per purge");
    }

    /// An item that started before the last purge event cannot hold the coming one.
    #[test]
    fn an_item_from_before_the_last_purge_starts_nothing() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        lazy_areas(&mut r, 3, 2);
        r.last_purge_ts = 2_000;
        let ahead = one_drain(1_000, 5_000, 2);
        r.start_at_work(3_000, &ahead);
        assert!(r.rules.early.is_none());
        assert_eq!(r.rules.work_starts, 0);
    }
}
