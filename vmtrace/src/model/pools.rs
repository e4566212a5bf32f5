//! Size-segregated pools per node (`node_alloc`, `node_pool_del_va`, `node_pool_add_va` and
//! `decay_va_pool_node` in mm/vmalloc.c): `vn->pool[256]`, LIFO lists of whole areas.

use std::collections::VecDeque;

use super::pagetable::AddrSet;

/// `MAX_VA_SIZE_PAGES`: pools hold areas of 1 to 256 pages, guard included.
pub const MAX_VA_SIZE_PAGES: u64 = 256;

/// What `node_pool_del_va` did with the head of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolLookup {
    /// The pool was empty (checked without the lock; nothing locked).
    Empty,
    /// The head was aligned and was taken.
    Hit(u64),
    /// The head was misaligned and moved to the tail: a miss that took the pool lock.
    Rotated,
}

/// `size_to_va_pool`: the pool index for an area of `size` bytes, if it is small enough.
#[inline]
pub fn pool_index(size: u64, page_size: u64) -> Option<usize> {
    if size == 0 || page_size == 0 {
        return None;
    }
    let idx = (size - 1) / page_size;
    (idx < MAX_VA_SIZE_PAGES).then_some(idx as usize)
}

#[derive(Clone, Debug)]
pub struct Pools {
    /// `node * 256 + index` -> area starts, head first. Each pool's areas all have the pool's size.
    lists: Vec<VecDeque<u64>>,
    /// Every pooled start, once [`Pools::index_members`] turned it on: observed-timing replay's
    /// resynchronisation asks whether an area is pooled for each candidate of a swap, and a
    /// scan of lists thousands long per candidate took a test_vmalloc recording's replay from
    /// 25-34 s to 78-80 s. Free-running replay and the what-if never ask, and keep the hash
    /// off their per-event path (a fifth of the model core's time on a fix-size trace).
    members: Option<AddrSet>,
    page_size: u64,
    objects: u64,
}

impl Pools {
    pub fn new(nodes: u32, page_size: u64) -> Self {
        Self {
            lists: vec![VecDeque::new(); nodes as usize * MAX_VA_SIZE_PAGES as usize],
            members: None,
            page_size,
            objects: 0,
        }
    }

    #[inline]
    fn slot(&self, node: u32, size: u64) -> Option<usize> {
        let idx = pool_index(size, self.page_size)?;
        let i = node as usize * MAX_VA_SIZE_PAGES as usize + idx;
        (i < self.lists.len()).then_some(i)
    }

    /// Total pooled objects over every node (what the shrinker counts).
    pub fn objects(&self) -> u64 {
        self.objects
    }

    /// Keeps an index of the pooled starts from here on (`on`), so that [`Pools::remove`] and
    /// [`Pools::replace`] answer "not pooled" without scanning, or drops it.
    pub fn index_members(&mut self, on: bool) {
        match (on, self.members.is_some()) {
            (true, false) => self.members = Some(self.lists.iter().flatten().copied().collect()),
            (false, true) => self.members = None,
            _ => {}
        }
    }

    /// False when the index says `addr` is in no pool; true without an index.
    fn may_hold(&self, addr: u64) -> bool {
        self.members.as_ref().is_none_or(|m| m.contains(&addr))
    }

    /// `vp->len` of `node`'s pool for `size`.
    pub fn len(&self, node: u32, size: u64) -> usize {
        self.slot(node, size).map_or(0, |i| self.lists[i].len())
    }

    /// The head of `node`'s pool for `size`.
    pub fn head(&self, node: u32, size: u64) -> Option<u64> {
        self.slot(node, size)
            .and_then(|i| self.lists[i].front().copied())
    }

