//! The pace of `purge_vmap_node`'s loops (docs/inference.md, "Purge-loop pacing").
//!
//! - **Observes** the drain item's TLB flush and the purge event (read ahead).
//! - **Infers** when each pooled entry of the batch reached its pool, at one pace from the flush
//!   to the event, and withholds the entries the loops had not reached yet; an allocation of one
//!   of them shows the loops had, and every entry before it is pushed then.
//! - **Parameters**: none.
//! - **Counters**: `loop_entries_withheld`, `loop_entries_caught_up` in the replay report.

use crate::replay::lookahead::DrainLookup;
use crate::replay::Replayer;

impl Replayer<'_> {
    /// `purge_vmap_node` pushes its node's batch into the pools one area at a time, in address
    /// order, node after node (the drain worker runs them itself below two full backlogs), from
    /// right after the TLB flush; the model has just pushed the batch entries from `from` on at
    /// once. The pooled ones the loops had not reached by now are withheld until their time,
    /// at one pace from the flush to the purge event. An allocation in the meantime finds the
    /// pools as the loops left them, which spares wrong pool hits and the hiding they would
    /// lead to. Half or twice that pace predicts worse. The exact entry the kernel takes
    /// mid-loop still differs often: its pace jitters by more than the gap between two areas
    /// (about 90 ns).
    pub(in crate::replay) fn loop_progress(&mut self, from: usize, ahead: &dyn DrainLookup) {
        if !self.opts.rule_on(super::Rule::LoopPacing) {
            return;
        }
        let (Some(e), Some(flush), Some((_, end))) = (
            self.rules.early.as_ref(),
            self.rules.detach.as_ref().and_then(|d| d.flush),
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
                self.rules.loop_pending.push_back((at, node, addr, size));
                self.rules.loop_withheld += 1;
            }
        }
    }

    /// Pushes the withheld loop entries whose time has come by `ts` (all with `u64::MAX`).
    pub(in crate::replay) fn loop_advance(&mut self, ts: u64) {
        while let Some(&(at, node, addr, size)) = self.rules.loop_pending.front() {
            if at > ts {
                break;
            }
            self.rules.loop_pending.pop_front();
            self.model.restore_pooled(node, size, &[addr]);
        }
    }

    /// The kernel took `addr`: if the loops' pace had not reached it, they had, and every
    /// entry before it is pushed now.
    pub(in crate::replay) fn loop_catch_up(&mut self, addr: u64) {
        let Some(i) = self
            .rules
            .loop_pending
            .iter()
            .position(|&(_, _, a, _)| a == addr)
        else {
            return;
        };
        self.rules.loop_caught_up += 1;
        for (_, node, a, size) in self.rules.loop_pending.drain(..=i) {
            self.model.restore_pooled(node, size, &[a]);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::replay::testkit::{pooled_areas, replayer, PAGE};
    use crate::replay::ReplayOptions;

    /// Withheld pool entries come back when their time comes, and all at once up to one the
    /// kernel is seen taking: the loops had reached it.
    #[test]
    fn withheld_entries_come_back_on_time_or_when_the_kernel_takes_one() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        let addrs = pooled_areas(&mut r, 4, 1);
        for (i, &a) in addrs[1..].iter().enumerate() {
            assert!(r.model.withhold_pooled(a, PAGE, 0));
            r.rules
                .loop_pending
                .push_back((100 * (i as u64 + 1), 0, a, PAGE));
        }
        assert_eq!(r.model.pools().len(0, PAGE), 1);
        r.loop_advance(150);
        assert_eq!(r.model.pools().len(0, PAGE), 2, "the first one's time came");
        assert_eq!(r.model.pools().head(0, PAGE), Some(addrs[1]));
        r.loop_catch_up(addrs[3]);
        assert_eq!(
            r.model.pools().len(0, PAGE),
            4,
            "the kernel took the last one"
        );
        assert_eq!((r.rules.loop_caught_up, r.rules.loop_pending.len()), (1, 0));
        r.loop_catch_up(addrs[3]);
        assert_eq!(r.rules.loop_caught_up, 1, "nothing withheld any more");
        assert!(r.model.hidden().is_empty());
        r.model.check_invariants().unwrap();
    }
}
