//! A bounded look-ahead over the trace for observed-timing replay: which drain work item ran a
//! purge, and whether it had started.
//!
//! The kernel's drain work (`drain_vmap_area_work`) decays the pools and detaches every node's
//! lazy list at the start of `__purge_vmap_area_lazy`, but the `purge_vmap_area_lazy` event
//! fires at its end. The `purge_work` probe's `work` record tells when the item started, but it
//! is written at the item's *end*, so in the time-ordered trace it comes after the purge event
//! it contains. Replay therefore reads a little ahead: a record is handed out only once the
//! records up to [`WINDOW_NS`] after it (or [`MAX_RECORDS`] of them, or the end of the trace)
//! have been read, and the drain items among those are searched for the one holding a purge
//! event. Replay uses the match to refuse an "early" purge before the item has started (the
//! kernel cannot have purged yet) and to count the frees that race with the detach.
//!
//! Memory stays bounded by [`MAX_RECORDS`] whatever the trace length; a drain item that ends
//! further away than the window is simply not found, and that purge is treated as one without
//! a work record.

use std::collections::VecDeque;
use std::io::BufRead;

use crate::trace::{ReadError, Record, TraceReader};

/// How far past a record the look-ahead reads: well above the drain work's usual run time (tens
/// of microseconds to ~10 ms on a busy machine, the reason for the unbound-workqueue fix).
pub const WINDOW_NS: u64 = 200_000_000;

/// Most records held at once, whatever the window: the bound on memory.
pub const MAX_RECORDS: usize = 1 << 16;

/// The kernel function of the drain work item in `work` records.
pub const DRAIN_FUNCTION: &str = "drain_vmap_area_work";

/// The pool decays of the richer rungs in `work` records: each node's, right before its detach.
pub use crate::probe::ladder::DECAY_FUNCTION;

/// Most pool decays remembered, whatever the window. A decay's record comes before the record
/// of the drain item it ran in (written at the item's end), and the decays are looked up only
/// when replay reaches that item's start, possibly after handing them out: so they are kept
/// past their hand-out, the newest this many (two per purge on two nodes; a purge's decays
/// come within its item, well inside [`WINDOW_NS`]).
pub const MAX_DECAYS: usize = 4096;

/// One drain work item: the kworker's pid and its `[start, end]` in CLOCK_BOOTTIME ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainItem {
    pub pid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The purge's TLB flush, right after its last lazy-list detach, if recorded.
    pub flush_ns: Option<u64>,
}

impl DrainItem {
    /// Whether a purge event of task `pid` at `ts` ran inside this item.
    pub fn holds(&self, pid: u32, ts: u64) -> bool {
        self.pid == pid && self.start_ns <= ts && ts <= self.end_ns
    }
}

/// The drain item a `work` record describes, if it is one.
pub fn drain_item(rec: &Record) -> Option<DrainItem> {
    match rec {
        Record::Work(w) if w.function == DRAIN_FUNCTION => Some(DrainItem {
            pid: w.ctx.pid,
            start_ns: w.start_ns,
            end_ns: w.start_ns.saturating_add(w.duration_ns),
            flush_ns: w.flush_ns,
        }),
        _ => None,
    }
}

/// Records held ahead of the one being replayed, indexed for the lookups replay makes. Fed by a
/// reader ([`Lookahead`]) or pushed as they arrive (`vmtrace top`'s live model,
/// [`super::live`]); both hand a record out under the same rule ([`Ahead::covered`]), so the
/// same records give the same replay either way.
pub struct Ahead {
    /// Records read ahead, each with its line and its index in the stream.
    buf: VecDeque<(usize, Result<Record, ReadError>)>,
    /// Drain items and purge events among `buf`, with their stream index, so that lookups do
    /// not walk the whole buffer (replay asks on every free while a drain is pending).
    drains: VecDeque<(u64, DrainItem)>,
    purges: VecDeque<(u64, u32, u64, u32)>,
    /// The newest pool decays read, as `(pid, start_ns, end_ns)`, kept after hand-out (see
    /// [`MAX_DECAYS`]).
    decays: VecDeque<(u32, u64, u64)>,
    /// Frees among `buf` as `(index, va_start, nr_lazy, ts)`, for [`DrainLookup::frees_ahead`].
    frees: VecDeque<(u64, u64, u64, u64)>,
    /// Stream index of the next record read, and of the next handed out.
    read: u64,
    handed: u64,
    window_ns: u64,
    max_records: usize,
    /// Line of the record last handed out.
    line: usize,
}

