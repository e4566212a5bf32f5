//! One recording read once into what `vmtrace compare` sets beside another: the header facts,
//! every timed sample of each figure (so that it can be cut into time windows afterwards), and
//! the figures a run gives only once (VA high-water, page-table slots, backing-page orders).

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::model::pagetable::PageTableSlots;
use crate::replay::lookahead::DRAIN_FUNCTION;
use crate::trace::{Footer, Header, LockClass, PtLevel, ReadError, Record, TraceReader};

/// A figure sampled over time: `(timestamp, value)` in trace order.
pub type Samples = Vec<(u64, u64)>;

/// Header facts that make two recordings comparable or not; listed first when they differ.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Facts {
    pub kernel: String,
    pub machine: String,
    pub online_cpus: u32,
    pub possible_cpus: u32,
    pub vmap_nodes: u32,
    pub lazy_max_pages: Option<u64>,
    pub page_size: u64,
    /// Probes that attached, with their rung (`lock_waits=tracepoint`).
    pub probes: Vec<String>,
    /// `record`'s command line (the workload it ran, when it ran one).
    pub command: String,
    /// `recorded`, `imported from perf-script` or `synthetic`.
    pub origin: String,
}

/// What one recording holds, ready to compare.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub facts: Facts,
    pub first_ts: u64,
    pub last_ts: u64,
    /// Successful allocations: size in pages.
    pub allocs: Samples,
    pub failed_allocs: Samples,
    /// Lazy frees: the backlog (`nr_lazy`, pages) each one left.
    pub frees: Samples,
    /// Purges: `npurged`.
    pub purges: Samples,
    /// `alloc_vmap_area` latency, ns (fentry/kprobe rungs).
    pub latency: Samples,
    /// Contended waits per lock class, ns.
    pub waits: BTreeMap<LockClass, Samples>,
    /// From the free that first crossed the threshold to the drain item's start, ns, stamped
    /// at the start.
    pub drain_latency: Samples,
    /// Run time of each `drain_vmap_area_work` item, ns, stamped at its start.
    pub drain_run: Samples,
    /// Page-table pages allocated for vmalloc space, per level (`page_tables` probe).
    pub pt_pages: BTreeMap<&'static str, Samples>,
    /// Highest end of an allocation in the VMALLOC range, bytes above its start.
    pub high_water_bytes: Option<u64>,
    /// 2 MiB slots (PTE tables) the recording's allocations touched that the start snapshot's
    /// areas did not.
    pub pte_slots_added: u64,
    pub backing_page_orders: Option<Vec<u64>>,
    /// Allocations per task name.
    pub comms: HashMap<String, u64>,
    pub lost_events: Option<u64>,
    /// The line where a trace without a footer ends.
    pub cut_short_at_line: Option<usize>,
}

impl Profile {
    /// The span the windows cut: first to last event.
    pub fn span_ns(&self) -> u64 {
        self.last_ts.saturating_sub(self.first_ts)
    }
}

fn facts(h: &Header) -> Facts {
    let origin = if let Some(i) = &h.imported {
        format!("imported from {}", i.from)
    } else if h.synthetic.is_some() {
        "synthetic".into()
    } else {
        "recorded".into()
    };
    Facts {
        kernel: h.system.kernel_release.clone(),
        machine: h.system.machine.clone(),
        online_cpus: h.system.online_cpus,
        possible_cpus: h.system.possible_cpus,
        vmap_nodes: h.vmap.nr_vmap_nodes,
        lazy_max_pages: h.vmap.lazy_max_pages_tracepoint,
        page_size: h.system.page_size,
        probes: h
            .probes
            .iter()
            .map(|p| format!("{}={}", p.probe, p.rung))
            .collect(),
        command: workload_command(&h.command_line),
        origin,
    }
}

/// `record`'s command line without its output file (two recordings of one workload are
/// written to different files) and with programs by their file names.
fn workload_command(argv: &[String]) -> String {
    let mut out = Vec::new();
    let mut skip = false;
    for (i, a) in argv.iter().enumerate() {
        if skip {
            skip = false;
            continue;
        }
        if a == "--" {
            out.extend(argv[i..].iter().map(|x| base(x)));
            break;
        }
        if a == "-o" || a == "--output" {
            skip = true;
            continue;
        }
        if a.starts_with("--output=")
            || (a.starts_with("-o") && a.len() > 2 && !a.starts_with("--"))
        {
            continue;
        }
        out.push(if i == 0 { base(a) } else { a.as_str() });
    }
    out.join(" ")
}

fn base(path: &str) -> &str {
    if path.contains(char::is_whitespace) {
        return path;
    }
    path.rsplit('/').next().unwrap_or(path)
}

fn level_name(l: PtLevel) -> &'static str {
    match l {
        PtLevel::Pte => "pte",
        PtLevel::Pmd => "pmd",
        PtLevel::Pud => "pud",
        PtLevel::P4d => "p4d",
    }
}

