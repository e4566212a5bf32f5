//! Replay a trace through the reference model and compare, event by event, what the model
//! predicts with what the kernel did (observed-timing mode).
//!
//! The model is seeded from the trace's vmallocinfo snapshot (busy, `unpurged` and `vm_map_ram`
//! areas). Then, for every event after the snapshot:
//!
//! - **alloc**: the model allocates; its address is compared with the observed one. When they
//!   differ, the model's choice is undone and the observed placement is applied instead, so that
//!   one divergence does not cascade: every prediction is a one-step prediction from a state that
//!   agrees with the kernel as far as the trace can tell.
//! - **free**: the model frees lazily; its backlog (`nr_lazy`) is compared with the event's.
//! - **purge**: the model purges where the trace shows a purge; the object count is compared
//!   with `npurged`.
//!
//! What seeding cannot know: the pool contents at trace start (pooled areas are neither busy nor
//! lazy, so `/proc/vmallocinfo` does not list them; the model treats them as free), the node tag
//! of areas already busy or lazy (the model assumes `addr_to_node`), and which areas carry a
//! guard page. Agreement is therefore reported overall and after warm-up: after the first purge
//! that put observed frees into the pools of every node.

pub mod charts;
pub mod checked;
pub mod cli;
pub mod free_run;
pub mod infer;
pub mod live;
pub mod lookahead;
mod report;
#[cfg(test)]
mod testkit;
pub mod tracked;
pub mod validate;

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::FxHashMap;
use std::io::BufRead;

use serde::Serialize;

use crate::model::{
    AllocRequest, Allocated, Model, ModelError, NodeLayout, PageTableSlots, Params, Placement,
    PurgeInProgress, SlotCounts, Variant,
};
use crate::trace::{AreaKind, ReadError, Record, TraceReader};
use infer::detach::{Detach, StepFit};
use lookahead::{DrainItem, DrainLookup, Lookahead};

pub use free_run::{free_run, FreeRunOptions, WhatIf};
pub use report::{render_comparison, render_fit, render_text};

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub variant: Variant,
    /// Turn warnings (unknown frees, timestamps going backwards, …) into errors.
    pub strict: bool,
    /// What-if override of the node count (the zone size follows the kernel's rule unless
    /// `zone_pages` is given too).
    pub nodes: Option<u32>,
    /// What-if override of the zone size in pages: `addr_to_node` deals zones of this size to
    /// the nodes round-robin, so it decides which node's busy and lazy lock an area takes.
    pub zone_pages: Option<u64>,
    /// What-if override of `lazy_max_pages`.
    pub lazy_max_pages: Option<u64>,
    /// How many divergences to keep with their context.
    pub max_divergences: usize,
    /// Predicted time from a drain work item's start to the detach of node 0's lazy list (the
    /// purge mutex, then node 0's pool decay): frees whose events come this soon after the
    /// start are predicted in the purge's batch. See [`DEFAULT_DETACH_DELAY_NS`].
    pub detach_delay_ns: u64,
    /// Added per node after node 0: the kernel decays node `n`'s pools after detaching node
    /// `n - 1`'s list, so later nodes detach later. See [`DEFAULT_DETACH_STEP_NS`]. With
    /// [`ReplayOptions::fit_detach_step`] it is the starting value.
    pub detach_step_ns: u64,
    /// Refit the step between two nodes' detaches to the trace, from the purges already seen
    /// (see `replay::infer::detach::StepFit` and docs/inference.md).
    pub fit_detach_step: bool,
    /// Replay causally only: no record after the current one is read and no event's own
    /// address or backlog is used before it is scored, so the explained figures are the strict
    /// ones. Without it a replay runs the causal pass beside the explained one, in the same
    /// read, for [`Report::strict`].
    pub causal: bool,
    /// The inference rules' tuned parameters. The causal pass runs the rules that read no
    /// record ahead, so some of these move strict figures too.
    pub infer: infer::InferenceParams,
    /// Rules turned off (`--without`), for ablation.
    pub without: Vec<infer::Rule>,
}

impl ReplayOptions {
    /// Whether `rule` runs in this replay.
    fn rule_on(&self, rule: infer::Rule) -> bool {
        !self.without.contains(&rule)
    }
}

/// The default of [`ReplayOptions::detach_delay_ns`], with [`DEFAULT_DETACH_STEP_NS`]: the
/// best pair of a sweep on 8 s fix-size and random-size stress traces of the 2-CPU 6.18
/// reference machine; predicting every detach at the item's start, or one delay for every node,
/// agreed on far fewer purges (`docs/inference.md`, "Detach prediction").
pub const DEFAULT_DETACH_DELAY_NS: u64 = 15_000;
/// The default of [`ReplayOptions::detach_step_ns`].
pub const DEFAULT_DETACH_STEP_NS: u64 = 20_000;

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            variant: Variant::Nodes,
            strict: false,
            nodes: None,
            zone_pages: None,
            lazy_max_pages: None,
            max_divergences: 10,
            detach_delay_ns: DEFAULT_DETACH_DELAY_NS,
            detach_step_ns: DEFAULT_DETACH_STEP_NS,
            fit_detach_step: true,
            causal: false,
            infer: infer::InferenceParams::default(),
            without: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("line {line}: expected the vmallocinfo snapshot as the second record, found {found}")]
    NoSnapshot { line: usize, found: String },
    #[error("line 2: the vmallocinfo snapshot has hashed addresses (recorded without root), so it cannot seed a replay")]
    HashedSnapshot,
    #[error("line 1: the header does not give the VMALLOC range (vmap.vmalloc_start/vmalloc_end are null); the model needs it")]
    NoVmallocRange,
    #[error("line 1: cannot build the model: {0}")]
    Model(#[from] ModelError),
    #[error("line {line}: {message} (--strict makes this fatal)")]
    Strict { line: usize, message: String },
}

/// Predicted against observed, for one kind of comparison.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Agreement {
    pub compared: u64,
    pub agreed: u64,
}

/// The strict figures (docs/model.md, "Strict and explained figures").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Strict {
    /// The model's first prediction, from the state earlier records built, before the
    /// allocation's own address is used for anything.
    pub placement: Agreement,
    pub placement_after_warmup: Agreement,
    /// The model's backlog after the free, by exact equality, before anything adjusts it.
    pub nr_lazy: Agreement,
    /// Every lazy area the model holds when the purge event arrives, with nothing read ahead.
    pub npurged: Agreement,
}

impl Agreement {
    fn add(&mut self, ok: bool) {
        self.compared += 1;
        self.agreed += u64::from(ok);
    }

    /// Share agreed in percent; 100 when nothing was compared.
    pub fn percent(&self) -> f64 {
        if self.compared == 0 {
            100.0
        } else {
            100.0 * self.agreed as f64 / self.compared as f64
        }
    }
}

/// One purge, predicted against observed.
#[derive(Clone, Debug, Serialize)]
pub struct PurgeCheck {
    pub line: usize,
    pub ts_ns: u64,
    pub observed_npurged: u32,
    pub predicted_npurged: u32,
    pub pages: u64,
    pub pooled: u32,
    pub decayed: u32,
    pub helpers: u32,
    pub full: bool,
}

/// A prediction that disagreed with the trace, with the model state around it.
#[derive(Clone, Debug, Serialize)]
pub struct Divergence {
    pub line: usize,
    pub ts_ns: u64,
    pub kind: &'static str,
    pub class: &'static str,
    pub cpu: u32,
    pub size: u64,
    pub align: u64,
    pub observed: String,
    pub predicted: String,
    /// Model state just before the prediction.
    pub context: String,
}

/// How the snapshot seeded the model.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SeedInfo {
    pub busy: u64,
    pub unpurged: u64,
    pub vm_map_ram: u64,
    /// Areas outside the VMALLOC range (modules, …), kept only to recognise their frees.
    pub outside_range: u64,
    /// Snapshot areas the model could not place (overlapping another one).
    pub rejected: u64,
    pub lazy_pages: u64,
    /// Events before the snapshot read, already reflected in it.
    pub events_before_snapshot: u64,
    /// Events inside the read window found already reflected.
    pub events_in_window_reflected: u64,
    /// Areas the snapshot lists as unpurged whose last record before it is a free followed
    /// by a purge event: the kernel had purged them (its backlog leaves them out, and it hands
    /// them out of its pools next), so the model pools them as that purge would have.
    pub purged_before_snapshot: u64,
    /// Observed `nr_lazy` minus predicted at the first compared free: how far the seeded
    /// backlog was off (0 when the snapshot was exact).
    pub first_free_nr_lazy_offset: Option<i64>,
    /// The recording emptied the pools before the snapshot (`record --drain-pools`): the
    /// space it leaves out is free. Otherwise pool entries from before the trace, which no
    /// snapshot lists, look free to the model.
    pub pools_drained: bool,
}

/// Page-table pages added during the recording. The model predicts new 2 MiB / 1 GiB / 512 GiB
/// tables from the observed placements; the kernel's own figures come from whichever sources the
/// trace carries (pt_page events with `--probes page_tables`, meminfo samples, allocinfo
/// samples with `--allocinfo-interval`). meminfo and allocinfo count all page tables, user
/// ones included, so they bound the vmalloc share from above.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PageTableGrowth {
    /// New PTE + PMD + PUD tables the model predicts after seeding from the snapshot.
    pub predicted_new_tables: u64,
    /// `pt_page` events (kernel page-table pages allocated under vmap mapping functions).
    pub observed_pt_page_events: Option<u64>,
    /// Last minus first meminfo `PageTables`, kB.
    pub meminfo_page_tables_delta_kb: Option<i64>,
    /// Last minus first allocinfo `pagetable_alloc` bytes.
    pub allocinfo_pagetable_delta_bytes: Option<i64>,
}

