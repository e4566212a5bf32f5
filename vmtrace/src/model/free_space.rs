//! The global free space: `free_vmap_area_root` and its list (`find_vmap_lowest_match`,
//! `va_clip` and `merge_or_add_vmap_area` in mm/vmalloc.c).
//!
//! Blocks are kept in a `BTreeMap` keyed by start (the address-sorted list, for merging) and, in
//! parallel, in one `BTreeMap` per power-of-two size class. The size classes stand in for the
//! kernel's `subtree_max_size` augmentation: to find the lowest block that can hold a request we
//! take the lowest block of every class whose members all fit (one lookup each) and scan only the
//! one or two classes whose members may or may not fit, and only below the best candidate found.
//!
//! For `align <= PAGE_SIZE` the result is exactly the kernel's: `find_vmap_lowest_match` returns the
//! lowest-addressed block that passes `is_within_this_va`, whatever the tree's shape. For larger
//! alignments the kernel descends by `size + align - 1` (`adjust_search_size`) but accepts a
//! visited block on the exact aligned test, so its answer depends on the rb-tree's shape: it is
//! never above the lowest block of that length, and below it only a shorter block that happens
//! to sit on the search path. This module returns the lowest block of that length (the lowest
//! aligned fit when there is none), which is the kernel's answer unless such a path block
//! exists. `docs/model.md` gives the measured deviation.

use std::collections::BTreeMap;

use super::ModelError;

/// `enum fit_type` of `mm/vmalloc.c`, without `NOTHING_FIT`, which [`FreeSpace`] never produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum FitType {
    /// The block is used up entirely.
    Fl,
    /// The allocation starts at the block's start.
    Le,
    /// The allocation ends at the block's end.
    Re,
    /// The allocation lies strictly inside: the block splits in two (one preload object used).
    Ne,
}

/// Why the lowest-fit search failed; the kernel's `alloc_vmap_area` trace shows these as errnos.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FitFailure {
    /// `-ENOENT`: no free block can hold the request.
    NoBlock,
    /// `-ERANGE`: the lowest fitting block ends the allocation beyond `vend`.
    BeyondEnd,
}

/// Number of size classes: one per bit of a `u64` length.
const CLASSES: usize = 64;

#[derive(Clone, Debug)]
pub struct FreeSpace {
    /// start -> end (exclusive) of every free block.
    blocks: BTreeMap<u64, u64>,
    /// The same blocks split by `floor(log2(len))`.
    classes: Vec<BTreeMap<u64, u64>>,
    /// Bit `c` set when class `c` has members: the searches skip empty classes without a
    /// lookup (most of the 64 are empty, and a lookup per class per allocation was the
    /// largest single cost of free-running replay).
    nonempty: u64,
    free_bytes: u64,
}

#[inline]
fn class_of(len: u64) -> usize {
    63 - len.leading_zeros() as usize
}

#[inline]
fn align_up(v: u64, align: u64) -> Option<u64> {
    // `align` is a power of two (checked by the caller).
    v.checked_add(align - 1).map(|x| x & !(align - 1))
}

/// `is_within_this_va`: the aligned start inside `[start, end)`, if the request fits there.
#[inline]
fn fit_in(start: u64, end: u64, size: u64, align: u64, vstart: u64) -> Option<u64> {
    let nva = if start > vstart {
        align_up(start, align)?
    } else {
        align_up(vstart, align)?
    };
    if nva < vstart {
        return None;
    }
    let last = nva.checked_add(size)?;
    (last <= end).then_some(nva)
}

impl Default for FreeSpace {
    fn default() -> Self {
        Self::new()
    }
}

impl FreeSpace {
    pub fn new() -> Self {
        Self {
            blocks: BTreeMap::new(),
            classes: vec![BTreeMap::new(); CLASSES],
            nonempty: 0,
            free_bytes: 0,
        }
    }

