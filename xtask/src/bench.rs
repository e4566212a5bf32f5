//! `cargo xtask bench`: how much does tracing slow a vmalloc-heavy workload?
//!
//! One run measures the same `vmtrace stress fix-size` workload under each condition of
//! [`CONDITIONS`]: untraced; under `vmtrace record` with the foundation probes only (the three
//! vmalloc tracepoints, which is what the bpftrace baseline counts), with the default probes,
//! and with the issue-4 ladder set (the foundation and ladder runs once more with
//! `VMTRACE_TRACEPOINTS=perf`, to show what attaching raw tracepoints saves); under
//! `vmtrace serve` scraped every second, with and without
//! `--record`; under a bpftrace script counting the same three tracepoints; and under
//! `perf record -e 'vmalloc:*'`. The workload reports its own throughput, so tracer start-up and
//! tear-down are not counted. Conditions are interleaved round by round and compared by their
//! medians, because on a small shared machine one run of each is mostly noise.
//!
//! The goals the numbers are held to: vmtrace slows the workload no more than bpftrace does,
//! and `serve` no more than `record`. This is a benchmark, not a test: it reports, it does not
//! judge, and it only fails when a condition cannot be measured at all.
//!
//! `--soak DURATION` runs the daemon instead: `vmtrace serve --record` under stress with a
//! scrape every second, printing its resident memory as it goes, to show it stays flat.

use std::fs;
use std::io::Write as _;
use std::io::{BufRead as _, BufReader, Read as _, Seek as _, SeekFrom};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
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
    /// Repeat the conditions this many times, interleaved, and compare medians: on a busy
    /// machine one run of each is mostly noise.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Keep the vmtrace traces and perf.data in target/bench/ instead of deleting them (they
    /// can take hundreds of MB).
    #[arg(long)]
    pub keep: bool,
    /// Measure only these conditions, comma-separated (default: all): untraced, foundation,
    /// record, record-zst (the same, compressed), ladder, foundation-perf, ladder-perf (the same with perf tracepoints), serve,
    /// serve-record, top (`vmtrace top -b` with its live model; its own CPU share is reported),
    /// bpftrace, perf. `untraced` is always measured: it is the baseline of every
    /// ratio.
    #[arg(long, value_delimiter = ',', value_name = "CONDITIONS")]
    pub only: Vec<String>,
    /// Soak instead of the overhead table: run `vmtrace serve --record` this long (`10m`) under
    /// stress with a scrape every second, printing its RSS at the start, every --soak-every and
    /// at the end; results in target/bench/soak.json.
    #[arg(long, value_name = "DURATION")]
    pub soak: Option<String>,
    /// With --soak: how often to print the RSS.
    #[arg(long, value_name = "DURATION", default_value = "1m")]
    pub soak_every: String,
}

/// One way of running the workload.
#[derive(Clone, Copy, Debug)]
struct Condition {
    /// What `--only` names it.
    key: &'static str,
    /// Its row in the table and `condition` in overhead.json.
    label: &'static str,
}

/// Every condition, in the order each round measures them.
const CONDITIONS: [Condition; 12] = [
    Condition {
        key: "untraced",
        label: "untraced",
    },
    Condition {
        key: "foundation",
        label: "record --probes none",
    },
    Condition {
        key: "record",
        label: "vmtrace record",
    },
    Condition {
        key: "record-zst",
        label: "vmtrace record -o .jsonl.zst",
    },
    Condition {
        key: "ladder",
        label: "record +ladder",
    },
    Condition {
        key: "foundation-perf",
        label: "record --probes none, perf tracepoints",
    },
    Condition {
        key: "ladder-perf",
        label: "record +ladder, perf tracepoints",
    },
    Condition {
        key: "serve",
        label: "serve, 1 scrape/s",
    },
    Condition {
        key: "serve-record",
        label: "serve --record",
    },
    Condition {
        key: "top",
        label: "top -b (model live)",
    },
    Condition {
        key: "bpftrace",
        label: "bpftrace",
    },
    Condition {
        key: "perf",
        label: "perf record",
    },
];

/// The optional probes of the `ladder` condition: issue 4's set (the default set has
/// alloc_latency instead of page_tables).
const LADDER_PROBES: &str = "lock_waits,purge_work,page_tables";

