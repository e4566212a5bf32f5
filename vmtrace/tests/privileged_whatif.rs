//! Privileged out-of-sample check of the what-if half: record two different workloads on this
//! kernel, calibrate the simulation on one (`vmtrace calibrate`), and validate free-running
//! replay of `nodes` on the other, which the calibration never saw.
//!
//! The floors sit outside the spread measured on held-out recordings of the 2-CPU 6.18
//! reference machine (`docs/model.md`, "Validation against recordings"): they catch a
//! regression of the free-running model or of the calibration, not the known misses (lock
//! waits) that the same table lists. A pair recorded while the machine stalled is reported
//! and recorded once more; the test fails when the retake stalled too. A perturbed calibration must score worse,
//! so the figures are shown to depend on the measured input. Without BPF privileges the test
//! skips loudly, unless `VMTRACE_REQUIRE_PRIVILEGED=1`, where it fails.

mod common;

use common::privileged;
use std::path::{Path, PathBuf};
use std::process::Command;

const VMTRACE: &str = env!("CARGO_BIN_EXE_vmtrace");

/// The `nodes` variant's validation entries: metric → (observed, predicted, ratio, within).
fn validation(trace: &Path, costs: &Path) -> Vec<(String, f64, f64, Option<f64>, bool)> {
    let costs = costs.to_str().expect("a UTF-8 calibration path");
    let doc = common::vmtrace_json(
        &["replay", "--free-running", "--json", "--costs", costs],
        trace,
    );
    let w = doc["what_if"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["variant"] == "nodes")
        .expect("a nodes what-if");
    // `measured, queued` where the calibration found drains waiting behind deferred frees.
    let source = w["drain_latency_source"].as_str();
    assert!(
        matches!(source, Some("measured" | "measured, queued")),
        "drain latency {source:?}"
    );
    let v: Vec<_> = w["validation"]
        .as_array()
        .expect("validation entries")
        .iter()
        .map(|e| {
            (
                e["metric"].as_str().unwrap().to_string(),
                e["observed"].as_f64().unwrap(),
                e["predicted"].as_f64().unwrap(),
                e["ratio"].as_f64(),
                e["within"].as_bool().unwrap(),
            )
        })
        .collect();
    // Replay's pool-hit attribution (the observed side) is an inference; the trace alone
    // bounds it from above (a node's pool only holds areas that node allocated). Recorded with
    // --drain-pools, so the bound exists. On 2- and 16-CPU recordings it held with 0.007-0.11
    // to spare; half a point is allowed for tasks that migrated between the kernel's choice of
    // node and the tracepoint (0.017 % of events at 16 threads).
    let max = w["trace"]["pool_hit_share_max"]
        .as_f64()
        .expect("a drained recording has the trace-only pool-hit bound");
    let attributed = v.iter().find(|e| e.0 == "pool_hit_share").unwrap().1;
    assert!(
        attributed <= max + 0.005,
        "replay attributes {attributed} of the allocations to pools, more than the trace allows ({max})"
    );
    v
}

fn ratio(v: &[(String, f64, f64, Option<f64>, bool)], metric: &str) -> f64 {
    let e = v
        .iter()
        .find(|e| e.0 == metric)
        .unwrap_or_else(|| panic!("no {metric} in {v:?}"));
    e.3.unwrap_or_else(|| panic!("{metric}: nothing observed"))
}

/// Machine stalls (silences of a millisecond or more) that `vmtrace calibrate` may take out of
/// one recording's drain and purge intervals before the recording counts as disturbed. On the
/// ten-second corpus it took out 0 ms from six recordings of seven and 6.6 ms from the
/// seventh; a run that failed the page-table bound (1.33) had 86 ms taken out of its fit.
const STALLS_CUT_MAX_NS: u64 = 20_000_000;

