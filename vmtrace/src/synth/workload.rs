//! The tests of `lib/test_vmalloc.c` that go through `alloc_vmap_area`, as per-thread operation
//! scripts, in the order of their `run_test_mask` bits. Each script yields one operation at a
//! time so that a trace of millions of events never holds its operations in memory.

/// Small deterministic generator (SplitMix64): the crate needs no `rand` for this, and the
/// sequence is fixed for a seed on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`); the modulo bias is irrelevant at these ranges.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// One test of `lib/test_vmalloc.c`, by mask bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    FixSize,
    FullFit,
    LongBusyList,
    RandomSize,
    FixAlign,
    RandomSizeAlign,
    AlignShift,
    /// Bit 7: goes through the per-CPU allocator (`pcpu_get_vm_areas`), not `alloc_vmap_area`.
    PcpuAlloc,
    KvfreeRcu1,
    KvfreeRcu2,
    VmMapRam,
    NoBlockAlloc,
    Vrealloc,
}

impl Test {
    /// Every test in mask-bit order: bit `i` of `run_test_mask` enables `ALL[i]`.
    pub const ALL: [Test; 13] = [
        Test::FixSize,
        Test::FullFit,
        Test::LongBusyList,
        Test::RandomSize,
        Test::FixAlign,
        Test::RandomSizeAlign,
        Test::AlignShift,
        Test::PcpuAlloc,
        Test::KvfreeRcu1,
        Test::KvfreeRcu2,
        Test::VmMapRam,
        Test::NoBlockAlloc,
        Test::Vrealloc,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Test::FixSize => "fix_size_alloc_test",
            Test::FullFit => "full_fit_alloc_test",
            Test::LongBusyList => "long_busy_list_alloc_test",
            Test::RandomSize => "random_size_alloc_test",
            Test::FixAlign => "fix_align_alloc_test",
            Test::RandomSizeAlign => "random_size_align_alloc_test",
            Test::AlignShift => "align_shift_alloc_test",
            Test::PcpuAlloc => "pcpu_alloc_test",
            Test::KvfreeRcu1 => "kvfree_rcu_1_arg_vmalloc_test",
            Test::KvfreeRcu2 => "kvfree_rcu_2_arg_vmalloc_test",
            Test::VmMapRam => "vm_map_ram_test",
            Test::NoBlockAlloc => "no_block_alloc_test",
            Test::Vrealloc => "vrealloc_test",
        }
    }

    /// Whether the test's vmap areas come from `alloc_vmap_area` (so a trace can show them).
    pub fn uses_alloc_vmap_area(self) -> bool {
        self != Test::PcpuAlloc
    }

    /// The tests `mask` enables that go through `alloc_vmap_area`, in mask-bit order. Bits above
    /// 12 name no test, as in the module.
    pub fn from_mask(mask: u64) -> Vec<Test> {
        Test::ALL
            .iter()
            .enumerate()
            .filter(|&(i, t)| mask & (1 << i) != 0 && t.uses_alloc_vmap_area())
            .map(|(_, &t)| t)
            .collect()
    }
}

/// One step of a worker thread. `slot` names a pointer the test holds; sizes are pages without
/// the guard page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `vmalloc`/`__vmalloc_node`: an area with a guard page. Stop the test if it fails.
    Alloc { slot: u32, pages: u64, align: u64 },
    /// `vfree`: the lazy free happens now.
    Free { slot: u32 },
    /// `kvfree_rcu`: the lazy free happens after an RCU grace period, in another context.
    FreeRcu { slot: u32 },
    /// `vm_map_ram` of `pages` pages (no guard page; vmap-block path up to 64 pages).
    MapRam { slot: u32, pages: u64 },
    /// `vm_unmap_ram`.
    UnmapRam { slot: u32 },
}

/// Sizes that depend on the machine and the command line.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub loops: u64,
    pub nr_pages: u64,
    /// `full_fit_alloc_test`'s `junk`: `lazy_max_pages` in the module.
    pub junk: u64,
    /// `long_busy_list_alloc_test`'s live areas: 15000 in the module.
    pub busy_list: u64,
    pub page_size: u64,
}

/// Pages of a `vmalloc` of `bytes` bytes.
fn pages_of(bytes: u64, page: u64) -> u64 {
    bytes.div_ceil(page).max(1)
}

/// Where a running test is: a phase and a counter inside it.
#[derive(Clone, Debug)]
pub struct Script {
    test: Test,
    phase: u32,
    i: u64,
    /// Second pointer of a loop body that allocates two areas.
    stop: bool,
}

