//! `vmtrace import`: the command-line edge (anyhow lives here, not below).

use std::io::{BufRead, Cursor, Read};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Args;

use super::parse::Format;
use super::{import, ImportOptions};

/// Options of `vmtrace import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Text output of the vmalloc tracepoints: `perf script` (after `perf record -e
    /// 'vmalloc:*'`), `trace-cmd report`, or the tracefs `trace` file. Drain work items
    /// (`workqueue:workqueue_execute_*`) and lock waits (`lock:contention_begin/end`, with the
    /// kernel stack printed under each: `perf record -g`) are read too. `.gz` and `.zst` are
    /// read as they are; `-` reads stdin (held in memory: the input is read twice).
    pub input: PathBuf,

    /// The input's format; detected from the first event line when not given (`perf-script`
    /// prints `COMM PID [CPU]`, the other two `COMM-PID [CPU]`; the tracefs file adds a flags
    /// column after the CPU, which `trace-cmd report` prints only with `-l`).
    #[arg(long, value_name = "FORMAT", value_parser = ["perf-script", "trace-cmd", "ftrace"])]
    pub from: Option<String>,

    /// The trace to write; `.zst` or `.gz` compresses it. `-` writes to stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,

    /// A `/proc/vmallocinfo` dump taken with real addresses (as root) just before the events
    /// began: the start snapshot replay seeds its model from. Without it the trace starts from
    /// an empty VMALLOC space, and the header says so.
    #[arg(long, value_name = "DUMP")]
    pub vmallocinfo: Option<PathBuf>,

    /// When the dump was taken, as SECS.FRAC in the input's own clock (the tool's timestamps).
    /// Default: estimated as the point among the events where the dump fits them best
    /// (docs/import.md); the header says which.
    #[arg(long, value_name = "SECS", requires = "vmallocinfo", value_parser = parse_secs)]
    pub vmallocinfo_at: Option<u64>,

    /// Possible CPUs of the recorded machine (the node count and zone size follow from it).
    /// Default: the highest CPU in the input plus one, with a note in the header.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub cpus: Option<u32>,

    /// `lazy_max_pages` of the recorded machine. Default: the free events' `nr_lazy_max`.
    #[arg(long, value_name = "PAGES")]
    pub lazy_max: Option<u64>,

    /// Print what was imported as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ImportArgs) -> anyhow::Result<ExitCode> {
    let snapshot = match &args.vmallocinfo {
        None => None,
        Some(p) => {
            let mut text = String::new();
            crate::trace::compress::open(p)
                .with_context(|| format!("cannot open {}", p.display()))?
                .read_to_string(&mut text)
                .with_context(|| format!("reading {}", p.display()))?;
            let areas = crate::host::vmallocinfo::parse(&text)
                .map_err(|(line, msg)| anyhow::anyhow!("{}: line {line}: {msg}", p.display()))?;
            // `%pK` prints zeros or hashes (32-bit values) unless kptr_restrict lets the
            // reader see kernel addresses, which on x86_64 all lie in the top half.
            if let Some(a) = areas.iter().find(|a| a.start.0 < 1 << 63) {
                bail!(
                    "{}: {:#x} is not a kernel address: the dump's addresses are hashed or hidden; take it as root with kernel.kptr_restrict=1",
                    p.display(),
                    a.start.0
                );
            }
            Some(areas)
        }
    };
    let opts = ImportOptions {
        from: args.from.as_deref().and_then(Format::from_name),
        cpus: args.cpus,
        lazy_max: args.lazy_max,
        snapshot,
        snapshot_at: args.vmallocinfo_at,
        input: args.input.display().to_string(),
        command_line: std::env::args().collect(),
    };
    let out: Box<dyn std::io::Write> = if args.output.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        crate::trace::compress::create(&args.output)
            .with_context(|| format!("cannot create {}", args.output.display()))?
    };
    let name = args.input.display().to_string();
    let summary = if args.input.as_os_str() == "-" {
        let mut buf = Vec::new();
        crate::trace::compress::open(&args.input)?
            .read_to_end(&mut buf)
            .context("reading stdin")?;
        import(|| Ok(Cursor::new(&buf[..])), &opts, out)
    } else {
        let path = args.input.clone();
        import(
            || -> std::io::Result<Box<dyn BufRead + Send>> { crate::trace::compress::open(&path) },
            &opts,
            out,
        )
    }
    .with_context(|| format!("importing {name}"))?;
    if args.json {
        let v = serde_json::json!({
            "from": summary.format.name(),
            "lines": summary.lines,
            "events": summary.events,
            "other_events": summary.other_events,
            "repeated_lines": summary.repeated_lines,
            "drain_items": summary.drain_items,
            "lock_waits": summary.lock_waits,
            "cpus": summary.cpus,
            "inferred": summary.inferred,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    eprintln!(
        "vmtrace import: {} lines of {}: {} alloc, {} free, {} purge, {} drain items, {} lock waits on vmap paths; {} events of other kinds skipped",
        summary.lines,
        summary.format.name(),
        summary.events.alloc,
        summary.events.free,
        summary.events.purge,
        summary.drain_items,
        summary.lock_waits,
        summary.other_events
    );
    for note in &summary.inferred {
        eprintln!("  inferred: {note}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `SECS.FRAC` (up to 9 fractional digits) as nanoseconds.
fn parse_secs(s: &str) -> Result<u64, String> {
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    if secs.is_empty()
        || frac.len() > 9
        || !secs.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return Err(format!("`{s}` is not SECS.FRAC (e.g. 16736.414516)"));
    }
    let whole: u64 = secs.parse().map_err(|e| format!("`{s}`: {e}"))?;
    let part: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse::<u64>().map_err(|e| format!("`{s}`: {e}"))? * 10u64.pow(9 - frac.len() as u32)
    };
    whole
        .checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(part))
        .ok_or_else(|| format!("`{s}` is too large"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn seconds_parse_to_nanoseconds() {
        assert_eq!(super::parse_secs("16736.414516"), Ok(16_736_414_516_000));
        assert_eq!(super::parse_secs("2"), Ok(2_000_000_000));
        assert_eq!(super::parse_secs("1.000000001"), Ok(1_000_000_001));
        assert!(super::parse_secs("1.0000000001").is_err());
        assert!(super::parse_secs("-1").is_err());
        assert!(super::parse_secs("x.5").is_err());
    }
}
