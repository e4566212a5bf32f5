//! The records of a trace, one per line. `docs/trace-format.md` is the prose version of this file.

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

use super::wire::Field;
use super::wire::SystemFacts;
use super::KAddr;

/// One line of a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    Header(Box<Header>),
    Vmallocinfo(Box<VmallocSnapshot>),
    Alloc(Alloc),
    Free(Free),
    Purge(Purge),
    Contention(Box<Contention>),
    Work(Box<Work>),
    WorkStart(WorkStart),
    PtPage(PtPage),
    Latency(Latency),
    Meminfo(Meminfo),
    Allocinfo(Box<AllocinfoSample>),
    Footer(Box<Footer>),
}

/// First line: everything a replay needs to know about the machine and the recording.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Always [`super::FORMAT`].
    pub format: String,
    pub version: u32,
    pub tool: Tool,
    /// `vmtrace record` arguments as given.
    pub command_line: Vec<String>,
    pub system: SystemFacts,
    pub vmap: VmapFacts,
    pub probes: Vec<ProbeInfo>,
    /// Event timestamps are CLOCK_BOOTTIME nanoseconds (`bpf_ktime_get_boot_ns`).
    pub clock: String,
    pub start_boottime_ns: u64,
    /// Wall-clock time of `start_boottime_ns`, nanoseconds since the Unix epoch.
    pub start_realtime_ns: u64,
    pub ring_buffer_bytes: u64,
    /// Present only in traces made by `vmtrace synth`: nothing in them was observed on a
    /// kernel, so tools must not present them as a recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<Synthetic>,
    /// Present only in traces made by `vmtrace import` from another tool's text output: what
    /// it came from, and which header facts were inferred rather than read from a kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported: Option<Imported>,
}

/// Where an imported trace came from (`vmtrace import`, docs/import.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Imported {
    /// `perf-script`, `trace-cmd` or `ftrace`.
    pub from: String,
    /// The input file as given (`-` for stdin).
    pub input: String,
    /// Each header fact or record that was inferred or is missing, and how.
    pub inferred: Vec<String>,
}

/// How a synthetic trace was generated (`vmtrace synth`, docs/synth.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Synthetic {
    /// The generator, e.g. `"vmtrace synth"`.
    pub generator: String,
    /// The workload it imitates, e.g. `"lib/test_vmalloc.c"`.
    pub workload: String,
    /// Enabled tests, in mask-bit order.
    pub tests: Vec<String>,
    /// Generator parameters (mask, threads, cpus, loops, nr_pages, seed, timing costs, …).
    pub params: std::collections::BTreeMap<String, u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    pub version: String,
}

/// Parameters of the kernel's vmap allocator on the recorded machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmapFacts {
    /// `clamp(possible CPUs, 1, 128)` when above 1, else 1 (the node layer's rule).
    pub nr_vmap_nodes: u32,
    /// Bytes per zone dealt round-robin to nodes: 16 pages with more than one node, else 1.
    pub zone_size: u64,
    /// `fls(online CPUs) * 32 MiB / PAGE_SIZE`, computed from the CPU count.
    pub lazy_max_pages_computed: u64,
    /// `nr_lazy_max` as the kernel reported it in a `free_vmap_area_noflush` event during
    /// start-up calibration; `null` if no free event arrived in time.
    pub lazy_max_pages_tracepoint: Option<u64>,
    /// VMALLOC_START and VMALLOC_END (inclusive last byte) as the kernel passed them in the
    /// calibration allocation's `vstart`/`vend`; `null` if calibration saw no allocation.
    pub vmalloc_start: Option<KAddr>,
    pub vmalloc_end: Option<KAddr>,
    /// How the values above were obtained, for a human reading the header.
    pub source: String,
}