    /// The entries of `node`'s pool for `size`, head first.
    pub fn entries(&self, node: u32, size: u64) -> impl Iterator<Item = u64> + '_ {
        self.slot(node, size)
            .into_iter()
            .flat_map(move |i| self.lists[i].iter().copied())
    }

    /// `node_pool_del_va`: looks only at the head; takes it if aligned, else rotates it.
    pub fn take_head(&mut self, node: u32, size: u64, align: u64) -> PoolLookup {
        let Some(i) = self.slot(node, size) else {
            return PoolLookup::Empty;
        };
        let list = &mut self.lists[i];
        let Some(&head) = list.front() else {
            return PoolLookup::Empty;
        };
        if align <= 1 || head % align == 0 {
            list.pop_front();
            if let Some(m) = self.members.as_mut() {
                m.remove(&head);
            }
            self.objects -= 1;
            PoolLookup::Hit(head)
        } else {
            list.rotate_left(1);
            PoolLookup::Rotated
        }
    }

    /// `node_pool_add_va`: pushes on the head. False when `size` has no pool.
    pub fn push_head(&mut self, node: u32, addr: u64, size: u64) -> bool {
        match self.slot(node, size) {
            Some(i) => {
                self.lists[i].push_front(addr);
                if let Some(m) = self.members.as_mut() {
                    let fresh = m.insert(addr);
                    debug_assert!(fresh, "{addr:#x} pooled twice");
                }
                self.objects += 1;
                true
            }
            None => false,
        }
    }

    /// Removes `addr` wherever it is pooled (replay resynchronisation); returns its node.
    pub fn remove(&mut self, addr: u64, size: u64, prefer_node: u32) -> Option<u32> {
        if !self.may_hold(addr) {
            return None;
        }
        let idx = pool_index(size, self.page_size)?;
        let nodes = (self.lists.len() / MAX_VA_SIZE_PAGES as usize) as u32;
        let order = std::iter::once(prefer_node).chain((0..nodes).filter(|&n| n != prefer_node));
        for node in order {
            let i = node as usize * MAX_VA_SIZE_PAGES as usize + idx;
            let Some(list) = self.lists.get_mut(i) else {
                continue;
            };
            if let Some(pos) = list.iter().position(|&a| a == addr) {
                list.remove(pos);
                if let Some(m) = self.members.as_mut() {
                    m.remove(&addr);
                }
                self.objects -= 1;
                return Some(node);
            }
        }
        None
    }

    /// Puts `new` where `old` is in a pool of `size` (any node), keeping the list's order.
    /// Returns the node, or `None` when `old` is in no such pool.
    pub fn replace(&mut self, old: u64, new: u64, size: u64) -> Option<u32> {
        if !self.may_hold(old) {
            return None;
        }
        let idx = pool_index(size, self.page_size)?;
        let nodes = (self.lists.len() / MAX_VA_SIZE_PAGES as usize) as u32;
        for node in 0..nodes {
            let i = node as usize * MAX_VA_SIZE_PAGES as usize + idx;
            if let Some(slot) = self.lists[i].iter_mut().find(|a| **a == old) {
                *slot = new;
                if let Some(m) = self.members.as_mut() {
                    m.remove(&old);
                    m.insert(new);
                }
                return Some(node);
            }
        }
        None
    }

    /// `decay_va_pool_node`: takes [`decay_count`] areas from the head of each of
    /// `node`'s non-empty pools and appends `(start, size)` to `out`. Returns the `pool_lock`
    /// sections it took ([`decay_sections`] per non-empty pool).
    pub fn decay(
        &mut self,
        node: u32,
        full: bool,
        rule: DecayRule,
        out: &mut Vec<(u64, u64)>,
    ) -> u32 {
        let base = node as usize * MAX_VA_SIZE_PAGES as usize;
        let mut sections = 0;
        for idx in 0..MAX_VA_SIZE_PAGES as usize {
            let Some(list) = self.lists.get_mut(base + idx) else {
                break;
            };
            if list.is_empty() {
                continue;
            }
            let n = decay_count(list.len(), full, rule);
            sections += decay_sections(list.len(), n);
            let size = (idx as u64 + 1) * self.page_size;
            for a in list.drain(..n) {
                if let Some(m) = self.members.as_mut() {
                    m.remove(&a);
                }
                out.push((a, size));
            }
            self.objects -= n as u64;
        }
        sections
    }

    /// Every pooled area as `(node, start, size)`.
    pub fn iter(&self) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        let per = MAX_VA_SIZE_PAGES as usize;
        self.lists.iter().enumerate().flat_map(move |(i, l)| {
            let node = (i / per) as u32;
            let size = ((i % per) as u64 + 1) * self.page_size;
            l.iter().map(move |&a| (node, a, size))
        })
    }
}

