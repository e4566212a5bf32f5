//! `vmtrace allocinfo ...` subcommands: argument parsing and printing only; the work is in the
//! library modules next to this one.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use regex::Regex;

use super::diff::{diff, DiffSort, Listing};
use super::marks::Marker;
use super::model::Snapshot;
use super::parse::{parse, Mode};
use super::query::{GroupBy, Selection, ShowSort};
use super::render::SizeStyle;
use super::show::show;
use super::size::parse_number;
use super::snapshot::{self, PROC_ALLOCINFO};
use super::watch::{self, WatchOptions};

/// Snapshot, show, diff and watch /proc/allocinfo.
///
/// Every text format the kernel has printed is understood: the 2024 pre-merge series (human sizes,
/// `module:NAME`), version 1.0 and 2.0 files, and what `sort -g`, `sort -h`, `tail` and
/// `numfmt --to=iec` make of them. See docs/allocinfo.md.
#[derive(Debug, Subcommand)]
pub enum AllocinfoCommand {
    /// Save /proc/allocinfo to a file, atomically, or print it.
    ///
    /// The kernel's text is saved unchanged, so the file is also readable by other tools. When
    /// the file does not exist, the message says why (kernel built without
    /// CONFIG_MEM_ALLOC_PROFILING, profiling disabled at boot, or no permission).
    Snapshot(SnapshotArgs),
    /// List the tags of one snapshot, sorted, filtered and optionally grouped.
    Show(ShowArgs),
    /// Show what changed between two snapshots, per tag or per group.
    ///
    /// A row's delta is NEW minus OLD; a tag missing on one side counts as zero there and is
    /// listed as added or removed. Totals cover every tag that --filter keeps. Page-table tags
    /// (pagetable_alloc) are marked `pt`, vmalloc call sites `vm`. For accurate:no tags the
    /// absolute values are flagged `~` (too low), while their deltas are exact.
    Diff(DiffArgs),
    /// Re-read allocinfo at an interval and print what changed, against the previous and the
    /// first sample.
    Watch(WatchArgs),
}

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// Write the snapshot to FILE (atomically: a temporary file renamed over it) instead of
    /// standard output. `-` means standard output.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// File to read instead of /proc/allocinfo.
    #[arg(long, value_name = "PATH", default_value = PROC_ALLOCINFO)]
    pub file: PathBuf,
}

/// Options shared by every command that reads snapshots.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// Skip lines that cannot be parsed instead of stopping at the first; the number skipped and
    /// the first error are reported on standard error.
    #[arg(long)]
    pub lenient: bool,
}

/// Options that pick and fold tags.
#[derive(Debug, Args)]
pub struct SelectArgs {
    /// Keep only tags whose file, function or module matches REGEX (unanchored; Rust regex
    /// syntax, e.g. `^mm/`, `vmalloc|vmap`, `^ext4$`).
    #[arg(long, value_name = "REGEX", value_parser = parse_regex)]
    pub filter: Option<Regex>,

    /// Sum tags per function, source file, module (built-in code is `(built-in)`) or source
    /// directory.
    #[arg(long, value_enum, value_name = "KEY")]
    pub group_by: Option<GroupBy>,

    /// Also mark as vmalloc call sites (`vm`) the tags whose function is a caller in this
    /// /proc/vmallocinfo capture. Without it only mm/vmalloc.c's own tags are marked `vm`.
    #[arg(long, value_name = "FILE")]
    pub vmallocinfo: Option<PathBuf>,
}

