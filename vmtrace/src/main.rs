//! The `vmtrace` binary: parse the command line, run the job, map errors to an exit status.

use clap::Parser as _;
use vmtrace::cli::{Cli, Command};

/// glibc's malloc raises its mmap threshold after each large free, so the what-if's large,
/// short-lived buffers (operation queues, purge steps) end up in its arenas and fragment them:
/// a what-if's RSS grew 1.7× per tenfold loops while its live heap grew 1.2×.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = match &cli.command {
        Command::Record(args) => vmtrace::record::run(args),
        Command::Stress(args) => vmtrace::workload::run(args),
        Command::Summary(args) => vmtrace::summary::run(args),
        Command::Probes(args) => vmtrace::probe::table::run(args),
        Command::Replay(args) => vmtrace::replay::cli::run(args),
        Command::Calibrate(args) => vmtrace::replay::cli::calibrate(args),
        Command::Synth(args) => vmtrace::synth::cli::run(args),
        Command::Import(args) => vmtrace::import::cli::run(args),
        Command::Compare(args) => vmtrace::compare::cli::run(args),
        Command::Whatif(args) => vmtrace::whatif::cli::run(args),
        Command::Top(args) => vmtrace::tui::run(args),
        Command::Serve(args) => vmtrace::export::serve::run(args),
        Command::Allocinfo(cmd) => vmtrace::allocinfo::cli::run(cmd),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("vmtrace: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_target(false)
        .init();
}
