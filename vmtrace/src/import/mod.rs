//! `vmtrace import`: text output of the vmalloc tracepoints from other tools (`perf script`,
//! `trace-cmd report`, the tracefs `trace` file) as a vmtrace trace.
//!
//! Kernel developers already have such traces, often from a machine vmtrace never ran on. The
//! events carry everything replay needs except the machine's facts and the start state, so
//! those are inferred from the events, or taken from options and a `/proc/vmallocinfo` dump,
//! and the header says which were inferred (`imported.inferred`).
//!
//! The input is read twice: the first pass finds the facts the header needs (CPUs,
//! `nr_lazy_max`, the VMALLOC range), the second writes the records. Memory stays flat in the
//! input's size.

pub mod cli;
pub mod dump_time;
pub mod parse;

use std::collections::HashMap;
use std::io::BufRead;

use thiserror::Error;

use crate::model::{lazy_max_pages, NodeLayout};
use crate::replay::lookahead::DRAIN_FUNCTION;
use crate::trace::wire::SystemFacts;
use crate::trace::{
    Contention, EventCounts, Footer, Header, Imported, KAddr, Record, StopReason, Tool,
    VmallocArea, VmallocSnapshot, VmapFacts, Work, WorkStart, FORMAT, VERSION,
};
use parse::{Format, LockEdge, WorkEdge};

/// x86_64's page size: none of the three formats prints it, and every vmalloc size is a
/// multiple of it.
const PAGE: u64 = 4096;

#[derive(Debug, Error)]
pub enum ImportError {
    #[error("line {line}: {msg}")]
    Line { line: u64, msg: String },
    #[error("reading the input: {0}")]
    Io(#[from] std::io::Error),
    #[error("no vmalloc event in the input ({lines} lines; {other} events of other kinds)")]
    Empty { lines: u64, other: u64 },
    #[error("writing the trace: {0}")]
    Write(std::io::Error),
}

/// What the caller knows that the text does not say.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// `None`: detected from the first event line.
    pub from: Option<Format>,
    /// Possible CPUs of the recorded machine; `None`: the highest CPU seen, plus one.
    pub cpus: Option<u32>,
    /// `lazy_max_pages`; `None`: the free events' `nr_lazy_max`.
    pub lazy_max: Option<u64>,
    /// The start snapshot, from a `/proc/vmallocinfo` dump taken with real addresses.
    pub snapshot: Option<Vec<VmallocArea>>,
    /// When the dump was taken, in the input's clock (ns); `None`: estimated.
    pub snapshot_at: Option<u64>,
    /// The input's name, for the header.
    pub input: String,
    pub command_line: Vec<String>,
}

/// Event times as written: microsecond input keeps its order within a µs, 1 ns apart (never
/// past the µs).
#[derive(Default)]
struct Clock {
    last: u64,
}

/// How far back in time a line may come and still be taken, at the time of the line before
/// it. perf orders its per-CPU buffers in rounds and prints an event that missed its round
/// late ("out of order events"): 3 µs back in a `perf record -a -g` of lock events. A line
/// further back is more likely a file put together in the wrong order, which is an error.
const BACK_TOLERANCE_NS: u64 = 10_000_000;

impl Clock {
    fn stamp(&mut self, p: &parse::Prefix) -> u64 {
        let mut ts = p.ts_ns;
        if ts <= self.last && p.frac_digits <= 6 && self.last < ts + 999 {
            ts = self.last + 1;
        }
        // A line printed out of order is written at the time of the line before it.
        ts = ts.max(self.last);
        self.last = ts;
        ts
    }
}

/// What the first pass found.
#[derive(Clone, Debug, Default)]
struct Facts {
    format: Option<Format>,
    max_cpu: u32,
    nr_lazy_max: Option<u64>,
    ranges: HashMap<(u64, u64), u64>,
    first_ts: Option<u64>,
    last_ts: u64,
    events: EventCounts,
    other_events: u64,
    /// `drain_vmap_area_work` items that started.
    drain_items: u64,
    /// Timestamps printed with 6 fractional digits (µs).
    micro: bool,
    /// `lock:contention_begin` and `_end` lines, and the begins among them.
    lock_edges: u64,
    /// `workqueue_execute_start` and `_end` lines of drain items.
    drain_edges: u64,
    lock_begins: u64,
    /// Lines printed up to [`BACK_TOLERANCE_NS`] before the latest time seen, and the most.
    out_of_order: u64,
    most_back_ns: u64,
}

