//! `vmtrace synth`: synthetic traces shaped like `lib/test_vmalloc.c` (its module parameters,
//! tests and kthreads; docs/synth.md).
//!
//! The generator drives the reference model itself, so every address in the trace is the one
//! the model (variant `nodes`, the current kernel) chose and the trace is self-consistent: an
//! observed-timing replay agrees with it, and what-if replays start from a plausible history.
//! Time comes from a simple per-CPU timing model (docs/synth.md): threads are dealt to CPUs
//! round-robin, each CPU runs its threads in turn one operation at a time, and each operation
//! advances its CPU's clock by its uncontended cost ([`crate::sim::timing::Costs`]). The
//! trace therefore has no contention in it; the contention model predicts it on replay.

pub mod cli;
pub mod workload;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use rustc_hash::FxHashMap;
use std::io::Write;

use crate::host::system::SystemFacts;
use crate::model::{lazy_max_pages, AllocRequest, Model, ModelError, NodeLayout, Params, Variant};
use crate::sim::timing::Costs;
use crate::trace::{
    Alloc, Ctx, EventCounts, Footer, Free, Header, KAddr, Purge, Record, StopReason, Synthetic,
    Tool, TraceWriter, VmallocSnapshot, VmapFacts, FORMAT, VERSION,
};
use workload::{Op, Rng, Script, Shape, Test};

/// x86_64 4-level `VMALLOC_START` and `VMALLOC_END` (inclusive), as the kernel passes them.
pub const VMALLOC_START: u64 = 0xffff_c900_0000_0000;
pub const VMALLOC_END: u64 = 0xffff_e8ff_ffff_ffff;
const PAGE: u64 = 4096;
/// `VMAP_BBMAP_BITS` on x86_64 with `NR_CPUS` ≤ 2048 (mm/vmalloc.c): a vmap block is 1024 pages.
const VMAP_BLOCK_PAGES: u64 = 1024;
/// `VMAP_MAX_ALLOC`: `vm_map_ram` of more pages bypasses the vmap blocks.
const VMAP_MAX_ALLOC: u64 = 64;
/// Boot time of the first operation: not zero, so that no timestamp looks like a missing one.
const T0_NS: u64 = 1_000_000_000;

/// What to generate.
#[derive(Clone, Debug)]
pub struct SynthParams {
    /// `run_test_mask`: bit i enables test i of `lib/test_vmalloc.c`.
    pub mask: u64,
    /// `nr_threads`.
    pub threads: u32,
    /// Online (= possible) CPUs of the imagined machine.
    pub cpus: u32,
    /// `test_loop_count`.
    pub loops: u64,
    /// `nr_pages` (0 is treated as 1, as in the module).
    pub nr_pages: u64,
    pub seed: u64,
    /// `full_fit_alloc_test`'s pairs; `None`: `lazy_max_pages`, as in the module.
    pub junk: Option<u64>,
    /// `long_busy_list_alloc_test`'s live areas (15000 in the module).
    pub busy_list: u64,
    /// Delay from a drain trigger to the purge of the drain work.
    pub purge_latency_ns: u64,
    /// Delay from `kvfree_rcu` to the lazy free (one RCU grace period plus batching).
    pub rcu_delay_ns: u64,
    pub costs: Costs,
}

