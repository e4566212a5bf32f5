//! Loads the embedded BPF object with field layouts taken from tracefs, and attaches it.

use std::path::Path;
use std::sync::Mutex;

use aya::{
    maps::{HashMap as AyaHashMap, MapData, PerCpuArray, RingBuf, StackTraceMap},
    programs::{FEntry, FExit, KProbe, RawTracePoint, TracePoint},
    Btf, Ebpf, EbpfLoader,
};
use vmtrace_common::{
    counter, kind, names, AddrRange, FieldLoc, PageFilter, RangeSet, TpLayout, HOLD_CLASSES,
    HOLD_STRIDE, MAX_FIELDS, MAX_ORDER_SLOTS, MAX_RANGES,
};

use super::ladder::{self, Choice, ProgSpec, Rung};
use super::raw::{self, RawPlan};
use crate::host::kallsyms::Kallsyms;

use crate::host::{
    self,
    tracefs::{self, Field, Format},
    HostError,
};
use crate::trace::{LockClass, ProbeInfo, ProbeRunStats};

/// A tracepoint vmtrace attaches to, with the fields it reads in wire order.
#[derive(Debug, Clone, Copy)]
pub struct TracepointSpec {
    pub category: &'static str,
    pub name: &'static str,
    pub program: &'static str,
    pub layout_global: &'static str,
    pub kind: u32,
    /// Field names in the order the probe stores them in `Event::fields`.
    pub fields: &'static [&'static str],
    /// Fields without which the event is meaningless; a kernel lacking them is refused.
    pub required: &'static [&'static str],
}

pub const TRACEPOINTS: [TracepointSpec; 3] = [
    TracepointSpec {
        category: "vmalloc",
        name: "alloc_vmap_area",
        program: names::PROG_ALLOC,
        layout_global: names::ALLOC_LAYOUT,
        kind: kind::ALLOC,
        fields: &["addr", "size", "align", "vstart", "vend", "failed"],
        required: &["addr", "size"],
    },
    TracepointSpec {
        category: "vmalloc",
        name: "free_vmap_area_noflush",
        program: names::PROG_FREE,
        layout_global: names::FREE_LAYOUT,
        kind: kind::FREE,
        fields: &["va_start", "nr_lazy", "nr_lazy_max"],
        required: &["va_start"],
    },
    TracepointSpec {
        category: "vmalloc",
        name: "purge_vmap_area_lazy",
        program: names::PROG_PURGE,
        layout_global: names::PURGE_LAYOUT,
        kind: kind::PURGE,
        fields: &["start", "end", "npurged"],
        required: &["start", "end"],
    },
];

/// The probe object compiled by `build.rs` from `vmtrace-ebpf`.
static PROBES_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/vmtrace"));

