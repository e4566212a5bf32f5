//! Pooled ranges found free (docs/inference.md, "Pooled ranges found free").
//!
//! - **Observes** the kernel placing an area from its free tree over a range the model holds
//!   pooled.
//! - **Infers** that the kernel's pools differ from the model's there (a decay took other
//!   entries, an entry went to the other node's pool), and only the overlapping entries are
//!   known to be free in the kernel: they return to the model's free tree.
//! - **Parameters**: none.
//! - **Counter**: `pooled_found_free` in the replay report.

use crate::replay::Replayer;

impl Replayer<'_> {
    /// The vmap-node shrinker (a full decay of every pool, which emits no event) is not
    /// inferred instead: a random-size workload would infer it hundreds of times and throw
    /// every pool away each time. True when some pooled entry overlapped.
    pub(in crate::replay) fn free_pooled_found_free(&mut self, addr: u64, size: u64) -> bool {
        if !self.model.overlaps_pooled(addr, size) {
            return false;
        }
        self.model.decay_overlapping(addr, size);
        self.rules.pooled_found_free += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use crate::replay::testkit::{pooled_areas, replayer, request, PAGE};
    use crate::replay::ReplayOptions;

    /// Only the pooled entry under the kernel's placement is freed; the others stay pooled.
    #[test]
    fn only_the_entries_under_the_kernels_placement_leave_the_pools() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        let addrs = pooled_areas(&mut r, 3, 2);
        assert!(
            !r.free_pooled_found_free(addrs[2] + 64 * PAGE, 2 * PAGE),
            "nothing pooled"
        );
        assert!(r.free_pooled_found_free(addrs[1], PAGE));
        assert_eq!(
            (r.model.pools().len(0, 2 * PAGE), r.rules.pooled_found_free),
            (2, 1)
        );
        assert!(r.model.claim(&request(&r, 1, 0), addrs[1]).is_ok());
        r.model.check_invariants().unwrap();
    }
}
