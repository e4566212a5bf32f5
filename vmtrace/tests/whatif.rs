//! What-if sanity, asserted as inequalities: on a synthetic test_vmalloc trace with far more
//! threads than CPUs (64 CPUs, 256 threads, mask 7), the pre-node `global` design predicts a
//! much larger lock-wait share and a lower throughput than `nodes`, and capping the pools
//! (`nodes-capped`) never needs more page-table slots than `nodes`. The sizes are scaled down
//! (--loops 50, --junk 16, --busy-list 20, lazy_max 512 pages) so that it runs in seconds and
//! still purges several times; `cargo test --test whatif -- --nocapture` prints the figures.
//!
//! The lock waits come from the discrete-event simulation (`replay/des.rs`): the synthetic
//! streams have no think time, so the CPUs run back to back and a saturated lock bounds the
//! throughput. That bound is checked too: `global` takes the one free-tree lock for every
//! allocation, so it cannot complete more allocations per second than 1 / `free_area_lock_ns`,
//! and its free-tree lock is busy nearly all of the simulated time.

use vmtrace::model::Variant;
use vmtrace::replay::{free_run, FreeRunOptions, ReplayOptions, WhatIf};
use vmtrace::sim::timing::Costs;
use vmtrace::synth::{generate, SynthParams};
use vmtrace::trace::LockClass;

fn trace() -> Vec<u8> {
    let p = SynthParams {
        mask: 7,
        threads: 256,
        cpus: 64,
        loops: 50,
        junk: Some(16),
        busy_list: 20,
        seed: 1,
        ..SynthParams::default()
    };
    let mut out = Vec::new();
    generate(&p, vec!["vmtrace".into(), "synth".into()], &mut out).expect("generation");
    out
}

fn what_if(bytes: &[u8], variant: Variant) -> WhatIf {
    let opts = ReplayOptions {
        variant,
        lazy_max_pages: Some(512),
        ..ReplayOptions::default()
    };
    let w = free_run(bytes, &opts, &FreeRunOptions::default()).expect("free-running replay");
    eprintln!(
        "{:<13} lock-wait share {:5.1} %  throughput {:7.3} Mops/s  makespan {:6.3} ms  footprint {:7.1} MiB  PT slots {}/{}/{}  purges {}",
        variant.name(),
        100.0 * w.lock_wait_share,
        w.throughput_ops_per_s / 1e6,
        w.makespan_ns as f64 / 1e6,
        w.high_water_bytes as f64 / 1048576.0,
        w.slots.pte_tables,
        w.slots.pmd_tables,
        w.slots.pud_tables,
        w.purges
    );
    for c in &w.lock_waits {
        eprintln!(
            "    {:<16} {:>3} inst {:>7} sections {:>7} waited {:>9.3} ms wait  peak {:.2}",
            c.class.name(),
            c.instances,
            c.sections,
            c.waits,
            c.wait_ns as f64 / 1e6,
            c.max_utilisation
        );
    }
    w
}

fn class(w: &WhatIf, class: LockClass) -> vmtrace::sim::timing::ClassWait {
    w.lock_waits
        .iter()
        .find(|c| c.class == class)
        .cloned()
        .unwrap_or_else(|| panic!("{:?} has no {class:?}", w.variant))
}

#[test]
fn global_waits_more_and_capped_pools_need_no_more_page_tables() {
    let bytes = trace();
    let nodes = what_if(&bytes, Variant::Nodes);
    let capped = what_if(&bytes, Variant::NodesCapped);
    let global = what_if(&bytes, Variant::Global);
    for w in [&nodes, &capped, &global] {
        assert_eq!(w.alloc_failures, 0);
        assert_eq!(w.frees_unknown, 0);
        assert_eq!(w.cpus, 64);
        assert!(w.purges >= 2, "{:?} purged {} times", w.variant, w.purges);
        assert_eq!((w.late_starts, w.unfinished_ops), (0, 0), "{:?}", w.variant);
        // The series accounts for every operation and every wait.
        assert!(!w.wait_series.is_empty() && w.wait_series.len() <= 500);
        let ops: u64 = w.wait_series.iter().map(|s| s.ops).sum();
        assert_eq!(ops, w.allocs + w.frees);
        let waited: u64 = w.wait_series.iter().map(|s| s.wait_ns).sum();
        assert_eq!(waited, w.wait_ns);
        // The histograms count every section that waited.
        for c in &w.lock_waits {
            let n: u64 = c.wait_histogram.iter().map(|b| b.count).sum();
            assert_eq!(n, c.waits, "{:?} {:?}", w.variant, c.class);
        }
    }
    assert!(
        global.lock_wait_share > 1.5 * nodes.lock_wait_share
            && global.lock_wait_share - nodes.lock_wait_share > 0.2,
        "global {} vs nodes {}",
        global.lock_wait_share,
        nodes.lock_wait_share
    );
    assert!(
        global.throughput_ops_per_s < 0.75 * nodes.throughput_ops_per_s,
        "global {} vs nodes {}",
        global.throughput_ops_per_s,
        nodes.throughput_ops_per_s
    );
    // `global` is bound by its free-tree lock: at most one allocation per section cost, and
    // the lock busy nearly all of the simulated time.
    let fa = class(&global, LockClass::FreeAreaLock);
    let ops_per_alloc = (global.allocs + global.frees) as f64 / global.allocs as f64;
    let bound = ops_per_alloc * 1e9 / Costs::default().free_area_lock_ns as f64;
    assert!(
        global.throughput_ops_per_s <= bound,
        "{} > {bound}",
        global.throughput_ops_per_s
    );
    assert!(
        fa.held_ns as f64 > 0.9 * global.makespan_ns as f64,
        "free-tree lock held {} of {} ns",
        fa.held_ns,
        global.makespan_ns
    );
    assert!(capped.page_table_pages <= nodes.page_table_pages);
    assert!(capped.slots.pte_tables <= nodes.slots.pte_tables);
    // The per-node busy locks are what spreads the load: one instance in `global`.
    let busy = |w: &WhatIf| {
        let c = class(w, LockClass::NodeBusyLock);
        (c.instances, c.wait_ns)
    };
    assert_eq!(busy(&nodes).0, 64);
    assert_eq!(busy(&global).0, 1);
    assert!(busy(&global).1 > 100 * busy(&nodes).1.max(1));
}

