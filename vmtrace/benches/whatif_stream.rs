//! `vmtrace whatif`'s speed on one core: a benchmark, not a test.
//!
//! `cargo bench -p vmtrace --bench whatif_stream` prints one JSON object per case on stdout:
//! the synthetic generator alone (its records dropped), and the generator streaming into one
//! variant's free-running model and lock simulation (what one sweep job does). Rates are
//! events (allocations and frees) per second of the thread's CPU time, so other processes on
//! a shared machine do not count; docs/whatif.md gives the figures.
//!
//! A plain `harness = false` binary: one case runs for seconds, so criterion's resampling
//! would only add minutes.

mod common;

/// The `vmtrace` binary's allocator (main.rs), so that the rates are the command's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::atomic::AtomicU64;

use common::thread_cpu_seconds;

use vmtrace::model::Variant;
use vmtrace::replay::FreeRunOptions;
use vmtrace::synth::{stream, Sink, SynthError, SynthParams};
use vmtrace::trace::Record;
use vmtrace::whatif::{run_point, Point, Sweep};

/// Counts the events and drops every record.
struct Count(u64);

impl Sink for Count {
    fn put(&mut self, r: Record) -> Result<(), SynthError> {
        if matches!(r, Record::Alloc(_) | Record::Free(_)) {
            self.0 += 1;
        }
        Ok(())
    }
}

fn main() {
    let cases = [
        ("mask127-t64-c128-l1000", 0x7f, 64, 128, 1000),
        ("mask1-t8-c8-l20000", 1, 8, 8, 20000),
    ];
    for (name, mask, threads, cpus, loops) in cases {
        let sweep = Sweep {
            base: SynthParams {
                mask,
                loops,
                busy_list: vmtrace::synth::module_scaled(15_000, loops),
                ..SynthParams::default()
            },
            threads: vec![threads],
            cpus: vec![cpus],
            variants: vec![Variant::Nodes],
            free_run: FreeRunOptions::default(),
            scale_setup: true,
        };
        let p = Point { cpus, threads };
        let t = thread_cpu_seconds();
        let mut count = Count(0);
        if let Err(e) = stream(&sweep.params(p), Vec::new(), &mut count) {
            eprintln!("whatif_stream: {name}: {e}");
            std::process::exit(1);
        }
        let gen_s = thread_cpu_seconds() - t;
        let t = thread_cpu_seconds();
        let w = match run_point(&sweep, p, Variant::Nodes, &AtomicU64::new(0)) {
            Ok(w) => w,
            Err(e) => {
                eprintln!("whatif_stream: {name}: {e}");
                std::process::exit(1);
            }
        };
        let both_s = thread_cpu_seconds() - t;
        let events = count.0 as f64;
        println!(
            "{}",
            serde_json::json!({
                "case": name,
                "events": count.0,
                "model_allocs": w.allocs,
                "generator_cpu_seconds": gen_s,
                "generator_events_per_sec": events / gen_s,
                "generator_and_nodes_cpu_seconds": both_s,
                "generator_and_nodes_events_per_sec": events / both_s,
            })
        );
    }
}
