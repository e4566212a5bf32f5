//! `vmtrace summary`: what a trace holds, at a glance, in text or JSON.
//!
//! Besides counts it cross-checks the trace against itself: every free should name an area that a
//! recorded allocation or the start snapshot produced, and every address should lie in the
//! header's VMALLOC range (or another range an allocation asked for, such as modules).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;

use crate::trace::{
    AreaKind, ClassHolds, EventCounts, Footer, Header, LadderStats, LockClass, ReadError, Record,
    TraceReader,
};

#[derive(Debug, Args)]
pub struct SummaryArgs {
    /// Trace file to summarise (`-` for stdin).
    pub trace: PathBuf,

    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub kernel: String,
    pub cpus_online: u32,
    pub nr_vmap_nodes: u32,
    pub lazy_max_pages: Option<u64>,
    pub vmalloc_start: Option<String>,
    pub vmalloc_end: Option<String>,
    pub snapshot_areas: BTreeMap<String, u64>,
    pub snapshot_real_addresses: bool,
    pub events: EventCounts,
    pub duration_s: f64,
    pub events_per_s: f64,
    pub failed_allocs: u64,
    /// (size in bytes, count), most frequent first, top 10.
    pub top_alloc_sizes: Vec<(u64, u64)>,
    /// (comm, allocations), top 10.
    pub top_comms: Vec<(String, u64)>,
    pub max_nr_lazy: u64,
    /// Frees that pushed the backlog over the threshold (each scheduled a drain).
    pub drain_triggers: u64,
    pub purged_areas: u64,
    pub max_npurged: u32,
    /// Frees whose address matches no earlier allocation nor a snapshot area.
    pub unmatched_frees: u64,
    /// Successful allocations outside `[vmalloc_start, vmalloc_end]`.
    pub allocs_outside_vmalloc: u64,
    pub lost_total: Option<u64>,
    pub lost_per_cpu: Option<Vec<u64>>,
    pub stop_reason: Option<String>,
    /// Set when the trace has no footer: the line at which it ends.
    pub cut_short_at_line: Option<usize>,
    /// Lock waits (`lock_waits`) and timed holds (`lock_holds`) per class, from the footer;
    /// classes with neither are left out.
    pub locks: Vec<LockSummary>,
}

#[derive(Debug, Default, Serialize)]
pub struct LockSummary {
    pub class: String,
    pub waits: u64,
    pub wait_ns: u64,
    /// Holds timed; `None` without the `lock_holds` probe.
    pub holds: Option<u64>,
    pub hold_mean_ns: Option<f64>,
    /// The histogram bucket bound under which 99 % of the holds fell.
    pub hold_p99_below_ns: Option<u64>,
}

