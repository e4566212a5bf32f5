//! Purge work: `workqueue:workqueue_execute_start` / `_end` (`include/trace/events/workqueue.h`;
//! checked on 6.18) filtered in the kernel to the vmap work functions (`drain_vmap_area_work`,
//! `purge_vmap_node`, addresses from `/proc/kallsyms`), and on the richer rungs entry/exit of
//! `purge_vmap_node` itself with `vn->nr_purged` read at the offset BTF gives, and of
//! `decay_va_pool_node`, whose exit times each node's lazy-list detach.
//!
//! The start is keyed by the work item's address, not by CPU: a work item on an unbound
//! workqueue may be picked up by a worker that later migrates.
//!
//! A drain item also gets the time of its first TLB-flush cross-call (`csd:csd_queue_cpu` for
//! `do_flush_tlb_all` or `do_kernel_range_flush`, queued by the same thread): the purge's
//! `flush_tlb_kernel_range` comes right after its last lazy-list detach, which has no event of
//! its own, and replay needs that moment to tell which racing frees the purge took.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::{fentry, fexit, kprobe, kretprobe, map},
    maps::HashMap,
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext, TracePointContext},
    EbpfContext, Global,
};
use vmtrace_common::{counter, kind, work as w, TpLayout, MAX_FIELDS};

use crate::maps::{bump, emit_values, field, layout_of, now_ns, this_cpu};

/// `work, function`.
#[unsafe(no_mangle)]
static WQ_START_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// `work, function`.
#[unsafe(no_mangle)]
static WQ_END_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// `work` only: `workqueue_execute_start`'s prototype has no function argument, which is read
/// from the work item at [`WORK_FUNC_OFFSET`].
#[unsafe(no_mangle)]
static WQ_START_RAW_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// `work, function`.
#[unsafe(no_mangle)]
static WQ_END_RAW_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// Byte offset of `func` in `struct work_struct` (BTF); `u64::MAX` if unknown, and then user
/// space does not attach the raw start program.
#[unsafe(no_mangle)]
static WORK_FUNC_OFFSET: Global<u64> = Global::new(u64::MAX);
/// Addresses of `drain_vmap_area_work` and `purge_vmap_node` (0 = absent).
#[unsafe(no_mangle)]
static WORK_FUNCS: Global<[u64; 2]> = Global::new([0; 2]);
/// `cpu, callsite, func` of `csd:csd_queue_cpu`; only `func` is read.
#[unsafe(no_mangle)]
static CSD_QUEUE_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// `cpu, callsite, func` as raw argument slots.
#[unsafe(no_mangle)]
static CSD_QUEUE_RAW_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// Addresses of `do_flush_tlb_all` and `do_kernel_range_flush` (0 = absent).
#[unsafe(no_mangle)]
static FLUSH_FUNCS: Global<[u64; 2]> = Global::new([0; 2]);
/// Byte offset of `nr_purged` in `struct vmap_node` (BTF), for the fexit rung; `u64::MAX` if
/// unknown.
#[unsafe(no_mangle)]
static NR_PURGED_OFFSET: Global<u64> = Global::new(u64::MAX);
/// Address of `decay_va_pool_node` (0 = absent), the `function` of its records.
#[unsafe(no_mangle)]
static DECAY_FUNC: Global<u64> = Global::new(0);

#[repr(C)]
#[derive(Clone, Copy)]
struct Started {
    ts: u64,
    cpu: u64,
}

#[map]
static WORK_START: HashMap<u64, Started> = HashMap::with_max_entries(1024, 0);

/// Drain items running, by thread id: the time of the first TLB-flush cross-call each queued
/// (0 until then). Keyed by thread because `csd_queue_cpu` knows only who queued the call.
#[map]
static DRAIN_FLUSH: HashMap<u32, u64> = HashMap::with_max_entries(256, 0);

/// Purge-node calls in flight on the richer rungs, by thread id: `(&vn->purge_work, start,
/// cpu)`.
#[map]
static NODE_START: HashMap<u32, [u64; 3]> = HashMap::with_max_entries(1024, 0);

/// Pool decays in flight on the richer rungs, by thread id: `(vn, start, cpu)`.
#[map]
static DECAY_START: HashMap<u32, [u64; 3]> = HashMap::with_max_entries(1024, 0);

#[inline(always)]
fn is_vmap_work(function: u64) -> bool {
    let f = WORK_FUNCS.load();
    function != 0 && (function == f[0] || function == f[1])
}

