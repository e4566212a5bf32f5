//! `vmtrace whatif` as a user runs it: the JSON rows carry the documented fields, a row equals
//! what `vmtrace synth` then `vmtrace replay --free-running` predict for the same options,
//! `--report` writes its charts, `--trace` sweeps a recording over CPU counts, and bad
//! options get a clear error.

mod common;

use std::process::{Command, Output};

use serde_json::Value;

fn vmtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(args)
        .output()
        .unwrap()
}

fn json_of(args: &[&str]) -> Value {
    let out = vmtrace(args);
    assert!(
        out.status.success(),
        "vmtrace {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The workload of the small sweep, as options shared by `whatif` and `synth`.
const WORKLOAD: [&str; 10] = [
    "--mask",
    "0x7f",
    "--loops",
    "40",
    "--junk",
    "48",
    "--busy-list",
    "30",
    "--seed",
    "4",
];

#[test]
fn rows_have_the_documented_fields_and_match_synth_then_replay() {
    let mut args = vec![
        "whatif",
        "--threads",
        "2,6",
        "--cpus",
        "4",
        "--variant",
        "nodes",
        "--variant",
        "global",
        "--costs",
        "none",
        "--json",
    ];
    args.extend(WORKLOAD);
    let rows = json_of(&args);
    let rows = rows.as_array().expect("an array of rows");
    assert_eq!(rows.len(), 4, "2 thread counts x 2 variants");
    for r in rows {
        for field in [
            "threads",
            "cpus",
            "variant",
            "page_table_pages",
            "high_water_bytes",
            "purges",
            "pool_hit_share",
            "lock_wait_share",
            "throughput_ops_per_s",
        ] {
            assert!(r.get(field).is_some(), "row lacks {field}: {r}");
        }
    }
    let order: Vec<(u64, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["threads"].as_u64().unwrap(),
                r["variant"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        order,
        vec![(2, "nodes"), (2, "global"), (6, "nodes"), (6, "global")]
    );

    // The same point through a trace file.
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.jsonl.zst");
    let mut synth = vec!["synth", "--threads", "6", "--cpus", "4", "--costs", "none"];
    synth.extend(WORKLOAD);
    synth.extend(["-o", trace.to_str().unwrap()]);
    let out = vmtrace(&synth);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let replayed = common::vmtrace_json(
        &[
            "replay",
            "--free-running",
            "--variant",
            "nodes",
            "--variant",
            "global",
            "--costs",
            "none",
            "--seed",
            "4",
            "--json",
        ],
        &trace,
    );
    let what_if = replayed["what_if"].as_array().expect("what_if");
    for (row, w) in rows[2..].iter().zip(what_if) {
        assert_eq!(row["variant"], w["variant"]);
        for field in [
            "allocs",
            "page_table_pages",
            "high_water_bytes",
            "purges",
            "pool_hit_share",
            "lock_wait_share",
            "throughput_ops_per_s",
            "makespan_ns",
        ] {
            assert_eq!(row[field], w[field], "{field} of {}", row["variant"]);
        }
        assert!(row["allocs"].as_u64().unwrap() > 1000);
    }
    // More threads on the same CPUs: more allocations, and the one free-tree lock of
    // `global` waits at least as much as with fewer.
    assert!(rows[2]["allocs"].as_u64() > rows[0]["allocs"].as_u64());
    assert!(rows[3]["lock_wait_share"].as_f64() >= rows[1]["lock_wait_share"].as_f64());
}

#[test]
fn report_writes_charts_and_an_index() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r");
    let mut args = vec![
        "whatif",
        "--threads",
        "1,2",
        "--cpus",
        "2,4",
        "--variant",
        "nodes",
        "--report",
        report.to_str().unwrap(),
    ];
    args.extend(WORKLOAD);
    let out = vmtrace(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(table.lines().count(), 1 + 4, "header and 4 rows:\n{table}");
    for stem in [
        "page_tables_vs_threads",
        "lock_wait_vs_cpus",
        "throughput_vs_threads",
    ] {
        for ext in ["svg", "png"] {
            let f = report.join(format!("{stem}.{ext}"));
            assert!(
                f.metadata().map(|m| m.len() > 1000).unwrap_or(false),
                "{f:?}"
            );
        }
    }
    let index = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert!(index.contains("page_tables_vs_threads.svg"));
    assert!(index.contains("nodes"));
    // The built-in calibration's held-out check is shown beside the predictions, on the
    // terminal and in the report.
    let stderr = String::from_utf8_lossy(&out.stderr);
    for text in [&*stderr, &index] {
        assert!(
            text.contains("recordings it was not fitted on") && text.contains("lock waits"),
            "{text}"
        );
    }
}

/// Costs that were never checked get no check printed beside them.
#[test]
fn no_check_is_printed_for_unchecked_costs() {
    let mut args = vec![
        "whatif",
        "--threads",
        "1",
        "--cpus",
        "2",
        "--variant",
        "nodes",
        "--costs",
        "none",
    ];
    args.extend(WORKLOAD);
    let out = vmtrace(&args);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("not fitted on"), "{stderr}");
}

#[test]
fn a_recorded_trace_sweeps_over_cpus() {
    let rows = json_of(&[
        "whatif",
        "--trace",
        common::sample_trace_path().to_str().unwrap(),
        "--cpus",
        "2,16",
        "--variant",
        "nodes",
        "--json",
    ]);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r["threads"].is_null()));
    let nodes: Vec<u64> = rows.iter().map(|r| r["nodes"].as_u64().unwrap()).collect();
    assert_eq!(nodes, vec![2, 16]);
    let lazy: Vec<u64> = rows
        .iter()
        .map(|r| r["lazy_max_pages"].as_u64().unwrap())
        .collect();
    assert_eq!(
        lazy,
        vec![16384, 40960],
        "fls(cpus) * 32 MiB of 4 KiB pages"
    );
    assert_eq!(rows[0]["allocs"], rows[1]["allocs"]);
}

/// `vmtrace whatif` at one 4-thread, 4-CPU point of [`WORKLOAD`], variant `nodes`, as JSON.
fn one_point(extra: &[&str]) -> Value {
    let mut args = vec![
        "whatif",
        "--threads",
        "4",
        "--cpus",
        "4",
        "--variant",
        "nodes",
        "--json",
    ];
    args.extend(extra);
    args.extend(WORKLOAD);
    json_of(&args)
}

#[test]
fn several_seeds_give_means_and_their_spread() {
    let rows = one_point(&["--seeds", "3"]);
    let r = &rows.as_array().unwrap()[0];
    assert_eq!(r["seeds"], 3);
    for field in [
        "page_table_pages",
        "lock_wait_share",
        "throughput_ops_per_s",
    ] {
        let (lo, hi) = (
            r["spread"][field]["min"].as_f64().unwrap(),
            r["spread"][field]["max"].as_f64().unwrap(),
        );
        let mean = r[field].as_f64().unwrap();
        assert!(
            lo <= mean + 0.5 && mean <= hi + 0.5,
            "{field}: {mean} outside {lo}..{hi}"
        );
    }
    let single = one_point(&[]);
    assert!(single[0].get("spread").is_none(), "one seed has no spread");
    assert_eq!(single[0]["seeds"], 1);
}

#[test]
fn bad_options_are_refused_clearly() {
    let out = vmtrace(&["whatif", "--threads", "0"]);
    assert!(!out.status.success());
    let out = vmtrace(&["whatif", "--mask", "0x80", "--threads", "1", "--cpus", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("enables no test"), "{err}");
    let out = vmtrace(&["whatif", "--trace", "/nonexistent/t.jsonl"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/t.jsonl"));
}
