//! `vmtrace replay`: the command-line edge of the replay (anyhow lives here, not below).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::process::ExitCode;

use anyhow::Context as _;

use super::{render_text, replay, ReplayOptions};
use crate::cli::ReplayArgs;
use crate::model::Variant;

/// Runs one replay per requested variant and prints the reports.
pub fn run(args: &ReplayArgs) -> anyhow::Result<ExitCode> {
    let variants = if args.variants.is_empty() {
        vec![Variant::Nodes]
    } else {
        args.variants.clone()
    };
    let mut reports = Vec::new();
    for variant in variants {
        let opts = ReplayOptions {
            variant,
            strict: args.strict,
            nodes: args.nodes,
            lazy_max_pages: args.lazy_max,
            max_divergences: args.divergences,
        };
        let input = open(&args.trace)?;
        let report = replay(input, &opts).with_context(|| {
            format!(
                "replaying {} with variant {}",
                args.trace.display(),
                variant.name()
            )
        })?;
        reports.push(report);
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &reports)?;
        writeln!(out)?;
    } else {
        for (i, r) in reports.iter().enumerate() {
            if i > 0 {
                writeln!(out)?;
            }
            out.write_all(render_text(r).as_bytes())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn open(path: &std::path::Path) -> anyhow::Result<Box<dyn BufRead>> {
    if path.as_os_str() == "-" {
        // Several variants cannot re-read stdin; the first one consumes it.
        return Ok(Box::new(BufReader::new(std::io::stdin())));
    }
    let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(Box::new(BufReader::with_capacity(1 << 20, f)))
}
