//! The lazy path (`free_vmap_area_noflush`, `__purge_vmap_area_lazy` and `purge_vmap_node` in
//! mm/vmalloc.c): per-node lazy trees, `vmap_lazy_nr`, and the purge arithmetic.

use std::collections::BTreeMap;

/// A lazily freed area waiting for a purge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LazyArea {
    pub size: u64,
    /// Encoded node id (`(id + 1)`, 0 = none), as in `va->flags`.
    pub tag: u32,
    /// Order of the lazy free (0 for seeded areas): the kernel detaches a node's lazy list at
    /// one instant, so the areas a purge takes are the oldest ones; replay needs the order to
    /// leave the frees that came after the detach for the next purge.
    pub seq: u64,
}

/// Lazy trees, one per node (one merging tree in the `global` variant).
#[derive(Clone, Debug)]
pub struct LazyLists {
    trees: Vec<BTreeMap<u64, LazyArea>>,
    /// The pre-node purge tree (`purge_vmap_area_root`, v6.2–v6.8) merged adjacent areas; the
    /// node design's lazy trees do not.
    merging: bool,
    /// `vmap_lazy_nr`, in pages.
    pages: u64,
}

impl LazyLists {
    pub fn new(nodes: u32, merging: bool) -> Self {
        Self {
            trees: vec![BTreeMap::new(); nodes.max(1) as usize],
            merging,
            pages: 0,
        }
    }

    /// `vmap_lazy_nr`.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Objects on all lazy trees.
    pub fn objects(&self) -> usize {
        self.trees.iter().map(BTreeMap::len).sum()
    }

    /// `free_vmap_area_noflush`: adds the area and returns the new backlog in pages.
    pub fn insert(&mut self, node: u32, start: u64, area: LazyArea, page_size: u64) -> u64 {
        let i = (node as usize).min(self.trees.len() - 1);
        self.pages += area.size / page_size.max(1);
        let tree = &mut self.trees[i];
        if !self.merging {
            tree.insert(start, area);
            return self.pages;
        }
        let mut start = start;
        let mut size = area.size;
        let mut seq = area.seq;
        if let Some(next) = tree.remove(&(start + size)) {
            size += next.size;
            seq = seq.max(next.seq);
        }
        if let Some((&ps, &prev)) = tree.range(..start).next_back() {
            if ps + prev.size == start {
                tree.remove(&ps);
                start = ps;
                size += prev.size;
                seq = seq.max(prev.seq);
            }
        }
        tree.insert(start, LazyArea { size, tag: 0, seq });
        self.pages
    }

    /// Takes a node's whole lazy tree (the detach under `lazy.lock`), in address order.
    pub fn detach(&mut self, node: u32) -> BTreeMap<u64, LazyArea> {
        self.trees
            .get_mut(node as usize)
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Detaches only the areas of `node` whose free order is below `cutoff` (replay: the frees
    /// that came after the kernel's detach stay for the next purge), in address order.
    pub fn detach_before(&mut self, node: u32, cutoff: u64) -> BTreeMap<u64, LazyArea> {
        let Some(tree) = self.trees.get_mut(node as usize) else {
            return BTreeMap::new();
        };
        if tree.values().all(|a| a.seq < cutoff) {
            return std::mem::take(tree);
        }
        let (taken, kept): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(tree)
            .into_iter()
            .partition(|(_, a)| a.seq < cutoff);
        *tree = kept;
        taken
    }

    /// Pages of the areas of `node` whose free order is below `cutoff`: what
    /// [`LazyLists::detach_before`] would take.
    pub fn pages_before(&self, node: u32, cutoff: u64, page_size: u64) -> u64 {
        self.trees.get(node as usize).map_or(0, |t| {
            t.values()
                .filter(|a| a.seq < cutoff)
                .map(|a| a.size / page_size.max(1))
                .sum()
        })
    }

    /// `(free order, pages)` of the areas of `node` whose free order is below `cutoff`, in
    /// address order.
    pub fn seqs_before(&self, node: u32, cutoff: u64, page_size: u64) -> Vec<(u64, u64)> {
        self.trees.get(node as usize).map_or_else(Vec::new, |t| {
            t.values()
                .filter(|a| a.seq < cutoff)
                .map(|a| (a.seq, a.size / page_size.max(1)))
                .collect()
        })
    }

    /// Takes one area off `node`'s tree and its pages off the counter (replay: the kernel's
    /// purge took it, see `TrackedModel::swap_purged`).
    pub fn remove(&mut self, node: u32, start: u64, page_size: u64) -> Option<LazyArea> {
        let area = self.trees.get_mut(node as usize)?.remove(&start)?;
        self.pages = self.pages.saturating_sub(area.size / page_size.max(1));
        Some(area)
    }

    /// `purge_vmap_node` step 3: the purged pages leave the counter.
    pub fn subtract(&mut self, pages: u64) {
        self.pages = self.pages.saturating_sub(pages);
    }

    /// Every lazy area as `(node, start, area)`.
    pub fn iter(&self) -> impl Iterator<Item = (u32, u64, LazyArea)> + '_ {
        self.trees
            .iter()
            .enumerate()
            .flat_map(|(n, t)| t.iter().map(move |(&s, &a)| (n as u32, s, a)))
    }

    pub fn nodes(&self) -> u32 {
        self.trees.len() as u32
    }

    /// Whether any lazy area overlaps `[start, end)`. Areas on one tree are disjoint and sorted,
    /// so only the last one starting below `end` can reach `start`: one lookup per tree instead
    /// of a walk of the whole backlog, which replay would otherwise pay on every allocation
    /// while a drain is pending.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.trees.iter().any(|t| {
            t.range(..end)
                .next_back()
                .is_some_and(|(&s, a)| s.saturating_add(a.size) > start)
        })
    }

    /// The lazy area starting at `addr`, if any.
    pub fn find(&self, addr: u64) -> Option<(u32, LazyArea)> {
        self.trees
            .iter()
            .enumerate()
            .find_map(|(n, t)| t.get(&addr).map(|a| (n as u32, *a)))
    }
}

