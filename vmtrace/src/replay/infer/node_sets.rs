//! Which nodes' batches add up to a backlog drop: shared by the early-purge and the
//! across-purge rules, and by the free path that settles held subtractions.

/// Every non-empty set of `nodes` (`(node, batch pages)`) as a bit mask over their indices,
/// with its pages; none when there are too many nodes to try every set.
pub(in crate::replay) fn node_sets(nodes: &[(u32, u64)]) -> impl Iterator<Item = (u32, u64)> + '_ {
    let sets = if nodes.len() > 16 {
        0
    } else {
        1u32 << nodes.len()
    };
    (1u32..sets).map(move |mask| {
        let sum = (0..nodes.len())
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| nodes[i].1)
            .sum();
        (mask, sum)
    })
}

/// The nodes among `(node, batch pages)` whose pages add up to exactly `pages`: the smallest
/// such set (the lowest node ids among equals), or `None` when none does or there are too many
/// nodes to try every set.
pub(in crate::replay) fn nodes_summing_to(nodes: &[(u32, u64)], pages: u64) -> Option<Vec<u32>> {
    node_sets(nodes)
        .filter(|&(_, sum)| sum == pages)
        .map(|(mask, _)| mask)
        .min_by_key(|mask| (mask.count_ones(), *mask))
        .map(|mask| {
            (0..nodes.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| nodes[i].0)
                .collect()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_set_of_nodes_summing_to_the_drop_wins() {
        let nodes = [(0, 5), (1, 3), (2, 2), (3, 8)];
        assert_eq!(node_sets(&nodes).count(), 15, "every non-empty set");
        assert_eq!(
            nodes_summing_to(&nodes, 8),
            Some(vec![3]),
            "one node before two"
        );
        assert_eq!(
            nodes_summing_to(&nodes, 5),
            Some(vec![0]),
            "the lowest ids among equals"
        );
        assert_eq!(nodes_summing_to(&nodes, 18), Some(vec![0, 1, 2, 3]));
        assert_eq!(nodes_summing_to(&nodes, 4), None);
        let many: Vec<(u32, u64)> = (0..17).map(|n| (n, 1)).collect();
        assert_eq!(
            nodes_summing_to(&many, 1),
            None,
            "too many nodes to try every set"
        );
    }
}
