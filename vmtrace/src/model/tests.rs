//! Property tests: random alloc/free/purge sequences against a page-bitmap oracle.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

const PAGE: u64 = 4096;
const BASE: u64 = 0x10_0000;
const PAGES: u64 = 512;

fn params(variant: Variant) -> Params {
    Params {
        page_size: PAGE,
        layout: NodeLayout::new(2, 16 * PAGE),
        lazy_max_pages: 64,
        vmalloc_start: BASE,
        vmalloc_end: BASE + PAGES * PAGE + PAGE - 1,
        five_level: false,
        variant,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        pages: u64,
        align_shift: u32,
        cpu: u32,
    },
    Free {
        pick: usize,
    },
    Purge {
        full: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u64..24, 0u32..5, 0u32..3).prop_map(|(pages, s, cpu)| Op::Alloc {
            pages,
            align_shift: s,
            cpu,
        }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => any::<bool>().prop_map(|full| Op::Purge { full }),
    ]
}

/// Lowest aligned run of `pages` free pages: what lowest-address fit must return.
fn oracle_fit(used: &[bool], pages: u64, align: u64) -> Option<u64> {
    let step = (align / PAGE).max(1);
    let base_page = BASE / PAGE;
    let mut p = 0u64;
    while p + pages <= PAGES {
        // Alignment is of the absolute address.
        if !(base_page + p).is_multiple_of(step) {
            p += 1;
            continue;
        }
        match (p..p + pages).find(|&q| used[q as usize]) {
            None => return Some(BASE + p * PAGE),
            Some(q) => p = q + 1,
        }
    }
    None
}

fn used_pages(
    busy: &BTreeMap<u64, u64>,
    lazy: &BTreeMap<u64, u64>,
    m: &Model,
) -> Result<Vec<bool>, TestCaseError> {
    let mut used = vec![false; PAGES as usize];
    let spans = busy
        .iter()
        .chain(lazy.iter())
        .map(|(&a, &s)| (a, s))
        .chain(m.pools().iter().map(|(_, a, s)| (a, s)));
    for (a, s) in spans {
        for p in (a - BASE) / PAGE..(a - BASE + s) / PAGE {
            prop_assert!(!used[p as usize], "page {p} used twice");
            used[p as usize] = true;
        }
    }
    Ok(used)
}

fn run(variant: Variant, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut m = Model::new(params(variant)).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut busy: BTreeMap<u64, u64> = BTreeMap::new();
    let mut lazy: BTreeMap<u64, u64> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Alloc {
                pages,
                align_shift,
                cpu,
            } => {
                let align = if align_shift == 0 {
                    1
                } else {
                    PAGE << (align_shift - 1)
                };
                let used = used_pages(&busy, &lazy, &m)?;
                let pooled_before: Vec<(u32, u64, u64)> = m.pools().iter().collect();
                let req = AllocRequest {
                    size: pages * PAGE,
                    align,
                    vstart: BASE,
                    vend: params(variant).vmalloc_end,
                    cpu,
                    retry: false,
                    guard: true,
                };
                let got = m
                    .alloc(&req)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                match got {
                    Ok(a) => {
                        match a.placement {
                            Placement::FreeTree(_) => {
                                prop_assert_eq!(Some(a.addr), oracle_fit(&used, pages, align))
                            }
                            Placement::Pool => {
                                prop_assert!(pooled_before.contains(&(
                                    cpu % 2,
                                    a.addr,
                                    pages * PAGE
                                )));
                                prop_assert_eq!(a.addr % align, 0);
                            }
                        }
                        busy.insert(a.addr, pages * PAGE);
                    }
                    Err(_) => prop_assert_eq!(oracle_fit(&used, pages, align), None),
                }
            }
            Op::Free { pick } => {
                if busy.is_empty() {
                    continue;
                }
                let addr = *busy.keys().nth(pick % busy.len()).unwrap_or(&0);
                let size = busy.remove(&addr).unwrap_or(0);
                let f = m
                    .free(addr)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                lazy.insert(addr, size);
                let expect: u64 = lazy.values().map(|s| s / PAGE).sum();
                prop_assert_eq!(f.nr_lazy, expect);
                prop_assert_eq!(f.drain, expect > 64);
            }
            Op::Purge { full } => {
                let p = m.purge(full);
                let pages: u64 = lazy.values().map(|s| s / PAGE).sum();
                prop_assert_eq!(p.pages, pages);
                if variant != Variant::Global {
                    prop_assert_eq!(p.npurged as usize, lazy.len());
                }
                if full {
                    prop_assert_eq!(m.pools().objects(), 0);
                }
                lazy.clear();
            }
        }
        if let Err(e) = m.check_invariants() {
            return Err(TestCaseError::fail(e));
        }
        prop_assert_eq!(m.busy().len(), busy.len());
        prop_assert_eq!(m.lazy_pages(), lazy.values().map(|s| s / PAGE).sum::<u64>());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn nodes_matches_oracle(ops in proptest::collection::vec(op(), 1..200)) {
        run(Variant::Nodes, ops)?;
    }

    #[test]
    fn nodes_capped_matches_oracle(ops in proptest::collection::vec(op(), 1..200)) {
        run(Variant::NodesCapped, ops)?;
    }

    #[test]
    fn global_matches_oracle(ops in proptest::collection::vec(op(), 1..200)) {
        run(Variant::Global, ops)?;
    }
}

#[test]
fn undo_and_claim_restore_state() {
    let mut m = Model::new(params(Variant::Nodes)).unwrap();
    let req = AllocRequest {
        size: 3 * PAGE,
        align: 1,
        vstart: BASE,
        vend: params(Variant::Nodes).vmalloc_end,
        cpu: 0,
        retry: false,
        guard: true,
    };
    let a = m.alloc(&req).unwrap().unwrap();
    assert_eq!(a.addr, BASE);
    m.undo_alloc(&a).unwrap();
    assert_eq!(m.free_space().len(), 1);
    assert_eq!(
        m.claim(&req, BASE + 8 * PAGE).unwrap(),
        Placement::FreeTree(FitType::Ne)
    );
    m.check_invariants().unwrap();
    assert!(m.claim(&req, BASE + 9 * PAGE).is_err());
}
