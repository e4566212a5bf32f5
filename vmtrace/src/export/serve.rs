//! The `vmtrace serve` daemon: probes on one thread feeding [`Metrics`], HTTP on a small tokio
//! runtime reading them, signals for a clean stop.
//!
//! Thread layout, and why: the event thread owns the probes and the ring buffer and does nothing
//! but decode and count (and, with `--record`, write the trace files through the record
//! pipeline, see [`super::rotate`]), so no HTTP client can delay it (the ring buffer would
//! overflow and events be lost). The HTTP runtime only ever reads atomics. Capabilities are
//! dropped by both the event thread and the main thread after the probes are attached and before
//! the HTTP runtime's threads exist (see [`super::caps`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;

use super::http::{self, Handler, Limits};
use super::rotate::{RotateOptions, Rotating};
use super::{caps, Features, Metrics};
use crate::host::{system, vmallocinfo};
use crate::live::EventRings;
use crate::probe::LoadedProbes;
use crate::record::{self, Pipeline, ProbeCounters};
use crate::trace::{Record, StopReason};

/// `vmtrace serve` options.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to serve /metrics and /healthz on. Loopback by default: put a reverse proxy or
    /// an explicit address in front to expose it.
    #[arg(long, default_value = "127.0.0.1:9465")]
    pub listen: SocketAddr,

    /// Optional probes to attach, as for `vmtrace record --probes`.
    #[arg(long, value_delimiter = ',', default_value = crate::probe::selection::DEFAULT_PROBES)]
    pub probes: Vec<String>,

    /// Total size of the BPF ring buffers in MiB (a power of two), one ring per CPU up to eight.
    #[arg(long, default_value_t = 64)]
    pub ring_mib: u32,

    /// Keep capabilities after attaching (debugging only; the default drops them all).
    #[arg(long)]
    pub keep_caps: bool,

    /// Also write the events as trace files (the format of `vmtrace record`) into DIR, created
    /// if missing. Each file stands alone: header, snapshot, events, footer. DIR must be
    /// writable by the daemon's user without capabilities (they are dropped before the first
    /// file is created).
    #[arg(long, value_name = "DIR")]
    pub record: Option<std::path::PathBuf>,

    /// With --record: close the current file and start the next once it reaches SIZE (`64M`,
    /// `1G`; K, M, G, T are powers of 1024, a bare number is bytes).
    #[arg(long, value_name = "SIZE", value_parser = super::rotate::parse_size,
          default_value = "64M", requires = "record")]
    pub rotate: u64,

    /// With --record: store each file compressed, `zstd` (`.jsonl.zst`, about 15× smaller)
    /// or `gzip` (`.jsonl.gz`), or `none` (`.jsonl`). Every vmtrace reader opens all three; a
    /// file cut by a crash stays readable up to its last flushed frame. --rotate counts the
    /// JSON Lines before compression.
    #[arg(long, value_name = "KIND", value_parser = crate::trace::compress::Compression::parse,
          default_value = "none", requires = "record")]
    pub compress: crate::trace::compress::Compression,

    /// With --record: keep at most N files named vmtrace-*.jsonl (or .jsonl.zst, .jsonl.gz) in
    /// DIR, the one being written included, deleting the oldest; 0 keeps them all. Disk use is
    /// bounded by about N × SIZE.
    #[arg(long, value_name = "N", default_value_t = 16, requires = "record")]
    pub keep: usize,
}

/// How often the event thread checks for a stop, beats the health clock and (with --record)
/// writes and flushes the events the reorder window has released.
const TICK: Duration = crate::record::FLUSH_INTERVAL;
/// How often /proc/meminfo and the lost counters are read.
const SLOW_TICK: Duration = Duration::from_secs(1);
/// /healthz fails when the event thread has not beaten for this long.
const STALE_AFTER: Duration = Duration::from_secs(5);
/// Resolved contention stacks kept; the cache is cleared past this so memory stays bounded
/// over days (distinct vmap stacks are few, so this is rarely reached).
const MAX_STACKS: usize = 4096;

