//! When a started purge detached each node's lazy list, and the per-trace fit of the time
//! between two nodes' detaches that the prediction uses.

use std::collections::VecDeque;

use crate::replay::ReplayOptions;

/// When a started purge detached each node's lazy list. `__purge_vmap_area_lazy` decays a
/// node's pools and then detaches its list, node after node, and right after the last one
/// queues its TLB flush; a free whose event comes before its node's detach is in the batch.
#[derive(Clone, Debug)]
pub(in crate::replay) struct Detach {
    /// The drain work item's start.
    pub(in crate::replay) start: u64,
    /// Its TLB flush (`work.flush_ns`), when recorded.
    pub(in crate::replay) flush: Option<u64>,
    /// The item's pool decays, `(start_ns, end_ns)` in the order they ran, when a richer rung
    /// timed them (`decay_va_pool_node`): the `n`-th is node `n`'s, and its end is that node's
    /// detach, known rather than predicted.
    pub(in crate::replay) decays: Vec<(u64, u64)>,
    /// The predicted time between two nodes' detaches ([`StepFit`]).
    pub(in crate::replay) step: u64,
}

impl Detach {
    /// Whether the decays were timed, one per node: with some missing, which node each belongs
    /// to is unknown, and the prediction from the start and flush is used instead.
    pub(in crate::replay) fn timed(&self, nodes: u32) -> bool {
        self.decays.len() == nodes as usize
    }

    /// When node `node`'s pools decay: right after the previous node's detach (node 0: at the
    /// start), or when its timed decay began.
    pub(in crate::replay) fn decay_at(&self, node: u32, nodes: u32, opts: &ReplayOptions) -> u64 {
        if self.timed(nodes) {
            if let Some(&(start, _)) = self.decays.get(node as usize) {
                return start;
            }
        }
        match node.checked_sub(1) {
            Some(prev) => self.at(prev, nodes, opts),
            None => self.start,
        }
    }

    /// Node `node`'s predicted detach. From the start: [`ReplayOptions::detach_delay_ns`] plus
    /// one step ([`Detach::step`]) per node before it. With the flush recorded, the
    /// last node detaches at the flush and each earlier one a step before it, but no earlier
    /// than the prediction from the start: the flush bounds the last detach far more tightly
    /// than the start does (docs/inference.md, "Detach prediction").
    ///
    /// With the decays timed, the next node's decay start (the last node: the flush): the
    /// kernel takes the node's `lazy.lock` and detaches the list after `decay_va_pool_node`
    /// returns and before it moves on, and that gap can be milliseconds when the CPU is taken
    /// away (12-20 ms seen in TCG guests).
    pub(in crate::replay) fn at(&self, node: u32, nodes: u32, opts: &ReplayOptions) -> u64 {
        self.at_with_step(node, nodes, opts, self.step)
    }

    /// [`Detach::at`] with another step.
    fn at_with_step(&self, node: u32, nodes: u32, opts: &ReplayOptions, step: u64) -> u64 {
        if self.timed(nodes) {
            if let Some(&(_, end)) = self.decays.get(node as usize) {
                // The detach takes the node's lazy.lock between its decay's end and the next
                // node's decay start (the last node: before its flush is queued). The frees in
                // that gap join the batch, so the latest bound is the detach.
                let next = match self.decays.get(node as usize + 1) {
                    Some(&(start, _)) => Some(start),
                    None => self.flush,
                };
                return next.filter(|&n| n >= end).unwrap_or(end);
            }
        }
        let forward = self
            .start
            .saturating_add(opts.detach_delay_ns)
            .saturating_add(u64::from(node) * step);
        match self.flush {
            None => forward,
            Some(flush) => {
                let later = u64::from(nodes.saturating_sub(node + 1));
                let back = flush.saturating_sub(later * step);
                back.max(forward).min(flush)
            }
        }
    }
}

/// Candidate steps tried by [`StepFit`], [`STEP_GRAIN_NS`] apart from 0: up to 127 µs.
const STEP_CANDIDATES: usize = 128;
const STEP_GRAIN_NS: u64 = 1_000;
/// How many of the latest informative purges the fit weighs.
const FIT_WINDOW: usize = 128;
/// Informative purges needed before the fit replaces the configured step.
const FIT_MIN_PURGES: usize = 8;

/// Fits the step between two nodes' detaches to the trace, purge by purge. Node 0's detach
/// comes after its pool decay and before node 1's, and nothing on the tracepoint rung marks
/// it: its distance from the flush is node 1's decay, whose length depends on the machine
/// and its load (on the 2-CPU reference machine a fixed 20 µs predicted `npurged` on 89–92 %
/// of the purges of one set of recordings, and 30 µs on 94–96 %). Each purge event, once
/// seen, says which steps would have predicted its `npurged`: those for which the frees after
/// the drain item's start that beat their node's detach, with what was lazy at the start,
/// make up the count. The step used for the next purge is the one that would have been right
/// most often over the last [`FIT_WINDOW`] purges that told steps apart (the configured one
/// until [`FIT_MIN_PURGES`] did, and among equals the one closest to it). Only purges before
/// the one predicted are used.
#[derive(Clone, Debug)]
pub(in crate::replay) struct StepFit {
    prior: u64,
    enabled: bool,
    window: VecDeque<u128>,
    counts: [u32; STEP_CANDIDATES],
    current: u64,
}

