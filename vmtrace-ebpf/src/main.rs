//! vmtrace's kernel-side probes.
//!
//! One module per kernel subject. Every program writes a fixed-size [`vmtrace_common::Event`] into
//! one shared ring buffer, so user space sees all kinds in reservation order, and counts a per-CPU
//! lost event whenever the ring buffer is full.
#![no_std]
#![no_main]

/// Return value of every tracepoint program: 1 lets the kernel go on to deliver the event to
/// perf and ftrace users of the same tracepoint; 0 would suppress it for all of them
/// (`perf_trace_run_bpf_submit`), so `perf record -e vmalloc:*` or `perf lock contention` would
/// see nothing while vmtrace records. aya-ebpf 0.2's `#[tracepoint]` macro always returns 0,
/// hence [`tracepoint_programs!`]. (A raw tracepoint program's return value is ignored.)
const PASS_ON: u32 = 1;

/// Declares the two programs of one kernel tracepoint, both running `$handler::<RAW>(ctx)`:
///
/// * `$tp` in section `tracepoint/<category>/<name>`, a perf tracepoint program: its context
///   is the tracefs record, fields at the offsets of the `format` file. It always returns
///   [`PASS_ON`].
/// * `$raw` in section `raw_tp/<name>`, a raw tracepoint program: its context is the
///   `TP_PROTO` arguments widened to `u64` (`struct bpf_raw_tracepoint_args`), slots found in
///   kernel BTF. The kernel skips building the record for it, which is most of what a hot
///   tracepoint costs (see docs/probes.md); user space attaches it where it loads and falls
///   back to `$tp` otherwise.
///
/// Both contexts go through `TracePointContext`, whose reads are `bpf_probe_read_kernel` at
/// `ctx + offset` and whose stack helpers take the context as is, which is right for both.
macro_rules! tracepoint_programs {
    ($category:literal, $name:literal, $tp:ident, $raw:ident, $handler:ident) => {
        #[unsafe(no_mangle)]
        #[unsafe(link_section = concat!("tracepoint/", $category, "/", $name))]
        pub fn $tp(ctx: *mut core::ffi::c_void) -> u32 {
            let _ = $handler::<false>(aya_ebpf::programs::TracePointContext::new(ctx));
            crate::PASS_ON
        }

        #[unsafe(no_mangle)]
        #[unsafe(link_section = concat!("raw_tp/", $name))]
        pub fn $raw(ctx: *mut core::ffi::c_void) -> u32 {
            let _ = $handler::<true>(aya_ebpf::programs::TracePointContext::new(ctx));
            0
        }
    };
}

mod hold;
mod kmem;
mod latency;
mod lock;
mod maps;
mod vmalloc;
mod workqueue;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path, so this is never executed on a loaded program.
    loop {}
}

/// `bpf_ktime_get_boot_ns`, `bpf_probe_read_kernel` and the tracepoint attach type are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
