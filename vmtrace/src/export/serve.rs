//! The `vmtrace serve` daemon: probes on one thread feeding [`Metrics`], HTTP on a small tokio
//! runtime reading them, signals for a clean stop.
//!
//! Thread layout, and why: the event thread owns the probes and the ring buffer and does nothing
//! but decode and count, so no HTTP client can delay it (the ring buffer would overflow and
//! events be lost). The HTTP runtime only ever reads atomics. Capabilities are dropped by both
//! the event thread and the main thread after the probes are attached and before the HTTP
//! runtime's threads exist (see [`super::caps`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;

use super::http::{self, Handler, Limits};
use super::{caps, Features, Metrics};
use crate::host::{meminfo, system};
use crate::probe::contention::Classifier;
use crate::probe::LoadedProbes;
use crate::trace::{Meminfo, Record};

/// `vmtrace serve` options.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to serve /metrics and /healthz on. Loopback by default: put a reverse proxy or
    /// an explicit address in front to expose it.
    #[arg(long, default_value = "127.0.0.1:9465")]
    pub listen: SocketAddr,

    /// Optional probes to attach, as for `vmtrace record --probes`.
    #[arg(long, value_delimiter = ',', default_value = crate::cli::DEFAULT_PROBES)]
    pub probes: Vec<String>,

    /// Size of the BPF ring buffer in MiB (a power of two).
    #[arg(long, default_value_t = 64)]
    pub ring_mib: u32,

    /// Keep capabilities after attaching (debugging only; the default drops them all).
    #[arg(long)]
    pub keep_caps: bool,
}

/// How often the event thread checks for a stop and beats the health clock.
const TICK: Duration = Duration::from_millis(100);
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
}

impl Handler for Shared {
    fn metrics(&self) -> String {
        self.metrics.render()
    }

    fn health(&self) -> Result<String, String> {
        let now = self.started.elapsed().as_millis() as u64;
        let age = now.saturating_sub(self.heartbeat_ms.load(Ordering::Relaxed));
        if age <= STALE_AFTER.as_millis() as u64 {
            Ok("ok\n".into())
        } else {
            Err(format!("event thread silent for {age} ms\n"))
        }
    }
}

/// Set by the signal task; read by the event thread.
static STOP: AtomicBool = AtomicBool::new(false);

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let wanted = crate::cli::resolve_probes(&args.probes).map_err(anyhow::Error::msg)?;
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
    let hb = heartbeat.clone();
    let events = std::thread::Builder::new()
        .name("vmtrace-events".into())
        .spawn(move || event_thread(wanted, ring_bytes, keep_caps, ready_tx, started, hb))?;
    let metrics: Arc<Metrics> = match ready_rx.recv() {
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

    let shared = Arc::new(Shared {
        metrics: metrics.clone(),
        started,
        heartbeat_ms: heartbeat,
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
        tokio::select! {
            _ = term.recv() => log::info!("SIGTERM"),
            _ = int.recv() => log::info!("SIGINT"),
        }
        let _ = stop_tx.send(true);
        let _ = server.await;
        Ok::<_, std::io::Error>(())
    });
    STOP.store(true, Ordering::Relaxed);
    rt.shutdown_timeout(Duration::from_secs(2));
    let ended = events.join();
    result.context("serving HTTP")?;
    match ended {
        Ok(Ok(())) => {}
        Ok(Err(why)) => anyhow::bail!("{why}"),
        Err(_) => anyhow::bail!("the event thread panicked"),
    }
    eprintln!(
        "vmtrace serve: stopped, probes detached; {} allocations counted",
        metrics.allocations()
    );
    Ok(ExitCode::SUCCESS)
}

/// Attaches the probes, reports the registry (or why not) on `ready`, then counts events until
/// [`STOP`]; detaches and drains the ring buffer before returning.
fn event_thread(
    wanted: Vec<&'static str>,
    ring_bytes: u64,
    keep_caps: bool,
    ready: SyncSender<Result<Arc<Metrics>, String>>,
    started: Instant,
    heartbeat: Arc<AtomicU64>,
) -> Result<(), String> {
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
    rt.block_on(events(
        wanted, ring_bytes, keep_caps, ready, started, heartbeat,
    ))
}