/// What was imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportSummary {
    pub format: Format,
    pub lines: u64,
    pub events: EventCounts,
    /// Event lines of other tracepoints (locks, other work items, …), skipped.
    pub other_events: u64,
    /// Event lines identical to the event line before them (a sample printed twice), dropped.
    pub repeated_lines: u64,
    /// `drain_vmap_area_work` items written as `work` records (with their `work_start`).
    pub drain_items: u64,
    /// Waits on vmap paths written as `contention` records.
    pub lock_waits: u64,
    pub cpus: u32,
    /// Header facts and records that were inferred or are missing.
    pub inferred: Vec<String>,
}

/// An event line the import keeps.
#[derive(Clone, Copy, Debug)]
enum Line<'a> {
    /// One of the three vmalloc tracepoints, by name.
    Vmalloc(&'a str),
    /// An edge of a `drain_vmap_area_work` item (other work items count as other events).
    Drain { edge: WorkEdge, work: u64 },
    /// An edge of a lock wait, with the kernel stack printed under it (empty without one).
    Lock {
        edge: LockEdge,
        frames: &'a [String],
    },
}

/// One pass over the lines: calls `each` with every kept event line's 1-based number, its
/// columns and what it is (`each` reads the fields, with the time it chooses).
fn scan<R: BufRead>(
    input: R,
    from: Option<Format>,
    mut each: impl FnMut(u64, &parse::Prefix, Line<'_>) -> Result<(), ImportError>,
) -> Result<Scanned, ImportError> {
    let mut format = from;
    let mut n = 0u64;
    let mut other = 0u64;
    let mut repeated = 0u64;
    let mut previous = String::new();
    // A lock wait's begin waits here for the stack printed under it, until the next event line.
    let mut held: Option<(u64, parse::Prefix, LockEdge)> = None;
    let mut frames: Vec<String> = Vec::new();
    for line in input.lines() {
        n += 1;
        let line = line?;
        let Some(p) = parse::prefix(&line) else {
            if held.is_some() {
                frames.extend(parse::frame(&line));
            }
            continue;
        };
        release(&mut held, &mut frames, &mut each)?;
        let p = p.map_err(|msg| ImportError::Line { line: n, msg })?;
        let kept = if let Some(name) = parse::vmalloc_event(&p.event) {
            Line::Vmalloc(name)
        } else if let Some(edge) = parse::workqueue_event(&p.event) {
            let (work, function) =
                parse::work_fields(&p.rest).map_err(|msg| ImportError::Line { line: n, msg })?;
            if function != DRAIN_FUNCTION {
                other += 1;
                continue;
            }
            Line::Drain { edge, work }
        } else if let Some(begin) = parse::lock_event(&p.event) {
            let edge = parse::lock_fields(begin, &p.rest)
                .map_err(|msg| ImportError::Line { line: n, msg })?;
            Line::Lock { edge, frames: &[] }
        } else {
            other += 1;
            continue;
        };
        // `perf script` sometimes prints one sample twice, the second line identical to the
        // first to the nanosecond (on a 2-thread random-size recording beside vmtrace's own,
        // one allocation in about 140,000, and the native recording had it once). No two
        // events are: an area is freed between two allocations of it, a purge takes
        // microseconds, and a work item runs between its start and its end. So a kept line
        // equal to the kept line before it is dropped and counted.
        if line == previous {
            repeated += 1;
            continue;
        }
        previous.clone_from(&line);
        let seen = detect(&p);
        match format {
            None => format = Some(seen),
            // perf and the other two print the task differently; trace-cmd and ftrace only
            // differ in columns the parser reads either way.
            Some(Format::PerfScript) if seen != Format::PerfScript => {
                return Err(ImportError::Line {
                    line: n,
                    msg: format!(
                        "a {} line in {} input",
                        seen.name(),
                        Format::PerfScript.name()
                    ),
                })
            }
            Some(f) if f != Format::PerfScript && seen == Format::PerfScript => {
                return Err(ImportError::Line {
                    line: n,
                    msg: format!("a perf-script line in {} input", f.name()),
                })
            }
            _ => {}
        }
        if let Line::Lock {
            edge: edge @ LockEdge::Begin { .. },
            ..
        } = kept
        {
            held = Some((n, p, edge));
            continue;
        }
        each(n, &p, kept)?;
    }
    release(&mut held, &mut frames, &mut each)?;
    Ok(Scanned {
        lines: n,
        format,
        other,
        repeated,
    })
}

/// Hands a held lock-wait begin to `each` with the frames printed under it.
fn release(
    held: &mut Option<(u64, parse::Prefix, LockEdge)>,
    frames: &mut Vec<String>,
    each: &mut impl FnMut(u64, &parse::Prefix, Line<'_>) -> Result<(), ImportError>,
) -> Result<(), ImportError> {
    if let Some((at, p, edge)) = held.take() {
        each(at, &p, Line::Lock { edge, frames })?;
        frames.clear();
    }
    Ok(())
}

/// What [`scan`] counted over the whole input.
struct Scanned {
    lines: u64,
    format: Option<Format>,
    /// Event lines of other tracepoints.
    other: u64,
    /// Event lines identical to the event line before them, dropped.
    repeated: u64,
}

/// `COMM PID` is perf's, `COMM-PID` trace-cmd's or ftrace's. The tracefs `trace` file always
/// prints the latency flags column between CPU and time, `trace-cmd report` only with `-l`
/// (such input is called ftrace; `--from trace-cmd` names it). The two print the same columns
/// the parser reads, so the name only labels the header.
fn detect(p: &parse::Prefix) -> Format {
    match (p.dashed, p.flags) {
        (false, _) => Format::PerfScript,
        (true, true) => Format::Ftrace,
        (true, false) => Format::TraceCmd,
    }
}

/// Imports `open()`'s text into `out`. `open` is called twice (see the module doc).
pub fn import<R: BufRead, W: std::io::Write>(
    mut open: impl FnMut() -> std::io::Result<R>,
    opts: &ImportOptions,
    out: W,
) -> Result<ImportSummary, ImportError> {
    let mut facts = Facts::default();
    let mut cut = opts.snapshot.as_deref().map(dump_time::DumpCut::new);
    // The written time of each event, to place the dump among them.
    let mut stamps = Vec::new();
    let mut clock = Clock::default();
    let scanned = scan(open()?, opts.from, |line, p, kept| {
        facts.first_ts.get_or_insert(p.ts_ns);
        if p.ts_ns < facts.last_ts {
            let back = facts.last_ts - p.ts_ns;
            if back > BACK_TOLERANCE_NS {
                return Err(ImportError::Line {
                    line,
                    msg: format!(
                        "time goes backwards ({} ns after {} ns): sort the input by time",
                        p.ts_ns, facts.last_ts
                    ),
                });
            }
            facts.out_of_order += 1;
            facts.most_back_ns = facts.most_back_ns.max(back);
        }
        facts.last_ts = facts.last_ts.max(p.ts_ns);
        facts.micro |= p.frac_digits <= 6;
        let name = match kept {
            Line::Vmalloc(name) => name,
            Line::Lock { edge, .. } => {
                if cut.is_some() {
                    clock.stamp(p);
                }
                facts.lock_edges += 1;
                facts.max_cpu = facts.max_cpu.max(p.cpu);
                if matches!(edge, LockEdge::Begin { .. }) {
                    facts.lock_begins += 1;
                }
                return Ok(());
            }
            Line::Drain { edge, .. } => {
                // Stamped as the second pass will, so the dump's cut lands at the same time.
                if cut.is_some() {
                    clock.stamp(p);
                }
                facts.drain_items += u64::from(edge == WorkEdge::Start);
                facts.drain_edges += 1;
                return Ok(());
            }
        };
        let rec = parse::record(name, &p.rest, parse::ctx(p, p.ts_ns))
            .map_err(|msg| ImportError::Line { line, msg })?;
        if let Some(c) = cut.as_mut() {
            stamps.push(clock.stamp(p));
            match &rec {
                Record::Alloc(a) if a.failed == 0 => c.event(a.addr.0, true),
                Record::Free(f) => c.event(f.va_start.0, false),
                // Failed attempts and purges name no area.
                _ => c.other(),
            }
        }
        facts.max_cpu = facts.max_cpu.max(p.cpu);
        match &rec {
            Record::Alloc(a) => {
                facts.events.alloc += 1;
                if a.failed == 0 {
                    *facts.ranges.entry((a.vstart.0, a.vend.0)).or_default() += 1;
                }
            }
            Record::Free(f) => {
                facts.events.free += 1;
                facts.nr_lazy_max.get_or_insert(f.nr_lazy_max);
            }
            _ => facts.events.purge += 1,
        }
        Ok(())
    })?;
    let Scanned {
        lines,
        format,
        other,
        repeated,
    } = scanned;
    facts.format = format;
    facts.other_events = other;
    // Lock waits and drain items alone replay nothing: the text must hold vmalloc events.
    let (Some(format), Some(first_ts), true) =
        (facts.format, facts.first_ts, facts.events.total() > 0)
    else {
        return Err(ImportError::Empty {
            lines,
            other: other + facts.lock_edges + facts.drain_edges,
        });
    };

    let mut inferred = Vec::new();
    let cpus = match opts.cpus {
        Some(c) => c,
        None => {
            inferred.push(format!(
                "possible CPUs: {} from the highest CPU seen (pass --cpus: the node count and zone size follow from it)",
                facts.max_cpu + 1
            ));
            facts.max_cpu + 1
        }
    };
    let layout = NodeLayout::from_cpus(cpus, PAGE);
    let lazy_max = match (opts.lazy_max, facts.nr_lazy_max) {
        (Some(l), _) => Some(l),
        (None, Some(l)) => {
            inferred.push(format!("lazy_max_pages: {l}, the free events' nr_lazy_max"));
            Some(l)
        }
        (None, None) => {
            inferred.push(format!(
                "lazy_max_pages: no free event; {} computed from the CPU count",
                lazy_max_pages(cpus, PAGE)
            ));
            None
        }
    };
    // The VMALLOC range: the vstart/vend most allocations asked for (`__get_vm_area_node`
    // passes VMALLOC_START/END for everything but modules and a few arch ranges).
    let range = facts
        .ranges
        .iter()
        .max_by_key(|(r, n)| (**n, std::cmp::Reverse(r.0)))
        .map(|(r, _)| *r);
    match range {
        Some((s, e)) => inferred.push(format!(
            "VMALLOC range {s:#x}-{e:#x}: the vstart/vend most allocations passed"
        )),
        None => inferred.push("VMALLOC range: no successful allocation".into()),
    }
    inferred.push(format!(
        "page size {PAGE}: not in the text (x86_64 assumed)"
    ));
    if facts.micro {
        inferred.push(
            "timestamps printed in µs: events within one µs are 1 ns apart, in input order".into(),
        );
    }
    inferred.push(format!(
        "clock: {}'s trace clock, not CLOCK_BOOTTIME",
        format.name()
    ));
    inferred.push("lost events unknown: the text does not say how many the tool dropped".into());
    if facts.out_of_order > 0 {
        inferred.push(format!(
            "{} event line(s) printed out of time order, up to {} ns back: each written at the time of the line before it",
            facts.out_of_order, facts.most_back_ns
        ));
    }
    if repeated > 0 {
        inferred.push(format!(
            "{repeated} event line(s) identical to the line before them dropped as printed twice"
        ));
    }
    if facts.drain_items > 0 {
        inferred.push(format!(
            "drain work: {} drain_vmap_area_work items from workqueue_execute_start/end (work and work_start records; the function's address is not in the text, written as 0)",
            facts.drain_items
        ));
    }
    if facts.lock_begins > 0 {
        inferred.push(format!(
            "lock waits: {} contention_begin lines; those whose printed kernel stack passes through a vmap lock's user are contention records, classified from that stack and the lock's address as the lock_waits probe does (none without stacks: record with -g, or the stacktrace option)",
            facts.lock_begins
        ));
    }
    let mut snapshot_at = first_ts.saturating_sub(2);
    let snapshot_areas = match &opts.snapshot {
        Some(a) => {
            let n = stamps.len();
            // A given time places the dump before the first event at or after it.
            let given = opts.snapshot_at.map(|t| stamps.partition_point(|&s| s < t));
            let c = cut.take().map(|c| c.cut(given)).unwrap_or(dump_time::Cut {
                index: 0,
                disagreements: 0,
                at_start: 0,
            });
            if c.index > 0 {
                snapshot_at = stamps.get(c.index).copied().unwrap_or(facts.last_ts + 1);
            }
            let how = if given.is_some() {
                "at the time given"
            } else {
                "the cut where the fewest addresses' states disagree with the dump"
            };
            inferred.push(format!(
                "start snapshot: {} areas from the given /proc/vmallocinfo dump, placed before event {} of {n}, {how} ({} disagreements, against {} before the first event); replay skips the events before it",
                a.len(),
                c.index,
                c.disagreements,
                c.at_start
            ));
            a.clone()
        }
        None => {
            inferred.push(
                "start snapshot: none given (--vmallocinfo); the trace starts from an empty VMALLOC space".into(),
            );
            Vec::new()
        }
    };

    let cpu_list = if cpus > 1 {
        format!("0-{}", cpus - 1)
    } else {
        "0".into()
    };
    let start = first_ts.saturating_sub(2);
    let header = Header {
        format: FORMAT.into(),
        version: VERSION,
        tool: Tool {
            name: "vmtrace".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        command_line: opts.command_line.clone(),
        system: SystemFacts {
            kernel_release: "unknown (imported)".into(),
            kernel_version: format!("unknown (imported from {})", format.name()),
            machine: "x86_64".into(),
            hostname: "unknown (imported)".into(),
            page_size: PAGE,
            possible_cpus: cpus,
            possible_cpu_list: cpu_list.clone(),
            online_cpus: cpus,
            online_cpu_list: cpu_list,
            btf: false,
        },
        vmap: VmapFacts {
            nr_vmap_nodes: layout.nr_nodes(),
            zone_size: layout.zone_size(),
            lazy_max_pages_computed: lazy_max_pages(cpus, PAGE),
            lazy_max_pages_tracepoint: lazy_max,
            vmalloc_start: range.map(|r| KAddr(r.0)),
            vmalloc_end: range.map(|r| KAddr(r.1)),
            source: format!(
                "vmtrace import from {}: nodes and zone size from {cpus} CPUs by the kernel's rules; see imported.inferred",
                format.name()
            ),
        },
        probes: Vec::new(),
        clock: format!("{} trace clock", format.name()),
        start_boottime_ns: start,
        start_realtime_ns: 0,
        ring_buffer_bytes: 0,
        synthetic: None,
        imported: Some(Imported {
            from: format.name().into(),
            input: opts.input.clone(),
            inferred: inferred.clone(),
        }),
    };

    let mut w = crate::trace::TraceWriter::new(out);
    let put =
        |w: &mut crate::trace::TraceWriter<W>, r: Record| w.write(&r).map_err(ImportError::Write);
    put(&mut w, Record::Header(Box::new(header)))?;
    put(
        &mut w,
        Record::Vmallocinfo(Box::new(VmallocSnapshot {
            ts_start_ns: snapshot_at,
            ts_end_ns: snapshot_at,
            real_addresses: true,
            pools_drained: false,
            areas: snapshot_areas,
        })),
    )?;
    let mut clock = Clock::default();
    // Drain items started and not yet ended, by (CPU, work item): a work item runs on one
    // worker from start to end.
    let mut running: HashMap<(u32, u64), u64> = HashMap::new();
    let mut written_items = 0u64;
    let mut locks = LockWaits::new(layout.nr_nodes());
    scan(open()?, Some(format), |line, p, kept| {
        let ts = clock.stamp(p);
        let ctx = parse::ctx(p, ts);
        let r = match kept {
            Line::Lock { edge, frames } => match locks.edge(p, ts, edge, frames) {
                Some(c) => Record::Contention(Box::new(c)),
                None => return Ok(()),
            },
            Line::Vmalloc(name) => {
                parse::record(name, &p.rest, ctx).map_err(|msg| ImportError::Line { line, msg })?
            }
            Line::Drain {
                edge: WorkEdge::Start,
                work,
            } => {
                running.insert((p.cpu, work), ts);
                Record::WorkStart(WorkStart {
                    ctx,
                    function: DRAIN_FUNCTION.into(),
                    function_addr: KAddr(0),
                    work: KAddr(work),
                })
            }
            Line::Drain {
                edge: WorkEdge::End,
                work,
            } => {
                // An end whose start came before the text began tells no run time.
                let Some(start) = running.remove(&(p.cpu, work)) else {
                    return Ok(());
                };
                written_items += 1;
                Record::Work(Box::new(Work {
                    ctx,
                    function: DRAIN_FUNCTION.into(),
                    function_addr: KAddr(0),
                    work: KAddr(work),
                    start_ns: start,
                    duration_ns: ts - start,
                    start_cpu: p.cpu,
                    nr_purged: None,
                    flush_ns: None,
                }))
            }
        };
        put(&mut w, r)
    })?;
    put(
        &mut w,
        Record::Footer(Box::new(Footer {
            end_boottime_ns: clock.last + 1,
            reason: StopReason::CommandExited,
            command_exit_code: None,
            events: facts.events,
            lost_per_cpu: vec![0; cpus as usize],
            lost_by_kind: EventCounts::default(),
            lost_total: 0,
            late_events: 0,
            kernel_run_stats: None,
            ladder: None,
        })),
    )?;
    w.flush().map_err(ImportError::Write)?;
    Ok(ImportSummary {
        format,
        lines,
        events: facts.events,
        other_events: other,
        repeated_lines: repeated,
        drain_items: written_items,
        lock_waits: locks.written,
        cpus,
        inferred,
    })
}

/// Waits on the vmap locks from `lock:contention_begin/end` pairs, kept and classified the way
/// the `lock_waits` probe keeps them: a wait counts when the stack printed under its begin
/// passes through a function of mm/vmalloc.c that takes a vmap lock
/// ([`LOCK_FUNCTIONS`](crate::probe::loader::LOCK_FUNCTIONS)), and the same classifier names
/// its lock from that stack and the lock's address. Text without stacks (perf without `-g`,
/// ftrace without the `stacktrace` option) cannot show which waits those are, so none is kept.
struct LockWaits {
    classifier: crate::probe::contention::Classifier,
    /// Begun and not yet ended, by CPU for a spinlock (its waiter spins where it began) and by
    /// task for a sleeping lock: the begin's time, flags, lock and stack.
    spinning: HashMap<u32, Begun>,
    sleeping: HashMap<u32, Begun>,
    written: u64,
}

struct Begun {
    ts: u64,
    lock: u64,
    flags: u32,
    stack: Vec<String>,
}

/// `LCB_F_SPIN` and `LCB_F_MUTEX`: a wait with SPIN alone spins on its CPU.
const LCB_F_SPIN: u32 = 1;
const LCB_F_MUTEX: u32 = 1 << 5;

impl LockWaits {
    fn new(nr_nodes: u32) -> Self {
        Self {
            classifier: crate::probe::contention::Classifier::new(nr_nodes),
            spinning: HashMap::new(),
            sleeping: HashMap::new(),
            written: 0,
        }
    }

    /// Takes one edge; a completed wait on a vmap path comes back as its record (the caller
    /// sets the context: the end's task, CPU and time).
    fn edge(
        &mut self,
        p: &parse::Prefix,
        ts: u64,
        edge: LockEdge,
        frames: &[String],
    ) -> Option<Contention> {
        match edge {
            LockEdge::Begin { lock, flags } => {
                if !on_vmap_path(frames) {
                    return None;
                }
                let begun = Begun {
                    ts,
                    lock,
                    flags,
                    stack: frames.to_vec(),
                };
                if flags & (LCB_F_SPIN | LCB_F_MUTEX) == LCB_F_SPIN {
                    self.spinning.insert(p.cpu, begun);
                } else {
                    // A mutex reports a spinning phase and then a sleeping one: keep the first.
                    self.sleeping.entry(p.pid).or_insert(begun);
                }
                None
            }
            LockEdge::End { lock, ret } => {
                let b = match self.spinning.get(&p.cpu) {
                    Some(b) if b.lock == lock => self.spinning.remove(&p.cpu),
                    _ => match self.sleeping.get(&p.pid) {
                        Some(b) if b.lock == lock => self.sleeping.remove(&p.pid),
                        _ => None,
                    },
                }?;
                let c = self.classifier.classify(&b.stack, b.lock, b.flags);
                self.written += 1;
                Some(Contention {
                    ctx: parse::ctx(p, ts),
                    lock: KAddr(b.lock),
                    flags: b.flags,
                    wait_ns: ts.saturating_sub(b.ts),
                    ret,
                    class: c.class,
                    node: c.node,
                    stack_id: 0,
                    stack: b.stack,
                    probe_ns: None,
                })
            }
        }
    }
}

/// Whether a stack (innermost first) is one the `lock_waits` probe keeps: through a vmap
/// lock's user, not through the ring buffer's own functions.
fn on_vmap_path(frames: &[String]) -> bool {
    use crate::probe::loader::{LOCK_FUNCTIONS, SELF_FUNCTIONS};
    let function =
        |f: &String| crate::host::kallsyms::base_name(f.split('+').next().unwrap_or(f)).to_string();
    frames
        .iter()
        .any(|f| LOCK_FUNCTIONS.contains(&function(f).as_str()))
        && !frames
            .iter()
            .any(|f| SELF_FUNCTIONS.contains(&function(f).as_str()))
}

#[cfg(test)]
mod tests;