/// How one logical probe is attached on this kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeInfo {
    /// `category:name` of the tracepoint.
    pub probe: String,
    /// `tracepoint`, `raw_tracepoint`, `kprobe` or `fentry`.
    pub rung: String,
    /// BPF program name.
    pub program: String,
    /// Fields read, with the offsets from the tracepoint's `format` file.
    pub fields: Vec<Field>,
    /// Fields vmtrace knows but this kernel's format lacks; reported as 0 in events.
    pub missing_fields: Vec<String>,
    /// The logical probe this entry implements (`lock_waits`, `purge_work`, `page_tables`,
    /// `backing_pages`, `alloc_latency`); absent for the three vmalloc tracepoints, which have
    /// no other rung.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical: Option<String>,
    /// Richer rungs tried before the chosen one, each with the reason it was refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RungRefusal>,
    /// What the chosen rung cannot give (e.g. no latency on the tracepoint rung).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// On the tracepoint rung, how it attached: `raw_tp` (a raw tracepoint, arguments found in
    /// kernel BTF) or `perf` (the tracefs record); absent in traces from before the raw
    /// attach and on the other rungs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach: Option<String>,
    /// Why a tracepoint attached as `perf` rather than `raw_tp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach_fallback: Option<String>,
}

/// A rung of the strategy ladder that could not be used, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RungRefusal {
    /// `fentry`, `kprobe` or `tracepoint`.
    pub rung: String,
    pub reason: String,
}

/// What `/proc/vmallocinfo` showed at the start: the state a model replay is seeded from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmallocSnapshot {
    /// CLOCK_BOOTTIME just before and just after the file was read; events in between may or
    /// may not be reflected.
    pub ts_start_ns: u64,
    pub ts_end_ns: u64,
    /// False when the kernel hashed the addresses (kptr_restrict could not be lowered).
    pub real_addresses: bool,
    /// True when `record --drain-pools` emptied the vmap pools just before the read, so the
    /// areas the snapshot leaves out are free; otherwise pooled areas, which no snapshot
    /// shows, look free too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pools_drained: bool,
    pub areas: Vec<VmallocArea>,
}

/// Kind of a `/proc/vmallocinfo` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AreaKind {
    /// An area with a `vm_struct` (vmalloc, vmap, ioremap, …).
    Busy,
    /// `unpurged vm_area`: lazily freed, waiting for a purge.
    Unpurged,
    /// `vm_map_ram`: a vmap area without a `vm_struct`.
    VmMapRam,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmallocArea {
    pub start: KAddr,
    pub end: KAddr,
    /// Bytes, including the guard page where there is one.
    pub size: u64,
    pub kind: AreaKind,
    /// `function+off/len [module]` for busy areas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phys: Option<String>,
    /// Flag words (`vmalloc`, `vmap`, `ioremap`, `user`, `vpages`, …) and `N<node>=<pages>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
}

/// Task context carried by every event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ctx {
    /// CLOCK_BOOTTIME nanoseconds.
    pub ts_ns: u64,
    pub cpu: u32,
    pub tgid: u32,
    pub pid: u32,
    pub comm: CompactString,
}

/// `vmalloc:alloc_vmap_area`: one attempt to allocate a vmap area (a request may retry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alloc {
    #[serde(flatten)]
    pub ctx: Ctx,
    /// Start of the area; on failure a negative errno cast to unsigned.
    pub addr: KAddr,
    /// Bytes, including the guard page.
    pub size: u64,
    pub align: u64,
    pub vstart: KAddr,
    pub vend: KAddr,
    /// Non-zero when the attempt failed.
    pub failed: i32,
}

/// `vmalloc:free_vmap_area_noflush`: an area put on its node's lazy list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Free {
    #[serde(flatten)]
    pub ctx: Ctx,
    pub va_start: KAddr,
    /// Lazy backlog in pages, including this area.
    pub nr_lazy: u64,
    /// `lazy_max_pages()` at the time; `nr_lazy > nr_lazy_max` schedules a drain.
    pub nr_lazy_max: u64,
}

/// `vmalloc:purge_vmap_area_lazy`: end of one `__purge_vmap_area_lazy` call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Purge {
    #[serde(flatten)]
    pub ctx: Ctx,
    pub start: KAddr,
    pub end: KAddr,
    /// Area objects purged (pooled ones included), not pages.
    pub npurged: u32,
}

