//! The trace state replay keeps beside the model: hidden ranges, held subtractions, untracked
//! frees, and the detach-race moves that must take hidden ranges back.

use super::*;
use crate::model::tests::{one_page_req, params, PAGE};
use crate::model::{Params, Variant};

impl TrackedModel {
    /// A whole purge: every lazy area, as the drain work's.
    fn purge(&mut self, full: bool) -> Purged {
        self.purge_oldest(full, usize::MAX)
    }
}

/// `n` one-page areas allocated on CPU 0, lowest first.
fn one_page_areas(m: &mut TrackedModel, p: &Params, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| m.alloc(&one_page_req(0, p)).unwrap().unwrap().addr)
        .collect()
}

/// `n` one-page areas allocated, freed and purged into node 0's pool.
fn pooled_one_page_areas(m: &mut TrackedModel, p: &Params, n: usize) -> Vec<u64> {
    let addrs = one_page_areas(m, p, n);
    for &a in &addrs {
        m.free(a).unwrap();
    }
    m.purge(false);
    addrs
}

/// Hidden space (what replay found unavailable in the kernel) is skipped by the lowest fit,
/// counted in the coverage invariant, and comes back on `unhide` or a full decay.
#[test]
fn hidden_ranges_are_skipped_and_come_back() {
    let p = params(Variant::Nodes);
    let base = p.vmalloc_start;
    let mut m = TrackedModel::new(Model::new(p.clone()).unwrap());
    assert!(m.hide(base, 2 * PAGE, 0));
    m.check_invariants().unwrap();
    let a = m.alloc(&one_page_req(0, &p)).unwrap().unwrap();
    assert_eq!(a.addr, base + 2 * PAGE, "the hidden pages are not offered");
    assert!(
        !m.hide(base + 2 * PAGE, PAGE, 0),
        "a busy page cannot be hidden"
    );
    assert!(m.unhide(base + PAGE, PAGE));
    assert!(m.hidden().is_empty());
    let b = m.alloc(&one_page_req(0, &p)).unwrap().unwrap();
    assert_eq!(b.addr, base, "unhidden space is free again");
    assert!(m.hide(base + PAGE, PAGE, 0));
    m.purge(true);
    assert!(
        m.hidden().is_empty(),
        "a full decay empties the pools hidden space sits in"
    );
    m.check_invariants().unwrap();
}

/// A range the kernel keeps showing unavailable after every purge gives it back stays hidden
/// once `STICKY_AFTER` purges have; using it, or a full decay, still frees it.
#[test]
fn a_range_hidden_after_every_purge_stays_hidden() {
    let p = params(Variant::Nodes);
    let base = p.vmalloc_start;
    let mut m = TrackedModel::new(Model::new(p.clone()).unwrap());
    for _ in 0..STICKY_AFTER {
        assert!(m.hide(base, PAGE, 0));
        m.unhide_after_purge();
        assert!(m.hidden().is_empty(), "given back before it sticks");
    }
    assert!(m.hide(base, PAGE, 0));
    m.unhide_after_purge();
    assert_eq!(m.hidden().len(), 1, "sticky now");
    m.check_invariants().unwrap();
    assert!(m.hide(base + PAGE, PAGE, 0));
    m.unhide_after_purge();
    assert_eq!(m.hidden().len(), 1, "another range is given back as before");
    assert!(m.unhide(base, PAGE), "the kernel used it");
    assert!(m.hidden().is_empty());
    m.check_invariants().unwrap();
}

/// `decay_overlapping` returns only the pool entries inside the range to the free tree; the
/// rest of the pools stay as they were (replay's answer to a kernel allocation inside a range
/// the model held pooled).
#[test]
fn decay_overlapping_frees_only_the_entries_in_the_range() {
    let p = params(Variant::Nodes);
    let mut m = TrackedModel::new(Model::new(p.clone()).unwrap());
    let addrs = pooled_one_page_areas(&mut m, &p, 4);
    assert_eq!(m.pools().objects(), 4);
    let (first, second) = (addrs[0], addrs[1]);
    assert_eq!(m.decay_overlapping(first, PAGE), 1);
    assert_eq!(m.pools().objects(), 3);
    assert!(m.free_space().block_containing(first).is_some());
    assert!(m.pools().iter().any(|(_, s, _)| s == second));
    assert_eq!(
        m.decay_overlapping(first, PAGE),
        0,
        "nothing pooled there now"
    );
    m.check_invariants().unwrap();
}