/// The fidelity report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub variant: Variant,
    /// Figures no later record can help: from a replay that reads nothing ahead and scores each
    /// event before using it. The figures below are the explained ones; the counters after
    /// them say how often each rule intervened.
    pub strict: Strict,
    /// Whether the whole replay was the causal one (`--causal`): then the figures below are
    /// strict too, and the rules' counters say how causal resync used each event after its
    /// score.
    pub causal: bool,
    /// Rules turned off for this replay (`--without`), in both passes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules_off: Vec<infer::Rule>,
    pub nodes: u32,
    pub zone_size: u64,
    pub lazy_max_pages: u64,
    pub vmalloc_start: String,
    pub vmalloc_end: String,
    pub seed: SeedInfo,
    pub events: EventTally,
    /// Successful allocations whose predicted address equals the observed one.
    pub placement: Agreement,
    pub placement_after_warmup: Agreement,
    /// Line of the purge that ended warm-up, if any.
    pub warmup_line: Option<usize>,
    /// Failed attempts: whether the model also failed.
    pub failures: Agreement,
    pub nr_lazy: Agreement,
    pub nr_lazy_after_warmup: Agreement,
    pub npurged: Agreement,
    pub purges: Vec<PurgeCheck>,
    /// Divergences by class (placement and counters).
    pub divergence_classes: BTreeMap<&'static str, u64>,
    pub first_divergences: Vec<Divergence>,
    pub observed_high_water: String,
    pub predicted_high_water: String,
    pub observed_slots: SlotCounts,
    /// The snapshot's slots, before the first event (the same for both sides).
    pub seeded_slots: SlotCounts,
    pub predicted_slots: SlotCounts,
    /// Page tables the recording added, predicted against every observed source the trace has.
    pub page_table_growth: PageTableGrowth,
    pub warnings: BTreeMap<&'static str, u64>,
    pub first_warnings: Vec<String>,
    pub model: crate::model::ModelStats,
    pub locks: crate::model::LockCounts,
    /// Purges applied before their event because the trace showed their effect first.
    pub early_purges: u64,
    /// Purges started (pools decayed, batches detached) where the drain work item holding
    /// their event started, read ahead from the `purge_work` probe's records.
    pub purges_started_at_work: u64,
    /// Purges whose batch swapped one area for another of a different size so that the backlog
    /// after the purge matches the kernel's (`Replayer::reconcile_batch`).
    pub batches_reconciled: u64,
    /// Areas the causal replay gave back to the lazy lists after a purge event showed its
    /// batch larger than the kernel's (`Replayer::give_back_newest`).
    pub batch_areas_given_back: u64,
    /// Purges whose batch the causal replayer set node by node from the `purge_vmap_node`
    /// records' own counts (`nr_purged`, richer rungs only); the explained replayer does not
    /// use them.
    pub purges_by_node_counts: u64,
    /// Purges the causal replayer started at their drain item's `work_start` record and
    /// followed node by node from the richer rungs' records.
    pub purges_followed_by_node: u64,
    /// Areas the causal replayer moved into or out of a batch it had already taken, to match
    /// the nodes' counts at the purge event.
    pub node_count_areas_moved: u64,
    /// Areas whose node the causal replayer had guessed (the snapshot's) and moved to another
    /// node, lazy or pooled, because the nodes' counts placed them there.
    pub node_count_areas_retagged: u64,
    /// Adds of frees not seen yet that a free's backlog showed, which the causal replayer
    /// counted in its predicted backlog until their frees came (`late_adds`).
    pub late_adds_seen: u64,
    /// Late frees whose pages such an add had already counted.
    pub late_adds_matched: u64,
    /// Purges whose batch, when no single swap made the backlog after it match the kernel's,
    /// moved the node split instead: the newest areas of one node's batch back to lazy and as
    /// many of another node's oldest lazy areas in (`Replayer::shift_between_nodes`).
    pub batches_shifted: u64,
    /// The step between two nodes' detaches the fit ended with, in ns (`None`: the configured
    /// one, because the fit was off or too few purges told steps apart), and how many purges
    /// it weighed last.
    pub detach_step_fitted_ns: Option<u64>,
    pub detach_step_fit_purges: usize,
    /// Node loops whose end showed a drop below the node's batch, settled by trading its
    /// newest areas for the other node's oldest lazy ones (`TrackedModel::move_batch_tail`).
    pub batch_tails_moved: u64,
    /// Of `purge_swaps`, those whose purged area came from a batch older than the last two.
    pub purge_swaps_older: u64,
    /// Pool entries hidden as missing in the kernel and put back when the kernel was seen
    /// taking one of them from its pool.
    pub pool_entries_restored: u64,
    /// Entries of purge batches pushed early (on a reuse) that the model held back until
    /// `purge_vmap_node`'s loop, paced from the TLB flush to the purge event, reached them
    /// (`Replayer::loop_progress`).
    pub loop_entries_withheld: u64,
    /// Of those, the ones the kernel took before the pace reached them: the model's loop was
    /// moved up to them.
    pub loop_entries_caught_up: u64,
    /// Lazy areas the model added to a purge's batch at its event, when the batch (fixed at
    /// the drain item's start and split by node) came out smaller than the observed `npurged`
    /// (`TrackedModel::purge_late_oldest`).
    pub purged_late: u64,
    /// Early purges applied node by node at different points: a free saw one node's
    /// decrement of `vmap_lazy_nr` but not yet the other's.
    pub early_split_purges: u64,
    /// `nr_lazy` comparisons that agree only in the kernel's order of additions, not in the
    /// trace's order of events (counted in `nr_lazy.agreed`).
    pub nr_lazy_reordered: u64,
    /// Allocations of an area the model still held lazy after its purges, which the kernel's
    /// purge had taken instead of one the model's took: the two were swapped
    /// ([`Replayer::swap_purged`]).
    pub purge_swaps: u64,
    /// Purges matched to the drain work item that ran them, and what that told replay.
    pub drain_work: DrainWork,
    /// Allocations inside ranges the model held pooled, where the kernel had the space free:
    /// the overlapping pool entries went back to the free tree, as a decay the model missed
    /// (its pools differ from the kernel's) would have put them.
    pub pooled_found_free: u64,
    /// Ranges hidden because the kernel's choice showed them unavailable (pool entries from
    /// before the trace, stale model pool entries), and hidden ranges the kernel used later.
    pub hidden_ranges: u64,
    pub hidden_ranges_used: u64,
    /// Hidden ranges put into a pool because the kernel took the ones above them from it, in
    /// its order ([`Replayer::pool_hidden_below`]).
    pub hidden_ranges_pooled: u64,
    /// Hidden ranges given back to the free tree because the kernel's lowest fit was seen
    /// walking up through them ([`Replayer::free_hidden_above`]).
    pub hidden_ranges_freed: u64,
    /// Hidden ranges split into request-sized pieces because the kernel took their tops
    /// `InferenceParams::top_picks_to_split` times in a row ([`Replayer::split_merged_pool`]).
    pub hidden_ranges_split: u64,
    pub pooled_objects_at_end: u64,
    pub lazy_pages_at_end: u64,
    /// Successful allocations per node of the CPU that made them (the pool `node_alloc` would
    /// use), as the kernel did them: the observed side of the per-node share chart.
    pub allocs_per_node: Vec<u64>,
    /// The kernel's threshold as the last free reported it (`nr_lazy_max`), which differs
    /// from `lazy_max_pages` under `--lazy-max` or when online CPUs changed.
    pub observed_nr_lazy_max: Option<u64>,
    /// Observed footprint and backlog over time (charts), at most [`SERIES_CAP`] points evenly
    /// spaced in events, so memory stays bounded whatever the trace length.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub observed_series: Vec<ObservedSample>,
    /// meminfo `VmallocUsed` samples, when the trace has them (at most [`SERIES_CAP`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vmalloc_used_series: Vec<VmallocUsedSample>,
}

/// Purges and the drain work items (`work` records of the `purge_work` probe) that ran them,
/// matched through the look-ahead ([`lookahead`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DrainWork {
    /// Purge events held by a `drain_vmap_area_work` item of the same task.
    pub purges_in_work: u64,
    /// Purge events without one: synchronous callers (allocation failure, `vm_unmap_aliases`),
    /// traces recorded without `purge_work`, or an item ending beyond the look-ahead.
    pub purges_without_work: u64,
    /// Early purges not applied because the drain item of the coming purge had not started:
    /// what looked like the purge's effect (a lower backlog, reuse of a lazy range) cannot be
    /// its effect before the item runs.
    pub early_refused: u64,
    /// Frees (in the model) between a purge's detach bound (its item's start, or the previous
    /// purge event if later) and its event. The kernel leaves those freed after its real detach
    /// for the next purge; the model purges them all (see docs/inference.md, "The detach race").
    pub frees_after_work_start: u64,
}

/// Most free times remembered since the last purge event, for
/// [`DrainWork::frees_after_work_start`]: the bound on memory whatever the trace.
pub const FREE_LOG_CAP: usize = 1 << 16;

/// Most points a time series in a report keeps.
pub const SERIES_CAP: usize = 500;

/// One observed point: what the kernel showed at an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ObservedSample {
    pub ts_ns: u64,
    /// Bytes from VMALLOC_START to the highest end the kernel allocated during the trace (0
    /// before the first allocation): the measure of [`WhatIf::high_water_bytes`], so that the
    /// two compare. Snapshot areas are left out: the percpu chunks sit at the top of the range
    /// and would dwarf everything the workload did.
    pub high_water_bytes: u64,
    /// The kernel's `vmap_lazy_nr` as the last free reported it (the seeded backlog before).
    pub lazy_pages: u64,
}

/// One meminfo sample of `VmallocUsed`: pages of busy vmalloc areas, not the address span.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct VmallocUsedSample {
    pub ts_ns: u64,
    pub bytes: u64,
}