impl Default for SynthParams {
    fn default() -> Self {
        Self {
            mask: 7,
            threads: 1,
            cpus: 1,
            loops: 1000,
            nr_pages: 1,
            seed: 0,
            junk: None,
            busy_list: 15000,
            purge_latency_ns: 1_000_000,
            rcu_delay_ns: 8_000_000,
            costs: Costs::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("writing the trace: {0}")]
    Io(#[from] std::io::Error),
    #[error("the model refused a request: {0}")]
    Model(#[from] ModelError),
    #[error("{0}")]
    Params(String),
    /// The consumer of the records refused one (`vmtrace whatif`'s free-running models).
    #[error("{0}")]
    Sink(Box<dyn std::error::Error + Send + Sync>),
}

/// `lib/test_vmalloc.c`'s `test_loop_count`.
pub const MODULE_LOOPS: u64 = 1_000_000;

/// A setup size of the module (full_fit's junk pairs, long_busy_list's live areas) scaled
/// from the module's 1,000,000 loops down to `loops`, at least 1: the scale at which a shorter
/// run keeps the module's mix of setup bursts and looped allocations.
pub fn module_scaled(n: u64, loops: u64) -> u64 {
    (n.saturating_mul(loops.min(MODULE_LOOPS)))
        .div_ceil(MODULE_LOOPS)
        .max(1)
}

/// What was generated.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SynthSummary {
    pub tests: Vec<&'static str>,
    pub events: EventCounts,
    pub failed_attempts: u64,
    pub duration_ns: u64,
    pub lines: u64,
}

/// A thread of the workload.
struct Worker {
    id: u32,
    cpu: u32,
    order: Vec<Test>,
    at: usize,
    script: Option<Script>,
    /// Pointer slots: slot → (address, pages mapped). Vmap-block mappings hold their block.
    slots: FxHashMap<u32, Held>,
}

#[derive(Clone, Copy, Debug)]
enum Held {
    Area { addr: u64, pages: u64 },
    Block { block: u64, pages: u64 },
}

/// A per-CPU vmap block (`vb_alloc`'s bump allocator): used and dirty pages.
#[derive(Clone, Copy, Debug)]
struct Block {
    cpu: u32,
    used: u64,
    dirty: u64,
}

/// Something due at a time: a CPU's next turn or a deferred kernel action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    Cpu(u32),
    /// The drain work's purge, on this CPU.
    Purge(u32),
    /// A `kvfree_rcu` free of this area, on this CPU.
    RcuFree(u32, u64),
}

/// Header of a synthetic trace: the imagined machine's facts follow `cpus` by the kernel's rules.
pub fn header(p: &SynthParams, tests: &[Test], command_line: Vec<String>) -> Header {
    let layout = NodeLayout::from_cpus(p.cpus, PAGE);
    let lazy_max = lazy_max_pages(p.cpus, PAGE);
    let cpu_list = if p.cpus > 1 {
        format!("0-{}", p.cpus - 1)
    } else {
        "0".into()
    };
    let c = &p.costs;
    let params: BTreeMap<String, u64> = [
        ("mask", p.mask),
        ("threads", u64::from(p.threads)),
        ("cpus", u64::from(p.cpus)),
        ("loops", p.loops),
        ("nr_pages", p.nr_pages),
        ("seed", p.seed),
        ("junk", p.junk.unwrap_or(lazy_max)),
        ("busy_list", p.busy_list),
        ("purge_latency_ns", p.purge_latency_ns),
        ("rcu_delay_ns", p.rcu_delay_ns),
        ("alloc_base_ns", c.alloc_base_ns),
        ("alloc_per_page_ns", c.alloc_per_page_ns),
        ("free_base_ns", c.free_base_ns),
        ("free_per_page_ns", c.free_per_page_ns),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Header {
        format: FORMAT.into(),
        version: VERSION,
        tool: Tool {
            name: "vmtrace".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        command_line,
        system: SystemFacts {
            kernel_release: "synthetic".into(),
            kernel_version: "vmtrace synth (model variant nodes)".into(),
            machine: "x86_64".into(),
            hostname: "synthetic".into(),
            page_size: PAGE,
            possible_cpus: p.cpus,
            possible_cpu_list: cpu_list.clone(),
            online_cpus: p.cpus,
            online_cpu_list: cpu_list,
            btf: false,
        },
        vmap: VmapFacts {
            nr_vmap_nodes: layout.nr_nodes(),
            zone_size: layout.zone_size(),
            lazy_max_pages_computed: lazy_max,
            lazy_max_pages_tracepoint: Some(lazy_max),
            vmalloc_start: Some(KAddr(VMALLOC_START)),
            vmalloc_end: Some(KAddr(VMALLOC_END)),
            source: "vmtrace synth: derived from --cpus by the kernel's rules (nodes = clamp(cpus, 1, 128), 16-page zones, lazy_max_pages = fls(cpus) * 32 MiB / PAGE_SIZE); x86_64 4-level VMALLOC range".into(),
        },
        probes: Vec::new(),
        clock: "CLOCK_BOOTTIME".into(),
        start_boottime_ns: T0_NS,
        start_realtime_ns: 0,
        ring_buffer_bytes: 0,
        synthetic: Some(Synthetic {
            generator: "vmtrace synth".into(),
            workload: "lib/test_vmalloc.c".into(),
            tests: tests.iter().map(|t| t.name().to_string()).collect(),
            params,
        }),
        imported: None,
    }
}

/// Where the generator's records go: a trace writer for `vmtrace synth`, the free-running
/// models for `vmtrace whatif`. Both see the same records in the same order.
pub trait Sink {
    fn put(&mut self, r: Record) -> Result<(), SynthError>;
}

impl<W: Write> Sink for TraceWriter<W> {
    fn put(&mut self, r: Record) -> Result<(), SynthError> {
        self.write(&r)?;
        Ok(())
    }
}

/// Generates one trace into `out`.
pub fn generate<W: Write>(
    p: &SynthParams,
    command_line: Vec<String>,
    out: W,
) -> Result<SynthSummary, SynthError> {
    let mut w = TraceWriter::new(out);
    let mut summary = stream(p, command_line, &mut w)?;
    w.flush()?;
    summary.lines = w.lines_written();
    Ok(summary)
}

/// Generates one trace's records, header and start snapshot first and footer last, into
/// `sink`. `lines` of the summary counts the records.
pub fn stream<S: Sink>(
    p: &SynthParams,
    command_line: Vec<String>,
    sink: &mut S,
) -> Result<SynthSummary, SynthError> {
    if p.threads == 0 || p.cpus == 0 {
        return Err(SynthError::Params(
            "--threads and --cpus must be at least 1".into(),
        ));
    }
    let tests = Test::from_mask(p.mask);
    let mut g = Generator::new(p, &tests)?;
    let mut w = Counted { sink, records: 0 };
    w.put(Record::Header(Box::new(header(p, &tests, command_line))))?;
    w.put(Record::Vmallocinfo(Box::new(VmallocSnapshot {
        ts_start_ns: T0_NS - 1000,
        ts_end_ns: T0_NS - 500,
        real_addresses: true,
        pools_drained: false,
        areas: Vec::new(),
    })))?;
    g.run(&mut w)?;
    let end = g.last_ts + 1;
    let footer = Footer {
        end_boottime_ns: end,
        reason: StopReason::CommandExited,
        command_exit_code: Some(0),
        events: g.summary.events,
        lost_per_cpu: vec![0; p.cpus as usize],
        lost_by_kind: EventCounts::default(),
        lost_total: 0,
        late_events: 0,
        kernel_run_stats: None,
        ladder: None,
    };
    w.put(Record::Footer(Box::new(footer)))?;
    g.summary.tests = tests.iter().map(|t| t.name()).collect();
    g.summary.duration_ns = end - T0_NS;
    g.summary.lines = w.records;
    Ok(g.summary)
}

/// Counts what passes to the sink.
struct Counted<'s, S> {
    sink: &'s mut S,
    records: u64,
}

impl<S: Sink> Sink for Counted<'_, S> {
    fn put(&mut self, r: Record) -> Result<(), SynthError> {
        self.records += 1;
        self.sink.put(r)
    }
}

struct Generator<'p> {
    p: &'p SynthParams,
    shape: Shape,
    model: Model,
    rng: Rng,
    workers: Vec<Worker>,
    /// Per CPU: its clock and its runnable workers in turn order.
    clocks: Vec<u64>,
    runq: Vec<VecDeque<usize>>,
    due: BinaryHeap<Reverse<(u64, u64, Due)>>,
    seq: u64,
    drain_pending: bool,
    /// vmap blocks by start address, and each CPU's current block.
    blocks: FxHashMap<u64, Block>,
    cur_block: FxHashMap<u32, u64>,
    last_ts: u64,
    summary: SynthSummary,
}

