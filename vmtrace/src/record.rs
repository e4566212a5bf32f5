//! `vmtrace record`: probes → reorder → JSON Lines, until a duration, a signal or a command ends.
//!
//! Order of work matters:
//! 1. probes are loaded and attached *before* the output file is created, so a run without
//!    privileges leaves no half-written file;
//! 2. a calibration allocation confirms the probes see traffic and reads VMALLOC_START/END and
//!    `lazy_max_pages` from the kernel itself;
//! 3. `/proc/vmallocinfo` is snapshotted after the probes are live, so every area a later event
//!    frees is either in the snapshot or allocated by a recorded event.
//!
//! The pieces between the ring buffer and a finished file ([`Pipeline`], [`TraceFile`],
//! [`ProbeCounters`], [`footer`], [`calibrate`], [`header`]) are public because
//! `vmtrace serve --record` writes its rotating files with the very same code
//! (`export::rotate`): one pipeline, so a file from either reads and replays the same way.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use tokio::signal::unix::{signal, SignalKind};

use crate::host::system::{self, SystemFacts};
use crate::host::vmallocinfo;
use crate::live::EventRings;
use crate::probe::contention::Classifier;
use crate::probe::selection::{resolve_probes, DEFAULT_PROBES};
use crate::probe::LoadedProbes;
use crate::trace::{
    self, ClassHolds, ClassTotal, EventCounts, Footer, Header, KAddr, LadderCounts, LadderStats,
    LockClass, Meminfo, Record, StopReason, Tool, TraceWriter, VmallocSnapshot, VmapFacts,
};
use crate::value_parsers::parse_duration;

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Output trace file (JSON Lines). A name ending in `.zst` writes zstd (about 15× smaller),
    /// `.gz` gzip; every vmtrace reader opens either. `-` writes to stdout.
    #[arg(short, long, default_value = "vmtrace.jsonl")]
    pub output: PathBuf,

    /// Stop after this long (e.g. `10s`, `1m30s`). Without it, record until Ctrl-C, SIGTERM or
    /// the end of COMMAND.
    #[arg(short, long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Total size of the BPF ring buffers in MiB (a power of two), split into one ring per CPU (up
    /// to eight). Bigger absorbs longer reader stalls.
    #[arg(long, default_value_t = 64)]
    pub ring_mib: u32,

    /// Do not print the end-of-recording summary on stderr.
    #[arg(short, long)]
    pub quiet: bool,

    /// Print the end-of-recording summary as JSON on stdout (ignored with `-o -`).
    #[arg(long)]
    pub json: bool,

    /// How often to sample /proc/meminfo PageTables and VmallocUsed into the trace; `0` turns
    /// sampling off.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub meminfo_interval: Option<Duration>,

    /// Sample /proc/allocinfo (memory allocation profiling) into the trace this often: totals,
    /// page-table pages (`pagetable_alloc`) and the vmalloc allocator's own tags, so a replay can
    /// put observed page-table growth beside the model's. Off unless given; when the file is
    /// missing vmtrace says why once and records without it.
    #[arg(long, value_parser = parse_duration)]
    pub allocinfo_interval: Option<Duration>,

    /// The allocinfo file to sample (tests point it at a fixture).
    #[arg(long, default_value = "/proc/allocinfo", hide = true)]
    pub allocinfo_path: PathBuf,

    /// Optional probes to attach besides the three vmalloc tracepoints, comma-separated:
    /// lock_waits, purge_work, page_tables, backing_pages, alloc_latency, lock_holds, `all` or
    /// `none`. page_tables and backing_pages hook kmem:mm_page_alloc, which fires for every page
    /// the kernel allocates, and lock_holds (fentry kernels only; it brings lock_waits) every
    /// spinlock take and release, so they cost the most (see docs/probes.md); `vmtrace probes`
    /// shows which rung each would use here.
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_PROBES)]
    pub probes: Vec<String>,

    /// Empty the vmap pools just before the start snapshot, so that it shows the whole
    /// allocator state and a free-running replay starts where the kernel did. Pooled areas are
    /// in no list /proc/vmallocinfo prints, so with full pools (after any earlier vmalloc-heavy
    /// work) the snapshot shows their space as free. Writes 2 to /proc/sys/vm/drop_caches,
    /// which runs the `vmap-node` shrinker and also drops reclaimable slab (dentries and
    /// inodes): meant for a test box, not a busy production machine.
    #[arg(long)]
    pub drain_pools: bool,

    /// Command to run while recording, like `perf record -- cmd`. Recording stops when it exits.
    #[arg(last = true)]
    pub command: Vec<String>,
}
impl RecordArgs {
    /// `--probes` resolved to logical probe names, refusing unknown ones with the list of valid
    /// names.
    pub fn wanted_probes(&self) -> Result<Vec<&'static str>, String> {
        resolve_probes(&self.probes)
    }
}

/// Exit status when events were lost: the trace is complete as a file but not as a record.
pub const EXIT_LOST_EVENTS: u8 = 3;

/// Events are held this long before being written, so records reserved on different CPUs in
/// a slightly different order than their timestamps are written in timestamp order.
pub const REORDER_WINDOW_NS: u64 = 50_000_000;
/// How often buffered output is flushed; bounds what a SIGKILL can lose.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// Calibration waits at most this long for its own allocation and free to come back.
const CALIBRATION_TIMEOUT: Duration = Duration::from_secs(2);
/// How often calibration looks for its own events.
const CALIBRATION_POLL: Duration = Duration::from_millis(5);

pub fn run(args: &RecordArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(record(args))
}

/// Holds decoded events until the watermark passes them, then releases them in time order.
///
/// The ring buffer delivers events almost sorted (records are reserved in time order; only
/// CPUs racing between reserve and timestamp swap neighbours), so an insertion from the back
/// of a deque is O(1) per event. A binary heap moved whole records on every sift: it was 17 %
/// of `record`'s samples, and memmove another 26 %.
#[derive(Default)]
pub struct Reorder {
    queue: VecDeque<Pending>,
    last_emitted_ts: u64,
    pub late: u64,
}