impl Ahead {
    pub fn new(window_ns: u64, max_records: usize) -> Self {
        Self {
            buf: VecDeque::new(),
            drains: VecDeque::new(),
            purges: VecDeque::new(),
            decays: VecDeque::new(),
            frees: VecDeque::new(),
            read: 0,
            handed: 0,
            window_ns,
            max_records: max_records.max(1),
            line: 0,
        }
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Line of the record last handed out.
    pub fn line(&self) -> usize {
        self.line
    }

    /// Timestamp of the newest record held (records without a time do not move it).
    fn horizon(&self) -> Option<u64> {
        self.buf
            .iter()
            .rev()
            .find_map(|(_, r)| r.as_ref().ok().and_then(Record::ts_ns))
    }

    /// Whether the records held from position `from` on reach far enough past it: the cap is
    /// reached, or the newest time is more than the window after that record's.
    fn covered(&self, from: usize) -> bool {
        if self.buf.len().saturating_sub(from) >= self.max_records {
            return true;
        }
        match (self.buf.get(from), self.horizon()) {
            (Some((_, Ok(rec))), Some(h)) => rec
                .ts_ns()
                .is_some_and(|f| h > f.saturating_add(self.window_ns)),
            _ => false,
        }
    }

    /// Takes in the next record of the stream, read from `line`.
    pub fn push(&mut self, line: usize, r: Result<Record, ReadError>) {
        if let Ok(rec) = &r {
            if let Some(d) = drain_item(rec) {
                self.drains.push_back((self.read, d));
            } else if let Record::Purge(p) = rec {
                self.purges
                    .push_back((self.read, p.ctx.pid, p.ctx.ts_ns, p.npurged));
            } else if let Record::Free(f) = rec {
                self.frees
                    .push_back((self.read, f.va_start.0, f.nr_lazy, f.ctx.ts_ns));
            } else if let Record::Work(w) = rec {
                if w.function == DECAY_FUNCTION {
                    if self.decays.len() >= MAX_DECAYS {
                        self.decays.pop_front();
                    }
                    let end = w.start_ns.saturating_add(w.duration_ns);
                    self.decays.push_back((w.ctx.pid, w.start_ns, end));
                }
            }
        }
        self.read += 1;
        self.buf.push_back((line, r));
    }

    /// The oldest record held, once the records after it cover the window as a reader's would
    /// when replay gets to it (or at once when `at_end`: nothing more will come).
    pub fn pop_ready(&mut self, at_end: bool) -> Option<Result<Record, ReadError>> {
        if at_end || self.covered(1) {
            self.pop()
        } else {
            None
        }
    }

    fn pop(&mut self) -> Option<Result<Record, ReadError>> {
        let (line, r) = self.buf.pop_front()?;
        self.line = line;
        let at = self.handed;
        self.handed += 1;
        while self.drains.front().is_some_and(|&(i, _)| i <= at) {
            self.drains.pop_front();
        }
        while self.purges.front().is_some_and(|&(i, _, _, _)| i <= at) {
            self.purges.pop_front();
        }
        while self.frees.front().is_some_and(|&(i, ..)| i <= at) {
            self.frees.pop_front();
        }
        Some(r)
    }

    /// The drain item among the records read ahead that holds a purge event of task `pid` at
    /// `ts`: the item's `work` record comes after the event because it is written at its end.
    pub fn drain_holding(&self, pid: u32, ts: u64) -> Option<DrainItem> {
        self.drains
            .iter()
            .map(|&(_, d)| d)
            .find(|d| d.holds(pid, ts))
    }

    /// The pool decays that ran in drain item `item`, as `(start_ns, end_ns)` in the order
    /// they ran: node 0's first, as `__purge_vmap_area_lazy` goes through the nodes.
    pub fn decays_in(&self, item: &DrainItem) -> Vec<(u64, u64)> {
        let mut d: Vec<(u64, u64)> = self
            .decays
            .iter()
            .filter(|&&(pid, start, end)| {
                pid == item.pid && item.start_ns <= start && end <= item.end_ns
            })
            .map(|&(_, start, end)| (start, end))
            .collect();
        d.sort_unstable();
        d
    }

    /// The size of the area at `va` when its allocation is read ahead, before its next free:
    /// an area allocated after the record just handed out, which replay does not hold yet.
    pub fn size_allocated_ahead(&self, va: u64) -> Option<u64> {
        for (_, r) in &self.buf {
            match r {
                Ok(Record::Alloc(a)) if a.addr.0 == va && a.failed == 0 => return Some(a.size),
                Ok(Record::Free(f)) if f.va_start.0 == va => return None,
                _ => {}
            }
        }
        None
    }

    /// The next purge event read ahead, as `(pid, ts)`.
    pub fn next_purge(&self) -> Option<(u32, u64)> {
        self.purges.front().map(|&(_, pid, ts, _)| (pid, ts))
    }

    /// `npurged` of the next purge event read ahead.
    pub fn next_npurged(&self) -> Option<u32> {
        self.purges.front().map(|&(_, _, _, n)| n)
    }

    /// Up to `max` frees read ahead before the next purge event, as `(va_start, nr_lazy)`.
    pub fn frees_ahead(&self, max: usize) -> Vec<(u64, u64)> {
        self.frees_before_purge()
            .take(max)
            .map(|&(_, va, nr, _)| (va, nr))
            .collect()
    }

    /// Up to `max` frees read ahead before the next purge event, as `(va_start, ts_ns)`.
    pub fn frees_ahead_timed(&self, max: usize) -> Vec<(u64, u64)> {
        self.frees_before_purge()
            .take(max)
            .map(|&(_, va, _, ts)| (va, ts))
            .collect()
    }

    fn frees_before_purge(&self) -> impl Iterator<Item = &(u64, u64, u64, u64)> {
        let stop = self.purges.front().map_or(u64::MAX, |&(i, _, _, _)| i);
        self.frees.iter().take_while(move |&&(i, ..)| i < stop)
    }
}

/// Records of a trace, read ahead by up to a window. Read errors are handed out in their place
/// in the stream, after every record before them.
pub struct Lookahead<R: BufRead> {
    reader: TraceReader<R>,
    ahead: Ahead,
    /// The reader returned its end or an error: nothing more to read.
    done: bool,
}

impl<R: BufRead> Lookahead<R> {
    pub fn new(reader: TraceReader<R>) -> Self {
        Self::with_limits(reader, WINDOW_NS, MAX_RECORDS)
    }

