//! Lock waits on vmap paths: `lock:contention_begin` / `lock:contention_end`
//! (`include/trace/events/lock.h`, since v5.19; checked on 6.18), and the same logic on the
//! richer rungs (entry/exit of the queued-spinlock slow path) for kernels that allow them.
//!
//! Only waits whose kernel stack passes through a vmap function (`LOCK_RANGES`, resolved from
//! `/proc/kallsyms` by user space) are kept: the filter runs at `contention_begin`, so unrelated
//! contention costs one stack walk and leaves no state behind. Once user space has classified a
//! lock's address from enough walked stacks it puts it in `KNOWN_LOCKS`, and waits on it are
//! kept without a walk: the walk costs the waiter microseconds, far more than the waits it
//! records, and the kernel would not have spent them. A wait is timed from a pending
//! slot: per CPU for pure spinlocks (the waiter cannot migrate while it spins), per task for
//! sleeping locks (a mutex waiter may wake on another CPU) — the split `perf lock contention`
//! makes for the same reason.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{fentry, fexit, kprobe, kretprobe, map},
    maps::{HashMap, PerCpuArray},
    programs::{
        tracing::StackIdContext, FEntryContext, FExitContext, ProbeContext, RetProbeContext,
        TracePointContext,
    },
    EbpfContext, Global,
};
use vmtrace_common::{
    contention as c, counter, kind, RangeSet, TpLayout, MAX_FIELDS, RAW_EXTRA_FRAMES,
};

use crate::maps::{bump, emit_values, field, global_ptr, layout_of, now_ns, stack_hits2, STACKS};

/// `lock_addr, flags`.
#[unsafe(no_mangle)]
static LOCK_BEGIN_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// `lock_addr, ret`.
#[unsafe(no_mangle)]
static LOCK_END_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// The same from the raw arguments `lock, flags` and `lock, ret`.
#[unsafe(no_mangle)]
static LOCK_BEGIN_RAW_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
#[unsafe(no_mangle)]
static LOCK_END_RAW_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// The vmap functions a kept wait's stack must pass through.
#[unsafe(no_mangle)]
static LOCK_RANGES: Global<RangeSet> = Global::new(RangeSet::EMPTY);
/// The ring buffer's reserve and submit: a wait whose stack passes through them is on the
/// ring buffer's own lock, taken by vmtrace's programs (which run inside vmap functions, so
/// the wait would pass the filter). It is vmtrace's, not the kernel's, and worse: its end runs
/// on the CPU that now holds that lock, so the contention event could not be reserved (the
/// lock reports the self-deadlock and the reserve fails, counted as lost). Such waits are
/// dropped at their begin.
#[unsafe(no_mangle)]
static SELF_RANGES: Global<RangeSet> = Global::new(RangeSet::EMPTY);

/// Frames the lock filter inspects. The function that takes the lock sits right under the lock
/// primitives: frame 2 for a spinlock (`__pv_queued_spin_lock_slowpath`, `_raw_spin_lock*`),
/// frame 3 for a mutex (`__mutex_lock`, `__mutex_lock_slowpath`, `mutex_lock`) in the stacks
/// recorded on the reference machine (tests/fixtures/contention/stacks.txt); 6 leaves margin.
/// A deeper match would only be a vmap function further up, i.e. a wait on some other lock
/// taken by code the vmap function called (an interrupt, the page allocator), which the
/// classifier calls "other" anyway. Walking 6 frames instead of 16 is what most of the
/// filter's cost was, paid on every contention in the system.
const LOCK_FILTER_FRAMES: usize = 6;
/// The same depth below a raw tracepoint's (or fentry's) own frames.
const LOCK_FILTER_FRAMES_RAW: usize = LOCK_FILTER_FRAMES + RAW_EXTRA_FRAMES;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Pending {
    begin_ns: u64,
    /// From this wait's first clock read in `contention_begin` to `begin_ns`: the program's
    /// stack walk, which the waiter spends before `begin_ns` as part of its wait.
    probe_ns: u64,
    lock: u64,
    flags: u64,
    stack_id: i64,
    matched: u64,
}

