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
                self.rules.batch_given_back += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::model::AllocRequest;
    use crate::replay::testkit::replayer;
    use crate::replay::ReplayOptions;

    /// `give_back_newest`: a batch larger than the kernel's `npurged` returns its newest areas
    /// (the frees that raced the kernel's detach) to the lazy lists, oldest kept purged.
    #[test]
    fn an_over_large_batch_gives_its_newest_areas_back() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        let (start, end) = (r.model.params().vmalloc_start, r.model.params().vmalloc_end);
        let mut addrs = Vec::new();
        for _ in 0..3 {
            let req = AllocRequest {
                size: 3 * 4096,
                align: 1,
                vstart: start,
                vend: end,
                cpu: 0,
                retry: false,
                guard: true,
            };
            let got = r.model.alloc(&req).expect("request").expect("space");
            addrs.push(got.addr);
        }
        for &a in &addrs {
            r.model.free(a).expect("busy");
        }
        let mut got = r.model.purge_oldest(false, 3);
        assert_eq!(got.npurged, 3);
        r.give_back_newest(&mut got, 1);
        assert_eq!((got.npurged, r.rules.batch_given_back), (2, 1));
        assert_eq!(got.pages, 2 * 3);
        // The newest free is lazy again, with its pages back in the backlog; the older stay purged.
        assert!(r.model.lazy().find(addrs[2]).is_some());
        assert!(r.model.lazy().find(addrs[0]).is_none() && r.model.lazy().find(addrs[1]).is_none());
        assert_eq!(r.model.lazy_pages(), 3);
    }
}