/// What the HTTP side reads: the registry and the event thread's heartbeat.
struct Shared {
    metrics: Arc<Metrics>,
    started: Instant,
    /// Milliseconds since `started` at the event thread's last tick.
    heartbeat_ms: Arc<AtomicU64>,
    /// Why writing trace files stopped, once it has: the daemon then goes on serving metrics
    /// but reports itself unhealthy, since it no longer does everything it was asked to.
    record_error: Arc<OnceLock<String>>,
}

impl Handler for Shared {
    fn metrics(&self) -> String {
        self.metrics.render()
    }

    fn health(&self) -> Result<String, String> {
        let now = self.started.elapsed().as_millis() as u64;
        let age = now.saturating_sub(self.heartbeat_ms.load(Ordering::Relaxed));
        if age > STALE_AFTER.as_millis() as u64 {
            return Err(format!("event thread silent for {age} ms\n"));
        }
        match self.record_error.get() {
            Some(why) => Err(format!("trace files no longer written: {why}\n")),
            None => Ok("ok\n".into()),
        }
    }
}

/// Set by the main thread on a signal, read by the event thread: 0 runs on, else the signal.
static STOP: AtomicI32 = AtomicI32::new(0);

/// What the event thread needs to start.
struct EventConfig {
    wanted: Vec<&'static str>,
    ring_bytes: u64,
    keep_caps: bool,
    record: Option<RotateOptions>,
    started: Instant,
    heartbeat: Arc<AtomicU64>,
    record_error: Arc<OnceLock<String>>,
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let wanted =
        crate::probe::selection::resolve_probes(&args.probes).map_err(anyhow::Error::msg)?;
    let ring_bytes = u64::from(args.ring_mib) << 20;
    // Bound before the capabilities go, so a port below 1024 still works.
    let listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("binding {}", args.listen))?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;

    let keep_caps = args.keep_caps;
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let started = Instant::now();
    let heartbeat = Arc::new(AtomicU64::new(0));
    let record_error = Arc::new(OnceLock::new());
    let config = EventConfig {
        wanted,
        ring_bytes,
        keep_caps,
        record: args.record.as_ref().map(|dir| RotateOptions {
            dir: dir.clone(),
            max_bytes: args.rotate,
            compression: args.compress,
            keep: args.keep,
        }),
        started,
        heartbeat: heartbeat.clone(),
        record_error: record_error.clone(),
    };
    let events = std::thread::Builder::new()
        .name("vmtrace-events".into())
        .spawn(move || event_thread(config, ready_tx))?;
    let (metrics, first_file): (Arc<Metrics>, Option<PathBuf>) = match ready_rx.recv() {
        Ok(Ok(m)) => m,
        Ok(Err(why)) => {
            let _ = events.join();
            anyhow::bail!("{why}");
        }
        Err(_) => {
            let _ = events.join();
            anyhow::bail!("the probe thread ended before attaching");
        }
    };
    let caps_note = if keep_caps {
        "kept (--keep-caps)".to_string()
    } else {
        caps::drop_all().context("dropping capabilities")?;
        format!(
            "all dropped (CapEff {}, no_new_privs)",
            caps::effective().unwrap_or_else(|| "?".into())
        )
    };
    eprintln!(
        "vmtrace serve: listening on http://{local}/metrics; capabilities {caps_note}; pid {}",
        std::process::id()
    );
    if let Some(path) = &first_file {
        eprintln!(
            "vmtrace serve: writing trace files, first {} (a new one every {} bytes, {})",
            path.display(),
            args.rotate,
            match args.keep {
                0 => "all kept".to_string(),
                n => format!("the newest {n} kept"),
            }
        );
    }

    let shared = Arc::new(Shared {
        metrics: metrics.clone(),
        started,
        heartbeat_ms: heartbeat,
        record_error,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("vmtrace-http")
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let result = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let handler: Arc<dyn Handler> = shared.clone();
        let server = tokio::spawn(http::serve(listener, handler, Limits::default(), stop_rx));
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let signo = tokio::select! {
            _ = term.recv() => libc::SIGTERM,
            _ = int.recv() => libc::SIGINT,
        };
        log::info!("signal {signo}");
        STOP.store(signo, Ordering::Relaxed);
        let _ = stop_tx.send(true);
        let _ = server.await;
        Ok::<_, std::io::Error>(())
    });
    if STOP.load(Ordering::Relaxed) == 0 {
        // The HTTP side failed before any signal: stop the event thread all the same.
        STOP.store(libc::SIGTERM, Ordering::Relaxed);
    }
    rt.shutdown_timeout(Duration::from_secs(2));
    let ended = events.join();
    result.context("serving HTTP")?;
    let last_file = match ended {
        Ok(Ok(last)) => last,
        Ok(Err(why)) => anyhow::bail!("{why}"),
        Err(_) => anyhow::bail!("the event thread panicked"),
    };
    eprintln!(
        "vmtrace serve: stopped, probes detached; {} allocations counted{}",
        metrics.allocations(),
        last_file
            .map(|p| format!("; last trace file {} closed", p.display()))
            .unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}

