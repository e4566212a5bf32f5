//! `vmtrace compare` as a user runs it, on the bundled real trace: against itself it flags
//! nothing, `--report` writes its charts, and bad input gets a line-numbered error.

mod common;

use std::io::Read as _;
use std::process::Command;

const VMTRACE: &str = env!("CARGO_BIN_EXE_vmtrace");

fn sample_text() -> String {
    let mut s = String::new();
    vmtrace::trace::compress::open(&common::sample_trace_path())
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    s
}

#[test]
fn the_bundled_trace_against_itself_flags_nothing_and_writes_a_report() {
    let sample = common::sample_trace_path();
    let dir = std::env::temp_dir().join(format!("vmtrace-compare-{}", std::process::id()));
    let out = Command::new(VMTRACE)
        .arg("compare")
        .arg(&sample)
        .arg(&sample)
        .arg("--json")
        .arg("--report")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["flagged"], 0, "{doc:#}");
    assert!(doc["tested"].as_u64().unwrap() >= 10, "{}", doc["tested"]);
    assert!(doc["header_differences"].as_array().unwrap().is_empty());
    let rows = doc["rows"].as_array().unwrap();
    let groups: Vec<&str> = rows.iter().map(|r| r["group"].as_str().unwrap()).collect();
    for g in [
        "events",
        "sizes",
        "purges",
        "lazy backlog (at each free)",
        "footprint",
    ] {
        assert!(groups.contains(&g), "no {g} rows in {groups:?}");
    }
    assert!(
        groups.iter().any(|g| g.starts_with("lock waits: ")),
        "the bundled trace has contention records: {groups:?}"
    );
    for f in [
        "cdfs.svg",
        "cdfs.png",
        "sizes.svg",
        "sizes.png",
        "ratios.svg",
        "ratios.png",
        "index.html",
    ] {
        let len = std::fs::metadata(dir.join(f)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 500, "{f}: {len} bytes");
    }
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    assert!(html.contains("node_busy_lock") && html.contains("ratios.svg"));
    let _ = std::fs::remove_dir_all(&dir);

    let text = Command::new(VMTRACE)
        .arg("compare")
        .arg(&sample)
        .arg(&sample)
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("0 of ") && text.contains("tested rows flagged"),
        "{text}"
    );
    assert!(text.contains("Same kernel, machine, CPUs, probes and command line."));
}

#[test]
fn a_perturbed_copy_is_flagged_where_it_was_changed() {
    // Every allocation made four times as large: the size rows must flag, the rates not.
    let text = sample_text();
    let changed: String = text
        .lines()
        .map(|l| {
            if l.starts_with("{\"type\":\"alloc\"") {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let mut v = v;
                let size = v["size"].as_u64().unwrap();
                v["size"] = (size * 4).into();
                v.to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    let path =
        std::env::temp_dir().join(format!("vmtrace-compare-big-{}.jsonl", std::process::id()));
    std::fs::write(&path, changed).unwrap();
    let doc = common::vmtrace_json(
        &[
            "compare",
            "--json",
            common::sample_trace_path().to_str().unwrap(),
        ],
        &path,
    );
    let _ = std::fs::remove_file(&path);
    let flagged = |metric: &str| {
        doc["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["metric"] == metric)
            .map(|r| r["flagged"].as_bool().unwrap())
    };
    assert_eq!(flagged("allocation size p50"), Some(true), "{doc:#}");
    assert_eq!(flagged("allocations"), Some(false));
    assert_eq!(flagged("lazy frees"), Some(false));
}

#[test]
fn a_malformed_line_is_an_error_with_its_number() {
    let mut lines: Vec<String> = sample_text().lines().map(str::to_string).collect();
    let at = lines.len() / 2;
    lines[at] = "{\"type\":\"alloc\",\"ts_ns\":\"soon\"}".into();
    let path =
        std::env::temp_dir().join(format!("vmtrace-compare-bad-{}.jsonl", std::process::id()));
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let out = Command::new(VMTRACE)
        .arg("compare")
        .arg(common::sample_trace_path())
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("line {}", at + 1)), "{err}");
}