    /// Total free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Number of free blocks (objects in the kernel's free tree).
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Free blocks in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.blocks.iter().map(|(&s, &e)| (s, e))
    }

    /// The free block containing `addr`, if any.
    pub fn block_containing(&self, addr: u64) -> Option<(u64, u64)> {
        let (&s, &e) = self.blocks.range(..=addr).next_back()?;
        (addr < e).then_some((s, e))
    }

    /// The `n` lowest-addressed blocks at least `size` bytes long, in address order.
    ///
    /// Replay shows them beside every divergence and takes them before every prediction, so
    /// they come from the size classes (the lowest fitting members of each class, merged)
    /// rather than from a walk of the address-ordered list, which passes every smaller hole
    /// below them.
    pub fn lowest_fitting(&self, size: u64, n: usize) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(n);
        if n == 0 {
            return out;
        }
        if size == 0 {
            out.extend(self.iter().take(n));
            return out;
        }
        // Every member of a class above `size`'s fits, so those classes give their lowest `n`
        // at once; `size`'s own class, where members may be too short, is scanned last and
        // only below the `n`th candidate found so far.
        let partial = class_of(size);
        for class in (partial + 1..CLASSES).chain([partial]) {
            let upper = if out.len() == n {
                out[n - 1].0
            } else {
                u64::MAX
            };
            let fitting = self.classes[class]
                .range(..upper)
                .filter(|&(&s, &e)| e - s >= size)
                .take(n);
            for (&s, &e) in fitting {
                let at = out.partition_point(|&(o, _)| o < s);
                out.insert(at, (s, e));
                out.truncate(n);
            }
        }
        out
    }

    /// The non-empty classes from `first` up, in order.
    fn classes_from(&self, first: usize) -> impl Iterator<Item = usize> {
        let mut bits = if first >= CLASSES {
            0
        } else {
            self.nonempty & (u64::MAX << first)
        };
        std::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let c = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            Some(c)
        })
    }

    fn link(&mut self, start: u64, end: u64) {
        self.blocks.insert(start, end);
        let c = class_of(end - start);
        self.classes[c].insert(start, end);
        self.nonempty |= 1 << c;
        self.free_bytes += end - start;
    }

    fn unlink(&mut self, start: u64, end: u64) {
        self.blocks.remove(&start);
        let c = class_of(end - start);
        self.classes[c].remove(&start);
        if self.classes[c].is_empty() {
            self.nonempty &= !(1 << c);
        }
        self.free_bytes -= end - start;
    }

    /// `find_vmap_lowest_match` followed by the fit test: the lowest block that can hold `size`
    /// bytes aligned to `align` at or above `vstart`, and the placement in it.
    pub fn find_lowest(&self, size: u64, align: u64, vstart: u64) -> Option<(u64, u64, u64)> {
        self.find_lowest_of(size, align, vstart, 0)
    }

    /// [`FreeSpace::find_lowest`] among the blocks at least `min_len` long.
    fn find_lowest_of(
        &self,
        size: u64,
        align: u64,
        vstart: u64,
        min_len: u64,
    ) -> Option<(u64, u64, u64)> {
        if size == 0 || !align.is_power_of_two() {
            return None;
        }
        let fit_in = |s: u64, e: u64, size, align, vstart| {
            if e - s < min_len {
                None
            } else {
                fit_in(s, e, size, align, vstart)
            }
        };
        // A block that straddles vstart is the only candidate starting below it.
        if let Some((&s, &e)) = self.blocks.range(..=vstart).next_back() {
            if e > vstart {
                if let Some(nva) = fit_in(s, e, size, align, vstart) {
                    return Some((s, e, nva));
                }
            }
        }
        let lo = vstart.saturating_add(1);
        // Any block at least this long fits whatever its alignment.
        let sure = size.saturating_add(align - 1);
        let mut best: Option<(u64, u64, u64)> = None;
        // Classes whose every member fits: the lowest member is the candidate.
        for class in self.classes_from(class_of(sure).saturating_add(1)) {
            let upper = best.map_or(u64::MAX, |b| b.0);
            if let Some((&s, &e)) = self.classes[class].range(lo..upper).next() {
                if let Some(nva) = fit_in(s, e, size, align, vstart) {
                    best = Some((s, e, nva));
                }
            }
        }
        // Classes whose members may or may not fit: scan below the best so far.
        let partial_end = class_of(sure).min(CLASSES - 1);
        for class in self
            .classes_from(class_of(size))
            .take_while(|&c| c <= partial_end)
        {
            let upper = best.map_or(u64::MAX, |b| b.0);
            for (&s, &e) in self.classes[class].range(lo..upper) {
                if let Some(nva) = fit_in(s, e, size, align, vstart) {
                    best = Some((s, e, nva));
                    break;
                }
            }
        }
        best
    }

    /// `__alloc_vmap_area`: lowest fit, the `vend` check, then the split.
    pub fn alloc(
        &mut self,
        size: u64,
        align: u64,
        vstart: u64,
        vend_inclusive: u64,
        adjust: bool,
    ) -> Result<(u64, FitType), FitFailure> {
        // With `adjust`, the kernel's search descends towards the lowest block of at least
        // `size + align - 1` bytes, checking only the blocks on its path on the way: it never
        // returns a block above that one, and a smaller block below it only when the tree's
        // shape puts it on the path. The model takes the long block (the kernel's answer
        // whenever no smaller fitting block is a path ancestor), or the lowest fit when there is
        // none.
        let long = adjust
            .then(|| self.find_lowest_of(size, align, vstart, size.saturating_add(align - 1)))
            .flatten();
        let (s, e, nva) = long
            .or_else(|| self.find_lowest(size, align, vstart))
            .ok_or(FitFailure::NoBlock)?;
        // va_alloc: `nva + size > vend` with the kernel's inclusive VMALLOC_END.
        if nva.saturating_add(size) > vend_inclusive {
            return Err(FitFailure::BeyondEnd);
        }
        Ok((nva, self.split(s, e, nva, size)))
    }

    /// `va_clip`: carve `[nva, nva+size)` out of block `[s, e)`.
    fn split(&mut self, s: u64, e: u64, nva: u64, size: u64) -> FitType {
        let end = nva + size;
        self.unlink(s, e);
        let fit = match (nva == s, end == e) {
            (true, true) => FitType::Fl,
            (true, false) => FitType::Le,
            (false, true) => FitType::Re,
            (false, false) => FitType::Ne,
        };
        if nva > s {
            self.link(s, nva);
        }
        if end < e {
            self.link(end, e);
        }
        fit
    }

    /// Takes an exact range out of the free space (replay resynchronisation: the kernel placed
    /// an area where the model did not predict it).
    pub fn claim(&mut self, start: u64, size: u64) -> Result<FitType, ModelError> {
        match self.block_containing(start) {
            Some((s, e)) if start.checked_add(size).is_some_and(|end| end <= e) => {
                Ok(self.split(s, e, start, size))
            }
            _ => Err(ModelError::NotFree { addr: start, size }),
        }
    }

    /// `merge_or_add_vmap_area_augment`: returns `[start, end)` and merges with both neighbours.
    pub fn release(&mut self, start: u64, size: u64) -> Result<(), ModelError> {
        let end = start
            .checked_add(size)
            .ok_or(ModelError::Overlap { addr: start, size })?;
        if size == 0 {
            return Ok(());
        }
        let prev = self
            .blocks
            .range(..=start)
            .next_back()
            .map(|(&s, &e)| (s, e));
        let next = self.blocks.range(start..).next().map(|(&s, &e)| (s, e));
        if prev.is_some_and(|(_, pe)| pe > start) || next.is_some_and(|(ns, _)| ns < end) {
            return Err(ModelError::Overlap { addr: start, size });
        }
        let mut new_start = start;
        let mut new_end = end;
        if let Some((ns, ne)) = next {
            if ns == end {
                self.unlink(ns, ne);
                new_end = ne;
            }
        }
        if let Some((ps, pe)) = prev {
            if pe == start {
                self.unlink(ps, pe);
                new_start = ps;
            }
        }
        self.link(new_start, new_end);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4096;

    #[test]
    fn fit_types_and_merge() {
        let mut f = FreeSpace::new();
        f.release(0, 100 * P).unwrap();
        assert_eq!(f.alloc(2 * P, 1, 0, u64::MAX, false), Ok((0, FitType::Le)));
        f.claim(50 * P, 2 * P).unwrap();
        // Blocks: [2,50) [52,100)
        assert_eq!(
            f.alloc(48 * P, 1, 0, u64::MAX, false),
            Ok((2 * P, FitType::Fl))
        );
        assert_eq!(
            f.alloc(2 * P, 4 * P, 52 * P, u64::MAX, false),
            Ok((52 * P, FitType::Le))
        );
        // [54,100): aligned to 8 pages -> 56: NE.
        assert_eq!(
            f.alloc(P, 8 * P, 0, u64::MAX, false),
            Ok((56 * P, FitType::Ne))
        );
        assert_eq!(f.len(), 2);
        f.release(56 * P, P).unwrap();
        assert_eq!(f.len(), 1);
        assert!(f.release(60 * P, P).is_err());
        assert_eq!(f.alloc(P, 1, 0, 54 * P, false), Err(FitFailure::BeyondEnd));
        assert_eq!(
            f.alloc(1000 * P, 1, 0, u64::MAX, false),
            Err(FitFailure::NoBlock)
        );
    }

    #[test]
    fn an_adjusted_search_skips_short_blocks_that_fit_only_by_alignment() {
        let mut f = FreeSpace::new();
        // [8,14): six pages, holds 5 pages at 8 (4-page alignment) but is shorter than the
        // search length 5 + 4 - 1 = 8 pages. [20,40) is long enough.
        f.release(8 * P, 6 * P).unwrap();
        f.release(20 * P, 20 * P).unwrap();
        let mut plain = f.clone();
        assert_eq!(
            plain.alloc(5 * P, 4 * P, 0, u64::MAX, false),
            Ok((8 * P, FitType::Le))
        );
        assert_eq!(
            f.alloc(5 * P, 4 * P, 0, u64::MAX, true),
            Ok((20 * P, FitType::Le))
        );
        // No long block left: the lowest fit, as the kernel's search may still find it.
        let mut short = FreeSpace::new();
        short.release(8 * P, 6 * P).unwrap();
        assert_eq!(
            short.alloc(5 * P, 4 * P, 0, u64::MAX, true),
            Ok((8 * P, FitType::Le))
        );
    }

    proptest::proptest! {
        /// The class-based search agrees with a walk of the address-ordered list.
        #[test]
        fn lowest_fitting_matches_a_walk(
            holes in proptest::collection::vec((1u64..40, 1u64..6), 0..60),
            size_pages in 0u64..12,
            n in 0usize..5,
        ) {
            let mut f = FreeSpace::new();
            let mut at = 0;
            for (gap, len) in holes {
                at += gap * P;
                f.release(at, len * P).unwrap();
                at += len * P;
            }
            let size = size_pages * P;
            let walk: Vec<(u64, u64)> =
                f.iter().filter(|(s, e)| e - s >= size).take(n).collect();
            proptest::prop_assert_eq!(f.lowest_fitting(size, n), walk);
        }
    }
}
