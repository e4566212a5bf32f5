//! `App`: everything `vmtrace top` shows, updated from [`Event`]s and never touched by I/O.
//!
//! The state is separate from the render functions (bpftop/bottom habit) so that tests can drive
//! it with fixed events and render it into a `TestBackend`, and so that a live session and a
//! replay share every line after the event source.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::model::SlotCounts;
use crate::probe::loader::PAGE_PROBES;
use crate::trace::{AreaKind, Header, LockClass, ProbeInfo, PtLevel, Record, VmallocSnapshot};

/// What the header says of the page probes while `top` keeps them off.
pub const PAGE_PROBES_OFF: &str = "off: press t to attach (hooks the page allocator)";

/// Longest time window, in one-second buckets: the ring buffers never grow beyond it.
pub const MAX_WINDOW_SECS: usize = 600;
/// Shortest time window `-` can reach.
pub const MIN_WINDOW_SECS: usize = 10;
/// Records held back while paused before further ones are dropped (and counted), so a long
/// pause on a busy machine cannot grow memory without bound.
pub const MAX_PENDING: usize = 1_000_000;
/// Size-histogram buckets in pages (guard page included): 1, 2, 3-4, 5-8, … , >512.
pub const SIZE_BUCKETS: usize = 11;

/// One input, data batch or tick: the only way anything reaches the [`App`].
#[derive(Debug)]
pub enum Event {
    Input(Key),
    /// Facts about the machine and the probes, sent once by a source before its first batch.
    Start(Box<SourceInfo>),
    Data(Batch),
    /// Top callers from a `/proc/vmallocinfo` snapshot (live only), or why there are none.
    Callers(Result<Vec<Caller>, String>),
    /// Model agreement as far as the source can give it, or why it cannot.
    Model(Box<Result<ModelView, String>>),
    /// The source stopped (replay ended, ring buffer broke): shown in the header.
    SourceEnded(String),
    /// The live source's page probes: after each toggle, and each second while they are on.
    PageProbes(PageProbes),
    /// The terminal changed size: redraw.
    Resize,
    Tick,
}

/// Requests from the screen to a live source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Attach (true) or detach the page probes (`probe::loader::PAGE_PROBES`).
    PageProbes(bool),
}

/// The page probes of a live source, as it last reported them. They hook the page allocator,
/// which the whole kernel calls, so they start off and the panel shows what they cost.
#[derive(Clone, Debug, PartialEq)]
pub struct PageProbes {
    pub on: bool,
    /// The rung they attach on, e.g. "tracepoint".
    pub rung: String,
    /// Why the last toggle failed.
    pub error: Option<String>,
    /// Program runs and their run time as the kernel counted them since the probes were
    /// attached, over `secs` seconds.
    pub runs: u64,
    pub run_ns: u64,
    pub secs: f64,
}

/// The keys `vmtrace top` understands, decoupled from crossterm so tests need no terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Tab,
    BackTab,
    Left,
    Right,
    Up,
    Down,
    Enter,
    Esc,
    CtrlC,
}

/// Records in stream order plus where the stream's clock stands.
#[derive(Debug, Default)]
pub struct Batch {
    pub records: Vec<Record>,
    /// Stream time (CLOCK_BOOTTIME of the traced machine) up to which this batch is complete;
    /// advances the rate buckets even when no event arrived.
    pub now_ns: u64,
    /// Events lost so far in the ring buffer, all kinds (a running total, not a delta).
    pub lost_total: u64,
}

/// Where the events come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    Live,
    Replay { name: String, speed: f64 },
}

/// What the header shows; from the trace header (replay) or the running kernel (live).
#[derive(Clone, Debug)]
pub struct SourceInfo {
    pub mode: Mode,
    pub kernel: String,
    pub cpus: u32,
    pub nodes: u32,
    pub zone_size: u64,
    pub page_size: u64,
    /// `lazy_max_pages`, until the first free event reports the kernel's own value.
    pub lazy_max_pages: u64,
    pub probes: Vec<ProbeInfo>,
    /// Shown in reverse video under the header, e.g. why live capture fell back to a replay.
    pub banner: Option<String>,
}

