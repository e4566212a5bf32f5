//! Maps shared by every probe, and the emit path that fills them.

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id,
        bpf_ktime_get_boot_ns,
    },
    macros::map,
    maps::{PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use vmtrace_common::{kind, Event, FieldLoc, TpLayout};

/// 16 MiB holds about 160k events: more than half a second of the fastest user-space stressor on
/// two CPUs, which is the slack the reader needs when it is descheduled. User space may resize it
/// at load time (`--ring-size`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(16 * 1024 * 1024, 0);

/// Reserve failures per CPU, indexed by event kind. Read by user space for the footer and the TUI.
#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(kind::COUNT, 0);

/// Reads one tracepoint field at the offset the `format` file gave, widened to 64 bits.
#[inline(always)]
fn read_field(ctx: &TracePointContext, loc: &FieldLoc) -> Result<u64, i32> {
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

/// Copies every field named in `layout` plus the task context into a ring-buffer record.
#[inline(always)]
pub fn emit(ctx: &TracePointContext, event_kind: u32, layout: &TpLayout) -> Result<(), i32> {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count_lost(ctx, event_kind);
        return Err(-1);
    };
    let ev = entry.as_mut_ptr();
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: `ev` points at a reserved, exclusively owned record of the right size.
    unsafe {
        (*ev).ts_ns = bpf_ktime_get_boot_ns();
        (*ev).kind = event_kind;
        (*ev).cpu = bpf_get_smp_processor_id();
        (*ev).tgid = (pid_tgid >> 32) as u32;
        (*ev).pid = pid_tgid as u32;
        (*ev).comm = bpf_get_current_comm().unwrap_or([0; 16]);
        // Iterating the two fixed-size arrays together leaves no bounds check (and so no
        // panic path) for the verifier to reject.
        for (i, (slot, loc)) in (*ev)
            .fields
            .iter_mut()
            .zip(layout.fields.iter())
            .enumerate()
        {
            *slot = match read_field(ctx, loc) {
                Ok(v) => v,
                Err(e) => {
                    // Error path only: a failed read means the layout is wrong for this kernel.
                    warn!(
                        ctx,
                        "vmtrace: reading field {} of kind {} failed: {}", i, event_kind, e
                    );
                    0
                }
            };
        }
    }
    entry.submit(0);
    Ok(())
}

#[inline(always)]
fn count_lost(ctx: &TracePointContext, event_kind: u32) {
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
