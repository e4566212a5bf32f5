//! Privileged fidelity test: record real `vmtrace stress` traffic on this kernel, replay it
//! through the model (`nodes`, observed timing) and check the agreement floors.
//!
//! The floors are below what was measured on the project's 2-CPU 6.18 machines (see
//! `docs/model.md`, "Measured agreement"), with margin for run-to-run variation: they catch a
//! model regression, not the remaining known divergence classes. Without BPF privileges the test
//! skips loudly, unless `VMTRACE_REQUIRE_PRIVILEGED=1`, where it fails.

mod common;

use common::privileged;
use std::process::Command;

const VMTRACE: &str = env!("CARGO_BIN_EXE_vmtrace");

#[test]
fn replay_of_real_stress_meets_the_floors() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("stress.jsonl");
    // The capture: 60 s of stress, 20 s of each pattern, 2 threads, in one trace.
    let script = format!(
        "{v} stress fix-size --threads 2 --duration 20s >/dev/null && \
         {v} stress random-size --threads 2 --duration 20s >/dev/null && \
         {v} stress thread-churn --threads 2 --duration 20s >/dev/null",
        v = VMTRACE
    );
    let status = Command::new(VMTRACE)
        .args(["record", "-q", "-o"])
        .arg(&trace)
        .args(["--", "sh", "-c", &script])
        .status()
        .unwrap();
    assert!(status.success(), "vmtrace record failed: {status}");

    let out = Command::new(VMTRACE)
        .args(["replay", "--json", "--variant", "nodes"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vmtrace replay failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &reports[0];
    let pct = |k: &str| {
        let a = &r[k];
        let (agreed, compared) = (
            a["agreed"].as_f64().unwrap(),
            a["compared"].as_f64().unwrap(),
        );
        assert!(compared > 0.0, "nothing compared for {k}");
        100.0 * agreed / compared
    };
    let placement = pct("placement");
    let warm = pct("placement_after_warmup");
    let nr_lazy = pct("nr_lazy");
    let npurged = pct("npurged");
    eprintln!(
        "measured: placement {placement:.2} %, after warm-up {warm:.2} %, nr_lazy {nr_lazy:.2} %, npurged {npurged:.2} %"
    );
    eprintln!("divergence classes: {}", r["divergence_classes"]);
    assert!(r["events"]["alloc"].as_u64().unwrap() > 10_000);
    assert!(r["warmup_line"].is_u64(), "warm-up never ended");
    // Floors from every measurement of this test so far: placement after warm-up 61.7–79.2 %,
    // nr_lazy 71.8–97.3 %, npurged 49.4–92.2 % before purges were aligned with the observed
    // npurged; 71.5 / 95.2 / 71.1 % after (30 Nov 2026). The counters vary most: frees that land
    // between a purge's detach and its event (docs/model.md) are more frequent when the stress
    // runs faster, and a clean CI-like run on an idle machine gave the lowest figures. With
    // purge swaps and whole early purges on reuse (later on 30 Nov 2026), four runs gave
    // 68.4–76.6 / 95.7–99.8 / 62.9–66.7 %, so the nr_lazy floor rose from 75 to 90 %. With
    // purges started at their drain item, pools hidden by mistake put back, no inferred shrinks
    // and the detach delay (1 Dec 2026), three runs gave 98.2–98.7 / 99.5–99.8 / 81.7–85.1 %;
    // the floors rose to 90 / 97 / 60 %, leaving room for a busier machine (a 20 s fix-size
    // trace at full speed replays at 96.5 / 99.0 / 68.4 %). With each drain item's TLB flush
    // recorded and racing frees joined by it (later on 1 Dec 2026), three runs gave
    // 99.3–99.5 / 99.96–99.97 / 94.1–95.1 %, and the 20 s recordings 99.0–99.3 / 99.9–100 /
    // 90.0–96.2 %: the floors rose to 95 / 99 / 80 %. Without the flush probe (a kernel where
    // it cannot attach) npurged is predicted from the start alone, 82–92 % here. With the backlog
    // drop seen after a reuse and the purge loop paced (1 Dec 2026, session 7), two runs gave
    // 99.50–99.57 / 99.99 / 93.5–94.0 %: the floors rose to 97 / 99.5 / 80 %. With add order
    // from the closest frees and node batches traded on a short drop (1 Dec 2026, session 8),
    // two runs gave 99.51–99.63 / 99.999 (7–8 misses) / 94.2–95.8 %: the nr_lazy floor rose to
    // 99.9 %, the level of the mixed 3 × 8 s recording (99.96 %). npurged stays at 80 %: older
    // recordings of the same patterns replay at 81.6–85.1 %, and the detach it depends on has
    // no event on the tracepoint rung (docs/model.md). With the step between two nodes'
    // detaches fitted to the trace (1 Dec 2026, session 9), two runs gave 99.52–99.53 / 100 /
    // 94.5–95.2 % and fix-size, random-size, long-busy-list and mixed recordings 93.9–95.9 %
    // (82.7 % full-fit, not in this test): the npurged floor rose to 85 %, room for a machine
    // where fewer purges tell steps apart. Since 2 Dec 2026 (session 11) the capture is the
    // issue's 60 s (20 s per pattern, was 8 s): one run gave 99.59 / 100.00 (1 miss) / 95.21 %.
    assert!(warm >= 97.0, "placement after warm-up {warm:.2} % < 97 %");
    assert!(nr_lazy >= 99.9, "nr_lazy agreement {nr_lazy:.3} % < 99.9 %");
    assert!(npurged >= 85.0, "npurged agreement {npurged:.2} % < 85 %");
    // No warnings are expected from a healthy recording, except frees the model cannot place:
    // once, on a machine at load average 10 (parallel builds and another stress running), 774 of
    // ~700k frees (0.11 %) named areas the model did not hold as busy; quiet runs have none.
    // Tolerate 0.5 % of frees of that kind (still investigated: docs/model.md) and nothing else.
    let warnings = r["warnings"].as_object().cloned().unwrap_or_default();
    let frees = r["events"]["free"].as_u64().unwrap_or(0);
    for (kind, n) in &warnings {
        let n = n.as_u64().unwrap_or(u64::MAX);
        let allowed = if kind == "free-unknown-address" {
            frees / 200
        } else {
            0
        };
        assert!(
            n <= allowed,
            "{n} `{kind}` warnings (allowed {allowed}): {}",
            r["first_warnings"]
        );
    }
}
