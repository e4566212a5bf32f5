//! The records of a trace, one per line. `docs/trace-format.md` is the prose version of this file.

use serde::{Deserialize, Serialize};

use super::KAddr;
use crate::host::system::SystemFacts;
use crate::host::tracefs::Field;

/// One line of a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    Header(Box<Header>),
    Vmallocinfo(Box<VmallocSnapshot>),
    Alloc(Alloc),
    Free(Free),
    Purge(Purge),
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
    pub comm: String,
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

/// Why recording stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Duration,
    Sigint,
    Sigterm,
    CommandExited,
    Error,
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
            _ => None,
        }
    }
}