/// Keeps every `every`-th offered point and, when `cap` are kept, drops every other one and
/// doubles `every`: between `cap / 2` and `cap` points, evenly spaced in offers, in O(cap)
/// memory without knowing the trace's length in advance.
#[derive(Clone, Debug)]
pub(crate) struct Thinned<T> {
    cap: usize,
    every: u64,
    offered: u64,
    points: Vec<T>,
    /// The latest offer not kept, so that the series ends where the trace ends.
    last: Option<T>,
}

impl<T: Copy> Thinned<T> {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(2),
            every: 1,
            offered: 0,
            points: Vec::new(),
            last: None,
        }
    }

    pub(crate) fn offer(&mut self, point: T) {
        if self.offered.is_multiple_of(self.every) {
            self.points.push(point);
            self.last = None;
            if self.points.len() >= self.cap {
                let mut i = 0;
                self.points.retain(|_| {
                    i += 1;
                    i % 2 == 1
                });
                self.every = self.every.saturating_mul(2);
            }
        } else {
            self.last = Some(point);
        }
        self.offered += 1;
    }

    pub(crate) fn finish(mut self) -> Vec<T> {
        if let Some(p) = self.last {
            if self.points.len() >= self.cap {
                self.points.pop();
            }
            self.points.push(p);
        }
        self.points
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct EventTally {
    pub alloc: u64,
    pub alloc_failed: u64,
    pub free: u64,
    pub purge: u64,
    /// Allocations with a window other than VMALLOC that the model does not manage.
    pub alloc_out_of_model: u64,
    pub free_out_of_model: u64,
    pub lines: usize,
}

/// A trace opened for replay: the reader positioned after the snapshot, and the model
/// parameters its header gives (overridden by the options).
pub(crate) struct Opened<R: BufRead> {
    pub reader: TraceReader<R>,
    pub header: crate::trace::Header,
    pub snapshot: Box<crate::trace::VmallocSnapshot>,
    pub params: Params,
}

/// Reads header and snapshot and derives the model parameters; shared by observed-timing and
/// free-running replay so both seed from the same facts.
pub(crate) fn open<R: BufRead>(input: R, opts: &ReplayOptions) -> Result<Opened<R>, ReplayError> {
    let mut reader = TraceReader::new(input);
    let header = reader.read_header()?;
    let snapshot = match reader.next() {
        Some(Ok(Record::Vmallocinfo(s))) => s,
        Some(Ok(other)) => {
            return Err(ReplayError::NoSnapshot {
                line: reader.line(),
                found: format!("a {} record", crate::trace::reader::kind_name(&other)),
            })
        }
        Some(Err(e)) => return Err(e.into()),
        None => {
            return Err(ReplayError::NoSnapshot {
                line: reader.line() + 1,
                found: "the end of the file".into(),
            })
        }
    };
    let params = params_for(&header, &snapshot, opts)?;
    Ok(Opened {
        reader,
        header,
        snapshot,
        params,
    })
}

/// The model's parameters for a trace with `header` and start `snapshot`, with the what-if
/// overrides of `opts`: what [`open`] derives, for callers that have the records without a
/// file (`vmtrace whatif` streams them from the generator).
pub(crate) fn params_for(
    header: &crate::trace::Header,
    snapshot: &crate::trace::VmallocSnapshot,
    opts: &ReplayOptions,
) -> Result<Params, ReplayError> {
    if !snapshot.real_addresses {
        return Err(ReplayError::HashedSnapshot);
    }
    let (Some(vstart), Some(vend)) = (header.vmap.vmalloc_start, header.vmap.vmalloc_end) else {
        return Err(ReplayError::NoVmallocRange);
    };
    let page_size = header.system.page_size;
    let layout = match opts.nodes {
        Some(n) => NodeLayout::from_cpus(n, page_size),
        None => NodeLayout::new(header.vmap.nr_vmap_nodes, header.vmap.zone_size),
    };
    let layout = match opts.zone_pages {
        Some(z) => NodeLayout::new(layout.nr_nodes(), z.saturating_mul(page_size)),
        None => layout,
    };
    let lazy_max = opts.lazy_max_pages.unwrap_or(
        header
            .vmap
            .lazy_max_pages_tracepoint
            .unwrap_or(header.vmap.lazy_max_pages_computed),
    );
    Ok(Params {
        page_size,
        layout,
        lazy_max_pages: lazy_max,
        vmalloc_start: vstart.0,
        vmalloc_end: vend.0,
        five_level: Params::five_level_base(vstart.0),
        decay: crate::model::DecayRule::for_release(&header.system.kernel_release),
        variant: opts.variant,
    })
}

/// Replays a whole trace.
pub fn replay<R: BufRead>(input: R, opts: &ReplayOptions) -> Result<Report, ReplayError> {
    let Opened {
        reader,
        header,
        snapshot,
        params,
    } = open(input, opts)?;
    let mut causal = Replayer::new(Model::new(params.clone())?, opts);
    causal.causal = true;
    causal.rules.node_counts.recorded = infer::node_counts::decays_recorded(&header);
    causal.seed(&snapshot);
    let mut explained = if opts.causal {
        None
    } else {
        let mut r = Replayer::new(Model::new(params)?, opts);
        r.seed(&snapshot);
        Some(r)
    };
    let mut ahead = Lookahead::new(reader);
    while let Some(rec) = ahead.next_record() {
        let rec = rec?;
        if let Some(r) = explained.as_mut() {
            r.line = ahead.line();
            r.event(&rec, &*ahead)?;
        }
        causal.line = ahead.line();
        causal.event(&rec, &lookahead::Blind)?;
    }
    causal.tally.lines = ahead.lines_read();
    let strict = causal.strict();
    let node_counts = causal.rules.node_counts.clone();
    let late_adds = (causal.rules.late_adds_seen, causal.rules.late_adds_matched);
    let mut report = match explained {
        Some(mut r) => {
            r.tally.lines = ahead.lines_read();
            r.finish()
        }
        None => causal.finish(),
    };
    report.strict = strict;
    report.purges_by_node_counts = node_counts.used;
    report.purges_followed_by_node = node_counts.started;
    report.node_count_areas_moved = node_counts.moved;
    report.node_count_areas_retagged = node_counts.retagged;
    report.late_adds_seen = late_adds.0;
    report.late_adds_matched = late_adds.1;
    Ok(report)
}

/// Observed-timing replay: the event loop (this struct: the trace's position, the model, what
/// seeding and the model's own failures need), the scoring of each prediction ([`Scoring`]) and
/// the inference rules' state and counters ([`Rules`]).
struct Replayer<'o> {
    model: tracked::TrackedModel,
    opts: &'o ReplayOptions,
    line: usize,
    snapshot_start: u64,
    snapshot_end: u64,
    last_ts: u64,
    /// Areas whose last record before the snapshot is a free, with its time, and the last
    /// purge event before the snapshot: checked against the seeded lazy areas at the first
    /// event after it ([`Replayer::purged_before_snapshot`]), then dropped.
    pre_frees: FxHashMap<u64, u64>,
    pre_purge: Option<u64>,
    pre_checked: bool,
    /// A failed attempt was seen: the next purge is the full one of the failure path, and the
    /// next attempt of the same task and size is a retry that skips the pools.
    pending_failure: Option<(u32, u64)>,
    /// A free pushed the backlog over the threshold and no purge event has come yet.
    drain_pending: bool,
    /// Times of the model's lazy frees since the last purge event, at most [`FREE_LOG_CAP`].
    free_log: VecDeque<u64>,
    /// Time of the last purge event: a later purge cannot have detached before it (the
    /// purge mutex serialises them).
    last_purge_ts: u64,
    drain_work: DrainWork,
    /// Areas the model does not manage (other windows, conflicting placements): start → size.
    outside: FxHashMap<u64, u64>,
    seed: SeedInfo,
    tally: EventTally,
    /// Reads nothing ahead (it is given [`lookahead::Blind`]) and uses an allocation's own
    /// address only after scoring it: the replay the strict figures come from.
    causal: bool,
    warnings: BTreeMap<&'static str, u64>,
    first_warnings: Vec<String>,
    score: Scoring,
    rules: Rules,
}

/// What replay compares and reports: each prediction against the kernel's, the divergences,
/// warm-up, and the observed series the report draws.
struct Scoring {
    warmed_up: bool,
    warmup_line: Option<usize>,
    /// Trace time of the purge that ended the warm-up (the live view counts from it).
    warmup_ts: Option<u64>,
    /// The newest divergences, for the live view (the report keeps the first ones).
    recent: VecDeque<Divergence>,
    obs_slots: PageTableSlots,
    pred_slots: PageTableSlots,
    /// Predicted tables right after seeding, so growth counts only what the trace added.
    seed_tables: u64,
    seed_slots: SlotCounts,
    pt_page_events: Option<u64>,
    meminfo_kb: Option<(u64, u64)>,
    allocinfo_pt: Option<(i64, i64)>,
    obs_high: u64,
    pred_high: u64,
    /// The kernel's backlog as the last free reported it.
    obs_lazy: u64,
    obs_lazy_max: Option<u64>,
    /// Highest end the kernel allocated after the snapshot.
    obs_run_high: u64,
    obs_series: Thinned<ObservedSample>,
    vmalloc_used: Thinned<VmallocUsedSample>,
    obs_per_node: Vec<u64>,
    placement: Agreement,
    placement_warm: Agreement,
    failures: Agreement,
    nr_lazy: Agreement,
    nr_lazy_warm: Agreement,
    /// Each free's backlog against the model's before any rule adjusts the model for it.
    nr_lazy_exact: Agreement,
    npurged: Agreement,
    purges: Vec<PurgeCheck>,
    classes: BTreeMap<&'static str, u64>,
    divergences: Vec<Divergence>,
}

