//! The `work_start` batch prediction, causal replay only (docs/inference.md, "`work_start`
//! batch prediction").
//!
//! - **Observes** the `work_start` record of a drain item as it happens (trace format 2), and
//!   the frees after it.
//! - **Infers** the batch of the purge that item runs: what was lazy at its start (the kernel
//!   detaches every node's lazy list right after), plus the frees predicted on their node's
//!   list before its detach (`Detach::at` from the start, with the default delay and step).
//! - **Parameters**: `ReplayOptions::detach_delay_ns`, `ReplayOptions::detach_step_ns`.
//! - **Counter**: none of its own; it is the strict `npurged` prediction.

use crate::replay::Replayer;

impl Replayer<'_> {
    /// A drain item of task `pid` started at `ts`: what is lazy now is its batch, less the
    /// frees that race the detach.
    pub(in crate::replay) fn work_start_seen(&mut self, pid: u32, ts: u64) {
        if self.rules.item_start.is_none() {
            let lazy = self.model.lazy().objects() + self.rules.foreign_lazy as usize;
            self.rules.item_start = Some((pid, ts, lazy));
        }
    }

    /// A free on `node` at `ts` after the item's start joins the predicted batch when it comes
    /// before that node's predicted detach.
    pub(in crate::replay) fn work_start_free(&mut self, node: u32, ts: u64) {
        if let Some((_, start, n)) = self.rules.item_start.as_mut() {
            let at = start
                .saturating_add(self.opts.detach_delay_ns)
                .saturating_add(u64::from(node) * self.opts.detach_step_ns);
            if ts < at {
                *n += 1;
            }
        }
    }

    /// The predicted batch of a purge event of task `pid`, when its item's start was seen;
    /// the prediction is used up either way.
    pub(in crate::replay) fn work_start_batch(&mut self, pid: u32) -> Option<usize> {
        match self.rules.item_start.take() {
            Some((p, _, lazy)) if p == pid => Some(lazy),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::replay::testkit::{lazy_areas, replayer};
    use crate::replay::ReplayOptions;

    /// The batch is what was lazy at the item's start plus the frees before each node's
    /// predicted detach; it belongs to the item's task only, and is used once.
    #[test]
    fn the_batch_is_the_lazy_areas_at_the_start_and_the_frees_before_the_detach() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        lazy_areas(&mut r, 3, 2);
        r.work_start_seen(7, 1_000);
        r.work_start_seen(7, 2_000);
        let node0 = 1_000 + opts.detach_delay_ns;
        r.work_start_free(0, node0 - 1);
        r.work_start_free(0, node0);
        r.work_start_free(1, node0 + opts.detach_step_ns - 1);
        assert_eq!(r.work_start_batch(8), None, "another task's purge");
        r.work_start_seen(7, 1_000);
        r.work_start_free(0, node0 - 1);
        r.work_start_free(1, node0 + opts.detach_step_ns - 1);
        assert_eq!(r.work_start_batch(7), Some(3 + 2));
        assert_eq!(r.work_start_batch(7), None, "used up");
    }
}