impl<'p> Generator<'p> {
    fn new(p: &'p SynthParams, tests: &[Test]) -> Result<Self, SynthError> {
        let lazy_max = lazy_max_pages(p.cpus, PAGE);
        let model = Model::new(Params {
            page_size: PAGE,
            layout: NodeLayout::from_cpus(p.cpus, PAGE),
            lazy_max_pages: lazy_max,
            vmalloc_start: VMALLOC_START,
            vmalloc_end: VMALLOC_END,
            five_level: false,
            // synth stands in for the current kernel's test_vmalloc runs.
            decay: crate::model::DecayRule::Quarter,
            variant: Variant::Nodes,
        })?;
        let mut rng = Rng::new(p.seed);
        let mut workers = Vec::with_capacity(p.threads as usize);
        let mut runq = vec![VecDeque::new(); p.cpus as usize];
        for id in 0..p.threads {
            let order = workload::worker_order(tests, &mut rng);
            let cpu = id % p.cpus;
            runq[cpu as usize].push_back(workers.len());
            workers.push(Worker {
                id,
                cpu,
                order,
                at: 0,
                script: None,
                slots: FxHashMap::default(),
            });
        }
        let mut g = Self {
            p,
            shape: Shape {
                loops: p.loops,
                nr_pages: p.nr_pages,
                junk: p.junk.unwrap_or(lazy_max),
                busy_list: p.busy_list,
                page_size: PAGE,
            },
            model,
            rng,
            workers,
            clocks: vec![T0_NS; p.cpus as usize],
            runq,
            due: BinaryHeap::new(),
            seq: 0,
            drain_pending: false,
            blocks: FxHashMap::default(),
            cur_block: FxHashMap::default(),
            last_ts: T0_NS,
            summary: SynthSummary::default(),
        };
        for cpu in 0..p.cpus {
            g.schedule(T0_NS, Due::Cpu(cpu));
        }
        Ok(g)
    }