/// A small synthetic trace with `contention` and `latency` events appended before its footer,
/// as a recording with the `lock_waits` and `alloc_latency` probes would carry them.
fn observed_trace() -> Vec<u8> {
    let p = SynthParams {
        mask: 1,
        threads: 16,
        cpus: 4,
        loops: 100,
        seed: 2,
        ..SynthParams::default()
    };
    let mut out = Vec::new();
    generate(&p, vec!["vmtrace".into(), "synth".into()], &mut out).expect("generation");
    let text = String::from_utf8(out).expect("utf8");
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let footer = lines.pop().expect("footer");
    let ctx = r#""ts_ns":2000000000,"cpu":1,"tgid":7,"pid":7,"comm":"vmalloc_test/0""#;
    for (class, wait) in [
        ("free_area_lock", 900),
        ("free_area_lock", 1500),
        ("node_busy_lock", 70),
    ] {
        lines.push(format!(
            r#"{{"type":"contention",{ctx},"lock":"0xffffffff82a0b000","flags":1,"wait_ns":{wait},"ret":0,"class":"{class}","node":null,"stack_id":-1,"stack":[]}}"#
        ));
    }
    lines.push(format!(
        r#"{{"type":"latency",{ctx},"function":"alloc_vmap_area","start_ns":1999999000,"latency_ns":2500}}"#
    ));
    lines.push(footer);
    (lines.join("\n") + "\n").into_bytes()
}