async fn events(
    wanted: Vec<&'static str>,
    ring_bytes: u64,
    keep_caps: bool,
    ready: SyncSender<Result<Arc<Metrics>, String>>,
    started: Instant,
    heartbeat: Arc<AtomicU64>,
) -> Result<(), String> {
    use tokio::io::unix::AsyncFd;
    let setup = || {
        let facts =
            system::SystemFacts::read().map_err(|e| format!("reading kernel facts: {e}"))?;
        let mut probes =
            LoadedProbes::load_and_attach(ring_bytes, &wanted).map_err(|e| e.to_string())?;
        let ring = probes.take_ring().map_err(|e| e.to_string())?;
        // SAFETY: as in record.rs: the AsyncFd owns the RingBuf, which owns its map fd.
        let ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
            .map_err(|e| format!("polling the ring buffer: {e}"))?;
        if !keep_caps {
            caps::drop_all().map_err(|e| format!("dropping capabilities: {e}"))?;
        }
        Ok::<_, String>((facts, probes, ring))
    };
    let (facts, mut probes, mut ring) = match setup() {
        Ok(v) => v,
        Err(why) => {
            let _ = ready.send(Err(why.clone()));
            return Err(why);
        }
    };
    let (nodes, _zone) = system::vmap_nodes(facts.possible_cpus, facts.page_size);
    let metrics = Arc::new(Metrics::new(Features::from_probes(&probes.infos)));
    metrics.set_probes(&probes.infos);
    metrics.set_nodes(nodes);
    metrics.set_lazy_threshold(system::lazy_max_pages(facts.online_cpus, facts.page_size));
    let _ = ready.send(Ok(metrics.clone()));

    let mut classifier = Classifier::new(nodes);
    let mut stacks: HashMap<i64, Vec<String>> = HashMap::new();
    let mut tick = tokio::time::interval(TICK);
    let mut slow = tokio::time::interval(SLOW_TICK);
    let slow_work = |probes: &LoadedProbes| {
        if let Ok(m) = meminfo::read() {
            metrics.observe(&Record::Meminfo(Meminfo {
                ts_ns: system::boottime_ns(),
                page_tables_kb: m.page_tables_kb,
                vmalloc_used_kb: m.vmalloc_used_kb,
            }));
        }
        if let Ok(lost) = probes.lost() {
            metrics.set_lost(per_cpu(&lost));
        }
    };
    loop {
        tokio::select! {
            r = ring.readable_mut() => match r {
                Ok(mut g) => {
                    g.clear_ready();
                    crate::live::drain(g.get_inner_mut(), &probes, &mut classifier, &mut stacks,
                        |rec| metrics.observe(&rec));
                }
                Err(e) => return Err(format!("ring buffer: {e}")),
            },
            _ = tick.tick() => {
                // The probes submit without waking user space for every record (cheaper in
                // the kernel), so readiness alone can leave records waiting: drain on the tick.
                crate::live::drain(
                    ring.get_mut(),
                    &probes,
                    &mut classifier,
                    &mut stacks,
                    |rec| metrics.observe(&rec),
                );
                heartbeat.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                if stacks.len() > MAX_STACKS {
                    stacks.clear();
                }
                if STOP.load(Ordering::Relaxed) {
                    break;
                }
            }
            _ = slow.tick() => slow_work(&probes),
        }
    }
    // No event is produced after the detach; what is left in the ring is still counted.
    probes.detach();
    crate::live::drain(
        ring.get_mut(),
        &probes,
        &mut classifier,
        &mut stacks,
        |rec| metrics.observe(&rec),
    );
    slow_work(&probes);
    Ok(())
}

/// Lost counts `[kind][cpu]` summed over kinds, per CPU.
fn per_cpu(lost: &[Vec<u64>]) -> Vec<u64> {
    let cpus = lost.iter().map(Vec::len).max().unwrap_or(0);
    (0..cpus)
        .map(|c| lost.iter().filter_map(|k| k.get(c)).sum())
        .collect()
}
