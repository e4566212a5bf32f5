//! `vmtrace compare` on real recordings of this kernel: the same workload recorded twice
//! flags no more than the stated false-positive rate allows, and one against two threads of
//! the same workload flags the differences two threads make on a two-CPU machine (more
//! allocations per second, more purges, smaller mean purges, a drain that waits behind two busy
//! CPUs) and shows more waits on the busy lock.
//!
//! Without BPF privileges the test skips loudly, unless `VMTRACE_REQUIRE_PRIVILEGED=1`, where
//! it fails.

mod common;

use common::privileged;
use serde_json::Value;
use std::path::Path;

const STRESS_1: &str = "fix-size --pages 16 --threads 1 --duration 4s";
const STRESS_2: &str = "fix-size --pages 16 --threads 2 --duration 4s";

fn compare(a: &Path, b: &Path) -> Value {
    let doc = common::vmtrace_json(&["compare", "--json", a.to_str().unwrap()], b);
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .arg("compare")
        .arg(a)
        .arg(b)
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&text.stdout));
    doc
}

/// (metric of its group, B/A) of every flagged row.
fn flagged(doc: &Value) -> Vec<(String, f64)> {
    doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .chain(doc["size_rows"].as_array().unwrap())
        .filter(|r| r["flagged"] == true)
        .map(|r| {
            (
                format!(
                    "{}: {}",
                    r["group"].as_str().unwrap(),
                    r["metric"].as_str().unwrap()
                ),
                r["ratio"].as_f64().unwrap_or(f64::INFINITY),
            )
        })
        .collect()
}

#[test]
fn same_workload_is_quiet_and_another_thread_count_is_flagged() {
    if !privileged() {
        return;
    }
    let dir =
        std::env::temp_dir().join(format!("vmtrace-privileged-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (one, again, two) = (
        dir.join("one.jsonl.zst"),
        dir.join("again.jsonl.zst"),
        dir.join("two.jsonl.zst"),
    );
    common::record_stress_with(&one, &["--drain-pools"], STRESS_1);
    common::record_stress_with(&again, &["--drain-pools"], STRESS_1);
    common::record_stress_with(&two, &["--drain-pools"], STRESS_2);

    // Same workload: docs/compare.md measured 24 flagged of 394 tested rows (6 %) over
    // sixteen pairs of four workloads, most of them wait-time rows. Rows of one group are not
    // independent: a lock's wait count, time waiting and p99 move together, and so do a
    // purge's drain latency and drain item run time (both follow where the kworker ran). So
    // the groups are counted: at most one tested group in three, and at least 2. Ten pairs of
    // this workload flagged one group at most.
    let same = compare(&one, &again);
    let tested = same["tested"].as_u64().unwrap();
    let f = flagged(&same);
    assert!(tested >= 15, "only {tested} rows tested");
    let groups = |only_flagged: bool| -> std::collections::BTreeSet<String> {
        same["rows"]
            .as_array()
            .unwrap()
            .iter()
            .chain(same["size_rows"].as_array().unwrap())
            .filter(|r| r["tested"] == true && (!only_flagged || r["flagged"] == true))
            .map(|r| r["group"].as_str().unwrap().to_string())
            .collect()
    };
    let (tested_groups, flagged_groups) = (groups(false), groups(true));
    let allowed = tested_groups.len().div_ceil(3).max(2);
    eprintln!(
        "same workload: {} of {tested} rows flagged, in {} of {} groups: {f:?}",
        f.len(),
        flagged_groups.len(),
        tested_groups.len()
    );
    assert!(
        flagged_groups.len() <= allowed,
        "{} of {} groups flagged (allowed {allowed}): {f:?}",
        flagged_groups.len(),
        tested_groups.len()
    );
    assert!(same["header_differences"].as_array().unwrap().is_empty());

    // One thread against two: the differences all ten pairs of docs/compare.md flagged
    // (allocations 1.28-1.57x, purges 1.64-2.06x, mean npurged 0.76-0.87x, drain latency p90
    // 6.7-78x).
    let diff = compare(&one, &two);
    let f = flagged(&diff);
    eprintln!("one against two threads: {f:?}");
    let ratio = |m: &str| f.iter().find(|(x, _)| x == m).map(|&(_, r)| r);
    for (metric, up) in [
        ("events: allocations", true),
        ("events: purges", true),
        ("purges: npurged mean", false),
        ("purges: drain latency p90", true),
    ] {
        let r = ratio(metric).unwrap_or_else(|| panic!("{metric} not flagged: {f:?}"));
        assert_eq!(r > 1.0, up, "{metric}: B/A {r}");
    }
    // Busy-lock waits rose 1.8-4.5x in the ten pairs of docs/compare.md, but in later runs
    // also 0.72x and 1.07x: the stress frees its vmalloc'd BPF maps in kworkers
    // (`bpf_map_free_deferred`), so on two CPUs one thread's frees already meet its own
    // allocations on the other CPU, and a second thread adds waits the scheduler can hide.
    // So only a floor is asserted: a second thread does not take busy-lock waits away
    // (lowest seen 0.72x); a side that lost its waits (a broken classification) fails it.
    let busy = diff["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["group"] == "lock waits: node_busy_lock" && r["metric"] == "waits")
        .and_then(|r| r["ratio"].as_f64())
        .expect("busy-lock waits on both sides");
    eprintln!("busy-lock waits B/A {busy:.2}");
    assert!(busy > 0.5, "busy-lock waits B/A {busy}");
    let cmd = diff["header_differences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["field"] == "command")
        .expect("the command lines differ");
    assert!(cmd["b"].as_str().unwrap().contains("--threads 2"), "{cmd}");
    let _ = std::fs::remove_dir_all(&dir);
}