/// Observed contention per lock class stands beside the prediction in the what-if report.
#[test]
fn observed_contention_is_reported_beside_the_prediction() {
    let bytes = observed_trace();
    let w = free_run(
        &bytes[..],
        &ReplayOptions::default(),
        &FreeRunOptions::default(),
    )
    .expect("free-running replay");
    let obs = &w.observed.contention;
    assert_eq!(obs.len(), 2, "{obs:?}");
    assert_eq!(obs[0].class, LockClass::FreeAreaLock);
    assert_eq!((obs[0].count, obs[0].wait_ns), (2, 2400));
    // 900 ns and 1500 ns fall in the 1024 and 2048 ns buckets.
    let buckets: Vec<(u64, u64)> = obs[0]
        .wait_histogram
        .iter()
        .map(|b| (b.le_ns, b.count))
        .collect();
    assert_eq!(buckets, vec![(1024, 1), (2048, 1)]);
    assert_eq!(obs[1].class, LockClass::NodeBusyLock);
    assert_eq!((w.observed.latency_count, w.observed.latency_ns), (1, 2500));
    let text = vmtrace::replay::render_comparison(std::slice::from_ref(&w));
    assert!(
        text.contains("observed contention (trace) beside predicted waits"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("free_area_lock") && l.contains("2 / 0.002"))
        .unwrap_or_else(|| panic!("no observed free_area_lock line:\n{text}"));
    let predicted = class(&w, LockClass::FreeAreaLock);
    assert!(
        line.contains(&format!("{} / ", predicted.waits)),
        "{line} lacks the predicted {predicted:?}"
    );
    assert!(text.contains("alloc_vmap_area latency, mean: observed 2500 ns (1 events)"));
}

/// `--cost` reaches the simulation, a bad one is refused with the names, and `--fit-costs`
/// prints what it fitted (text) or adds `cost_fit` (JSON).
#[test]
fn cli_costs_and_fitting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.jsonl");
    std::fs::write(&path, observed_trace()).expect("write");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_vmtrace"))
            .arg("replay")
            .arg(&path)
            .args(args)
            .output()
            .expect("run vmtrace")
    };
    let json = |out: &std::process::Output| -> serde_json::Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let base = json(&run(&["--free-running", "--json", "--costs", "none"]));
    let slow = json(&run(&[
        "--free-running",
        "--json",
        "--costs",
        "none",
        "--cost",
        "free_area_lock_ns=2000",
    ]));
    let fa = |v: &serde_json::Value| v["what_if"][0]["costs"]["free_area_lock_ns"].as_u64();
    assert_eq!(fa(&base), Some(250));
    assert_eq!(fa(&slow), Some(2000));
    // Without --costs, the calibration shipped with the project.
    let builtin: serde_json::Value =
        serde_json::from_str(include_str!("../assets/calibration.json"))
            .expect("the bundled calibration");
    let default = json(&run(&["--free-running", "--json"]));
    assert_eq!(default["what_if"][0]["costs"], builtin["costs"]);
    assert_eq!(default["what_if"][0]["drain_latency_source"], "measured");
    // A calibration file that is not one says where.
    let broken = dir.path().join("broken.json");
    std::fs::write(
        &broken,
        "{\n  \"format\": \"vmtrace-calibration\",\n  \"version\": x\n}\n",
    )
    .expect("write");
    let out = run(&["--free-running", "--costs", broken.to_str().expect("utf-8")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 3"), "{err}");
    let wait = |v: &serde_json::Value| v["what_if"][0]["wait_ns"].as_u64().expect("wait_ns");
    assert!(
        wait(&slow) > wait(&base),
        "{} vs {}",
        wait(&slow),
        wait(&base)
    );

    let bad = run(&["--free-running", "--cost", "free_area_ns=3"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("unknown cost `free_area_ns`") && err.contains("free_area_lock_ns"),
        "{err}"
    );

    let fitted = json(&run(&["--fit-costs", "--json"]));
    let fit = &fitted["cost_fit"];
    assert!(
        fit["rounds"].as_array().is_some_and(|r| !r.is_empty()),
        "{fit}"
    );
    assert_eq!(fit["rounds"][0]["classes"][0]["class"], "free_area_lock");
    assert_eq!(fit["rounds"][0]["classes"][0]["observed_wait_ns"], 2400);
    // The comparison ran with the fitted costs.
    assert_eq!(fitted["what_if"][0]["costs"], fit["fitted"]);
    let text = run(&["--fit-costs"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("cost fit (variant nodes"), "{text}");
    assert!(
        text.contains("not fitted (no contention observed): node_lazy_lock"),
        "{text}"
    );
}

/// Free-running `nodes` on the trace's own parameters puts every prediction beside the trace's
/// figure; a what-if override (here `--lazy-max`) predicts another kernel, so it carries none.
#[test]
fn free_running_nodes_is_validated_against_the_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.jsonl");
    std::fs::write(&path, observed_trace()).expect("write");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vmtrace"))
            .arg("replay")
            .arg(&path)
            .args(args)
            .output()
            .expect("run vmtrace");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let out = run(&[
        "--free-running",
        "--json",
        "--variant",
        "nodes",
        "--variant",
        "global",
    ]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let nodes = &doc["what_if"][0];
    assert_eq!(nodes["variant"], "nodes");
    let metrics: Vec<&str> = nodes["validation"]
        .as_array()
        .expect("validation")
        .iter()
        .map(|e| e["metric"].as_str().expect("metric"))
        .collect();
    for m in [
        "purges",
        "npurged_mean",
        "pool_hit_share",
        "high_water_bytes",
        "pte_tables",
        "nr_lazy_mean",
        "waits:free_area_lock",
        "wait_ns:free_area_lock",
    ] {
        assert!(metrics.contains(&m), "{m} missing from {metrics:?}");
    }
    let purges = nodes["validation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["metric"] == "purges")
        .unwrap();
    assert_eq!(
        purges["observed"].as_f64(),
        nodes["trace"]["purges"].as_f64()
    );
    assert_eq!(purges["predicted"].as_f64(), nodes["purges"].as_f64());
    // Page tables are judged on what the trace added: the snapshot's are the same on both
    // sides and would make any model agree.
    let pte = nodes["validation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["metric"] == "pte_tables")
        .unwrap();
    let (all, seeded) = (
        nodes["slots"]["pte_tables"].as_f64().unwrap(),
        nodes["seeded_slots"]["pte_tables"].as_f64().unwrap(),
    );
    assert_eq!(pte["predicted"].as_f64(), Some(all - seeded));
    assert!(
        doc["what_if"][1].get("validation").is_none(),
        "global is another design: nothing to validate"
    );
    let text = String::from_utf8_lossy(&run(&["--free-running"]).stdout).to_string();
    assert!(text.contains("Validation: free-running nodes"), "{text}");
    let other = run(&["--free-running", "--json", "--lazy-max", "64"]);
    let doc: serde_json::Value = serde_json::from_slice(&other.stdout).expect("json");
    assert!(doc["what_if"][0].get("validation").is_none());
}