/// Slots used by the scripts: fixed ones for loop pointers and arrays (`S_ARR1 + 1` is the
/// second array), then indexed pointers from `S_BASE`.
const S_A: u32 = 0;
const S_B: u32 = 1;
const S_ARR1: u32 = 2;
const S_BASE: u32 = 4;

impl Script {
    pub fn new(test: Test) -> Self {
        Self {
            test,
            phase: 0,
            i: 0,
            stop: false,
        }
    }

    pub fn test(&self) -> Test {
        self.test
    }

    /// The last `Alloc` failed: the test returns early (as `align_shift_alloc_test` does at its
    /// first failure; the other tests also bail out on a NULL pointer).
    pub fn failed(&mut self) {
        self.stop = true;
    }

    /// The next operation, or `None` when the test is done.
    pub fn next(&mut self, s: &Shape, rng: &mut Rng) -> Option<Op> {
        if self.stop {
            return None;
        }
        let page = s.page_size;
        let n = s.nr_pages.max(1);
        // Loop bodies of 2 or 4 steps over `loops` iterations: step = i % k, iteration = i / k.
        macro_rules! body {
            ($k:expr, $total:expr, |$step:ident| $e:expr) => {{
                if self.i >= $k * $total {
                    None
                } else {
                    let $step = self.i % $k;
                    self.i += 1;
                    Some($e)
                }
            }};
        }
        match self.test {
            Test::FixSize | Test::NoBlockAlloc => body!(2, s.loops, |st| match st {
                0 => Op::Alloc {
                    slot: S_A,
                    pages: n,
                    align: 1,
                },
                _ => Op::Free { slot: S_A },
            }),
            Test::RandomSize => body!(2, s.loops, |st| match st {
                0 => Op::Alloc {
                    slot: S_A,
                    pages: 1 + rng.below(100),
                    align: 1,
                },
                _ => Op::Free { slot: S_A },
            }),
            Test::FixAlign => body!(2, s.loops, |st| match st {
                // THREAD_ALIGN << 1 on x86_64 without KASAN: 32 KiB.
                0 => Op::Alloc {
                    slot: S_A,
                    pages: 5,
                    align: 32 << 10,
                },
                _ => Op::Free { slot: S_A },
            }),
            Test::RandomSizeAlign => body!(2, s.loops, |st| match st {
                0 => {
                    let r = rng.below(256);
                    Op::Alloc {
                        slot: S_A,
                        pages: (r % 10) + 1,
                        align: 1 << (r % 23),
                    }
                }
                _ => Op::Free { slot: S_A },
            }),
            Test::AlignShift => body!(2, 64, |st| match st {
                0 => Op::Alloc {
                    slot: S_A,
                    pages: 1,
                    align: 1u64 << (self.i / 2),
                },
                _ => Op::Free { slot: S_A },
            }),
            Test::KvfreeRcu1 | Test::KvfreeRcu2 => body!(2, s.loops, |st| match st {
                0 => Op::Alloc {
                    slot: S_A,
                    pages: 1,
                    align: 1,
                },
                _ => Op::FreeRcu { slot: S_A },
            }),
            Test::VmMapRam => body!(2, s.loops, |st| match st {
                0 => Op::MapRam {
                    slot: S_A,
                    pages: n
                },
                _ => Op::UnmapRam { slot: S_A },
            }),
            Test::Vrealloc => body!(4, s.loops, |st| match st {
                // vrealloc(NULL, 1 page); grow to 4 pages (new area, old freed); the shrinks and
                // the regrow to 1 page happen in place; vfree.
                0 => Op::Alloc {
                    slot: S_A,
                    pages: 1,
                    align: 1,
                },
                1 => Op::Alloc {
                    slot: S_B,
                    pages: 4,
                    align: 1,
                },
                2 => Op::Free { slot: S_A },
                _ => Op::Free { slot: S_B },
            }),
            Test::LongBusyList => self.long_busy_list(s, page),
            Test::FullFit => self.full_fit(s, page),
            Test::PcpuAlloc => None,
        }
    }

    fn step(&mut self, phase_len: u64) -> Option<u64> {
        if self.i < phase_len {
            self.i += 1;
            Some(self.i - 1)
        } else {
            self.phase += 1;
            self.i = 0;
            None
        }
    }