/// The conditions `--only` selects, in measuring order, with `untraced` added; an unknown name
/// is refused with the list of known ones.
fn select(only: &[String]) -> Result<Vec<Condition>> {
    for name in only {
        if !CONDITIONS.iter().any(|c| c.key == name.trim()) {
            bail!(
                "unknown condition `{name}` in --only; known: {}",
                CONDITIONS.map(|c| c.key).join(", ")
            );
        }
    }
    Ok(CONDITIONS
        .into_iter()
        .filter(|c| {
            only.is_empty() || c.key == "untraced" || only.iter().any(|o| o.trim() == c.key)
        })
        .collect())
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
    key: &'static str,
    command: String,
    total_ops: Option<u64>,
    ops_per_sec: Option<f64>,
    ratio_to_untraced: Option<f64>,
    /// The median of the per-round ratios to the untraced run of the same round (see
    /// [`paired_ratio`]); what the comparisons use.
    paired_ratio: Option<f64>,
    /// Lowest and highest round's ops/s over the median untraced ops/s: the spread a
    /// difference between two ratios has to beat to mean something.
    ratio_range: Option<(f64, f64)>,
    /// What the tracer itself reported (vmtrace's footer, bpftrace's counts, perf's samples).
    tracer: Option<Value>,
    /// Why the numbers may not mean what they seem, e.g. another tracer was attached.
    warnings: Vec<String>,
    error: Option<String>,
}

impl Outcome {
    /// A row with nothing measured yet.
    fn empty(condition: &'static str, key: &'static str, command: String) -> Self {
        Outcome {
            condition,
            key,
            command,
            total_ops: None,
            ops_per_sec: None,
            ratio_to_untraced: None,
            paired_ratio: None,
            ratio_range: None,
            tracer: None,
            warnings: Vec::new(),
            error: None,
        }
    }
}

