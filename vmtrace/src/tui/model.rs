//! The model panel's replay: its own thread runs [`LiveReplay`] over the records the source
//! hands the UI, so the figures move as the stream does and a slow model never holds the
//! screen back.
//!
//! A live source must not wait for the model (the rings would overflow), so it hands records
//! over without blocking; when the model's queue is full it stops feeding, and the next fresh
//! start snapshot begins a new replay (counted as a reset and shown). A replay source can
//! wait, and does: the model then sets the pace, which only shows at high `--speed`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::app::{Event, ModelView};
use crate::replay::live::{LiveFigures, LiveReplay};
use crate::replay::ReplayOptions;
use crate::trace::{Header, KAddr, Record, VmallocSnapshot};

/// Batches queued for the model: with the sources' 100 ms batches, about 6 s of stream.
const QUEUE_BATCHES: usize = 64;
/// How often the panel's figures are sent to the UI.
const VIEW_EVERY: Duration = Duration::from_millis(500);
/// Records held while a live stream has not yet shown the VMALLOC range (the calibration
/// allocation carries it); past this the model gives up until the next start.
const MAX_WAITING: usize = 1 << 20;

/// What a source hands the model thread.
pub enum Feed {
    /// A replay starts here: the kernel's facts and the state at `snapshot`. A header without
    /// the VMALLOC range (live) takes it from the allocation `calibration` names, `(tgid,
    /// size)`, as `record`'s calibration does, or from the one an earlier start learned it from.
    Start {
        header: Box<Header>,
        snapshot: Box<VmallocSnapshot>,
        scope: String,
        calibration: Option<(u32, u64)>,
    },
    Records(Vec<Record>),
    /// The stream ended (a replay at its end): nothing more to read ahead.
    End,
}

/// The sending side, owned by a source.
pub struct ModelFeed {
    tx: SyncSender<Feed>,
    /// Whether a full queue may drop records (live) rather than wait (replay).
    may_drop: bool,
    /// Records were dropped since the last start: feed nothing until the next one.
    behind: bool,
}

impl ModelFeed {
    /// Starts a replay from `snapshot`. Returns false when a live queue had no room; the
    /// source tries again later.
    pub fn start(
        &mut self,
        header: &Header,
        snapshot: &VmallocSnapshot,
        scope: String,
        calibration: Option<(u32, u64)>,
    ) -> bool {
        let feed = Feed::Start {
            header: Box::new(header.clone()),
            snapshot: Box::new(snapshot.clone()),
            scope,
            calibration,
        };
        if self.send(feed) {
            self.behind = false;
            true
        } else {
            false
        }
    }

    /// Hands over a copy of `records` (the UI keeps its own).
    pub fn records(&mut self, records: &[Record]) {
        if self.behind || records.is_empty() {
            return;
        }
        if !self.send(Feed::Records(records.to_vec())) {
            self.behind = true;
        }
    }

    /// The stream ended: the model replays what it held for read-ahead.
    pub fn end(&mut self) {
        if !self.behind {
            self.send(Feed::End);
        }
    }

    /// Whether the model lost records and waits for a new start.
    pub fn is_behind(&self) -> bool {
        self.behind
    }

    fn send(&self, feed: Feed) -> bool {
        if self.may_drop {
            match self.tx.try_send(feed) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
            }
        } else {
            self.tx.send(feed).is_ok()
        }
    }
}

/// Starts the model thread. `may_drop`: a live source's feed drops records when the model
/// falls behind instead of waiting.
pub fn spawn(
    tx: Sender<Event>,
    stop: Arc<AtomicBool>,
    may_drop: bool,
) -> (ModelFeed, JoinHandle<()>) {
    let (feed_tx, feed_rx) = std::sync::mpsc::sync_channel(QUEUE_BATCHES);
    let handle = std::thread::spawn(move || run(&feed_rx, &tx, &stop));
    (
        ModelFeed {
            tx: feed_tx,
            may_drop,
            behind: false,
        },
        handle,
    )
}

/// One replay and what the panel says about it.
struct Running<'o> {
    live: Option<LiveReplay<'o>>,
    /// A live start waiting for the VMALLOC range, with the records meanwhile.
    waiting: Option<(Box<Header>, Box<VmallocSnapshot>, Vec<Record>)>,
    /// The calibration allocation the range is read from, `(tgid, size)`.
    calibration: Option<(u32, u64)>,
    /// The VMALLOC range, once an allocation showed it (kept for later starts).
    range: Option<(KAddr, KAddr)>,
    scope: String,
    /// Replays begun, the first included.
    starts: u64,
    failed: Option<String>,
}

