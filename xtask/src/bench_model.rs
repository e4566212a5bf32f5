//! `cargo xtask bench-model`: how fast is the allocator model, and does replay memory stay flat?
//!
//! Issue 3's performance acceptance, measured on synthetic `fix_size` traces (`vmtrace synth
//! --mask 1`) of 10 M and 1 M events, generated once and cached in target/bench/:
//!
//! - the model core's events/s on one thread, events parsed before the clock starts (the
//!   `model_core` bench of the vmtrace crate, `vmtrace/benches/model_core.rs`);
//! - `vmtrace replay --json FILE` against `jq -c 'select(.type=="alloc")' FILE | wc -l` on the
//!   same file, wall time;
//! - the peak RSS of that replay on the 10 M trace over the 1 M one.
//!
//! Like `cargo xtask bench`, it reports and does not judge: the targets are printed beside the
//! numbers, and it only fails when something cannot be measured at all. Wall times on a shared
//! machine count other processes' time slices, so CPU times are printed beside them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use clap::Args;
use serde::Serialize;
use serde_json::Value;

use crate::cmd::{self, banner, find_on_path};
use crate::run::build_release;

#[derive(Debug, Args)]
pub struct BenchModelArgs {
    /// Events of the large trace (allocs + frees; the purges come on top).
    #[arg(long, default_value_t = 10_000_000)]
    pub events: u64,
    /// Events of the small trace the large one's peak RSS is compared with.
    #[arg(long, default_value_t = 1_000_000)]
    pub small_events: u64,
    /// Repeat each measurement this many times and keep the best (a benchmark on a busy
    /// machine is slowed by others, never sped up).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Generate the traces again even when target/bench/ has them (after a change to
    /// `vmtrace synth`).
    #[arg(long)]
    pub regenerate: bool,
    /// Skip the jq comparison (about a minute per round on the 10 M trace).
    #[arg(long)]
    pub no_jq: bool,
}

/// The workload: `fix_size_alloc_test` on an imagined 2-CPU machine with two threads, so that
/// the trace has two vmap nodes, both pools in use, and a purge every few thousand frees.
const THREADS: u64 = 2;
const CPUS: u64 = 2;

/// Issue 3's targets.
const TARGET_CORE_EVENTS_PER_SEC: f64 = 5e6;
const TARGET_RSS_RATIO: f64 = 1.5;

/// One run of a child process: wall time and what `wait4` reports.
#[derive(Clone, Copy, Debug, Default, Serialize)]
struct Run {
    wall_s: f64,
    user_s: f64,
    sys_s: f64,
    max_rss_kb: u64,
}

impl Run {
    fn cpu_s(&self) -> f64 {
        self.user_s + self.sys_s
    }
}

#[derive(Debug, Serialize)]
struct TraceFile {
    path: PathBuf,
    events: u64,
    bytes: u64,
}

#[derive(Debug, Serialize)]
struct Results {
    large: TraceFile,
    small: TraceFile,
    rounds: u32,
    /// The `model_core` bench's JSON on the large and the small trace.
    model_core_large: Value,
    model_core_small: Value,
    /// Best replay of each trace (by wall time), with its peak RSS.
    replay_large: Run,
    replay_small: Run,
    /// Largest peak RSS over the rounds, per trace: the figure the ratio uses.
    replay_large_max_rss_kb: u64,
    replay_small_max_rss_kb: u64,
    jq_large: Option<Run>,
    jq_alloc_lines: Option<u64>,
    /// Placement and nr_lazy agreement of the replay: a synthetic trace is self-consistent, so
    /// anything under 100 % means the trace or the replay is broken, not slow.
    replay_placement_percent: Option<f64>,
    replay_nr_lazy_percent: Option<f64>,
    core_events_per_sec: Option<f64>,
    jq_over_replay_wall: Option<f64>,
    rss_ratio: f64,
}