#[inline(always)]
fn on_execute_start<const RAW: bool>(ctx: TracePointContext) -> u32 {
    let layout = layout_of::<RAW>(&WQ_START_LAYOUT, &WQ_START_RAW_LAYOUT);
    // Raw: the function is read from the work item, so the work comes first. Perf: the record
    // has both, and the work is only read for the few items that pass the filter.
    let (work, function) = if RAW {
        let work = field::<RAW, 0>(&ctx, layout);
        let off = WORK_FUNC_OFFSET.load();
        if work == 0 || off == u64::MAX {
            return 0;
        }
        // SAFETY: the work item the kernel is about to run; a bad read is an error.
        let function = unsafe { bpf_probe_read_kernel((work + off) as *const u64) }.unwrap_or(0);
        (Some(work), function)
    } else {
        (None, field::<RAW, 1>(&ctx, layout))
    };
    if !is_vmap_work(function) {
        return 0;
    }
    let work = match work {
        Some(w) => w,
        None => field::<RAW, 0>(&ctx, layout),
    };
    let s = Started {
        ts: now_ns(),
        cpu: this_cpu(),
    };
    let _ = WORK_START.insert(work, s, 0);
    if function != WORK_FUNCS.load()[0] {
        return 0;
    }
    let _ = DRAIN_FLUSH.insert(bpf_get_current_pid_tgid() as u32, 0, 0);
    // The drain's start, now: its WORK record comes only after the purge it runs.
    let mut v = [0u64; MAX_FIELDS];
    v[w::WORK] = work;
    v[w::FUNCTION] = function;
    v[w::START_CPU] = s.cpu;
    match emit_values(&ctx, kind::WORK_START, &v) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

#[inline(always)]
fn on_execute_end<const RAW: bool>(ctx: TracePointContext) -> u32 {
    let layout = layout_of::<RAW>(&WQ_END_LAYOUT, &WQ_END_RAW_LAYOUT);
    let function = field::<RAW, 1>(&ctx, layout);
    if !is_vmap_work(function) {
        return 0;
    }
    let work = field::<RAW, 0>(&ctx, layout);
    // SAFETY: map value copied out before the delete.
    let Some(s) = (unsafe { WORK_START.get(work) }).copied() else {
        bump(counter::WORK_UNMATCHED_END);
        return 0;
    };
    let _ = WORK_START.remove(work);
    let mut v = [0u64; MAX_FIELDS];
    v[w::WORK] = work;
    v[w::FUNCTION] = function;
    v[w::START_NS] = s.ts;
    v[w::DURATION_NS] = now_ns().saturating_sub(s.ts);
    v[w::START_CPU] = s.cpu;
    v[w::NR_PURGED] = u64::MAX;
    v[w::FLUSH_NS] = u64::MAX;
    if function == WORK_FUNCS.load()[0] {
        let tid = bpf_get_current_pid_tgid() as u32;
        // SAFETY: map value copied out before the delete.
        if let Some(&t) = unsafe { DRAIN_FLUSH.get(tid) } {
            if t != 0 {
                v[w::FLUSH_NS] = t;
            }
        }
        let _ = DRAIN_FLUSH.remove(tid);
    }
    match emit_values(&ctx, kind::WORK, &v) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

tracepoint_programs!(
    "workqueue",
    "workqueue_execute_start",
    workqueue_execute_start,
    raw_workqueue_execute_start,
    on_execute_start
);
tracepoint_programs!(
    "workqueue",
    "workqueue_execute_end",
    workqueue_execute_end,
    raw_workqueue_execute_end,
    on_execute_end
);

#[inline(always)]
fn on_csd_queue<const RAW: bool>(ctx: TracePointContext) -> u32 {
    let layout = layout_of::<RAW>(&CSD_QUEUE_LAYOUT, &CSD_QUEUE_RAW_LAYOUT);
    // Every cross-CPU call in the system passes here: two compares turn almost all away.
    let func = field::<RAW, 2>(&ctx, layout);
    let f = FLUSH_FUNCS.load();
    if func == 0 || (func != f[0] && func != f[1]) {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(t) = DRAIN_FLUSH.get_ptr_mut(tid) {
        // SAFETY: a value of this map, written only by this thread.
        unsafe {
            if *t == 0 {
                *t = now_ns();
            }
        }
    }
    0
}

tracepoint_programs!(
    "csd",
    "csd_queue_cpu",
    csd_queue_cpu,
    raw_csd_queue_cpu,
    on_csd_queue
);

/// Entry of a timed call: `arg` (the node or its work) and the time and CPU, by thread id.
#[inline(always)]
fn call_enter(calls: &HashMap<u32, [u64; 3]>, arg: u64) {
    let tid = bpf_get_current_pid_tgid() as u32;
    let v = [arg, now_ns(), this_cpu()];
    let _ = calls.insert(tid, v, 0);
}

/// Exit of a timed call: one `WORK` record for `function`, with `nr_purged` read at
/// `nr_purged_offset` from the call's argument (`u64::MAX`: not read).
#[inline(always)]
fn call_exit<C: EbpfContext>(
    ctx: &C,
    calls: &HashMap<u32, [u64; 3]>,
    function: u64,
    nr_purged_offset: u64,
) -> Result<(), i32> {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: map value copied out before the delete.
    let Some(s) = (unsafe { calls.get(tid) }).copied() else {
        return Ok(());
    };
    let _ = calls.remove(tid);
    let nr_purged = if nr_purged_offset == u64::MAX || s[0] == 0 {
        u64::MAX
    } else {
        // SAFETY: a kernel pointer the kernel passed to the traced function; a bad read is an
        // error.
        unsafe { bpf_probe_read_kernel((s[0] + nr_purged_offset) as *const u64) }
            .unwrap_or(u64::MAX)
    };
    let mut v = [0u64; MAX_FIELDS];
    v[w::WORK] = s[0];
    v[w::FUNCTION] = function;
    v[w::START_NS] = s[1];
    v[w::DURATION_NS] = now_ns().saturating_sub(s[1]);
    v[w::START_CPU] = s[2];
    v[w::NR_PURGED] = nr_purged;
    v[w::FLUSH_NS] = u64::MAX;
    emit_values(ctx, kind::WORK, &v)
}

#[inline(always)]
fn node_exit<C: EbpfContext>(ctx: &C) -> Result<(), i32> {
    call_exit(
        ctx,
        &NODE_START,
        WORK_FUNCS.load()[1],
        NR_PURGED_OFFSET.load(),
    )
}

#[inline(always)]
fn decay_exit<C: EbpfContext>(ctx: &C) -> Result<(), i32> {
    call_exit(ctx, &DECAY_START, DECAY_FUNC.load(), u64::MAX)
}

/// The four programs timing one kernel function on the richer rungs: entry (fentry, kprobe)
/// keeps its first argument and the time in `$calls`, exit (fexit, kretprobe) emits the record
/// through `$exit`.
macro_rules! timed_call_programs {
    ($function:literal, $calls:ident, $exit:ident,
     $fentry:ident, $fexit:ident, $kprobe:ident, $kretprobe:ident) => {
        #[fentry(function = $function)]
        pub fn $fentry(ctx: FEntryContext) -> u32 {
            call_enter(&$calls, ctx.arg(0));
            0
        }

        #[fexit(function = $function)]
        pub fn $fexit(ctx: FExitContext) -> u32 {
            match $exit(&ctx) {
                Ok(()) => 0,
                Err(_) => 1,
            }
        }

        #[kprobe]
        pub fn $kprobe(ctx: ProbeContext) -> u32 {
            call_enter(&$calls, ctx.arg(0).unwrap_or(0));
            0
        }

        #[kretprobe]
        pub fn $kretprobe(ctx: RetProbeContext) -> u32 {
            match $exit(&ctx) {
                Ok(()) => 0,
                Err(_) => 1,
            }
        }
    };
}

// `purge_vmap_node(struct work_struct *work)`: `work` is `&vn->purge_work`, so user space
// subtracts that member's BTF offset to get the node.
timed_call_programs!(
    "purge_vmap_node",
    NODE_START,
    node_exit,
    fentry_purge_vmap_node,
    fexit_purge_vmap_node,
    kprobe_purge_vmap_node,
    kretprobe_purge_vmap_node
);

// `decay_va_pool_node(struct vmap_node *vn, bool full_decay)`. `__purge_vmap_area_lazy` runs
// it for every node in turn and detaches the node's lazy list right after it returns, so its
// exit times the detach, which no tracepoint marks; the frees that raced the detach are the
// ones replay cannot place without it.
timed_call_programs!(
    "decay_va_pool_node",
    DECAY_START,
    decay_exit,
    fentry_decay_va_pool_node,
    fexit_decay_va_pool_node,
    kprobe_decay_va_pool_node,
    kretprobe_decay_va_pool_node
);