/// The inference rules' state and their intervention counters (`replay/infer/`, one file
/// per rule; docs/inference.md).
struct Rules {
    /// The purge the pending drain will report was already started, because the trace showed
    /// its effect before its event (an allocation of a purged area, a backlog that dropped):
    /// every node's batch is fixed, and the nodes whose decrement the trace showed are purged
    /// (all of them once [`PurgeInProgress::is_done`]); the rest wait for a later drop or the
    /// event.
    early: Option<PurgeInProgress>,
    /// Lazy areas the model held when it purged early: its unaligned prediction of `npurged`.
    early_lazy_before: Option<usize>,
    /// Frees since the last purge of areas the model does not hold (module and BPF JIT ranges,
    /// other windows). The kernel puts them on its lazy lists like any other, so its next
    /// purge counts them in `npurged`.
    foreign_lazy: u32,
    early_purges: u64,
    /// The model's pool entries the kernel's last pool pick skipped: `(node, size, entries)`.
    pool_skip: Option<(u32, u64, Vec<u64>)>,
    /// Purges started where their drain work item started.
    work_starts: u64,
    /// The next purge event `(pid, ts)` and the start of the drain item holding it.
    next_item: Option<((u32, u64), DrainItem)>,
    /// Purges whose batch was reconciled with the backlog after them (`reconcile_batch`).
    reconciled: u64,
    /// See [`Report::batches_shifted`].
    shifted: u64,
    /// See [`Report::batch_tails_moved`].
    batch_tails_moved: u64,
    /// The drain item of the started purge, which predicts when each node's lazy list was
    /// detached ([`Detach::at`]).
    detach: Option<Detach>,
    /// Lazy areas at the started purge's drain item start, and the frees since (event time,
    /// node): what [`StepFit`] learns from at the purge event.
    start_lazy: Option<usize>,
    detach_frees: Vec<(u64, u32)>,
    step_fit: StepFit,
    /// Batch entries `purge_vmap_node`'s loops have not reached yet, withheld from the pools
    /// until then: `(push time, node, addr, size)` in push order ([`Replayer::loop_progress`]).
    loop_pending: VecDeque<(u64, u32, u64, u64)>,
    loop_withheld: u64,
    loop_caught_up: u64,
    /// Frees still to join each node's batch of the started purge ([`Replayer::plan_joins`]).
    joins_left: Vec<u32>,
    /// Areas the last purge's batch held beyond every area the model had lazy, and the pages
    /// that purge subtracted ([`Replayer::join_owed`]).
    owed_joins: Option<(u32, u64)>,
    /// Pool entries hidden as a run since the last purge event: whole pools
    /// (`hide_unavailable`) and the entries a confirmed pool skip passed over.
    hidden_pools: Vec<HiddenPool>,
    pools_restored: u64,
    /// Lazy areas purged at a purge's event to make up its observed `npurged`.
    late_purged: u64,
    /// Early purges applied node by node at more than one point, and whether the current one
    /// is.
    early_split: u64,
    /// Adds a free's backlog showed before their events came (causal replay).
    late_adds_seen: u64,
    /// Late frees whose pages such adds held.
    late_adds_matched: u64,
    /// Pages of those adds whose frees have not come yet: part of the causal replay's
    /// predicted backlog, not of the model's (its drain trigger and purges do not see them).
    unseen_pages: u64,
    early_is_split: bool,
    /// The last frees since the model's last purge step, as `(observed nr_lazy, pages)`, at
    /// most `InferenceParams::add_order_span`: see [`Replayer::add_order_explains`].
    recent_frees: VecDeque<(u64, u64)>,
    /// The frees since the last purge event, as `(observed nr_lazy, pages)`, while there are
    /// fewer than `InferenceParams::since_purge_span`: their adds may have come before that purge's last
    /// subtractions (see [`Replayer::last_purge_nodes_explain`]). None after that.
    since_purge: Option<Vec<(u64, u64)>>,
    nr_lazy_reordered: u64,
    /// The areas the model's last purge took (the early one in progress included), for
    /// [`Replayer::swap_purged`].
    last_batch: Vec<crate::model::PurgedArea>,
    /// The batch of the purge before: a pair of purges (the second taking what raced the
    /// first's detach) splits the kernel's areas between them otherwise than the model's.
    prev_batch: Vec<crate::model::PurgedArea>,
    /// The batches before those, newest first, at most `InferenceParams::older_batches`: the last resort of
    /// [`Replayer::swap_purged`].
    older_batches: VecDeque<Vec<crate::model::PurgedArea>>,
    swapped: u64,
    /// See [`Report::purge_swaps_older`].
    swapped_older: u64,
    pooled_found_free: u64,
    /// Ranges hidden as unavailable in the kernel, and hidden ranges the kernel used later.
    hidden: u64,
    unhidden: u64,
    /// The last hidden range of exactly its request's size that the kernel took while the
    /// model's pool for it was empty: `(node, size, addr)` ([`Replayer::pool_hidden_below`]).
    hidden_pick: Option<(u32, u64, u64)>,
    hidden_pooled: u64,
    /// The last hidden range of exactly its request's size that the kernel took below the
    /// model's pick: `(size, addr)` ([`Replayer::free_hidden_above`]).
    hidden_low_pick: Option<(u64, u64)>,
    hidden_freed: u64,
    hidden_split: u64,
    /// The last kernel pick at the top of a hidden range and how many such picks, each right
    /// below the last, came in a row: `(node, size, addr, run)`
    /// ([`Replayer::split_merged_pool`]).
    top_pick: Option<(u32, u64, u64, usize)>,
    /// `(pid, lazy objects)` at the start of the drain item running now, from its `work_start`
    /// record (causal replay only).
    item_start: Option<(u32, u64, usize)>,
    /// Areas [`Replayer::give_back_newest`] returned to the lazy lists.
    batch_given_back: u64,
    /// What the richer rungs' `purge_vmap_node` records showed of each node's batch.
    node_counts: infer::node_counts::NodeCounts,
}

impl<'o> Replayer<'o> {
    fn new(mut model: Model, opts: &'o ReplayOptions) -> Self {
        model.index_pools(true);
        let nodes = model.params().layout.nr_nodes() as usize;
        Self {
            model: tracked::TrackedModel::new(model),
            opts,
            line: 2,
            snapshot_start: 0,
            snapshot_end: 0,
            last_ts: 0,
            pre_frees: FxHashMap::default(),
            pre_purge: None,
            pre_checked: false,
            pending_failure: None,
            drain_pending: false,
            free_log: VecDeque::new(),
            last_purge_ts: 0,
            drain_work: DrainWork::default(),
            outside: FxHashMap::default(),
            seed: SeedInfo::default(),
            tally: EventTally::default(),
            causal: opts.causal,
            warnings: BTreeMap::new(),
            first_warnings: Vec::new(),
            score: Scoring {
                warmed_up: false,
                warmup_line: None,
                warmup_ts: None,
                recent: VecDeque::new(),
                obs_slots: PageTableSlots::new(),
                pred_slots: PageTableSlots::new(),
                seed_tables: 0,
                seed_slots: SlotCounts::default(),
                pt_page_events: None,
                meminfo_kb: None,
                allocinfo_pt: None,
                obs_high: 0,
                pred_high: 0,
                obs_lazy: 0,
                obs_lazy_max: None,
                obs_run_high: 0,
                obs_series: Thinned::new(SERIES_CAP),
                vmalloc_used: Thinned::new(SERIES_CAP),
                obs_per_node: vec![0; nodes],
                placement: Agreement::default(),
                placement_warm: Agreement::default(),
                failures: Agreement::default(),
                nr_lazy: Agreement::default(),
                nr_lazy_warm: Agreement::default(),
                nr_lazy_exact: Agreement::default(),
                npurged: Agreement::default(),
                purges: Vec::new(),
                classes: BTreeMap::new(),
                divergences: Vec::new(),
            },
            rules: Rules {
                start_lazy: None,
                detach_frees: Vec::new(),
                step_fit: StepFit::new(opts),
                early: None,
                early_lazy_before: None,
                foreign_lazy: 0,
                early_purges: 0,
                work_starts: 0,
                next_item: None,
                reconciled: 0,
                shifted: 0,
                batch_tails_moved: 0,
                detach: None,
                loop_pending: VecDeque::new(),
                loop_withheld: 0,
                loop_caught_up: 0,
                joins_left: Vec::new(),
                owed_joins: None,
                hidden_pools: Vec::new(),
                pools_restored: 0,
                late_purged: 0,
                pool_skip: None,
                early_split: 0,
                late_adds_seen: 0,
                late_adds_matched: 0,
                unseen_pages: 0,
                early_is_split: false,
                recent_frees: VecDeque::new(),
                since_purge: None,
                nr_lazy_reordered: 0,
                last_batch: Vec::new(),
                prev_batch: Vec::new(),
                older_batches: VecDeque::new(),
                swapped_older: 0,
                swapped: 0,
                pooled_found_free: 0,
                hidden: 0,
                unhidden: 0,
                hidden_pick: None,
                hidden_pooled: 0,
                hidden_low_pick: None,
                hidden_freed: 0,
                hidden_split: 0,
                top_pick: None,
                batch_given_back: 0,
                item_start: None,
                node_counts: Default::default(),
            },
        }
    }

    fn warn(&mut self, kind: &'static str, message: String) -> Result<(), ReplayError> {
        if self.opts.strict {
            return Err(ReplayError::Strict {
                line: self.line,
                message,
            });
        }
        *self.warnings.entry(kind).or_default() += 1;
        if self.first_warnings.len() < 20 {
            self.first_warnings
                .push(format!("line {}: {message}", self.line));
        }
        Ok(())
    }