    fn schedule(&mut self, at: u64, what: Due) {
        self.seq += 1;
        self.due.push(Reverse((at, self.seq, what)));
    }

    fn run<S: Sink>(&mut self, w: &mut S) -> Result<(), SynthError> {
        while let Some(Reverse((at, _, what))) = self.due.pop() {
            match what {
                Due::Cpu(cpu) => self.turn(cpu, w)?,
                Due::Purge(cpu) => {
                    self.drain_pending = false;
                    self.purge(at, cpu, false, w)?;
                }
                Due::RcuFree(cpu, addr) => {
                    let ctx = kworker(at, cpu);
                    self.free(ctx, addr, w)?;
                }
            }
        }
        Ok(())
    }

    /// One operation of the next worker on `cpu`, then the CPU's next turn.
    fn turn<S: Sink>(&mut self, cpu: u32, w: &mut S) -> Result<(), SynthError> {
        let Some(wi) = self.runq[cpu as usize].pop_front() else {
            return Ok(());
        };
        let now = self.clocks[cpu as usize];
        let Some(op) = self.next_op(wi) else {
            // This worker is done; the CPU goes on with the others at once.
            if !self.runq[cpu as usize].is_empty() {
                self.schedule(now, Due::Cpu(cpu));
            }
            return Ok(());
        };
        let cost = self.execute(wi, op, now, w)?;
        self.clocks[cpu as usize] = now + cost.max(1);
        self.runq[cpu as usize].push_back(wi);
        self.schedule(now + cost.max(1), Due::Cpu(cpu));
        Ok(())
    }

    fn next_op(&mut self, wi: usize) -> Option<Op> {
        let shape = self.shape;
        let wk = &mut self.workers[wi];
        loop {
            if wk.script.is_none() {
                let t = *wk.order.get(wk.at)?;
                wk.at += 1;
                wk.script = Some(Script::new(t));
            }
            if let Some(op) = wk
                .script
                .as_mut()
                .and_then(|s| s.next(&shape, &mut self.rng))
            {
                return Some(op);
            }
            wk.script = None;
        }
    }

    fn ctx(&self, wi: usize, ts: u64) -> Ctx {
        let wk = &self.workers[wi];
        Ctx {
            ts_ns: ts,
            cpu: wk.cpu,
            tgid: 1000 + wk.id,
            pid: 1000 + wk.id,
            comm: compact_str::format_compact!("vmalloc_test/{}", wk.id),
        }
    }