impl SourceInfo {
    pub fn from_header(h: &Header, mode: Mode, banner: Option<String>) -> Self {
        Self {
            mode,
            kernel: h.system.kernel_release.clone(),
            cpus: h.system.online_cpus,
            nodes: h.vmap.nr_vmap_nodes.max(1),
            zone_size: h.vmap.zone_size.max(1),
            page_size: h.system.page_size.max(1),
            lazy_max_pages: h
                .vmap
                .lazy_max_pages_tracepoint
                .unwrap_or(h.vmap.lazy_max_pages_computed),
            probes: h.probes.clone(),
            banner,
        }
    }

    /// Whether the logical probe attached on some rung (it is listed and not marked off).
    pub fn probe_attached(&self, logical: &str) -> Result<(), String> {
        let mine: Vec<&ProbeInfo> = self
            .probes
            .iter()
            .filter(|p| p.logical.as_deref() == Some(logical))
            .collect();
        if mine.is_empty() {
            return Err(format!("{logical} probe not in this session"));
        }
        if let Some(off) = mine.iter().find(|p| p.rung == "off" || p.rung == "none") {
            return Err(format!(
                "{logical} probe {}",
                off.note.clone().unwrap_or_else(|| "not attached".into())
            ));
        }
        Ok(())
    }
}

/// Bytes held by one caller in a vmallocinfo snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub caller: String,
    pub bytes: u64,
    pub areas: u64,
}

/// Aggregates a snapshot's busy areas by caller, biggest first.
pub fn top_callers(snap: &VmallocSnapshot, n: usize) -> Vec<Caller> {
    let mut by: HashMap<&str, (u64, u64)> = HashMap::new();
    for a in snap.areas.iter().filter(|a| a.kind == AreaKind::Busy) {
        let name = a.caller.as_deref().unwrap_or("(no caller)");
        // Drop the `+off/len` so areas from one function add up.
        let name = name.split('+').next().unwrap_or(name);
        let e = by.entry(name).or_default();
        e.0 += a.size;
        e.1 += 1;
    }
    let mut v: Vec<Caller> = by
        .into_iter()
        .map(|(c, (bytes, areas))| Caller {
            caller: c.to_string(),
            bytes,
            areas,
        })
        .collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.caller.cmp(&b.caller)));
    v.truncate(n);
    v
}

/// What the reference model says about the stream (see docs/model.md).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelView {
    /// Where the figures come from, e.g. "whole-trace replay, nodes variant".
    pub scope: String,
    /// The strict figures (nothing read ahead), shown before the explained ones.
    pub strict_placement_pct: f64,
    pub strict_nr_lazy_pct: f64,
    pub strict_npurged_pct: f64,
    /// Placement after warm-up (from the first purge on, when the model's pools and lazy
    /// lists have been through one drain), strict and explained: the figures that say how the
    /// model does once it is past the state no snapshot shows.
    pub warm_strict_pct: f64,
    pub warm_pct: f64,
    pub warm_compared: u64,
    pub warmup_line: Option<usize>,
    pub placement_pct: f64,
    pub placement_compared: u64,
    pub nr_lazy_pct: f64,
    pub npurged_pct: f64,
    pub pooled_objects: u64,
    pub predicted_high_water: String,
    pub observed_high_water: String,
    /// Page-table slots the model's placements touched, and the kernel's observed ones.
    pub predicted_slots: SlotCounts,
    pub observed_slots: SlotCounts,
    /// The newest divergences, newest first.
    pub recent: Vec<String>,
}

/// Events per one-second bucket of stream time, newest last; at most [`MAX_WINDOW_SECS`].
#[derive(Clone, Debug, Default)]
pub struct Series {
    buckets: VecDeque<u64>,
    /// Index (seconds since the stream start) of the newest bucket.
    newest: u64,
}

impl Series {
    /// Adds `n` to the bucket of second `sec`, opening empty buckets up to it.
    pub fn add(&mut self, sec: u64, n: u64) {
        self.advance(sec);
        if sec + (self.buckets.len() as u64) <= self.newest {
            return; // older than the window
        }
        let back = (self.newest - sec) as usize;
        let i = self.buckets.len() - 1 - back;
        self.buckets[i] += n;
    }

