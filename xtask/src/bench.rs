//! `cargo xtask bench`: how much does tracing slow a vmalloc-heavy workload?
//!
//! One run measures the same `vmtrace stress fix-size` workload four ways: untraced, under
//! `vmtrace record`, under a bpftrace script counting the same three vmalloc tracepoints, and
//! under `perf record -e 'vmalloc:*'`. The workload reports its own throughput, so tracer
//! start-up and tear-down are not counted. The goal the numbers are held to: vmtrace slows the
//! workload no more than bpftrace does. This is a benchmark, not a test: it reports, it does
//! not judge, and it only fails when a condition cannot be measured at all.

use std::fs;
use std::io::{BufRead as _, BufReader, Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::cmd::{self, banner, find_on_path, is_root};
use crate::run::build_release;
use crate::setup::setup;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// How long each run of the workload lasts (`10s`, `1m`; a bare number means seconds).
    #[arg(long, default_value = "10s")]
    pub duration: String,
    /// Data pages per BPF array map the workload creates and frees.
    #[arg(long, default_value_t = 16)]
    pub pages: u32,
    /// Worker threads of the workload.
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
    /// Repeat the four conditions this many times, interleaved, and compare medians: on a busy
    /// machine one run of each is mostly noise.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Keep the vmtrace trace and perf.data in target/bench/ instead of deleting them (they can
    /// take hundreds of MB).
    #[arg(long)]
    pub keep: bool,
}

/// The bpftrace baseline: count the three tracepoints vmtrace records, the cheapest thing a
/// bpftrace user would write to watch them.
const BPFTRACE_PROGRAM: &str = "tracepoint:vmalloc:alloc_vmap_area,tracepoint:vmalloc:free_vmap_area_noflush,tracepoint:vmalloc:purge_vmap_area_lazy { @[probe] = count(); }";
/// How many perf-event attachments bpftrace makes for that program.
const BPFTRACE_PROBES: usize = 3;

/// What `vmtrace stress --json` reports; other fields are ignored.
#[derive(Debug, Deserialize)]
struct StressReport {
    total_ops: u64,
    ops_per_sec: f64,
}

/// One row of the result table and of overhead.json.
#[derive(Debug, Serialize)]
struct Outcome {
    condition: &'static str,
    command: String,
    total_ops: Option<u64>,
    ops_per_sec: Option<f64>,
    ratio_to_untraced: Option<f64>,
    /// What the tracer itself reported (vmtrace's footer, bpftrace's counts, perf's samples).
    tracer: Option<Value>,
    /// Why the numbers may not mean what they seem, e.g. another tracer was attached.
    warnings: Vec<String>,
    error: Option<String>,
}