/// Hidden pool entries put back with `restore_pooled` come back in their order (the first at
/// the head), and only those that were hidden with that size.
#[test]
fn restore_pooled_puts_hidden_entries_back_in_order() {
    let p = params(Variant::Nodes);
    let mut m = TrackedModel::new(Model::new(p.clone()).unwrap());
    pooled_one_page_areas(&mut m, &p, 3);
    let order: Vec<u64> = m.pools().iter().map(|(_, s, _)| s).collect();
    assert_eq!(order.len(), 3);
    for &a in &order {
        assert!(m.hide(a, PAGE, 0));
    }
    assert_eq!(m.pools().objects(), 0);
    assert_eq!(m.restore_pooled(0, PAGE, &order[1..]), 2);
    let back: Vec<u64> = m.pools().iter().map(|(_, s, _)| s).collect();
    assert_eq!(back, order[1..].to_vec());
    assert_eq!(
        m.restore_pooled(0, 2 * PAGE, &order[..1]),
        0,
        "hidden with another size"
    );
    assert_eq!(m.hidden().len(), 1);
    m.check_invariants().unwrap();
}

/// `purge_late_oldest` purges the oldest lazy areas without decaying the pools.
#[test]
fn purge_late_oldest_takes_the_oldest_and_decays_nothing() {
    let p = params(Variant::Nodes);
    let mut m = TrackedModel::new(Model::new(p.clone()).unwrap());
    let addrs = one_page_areas(&mut m, &p, 8);
    for &a in &addrs[..4] {
        m.free(a).unwrap();
    }
    m.purge(false);
    assert_eq!(m.pools().objects(), 4);
    for &a in &addrs[4..] {
        m.free(a).unwrap();
    }
    let late = m.purge_late_oldest(3);
    assert_eq!((late.npurged, late.batch.len(), late.decayed), (3, 3, 0));
    assert_eq!(m.pools().objects(), 7, "nothing decayed, three pooled");
    assert_eq!(m.lazy().objects(), 1);
    assert!(m.lazy().find(addrs[7]).is_some(), "the newest stays lazy");
    assert_eq!(m.lazy_pages(), 1);
    m.check_invariants().unwrap();
}

/// With the subtraction deferred, a purged node's areas are pooled at once but its pages stay
/// in the backlog the next free reports until they are settled.
#[test]
fn deferred_subtractions_stay_in_the_backlog_until_settled() {
    let p = params(Variant::Nodes);
    let mut m = TrackedModel::new(Model::new(p.clone()).unwrap());
    let addrs = one_page_areas(&mut m, &p, 4);
    for &a in &addrs[..3] {
        m.free(a).unwrap();
    }
    assert_eq!(m.lazy_pages(), 3);
    m.defer_subtraction(true);
    let got = m.purge(false);
    m.defer_subtraction(false);
    assert_eq!(got.pooled, 3);
    assert_eq!(m.unsubtracted(), &[(0, 3)]);
    assert_eq!(m.lazy_pages(), 3, "still counted");
    assert_eq!(m.free(addrs[3]).unwrap().nr_lazy, 4);
    m.settle_subtractions(Some(&[1]));
    assert_eq!(m.lazy_pages(), 4, "node 1 held nothing");
    m.settle_subtractions(Some(&[0]));
    assert_eq!(m.lazy_pages(), 1);
    m.check_invariants().unwrap();
}

/// A lazy free of an area the model holds nothing for still counts in the backlog the next
/// free reports, can schedule the drain, and leaves with the next purge.
#[test]
fn untracked_lazy_frees_count_until_the_next_purge() {
    let p = params(Variant::Nodes);
    let mut m = TrackedModel::new(Model::new(p.clone()).unwrap());
    let addrs = one_page_areas(&mut m, &p, 2);
    m.free(addrs[0]).unwrap();
    assert_eq!(m.free_untracked(10 * PAGE), (11, false));
    assert_eq!(
        m.free(addrs[1]).unwrap().nr_lazy,
        12,
        "the next free reports them"
    );
    let (nr_lazy, drain) = m.free_untracked(p.lazy_max_pages * PAGE);
    assert_eq!(nr_lazy, 12 + p.lazy_max_pages);
    assert!(drain, "past lazy_max_pages");
    let got = m.purge(false);
    assert_eq!(got.npurged, 2, "only the tracked areas are in the batch");
    assert_eq!(m.lazy_pages(), 0);
    m.check_invariants().unwrap();
}

/// `swap_purged` trades a lazy area the kernel's purge took for one the model's purge took:
/// the lazy set changes, the backlog and the counts do not, and the traded area can then be
/// claimed where the kernel put it.
#[test]
fn swap_purged_trades_lazy_for_purged() {
    let p = params(Variant::Nodes);
    let mut m = TrackedModel::new(Model::new(p.clone()).unwrap());
    let addrs = one_page_areas(&mut m, &p, 3);
    m.free(addrs[0]).unwrap();
    m.free(addrs[1]).unwrap();
    m.free(addrs[2]).unwrap();
    let got = m.purge_oldest(false, 2);
    assert!(m.lazy().find(addrs[2]).is_some(), "the newest free waits");
    let (pages, objects) = (m.lazy_pages(), m.lazy().objects());
    let newest_purged = *got.batch.iter().max_by_key(|a| a.area.seq).unwrap();
    assert_eq!(newest_purged.addr, addrs[1]);
    assert!(
        !m.swap_purged(addrs[0] + 7 * PAGE, &newest_purged),
        "not a lazy area"
    );
    assert!(m.swap_purged(addrs[2], &newest_purged));
    assert!(m.lazy().find(addrs[2]).is_none());
    assert!(
        m.lazy().find(addrs[1]).is_some(),
        "the model's pick is lazy again"
    );
    assert_eq!((m.lazy_pages(), m.lazy().objects()), (pages, objects));
    m.check_invariants().unwrap();
    assert!(
        !m.swap_purged(addrs[1], &newest_purged),
        "the purged area is lazy now, not pooled or free"
    );
    let pooled_before: Vec<u64> = m.pools().iter().map(|(_, s, _)| s).collect();
    assert!(
        pooled_before.contains(&addrs[2]),
        "the kernel's pick takes the pooled area's place: {pooled_before:x?}"
    );
    assert!(!pooled_before.contains(&addrs[1]));
    assert_eq!(
        m.claim(&one_page_req(0, &p), addrs[2]).unwrap(),
        Placement::Pool,
        "so taking it is a pool hit"
    );
    m.check_invariants().unwrap();
}

