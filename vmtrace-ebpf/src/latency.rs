//! Allocation latency: entry to exit of `alloc_vmap_area`. Only the fentry/fexit and
//! kprobe/kretprobe rungs can time a function; the tracepoint fires once, at the end, so on the
//! tracepoint rung vmtrace reports no latency rather than a made-up one.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{fentry, fexit, kprobe, kretprobe, map},
    maps::HashMap,
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext},
    EbpfContext,
};
use vmtrace_common::{kind, MAX_FIELDS};

use crate::maps::{emit_values, now_ns};

#[map]
static ALLOC_START: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

#[inline(always)]
fn enter() {
    let tid = bpf_get_current_pid_tgid() as u32;
    let _ = ALLOC_START.insert(tid, now_ns(), 0);
}

#[inline(always)]
fn exit<C: EbpfContext>(ctx: &C, ret: u64) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: value copied out before the delete.
    let Some(start) = (unsafe { ALLOC_START.get(tid) }).copied() else {
        return 0;
    };
    let _ = ALLOC_START.remove(tid);
    let mut v = [0u64; MAX_FIELDS];
    v[0] = start;
    v[1] = now_ns().saturating_sub(start);
    v[2] = ret;
    match emit_values(ctx, kind::LATENCY, &v) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

#[fentry(function = "alloc_vmap_area")]
pub fn fentry_alloc_vmap_area(_ctx: FEntryContext) -> u32 {
    enter();
    0
}

/// `alloc_vmap_area` has 8 arguments on 6.18; the return value follows them in the fexit
/// context, which user space cannot change here, so it is not read: the latency is the point.
#[fexit(function = "alloc_vmap_area")]
pub fn fexit_alloc_vmap_area(ctx: FExitContext) -> u32 {
    exit(&ctx, 0)
}

#[kprobe]
pub fn kprobe_alloc_vmap_area(_ctx: ProbeContext) -> u32 {
    enter();
    0
}

#[kretprobe]
pub fn kretprobe_alloc_vmap_area(ctx: RetProbeContext) -> u32 {
    let ret: u64 = ctx.ret();
    exit(&ctx, ret)
}