struct Pending {
    ts: u64,
    record: Record,
}

impl Reorder {
    pub fn push(&mut self, record: Record) {
        let ts = record.ts_ns().unwrap_or(0);
        // After every entry with an equal timestamp, so ties keep their arrival order.
        let mut at = self.queue.len();
        while at > 0 && self.queue[at - 1].ts > ts {
            at -= 1;
        }
        self.queue.insert(at, Pending { ts, record });
    }

    /// Merges `sources` streams, each in time order (an event ring: one CPU's records), into
    /// the buffer: `heads` holds the next record of each source, taken but not merged yet, and
    /// the oldest head always goes next (ties to the lowest source), so the buffer receives
    /// records in time order and each is moved once. `pull(i)` takes the next item of source
    /// `i`: `None` when it is empty (it is not asked again in this call: what it receives
    /// meanwhile is newer than the call's start, which the caller's watermark keeps behind),
    /// `Some(None)` for an item that gave no record (undecodable).
    ///
    /// Stops when the buffer holds `bound` records and returns the oldest head's time then:
    /// every record held is at most that, every record still in a source at least that, so
    /// releasing below it can write nothing out of order. `None` when every source ran dry.
    pub fn merge_from(
        &mut self,
        heads: &mut Vec<Option<Record>>,
        sources: usize,
        bound: usize,
        mut pull: impl FnMut(usize) -> Option<Option<Record>>,
    ) -> Option<u64> {
        heads.resize_with(sources, || None);
        let mut dry = vec![false; sources];
        loop {
            for (i, head) in heads.iter_mut().enumerate() {
                while head.is_none() && !dry[i] {
                    match pull(i) {
                        None => dry[i] = true,
                        Some(rec) => *head = rec,
                    }
                }
            }
            let (ts, i) = heads
                .iter()
                .enumerate()
                .filter_map(|(i, h)| h.as_ref().map(|r| (r.ts_ns().unwrap_or(0), i)))
                .min()?;
            if self.held() >= bound {
                return Some(ts);
            }
            if let Some(rec) = heads[i].take() {
                self.push(rec);
            }
        }
    }

    /// Pops the oldest event if its timestamp is below `watermark` (any event with
    /// `u64::MAX`). One at a time, so a writer can act between two events (rotate a file).
    pub fn pop_one(&mut self, watermark: u64) -> Option<Record> {
        if self.queue.front()?.ts >= watermark {
            return None;
        }
        let p = self.queue.pop_front()?;
        if p.ts < self.last_emitted_ts {
            self.late += 1;
        }
        self.last_emitted_ts = self.last_emitted_ts.max(p.ts);
        Some(p.record)
    }

