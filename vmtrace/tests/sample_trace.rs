//! The bundled real trace (`vmtrace/assets/sample-trace.jsonl.zst`) stays readable and valid: it is
//! what `cargo xtask run` shows without privileges, so a format change must regenerate it.

mod common;

use std::path::PathBuf;
use std::process::Command;

fn sample() -> PathBuf {
    common::sample_trace_path()
}

#[test]
fn sample_trace_validates_against_the_schema() {
    let lines = common::assert_trace_valid(&sample());
    assert!(lines > 1000, "only {lines} lines");
}

#[test]
fn sample_trace_is_consistent() {
    let input = vmtrace::trace::compress::open(&sample()).unwrap();
    let s = vmtrace::summary::summarize(input).unwrap();
    assert_eq!(s.lost_total, Some(0));
    assert!(s.cut_short_at_line.is_none());
    assert!(s.snapshot_real_addresses);
    assert!(
        s.events.alloc >= 2000 && s.events.free >= 2000 && s.events.purge >= 1,
        "{:?}",
        s.events
    );
    assert_eq!(s.unmatched_frees, 0);
    assert_eq!(s.allocs_outside_vmalloc, 0);
    assert_eq!(s.lazy_max_pages, Some(16384));
    assert_eq!(s.nr_vmap_nodes, 2);
}

#[test]
fn summary_command_prints_text_and_json() {
    let out = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .arg("summary")
        .arg(sample())
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("lost events: 0"), "{text}");
    assert!(text.contains("vmap nodes 2"), "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["summary", "--json"])
        .arg(sample())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["lost_total"], 0);
    assert!(v["events"]["alloc"].as_u64().unwrap() >= 2000);
}

#[test]
fn a_corrupt_line_is_reported_with_its_number() {
    let text = common::sample_trace_text();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[10] = "{\"type\":\"alloc\",\"ts_ns\":\"oops\"}";
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, lines.join("\n") + "\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .arg("summary")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 11"), "{err}");
}

/// The strict figures are the causal replay's own: a plain replay computes them in a second
/// pass over the same read, and `--causal` runs that pass alone, so both must give the same
/// strict figures, and the causal report's figures must be those strict ones. Nothing the
/// strict figures leave out can make them agree more than the explained ones; on this trace
/// the explained placement agrees on a few allocations more (the rules helped them), and both
/// `nr_lazy` figures agree on every free.
#[test]
fn strict_figures_are_the_causal_replay_and_stay_below_the_explained_ones() {
    use vmtrace::replay::{replay, ReplayOptions};
    let read = || vmtrace::trace::compress::open(&sample()).unwrap();
    let both = replay(read(), &ReplayOptions::default()).unwrap();
    let causal = replay(
        read(),
        &ReplayOptions {
            causal: true,
            ..ReplayOptions::default()
        },
    )
    .unwrap();
    assert!(causal.causal && !both.causal);
    assert_eq!(both.strict, causal.strict);
    assert_eq!(causal.placement, causal.strict.placement);
    assert_eq!(causal.nr_lazy, causal.strict.nr_lazy);
    assert_eq!(causal.npurged, causal.strict.npurged);
    assert_eq!(both.strict.nr_lazy.compared, both.nr_lazy.compared);
    assert!(
        both.strict.nr_lazy.agreed <= both.nr_lazy.agreed,
        "strict {:?}, explained {:?}",
        both.strict.nr_lazy,
        both.nr_lazy
    );
    assert_eq!(both.strict.placement.compared, both.placement.compared);
    assert!(
        both.strict.placement.agreed < both.placement.agreed,
        "strict {:?}, explained {:?}",
        both.strict.placement,
        both.placement
    );
}

/// The validation's page tables are those the trace added: the snapshot's (hundreds of areas
/// here) are the same on both sides and would make any model agree.
#[test]
fn page_tables_are_validated_on_what_the_trace_added() {
    let out = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["replay", "--free-running", "--json"])
        .arg(sample())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let w = &doc["what_if"][0];
    let pte = w["validation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["metric"] == "pte_tables")
        .expect("pte_tables validated");
    let (all, seeded) = (
        w["slots"]["pte_tables"].as_f64().unwrap(),
        w["seeded_slots"]["pte_tables"].as_f64().unwrap(),
    );
    assert!(seeded > 0.0 && all > seeded, "{all} {seeded}");
    assert_eq!(pte["predicted"].as_f64(), Some(all - seeded));
    assert!(pte["observed"].as_f64().unwrap() < all, "{pte}");
    // The built-in calibration's held-out check comes with the predictions, one entry per
    // validation metric it checked.
    let check = &doc["calibration_check"];
    let metrics: Vec<&str> = check["metrics"]
        .as_array()
        .expect("a calibration_check with metrics")
        .iter()
        .map(|m| m["metric"].as_str().unwrap())
        .collect();
    assert!(metrics.contains(&"pte_tables"), "{check}");
    assert!(
        !check["recordings"].as_array().unwrap().is_empty(),
        "{check}"
    );
}

/// The README's screen shows the bundled trace's placement after warm-up, strict and explained,
/// as the model gives it now: a model change that moves them must update the screen.
#[test]
fn the_readme_screen_shows_the_bundled_traces_warmed_up_placement() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let input = vmtrace::trace::compress::open(&sample()).unwrap();
    let r = vmtrace::replay::replay(input, &vmtrace::replay::ReplayOptions::default()).unwrap();
    let warm = &r.placement_after_warmup;
    assert!(
        warm.compared > 10_000,
        "{} compared after warm-up",
        warm.compared
    );
    let line = format!(
        "warmed-up strict {:.1}%  explained {:.1}% ({})",
        r.strict.placement_after_warmup.percent(),
        warm.percent(),
        warm.compared
    );
    assert!(
        readme.contains(&line),
        "README.md's screen lacks `{line}`: rerun `vmtrace top --replay vmtrace/assets/sample-trace.jsonl.zst -b -n 1 -d 1s`"
    );
    // Past warm-up, the model places nearly every allocation the kernel did.
    assert!(r.strict.placement_after_warmup.percent() > 95.0);
}
