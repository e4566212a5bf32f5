//! `vmtrace compare A B [--json] [--report DIR]`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use super::{compare, profile, Comparison, Profile, Row};

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The baseline recording (plain, .zst or .gz JSON Lines).
    pub a: PathBuf,

    /// The recording compared against it.
    pub b: PathBuf,

    /// Print the comparison as JSON.
    #[arg(long)]
    pub json: bool,

    /// Write CDF overlays (lock waits, purge sizes, drain latency, backlog, allocation sizes),
    /// bar charts (size histogram, B/A of every tested row) and an index.html into DIR,
    /// created if missing.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,

    /// Seed of the bootstrap: the same seed gives the same intervals.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Show every row, untested ones included (by default rows in neither recording are left
    /// out).
    #[arg(long)]
    pub all: bool,
}

fn read(path: &Path, progress: &AtomicU64) -> anyhow::Result<Profile> {
    let input = crate::trace::compress::open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    profile::read(input, progress).with_context(|| format!("reading {}", path.display()))
}

/// Reads both recordings at once, with a spinner on stderr (drawn only on a terminal).
fn read_both(a: &Path, b: &Path) -> anyhow::Result<(Profile, Profile)> {
    let counted = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed_precise} reading: {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    let (pa, pb) = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                bar.set_message(format!("{} records", counted.load(Ordering::Relaxed)));
                bar.tick();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let hb = s.spawn(|| read(b, &counted));
        let pa = read(a, &counted);
        let pb = hb
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("reading {} failed", b.display())));
        stop.store(true, Ordering::Relaxed);
        (pa, pb)
    });
    bar.finish_and_clear();
    Ok((pa?, pb?))
}

pub fn run(args: &CompareArgs) -> anyhow::Result<ExitCode> {
    let (a, b) = read_both(&args.a, &args.b)?;
    let c = compare(
        &a,
        &b,
        &args.a.display().to_string(),
        &args.b.display().to_string(),
        args.seed,
    );
    if let Some(dir) = &args.report {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let files = super::charts::write_report(dir, &c, &a, &b)
            .with_context(|| format!("writing the report into {}", dir.display()))?;
        eprintln!(
            "vmtrace: wrote {} files; open {}",
            files.len(),
            dir.join("index.html").display()
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        print!("{}", render(&c, args.all));
    }
    Ok(ExitCode::SUCCESS)
}

/// A value in its unit, short.
pub fn value(v: Option<f64>, unit: &str) -> String {
    let Some(v) = v else {
        return "–".into();
    };
    match unit {
        "share" if v > 0.0 && v < 0.01 => format!("{:.2e} %", 100.0 * v),
        "share" => format!("{:.2} %", 100.0 * v),
        "ns" => short_ns(v),
        "MiB" => format!("{v:.1} MiB"),
        _ if v.abs() >= 1000.0 => group_thousands(v.round() as i64),
        _ if v.fract() == 0.0 => format!("{v:.0}"),
        _ => format!("{v:.2}"),
    }
}

fn short_ns(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} ms", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2} µs", v / 1e3)
    } else {
        format!("{v:.0} ns")
    }
}

fn group_thousands(v: i64) -> String {
    let s = v.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    if v < 0 {
        format!("-{out}")
    } else {
        out
    }
}

fn unit_label(unit: &str) -> &str {
    match unit {
        "ns" | "MiB" | "share" => "",
        u => u,
    }
}

fn row_line(out: &mut String, r: &Row) {
    let ratio = r.ratio.map_or("–".into(), |x| format!("{x:.2}"));
    let interval = match r.interval {
        Some(i) => format!("{:.2}–{:.2}", i.lo, i.hi),
        None => "not tested".into(),
    };
    let mark = if r.flagged { "*" } else { "" };
    let name = match unit_label(r.unit) {
        "" => r.metric.clone(),
        u => format!("{} ({u})", r.metric),
    };
    let _ = writeln!(
        out,
        "  {:<34} {:>14} {:>14} {:>7}  {:<12} {}",
        name,
        value(r.a, r.unit),
        value(r.b, r.unit),
        ratio,
        interval,
        mark
    );
}

fn section(out: &mut String, rows: &[Row], all: bool) {
    let mut group = "";
    for r in rows {
        if !all && r.a.is_none() && r.b.is_none() {
            continue;
        }
        if r.group != group {
            group = &r.group;
            let _ = writeln!(out, "{group}");
        }
        row_line(out, r);
    }
}

/// Plain-text rendering, kept apart so tests read it without a terminal.
pub fn render(c: &Comparison, all: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "A: {}  ({:.1} s)", c.a_name, c.a_duration_s);
    let _ = writeln!(out, "B: {}  ({:.1} s)", c.b_name, c.b_duration_s);
    if c.header_differences.is_empty() {
        let _ = writeln!(
            out,
            "\nSame kernel, machine, CPUs, probes and command line."
        );
    } else {
        let _ = writeln!(out, "\nHeader differences:");
        for d in &c.header_differences {
            let _ = writeln!(out, "  {:<15} A: {}", d.field, d.a);
            let _ = writeln!(out, "  {:<15} B: {}", "", d.b);
        }
    }
    let _ = writeln!(
        out,
        "\n  {:<34} {:>14} {:>14} {:>7}  {:<12}",
        "metric", "A", "B", "B/A", "95 % interval"
    );
    section(&mut out, &c.rows, all);
    section(&mut out, &c.size_rows, all);
    section(&mut out, &c.backing_page_orders, all);
    if !c.comms.is_empty() {
        let _ = writeln!(out, "allocations by task (top 10)");
        for r in &c.comms {
            let _ = writeln!(
                out,
                "  {:<34} {:>14} {:>14}",
                r.comm,
                group_thousands(r.a as i64),
                group_thousands(r.b as i64)
            );
        }
    }
    let _ = writeln!(
        out,
        "\n{} of {} tested rows flagged (*). Method: {}; {} windows, {} resamples, seed {}.",
        c.flagged, c.tested, c.method.text, c.method.windows, c.method.resamples, c.method.seed
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_in_their_units() {
        assert_eq!(value(Some(1234.4), "ns"), "1.23 µs");
        assert_eq!(value(Some(56112.0), "/s"), "56,112");
        assert_eq!(value(Some(0.1234), "share"), "12.34 %");
        assert_eq!(value(Some(0.000_012), "share"), "1.20e-3 %");
        assert_eq!(value(Some(12.0), "pages"), "12");
        assert_eq!(value(None, "pages"), "–");
        assert_eq!(group_thousands(-1_234_567), "-1,234,567");
    }
}
