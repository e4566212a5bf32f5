//! summary
pub fn run(_args: &crate::cli::SummaryArgs) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("summary is not implemented yet")
}