pub fn bench(args: &BenchArgs) -> Result<std::process::ExitCode> {
    if !is_root() {
        bail!("the benchmark attaches tracers (vmtrace, bpftrace, perf -a) and needs root");
    }
    setup()?;
    let vmtrace = build_release()?;
    let dir = cmd::metadata()?.target_directory.join("bench");
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;

    let stress = |program: &Path| {
        let mut c = Command::new(program);
        c.args(["stress", "fix-size", "--pages", &args.pages.to_string()])
            .args([
                "--threads",
                &args.threads.to_string(),
                "--duration",
                &args.duration,
                "--json",
            ]);
        c
    };
    let with_stress = |mut c: Command| {
        let s = stress(&vmtrace);
        c.arg("--").arg(s.get_program()).args(s.get_args());
        c
    };

    let rounds = args.rounds.max(1);
    let mut all_rounds: Vec<Vec<Outcome>> = Vec::new();
    for round in 1..=rounds {
        let mut outcomes = Vec::new();

        banner(&format!("round {round}/{rounds}: untraced"));
        outcomes.push(measure("untraced", stress(&vmtrace), |c| {
            run_workload(c).map(|(r, _)| (r, None))
        }));

        banner(&format!("round {round}/{rounds}: under vmtrace record"));
        let trace = dir.join("vmtrace-record.jsonl");
        let mut record = Command::new(&vmtrace);
        record.args(["record", "-o"]).arg(&trace);
        outcomes.push(measure("vmtrace record", with_stress(record), |c| {
            let (report, _) = run_workload(c)?;
            let footer = last_line(&trace)
                .ok()
                .flatten()
                .filter(|v| v["type"] == "footer");
            Ok((report, Some(json!({ "footer": footer }))))
        }));
        if !args.keep {
            let _ = fs::remove_file(&trace);
        }

        banner(&format!("round {round}/{rounds}: under bpftrace"));
        outcomes.push(measure("bpftrace", stress(&vmtrace), under_bpftrace));

        banner(&format!("round {round}/{rounds}: under perf record"));
        let perf_data = dir.join("perf.data");
        let mut perf = Command::new("perf");
        perf.args(["record", "-e", "vmalloc:*", "-a", "-o"])
            .arg(&perf_data);
        outcomes.push(measure("perf record", with_stress(perf), |c| {
            let (report, stderr) = run_workload(c)?;
            let bytes = fs::metadata(&perf_data).map(|m| m.len()).ok();
            let samples = perf_samples(&stderr);
            Ok((
                report,
                Some(json!({ "samples": samples, "perf_data_bytes": bytes })),
            ))
        }));
        if !args.keep {
            let _ = fs::remove_file(&perf_data);
        }
        all_rounds.push(outcomes);
    }
    let mut outcomes = median_outcomes(all_rounds);
    let base = outcomes.first().and_then(|o| o.ops_per_sec);
    for o in &mut outcomes {
        o.ratio_to_untraced = match (o.ops_per_sec, base) {
            (Some(v), Some(b)) if b > 0.0 => Some(v / b),
            _ => None,
        };
    }

    print_table(&outcomes);
    let out = dir.join("overhead.json");
    let report = json!({
        "benchmark": "vmtrace stress fix-size throughput under tracers",
        "workload": { "pattern": "fix-size", "pages": args.pages, "threads": args.threads, "duration": args.duration },
        "kernel": fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).ok(),
        "cpus": thread::available_parallelism().map(usize::from).ok(),
        "unix_time": SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).ok(),
        "rounds": rounds,
        "aggregation": "median ops/s per condition over the rounds; ratio = median / median untraced",
        "results": outcomes,
    });
    let text = serde_json::to_string_pretty(&report).context("cannot serialise the results")?;
    fs::write(&out, text + "\n").with_context(|| format!("cannot write {}", out.display()))?;
    println!("results written to {}", out.display());

    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.error.is_some())
        .map(|o| o.condition)
        .collect();
    if failed.is_empty() {
        Ok(std::process::ExitCode::SUCCESS)
    } else {
        bail!("could not measure: {}", failed.join(", "))
    }
}

/// Folds the rounds into one row per condition: the median ops/s, with every round's figure
/// kept in `tracer.rounds_ops_per_sec` and all warnings and errors carried over.
fn median_outcomes(rounds: Vec<Vec<Outcome>>) -> Vec<Outcome> {
    let mut merged: Vec<Outcome> = Vec::new();
    let mut per_condition: Vec<Vec<f64>> = Vec::new();
    for round in rounds {
        for (i, o) in round.into_iter().enumerate() {
            if merged.len() <= i {
                per_condition.push(Vec::new());
                merged.push(Outcome {
                    condition: o.condition,
                    command: o.command.clone(),
                    total_ops: None,
                    ops_per_sec: None,
                    ratio_to_untraced: None,
                    tracer: None,
                    warnings: Vec::new(),
                    error: None,
                });
            }
            if let Some(v) = o.ops_per_sec {
                per_condition[i].push(v);
            }
            let m = &mut merged[i];
            m.total_ops = match (m.total_ops, o.total_ops) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            m.tracer = o.tracer.or(m.tracer.take());
            m.warnings.extend(o.warnings);
            if o.error.is_some() {
                m.error = o.error;
            }
        }
    }
    for (m, mut values) in merged.iter_mut().zip(per_condition) {
        values.sort_by(f64::total_cmp);
        m.ops_per_sec = values.get(values.len() / 2).copied();
        let mut tracer = m.tracer.take().unwrap_or_else(|| json!({}));
        tracer["rounds_ops_per_sec"] = json!(values);
        m.tracer = Some(tracer);
        m.warnings.sort();
        m.warnings.dedup();
    }
    merged
}