/// Which vmap lock a contention event waited on, classified in user space from its stack
/// (the locks of mm/vmalloc.c, plus `init_mm.page_table_lock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LockClass {
    /// `free_vmap_area_lock` (global spinlock).
    FreeAreaLock,
    /// `vn->busy.lock`.
    NodeBusyLock,
    /// `vn->lazy.lock`.
    NodeLazyLock,
    /// `vn->pool_lock`.
    NodePoolLock,
    /// `vmap_purge_lock` (global mutex).
    PurgeMutex,
    /// `init_mm.page_table_lock`.
    PageTableLock,
    /// A lock on a vmap path that is none of the above (zone locks, run-queue locks, vmap blocks).
    Other,
}

impl LockClass {
    pub const ALL: [LockClass; 7] = [
        LockClass::FreeAreaLock,
        LockClass::NodeBusyLock,
        LockClass::NodeLazyLock,
        LockClass::NodePoolLock,
        LockClass::PurgeMutex,
        LockClass::PageTableLock,
        LockClass::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LockClass::FreeAreaLock => "free_area_lock",
            LockClass::NodeBusyLock => "node_busy_lock",
            LockClass::NodeLazyLock => "node_lazy_lock",
            LockClass::NodePoolLock => "node_pool_lock",
            LockClass::PurgeMutex => "purge_mutex",
            LockClass::PageTableLock => "page_table_lock",
            LockClass::Other => "other",
        }
    }
}

/// `lock:contention_begin` → `lock:contention_end` on a vmap path: one lock wait.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contention {
    /// Context of the waiter, at the end of the wait (`ts_ns` is when it got the lock).
    #[serde(flatten)]
    pub ctx: Ctx,
    /// Address of the lock (kernel-image address for global locks, heap for per-node ones).
    pub lock: KAddr,
    /// `LCB_F_*` bits of `contention_begin`: 1 spin, 2 read, 4 write, 8 rt, 16 percpu, 32 mutex.
    pub flags: u32,
    /// Nanoseconds from `contention_begin` to `contention_end`.
    pub wait_ns: u64,
    /// `ret` of `contention_end`: 0, or a negative errno when a sleeping wait was interrupted.
    pub ret: i32,
    pub class: LockClass,
    /// vmap node of a per-node lock, when known (see docs/trace-format.md); `null` otherwise.
    pub node: Option<u32>,
    /// Id in the kernel stack map; negative errno when the stack could not be stored.
    pub stack_id: i64,
    /// Kernel stack, innermost frame first, as `symbol+0xoff`; empty when `stack_id` < 0.
    pub stack: Vec<String>,
    /// The probe's own time in `contention_begin` before it stamped the wait's start (its stack
    /// walk): the waiter was already waiting, so its wait began this much before
    /// `ts_ns - wait_ns`. Absent in traces from before the member existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_ns: Option<u64>,
}

/// One execution of a vmap purge work item (`drain_vmap_area_work` or `purge_vmap_node`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Work {
    /// Context at the end of the work item.
    #[serde(flatten)]
    pub ctx: Ctx,
    /// `drain_vmap_area_work` or `purge_vmap_node`.
    pub function: String,
    pub function_addr: KAddr,
    /// The `work_struct` (tracepoint rung) or the `vmap_node` (fentry/kprobe rungs).
    pub work: KAddr,
    pub start_ns: u64,
    pub duration_ns: u64,
    pub start_cpu: u32,
    /// `vn->nr_purged` after `purge_vmap_node` (fexit rung only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nr_purged: Option<u64>,
    /// First TLB-flush cross-call this item queued (`csd:csd_queue_cpu` for
    /// `do_flush_tlb_all` or `do_kernel_range_flush`), CLOCK_BOOTTIME ns: the purge's
    /// `flush_tlb_kernel_range`, which comes right after the last node's lazy list was
    /// detached. Absent when not probed, or when the item flushed nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_ns: Option<u64>,
}

/// The start of a `drain_vmap_area_work` item, written when it starts: a reader in event order
/// then knows the purge has begun (its pool decays and lazy-list detaches follow) before the
/// purge event and the item's [`Work`] record, both written at its end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkStart {
    /// Context at the item's start; `ts_ns` is the start.
    #[serde(flatten)]
    pub ctx: Ctx,
    /// `drain_vmap_area_work`.
    pub function: String,
    pub function_addr: KAddr,
    /// The `work_struct`.
    pub work: KAddr,
}