/// Reads a whole trace, counting records into `progress`. A trace cut short (no footer) is
/// read up to its last complete line; a malformed line elsewhere is an error that names it.
pub fn read(input: impl BufRead, progress: &AtomicU64) -> Result<Profile, ReadError> {
    let mut reader = TraceReader::new(input);
    let header = reader.read_header()?;
    let mut p = Profile {
        facts: facts(&header),
        ..Profile::default()
    };
    let page = header.system.page_size.max(1);
    let range = header.vmap.vmalloc_start.zip(header.vmap.vmalloc_end);
    let mut slots = PageTableSlots::new();
    let mut seeded_pte = 0;
    let mut first = None;
    // Frees above the threshold since the last drain item started: the first queued the next.
    let mut over: Option<u64> = None;
    let mut footer: Option<Footer> = None;
    for rec in reader.by_ref() {
        let rec = match rec {
            Ok(r) => r,
            Err(ReadError::Truncated { line }) => {
                p.cut_short_at_line = Some(line);
                break;
            }
            Err(e) => return Err(e),
        };
        progress.fetch_add(1, Ordering::Relaxed);
        if let Some(ts) = rec.ts_ns() {
            if matches!(rec, Record::Alloc(_) | Record::Free(_) | Record::Purge(_)) {
                first.get_or_insert(ts);
                p.last_ts = p.last_ts.max(ts);
            }
        }
        match rec {
            Record::Vmallocinfo(snap) => {
                for a in &snap.areas {
                    slots.map(a.start.0, a.start.0.saturating_add(a.size));
                }
                seeded_pte = slots.counts().pte_tables;
            }
            Record::Alloc(a) => {
                if a.failed != 0 {
                    p.failed_allocs.push((a.ctx.ts_ns, 1));
                    continue;
                }
                p.allocs.push((a.ctx.ts_ns, a.size.div_ceil(page)));
                *p.comms.entry(a.ctx.comm.to_string()).or_default() += 1;
                if let Some((start, end)) = range {
                    let top = a.addr.0.saturating_add(a.size);
                    if a.addr.0 >= start.0 && top <= end.0.saturating_add(1) {
                        let hw = p.high_water_bytes.get_or_insert(0);
                        *hw = (*hw).max(top - start.0);
                        slots.map(a.addr.0, top);
                    }
                }
            }
            Record::Free(f) => {
                p.frees.push((f.ctx.ts_ns, f.nr_lazy));
                if f.nr_lazy_max > 0 && f.nr_lazy > f.nr_lazy_max {
                    over.get_or_insert(f.ctx.ts_ns);
                }
            }
            Record::Purge(x) => p.purges.push((x.ctx.ts_ns, u64::from(x.npurged))),
            Record::Contention(c) if c.wait_ns > 0 && c.class != LockClass::Other => {
                p.waits
                    .entry(c.class)
                    .or_default()
                    .push((c.ctx.ts_ns, c.wait_ns));
            }
            Record::Work(w) if w.function == DRAIN_FUNCTION => {
                p.drain_run.push((w.start_ns, w.duration_ns));
                if let Some(t) = over.take().filter(|&t| t <= w.start_ns) {
                    p.drain_latency.push((w.start_ns, w.start_ns - t));
                }
            }
            Record::Latency(l) if l.function == "alloc_vmap_area" => {
                p.latency.push((l.ctx.ts_ns, l.latency_ns));
            }
            Record::PtPage(t) => {
                p.pt_pages
                    .entry(level_name(t.level))
                    .or_default()
                    .push((t.ctx.ts_ns, 1));
            }
            Record::Footer(f) => footer = Some(*f),
            _ => {}
        }
    }
    p.first_ts = first.unwrap_or(0);
    // The work record comes at the item's end: its start may precede events already read.
    p.drain_latency.sort_unstable();
    p.drain_run.sort_unstable();
    p.pte_slots_added = slots.counts().pte_tables.saturating_sub(seeded_pte);
    if let Some(f) = footer {
        p.lost_events = Some(f.lost_total);
        p.backing_page_orders = f.ladder.map(|l| l.backing_page_orders);
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_file_is_not_part_of_the_workload() {
        let argv = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(
            workload_command(&argv("/usr/bin/vmtrace record -q --drain-pools -o /tmp/a.jsonl -- /x/vmtrace stress fix-size -o 3")),
            "vmtrace record -q --drain-pools -- vmtrace stress fix-size -o 3"
        );
        assert_eq!(
            workload_command(&argv(
                "vmtrace record --output=b.jsonl -ob.zst --duration 3s"
            )),
            "vmtrace record --duration 3s"
        );
        // A shell script keeps its paths: only a lone program path is cut to its name.
        let script = [
            "vmtrace",
            "record",
            "--",
            "/bin/sh",
            "-c",
            "/x/vmtrace stress >/dev/null",
        ];
        let script: Vec<String> = script.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            workload_command(&script),
            "vmtrace record -- sh -c /x/vmtrace stress >/dev/null"
        );
    }
}