    /// Sets the bucket of second `sec` to at least `v` (for peak-per-second series).
    pub fn max_in(&mut self, sec: u64, v: u64) {
        self.advance(sec);
        if let Some(b) = self.buckets.back_mut() {
            *b = (*b).max(v);
        }
    }

    /// Opens empty buckets up to second `sec`.
    pub fn advance(&mut self, sec: u64) {
        if self.buckets.is_empty() {
            self.buckets.push_back(0);
            self.newest = sec;
            return;
        }
        while self.newest < sec {
            self.newest += 1;
            self.buckets.push_back(0);
            if self.buckets.len() > MAX_WINDOW_SECS {
                self.buckets.pop_front();
            }
        }
    }

    /// The last `n` buckets, oldest first.
    pub fn last(&self, n: usize) -> Vec<u64> {
        let skip = self.buckets.len().saturating_sub(n);
        self.buckets.iter().skip(skip).copied().collect()
    }

    /// The newest complete second (the one before the bucket being filled).
    pub fn rate(&self) -> u64 {
        let n = self.buckets.len();
        if n >= 2 {
            self.buckets[n - 2]
        } else {
            0
        }
    }
}

/// Panels in focus order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Panel {
    Rates,
    Sizes,
    Lazy,
    Nodes,
    Footprint,
    PageTables,
    Locks,
    Callers,
    Model,
}

impl Panel {
    pub const ALL: [Panel; 9] = [
        Panel::Rates,
        Panel::Sizes,
        Panel::Lazy,
        Panel::Nodes,
        Panel::Footprint,
        Panel::PageTables,
        Panel::Locks,
        Panel::Callers,
        Panel::Model,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Panel::Rates => "rates /s",
            Panel::Sizes => "allocation size (pages)",
            Panel::Lazy => "lazy backlog",
            Panel::Nodes => "vmap nodes",
            Panel::Footprint => "VA footprint",
            Panel::PageTables => "page tables",
            Panel::Locks => "lock contention",
            Panel::Callers => "top callers (vmallocinfo)",
            Panel::Model => "model agreement",
        }
    }

    fn index(self) -> usize {
        Panel::ALL.iter().position(|p| *p == self).unwrap_or(0)
    }
}

/// Counters that `r` resets.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub alloc: u64,
    pub free: u64,
    pub purge: u64,
    pub failed: u64,
    pub alloc_rate: Series,
    pub free_rate: Series,
    pub purge_rate: Series,
    /// Peak lazy backlog (pages) per second.
    pub lazy_peak: Series,
    /// Stream seconds at which purges happened, newest last (markers under the backlog).
    pub purge_marks: VecDeque<u64>,
    pub purged_objects: u64,
    pub sizes: [u64; SIZE_BUCKETS],
    /// Successful allocations and bytes per vmap node.
    pub node_allocs: Vec<u64>,
    pub node_bytes: Vec<u64>,
    /// Count and total wait per lock class.
    pub locks: BTreeMap<LockClass, (u64, u64)>,
    pub pt_pages: BTreeMap<&'static str, u64>,
    pub high_water: u64,
    /// Lost events when the counters were last reset, so `lost` shows losses since then.
    pub lost_base: u64,
    /// The model's slots (predicted, observed) when the counters were last reset or the page
    /// probes attached, so the page-table panel sets the probe's pages since then beside the
    /// model's tables since then.
    pub slot_base: Option<(SlotCounts, SlotCounts)>,
}

/// The whole state of `vmtrace top`.
#[derive(Debug)]
pub struct App {
    pub info: Option<SourceInfo>,
    pub c: Counters,
    /// Busy areas the stream has shown (start snapshot plus allocations): address → bytes.
    busy: HashMap<u64, u64>,
    pub busy_bytes: u64,
    pub lazy_bytes: u64,
    /// Current lazy backlog in pages, as the last free reported it (0 after a purge).
    pub lazy_pages: u64,
    pub lost_total: u64,
    pub meminfo_pt_kb: Option<u64>,
    pub callers: Result<Vec<Caller>, String>,
    pub model: Result<ModelView, String>,
    pub ended: Option<String>,
    /// Stream time of the first record, the origin of the rate buckets.
    origin_ns: Option<u64>,
    pub now_sec: u64,
    pub focus: Panel,
    pub zoomed: bool,
    pub paused: bool,
    pub help: bool,
    pub window_secs: usize,
    pub quit: bool,
    pending: Vec<Batch>,
    pending_records: usize,
    pub dropped_while_paused: u64,
    /// The live source's page probes; `None` for a replay, which has no probes to toggle.
    pub page_probes: Option<PageProbes>,
    /// Requests for the source, taken by the screen loop after each event.
    pub controls: Vec<Control>,
    /// Set by anything that changes what is drawn; the loop clears it after drawing.
    pub dirty: bool,
}