    /// The node tag a snapshot area gets. `alloc_vmap_area` tags every allocation of the
    /// VMALLOC window with its CPU's node when there is more than one, so a purge pools the
    /// area; the snapshot does not say which CPU that was. The node its address maps to stands
    /// in, as `free_vmap_area_noflush` picks for an untagged area.
    fn seed_tag(&mut self, addr: u64) -> u32 {
        let p = self.model.params();
        if p.variant.has_pools() && p.layout.nr_nodes() > 1 {
            if self.causal {
                // Only the causal replayer's node-count rule corrects a guessed tag.
                self.rules.node_counts.guessed_tag(addr);
            }
            p.layout.addr_to_node(addr) + 1
        } else {
            0
        }
    }

    fn seed(&mut self, snap: &crate::trace::VmallocSnapshot) {
        self.snapshot_start = snap.ts_start_ns;
        self.snapshot_end = snap.ts_end_ns;
        self.seed.pools_drained = snap.pools_drained;
        let page = self.model.params().page_size;
        for a in &snap.areas {
            let (start, size) = (a.start.0, a.size);
            let res = match a.kind {
                AreaKind::Busy => {
                    self.seed.busy += 1;
                    let tag = self.seed_tag(start);
                    self.model.seed_busy(start, size, tag, true)
                }
                AreaKind::VmMapRam => {
                    self.seed.vm_map_ram += 1;
                    let tag = self.seed_tag(start);
                    self.model.seed_busy(start, size, tag, false)
                }
                AreaKind::Unpurged => {
                    self.seed.unpurged += 1;
                    let tag = self.seed_tag(start);
                    self.model.seed_lazy(start, size, tag)
                }
            };
            match res {
                Ok(()) => {
                    if a.kind != AreaKind::Unpurged {
                        let guard = if a.kind == AreaKind::Busy { page } else { 0 };
                        let end = start + size - guard.min(size);
                        self.score.obs_slots.map(start, end);
                        self.score.pred_slots.map(start, end);
                        self.score.obs_high = self.score.obs_high.max(start + size);
                        self.score.pred_high = self.score.pred_high.max(start + size);
                    }
                }
                Err(ModelError::OutOfRange { .. }) => {
                    self.seed.outside_range += 1;
                    if a.kind != AreaKind::Unpurged {
                        self.outside.insert(start, size);
                    }
                }
                Err(_) => self.seed.rejected += 1,
            }
        }
        self.seed.lazy_pages = self.model.lazy_pages();
        self.score.obs_lazy = self.seed.lazy_pages;
        self.score.seed_tables = total_tables(&self.score.pred_slots.counts());
        self.score.seed_slots = self.score.pred_slots.counts();
    }