/// Level of a kernel page-table page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PtLevel {
    Pte,
    Pmd,
    Pud,
    P4d,
}

/// One kernel page-table page allocated while mapping vmalloc space.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtPage {
    #[serde(flatten)]
    pub ctx: Ctx,
    pub level: PtLevel,
    /// Page frame number (tracepoint rung); on the fentry/kprobe rungs the address of the
    /// parent entry being filled.
    pub pfn: u64,
    pub order: u32,
}

/// Entry-to-exit latency of one `alloc_vmap_area` call (fentry/kprobe rungs only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latency {
    #[serde(flatten)]
    pub ctx: Ctx,
    pub function: String,
    pub start_ns: u64,
    pub latency_ns: u64,
}

/// One `/proc/meminfo` sample (1 Hz by default).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meminfo {
    /// CLOCK_BOOTTIME when the file was read.
    pub ts_ns: u64,
    pub page_tables_kb: u64,
    pub vmalloc_used_kb: u64,
}

/// One read of /proc/allocinfo (`record --allocinfo-interval`), reduced to what vmtrace
/// explains: the page-table pages vmalloc space costs and the vmalloc allocator's own tags.
/// Whole snapshots belong in `vmtrace allocinfo snapshot` files, not in every trace line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocinfoSample {
    /// CLOCK_BOOTTIME when the file was read.
    pub ts_ns: u64,
    /// Sum over every tag.
    pub total: super::wire::Counts,
    /// Sum over the `func:pagetable_alloc` tags (all page tables, not only vmalloc's).
    pub pagetable: super::wire::Counts,
    /// Tags of `mm/vmalloc.c`.
    pub vmalloc_tags: Vec<super::wire::Tag>,
    /// Some tag said `accurate:no`: absolute values are low, deltas are exact.
    pub inaccurate: bool,
    /// Lines the lenient parser skipped.
    pub skipped_lines: u64,
}

/// Counts of the ladder's event kinds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LadderCounts {
    pub contention: u64,
    pub work: u64,
    pub pt_page: u64,
    pub latency: u64,
}

/// Per-class totals of the contention events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassTotal {
    pub class: LockClass,
    pub count: u64,
    pub wait_ns: u64,
}

/// Critical sections of one lock class as the hold probe timed them (`lock_holds`: from the
/// return of `_raw_spin_lock` to the entry of `_raw_spin_unlock`, on lock addresses already
/// classified from waits).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassHolds {
    pub class: LockClass,
    pub count: u64,
    /// Sum of the holds.
    pub hold_ns: u64,
    /// Holds by exp2 bucket: index `k` counts holds in `[2^(k-1), 2^k)` ns (0: 0 ns; the
    /// last also counts longer ones).
    pub histogram: Vec<u64>,
}

impl ClassHolds {
    pub fn mean_ns(&self) -> f64 {
        self.hold_ns as f64 / self.count.max(1) as f64
    }

    /// The upper bound of the bucket that holds the `q` quantile (`2^k` ns for bucket `k`):
    /// the histogram says no more than that a hold was under it.
    pub fn quantile_bound_ns(&self, q: f64) -> u64 {
        let want = (q * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (k, &n) in self.histogram.iter().enumerate() {
            seen += n;
            if seen >= want {
                return 1u64 << k.min(63);
            }
        }
        1u64 << self.histogram.len().min(63)
    }
}

/// Accounting of the ladder probes (lock waits, purge work, page tables, backing pages).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LadderStats {
    pub events: LadderCounts,
    pub lost: LadderCounts,
    /// `bpf_get_stackid` failures (stack map full or bucket taken).
    pub stack_map_failures: u64,
    /// `bpf_get_stack` failures in the in-kernel filters.
    pub stack_read_failures: u64,
    /// Contentions dropped in the kernel because no vmap function was on the stack.
    pub contention_filtered: u64,
    /// Contention begins ignored because a wait was already pending on that CPU or task.
    pub contention_nested: u64,
    /// Contentions kept without a stack walk, on lock addresses already classified as vmap
    /// locks (their records have `stack_id` `i64::MIN`). Absent before the probe had them.
    #[serde(default)]
    pub contention_known: u64,
    /// `mm_page_alloc` hits that passed the gfp pre-filter and had their stack walked.
    pub page_stack_walks: u64,
    /// Work-item ends whose start was not seen.
    pub work_unmatched_end: u64,
    /// Count and total wait per lock class, every class listed.
    pub contention_by_class: Vec<ClassTotal>,
    /// Backing-page allocations on the vmalloc path by order (index = order; the last slot
    /// also counts larger orders).
    pub backing_page_orders: Vec<u64>,
    /// `purge` events from a `drain_vmap_area_work` worker, and how many of them fell inside a
    /// recorded work item of the same task.
    pub purges_from_work: u64,
    pub purges_matched: u64,
    /// Lock holds per class (the `lock_holds` probe), classes with at least one hold; empty
    /// when the probe was off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lock_holds: Vec<ClassHolds>,
    /// Known-lock takes the hold probe left untimed because another was being timed on the
    /// same CPU.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hold_nested: u64,
}

