//! Small traces and replayers for the rules' tests.

use crate::model::{AllocRequest, Model};
use crate::replay::lookahead::{DrainItem, DrainLookup};
use crate::replay::{open, ReplayOptions, Replayer};
use crate::synth::{generate, SynthParams};

/// A small synthetic trace on 2 CPUs: header with 2 nodes of 16-page zones.
pub(in crate::replay) fn trace() -> Vec<u8> {
    let p = SynthParams {
        mask: 3,
        threads: 2,
        cpus: 2,
        loops: 30,
        busy_list: 10,
        nr_pages: 2,
        ..SynthParams::default()
    };
    let mut out = Vec::new();
    generate(&p, vec!["test".into()], &mut out).expect("synth");
    out
}

/// The synth trace with the last free before its first purge of more than one area
/// moved to just after that purge, as a vCPU descheduled between the free's counter update
/// and its tracepoint sends it. With `counted`, the free reports the `nr_lazy` it had (the
/// purge's pages still in it); without, a backlog the purge had already subtracted from,
/// which no such race gives.
pub(in crate::replay) fn with_late_free(counted: bool) -> Vec<u8> {
    let text = String::from_utf8(trace()).expect("utf-8");
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let purge = lines
        .iter()
        .position(|v| v["type"] == "purge" && v["npurged"].as_u64() > Some(1))
        .expect("a purge of more than one area");
    let free = lines[..purge]
        .iter()
        .rposition(|v| v["type"] == "free")
        .expect("a free before it");
    let mut late = lines.remove(free);
    late["ts_ns"] = (lines[purge - 1]["ts_ns"].as_u64().expect("ts") + 1).into();
    if !counted {
        late["nr_lazy"] = 1.into();
    }
    lines.insert(purge, late);
    let mut out = String::new();
    for v in lines {
        out += &format!("{v}\n");
    }
    out.into_bytes()
}

/// A replayer on [`trace`]'s parameters, with nothing replayed yet.
pub(in crate::replay) fn replayer(opts: &ReplayOptions) -> Replayer<'_> {
    let params = open(&trace()[..], opts).expect("open").params;
    Replayer::new(Model::new(params).expect("model"), opts)
}

pub(in crate::replay) const PAGE: u64 = 4096;

/// A request of `pages` (guard included) on `cpu` in the exact VMALLOC window, as `vmalloc`
/// makes it: eligible for the pools.
pub(in crate::replay) fn request(r: &Replayer, pages: u64, cpu: u32) -> AllocRequest {
    let p = r.model.params();
    AllocRequest {
        size: pages * PAGE,
        align: 1,
        vstart: p.vmalloc_start,
        vend: p.vmalloc_end,
        cpu,
        retry: false,
        guard: true,
    }
}

/// `n` areas of `pages` allocated on CPU 0 (node 0) and freed, oldest first: lazy in node 0's
/// tree.
pub(in crate::replay) fn lazy_areas(r: &mut Replayer, n: usize, pages: u64) -> Vec<u64> {
    let req = request(r, pages, 0);
    let addrs: Vec<u64> = (0..n)
        .map(|_| r.model.alloc(&req).expect("request").expect("space").addr)
        .collect();
    for &a in &addrs {
        r.model.free(a).expect("busy");
    }
    addrs
}

/// [`lazy_areas`], then purged: in node 0's pool, the last one at its head.
pub(in crate::replay) fn pooled_areas(r: &mut Replayer, n: usize, pages: u64) -> Vec<u64> {
    let addrs = lazy_areas(r, n, pages);
    r.model.purge_oldest(false, usize::MAX);
    addrs
}

/// What a trace read ahead shows: at most one drain item, whose purge event comes at its end
/// from its task with `npurged` areas, and the frees before that event.
#[derive(Default)]
pub(in crate::replay) struct Ahead {
    pub item: Option<DrainItem>,
    pub npurged: Option<u32>,
    pub frees: Vec<(u64, u64)>,
}

/// A drain item of task 7 over `[start, end]`, holding a purge event of `npurged` areas.
pub(in crate::replay) fn one_drain(start: u64, end: u64, npurged: u32) -> Ahead {
    Ahead {
        item: Some(DrainItem {
            pid: 7,
            start_ns: start,
            end_ns: end,
            flush_ns: None,
        }),
        npurged: Some(npurged),
        frees: Vec::new(),
    }
}

impl DrainLookup for Ahead {
    fn drain_holding(&self, pid: u32, ts: u64) -> Option<DrainItem> {
        self.item.filter(|i| i.holds(pid, ts))
    }
    fn next_purge(&self) -> Option<(u32, u64)> {
        self.item.map(|i| (i.pid, i.end_ns))
    }
    fn next_npurged(&self) -> Option<u32> {
        self.npurged
    }
    fn frees_ahead(&self, max: usize) -> Vec<(u64, u64)> {
        self.frees.iter().take(max).copied().collect()
    }
}