/// [`ladder::verify_kprobe_programs`] on the embedded probe object.
pub fn verify_kprobe_programs() -> Result<Vec<(&'static str, String)>, String> {
    ladder::verify_kprobe_programs(PROBES_OBJECT)
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "insufficient privileges to load BPF programs: run as root, or grant CAP_BPF and \
         CAP_PERFMON (e.g. `sudo setcap cap_bpf,cap_perfmon+ep $(which vmtrace)`)"
    )]
    NoPrivilege,
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(
        "tracepoint {tracepoint} lacks the field `{field}` vmtrace needs (kernel format changed?)"
    )]
    MissingField { tracepoint: String, field: String },
    #[error(
        "tracepoint {tracepoint}: field `{field}` at offset {offset} is not aligned to its size \
         {size}; the probe picks fields out of one bulk copy by aligned index"
    )]
    Misaligned {
        tracepoint: String,
        field: String,
        offset: u16,
        size: u8,
    },
    #[error("tracepoint {tracepoint}: field `{field}` has unsupported size {size}")]
    BadFieldSize {
        tracepoint: String,
        field: String,
        size: u8,
    },
    #[error("loading the BPF object failed: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("BPF program {program}: {action} failed: {source}")]
    Program {
        program: String,
        action: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("BPF map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("ring buffer size {0} bytes is not a power of two multiple of the page size")]
    BadRingSize(u64),
}

/// Maps a tracepoint's format onto the probe's wire layout, refusing kernels that lack a
/// required field.
pub fn build_layout(
    spec: &TracepointSpec,
    format: &Format,
) -> Result<(TpLayout, ProbeInfo), ProbeError> {
    let tp = format!("{}:{}", spec.category, spec.name);
    let mut layout = TpLayout::EMPTY;
    let mut fields: Vec<Field> = Vec::new();
    let mut missing = Vec::new();
    for (i, name) in spec.fields.iter().enumerate().take(MAX_FIELDS) {
        match format.field(name) {
            Some(f) => {
                if !matches!(f.size, 1 | 2 | 4 | 8) {
                    return Err(ProbeError::BadFieldSize {
                        tracepoint: tp,
                        field: f.name.clone(),
                        size: f.size,
                    });
                }
                if f.offset % u16::from(f.size) != 0 {
                    return Err(ProbeError::Misaligned {
                        tracepoint: tp,
                        field: f.name.clone(),
                        offset: f.offset,
                        size: f.size,
                    });
                }
                layout.fields[i] = FieldLoc {
                    offset: f.offset,
                    size: f.size,
                    signed: u8::from(f.signed),
                };
                fields.push(f.clone());
            }
            None if spec.required.contains(name) => {
                return Err(ProbeError::MissingField {
                    tracepoint: tp,
                    field: (*name).into(),
                })
            }
            None => missing.push((*name).to_string()),
        }
    }
    let info = ProbeInfo {
        probe: tp,
        rung: "tracepoint".into(),
        program: spec.program.into(),
        fields,
        missing_fields: missing,
        logical: None,
        refused: Vec::new(),
        note: None,
        attach: None,
        attach_fallback: None,
    };
    Ok((layout, info))
}

/// How `ring_bytes` (a power of two) is split over the event rings: one ring per possible CPU
/// up to [`vmtrace_common::RINGS`], each the largest power of two that keeps the total within
/// `ring_bytes`, and never under a page (the kernel's minimum).
pub fn ring_split(ring_bytes: u64, possible_cpus: u32, page: u64) -> (usize, u64) {
    let n = (possible_cpus as usize).clamp(1, vmtrace_common::RINGS);
    let share = (ring_bytes / n as u64).max(1);
    // Largest power of two <= share.
    let each = 1u64 << (63 - share.leading_zeros());
    (n, each.max(page))
}

/// `VMTRACE_LOCK_WALK=always` walks the stack of every lock wait, known address or not: to
/// measure what the walk costs the recorded waits, or should a kernel ever reuse a vmap lock's
/// address for another lock (none does: they are static or per node).
pub const LOCK_WALK_ENV: &str = "VMTRACE_LOCK_WALK";

fn always_walk_locks() -> bool {
    std::env::var(LOCK_WALK_ENV).is_ok_and(|v| v == "always")
}

/// Probes loaded and attached; dropping this detaches them.
pub struct LoadedProbes {
    ebpf: Ebpf,
    pub infos: Vec<ProbeInfo>,
    pub ring_bytes: u64,
    /// Event rings in use (see [`ring_split`]).
    pub nr_rings: usize,
    lost: PerCpuArray<MapData, u64>,
    /// Owned links of the three vmalloc tracepoints; dropping one detaches it.
    links: Vec<Box<dyn std::any::Any>>,
    /// The program attached to each of [`TRACEPOINTS`]: the raw twin or the perf program.
    vmalloc_programs: Vec<&'static str>,
    /// Owned links of the ladder probes, by logical probe; dropping one detaches it.
    optional_links: Vec<(&'static str, Box<dyn std::any::Any>)>,
    /// Raw-attach plans, kept to attach the page probes again ([`Self::set_page_probes`]).
    plans: Vec<RawPlan>,
    /// The programs of the page probes while they are attached, and the kernel's run count
    /// and run time of those programs when they were attached.
    page_programs: Vec<&'static str>,
    page_baseline: (u64, u64),
    /// Holds `BPF_ENABLE_STATS` while the page probes are on, so their cost per event is
    /// measured; the kernel stops counting when it is dropped, whatever way the process ends.
    stats: Option<std::os::fd::OwnedFd>,
    counters: Option<PerCpuArray<MapData, u64>>,
    backing: Option<PerCpuArray<MapData, u64>>,
    /// The hold probe's `HOLD_HIST`.
    holds: Option<PerCpuArray<MapData, u64>>,
    /// The probes' log ring when no runtime polls it ([`start_probe_logger`]): held so that its
    /// fd number is not reused while the programs still name it.
    _idle_logger: Option<IdleLogger>,
    /// vmap locks whose address is known before any wait: `free_vmap_area_lock` from kallsyms.
    static_locks: Vec<(u64, LockClass)>,
    /// Offsets of a `struct vmap_node`'s locks, from kernel BTF: each node's locks are known
    /// once a decay record gives the node's address.
    node_lock_offsets: Vec<(u64, LockClass)>,
    stacks: Option<StackTraceMap<MapData>>,
    /// The lock probe's `KNOWN_LOCKS`; `None` without the map or with
    /// `VMTRACE_LOCK_WALK=always`, when every wait is walked as before the map existed.
    known_locks: Option<Mutex<AyaHashMap<MapData, u64, u32>>>,
    /// Kernel symbols, when readable: stack frames and work functions are resolved with them.
    pub ksyms: Option<Kallsyms>,
    /// The ladder's decision for each logical probe.
    pub choices: Vec<Choice>,
}

/// The probes on the page allocator, toggled together ([`LoadedProbes::set_page_probes`]): on
/// the tracepoint rung they share one program.
pub const PAGE_PROBES: [&str; 2] = ["page_tables", "backing_pages"];

/// A tracepoint of the ladder, with the fields its program reads.
struct LadderTp {
    category: &'static str,
    name: &'static str,
    global: &'static str,
    fields: &'static [&'static str],
}

const LADDER_TPS: [LadderTp; 6] = [
    LadderTp {
        category: "lock",
        name: "contention_begin",
        global: names::LOCK_BEGIN_LAYOUT,
        fields: &["lock_addr", "flags"],
    },
    LadderTp {
        category: "lock",
        name: "contention_end",
        global: names::LOCK_END_LAYOUT,
        fields: &["lock_addr", "ret"],
    },
    LadderTp {
        category: "workqueue",
        name: "workqueue_execute_start",
        global: names::WQ_START_LAYOUT,
        fields: &["work", "function"],
    },
    LadderTp {
        category: "workqueue",
        name: "workqueue_execute_end",
        global: names::WQ_END_LAYOUT,
        fields: &["work", "function"],
    },
    LadderTp {
        category: "kmem",
        name: "mm_page_alloc",
        global: names::PAGE_ALLOC_LAYOUT,
        fields: &["pfn", "order", "gfp_flags"],
    },
    LadderTp {
        category: "csd",
        name: "csd_queue_cpu",
        global: names::CSD_QUEUE_LAYOUT,
        fields: &["cpu", "callsite", "func"],
    },
];

/// The purge's TLB flush, timed for `drain_vmap_area_work` items on the tracepoint rung of
/// `purge_work`: an add-on that attaches only with that rung, and whose failure costs the flush
/// times alone.
const FLUSH_TP: ProgSpec = ProgSpec {
    program: names::PROG_CSD_QUEUE,
    target: "csd:csd_queue_cpu",
    ret: false,
};

/// mm/vmalloc.c functions that take a vmap lock, plus the page-table path under vmap mapping:
/// a contention whose stack holds none of them is dropped in the kernel.
pub const LOCK_FUNCTIONS: [&str; 24] = [
    "alloc_vmap_area",
    "find_vmap_area",
    "find_unlink_vmap_area",
    "find_vmap_area_exceed_addr_lock",
    "free_vmap_area_noflush",
    "purge_vmap_node",
    "__purge_vmap_area_lazy",
    "purge_vmap_area_lazy",
    "decay_va_pool_node",
    "reclaim_list_global",
    "vmap_node_shrink_scan",
    "drain_vmap_area_work",
    "_vm_unmap_aliases",
    "pcpu_get_vm_areas",
    "vread_iter",
    "vmalloc_info_show",
    "vmalloc_dump_obj",
    "insert_vmap_area",
    "vrealloc_node_align_noprof",
    "__pte_alloc_kernel",
    "vmap_small_pages_range_noflush",
    "vmap_range_noflush",
    "__vmap_pages_range_noflush",
    "vmap_pages_range",
];

/// The ring buffer's reserve and submit: contention under them is on the ring buffer's own lock,
/// caused by vmtrace's programs, and is dropped in the kernel (`SELF_RANGES`).
pub const SELF_FUNCTIONS: [&str; 3] = [
    "__bpf_ringbuf_reserve",
    "bpf_ringbuf_reserve",
    "bpf_ringbuf_submit",
];

/// Kernel page-table allocators; the index is the level (0 = PTE … 3 = P4D).
pub const PT_ALLOCATORS: [&str; 4] = [
    "__pte_alloc_kernel",
    "__pmd_alloc",
    "__pud_alloc",
    "__p4d_alloc",
];
/// Functions that map vmalloc space.
pub const VMAP_MAPPERS: [&str; 4] = [
    "vmap_small_pages_range_noflush",
    "vmap_range_noflush",
    "__vmap_pages_range_noflush",
    "vmap_pages_range",
];
/// The vmalloc page-allocation path.
pub const VMALLOC_PAGE_PATH: [&str; 3] = [
    "__vmalloc_node_range_noprof",
    "__vmalloc_area_node",
    "vm_area_alloc_pages",
];
/// Work functions of the purge path (`WORK_FUNCS` order).
pub const WORK_FUNCTIONS: [&str; 2] = ["drain_vmap_area_work", "purge_vmap_node"];
/// The cross-call functions x86's `flush_tlb_kernel_range` queues (`FLUSH_FUNCS` order): a full
/// flush (the usual case, over 33 pages) or a ranged one.
pub const FLUSH_FUNCTIONS: [&str; 2] = ["do_flush_tlb_all", "do_kernel_range_flush"];

/// Builds a filter table from function names; missing functions are skipped (inlined on this
/// build), or kept as empty slots with `keep_slots` so an index keeps its meaning.
pub fn range_set(ksyms: &Kallsyms, functions: &[&str], keep_slots: bool) -> RangeSet {
    let mut set = RangeSet::EMPTY;
    let mut n = 0usize;
    let mut lo = u64::MAX;
    let mut hi = 0u64;
    for f in functions {
        let ranges = ksyms.ranges(f);
        if ranges.is_empty() && keep_slots && n < MAX_RANGES {
            n += 1;
            continue;
        }
        // With keep_slots only the main symbol counts (one slot per function).
        let take = if keep_slots { 1 } else { ranges.len() };
        for (start, end, _) in ranges.into_iter().take(take) {
            if n >= MAX_RANGES {
                log::warn!("filter table full: {f} and later functions are not filtered on");
                break;
            }
            set.ranges[n] = AddrRange { start, end };
            lo = lo.min(start);
            hi = hi.max(end);
            n += 1;
        }
    }
    set.count = n as u32;
    if hi > 0 {
        set.lo = lo;
        set.hi = hi;
    }
    set
}

/// Reads a gfp bit from `mm_page_alloc`'s print format (`… << (8))), "__GFP_ZERO"}`): the bit
/// numbers depend on the kernel configuration.
pub fn gfp_bit(format_text: &str, flag: &str) -> Option<u64> {
    let needle = format!("\"{flag}\"}}");
    let at = format_text.find(&needle)?;
    let before = &format_text[..at];
    let shift_at = before.rfind("<< (")?;
    let digits: String = before[shift_at + 4..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse::<u32>()
        .ok()
        .filter(|b| *b < 64)
        .map(|b| 1u64 << b)
}

/// The page filter from the format text, with the 6.18 bits as fallback.
pub fn page_filter(format_text: Option<&str>) -> PageFilter {
    let bit = |name: &str, default: u32| {
        format_text
            .and_then(|t| gfp_bit(t, name))
            .unwrap_or(1u64 << default)
    };
    let zero = bit("__GFP_ZERO", 8);
    let account = bit("__GFP_ACCOUNT", 22);
    let highmem = bit("__GFP_HIGHMEM", 1);
    let movable = bit("__GFP_MOVABLE", 3);
    PageFilter {
        pt_require: zero,
        pt_exclude: account | highmem,
        back_require: highmem,
        back_exclude: movable,
    }
}

impl LoadedProbes {
    /// Checks privileges, reads the tracepoint formats, loads the object with those layouts and
    /// attaches every program. Any failure is reported with what to do about it.
    /// `wanted` names the optional logical probes to attach (see [`ladder::logical_names`]); the
    /// three vmalloc tracepoints are always attached.
    pub fn load_and_attach(ring_bytes: u64, wanted: &[&str]) -> Result<Self, ProbeError> {
        if !host::system::bpf_capable()? {
            return Err(ProbeError::NoPrivilege);
        }
        let page = host::system::SystemFacts::read()?.page_size;
        if !ring_bytes.is_power_of_two() || ring_bytes < page || ring_bytes > u64::from(u32::MAX) {
            return Err(ProbeError::BadRingSize(ring_bytes));
        }
        raise_memlock();
        let tracefs = tracefs::locate()?;
        Self::load_with(&tracefs, ring_bytes, wanted)
    }

    fn load_with(tracefs: &Path, ring_bytes: u64, wanted: &[&str]) -> Result<Self, ProbeError> {
        let facts = host::system::SystemFacts::read()?;
        let (nr_rings, ring_each) = ring_split(ring_bytes, facts.possible_cpus, facts.page_size);
        let mut layouts = Vec::new();
        let mut infos = Vec::new();
        for spec in &TRACEPOINTS {
            let format = tracefs::read_format(tracefs, spec.category, spec.name)?;
            let (layout, info) = build_layout(spec, &format)?;
            layouts.push((spec.layout_global, layout));
            infos.push(info);
        }
        let ksyms = match Kallsyms::read() {
            Ok(k) => Some(k),
            Err(e) => {
                log::warn!("{e}; the lock, purge-work and page-table probes are off");
                None
            }
        };
        let mut choices = ladder::detect(PROBES_OBJECT, Some(tracefs), ksyms.as_ref());
        for choice in &mut choices {
            if !wanted.contains(&choice.logical.name) {
                choice.rung = Rung::None;
                choice.not_requested = true;
            }
        }

        // Tracepoint-rung inputs: layouts from tracefs, filter tables from kallsyms.
        let mut tp_missing: Vec<(String, String)> = Vec::new();
        let mut ladder_fields: Vec<(String, Vec<Field>)> = Vec::new();
        let mut page_format_text = None;
        for tp in &LADDER_TPS {
            let id = format!("{}:{}", tp.category, tp.name);
            match tracefs::read_format(tracefs, tp.category, tp.name) {
                Ok(format) => {
                    let mut layout = TpLayout::EMPTY;
                    let mut fields = Vec::new();
                    for (i, name) in tp.fields.iter().enumerate() {
                        match format
                            .field(name)
                            .filter(|f| matches!(f.size, 1 | 2 | 4 | 8))
                        {
                            Some(f) => {
                                layout.fields[i] = FieldLoc {
                                    offset: f.offset,
                                    size: f.size,
                                    signed: u8::from(f.signed),
                                };
                                fields.push(f.clone());
                            }
                            None => tp_missing.push((id.clone(), format!("{id} lacks `{name}`"))),
                        }
                    }
                    layouts.push((tp.global, layout));
                    ladder_fields.push((id.clone(), fields));
                    if tp.category == "kmem" {
                        let path = tracefs.join("events/kmem/mm_page_alloc/format");
                        page_format_text = std::fs::read_to_string(path).ok();
                    }
                }
                Err(e) => tp_missing.push((id, e.to_string())),
            }
        }
        if ksyms.is_none() {
            for tp in &LADDER_TPS {
                tp_missing.push((
                    format!("{}:{}", tp.category, tp.name),
                    "no kernel symbols for the in-kernel filter".into(),
                ));
            }
        }

        // Raw attach: argument slots and struct offsets from kernel BTF.
        let kbtf = crate::host::btf::KernelBtf::read().map_err(|e| e.to_string());
        let work_func_offset = kbtf
            .as_ref()
            .ok()
            .and_then(|b| b.member_offset("work_struct", "func"));
        // The richer purge rungs see `&vn->purge_work`, not `vn`: the offset they read at is
        // `nr_purged`'s relative to that member (wrapping if it comes first).
        let nr_purged_offset = kbtf.as_ref().ok().and_then(|b| {
            let nr_purged = b.member_offset("vmap_node", "nr_purged")?;
            let work = b.member_offset("vmap_node", "purge_work")?;
            Some(nr_purged.wrapping_sub(work))
        });
        let plans = raw::plan(
            kbtf.as_ref().map_err(String::as_str),
            work_func_offset,
            raw::perf_forced(),
        );

        let mut loader = EbpfLoader::new();
        for (global, layout) in &layouts {
            loader.override_global(global, layout, true);
        }
        let raw_layouts: Vec<(&str, TpLayout)> = plans
            .iter()
            .map(|p| {
                let layout = p.layout.clone().unwrap_or(TpLayout::EMPTY);
                (p.twin.layout_global, layout)
            })
            .collect();
        for (global, layout) in &raw_layouts {
            loader.override_global(global, layout, true);
        }
        let raw_direct = raw::direct_bits(&plans);
        loader.override_global(names::RAW_DIRECT, &raw_direct, true);
        let work_func_offset_value = work_func_offset.unwrap_or(u64::MAX);
        let nr_purged_offset_value = nr_purged_offset.unwrap_or(u64::MAX);
        loader.override_global(names::WORK_FUNC_OFFSET, &work_func_offset_value, true);
        loader.override_global(names::NR_PURGED_OFFSET, &nr_purged_offset_value, true);
        let empty = RangeSet::EMPTY;
        let self_ranges = ksyms
            .as_ref()
            .map_or(RangeSet::EMPTY, |k| range_set(k, &SELF_FUNCTIONS, false));
        let flush_funcs = ksyms.as_ref().map_or([0; 2], |k| {
            FLUSH_FUNCTIONS.map(|f| k.addr_of(f).unwrap_or(0))
        });
        loader.override_global(names::FLUSH_FUNCS, &flush_funcs, true);
        let decay_func = ksyms
            .as_ref()
            .and_then(|k| k.addr_of(ladder::DECAY_FUNCTION))
            .unwrap_or(0);
        loader.override_global(names::DECAY_FUNC, &decay_func, true);
        let (lock_ranges, pt_ranges, map_ranges, page_ranges, work_funcs) = match &ksyms {
            Some(k) => {
                let pt_on_tracepoint = choices
                    .iter()
                    .any(|c| c.logical.name == "page_tables" && c.rung == Rung::Tracepoint);
                (
                    range_set(k, &LOCK_FUNCTIONS, false),
                    // A richer page-table rung reports those pages itself: no duplicates.
                    if pt_on_tracepoint {
                        range_set(k, &PT_ALLOCATORS, true)
                    } else {
                        RangeSet::EMPTY
                    },
                    range_set(k, &VMAP_MAPPERS, false),
                    range_set(k, &VMALLOC_PAGE_PATH, false),
                    drain_only_work_funcs(
                        WORK_FUNCTIONS.map(|f| k.addr_of(f).unwrap_or(0)),
                        choices
                            .iter()
                            .any(|c| c.logical.name == "purge_work" && c.rung == Rung::Tracepoint),
                    ),
                )
            }
            None => (empty, empty, empty, empty, [0; 2]),
        };
        let filter = page_filter(page_format_text.as_deref());
        loader.override_global(names::LOCK_RANGES, &lock_ranges, true);
        loader.override_global(names::SELF_RANGES, &self_ranges, true);
        loader.override_global(names::PT_ALLOC_RANGES, &pt_ranges, true);
        loader.override_global(names::VMAP_MAP_RANGES, &map_ranges, true);
        loader.override_global(names::VMALLOC_PAGE_RANGES, &page_ranges, true);
        loader.override_global(names::WORK_FUNCS, &work_funcs, true);
        loader.override_global(names::PAGE_FILTER, &filter, true);
        // Checked above to fit; the rings past `nr_rings` are never reserved in: one page.
        for (i, name) in names::EVENT_RINGS.iter().enumerate() {
            let bytes = if i < nr_rings {
                ring_each
            } else {
                facts.page_size
            };
            loader.map_max_entries(name, bytes as u32);
        }
        let nr_rings_value = nr_rings as u32;
        let wakeup_bytes = (ring_each / 16).max(facts.page_size);
        loader.override_global(names::NR_RINGS, &nr_rings_value, true);
        loader.override_global(names::WAKEUP_BYTES, &wakeup_bytes, true);
        let mut ebpf = loader
            .load(PROBES_OBJECT)
            .map_err(|e| classify_load_error(Box::new(e)))?;
        let idle_logger = start_probe_logger(&mut ebpf);
        let mut links: Vec<Box<dyn std::any::Any>> = Vec::new();
        let mut vmalloc_programs = Vec::new();
        for (spec, info) in TRACEPOINTS.iter().zip(infos.iter_mut()) {
            let (link, how) = attach_tracepoint(
                &mut ebpf,
                spec.program,
                &format!("{}:{}", spec.category, spec.name),
                &plans,
            )
            .map_err(|(action, e)| ProbeError::Program {
                program: spec.program.into(),
                action,
                source: Box::new(e),
            })?;
            log::info!(
                "attached {} to tracepoint {}:{} ({})",
                spec.program,
                spec.category,
                spec.name,
                how.name()
            );
            how.describe(info);
            links.push(link);
            let program = how.program(spec.program);
            info.program = program.into();
            vmalloc_programs.push(program);
        }

        // The ladder probes: optional, so a failure is reported, never fatal.
        let btf = Btf::from_sys_fs().ok();
        let mut optional_links: Vec<(&'static str, Box<dyn std::any::Any>)> = Vec::new();
        let mut attached_tps: Vec<&'static str> = Vec::new();
        let mut attach_how: Vec<(&'static str, Attached)> = Vec::new();
        let mut page_programs = Vec::new();
        for choice in &mut choices {
            let progs = ladder::rung_programs(choice);
            if choice.rung == Rung::Tracepoint {
                let missing: Vec<String> = progs
                    .iter()
                    .flat_map(|p| {
                        tp_missing
                            .iter()
                            .filter(move |(id, _)| id == p.target)
                            .map(|(_, why)| why.clone())
                    })
                    .collect();
                if !missing.is_empty() {
                    choice.refused.push((Rung::Tracepoint, missing.join("; ")));
                    choice.rung = Rung::None;
                    continue;
                }
            }
            let mut new_links = Vec::new();
            let mut failure = None;
            for spec in progs {
                if attached_tps.contains(&spec.program) {
                    continue;
                }
                match attach_one(
                    &mut ebpf,
                    choice.rung,
                    spec,
                    btf.as_ref(),
                    ksyms.as_ref(),
                    &plans,
                ) {
                    Ok((link, how)) => {
                        let program = how
                            .as_ref()
                            .map_or(spec.program, |h| h.program(spec.program));
                        if let Some(how) = how {
                            attach_how.push((spec.target, how));
                        }
                        new_links.push((spec.program, program, link))
                    }
                    Err(why) => {
                        failure = Some(why);
                        break;
                    }
                }
            }
            match failure {
                None => {
                    for (program, running, link) in new_links {
                        if choice.rung == Rung::Tracepoint {
                            attached_tps.push(program);
                        }
                        if PAGE_PROBES.contains(&choice.logical.name) {
                            page_programs.push(running);
                        }
                        optional_links.push((choice.logical.name, link));
                    }
                }
                Some(why) => {
                    log::warn!(
                        "probe {} ({} rung) could not attach: {why}",
                        choice.logical.name,
                        choice.rung.name()
                    );
                    choice.refused.push((choice.rung, why));
                    choice.rung = Rung::None;
                }
            }
        }
        // Drain items (when each purge started) and their TLB flush: the tracepoint rung has
        // the items already; a richer rung records per-node calls instead, so the workqueue
        // tracepoints are added for the items alone (`WORK_FUNCS` then holds only the drain
        // function).
        let purge_rung = choices
            .iter()
            .find(|c| c.logical.name == "purge_work")
            .map_or(Rung::None, |c| c.rung);
        let mut drain_notes: Vec<String> = Vec::new();
        let items = match purge_rung {
            Rung::Tracepoint => Some(Ok(())),
            Rung::Fentry | Rung::Kprobe => {
                let purge_work = ladder::LOGICAL.iter().find(|l| l.name == "purge_work");
                let specs = purge_work.map_or(&[][..], |l| l.tracepoint);
                let attached = attach_addons(
                    &mut ebpf,
                    specs,
                    &tp_missing,
                    btf.as_ref(),
                    ksyms.as_ref(),
                    &plans,
                );
                Some(attached.map(|new_links| {
                    optional_links
                        .extend(new_links.into_iter().map(|(link, _)| ("purge_work", link)));
                    drain_notes.push("drain items from the workqueue tracepoints".into());
                }))
            }
            Rung::None => None,
        };
        match items {
            Some(Ok(())) => {
                let flush = attach_flush(
                    &mut ebpf,
                    &tp_missing,
                    flush_funcs,
                    btf.as_ref(),
                    ksyms.as_ref(),
                    &plans,
                );
                drain_notes.push(match flush {
                    Ok((link, how)) => {
                        optional_links.push(("purge_work", link));
                        format!(
                            "drain items timed at their TLB flush ({}, {})",
                            FLUSH_TP.target,
                            how.map_or("?", |h| h.name())
                        )
                    }
                    Err(why) => {
                        log::warn!("purge_work: no TLB-flush times: {why}");
                        format!("no TLB-flush times: {why}")
                    }
                });
            }
            Some(Err(why)) => {
                log::warn!("purge_work: no drain items: {why}");
                drain_notes.push(format!("no drain items: {why}"));
            }
            None => {}
        }
        let flush_note = (!drain_notes.is_empty()).then(|| drain_notes.join("; "));
        for choice in &choices {
            if choice.rung == Rung::None
                && choice.logical.name != "alloc_latency"
                && !choice.not_requested
            {
                eprintln!(
                    "vmtrace: warning: probe {} is off: {}",
                    choice.logical.name,
                    choice
                        .refused
                        .iter()
                        .map(|(r, why)| format!("{}: {why}", r.name()))
                        .collect::<Vec<_>>()
                        .join("; ")
                );
            }
            let mut info = ladder_info(choice, &ladder_fields, ksyms.as_ref());
            if choice.rung == Rung::Tracepoint {
                let progs = choice.logical.tracepoint;
                // One entry per logical probe: perf if any of its tracepoints fell back.
                let hows: Vec<(&ProgSpec, &Attached)> = progs
                    .iter()
                    .filter_map(|p| {
                        let (_, how) = attach_how.iter().find(|(t, _)| *t == p.target)?;
                        Some((p, how))
                    })
                    .collect();
                let perf = hows.iter().find(|(_, h)| matches!(h, Attached::Perf(_)));
                if let Some((_, how)) = perf.or(hows.first()) {
                    how.describe(&mut info);
                    info.program = hows
                        .iter()
                        .map(|(p, h)| h.program(p.program))
                        .collect::<Vec<_>>()
                        .join("+");
                }
            }
            if choice.logical.name == "purge_work" {
                if let Some(extra) = &flush_note {
                    info.note = Some(match info.note.take() {
                        Some(n) => format!("{n}; {extra}"),
                        None => extra.clone(),
                    });
                }
            }
            infos.push(info);
        }

        let lost_map = ebpf.take_map(names::LOST).ok_or(ProbeError::Map {
            map: names::LOST,
            source: Box::new(aya::maps::MapError::InvalidName {
                name: names::LOST.into(),
            }),
        })?;
        let lost = PerCpuArray::try_from(lost_map).map_err(|e| ProbeError::Map {
            map: names::LOST,
            source: Box::new(e),
        })?;
        let counters = ebpf
            .take_map(names::COUNTERS)
            .and_then(|m| PerCpuArray::try_from(m).ok());
        let backing = ebpf
            .take_map(names::BACKING_ORDERS)
            .and_then(|m| PerCpuArray::try_from(m).ok());
        let holds = ebpf
            .take_map(names::HOLD_HIST)
            .and_then(|m| PerCpuArray::try_from(m).ok());
        let static_locks = ksyms
            .as_ref()
            .and_then(|k| k.data_addr("free_vmap_area_lock"))
            .map(|a| vec![(a, LockClass::FreeAreaLock)])
            .unwrap_or_default();
        let node_lock_offsets = kbtf
            .as_ref()
            .ok()
            .map(vmap_node_lock_offsets)
            .unwrap_or_default();
        let stacks = ebpf
            .take_map(names::STACKS)
            .and_then(|m| StackTraceMap::try_from(m).ok());
        let known_locks = if always_walk_locks() {
            None
        } else {
            ebpf.take_map(names::KNOWN_LOCKS)
                .and_then(|m| AyaHashMap::try_from(m).ok())
                .map(Mutex::new)
        };
        Ok(Self {
            ebpf,
            _idle_logger: idle_logger,
            infos,
            ring_bytes: nr_rings as u64 * ring_each,
            nr_rings,
            lost,
            links,
            vmalloc_programs,
            optional_links,
            plans,
            page_programs,
            page_baseline: (0, 0),
            stats: None,
            counters,
            backing,
            holds,
            static_locks,
            node_lock_offsets,
            stacks,
            known_locks,
            ksyms,
            choices,
        })
    }

    /// Tells the lock probe to keep waits on `lock` without walking the waiter's stack. A
    /// failed insert (map full) only means those waits stay walked.
    pub fn mark_known_lock(&self, lock: u64, class: LockClass) {
        if let Some(m) = &self.known_locks {
            if let Ok(mut m) = m.lock() {
                let code = LockClass::ALL.iter().position(|&c| c == class).unwrap_or(0) as u32;
                let _ = m.insert(lock, code, 0);
            }
        }
    }

    /// vmap lock addresses known without a wait (`free_vmap_area_lock`).
    pub fn static_locks(&self) -> &[(u64, LockClass)] {
        &self.static_locks
    }

    /// The locks of the `struct vmap_node` at `vn` (a decay record's `work`).
    pub fn node_locks(&self, vn: u64) -> impl Iterator<Item = (u64, LockClass)> + '_ {
        self.node_lock_offsets
            .iter()
            .map(move |&(off, class)| (vn.wrapping_add(off), class))
    }

    /// Frames of a kernel stack id, innermost first, as `symbol+0xoff`.
    pub fn stack_frames(&self, stack_id: i64) -> Option<Vec<String>> {
        let id = u32::try_from(stack_id).ok()?;
        let trace = self.stacks.as_ref()?.get(&id, 0).ok()?;
        let k = self.ksyms.as_ref();
        let frames: Vec<String> = trace
            .frames()
            .iter()
            .map(|f| match k {
                Some(k) => k.format(f.ip),
                None => format!("{:#x}", f.ip),
            })
            .collect();
        Some(strip_bpf_frames(frames))
    }

    /// Sum over CPUs of one `COUNTERS` slot.
    pub fn counter(&self, index: u32) -> u64 {
        self.counters
            .as_ref()
            .and_then(|m| m.get(&index, 0).ok())
            .map(|v| v.iter().sum())
            .unwrap_or(0)
    }

    /// The backing-page order histogram, summed over CPUs.
    pub fn backing_orders(&self) -> Vec<u64> {
        (0..MAX_ORDER_SLOTS)
            .map(|o| {
                self.backing
                    .as_ref()
                    .and_then(|m| m.get(&o, 0).ok())
                    .map(|v| v.iter().sum())
                    .unwrap_or(0)
            })
            .collect()
    }

    /// The hold probe's histogram, summed over CPUs; empty without the map.
    pub fn hold_hist(&self) -> Vec<u64> {
        let Some(m) = &self.holds else {
            return Vec::new();
        };
        (0..HOLD_CLASSES * HOLD_STRIDE)
            .map(|i| m.get(&i, 0).map(|v| v.iter().sum()).unwrap_or(0))
            .collect()
    }

    /// The counters the footer reports, by `vmtrace_common::counter` index.
    pub fn stack_map_failures(&self) -> u64 {
        self.counter(counter::STACK_MAP_FAIL)
    }

    /// Detaches every program but keeps them loaded, so no event is produced after this while
    /// the run counts and lost counters can still be read and the ring buffer drained: the
    /// footer then balances exactly.
    pub fn detach(&mut self) {
        self.optional_links.clear();
        self.links.clear();
        self.page_programs.clear();
    }

    /// Whether the page probes ([`PAGE_PROBES`]) are attached now.
    pub fn page_probes_on(&self) -> bool {
        !self.page_programs.is_empty()
    }

    /// Attaches or detaches the page probes ([`PAGE_PROBES`]) while the others run: they hook
    /// the page allocator, which every part of the kernel calls, so `top` keeps them off until
    /// asked. Their rung and filters were settled at load, so they must have been wanted then;
    /// otherwise, or when no rung attached, says why. Attaching also starts the kernel's run
    /// statistics ([`Self::page_probe_cost`]), held until they are detached.
    pub fn set_page_probes(&mut self, on: bool) -> Result<(), String> {
        if !on {
            self.optional_links
                .retain(|(logical, _)| !PAGE_PROBES.contains(logical));
            self.page_programs.clear();
            self.stats = None;
            return Ok(());
        }
        if !self.page_probes_on() {
            let choices: Vec<Choice> = self
                .choices
                .iter()
                .filter(|c| PAGE_PROBES.contains(&c.logical.name))
                .cloned()
                .collect();
            let usable: Vec<&Choice> = choices.iter().filter(|c| c.rung != Rung::None).collect();
            if usable.is_empty() {
                let why: Vec<String> = choices
                    .iter()
                    .map(|c| {
                        let refused: Vec<String> =
                            c.refused.iter().map(|(_, why)| why.clone()).collect();
                        match (c.not_requested, refused.is_empty()) {
                            (true, _) => format!("{}: not loaded", c.logical.name),
                            (false, true) => format!("{}: no rung", c.logical.name),
                            (false, false) => format!("{}: {}", c.logical.name, refused.join("; ")),
                        }
                    })
                    .collect();
                return Err(if why.is_empty() {
                    "no page probe in this object".into()
                } else {
                    why.join("; ")
                });
            }
            let btf = Btf::from_sys_fs().ok();
            let mut links = Vec::new();
            let mut programs: Vec<&'static str> = Vec::new();
            let mut seen: Vec<&'static str> = Vec::new();
            for choice in usable {
                for spec in ladder::rung_programs(choice) {
                    if seen.contains(&spec.program) {
                        continue;
                    }
                    let (link, how) = attach_one(
                        &mut self.ebpf,
                        choice.rung,
                        spec,
                        btf.as_ref(),
                        self.ksyms.as_ref(),
                        &self.plans,
                    )?;
                    seen.push(spec.program);
                    programs.push(
                        how.as_ref()
                            .map_or(spec.program, |h| h.program(spec.program)),
                    );
                    links.push((choice.logical.name, link));
                }
            }
            self.optional_links.extend(links);
            self.page_programs = programs;
        }
        if self.stats.is_none() {
            self.stats = Some(
                aya::sys::enable_stats(aya::sys::Stats::RunTime)
                    .map_err(|e| format!("BPF_ENABLE_STATS: {e}"))?,
            );
            self.page_baseline = self.page_runs();
        }
        Ok(())
    }

    /// Runs and run time of the page probes' programs, as the kernel counts them.
    fn page_runs(&self) -> (u64, u64) {
        self.page_programs
            .iter()
            .filter_map(|p| self.ebpf.program(p)?.info().ok())
            .fold((0, 0), |(n, t), i| {
                let ns = u64::try_from(i.run_time().as_nanos()).unwrap_or(u64::MAX);
                (n + i.run_count(), t.saturating_add(ns))
            })
    }

    /// The page probes' program runs and the nanoseconds they took since they were attached by
    /// [`Self::set_page_probes`]; `None` while they are off or unmeasured.
    pub fn page_probe_cost(&self) -> Option<(u64, u64)> {
        self.stats.as_ref()?;
        let (n, t) = self.page_runs();
        Some((
            n.saturating_sub(self.page_baseline.0),
            t.saturating_sub(self.page_baseline.1),
        ))
    }

    /// Takes the event rings in use, CPU `c`'s being number `c % nr_rings`; call once.
    pub fn take_rings(&mut self) -> Result<Vec<RingBuf<MapData>>, ProbeError> {
        names::EVENT_RINGS[..self.nr_rings]
            .iter()
            .map(|&name| {
                let map = self.ebpf.take_map(name).ok_or(ProbeError::Map {
                    map: names::EVENTS,
                    source: Box::new(aya::maps::MapError::InvalidName { name: name.into() }),
                })?;
                RingBuf::try_from(map).map_err(|e| ProbeError::Map {
                    map: names::EVENTS,
                    source: Box::new(e),
                })
            })
            .collect()
    }

    /// The kernel's own count of program runs, i.e. tracepoint hits, per probe. Only meaningful
    /// while `kernel.bpf_stats_enabled` is 1; `None` otherwise. Comparing it with events received
    /// plus events lost checks the whole pipeline against the kernel.
    pub fn run_stats(&self) -> Option<Vec<ProbeRunStats>> {
        if !bpf_stats_enabled() {
            return None;
        }
        TRACEPOINTS
            .iter()
            .zip(&self.vmalloc_programs)
            .map(|(spec, program)| {
                let info = self.ebpf.program(program)?.info().ok()?;
                Some(ProbeRunStats {
                    probe: format!("{}:{}", spec.category, spec.name),
                    run_count: info.run_count(),
                    run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                })
            })
            .collect()
    }

    /// Reserve failures so far: `[kind][cpu]`, indexed by `vmtrace_common::kind` (every kind,
    /// the ladder's included).
    pub fn lost(&self) -> Result<Vec<Vec<u64>>, ProbeError> {
        (0..kind::COUNT)
            .map(|k| {
                self.lost
                    .get(&k, 0)
                    .map(|v| v.iter().copied().collect())
                    .map_err(|e| ProbeError::Map {
                        map: names::LOST,
                        source: Box::new(e),
                    })
            })
            .collect()
    }
}

/// Loads and attaches one program of a ladder rung; returns its owned link.
/// The work functions the workqueue programs report: both on the tracepoint rung of
/// `purge_work`; only `drain_vmap_area_work` when a richer rung reports `purge_vmap_node`
/// itself (per node, with `nr_purged`), so that no call is recorded twice.
fn drain_only_work_funcs(funcs: [u64; 2], purge_on_tracepoint: bool) -> [u64; 2] {
    if purge_on_tracepoint {
        funcs
    } else {
        [funcs[0], 0]
    }
}

/// A link of an add-on program, and how its tracepoint attached.
type AddonLink = (Box<dyn std::any::Any>, Option<Attached>);

/// Attaches tracepoint programs outside their logical probe's rung (all or none), or says why
/// not.
fn attach_addons(
    ebpf: &mut Ebpf,
    specs: &[ProgSpec],
    tp_missing: &[(String, String)],
    btf: Option<&Btf>,
    ksyms: Option<&Kallsyms>,
    plans: &[RawPlan],
) -> Result<Vec<AddonLink>, String> {
    let mut links = Vec::new();
    for spec in specs {
        if let Some((_, why)) = tp_missing.iter().find(|(id, _)| id == spec.target) {
            return Err(why.clone());
        }
        links.push(attach_one(ebpf, Rung::Tracepoint, spec, btf, ksyms, plans)?);
    }
    Ok(links)
}

/// Attaches [`FLUSH_TP`], or says why not.
fn attach_flush(
    ebpf: &mut Ebpf,
    tp_missing: &[(String, String)],
    funcs: [u64; 2],
    btf: Option<&Btf>,
    ksyms: Option<&Kallsyms>,
    plans: &[RawPlan],
) -> Result<AddonLink, String> {
    if funcs == [0; 2] {
        return Err(format!(
            "neither of {} in kallsyms",
            FLUSH_FUNCTIONS.join(", ")
        ));
    }
    let mut links = attach_addons(ebpf, &[FLUSH_TP], tp_missing, btf, ksyms, plans)?;
    links.pop().ok_or_else(|| "nothing attached".to_string())
}

fn attach_one(
    ebpf: &mut Ebpf,
    rung: Rung,
    spec: &ProgSpec,
    btf: Option<&Btf>,
    ksyms: Option<&Kallsyms>,
    plans: &[RawPlan],
) -> Result<(Box<dyn std::any::Any>, Option<Attached>), String> {
    if rung == Rung::Tracepoint {
        return attach_tracepoint(ebpf, spec.program, spec.target, plans)
            .map(|(link, how)| (link, Some(how)))
            .map_err(|(action, e)| {
                ladder::describe_error(&format!("{action} {} on {}", spec.program, spec.target), &e)
            });
    }
    let target = ladder::resolve_target(spec.target, ksyms);
    let prog = ebpf
        .program_mut(spec.program)
        .ok_or_else(|| format!("program {} missing from the object", spec.program))?;
    let err = |action: &str, e: &(dyn std::error::Error + 'static)| {
        ladder::describe_error(&format!("{action} {} on {target}", spec.program), e)
    };
    match rung {
        Rung::Fentry => {
            let btf = btf.ok_or_else(|| "no kernel BTF".to_string())?;
            if spec.ret {
                let p: &mut FExit = prog.try_into().map_err(|e| err("type check", &e))?;
                if p.fd().is_err() {
                    p.load(&target, btf).map_err(|e| err("load", &e))?;
                }
                let id = p.attach().map_err(|e| err("attach", &e))?;
                let link: Box<dyn std::any::Any> =
                    Box::new(p.take_link(id).map_err(|e| err("link", &e))?);
                Ok(link)
            } else {
                let p: &mut FEntry = prog.try_into().map_err(|e| err("type check", &e))?;
                if p.fd().is_err() {
                    p.load(&target, btf).map_err(|e| err("load", &e))?;
                }
                let id = p.attach().map_err(|e| err("attach", &e))?;
                let link: Box<dyn std::any::Any> =
                    Box::new(p.take_link(id).map_err(|e| err("link", &e))?);
                Ok(link)
            }
        }
        Rung::Kprobe => {
            let p: &mut KProbe = prog.try_into().map_err(|e| err("type check", &e))?;
            if p.fd().is_err() {
                p.load().map_err(|e| err("load", &e))?;
            }
            let id = p.attach(&target, 0).map_err(|e| err("attach", &e))?;
            let link: Box<dyn std::any::Any> =
                Box::new(p.take_link(id).map_err(|e| err("link", &e))?);
            Ok(link)
        }
        // The tracepoint rung returned above.
        Rung::Tracepoint | Rung::None => Err("no rung".into()),
    }
    .map(|link| (link, None))
}

/// Drops the frames a raw tracepoint program's stack starts with (the program, shown as an
/// address past the kernel text, and `bpf_trace_run<N>`), so that every rung's stacks start at
/// the tracepoint's call site, as a perf tracepoint's do, and the classifier's "first frame
/// that is not a lock primitive" is the acquirer. Found by name, not by a fixed count: how many
/// frames the tracing glue adds depends on the kernel build.
pub fn strip_bpf_frames(mut frames: Vec<String>) -> Vec<String> {
    let glue = frames
        .iter()
        .take(vmtrace_common::RAW_EXTRA_FRAMES + 4)
        .rposition(|f| f.starts_with("bpf_trace_run"));
    if let Some(last) = glue {
        frames.drain(..=last);
    }
    frames
}

/// A program's link; dropping it detaches the program.
type OwnedLink = Box<dyn std::any::Any>;

/// How a tracepoint program attached.
#[derive(Debug, Clone)]
enum Attached {
    Raw,
    /// As a perf tracepoint; with the reason when a raw attach was wanted.
    Perf(Option<String>),
}

impl Attached {
    fn name(&self) -> &'static str {
        match self {
            Attached::Raw => "raw_tp",
            Attached::Perf(_) => "perf",
        }
    }

    /// The program that attached in place of the perf tracepoint program `perf_program`.
    fn program(&self, perf_program: &'static str) -> &'static str {
        match (self, raw::twin_of(perf_program)) {
            (Attached::Raw, Some(twin)) => twin.raw_program,
            _ => perf_program,
        }
    }

    fn describe(&self, info: &mut ProbeInfo) {
        info.attach = Some(self.name().into());
        if let Attached::Perf(why) = self {
            info.attach_fallback = why.clone();
        }
    }
}

/// Attaches the program of tracepoint `target` (`category:name`): its raw twin where the plan
/// has a layout for it and the kernel takes it, the perf tracepoint program otherwise.
fn attach_tracepoint(
    ebpf: &mut Ebpf,
    perf_program: &'static str,
    target: &str,
    plans: &[RawPlan],
) -> Result<(OwnedLink, Attached), (&'static str, aya::programs::ProgramError)> {
    let (category, name) = target.split_once(':').unwrap_or(("", target));
    let plan = plans.iter().find(|p| p.twin.perf_program == perf_program);
    let why_perf = match plan.map(|p| &p.layout) {
        None => None,
        Some(Err(why)) => Some(why.clone()),
        Some(Ok(_)) => {
            let raw_program = plan.map_or("", |p| p.twin.raw_program);
            match attach_raw(ebpf, raw_program, name) {
                Ok(link) => return Ok((link, Attached::Raw)),
                Err(e) => {
                    log::warn!("raw tracepoint {name}: {e}; attaching the perf tracepoint");
                    Some(format!("raw attach failed: {e}"))
                }
            }
        }
    };
    let missing = || aya::programs::ProgramError::UnexpectedProgramType;
    let p: &mut TracePoint = ebpf
        .program_mut(perf_program)
        .ok_or(("lookup", missing()))?
        .try_into()
        .map_err(|e| ("type check", e))?;
    // Loaded already when the page probes are attached again.
    if p.fd().is_err() {
        p.load().map_err(|e| ("verifier load", e))?;
    }
    let id = p.attach(category, name).map_err(|e| ("attach", e))?;
    let link = p.take_link(id).map_err(|e| ("link", e))?;
    Ok((Box::new(link), Attached::Perf(why_perf)))
}

fn attach_raw(
    ebpf: &mut Ebpf,
    program: &str,
    name: &str,
) -> Result<Box<dyn std::any::Any>, aya::programs::ProgramError> {
    let p: &mut RawTracePoint = ebpf
        .program_mut(program)
        .ok_or(aya::programs::ProgramError::UnexpectedProgramType)?
        .try_into()?;
    if p.fd().is_err() {
        p.load()?;
    }
    let id = p.attach(name)?;
    Ok(Box::new(p.take_link(id)?))
}

/// The header entry of one logical probe.
fn ladder_info(
    choice: &Choice,
    fields: &[(String, Vec<Field>)],
    ksyms: Option<&Kallsyms>,
) -> ProbeInfo {
    let progs = ladder::rung_programs(choice);
    let targets: Vec<String> = progs
        .iter()
        .map(|p| ladder::resolve_target(p.target, ksyms))
        .collect();
    let mut dedup = targets.clone();
    dedup.dedup();
    let probe = if dedup.is_empty() {
        choice.logical.name.to_string()
    } else {
        dedup.join("+")
    };
    let used_fields = if choice.rung == Rung::Tracepoint {
        fields
            .iter()
            .filter(|(id, _)| targets.contains(id))
            .flat_map(|(_, f)| f.iter().cloned())
            .collect()
    } else {
        Vec::new()
    };
    let note = match choice.rung {
        Rung::Tracepoint => choice.logical.tracepoint_note.map(String::from),
        Rung::None if choice.not_requested => Some(ladder::NOT_REQUESTED.into()),
        Rung::None if choice.logical.tracepoint.is_empty() => {
            choice.logical.tracepoint_note.map(String::from)
        }
        _ => None,
    };
    ProbeInfo {
        probe,
        rung: choice.rung.name().into(),
        program: progs
            .iter()
            .map(|p| p.program)
            .collect::<Vec<_>>()
            .join("+"),
        fields: used_fields,
        missing_fields: Vec::new(),
        logical: Some(choice.logical.name.into()),
        refused: choice
            .refused
            .iter()
            .map(|(r, why)| crate::trace::RungRefusal {
                rung: r.name().into(),
                reason: why.clone(),
            })
            .collect(),
        note,
        attach: None,
        attach_fallback: None,
    }
}

/// `kernel.bpf_stats_enabled`: whether the kernel counts program runs and run time.
pub fn bpf_stats_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .map(|v| v.trim() == "1")
        .unwrap_or(false)
}

/// EPERM from the kernel at load time means privileges even when the capability check passed
/// (e.g. a LSM or a user namespace); say so instead of printing a verifier dump.
fn classify_load_error(e: Box<aya::EbpfError>) -> ProbeError {
    let text = format!("{e:?}");
    if text.contains("EPERM") || text.contains("Operation not permitted") {
        ProbeError::NoPrivilege
    } else {
        ProbeError::Load(e)
    }
}

/// RLIMIT_MEMLOCK only matters on kernels before 5.11 (BPF memory is charged to the memory cgroup
/// since); failing to raise it, e.g. without CAP_SYS_RESOURCE, is not fatal.
fn raise_memlock() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a caller-owned struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        log::debug!(
            "could not raise RLIMIT_MEMLOCK ({}); fine on kernels >= 5.11",
            std::io::Error::last_os_error()
        );
    }
}

