//! Wire types shared by the vmtrace probes (`vmtrace-ebpf`) and user space (`vmtrace`).
//!
//! Everything here is `#[repr(C)]` with explicit padding, so the byte layout the BPF program writes
//! is the one user space reads, whatever the compiler would otherwise do with implicit padding.
#![no_std]

/// Maximum number of fields a probed tracepoint may carry.
///
/// The widest vmalloc tracepoint, `alloc_vmap_area`, has six; the slack leaves room for a kernel
/// that adds a field without needing a new wire layout.
pub const MAX_FIELDS: usize = 8;

/// How many event ring buffers the probes have. Each CPU reserves in its own ring (CPU `c` in
/// ring `c % NR_RINGS`), because one ring shared by every CPU made its lock and producer
/// position bounce between them: `__bpf_ringbuf_reserve` was 44 % of the vmalloc programs' time
/// on two CPUs. Eight covers small machines one ring per CPU and bounds the map count on big
/// ones (a ring then serves every eighth CPU).
pub const RINGS: usize = 8;

/// Length of `task_struct::comm`, as the `bpf_get_current_comm` helper fills it.
pub const COMM_LEN: usize = 16;

/// Which tracepoint an [`Event`] came from. Values are stable: they are the ring-buffer wire format.
pub mod kind {
    /// `vmalloc:alloc_vmap_area`.
    pub const ALLOC: u32 = 1;
    /// `vmalloc:free_vmap_area_noflush`.
    pub const FREE: u32 = 2;
    /// `vmalloc:purge_vmap_area_lazy`.
    pub const PURGE: u32 = 3;
    /// One lock wait on a vmap path (`lock:contention_begin` → `lock:contention_end`, or a
    /// richer rung). Fields: see [`super::contention`].
    pub const CONTENTION: u32 = 4;
    /// One purge work item (`workqueue:workqueue_execute_start/_end` filtered to the vmap work
    /// functions), or on the richer rungs one call of `purge_vmap_node` or of
    /// `decay_va_pool_node`. Fields: see [`super::work`].
    pub const WORK: u32 = 5;
    /// One kernel page-table page allocated for vmalloc space. Fields: see [`super::ptpage`].
    pub const PT_PAGE: u32 = 6;
    /// Entry-to-exit latency of `alloc_vmap_area` (fentry/fexit or kprobe/kretprobe rungs only).
    /// Fields: `[0]` entry time, `[1]` latency ns, `[2]` return value.
    pub const LATENCY: u32 = 7;
    /// The start of a `drain_vmap_area_work` item (`workqueue_execute_start`), emitted then, so
    /// that a reader in event order knows when the purge began (its detach follows) before the
    /// item's [`WORK`] record, which is emitted at its end. Fields: [`super::work::WORK`],
    /// [`super::work::FUNCTION`], [`super::work::START_CPU`].
    pub const WORK_START: u32 = 8;
    /// One past the largest kind; sizes the per-kind lost-event counters.
    pub const COUNT: u32 = 9;
}

/// Field slots of a [`kind::CONTENTION`] event.
pub mod contention {
    pub const LOCK: usize = 0;
    pub const FLAGS: usize = 1;
    pub const WAIT_NS: usize = 2;
    /// `bpf_get_stackid` result: a stack id, or a negative errno when the stack map failed.
    pub const STACK_ID: usize = 3;
    pub const BEGIN_NS: usize = 4;
    /// `ret` of `contention_end` (0 on success, e.g. -EINTR for an interrupted mutex wait).
    pub const RET: usize = 5;
    /// Index into the filter's range table of the first frame that matched.
    pub const MATCHED: usize = 6;
    /// The begin program's own time before it stamped [`BEGIN_NS`]: from just after the lock
    /// verdict to the stamp, the vmap-frame walk and the stack-id store. The wait began that
    /// much before `BEGIN_NS`.
    pub const PROBE_NS: usize = 7;
    /// [`STACK_ID`] of a wait on a lock user space already knows as a vmap lock
    /// (`KNOWN_LOCKS`): the program took no stack, so the waiter lost no time to the probe's
    /// walk. No errno is this value.
    pub const STACK_NOT_WALKED: i64 = i64::MIN;
    /// `LCB_F_*` bits of `include/trace/events/lock.h`.
    pub const F_SPIN: u64 = 1 << 0;
    pub const F_MUTEX: u64 = 1 << 5;
}