    fn long_busy_list(&mut self, s: &Shape, page: u64) -> Option<Op> {
        loop {
            let (len, phase) = match self.phase {
                0 => (1, 0),
                1 => (s.busy_list, 1),
                2 => (4 * s.loops, 2),
                3 => (s.busy_list, 3),
                4 => (1, 4),
                _ => return None,
            };
            let Some(i) = self.step(len) else { continue };
            let idx = S_BASE + i as u32;
            return Some(match phase {
                0 => Op::Alloc {
                    slot: S_ARR1,
                    pages: pages_of(s.busy_list * 8, page),
                    align: 1,
                },
                1 => Op::Alloc {
                    slot: idx,
                    pages: 1,
                    align: 1,
                },
                2 => match i % 4 {
                    0 => Op::Alloc {
                        slot: S_A,
                        pages: 100,
                        align: 1,
                    },
                    1 => Op::Alloc {
                        slot: S_B,
                        pages: 1,
                        align: 1,
                    },
                    2 => Op::Free { slot: S_A },
                    _ => Op::Free { slot: S_B },
                },
                3 => Op::Free { slot: idx },
                _ => Op::Free { slot: S_ARR1 },
            });
        }
    }

    fn full_fit(&mut self, s: &Shape, page: u64) -> Option<Op> {
        // Slots: ptr[i] = S_BASE + 2i, junk[i] = S_BASE + 2i + 1.
        loop {
            let (len, phase) = match self.phase {
                0 => (2, 0),
                1 => (2 * s.junk, 1),
                2 => (s.junk, 2),
                3 => (2 * s.loops, 3),
                4 => (s.junk, 4),
                5 => (2, 5),
                _ => return None,
            };
            let Some(i) = self.step(len) else { continue };
            let arr_pages = pages_of(s.junk * 8, page);
            return Some(match phase {
                0 => Op::Alloc {
                    slot: S_ARR1 + i as u32,
                    pages: arr_pages,
                    align: 1,
                },
                1 => Op::Alloc {
                    slot: S_BASE + i as u32,
                    pages: 1,
                    align: 1,
                },
                2 => Op::Free {
                    slot: S_BASE + 2 * i as u32 + 1,
                },
                3 if i % 2 == 0 => Op::Alloc {
                    slot: S_A,
                    pages: 1,
                    align: 1,
                },
                3 => Op::Free { slot: S_A },
                4 => Op::Free {
                    slot: S_BASE + 2 * i as u32,
                },
                _ => Op::Free {
                    slot: S_ARR1 + i as u32,
                },
            });
        }
    }
}

/// Sattolo's shuffle as each worker applies it to its test order when `sequential_test_order`
/// is off (the default): `j = random_below(i)` for `i` from `n - 1` down to 1.
pub fn shuffle(tests: &mut [Test], rng: &mut Rng) {
    for i in (1..tests.len()).rev() {
        let j = rng.below(i as u64) as usize;
        tests.swap(i, j);
    }
}

/// One worker's test order, as `test_func` builds it: the shuffle runs over **every** index of
/// `test_case_array` (`shuffle_array(random_array, ARRAY_SIZE(test_case_array))`) and the tests
/// the mask disables are skipped afterwards. Shuffling only the enabled tests would be a
/// Sattolo cycle of those alone: with three tests only two of the six orders could occur.
pub fn worker_order(enabled: &[Test], rng: &mut Rng) -> Vec<Test> {
    let mut all = Test::ALL.to_vec();
    shuffle(&mut all, rng);
    all.retain(|t| enabled.contains(t));
    all
}

