//! Kernel page-table pages of vmalloc space (the `vmap_pages_*_range` walk of mm/vmalloc.c, its
//! `*_alloc_track` helpers, and x86's boot-time `preallocate_vmalloc_pages`): a set of slots
//! ever mapped.
//!
//! A PTE table covers 2 MiB, a PMD table 1 GiB and a PUD table 512 GiB. Tables are never freed
//! by unmapping, so the slots form a monotone set. PUD tables are preallocated at boot on
//! 4-level paging, so they are only counted on 5-level.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

const PMD_SHIFT: u32 = 21;
const PUD_SHIFT: u32 = 30;
const P4D_SHIFT: u32 = 39;

/// Counts of distinct slots touched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SlotCounts {
    /// 2 MiB regions: PTE table pages.
    pub pte_tables: u64,
    /// 1 GiB regions: PMD table pages.
    pub pmd_tables: u64,
    /// 512 GiB regions: PUD table pages (only allocated on demand with 5-level paging).
    pub pud_tables: u64,
}

impl SlotCounts {
    /// Page-table pages the kernel allocated on demand for these slots.
    pub fn pages(&self, five_level: bool) -> u64 {
        self.pte_tables + self.pmd_tables + if five_level { self.pud_tables } else { 0 }
    }
}

/// Hashes a slot number or an address by one multiplication (Fibonacci hashing), its high half
/// folded onto the low: the table indexes by the low bits, and a page-aligned address times an
/// odd constant keeps its twelve zero low bits (the pools' address set, keyed so, made the
/// model ten times slower without the fold). Slot numbers and addresses are plain integers from
/// a trace, not attacker-chosen keys, and the std SipHash was most of a replay's time on a
/// snapshot with large areas: 72 BPF arenas of 4 GiB (0.28 TiB, 144k PTE slots) made seeding
/// 90 % of a 47 ms replay of 120 events.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SlotHasher(u64);

impl Hasher for SlotHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type SlotSet = HashSet<u64, BuildHasherDefault<SlotHasher>>;

/// A set of addresses, with the same multiplicative hash as the slots: the keys are the
/// model's own addresses, never chosen by an adversary.
pub(crate) type AddrSet = SlotSet;

#[derive(Clone, Debug, Default)]
pub struct PageTableSlots {
    pte: SlotSet,
    pmd: SlotSet,
    pud: SlotSet,
    /// Last 2 MiB slot marked: consecutive small mappings usually fall in the same one, and this
    /// skips the hash lookups for them.
    last_pte: Option<u64>,
}

impl PageTableSlots {
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the tables needed to map `[start, end)`; returns how many new table pages that
    /// takes (each one is an `init_mm.page_table_lock` section).
    pub fn map(&mut self, start: u64, end: u64) -> u32 {
        if end <= start {
            return 0;
        }
        let last = end - 1;
        let mut new = 0;
        let (first_pte, last_pte) = (start >> PMD_SHIFT, last >> PMD_SHIFT);
        if first_pte == last_pte && self.last_pte == Some(first_pte) {
            return 0;
        }
        for slot in first_pte..=last_pte {
            new += u32::from(self.pte.insert(slot));
        }
        self.last_pte = Some(last_pte);
        for slot in (start >> PUD_SHIFT)..=(last >> PUD_SHIFT) {
            new += u32::from(self.pmd.insert(slot));
        }
        for slot in (start >> P4D_SHIFT)..=(last >> P4D_SHIFT) {
            new += u32::from(self.pud.insert(slot));
        }
        new
    }

    pub fn counts(&self) -> SlotCounts {
        SlotCounts {
            pte_tables: self.pte.len() as u64,
            pmd_tables: self.pmd.len() as u64,
            pud_tables: self.pud.len() as u64,
        }
    }

    /// Whether the page at `addr` lies in a counted 2 MiB, 1 GiB and 512 GiB slot.
    pub fn covers(&self, addr: u64) -> bool {
        self.pte.contains(&(addr >> PMD_SHIFT))
            && self.pmd.contains(&(addr >> PUD_SHIFT))
            && self.pud.contains(&(addr >> P4D_SHIFT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_monotone() {
        let mut t = PageTableSlots::new();
        let base = 0xffffc90000000000u64;
        assert_eq!(t.map(base, base + 4096), 3);
        assert_eq!(t.map(base + 8192, base + 3 * 4096), 0);
        // Crossing a 2 MiB boundary needs one more PTE table.
        assert_eq!(t.map(base + (2 << 20) - 4096, base + (2 << 20) + 4096), 1);
        let c = t.counts();
        assert_eq!((c.pte_tables, c.pmd_tables, c.pud_tables), (2, 1, 1));
        assert_eq!(c.pages(false), 3);
        assert!(t.covers(base + (2 << 20)));
        assert!(!t.covers(base + (4 << 20)));
    }
}
