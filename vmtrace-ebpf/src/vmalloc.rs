//! Probes on the three `vmalloc` tracepoints (`include/trace/events/vmalloc.h`, since v6.2;
//! checked on 6.18).
//!
//! Field offsets are not compiled in: user space parses each tracepoint's `format` file and sets
//! the `*_LAYOUT` globals before load, because the record layout is kernel-build specific.

use aya_ebpf::{programs::TracePointContext, Global};
use vmtrace_common::{kind, TpLayout};

use crate::maps::emit;

/// `addr, size, align, vstart, vend, failed`.
#[unsafe(no_mangle)]
static ALLOC_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// `va_start, nr_lazy, nr_lazy_max`.
#[unsafe(no_mangle)]
static FREE_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// `start, end, npurged`.
#[unsafe(no_mangle)]
static PURGE_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);

/// Return value of a tracepoint program: 1 lets the kernel go on to deliver the event to perf
/// and ftrace users of the same tracepoint; 0 would suppress it for all of them
/// (`perf_trace_run_bpf_submit`), so `perf record -e vmalloc:*` would see nothing while vmtrace
/// records. aya-ebpf 0.2's `#[tracepoint]` macro always returns 0, hence the hand-written
/// entry points below.
const PASS_ON: u32 = 1;

/// Declares a tracepoint program in section `tracepoint/<category>/<name>` that emits one
/// event of `kind` with the fields of `layout` and passes the event on.
macro_rules! vmalloc_tracepoint {
    ($prog:ident, $name:literal, $kind:expr, $layout:ident) => {
        #[unsafe(no_mangle)]
        #[unsafe(link_section = concat!("tracepoint/vmalloc/", $name))]
        pub fn $prog(ctx: *mut core::ffi::c_void) -> u32 {
            let ctx = TracePointContext::new(ctx);
            // A failed emit was already counted in LOST; the event still goes on to others.
            let _ = emit(&ctx, $kind, &$layout.load());
            PASS_ON
        }
    };
}

vmalloc_tracepoint!(
    vmalloc_alloc_vmap_area,
    "alloc_vmap_area",
    kind::ALLOC,
    ALLOC_LAYOUT
);
vmalloc_tracepoint!(
    vmalloc_free_vmap_area_noflush,
    "free_vmap_area_noflush",
    kind::FREE,
    FREE_LAYOUT
);
vmalloc_tracepoint!(
    vmalloc_purge_vmap_area_lazy,
    "purge_vmap_area_lazy",
    kind::PURGE,
    PURGE_LAYOUT
);
