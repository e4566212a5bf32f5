//! `vmtrace replay`: the command-line edge of the replay (anyhow lives here, not below).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::process::ExitCode;

use anyhow::Context as _;

use super::free_run::{free_run, FreeRunOptions};
use super::{render_comparison, render_text, replay, ReplayOptions};
use crate::cli::ReplayArgs;
use crate::model::Variant;

/// Runs one replay per requested variant and prints the reports; with `--free-running`, or
/// with several variants, the free-running what-if comparison as well.
pub fn run(args: &ReplayArgs) -> anyhow::Result<ExitCode> {
    let variants = if args.variants.is_empty() {
        vec![Variant::Nodes]
    } else {
        args.variants.clone()
    };
    let compare = args.free_running || variants.len() > 1;
    let mut reports = Vec::new();
    let mut what_ifs = Vec::new();
    let fr = FreeRunOptions {
        purge_latency_ns: u64::try_from(args.purge_latency.as_nanos()).unwrap_or(u64::MAX),
        ..FreeRunOptions::default()
    };
    for &variant in &variants {
        let opts = ReplayOptions {
            variant,
            strict: args.strict,
            nodes: args.nodes,
            lazy_max_pages: args.lazy_max,
            max_divergences: args.divergences,
        };
        let context = || {
            format!(
                "replaying {} with variant {}",
                args.trace.display(),
                variant.name()
            )
        };
        if !args.free_running {
            let report = replay(open(&args.trace)?, &opts).with_context(context)?;
            reports.push(report);
        }
        if compare {
            let w = free_run(open(&args.trace)?, &opts, &fr).with_context(context)?;
            what_ifs.push(w);
        }
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        if compare {
            let doc = serde_json::json!({ "fidelity": reports, "what_if": what_ifs });
            serde_json::to_writer_pretty(&mut out, &doc)?;
        } else {
            serde_json::to_writer_pretty(&mut out, &reports)?;
        }
        writeln!(out)?;
    } else {
        for (i, r) in reports.iter().enumerate() {
            if i > 0 {
                writeln!(out)?;
            }
            out.write_all(render_text(r).as_bytes())?;
        }
        if compare {
            if !reports.is_empty() {
                writeln!(out)?;
            }
            out.write_all(render_comparison(&what_ifs).as_bytes())?;
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