impl Default for App {
    fn default() -> Self {
        Self::new()
    }
}

impl App {
    pub fn new() -> Self {
        Self {
            info: None,
            // The model counts slots from the start snapshot, and so do the counters.
            c: Counters {
                slot_base: Some(Default::default()),
                ..Counters::default()
            },
            busy: HashMap::new(),
            busy_bytes: 0,
            lazy_bytes: 0,
            lazy_pages: 0,
            lost_total: 0,
            meminfo_pt_kb: None,
            callers: Err("waiting for the first snapshot".into()),
            model: Err("waiting for the model".into()),
            ended: None,
            origin_ns: None,
            now_sec: 0,
            focus: Panel::Rates,
            zoomed: false,
            paused: false,
            help: false,
            window_secs: 60,
            quit: false,
            pending: Vec::new(),
            pending_records: 0,
            dropped_while_paused: 0,
            page_probes: None,
            controls: Vec::new(),
            dirty: true,
        }
    }

    /// Applies one event.
    pub fn handle(&mut self, ev: Event) {
        match ev {
            Event::Input(k) => self.key(k),
            Event::Start(info) => {
                let nodes = info.nodes as usize;
                self.c.node_allocs = vec![0; nodes];
                self.c.node_bytes = vec![0; nodes];
                self.info = Some(*info);
                self.dirty = true;
            }
            Event::Data(b) => {
                if self.paused {
                    if self.pending_records + b.records.len() > MAX_PENDING {
                        self.dropped_while_paused += b.records.len() as u64;
                    } else {
                        self.pending_records += b.records.len();
                        self.pending.push(b);
                    }
                } else {
                    self.apply(b);
                }
            }
            Event::Callers(c) => {
                self.callers = c;
                self.dirty = !self.paused;
            }
            Event::Model(m) => {
                self.model = *m;
                if self.c.slot_base.is_none() {
                    // Attached or reset before the model had a view: count from its first.
                    self.c.slot_base = self.model_slots();
                }
                self.dirty = !self.paused;
            }
            Event::SourceEnded(why) => {
                self.ended = Some(why);
                self.dirty = true;
            }
            Event::PageProbes(pp) => {
                let was_on = self.page_probes.as_ref().is_some_and(|p| p.on);
                if pp.on && !was_on {
                    // Counted from the attach on, beside the model's tables from then on.
                    self.c.pt_pages.clear();
                    self.c.slot_base = self.model_slots();
                }
                if let Some(info) = &mut self.info {
                    for p in &mut info.probes {
                        let page = p
                            .logical
                            .as_deref()
                            .is_some_and(|l| PAGE_PROBES.contains(&l));
                        if page && pp.on {
                            p.rung = pp.rung.clone();
                            p.note = None;
                        } else if page {
                            p.rung = "off".into();
                            p.note = Some(PAGE_PROBES_OFF.into());
                        }
                    }
                }
                self.page_probes = Some(pp);
                self.dirty = true;
            }
            Event::Resize => self.dirty = true,
            Event::Tick => {}
        }
    }

