//! vmtrace's kernel-side probes.
//!
//! One module per kernel subject. Every program writes a fixed-size [`vmtrace_common::Event`] into
//! one shared ring buffer, so user space sees all kinds in reservation order, and counts a per-CPU
//! lost event whenever the ring buffer is full.
#![no_std]
#![no_main]

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
