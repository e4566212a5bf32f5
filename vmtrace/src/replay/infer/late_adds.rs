//! Adds whose events come late (docs/inference.md, "Adds whose events come late").
//!
//! - **Observes** each free's `nr_lazy`, after it is scored. `free_vmap_area_noflush` adds the
//!   area's pages to `vmap_lazy_nr`, takes the node's lazy lock, inserts the area, unlocks, and
//!   only then fires its tracepoint. A task preempted between the add and the tracepoint (a
//!   TCG guest's vCPUs are descheduled for milliseconds) reports its free tens of events later,
//!   and every free in between reports a backlog that already holds its pages.
//! - **Infers**, in the causal replay only, an add not seen yet when a free's backlog exceeds
//!   the model's by exactly the pages of some area the model holds busy: those pages count in
//!   the backlog from then on. When a free then reports a backlog below what the model already
//!   held before it, and the unseen pages cover it, its pages were among them and are not added
//!   again, and it is not read as a purge's drop (the early-purge rules would purge a node for
//!   it). The unseen pages are part of the predicted backlog only, not of the model's: its
//!   drain trigger and purges do not see them (with them in the model, random-size placement
//!   got worse). Unseen pages left at a purge event leave with it.
//! - **Parameters**: none.
//! - **Counters**: `late_adds_seen` (adds taken from a backlog), `late_adds_matched` (late
//!   frees whose pages they held).
//!
//! Each free is still scored before the rule uses it, so the strict `nr_lazy` figure stays
//! strict: what the rule saves is the run of frees after a late add, each of which would
//! otherwise disagree by its pages until its event came.

use crate::replay::Replayer;

impl Replayer<'_> {
    /// Whether a free of `own` pages reporting `nr_lazy`, below the predicted backlog, is one
    /// whose add the unseen adds already counted (causal replay only).
    pub(in crate::replay) fn late_free(&self, nr_lazy: u64, own: u64) -> bool {
        self.causal
            && self.opts.rule_on(super::Rule::LateAdds)
            && nr_lazy < self.model.lazy_pages() + self.rules.unseen_pages
            && self.rules.unseen_pages >= own
    }

    /// After a free of `own` pages, scored against the model's backlog `before` it (with the
    /// unseen adds), reported `nr_lazy`.
    pub(in crate::replay) fn late_adds(&mut self, nr_lazy: u64, before: u64, own: u64) {
        if !self.causal || !self.opts.rule_on(super::Rule::LateAdds) {
            return;
        }
        if self.rules.unseen_pages > 0 && nr_lazy == before - self.rules.unseen_pages + own {
            // The model's own backlog was the kernel's: the pages taken for unseen adds were
            // a purge's subtraction not yet made, or a free the kernel made before its event
            // and the model added in step after all.
            self.rules.unseen_pages = 0;
            return;
        }
        if nr_lazy < before {
            if self.rules.unseen_pages >= own {
                self.rules.unseen_pages -= own;
                self.rules.late_adds_matched += 1;
            }
            return;
        }
        let Some(extra) = nr_lazy.checked_sub(before + own).filter(|&e| e > 0) else {
            return;
        };
        let page = self.model.params().page_size;
        if self.model.busy().values().any(|b| b.size / page == extra) {
            self.rules.unseen_pages += extra;
            self.rules.late_adds_seen += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::replay::testkit::{replayer, request};
    use crate::replay::ReplayOptions;

    /// A free reports three pages more than the model holds, and an area of three pages is
    /// busy: the next frees are predicted with them. When that area's free comes, below the
    /// backlog, its pages are not added twice.
    #[test]
    fn an_add_seen_in_the_backlog_counts_until_its_free_comes() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        r.causal = true;
        let big = request(&r, 10, 0);
        let small = request(&r, 3, 0);
        let a = r.model.alloc(&big).expect("request").expect("space").addr;
        let late = r.model.alloc(&small).expect("request").expect("space").addr;
        let before = r.model.lazy_pages();
        r.model.free(a).expect("busy");
        r.late_adds(before + 10 + 3, before, 10);
        assert_eq!(r.rules.unseen_pages, 3);
        assert_eq!(
            r.model.lazy_pages(),
            before + 10,
            "the model's own backlog is untouched"
        );
        assert_eq!(r.rules.late_adds_seen, 1);
        let ahead = r.model.lazy_pages() + r.rules.unseen_pages;
        r.model.free(late).expect("busy");
        r.late_adds(before + 3, ahead, 3);
        assert_eq!(r.rules.unseen_pages, 0, "not counted twice");
        assert_eq!(r.rules.late_adds_matched, 1);

        // No busy area of the extra pages: the model is left as it is.
        let b = r.model.alloc(&big).expect("request").expect("space").addr;
        let before = r.model.lazy_pages();
        r.model.free(b).expect("busy");
        r.late_adds(before + 10 + 7, before, 10);
        assert_eq!(r.rules.unseen_pages, 0);
        assert_eq!(r.rules.late_adds_seen, 1);
    }

    /// A free reporting a backlog far below the model's is a late one, not a purge's drop,
    /// only when the unseen adds hold its pages: then the early-purge rules leave it alone.
    #[test]
    fn a_late_free_is_not_read_as_a_drop() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        r.causal = true;
        let big = request(&r, 20, 0);
        let a = r.model.alloc(&big).expect("request").expect("space").addr;
        r.model.free(a).expect("busy");
        let lazy = r.model.lazy_pages();
        assert!(!r.late_free(lazy - 10, 3), "no unseen add: a drop");
        r.rules.unseen_pages = 3;
        assert!(r.late_free(lazy - 10, 3));
        assert!(!r.late_free(lazy - 10, 4), "more pages than were unseen");
        r.causal = false;
        assert!(!r.late_free(lazy - 10, 3), "causal replay only");
    }

    /// The rule is the causal replay's only.
    #[test]
    fn the_explained_replay_leaves_the_backlog_alone() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        let small = request(&r, 3, 0);
        r.model.alloc(&small).expect("request").expect("space");
        let before = r.model.lazy_pages();
        r.late_adds(before + 3 + 3, before, 3);
        assert_eq!(r.rules.unseen_pages, 0);
    }
}
