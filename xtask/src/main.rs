//! `cargo xtask`: the one entry point for setting up a machine, running vmtrace, testing it and
//! measuring its overhead.
//!
//! It exists because building vmtrace needs more than `cargo build`: the eBPF crate is compiled
//! by a nightly toolchain with `rust-src`, and linked by a `bpf-linker` that must use the very
//! LLVM of that nightly. A fresh machine gets all of it from `cargo xtask run` or
//! `cargo xtask test`, and CI (`.ci/run`) goes through the same code path as a developer.

mod bench;
mod bench_model;
mod cmd;
mod elf;
mod fidelity;
mod repeatability;
mod run;
mod setup;
mod test;
mod test_vmalloc;
mod testbox;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Developer tasks for vmtrace: set up the toolchain, run, test and benchmark.
///
/// Every task that builds starts with `setup`, which is idempotent and takes about a second when
/// nothing is missing, so a fresh machine needs nothing but `cargo xtask run` or
/// `cargo xtask test`.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", version, about)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install what building and testing vmtrace needs; a no-op when everything is present.
    ///
    /// Checks, and installs when missing or stale: the nightly toolchain with rust-src and
    /// clippy; rustfmt and clippy for the toolchain running this command; bpf-linker 0.13.0
    /// built against the nightly rustc's own LLVM (LLVM found through symlinks in
    /// $XDG_DATA_HOME/vmtrace/llvm, default ~/.local/share/vmtrace/llvm); the Debian packages
    /// the tests use (apt-get, as root); and a mounted tracefs (as root).
    Setup,
    /// Build vmtrace in release mode and run it; without ARGS, run the demo job.
    ///
    /// The demo job, as root on a kernel with BPF: record 10 s of vmalloc events while
    /// `vmtrace stress fix-size` runs, into target/vmtrace-demo.jsonl, then summarise the trace.
    /// Otherwise it says why and summarises the bundled vmtrace/assets/sample-trace.jsonl.zst.
    Run(run::RunArgs),
    /// Run the whole check suite, as CI does: setup, fmt, clippy (user space and eBPF), tests.
    ///
    /// Steps, stopping at the first failure: setup; `cargo fmt --check`; clippy -D warnings on
    /// the user-space crates, then on the eBPF crate (nightly, bpfel-unknown-none); unit and
    /// doc tests; integration tests; then each `tests/privileged_*.rs` target on its own with
    /// --test-threads=1. As root, VMTRACE_REQUIRE_PRIVILEGED=1 is set so privileged tests fail
    /// instead of skipping.
    Test,
    /// Measure how much tracing slows a vmalloc-heavy workload (a benchmark, not a test).
    ///
    /// Runs `vmtrace stress fix-size --json` untraced, under `vmtrace record` (foundation
    /// probes only, default probes, ladder probes), under `vmtrace serve` scraped every second
    /// (with and without --record), under a bpftrace script counting the same three vmalloc
    /// tracepoints, and under `perf record -e 'vmalloc:*' -a`, interleaved over --rounds; prints
    /// median ops/s, the ratio to the untraced run and the derived comparisons, and writes them
    /// to target/bench/overhead.json. `--only` picks conditions; `--soak 10m` watches the
    /// daemon's memory instead. Needs root.
    Bench(bench::BenchArgs),
    /// Benchmark the allocator model and `vmtrace replay` (issue 3's performance targets).
    ///
    /// Generates synthetic fix-size traces of 10 M and 1 M events once (cached in
    /// target/bench/), then measures the model core's events/s on one thread, `vmtrace replay`
    /// against `jq -c 'select(.type=="alloc")' FILE | wc -l`, and replay's peak RSS on both
    /// traces; prints them beside the targets and writes target/bench/model.json.
    BenchModel(bench_model::BenchModelArgs),
    /// Run a command as root in a QEMU guest with another kernel (see docs/testbox.md).
    ///
    /// Boots Debian's 6.12 (default) or 6.1 kernel under TCG with a busybox initramfs that
    /// carries the release vmtrace, runs COMMAND (default `vmtrace probes`) in the guest's
    /// working directory, a 9p share of --out (default target/testbox/out), and exits with its
    /// status. The kernel is downloaded once, through a private apt configuration, into
    /// $XDG_CACHE_HOME/vmtrace/testbox (default ~/.cache/vmtrace/testbox); later runs are
    /// offline. The guest's console log goes to --console (default target/testbox/console.log).
    Testbox(testbox::TestboxArgs),
    /// Strict and explained replay figures, and the free-running validation, on a train/test
    /// corpus of real recordings (see docs/fidelity.md).
    ///
    /// The corpus (every stress pattern with 1 and 2 threads, 10 s each) is recorded once, as
    /// root, into $XDG_CACHE_HOME/vmtrace/corpus (default ~/.cache/vmtrace/corpus), with a
    /// manifest of SHA-256 sums that later runs check. Each recording is replayed in observed
    /// timing; the simulation is calibrated on the `train` recordings alone and validated
    /// free-running on all of them. Prints per-recording and pooled figures per split and
    /// writes target/fidelity/fidelity.json; `--against OLD.json` prints what moved. A rule
    /// or constant lands only if the `test` figures do not get worse.
    Fidelity(fidelity::FidelityArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Setup => setup::setup().map(|()| ExitCode::SUCCESS),
        Task::Run(args) => run::run(&args),
        Task::Test => test::test(),
        Task::Bench(args) => bench::bench(&args),
        Task::BenchModel(args) => bench_model::bench_model(&args),
        Task::Testbox(args) => testbox::testbox(&args),
        Task::Fidelity(args) => fidelity::fidelity(&args).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_passes_everything_after_the_task_to_vmtrace() {
        let cli = Cli::try_parse_from(["xtask", "run", "--", "summary", "--json", "t.jsonl"])
            .expect("run with trailing args parses");
        let Task::Run(args) = cli.task else {
            panic!("expected the run task");
        };
        assert_eq!(args.args, ["summary", "--json", "t.jsonl"]);

        let cli = Cli::try_parse_from(["xtask", "run", "record", "-o", "x.jsonl"])
            .expect("run without `--` parses");
        let Task::Run(args) = cli.task else {
            panic!("expected the run task");
        };
        assert_eq!(args.args, ["record", "-o", "x.jsonl"]);
    }
}
