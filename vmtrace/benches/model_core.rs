//! Model-core and reader throughput on a trace file: a benchmark, not a test.
//!
//! `cargo bench -p vmtrace --bench model_core -- TRACE [--rounds N] [--live-only]` prints one
//! JSON object on stdout. `cargo xtask bench-model` runs it on cached synthetic traces and puts
//! the numbers beside the whole-binary ones (replay against jq, peak RSS); docs/development.md
//! explains the figures.
//!
//! Three things are timed, so that a slowdown can be placed:
//!
//! All rates are per second of the thread's CPU time (`*_per_wall_sec` beside them): on a shared
//! machine wall time also counts other processes.
//!
//! - **model core**: the events are parsed and reduced to what the model needs *before* the
//!   clock starts, then fed to [`Model`] the way observed-timing replay feeds it (predict,
//!   compare, undo and claim the observed address on a mismatch; lazy free and compare
//!   `nr_lazy`; purge where the trace purges and compare `npurged`). Agreement is printed as
//!   well: a driver that no longer agrees with a self-consistent synthetic trace is measuring
//!   something else.
//! - **reader**: [`TraceReader`] over the file (JSON parsing; the file is in the page cache
//!   after the load, so this is parsing, not the disk).
//! - **replay**: [`replay`] over the same file, in this process: parsing plus the whole replay
//!   bookkeeping, what `vmtrace replay` does short of printing.
//! - **live** (`--live-only`, instead of the three above): the records parsed before the clock
//!   starts, then pushed one at a time into [`LiveReplay`], as `vmtrace top`'s model thread
//!   takes them: both replays (strict and explained) and the read-ahead window, without the
//!   parsing. Its rate against the stream's is the model's share of `top`'s CPU (docs/tui.md).
//!   Every record is held in memory first, so give it a recording, not a 10 M-event trace.
//!
//! It is a plain `harness = false` binary rather than criterion: one pass over ten million
//! events takes seconds, so statistical resampling adds nothing but minutes, and the numbers
//! have to reach the xtask as JSON anyway.

use std::fs::File;
use std::io::BufReader;
use std::time::Instant;

mod common;
use common::thread_cpu_seconds;
use vmtrace::model::{AllocRequest, DecayRule, Model, NodeLayout, Params, Variant};
use vmtrace::replay::live::LiveReplay;
use vmtrace::replay::{replay, ReplayOptions};
use vmtrace::trace::{AreaKind, Header, Record, TraceReader, VmallocSnapshot};

/// One event reduced to what the model consumes (48 bytes instead of a `Record` and its
/// strings), so that ten million of them fit in memory next to each other.
#[derive(Clone, Copy, Debug)]
enum Event {
    Alloc {
        addr: u64,
        size: u64,
        align: u64,
        vstart: u64,
        vend: u64,
        cpu: u32,
        failed: bool,
    },
    Free {
        addr: u64,
        nr_lazy: u64,
    },
    Purge {
        npurged: u32,
    },
}

/// Wall and CPU clocks started together.
struct Clock {
    wall: Instant,
    cpu: f64,
}

impl Clock {
    fn start() -> Self {
        Self {
            wall: Instant::now(),
            cpu: thread_cpu_seconds(),
        }
    }

    /// `(wall seconds, cpu seconds)` since the start.
    fn stop(&self) -> (f64, f64) {
        (
            self.wall.elapsed().as_secs_f64(),
            thread_cpu_seconds() - self.cpu,
        )
    }
}

