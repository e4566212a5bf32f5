//! Event sources: the probes (live) and a trace file (replay). Each runs on its own thread and
//! sends [`Event`]s into the one channel the UI loop reads, so nothing after this module knows
//! which one is running.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::app::{top_callers, Batch, Control, Event, Mode, PageProbes, SourceInfo};
use super::model::ModelFeed;
use crate::host::{meminfo, system, vmallocinfo};
use crate::live::EventRings;
use crate::probe::contention::Classifier;
use crate::probe::loader::PAGE_PROBES;
use crate::probe::LoadedProbes;
use crate::record::Reorder;
use crate::trace::{Meminfo, Record, TraceReader};

/// The trace `vmtrace top` plays when probes cannot attach: `vmtrace/assets/sample-trace.jsonl.zst`,
/// built into the binary so the fallback works wherever the binary is copied (zstd: 41 kB
/// against 859 kB plain).
pub static BUNDLED_TRACE: &[u8] = include_bytes!("../../assets/sample-trace.jsonl.zst");
/// Name shown for the bundled trace.
pub const BUNDLED_NAME: &str = "bundled sample-trace.jsonl.zst";

/// How often a source hands a batch to the UI: the UI draws at most this often anyway.
const BATCH_EVERY: Duration = Duration::from_millis(100);
/// Live events are held this long so records from different CPUs arrive in time order
/// (the same window `vmtrace record` uses).
const REORDER_WINDOW_NS: u64 = 50_000_000;
/// How often the live source re-reads `/proc/vmallocinfo` for the top callers.
const CALLERS_EVERY: Duration = Duration::from_secs(5);
/// Callers kept per snapshot.
const TOP_CALLERS: usize = 20;
/// How the model panel names a live replay.
const LIVE_SCOPE: &str = "live, nodes variant";

/// Where a replay reads from.
#[derive(Clone, Debug)]
pub enum ReplayInput {
    File(PathBuf),
    Bundled,
}

/// What to replay and how.
#[derive(Clone, Debug)]
pub struct ReplaySpec {
    pub input: ReplayInput,
    /// Trace seconds per wall second.
    pub speed: f64,
    /// Start again at the end (the bundled trace lasts well under a second).
    pub looped: bool,
    pub banner: Option<String>,
}

impl ReplaySpec {
    fn open(&self) -> std::io::Result<Box<dyn BufRead + Send>> {
        Ok(match &self.input {
            ReplayInput::File(p) => crate::trace::compress::open(p)?,
            ReplayInput::Bundled => {
                crate::trace::compress::reader(BUNDLED_TRACE, BUNDLED_NAME.into())?
            }
        })
    }

    fn name(&self) -> String {
        match &self.input {
            ReplayInput::File(p) => p.display().to_string(),
            ReplayInput::Bundled => BUNDLED_NAME.into(),
        }
    }
}

/// Checks that a replay input opens and starts with a valid header, so a bad path fails
/// before the screen is taken.
pub fn check_replay(spec: &ReplaySpec) -> Result<(), String> {
    let input = spec
        .open()
        .map_err(|e| format!("cannot open {}: {e}", spec.name()))?;
    TraceReader::new(input)
        .read_header()
        .map(drop)
        .map_err(|e| format!("{}: {e}", spec.name()))
}

/// Starts the replay thread, which feeds the model thread as it feeds the UI.
pub fn spawn_replay(spec: ReplaySpec, tx: Sender<Event>, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    let (mut feed, _model) = super::model::spawn(tx.clone(), stop.clone(), false);
    std::thread::spawn(move || {
        if let Err(why) = replay(&spec, &tx, &stop, &mut feed) {
            let _ = tx.send(Event::SourceEnded(why));
        }
    })
}

/// Moves a record's timestamps by `off` nanoseconds (a looped replay's later rounds).
fn shift(rec: &mut Record, off: u64) {
    let ts = match rec {
        Record::Alloc(e) => &mut e.ctx.ts_ns,
        Record::Free(e) => &mut e.ctx.ts_ns,
        Record::Purge(e) => &mut e.ctx.ts_ns,
        Record::Contention(e) => &mut e.ctx.ts_ns,
        Record::Work(e) => &mut e.ctx.ts_ns,
        Record::WorkStart(e) => &mut e.ctx.ts_ns,
        Record::PtPage(e) => &mut e.ctx.ts_ns,
        Record::Latency(e) => &mut e.ctx.ts_ns,
        Record::Meminfo(e) => &mut e.ts_ns,
        _ => return,
    };
    *ts += off;
}

