//! `vmtrace allocinfo ...` subcommands.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum AllocinfoCommand {
    /// Save a snapshot of /proc/allocinfo.
    Snapshot,
}

pub fn run(cmd: &AllocinfoCommand) -> anyhow::Result<std::process::ExitCode> {
    match cmd {
        AllocinfoCommand::Snapshot => anyhow::bail!("allocinfo snapshot is not implemented yet"),
    }
}