/// Runs one condition and turns any failure into a row that says why, so one broken tracer
/// does not hide the others' numbers.
fn measure(
    condition: &'static str,
    mut cmd: Command,
    how: impl FnOnce(&mut Command) -> Result<(StressReport, Option<Value>)>,
) -> Outcome {
    let command = cmd::display(&cmd);
    let mut outcome = Outcome {
        condition,
        command,
        total_ops: None,
        ops_per_sec: None,
        ratio_to_untraced: None,
        tracer: None,
        warnings: Vec::new(),
        error: None,
    };
    // Checked before and after the run (when our own tracer is not attached): another tracer
    // during a condition slows the workload too, and can hide events from perf.
    let mut others = foreign_attachments();
    let result = how(&mut cmd);
    others.extend(foreign_attachments());
    others.sort();
    others.dedup();
    for who in others {
        outcome.warnings.push(format!(
            "{who} had a BPF program on a vmalloc tracepoint around this run: it slows the \
             workload too, and perf sees no events while a program returning 0 is attached"
        ));
    }
    match result {
        Ok((report, tracer)) => {
            println!(
                "{condition}: {:.0} ops/s ({} ops)",
                report.ops_per_sec, report.total_ops
            );
            // perf should see an event per alloc and per free; fewer than one per op means
            // something hid them.
            let samples = tracer.as_ref().and_then(|t| t["samples"].as_u64());
            if condition == "perf record" && samples.unwrap_or(0) < report.total_ops {
                outcome.warnings.push(format!(
                    "perf recorded {} samples for {} ops: a BPF program returning 0 on these \
                     tracepoints hides their events from perf",
                    samples.map_or("no".into(), |n| n.to_string()),
                    report.total_ops
                ));
            }
            outcome.total_ops = Some(report.total_ops);
            outcome.ops_per_sec = Some(report.ops_per_sec);
            outcome.tracer = tracer;
        }
        Err(err) => {
            println!("{condition}: FAILED: {err:#}");
            outcome.error = Some(format!("{err:#}"));
        }
    }
    for warning in &outcome.warnings {
        println!("warning: {warning}");
    }
    outcome
}

/// Runs the workload (possibly wrapped in a tracer), reads its JSON report from stdout, and
/// returns it with stderr, which is echoed once the run is over.
fn run_workload(cmd: &mut Command) -> Result<(StressReport, String)> {
    let line = cmd::display(cmd);
    println!("$ {line}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start `{line}`"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprint!("{stderr}");
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}); stdout: {}",
            out.status,
            stdout.trim()
        );
    }
    let report = parse_report(&stdout).with_context(|| {
        format!(
            "`{line}` printed no JSON object with total_ops and ops_per_sec; stdout: {}",
            stdout.trim()
        )
    })?;
    Ok((report, stderr))
}

/// The sample count from perf's closing line,
/// `[ perf record: Captured and wrote 9.8 MB perf.data (95136 samples) ]`; `None` when perf
/// recorded no sample at all (it then leaves the parenthesis out).
fn perf_samples(stderr: &str) -> Option<u64> {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.contains("perf record: Captured"))?;
    let (_, tail) = line.rsplit_once('(')?;
    tail.split_whitespace().next()?.parse().ok()
}

/// The vmalloc tracepoints the tracers under test attach to.
const VMALLOC_TRACEPOINTS: [&str; 3] = [
    "alloc_vmap_area",
    "free_vmap_area_noflush",
    "purge_vmap_area_lazy",
];

/// Processes holding a BPF program on a vmalloc tracepoint (`bpftool perf list`), as
/// `pid N (comm)`. Another tracer running during a condition slows the workload and skews the
/// comparison; worse, the kernel drops a tracepoint's perf samples whenever an attached BPF
/// program returns 0, so `perf record` then sees nothing. Empty when bpftool cannot tell.
fn foreign_attachments() -> Vec<String> {
    let Some(bpftool) = bpftool() else {
        return Vec::new();
    };
    let entries = cmd::stdout_of(Command::new(bpftool).args(["-j", "perf", "list"]))
        .ok()
        .and_then(|s| serde_json::from_str::<Vec<Value>>(&s).ok())
        .unwrap_or_default();
    let mut pids: Vec<u64> = entries
        .iter()
        .filter(|e| {
            e["fd_type"] == "tracepoint"
                && e["tracepoint"]
                    .as_str()
                    .is_some_and(|tp| VMALLOC_TRACEPOINTS.contains(&tp))
        })
        .filter_map(|e| e["pid"].as_u64())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids.into_iter()
        .map(|pid| {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("pid {pid} ({})", comm.trim())
        })
        .collect()
}