/// How `decay_va_pool_node` sizes a partial decay. The rule changed in v6.16, and a 6.12
/// guest's recording shows the older one (docs/model.md, "Decay before v6.16").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecayRule {
    /// v6.16 and later: `len >> 2` from the head, so pools of 1–3 keep everything.
    #[default]
    Quarter,
    /// v6.9–v6.15: the loop takes an area before it tests `--n_decay`, which wraps from 0 when
    /// `len >> 2` is 0, so pools of 1–3 are emptied; longer pools lose `len >> 2`.
    QuarterEmptyingShort,
}

impl DecayRule {
    /// The rule of the kernel whose `uname -r` is `release`; a release that does not parse
    /// gets the current rule.
    pub fn for_release(release: &str) -> Self {
        let mut parts = release
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<u32>().unwrap_or(0));
        match (parts.next(), parts.next()) {
            (Some(major), Some(minor)) if (major, minor) < (6, 16) => {
                DecayRule::QuarterEmptyingShort
            }
            _ => DecayRule::Quarter,
        }
    }
}

/// Areas a decay takes from a pool of `len`: 25 % rounded down (all of a pool of 1–3 under
/// the pre-6.16 rule), or all of them on the allocation-failure path.
#[inline]
/// `pool_lock` sections the decay of one non-empty pool of `len` takes when it cuts `cut`: one
/// to detach the list, and one to attach back what is left, which `decay_va_pool_node` skips
/// when the cut took everything (`if (!list_empty(&tmp_list))`).
pub fn decay_sections(len: usize, cut: usize) -> u32 {
    if cut >= len {
        1
    } else {
        2
    }
}