/// Runs `vmtrace calibrate TRACE -o OUT`, printing what the fit measured (drain latency, purge
/// span, stalls taken out) so that a miss can be read against its inputs.
fn calibrate(trace: &Path, out: &Path) -> serde_json::Value {
    let run = Command::new(VMTRACE)
        .arg("calibrate")
        .arg(trace)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "vmtrace calibrate failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&run.stdout));
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

/// Records the fit (fix-size) and the held-out (random-size) workloads back to back and
/// calibrates on the fit: the held-out trace, the calibration's path and its JSON. A pair in
/// which either recording lost more than [`STALLS_CUT_MAX_NS`] to machine stalls is an error
/// naming them, so that the caller retakes it once: the figures below judge the model, and a
/// disturbed machine moves them by more than their floors allow.
fn undisturbed_pair(
    dir: &Path,
    tag: &str,
) -> Result<(PathBuf, PathBuf, serde_json::Value), String> {
    let fit = dir.join(format!("fix-size{tag}.jsonl"));
    let held_out = dir.join(format!("random-size{tag}.jsonl"));
    // Pools drained before each snapshot: free-running replay starts from it, and the two
    // recordings run back to back.
    let drain = ["--drain-pools"];
    common::record_stress_with(
        &fit,
        &drain,
        "fix-size --pages 16 --threads 2 --duration 6s",
    );
    common::record_stress_with(&held_out, &drain, "random-size --threads 2 --duration 6s");
    let text = std::fs::read_to_string(&held_out).unwrap();
    let snapshot: serde_json::Value =
        serde_json::from_str(text.lines().nth(1).expect("snapshot line")).unwrap();
    assert_eq!(
        snapshot["pools_drained"], true,
        "--drain-pools marks the snapshot"
    );
    drop(text);

    let cal = dir.join(format!("cal{tag}.json"));
    let c = calibrate(&fit, &cal);
    // The held-out recording is calibrated only to measure its stalls.
    let h = calibrate(&held_out, &dir.join(format!("held-out-cal{tag}.json")));
    let disturbed: Vec<String> = [(&fit, &c), (&held_out, &h)]
        .iter()
        .filter_map(|(t, c)| {
            let ns = c["stalls"]["ns"].as_u64().unwrap();
            (ns > STALLS_CUT_MAX_NS).then(|| {
                format!(
                    "{}: {:.1} ms of machine stalls over {} intervals (at most {} ms)",
                    t.display(),
                    ns as f64 / 1e6,
                    c["stalls"]["intervals"],
                    STALLS_CUT_MAX_NS / 1_000_000
                )
            })
        })
        .collect();
    if disturbed.is_empty() {
        Ok((held_out, cal, c))
    } else {
        Err(disturbed.join("; "))
    }
}

#[test]
fn a_calibration_from_one_workload_predicts_another() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (held_out, cal, c) = match undisturbed_pair(dir.path(), "") {
        Ok(r) => r,
        Err(why) => {
            eprintln!("{why}; recording both once more");
            undisturbed_pair(dir.path(), "-retake")
                .unwrap_or_else(|retake| panic!("{why}; the retake too: {retake}"))
        }
    };
    let measured: Vec<&str> = c["provenance"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["source"] == "measured")
        .map(|p| p["cost"].as_str().unwrap())
        .collect();
    eprintln!("measured costs: {measured:?}");
    assert!(measured.contains(&"busy_lock_ns"), "{measured:?}");
    assert!(measured.contains(&"purge_base_ns"), "{measured:?}");
    assert!(
        c["drain_latency"]["count"].as_u64().unwrap() > 50,
        "{}",
        c["drain_latency"]
    );

    let fu = &c["follow_up"]["counts"];
    assert!(
        fu["concurrent_items"].as_u64().unwrap() > 20,
        "two threads start most drains among concurrent frees: {fu}"
    );

    let v = validation(&held_out, &cal);
    for e in &v {
        eprintln!(
            "{:<28} observed {:>14.1} predicted {:>14.1} ratio {:>6} {}",
            e.0,
            e.1,
            e.2,
            e.3.map_or("-".into(), |r| format!("{r:.2}")),
            if e.4 { "ok" } else { "MISS" }
        );
    }
    // On the test split of `cargo xtask fidelity` (docs/fidelity.md), with follow-up drains,
    // purges came to 0.91–1.03 and mean npurged to 0.97–1.10; without them two-thread purges
    // were 0.61–0.80. Backlog 0.96–1.02, pool-hit share within 0–10 points.
    let purges = ratio(&v, "purges");
    assert!((0.8..=1.2).contains(&purges), "purges ratio {purges}");
    let npurged = ratio(&v, "npurged_mean");
    assert!((0.8..=1.25).contains(&npurged), "npurged ratio {npurged}");
    let lazy = ratio(&v, "nr_lazy_mean");
    assert!((lazy - 1.0).abs() <= 0.15, "nr_lazy_mean ratio {lazy}");
    let pool = v.iter().find(|e| e.0 == "pool_hit_share").unwrap();
    assert!(
        (pool.1 - pool.2).abs() <= 0.10,
        "pool-hit share {} observed, {} predicted",
        pool.1,
        pool.2
    );
    // From drained snapshots, with seeded lazy areas pooled by their purge and each purge's
    // batch held back for its measured span, held-out high-water came to 0.95–1.05 and
    // page-table slots to 0.93–1.06 on the 10 s corpus; from undrained ones, 0.38–0.98. Five
    // runs of this 6 s test gave high-water 0.60, 1.01, 0.96, 1.12, 0.48 and page-table slots
    // 0.99, 1.02, 0.97, 1.17, 0.98: one area placed higher or lower than the kernel's sets the
    // mark (in the 0.48 run the kernel's highest area ended at 397 MiB, the model's at 190 MiB,
    // with 62 against 61 slots), so the high-water floor is far wider than its target.
    let high = ratio(&v, "high_water_bytes");
    assert!((0.4..=1.3).contains(&high), "high-water ratio {high}");
    let pte = ratio(&v, "pte_tables");
    assert!((0.8..=1.3).contains(&pte), "pte_tables ratio {pte}");
    assert!(
        v.iter().any(|e| e.0.starts_with("wait_ns:")),
        "the recording's contention records reach the validation"
    );

    // The same calibration without its drain queue: drains sample one blended latency.
    let mut unqueued = c.clone();
    unqueued["drain_queue"] = serde_json::Value::Null;
    let unqueued_path = dir.path().join("no-drain-queue.json");
    std::fs::write(&unqueued_path, serde_json::to_string(&unqueued).unwrap()).unwrap();
    let u = validation(&held_out, &unqueued_path);
    eprintln!(
        "without the drain queue: high-water {:.3}, pte_tables {:.3}, purges {:.3}, nr_lazy_mean {:.3}",
        ratio(&u, "high_water_bytes"),
        ratio(&u, "pte_tables"),
        ratio(&u, "purges"),
        ratio(&u, "nr_lazy_mean")
    );

    // The same calibration without its follow-up drains: two threads' purges fall short again.
    let mut lone = c.clone();
    lone["follow_up"] = serde_json::Value::Null;
    let lone_path = dir.path().join("no-follow-up.json");
    std::fs::write(&lone_path, serde_json::to_string(&lone).unwrap()).unwrap();
    let purges_lone = ratio(&validation(&held_out, &lone_path), "purges");
    eprintln!("without follow-ups: purges {purges_lone:.3}");
    // Worse against the kernel, and by a move that is the follow-ups' own (they add purges):
    // one run gave 1.165 with them and 0.786 without, as far off on the other side less 0.049.
    assert!(
        (purges_lone - 1.0).abs() > (purges - 1.0).abs() && purges_lone < 0.9 * purges,
        "without follow-ups purges are {purges_lone} (measured: {purges})"
    );

    // The same calibration with every drain latency 100 times longer: the backlog and the
    // purges must move away from what the kernel did.
    // Where drains wait for the frees queued ahead, the others sample the queue's base instead.
    let mut slow = c.clone();
    for path in [
        "/drain_latency/quantiles_ns",
        "/drain_queue/unblocked/quantiles_ns",
    ] {
        for q in slow
            .pointer_mut(path)
            .and_then(|q| q.as_array_mut())
            .into_iter()
            .flatten()
        {
            *q = serde_json::json!(q.as_u64().unwrap() * 100);
        }
    }
    let slow_path = dir.path().join("slow.json");
    std::fs::write(&slow_path, serde_json::to_string(&slow).unwrap()).unwrap();
    let p = validation(&held_out, &slow_path);
    let (lazy_p, purges_p) = (ratio(&p, "nr_lazy_mean"), ratio(&p, "purges"));
    eprintln!("perturbed: nr_lazy_mean {lazy_p:.3}, purges {purges_p:.3}");
    assert!(
        (lazy_p - 1.0).abs() > (lazy - 1.0).abs() + 0.05,
        "100x drain latency left the backlog at {lazy_p} (measured: {lazy})"
    );
    assert!(
        (purges_p - 1.0).abs() > (purges - 1.0).abs(),
        "100x drain latency left purges at {purges_p} (measured: {purges})"
    );
}