impl StepFit {
    pub(in crate::replay) fn new(opts: &ReplayOptions) -> Self {
        Self {
            prior: opts.detach_step_ns,
            enabled: opts.fit_detach_step,
            window: VecDeque::with_capacity(FIT_WINDOW),
            counts: [0; STEP_CANDIDATES],
            current: opts.detach_step_ns,
        }
    }

    /// The step to predict the next purge with.
    pub(in crate::replay) fn step(&self) -> u64 {
        self.current
    }

    /// The fitted step, once the fit has replaced the configured one.
    pub(in crate::replay) fn fitted(&self) -> Option<u64> {
        (self.enabled && self.window.len() >= FIT_MIN_PURGES).then_some(self.current)
    }

    /// Informative purges the fit weighs now.
    pub(in crate::replay) fn purges(&self) -> usize {
        self.window.len()
    }

    /// A purge event showed its `npurged`: `joined` of the `frees` (event time and node) after
    /// its drain item's start were in its batches. Purges with timed decays, or that no step
    /// or every step explains, say nothing about the step.
    pub(in crate::replay) fn observe(
        &mut self,
        d: &Detach,
        nodes: u32,
        opts: &ReplayOptions,
        frees: &[(u64, u32)],
        joined: usize,
    ) {
        if !self.enabled || d.timed(nodes) || nodes < 2 || frees.len() < joined {
            return;
        }
        let mut mask = 0u128;
        for c in 0..STEP_CANDIDATES {
            let step = c as u64 * STEP_GRAIN_NS;
            let n = frees
                .iter()
                .filter(|&&(ts, node)| ts < d.at_with_step(node, nodes, opts, step))
                .count();
            if n == joined {
                mask |= 1 << c;
            }
        }
        if mask == 0 || mask == u128::MAX {
            return;
        }
        if self.window.len() == FIT_WINDOW {
            if let Some(old) = self.window.pop_front() {
                self.tally(old, false);
            }
        }
        self.window.push_back(mask);
        self.tally(mask, true);
        if self.window.len() >= FIT_MIN_PURGES {
            let prior = self.prior;
            let best = (0..STEP_CANDIDATES)
                .max_by_key(|&c| {
                    let step = c as u64 * STEP_GRAIN_NS;
                    (self.counts[c], std::cmp::Reverse(step.abs_diff(prior)))
                })
                .unwrap_or(0);
            self.current = best as u64 * STEP_GRAIN_NS;
        }
    }

    fn tally(&mut self, mask: u128, add: bool) {
        for (c, n) in self.counts.iter_mut().enumerate() {
            if mask & (1 << c) != 0 {
                if add {
                    *n += 1;
                } else {
                    *n -= 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detach(start: u64, flush: u64) -> Detach {
        Detach {
            start,
            flush: Some(flush),
            decays: Vec::new(),
            step: 0,
        }
    }

    /// Every purge's node-0 free came 25 µs before the flush and joined: the fit moves from
    /// the configured 10 µs to a step under 25 µs, and stays at the configured one before
    /// enough purges told steps apart.
    #[test]
    fn the_step_follows_the_purges_seen() {
        let opts = ReplayOptions {
            detach_step_ns: 30_000,
            detach_delay_ns: 0,
            ..ReplayOptions::default()
        };
        let mut fit = StepFit::new(&opts);
        for i in 0..FIT_MIN_PURGES as u64 {
            assert_eq!(fit.step(), 30_000, "before purge {i}");
            let base = 1_000_000 * (i + 1);
            let d = detach(base, base + 100_000);
            // A node-0 free 25 us before the flush, and a node-1 free after it (never joins).
            fit.observe(&d, 2, &opts, &[(base + 75_000, 0), (base + 100_500, 1)], 1);
        }
        assert!(fit.step() < 25_000, "{}", fit.step());
        // Of the steps under 25 us, the one closest to the configured 30 us.
        assert_eq!(fit.step(), 24_000);
        assert_eq!(fit.fitted(), Some(24_000));
    }

    /// A purge that every step explains (no free near a detach), or none does, is not counted.
    #[test]
    fn uninformative_purges_are_not_counted() {
        let opts = ReplayOptions::default();
        let mut fit = StepFit::new(&opts);
        let d = detach(1_000, 200_000);
        fit.observe(&d, 2, &opts, &[(500_000, 0)], 0);
        fit.observe(&d, 2, &opts, &[(500_000, 0)], 1);
        assert_eq!(fit.purges(), 0);
        assert_eq!(fit.fitted(), None);
        let off = ReplayOptions {
            fit_detach_step: false,
            ..ReplayOptions::default()
        };
        let mut fixed = StepFit::new(&off);
        for _ in 0..2 * FIT_MIN_PURGES {
            fixed.observe(&d, 2, &off, &[(190_000, 0)], 0);
        }
        assert_eq!(fixed.step(), off.detach_step_ns);
    }
}
