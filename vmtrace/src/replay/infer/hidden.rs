//! Hidden ranges: space the snapshot lists free that the kernel's choices show was not
//! (docs/inference.md, "Hidden space", "Hidden ranges read as a pool", "Hidden ranges read as
//! free space" and "Split of merged hidden ranges"). Pool entries from before the
//! trace are the usual cause: `/proc/vmallocinfo` does not list pooled areas.
//!
//! - **Observes** an allocation's observed address against the model's pick and the ranges the
//!   model holds hidden.
//! - **Infers** which model-free ranges were unavailable in the kernel
//!   ([`Replayer::hide_unavailable`]), which hidden ranges were a pool handing out entries
//!   downwards ([`Replayer::pool_hidden_below`], [`Replayer::split_merged_pool`]) and which
//!   were free after all ([`Replayer::free_hidden_above`]).
//! - **Parameters**: `InferenceParams::hidden_pool_span`, `InferenceParams::top_picks_to_split`.
//! - **Counters**: `hidden_ranges`, `hidden_ranges_pooled`, `hidden_ranges_split`,
//!   `hidden_ranges_freed` in the replay report.

use crate::model::{AllocRequest, Allocated, ModelError, Placement};
use crate::replay::{HiddenPool, Replayer};

impl Replayer<'_> {
    /// A pool the model hid as empty in the kernel, now seen in use there at `addr`: it was
    /// only missing for a moment (or its head differed). The entries after the one used go back
    /// to the pool, in their order.
    pub(in crate::replay) fn restore_hidden_pool_in_use(&mut self, size: u64, addr: u64) {
        let group = self
            .rules
            .hidden_pools
            .iter()
            .position(|h| h.size == size && h.entries.contains(&addr));
        if let Some(g) = group {
            let h = self.rules.hidden_pools.swap_remove(g);
            let k = h.entries.iter().position(|&a| a == addr).unwrap_or(0);
            self.rules.pools_restored += u64::from(self.model.restore_pooled(
                h.node,
                h.size,
                &h.entries[k + 1..],
            ));
        }
    }

    /// The kernel used space the model had hidden: it was available after all. Returns the
    /// claim tried again, or None when nothing hidden was there. A hidden range of exactly the
    /// request's size is read further ([`Replayer::pool_hidden_below`],
    /// [`Replayer::free_hidden_above`]).
    pub(in crate::replay) fn unhide_used(
        &mut self,
        req: &AllocRequest,
        node: u32,
        addr: u64,
        predicted: Option<&Allocated>,
    ) -> Option<Result<Placement, ModelError>> {
        let exactly_hidden = self.model.hidden().get(&addr) == Some(&req.size);
        if !self.model.unhide(addr, req.size) {
            return None;
        }
        self.rules.unhidden += 1;
        let claimed = self.model.claim(req, addr);
        if exactly_hidden && claimed.is_ok() {
            self.pool_hidden_below(req, node, addr);
            if let Some(g) = predicted {
                self.free_hidden_above(req, addr, g.addr);
            }
        }
        Some(claimed)
    }

    /// Puts every pool hidden whole since the last purge back, in its order, before a purge
    /// decays the pools: the kernel decays `len >> 2` entries from each pool's head, so a pool
    /// the model holds shorter than the kernel's decays other entries.
    pub(in crate::replay) fn restore_hidden_pools(&mut self) {
        for h in std::mem::take(&mut self.rules.hidden_pools) {
            if h.back_before_decay {
                self.rules.pools_restored +=
                    u64::from(self.model.restore_pooled(h.node, h.size, &h.entries));
            }
        }
    }

    /// The kernel took `addr` from its free tree although the model offered something else.
    /// With `align <= PAGE_SIZE` the kernel's pick is its lowest fitting free block, and a
    /// pool hit is preferred to it, so (a) when the model offered a pool hit, the kernel's pool
    /// was empty, and (b) every model-free block below `addr` that could hold the request was
    /// not free in the kernel. Both are space the trace never showed: pool entries from before
    /// the trace (vmallocinfo does not list pooled areas) or diverged pool histories. They are
    /// hidden until the kernel uses them ([`crate::replay::tracked::TrackedModel::unhide`]).
    pub(in crate::replay) fn hide_unavailable(
        &mut self,
        req: &AllocRequest,
        addr: u64,
        model_pool_hit: bool,
    ) {
        if !self.opts.rule_on(super::Rule::Hidden) {
            return;
        }
        let node = self.model.params().layout.cpu_to_node(req.cpu);
        if model_pool_hit {
            let stale: Vec<u64> = self.model.pools().entries(node, req.size).collect();
            for &s in &stale {
                if self.model.hide(s, req.size, node) {
                    self.rules.hidden += 1;
                }
            }
            self.rules.hidden_pools.push(HiddenPool {
                node,
                size: req.size,
                entries: stale,
                back_before_decay: true,
            });
        }
        // With a larger alignment, only the blocks long enough to steer the kernel's search
        // are known to be taken (see `FreeSpace::alloc`): a shorter one may just have been off
        // its path.
        let min_len = if self.model.adjusts_search(req) {
            req.size.saturating_add(req.align - 1)
        } else {
            req.size
        };
        let below: Vec<(u64, u64)> = self
            .model
            .free_space()
            .iter()
            .take_while(|&(s, _)| s < addr)
            .filter(|&(s, e)| s >= req.vstart && e - s >= min_len)
            .collect();
        for (s, e) in below {
            if self.model.hide(s, e - s, node) {
                self.rules.hidden += 1;
            }
        }
    }

    /// The kernel took `addr`, a hidden range of exactly the request's size, while the model's
    /// pool for the request was empty. The second such pick in a row on the node, lower than
    /// the first, reads as the kernel's pool handing out entries the trace never showed (from
    /// before it, or left under the pool's later entries, which a decay never reaches: it cuts
    /// from the head). `purge_vmap_node` pushes a batch in address order, so such a pool gives
    /// them out downwards: the hidden ranges of that size below `addr` become the model's pool,
    /// highest on top. When the kernel then takes something else, the pool is hidden again as
    /// seen missing. Without this every pick from such a pool is a miss; full-fit workloads
    /// have the most of them. Acting on every such pick, not the second in a row,
    /// mistakes single hidden picks for pools on random-size workloads. At most
    /// `InferenceParams::hidden_pool_span` are moved: fewer, or no bound, predict full-fit slightly worse.
    pub(in crate::replay) fn pool_hidden_below(
        &mut self,
        req: &AllocRequest,
        node: u32,
        addr: u64,
    ) {
        if !self.model.pool_eligible(req) || self.model.pools().len(node, req.size) != 0 {
            return;
        }
        let prev = self.rules.hidden_pick.replace((node, req.size, addr));
        if !prev.is_some_and(|(n, z, a)| n == node && z == req.size && a > addr) {
            return;
        }
        let below: Vec<u64> = self
            .model
            .hidden()
            .range(..addr)
            .rev()
            .filter(|&(_, &z)| z == req.size)
            .map(|(&s, _)| s)
            .take(self.opts.infer.hidden_pool_span)
            .collect();
        self.rules.hidden_pooled += u64::from(self.model.restore_pooled(node, req.size, &below));
    }

    /// The kernel took `addr`, the top of a hidden range: a pool handing out adjacent entries
    /// downwards, as `purge_vmap_node` pushed them, which the model had merged into one free
    /// range (the kernel keeps each as its own `vmap_area`) and then hidden. From the
    /// `InferenceParams::top_picks_to_split`th such pick in a row (each right below the last;
    /// with the default 1, the first), with the model's pool for the request empty, a range
    /// that is a whole number of request-sized pieces is split into them: the
    /// pick is then exact, and [`Replayer::pool_hidden_below`] reads the next one as the
    /// pool's. Without it each pick unhides the range, takes its top and hides the rest again,
    /// a miss every time (full-fit workloads have long runs of them).
    /// Ranges that are not a whole number of pieces are not split: splitting them from the top
    /// mispredicts fix-size and random-size workloads.
    pub(in crate::replay) fn split_merged_pool(
        &mut self,
        req: &AllocRequest,
        node: u32,
        addr: u64,
    ) {
        let top = self
            .model
            .hidden()
            .range(..=addr)
            .next_back()
            .filter(|&(&s, &z)| s + z == addr + req.size)
            .map(|(&s, _)| s);
        let Some(s) = top else {
            return;
        };
        let run = match self.rules.top_pick {
            Some((n, z, a, k)) if n == node && z == req.size && a == addr + req.size => {
                k.saturating_add(1)
            }
            _ => 1,
        };
        self.rules.top_pick = Some((node, req.size, addr, run));
        if s == addr
            || run < self.opts.infer.top_picks_to_split
            || req.align > self.model.params().page_size
            || !self.model.pool_eligible(req)
            || self.model.pools().len(node, req.size) != 0
        {
            return;
        }
        if self.model.split_hidden(s, req.size) {
            self.rules.hidden_split += 1;
        }
    }

    /// The kernel took `addr`, a hidden range of exactly the request's size, below `predicted`,
    /// the model's pick. The second such pick in a row of that size, above the first, reads as
    /// the kernel's lowest fit walking up through ranges free there that the model had hidden:
    /// typically pool entries a decay gave back to the kernel's free tree, hidden when the
    /// kernel's picks above them came from a pool the model did not know of (the hiding rule
    /// takes every pick the model had free as a free-tree pick). Every hidden range of exactly
    /// that size between the pick and `predicted` goes back to the free tree; without this,
    /// full-fit workloads miss each step of such a walk. The longer hidden ranges in that span
    /// stay hidden, and a single pick is not enough: giving back either way mispredicts
    /// random-size workloads.
    pub(in crate::replay) fn free_hidden_above(
        &mut self,
        req: &AllocRequest,
        addr: u64,
        predicted: u64,
    ) {
        if predicted <= addr || req.align > self.model.params().page_size {
            return;
        }
        let prev = self.rules.hidden_low_pick.replace((req.size, addr));
        if !prev.is_some_and(|(z, a)| z == req.size && a < addr) {
            return;
        }
        let above: Vec<u64> = self
            .model
            .hidden()
            .range(addr..predicted)
            .filter(|&(_, &z)| z == req.size)
            .map(|(&s, _)| s)
            .collect();
        for s in above {
            if self.model.unhide(s, req.size) {
                self.rules.hidden_freed += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::replay::testkit::{pooled_areas, replayer, request, PAGE};
    use crate::replay::ReplayOptions;

    /// The kernel placed an area from its free tree where the model offered a pool hit: the
    /// model's pool and every free block below the kernel's pick are hidden, so the model's
    /// next pick is not the one the kernel passed over; the pool comes back before the next
    /// decay, in its order.
    #[test]
    fn a_pool_the_kernel_passed_over_is_hidden_then_put_back() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        let addrs = pooled_areas(&mut r, 3, 2);
        let req = request(&r, 2, 0);
        assert_eq!(r.model.pools().len(0, req.size), 3);
        let head = r.model.pools().head(0, req.size);
        let kernel = addrs[2] + 64 * PAGE;
        r.hide_unavailable(&req, kernel, true);
        assert_eq!(r.model.pools().len(0, req.size), 0, "the pool is hidden");
        assert_eq!(
            r.rules.hidden, 4,
            "its three entries and the free block below the pick"
        );
        r.model.check_invariants().unwrap();
        let next = r.model.alloc(&req).unwrap();
        assert!(
            next.is_err(),
            "nothing the kernel showed free is left to offer"
        );
        r.restore_hidden_pools();
        assert_eq!(
            (r.model.pools().len(0, req.size), r.rules.pools_restored),
            (3, 3)
        );
        assert_eq!(r.model.pools().head(0, req.size), head, "in their order");
        r.model.check_invariants().unwrap();
    }

    /// Hides `n` adjacent one-page ranges from the bottom of the range, each its own range.
    fn hidden_pages(r: &mut crate::replay::Replayer, n: u64) -> u64 {
        let base = r.model.params().vmalloc_start;
        for i in 0..n {
            assert!(r.model.hide(base + i * PAGE, PAGE, 0));
        }
        base
    }

    /// Two picks in a row of hidden ranges, the second lower, with the model's pool empty: the
    /// hidden ranges of that size below become the pool, highest on top.
    #[test]
    fn a_second_lower_pick_of_hidden_ranges_reads_them_as_a_pool() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        let base = hidden_pages(&mut r, 4);
        let req = request(&r, 1, 0);
        r.pool_hidden_below(&req, 0, base + 3 * PAGE);
        assert_eq!(r.model.pools().len(0, PAGE), 0, "one pick is not a pool");
        r.pool_hidden_below(&req, 0, base + 2 * PAGE);
        assert_eq!(r.rules.hidden_pooled, 2);
        assert_eq!(r.model.pools().head(0, PAGE), Some(base + PAGE));
        assert_eq!(r.model.pools().len(0, PAGE), 2);
        r.model.check_invariants().unwrap();
    }

    /// A pick at the top of a merged hidden range that is a whole number of pieces splits it
    /// into request-sized ranges; a range of another length stays whole.
    #[test]
    fn a_pick_at_the_top_of_a_merged_hidden_range_splits_it() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        let base = r.model.params().vmalloc_start;
        assert!(r.model.hide(base, 4 * PAGE, 0));
        assert!(r.model.hide(base + 8 * PAGE, 3 * PAGE, 0));
        let req = request(&r, 2, 0);
        r.split_merged_pool(&req, 0, base + 2 * PAGE);
        assert_eq!((r.rules.hidden_split, r.model.hidden().len()), (1, 3));
        r.split_merged_pool(&req, 0, base + 9 * PAGE);
        assert_eq!(
            r.rules.hidden_split, 1,
            "3 pages are not whole 2-page pieces"
        );
        r.model.check_invariants().unwrap();
    }

    /// Two picks in a row of hidden ranges below the model's pick, the second higher: the
    /// hidden ranges of that size between them and the model's pick are free after all; a
    /// longer one stays hidden.
    #[test]
    fn a_second_higher_pick_below_the_model_frees_the_hidden_ranges_above() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        let base = r.model.params().vmalloc_start;
        for i in [0, 2, 4] {
            assert!(r.model.hide(base + i * PAGE, PAGE, 0));
        }
        assert!(r.model.hide(base + 6 * PAGE, 2 * PAGE, 0));
        let req = request(&r, 1, 0);
        let predicted = base + 10 * PAGE;
        r.free_hidden_above(&req, base, predicted);
        assert_eq!(r.rules.hidden_freed, 0, "one pick is not a walk");
        r.free_hidden_above(&req, base + 2 * PAGE, predicted);
        assert_eq!(r.rules.hidden_freed, 2);
        let left: Vec<u64> = r.model.hidden().keys().copied().collect();
        assert_eq!(left, vec![base, base + 6 * PAGE]);
        r.model.check_invariants().unwrap();
    }
}