    /// Pops every event with a timestamp below `watermark` (all of them with `u64::MAX`).
    pub fn pop_ready(&mut self, watermark: u64, mut out: impl FnMut(Record)) {
        while let Some(rec) = self.pop_one(watermark) {
            out(rec);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Record> {
        self.queue.iter().map(|p| &p.record)
    }

    /// Events held.
    fn held(&self) -> usize {
        self.queue.len()
    }

    /// Gives back the memory a burst left behind (a deque keeps its largest capacity), so a
    /// long-running reader's footprint returns to what its steady rate needs. True when it
    /// shrank.
    fn shrink(&mut self) -> bool {
        let cap = self.queue.capacity();
        if cap > 16 * 1024 && self.queue.len() < cap / 8 {
            self.queue.shrink_to(self.queue.len() * 2);
            return true;
        }
        false
    }
}

/// At most this many events wait in the reorder buffer; the rest wait in the ring buffer. At
/// about 110 bytes an event this bounds the buffer near 7 MiB, and it is 25 times what the
/// 50 ms window holds at the fastest rate `stress fix-size` reaches here (about 50,000 events
/// per second). Without it a reader that stalled (a slow disk, a stopped process) moved the
/// whole ring into memory at once: a 3 s stall of `serve --record` under stress grew its heap
/// by 43 MiB, for good.
const MAX_HELD: usize = 1 << 16;

/// From the ring buffer to trace records in time order: decoding, contention stacks resolved to
/// lock classes (through [`crate::live::drain_at_most`], as `top` and `serve` count them), work-item
/// functions resolved to names, then the reorder window.
pub struct Pipeline {
    pub reorder: Reorder,
    /// The next record of each ring, taken out but not yet merged (see [`Pipeline::drain`]).
    heads: Vec<Option<Record>>,
    undecodable: u64,
    classifier: Classifier,
    /// Resolved contention stacks by stack id: the stack map is read once per distinct stack.
    stacks: HashMap<i64, Vec<String>>,
    /// False when nothing writes the records (`serve` without `--record`): they are only
    /// observed, never held.
    keep: bool,
}

impl Pipeline {
    /// A pipeline for a kernel with `nodes` vmap nodes; `keep` is false when the records are
    /// only observed and dropped.
    pub fn new(nodes: u32, keep: bool) -> Self {
        Pipeline {
            reorder: Reorder::default(),
            heads: Vec::new(),
            undecodable: 0,
            classifier: Classifier::new(nodes),
            stacks: HashMap::new(),
            keep,
        }
    }

    /// Moves what is in the rings into the reorder buffer, merging them as it goes
    /// ([`Reorder::merge_from`]; the pipeline keeps each ring's head between drains), until
    /// the buffer holds [`MAX_HELD`] events; `observe` sees each record first, in arrival
    /// order. Returns `Some(ts)` when it stopped at that bound: nothing below `ts` is left in
    /// the rings (see [`pump`]).
    pub fn drain(
        &mut self,
        rings: &mut EventRings,
        probes: &LoadedProbes,
        mut observe: impl FnMut(&Record),
    ) -> Option<u64> {
        let Pipeline {
            reorder,
            heads,
            classifier,
            stacks,
            keep,
            undecodable: undecodable_total,
        } = self;
        if !*keep {
            for i in 0..rings.len() {
                let ring = rings.ring(i);
                let (_, undecodable) = crate::live::drain_at_most(
                    ring,
                    probes,
                    classifier,
                    stacks,
                    usize::MAX,
                    |rec| observe(&rec),
                );
                *undecodable_total += undecodable;
            }
            return None;
        }
        crate::live::know_static_locks(probes, classifier);
        reorder.merge_from(heads, rings.len(), MAX_HELD, |i| {
            let pulled = crate::live::pull_one(rings, i, probes, classifier, stacks)?;
            let Some(rec) = pulled else {
                *undecodable_total += 1;
                return Some(None);
            };
            observe(&rec);
            Some(Some(rec))
        })
    }

    /// Adds a record that did not come from the ring buffer (a meminfo or allocinfo sample).
    pub fn push(&mut self, rec: Record) {
        if self.keep {
            self.reorder.push(rec);
        }
    }

    /// Events written out of order plus ring records that could not be decoded: the footer's
    /// `late_events`, cumulative.
    pub fn late_events(&self) -> u64 {
        self.reorder.late + self.undecodable
    }

    /// Empties the stack cache once it holds more than `max` stacks, so a daemon's memory stays
    /// bounded however many distinct stacks it meets (they are re-read on demand).
    pub fn bound_stack_cache(&mut self, max: usize) {
        if self.stacks.len() > max {
            self.stacks.clear();
        }
    }

    /// Stops holding records (the writer failed): from now on they are only observed.
    pub fn stop_keeping(&mut self) {
        self.keep = false;
        self.heads.clear();
        self.reorder = Reorder::default();
    }
}

/// Drains the rings and has `write` take every event below `watermark` from the pipeline's
/// reorder buffer, in as many rounds as the [`MAX_HELD`] bound needs. While the rings still
/// hold more, a round releases only events older than the oldest one left in them, so a round
/// boundary cannot write anything out of order. `observe` sees every record drained, as in
/// [`Pipeline::drain`].
pub fn pump<E>(
    pipeline: &mut Pipeline,
    rings: &mut EventRings,
    probes: &LoadedProbes,
    watermark: u64,
    mut observe: impl FnMut(&Record),
    mut write: impl FnMut(&mut Pipeline, u64) -> Result<(), E>,
) -> Result<(), E> {
    loop {
        let cut = pipeline.drain(rings, probes, &mut observe);
        let Some(cut) = cut else {
            write(pipeline, watermark)?;
            break;
        };
        let held = pipeline.reorder.held();
        write(pipeline, watermark.min(cut))?;
        if pipeline.reorder.held() == held {
            // Everything held is newer than the watermark (over a million events a second):
            // the rest waits in the rings for the next round.
            break;
        }
    }
    if pipeline.reorder.shrink() {
        release_free_heap();
    }
    Ok(())
}

/// Returns the heap pages a burst freed to the kernel. An allocator keeps freed memory for
/// reuse (the deque's buffer and the events' small strings lie among live blocks), so without
/// this a daemon's RSS keeps the height of its largest burst for good. The `vmtrace` binary
/// allocates through mimalloc, which `mi_collect(true)` makes give back its free pages; without
/// it, a `serve --record` stopped through 300,000 events kept about 40 MiB more heap than after
/// the same events unstalled (tests/privileged_serve.rs). `malloc_trim` does the same for what
/// goes through glibc (a library user's allocator, C code). Called only after a burst, so its
/// walk over the heap costs nothing in the steady state.
fn release_free_heap() {
    // SAFETY: mi_collect only returns mimalloc's free memory to the kernel; it takes no
    // pointers, and does nothing when mimalloc holds nothing.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the kernel; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What one trace file holds, counted as its records are written: its footer's counts.
#[derive(Debug, Default)]
pub struct FileTally {
    pub events: EventCounts,
    ladder: LadderCounts,
    by_class: BTreeMap<LockClass, (u64, u64)>,
    /// `(pid, start, end)` of every `drain_vmap_area_work` item.
    drain_items: Vec<(u32, u64, u64)>,
    /// `(pid, ts)` of every purge run by a kworker.
    worker_purges: Vec<(u32, u64)>,
}

impl FileTally {
    fn add(&mut self, rec: &Record) {
        match rec {
            Record::Alloc(_) => self.events.alloc += 1,
            Record::Free(_) => self.events.free += 1,
            Record::Purge(p) => {
                self.events.purge += 1;
                if p.ctx.comm.starts_with("kworker") {
                    self.worker_purges.push((p.ctx.pid, p.ctx.ts_ns));
                }
            }
            Record::Contention(c) => {
                self.ladder.contention += 1;
                let e = self.by_class.entry(c.class).or_default();
                e.0 += 1;
                e.1 += c.wait_ns;
            }
            Record::Work(w) => {
                self.ladder.work += 1;
                if w.function == "drain_vmap_area_work" {
                    self.drain_items
                        .push((w.ctx.pid, w.start_ns, w.start_ns + w.duration_ns));
                }
            }
            Record::PtPage(_) => self.ladder.pt_page += 1,
            Record::Latency(_) => self.ladder.latency += 1,
            _ => {}
        }
    }

    /// Purges from workers, and how many lie inside a drain work item of the same worker.
    fn purge_matching(&self) -> (u64, u64) {
        let matched = self
            .worker_purges
            .iter()
            .filter(|(pid, ts)| {
                self.drain_items
                    .iter()
                    .any(|(p, s, e)| p == pid && s <= ts && ts <= e)
            })
            .count();
        (self.worker_purges.len() as u64, matched as u64)
    }
}

/// A trace being written: header and snapshot first, then events, then a footer.
pub struct TraceFile<W: Write> {
    writer: TraceWriter<W>,
    pub tally: FileTally,
}

impl<W: Write> TraceFile<W> {
    /// Writes the header and the snapshot (and flushes them, so the file is readable at once).
    pub fn start(out: W, header: &Header, snapshot: &VmallocSnapshot) -> io::Result<Self> {
        let mut writer = TraceWriter::new(out);
        writer.write(&Record::Header(Box::new(header.clone())))?;
        writer.write(&Record::Vmallocinfo(Box::new(snapshot.clone())))?;
        writer.flush()?;
        Ok(TraceFile {
            writer,
            tally: FileTally::default(),
        })
    }

    /// Writes one event line and counts it.
    pub fn write_event(&mut self, rec: &Record) -> io::Result<()> {
        self.tally.add(rec);
        self.writer.write(rec)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }

    /// Bytes written so far, header included.
    pub fn bytes_written(&self) -> u64 {
        self.writer.bytes_written()
    }

    /// Lines written after the header and the snapshot.
    pub fn event_lines(&self) -> u64 {
        self.writer.lines_written().saturating_sub(2)
    }

    /// Writes the footer and returns the flushed sink.
    pub fn finish(mut self, footer: &Footer) -> io::Result<W> {
        self.writer
            .write(&Record::Footer(Box::new(footer.clone())))?;
        self.writer.into_inner()
    }
}

/// Moves every event below `watermark` from the reorder buffer into the file.
fn emit<W: Write>(
    reorder: &mut Reorder,
    watermark: u64,
    file: &mut TraceFile<W>,
) -> io::Result<()> {
    while let Some(rec) = reorder.pop_one(watermark) {
        file.write_event(&rec)?;
    }
    Ok(())
}

/// The probes' cumulative counters, read together, so a file that covers only part of the
/// probes' life (a rotated one) can report the difference since it began.
#[derive(Clone, Debug, Default)]
pub struct ProbeCounters {
    /// Reserve failures `[kind][cpu]`.
    pub lost: Vec<Vec<u64>>,
    /// The ladder's `vmtrace_common::counter` values, as the footer's `ladder` names them.
    pub stack_map_failures: u64,
    pub stack_read_failures: u64,
    pub contention_filtered: u64,
    pub contention_nested: u64,
    pub contention_known: u64,
    pub page_stack_walks: u64,
    pub work_unmatched_end: u64,
    /// Backing-page allocations by order.
    pub backing_page_orders: Vec<u64>,
    /// The hold probe's `HOLD_HIST`, summed over CPUs (layout: `vmtrace_common::HOLD_STRIDE`).
    pub hold_hist: Vec<u64>,
    pub hold_nested: u64,
}

impl ProbeCounters {
    pub fn read(probes: &LoadedProbes) -> anyhow::Result<Self> {
        use vmtrace_common::counter;
        Ok(ProbeCounters {
            lost: probes.lost()?,
            stack_map_failures: probes.counter(counter::STACK_MAP_FAIL),
            stack_read_failures: probes.counter(counter::STACK_READ_FAIL),
            contention_filtered: probes.counter(counter::CONTENTION_FILTERED),
            contention_nested: probes.counter(counter::CONTENTION_NESTED),
            contention_known: probes.counter(counter::CONTENTION_KNOWN),
            page_stack_walks: probes.counter(counter::PAGE_STACK_WALKS),
            work_unmatched_end: probes.counter(counter::WORK_UNMATCHED_END),
            backing_page_orders: probes.backing_orders(),
            hold_hist: probes.hold_hist(),
            hold_nested: probes.counter(counter::HOLD_NESTED),
        })
    }

    /// What accumulated since `base` was read (counters only grow; a shorter `base` is
    /// padded with zeros).
    pub fn since(&self, base: &ProbeCounters) -> ProbeCounters {
        let sub = |a: &[u64], b: &[u64]| -> Vec<u64> {
            a.iter()
                .enumerate()
                .map(|(i, v)| v.saturating_sub(b.get(i).copied().unwrap_or(0)))
                .collect()
        };
        ProbeCounters {
            lost: self
                .lost
                .iter()
                .enumerate()
                .map(|(k, v)| sub(v, base.lost.get(k).map_or(&[], Vec::as_slice)))
                .collect(),
            stack_map_failures: self
                .stack_map_failures
                .saturating_sub(base.stack_map_failures),
            stack_read_failures: self
                .stack_read_failures
                .saturating_sub(base.stack_read_failures),
            contention_filtered: self
                .contention_filtered
                .saturating_sub(base.contention_filtered),
            contention_nested: self
                .contention_nested
                .saturating_sub(base.contention_nested),
            contention_known: self.contention_known.saturating_sub(base.contention_known),
            page_stack_walks: self.page_stack_walks.saturating_sub(base.page_stack_walks),
            work_unmatched_end: self
                .work_unmatched_end
                .saturating_sub(base.work_unmatched_end),
            backing_page_orders: sub(&self.backing_page_orders, &base.backing_page_orders),
            hold_hist: sub(&self.hold_hist, &base.hold_hist),
            hold_nested: self.hold_nested.saturating_sub(base.hold_nested),
        }
    }
}

/// The footer of a file: `tally` is what the file holds, `late_events` and `counters` what
/// happened while it was written.
pub fn footer(
    reason: StopReason,
    command_exit_code: Option<i32>,
    tally: &FileTally,
    late_events: u64,
    counters: &ProbeCounters,
) -> Footer {
    use vmtrace_common::kind;
    let lost = &counters.lost;
    let ncpu = lost.iter().map(Vec::len).max().unwrap_or(0);
    let mut per_cpu = vec![0u64; ncpu];
    for by_cpu in lost {
        for (cpu, n) in by_cpu.iter().enumerate() {
            per_cpu[cpu] += n;
        }
    }
    let sum = |k: u32| lost.get(k as usize).map(|v| v.iter().sum()).unwrap_or(0);
    let (purges_from_work, purges_matched) = tally.purge_matching();
    let ladder = LadderStats {
        events: tally.ladder,
        lost: LadderCounts {
            contention: sum(kind::CONTENTION),
            work: sum(kind::WORK) + sum(kind::WORK_START),
            pt_page: sum(kind::PT_PAGE),
            latency: sum(kind::LATENCY),
        },
        stack_map_failures: counters.stack_map_failures,
        stack_read_failures: counters.stack_read_failures,
        contention_filtered: counters.contention_filtered,
        contention_nested: counters.contention_nested,
        contention_known: counters.contention_known,
        page_stack_walks: counters.page_stack_walks,
        work_unmatched_end: counters.work_unmatched_end,
        contention_by_class: LockClass::ALL
            .iter()
            .map(|&class| {
                let (count, wait_ns) = tally.by_class.get(&class).copied().unwrap_or_default();
                ClassTotal {
                    class,
                    count,
                    wait_ns,
                }
            })
            .collect(),
        backing_page_orders: counters.backing_page_orders.clone(),
        purges_from_work,
        purges_matched,
        lock_holds: class_holds(&counters.hold_hist),
        hold_nested: counters.hold_nested,
    };
    Footer {
        end_boottime_ns: system::boottime_ns(),
        reason,
        command_exit_code,
        events: tally.events,
        lost_total: per_cpu.iter().sum(),
        lost_per_cpu: per_cpu,
        lost_by_kind: EventCounts {
            alloc: sum(kind::ALLOC),
            free: sum(kind::FREE),
            purge: sum(kind::PURGE),
        },
        late_events,
        kernel_run_stats: None,
        ladder: Some(ladder),
    }
}

/// The hold histogram per class, classes with holds only.
fn class_holds(hist: &[u64]) -> Vec<ClassHolds> {
    use vmtrace_common::{HOLD_BUCKETS, HOLD_STRIDE};
    let (stride, buckets) = (HOLD_STRIDE as usize, HOLD_BUCKETS as usize);
    LockClass::ALL
        .iter()
        .enumerate()
        .filter_map(|(code, &class)| {
            let row = hist.get(code * stride..(code + 1) * stride)?;
            let histogram = row[..buckets].to_vec();
            let count: u64 = histogram.iter().sum();
            (count > 0).then(|| ClassHolds {
                class,
                count,
                hold_ns: row[buckets],
                histogram,
            })
        })
        .collect()
}

/// A `/proc/meminfo` sample as a trace record; `None` (logged) when the file cannot be read.
pub fn meminfo_sample() -> Option<Record> {
    match crate::host::meminfo::read() {
        Ok(m) => Some(Record::Meminfo(Meminfo {
            ts_ns: system::boottime_ns(),
            page_tables_kb: m.page_tables_kb,
            vmalloc_used_kb: m.vmalloc_used_kb,
        })),
        Err(e) => {
            log::debug!("meminfo sample skipped: {e}");
            None
        }
    }
}

/// Samples the allocinfo file as a trace record; `Err` says why it cannot be read, so the
/// caller stops trying (and says why once).
fn allocinfo_sample(path: &Path) -> Result<Record, String> {
    let ts_ns = system::boottime_ns();
    let bytes = crate::allocinfo::snapshot::read(path).map_err(|e| e.to_string())?;
    let name = path.display().to_string();
    let snap = crate::allocinfo::parse(&name, &bytes, crate::allocinfo::Mode::Lenient)
        .map_err(|e| e.to_string())?;
    let vmalloc_tags = snap
        .tags
        .iter()
        .filter(|t| t.key.file == crate::allocinfo::marks::VMALLOC_FILE)
        .cloned()
        .collect();
    Ok(Record::Allocinfo(Box::new(crate::trace::AllocinfoSample {
        ts_ns,
        total: snap.total(),
        pagetable: snap.pagetable(),
        vmalloc_tags,
        inaccurate: snap.has_inaccurate(),
        skipped_lines: snap.skipped.len() as u64,
    })))
}

/// Pushes an allocinfo sample into the pipeline; false (with the reason on stderr) when the
/// file cannot be sampled.
fn sample_allocinfo(pipeline: &mut Pipeline, path: &Path) -> bool {
    match allocinfo_sample(path) {
        Ok(rec) => {
            pipeline.push(rec);
            true
        }
        Err(e) => {
            eprintln!("vmtrace: warning: not sampling allocinfo: {e}");
            false
        }
    }
}

/// What the calibration allocation told us about the kernel.
#[derive(Debug, Default)]
pub struct Calibration {
    vstart: Option<KAddr>,
    vend: Option<KAddr>,
    nr_lazy_max: Option<u64>,
}

impl Calibration {
    /// Whether the probes saw the calibration allocation.
    pub fn saw_allocation(&self) -> bool {
        self.vstart.is_some()
    }
}

/// The header of a trace: the kernel's facts, the calibration's findings and how each probe
/// attached. `start_*` are read now, so a later file's header gets its own by calling again.
pub fn header(facts: &SystemFacts, calibration: &Calibration, probes: &LoadedProbes) -> Header {
    let (nodes, zone) = system::vmap_nodes(facts.possible_cpus, facts.page_size);
    Header {
        format: trace::FORMAT.into(),
        version: trace::VERSION,
        tool: Tool {
            name: "vmtrace".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        command_line: std::env::args().collect(),
        vmap: VmapFacts {
            nr_vmap_nodes: nodes,
            zone_size: zone,
            lazy_max_pages_computed: system::lazy_max_pages(facts.online_cpus, facts.page_size),
            lazy_max_pages_tracepoint: calibration.nr_lazy_max,
            vmalloc_start: calibration.vstart,
            vmalloc_end: calibration.vend,
            source: "nodes and zone from possible CPUs (vmap_init_nodes); lazy_max_pages \
                     computed from online CPUs and read from a free_vmap_area_noflush event; \
                     VMALLOC range from the vstart/vend of a calibration vmalloc"
                .into(),
        },
        system: facts.clone(),
        probes: probes.infos.clone(),
        clock: "CLOCK_BOOTTIME".into(),
        start_boottime_ns: system::boottime_ns(),
        start_realtime_ns: system::realtime_ns(),
        ring_buffer_bytes: probes.ring_bytes,
        synthetic: None,
        imported: None,
    }
}

async fn record(args: &RecordArgs) -> anyhow::Result<ExitCode> {
    let wanted = args.wanted_probes().map_err(anyhow::Error::msg)?;
    check_output(&args.output)?;
    let started = Instant::now();
    let facts = SystemFacts::read().context("reading kernel facts")?;
    let ring_bytes = u64::from(args.ring_mib) << 20;
    // Signals first: from here on Ctrl-C is an orderly stop, never a kill mid-way.
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;

    let mut probes = LoadedProbes::load_and_attach(ring_bytes, &wanted)?;
    let stats_at_start = crate::probe::loader::bpf_stats_enabled();
    let mut rings = EventRings::take(&mut probes)?;
    let (nodes, _) = system::vmap_nodes(facts.possible_cpus, facts.page_size);
    let mut pipeline = Pipeline::new(nodes, true);

    // Snapshot right after attach: the window in which an event can refer to an area the
    // snapshot does not show is then only as long as the read itself.
    let drained = args.drain_pools
        && match vmallocinfo::drain_pools() {
            Ok(()) => true,
            Err(e) => {
                log::warn!("--drain-pools: {e}; the snapshot cannot show the pools");
                false
            }
        };
    let mut snapshot = vmallocinfo::snapshot().context("snapshotting /proc/vmallocinfo")?;
    snapshot.pools_drained = drained;
    if !snapshot.real_addresses {
        log::warn!(
            "/proc/vmallocinfo addresses are hashed; the start snapshot cannot seed a replay"
        );
    }
    let calibration = calibrate(&mut pipeline, &mut rings, &probes, facts.page_size, |_| {}).await;
    if !calibration.saw_allocation() {
        log::warn!("calibration allocation was not seen by the probes; header range is unknown");
    }
    let header = header(&facts, &calibration, &probes);

    // The command starts before the file exists, so a command that cannot start leaves no
    // file; its first events wait in the reorder buffer until the header is written.
    let mut child = match args.command.split_first() {
        Some((program, rest)) => Some(
            tokio::process::Command::new(program)
                .args(rest)
                .kill_on_drop(false)
                .spawn()
                .with_context(|| format!("starting `{}`", args.command.join(" ")))?,
        ),
        None => None,
    };

    // Only now, with probes attached and facts gathered, does an output file appear.
    let to_stdout = args.output.as_os_str() == "-";
    let sink: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout())
    } else {
        crate::trace::compress::create(&args.output)
            .with_context(|| format!("creating {}", args.output.display()))?
    };
    let mut file = TraceFile::start(sink, &header, &snapshot)?;
    drop(snapshot);

    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut flush_tick = tokio::time::interval(FLUSH_INTERVAL);
    let meminfo_every = args.meminfo_interval.filter(|d| !d.is_zero());
    let mut meminfo_tick =
        tokio::time::interval(meminfo_every.unwrap_or(Duration::from_secs(3600)));
    // Sampled once at the start, then on the interval, then once at the end, so even a short
    // recording has the growth between two reads.
    let mut allocinfo_every = args.allocinfo_interval.filter(|d| !d.is_zero());
    if allocinfo_every.is_some() && !sample_allocinfo(&mut pipeline, &args.allocinfo_path) {
        allocinfo_every = None;
    }
    let mut allocinfo_tick = tokio::time::interval_at(
        tokio::time::Instant::now() + allocinfo_every.unwrap_or(Duration::from_secs(3600)),
        allocinfo_every.unwrap_or(Duration::from_secs(3600)),
    );
    let mut command_exit_code = None;
    let mut ring_error = None;
    let reason = loop {
        tokio::select! {
            r = rings.readable() => match r {
                Ok(()) => {
                    pipeline.drain(&mut rings, &probes, |_| {});
                }
                Err(e) => {
                    // Still write what we have and a footer that says the recording broke off.
                    ring_error = Some(e);
                    break StopReason::Error;
                }
            },
            _ = meminfo_tick.tick(), if meminfo_every.is_some() => {
                if let Some(rec) = meminfo_sample() {
                    pipeline.push(rec);
                }
            }
            _ = allocinfo_tick.tick(), if allocinfo_every.is_some() => {
                if !sample_allocinfo(&mut pipeline, &args.allocinfo_path) {
                    allocinfo_every = None;
                }
            }
            _ = flush_tick.tick() => {
                let watermark = system::boottime_ns().saturating_sub(REORDER_WINDOW_NS);
                pump(&mut pipeline, &mut rings, &probes, watermark, |_| {}, |p, w| {
                    emit(&mut p.reorder, w, &mut file)
                })
                .context("writing the trace")?;
                file.flush().context("writing the trace")?;
            }
            _ = sleep_until(deadline) => break StopReason::Duration,
            _ = sigint.recv() => break StopReason::Sigint,
            _ = sigterm.recv() => break StopReason::Sigterm,
            status = wait_child(&mut child) => {
                // A command killed by a signal reports 128 + signal, as shells do.
                command_exit_code = status
                    .code()
                    .or_else(|| std::os::unix::process::ExitStatusExt::signal(&status).map(|s| 128 + s));
                break StopReason::CommandExited;
            }
        }
    };

    // Frees deferred to workqueues (e.g. a closed BPF map) land a few ms after the command
    // exits; give them a moment so the trace does not end mid-sequence.
    tokio::time::sleep(Duration::from_millis(100)).await;
    if meminfo_every.is_some() {
        if let Some(rec) = meminfo_sample() {
            pipeline.push(rec);
        }
    }
    if allocinfo_every.is_some() {
        sample_allocinfo(&mut pipeline, &args.allocinfo_path);
    }
    probes.detach();
    pump(
        &mut pipeline,
        &mut rings,
        &probes,
        u64::MAX,
        |_| {},
        |p, w| emit(&mut p.reorder, w, &mut file),
    )
    .context("writing the trace")?;
    let counters = ProbeCounters::read(&probes)?;
    let mut footer = footer(
        reason,
        command_exit_code,
        &file.tally,
        pipeline.late_events(),
        &counters,
    );
    if stats_at_start {
        footer.kernel_run_stats = probes.run_stats();
    }
    let sink = file.finish(&footer).context("flushing the trace")?;
    drop(sink);
    if !to_stdout {
        if let Ok(f) = File::open(&args.output) {
            let _ = f.sync_all();
        }
    }

    let elapsed = started.elapsed();
    report(args, &footer, elapsed, to_stdout)?;
    if let Some(e) = ring_error {
        return Err(e).context("reading the ring buffer (the trace ends with an `error` footer)");
    }
    if let Some(mut c) = child {
        if reason != StopReason::CommandExited {
            // perf leaves the command running too; say so rather than killing it silently.
            if let Ok(None) = c.try_wait() {
                eprintln!("vmtrace: recording stopped; the command is still running");
            }
        }
    }
    Ok(if footer.lost_total > 0 {
        ExitCode::from(EXIT_LOST_EVENTS)
    } else {
        match command_exit_code {
            Some(0) | None => ExitCode::SUCCESS,
            Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        }
    })
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn wait_child(child: &mut Option<tokio::process::Child>) -> std::process::ExitStatus {
    match child {
        Some(c) => match c.wait().await {
            Ok(s) => s,
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// perf-style one-line report on stderr (or JSON on stdout with `--json`).
fn report(
    args: &RecordArgs,
    footer: &Footer,
    elapsed: Duration,
    to_stdout: bool,
) -> anyhow::Result<()> {
    let size = if to_stdout {
        None
    } else {
        std::fs::metadata(&args.output).ok().map(|m| m.len())
    };
    if args.json && !to_stdout {
        let v = serde_json::json!({
            "output": args.output,
            "bytes": size,
            "elapsed_s": elapsed.as_secs_f64(),
            "reason": footer.reason,
            "events": footer.events,
            "lost_total": footer.lost_total,
            "lost_per_cpu": footer.lost_per_cpu,
            "late_events": footer.late_events,
            "command_exit_code": footer.command_exit_code,
        });
        println!("{v}");
    }
    if !args.quiet {
        let e = &footer.events;
        eprintln!(
            "[ vmtrace record: {} events ({} alloc, {} free, {} purge) in {:.2} s, stopped by {}, \
             {} lost{} ]",
            e.total(),
            e.alloc,
            e.free,
            e.purge,
            elapsed.as_secs_f64(),
            reason_text(footer.reason),
            footer.lost_total,
            match size {
                Some(b) => format!(
                    ", wrote {:.1} MiB ({:.0} B/event) to {}",
                    b as f64 / 1048576.0,
                    b as f64 / e.total().max(1) as f64,
                    args.output.display()
                ),
                None => String::new(),
            }
        );
    }
    if footer.lost_total > 0 {
        eprintln!(
            "vmtrace: WARNING: {} events were lost (ring buffer full; per CPU: {:?}). \
             Try a larger --ring-mib.",
            footer.lost_total, footer.lost_per_cpu
        );
    }
    Ok(())
}

fn reason_text(r: StopReason) -> &'static str {
    match r {
        StopReason::Duration => "--duration",
        StopReason::Sigint => "SIGINT",
        StopReason::Sigterm => "SIGTERM",
        StopReason::CommandExited => "command exit",
        StopReason::Error => "error",
        StopReason::Rotated => "rotation",
    }
}

/// Allocates and frees one small vmalloc area of our own (a 1-page mmapable BPF array) and waits
/// for the probes to report both, which proves end to end that events flow, and reads from the
/// kernel's own events the VMALLOC range and `lazy_max_pages`. Needs CAP_BPF (the array), so a
/// daemon calls it before dropping its capabilities. `observe` sees every record drained
/// meanwhile, as in [`Pipeline::drain`].
pub async fn calibrate(
    pipeline: &mut Pipeline,
    rings: &mut EventRings,
    probes: &LoadedProbes,
    page_size: u64,
    mut observe: impl FnMut(&Record),
) -> Calibration {
    let mut cal = Calibration::default();
    let me = std::process::id();
    // 1 is a power of two, so the unprivileged entry rounding cannot change the size.
    let expected = crate::workload::fix_size_area_bytes(1, page_size);
    if let Err(e) = crate::workload::ArrayMap::create(1, page_size).map(drop) {
        log::warn!("calibration allocation failed: {e}");
        return cal;
    }
    let deadline = tokio::time::Instant::now() + CALIBRATION_TIMEOUT;
    let mut addr = None;
    loop {
        pipeline.drain(rings, probes, &mut observe);
        for rec in pipeline.reorder.iter() {
            match rec {
                Record::Alloc(a)
                    if a.ctx.tgid == me
                        && a.size == expected
                        && a.failed == 0
                        && addr.is_none() =>
                {
                    addr = Some(a.addr);
                    cal.vstart = Some(a.vstart);
                    cal.vend = Some(a.vend);
                }
                Record::Free(f) if Some(f.va_start) == addr => {
                    cal.nr_lazy_max = Some(f.nr_lazy_max)
                }
                Record::Free(f) if cal.nr_lazy_max.is_none() && addr.is_some() => {
                    cal.nr_lazy_max = Some(f.nr_lazy_max)
                }
                _ => {}
            }
        }
        if cal.vstart.is_some() && cal.nr_lazy_max.is_some() {
            return cal;
        }
        // The probes wake readers only in batches, so poll rather than wait for readiness.
        if tokio::time::Instant::now() >= deadline {
            return cal;
        }
        tokio::time::sleep(CALIBRATION_POLL).await;
    }
}

/// Checks an output path before any work, so a typo fails fast.
pub fn check_output(path: &Path) -> anyhow::Result<()> {
    if path.as_os_str() == "-" {
        return Ok(());
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(dir) = dir {
        if !dir.is_dir() {
            bail!("output directory {} does not exist", dir.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Ctx, Purge};

    fn purge(ts: u64) -> Record {
        Record::Purge(Purge {
            ctx: Ctx {
                ts_ns: ts,
                cpu: 0,
                tgid: 1,
                pid: 1,
                comm: "k".into(),
            },
            start: KAddr(0),
            end: KAddr(0),
            npurged: 0,
        })
    }

    #[test]
    fn reorder_releases_in_time_order_below_the_watermark() {
        let mut r = Reorder::default();
        for ts in [30, 10, 20, 50, 40] {
            r.push(purge(ts));
        }
        let mut out = Vec::new();
        r.pop_ready(35, |rec| out.push(rec.ts_ns().unwrap()));
        assert_eq!(out, [10, 20, 30]);
        r.push(purge(25)); // arrives after 30 was written: late
        r.pop_ready(u64::MAX, |rec| out.push(rec.ts_ns().unwrap()));
        assert_eq!(out, [10, 20, 30, 25, 40, 50]);
        assert_eq!(r.late, 1);
    }

    proptest::proptest! {
        /// Sources in time order (one per ring), merged one drain after another with single
        /// pushes in between, come out exactly as if every record had been pushed alone: in
        /// time order, ties in arrival order (sources in index order).
        #[test]
        fn merged_sources_come_out_like_single_pushes(
            drains in proptest::collection::vec(
                (proptest::collection::vec(proptest::collection::vec(0u64..60, 0..30), 1..4), 0u64..60),
                1..6,
            ),
        ) {
            let (mut merged, mut single) = (Reorder::default(), Reorder::default());
            let mut seq = 0u32;
            let mut tagged = |t: u64| {
                let mut rec = purge(t);
                if let Record::Purge(p) = &mut rec {
                    p.npurged = seq;
                }
                seq += 1;
                rec
            };
            for (runs, extra) in drains {
                let mut sources: Vec<std::collections::VecDeque<Record>> = Vec::new();
                for mut run in runs {
                    run.sort();
                    let mut source = std::collections::VecDeque::new();
                    for t in run {
                        let rec = tagged(t);
                        single.push(rec.clone());
                        source.push_back(rec);
                    }
                    sources.push(source);
                }
                let mut heads = Vec::new();
                let n = sources.len();
                let cut = merged.merge_from(&mut heads, n, usize::MAX, |i| {
                    sources[i].pop_front().map(Some)
                });
                proptest::prop_assert_eq!(cut, None);
                proptest::prop_assert!(sources.iter().all(|s| s.is_empty()));
                let rec = tagged(extra);
                single.push(rec.clone());
                merged.push(rec);
            }
            let drain = |r: &mut Reorder| {
                let mut out = Vec::new();
                r.pop_ready(u64::MAX, |rec| {
                    if let Record::Purge(p) = rec {
                        out.push((p.ctx.ts_ns, p.npurged));
                    }
                });
                out
            };
            proptest::prop_assert_eq!(drain(&mut merged), drain(&mut single));
        }

        /// A merge bounded to a few held records, released below the time it returns round after
        /// round (what `pump` does after a stall), writes every record once, in time order:
        /// never one record late, however unevenly the sources are filled. Releasing by a
        /// watermark alone here is what wrote 12,578 records late in a stalled `serve --record`.
        #[test]
        fn a_bounded_merge_never_releases_out_of_order(
            runs in proptest::collection::vec(proptest::collection::vec(0u64..1000, 0..80), 1..5),
            bound in 1usize..20,
        ) {
            let mut sources: Vec<std::collections::VecDeque<Record>> = runs
                .iter()
                .map(|run| {
                    let mut run = run.clone();
                    run.sort();
                    run.into_iter().map(purge).collect()
                })
                .collect();
            let total: usize = sources.iter().map(|s| s.len()).sum();
            let (mut r, mut heads, mut out) = (Reorder::default(), Vec::new(), Vec::new());
            let n = sources.len();
            for round in 0.. {
                // Every round releases at least one record, so this many rounds is plenty.
                proptest::prop_assert!(round <= total + 1, "the merge stopped making progress");
                let cut = r.merge_from(&mut heads, n, bound, |i| sources[i].pop_front().map(Some));
                proptest::prop_assert!(r.held() <= bound);
                let held = r.held();
                r.pop_ready(cut.unwrap_or(u64::MAX), |rec| out.push(rec.ts_ns().unwrap()));
                if cut.is_none() {
                    break;
                }
                if r.held() == held {
                    // Everything held ties with the oldest head: release the ties, as a later
                    // watermark would, and go on.
                    r.pop_ready(cut.unwrap_or(u64::MAX) + 1, |rec| out.push(rec.ts_ns().unwrap()));
                }
            }
            proptest::prop_assert_eq!(out.len(), total);
            proptest::prop_assert!(out.windows(2).all(|w| w[0] <= w[1]), "{:?}", out);
            proptest::prop_assert_eq!(r.late, 0);
        }
    }

    proptest::proptest! {
        /// Whatever the arrival order, everything comes out once, in time order, and ties keep
        /// their arrival order.
        #[test]
        fn reorder_sorts_any_arrival_order(ts in proptest::collection::vec(0u64..50, 0..200)) {
            let mut r = Reorder::default();
            for (i, t) in ts.iter().enumerate() {
                let mut rec = purge(*t);
                if let Record::Purge(p) = &mut rec {
                    p.npurged = i as u32;
                }
                r.push(rec);
            }
            let mut out = Vec::new();
            r.pop_ready(u64::MAX, |rec| {
                if let Record::Purge(p) = rec {
                    out.push((p.ctx.ts_ns, p.npurged));
                }
            });
            let mut want: Vec<(u64, u32)> = ts.iter().enumerate().map(|(i, t)| (*t, i as u32)).collect();
            want.sort();
            proptest::prop_assert_eq!(out, want);
            proptest::prop_assert_eq!(r.late, 0);
        }
    }
}
