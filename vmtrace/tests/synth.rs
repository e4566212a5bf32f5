//! `vmtrace synth`: the output is a schema-valid trace marked synthetic, its sizes include the
//! guard page, the mask selects the module's tests, it is deterministic for a seed, and an
//! observed-timing replay of it agrees with it exactly (the generator drives the same model).

mod common;

use std::collections::BTreeSet;

use vmtrace::replay::{replay, ReplayOptions};
use vmtrace::synth::{generate, SynthParams};
use vmtrace::trace::{Record, TraceReader};

fn synth(p: &SynthParams) -> Vec<u8> {
    let mut out = Vec::new();
    generate(p, vec!["vmtrace".into(), "synth".into()], &mut out).expect("generation");
    out
}

fn small(mask: u64) -> SynthParams {
    SynthParams {
        mask,
        threads: 6,
        cpus: 4,
        loops: 30,
        junk: Some(32),
        busy_list: 40,
        seed: 5,
        ..SynthParams::default()
    }
}

fn records(bytes: &[u8]) -> Vec<Record> {
    TraceReader::new(bytes)
        .collect::<Result<Vec<_>, _>>()
        .expect("the trace reads back")
}

#[test]
fn output_is_schema_valid_and_marked_synthetic() {
    let bytes = synth(&small(0x1f7f));
    let n = common::assert_bytes_valid(&bytes);
    assert!(n > 1000, "only {n} lines");
    let recs = records(&bytes);
    let Record::Header(h) = &recs[0] else {
        panic!("no header")
    };
    let s = h
        .synthetic
        .as_ref()
        .expect("header marks the trace synthetic");
    assert_eq!(s.workload, "lib/test_vmalloc.c");
    assert_eq!(s.params["mask"], 0x1f7f);
    assert_eq!(s.tests.len(), 12, "every alloc_vmap_area test but pcpu");
    assert_eq!(h.vmap.nr_vmap_nodes, 4);
    assert_eq!(h.vmap.zone_size, 16 * 4096);
    assert_eq!(h.vmap.lazy_max_pages_computed, 3 * 8192);
    assert!(matches!(recs.last(), Some(Record::Footer(_))));
}

#[test]
fn mask_selects_the_tests_and_sizes_include_the_guard_page() {
    let sizes = |mask: u64| -> BTreeSet<(u64, u64)> {
        records(&synth(&small(mask)))
            .iter()
            .filter_map(|r| match r {
                Record::Alloc(a) if a.failed == 0 => Some((a.size / 4096, a.align)),
                _ => None,
            })
            .collect()
    };
    // fix_size of 1 page: 2 pages with the guard, align 1.
    assert_eq!(sizes(1), BTreeSet::from([(2, 1)]));
    // fix_align: 5 pages + guard at 32 KiB.
    assert_eq!(sizes(1 << 4), BTreeSet::from([(6, 32 << 10)]));
    // long_busy_list: the pointer array (40 * 8 bytes: 1 page), 1-page areas and 100 pages.
    assert_eq!(sizes(1 << 2), BTreeSet::from([(2, 1), (101, 1)]));
    // random_size: 1..=100 pages, every one with a guard.
    assert!(sizes(1 << 3)
        .iter()
        .all(|&(p, a)| (2..=101).contains(&p) && a == 1));
    // vm_map_ram of 1 page: a vmap block (1024 pages, aligned to itself, no guard).
    assert_eq!(sizes(1 << 10), BTreeSet::from([(1024, 1024 * 4096)]));
    // vrealloc: 1 page then 4 pages, each with a guard.
    assert_eq!(sizes(1 << 12), BTreeSet::from([(2, 1), (5, 1)]));
    // pcpu_alloc_test alone: no alloc_vmap_area traffic at all.
    assert!(sizes(1 << 7).is_empty());
}

#[test]
fn deterministic_for_a_seed_and_different_across_seeds() {
    let p = small(0x3f);
    assert_eq!(synth(&p), synth(&p));
    let q = SynthParams { seed: 6, ..p };
    assert_ne!(synth(&small(0x3f)), synth(&q));
}

#[test]
fn timestamps_interleave_cpus_and_never_go_back() {
    let recs = records(&synth(&small(7)));
    let mut last = 0;
    let mut cpus = BTreeSet::new();
    let mut switches = 0;
    let mut prev_cpu = None;
    for r in &recs {
        if let Some(ts) = r.ts_ns() {
            assert!(ts >= last, "timestamp went back");
            last = ts;
        }
        if let Record::Alloc(a) = r {
            cpus.insert(a.ctx.cpu);
            if prev_cpu.is_some_and(|c| c != a.ctx.cpu) {
                switches += 1;
            }
            prev_cpu = Some(a.ctx.cpu);
        }
    }
    assert_eq!(cpus.len(), 4);
    assert!(
        switches > 100,
        "per-CPU streams do not interleave ({switches})"
    );
}

#[test]
fn observed_timing_replay_agrees_exactly() {
    let bytes = synth(&small(0x1f7f));
    let r = replay(&bytes[..], &ReplayOptions::default()).expect("replay");
    assert_eq!(r.placement.agreed, r.placement.compared);
    assert!(r.placement.compared > 1000);
    assert_eq!(r.nr_lazy.agreed, r.nr_lazy.compared);
    assert_eq!(r.npurged.agreed, r.npurged.compared);
    assert!(r.warnings.is_empty(), "{:?}", r.first_warnings);
}