/// The probes' log ring when no runtime polls it: kept, unread, for as long as the probes.
type IdleLogger = aya_log::EbpfLogger<&'static dyn log::Log>;

/// Forwards aya-log records from the probes (error paths only) to the `log` facade.
///
/// `EbpfLogger::init` takes the log ring out of `ebpf`, and every program that logs still names
/// it by its fd number until the program is loaded. Dropping the logger before then closes that
/// fd: the number dangles, and the next file or map opened takes it. The verifier then refused
/// the first program ("fd N is not pointing to valid bpf_map") in a process without a tokio
/// runtime, or, had a map taken the number, the program would have logged into that map. So
/// a logger that no runtime polls is returned, and the caller keeps it as long as the probes.
fn start_probe_logger(ebpf: &mut Ebpf) -> Option<IdleLogger> {
    let logger = match aya_log::EbpfLogger::init(ebpf) {
        Ok(logger) => logger,
        Err(e) => {
            log::debug!("probe logger unavailable: {e}");
            return None;
        }
    };
    if tokio::runtime::Handle::try_current().is_err() {
        log::debug!("no tokio runtime: probe log records are not forwarded");
        return Some(logger);
    }
    // SAFETY: the logger owns its ring-buffer fd and keeps it open while the AsyncFd (which
    // owns the logger) is registered.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
    };
    match registered {
        Ok(mut fd) => {
            tokio::spawn(async move {
                loop {
                    let Ok(mut guard) = fd.readable_mut().await else {
                        break;
                    };
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
            });
            None
        }
        Err(e) => {
            let (logger, cause) = e.into_parts();
            log::debug!("probe logger not polled: {cause}");
            Some(logger)
        }
    }
}

