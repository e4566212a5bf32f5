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
/// hence [`tracepoint_pass_on!`].
const PASS_ON: u32 = 1;

/// Declares a tracepoint program in section `tracepoint/<category>/<name>` whose body sees a
/// `TracePointContext` and whose return value is ignored: the program always returns
/// [`PASS_ON`].
macro_rules! tracepoint_pass_on {
    ($category:literal, $name:literal, pub fn $prog:ident($ctx:ident: TracePointContext) -> u32 $body:block) => {
        #[unsafe(no_mangle)]
        #[unsafe(link_section = concat!("tracepoint/", $category, "/", $name))]
        pub fn $prog(raw: *mut core::ffi::c_void) -> u32 {
            #[inline(always)]
            fn handler($ctx: aya_ebpf::programs::TracePointContext) -> u32 $body
            let _ = handler(aya_ebpf::programs::TracePointContext::new(raw));
            crate::PASS_ON
        }
    };
}

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