/// Field slots of a [`kind::WORK`] event.
pub mod work {
    /// `struct work_struct *`; on the fentry/kprobe rungs `&vn->purge_work` (`purge_vmap_node`)
    /// or the `struct vmap_node *` (`decay_va_pool_node`).
    pub const WORK: usize = 0;
    pub const FUNCTION: usize = 1;
    pub const START_NS: usize = 2;
    pub const DURATION_NS: usize = 3;
    pub const START_CPU: usize = 4;
    /// `vn->nr_purged` after the call (fexit rung only; `u64::MAX` when not read).
    pub const NR_PURGED: usize = 5;
    /// First TLB-flush cross-call a `drain_vmap_area_work` item queued (`csd:csd_queue_cpu`),
    /// ns; `u64::MAX` when none was seen.
    pub const FLUSH_NS: usize = 6;
}

/// Field slots of a [`kind::PT_PAGE`] event.
pub mod ptpage {
    /// 0 = PTE table (`__pte_alloc_kernel`), 1 = PMD, 2 = PUD, 3 = P4D.
    pub const LEVEL: usize = 0;
    pub const PFN: usize = 1;
    pub const GFP: usize = 2;
    pub const ORDER: usize = 3;
}

/// Largest page order the backing-page histogram counts separately (`MAX_PAGE_ORDER` is 10 on
/// x86_64); larger orders land in the last slot.
pub const MAX_ORDER_SLOTS: u32 = 12;

/// The lock-hold histogram (`HOLD_HIST`): per lock class (the code user space gives a known
/// lock in `KNOWN_LOCKS`, its index in `LockClass::ALL`), [`HOLD_BUCKETS`] exp2 buckets
/// (bucket `k` counts holds in `[2^(k-1), 2^k)` ns, bucket 0 holds of 0 ns; the last also
/// counts longer ones), then the sum of the holds in ns.
pub const HOLD_CLASSES: u32 = 8;
pub const HOLD_BUCKETS: u32 = 32;
pub const HOLD_STRIDE: u32 = HOLD_BUCKETS + 1;

/// The [`HOLD_BUCKETS`] bucket of a hold of `ns`: the bits it needs, so bucket `k` holds
/// `[2^(k-1), 2^k)`; a binary search, as the BPF target has no count-leading-zeros.
#[inline(always)]
pub fn hold_bucket(ns: u64) -> u32 {
    let mut v = ns;
    let mut k = 0u32;
    let mut step = 32u32;
    while step > 0 {
        if v >> step != 0 {
            v >>= step;
            k += step;
        }
        step /= 2;
    }
    if v != 0 {
        k += 1;
    }
    if k >= HOLD_BUCKETS {
        HOLD_BUCKETS - 1
    } else {
        k
    }
}

/// Kernel stack depth the filters inspect. Lock and page-allocator frames come first, so the
/// vmap function is within the first dozen frames (the recorded stacks put it at depth 3 to 8);
/// the unwinder stops at this depth, and its cost grows with it. A raw tracepoint's stack starts
/// with [`RAW_EXTRA_FRAMES`] more, so its filters walk that many further (the scratch buffer
/// holds the deeper walk).
pub const FILTER_FRAMES: usize = 16 + RAW_EXTRA_FRAMES;

/// Frames a stack taken in a raw tracepoint program has above the tracepoint's call site: the
/// program itself and `bpf_trace_run<N>` (a perf tracepoint's stack starts at the call site,
/// from the registers saved there). User space strips them by name before classifying
/// (`LoadedProbes::stack_frames`); the in-kernel filters only need to look that much deeper.
pub const RAW_EXTRA_FRAMES: usize = 2;

