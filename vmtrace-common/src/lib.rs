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
    /// One past the largest kind; sizes the per-kind lost-event counters.
    pub const COUNT: u32 = 4;
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
    pub const LOST: &str = "LOST";
    pub const PROG_ALLOC: &str = "vmalloc_alloc_vmap_area";
    pub const PROG_FREE: &str = "vmalloc_free_vmap_area_noflush";
    pub const PROG_PURGE: &str = "vmalloc_purge_vmap_area_lazy";
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: all three are #[repr(C)] plain-old-data with explicit padding and no pointers.
    unsafe impl aya::Pod for super::FieldLoc {}
    unsafe impl aya::Pod for super::TpLayout {}
    unsafe impl aya::Pod for super::Event {}
}

// The wire layout must have no implicit padding: check the sizes the fields add up to.
const _: () = assert!(core::mem::size_of::<FieldLoc>() == 4);
const _: () = assert!(core::mem::size_of::<TpLayout>() == 4 * MAX_FIELDS);
const _: () = assert!(core::mem::size_of::<Event>() == 8 + 4 * 4 + COMM_LEN + 8 * MAX_FIELDS);
