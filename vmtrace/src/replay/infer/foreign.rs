//! Areas outside the model in `npurged` (docs/inference.md, "Areas outside the model in
//! `npurged`").
//!
//! - **Observes** frees, since the last purge, of areas the model does not hold: module-range
//!   allocations, BPF JIT images, other windows.
//! - **Infers** that the kernel's next purge counts them in `npurged` (its lazy lists take every
//!   lazily freed area): they are added to the predicted count and left out of the batch the
//!   observed count sizes.
//! - **Parameters**: none.
//! - **Counter**: none of its own; `events.free_out_of_model` counts those frees.

use crate::replay::Replayer;

impl Replayer<'_> {
    /// A lazy free of an area outside the model: one more area in the next purge's count.
    pub(in crate::replay) fn foreign_free(&mut self) {
        self.rules.foreign_lazy = self.rules.foreign_lazy.saturating_add(1);
    }

    /// The areas outside the model in the purge now reported, which it takes with it.
    pub(in crate::replay) fn foreign_in_batch(&mut self) -> u32 {
        std::mem::take(&mut self.rules.foreign_lazy)
    }
}

#[cfg(test)]
mod tests {
    use crate::replay::testkit::replayer;
    use crate::replay::ReplayOptions;

    #[test]
    fn foreign_frees_count_in_the_next_purge_only() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        r.foreign_free();
        r.foreign_free();
        assert_eq!(r.foreign_in_batch(), 2);
        assert_eq!(r.foreign_in_batch(), 0, "taken by that purge");
    }
}