/// Most address ranges one filter table holds.
pub const MAX_RANGES: usize = 32;

/// `[start, end)` of one kernel function, from `/proc/kallsyms`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddrRange {
    pub start: u64,
    pub end: u64,
}

/// A small table of function ranges handed to a probe as a read-only global: the in-kernel
/// stack filter. Sorted by `start`; `lo`/`hi` bound the whole table so most frames are
/// rejected with two compares.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeSet {
    pub count: u32,
    pub _pad: u32,
    pub lo: u64,
    pub hi: u64,
    pub ranges: [AddrRange; MAX_RANGES],
}

impl RangeSet {
    pub const EMPTY: RangeSet = RangeSet {
        count: 0,
        _pad: 0,
        lo: 0,
        hi: 0,
        ranges: [AddrRange { start: 0, end: 0 }; MAX_RANGES],
    };
}

/// Page-allocation filter parameters for `kmem:mm_page_alloc` (gfp bits differ between kernel
/// builds, so user space reads them from the tracepoint's print format).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageFilter {
    /// Page-table pages: all of these gfp bits set (`__GFP_ZERO`) …
    pub pt_require: u64,
    /// … and none of these (`__GFP_ACCOUNT`: user page tables; `__GFP_HIGHMEM`).
    pub pt_exclude: u64,
    /// vmalloc backing pages: all of these set (`__GFP_HIGHMEM`, added by `__vmalloc_area_node`) …
    pub back_require: u64,
    /// … and none of these (`__GFP_MOVABLE`: user pages).
    pub back_exclude: u64,
}

/// Indexes of the per-CPU `COUNTERS` array: filter and stack-map accounting.
pub mod counter {
    /// `bpf_get_stackid` failed (map full, or the bucket taken for the stack with each of its
    /// first frames dropped in turn); the event carries the errno.
    pub const STACK_MAP_FAIL: u32 = 0;
    /// `bpf_get_stack` for the in-kernel filter failed.
    pub const STACK_READ_FAIL: u32 = 1;
    /// Contentions seen whose stack held no vmap function (dropped in the kernel).
    pub const CONTENTION_FILTERED: u32 = 2;
    /// A contention began while another one was pending on the same CPU/task (kept the outer).
    pub const CONTENTION_NESTED: u32 = 3;
    /// `mm_page_alloc` hits that passed the gfp pre-filter and had their stack walked.
    pub const PAGE_STACK_WALKS: u32 = 4;
    /// Work items of the vmap functions whose start was not seen (attached mid-item).
    pub const WORK_UNMATCHED_END: u32 = 5;
    /// Contentions kept without a stack walk, because user space had marked the lock's
    /// address as a vmap lock (`KNOWN_LOCKS`).
    pub const CONTENTION_KNOWN: u32 = 6;
    /// Known-lock takes not timed by the hold probe because this CPU already held another
    /// known lock it was timing (the vmap locks do not nest, so this stays 0 unless they do).
    pub const HOLD_NESTED: u32 = 7;
    pub const COUNT: u32 = 8;
}

/// Where one tracepoint field lives in the raw record, as read from the tracepoint's `format` file.
///
/// A field with `size == 0` is absent on this kernel; the probe then reports 0 for it and user
/// space knows from the trace header that the value means "not provided".
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FieldLoc {
    pub offset: u16,
    /// 1, 2, 4 or 8 bytes; anything else is rejected by user space before load.
    pub size: u8,
    /// Non-zero when the field is signed, so a 4-byte `int` is sign-extended into the `u64` slot.
    pub signed: u8,
}

/// The field layout of one tracepoint, handed to its program as a read-only global at load time.
///
/// The order of `fields` is the order user space documents for the event kind (for example
/// `addr, size, align, vstart, vend, failed` for `alloc_vmap_area`); it is *not* the kernel's
/// order, which is why offsets are carried rather than assumed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TpLayout {
    pub fields: [FieldLoc; MAX_FIELDS],
}