    fn event(&mut self, rec: &Record, ahead: &dyn DrainLookup) -> Result<(), ReplayError> {
        let Some(ts) = rec.ts_ns() else {
            return Ok(());
        };
        if ts < self.snapshot_start {
            self.seed.events_before_snapshot += 1;
            match rec {
                Record::Free(f) => {
                    self.pre_frees.insert(f.va_start.0, ts);
                }
                Record::Alloc(a) => {
                    self.pre_frees.remove(&a.addr.0);
                }
                Record::Purge(_) => self.pre_purge = Some(ts),
                _ => {}
            }
            return Ok(());
        }
        if !self.pre_checked {
            self.pre_checked = true;
            self.purged_before_snapshot();
        }
        if ts < self.last_ts {
            self.warn(
                "timestamp-backwards",
                format!(
                    "timestamp {ts} is earlier than the previous event's {}",
                    self.last_ts
                ),
            )?;
        }
        self.last_ts = self.last_ts.max(ts);
        let in_window = ts <= self.snapshot_end;
        if matches!(rec, Record::Alloc(_) | Record::Free(_)) {
            self.start_at_work(ts, ahead);
            self.loop_advance(ts);
        }
        match rec {
            Record::Alloc(a) => {
                self.alloc(a, in_window, ahead)?;
                self.observe(ts);
                Ok(())
            }
            Record::Free(f) => {
                self.free(f, in_window, ahead)?;
                self.score.obs_lazy = f.nr_lazy;
                self.score.obs_lazy_max = Some(f.nr_lazy_max);
                self.observe(ts);
                Ok(())
            }
            Record::Purge(p) => self.purge(p, ahead),
            Record::WorkStart(w) if self.causal && w.function == lookahead::DRAIN_FUNCTION => {
                self.work_start_seen(w.ctx.pid, w.ctx.ts_ns);
                self.rules.node_counts.item_started();
                self.causal_start_at_work();
                Ok(())
            }
            Record::Work(w) if self.opts.rule_on(infer::Rule::NodeCounts) => {
                let nodes = self.model.params().layout.nr_nodes();
                match self.rules.node_counts.observe(w, nodes) {
                    Some(infer::node_counts::Seen::Decay(node)) => self.node_decayed(node),
                    Some(infer::node_counts::Seen::Purged(node, count)) => {
                        self.node_purged(node, count);
                    }
                    None => {}
                }
                Ok(())
            }
            Record::PtPage(_) => {
                *self.score.pt_page_events.get_or_insert(0) += 1;
                Ok(())
            }
            Record::Meminfo(m) => {
                let first = self.score.meminfo_kb.map_or(m.page_tables_kb, |(f, _)| f);
                self.score.meminfo_kb = Some((first, m.page_tables_kb));
                self.score.vmalloc_used.offer(VmallocUsedSample {
                    ts_ns: m.ts_ns,
                    bytes: m.vmalloc_used_kb.saturating_mul(1024),
                });
                Ok(())
            }
            Record::Allocinfo(a) => {
                let first = self
                    .score
                    .allocinfo_pt
                    .map_or(a.pagetable.bytes, |(f, _)| f);
                self.score.allocinfo_pt = Some((first, a.pagetable.bytes));
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The snapshot is read after the probes attached, so the records before it show the
    /// last purge and each area's last free. An area freed before that purge and not
    /// allocated since is not lazy in the kernel, whatever the snapshot lists: on recordings
    /// started under load, the first free's `nr_lazy` came to exactly those areas' pages below
    /// the snapshot's backlog (5, 6, 9 and 16 areas in four recordings), and the kernel
    /// allocated them next.
    fn purged_before_snapshot(&mut self) {
        let frees = std::mem::take(&mut self.pre_frees);
        let Some(purge) = self.pre_purge else {
            return;
        };
        let mut stale: Vec<u64> = frees
            .into_iter()
            .filter(|&(_, ts)| ts < purge)
            .map(|(addr, _)| addr)
            .collect();
        stale.sort_unstable();
        for addr in stale {
            if self.model.seed_purged(addr) {
                self.seed.purged_before_snapshot += 1;
            }
        }
        self.seed.lazy_pages = self.model.lazy_pages();
        self.score.obs_lazy = self.seed.lazy_pages;
    }

    /// One point of the observed series after an allocation or a free.
    fn observe(&mut self, ts: u64) {
        let start = self.model.params().vmalloc_start;
        self.score.obs_series.offer(ObservedSample {
            ts_ns: ts,
            high_water_bytes: self.score.obs_run_high.saturating_sub(start),
            lazy_pages: self.score.obs_lazy,
        });
    }

    fn diverge(&mut self, d: Divergence) {
        *self.score.classes.entry(d.class).or_default() += 1;
        live::remember(&mut self.score.recent, &d);
        if self.score.divergences.len() < self.opts.max_divergences {
            self.score.divergences.push(d);
        }
    }

    /// The model state a divergence is shown with, taken before every prediction (the
    /// prediction changes it) but only formatted when the prediction turns out wrong.
    /// The model state an allocation of `size` on `cpu` meets. `lowest` (the free blocks that
    /// fit) is left empty: it is the costly part, and an allocation's own prediction leaves
    /// the free tree as it was once undone, so a caller fills it in only for a divergence
    /// ([`Replayer::lowest_fitting`]). Computed for every allocation, it took a fifth of the
    /// model core's time on the benchmark trace, where nothing diverges.
    fn context(&self, size: u64, cpu: u32) -> AllocContext {
        let m = &self.model;
        let node = m.params().layout.cpu_to_node(cpu);
        AllocContext {
            node,
            pool_pages: size / m.params().page_size,
            pool_len: m.pools().len(node, size),
            head: m.pools().head(node, size),
            lowest: Vec::new(),
            lazy_pages: m.lazy_pages(),
            busy: m.busy().len(),
        }
    }

    /// Fills in the lowest free blocks that fit `size` (see [`Replayer::context`]).
    fn fill_lowest(&self, context: &mut AllocContext, size: u64) {
        context.lowest = self.model.free_space().lowest_fitting(size, 3);
    }

    fn alloc(
        &mut self,
        a: &crate::trace::Alloc,
        in_window: bool,
        ahead: &dyn DrainLookup,
    ) -> Result<(), ReplayError> {
        let p = self.model.params().clone();
        let (addr, size) = (a.addr.0, a.size);
        let guard = !(a.align == a.size && a.size > p.page_size);
        let in_model = a.vstart.0 >= p.vmalloc_start && a.vend.0 <= p.vmalloc_end;
        let retry = self.pending_failure == Some((a.ctx.pid, size));
        if a.failed == 0 {
            self.rules.node_counts.known_tag(addr);
            self.pending_failure = None;
        }
        let req = AllocRequest {
            size,
            align: a.align.max(1),
            vstart: a.vstart.0,
            vend: a.vend.0,
            cpu: a.ctx.cpu,
            retry,
            guard,
        };
        if a.failed != 0 {
            self.tally.alloc_failed += 1;
            self.pending_failure = Some((a.ctx.pid, size));
            if !in_model {
                return Ok(());
            }
            let mut context = self.context(size, a.ctx.cpu);
            match self.model.alloc(&req) {
                Ok(Ok(got)) => {
                    self.score.failures.add(false);
                    let _ = self.model.undo_alloc(&got);
                    self.fill_lowest(&mut context, size);
                    self.diverge(Divergence {
                        line: self.line,
                        ts_ns: a.ctx.ts_ns,
                        kind: "alloc",
                        class: "kernel-failed-model-succeeded",
                        cpu: a.ctx.cpu,
                        size,
                        align: a.align,
                        observed: "failed".into(),
                        predicted: format!("{:#x}", got.addr),
                        context: context.to_string(),
                    });
                }
                Ok(Err(_)) => self.score.failures.add(true),
                Err(e) => self.warn("bad-request", format!("alloc: {e}"))?,
            }
            return Ok(());
        }
        if !in_model {
            self.tally.alloc_out_of_model += 1;
            self.outside.insert(addr, size);
            return Ok(());
        }
        if in_window && self.model.busy().get(&addr).is_some_and(|b| b.size == size) {
            self.seed.events_in_window_reflected += 1;
            return Ok(());
        }
        self.tally.alloc += 1;
        let node = p.layout.cpu_to_node(a.ctx.cpu) as usize;
        if let Some(n) = self.score.obs_per_node.get_mut(node) {
            *n += 1;
        }
        // The kernel's address inside a lazy area shows a purge had started there. The
        // causal replay scores the model's prediction first and purges only to resync.
        let reuse_first = !self.causal && self.opts.rule_on(infer::Rule::ReuseBeforeScoring);
        if reuse_first && self.reuse_shows_purge(addr, size) {
            self.purge_early_reused(ahead);
        }
        let mapped_end = |s: u64| s + size - if guard { p.page_size } else { 0 };
        self.score.obs_slots.map(addr, mapped_end(addr));
        self.score.obs_high = self.score.obs_high.max(addr + size);
        self.score.obs_run_high = self.score.obs_run_high.max(addr + size);
        let mut context = (self.score.divergences.len() < self.opts.max_divergences)
            .then(|| self.context(size, a.ctx.cpu));
        let predicted = match self.model.alloc(&req) {
            Ok(r) => r,
            Err(e) => {
                self.warn("bad-request", format!("alloc: {e}"))?;
                return Ok(());
            }
        };
        let pred_addr: Option<Allocated> = predicted.ok();
        if let Some(g) = &pred_addr {
            self.score.pred_slots.map(g.addr, mapped_end(g.addr));
            self.score.pred_high = self.score.pred_high.max(g.addr + size);
        }
        let ok = pred_addr.is_some_and(|g| g.addr == addr);
        self.score.placement.add(ok);
        if self.score.warmed_up {
            self.score.placement_warm.add(ok);
        }
        if ok {
            return Ok(());
        }
        if let Some(g) = &pred_addr {
            let _ = self.model.undo_alloc(g);
        }
        if !reuse_first && self.reuse_shows_purge(addr, size) {
            self.purge_early_reused(ahead);
        }
        if let Some(c) = context.as_mut() {
            self.fill_lowest(c, size);
        }
        let node32 = p.layout.cpu_to_node(a.ctx.cpu);
        let ahead_of_pick = self.entries_ahead_of_pick(pred_addr.as_ref(), node32, size, addr);
        self.loop_catch_up(addr);
        let claimed = self.claim_observed(&req, node32, addr, pred_addr.as_ref());
        let class = match (&pred_addr, &claimed) {
            (None, _) => "model-failed-kernel-succeeded",
            (_, Err(_)) => "observed-not-free-in-model",
            (Some(g), Ok(Placement::Pool)) if g.placement == Placement::Pool => {
                "both-pool-different-area"
            }
            (Some(_), Ok(Placement::Pool)) => "kernel-pool-hit-model-free-tree",
            (Some(g), Ok(_)) if g.placement == Placement::Pool => "model-pool-hit-kernel-free-tree",
            (Some(g), Ok(_)) if addr < g.addr => "kernel-lower-than-model",
            (Some(_), Ok(_)) => "kernel-higher-than-model",
        };
        if claimed.is_err() {
            // Keep the area out of the model so that its free is recognised, not an error.
            self.outside.insert(addr, size);
        }
        if matches!(claimed, Ok(Placement::Pool)) && !ahead_of_pick.is_empty() {
            self.pool_skip_seen(node32, size, ahead_of_pick);
        }
        if let (Some(g), Ok(Placement::FreeTree(_))) = (&pred_addr, &claimed) {
            // While a purge runs, the kernel's decay detaches each pool for a moment, and an
            // allocation then finds it empty: no evidence the pool is gone.
            let pool_gone = g.placement == Placement::Pool && self.rules.early.is_none();
            self.hide_unavailable(&req, addr, pool_gone);
        }
        self.diverge(Divergence {
            line: self.line,
            ts_ns: a.ctx.ts_ns,
            kind: "alloc",
            class,
            cpu: a.ctx.cpu,
            size,
            align: a.align,
            observed: format!("{addr:#x}"),
            predicted: pred_addr.map_or("failure".into(), |g| format!("{:#x}", g.addr)),
            context: context.map(|c| c.to_string()).unwrap_or_default(),
        });
        Ok(())
    }

    fn free(
        &mut self,
        f: &crate::trace::Free,
        in_window: bool,
        ahead: &dyn DrainLookup,
    ) -> Result<(), ReplayError> {
        let addr = f.va_start.0;
        if let Some(size) = self.outside.remove(&addr) {
            self.tally.free_out_of_model += 1;
            self.foreign_free();
            if self.model.free_untracked(size).1 {
                self.drain_pending = true;
            }
            return Ok(());
        }
        if self.model.busy().get(&addr).is_none() {
            if in_window && self.model.lazy().find(addr).is_some() {
                self.seed.events_in_window_reflected += 1;
                return Ok(());
            }
            return self.warn(
                "free-unknown-address",
                format!("free of {addr:#x}, which is not a busy area"),
            );
        }
        self.tally.free += 1;
        let own_pages =
            self.model.busy().get(&addr).map_or(0, |b| b.size) / self.model.params().page_size;
        let strict_ok = self.model.lazy_pages() + self.rules.unseen_pages + own_pages == f.nr_lazy;
        self.score.nr_lazy_exact.add(strict_ok);
        // A free whose add came long before its event reports a backlog from back then: not a
        // purge's drop, when the unseen adds hold its pages (`late_adds`).
        if !self.late_free(f.nr_lazy, own_pages) {
            self.backlog_drop_seen(f.nr_lazy, own_pages, ahead);
        }
        let before = self.model.lazy_pages() + self.rules.unseen_pages;
        let got = match self.model.free(addr) {
            Ok(g) => g,
            Err(e) => return self.warn("free-unknown-address", e.to_string()),
        };
        self.late_adds(f.nr_lazy, before, own_pages);
        self.join_owed(addr, got.size, got.nr_lazy, f.nr_lazy);
        if let (Some(left), Some(p)) = (
            self.rules.joins_left.get_mut(got.node as usize),
            self.rules.early.as_mut(),
        ) {
            if *left > 0 {
                *left -= 1;
                self.model.join_last_free(p, got.node);
            }
        }
        if let (Some(d), Some(n)) = (
            self.rules.detach.as_ref(),
            self.rules.early_lazy_before.as_mut(),
        ) {
            let nodes = self.model.params().layout.nr_nodes();
            if f.ctx.ts_ns < d.at(got.node, nodes, self.opts) {
                // Predicted to be on the lists before the detach.
                *n += 1;
            }
            self.rules.detach_frees.push((f.ctx.ts_ns, got.node));
        }
        self.work_start_free(got.node, f.ctx.ts_ns);
        if self.free_log.len() >= FREE_LOG_CAP {
            self.free_log.pop_front();
        }
        self.free_log.push_back(f.ctx.ts_ns);
        if self.seed.first_free_nr_lazy_offset.is_none() {
            self.seed.first_free_nr_lazy_offset = Some(f.nr_lazy as i64 - got.nr_lazy as i64);
        }
        if got.drain {
            self.drain_pending = true;
        }
        let exact = got.nr_lazy == f.nr_lazy;
        // A free soon after a purge event may have added its pages before some nodes of that
        // purge subtracted theirs (its event comes after, from a few ns to tens of µs): its
        // backlog then still holds those nodes' batches. That is the add order too.
        let pages = got.size / self.model.params().page_size;
        let since = self.rules.since_purge.take();
        // The causal replay counts exact agreement only: every figure it gives is strict.
        // The causal replay scores the free before the rules above adjusted the model for it,
        // and by exact agreement only: every figure it gives is strict.
        let ok = if self.causal {
            strict_ok
        } else {
            exact
                || self.add_order_explains(
                    f.nr_lazy,
                    got.nr_lazy,
                    ahead,
                    self.opts.infer.add_order_span,
                )
                || since.as_deref().is_some_and(|s| {
                    self.last_purge_nodes_explain(f.nr_lazy, got.nr_lazy, s)
                        || self.added_before_across_purge(f.nr_lazy, got.nr_lazy, pages, ahead)
                })
        };
        if let Some(mut s) = since.filter(|s| s.len() + 1 < self.opts.infer.since_purge_span) {
            s.push((f.nr_lazy, pages));
            self.rules.since_purge = Some(s);
        }
        if ok && !exact {
            self.rules.nr_lazy_reordered += 1;
        }
        if self.rules.recent_frees.len() >= self.opts.infer.add_order_span {
            self.rules.recent_frees.pop_front();
        }
        self.rules.recent_frees.push_back((f.nr_lazy, pages));
        self.score.nr_lazy.add(ok);
        if self.score.warmed_up {
            self.score.nr_lazy_warm.add(ok);
        }
        if !ok {
            let class = if f.nr_lazy < got.nr_lazy {
                "nr-lazy-kernel-lower"
            } else {
                "nr-lazy-kernel-higher"
            };
            self.diverge(Divergence {
                line: self.line,
                ts_ns: f.ctx.ts_ns,
                kind: "free",
                class,
                cpu: f.ctx.cpu,
                size: got.size,
                align: 0,
                observed: f.nr_lazy.to_string(),
                predicted: got.nr_lazy.to_string(),
                context: format!(
                    "lazy objects {}; purges so far {}",
                    self.model.lazy().objects(),
                    self.model.stats().purges
                ),
            });
        }
        Ok(())
    }

    fn purge(
        &mut self,
        p: &crate::trace::Purge,
        ahead: &dyn DrainLookup,
    ) -> Result<(), ReplayError> {
        self.tally.purge += 1;
        // Unseen adds leave with the purge, as the untracked frees do (`late_adds`).
        self.rules.unseen_pages = 0;
        self.loop_advance(u64::MAX);
        self.model.settle_subtractions(None);
        let full = self.pending_failure.is_some();
        let lazy_before = self.model.lazy().objects();
        self.drain_pending = false;
        // The batch is aligned with the observed `npurged`: the kernel detaches the lazy lists
        // at the start of the purge and emits the event at its end, so the frees that landed in
        // between stay lazy for the next purge, still counted in `nr_lazy`. Which frees those
        // were is a race the trace shows only through `npurged`; the model purges that many of
        // its oldest lazy areas (`Model::purge_oldest`). `npurged` agreement is measured
        // against the unaligned prediction (every lazy area at the purge), so it still says how
        // often no free raced the detach. See docs/model.md.
        match ahead.drain_holding(p.ctx.pid, p.ctx.ts_ns) {
            Some(item) => {
                self.drain_work.purges_in_work += 1;
                let bound = item.start_ns.max(self.last_purge_ts);
                let after = self.free_log.iter().rev().take_while(|&&t| t > bound);
                self.drain_work.frees_after_work_start += after.count() as u64;
            }
            None => self.drain_work.purges_without_work += 1,
        }
        // Areas outside the model were on the kernel's lazy lists too: they are part of its
        // count, and not of the model's batch.
        let foreign = self.foreign_in_batch();
        let in_model = p.npurged.saturating_sub(foreign);
        let unaligned =
            self.rules.early_lazy_before.take().unwrap_or(lazy_before) + foreign as usize;
        let unaligned = self.work_start_batch(p.ctx.pid).unwrap_or(unaligned);
        let unaligned = match self.rules.node_counts.take_predicted() {
            Some(at_detach) if self.causal => at_detach + foreign as usize,
            _ => unaligned,
        };
        if let (Some(d), Some(at_start)) = (self.rules.detach.take(), self.rules.start_lazy.take())
        {
            if let Some(joined) = (in_model as usize).checked_sub(at_start) {
                let nodes = self.model.params().layout.nr_nodes();
                self.rules
                    .step_fit
                    .observe(&d, nodes, self.opts, &self.rules.detach_frees, joined);
            }
        }
        self.rules.detach_frees.clear();
        self.rules.joins_left.clear();
        let nodes = self.model.params().layout.nr_nodes();
        let counts = self
            .rules
            .node_counts
            .take(p.npurged, nodes)
            .filter(|_| foreign == 0 && self.causal);
        let early = self.rules.early.take();
        self.rules.recent_frees.clear();
        let mut got = match (early, counts) {
            (Some(early), Some(counts)) if !full => {
                let mut got = self.model.purge_finish(early);
                self.match_node_counts(&mut got, &counts);
                got
            }
            (early, Some(counts)) => {
                if let Some(early) = early {
                    self.model.purge_finish(early);
                }
                self.purge_by_node_counts(full, &counts)
            }
            (Some(early), None) if !full => self.model.purge_finish(early),
            (early, None) => {
                if let Some(early) = early {
                    self.model.purge_finish(early);
                }
                self.model.purge_oldest(full, in_model as usize)
            }
        };
        self.top_up(&mut got, in_model);
        self.rules.owed_joins =
            (got.npurged < in_model).then(|| (in_model - got.npurged, got.pages));
        if self.causal && got.npurged > in_model {
            let excess = got.npurged - in_model;
            self.give_back_newest(&mut got, excess);
        }
        if !full {
            self.reconcile_batch(&mut got, ahead);
        }
        self.rules.since_purge = Some(Vec::new());
        let older = std::mem::replace(
            &mut self.rules.prev_batch,
            std::mem::replace(&mut self.rules.last_batch, got.batch.clone()),
        );
        if self.rules.older_batches.len() >= self.opts.infer.older_batches {
            self.rules.older_batches.pop_back();
        }
        self.rules.older_batches.push_front(older);
        self.last_purge_ts = self.last_purge_ts.max(p.ctx.ts_ns);
        self.free_log.clear();
        self.drain_pending = self.model.lazy_pages() > self.model.params().lazy_max_pages;
        // What was hidden may have been waiting for this purge in the kernel (lazy there while
        // the model had already purged it): give it back. Pool entries from before the trace
        // are hidden again by the next allocation that shows them unavailable.
        self.model.unhide_after_purge();
        self.rules.hidden_pools.clear();
        let predicted = u32::try_from(unaligned).unwrap_or(u32::MAX);
        let ok = predicted == p.npurged;
        self.score.npurged.add(ok);
        if !ok {
            self.diverge(Divergence {
                line: self.line,
                ts_ns: p.ctx.ts_ns,
                kind: "purge",
                class: if p.npurged < predicted {
                    "npurged-kernel-lower"
                } else {
                    "npurged-kernel-higher"
                },
                cpu: p.ctx.cpu,
                size: 0,
                align: 0,
                observed: p.npurged.to_string(),
                predicted: predicted.to_string(),
                context: format!(
                    "lazy objects before {lazy_before}; model purged {}",
                    got.npurged
                ),
            });
        }
        self.score.purges.push(PurgeCheck {
            line: self.line,
            ts_ns: p.ctx.ts_ns,
            observed_npurged: p.npurged,
            predicted_npurged: predicted,
            pages: got.pages,
            pooled: got.pooled,
            decayed: got.decayed,
            helpers: got.helpers,
            full,
        });
        let nodes = self.model.params().layout.nr_nodes();
        let rebuilt = match self.model.params().variant {
            Variant::Global => got.npurged > 0,
            _ => got.nodes_pooled == nodes,
        };
        if !self.score.warmed_up && !full && rebuilt {
            self.score.warmed_up = true;
            self.score.warmup_line = Some(self.line);
            self.score.warmup_ts = Some(p.ctx.ts_ns);
        }
        Ok(())
    }

    /// Whether `[addr, addr+size)` overlaps an area the model still holds as lazy.
    fn lazy_overlaps(&self, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size);
        if self
            .model
            .free_space()
            .block_containing(addr)
            .is_some_and(|(_, e)| end <= e)
        {
            return false;
        }
        self.model.lazy().overlaps(addr, end)
    }

    /// The strict figures, meaningful when this replayer is the causal one.
    fn strict(&self) -> Strict {
        Strict {
            placement: self.score.placement,
            placement_after_warmup: self.score.placement_warm,
            nr_lazy: self.score.nr_lazy_exact,
            npurged: self.score.npurged,
        }
    }

    fn finish(self) -> Report {
        let p = self.model.params();
        Report {
            strict: self.strict(),
            causal: self.causal,
            rules_off: self.opts.without.clone(),
            variant: p.variant,
            nodes: p.layout.nr_nodes(),
            zone_size: p.layout.zone_size(),
            lazy_max_pages: p.lazy_max_pages,
            vmalloc_start: format!("{:#x}", p.vmalloc_start),
            vmalloc_end: format!("{:#x}", p.vmalloc_end),
            seed: self.seed,
            events: self.tally,
            placement: self.score.placement,
            placement_after_warmup: self.score.placement_warm,
            warmup_line: self.score.warmup_line,
            failures: self.score.failures,
            nr_lazy: self.score.nr_lazy,
            nr_lazy_after_warmup: self.score.nr_lazy_warm,
            npurged: self.score.npurged,
            purges: self.score.purges,
            divergence_classes: self.score.classes,
            first_divergences: self.score.divergences,
            observed_high_water: format!("{:#x}", self.score.obs_high),
            predicted_high_water: format!("{:#x}", self.score.pred_high),
            observed_slots: self.score.obs_slots.counts(),
            seeded_slots: self.score.seed_slots,
            predicted_slots: self.score.pred_slots.counts(),
            page_table_growth: PageTableGrowth {
                predicted_new_tables: total_tables(&self.score.pred_slots.counts())
                    .saturating_sub(self.score.seed_tables),
                observed_pt_page_events: self.score.pt_page_events,
                meminfo_page_tables_delta_kb: self
                    .score
                    .meminfo_kb
                    .map(|(f, l)| l as i64 - f as i64),
                allocinfo_pagetable_delta_bytes: self
                    .score
                    .allocinfo_pt
                    .map(|(f, l)| l.saturating_sub(f)),
            },
            warnings: self.warnings,
            first_warnings: self.first_warnings,
            model: self.model.stats().clone(),
            locks: self.model.locks().clone(),
            early_purges: self.rules.early_purges,
            purges_started_at_work: self.rules.work_starts,
            batches_reconciled: self.rules.reconciled,
            batch_areas_given_back: self.rules.batch_given_back,
            purges_by_node_counts: self.rules.node_counts.used,
            purges_followed_by_node: self.rules.node_counts.started,
            node_count_areas_moved: self.rules.node_counts.moved,
            node_count_areas_retagged: self.rules.node_counts.retagged,
            late_adds_seen: self.rules.late_adds_seen,
            late_adds_matched: self.rules.late_adds_matched,
            batches_shifted: self.rules.shifted,
            detach_step_fitted_ns: self.rules.step_fit.fitted(),
            detach_step_fit_purges: self.rules.step_fit.purges(),
            batch_tails_moved: self.rules.batch_tails_moved,
            purge_swaps_older: self.rules.swapped_older,
            pool_entries_restored: self.rules.pools_restored,
            loop_entries_withheld: self.rules.loop_withheld,
            loop_entries_caught_up: self.rules.loop_caught_up,
            purged_late: self.rules.late_purged,
            early_split_purges: self.rules.early_split,
            nr_lazy_reordered: self.rules.nr_lazy_reordered,
            purge_swaps: self.rules.swapped,
            drain_work: self.drain_work,
            pooled_found_free: self.rules.pooled_found_free,
            hidden_ranges: self.rules.hidden,
            hidden_ranges_used: self.rules.unhidden,
            hidden_ranges_pooled: self.rules.hidden_pooled,
            hidden_ranges_freed: self.rules.hidden_freed,
            hidden_ranges_split: self.rules.hidden_split,
            pooled_objects_at_end: self.model.pools().objects(),
            lazy_pages_at_end: self.model.lazy_pages(),
            allocs_per_node: self.score.obs_per_node,
            observed_nr_lazy_max: self.score.obs_lazy_max,
            observed_series: self.score.obs_series.finish(),
            vmalloc_used_series: self.score.vmalloc_used.finish(),
        }
    }
}

/// What [`Replayer::context`] took: plain values, so that taking it costs no formatting.
struct AllocContext {
    node: u32,
    pool_pages: u64,
    pool_len: usize,
    head: Option<u64>,
    /// Lowest free blocks that fit, as `(start, end)`.
    lowest: Vec<(u64, u64)>,
    lazy_pages: u64,
    busy: usize,
}

impl std::fmt::Display for AllocContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node {} pool[{} pages] len {} head ",
            self.node, self.pool_pages, self.pool_len
        )?;
        match self.head {
            Some(h) => write!(f, "{h:#x}")?,
            None => f.write_str("-")?,
        }
        f.write_str("; lowest free blocks that fit: ")?;
        for (i, &(s, e)) in self.lowest.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{s:#x}+{:#x}", e - s)?;
        }
        write!(f, "; lazy {} pages; busy {}", self.lazy_pages, self.busy)
    }
}