    /// Runs one operation at `now`; returns its cost.
    fn execute<S: Sink>(
        &mut self,
        wi: usize,
        op: Op,
        now: u64,
        w: &mut S,
    ) -> Result<u64, SynthError> {
        let costs = self.p.costs;
        let ctx = self.ctx(wi, now);
        match op {
            Op::Alloc { slot, pages, align } => {
                match self.alloc(&ctx, (pages + 1) * PAGE, align, true, w)? {
                    Some(addr) => {
                        self.workers[wi]
                            .slots
                            .insert(slot, Held::Area { addr, pages });
                    }
                    None => {
                        if let Some(s) = self.workers[wi].script.as_mut() {
                            s.failed();
                        }
                    }
                }
                Ok(costs.alloc_ns(pages))
            }
            Op::Free { slot } | Op::UnmapRam { slot } | Op::FreeRcu { slot } => {
                let Some(held) = self.workers[wi].slots.remove(&slot) else {
                    return Ok(1);
                };
                match (held, op) {
                    (Held::Area { addr, .. }, Op::FreeRcu { .. }) => {
                        self.schedule(now + self.p.rcu_delay_ns, Due::RcuFree(ctx.cpu, addr));
                    }
                    (Held::Area { addr, .. }, _) => self.free(ctx, addr, w)?,
                    (Held::Block { block, pages }, _) => self.vb_free(ctx, block, pages, w)?,
                }
                let pages = match held {
                    Held::Area { pages, .. } | Held::Block { pages, .. } => pages,
                };
                Ok(costs.free_ns(pages))
            }
            Op::MapRam { slot, pages } => {
                if pages > VMAP_MAX_ALLOC {
                    if let Some(addr) = self.alloc(&ctx, pages * PAGE, PAGE, false, w)? {
                        self.workers[wi]
                            .slots
                            .insert(slot, Held::Area { addr, pages });
                    }
                } else if let Some(block) = self.vb_alloc(&ctx, pages, w)? {
                    let order_pages = pages.next_power_of_two();
                    self.workers[wi].slots.insert(
                        slot,
                        Held::Block {
                            block,
                            pages: order_pages,
                        },
                    );
                }
                Ok(costs.alloc_ns(pages))
            }
        }
    }

    /// `vb_alloc`: a bump allocation in this CPU's current block, a new block when it is full.
    fn vb_alloc<S: Sink>(
        &mut self,
        ctx: &Ctx,
        pages: u64,
        w: &mut S,
    ) -> Result<Option<u64>, SynthError> {
        let need = pages.next_power_of_two();
        if let Some(&b) = self.cur_block.get(&ctx.cpu) {
            if let Some(blk) = self.blocks.get_mut(&b) {
                if VMAP_BLOCK_PAGES - blk.used >= need {
                    blk.used += need;
                    return Ok(Some(b));
                }
            }
        }
        let size = VMAP_BLOCK_PAGES * PAGE;
        let Some(b) = self.alloc(ctx, size, size, false, w)? else {
            return Ok(None);
        };
        self.blocks.insert(
            b,
            Block {
                cpu: ctx.cpu,
                used: need,
                dirty: 0,
            },
        );
        self.cur_block.insert(ctx.cpu, b);
        Ok(Some(b))
    }

    /// `vb_free`: the pages become dirty; a block whose every page is dirty is freed lazily.
    fn vb_free<S: Sink>(
        &mut self,
        ctx: Ctx,
        block: u64,
        pages: u64,
        w: &mut S,
    ) -> Result<(), SynthError> {
        let Some(blk) = self.blocks.get_mut(&block) else {
            return Ok(());
        };
        blk.dirty += pages;
        if blk.dirty >= VMAP_BLOCK_PAGES {
            let cpu = blk.cpu;
            self.blocks.remove(&block);
            if self.cur_block.get(&cpu) == Some(&block) {
                self.cur_block.remove(&cpu);
            }
            self.free(ctx, block, w)?;
        }
        Ok(())
    }