pub fn decay_count(len: usize, full: bool, rule: DecayRule) -> usize {
    let short_emptied = rule == DecayRule::QuarterEmptyingShort && len < 4;
    if full || short_emptied {
        len
    } else {
        len >> 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The timed holds of a 6.12 guest showed the model taking the pool lock about 8,000 times
    /// more than the kernel on a random-size recording (docs/testbox.md): a pool the decay
    /// empties is not attached back, so it costs one section, not two.
    #[test]
    fn a_pool_the_decay_empties_costs_one_section() {
        for rule in [DecayRule::Quarter, DecayRule::QuarterEmptyingShort] {
            let mut p = Pools::new(1, 4096);
            // Pools of 1 and 8 one-page areas, and 2 areas of 2 pages.
            p.push_head(0, 0x1000, 4096);
            for i in 0..8u64 {
                p.push_head(0, 0x10000 + i * 0x1000, 4096 * 2);
            }
            for i in 0..2u64 {
                p.push_head(0, 0x40000 + i * 0x3000, 4096 * 3);
            }
            let mut out = Vec::new();
            let sections = p.decay(0, false, rule, &mut out);
            // The pool of 8 keeps 6: detach and attach back. The short ones keep everything
            // under `Quarter` (two each), and lose everything under the older rule (one each).
            let expected = match rule {
                DecayRule::Quarter => 2 + 2 + 2,
                DecayRule::QuarterEmptyingShort => 1 + 2 + 1,
            };
            assert_eq!(sections, expected, "{rule:?}");
            // A full decay empties every pool left: one section each.
            let left = match rule {
                DecayRule::Quarter => 3,
                DecayRule::QuarterEmptyingShort => 1,
            };
            let mut out = Vec::new();
            assert_eq!(p.decay(0, true, rule, &mut out), left, "{rule:?}");
        }
    }

    #[test]
    fn head_only_and_rotation() {
        let mut p = Pools::new(2, 4096);
        assert_eq!(pool_index(4096, 4096), Some(0));
        assert_eq!(pool_index(256 * 4096, 4096), Some(255));
        assert_eq!(pool_index(257 * 4096, 4096), None);
        p.push_head(1, 0x10000, 8192);
        p.push_head(1, 0x13000, 8192);
        // Head 0x13000 is not 16 KiB aligned: rotated to the tail.
        assert_eq!(p.take_head(1, 8192, 0x4000), PoolLookup::Rotated);
        assert_eq!(p.head(1, 8192), Some(0x10000));
        assert_eq!(p.take_head(1, 8192, 0x4000), PoolLookup::Hit(0x10000));
        assert_eq!(p.take_head(0, 8192, 1), PoolLookup::Empty);
        assert_eq!(p.objects(), 1);
        let q = DecayRule::Quarter;
        assert_eq!(decay_count(3, false, q), 0);
        assert_eq!(decay_count(7, false, q), 1);
        assert_eq!(decay_count(8, false, q), 2);
        assert_eq!(decay_count(3, true, q), 3);
        let old = DecayRule::QuarterEmptyingShort;
        assert_eq!(decay_count(1, false, old), 1);
        assert_eq!(decay_count(3, false, old), 3);
        assert_eq!(decay_count(4, false, old), 1);
        assert_eq!(decay_count(8, false, old), 2);
    }

    /// The member index changes no answer: the same operations on pools with and without it
    /// (turned on midway, with entries already pooled) give the same results and the same
    /// lists, and the index holds exactly the pooled starts afterwards.
    #[test]
    fn the_member_index_changes_no_answer() {
        let (mut plain, mut indexed) = (Pools::new(2, 4096), Pools::new(2, 4096));
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        // Eight distinct starts per size class, so that every address is pooled at most once.
        let mut free: Vec<(u64, u64)> = (0..3u64)
            .flat_map(|k| {
                (0..8u64).map(move |i| (0x10_0000 * (k + 1) + i * 0x1_0000, (k + 1) * 4096))
            })
            .collect();
        for step in 0..4000 {
            if step == 500 {
                indexed.index_members(true);
            }
            let size = (next(3) + 1) * 4096;
            let node = next(2) as u32;
            match next(5) {
                0 | 1 => {
                    if let Some(i) = free.iter().position(|&(_, z)| z == size) {
                        let (a, z) = free.swap_remove(i);
                        assert_eq!(plain.push_head(node, a, z), indexed.push_head(node, a, z));
                    }
                }
                2 => {
                    let (p, q) = (
                        plain.take_head(node, size, 1),
                        indexed.take_head(node, size, 1),
                    );
                    assert_eq!(p, q);
                    if let PoolLookup::Hit(a) = p {
                        free.push((a, size));
                    }
                }
                3 => {
                    let a = 0x10_0000 * (size / 4096) + next(8) * 0x1_0000;
                    let (p, q) = (plain.remove(a, size, node), indexed.remove(a, size, node));
                    assert_eq!(p, q, "remove {a:#x} at step {step}");
                    if p.is_some() {
                        free.push((a, size));
                    }
                }
                _ => {
                    let (mut p, mut q) = (Vec::new(), Vec::new());
                    let rule = DecayRule::QuarterEmptyingShort;
                    assert_eq!(
                        plain.decay(node, false, rule, &mut p),
                        indexed.decay(node, false, rule, &mut q)
                    );
                    assert_eq!(p, q);
                    free.extend(p);
                }
            }
        }
        let pooled: Vec<_> = plain.iter().collect();
        assert_eq!(pooled, indexed.iter().collect::<Vec<_>>());
        assert!(!pooled.is_empty());
        let mut index: Vec<u64> = indexed.members.clone().expect("on").into_iter().collect();
        let mut starts: Vec<u64> = pooled.iter().map(|&(_, a, _)| a).collect();
        index.sort_unstable();
        starts.sort_unstable();
        assert_eq!(index, starts);
    }

    #[test]
    fn the_decay_rule_follows_the_release() {
        assert_eq!(
            DecayRule::for_release("6.12.117+deb13-amd64"),
            DecayRule::QuarterEmptyingShort
        );
        assert_eq!(
            DecayRule::for_release("6.15.0"),
            DecayRule::QuarterEmptyingShort
        );
        assert_eq!(DecayRule::for_release("6.16.1"), DecayRule::Quarter);
        assert_eq!(
            DecayRule::for_release("6.18.44-fc-v1045"),
            DecayRule::Quarter
        );
        assert_eq!(DecayRule::for_release("7.0"), DecayRule::Quarter);
        assert_eq!(DecayRule::for_release("odd"), DecayRule::Quarter);
    }
}
