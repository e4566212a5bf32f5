//! Scenario tests of the allocator model, one JSON fixture per scenario under
//! `tests/fixtures/model/`. Each fixture lists steps and what the model must answer at each.

use std::path::Path;

use serde::Deserialize;
use vmtrace::model::{
    AllocRequest, DecayRule, FitType, Model, NodeLayout, Params, Placement, Variant,
};

const PAGE: u64 = 4096;
const BASE: u64 = 0xffffc90000000000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    description: String,
    #[serde(default = "two")]
    nodes: u32,
    /// Pages in the modelled range.
    range_pages: u64,
    lazy_max_pages: u64,
    #[serde(default)]
    variant: Variant,
    steps: Vec<Step>,
}

fn two() -> u32 {
    2
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, tag = "op", rename_all = "snake_case")]
enum Step {
    Alloc {
        pages: u64,
        #[serde(default)]
        align_pages: u64,
        #[serde(default)]
        cpu: u32,
        /// Expected address as a page offset from the range start.
        expect_page: u64,
        #[serde(default)]
        expect_fit: Option<FitType>,
        #[serde(default)]
        expect_pool: bool,
        #[serde(default)]
        expect_rotated: bool,
    },
    Free {
        page: u64,
        expect_nr_lazy: u64,
        expect_drain: bool,
    },
    Purge {
        #[serde(default)]
        full: bool,
        expect_npurged: u32,
        #[serde(default)]
        expect_pooled: Option<u32>,
        #[serde(default)]
        expect_decayed: Option<u32>,
        #[serde(default)]
        expect_helpers: Option<u32>,
    },
    ExpectPoolLen {
        node: u32,
        pages: u64,
        len: usize,
    },
}

fn run(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let sc: Scenario = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{}: bad fixture: {e}", path.display()));
    let name = format!("{} ({})", path.display(), sc.description);
    let params = Params {
        page_size: PAGE,
        layout: NodeLayout::from_cpus(sc.nodes, PAGE),
        lazy_max_pages: sc.lazy_max_pages,
        vmalloc_start: BASE,
        vmalloc_end: BASE + sc.range_pages * PAGE + PAGE - 1,
        five_level: false,
        decay: DecayRule::Quarter,
        variant: sc.variant,
    };
    let vend = params.vmalloc_end;
    let mut m = Model::new(params).unwrap();
    for (i, step) in sc.steps.iter().enumerate() {
        let at = format!("{name}, step {i}");
        match step {
            Step::Alloc {
                pages,
                align_pages,
                cpu,
                expect_page,
                expect_fit,
                expect_pool,
                expect_rotated,
            } => {
                let req = AllocRequest {
                    size: pages * PAGE,
                    align: (align_pages * PAGE).max(1),
                    vstart: BASE,
                    vend,
                    cpu: *cpu,
                    retry: false,
                    guard: true,
                };
                let a = m
                    .alloc(&req)
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{at}: {e:?}"));
                assert_eq!(a.addr, BASE + expect_page * PAGE, "{at}: address");
                assert_eq!(a.placement == Placement::Pool, *expect_pool, "{at}: pool");
                assert_eq!(a.rotated, *expect_rotated, "{at}: rotated");
                if let Some(f) = expect_fit {
                    assert_eq!(a.placement, Placement::FreeTree(*f), "{at}: fit");
                }
            }
            Step::Free {
                page,
                expect_nr_lazy,
                expect_drain,
            } => {
                let f = m.free(BASE + page * PAGE).unwrap();
                assert_eq!(f.nr_lazy, *expect_nr_lazy, "{at}: nr_lazy");
                assert_eq!(f.drain, *expect_drain, "{at}: drain");
            }
            Step::Purge {
                full,
                expect_npurged,
                expect_pooled,
                expect_decayed,
                expect_helpers,
            } => {
                let p = m.purge(*full);
                assert_eq!(p.npurged, *expect_npurged, "{at}: npurged");
                if let Some(v) = expect_pooled {
                    assert_eq!(p.pooled, *v, "{at}: pooled");
                }
                if let Some(v) = expect_decayed {
                    assert_eq!(p.decayed, *v, "{at}: decayed");
                }
                if let Some(v) = expect_helpers {
                    assert_eq!(p.helpers, *v, "{at}: helpers");
                }
            }
            Step::ExpectPoolLen { node, pages, len } => {
                assert_eq!(m.pools().len(*node, pages * PAGE), *len, "{at}: pool len");
            }
        }
        m.check_invariants().unwrap_or_else(|e| panic!("{at}: {e}"));
    }
}

#[test]
fn all_model_scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 6,
        "expected the scenario fixtures in {}",
        dir.display()
    );
    for f in &files {
        run(f);
    }
}