/// Reads a whole trace and summarises it. A missing footer (trace cut by SIGKILL) is not an
/// error; a malformed line in the middle is, with its line number.
pub fn summarize(input: impl BufRead) -> Result<Summary, ReadError> {
    let mut reader = TraceReader::new(input);
    let header: Header = reader.read_header()?;
    let mut s = Summary {
        kernel: header.system.kernel_release.clone(),
        cpus_online: header.system.online_cpus,
        nr_vmap_nodes: header.vmap.nr_vmap_nodes,
        lazy_max_pages: header.vmap.lazy_max_pages_tracepoint,
        vmalloc_start: header.vmap.vmalloc_start.map(|a| a.to_string()),
        vmalloc_end: header.vmap.vmalloc_end.map(|a| a.to_string()),
        ..Summary::default()
    };
    let range = match (header.vmap.vmalloc_start, header.vmap.vmalloc_end) {
        (Some(a), Some(b)) => Some((a.0, b.0)),
        _ => None,
    };
    let mut known: HashSet<u64> = HashSet::new();
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    let mut comms: HashMap<String, u64> = HashMap::new();
    let mut first_ts = None;
    let mut last_ts = 0;
    let mut footer: Option<Footer> = None;
    for rec in reader.by_ref() {
        let rec = match rec {
            Ok(r) => r,
            Err(ReadError::Truncated { line }) => {
                s.cut_short_at_line = Some(line);
                break;
            }
            Err(e) => return Err(e),
        };
        if let Some(ts) = rec.ts_ns() {
            first_ts.get_or_insert(ts);
            last_ts = ts;
        }
        match rec {
            Record::Header(_) => {}
            Record::Vmallocinfo(snap) => {
                s.snapshot_real_addresses = snap.real_addresses;
                for a in &snap.areas {
                    let k = match a.kind {
                        AreaKind::Busy => "busy",
                        AreaKind::Unpurged => "unpurged",
                        AreaKind::VmMapRam => "vm_map_ram",
                    };
                    *s.snapshot_areas.entry(k.into()).or_default() += 1;
                    known.insert(a.start.0);
                }
            }
            Record::Alloc(a) => {
                s.events.alloc += 1;
                if a.failed != 0 {
                    s.failed_allocs += 1;
                    continue;
                }
                known.insert(a.addr.0);
                *sizes.entry(a.size).or_default() += 1;
                *comms.entry(a.ctx.comm.into_string()).or_default() += 1;
                if let Some((lo, hi)) = range {
                    let inside_vmalloc =
                        a.addr.0 >= lo && a.addr.0.saturating_add(a.size) <= hi.saturating_add(1);
                    let same_range = a.vstart.0 == lo && a.vend.0 == hi;
                    if same_range && !inside_vmalloc {
                        s.allocs_outside_vmalloc += 1;
                    }
                }
            }
            Record::Free(f) => {
                s.events.free += 1;
                if !known.contains(&f.va_start.0) {
                    s.unmatched_frees += 1;
                }
                s.max_nr_lazy = s.max_nr_lazy.max(f.nr_lazy);
                if f.nr_lazy > f.nr_lazy_max {
                    s.drain_triggers += 1;
                }
                s.lazy_max_pages.get_or_insert(f.nr_lazy_max);
            }
            Record::Purge(p) => {
                s.events.purge += 1;
                s.purged_areas += u64::from(p.npurged);
                s.max_npurged = s.max_npurged.max(p.npurged);
            }
            Record::Footer(f) => footer = Some(*f),
            // Ladder records (lock waits, purge work, page tables) are not summarised here.
            _ => {}
        }
    }
    if let Some(first) = first_ts {
        s.duration_s = (last_ts.saturating_sub(first)) as f64 / 1e9;
    }
    if s.duration_s > 0.0 {
        s.events_per_s = s.events.total() as f64 / s.duration_s;
    }
    s.top_alloc_sizes = top(sizes, 10);
    s.top_comms = top(comms, 10);
    match footer {
        Some(f) => {
            s.lost_total = Some(f.lost_total);
            s.lost_per_cpu = Some(f.lost_per_cpu);
            s.stop_reason = serde_json::to_value(f.reason)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string));
            if let Some(l) = &f.ladder {
                s.locks = lock_summary(l);
            }
        }
        None if s.cut_short_at_line.is_none() => s.cut_short_at_line = Some(reader.line()),
        None => {}
    }
    Ok(s)
}

fn lock_summary(l: &LadderStats) -> Vec<LockSummary> {
    LockClass::ALL
        .iter()
        .filter_map(|&class| {
            let w = l.contention_by_class.iter().find(|c| c.class == class);
            let h = l.lock_holds.iter().find(|h| h.class == class);
            let (waits, wait_ns) = w.map_or((0, 0), |w| (w.count, w.wait_ns));
            (waits > 0 || h.is_some()).then(|| LockSummary {
                class: class.name().to_string(),
                waits,
                wait_ns,
                holds: h.map(|h| h.count),
                hold_mean_ns: h.map(ClassHolds::mean_ns),
                hold_p99_below_ns: h.map(|h| h.quantile_bound_ns(0.99)),
            })
        })
        .collect()
}

fn top<K: Ord + Clone>(m: HashMap<K, u64>, n: usize) -> Vec<(K, u64)> {
    let mut v: Vec<_> = m.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(n);
    v
}