fn replay(
    spec: &ReplaySpec,
    tx: &Sender<Event>,
    stop: &AtomicBool,
    feed: &mut ModelFeed,
) -> Result<(), String> {
    let speed = spec.speed;
    let started = Instant::now();
    // Trace time of the first event: stream time = origin + wall elapsed × speed.
    let mut origin: Option<u64> = None;
    let stream_now = |origin: u64| origin + (started.elapsed().as_secs_f64() * speed * 1e9) as u64;
    let mut offset = 0u64;
    let mut round = 0u64;
    let mut lost = 0u64;
    loop {
        let input = spec
            .open()
            .map_err(|e| format!("cannot open {}: {e}", spec.name()))?;
        let mut reader = TraceReader::new(input);
        let header = reader
            .read_header()
            .map_err(|e| format!("{}: {e}", spec.name()))?;
        if round == 0 {
            let info = SourceInfo::from_header(
                &header,
                Mode::Replay {
                    name: spec.name(),
                    speed,
                },
                spec.banner.clone(),
            );
            tx.send(Event::Start(Box::new(info)))
                .map_err(|_| "UI gone")?;
            // Top callers come from the trace's own start snapshot: there is no later one.
        }
        // Each round replays the model from the trace's snapshot again, moved to the round.
        let mut started = false;
        let mut batch = Vec::new();
        let mut first_ts = None;
        let mut last_ts = 0;
        for rec in reader.by_ref() {
            let mut rec = rec.map_err(|e| format!("{}: {e}", spec.name()))?;
            match &rec {
                Record::Footer(f) => {
                    lost += f.lost_total;
                    continue;
                }
                Record::Header(_) => continue,
                Record::Vmallocinfo(s) => {
                    if !started {
                        started = true;
                        let mut snap = s.as_ref().clone();
                        snap.ts_start_ns += offset;
                        snap.ts_end_ns += offset;
                        let scope = format!("{}, fed as replayed", spec.name());
                        feed.start(&header, &snap, scope, None);
                    }
                    if round > 0 {
                        continue;
                    }
                    let _ = tx.send(Event::Callers(Ok(top_callers(s, TOP_CALLERS))));
                }
                _ => {}
            }
            if let Some(ts) = rec.ts_ns() {
                shift(&mut rec, offset);
                let ts = ts + offset;
                first_ts.get_or_insert(ts);
                last_ts = ts;
                let o = *origin.get_or_insert(ts);
                while stream_now(o) < ts {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    send(tx, feed, &mut batch, stream_now(o), lost)?;
                    let wait = ts.saturating_sub(stream_now(o)) as f64 / speed / 1e9;
                    std::thread::sleep(BATCH_EVERY.min(Duration::from_secs_f64(wait.max(0.001))));
                }
            }
            batch.push(rec);
        }
        let now = origin.map_or(0, stream_now);
        send(tx, feed, &mut batch, now, lost)?;
        if !spec.looped || first_ts.is_none() {
            feed.end();
            let _ = tx.send(Event::SourceEnded(format!(
                "replay finished: {} is at its end (press q to quit)",
                spec.name()
            )));
            return Ok(());
        }
        round += 1;
        // The next round starts 1 ms after this one's last event (both timestamps are shifted).
        offset += last_ts.saturating_sub(first_ts.unwrap_or(last_ts)) + 1_000_000;
    }
}

fn send(
    tx: &Sender<Event>,
    feed: &mut ModelFeed,
    batch: &mut Vec<Record>,
    now_ns: u64,
    lost: u64,
) -> Result<(), String> {
    feed.records(batch);
    tx.send(Event::Data(Batch {
        records: std::mem::take(batch),
        now_ns,
        lost_total: lost,
    }))
    .map_err(|_| "UI gone".to_string())
}