fn run(rx: &Receiver<Feed>, tx: &Sender<Event>, stop: &AtomicBool) {
    let opts = ReplayOptions::default();
    let mut r = Running {
        live: None,
        waiting: None,
        calibration: None,
        range: None,
        scope: String::new(),
        starts: 0,
        failed: None,
    };
    let mut last_view = Instant::now();
    let _ = tx.send(Event::Model(Box::new(Err(
        "waiting for the first records".into()
    ))));
    while !stop.load(Ordering::Relaxed) {
        match rx.recv_timeout(VIEW_EVERY) {
            Ok(Feed::Start {
                mut header,
                snapshot,
                scope,
                calibration,
            }) => {
                r.starts += 1;
                r.scope = scope;
                r.failed = None;
                r.live = None;
                r.waiting = None;
                r.calibration = calibration.or(r.calibration);
                if let (None, Some((start, end))) = (header.vmap.vmalloc_start, r.range) {
                    header.vmap.vmalloc_start = Some(start);
                    header.vmap.vmalloc_end = Some(end);
                }
                if header.vmap.vmalloc_start.is_some() {
                    r.begin(&header, &snapshot, &opts);
                } else {
                    r.waiting = Some((header, snapshot, Vec::new()));
                }
            }
            Ok(Feed::Records(records)) => r.feed(records, &opts),
            Ok(Feed::End) => {
                r.end();
                // At once: a batch screen may be printed right after the replay's end.
                if tx.send(Event::Model(Box::new(r.view()))).is_err() {
                    return;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                // The source ended: show the final figures once more.
                let _ = tx.send(Event::Model(Box::new(r.view())));
                return;
            }
        }
        if last_view.elapsed() >= VIEW_EVERY {
            last_view = Instant::now();
            if tx.send(Event::Model(Box::new(r.view()))).is_err() {
                return;
            }
        }
    }
}

impl<'o> Running<'o> {
    fn begin(&mut self, header: &Header, snapshot: &VmallocSnapshot, opts: &'o ReplayOptions) {
        match LiveReplay::new(header, snapshot, opts) {
            Ok(l) => self.live = Some(l),
            Err(e) => self.failed = Some(format!("cannot start the model: {e}")),
        }
    }

    fn feed(&mut self, records: Vec<Record>, opts: &'o ReplayOptions) {
        if let Some((header, _, held)) = self.waiting.as_mut() {
            // Only the calibration allocation is known to be a VMALLOC one: module and BPF
            // JIT allocations carry their own windows.
            let Some((tgid, size)) = self.calibration else {
                self.waiting = None;
                self.failed = Some("no allocation known to show the VMALLOC range".into());
                return;
            };
            let range = records.iter().find_map(|r| match r {
                Record::Alloc(a) if a.failed == 0 && a.ctx.tgid == tgid && a.size == size => {
                    Some((a.vstart, a.vend))
                }
                _ => None,
            });
            held.extend(records);
            let Some((vstart, vend)) = range else {
                if held.len() > MAX_WAITING {
                    self.waiting = None;
                    self.failed = Some("the calibration allocation did not show".into());
                }
                return;
            };
            header.vmap.vmalloc_start = Some(vstart);
            header.vmap.vmalloc_end = Some(vend);
            self.range = Some((vstart, vend));
            let (header, snapshot, held) = self.waiting.take().expect("waiting");
            self.begin(&header, &snapshot, opts);
            self.push(held);
            return;
        }
        self.push(records);
    }

    fn push(&mut self, records: Vec<Record>) {
        let Some(live) = self.live.as_mut() else {
            return;
        };
        for rec in records {
            if let Err(e) = live.push(rec) {
                self.failed = Some(format!("the model stopped: {e}"));
                self.live = None;
                return;
            }
        }
    }

    fn end(&mut self) {
        if let Some(Err(e)) = self.live.as_mut().map(LiveReplay::flush) {
            self.failed = Some(format!("the model stopped: {e}"));
            self.live = None;
        }
    }

    fn view(&self) -> Result<ModelView, String> {
        if let Some(why) = &self.failed {
            return Err(why.clone());
        }
        match (&self.live, &self.waiting) {
            (Some(l), _) => Ok(view(&l.figures(), &self.scope, self.starts)),
            (None, Some(_)) => {
                Err("waiting for the calibration allocation to show the VMALLOC range".into())
            }
            (None, None) => Err("waiting for the start snapshot".into()),
        }
    }
}

/// The panel's figures from the replay's.
pub fn view(f: &LiveFigures, scope: &str, starts: u64) -> ModelView {
    let e = f.explained;
    let pct = |a: crate::replay::Agreement| a.percent();
    let warm = match (f.warmup_ts, f.warmup_line) {
        (Some(ts), Some(line)) => format!(
            "warmed up {:.1} s ago (line {line})",
            f.last_ts.saturating_sub(ts) as f64 / 1e9
        ),
        _ => "not warmed up yet (no purge has rebuilt every node's pools)".into(),
    };
    let resets = match starts {
        0 | 1 => String::new(),
        n => format!(
            "; restarted {} times (fell behind, or a new replay round)",
            n - 1
        ),
    };
    ModelView {
        scope: format!(
            "{scope}: {} records, {} held for read-ahead; {warm}{resets}",
            f.fed, f.held
        ),
        strict_placement_pct: f.strict.placement.percent(),
        strict_nr_lazy_pct: f.strict.nr_lazy.percent(),
        strict_npurged_pct: f.strict.npurged.percent(),
        warm_strict_pct: f.strict.placement_after_warmup.percent(),
        warm_pct: e.map_or(f64::NAN, |e| pct(e.placement_after_warmup)),
        warm_compared: e.map_or(0, |e| e.placement_after_warmup.compared),
        warmup_line: f.warmup_line,
        placement_pct: e.map_or(f64::NAN, |e| pct(e.placement)),
        placement_compared: e.map_or(0, |e| e.placement.compared),
        nr_lazy_pct: e.map_or(f64::NAN, |e| pct(e.nr_lazy)),
        npurged_pct: e.map_or(f64::NAN, |e| pct(e.npurged)),
        pooled_objects: f.pooled_objects,
        predicted_high_water: format!("{:#x}", f.predicted_high_water),
        observed_high_water: format!("{:#x}", f.observed_high_water),
        predicted_slots: f.predicted_slots,
        observed_slots: f.observed_slots,
        recent: f
            .recent
            .iter()
            .rev()
            .map(|d| {
                format!(
                    "line {} {} {} cpu {}: kernel {} model {}",
                    d.line, d.kind, d.class, d.cpu, d.observed, d.predicted
                )
            })
            .collect(),
    }
}
