//! User-space vmalloc workloads shaped like `lib/test_vmalloc.c`. (In progress.)

use clap::Args;

#[derive(Debug, Args)]
pub struct StressArgs {
    /// Pattern to run.
    pub pattern: String,
}

pub fn run(_args: &StressArgs) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("stress is not implemented yet")
}