pub fn bench(args: &BenchArgs) -> Result<std::process::ExitCode> {
    if !is_root() {
        bail!("the benchmark attaches tracers (vmtrace, bpftrace, perf -a) and needs root");
    }
    let conditions = select(&args.only)?;
    setup()?;
    let vmtrace = build_release()?;
    let dir = cmd::metadata()?.target_directory.join("bench");
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if let Some(total) = &args.soak {
        return soak(args, total, &vmtrace, &dir);
    }

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
    // `vmtrace record` with some probes, its footer as what the tracer reported.
    // `perf`: every tracepoint as a perf tracepoint program, as before raw attach existed.
    let under_record = |probes: &str, trace: &Path, perf: bool| {
        let mut record = Command::new(&vmtrace);
        record.args(["record", "--probes", probes, "-o"]).arg(trace);
        if perf {
            record.env("VMTRACE_TRACEPOINTS", "perf");
        }
        (with_stress(record), trace.to_path_buf())
    };
    // The footer of a plain trace is its last line; a compressed one is read through
    // `vmtrace summary`, which decompresses. The size says what each costs on disk per event.
    let record_footer = |c: &mut Command, trace: &Path| {
        let (report, _) = run_workload(c)?;
        let bytes = fs::metadata(trace).map(|m| m.len()).ok();
        let footer = if trace.extension().is_some_and(|e| e == "zst") {
            summary_footer(&vmtrace, trace)
        } else {
            last_line(trace)
                .ok()
                .flatten()
                .filter(|v| v["type"] == "footer")
        };
        Ok((report, Some(json!({ "footer": footer, "bytes": bytes }))))
    };
    let default_probes = vmtrace_default_probes(&vmtrace);

    let rounds = args.rounds.max(1);
    let mut all_rounds: Vec<Vec<Outcome>> = Vec::new();
    for round in 1..=rounds {
        let mut outcomes = Vec::new();
        for c in &conditions {
            banner(&format!("round {round}/{rounds}: {}", c.label));
            let outcome = match c.key {
                "untraced" => measure(*c, stress(&vmtrace), |cmd| {
                    run_workload(cmd).map(|(r, _)| (r, None))
                }),
                "foundation" | "record" | "record-zst" | "ladder" | "foundation-perf"
                | "ladder-perf" => {
                    let probes = match c.key {
                        "foundation" | "foundation-perf" => "none",
                        "record" | "record-zst" => default_probes.as_str(),
                        _ => LADDER_PROBES,
                    };
                    let ext = if c.key == "record-zst" {
                        "jsonl.zst"
                    } else {
                        "jsonl"
                    };
                    let (cmd, trace) = under_record(
                        probes,
                        &dir.join(format!("vmtrace-{}.{ext}", c.key)),
                        c.key.ends_with("-perf"),
                    );
                    let o = measure(*c, cmd, |cmd| record_footer(cmd, &trace));
                    if !args.keep {
                        let _ = fs::remove_file(&trace);
                    }
                    o
                }
                "serve" | "serve-record" => {
                    let traces = (c.key == "serve-record").then(|| dir.join("serve-traces"));
                    if let Some(t) = &traces {
                        let _ = fs::remove_dir_all(t);
                    }
                    let o = measure(*c, stress(&vmtrace), |cmd| {
                        under_serve(&vmtrace, cmd, traces.as_deref(), &dir)
                    });
                    if let (Some(t), false) = (&traces, args.keep) {
                        let _ = fs::remove_dir_all(t);
                    }
                    o
                }
                "top" => measure(*c, stress(&vmtrace), |cmd| {
                    under_top(&vmtrace, cmd, &dir.join("top.log"))
                }),
                "bpftrace" => measure(*c, stress(&vmtrace), under_bpftrace),
                _ => {
                    let perf_data = dir.join("perf.data");
                    let mut perf = Command::new("perf");
                    perf.args(["record", "-e", "vmalloc:*", "-a", "-o"])
                        .arg(&perf_data);
                    let o = measure(*c, with_stress(perf), |cmd| {
                        let (report, stderr) = run_workload(cmd)?;
                        let bytes = fs::metadata(&perf_data).map(|m| m.len()).ok();
                        let samples = perf_samples(&stderr);
                        Ok((
                            report,
                            Some(json!({ "samples": samples, "perf_data_bytes": bytes })),
                        ))
                    });
                    if !args.keep {
                        let _ = fs::remove_file(&perf_data);
                    }
                    o
                }
            };
            outcomes.push(outcome);
        }
        all_rounds.push(outcomes);
    }
    let mut outcomes = median_outcomes(all_rounds);
    let untraced = outcomes.iter().find(|o| o.key == "untraced");
    let base = untraced.and_then(|o| o.ops_per_sec);
    let base_rounds = untraced.map(round_values).unwrap_or_default();
    for o in &mut outcomes {
        o.ratio_to_untraced = match (o.ops_per_sec, base) {
            (Some(v), Some(b)) if b > 0.0 => Some(v / b),
            _ => None,
        };
        let rounds = round_values(o);
        o.paired_ratio = paired_ratio(&rounds, &base_rounds);
        let v: Vec<f64> = rounds.into_iter().flatten().collect();
        o.ratio_range = match base {
            Some(b) if b > 0.0 && !v.is_empty() => {
                let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                Some((lo / b, hi / b))
            }
            _ => None,
        };
    }

    let comparisons = comparisons(&outcomes);
    print_table(&outcomes, &comparisons);
    let out = dir.join("overhead.json");
    let report = json!({
        "benchmark": "vmtrace stress fix-size throughput under tracers",
        "workload": { "pattern": "fix-size", "pages": args.pages, "threads": args.threads, "duration": args.duration },
        "kernel": fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).ok(),
        "cpus": thread::available_parallelism().map(usize::from).ok(),
        "loadavg_at_end": fs::read_to_string("/proc/loadavg").map(|s| s.trim().to_string()).ok(),
        "unix_time": SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).ok(),
        "rounds": rounds,
        "default_probes": default_probes,
        "ladder_probes": LADDER_PROBES,
        "aggregation": "median ops/s per condition over the rounds; ratio_to_untraced = median / median untraced; paired_ratio = median over rounds of (ops/s / untraced ops/s of the same round), used by the comparisons; ratio_range = (slowest, fastest round) / median untraced",
        "results": outcomes,
        "comparisons": comparisons,
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

/// What `vmtrace summary --json` says of a trace's end: events and lost events (`lost_total`
/// is null when the trace has no footer).
fn summary_footer(vmtrace: &Path, trace: &Path) -> Option<Value> {
    let out = Command::new(vmtrace)
        .args(["summary", "--json"])
        .arg(trace)
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(json!({ "events": v["events"], "lost_total": v["lost_total"], "via": "vmtrace summary" }))
}

/// The optional probes `vmtrace record` attaches by default, from its `--help` (so the
/// benchmark names what it measured even if the default changes); the known default if the
/// help cannot be read.
fn vmtrace_default_probes(vmtrace: &Path) -> String {
    const KNOWN: &str = "lock_waits,purge_work,alloc_latency";
    let help = cmd::stdout_of(Command::new(vmtrace).args(["record", "--help"])).unwrap_or_default();
    help.split("--probes")
        .nth(1)
        .and_then(|after| after.split("[default: ").nth(1))
        .and_then(|d| d.split(']').next())
        .map(str::to_string)
        .unwrap_or_else(|| KNOWN.to_string())
}

/// One derived comparison of two conditions' ratios.
#[derive(Debug, Serialize)]
struct Comparison {
    name: &'static str,
    /// What the numbers mean.
    meaning: &'static str,
    a: &'static str,
    b: &'static str,
    a_ratio: f64,
    b_ratio: f64,
    /// `a_ratio / b_ratio`.
    quotient: f64,
    /// For goals: whether `a` slowed the workload no more than `b`; absent for plain figures.
    goal_met: Option<bool>,
}

/// The comparisons the issues ask for, where both conditions were measured.
fn comparisons(outcomes: &[Outcome]) -> Vec<Comparison> {
    let ratio = |key: &str| {
        outcomes
            .iter()
            .find(|o| o.key == key)
            .and_then(|o| o.paired_ratio.or(o.ratio_to_untraced))
    };
    let specs: [(&str, &str, &str, &str, bool); 7] = [
        (
            "foundation vs bpftrace",
            "vmtrace with the same three tracepoints bpftrace counts: the fair comparison (goal: no slower)",
            "foundation",
            "bpftrace",
            true,
        ),
        (
            "record vs bpftrace",
            "vmtrace record with its default probes against bpftrace counting three tracepoints (goal: no slower)",
            "record",
            "bpftrace",
            true,
        ),
        (
            "ladder beyond foundation",
            "throughput kept with the ladder probes relative to the foundation probes alone; 1 - quotient is the overhead beyond the foundation",
            "ladder",
            "foundation",
            false,
        ),
        (
            "raw vs perf tracepoints (foundation)",
            "the foundation probes attached as raw tracepoints against the same programs as perf tracepoints",
            "foundation",
            "foundation-perf",
            false,
        ),
        (
            "raw vs perf tracepoints (ladder)",
            "the ladder probes attached as raw tracepoints against the same programs as perf tracepoints",
            "ladder",
            "ladder-perf",
            false,
        ),
        (
            "serve vs record",
            "vmtrace serve scraped every second against vmtrace record, same probes (goal: no slower)",
            "serve",
            "record",
            true,
        ),
        (
            "serve --record vs record",
            "serve writing rotating trace files against record writing one",
            "serve-record",
            "record",
            false,
        ),
    ];
    specs
        .into_iter()
        .filter_map(|(name, meaning, a, b, goal)| {
            let (ra, rb) = (ratio(a)?, ratio(b)?);
            Some(Comparison {
                name,
                meaning,
                a,
                b,
                a_ratio: ra,
                b_ratio: rb,
                quotient: ra / rb,
                goal_met: goal.then_some(ra >= rb),
            })
        })
        .collect()
}

/// The median (the upper one of an even count); `None` for no values.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

/// A row's ops/s per round, in round order (`None` for a failed round).
fn round_values(o: &Outcome) -> Vec<Option<f64>> {
    o.tracer
        .as_ref()
        .and_then(|t| t["rounds_ops_per_sec"].as_array())
        .map(|a| a.iter().map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// The median over rounds of `row / untraced` within each round. Conditions run one after the
/// other inside a round, so a pair shares the machine's load of the moment; on a shared machine
/// whose load drifts between rounds this is steadier than the ratio of the two medians.
fn paired_ratio(row: &[Option<f64>], base: &[Option<f64>]) -> Option<f64> {
    median(
        row.iter()
            .zip(base)
            .filter_map(|(v, b)| match (v, b) {
                (Some(v), Some(b)) if *b > 0.0 => Some(v / b),
                _ => None,
            })
            .collect(),
    )
}

/// Folds the rounds into one row per condition: the median ops/s, with every round's figure
/// kept in `tracer.rounds_ops_per_sec` and all warnings and errors carried over.
fn median_outcomes(rounds: Vec<Vec<Outcome>>) -> Vec<Outcome> {
    let mut merged: Vec<Outcome> = Vec::new();
    let mut per_condition: Vec<Vec<Option<f64>>> = Vec::new();
    let mut cpu_shares: Vec<Vec<Option<f64>>> = Vec::new();
    for round in rounds {
        for (i, o) in round.into_iter().enumerate() {
            if merged.len() <= i {
                per_condition.push(Vec::new());
                cpu_shares.push(Vec::new());
                merged.push(Outcome::empty(o.condition, o.key, o.command.clone()));
            }
            per_condition[i].push(o.ops_per_sec);
            let m = &mut merged[i];
            m.total_ops = match (m.total_ops, o.total_ops) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            cpu_shares[i].push(
                o.tracer
                    .as_ref()
                    .and_then(|t| t["cpu_share_of_one_cpu"].as_f64()),
            );
            m.tracer = o.tracer.or(m.tracer.take());
            m.warnings.extend(o.warnings);
            if o.error.is_some() {
                m.error = o.error;
            }
        }
    }
    for ((m, values), shares) in merged.iter_mut().zip(per_condition).zip(cpu_shares) {
        m.ops_per_sec = median(values.iter().flatten().copied().collect());
        let mut tracer = m.tracer.take().unwrap_or_else(|| json!({}));
        // In round order (null for a failed round), so rows can be paired round by round.
        tracer["rounds_ops_per_sec"] = json!(values);
        if shares.iter().any(Option::is_some) {
            tracer["rounds_cpu_share_of_one_cpu"] = json!(shares);
        }
        m.tracer = Some(tracer);
        m.warnings.sort();
        m.warnings.dedup();
    }
    merged
}

/// Runs one condition and turns any failure into a row that says why, so one broken tracer
/// does not hide the others' numbers.
fn measure(
    c: Condition,
    mut cmd: Command,
    how: impl FnOnce(&mut Command) -> Result<(StressReport, Option<Value>)>,
) -> Outcome {
    let condition = c.label;
    let command = cmd::display(&cmd);
    let mut outcome = Outcome::empty(condition, c.key, command);
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
            if c.key == "perf" && samples.unwrap_or(0) < report.total_ops {
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

fn print_table(outcomes: &[Outcome], comparisons: &[Comparison]) {
    banner("overhead: vmtrace stress fix-size throughput");
    let w = outcomes
        .iter()
        .map(|o| o.condition.len())
        .max()
        .unwrap_or(0)
        .max(9);
    println!(
        "  {:<w$} {:>12} {:>8} {:>8} {:>15}",
        "condition", "ops/s", "ratio", "paired", "rounds"
    );
    for o in outcomes {
        let ops = o.ops_per_sec.map_or("failed".into(), |v| format!("{v:.0}"));
        let ratio = o
            .ratio_to_untraced
            .map_or("-".into(), |v| format!("{v:.3}"));
        let paired = o.paired_ratio.map_or("-".into(), |v| format!("{v:.3}"));
        let range = o
            .ratio_range
            .map_or(String::new(), |(lo, hi)| format!("{lo:.3}-{hi:.3}"));
        let flag = if o.warnings.is_empty() {
            ""
        } else {
            "  (see warnings)"
        };
        println!(
            "  {:<w$} {ops:>12} {ratio:>8} {paired:>8} {range:>15}{flag}",
            o.condition
        );
    }
    println!("  foundation = vmtrace record --probes none: the three vmalloc tracepoints, as bpftrace counts them");
    println!("  ladder = vmtrace record --probes {LADDER_PROBES}");
    if comparisons.is_empty() {
        return;
    }
    println!();
    let w = comparisons.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for c in comparisons {
        let verdict = match c.goal_met {
            Some(true) => "  goal met",
            Some(false) => "  goal NOT met",
            None => "",
        };
        println!(
            "  {:<w$} {:.3} / {:.3} = {:.3}{verdict}",
            c.name, c.a_ratio, c.b_ratio, c.quotient
        );
    }
    println!("  (paired ratios; a goal is met when the first is at least the second; differences inside the rounds' spread are noise)");
}

/// Scrapes `/metrics` once a second on its own thread, like a Prometheus with a 1 s interval,
/// until stopped.
struct Scraper {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<ScrapeStats>,
}

#[derive(Debug, Default, Serialize)]
struct ScrapeStats {
    scrapes: u64,
    failures: u64,
    max_ms: f64,
    last_error: Option<String>,
}

impl Scraper {
    fn start(addr: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::spawn(move || {
            let mut stats = ScrapeStats::default();
            let mut next = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    next += Duration::from_secs(1);
                    let t = Instant::now();
                    match http_get(addr, "/metrics") {
                        Ok((200, _)) => stats.scrapes += 1,
                        Ok((code, _)) => {
                            stats.failures += 1;
                            stats.last_error = Some(format!("HTTP {code}"));
                        }
                        Err(e) => {
                            stats.failures += 1;
                            stats.last_error = Some(e.to_string());
                        }
                    }
                    stats.max_ms = stats.max_ms.max(t.elapsed().as_secs_f64() * 1e3);
                }
                thread::sleep(Duration::from_millis(20));
            }
            stats
        });
        Scraper { stop, handle }
    }

    fn stop(self) -> ScrapeStats {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// GET over HTTP/1.0 with a 5 s timeout; `(status, body)`.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let timeout = Duration::from_secs(5);
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// The sum of every sample of a metric family in an exposition (all label sets).
fn metric_sum(exposition: &str, name: &str) -> Option<f64> {
    let mut found = false;
    let mut sum = 0.0;
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            sum += v;
            found = true;
        }
    }
    found.then_some(sum)
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A `vmtrace serve` in the background on a free loopback port, stopped with SIGTERM.
struct Daemon {
    child: Background,
    addr: SocketAddr,
    log: PathBuf,
}

impl Daemon {
    /// Starts serve (with `--record DIR`, rotating at 64 MiB and keeping `keep` files) and
    /// waits until /healthz answers.
    fn start(vmtrace: &Path, record: Option<(&Path, u32)>, log: PathBuf) -> Result<Self> {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let mut serve = Command::new(vmtrace);
        serve.args(["serve", "--listen", &addr.to_string()]);
        if let Some((dir, keep)) = record {
            serve
                .arg("--record")
                .arg(dir)
                .args(["--rotate", "64M", "--keep", &keep.to_string()]);
        }
        println!("$ {} &", cmd::display(&serve));
        let stderr =
            fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let child = serve
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("cannot start vmtrace serve")?;
        let mut d = Daemon {
            child: Background(child),
            addr,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if matches!(http_get(addr, "/healthz"), Ok((200, _))) {
                return Ok(d);
            }
            if let Ok(Some(status)) = d.child.0.try_wait() {
                bail!("vmtrace serve exited ({status}): {}", d.log_text());
            }
            if Instant::now() >= deadline {
                bail!(
                    "vmtrace serve was not healthy within 60 s: {}",
                    d.log_text()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits up to 30 s for the exit; returns the exit status as text.
    fn stop(mut self) -> Result<String> {
        let pid = libc::pid_t::try_from(self.pid()).context("serve pid out of range")?;
        // SAFETY: kill(2) on our own live child.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.0.try_wait() {
                if !status.success() {
                    bail!("vmtrace serve exited {status}: {}", self.log_text());
                }
                return Ok(status.to_string());
            }
            if Instant::now() >= deadline {
                bail!("vmtrace serve did not stop within 30 s of SIGTERM");
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Runs the workload while `vmtrace serve` (optionally with `--record DIR`) counts it and a
/// scraper reads /metrics every second.
fn under_serve(
    vmtrace: &Path,
    stress: &mut Command,
    record: Option<&Path>,
    dir: &Path,
) -> Result<(StressReport, Option<Value>)> {
    let daemon = Daemon::start(vmtrace, record.map(|d| (d, 2)), dir.join("serve.log"))?;
    let before = http_get(daemon.addr, "/metrics")
        .ok()
        .and_then(|(_, b)| metric_sum(&b, "vmtrace_allocations_total"))
        .unwrap_or(0.0);
    let scraper = Scraper::start(daemon.addr);
    let report = run_workload(stress);
    let scrapes = scraper.stop();
    let after = http_get(daemon.addr, "/metrics").ok().map(|(_, b)| b);
    let counted = after
        .as_deref()
        .and_then(|b| metric_sum(b, "vmtrace_allocations_total"))
        .map(|a| a - before);
    let lost = after
        .as_deref()
        .and_then(|b| metric_sum(b, "vmtrace_events_lost_total"));
    let exit = daemon.stop()?;
    let (report, _) = report?;
    Ok((
        report,
        Some(json!({
            "allocations_counted": counted,
            "events_lost": lost,
            "scrape": scrapes,
            "exit": exit,
        })),
    ))
}

/// Runs the workload while `vmtrace top -b` (default probes, its model panel replaying live)
/// watches it, and gives top's own CPU time over the workload's run as a share of one CPU:
/// issue 22 holds `top` to 5 %. The workload starts once top has drawn its first frame, by
/// then attached and seeded from its start snapshot.
fn under_top(
    vmtrace: &Path,
    stress: &mut Command,
    log: &Path,
) -> Result<(StressReport, Option<Value>)> {
    let mut top = Command::new(vmtrace);
    top.args(["top", "-b", "-n", "1000000", "-d", "5s"]);
    println!("$ {} &", cmd::display(&top));
    let out = fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let err = out.try_clone()?;
    let mut child = Background(
        top.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .context("cannot start vmtrace top")?,
    );
    let pid = child.0.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    while fs::read_to_string(log).map_or(true, |t| !t.contains("vmtrace top")) {
        if let Ok(Some(status)) = child.0.try_wait() {
            bail!(
                "vmtrace top exited ({status}) before its first frame: {}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        if Instant::now() >= deadline {
            bail!("vmtrace top drew no frame within 60 s");
        }
        thread::sleep(Duration::from_millis(100));
    }
    let cpu = || cpu_ticks(pid).context("cannot read vmtrace top's CPU time");
    let (before, started) = (cpu()?, Instant::now());
    let report = run_workload(stress);
    let (after, wall) = (cpu()?, started.elapsed().as_secs_f64());
    // SAFETY: kill(2) on our own live child; `Background` reaps it.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGINT);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Ok(Some(status)) = child.0.try_wait() {
            break status.to_string();
        }
        if Instant::now() >= deadline {
            break "still running 30 s after SIGINT: killed".into();
        }
        thread::sleep(Duration::from_millis(50));
    };
    let (report, _) = report?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let cpu_s = (after - before) as f64 / hz;
    let share = cpu_s / wall;
    println!(
        "vmtrace top used {:.1} % of one CPU ({cpu_s:.2} s of CPU in {wall:.1} s)",
        share * 100.0
    );
    Ok((
        report,
        Some(json!({
            "cpu_share_of_one_cpu": share,
            "cpu_s": cpu_s,
            "wall_s": wall,
            "exit": exit,
        })),
    ))
}

/// `utime + stime` of a process, all its threads, in clock ticks (`/proc/PID/stat` fields 14
/// and 15, counted after the parenthesised command name, which may hold spaces).
fn cpu_ticks(pid: u32) -> Option<u64> {
    stat_ticks(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn stat_ticks(stat: &str) -> Option<u64> {
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `10m`, `30s`, `1h`, `90` (seconds) as seconds.
fn parse_secs(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('s') => (&t[..t.len() - 1], 1),
        Some('m') => (&t[..t.len() - 1], 60),
        Some('h') => (&t[..t.len() - 1], 3600),
        _ => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .with_context(|| format!("invalid duration `{s}`: expected e.g. 90, 30s, 10m or 1h"))?;
    if n == 0 {
        bail!("duration `{s}` is zero");
    }
    Ok(n * mult)
}

/// `VmRSS` and `RssAnon` of a process, in KiB.
fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    Some((field("VmRSS:")?, field("RssAnon:")?))
}

/// One RSS sample of the soak.
#[derive(Debug, Serialize)]
struct SoakSample {
    elapsed_s: u64,
    rss_kib: u64,
    rss_anon_kib: u64,
    allocations: Option<f64>,
    events_lost: Option<f64>,
    trace_files: usize,
}

/// `cargo xtask bench --soak`: the daemon under stress for a long time, its memory watched.
fn soak(
    args: &BenchArgs,
    total: &str,
    vmtrace: &Path,
    dir: &Path,
) -> Result<std::process::ExitCode> {
    let total_s = parse_secs(total)?;
    let every_s = parse_secs(&args.soak_every)?;
    let traces = dir.join("soak-traces");
    let _ = fs::remove_dir_all(&traces);
    banner(&format!(
        "soak: vmtrace serve --record for {total_s} s under stress, 1 scrape/s"
    ));
    let daemon = Daemon::start(vmtrace, Some((&traces, 4)), dir.join("soak-serve.log"))?;
    let pid = daemon.pid();
    let mut stress = Command::new(vmtrace);
    stress
        .args(["stress", "fix-size", "--pages", &args.pages.to_string()])
        .args(["--threads", &args.threads.to_string()])
        .args(["--duration", &format!("{total_s}s"), "--json"]);
    println!("$ {} &", cmd::display(&stress));
    let stress = stress
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start vmtrace stress")?;
    let mut stress = Background(stress);
    let scraper = Scraper::start(daemon.addr);
    let started = Instant::now();

    let sample = |elapsed_s: u64| -> Result<SoakSample> {
        let (rss, anon) = rss_kib(pid).context("vmtrace serve is gone")?;
        let metrics = http_get(daemon.addr, "/metrics").ok().map(|(_, b)| b);
        let files = fs::read_dir(&traces).map(|d| d.count()).unwrap_or(0);
        let s = SoakSample {
            elapsed_s,
            rss_kib: rss,
            rss_anon_kib: anon,
            allocations: metrics
                .as_deref()
                .and_then(|b| metric_sum(b, "vmtrace_allocations_total")),
            events_lost: metrics
                .as_deref()
                .and_then(|b| metric_sum(b, "vmtrace_events_lost_total")),
            trace_files: files,
        };
        println!(
            "  t={:>5} s  VmRSS {:>7} KiB  RssAnon {:>7} KiB  allocations {:>11.0}  lost {:>3.0}  files {}",
            s.elapsed_s,
            s.rss_kib,
            s.rss_anon_kib,
            s.allocations.unwrap_or(f64::NAN),
            s.events_lost.unwrap_or(f64::NAN),
            s.trace_files
        );
        Ok(s)
    };
    let mut samples = vec![sample(0)?];
    let mut next = every_s.min(total_s);
    loop {
        let elapsed = started.elapsed().as_secs();
        let stress_done = matches!(stress.0.try_wait(), Ok(Some(_)));
        if elapsed >= total_s || stress_done {
            break;
        }
        if elapsed >= next {
            samples.push(sample(elapsed)?);
            next += every_s;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let end = started.elapsed().as_secs();
    samples.push(sample(end)?);
    let scrapes = scraper.stop();
    let mut out = String::new();
    if let Some(mut o) = stress.0.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    let ops = parse_report(&out).map(|r| r.total_ops);
    let exit = daemon.stop()?;

    let first = &samples[0];
    let last = &samples[samples.len() - 1];
    // The first minute fills the ring buffer's pages and the allocator's pools; growth after
    // it is what would matter over days.
    let warm = samples.iter().find(|s| s.elapsed_s >= 60).unwrap_or(first);
    println!(
        "  VmRSS start {} KiB, end {} KiB ({:+} KiB); from t={} s to the end {:+} KiB; RssAnon {} -> {} KiB",
        first.rss_kib,
        last.rss_kib,
        last.rss_kib as i64 - first.rss_kib as i64,
        warm.elapsed_s,
        last.rss_kib as i64 - warm.rss_kib as i64,
        first.rss_anon_kib,
        last.rss_anon_kib
    );
    println!(
        "  {} scrapes ({} failed, slowest {:.1} ms); stress ops {}; serve {exit}",
        scrapes.scrapes,
        scrapes.failures,
        scrapes.max_ms,
        ops.map_or("?".into(), |n| n.to_string())
    );
    let report = json!({
        "benchmark": "vmtrace serve --record soak under vmtrace stress fix-size, scraped every second",
        "duration_s": end,
        "workload": { "pattern": "fix-size", "pages": args.pages, "threads": args.threads },
        "serve": { "rotate": "64M", "keep": 4 },
        "kernel": fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).ok(),
        "unix_time": SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).ok(),
        "samples": samples,
        "scrape": scrapes,
        "stress_ops": ops,
        "serve_exit": exit,
    });
    let path = dir.join("soak.json");
    let text = serde_json::to_string_pretty(&report).context("cannot serialise the soak")?;
    fs::write(&path, text + "\n").with_context(|| format!("cannot write {}", path.display()))?;
    println!("results written to {}", path.display());
    if !args.keep {
        let _ = fs::remove_dir_all(&traces);
    }
    Ok(std::process::ExitCode::SUCCESS)
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
    fn cpu_ticks_skip_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 3 0";
        assert_eq!(stat_ticks(stat), Some(22));
        assert_eq!(stat_ticks("4242 (x) S 1"), None);
        assert!(cpu_ticks(std::process::id()).is_some());
    }

    #[test]
    fn only_selects_in_measuring_order_with_the_baseline() {
        let keys = |only: &[&str]| {
            let only: Vec<String> = only.iter().map(|s| s.to_string()).collect();
            select(&only).map(|v| v.iter().map(|c| c.key).collect::<Vec<_>>())
        };
        assert_eq!(keys(&[]).unwrap().len(), CONDITIONS.len());
        assert_eq!(
            keys(&["serve", "record"]).unwrap(),
            ["untraced", "record", "serve"]
        );
        assert_eq!(keys(&["untraced"]).unwrap(), ["untraced"]);
        let err = keys(&["serve", "servce"]).unwrap_err().to_string();
        assert!(
            err.contains("`servce`") && err.contains("serve-record"),
            "{err}"
        );
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_secs("90").unwrap(), 90);
        assert_eq!(parse_secs("30s").unwrap(), 30);
        assert_eq!(parse_secs("10m").unwrap(), 600);
        assert_eq!(parse_secs("1h").unwrap(), 3600);
        assert!(parse_secs("0").is_err());
        assert!(parse_secs("10x").is_err());
        assert!(parse_secs("m").is_err());
    }

    #[test]
    fn metric_families_are_summed_over_labels() {
        let text = "# HELP vmtrace_events_lost_total x\n\
            # TYPE vmtrace_events_lost_total counter\n\
            vmtrace_events_lost_total{cpu=\"0\"} 2\n\
            vmtrace_events_lost_total{cpu=\"1\"} 3\n\
            vmtrace_allocations_total 17\n\
            vmtrace_allocations_total_other 5\n";
        assert_eq!(metric_sum(text, "vmtrace_events_lost_total"), Some(5.0));
        assert_eq!(metric_sum(text, "vmtrace_allocations_total"), Some(17.0));
        assert_eq!(metric_sum(text, "vmtrace_frees_total"), None);
    }

    fn row(key: &'static str, ratio: f64) -> Outcome {
        Outcome {
            ratio_to_untraced: Some(ratio),
            ..Outcome::empty(key, key, String::new())
        }
    }

    #[test]
    fn comparisons_need_both_sides_and_judge_only_goals() {
        let rows = [
            row("untraced", 1.0),
            row("foundation", 0.8),
            row("ladder", 0.6),
            row("bpftrace", 0.85),
            row("record", 0.7),
        ];
        let c = comparisons(&rows);
        let names: Vec<&str> = c.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "foundation vs bpftrace",
                "record vs bpftrace",
                "ladder beyond foundation"
            ]
        );
        assert_eq!(c[0].goal_met, Some(false));
        assert!((c[2].quotient - 0.75).abs() < 1e-12);
        assert_eq!(c[2].goal_met, None);
    }

    #[test]
    fn paired_ratios_cancel_a_drifting_load() {
        // The machine gets slower round by round; the traced run is always 10 % slower than
        // the untraced run of its own round.
        let base = [Some(100.0), Some(80.0), Some(60.0)];
        let row = [Some(90.0), Some(72.0), Some(54.0)];
        let r = paired_ratio(&row, &base).unwrap();
        assert!((r - 0.9).abs() < 1e-12, "{r}");
        // A failed round on either side is left out.
        assert_eq!(
            paired_ratio(&[None, Some(40.0)], &[Some(1.0), Some(50.0)]),
            Some(0.8)
        );
        assert_eq!(paired_ratio(&[None], &[Some(1.0)]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![]), None);
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
