//! Probes on the three `vmalloc` tracepoints (`include/trace/events/vmalloc.h`, since v6.2;
//! checked on 6.18).
//!
//! Field offsets are not compiled in: user space parses each tracepoint's `format` file and sets
//! the `*_LAYOUT` globals before load, because the record layout is kernel-build specific.

use aya_ebpf::Global;
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

/// Declares the program of one vmalloc tracepoint: one event of `kind` with the fields of
/// `layout`; a failed emit was already counted in LOST.
macro_rules! vmalloc_tracepoint {
    ($prog:ident, $name:literal, $kind:expr, $layout:ident) => {
        tracepoint_pass_on! {
            "vmalloc",
            $name,
            pub fn $prog(ctx: TracePointContext) -> u32 {
                match emit(&ctx, $kind, &$layout.load()) {
                    Ok(()) => 0,
                    Err(_) => 1,
                }
            }
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