/// Offsets in `struct vmap_node` of `pool_lock`, `busy.lock` and `lazy.lock` (`busy` and
/// `lazy` are `struct rb_list`), those BTF has.
fn vmap_node_lock_offsets(btf: &crate::host::btf::KernelBtf) -> Vec<(u64, LockClass)> {
    let list_lock = btf.member_offset("rb_list", "lock");
    let in_list = |member: &str| Some(btf.member_offset("vmap_node", member)? + list_lock?);
    [
        (
            btf.member_offset("vmap_node", "pool_lock"),
            LockClass::NodePoolLock,
        ),
        (in_list("busy"), LockClass::NodeBusyLock),
        (in_list("lazy"), LockClass::NodeLazyLock),
    ]
    .into_iter()
    .filter_map(|(off, class)| Some((off?, class)))
    .collect()
}

#[cfg(test)]
mod tests {

    #[test]
    fn richer_purge_rungs_leave_the_workqueue_programs_the_drain_items_alone() {
        assert_eq!(drain_only_work_funcs([10, 20], true), [10, 20]);
        assert_eq!(drain_only_work_funcs([10, 20], false), [10, 0]);
    }

    #[test]
    fn rings_split_the_budget_one_per_cpu_up_to_eight() {
        assert_eq!(ring_split(16 << 20, 2, 4096), (2, 8 << 20));
        assert_eq!(ring_split(16 << 20, 1, 4096), (1, 16 << 20));
        // Three CPUs: 16/3 MiB rounds down to 4 MiB each, so the total stays within budget.
        assert_eq!(ring_split(16 << 20, 3, 4096), (3, 4 << 20));
        assert_eq!(ring_split(16 << 20, 256, 4096), (8, 2 << 20));
        // Never under a page, even when the budget is smaller than a page per ring.
        assert_eq!(ring_split(4096, 8, 4096), (8, 4096));
    }
    use super::*;