/// What the stack filter decided per lock address, on this CPU: how many waits on it it
/// dropped, or [`KEPT`] once one passed. Most contention in the system is on a handful of hot
/// locks that are never vmap locks (zone and slab locks, BPF's id locks under the stress mix:
/// over 90 % of `contention_begin` hits on the reference machine), and walking the stack of
/// every wait on them was most of the lock probe's cost. After [`SKIP_AFTER`] drops and no
/// keep, a lock's waits are dropped without the walk, except every [`RECHECK`]th, so a lock
/// taken on vmap paths too (`init_mm.page_table_lock`) is still found and then never skipped.
/// The vmap locks are static or per node and never move, so an address keeps its meaning.
///
/// A direct-mapped per-CPU cache ([`VERDICT_SLOTS`] slots, by a hash of the address): no lock
/// and no allocation on the lookup, where the LRU hash map it replaced took a bucket lock and
/// cost a third of the program on every contended lock in the system. Two hot locks that share
/// a slot evict each other and are walked again; that only costs time.
#[map]
static LOCK_VERDICT: PerCpuArray<Verdict> = PerCpuArray::with_max_entries(VERDICT_SLOTS, 0);
const VERDICT_SLOTS: u32 = 1024;
/// [`Verdict::drops`] of a lock with at least one wait kept.
const KEPT: u64 = u64::MAX;
const SKIP_AFTER: u64 = 64;
const RECHECK: u64 = 64;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Verdict {
    lock: u64,
    drops: u64,
}