    /// Handles one key.
    pub fn key(&mut self, k: Key) {
        self.dirty = true;
        if self.help && !matches!(k, Key::Char('q') | Key::CtrlC) {
            // Any key closes the help.
            self.help = false;
            return;
        }
        match k {
            Key::Char('q') | Key::CtrlC => self.quit = true,
            Key::Esc if self.zoomed => self.zoomed = false,
            Key::Esc => self.quit = true,
            Key::Char('p') | Key::Char(' ') => self.toggle_pause(),
            Key::Tab | Key::Right | Key::Down => self.move_focus(1),
            Key::BackTab | Key::Left | Key::Up => self.move_focus(Panel::ALL.len() - 1),
            Key::Enter => self.zoomed = !self.zoomed,
            Key::Char('+') | Key::Char('=') => {
                self.window_secs = (self.window_secs * 2).min(MAX_WINDOW_SECS)
            }
            Key::Char('-') => self.window_secs = (self.window_secs / 2).max(MIN_WINDOW_SECS),
            Key::Char('r') => self.reset(),
            Key::Char('?') | Key::Char('h') => self.help = true,
            Key::Char('t') => match &self.page_probes {
                Some(pp) => self.controls.push(Control::PageProbes(!pp.on)),
                None => self.dirty = false,
            },
            _ => self.dirty = false,
        }
    }

    fn move_focus(&mut self, by: usize) {
        let n = Panel::ALL.len();
        self.focus = Panel::ALL[(self.focus.index() + by) % n];
    }

    fn toggle_pause(&mut self) {
        self.paused = !self.paused;
        if !self.paused {
            for b in std::mem::take(&mut self.pending) {
                self.apply(b);
            }
            self.pending_records = 0;
        }
    }

    /// Clears the counters, rates and histograms; the VA footprint is state, not a counter,
    /// so it stays (its high-water mark restarts from the current footprint).
    pub fn reset(&mut self) {
        let nodes = self.c.node_allocs.len();
        self.c = Counters {
            node_allocs: vec![0; nodes],
            node_bytes: vec![0; nodes],
            high_water: self.busy_bytes + self.lazy_bytes,
            lost_base: self.lost_total,
            slot_base: self.model_slots(),
            ..Counters::default()
        };
        self.c.alloc_rate.advance(self.now_sec);
        self.dropped_while_paused = 0;
    }

    /// The model's page-table slots now, (predicted, observed).
    fn model_slots(&self) -> Option<(SlotCounts, SlotCounts)> {
        self.model
            .as_ref()
            .ok()
            .map(|m| (m.predicted_slots, m.observed_slots))
    }

    /// Records held back by a pause.
    pub fn pending_records(&self) -> usize {
        self.pending_records
    }

    fn sec(&mut self, ts: u64) -> u64 {
        let origin = *self.origin_ns.get_or_insert(ts);
        ts.saturating_sub(origin) / 1_000_000_000
    }

    fn page_size(&self) -> u64 {
        self.info.as_ref().map_or(4096, |i| i.page_size)
    }

    /// Applies a data batch to the counters.
    pub fn apply(&mut self, b: Batch) {
        self.dirty = true;
        self.lost_total = self.lost_total.max(b.lost_total);
        for r in b.records {
            self.record(r);
        }
        if b.now_ns > 0 && self.origin_ns.is_some() {
            let s = self.sec(b.now_ns);
            if s > self.now_sec {
                self.now_sec = s;
            }
        }
        let now = self.now_sec;
        for s in [
            &mut self.c.alloc_rate,
            &mut self.c.free_rate,
            &mut self.c.purge_rate,
            &mut self.c.lazy_peak,
        ] {
            s.advance(now);
        }
        while self
            .c
            .purge_marks
            .front()
            .is_some_and(|&m| m + (MAX_WINDOW_SECS as u64) < now)
        {
            self.c.purge_marks.pop_front();
        }
        self.c.high_water = self.c.high_water.max(self.busy_bytes + self.lazy_bytes);
    }

