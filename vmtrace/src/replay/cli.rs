//! `vmtrace replay`: the command-line edge of the replay (anyhow lives here, not below).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::process::ExitCode;

use anyhow::Context as _;

use super::charts::{write_report, ReportInput};
use super::free_run::{fit_costs, free_run, FreeRunOptions};
use super::{render_comparison, render_fit, render_text, replay, ReplayOptions};
use crate::cli::ReplayArgs;
use crate::model::Variant;

/// Runs one replay per requested variant and prints the reports; with `--free-running`, with
/// several variants, or with `--report`, the free-running what-if comparison as well. With
/// `--report DIR`, writes the charts and index.html there and says so on stderr.
pub fn run(args: &ReplayArgs) -> anyhow::Result<ExitCode> {
    let variants = if args.variants.is_empty() {
        vec![Variant::Nodes]
    } else {
        args.variants.clone()
    };
    // A report compares the designs: all three unless the user chose.
    let what_if_variants = if args.variants.is_empty() && args.report.is_some() {
        Variant::ALL.to_vec()
    } else {
        variants.clone()
    };
    let compare =
        args.free_running || variants.len() > 1 || args.report.is_some() || args.fit_costs;
    // The charts' observed side (footprint, backlog, purges) comes from an observed-timing
    // replay, so a report makes one even with --free-running (not printed then).
    let observed_passes = if args.free_running {
        usize::from(args.report.is_some())
    } else {
        variants.len()
    };
    let passes = observed_passes
        + if compare { what_if_variants.len() } else { 0 }
        + if args.fit_costs { FIT_ROUNDS + 1 } else { 0 };
    if args.trace.as_os_str() == "-" && passes > 1 {
        anyhow::bail!(
            "this replay reads the trace {passes} times (several variants, --free-running, --report or --fit-costs), which stdin cannot give; pass the trace as a file"
        );
    }
    let mut reports = Vec::new();
    let mut chart_only = Vec::new();
    let mut what_ifs = Vec::new();
    let mut fr = FreeRunOptions {
        purge_latency_ns: u64::try_from(args.purge_latency.as_nanos()).unwrap_or(u64::MAX),
        ..FreeRunOptions::default()
    };
    for (name, ns) in &args.costs {
        fr.costs
            .set(name, *ns)
            .with_context(|| format!("--cost {name}={ns}"))?;
    }
    let options = |variant| ReplayOptions {
        variant,
        strict: args.strict,
        nodes: args.nodes,
        zone_pages: args.zone_pages,
        lazy_max_pages: args.lazy_max,
        max_divergences: args.divergences,
        detach_delay_ns: u64::try_from(args.detach_delay.as_nanos()).unwrap_or(u64::MAX),
        detach_step_ns: u64::try_from(args.detach_node_step.as_nanos()).unwrap_or(u64::MAX),
        fit_detach_step: !args.no_detach_fit,
    };
    let context = |variant: Variant, mode: &str| {
        format!(
            "replaying {} with variant {} ({mode})",
            args.trace.display(),
            variant.name()
        )
    };
    let progress = |variant: Variant, mode: &str| {
        if args.report.is_some() {
            eprintln!("vmtrace replay: {}", context(variant, mode));
        }
    };
    for &variant in variants.iter().take(observed_passes) {
        progress(variant, "observed timing");
        let report = replay(open(&args.trace)?, &options(variant))
            .with_context(|| context(variant, "observed timing"))?;
        if args.free_running {
            chart_only.push(report);
        } else {
            reports.push(report);
        }
    }
    let fit = if args.fit_costs {
        progress(Variant::Nodes, "fitting costs");
        let fit = fit_costs(
            || open(&args.trace),
            &options(Variant::Nodes),
            &fr,
            FIT_ROUNDS,
        )
        .with_context(|| context(Variant::Nodes, "fitting costs"))?;
        fr.costs = fit.fitted;
        Some(fit)
    } else {
        None
    };
    if compare {
        for &variant in &what_if_variants {
            progress(variant, "free-running");
            let w = free_run(open(&args.trace)?, &options(variant), &fr)
                .with_context(|| context(variant, "free-running"))?;
            what_ifs.push(w);
        }
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        if compare {
            let mut doc = serde_json::json!({ "fidelity": reports, "what_if": what_ifs });
            if let Some(fit) = &fit {
                doc["cost_fit"] = serde_json::to_value(fit)?;
            }
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
            if let Some(fit) = &fit {
                out.write_all(render_fit(fit).as_bytes())?;
                writeln!(out)?;
            }
            out.write_all(render_comparison(&what_ifs).as_bytes())?;
        }
    }
    out.flush()?;
    if let Some(dir) = &args.report {
        let trace = args.trace.display().to_string();
        let input = ReportInput {
            trace: &trace,
            fidelity: if reports.is_empty() {
                &chart_only
            } else {
                &reports
            },
            what_if: &what_ifs,
        };
        let files = write_report(dir, &input)
            .with_context(|| format!("cannot write the report into {}", dir.display()))?;
        eprintln!(
            "vmtrace replay: wrote {} charts (SVG and PNG) and {} to {}",
            files.len().saturating_sub(1) / 2,
            dir.join("index.html").display(),
            dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Most rounds of `--fit-costs` after the first simulation (each one a pass over the trace).
const FIT_ROUNDS: usize = 8;

fn open(path: &std::path::Path) -> anyhow::Result<Box<dyn BufRead>> {
    if path.as_os_str() == "-" {
        // Only one pass can read stdin; `run` refuses more before the first.
        return Ok(Box::new(BufReader::new(std::io::stdin())));
    }
    let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(Box::new(BufReader::with_capacity(1 << 20, f)))
}
