//! Maps shared by every probe, and the emit path that fills them.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_boot_ns},
    macros::map,
    maps::{PerCpuArray, RingBuf, StackTrace},
    programs::TracePointContext,
    EbpfContext, Global,
};
use aya_log_ebpf::warn;
use core::ptr;
use vmtrace_common::{
    counter, kind, AddrRange, Event, FieldLoc, RangeSet, TpLayout, COMM_LEN, FILTER_FRAMES,
    MAX_FIELDS, MAX_ORDER_SLOTS, MAX_RANGES,
};

/// The event rings, one per CPU up to [`vmtrace_common::RINGS`] (see there for why). User space
/// sizes them at load time (`--ring-size` is their total, split over the rings in use) and
/// shrinks the unused ones to one page.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(16 * 1024 * 1024, 0);
#[map]
pub static EVENTS_1: RingBuf = RingBuf::with_byte_size(4096, 0);
#[map]
pub static EVENTS_2: RingBuf = RingBuf::with_byte_size(4096, 0);
#[map]
pub static EVENTS_3: RingBuf = RingBuf::with_byte_size(4096, 0);
#[map]
pub static EVENTS_4: RingBuf = RingBuf::with_byte_size(4096, 0);
#[map]
pub static EVENTS_5: RingBuf = RingBuf::with_byte_size(4096, 0);
#[map]
pub static EVENTS_6: RingBuf = RingBuf::with_byte_size(4096, 0);
#[map]
pub static EVENTS_7: RingBuf = RingBuf::with_byte_size(4096, 0);

/// How many rings are in use (1..=RINGS), set by user space from the possible CPUs.
#[unsafe(no_mangle)]
static NR_RINGS: Global<u32> = Global::new(1);

/// Unread bytes in a ring at which a submit wakes the reader (user space sets it to a sixteenth
/// of a ring).
///
/// By default every submit that finds the reader caught up queues an irq_work to wake it: one
/// wakeup and one context switch per event at 100k+ events/s, which cost more than the probes
/// themselves (`vmtrace top` spent 46 % of its samples in `finish_task_switch`). Readers drain on
/// a 100 ms timer anyway, so below this much data the event waits for that timer.
#[unsafe(no_mangle)]
static WAKEUP_BYTES: Global<u64> = Global::new(1 << 20);

/// Runs `$body` with `$ring` bound to this CPU's event ring. The body is expanded once per ring
/// rather than picking a ring reference first: the verifier must see a constant map at every
/// ring helper call, and LLVM may turn a match of references into a load from a table.
macro_rules! on_ring {
    ($ring:ident => $body:expr) => {
        on_ring!(@arms $ring, $body; 1 EVENTS_1, 2 EVENTS_2, 3 EVENTS_3, 4 EVENTS_4, 5 EVENTS_5,
                 6 EVENTS_6, 7 EVENTS_7)
    };
    (@arms $ring:ident, $body:expr; $($i:literal $map:ident),*) => {{
        let n = NR_RINGS.load();
        let i = if n > 1 { this_cpu() % u64::from(n) } else { 0 };
        match i {
            $($i => {
                let $ring = &$map;
                $body
            })*
            _ => {
                let $ring = &EVENTS;
                $body
            }
        }
    }};
}

/// Reserve failures per CPU, indexed by event kind. Read by user space for the footer and the TUI.
#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(kind::COUNT, 0);

/// Filter and stack-map accounting, per CPU, indexed by `vmtrace_common::counter`.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Kernel stacks of the contention events that passed the filter; the event carries the id and
/// user space resolves the frames once per id. Ids are a hash of the stack, so the map holds
/// distinct stacks only; a full map or a taken bucket is counted, never silent.
#[map]
pub static STACKS: StackTrace = StackTrace::with_max_entries(8192, 0);

/// Scratch space for the in-kernel stack filters (`bpf_get_stack`), one per CPU: too big for
/// the 512-byte BPF stack.
#[map]
pub static FRAMES: PerCpuArray<[u64; FILTER_FRAMES]> = PerCpuArray::with_max_entries(1, 0);

