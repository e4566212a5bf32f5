//! A real 16-node recording (`tests/fixtures/sixteen`, the only multi-node data a 2-CPU test
//! machine has): the trace-only bound on pool hits holds over replay's attribution of them, and
//! falls when the allocations' CPUs are scattered over other nodes, as a bound that reads the
//! nodes must.

mod common;

use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sixteen/fix16-head.jsonl.zst")
}

/// The `nodes` what-if of `replay --free-running --json`.
fn nodes_what_if(trace: &Path) -> serde_json::Value {
    let doc = common::vmtrace_json(
        &["replay", "--free-running", "--json", "--seed", "1"],
        trace,
    );
    doc["what_if"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["variant"] == "nodes")
        .cloned()
        .expect("a nodes what-if")
}

fn attributed_share(w: &serde_json::Value) -> f64 {
    w["validation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["metric"] == "pool_hit_share")
        .expect("the pool-hit share is validated")["observed"]
        .as_f64()
        .unwrap()
}

#[test]
fn the_pool_bound_holds_on_16_nodes_and_falls_when_cpus_move() {
    let w = nodes_what_if(&fixture());
    let bound = w["trace"]["pool_hit_share_max"].as_f64().expect("a bound");
    let attributed = attributed_share(&w);
    eprintln!("16 nodes: attributed {attributed:.4}, bound {bound:.4}");
    assert!(
        attributed <= bound + 0.005,
        "replay attributes {attributed} to pools, more than the trace allows ({bound})"
    );
    assert!(
        bound > 0.3,
        "fix-size reuses its areas through the pools: {bound}"
    );

    // The same events with each allocation's CPU moved by its index: reuses now mostly come
    // from another node than the one that last allocated the address.
    let dir = tempfile::tempdir().unwrap();
    let moved = dir.path().join("moved.jsonl");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&moved).unwrap());
    let input = vmtrace::trace::compress::open(&fixture()).unwrap();
    let mut i = 0u64;
    for line in input.lines() {
        let line = line.unwrap();
        if line.starts_with("{\"type\":\"alloc\"") {
            let mut v: serde_json::Value = serde_json::from_str(&line).unwrap();
            let cpu = v["cpu"].as_u64().unwrap();
            v["cpu"] = ((cpu + i) % 16).into();
            i += 1;
            writeln!(out, "{v}").unwrap();
        } else {
            writeln!(out, "{line}").unwrap();
        }
    }
    out.flush().unwrap();
    drop(out);
    let moved_bound = nodes_what_if(&moved)["trace"]["pool_hit_share_max"]
        .as_f64()
        .unwrap();
    eprintln!("CPUs moved: bound {moved_bound:.4}");
    assert!(
        moved_bound < bound / 3.0,
        "the bound did not fall with the nodes: {bound} -> {moved_bound}"
    );
}