/// The area the model's purge took may have been hidden since (replay saw the kernel pass it
/// over, as it would an area still lazy there): `swap_purged` still trades it back from
/// hiding, and the lazy area the kernel reused becomes free to claim. Without it the reused
/// area stayed outside the model and its next free went missing from the backlog.
#[test]
fn swap_purged_takes_a_hidden_area_back() {
    let p = params(Variant::Nodes);
    let mut m = TrackedModel::new(Model::new(p.clone()).unwrap());
    let addrs = one_page_areas(&mut m, &p, 3);
    for &a in &addrs {
        m.free(a).unwrap();
    }
    let got = m.purge_oldest(false, 2);
    let newest_purged = *got.batch.iter().max_by_key(|a| a.area.seq).unwrap();
    assert!(m.hide(newest_purged.addr, PAGE, newest_purged.node));
    let (pages, objects) = (m.lazy_pages(), m.lazy().objects());
    assert!(m.swap_purged(addrs[2], &newest_purged));
    assert!(m.hidden().is_empty(), "out of hiding");
    assert!(m.lazy().find(newest_purged.addr).is_some());
    assert_eq!((m.lazy_pages(), m.lazy().objects()), (pages, objects));
    m.check_invariants().unwrap();
    assert!(m.claim(&one_page_req(0, &p), addrs[2]).is_ok());
    m.check_invariants().unwrap();
}

/// `swap_purged_sized` trades areas of different sizes: the purged one comes back lazy, the
/// lazy one is purged into its own pool, and the backlog changes by the size difference.
#[test]
fn swap_purged_sized_trades_areas_of_different_sizes() {
    let p = params(Variant::Nodes);
    let mut m = TrackedModel::new(Model::new(p.clone()).unwrap());
    let req = |pages: u64| AllocRequest {
        size: pages * PAGE,
        ..one_page_req(0, &p)
    };
    let small = m.alloc(&req(1)).unwrap().unwrap().addr;
    let big = m.alloc(&req(3)).unwrap().unwrap().addr;
    m.free(small).unwrap();
    m.free(big).unwrap();
    let got = m.purge_oldest(false, 1);
    assert_eq!(got.batch.len(), 1);
    assert_eq!(m.lazy_pages(), 3, "the big one waits");
    assert!(m.swap_purged_sized(big, &got.batch[0]));
    assert_eq!(m.lazy_pages(), 1, "now the small one does");
    assert!(m.lazy().find(small).is_some());
    assert!(m.pools().iter().any(|(_, s, z)| s == big && z == 3 * PAGE));
    m.check_invariants().unwrap();
    assert!(
        !m.swap_purged_sized(big, &got.batch[0]),
        "big is not lazy any more"
    );
}

/// A withheld pool entry is neither pooled nor free until `restore_pooled` puts it back at the
/// head; the invariants hold throughout.
#[test]
fn withheld_pool_entries_come_back_at_the_head() {
    let p = params(Variant::Nodes);
    let mut m = TrackedModel::new(Model::new(p.clone()).unwrap());
    let addrs = pooled_one_page_areas(&mut m, &p, 3);
    assert_eq!(m.pools().head(0, PAGE), Some(addrs[2]));
    assert!(m.withhold_pooled(addrs[2], PAGE, 0));
    assert!(m.withhold_pooled(addrs[1], PAGE, 0));
    assert!(!m.withhold_pooled(addrs[1], PAGE, 0), "not pooled any more");
    m.check_invariants().unwrap();
    assert_eq!(m.pools().head(0, PAGE), Some(addrs[0]));
    assert_eq!(m.restore_pooled(0, PAGE, &[addrs[1]]), 1);
    assert_eq!(m.pools().head(0, PAGE), Some(addrs[1]));
    assert_eq!(m.restore_pooled(0, PAGE, &[addrs[2]]), 1);
    assert_eq!(m.pools().head(0, PAGE), Some(addrs[2]));
    assert!(m.hidden().is_empty());
    m.check_invariants().unwrap();
}