pub fn run(args: &SummaryArgs) -> anyhow::Result<ExitCode> {
    let input = crate::trace::compress::open(&args.trace)
        .with_context(|| format!("opening {}", args.trace.display()))?;
    let s = summarize(input).with_context(|| format!("reading {}", args.trace.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", render(&s));
    }
    Ok(ExitCode::SUCCESS)
}

/// Plain-text rendering, kept separate so tests can check it without a terminal.
pub fn render(s: &Summary) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
    let _ = writeln!(
        o,
        "kernel {}  cpus {}  vmap nodes {}",
        s.kernel, s.cpus_online, s.nr_vmap_nodes
    );
    let _ = writeln!(
        o,
        "VMALLOC {}..{}  lazy_max_pages {}",
        opt(&s.vmalloc_start),
        opt(&s.vmalloc_end),
        s.lazy_max_pages.map_or("unknown".into(), |v| v.to_string())
    );
    let snap: Vec<String> = s
        .snapshot_areas
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    let _ = writeln!(
        o,
        "start snapshot: {}{}",
        if snap.is_empty() {
            "none".into()
        } else {
            snap.join(", ")
        },
        if s.snapshot_real_addresses {
            ""
        } else {
            " (addresses hashed)"
        }
    );
    let _ = writeln!(
        o,
        "events: {} alloc ({} failed), {} free, {} purge over {:.3} s ({:.0}/s)",
        s.events.alloc,
        s.failed_allocs,
        s.events.free,
        s.events.purge,
        s.duration_s,
        s.events_per_s
    );
    let _ = writeln!(
        o,
        "lazy backlog: max {} pages, {} drain triggers; purges freed {} areas (max {} in one)",
        s.max_nr_lazy, s.drain_triggers, s.purged_areas, s.max_npurged
    );
    let _ = writeln!(o, "top allocation sizes:");
    for (size, n) in &s.top_alloc_sizes {
        let _ = writeln!(o, "  {size:>10} B  {n:>8}");
    }
    let _ = writeln!(o, "top allocating tasks:");
    for (comm, n) in &s.top_comms {
        let _ = writeln!(o, "  {comm:<16} {n:>8}");
    }
    if !s.locks.is_empty() {
        let _ = writeln!(o, "lock waits (lock_waits) and holds (lock_holds):");
        for l in &s.locks {
            let holds = match (l.holds, l.hold_mean_ns, l.hold_p99_below_ns) {
                (Some(n), Some(mean), Some(p99)) => {
                    format!("  holds {n:>9}, mean {mean:>7.0} ns, 99 % under {p99} ns")
                }
                _ => String::new(),
            };
            let _ = writeln!(
                o,
                "  {:<16} waits {:>7} {:>10.3} ms{holds}",
                l.class,
                l.waits,
                l.wait_ns as f64 / 1e6
            );
        }
    }
    let _ = writeln!(
        o,
        "checks: {} frees without a known allocation, {} allocations outside VMALLOC",
        s.unmatched_frees, s.allocs_outside_vmalloc
    );
    match (&s.lost_total, &s.cut_short_at_line) {
        (Some(l), _) => {
            let _ = writeln!(
                o,
                "lost events: {l}{}  stopped by: {}",
                s.lost_per_cpu
                    .as_ref()
                    .map_or(String::new(), |v| format!(" (per CPU {v:?})")),
                opt(&s.stop_reason)
            );
        }
        (None, Some(line)) => {
            let _ = writeln!(
                o,
                "no footer: the trace was cut short at line {line}; lost events unknown"
            );
        }
        (None, None) => {}
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{ClassTotal, LadderStats};

    #[test]
    fn lock_classes_show_waits_and_timed_holds() {
        let ladder = LadderStats {
            contention_by_class: LockClass::ALL
                .iter()
                .map(|&class| ClassTotal {
                    class,
                    count: u64::from(class == LockClass::NodeBusyLock) * 3,
                    wait_ns: u64::from(class == LockClass::NodeBusyLock) * 1_500_000,
                })
                .collect(),
            // 99 holds in [512, 1024) ns and one in [2^20, 2^21).
            lock_holds: vec![ClassHolds {
                class: LockClass::NodeLazyLock,
                count: 100,
                hold_ns: 99 * 700 + 1_500_000,
                histogram: (0..32)
                    .map(|k| match k {
                        10 => 99,
                        21 => 1,
                        _ => 0,
                    })
                    .collect(),
            }],
            ..LadderStats::default()
        };
        let locks = lock_summary(&ladder);
        assert_eq!(locks.len(), 2, "{locks:?}");
        assert_eq!(
            (locks[0].class.as_str(), locks[0].waits),
            ("node_busy_lock", 3)
        );
        assert_eq!(locks[0].holds, None);
        let lazy = &locks[1];
        assert_eq!(lazy.holds, Some(100));
        assert_eq!(lazy.hold_mean_ns, Some(15_693.0));
        assert_eq!(lazy.hold_p99_below_ns, Some(1024));
        let text = render(&Summary {
            locks,
            ..Summary::default()
        });
        assert!(
            text.contains("node_busy_lock   waits       3      1.500 ms\n"),
            "{text}"
        );
        assert!(
            text.contains("holds       100, mean   15693 ns, 99 % under 1024 ns"),
            "{text}"
        );
    }
}
