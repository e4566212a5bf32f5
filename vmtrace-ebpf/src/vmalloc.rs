//! Probes on the three `vmalloc` tracepoints (`include/trace/events/vmalloc.h`, since v6.2;
//! checked on 6.18).
//!
//! Field offsets are not compiled in: user space parses each tracepoint's `format` file and sets
//! the `*_LAYOUT` globals before load, because the record layout is kernel-build specific.

use aya_ebpf::Global;
use vmtrace_common::{kind, TpLayout};

use crate::maps::{emit, emit_args, layout_of};

/// `addr, size, align, vstart, vend, failed`.
#[unsafe(no_mangle)]
static ALLOC_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
#[unsafe(no_mangle)]
static ALLOC_RAW_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// `va_start, nr_lazy, nr_lazy_max`.
#[unsafe(no_mangle)]
static FREE_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
#[unsafe(no_mangle)]
static FREE_RAW_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// `start, end, npurged`.
#[unsafe(no_mangle)]
static PURGE_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
#[unsafe(no_mangle)]
static PURGE_RAW_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// Bit `kind` set: that tracepoint's raw layout is its first arguments in order, which the raw
/// program then copies without consulting the layout (`emit_args`). Set by user space.
#[unsafe(no_mangle)]
static RAW_DIRECT: Global<u32> = Global::new(0);

/// Declares the programs of one vmalloc tracepoint: one event of `kind` with the fields of
/// `layout` (`raw_layout` on the raw tracepoint, or its first `$direct` arguments as they are
/// when user space set the `RAW_DIRECT` bit); a failed emit was already counted in LOST.
macro_rules! vmalloc_tracepoint {
    ($handler:ident, $prog:ident, $raw:ident, $name:literal, $kind:expr, $layout:ident, $raw_layout:ident, $direct:literal) => {
        #[inline(always)]
        fn $handler<const RAW: bool>(ctx: aya_ebpf::programs::TracePointContext) -> u32 {
            let done = if RAW && RAW_DIRECT.load() & (1 << $kind) != 0 {
                emit_args::<$direct>(&ctx, $kind)
            } else {
                emit::<RAW>(&ctx, $kind, layout_of::<RAW>(&$layout, &$raw_layout))
            };
            match done {
                Ok(()) => 0,
                Err(_) => 1,
            }
        }
        tracepoint_programs!("vmalloc", $name, $prog, $raw, $handler);
    };
}

vmalloc_tracepoint!(
    on_alloc,
    vmalloc_alloc_vmap_area,
    raw_vmalloc_alloc_vmap_area,
    "alloc_vmap_area",
    kind::ALLOC,
    ALLOC_LAYOUT,
    ALLOC_RAW_LAYOUT,
    6
);
vmalloc_tracepoint!(
    on_free,
    vmalloc_free_vmap_area_noflush,
    raw_vmalloc_free_vmap_area_noflush,
    "free_vmap_area_noflush",
    kind::FREE,
    FREE_LAYOUT,
    FREE_RAW_LAYOUT,
    3
);
vmalloc_tracepoint!(
    on_purge,
    vmalloc_purge_vmap_area_lazy,
    raw_vmalloc_purge_vmap_area_lazy,
    "purge_vmap_area_lazy",
    kind::PURGE,
    PURGE_LAYOUT,
    PURGE_RAW_LAYOUT,
    3
);