#[derive(Default, serde::Serialize)]
struct CoreResult {
    events: u64,
    wall_seconds: f64,
    cpu_seconds: f64,
    /// Events per second of the thread's CPU time.
    events_per_sec: f64,
    events_per_wall_sec: f64,
    placement_agreed: u64,
    placement_compared: u64,
    nr_lazy_agreed: u64,
    nr_lazy_compared: u64,
    npurged_agreed: u64,
    npurged_compared: u64,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("model_core: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut trace = None;
    let mut rounds = 3u32;
    let mut live_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            // `cargo bench` passes --bench to every bench binary.
            "--bench" => {}
            // Only the live figure: the one `top`'s cost follows.
            "--live-only" => live_only = true,
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--rounds needs a number")?;
            }
            _ if a.starts_with('-') => return Err(format!("unknown option {a}")),
            _ => trace = Some(a),
        }
    }
    let path = trace.ok_or("usage: model_core TRACE [--rounds N] [--live-only]")?;
    if live_only {
        let live = live_rate(&path, rounds.max(1))?;
        let out = serde_json::json!({
            "trace": path,
            "rounds": rounds,
            "live_records_per_sec": live.0,
            "live_records_per_wall_sec": live.1,
        });
        println!("{out}");
        return Ok(());
    }
    let bytes = std::fs::metadata(&path)
        .map_err(|e| format!("{path}: {e}"))?
        .len();
    let (header, snapshot, events) = load(&path)?;
    let params = params(&header)?;

    let core: Vec<CoreResult> = (0..rounds.max(1))
        .map(|_| drive(&params, &snapshot, &events))
        .collect::<Result<_, _>>()?;
    let best = |f: &dyn Fn(&CoreResult) -> f64| core.iter().map(f).fold(0.0, f64::max);
    let model_events = events.len();
    drop(events);

    // Best of the rounds, by CPU time and by wall time separately.
    let mut reader = (0.0f64, 0.0f64);
    let mut replayed = (0.0f64, 0.0f64);
    let best_of = |best: &mut (f64, f64), n: f64, (wall, cpu): (f64, f64)| {
        best.0 = best.0.max(n / cpu);
        best.1 = best.1.max(n / wall);
    };
    let mut lines = 0usize;
    for _ in 0..rounds.max(1) {
        let clock = Clock::start();
        let mut n = 0usize;
        for rec in TraceReader::new(open(&path)?) {
            rec.map_err(|e| e.to_string())?;
            n += 1;
        }
        best_of(&mut reader, n as f64, clock.stop());
        lines = n;

        let clock = Clock::start();
        let report = replay(open(&path)?, &ReplayOptions::default()).map_err(|e| e.to_string())?;
        best_of(&mut replayed, report.events.lines as f64, clock.stop());
    }
    let out = serde_json::json!({
        "trace": path,
        "bytes": bytes,
        "records": lines,
        "model_events": model_events,
        "rounds": rounds,
        "model_core_events_per_sec": best(&|c| c.events_per_sec),
        "model_core_events_per_wall_sec": best(&|c| c.events_per_wall_sec),
        "model_core_runs": core,
        "reader_records_per_sec": reader.0,
        "reader_records_per_wall_sec": reader.1,
        "replay_lines_per_sec": replayed.0,
        "replay_lines_per_wall_sec": replayed.1,
    });
    println!("{out}");
    Ok(())
}

/// Best of `rounds` passes of [`LiveReplay`] over the trace's records, parsed beforehand:
/// `(records per CPU second, per wall second)`.
fn live_rate(path: &str, rounds: u32) -> Result<(f64, f64), String> {
    let mut reader = TraceReader::new(open(path)?);
    let header = reader.read_header().map_err(|e| e.to_string())?;
    let Some(Ok(Record::Vmallocinfo(snapshot))) = reader.next() else {
        return Err(format!("{path}: no start snapshot after the header"));
    };
    let records: Vec<Record> = reader
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let opts = ReplayOptions::default();
    let mut best = (0.0f64, 0.0f64);
    for _ in 0..rounds {
        let mut live = LiveReplay::new(&header, &snapshot, &opts).map_err(|e| e.to_string())?;
        let clock = Clock::start();
        for rec in &records {
            live.push(rec.clone()).map_err(|e| e.to_string())?;
        }
        live.flush().map_err(|e| e.to_string())?;
        let (wall, cpu) = clock.stop();
        best.0 = best.0.max(records.len() as f64 / cpu);
        best.1 = best.1.max(records.len() as f64 / wall);
    }
    Ok(best)
}

/// The trace through a large buffer, as `vmtrace replay` reads it. The file is read again for
/// every pass; after the first it comes from the page cache.
fn open(path: &str) -> Result<BufReader<File>, String> {
    let f = File::open(path).map_err(|e| format!("{path}: {e}"))?;
    Ok(BufReader::with_capacity(1 << 20, f))
}

type Loaded = (Header, VmallocSnapshot, Vec<Event>);