pub fn bench_model(args: &BenchModelArgs) -> Result<std::process::ExitCode> {
    if args.events == 0 || args.small_events == 0 {
        bail!("--events and --small-events must be positive");
    }
    let vmtrace = build_release()?;
    let dir = cmd::metadata()?.target_directory.join("bench");
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let rounds = args.rounds.max(1);

    banner("synthetic traces");
    let large = trace_file(&vmtrace, &dir, args.events, args.regenerate)?;
    let small = trace_file(&vmtrace, &dir, args.small_events, args.regenerate)?;

    banner("model core (cargo bench -p vmtrace --bench model_core)");
    let model_core_large = model_core(&large.path, rounds)?;
    let model_core_small = model_core(&small.path, 1)?;

    banner("vmtrace replay");
    let report_path = dir.join("model-replay-report.json");
    let mut replay_large = Vec::new();
    let mut replay_small = Vec::new();
    for _ in 0..rounds {
        replay_large.push(replay(&vmtrace, &large.path, &report_path)?);
        replay_small.push(replay(
            &vmtrace,
            &small.path,
            &dir.join("model-replay-small.json"),
        )?);
    }
    let agreement = agreement(&report_path);

    let mut jq = None;
    let mut jq_lines = None;
    if args.no_jq {
        println!("jq skipped (--no-jq)");
    } else if find_on_path("jq").is_none() {
        println!("jq is not installed: the replay-against-jq comparison is skipped");
    } else {
        banner("jq -c 'select(.type==\"alloc\")' FILE | wc -l");
        let mut best: Option<Run> = None;
        for _ in 0..rounds {
            let (run, lines) = jq_count(&large.path)?;
            jq_lines = Some(lines);
            if best.is_none_or(|b| run.wall_s < b.wall_s) {
                best = Some(run);
            }
        }
        jq = best;
    }

    let fastest = |runs: &[Run]| {
        runs.iter()
            .copied()
            .min_by(|a, b| a.wall_s.total_cmp(&b.wall_s))
            .unwrap_or_default()
    };
    let max_rss = |runs: &[Run]| runs.iter().map(|r| r.max_rss_kb).max().unwrap_or(0);
    let (large_rss, small_rss) = (max_rss(&replay_large), max_rss(&replay_small));
    let replay_large_best = fastest(&replay_large);
    let results = Results {
        core_events_per_sec: model_core_large["model_core_events_per_sec"].as_f64(),
        jq_over_replay_wall: jq.map(|j| j.wall_s / replay_large_best.wall_s),
        rss_ratio: large_rss as f64 / small_rss.max(1) as f64,
        replay_placement_percent: agreement.map(|a| a.0),
        replay_nr_lazy_percent: agreement.map(|a| a.1),
        large,
        small,
        rounds,
        model_core_large,
        model_core_small,
        replay_large: replay_large_best,
        replay_small: fastest(&replay_small),
        replay_large_max_rss_kb: large_rss,
        replay_small_max_rss_kb: small_rss,
        jq_large: jq,
        jq_alloc_lines: jq_lines,
    };
    print_table(&results);
    let out = dir.join("model.json");
    fs::write(&out, serde_json::to_string_pretty(&results)? + "\n")
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!("\nwritten to {}", out.display());
    Ok(std::process::ExitCode::SUCCESS)
}

/// The cached trace of `events` events, generated when missing. The name carries every
/// parameter, and the trace is written under a temporary name and renamed, so an interrupted
/// generation is never taken for a finished one.
fn trace_file(vmtrace: &Path, dir: &Path, events: u64, regenerate: bool) -> Result<TraceFile> {
    // Each loop of fix_size is one alloc and one free per thread.
    let loops = events.div_ceil(2 * THREADS).max(1);
    let path = dir.join(format!(
        "synth-fix-size-t{THREADS}-c{CPUS}-l{loops}-s0.jsonl"
    ));
    if regenerate || !path.is_file() {
        let tmp = path.with_extension("jsonl.part");
        let mut c = Command::new(vmtrace);
        c.args(["synth", "--mask", "1", "--seed", "0"])
            .args(["--threads", &THREADS.to_string()])
            .args(["--cpus", &CPUS.to_string()])
            .args(["--loops", &loops.to_string()])
            .arg("--output")
            .arg(&tmp);
        let t = Instant::now();
        cmd::run(&mut c)?;
        println!("generated in {:.1} s", t.elapsed().as_secs_f64());
        fs::rename(&tmp, &path)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
    } else {
        println!("cached: {} (--regenerate to make it again)", path.display());
    }
    let bytes = fs::metadata(&path)
        .with_context(|| format!("cannot stat {}", path.display()))?
        .len();
    Ok(TraceFile {
        path,
        events: loops * 2 * THREADS,
        bytes,
    })
}

