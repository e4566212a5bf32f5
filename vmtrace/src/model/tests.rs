//! Property tests: random alloc/free/purge sequences against a page-bitmap oracle.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

pub(crate) const PAGE: u64 = 4096;
const BASE: u64 = 0x10_0000;
const PAGES: u64 = 512;

/// A small 2-node allocator: 512 pages, 16-page zones, `lazy_max_pages` 64.
pub(crate) fn params(variant: Variant) -> Params {
    Params {
        page_size: PAGE,
        layout: NodeLayout::new(2, 16 * PAGE),
        lazy_max_pages: 64,
        vmalloc_start: BASE,
        vmalloc_end: BASE + PAGES * PAGE + PAGE - 1,
        five_level: false,
        decay: DecayRule::Quarter,
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

/// The kernel's search with `adjust_search_size` (alignment above a page): the lowest maximal
/// free run of at least `size + align - 1` bytes, else the lowest fit (`FreeSpace::alloc`).
fn oracle_fit_adjusted(used: &[bool], pages: u64, align: u64) -> Option<u64> {
    let step = (align / PAGE).max(1);
    let base_page = BASE / PAGE;
    let mut p = 0u64;
    while p < PAGES {
        if used[p as usize] {
            p += 1;
            continue;
        }
        let start = p;
        while p < PAGES && !used[p as usize] {
            p += 1;
        }
        // size + align - 1 bytes is one byte short of pages + step whole pages.
        if p - start >= pages + step {
            let aligned = (base_page + start).div_ceil(step) * step - base_page;
            return Some(BASE + aligned * PAGE);
        }
    }
    oracle_fit(used, pages, align)
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
                            Placement::FreeTree(_) if align > PAGE => prop_assert_eq!(
                                Some(a.addr),
                                oracle_fit_adjusted(&used, pages, align)
                            ),
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

pub(crate) fn one_page_req(cpu: u32, p: &Params) -> AllocRequest {
    AllocRequest {
        size: PAGE,
        align: 1,
        vstart: p.vmalloc_start,
        vend: p.vmalloc_end,
        cpu,
        retry: false,
        guard: true,
    }
}

/// `n` one-page areas allocated on CPU 0, lowest first.
fn one_page_areas(m: &mut Model, p: &Params, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| m.alloc(&one_page_req(0, p)).unwrap().unwrap().addr)
        .collect()
}

/// `n` one-page areas allocated, freed and purged into node 0's pool.
fn pooled_one_page_areas(m: &mut Model, p: &Params, n: usize) -> Vec<u64> {
    let addrs = one_page_areas(m, p, n);
    for &a in &addrs {
        m.free(a).unwrap();
    }
    m.purge(false);
    addrs
}

/// One area on each node's CPU, then a third on node 0 freed: `(model, on0, on1, first)`.
fn two_nodes_and_one_lazy(p: &Params) -> (Model, u64, u64, u64) {
    let mut m = Model::new(p.clone()).unwrap();
    let on0 = m.alloc(&one_page_req(0, p)).unwrap().unwrap().addr;
    let on1 = m.alloc(&one_page_req(1, p)).unwrap().unwrap().addr;
    let first = m.alloc(&one_page_req(0, p)).unwrap().unwrap().addr;
    m.free(first).unwrap();
    (m, on0, on1, first)
}

/// With joins held, a purge that takes more than was lazy at its start takes the frees the
/// caller joins to their node's batch, not the next ones in free order: here the node-1 free
/// that came second, not the node-0 free that came first.
#[test]
fn held_joins_take_the_chosen_free_not_the_next() {
    let p = params(Variant::Nodes);
    let (mut m, on0, on1, first) = two_nodes_and_one_lazy(&p);
    // npurged 2: the area lazy at the start and one racing free.
    let mut run = m.purge_start(false, Some(2));
    assert_eq!(run.joiners(), 1);
    run.hold_joins();
    assert_eq!(m.free(on0).unwrap().node, 0);
    let freed = m.free(on1).unwrap();
    assert_eq!(freed.node, 1);
    m.join_last_free(&mut run, freed.node);
    let got = m.purge_finish(run);
    assert_eq!(got.npurged, 2);
    let mut batch: Vec<u64> = got.batch.iter().map(|a| a.addr).collect();
    batch.sort_unstable();
    let mut want = vec![first, on1];
    want.sort_unstable();
    assert_eq!(batch, want);
    assert!(
        m.lazy().find(on0).is_some(),
        "the node-0 free missed its detach"
    );
    m.check_invariants().unwrap();
    // Without the hold, the next free in order joins.
    let (mut m, on0, on1, _) = two_nodes_and_one_lazy(&p);
    let run = m.purge_start(false, Some(2));
    m.free(on0).unwrap();
    m.free(on1).unwrap();
    m.purge_finish(run);
    assert!(m.lazy().find(on1).is_some());
    assert!(m.lazy().find(on0).is_none());
}

/// A deferred node keeps its whole pool until its decay: an allocation in between takes the
/// head the decay would have taken, and the decay then counts `len >> 2` of what is left.
#[test]
fn a_deferred_decay_cuts_the_pool_as_it_is_then() {
    let p = params(Variant::Nodes);
    let mut m = Model::new(p.clone()).unwrap();
    pooled_one_page_areas(&mut m, &p, 8);
    assert_eq!(m.pools().len(0, PAGE), 8);
    let head = m.pools().head(0, PAGE).unwrap();
    let mut run = m.purge_start_deferring(Some(0));
    assert_eq!(run.undecayed(), &[0, 1]);
    assert_eq!(m.pools().len(0, PAGE), 8, "nothing decayed yet");
    let got = m.alloc(&one_page_req(0, &p)).unwrap().unwrap();
    assert_eq!(
        got.addr, head,
        "the head a start-time decay would have freed"
    );
    m.decay_begin(&mut run, 0);
    assert_eq!(run.undecayed(), &[1]);
    assert_eq!(m.pools().len(0, PAGE), 6, "7 left, 7 >> 2 = 1 decayed");
    m.check_invariants().unwrap();
    let done = m.purge_finish(run);
    assert_eq!(done.decayed, 1);
    // Undecayed nodes decay before any node is purged.
    let mut m = Model::new(p.clone()).unwrap();
    pooled_one_page_areas(&mut m, &p, 8);
    let run = m.purge_start_deferring(None);
    let done = m.purge_finish(run);
    assert_eq!(done.decayed, 2);
    assert_eq!(m.pools().len(0, PAGE), 6);
    m.check_invariants().unwrap();
}

/// A decay begun cuts the pool at once; the cut entries are neither pooled nor free until the
/// decay ends, and an allocation cannot take them in between.
#[test]
fn a_decay_in_progress_holds_its_cut_entries_until_it_ends() {
    let p = params(Variant::Nodes);
    let mut m = Model::new(p.clone()).unwrap();
    let addrs = pooled_one_page_areas(&mut m, &p, 8);
    let mut run = m.purge_start_deferring(None);
    m.decay_begin(&mut run, 0);
    assert_eq!(m.pools().len(0, PAGE), 6, "8 >> 2 = 2 cut");
    let top = *addrs.iter().max().unwrap();
    assert_eq!(m.decaying_holding(top, PAGE), Some(0), "the head was cut");
    m.check_invariants().unwrap();
    // A CPU-1 request (node 1's pool is empty) goes to the free tree, past the cut entries.
    let got = m.alloc(&one_page_req(1, &p)).unwrap().unwrap();
    assert!(got.addr > top, "{:#x} inside the cut entries", got.addr);
    m.decay_end(&mut run, 0);
    assert_eq!(m.decaying_holding(top, PAGE), None);
    let done = m.purge_finish(run);
    assert_eq!(done.decayed, 2);
    m.check_invariants().unwrap();
}

/// A purge limited to the oldest frees leaves the later ones lazy and counted, and `unpurge`
/// takes a pooled area back to its lazy tree.
#[test]
fn purge_oldest_and_unpurge() {
    let p = params(Variant::Nodes);
    let mut m = Model::new(p.clone()).unwrap();
    let addrs: Vec<u64> = (0..3)
        .map(|_| m.alloc(&one_page_req(0, &p)).unwrap().unwrap().addr)
        .collect();
    // Freed out of address order: the oldest two are the highest addresses.
    m.free(addrs[2]).unwrap();
    m.free(addrs[1]).unwrap();
    m.free(addrs[0]).unwrap();
    let got = m.purge_oldest(false, 2);
    assert_eq!(got.npurged, 2);
    assert_eq!(m.lazy().objects(), 1);
    assert!(m.lazy().find(addrs[0]).is_some(), "the newest free waits");
    assert_eq!(m.lazy_pages(), 1);
    m.check_invariants().unwrap();
    let pooled = got
        .batch
        .iter()
        .find(|a| a.addr == addrs[1])
        .copied()
        .unwrap();
    assert!(m.unpurge(&pooled));
    assert_eq!(m.lazy().objects(), 2);
    assert_eq!(m.lazy_pages(), 2);
    assert_eq!(m.pools().len(0, PAGE), 1);
    m.check_invariants().unwrap();
}

/// A purge split node by node ends where the whole purge ends, and each node's step subtracts
/// only that node's batch; frees after the start stay out of every batch.
#[test]
fn purge_node_by_node_equals_the_whole_purge() {
    let p = params(Variant::Nodes);
    let build = || {
        let mut m = Model::new(p.clone()).unwrap();
        let mut addrs = Vec::new();
        for i in 0..12u32 {
            let req = AllocRequest {
                size: (1 + u64::from(i % 3)) * PAGE,
                cpu: i % 2,
                ..one_page_req(0, &p)
            };
            addrs.push(m.alloc(&req).unwrap().unwrap().addr);
        }
        for &a in addrs.iter().take(10) {
            m.free(a).unwrap();
        }
        (m, addrs)
    };
    let (mut whole, _) = build();
    let expected = whole.purge_oldest(false, 7);

    let (mut m, addrs) = build();
    let mut run = m.purge_start(false, Some(7));
    assert_eq!(run.remaining(), &[0, 1]);
    let b0 = m.purge_batch_pages(&run, 0);
    let b1 = m.purge_batch_pages(&run, 1);
    assert!(b0 > 0 && b1 > 0, "both nodes have work: {b0} {b1}");
    let before = m.lazy_pages();
    m.purge_node(&mut run, 1);
    assert_eq!(
        m.lazy_pages(),
        before - b1,
        "only node 1's batch left the counter"
    );
    assert_eq!(m.purge_batch_pages(&run, 1), 0);
    m.check_invariants().unwrap();
    // A free between the two nodes' ends is in no batch.
    m.free(addrs[10]).unwrap();
    let got = m.purge_finish(run);
    assert!(m.lazy().find(addrs[10]).is_some());
    m.check_invariants().unwrap();
    assert_eq!(
        (got.npurged, got.pages, got.pooled, got.decayed, got.helpers),
        (
            expected.npurged,
            expected.pages,
            expected.pooled,
            expected.decayed,
            expected.helpers
        )
    );
    assert_eq!(got.range, expected.range);
    // Both orders pool in address order: the same pool heads.
    for node in 0..2 {
        for pages in 1..=3 {
            assert_eq!(
                m.pools().head(node, pages * PAGE),
                whole.pools().head(node, pages * PAGE)
            );
        }
    }
}

/// `purge_node_pages` takes a node's oldest areas adding up to exactly the pages asked for,
/// and the other nodes then share what is left of `npurged`.
#[test]
fn purge_node_pages_takes_a_node_prefix_by_age() {
    let p = params(Variant::Nodes);
    let mut m = Model::new(p.clone()).unwrap();
    // Node 0 (16-page zones from BASE): three 1-page areas; node 1: two 1-page areas.
    let mut n0 = Vec::new();
    let mut n1 = Vec::new();
    for _ in 0..3 {
        n0.push(m.alloc(&one_page_req(0, &p)).unwrap().unwrap().addr);
    }
    for i in 0..2 {
        let a = BASE + 16 * PAGE + i * 2 * PAGE;
        m.claim(&one_page_req(1, &p), a).unwrap();
        n1.push(a);
    }
    m.free(n0[0]).unwrap();
    m.free(n1[0]).unwrap();
    m.free(n0[1]).unwrap();
    m.free(n1[1]).unwrap();
    m.free(n0[2]).unwrap();
    // The kernel purged 4 areas: the common estimate takes the 4 oldest (n0[0], n1[0], n0[1],
    // n1[1]); node 0 turned out to have detached after its third free, so it took 3 pages.
    let mut run = m.purge_start(false, Some(4));
    assert_eq!(m.purge_batch_pages(&run, 0), 2);
    assert!(
        !m.purge_node_pages(&mut run, 0, 4),
        "no prefix adds up to 4"
    );
    assert!(m.purge_node_pages(&mut run, 0, 3));
    assert_eq!(m.lazy_pages(), 2);
    assert_eq!(
        m.purge_batch_pages(&run, 1),
        1,
        "node 1 gets the one object left: its oldest"
    );
    let got = m.purge_finish(run);
    assert_eq!(got.npurged, 4);
    assert!(m.lazy().find(n1[1]).is_some());
    assert_eq!(m.lazy_pages(), 1);
    m.check_invariants().unwrap();
}

/// A pool hit the model predicted at another entry is still the kernel's pool hit: `undo_alloc`
/// takes the prediction's hit back and `claim` counts the kernel's, so replay's pool-hit share
/// (validation's observed side) counts pool hits, not agreeing predictions. A claim from the
/// free tree counts none.
#[test]
fn claims_from_a_pool_count_as_the_kernels_pool_hits() {
    let p = params(Variant::Nodes);
    let mut m = Model::new(p.clone()).unwrap();
    let addrs = pooled_one_page_areas(&mut m, &p, 3);
    let before = m.stats().clone();
    let predicted = m.alloc(&one_page_req(0, &p)).unwrap().unwrap();
    assert_eq!(predicted.placement, Placement::Pool);
    let kernels = *addrs.iter().find(|&&a| a != predicted.addr).unwrap();
    m.undo_alloc(&predicted).unwrap();
    assert_eq!(
        m.claim(&one_page_req(0, &p), kernels).unwrap(),
        Placement::Pool
    );
    let s = m.stats();
    assert_eq!(
        s.pool_hits, before.pool_hits,
        "the wrong prediction is taken back"
    );
    assert_eq!(s.pool_claims, before.pool_claims + 1);
    assert_eq!(s.allocs, before.allocs + 1);
    // Above every area so far: free-tree space.
    let high = addrs.iter().max().unwrap() + 8 * PAGE;
    assert!(matches!(
        m.claim(&one_page_req(0, &p), high).unwrap(),
        Placement::FreeTree(_)
    ));
    assert_eq!(m.stats().pool_claims, before.pool_claims + 1);
    // Node 0's last pooled area taken by a CPU of node 1: `node_alloc` never looks in another
    // node's pool, so the kernel took it from the free tree.
    let last = *addrs
        .iter()
        .find(|&&a| a != predicted.addr && a != kernels)
        .unwrap();
    assert_eq!(p.layout.cpu_to_node(1), 1);
    assert_eq!(
        m.claim(&one_page_req(1, &p), last).unwrap(),
        Placement::Pool
    );
    assert_eq!(m.stats().pool_claims, before.pool_claims + 1);
    m.check_invariants().unwrap();
}

/// A withdrawn range is outside the model until the caller gives it back: the coverage check
/// reports the gap unless told of the range, and the lowest fit skips it.
#[test]
fn withdrawn_space_is_a_gap_until_given_back() {
    let p = params(Variant::Nodes);
    let base = p.vmalloc_start;
    let mut m = Model::new(p.clone()).unwrap();
    assert!(m.withdraw(base, 2 * PAGE, 0));
    assert!(!m.withdraw(base, PAGE, 0), "already out");
    assert!(m.check_invariants().is_err(), "the gap is reported");
    let held = BTreeMap::from([(base, 2 * PAGE)]);
    m.check_invariants_with(&held).unwrap();
    let a = m.alloc(&one_page_req(0, &p)).unwrap().unwrap();
    assert_eq!(
        a.addr,
        base + 2 * PAGE,
        "the withdrawn pages are not offered"
    );
    assert!(m.release_free(base, 2 * PAGE));
    assert!(!m.release_free(base, PAGE), "free already");
    m.check_invariants().unwrap();
}

/// A decay merges its entries into a local tree before it takes the free-tree lock, so the
/// section walks runs of adjacent entries, not entries: three neighbours and a loner are two.
#[test]
fn decayed_neighbours_reach_the_free_tree_as_one_run() {
    let cut = [
        (0x5000, PAGE),
        (0x1000, PAGE),
        (0x2000, 2 * PAGE),
        (0x4000, PAGE),
        (0x9000, PAGE),
    ];
    assert_eq!(merged_runs(&cut), 2);
    assert_eq!(merged_runs(&cut[4..]), 1);
    assert_eq!(merged_runs(&[]), 0);
}