    fn record(&mut self, r: Record) {
        match r {
            Record::Header(_) | Record::Footer(_) | Record::Allocinfo(_) => {}
            Record::Vmallocinfo(s) => self.seed(&s),
            Record::Alloc(a) => {
                let s = self.sec(a.ctx.ts_ns);
                self.now_sec = self.now_sec.max(s);
                self.c.alloc += 1;
                self.c.alloc_rate.add(s, 1);
                if a.failed != 0 {
                    self.c.failed += 1;
                    return;
                }
                let pages = a.size.div_ceil(self.page_size());
                self.c.sizes[size_bucket(pages)] += 1;
                if let Some(info) = &self.info {
                    let node = ((a.addr.0 / info.zone_size) % u64::from(info.nodes)) as usize;
                    if let (Some(n), Some(b)) = (
                        self.c.node_allocs.get_mut(node),
                        self.c.node_bytes.get_mut(node),
                    ) {
                        *n += 1;
                        *b += a.size;
                    }
                }
                if let Some(old) = self.busy.insert(a.addr.0, a.size) {
                    self.busy_bytes = self.busy_bytes.saturating_sub(old);
                }
                self.busy_bytes += a.size;
                self.c.high_water = self.c.high_water.max(self.busy_bytes + self.lazy_bytes);
            }
            Record::Free(f) => {
                let s = self.sec(f.ctx.ts_ns);
                self.now_sec = self.now_sec.max(s);
                self.c.free += 1;
                self.c.free_rate.add(s, 1);
                if let Some(size) = self.busy.remove(&f.va_start.0) {
                    self.busy_bytes = self.busy_bytes.saturating_sub(size);
                    self.lazy_bytes += size;
                }
                self.lazy_pages = f.nr_lazy;
                self.c.lazy_peak.max_in(s, f.nr_lazy);
                if let Some(info) = self.info.as_mut() {
                    if f.nr_lazy_max > 0 {
                        info.lazy_max_pages = f.nr_lazy_max;
                    }
                }
            }
            Record::Purge(p) => {
                let s = self.sec(p.ctx.ts_ns);
                self.now_sec = self.now_sec.max(s);
                self.c.purge += 1;
                self.c.purge_rate.add(s, 1);
                self.c.purged_objects += u64::from(p.npurged);
                self.c.purge_marks.push_back(s);
                // A purge drains every lazy list; the next free reports the new backlog.
                self.lazy_pages = 0;
                self.lazy_bytes = 0;
            }
            Record::Contention(c) => {
                let e = self.c.locks.entry(c.class).or_default();
                e.0 += 1;
                e.1 += c.wait_ns;
            }
            Record::PtPage(p) => {
                let level = match p.level {
                    PtLevel::Pte => "pte",
                    PtLevel::Pmd => "pmd",
                    PtLevel::Pud => "pud",
                    PtLevel::P4d => "p4d",
                };
                *self.c.pt_pages.entry(level).or_default() += 1;
            }
            Record::Meminfo(m) => self.meminfo_pt_kb = Some(m.page_tables_kb),
            // Work, latency and any kind added later: not shown (yet).
            _ => {}
        }
    }

    /// Seeds the footprint from a start snapshot: busy areas and lazily freed ones.
    fn seed(&mut self, s: &VmallocSnapshot) {
        for a in &s.areas {
            match a.kind {
                AreaKind::Unpurged => self.lazy_bytes += a.size,
                AreaKind::Busy | AreaKind::VmMapRam => {
                    if s.real_addresses {
                        if let Some(old) = self.busy.insert(a.start.0, a.size) {
                            self.busy_bytes = self.busy_bytes.saturating_sub(old);
                        }
                    }
                    self.busy_bytes += a.size;
                }
            }
        }
        self.c.high_water = self.c.high_water.max(self.busy_bytes + self.lazy_bytes);
        if let Some(info) = &self.info {
            if matches!(info.mode, Mode::Replay { .. }) && !s.real_addresses {
                self.callers = Err("snapshot addresses hashed".into());
            }
        }
    }

    /// Lost events since the last reset.
    pub fn lost(&self) -> u64 {
        self.lost_total.saturating_sub(self.c.lost_base)
    }
}

/// Histogram bucket of an allocation of `pages` pages: 0 for 1, 1 for 2, 2 for 3-4, …
pub fn size_bucket(pages: u64) -> usize {
    if pages <= 1 {
        return 0;
    }
    let b = (64 - (pages - 1).leading_zeros()) as usize;
    b.min(SIZE_BUCKETS - 1)
}

/// Label of a histogram bucket.
pub fn size_label(bucket: usize) -> String {
    match bucket {
        0 => "1".into(),
        1 => "2".into(),
        b if b == SIZE_BUCKETS - 1 => format!(">{}", 1u64 << (b - 1)),
        b => format!("{}-{}", (1u64 << (b - 1)) + 1, 1u64 << b),
    }
}
