//! Pool skips (docs/inference.md, "Pool skips").
//!
//! - **Observes** the kernel taking an entry from the model's pool for the request, below the
//!   pool's head: the model's pool holds entries ahead of the kernel's pick.
//! - **Infers**, on the second such pick that skips the same entries, that the kernel's pool
//!   did not have them on top, and hides them (kept apart so that, if the kernel takes one,
//!   the rest come back in order). A single skip is as likely the kernel's own batch putting
//!   the pick on top.
//! - **Parameters**: none.
//! - **Counter**: `hidden_ranges` (with the other hiding rules).

use crate::model::{Allocated, Placement};
use crate::replay::{HiddenPool, Replayer};

impl Replayer<'_> {
    /// Entries the model's pool holds ahead of the kernel's pick at `addr`, when the model
    /// predicted a pool hit and the kernel took `addr` from the same pool.
    pub(in crate::replay) fn entries_ahead_of_pick(
        &self,
        predicted: Option<&Allocated>,
        node: u32,
        size: u64,
        addr: u64,
    ) -> Vec<u64> {
        match predicted {
            Some(g) if g.placement == Placement::Pool => {
                let pool = self.model.pools();
                if pool.entries(node, size).any(|s| s == addr) {
                    pool.entries(node, size)
                        .take_while(|&s| s != addr)
                        .collect()
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        }
    }

    /// The kernel's pool pick skipped `ahead_of_pick`: remembered, and on the second pick that
    /// skips the same entries, those are hidden.
    pub(in crate::replay) fn pool_skip_seen(
        &mut self,
        node: u32,
        size: u64,
        ahead_of_pick: Vec<u64>,
    ) {
        if !self.opts.rule_on(super::Rule::PoolSkip) {
            return;
        }
        let confirmed = self
            .rules
            .pool_skip
            .as_ref()
            .is_some_and(|(n, z, prev)| *n == node && *z == size && *prev == ahead_of_pick);
        if confirmed {
            for &s in &ahead_of_pick {
                if self.model.hide(s, size, node) {
                    self.rules.hidden += 1;
                }
            }
            // They may only sit lower in the kernel's pool (two areas its batch put on top):
            // if the kernel takes one, the rest come back in order, so that a cascade of
            // unhides becomes a few misses. Kept out of the pools put back before a decay,
            // where they mispredict random-size workloads.
            self.rules.hidden_pools.push(HiddenPool {
                node,
                size,
                entries: ahead_of_pick,
                back_before_decay: false,
            });
            self.rules.pool_skip = None;
        } else {
            self.rules.pool_skip = Some((node, size, ahead_of_pick));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::replay::testkit::{pooled_areas, replayer, request, PAGE};
    use crate::replay::ReplayOptions;

    /// One skip is remembered; the second skip of the same entries hides them.
    #[test]
    fn the_second_skip_of_the_same_entries_hides_them() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        let addrs = pooled_areas(&mut r, 3, 1);
        let req = request(&r, 1, 0);
        let predicted = r.model.alloc(&req).unwrap().unwrap();
        r.model.undo_alloc(&predicted).unwrap();
        assert_eq!(predicted.addr, addrs[2], "the head");
        let ahead = r.entries_ahead_of_pick(Some(&predicted), 0, PAGE, addrs[0]);
        assert_eq!(ahead, vec![addrs[2], addrs[1]]);
        r.pool_skip_seen(0, PAGE, ahead.clone());
        assert_eq!(r.model.pools().len(0, PAGE), 3, "one skip hides nothing");
        r.pool_skip_seen(0, PAGE, ahead);
        assert_eq!(r.model.pools().len(0, PAGE), 1, "the second does");
        assert_eq!(r.rules.hidden, 2);
        assert!(r.rules.pool_skip.is_none());
        r.model.check_invariants().unwrap();
    }
}