/// What the event thread reports once the probes are attached: the registry and the first
/// trace file.
type Ready = Result<(Arc<Metrics>, Option<PathBuf>), String>;

/// Attaches the probes, reports the registry (or why not) on `ready`, then counts events until
/// [`STOP`]; detaches and drains the ring buffer before returning the last trace file.
fn event_thread(config: EventConfig, ready: SyncSender<Ready>) -> Result<Option<PathBuf>, String> {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let why = format!("starting the event runtime: {e}");
            let _ = ready.send(Err(why.clone()));
            return Err(why);
        }
    };
    rt.block_on(events(config, ready))
}

/// Everything the event loop works with, set up while the capabilities are still held.
struct Attached {
    probes: LoadedProbes,
    rings: EventRings,
    metrics: Arc<Metrics>,
    pipeline: Pipeline,
    rotating: Option<Rotating>,
}

/// Attaches the probes; with --record also reads the snapshot and calibrates (both need the
/// capabilities); then drops the capabilities and creates the first trace file without them,
/// which proves the directory stays writable.
async fn attach(config: &mut EventConfig) -> Result<Attached, String> {
    let facts = system::SystemFacts::read().map_err(|e| format!("reading kernel facts: {e}"))?;
    let mut probes = LoadedProbes::load_and_attach(config.ring_bytes, &config.wanted)
        .map_err(|e| e.to_string())?;
    let mut rings = EventRings::take(&mut probes).map_err(|e| format!("{e:#}"))?;
    let (nodes, _zone) = system::vmap_nodes(facts.possible_cpus, facts.page_size);
    let metrics = Arc::new(Metrics::new(Features::from_probes(&probes.infos)));
    metrics.set_probes(&probes.infos);
    metrics.set_nodes(nodes);
    metrics.set_lazy_threshold(system::lazy_max_pages(facts.online_cpus, facts.page_size));
    let mut pipeline = Pipeline::new(nodes, config.record.is_some());

    let first = match config.record.take() {
        Some(opts) => {
            let snapshot = vmallocinfo::snapshot()
                .map_err(|e| format!("snapshotting /proc/vmallocinfo: {e}"))?;
            if !snapshot.real_addresses {
                log::warn!(
                    "/proc/vmallocinfo addresses are hashed; the trace files cannot seed a replay"
                );
            }
            let calibration =
                record::calibrate(&mut pipeline, &mut rings, &probes, facts.page_size, |rec| {
                    metrics.observe(rec)
                })
                .await;
            if !calibration.saw_allocation() {
                log::warn!(
                    "calibration allocation was not seen by the probes; header range is unknown"
                );
            }
            Some((
                opts,
                record::header(&facts, &calibration, &probes),
                snapshot,
            ))
        }
        None => None,
    };
    if !config.keep_caps {
        caps::drop_all().map_err(|e| format!("dropping capabilities: {e}"))?;
    }
    let rotating = match first {
        // The first file counts from zero: it holds every event since the attach.
        Some((opts, header, snapshot)) => Some(
            Rotating::start(opts, header, &snapshot, ProbeCounters::default(), 0).map_err(|e| {
                format!(
                    "{e:#} (trace files are written after the capabilities are dropped, so the \
                     directory must be writable by this user without them)"
                )
            })?,
        ),
        None => None,
    };
    Ok(Attached {
        probes,
        rings,
        metrics,
        pipeline,
        rotating,
    })
}