    pub fn with_limits(reader: TraceReader<R>, window_ns: u64, max_records: usize) -> Self {
        Self {
            reader,
            ahead: Ahead::new(window_ns, max_records),
            done: false,
        }
    }

    /// Line of the record last handed out.
    pub fn line(&self) -> usize {
        self.ahead.line()
    }

    /// Lines read from the input so far (at the end: all of them).
    pub fn lines_read(&self) -> usize {
        self.reader.line()
    }

    fn fill(&mut self) {
        while !self.done && !self.ahead.covered(0) {
            match self.reader.next() {
                Some(r) => {
                    self.done = r.is_err();
                    self.ahead.push(self.reader.line(), r);
                }
                None => self.done = true,
            }
        }
    }

    /// The next record, after reading ahead past it.
    pub fn next_record(&mut self) -> Option<Result<Record, ReadError>> {
        self.fill();
        let r = self.ahead.pop()?;
        self.fill();
        Some(r)
    }
}

impl<R: BufRead> std::ops::Deref for Lookahead<R> {
    type Target = Ahead;
    fn deref(&self) -> &Ahead {
        &self.ahead
    }
}

/// What replay asks of the records read ahead; a trait so that the replayer does not carry the
/// reader's type parameter.
pub trait DrainLookup {
    /// The drain item holding a purge event of task `pid` at `ts`, if read ahead.
    fn drain_holding(&self, pid: u32, ts: u64) -> Option<DrainItem>;
    /// The pool decays that ran in `item`, in order, as `(start_ns, end_ns)`; empty when not
    /// recorded (the tracepoint rung cannot time them).
    fn decays_in(&self, _item: &DrainItem) -> Vec<(u64, u64)> {
        Vec::new()
    }
    /// The size of the area at `va` when its allocation is read ahead, before its next free.
    fn size_allocated_ahead(&self, _va: u64) -> Option<u64> {
        None
    }
    /// The next purge event read ahead, as `(pid, ts)`.
    fn next_purge(&self) -> Option<(u32, u64)>;
    /// `npurged` of the next purge event read ahead: how many lazy areas its detach took.
    fn next_npurged(&self) -> Option<u32>;
    /// Up to `max` frees read ahead before the next purge event, as `(va_start, nr_lazy)`.
    fn frees_ahead(&self, _max: usize) -> Vec<(u64, u64)> {
        Vec::new()
    }
    /// Up to `max` frees read ahead before the next purge event, as `(va_start, ts_ns)`.
    fn frees_ahead_timed(&self, _max: usize) -> Vec<(u64, u64)> {
        Vec::new()
    }
}

/// The future as a causal replay sees it: nothing. Every question about records after the
/// current one is answered "not read ahead", which is what a trace recorded without the
/// `purge_work` probe already gives, so each rule falls back to what earlier records show.
/// The strict figures come from a replay through this lookup.
pub struct Blind;

impl DrainLookup for Blind {
    fn drain_holding(&self, _pid: u32, _ts: u64) -> Option<DrainItem> {
        None
    }
    fn next_purge(&self) -> Option<(u32, u64)> {
        None
    }
    fn next_npurged(&self) -> Option<u32> {
        None
    }
}

impl DrainLookup for Ahead {
    fn drain_holding(&self, pid: u32, ts: u64) -> Option<DrainItem> {
        Ahead::drain_holding(self, pid, ts)
    }
    fn decays_in(&self, item: &DrainItem) -> Vec<(u64, u64)> {
        Ahead::decays_in(self, item)
    }
    fn size_allocated_ahead(&self, va: u64) -> Option<u64> {
        Ahead::size_allocated_ahead(self, va)
    }
    fn next_purge(&self) -> Option<(u32, u64)> {
        Ahead::next_purge(self)
    }
    fn next_npurged(&self) -> Option<u32> {
        Ahead::next_npurged(self)
    }
    fn frees_ahead(&self, max: usize) -> Vec<(u64, u64)> {
        Ahead::frees_ahead(self, max)
    }
    fn frees_ahead_timed(&self, max: usize) -> Vec<(u64, u64)> {
        Ahead::frees_ahead_timed(self, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER_AND_SNAPSHOT: usize = 2;

    /// A trace body: `(ts, kind)` with kind `p` (purge by pid 7), `w` (drain item of pid 7 from
    /// ts - 50 to ts), `d` / `e` (a pool decay of pid 7 / 8 from ts - 10 to ts) or `m` (a
    /// meminfo sample), after a header and snapshot taken from synth.
    fn trace(events: &[(u64, char)]) -> Vec<u8> {
        let p = crate::synth::SynthParams {
            mask: 1,
            threads: 1,
            cpus: 2,
            loops: 1,
            ..crate::synth::SynthParams::default()
        };
        let mut synth = Vec::new();
        crate::synth::generate(&p, vec!["t".into()], &mut synth).expect("synth");
        let text = String::from_utf8(synth).expect("utf-8");
        let mut out: String = text
            .lines()
            .take(HEADER_AND_SNAPSHOT)
            .map(|l| format!("{l}\n"))
            .collect();
        for &(ts, kind) in events {
            out += &match kind {
                'p' => format!("{{\"type\":\"purge\",\"ts_ns\":{ts},\"cpu\":0,\"tgid\":7,\"pid\":7,\"comm\":\"k\",\"start\":\"0x0\",\"end\":\"0x0\",\"npurged\":0}}\n"),
                'w' => format!("{{\"type\":\"work\",\"ts_ns\":{ts},\"cpu\":0,\"tgid\":7,\"pid\":7,\"comm\":\"k\",\"function\":\"drain_vmap_area_work\",\"function_addr\":\"0x1\",\"work\":\"0x2\",\"start_ns\":{},\"duration_ns\":50,\"start_cpu\":0}}\n", ts - 50),
                'd' | 'e' => format!("{{\"type\":\"work\",\"ts_ns\":{ts},\"cpu\":0,\"tgid\":7,\"pid\":{},\"comm\":\"k\",\"function\":\"decay_va_pool_node\",\"function_addr\":\"0x3\",\"work\":\"0x4\",\"start_ns\":{},\"duration_ns\":10,\"start_cpu\":0}}\n", if kind == 'd' { 7 } else { 8 }, ts - 10),
                _ => format!("{{\"type\":\"meminfo\",\"ts_ns\":{ts},\"page_tables_kb\":1,\"vmalloc_used_kb\":1}}\n"),
            };
        }
        out.into_bytes()
    }

    fn opened(bytes: &[u8], window: u64, max: usize) -> Lookahead<&[u8]> {
        let mut reader = TraceReader::new(bytes);
        reader.read_header().expect("header");
        assert!(matches!(reader.next(), Some(Ok(Record::Vmallocinfo(_)))));
        Lookahead::with_limits(reader, window, max)
    }

    #[test]
    fn decays_handed_out_before_their_item_is_read_are_still_found() {
        // The item runs 970..1020. Its two decays end at 985 and 995; one of another task at 990
        // and one of this task before the item (960) do not belong to it.
        let bytes = trace(&[
            (960, 'd'),
            (985, 'd'),
            (990, 'e'),
            (995, 'd'),
            (1000, 'p'),
            (1020, 'w'),
        ]);
        // A window so short that the decays are handed out before the item's record is read.
        let mut a = opened(&bytes, 1, 1000);
        for _ in 0..4 {
            assert!(matches!(a.next_record(), Some(Ok(Record::Work(_)))));
        }
        assert!(matches!(a.next_record(), Some(Ok(Record::Purge(_)))));
        let item = a.drain_holding(7, 1000).expect("item read ahead");
        assert_eq!(a.decays_in(&item), vec![(975, 985), (985, 995)]);
        let other = DrainItem { pid: 9, ..item };
        assert!(a.decays_in(&other).is_empty());
    }

    #[test]
    fn the_item_ending_after_a_purge_is_found_within_the_window() {
        let bytes = trace(&[(1000, 'p'), (1010, 'm'), (1020, 'w'), (5000, 'm')]);
        let mut a = opened(&bytes, 100, 1000);
        let Some(Ok(Record::Purge(p))) = a.next_record() else {
            panic!("the purge comes first")
        };
        assert_eq!(a.line(), HEADER_AND_SNAPSHOT + 1);
        let item = a
            .drain_holding(p.ctx.pid, p.ctx.ts_ns)
            .expect("item read ahead");
        assert_eq!((item.start_ns, item.end_ns), (970, 1020));
        assert_eq!(a.drain_holding(p.ctx.pid + 1, p.ctx.ts_ns), None);
        assert_eq!(a.drain_holding(p.ctx.pid, 1021), None);
        // Every record still comes out, in order, once.
        let rest: Vec<u64> = std::iter::from_fn(|| a.next_record())
            .map(|r| r.expect("record").ts_ns().expect("timed"))
            .collect();
        assert_eq!(rest, vec![1010, 1020, 5000]);
    }

    #[test]
    fn an_item_beyond_the_window_or_the_record_cap_is_not_found() {
        let bytes = trace(&[(1000, 'p'), (1500, 'w')]);
        let mut a = opened(&bytes, 100, 1000);
        assert!(matches!(a.next_record(), Some(Ok(Record::Purge(_)))));
        assert_eq!(a.drain_holding(7, 1000), None);

        let bytes = trace(&[
            (1000, 'p'),
            (1001, 'm'),
            (1002, 'm'),
            (1003, 'm'),
            (1020, 'w'),
        ]);
        let mut a = opened(&bytes, 1_000_000, 3);
        assert!(matches!(a.next_record(), Some(Ok(Record::Purge(_)))));
        assert_eq!(a.drain_holding(7, 1000), None, "only 3 records are held");
        assert!(a.len() <= 3);
        let mut a = opened(&bytes, 1_000_000, 5);
        assert!(matches!(a.next_record(), Some(Ok(Record::Purge(_)))));
        assert!(a.drain_holding(7, 1000).is_some());
    }

    #[test]
    fn next_purge_skips_the_purges_already_handed_out() {
        let bytes = trace(&[(10, 'm'), (1000, 'p'), (1020, 'w'), (2000, 'p')]);
        let mut a = opened(&bytes, 10_000, 100);
        assert!(matches!(a.next_record(), Some(Ok(Record::Meminfo(_)))));
        assert_eq!(a.next_purge(), Some((7, 1000)));
        assert!(matches!(a.next_record(), Some(Ok(Record::Purge(_)))));
        assert_eq!(a.next_purge(), Some((7, 2000)));
        assert!(a.next_record().is_some());
        assert!(a.next_record().is_some());
        assert_eq!(a.next_purge(), None);
        assert!(a.next_record().is_none());
        assert_eq!(a.drain_holding(7, 1000), None);
    }
}