/// Pool entries replay hid as a run: put back in order from the one after an entry the kernel
/// is seen taking.
struct HiddenPool {
    node: u32,
    size: u64,
    /// From the pool's head.
    entries: Vec<u64>,
    /// A whole pool seen missing (rather than entries a pick passed over): put back before the
    /// next decay too, since the kernel decays `len >> 2` from a pool it still holds.
    back_before_decay: bool,
}

fn total_tables(c: &SlotCounts) -> u64 {
    c.pte_tables + c.pmd_tables + c.pud_tables
}

#[cfg(test)]
mod tests {
    use super::testkit::trace;
    use super::*;
    use crate::synth::VMALLOC_START;

    #[test]
    fn the_vmalloc_base_tells_the_paging_mode() {
        let five_level = Params::five_level_base;
        assert!(!five_level(0xffff_c900_0000_0000), "4-level base");
        assert!(
            five_level(0xffa0_0000_0000_0000),
            "5-level base without KASLR"
        );
        assert!(
            five_level(0xff78_b1b7_8000_0000),
            "5-level base a KASLR guest had"
        );
    }

    /// The synth trace with an area the snapshot lists as unpurged, and records before the
    /// snapshot: its allocation, its free, and (with `purged`) a purge after the free.
    fn with_stale_unpurged(purged: bool) -> Vec<u8> {
        const X: &str = "0xffffc90100000000";
        let text = String::from_utf8(trace()).expect("utf-8");
        let mut lines = text.lines();
        let mut out = String::new();
        out += lines.next().expect("header");
        out.push('\n');
        let mut snap: serde_json::Value =
            serde_json::from_str(lines.next().expect("snapshot")).expect("json");
        snap["areas"]
            .as_array_mut()
            .expect("areas")
            .push(serde_json::json!({
                "start": X, "end": "0xffffc90100002000", "size": 8192, "kind": "unpurged"
            }));
        out += &format!("{snap}\n");
        let ctx = r#""cpu":0,"tgid":9,"pid":9,"comm":"k""#;
        out += &format!("{{\"type\":\"alloc\",\"ts_ns\":999000000,{ctx},\"addr\":\"{X}\",\"size\":8192,\"align\":1,\"vstart\":\"0xffffc90000000000\",\"vend\":\"0xffffe8ffffffffff\",\"failed\":0}}\n");
        out += &format!("{{\"type\":\"free\",\"ts_ns\":999100000,{ctx},\"va_start\":\"{X}\",\"nr_lazy\":2,\"nr_lazy_max\":16384}}\n");
        if purged {
            out += &format!("{{\"type\":\"purge\",\"ts_ns\":999200000,{ctx},\"start\":\"{X}\",\"end\":\"0xffffc90100002000\",\"npurged\":1}}\n");
        }
        for l in lines {
            out += l;
            out.push('\n');
        }
        out.into_bytes()
    }