/// Runs the crate's `model_core` bench on `trace` and returns the JSON object it prints.
fn model_core(trace: &Path, rounds: u32) -> Result<Value> {
    let mut c = cmd::cargo();
    c.args([
        "bench",
        "--package",
        "vmtrace",
        "--bench",
        "model_core",
        "--",
    ])
    .arg(trace)
    .args(["--rounds", &rounds.to_string()])
    .stderr(Stdio::inherit());
    println!("$ {}", cmd::display(&c));
    let out = c
        .output()
        .with_context(|| format!("cannot start `{}`", cmd::display(&c)))?;
    if !out.status.success() {
        bail!("`{}` failed ({})", cmd::display(&c), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("the model_core bench printed no JSON: {}", stdout.trim()))?;
    serde_json::from_str(line).context("cannot parse the model_core bench's JSON")
}

/// `vmtrace replay --json TRACE > report`, timed, with its peak RSS.
fn replay(vmtrace: &Path, trace: &Path, report: &Path) -> Result<Run> {
    let out =
        fs::File::create(report).with_context(|| format!("cannot create {}", report.display()))?;
    let mut c = Command::new(vmtrace);
    c.args(["replay", "--json"]).arg(trace).stdout(out);
    let run = measure(&mut c)?;
    println!(
        "  {:.2} s wall, {:.2} s CPU, peak RSS {} KiB",
        run.wall_s,
        run.cpu_s(),
        run.max_rss_kb
    );
    Ok(run)
}

/// The jq baseline, run by `sh` so that the pipeline is the one the acceptance names; `wait4`
/// on the shell counts jq and wc too, since the shell waits for both.
fn jq_count(trace: &Path) -> Result<(Run, u64)> {
    let count = trace.with_extension("jq-count");
    let script = "jq -c 'select(.type==\"alloc\")' \"$1\" | wc -l > \"$2\"";
    let mut c = Command::new("sh");
    c.args(["-c", script, "sh"]).arg(trace).arg(&count);
    let run = measure(&mut c)?;
    let lines = fs::read_to_string(&count)
        .with_context(|| format!("cannot read {}", count.display()))?
        .trim()
        .parse()
        .context("wc -l printed no number")?;
    let _ = fs::remove_file(&count);
    println!(
        "  {lines} lines in {:.2} s wall, {:.2} s CPU",
        run.wall_s,
        run.cpu_s()
    );
    Ok((run, lines))
}

/// Runs a command to its end and reads its resource usage with `wait4`, which `std::process`
/// does not expose: peak RSS of the child (the largest of it and its waited-for children) and
/// its CPU time.
fn measure(c: &mut Command) -> Result<Run> {
    println!("$ {}", cmd::display(c));
    let t = Instant::now();
    let child = c
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start `{}`", cmd::display(c)))?;
    let pid = libc::pid_t::try_from(child.id()).context("child pid out of range")?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet waited for (`child` is never waited on or
    // killed); `status` and `usage` are valid, writable locals.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall_s = t.elapsed().as_secs_f64();
    if rc != pid {
        bail!(
            "wait4 on `{}` failed: {}",
            cmd::display(c),
            std::io::Error::last_os_error()
        );
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("`{}` failed (wait status {status:#x})", cmd::display(c));
    }
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    Ok(Run {
        wall_s,
        user_s: secs(usage.ru_utime),
        sys_s: secs(usage.ru_stime),
        // Linux reports ru_maxrss in KiB.
        max_rss_kb: u64::try_from(usage.ru_maxrss).unwrap_or(0),
    })
}

/// Placement and nr_lazy agreement in percent from a `replay --json` report.
fn agreement(report: &Path) -> Option<(f64, f64)> {
    let v: Value = serde_json::from_str(&fs::read_to_string(report).ok()?).ok()?;
    let r = v.get(0)?;
    let pct = |key: &str| {
        let a = &r[key];
        let compared = a["compared"].as_f64()?;
        let agreed = a["agreed"].as_f64()?;
        Some(if compared == 0.0 {
            100.0
        } else {
            100.0 * agreed / compared
        })
    };
    Some((pct("placement")?, pct("nr_lazy")?))
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

fn print_table(r: &Results) {
    let m = |e: u64| e as f64 / 1e6;
    banner("results");
    println!(
        "traces: {:.1} M events ({:.0} MB) and {:.1} M events ({:.0} MB), best of {} rounds",
        m(r.large.events),
        r.large.bytes as f64 / 1e6,
        m(r.small.events),
        r.small.bytes as f64 / 1e6,
        r.rounds
    );
    println!();
    println!("{:<44} {:>14} {:>14}   target", "measure", "value", "wall");
    let core = &r.model_core_large;
    let rate = |key: &str| {
        core[key]
            .as_f64()
            .map_or("-".into(), |v| format!("{:.2} M/s", v / 1e6))
    };
    println!(
        "{:<44} {:>14} {:>14}   >= 5 M/s: {}",
        "model core, events per CPU second",
        rate("model_core_events_per_sec"),
        rate("model_core_events_per_wall_sec"),
        verdict(
            r.core_events_per_sec
                .is_some_and(|v| v >= TARGET_CORE_EVENTS_PER_SEC)
        )
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "reader (JSON parsing), records/s",
        rate("reader_records_per_sec"),
        rate("reader_records_per_wall_sec")
    );
    println!(
        "{:<44} {:>14} {:>14}",
        "replay in process, lines/s",
        rate("replay_lines_per_sec"),
        rate("replay_lines_per_wall_sec")
    );
    println!(
        "{:<44} {:>13.2}s {:>13.2}s",
        "vmtrace replay --json (CPU, wall)",
        r.replay_large.cpu_s(),
        r.replay_large.wall_s
    );
    match (r.jq_large, r.jq_over_replay_wall) {
        (Some(j), Some(ratio)) => {
            println!(
                "{:<44} {:>13.2}s {:>13.2}s",
                "jq select(alloc) | wc -l (CPU, wall)",
                j.cpu_s(),
                j.wall_s
            );
            println!(
                "{:<44} {:>14} {:>13.1}x   > 1: {}",
                "jq wall / replay wall",
                "",
                ratio,
                verdict(ratio > 1.0)
            );
        }
        _ => println!("{:<44} {:>14}", "jq comparison", "skipped"),
    }
    println!(
        "{:<44} {:>11} KiB {:>10} KiB",
        "peak RSS of replay, large / small trace",
        r.replay_large_max_rss_kb,
        r.replay_small_max_rss_kb
    );
    println!(
        "{:<44} {:>14.2} {:>14}   <= 1.5: {}",
        "peak RSS ratio",
        r.rss_ratio,
        "",
        verdict(r.rss_ratio <= TARGET_RSS_RATIO)
    );
    if let (Some(p), Some(l)) = (r.replay_placement_percent, r.replay_nr_lazy_percent) {
        println!("replay agreement on the large trace: placement {p:.3} %, nr_lazy {l:.3} % (a synthetic trace should give 100 %)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_reads_a_replay_report() {
        let dir = std::env::temp_dir().join(format!("bench-model-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.json");
        fs::write(
            &p,
            r#"[{"placement":{"compared":4,"agreed":3},"nr_lazy":{"compared":0,"agreed":0}}]"#,
        )
        .unwrap();
        assert_eq!(agreement(&p), Some((75.0, 100.0)));
        fs::write(&p, "not json").unwrap();
        assert_eq!(agreement(&p), None);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn measure_reports_the_exit_and_the_usage() {
        let run = measure(Command::new("sh").args(["-c", "exit 0"])).unwrap();
        assert!(run.max_rss_kb > 0);
        assert!(measure(Command::new("sh").args(["-c", "exit 3"])).is_err());
    }
}
