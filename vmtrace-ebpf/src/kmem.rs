//! Page allocations on vmalloc paths: `kmem:mm_page_alloc` (`include/trace/events/kmem.h`;
//! checked on 6.18), filtered in the kernel twice over:
//!
//! 1. a gfp pre-filter (bits from the tracepoint's print format, `PAGE_FILTER`), so only
//!    plausible page-table pages (`__GFP_ZERO`, no `__GFP_ACCOUNT`) and plausible vmalloc
//!    backing pages (`__GFP_HIGHMEM` added by `__vmalloc_area_node`, not `__GFP_MOVABLE`) pay for
//!    a stack walk;
//! 2. for page-table candidates only, a stack filter: a page-table page is one whose stack
//!    passes through a kernel page-table allocator (`PT_ALLOC_RANGES`, index = level) under a
//!    vmap mapping function (`VMAP_MAP_RANGES`). Backing pages are counted on the gfp alone.
//!
//! Page-table pages become events; backing pages only bump a per-CPU order histogram.
//! The richer rungs probe `__pte_alloc_kernel` itself.

use aya_ebpf::{
    macros::{fentry, kprobe},
    programs::{FEntryContext, ProbeContext, TracePointContext},
    Global,
};
use vmtrace_common::{
    counter, kind, ptpage as p, PageFilter, RangeSet, TpLayout, FILTER_FRAMES, MAX_FIELDS,
    MAX_ORDER_SLOTS, RAW_EXTRA_FRAMES,
};

use crate::maps::{bump, emit_values, field, global_ptr, layout_of, stack_hits2, BACKING_ORDERS};

/// `pfn, order, gfp_flags`.
#[unsafe(no_mangle)]
static PAGE_ALLOC_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// `page, order, gfp_flags` from the raw arguments: the `struct page` address stands in for
/// the pfn, which the kernel computes only when it builds the record.
#[unsafe(no_mangle)]
static PAGE_ALLOC_RAW_LAYOUT: Global<TpLayout> = Global::new(TpLayout::EMPTY);
/// `__pte_alloc_kernel`, `__pmd_alloc`, `__pud_alloc`, `__p4d_alloc`, in that order (the index
/// is the level); absent ones have an empty range.
#[unsafe(no_mangle)]
static PT_ALLOC_RANGES: Global<RangeSet> = Global::new(RangeSet::EMPTY);
/// The vmap mapping functions (`vmap_small_pages_range_noflush`, `vmap_range_noflush`, …).
#[unsafe(no_mangle)]
static VMAP_MAP_RANGES: Global<RangeSet> = Global::new(RangeSet::EMPTY);
/// The vmalloc page-allocation path (`__vmalloc_node_range_noprof`, `vm_area_alloc_pages`).
#[unsafe(no_mangle)]
static VMALLOC_PAGE_RANGES: Global<RangeSet> = Global::new(RangeSet::EMPTY);
#[unsafe(no_mangle)]
static PAGE_FILTER: Global<PageFilter> = Global::new(PageFilter {
    pt_require: 0,
    pt_exclude: 0,
    back_require: 0,
    back_exclude: 0,
});

#[inline(always)]
fn on_page_alloc<const RAW: bool>(ctx: TracePointContext) -> u32 {
    let layout = layout_of::<RAW>(&PAGE_ALLOC_LAYOUT, &PAGE_ALLOC_RAW_LAYOUT);
    // Slots 1 and 2 on the raw tracepoint (`page, order, gfp_flags, migratetype`).
    let gfp = field::<RAW, 2>(&ctx, layout);
    let filter = PAGE_FILTER.load();
    let pt = filter.pt_require != 0
        && gfp & filter.pt_require == filter.pt_require
        && gfp & filter.pt_exclude == 0;
    let back = filter.back_require != 0
        && gfp & filter.back_require == filter.back_require
        && gfp & filter.back_exclude == 0;
    if !pt && !back {
        return 0;
    }
    let order = field::<RAW, 1>(&ctx, layout);
    if pt {
        bump(counter::PAGE_STACK_WALKS);
        let (pt_ranges, map_ranges) = (global_ptr(&PT_ALLOC_RANGES), global_ptr(&VMAP_MAP_RANGES));
        let (level, under_vmap) = if RAW {
            stack_hits2::<_, FILTER_FRAMES>(&ctx, pt_ranges, map_ranges)
        } else {
            stack_hits2::<_, { FILTER_FRAMES - RAW_EXTRA_FRAMES }>(&ctx, pt_ranges, map_ranges)
        };
        if let (Some(level), true) = (level, under_vmap) {
            let mut v = [0u64; MAX_FIELDS];
            v[p::LEVEL] = level;
            v[p::PFN] = field::<RAW, 0>(&ctx, layout);
            v[p::GFP] = gfp;
            v[p::ORDER] = order;
            return match emit_values(&ctx, kind::PT_PAGE, &v) {
                Ok(()) => 0,
                Err(_) => 1,
            };
        }
        return 0;
    }
    // Backing pages are told by their gfp alone: `__vmalloc_area_node` adds `__GFP_HIGHMEM`
    // (meaningless on 64-bit) and user pages carry `__GFP_MOVABLE`. A stack walk per backing
    // page cost more than the rest of the probes together (thousands of pages per large
    // vmalloc), so this path deliberately has none.
    let slot = if order < u64::from(MAX_ORDER_SLOTS) {
        order as u32
    } else {
        MAX_ORDER_SLOTS - 1
    };
    if let Some(n) = BACKING_ORDERS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot; programs run with migration disabled.
        unsafe { *n += 1 };
    }
    0
}

tracepoint_programs!(
    "kmem",
    "mm_page_alloc",
    kmem_mm_page_alloc,
    raw_kmem_mm_page_alloc,
    on_page_alloc
);

#[inline(always)]
fn pte_table(ctx_emit: impl FnOnce(&[u64; MAX_FIELDS]) -> Result<(), i32>, pmd: u64) -> u32 {
    let mut v = [0u64; MAX_FIELDS];
    v[p::LEVEL] = 0;
    // No pfn yet at entry: the pmd slot being filled stands in for it.
    v[p::PFN] = pmd;
    match ctx_emit(&v) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// `__pte_alloc_kernel(pmd_t *pmd)`: every call wants a new PTE table for init_mm (it may lose
/// the race and free it again).
#[fentry(function = "__pte_alloc_kernel")]
pub fn fentry_pte_alloc_kernel(ctx: FEntryContext) -> u32 {
    let pmd: u64 = ctx.arg(0);
    pte_table(|v| emit_values(&ctx, kind::PT_PAGE, v), pmd)
}

#[kprobe]
pub fn kprobe_pte_alloc_kernel(ctx: ProbeContext) -> u32 {
    let pmd: u64 = ctx.arg(0).unwrap_or(0);
    pte_table(|v| emit_values(&ctx, kind::PT_PAGE, v), pmd)
}