impl Test {
    /// Allocations one worker makes in this test: `(setup, looped)`. Setup allocations come in
    /// bursts with no free in between (full_fit's two arrays and `2 * junk` areas,
    /// long_busy_list's array and `busy_list` areas), so no vmap-node pool can serve more of
    /// them than it holds when the burst starts (`node_alloc` only takes a pool's head, and
    /// only a purge refills a pool). The looped ones scale with `loops`.
    pub fn allocs_per_thread(self, s: &Shape) -> (u64, u64) {
        match self {
            Test::FullFit => (2 + 2 * s.junk, s.loops),
            Test::LongBusyList => (1 + s.busy_list, 2 * s.loops),
            Test::Vrealloc => (0, 2 * s.loops),
            Test::AlignShift => (0, 64),
            Test::PcpuAlloc => (0, 0),
            _ => (0, s.loops),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(test: Test, shape: &Shape) -> Vec<Op> {
        let mut s = Script::new(test);
        let mut rng = Rng::new(1);
        std::iter::from_fn(|| s.next(shape, &mut rng)).collect()
    }

    fn shape() -> Shape {
        Shape {
            loops: 3,
            nr_pages: 2,
            junk: 4,
            busy_list: 5,
            page_size: 4096,
        }
    }

    #[test]
    fn mask_bits_select_tests_in_bit_order() {
        assert_eq!(
            Test::from_mask(7),
            [Test::FixSize, Test::FullFit, Test::LongBusyList]
        );
        assert_eq!(Test::from_mask(1 << 4), [Test::FixAlign]);
        // pcpu_alloc_test (bit 7) does not go through alloc_vmap_area.
        assert!(Test::from_mask(1 << 7).is_empty());
        assert_eq!(Test::from_mask(u64::MAX).len(), 12);
        assert_eq!(Test::from_mask(1 << 12), [Test::Vrealloc]);
    }

    #[test]
    fn every_script_frees_what_it_allocates() {
        for t in Test::ALL {
            let mut live = std::collections::HashSet::new();
            for op in ops(t, &shape()) {
                match op {
                    Op::Alloc { slot, .. } | Op::MapRam { slot, .. } => {
                        assert!(live.insert(slot), "{t:?}: slot {slot} reused while live")
                    }
                    Op::Free { slot } | Op::FreeRcu { slot } | Op::UnmapRam { slot } => {
                        assert!(
                            live.remove(&slot),
                            "{t:?}: slot {slot} freed while not live"
                        )
                    }
                }
            }
            assert!(live.is_empty(), "{t:?} leaks {live:?}");
        }
    }

    #[test]
    fn shapes_follow_the_module() {
        let s = shape();
        let full = ops(Test::FullFit, &s);
        // 2 arrays + 2*junk + loops allocations.
        let allocs = full
            .iter()
            .filter(|o| matches!(o, Op::Alloc { .. }))
            .count();
        assert_eq!(allocs as u64, 2 + 2 * s.junk + s.loops);
        let busy = ops(Test::LongBusyList, &s);
        assert!(busy.contains(&Op::Alloc {
            slot: S_A,
            pages: 100,
            align: 1
        }));
        let shift = ops(Test::AlignShift, &s);
        assert_eq!(shift.len(), 128);
        assert!(shift.contains(&Op::Alloc {
            slot: S_A,
            pages: 1,
            align: 1 << 63
        }));
    }

    #[test]
    fn worker_order_shuffles_every_test_then_applies_the_mask() {
        // test_func shuffles all of test_case_array and skips disabled tests afterwards, so
        // with mask 7 every relative order of the three tests occurs (each about 1/6 of the
        // workers), fix_size included as the first one.
        let enabled = Test::from_mask(7);
        let mut rng = Rng::new(0);
        let mut seen = std::collections::HashMap::new();
        for _ in 0..3000 {
            let o = worker_order(&enabled, &mut rng);
            let mut sorted = o.clone();
            sorted.sort_by_key(|t| Test::ALL.iter().position(|a| a == t));
            assert_eq!(sorted, enabled, "every enabled test once");
            let names: Vec<&str> = o.iter().map(|t| t.name()).collect();
            *seen.entry(names).or_insert(0u32) += 1;
        }
        assert_eq!(seen.len(), 6, "{seen:?}");
        assert!(seen.values().all(|&n| n > 300), "{seen:?}");
    }

    #[test]
    fn setup_allocations_match_the_scripts() {
        let s = shape();
        for t in [
            Test::FixSize,
            Test::FullFit,
            Test::LongBusyList,
            Test::Vrealloc,
        ] {
            let n = ops(t, &s)
                .iter()
                .filter(|o| matches!(o, Op::Alloc { .. }))
                .count() as u64;
            let (setup, looped) = t.allocs_per_thread(&s);
            assert_eq!(setup + looped, n, "{t:?}");
        }
        // vmtrace synth --mask 7 --cpus 64 with the default --loops 1000 and the module's
        // junk (lazy_max_pages) and busy list: the setup bursts are 97 % of all allocations.
        let big = Shape {
            loops: 1000,
            nr_pages: 1,
            junk: 57344,
            busy_list: 15000,
            page_size: 4096,
        };
        let (setup, looped) = Test::from_mask(7)
            .iter()
            .map(|t| t.allocs_per_thread(&big))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        assert_eq!((setup, looped), (129_691, 4000));
    }

    #[test]
    fn sattolo_moves_every_test() {
        let mut rng = Rng::new(7);
        for _ in 0..50 {
            let mut t = Test::from_mask(0x1f7f);
            let before = t.clone();
            shuffle(&mut t, &mut rng);
            assert!(t.iter().zip(&before).all(|(a, b)| a != b));
        }
    }
}