/// Orders of vmalloc backing-page allocations, per CPU: a histogram, not events, because a
/// large vmalloc allocates thousands of pages and only the distribution is wanted.
#[map]
pub static BACKING_ORDERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_ORDER_SLOTS, 0);

/// CLOCK_BOOTTIME now, the clock of every event timestamp.
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_boot_ns() }
}

#[inline(always)]
pub fn this_cpu() -> u64 {
    // SAFETY: a helper without arguments.
    u64::from(unsafe { bpf_get_smp_processor_id() })
}

#[inline(always)]
pub fn bump(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; programs run with migration disabled.
        unsafe { *slot += 1 };
    }
}

/// A pointer to a read-only global's value, for tables too large to copy onto the 512-byte
/// BPF stack with `Global::load`. Fields are then read with `read_volatile`, so the compiler
/// cannot fold in the compile-time placeholder the loader overrides.
#[inline(always)]
pub fn global_ptr<T>(g: &Global<T>) -> *const T {
    // `Global<T>` is `repr(transparent)` over `MaybeUninit<T>`.
    (g as *const Global<T>).cast()
}

/// The layout global a tracepoint program reads: `raw` (argument slots from BTF) in the raw
/// tracepoint twin, `perf` (offsets from the `format` file) in the perf tracepoint program.
#[inline(always)]
pub fn layout_of<const RAW: bool>(
    perf: &Global<TpLayout>,
    raw: &Global<TpLayout>,
) -> *const TpLayout {
    global_ptr(if RAW { raw } else { perf })
}

/// Index of the range of `set` holding `f`, if any.
#[inline(always)]
fn range_index(set: *const RangeSet, f: u64) -> Option<u64> {
    // SAFETY: `set` points at a global of the right type (see `global_ptr`); `j < MAX_RANGES`.
    unsafe {
        let lo = ptr::read_volatile(ptr::addr_of!((*set).lo));
        let hi = ptr::read_volatile(ptr::addr_of!((*set).hi));
        if f < lo || f >= hi {
            return None;
        }
        let count = ptr::read_volatile(ptr::addr_of!((*set).count)) as usize;
        let base = ptr::addr_of!((*set).ranges).cast::<AddrRange>();
        for j in 0..MAX_RANGES {
            if j >= count {
                break;
            }
            let r = ptr::read_volatile(base.add(j));
            if f >= r.start && f < r.end {
                return Some(j as u64);
            }
        }
    }
    None
}

/// Reads the innermost `DEPTH` frames (at most [`FILTER_FRAMES`]) of the current kernel stack
/// into this CPU's scratch buffer; returns it with the number of frames. The unwinder stops at
/// `DEPTH`, and its cost grows with every frame, so each filter asks for no more than it needs.
#[inline(always)]
fn read_stack<C: EbpfContext, const DEPTH: usize>(ctx: &C) -> Option<(*const u64, usize)> {
    let buf = FRAMES.get_ptr_mut(0)?;
    let depth = if DEPTH < FILTER_FRAMES {
        DEPTH
    } else {
        FILTER_FRAMES
    };
    // SAFETY: `buf` is this CPU's scratch slot of FILTER_FRAMES u64s, and depth <= that.
    let n = unsafe {
        aya_ebpf::helpers::bpf_get_stack(ctx.as_ptr(), buf.cast(), (depth * 8) as u32, 0)
    };
    if n <= 0 {
        bump(counter::STACK_READ_FAIL);
        return None;
    }
    Some((buf.cast::<u64>().cast_const(), (n as usize) / 8))
}

/// Walks the innermost `DEPTH` frames of the current kernel stack once and returns the index of
/// the first range of `a` that holds a frame, and whether any frame is in `b`. Loops are bounded
/// by constants and pointers are offset, never indexed, so there is no bounds check (and no
/// panic path) for the verifier to reject.
#[inline(always)]
pub fn stack_hits2<C: EbpfContext, const DEPTH: usize>(
    ctx: &C,
    a: *const RangeSet,
    b: *const RangeSet,
) -> (Option<u64>, bool) {
    let Some((buf, frames)) = read_stack::<C, DEPTH>(ctx) else {
        return (None, false);
    };
    let mut hit_a = None;
    let mut hit_b = false;
    for i in 0..FILTER_FRAMES {
        if i >= frames {
            break;
        }
        // SAFETY: i < FILTER_FRAMES, inside the scratch buffer.
        let f = unsafe { *buf.add(i) };
        if hit_a.is_none() {
            hit_a = range_index(a, f);
        }
        if !hit_b {
            hit_b = range_index(b, f).is_some();
        }
    }
    (hit_a, hit_b)
}