fn load(path: &str) -> Result<Loaded, String> {
    let mut reader = TraceReader::new(open(path)?);
    let header = reader.read_header().map_err(|e| e.to_string())?;
    let mut snapshot = None;
    let mut events = Vec::new();
    for rec in reader {
        match rec.map_err(|e| e.to_string())? {
            Record::Vmallocinfo(s) => snapshot = Some(*s),
            Record::Alloc(a) => events.push(Event::Alloc {
                addr: a.addr.0,
                size: a.size,
                align: a.align,
                vstart: a.vstart.0,
                vend: a.vend.0,
                cpu: a.ctx.cpu,
                failed: a.failed != 0,
            }),
            Record::Free(f) => events.push(Event::Free {
                addr: f.va_start.0,
                nr_lazy: f.nr_lazy,
            }),
            Record::Purge(p) => events.push(Event::Purge { npurged: p.npurged }),
            _ => {}
        }
    }
    let snapshot = snapshot.ok_or("the trace has no vmallocinfo snapshot")?;
    Ok((header, snapshot, events))
}

fn params(h: &Header) -> Result<Params, String> {
    let (Some(vstart), Some(vend)) = (h.vmap.vmalloc_start, h.vmap.vmalloc_end) else {
        return Err("the header has no VMALLOC range".into());
    };
    Ok(Params {
        page_size: h.system.page_size,
        layout: NodeLayout::new(h.vmap.nr_vmap_nodes, h.vmap.zone_size),
        lazy_max_pages: h
            .vmap
            .lazy_max_pages_tracepoint
            .unwrap_or(h.vmap.lazy_max_pages_computed),
        vmalloc_start: vstart.0,
        vmalloc_end: vend.0,
        five_level: Params::five_level_base(vstart.0),
        decay: DecayRule::for_release(&h.system.kernel_release),
        variant: Variant::Nodes,
    })
}

/// One timed pass: seed from the snapshot, then every event, as observed-timing replay does.
fn drive(
    params: &Params,
    snapshot: &VmallocSnapshot,
    events: &[Event],
) -> Result<CoreResult, String> {
    let mut m = Model::new(params.clone()).map_err(|e| e.to_string())?;
    for a in &snapshot.areas {
        // Areas outside the range or overlapping are skipped, as replay counts and skips them.
        let _ = match a.kind {
            AreaKind::Busy => m.seed_busy(a.start.0, a.size, 0, true),
            AreaKind::VmMapRam => m.seed_busy(a.start.0, a.size, 0, false),
            AreaKind::Unpurged => m.seed_lazy(a.start.0, a.size, 0),
        };
    }
    let page = params.page_size;
    let mut r = CoreResult::default();
    let mut pending_failure = false;
    let clock = Clock::start();
    for ev in events {
        match *ev {
            Event::Alloc {
                addr,
                size,
                align,
                vstart,
                vend,
                cpu,
                failed,
            } => {
                let req = AllocRequest {
                    size,
                    align: align.max(1),
                    vstart,
                    vend,
                    cpu,
                    retry: pending_failure,
                    guard: !(align == size && size > page),
                };
                pending_failure = failed;
                let got = m.alloc(&req).map_err(|e| e.to_string())?;
                if failed {
                    if let Ok(g) = got {
                        let _ = m.undo_alloc(&g);
                    }
                    continue;
                }
                r.placement_compared += 1;
                match got {
                    Ok(g) if g.addr == addr => r.placement_agreed += 1,
                    Ok(g) => {
                        let _ = m.undo_alloc(&g);
                        let _ = m.claim(&req, addr);
                    }
                    Err(_) => {
                        let _ = m.claim(&req, addr);
                    }
                }
            }
            Event::Free { addr, nr_lazy } => {
                if let Ok(f) = m.free(addr) {
                    r.nr_lazy_compared += 1;
                    r.nr_lazy_agreed += u64::from(f.nr_lazy == nr_lazy);
                }
            }
            Event::Purge { npurged } => {
                let p = m.purge(pending_failure);
                r.npurged_compared += 1;
                r.npurged_agreed += u64::from(p.npurged == npurged);
            }
        }
    }
    (r.wall_seconds, r.cpu_seconds) = clock.stop();
    r.events = events.len() as u64;
    r.events_per_sec = r.events as f64 / r.cpu_seconds;
    r.events_per_wall_sec = r.events as f64 / r.wall_seconds;
    std::hint::black_box(&m);
    Ok(r)
}