impl TpLayout {
    pub const EMPTY: TpLayout = TpLayout {
        fields: [FieldLoc {
            offset: 0,
            size: 0,
            signed: 0,
        }; MAX_FIELDS],
    };
}

/// One tracepoint hit, as it crosses the ring buffer.
///
/// The payload is the tracepoint's fields widened to `u64`, in [`TpLayout`] order. Keeping one
/// fixed-size record for every kind keeps the probe and the reader simple and lets one ring buffer
/// carry all kinds in the order they were reserved.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// `bpf_ktime_get_boot_ns()`: CLOCK_BOOTTIME, so it keeps counting across suspend and can be
    /// compared with `clock_gettime(CLOCK_BOOTTIME)` in user space.
    pub ts_ns: u64,
    pub kind: u32,
    pub cpu: u32,
    pub tgid: u32,
    pub pid: u32,
    pub comm: [u8; COMM_LEN],
    pub fields: [u64; MAX_FIELDS],
}

impl Event {
    pub const ZERO: Event = Event {
        ts_ns: 0,
        kind: 0,
        cpu: 0,
        tgid: 0,
        pid: 0,
        comm: [0; COMM_LEN],
        fields: [0; MAX_FIELDS],
    };
}

/// Names of the read-only globals and maps the user-space loader refers to.
pub mod names {
    pub const ALLOC_LAYOUT: &str = "ALLOC_LAYOUT";
    pub const FREE_LAYOUT: &str = "FREE_LAYOUT";
    pub const PURGE_LAYOUT: &str = "PURGE_LAYOUT";
    pub const EVENTS: &str = "EVENTS";
    /// The event rings, [`super::RINGS`] of them: CPU `c` reserves in ring `c % NR_RINGS`.
    pub const EVENT_RINGS: [&str; super::RINGS] = [
        EVENTS, "EVENTS_1", "EVENTS_2", "EVENTS_3", "EVENTS_4", "EVENTS_5", "EVENTS_6", "EVENTS_7",
    ];
    /// How many of the event rings are in use (1..=RINGS).
    pub const NR_RINGS: &str = "NR_RINGS";
    /// Unread bytes in a ring at which a submit wakes the reader.
    pub const WAKEUP_BYTES: &str = "WAKEUP_BYTES";
    pub const LOST: &str = "LOST";
    pub const PROG_ALLOC: &str = "vmalloc_alloc_vmap_area";
    pub const PROG_FREE: &str = "vmalloc_free_vmap_area_noflush";
    pub const PROG_PURGE: &str = "vmalloc_purge_vmap_area_lazy";
    pub const COUNTERS: &str = "COUNTERS";
    pub const STACKS: &str = "STACKS";
    pub const BACKING_ORDERS: &str = "BACKING_ORDERS";
    pub const HOLD_HIST: &str = "HOLD_HIST";
    pub const PROG_FEXIT_SPIN_LOCK: &str = "fexit_raw_spin_lock";
    pub const PROG_FENTRY_SPIN_UNLOCK: &str = "fentry_raw_spin_unlock";
    pub const LOCK_BEGIN_LAYOUT: &str = "LOCK_BEGIN_LAYOUT";
    pub const LOCK_END_LAYOUT: &str = "LOCK_END_LAYOUT";
    pub const WQ_START_LAYOUT: &str = "WQ_START_LAYOUT";
    pub const WQ_END_LAYOUT: &str = "WQ_END_LAYOUT";
    pub const PAGE_ALLOC_LAYOUT: &str = "PAGE_ALLOC_LAYOUT";
    pub const LOCK_RANGES: &str = "LOCK_RANGES";
    /// Lock addresses user space classified as vmap locks from enough walked stacks: a wait on
    /// one of them is kept without the walk.
    pub const KNOWN_LOCKS: &str = "KNOWN_LOCKS";
    pub const SELF_RANGES: &str = "SELF_RANGES";
    pub const PT_ALLOC_RANGES: &str = "PT_ALLOC_RANGES";
    pub const VMAP_MAP_RANGES: &str = "VMAP_MAP_RANGES";
    pub const VMALLOC_PAGE_RANGES: &str = "VMALLOC_PAGE_RANGES";
    pub const WORK_FUNCS: &str = "WORK_FUNCS";
    /// Addresses of the TLB-flush cross-call functions (`do_flush_tlb_all`,
    /// `do_kernel_range_flush`) the purge's `flush_tlb_kernel_range` queues.
    pub const FLUSH_FUNCS: &str = "FLUSH_FUNCS";
    pub const CSD_QUEUE_LAYOUT: &str = "CSD_QUEUE_LAYOUT";
    pub const PROG_CSD_QUEUE: &str = "csd_queue_cpu";
    pub const PROG_RAW_CSD_QUEUE: &str = "raw_csd_queue_cpu";
    pub const CSD_QUEUE_RAW_LAYOUT: &str = "CSD_QUEUE_RAW_LAYOUT";
    pub const PAGE_FILTER: &str = "PAGE_FILTER";
    pub const NR_PURGED_OFFSET: &str = "NR_PURGED_OFFSET";
    pub const PROG_LOCK_BEGIN: &str = "lock_contention_begin";
    pub const PROG_LOCK_END: &str = "lock_contention_end";
    pub const PROG_WQ_START: &str = "workqueue_execute_start";
    pub const PROG_WQ_END: &str = "workqueue_execute_end";
    pub const PROG_PAGE_ALLOC: &str = "kmem_mm_page_alloc";
    pub const PROG_FENTRY_ALLOC: &str = "fentry_alloc_vmap_area";
    pub const PROG_FEXIT_ALLOC: &str = "fexit_alloc_vmap_area";
    pub const PROG_KPROBE_ALLOC: &str = "kprobe_alloc_vmap_area";
    pub const PROG_KRETPROBE_ALLOC: &str = "kretprobe_alloc_vmap_area";
    pub const PROG_FENTRY_PURGE_NODE: &str = "fentry_purge_vmap_node";
    pub const PROG_FEXIT_PURGE_NODE: &str = "fexit_purge_vmap_node";
    pub const PROG_KPROBE_PURGE_NODE: &str = "kprobe_purge_vmap_node";
    pub const PROG_KRETPROBE_PURGE_NODE: &str = "kretprobe_purge_vmap_node";
    pub const PROG_FENTRY_DECAY: &str = "fentry_decay_va_pool_node";
    pub const PROG_FEXIT_DECAY: &str = "fexit_decay_va_pool_node";
    pub const PROG_KPROBE_DECAY: &str = "kprobe_decay_va_pool_node";
    pub const PROG_KRETPROBE_DECAY: &str = "kretprobe_decay_va_pool_node";
    /// Address of `decay_va_pool_node`: the `function` of its [`super::kind::WORK`] records.
    pub const DECAY_FUNC: &str = "DECAY_FUNC";
    pub const PROG_FENTRY_PTE: &str = "fentry_pte_alloc_kernel";
    pub const PROG_KPROBE_PTE: &str = "kprobe_pte_alloc_kernel";
    pub const PROG_FENTRY_SPIN: &str = "fentry_spin_slowpath";
    pub const PROG_FEXIT_SPIN: &str = "fexit_spin_slowpath";
    pub const PROG_KPROBE_SPIN: &str = "kprobe_spin_slowpath";
    pub const PROG_KRETPROBE_SPIN: &str = "kretprobe_spin_slowpath";
    // The raw-tracepoint twins of the tracepoint programs, and their layouts (argument slots of
    // `bpf_raw_tracepoint_args`, from the `btf_trace_<name>` prototype in kernel BTF).
    pub const PROG_RAW_ALLOC: &str = "raw_vmalloc_alloc_vmap_area";
    pub const PROG_RAW_FREE: &str = "raw_vmalloc_free_vmap_area_noflush";
    pub const PROG_RAW_PURGE: &str = "raw_vmalloc_purge_vmap_area_lazy";
    pub const PROG_RAW_LOCK_BEGIN: &str = "raw_lock_contention_begin";
    pub const PROG_RAW_LOCK_END: &str = "raw_lock_contention_end";
    pub const PROG_RAW_WQ_START: &str = "raw_workqueue_execute_start";
    pub const PROG_RAW_WQ_END: &str = "raw_workqueue_execute_end";
    pub const PROG_RAW_PAGE_ALLOC: &str = "raw_kmem_mm_page_alloc";
    pub const ALLOC_RAW_LAYOUT: &str = "ALLOC_RAW_LAYOUT";
    pub const FREE_RAW_LAYOUT: &str = "FREE_RAW_LAYOUT";
    pub const PURGE_RAW_LAYOUT: &str = "PURGE_RAW_LAYOUT";
    pub const LOCK_BEGIN_RAW_LAYOUT: &str = "LOCK_BEGIN_RAW_LAYOUT";
    pub const LOCK_END_RAW_LAYOUT: &str = "LOCK_END_RAW_LAYOUT";
    pub const WQ_START_RAW_LAYOUT: &str = "WQ_START_RAW_LAYOUT";
    pub const WQ_END_RAW_LAYOUT: &str = "WQ_END_RAW_LAYOUT";
    pub const PAGE_ALLOC_RAW_LAYOUT: &str = "PAGE_ALLOC_RAW_LAYOUT";
    /// Byte offset of `func` in `struct work_struct` (BTF): `workqueue_execute_start`'s raw
    /// arguments carry only the work item.
    pub const WORK_FUNC_OFFSET: &str = "WORK_FUNC_OFFSET";
    /// Bit `kind` set: that vmalloc tracepoint's raw layout is its first arguments in order, so
    /// its raw program copies them straight from the context (see `raw::direct_layout`).
    pub const RAW_DIRECT: &str = "RAW_DIRECT";
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: all three are #[repr(C)] plain-old-data with explicit padding and no pointers.
    unsafe impl aya::Pod for super::FieldLoc {}
    unsafe impl aya::Pod for super::TpLayout {}
    unsafe impl aya::Pod for super::Event {}
    unsafe impl aya::Pod for super::AddrRange {}
    unsafe impl aya::Pod for super::RangeSet {}
    unsafe impl aya::Pod for super::PageFilter {}
}