fn bpftool() -> Option<PathBuf> {
    find_on_path("bpftool").or_else(|| {
        let sbin = PathBuf::from("/usr/sbin/bpftool");
        sbin.is_file().then_some(sbin)
    })
}

/// Finds the workload's report in stdout that a tracer may have added lines to: the whole
/// output, else the last line that is a report, else a pretty-printed object at the end.
fn parse_report(stdout: &str) -> Option<StressReport> {
    serde_json::from_str(stdout.trim())
        .ok()
        .or_else(|| {
            stdout
                .lines()
                .rev()
                .find_map(|l| serde_json::from_str(l.trim()).ok())
        })
        .or_else(|| {
            let start = stdout.rfind("\n{").map(|i| i + 1)?;
            serde_json::from_str(stdout[start..].trim()).ok()
        })
}

/// The last complete line of a (possibly huge) JSON Lines file, parsed.
fn last_line(path: &Path) -> Result<Option<Value>> {
    let mut file =
        fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(1 << 20)))?;
    let mut tail = String::new();
    file.read_to_string(&mut tail)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(tail
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .and_then(|l| serde_json::from_str(l).ok()))
}

/// Kills a background tracer that is still running when its condition ends early.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs the workload while bpftrace counts the three tracepoints, starting it only once
/// bpftrace has attached, so every operation measured is traced.
fn under_bpftrace(stress: &mut Command) -> Result<(StressReport, Option<Value>)> {
    let mut bpftrace = Command::new("bpftrace");
    bpftrace.args(["-e", BPFTRACE_PROGRAM]);
    println!("$ {} &", cmd::display(&bpftrace));
    let child = bpftrace
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start bpftrace")?;
    let mut child = Background(child);
    let pid = child.0.id();

    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child
        .0
        .stdout
        .take()
        .context("bpftrace has no stdout pipe")?;
    let stderr = child
        .0
        .stderr
        .take()
        .context("bpftrace has no stderr pipe")?;
    let tx_err = tx.clone();
    let out_reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let err_reader = thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx_err.send(format!("stderr: {line}"));
        }
    });

    // bpftrace prints "Attaching N probes..." on stdout just before it attaches them.
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok(line) if line.contains("Attaching") => {
                lines.push(line);
                break;
            }
            Ok(line) => lines.push(line),
            Err(_) => bail!(
                "bpftrace did not start attaching within 60 s (exit: {:?}); it printed: {}",
                child.0.try_wait().ok().flatten(),
                lines.join(" | ")
            ),
        }
    }
    let attach_note = wait_attached(pid, BPFTRACE_PROBES, Duration::from_secs(15));
    println!("bpftrace: {attach_note}");

    let report = run_workload(stress).map(|(r, _)| r);

    // SIGINT makes bpftrace print its maps and exit; the counts show it saw the events.
    // SAFETY: kill(2) with a pid of our own live child; failure is harmless and reported by
    // the wait below.
    let pid_t = libc::pid_t::try_from(pid).context("bpftrace pid out of range")?;
    unsafe {
        libc::kill(pid_t, libc::SIGINT);
    }
    let exit_deadline = Instant::now() + Duration::from_secs(30);
    while child.0.try_wait().ok().flatten().is_none() && Instant::now() < exit_deadline {
        thread::sleep(Duration::from_millis(50));
    }
    drop(child); // kills it if SIGINT was not enough
    let _ = out_reader.join();
    let _ = err_reader.join();
    lines.extend(rx.try_iter());

    let counts: serde_json::Map<String, Value> = lines
        .iter()
        .filter_map(|l| parse_count(l))
        .map(|(probe, n)| (probe, Value::from(n)))
        .collect();
    let report = report?;
    Ok((
        report,
        Some(json!({ "attach": attach_note, "counts": counts })),
    ))
}