/// Why recording stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Duration,
    Sigint,
    Sigterm,
    CommandExited,
    Error,
    /// `vmtrace serve --record` started the next file (this one reached `--rotate`).
    Rotated,
}

/// Last line: counts and losses. A trace without one was cut short (e.g. SIGKILL).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Footer {
    pub end_boottime_ns: u64,
    pub reason: StopReason,
    /// Exit status of the recorded command, if one ran and exited normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_exit_code: Option<i32>,
    pub events: EventCounts,
    /// Ring-buffer reserve failures per CPU (index = CPU), all kinds together.
    pub lost_per_cpu: Vec<u64>,
    pub lost_by_kind: EventCounts,
    pub lost_total: u64,
    /// Events that reached user space after events with later timestamps had been written
    /// (written anyway, out of order), plus ring-buffer records that could not be decoded.
    /// Zero in a healthy recording.
    pub late_events: u64,
    /// Program runs as the kernel counted them (`kernel.bpf_stats_enabled=1` during the whole
    /// recording); absent otherwise. For each probe, run_count = events + lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_run_stats: Option<Vec<ProbeRunStats>>,
    /// Accounting of the ladder probes; absent in traces from before them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ladder: Option<LadderStats>,
}

/// The kernel's accounting of one BPF program (`bpf_prog_info.run_cnt`, `run_time_ns`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeRunStats {
    /// `category:name` of the tracepoint.
    pub probe: String,
    pub run_count: u64,
    pub run_time_ns: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventCounts {
    pub alloc: u64,
    pub free: u64,
    pub purge: u64,
}

impl EventCounts {
    pub fn total(&self) -> u64 {
        self.alloc + self.free + self.purge
    }
}

impl Record {
    /// Timestamp of an event record; `None` for header, snapshot and footer.
    pub fn ts_ns(&self) -> Option<u64> {
        match self {
            Record::Alloc(e) => Some(e.ctx.ts_ns),
            Record::Free(e) => Some(e.ctx.ts_ns),
            Record::Purge(e) => Some(e.ctx.ts_ns),
            Record::Contention(e) => Some(e.ctx.ts_ns),
            Record::Work(e) => Some(e.ctx.ts_ns),
            Record::WorkStart(e) => Some(e.ctx.ts_ns),
            Record::PtPage(e) => Some(e.ctx.ts_ns),
            Record::Latency(e) => Some(e.ctx.ts_ns),
            Record::Meminfo(e) => Some(e.ts_ns),
            Record::Allocinfo(e) => Some(e.ts_ns),
            _ => None,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every live reader moves each record several times (ring to reorder buffer to batch to
    /// model): the largest unboxed variant sets what each move copies. `Work` was boxed when it
    /// made every record 144 bytes, and memmove was then 17 % of `top`'s samples.
    #[test]
    fn a_record_is_no_larger_than_an_allocation() {
        assert!(
            std::mem::size_of::<Record>() <= std::mem::size_of::<Alloc>() + 8,
            "Record is {} bytes: box the variant that grew",
            std::mem::size_of::<Record>()
        );
    }
}