// The wire layout must have no implicit padding: check the sizes the fields add up to.
const _: () = assert!(core::mem::size_of::<FieldLoc>() == 4);
const _: () = assert!(core::mem::size_of::<TpLayout>() == 4 * MAX_FIELDS);
const _: () = assert!(core::mem::size_of::<Event>() == 8 + 4 * 4 + COMM_LEN + 8 * MAX_FIELDS);
const _: () = assert!(core::mem::size_of::<RangeSet>() == 24 + 16 * MAX_RANGES);
const _: () = assert!(core::mem::size_of::<PageFilter>() == 32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_buckets_are_the_bits_a_hold_needs() {
        assert_eq!(hold_bucket(0), 0);
        assert_eq!(hold_bucket(1), 1);
        assert_eq!(hold_bucket(2), 2);
        assert_eq!(hold_bucket(3), 2);
        assert_eq!(hold_bucket(4), 3);
        assert_eq!(hold_bucket(1023), 10);
        assert_eq!(hold_bucket(1024), 11);
        for ns in [5u64, 77, 1000, 123_456, 1 << 29] {
            let k = hold_bucket(ns);
            assert!(1u64 << (k - 1) <= ns && ns < 1u64 << k, "{ns} in {k}");
        }
        assert_eq!(hold_bucket(u64::MAX), HOLD_BUCKETS - 1);
        assert_eq!(hold_bucket(1 << 40), HOLD_BUCKETS - 1);
    }
}