    /// A snapshot that lists as unpurged an area the records before it show purged: pooled
    /// at the first event after the snapshot, the backlog agrees from the first free, as on the
    /// trace without that area; without the purge record it stays lazy, and every free until
    /// the first purge is one area off.
    #[test]
    fn an_area_purged_before_the_snapshot_is_not_seeded_lazy() {
        let opts = ReplayOptions::default();
        let plain = replay(&trace()[..], &opts).expect("replay");
        let fixed = replay(&with_stale_unpurged(true)[..], &opts).expect("replay");
        let kept = replay(&with_stale_unpurged(false)[..], &opts).expect("replay");
        assert_eq!(fixed.seed.purged_before_snapshot, 1);
        assert_eq!(kept.seed.purged_before_snapshot, 0);
        assert_eq!(fixed.seed.first_free_nr_lazy_offset, Some(0));
        assert_eq!(kept.seed.first_free_nr_lazy_offset, Some(-2));
        assert_eq!(fixed.strict.nr_lazy, plain.strict.nr_lazy);
        assert!(
            kept.strict.nr_lazy.agreed + 10 < fixed.strict.nr_lazy.agreed,
            "{:?} against {:?}",
            kept.strict.nr_lazy,
            fixed.strict.nr_lazy
        );
    }

    #[test]
    fn zone_pages_overrides_the_header_zone_and_moves_areas_between_nodes() {
        let bytes = trace();
        let header = open(&bytes[..], &ReplayOptions::default()).expect("open");
        let hl = header.params.layout;
        assert_eq!((hl.nr_nodes(), hl.zone_size()), (2, 16 * 4096));
        let opts = ReplayOptions {
            zone_pages: Some(1),
            ..ReplayOptions::default()
        };
        let zl = open(&bytes[..], &opts).expect("open").params.layout;
        assert_eq!((zl.nr_nodes(), zl.zone_size()), (2, 4096));
        // The page after VMALLOC_START is in node 0's first zone by the header, node 1's with
        // one-page zones.
        assert_eq!(hl.addr_to_node(VMALLOC_START + 4096), 0);
        assert_eq!(zl.addr_to_node(VMALLOC_START + 4096), 1);
        // With --nodes the kernel's rule gives the zone unless --zone-pages overrides it too.
        let n = ReplayOptions {
            nodes: Some(4),
            ..ReplayOptions::default()
        };
        assert_eq!(
            open(&bytes[..], &n)
                .expect("open")
                .params
                .layout
                .zone_size(),
            16 * 4096
        );
        let nz = ReplayOptions {
            nodes: Some(4),
            zone_pages: Some(3),
            ..ReplayOptions::default()
        };
        let l = open(&bytes[..], &nz).expect("open").params.layout;
        assert_eq!((l.nr_nodes(), l.zone_size()), (4, 3 * 4096));

        // The replay reports the zone it used, and areas take other nodes' busy locks.
        let by_header = replay(&bytes[..], &ReplayOptions::default()).expect("replay");
        let by_page = replay(&bytes[..], &opts).expect("replay");
        assert_eq!(by_header.zone_size, 16 * 4096);
        assert_eq!(by_page.zone_size, 4096);
        assert_ne!(by_header.locks.busy, by_page.locks.busy);
        assert_eq!(
            by_header.locks.busy.iter().sum::<u64>(),
            by_page.locks.busy.iter().sum::<u64>()
        );
    }

    #[test]
    fn observed_series_is_bounded_and_ends_at_the_last_event() {
        let mut t = Thinned::new(10);
        for i in 0..1000u64 {
            t.offer(i);
        }
        let pts = t.finish();
        assert!(pts.len() <= 10 && pts.len() >= 5, "{pts:?}");
        assert_eq!(pts[0], 0);
        assert_eq!(*pts.last().unwrap(), 999);
        // Evenly spaced apart from the final point.
        let steps: Vec<u64> = pts.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            steps[..steps.len() - 1].windows(2).all(|w| w[0] == w[1]),
            "{steps:?}"
        );

        let r = replay(&trace()[..], &ReplayOptions::default()).expect("replay");
        assert!(!r.observed_series.is_empty() && r.observed_series.len() <= SERIES_CAP);
        assert!(r
            .observed_series
            .windows(2)
            .all(|w| w[0].ts_ns <= w[1].ts_ns && w[0].high_water_bytes <= w[1].high_water_bytes));
        assert_eq!(
            r.allocs_per_node.iter().sum::<u64>(),
            r.events.alloc,
            "{:?}",
            r.allocs_per_node
        );
        assert!(
            r.allocs_per_node.iter().all(|&n| n > 0),
            "both CPUs allocate"
        );
    }
}
