//! Give-back of the newest areas, causal replay only (docs/inference.md, "Give-back of the
//! newest areas").
//!
//! - **Observes** a purge event whose `npurged` is below the batch the causal replay's purge took.
//! - **Infers** that the newest areas of that batch raced the kernel's detach and were left for
//!   its next batch, and gives them back to the lazy lists.
//! - **Parameters**: none.
//! - **Counter**: `batch_areas_given_back` in the replay report.

use crate::replay::Replayer;

impl Replayer<'_> {
    /// Causal resync after an `npurged` miss where the model's batch was larger than the
    /// kernel's: a purge the causal replay could only start at the first event that showed it
    /// took the frees that raced the kernel's detach, which the kernel left for its next batch.
    /// The `excess` newest areas of the batch go back to the lazy lists; without this the
    /// model's backlog stays that many areas below the kernel's until the next purge (on a
    /// 20 s fix-size recording, one or two 18-page areas on 1163 of 1398 intervals).
    pub(in crate::replay) fn give_back_newest(
        &mut self,
        got: &mut crate::model::Purged,
        excess: u32,
    ) {
        let page = self.model.params().page_size;
        let mut newest = got.batch.clone();
        newest.sort_unstable_by_key(|b| std::cmp::Reverse(b.area.seq));
        for b in newest.iter().take(excess as usize) {
            if self.model.unpurge(b) {
                got.batch.retain(|x| x.addr != b.addr);
                got.npurged -= 1;
                got.pages = got.pages.saturating_sub(b.area.size / page);
                self.batch_given_back += 1;
            }
        }
    }
}