    /// `alloc_vmap_area` with the kernel's failure path: a failed attempt, a full purge, one
    /// retry. Returns the address, or `None` when the retry failed too.
    fn alloc<S: Sink>(
        &mut self,
        ctx: &Ctx,
        size: u64,
        align: u64,
        guard: bool,
        w: &mut S,
    ) -> Result<Option<u64>, SynthError> {
        let mut req = AllocRequest {
            size,
            align: align.max(1),
            vstart: VMALLOC_START,
            vend: VMALLOC_END,
            cpu: ctx.cpu,
            retry: false,
            guard,
        };
        for attempt in 0..2 {
            let got = self.model.alloc(&req)?;
            let (addr, failed) = match got {
                Ok(a) => (a.addr, 0),
                Err(_) => ((-12i64) as u64, 1),
            };
            self.emit(
                w,
                Record::Alloc(Alloc {
                    ctx: ctx.clone(),
                    addr: KAddr(addr),
                    size,
                    align: req.align,
                    vstart: KAddr(VMALLOC_START),
                    vend: KAddr(VMALLOC_END),
                    failed,
                }),
            )?;
            if failed == 0 {
                self.summary.events.alloc += 1;
                return Ok(Some(addr));
            }
            self.summary.failed_attempts += 1;
            self.summary.events.alloc += 1;
            if attempt == 0 {
                self.purge(ctx.ts_ns, ctx.cpu, true, w)?;
                req.retry = true;
            }
        }
        Ok(None)
    }

    fn free<S: Sink>(&mut self, ctx: Ctx, addr: u64, w: &mut S) -> Result<(), SynthError> {
        let got = self.model.free(addr)?;
        let lazy_max = self.model.params().lazy_max_pages;
        let (ts, cpu) = (ctx.ts_ns, ctx.cpu);
        self.emit(
            w,
            Record::Free(Free {
                ctx,
                va_start: KAddr(addr),
                nr_lazy: got.nr_lazy,
                nr_lazy_max: lazy_max,
            }),
        )?;
        self.summary.events.free += 1;
        if got.drain && !self.drain_pending {
            // schedule_work on an idle work item; a pending one is not queued twice.
            self.drain_pending = true;
            self.schedule(ts + self.p.purge_latency_ns, Due::Purge(cpu));
        }
        Ok(())
    }

    fn purge<S: Sink>(
        &mut self,
        ts: u64,
        cpu: u32,
        full: bool,
        w: &mut S,
    ) -> Result<(), SynthError> {
        let got = self.model.purge(full);
        let (start, end) = got.range.unwrap_or((u64::MAX, 0));
        self.emit(
            w,
            Record::Purge(Purge {
                ctx: kworker(ts, cpu),
                start: KAddr(start),
                end: KAddr(end),
                npurged: got.npurged,
            }),
        )?;
        self.summary.events.purge += 1;
        Ok(())
    }

    fn emit<S: Sink>(&mut self, w: &mut S, r: Record) -> Result<(), SynthError> {
        if let Some(ts) = r.ts_ns() {
            self.last_ts = self.last_ts.max(ts);
        }
        w.put(r)
    }
}

/// Context of kernel work: the drain work and the RCU callbacks run in a kworker.
fn kworker(ts: u64, cpu: u32) -> Ctx {
    Ctx {
        ts_ns: ts,
        cpu,
        tgid: 2,
        pid: 100_000 + cpu,
        comm: compact_str::format_compact!("kworker/{cpu}:1"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(p: &SynthParams) -> Vec<u8> {
        let mut out = Vec::new();
        generate(p, vec!["vmtrace".into(), "synth".into()], &mut out).unwrap();
        out
    }

    #[test]
    fn deterministic_for_a_seed() {
        let p = SynthParams {
            mask: 0x1f7f,
            threads: 4,
            cpus: 2,
            loops: 20,
            junk: Some(16),
            busy_list: 10,
            seed: 42,
            ..SynthParams::default()
        };
        assert_eq!(gen(&p), gen(&p));
        let other = SynthParams {
            seed: 43,
            ..p.clone()
        };
        assert_ne!(gen(&p), gen(&other));
    }
}