/// Options of text and JSON output.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Print JSON instead of a table (see docs/allocinfo.md for the fields).
    #[arg(long)]
    pub json: bool,

    /// Print exact byte counts instead of IEC sizes like `numfmt --to=iec` (2.8M).
    #[arg(long)]
    pub bytes: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Snapshot file in any allocinfo format, /proc/allocinfo itself, or `-` for standard input.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// Order of the rows: largest bytes first, most calls first, or by name.
    #[arg(long, value_enum, default_value_t = ShowSort::Bytes)]
    pub sort: ShowSort,

    /// Print only the first N rows (the total still covers all of them).
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,

    #[command(flatten)]
    pub select: SelectArgs,
    #[command(flatten)]
    pub read: ReadArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The earlier snapshot (`-` for standard input).
    #[arg(value_name = "OLD")]
    pub old: PathBuf,

    /// The later snapshot (`-` for standard input, /proc/allocinfo for now).
    #[arg(value_name = "NEW")]
    pub new: PathBuf,

    /// Order of the rows: largest change in bytes or calls first (either sign), largest value
    /// in NEW first, or by name.
    #[arg(long, value_enum, default_value_t = DiffSort::DeltaBytes)]
    pub sort: DiffSort,

    /// List only rows whose byte change is at least SIZE either way (`4096`, `64K`, `1.5MiB`).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub min_delta: Option<u64>,

    /// Print only the first N rows (the totals still cover all of them).
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,

    /// Also list the rows that did not change.
    #[arg(long)]
    pub all: bool,

    #[command(flatten)]
    pub select: SelectArgs,
    #[command(flatten)]
    pub read: ReadArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Time between samples (`1s`, `500ms`, `2m`; a bare number is seconds).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = crate::value_parsers::parse_duration)]
    pub interval: Duration,

    /// Print at most N changed rows per update, largest change first.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,

    /// File to watch; any path works, which is how it is tested without the kernel feature.
    #[arg(long, value_name = "PATH", default_value = PROC_ALLOCINFO)]
    pub file: PathBuf,

    /// Stop after N samples after the first (default: run until interrupted).
    #[arg(long, value_name = "N")]
    pub count: Option<usize>,

    #[command(flatten)]
    pub select: SelectArgs,
    #[command(flatten)]
    pub read: ReadArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

fn parse_regex(s: &str) -> Result<Regex, String> {
    Regex::new(s).map_err(|e| format!("`{s}` is not a valid regular expression: {e}"))
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_number(s)
        .and_then(|n| u64::try_from(n.value).ok())
        .ok_or_else(|| {
            format!("`{s}` is not a size: expected a non-negative byte count such as 4096, 64K or 1.5MiB")
        })
}

pub fn run(cmd: &AllocinfoCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        AllocinfoCommand::Snapshot(args) => run_snapshot(args),
        AllocinfoCommand::Show(args) => run_show(args),
        AllocinfoCommand::Diff(args) => run_diff(args),
        AllocinfoCommand::Watch(args) => run_watch(args),
    }
}

