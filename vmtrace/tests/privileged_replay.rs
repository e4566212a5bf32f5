//! Privileged fidelity test: record real `vmtrace stress` traffic on this kernel, replay it
//! through the model (`nodes`, observed timing) and check the agreement floors.
//!
//! The floors are below what was measured on the project's 2-CPU 6.18 machines (see
//! `docs/model.md`, "Explained figures on the reference machine"), with margin for run-to-run
//! variation: they catch a model regression, not the remaining known divergence classes.
//! Without BPF privileges the test skips loudly, unless `VMTRACE_REQUIRE_PRIVILEGED=1`, where it
//! fails.

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
    // The floors sit below the spread of measured runs of this capture and of recordings of
    // the same patterns on the 2-CPU 6.18 reference machine (placement after warm-up
    // 99.5–99.7 %, nr_lazy 99.999–100 %, npurged 93.4–96.6 %; docs/model.md, "Explained figures
    // on the reference machine"), with room for a busier machine: frees that land between a
    // purge's detach and its event (docs/inference.md, "The detach race") are more frequent when
    // the stress runs faster, and npurged depends on a detach that has no event on the
    // tracepoint rung. Without the flush probe (a kernel where it cannot attach) npurged is
    // predicted from the drain item's start alone and comes out lower.
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
