//! Probes on the three `vmalloc` tracepoints (`include/trace/events/vmalloc.h`, since v6.2;
//! checked on 6.18).
//!
//! Field offsets are not compiled in: user space parses each tracepoint's `format` file and sets
//! the `*_LAYOUT` globals before load, because the record layout is kernel-build specific.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext, Global};
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

#[tracepoint(category = "vmalloc", name = "alloc_vmap_area")]
pub fn vmalloc_alloc_vmap_area(ctx: TracePointContext) -> u32 {
    match emit(&ctx, kind::ALLOC, &ALLOC_LAYOUT.load()) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

#[tracepoint(category = "vmalloc", name = "free_vmap_area_noflush")]
pub fn vmalloc_free_vmap_area_noflush(ctx: TracePointContext) -> u32 {
    match emit(&ctx, kind::FREE, &FREE_LAYOUT.load()) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

#[tracepoint(category = "vmalloc", name = "purge_vmap_area_lazy")]
pub fn vmalloc_purge_vmap_area_lazy(ctx: TracePointContext) -> u32 {
    match emit(&ctx, kind::PURGE, &PURGE_LAYOUT.load()) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}