async fn events(
    mut config: EventConfig,
    ready: SyncSender<Ready>,
) -> Result<Option<PathBuf>, String> {
    let Attached {
        mut probes,
        mut rings,
        metrics,
        mut pipeline,
        mut rotating,
    } = match attach(&mut config).await {
        Ok(a) => a,
        Err(why) => {
            let _ = ready.send(Err(why.clone()));
            return Err(why);
        }
    };
    let first = rotating.as_ref().map(|r| r.current_path().to_path_buf());
    let _ = ready.send(Ok((metrics.clone(), first)));

    let observe = |rec: &Record| metrics.observe(rec);
    let slow_work = |probes: &LoadedProbes, pipeline: &mut Pipeline| {
        if let Some(rec) = record::meminfo_sample() {
            metrics.observe(&rec);
            pipeline.push(rec);
        }
        if let Ok(lost) = probes.lost() {
            metrics.set_lost(per_cpu(&lost));
        }
    };
    let mut tick = tokio::time::interval(TICK);
    let mut slow = tokio::time::interval(SLOW_TICK);
    let mut ring_error = None;
    let reason = loop {
        tokio::select! {
            r = rings.readable() => match r {
                Ok(()) => {
                    pipeline.drain(&mut rings, &probes, observe);
                }
                Err(e) => {
                    ring_error = Some(format!("ring buffer: {e}"));
                    break StopReason::Error;
                }
            },
            _ = tick.tick() => {
                // The probes submit without waking user space for every record (cheaper in
                // the kernel), so readiness alone can leave records waiting: drain on the tick.
                pipeline.drain(&mut rings, &probes, observe);
                config.heartbeat.store(config.started.elapsed().as_millis() as u64, Ordering::Relaxed);
                pipeline.bound_stack_cache(MAX_STACKS);
                if let Some(r) = rotating.as_mut() {
                    let watermark = system::boottime_ns().saturating_sub(record::REORDER_WINDOW_NS);
                    let written = record::pump(
                        &mut pipeline,
                        &mut rings,
                        &probes,
                        watermark,
                        observe,
                        |p, w| r.emit(p, w, &mut || ProbeCounters::read(&probes)),
                    )
                    .and_then(|()| r.flush());
                    if let Err(e) = written {
                        stop_recording(&mut rotating, &mut pipeline, &config.record_error, e);
                    }
                }
                match STOP.load(Ordering::Relaxed) {
                    0 => {}
                    libc::SIGINT => break StopReason::Sigint,
                    _ => break StopReason::Sigterm,
                }
            }
            _ = slow.tick() => slow_work(&probes, &mut pipeline),
        }
    };
    // No event is produced after the detach; what is left in the ring is still counted and
    // written.
    probes.detach();
    let mut last = None;
    match rotating {
        None => {
            pipeline.drain(&mut rings, &probes, observe);
            slow_work(&probes, &mut pipeline);
        }
        Some(mut r) => {
            slow_work(&probes, &mut pipeline);
            let closed = record::pump(
                &mut pipeline,
                &mut rings,
                &probes,
                u64::MAX,
                observe,
                |p, w| r.emit(p, w, &mut || ProbeCounters::read(&probes)),
            )
            .and_then(|()| {
                let counters = ProbeCounters::read(&probes)?;
                r.finish(reason, pipeline.late_events(), &counters)
            });
            match closed {
                Ok(path) => last = Some(path),
                Err(e) => log::error!("closing the last trace file: {e:#}"),
            }
        }
    }
    match ring_error {
        Some(why) => Err(why),
        None => Ok(last),
    }
}

/// A trace file could not be written (disk full, directory removed): say why, stop writing,
/// and go on serving metrics with /healthz reporting the failure.
fn stop_recording(
    rotating: &mut Option<Rotating>,
    pipeline: &mut Pipeline,
    record_error: &OnceLock<String>,
    e: anyhow::Error,
) {
    let why = format!("{e:#}");
    log::error!("trace files: {why}; serving metrics only from now on");
    eprintln!("vmtrace serve: error: trace files: {why}; serving metrics only from now on");
    let _ = record_error.set(why);
    *rotating = None;
    pipeline.stop_keeping();
}

/// Lost counts `[kind][cpu]` summed over kinds, per CPU.
fn per_cpu(lost: &[Vec<u64>]) -> Vec<u64> {
    let cpus = lost.iter().map(Vec::len).max().unwrap_or(0);
    (0..cpus)
        .map(|c| lost.iter().filter_map(|k| k.get(c)).sum())
        .collect()
}