/// This CPU's verdict slot for `lock`, whoever holds it now.
#[inline(always)]
fn verdict_slot(lock: u64) -> Option<*mut Verdict> {
    // Fibonacci hashing: lock addresses are 8-byte aligned and clustered.
    let h = (lock.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as u32;
    LOCK_VERDICT.get_ptr_mut(h & (VERDICT_SLOTS - 1))
}

/// Whether the filter may drop this wait without walking the stack; counts the drop.
#[inline(always)]
fn skip_walk(lock: u64) -> bool {
    let Some(v) = verdict_slot(lock) else {
        return false;
    };
    // SAFETY: this CPU's slot; programs run with migration disabled.
    unsafe {
        if (*v).lock != lock {
            return false;
        }
        let drops = (*v).drops;
        if drops == KEPT || drops < SKIP_AFTER {
            return false;
        }
        (*v).drops = drops + 1;
        drops % RECHECK != 0
    }
}

/// Records the filter's verdict on a walked wait.
#[inline(always)]
fn record_verdict(lock: u64, kept: bool) {
    let Some(v) = verdict_slot(lock) else {
        return;
    };
    // SAFETY: as in `skip_walk`.
    unsafe {
        if (*v).lock != lock {
            *v = Verdict {
                lock,
                drops: if kept { KEPT } else { 1 },
            };
        } else if kept {
            (*v).drops = KEPT;
        } else if (*v).drops != KEPT {
            (*v).drops += 1;
        }
    }
}

/// vmap lock addresses user space has classified from enough walked stacks (the value is the
/// class's code, for `bpftool`; the program only tests membership). A wait on one of them is
/// kept without the stack walk: the vmap locks are static or per node and never move, and the
/// walk cost the waiter microseconds that the kernel, unprobed, would not spend, so every
/// recorded contention kept the operations that met apart for longer than they were. Entries
/// for `3 × nodes + 2` locks at most; 4096 leaves room for any node count.
#[map]
pub(crate) static KNOWN_LOCKS: HashMap<u64, u32> = HashMap::with_max_entries(4096, 0);

/// Pending spinlock waits, one per CPU (`lock == 0`: none).
#[map]
static PENDING_CPU: PerCpuArray<Pending> = PerCpuArray::with_max_entries(1, 0);

/// Pending sleeping-lock waits, by thread id.
#[map]
static PENDING_TASK: HashMap<u32, Pending> = HashMap::with_max_entries(4096, 0);

#[inline(always)]
fn begin_wait<C: EbpfContext + StackIdContext, const DEPTH: usize>(ctx: &C, lock: u64, flags: u64) {
    // First, as it is the cheapest test and drops most waits: it leaves no state behind, so
    // a nested begin it drops changes nothing either.
    if skip_walk(lock) {
        bump(counter::CONTENTION_FILTERED);
        return;
    }
    let per_cpu = flags & (c::F_SPIN | c::F_MUTEX) == c::F_SPIN;
    let tid = bpf_get_current_pid_tgid() as u32;
    if per_cpu {
        if let Some(p) = PENDING_CPU.get_ptr(0) {
            // SAFETY: this CPU's slot.
            if unsafe { (*p).lock } != 0 {
                bump(counter::CONTENTION_NESTED);
                return;
            }
        }
    } else if PENDING_TASK.get_ptr(tid).is_some() {
        // A mutex reports a spinning phase and then a sleeping phase: keep the first begin.
        bump(counter::CONTENTION_NESTED);
        return;
    }
    // Before the walk, which takes longer than most waits: user space gets the waiter's time
    // here as `probe_ns`, so a wait whose lock was released during the walk still shows it.
    let entry_ns = now_ns();
    if KNOWN_LOCKS.get_ptr(lock).is_some() {
        // The wait starts here; the lookup's few ns are part of it, as they are of the spin.
        bump(counter::CONTENTION_KNOWN);
        store_pending(
            per_cpu,
            tid,
            Pending {
                begin_ns: entry_ns,
                probe_ns: 0,
                lock,
                flags,
                stack_id: c::STACK_NOT_WALKED,
                matched: u64::MAX,
            },
        );
        return;
    }
    let (hit, own) =
        stack_hits2::<C, DEPTH>(ctx, global_ptr(&LOCK_RANGES), global_ptr(&SELF_RANGES));
    let Some(matched) = hit.filter(|_| !own) else {
        record_verdict(lock, false);
        bump(counter::CONTENTION_FILTERED);
        return;
    };
    record_verdict(lock, true);
    let stack_id = store_stack(ctx);
    let begin_ns = now_ns();
    store_pending(
        per_cpu,
        tid,
        Pending {
            begin_ns,
            probe_ns: begin_ns.saturating_sub(entry_ns),
            lock,
            flags,
            stack_id,
            matched,
        },
    );
}

/// Frames a wait's stack may lose to find a free bucket (see [`store_stack`]).
const MAX_SKIP: u64 = 2;
const EEXIST: i64 = 17;

/// Stores the waiter's stack and returns its id, or the last errno. The stack map has no
/// `BPF_F_REUSE_STACKID`, so an id user space has resolved stays valid; but then a stack whose
/// hash bucket another stack took first fails every time, and a popular vmap stack can lose
/// its bucket to a rare one in any run. Dropping the innermost frame (the tracepoint's own
/// frames, or a lock primitive above the acquirer the classifier looks for) changes the hash.
#[inline(always)]
fn store_stack<C: EbpfContext + StackIdContext>(ctx: &C) -> i64 {
    let mut last = 0;
    for skip in 0..=MAX_SKIP {
        match ctx.get_stackid(&STACKS, skip) {
            Ok(id) => return id,
            Err(e) => last = e as i64,
        }
        if last != -EEXIST {
            break;
        }
    }
    bump(counter::STACK_MAP_FAIL);
    last
}

#[inline(always)]
fn store_pending(per_cpu: bool, tid: u32, pending: Pending) {
    if per_cpu {
        if let Some(p) = PENDING_CPU.get_ptr_mut(0) {
            // SAFETY: this CPU's slot.
            unsafe { *p = pending };
        }
    } else {
        let _ = PENDING_TASK.insert(tid, pending, 0);
    }
}

#[inline(always)]
fn end_wait<C: EbpfContext>(ctx: &C, lock: u64, ret: u64) -> Result<(), i32> {
    let mut found = None;
    if let Some(p) = PENDING_CPU.get_ptr_mut(0) {
        // SAFETY: this CPU's slot.
        unsafe {
            if (*p).lock == lock && lock != 0 {
                found = Some(*p);
                (*p).lock = 0;
            }
        }
    }
    if found.is_none() {
        let tid = bpf_get_current_pid_tgid() as u32;
        if let Some(p) = PENDING_TASK.get_ptr(tid) {
            // SAFETY: a map value pointer, valid until the delete below.
            let p = unsafe { *p };
            if p.lock == lock {
                found = Some(p);
                let _ = PENDING_TASK.remove(tid);
            }
        }
    }
    let Some(p) = found else {
        return Ok(());
    };
    let now = now_ns();
    let mut v = [0u64; MAX_FIELDS];
    v[c::LOCK] = p.lock;
    v[c::FLAGS] = p.flags;
    v[c::WAIT_NS] = now.saturating_sub(p.begin_ns);
    v[c::STACK_ID] = p.stack_id as u64;
    v[c::BEGIN_NS] = p.begin_ns;
    v[c::RET] = ret;
    v[c::MATCHED] = p.matched;
    v[c::PROBE_NS] = p.probe_ns;
    emit_values(ctx, kind::CONTENTION, &v)
}

#[inline(always)]
fn on_contention_begin<const RAW: bool>(ctx: TracePointContext) -> u32 {
    let layout = layout_of::<RAW>(&LOCK_BEGIN_LAYOUT, &LOCK_BEGIN_RAW_LAYOUT);
    let lock = field::<RAW, 0>(&ctx, layout);
    let flags = field::<RAW, 1>(&ctx, layout);
    if lock != 0 {
        if RAW {
            begin_wait::<_, LOCK_FILTER_FRAMES_RAW>(&ctx, lock, flags);
        } else {
            begin_wait::<_, LOCK_FILTER_FRAMES>(&ctx, lock, flags);
        }
    }
    0
}

#[inline(always)]
fn on_contention_end<const RAW: bool>(ctx: TracePointContext) -> u32 {
    let layout = layout_of::<RAW>(&LOCK_END_LAYOUT, &LOCK_END_RAW_LAYOUT);
    let lock = field::<RAW, 0>(&ctx, layout);
    let ret = field::<RAW, 1>(&ctx, layout);
    match end_wait(&ctx, lock, ret) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

tracepoint_programs!(
    "lock",
    "contention_begin",
    lock_contention_begin,
    raw_lock_contention_begin,
    on_contention_begin
);
tracepoint_programs!(
    "lock",
    "contention_end",
    lock_contention_end,
    raw_lock_contention_end,
    on_contention_end
);

// Richer rungs: entry and exit of the queued-spinlock slow path (`__pv_queued_spin_lock_slowpath`
// or `native_queued_spin_lock_slowpath`, chosen by user space at load/attach time). They see
// spinlocks only (the mutex slow path has its own tracepoints), so the tracepoint rung is what
// covers `vmap_purge_lock`.

/// The lock argument of a BTF-typed (fentry/fexit) program as a plain number. The verifier
/// types `ctx.arg(0)` as a `struct qspinlock *` and refuses any arithmetic on it, and the
/// pending-slot hash multiplies the address. Reading the same context slot through
/// `bpf_probe_read_kernel` yields an untyped scalar with the same value.
#[inline(always)]
pub(crate) fn btf_lock_arg<C: EbpfContext>(ctx: &C) -> u64 {
    // SAFETY: the first u64 slot of a tracing context is the first argument; the helper
    // checks the read and zeroes the result on failure.
    unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(ctx.as_ptr() as *const u64) }.unwrap_or(0)
}

#[fentry]
pub fn fentry_spin_slowpath(ctx: FEntryContext) -> u32 {
    let lock = btf_lock_arg(&ctx);
    if lock == 0 {
        return 0;
    }
    begin_wait::<_, LOCK_FILTER_FRAMES_RAW>(&ctx, lock, c::F_SPIN);
    0
}

#[fexit]
pub fn fexit_spin_slowpath(ctx: FExitContext) -> u32 {
    let lock = btf_lock_arg(&ctx);
    match end_wait(&ctx, lock, 0) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

#[kprobe]
pub fn kprobe_spin_slowpath(ctx: ProbeContext) -> u32 {
    if let Some(lock) = ctx.arg::<u64>(0) {
        begin_wait::<_, LOCK_FILTER_FRAMES>(&ctx, lock, c::F_SPIN);
    }
    0
}

/// A kretprobe cannot see the argument, but the slow path runs with preemption off, so the
/// per-CPU pending slot is the one the matching entry filled.
#[kretprobe]
pub fn kretprobe_spin_slowpath(ctx: RetProbeContext) -> u32 {
    let lock = PENDING_CPU
        .get_ptr(0)
        // SAFETY: this CPU's slot.
        .map(|p| unsafe { (*p).lock })
        .unwrap_or(0);
    if lock == 0 {
        return 0;
    }
    match end_wait(&ctx, lock, 0) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}
