//! record
pub fn run(_args: &crate::cli::RecordArgs) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("record is not implemented yet")
}