/// `bpf_ringbuf_query` / `bpf_ringbuf_submit` flags (`include/uapi/linux/bpf.h`).
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

#[inline(always)]
fn submit_flags(ring: &RingBuf) -> u64 {
    if ring.query(BPF_RB_AVAIL_DATA) >= WAKEUP_BYTES.load() {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// Writes the task context every event carries (time, kind, CPU, tgid/pid, comm).
#[inline(always)]
fn fill_context(ev: *mut Event, event_kind: u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: callers pass a reserved, exclusively owned ring-buffer record.
    unsafe {
        (*ev).ts_ns = bpf_ktime_get_boot_ns();
        (*ev).kind = event_kind;
        (*ev).cpu = bpf_get_smp_processor_id();
        (*ev).tgid = (pid_tgid >> 32) as u32;
        (*ev).pid = pid_tgid as u32;
        // The raw helper, writing straight into the record: the safe wrapper zero-fills a
        // stack copy byte by byte and then copies it, which cost about 80 ns per event (a
        // sixth of the program) on the reference machine. On failure the helper zeroes the
        // buffer itself.
        aya_ebpf::helpers::generated::bpf_get_current_comm(
            ptr::addr_of_mut!((*ev).comm).cast(),
            COMM_LEN as u32,
        );
    }
}

/// Writes one event whose payload the probe computed itself (not copied from a tracepoint).
#[inline(always)]
pub fn emit_values<C: EbpfContext>(
    ctx: &C,
    event_kind: u32,
    values: &[u64; MAX_FIELDS],
) -> Result<(), i32> {
    on_ring!(ring => {
        let Some(mut entry) = ring.reserve::<Event>(0) else {
            count_lost(ctx, event_kind);
            return Err(-1);
        };
        let ev = entry.as_mut_ptr();
        fill_context(ev, event_kind);
        // SAFETY: `ev` points at a reserved, exclusively owned record of the right size.
        unsafe {
            (*ev).fields = *values;
        }
        entry.submit(submit_flags(ring));
        Ok(())
    })
}

/// Reads one tracepoint field at the offset the `format` file gave (perf tracepoint) or of its
/// argument slot (raw tracepoint: 8 bytes, already widened by the kernel), widened to 64 bits.
#[inline(always)]
pub fn read_field(ctx: &TracePointContext, loc: &FieldLoc) -> Result<u64, i32> {
    let off = loc.offset as usize;
    // SAFETY: the offsets come from the running kernel's `format` file for this very tracepoint,
    // and bpf_probe_read_kernel turns a bad address into an error rather than a fault.
    unsafe {
        Ok(match (loc.size, loc.signed != 0) {
            (8, _) => ctx.read_at::<u64>(off)?,
            (4, true) => ctx.read_at::<i32>(off)? as i64 as u64,
            (4, false) => ctx.read_at::<u32>(off)? as u64,
            (2, true) => ctx.read_at::<i16>(off)? as i64 as u64,
            (2, false) => ctx.read_at::<u16>(off)? as u64,
            (1, true) => ctx.read_at::<i8>(off)? as i64 as u64,
            (1, false) => ctx.read_at::<u8>(off)? as u64,
            _ => 0,
        })
    }
}

/// Field `I` of a tracepoint whose layout is the global behind `layout` (see [`global_ptr`]).
/// On a raw tracepoint whose argument `I` holds it (the kernel's order for every probe here),
/// it is one constant-offset context load: these programs run for every contended lock, work
/// item and page in the system, and a `bpf_probe_read_kernel` per field plus a copy of the
/// whole layout were most of their run time. Any other layout takes the general read.
///
/// The kernel refuses to attach a raw program that loads past its tracepoint's last argument,
/// so user space attaches a twin raw only where BTF declares at least `I + 1` arguments
/// (`RawTwin::direct_slots`).
#[inline(always)]
pub fn field<const RAW: bool, const I: usize>(
    ctx: &TracePointContext,
    layout: *const TpLayout,
) -> u64 {
    // SAFETY: `layout` points at a global `TpLayout`, whose MAX_FIELDS entries lead it.
    let loc = unsafe { ptr::read_volatile(layout.cast::<FieldLoc>().add(I)) };
    if RAW && loc.size == 8 && usize::from(loc.offset) == I * 8 {
        // SAFETY: a raw tracepoint's context is its `u64` argument array, with more than `I`
        // slots where this program is attached (see above).
        return unsafe { *ctx.as_ptr().cast::<u64>().add(I) };
    }
    if loc.size == 0 {
        return 0;
    }
    read_field(ctx, &loc).unwrap_or(0)
}

/// Where the one bulk read starts. A perf tracepoint's record begins with the 8-byte common
/// header (`common_type`, `common_flags`, `common_preempt_count`, `common_pid`), after which
/// every tracepoint's own fields begin; a raw tracepoint's context is the argument array
/// itself.
const fn window_start<const RAW: bool>() -> usize {
    if RAW {
        0
    } else {
        8
    }
}
/// How many bytes the bulk read copies. The three vmalloc records need at most 44 (the six
/// fields of `alloc_vmap_area` on 6.18), their raw arguments 48; a field outside the window is
/// read on its own.
const WINDOW: usize = 64;

/// The field `loc` out of the bulk copy `window` of the record, or `None` when it lies outside
/// the window (a kernel whose layout is wider than expected: the caller reads it on its own).
///
/// Every arm checks its own bound, so the verifier sees a constant-bounded offset into the
/// stack buffer.
#[inline(always)]
fn from_window<const RAW: bool>(window: &[u64; WINDOW / 8], loc: &FieldLoc) -> Option<u64> {
    let off = loc.offset as usize;
    if off < window_start::<RAW>() {
        return None;
    }
    let rel = off - window_start::<RAW>();
    let base = window.as_ptr().cast::<u8>();
    // SAFETY: each arm bounds `rel` so the read stays inside `window`. Indexing in units of the
    // field's size (not bytes) lets the verifier prove the alignment it demands of
    // variable-offset stack reads; user space refuses a layout whose fields are not naturally
    // aligned (`build_layout`), so the index loses no low bits.
    unsafe {
        Some(match (loc.size, loc.signed != 0) {
            (8, _) if rel <= WINDOW - 8 => *base.cast::<u64>().add(rel >> 3),
            (4, s) if rel <= WINDOW - 4 => {
                let v = *base.cast::<u32>().add(rel >> 2);
                if s {
                    v as i32 as i64 as u64
                } else {
                    u64::from(v)
                }
            }
            (2, s) if rel <= WINDOW - 2 => {
                let v = *base.cast::<u16>().add(rel >> 1);
                if s {
                    v as i16 as i64 as u64
                } else {
                    u64::from(v)
                }
            }
            (1, s) if rel < WINDOW => {
                let v = *base.add(rel);
                if s {
                    v as i8 as i64 as u64
                } else {
                    u64::from(v)
                }
            }
            _ => return None,
        })
    }
}

/// Copies the first `N` raw tracepoint arguments, in order, plus the task context into a
/// ring-buffer record: the fast path for a raw layout that is exactly that (user space checks,
/// `RAW_DIRECT`). Constant-offset context loads, no helper call and no scratch buffer: the
/// general [`emit`] spent a third of its run time zero-filling and picking its bulk copy.
///
/// The kernel refuses to attach a raw program that loads past its tracepoint's last argument,
/// so user space attaches this one only where BTF declares at least `N`.
#[inline(always)]
pub fn emit_args<const N: usize>(ctx: &TracePointContext, event_kind: u32) -> Result<(), i32> {
    on_ring!(ring => {
        let Some(mut entry) = ring.reserve::<Event>(0) else {
            count_lost(ctx, event_kind);
            return Err(-1);
        };
        let ev = entry.as_mut_ptr();
        fill_context(ev, event_kind);
        let args = ctx.as_ptr().cast::<u64>().cast_const();
        // SAFETY: a raw tracepoint's context is its `u64` argument array with at least `N` slots
        // (checked at attach), and `ev` is a reserved, exclusively owned record.
        unsafe {
            let fields = ptr::addr_of_mut!((*ev).fields).cast::<u64>();
            for i in 0..MAX_FIELDS {
                let v = if i < N { *args.add(i) } else { 0 };
                // Volatile: LLVM turns adjacent zero stores into a `memset` call, which the BPF
                // target links as a byte-at-a-time loop.
                ptr::write_volatile(fields.add(i), v);
            }
        }
        entry.submit(submit_flags(ring));
        Ok(())
    })
}

/// Copies every field named in `layout` plus the task context into a ring-buffer record.
///
/// The record's fields are copied with one `bpf_probe_read_kernel` of [`WINDOW`] bytes and then
/// picked out by offset: one helper call per event instead of one per field (six for
/// `alloc_vmap_area`), which roughly halved the program's run time (`bpf_stats_enabled`
/// `run_time_ns`, see docs/probes.md). Fields outside the window fall back to single reads.
/// The layout is read field by field from its global, not copied: a copy of the whole table
/// cost some eighty instructions per event.
#[inline(always)]
pub fn emit<const RAW: bool>(
    ctx: &TracePointContext,
    event_kind: u32,
    layout: *const TpLayout,
) -> Result<(), i32> {
    on_ring!(ring => {
        let Some(mut entry) = ring.reserve::<Event>(0) else {
            count_lost(ctx, event_kind);
            return Err(-1);
        };
        let ev = entry.as_mut_ptr();
        fill_context(ev, event_kind);
        // Not zero-filled: the helper writes all of it, zeroes included on failure, and a 64-byte
        // zero fill became a byte-at-a-time `memset` loop of some 300 instructions.
        let mut window = core::mem::MaybeUninit::<[u64; WINDOW / 8]>::uninit();
        // SAFETY: the context points at the record in the per-CPU trace buffer (perf tracepoint)
        // or at the argument array on the kernel stack (raw tracepoint), and
        // bpf_probe_read_kernel turns a bad address into an error rather than a fault (and zeroes
        // the destination). Bytes past the record's end are copied but never picked (no field
        // offset points there).
        let copied = unsafe {
            let src = ctx.as_ptr().cast::<u8>().add(window_start::<RAW>());
            aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                window.as_mut_ptr().cast(),
                WINDOW as u32,
                src.cast(),
            ) == 0
        };
        // SAFETY: written by the helper above, on success and on failure alike.
        let window = unsafe { window.assume_init() };
        let locs = layout.cast::<FieldLoc>();
        // SAFETY: `ev` points at a reserved, exclusively owned record of the right size; `locs`
        // points at a global `TpLayout` of MAX_FIELDS entries (see `global_ptr`).
        unsafe {
            let fields = ptr::addr_of_mut!((*ev).fields).cast::<u64>();
            for i in 0..MAX_FIELDS {
                let loc = ptr::read_volatile(locs.add(i));
                let slot = fields.add(i);
                if loc.size == 0 {
                    *slot = 0;
                    continue;
                }
                let quick = if copied {
                    from_window::<RAW>(&window, &loc)
                } else {
                    None
                };
                *slot = match quick {
                    Some(v) => v,
                    None => match read_field(ctx, &loc) {
                        Ok(v) => v,
                        Err(e) => {
                            // Error path only: a failed read means the layout is wrong for this
                            // kernel.
                            warn!(
                                ctx,
                                "vmtrace: reading field {} of kind {} failed: {}", i, event_kind, e
                            );
                            0
                        }
                    },
                };
            }
        }
        entry.submit(submit_flags(ring));
        Ok(())
    })
}

#[inline(always)]
fn count_lost<C: EbpfContext>(ctx: &C, event_kind: u32) {
    if let Some(slot) = LOST.get_ptr_mut(event_kind) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs with preemption off.
        let before = unsafe { *slot };
        unsafe { *slot = before + 1 };
        if before == 0 {
            // Once per CPU and kind, so a full ring buffer does not also flood the log ring.
            warn!(
                ctx,
                "vmtrace: ring buffer full, dropping events of kind {}", event_kind
            );
        }
    }
}