fn run_snapshot(args: &SnapshotArgs) -> anyhow::Result<ExitCode> {
    let bytes = snapshot::read(&args.file)?;
    for warning in live_warnings(&args.file) {
        eprintln!("vmtrace: warning: {warning}");
    }
    // Validate without changing what is saved: a format this parser does not know yet is worth a
    // warning, not a lost capture.
    let name = args.file.display().to_string();
    if let Ok(parsed) = parse(&name, &bytes, Mode::Lenient) {
        report_skipped(&parsed);
    }
    match &args.output {
        Some(path) if path != Path::new("-") => {
            snapshot::write_atomic(path, &bytes)?;
            eprintln!(
                "vmtrace: saved {} to {}",
                args.file.display(),
                path.display()
            );
        }
        _ => write_stdout(&bytes)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn run_show(args: &ShowArgs) -> anyhow::Result<ExitCode> {
    let snap = load(&args.file, &args.read)?;
    let selection = selection(&args.select)?;
    let report = show(&snap, &selection, args.sort, args.top);
    if args.output.json {
        let text = serde_json::to_string_pretty(&report).context("cannot encode JSON")?;
        write_stdout(format!("{text}\n").as_bytes())?;
    } else {
        write_stdout(report.to_text(size_style(&args.output)).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn run_diff(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    if args.old == Path::new("-") && args.new == Path::new("-") {
        anyhow::bail!("OLD and NEW cannot both be `-` (standard input can be read only once)");
    }
    let selection = selection(&args.select)?;
    // Reading and parsing the two inputs are independent: do them at the same time.
    let (old, new) = std::thread::scope(|scope| {
        let other = scope.spawn(|| load(&args.old, &args.read));
        let new = load(&args.new, &args.read);
        let old = other
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (old, new)
    });
    let (old, new) = (old?, new?);
    let result = diff(&old, &new, &selection);
    let listing = Listing {
        sort: args.sort,
        min_delta: args.min_delta.unwrap_or(0),
        top: args.top,
        all: args.all,
    };
    if args.output.json {
        let text = serde_json::to_string_pretty(&result.to_json(&listing))
            .context("cannot encode JSON")?;
        write_stdout(format!("{text}\n").as_bytes())?;
    } else {
        write_stdout(
            result
                .to_text(&listing, size_style(&args.output))
                .as_bytes(),
        )?;
    }
    // The process ends here: freeing some 10^5 small allocations one by one would take longer
    // than the diff itself on large files, and the kernel reclaims them at once.
    std::mem::forget((old, new, result));
    Ok(ExitCode::SUCCESS)
}

fn run_watch(args: &WatchArgs) -> anyhow::Result<ExitCode> {
    for warning in live_warnings(&args.file) {
        eprintln!("vmtrace: warning: {warning}");
    }
    let options = WatchOptions {
        interval: args.interval,
        count: args.count,
        top: Some(args.top),
        mode: mode(&args.read),
        json: args.output.json,
        style: size_style(&args.output),
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match watch::run(&args.file, selection(&args.select)?, &options, &mut out) {
        Err(super::error::AllocinfoError::Write { source, .. })
            if source.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            Ok(ExitCode::SUCCESS)
        }
        other => {
            other?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn live_warnings(path: &Path) -> Vec<String> {
    if path == Path::new(PROC_ALLOCINFO) {
        snapshot::live_warnings()
    } else {
        Vec::new()
    }
}

fn mode(read: &ReadArgs) -> Mode {
    if read.lenient {
        Mode::Lenient
    } else {
        Mode::Strict
    }
}

fn size_style(output: &OutputArgs) -> SizeStyle {
    if output.bytes {
        SizeStyle::Exact
    } else {
        SizeStyle::Iec
    }
}

fn selection(args: &SelectArgs) -> anyhow::Result<Selection> {
    let marker = match &args.vmallocinfo {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let marker = Marker::with_vmallocinfo(&text);
            if marker.caller_count() == 0 {
                eprintln!(
                    "vmtrace: warning: {} names no vmalloc callers (is it a /proc/vmallocinfo capture?)",
                    path.display()
                );
            }
            marker
        }
        None => Marker::default(),
    };
    Ok(Selection {
        filter: args.filter.clone(),
        group_by: args.group_by,
        marker,
    })
}

/// Reads and parses one input, reporting lenient skips on stderr.
fn load(path: &Path, read: &ReadArgs) -> anyhow::Result<Snapshot> {
    let (name, bytes) = if path == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("cannot read standard input")?;
        ("-".to_string(), bytes)
    } else {
        (path.display().to_string(), snapshot::read(path)?)
    };
    let snap = parse(&name, &bytes, mode(read))?;
    report_skipped(&snap);
    Ok(snap)
}

fn report_skipped(snap: &Snapshot) {
    if let Some(first) = snap.skipped.first() {
        eprintln!(
            "vmtrace: warning: skipped {} bad line(s) in {}; the first: {first}",
            snap.skipped.len(),
            snap.source_name
        );
    }
}

/// Writes to stdout; a closed pipe (`| head`) is a normal end, not an error.
fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot write to standard output"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_arguments() {
        assert_eq!(parse_size_arg("64K"), Ok(65536));
        assert_eq!(parse_size_arg("4096"), Ok(4096));
        assert!(parse_size_arg("-1").unwrap_err().contains("`-1`"));
        assert!(parse_regex("(").unwrap_err().contains("`(`"));
    }
}