    fn fmt(fields: &[(&str, u16, u8, bool)]) -> Format {
        Format {
            name: "t".into(),
            id: 1,
            fields: fields
                .iter()
                .map(|&(n, o, s, sg)| Field {
                    name: n.into(),
                    decl: format!("unsigned long {n}"),
                    offset: o,
                    size: s,
                    signed: sg,
                })
                .collect(),
        }
    }

    #[test]
    fn layout_follows_the_format_not_the_wire_order() {
        // A kernel that put `failed` first and lacks `align`.
        let f = fmt(&[
            ("failed", 8, 4, true),
            ("addr", 16, 8, false),
            ("size", 24, 8, false),
            ("vstart", 32, 8, false),
            ("vend", 40, 8, false),
        ]);
        let (layout, info) = build_layout(&TRACEPOINTS[0], &f).unwrap();
        assert_eq!(
            layout.fields[0],
            FieldLoc {
                offset: 16,
                size: 8,
                signed: 0
            }
        );
        assert_eq!(
            layout.fields[5],
            FieldLoc {
                offset: 8,
                size: 4,
                signed: 1
            }
        );
        assert_eq!(layout.fields[2], FieldLoc::default());
        assert_eq!(info.missing_fields, ["align"]);
    }

    #[test]
    fn a_misaligned_field_is_refused() {
        // The probe picks fields out of one bulk copy by aligned index, so an unaligned offset
        // would silently read the wrong bytes: refuse it instead.
        let f = fmt(&[("addr", 12, 8, false), ("size", 24, 8, false)]);
        let err = build_layout(&TRACEPOINTS[0], &f).unwrap_err();
        assert!(
            matches!(err, ProbeError::Misaligned { offset: 12, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_missing_required_field_is_refused() {
        let f = fmt(&[("size", 8, 8, false)]);
        let err = build_layout(&TRACEPOINTS[0], &f).unwrap_err();
        assert!(err.to_string().contains("`addr`"), "{err}");
        let f = fmt(&[("addr", 8, 3, false), ("size", 16, 8, false)]);
        assert!(matches!(
            build_layout(&TRACEPOINTS[0], &f),
            Err(ProbeError::BadFieldSize { .. })
        ));
    }

    #[test]
    fn raw_tracepoint_glue_frames_are_stripped_by_name() {
        let v = |f: &[&str]| f.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // As recorded on the reference machine: the JIT image resolves to the last text
        // symbol.
        let raw = v(&[
            "_einittext+0x3c8322f7",
            "bpf_trace_run2+0x159",
            "__pv_queued_spin_lock_slowpath+0x10e",
            "_raw_spin_lock+0x29",
            "alloc_vmap_area+0x1a2",
        ]);
        assert_eq!(strip_bpf_frames(raw.clone()), raw[2..].to_vec());
        // A perf tracepoint's stack is left alone.
        assert_eq!(strip_bpf_frames(raw[2..].to_vec()), raw[2..].to_vec());
        // Only the top of the stack is searched.
        let mut deep = v(&["a", "b", "c", "d", "e", "f", "g"]);
        deep.push("bpf_trace_run1+0x1".into());
        assert_eq!(strip_bpf_frames(deep.clone()), deep);
    }
}
