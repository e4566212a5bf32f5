//! Lock holds: how long each known vmap lock is held, from the return of `_raw_spin_lock` (the
//! lock is taken) to the entry of `_raw_spin_unlock`. The contention probes see only the waits,
//! and a wait is the rest of a section someone else held; the simulation needs the sections
//! themselves, which only a function-boundary probe can time. Both functions run for every
//! spinlock in the kernel, so the programs do as little as possible for the others: the lock
//! side is one hash lookup (`KNOWN_LOCKS`, filled by user space from classified waits), the
//! unlock side one per-CPU read. Holds are aggregated in the kernel, not streamed: a vmap
//! operation takes three or four of these locks, so one record per hold would multiply the
//! trace.
//!
//! A spinlock's holder cannot migrate or be preempted, so a per-CPU slot times it; the vmap
//! locks are never taken from interrupts and do not nest, so one slot is enough (a second
//! known lock while one is timed is counted in `HOLD_NESTED` and not timed).

use aya_ebpf::{
    macros::{fentry, fexit, map},
    maps::PerCpuArray,
    programs::{FEntryContext, FExitContext},
};
use vmtrace_common::{counter, hold_bucket, HOLD_BUCKETS, HOLD_CLASSES, HOLD_STRIDE};

use crate::{
    lock::{btf_lock_arg, KNOWN_LOCKS},
    maps::{bump, now_ns},
};

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Held {
    /// 0: nothing timed on this CPU.
    lock: u64,
    since_ns: u64,
    class: u64,
}

#[map]
static HELD: PerCpuArray<Held> = PerCpuArray::with_max_entries(1, 0);

/// See [`vmtrace_common::HOLD_STRIDE`] for the layout.
#[map]
static HOLD_HIST: PerCpuArray<u64> = PerCpuArray::with_max_entries(HOLD_CLASSES * HOLD_STRIDE, 0);

/// A slot older than this was left by a take whose release the probe missed (released through
/// another primitive, or attached between the two): it is taken over rather than blocking this
/// CPU's timing for good.
const STALE_NS: u64 = 100_000_000;

#[inline(always)]
fn add(index: u32, n: u64) {
    if let Some(slot) = HOLD_HIST.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; programs run with migration disabled.
        unsafe { *slot += n };
    }
}

#[fexit(function = "_raw_spin_lock")]
pub fn fexit_raw_spin_lock(ctx: FExitContext) -> u32 {
    let lock = btf_lock_arg(&ctx);
    // SAFETY: the value is copied out at once.
    let Some(class) = (unsafe { KNOWN_LOCKS.get(lock) }).copied() else {
        return 0;
    };
    let Some(h) = HELD.get_ptr_mut(0) else {
        return 0;
    };
    let now = now_ns();
    // SAFETY: this CPU's slot.
    unsafe {
        if (*h).lock != 0 && now.saturating_sub((*h).since_ns) < STALE_NS {
            bump(counter::HOLD_NESTED);
            return 0;
        }
        *h = Held {
            lock,
            since_ns: now,
            class: u64::from(class),
        };
    }
    0
}

#[fentry(function = "_raw_spin_unlock")]
pub fn fentry_raw_spin_unlock(ctx: FEntryContext) -> u32 {
    let Some(h) = HELD.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot.
    let held = unsafe { *h };
    if held.lock == 0 {
        return 0;
    }
    if btf_lock_arg(&ctx) != held.lock {
        return 0;
    }
    let hold = now_ns().saturating_sub(held.since_ns);
    // SAFETY: this CPU's slot.
    unsafe { (*h).lock = 0 };
    let class = held.class as u32;
    if class >= HOLD_CLASSES {
        return 0;
    }
    let base = class * HOLD_STRIDE;
    add(base + hold_bucket(hold), 1);
    add(base + HOLD_BUCKETS, hold);
    0
}