/// Starts the live source: loads and attaches the probes on its own thread and waits for the
/// outcome, so a failure (no privileges, no BPF) can fall back to a replay before the screen is
/// taken. Returns the reason on failure.
pub fn spawn_live(
    wanted: Vec<&'static str>,
    ring_bytes: u64,
    tx: Sender<Event>,
    stop: Arc<AtomicBool>,
) -> Result<(JoinHandle<()>, Sender<Control>), String> {
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<Result<(), String>>(1);
    let (control_tx, control_rx) = std::sync::mpsc::channel::<Control>();
    let handle = std::thread::spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                let _ = ready_tx.send(Err(format!("starting the async runtime: {e}")));
                return;
            }
        };
        rt.block_on(live(wanted, ring_bytes, tx, stop, ready_tx, control_rx));
    });
    match ready_rx.recv() {
        Ok(Ok(())) => Ok((handle, control_tx)),
        Ok(Err(why)) => {
            let _ = handle.join();
            Err(why)
        }
        Err(_) => {
            let _ = handle.join();
            Err("the probe thread ended before attaching".into())
        }
    }
}

async fn live(
    wanted: Vec<&'static str>,
    ring_bytes: u64,
    tx: Sender<Event>,
    stop: Arc<AtomicBool>,
    ready: std::sync::mpsc::SyncSender<Result<(), String>>,
    controls: Receiver<Control>,
) {
    // The page probes are loaded whatever `--probes` says, so that `t` can attach them later,
    // and detached at once unless asked for.
    let pages_wanted = PAGE_PROBES.iter().any(|p| wanted.contains(p));
    let mut loaded = wanted.clone();
    loaded.extend(PAGE_PROBES);
    let setup = async {
        let facts =
            system::SystemFacts::read().map_err(|e| format!("reading kernel facts: {e}"))?;
        let mut probes =
            LoadedProbes::load_and_attach(ring_bytes, &loaded).map_err(|e| e.to_string())?;
        let rings = EventRings::take(&mut probes).map_err(|e| format!("{e:#}"))?;
        Ok::<_, String>((facts, probes, rings))
    };
    let (facts, mut probes, mut rings) = match setup.await {
        Ok(v) => v,
        Err(why) => {
            let _ = ready.send(Err(why));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let page_rung = probes
        .infos
        .iter()
        .find(|p| p.logical.as_deref() == Some("page_tables"))
        .map_or_else(|| "off".to_string(), |p| p.rung.clone());
    let mut pages = PageProbes {
        on: false,
        rung: page_rung,
        error: None,
        runs: 0,
        run_ns: 0,
        secs: 0.0,
    };
    let mut pages_since = Instant::now();
    let toggled = probes.set_page_probes(pages_wanted);
    pages.on = probes.page_probes_on();
    pages.error = toggled.err();
    let (nodes, zone) = system::vmap_nodes(facts.possible_cpus, facts.page_size);
    let info = SourceInfo {
        mode: Mode::Live,
        kernel: facts.kernel_release.clone(),
        cpus: facts.online_cpus,
        nodes,
        zone_size: zone,
        page_size: facts.page_size,
        lazy_max_pages: system::lazy_max_pages(facts.online_cpus, facts.page_size),
        probes: probes.infos.clone(),
        banner: None,
    };
    if tx.send(Event::Start(Box::new(info))).is_err()
        || tx.send(Event::PageProbes(pages.clone())).is_err()
    {
        return;
    }
    // The model takes the VMALLOC range from a calibration allocation of our own, made right
    // after the snapshot below, as `record` does (the header has none without it).
    let header = crate::record::header(&facts, &Default::default(), &probes);
    let calibration = (
        std::process::id(),
        crate::workload::fix_size_area_bytes(1, facts.page_size),
    );
    let (mut feed, _model) = super::model::spawn(tx.clone(), stop.clone(), true);
    let mut reorder = Reorder::default();
    // The start snapshot seeds the footprint and the model, as it seeds a replay.
    match vmallocinfo::snapshot() {
        Ok(s) => {
            let _ = tx.send(Event::Callers(Ok(top_callers(&s, TOP_CALLERS))));
            feed.start(&header, &s, LIVE_SCOPE.into(), Some(calibration));
            reorder.push(Record::Vmallocinfo(Box::new(s)));
            if let Err(e) = crate::workload::ArrayMap::create(1, facts.page_size) {
                let _ = tx.send(Event::Model(Box::new(Err(format!(
                    "the calibration allocation failed: {e}"
                )))));
            }
        }
        Err(e) => {
            let _ = tx.send(Event::Callers(Err(format!("vmallocinfo: {e}"))));
        }
    }
    let mut classifier = Classifier::new(nodes);
    let mut stacks: HashMap<i64, Vec<String>> = HashMap::new();
    let mut batch_tick = tokio::time::interval(BATCH_EVERY);
    let mut slow_tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_callers = Instant::now();
    let mut lost_total = 0u64;
    let mut last_batch = 0usize;
    loop {
        tokio::select! {
            r = rings.readable() => match r {
                Ok(()) => {
                    drain(&mut rings, &probes, &mut reorder, &mut classifier, &mut stacks);
                }
                Err(e) => {
                    let _ = tx.send(Event::SourceEnded(format!("ring buffer: {e}")));
                    return;
                }
            },
            _ = batch_tick.tick() => {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                for Control::PageProbes(on) in controls.try_iter() {
                    pages.error = probes.set_page_probes(on).err();
                    if probes.page_probes_on() != pages.on {
                        pages.on = probes.page_probes_on();
                        pages_since = Instant::now();
                        (pages.runs, pages.run_ns, pages.secs) = (0, 0, 0.0);
                    }
                    let _ = tx.send(Event::PageProbes(pages.clone()));
                }
                drain(&mut rings, &probes, &mut reorder, &mut classifier, &mut stacks);
                let watermark = system::boottime_ns().saturating_sub(REORDER_WINDOW_NS);
                // Sized from the last batch: growing it record by record moved every record
                // again at each doubling.
                let mut records = Vec::with_capacity(last_batch + last_batch / 4);
                reorder.pop_ready(watermark, |r| records.push(r));
                last_batch = records.len();
                feed.records(&records);
                let b = Batch { records, now_ns: watermark, lost_total };
                if tx.send(Event::Data(b)).is_err() {
                    return;
                }
            }
            _ = slow_tick.tick() => {
                if let Ok(m) = meminfo::read() {
                    reorder.push(Record::Meminfo(Meminfo {
                        ts_ns: system::boottime_ns(),
                        page_tables_kb: m.page_tables_kb,
                        vmalloc_used_kb: m.vmalloc_used_kb,
                    }));
                }
                if let Ok(lost) = probes.lost() {
                    lost_total = lost.iter().flatten().sum();
                }
                if let Some((runs, ns)) = probes.page_probe_cost() {
                    (pages.runs, pages.run_ns) = (runs, ns);
                    pages.secs = pages_since.elapsed().as_secs_f64();
                    let _ = tx.send(Event::PageProbes(pages.clone()));
                }
                if feed.is_behind() {
                    // Records were dropped: the model starts again from a fresh snapshot (the
                    // replay ignores the records before it that are still in the reorder).
                    if let Ok(s) = vmallocinfo::snapshot() {
                        feed.start(&header, &s, LIVE_SCOPE.into(), None);
                    }
                }
                if last_callers.elapsed() >= CALLERS_EVERY {
                    last_callers = Instant::now();
                    let c = vmallocinfo::snapshot()
                        .map(|s| top_callers(&s, TOP_CALLERS))
                        .map_err(|e| format!("vmallocinfo: {e}"));
                    let _ = tx.send(Event::Callers(c));
                }
            }
        }
    }
}

/// Decodes everything in the rings into the reorder buffer, merged in time order as
/// `record` merges them ([`Reorder::merge_from`], unbounded: the TUI releases every batch).
fn drain(
    rings: &mut EventRings,
    probes: &LoadedProbes,
    reorder: &mut Reorder,
    classifier: &mut Classifier,
    stacks: &mut HashMap<i64, Vec<String>>,
) {
    let mut heads = Vec::new();
    crate::live::know_static_locks(probes, classifier);
    reorder.merge_from(&mut heads, rings.len(), usize::MAX, |i| {
        crate::live::pull_one(rings, i, probes, classifier, stacks)
    });
}