/// `@[tracepoint:vmalloc:alloc_vmap_area]: 1234` → (`tracepoint:vmalloc:alloc_vmap_area`, 1234).
fn parse_count(line: &str) -> Option<(String, u64)> {
    let rest = line.trim().strip_prefix("@[")?;
    let (probe, count) = rest.split_once("]:")?;
    Some((probe.to_string(), count.trim().parse().ok()?))
}

/// Waits until `bpftool perf list` shows `want` tracepoint attachments owned by `pid`, because
/// "Attaching" is printed before the attachments exist. Falls back to a fixed pause, and says
/// so, when bpftool cannot tell.
fn wait_attached(pid: u32, want: usize, timeout: Duration) -> String {
    let Some(bpftool) = bpftool() else {
        thread::sleep(Duration::from_secs(2));
        return "bpftool not found; waited 2 s after \"Attaching\"".into();
    };
    let deadline = Instant::now() + timeout;
    loop {
        let attached = cmd::stdout_of(Command::new(&bpftool).args(["-j", "perf", "list"]))
            .ok()
            .and_then(|s| serde_json::from_str::<Vec<Value>>(&s).ok())
            .map(|entries| {
                entries
                    .iter()
                    .filter(|e| e["pid"] == pid && e["fd_type"] == "tracepoint")
                    .count()
            });
        match attached {
            Some(n) if n >= want => return format!("{n} tracepoints attached (bpftool perf list)"),
            _ if Instant::now() >= deadline => {
                return format!("bpftool never showed {want} attachments for pid {pid}; started anyway after {timeout:?}")
            }
            _ => thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn print_table(outcomes: &[Outcome]) {
    banner("overhead: vmtrace stress fix-size throughput");
    println!("  {:<16} {:>14} {:>10}", "condition", "ops/s", "ratio");
    for o in outcomes {
        let ops = o.ops_per_sec.map_or("failed".into(), |v| format!("{v:.0}"));
        let ratio = o
            .ratio_to_untraced
            .map_or("-".into(), |v| format!("{v:.3}"));
        let flag = if o.warnings.is_empty() {
            ""
        } else {
            "  (see warnings)"
        };
        println!("  {:<16} {ops:>14} {ratio:>10}{flag}", o.condition);
    }
    let ratio = |name: &str| {
        outcomes
            .iter()
            .find(|o| o.condition == name)
            .and_then(|o| o.ratio_to_untraced)
    };
    if let (Some(v), Some(b)) = (ratio("vmtrace record"), ratio("bpftrace")) {
        let verdict = if v >= b { "met" } else { "NOT met" };
        println!("  goal (vmtrace slows the workload no more than bpftrace): {verdict} ({v:.3} vs {b:.3})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_is_found_among_tracer_output() {
        let plain = r#"{"total_ops": 10, "ops_per_sec": 5.0, "threads": []}"#;
        assert_eq!(parse_report(plain).map(|r| r.total_ops), Some(10));

        let wrapped = "perf noise\n{\"total_ops\": 7, \"ops_per_sec\": 3.5}\ntrailer\n";
        assert_eq!(parse_report(wrapped).map(|r| r.total_ops), Some(7));

        let pretty = "noise\n{\n  \"total_ops\": 9,\n  \"ops_per_sec\": 1.0\n}\n";
        assert_eq!(parse_report(pretty).map(|r| r.total_ops), Some(9));

        assert!(parse_report("no json here").is_none());
    }

    #[test]
    fn perf_sample_count_parses() {
        let stderr = "[ perf record: Woken up 63 times to write data ]\n\
            [ perf record: Captured and wrote 15.917 MB /x/perf.data (153170 samples) ]\n";
        assert_eq!(perf_samples(stderr), Some(153170));
        let none = "[ perf record: Captured and wrote 0.043 MB perf.data ]";
        assert_eq!(perf_samples(none), None);
    }

    #[test]
    fn bpftrace_counts_parse() {
        assert_eq!(
            parse_count("@[tracepoint:vmalloc:alloc_vmap_area]: 18"),
            Some(("tracepoint:vmalloc:alloc_vmap_area".into(), 18))
        );
        assert_eq!(parse_count("Attaching 3 probes..."), None);
    }
}