/// `__purge_vmap_area_lazy`'s helper count: `clamp(backlog / lazy_max, 1, nodes with work) - 1`,
/// with the backlog read after the detach and before any decrement.
pub fn purge_helpers(lazy_pages: u64, lazy_max_pages: u64, nodes_with_work: u32) -> u32 {
    if nodes_with_work == 0 {
        return 0;
    }
    let ratio = lazy_pages / lazy_max_pages.max(1);
    (ratio.clamp(1, u64::from(nodes_with_work)) - 1) as u32
}

/// `lazy_max_pages()`: `fls(online CPUs) * 32 MiB / PAGE_SIZE`.
pub fn lazy_max_pages(online_cpus: u32, page_size: u64) -> u64 {
    let fls = u64::from(32 - online_cpus.leading_zeros());
    fls * ((32 << 20) / page_size.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_and_threshold() {
        assert_eq!(purge_helpers(16385, 16384, 2), 0);
        assert_eq!(purge_helpers(32768, 16384, 2), 1);
        assert_eq!(purge_helpers(99999, 16384, 2), 1);
        assert_eq!(purge_helpers(10, 16384, 1), 0);
        assert_eq!(purge_helpers(10, 16384, 0), 0);
        assert_eq!(lazy_max_pages(2, 4096), 16384);
        assert_eq!(lazy_max_pages(1, 4096), 8192);
        assert_eq!(lazy_max_pages(8, 4096), 32768);
    }

    #[test]
    fn merging_tree() {
        let mut l = LazyLists::new(1, true);
        l.insert(
            0,
            0x1000,
            LazyArea {
                size: 0x1000,
                tag: 0,
                seq: 0,
            },
            4096,
        );
        l.insert(
            0,
            0x3000,
            LazyArea {
                size: 0x1000,
                tag: 0,
                seq: 0,
            },
            4096,
        );
        l.insert(
            0,
            0x2000,
            LazyArea {
                size: 0x1000,
                tag: 0,
                seq: 0,
            },
            4096,
        );
        assert_eq!(l.objects(), 1);
        assert_eq!(l.pages(), 3);
    }

    proptest::proptest! {
        /// The per-tree lookup agrees with a scan of every lazy area.
        #[test]
        fn overlaps_matches_a_scan(
            areas in proptest::collection::vec((0u64..8, 1u64..6, 0u32..3), 0..40),
            start in 0u64..400,
            len in 0u64..20,
        ) {
            let mut l = LazyLists::new(3, false);
            let mut at = 0;
            for (gap, pages, node) in areas {
                at += gap;
                let area = LazyArea { size: pages, tag: 0, seq: 0 };
                l.insert(node, at, area, 1);
                at += pages;
            }
            let end = start + len;
            let scan = l.iter().any(|(_, s, a)| s < end && start < s + a.size);
            proptest::prop_assert_eq!(l.overlaps(start, end), scan);
        }
    }
}
