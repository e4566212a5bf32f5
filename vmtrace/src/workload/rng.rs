//! A tiny seeded PRNG (SplitMix64), so a stress run is reproducible from `--seed` forever.
//!
//! A crate such as `rand` would do as well, but its small generators are documented as not portable
//! across releases, and the workload only needs uniform integers: SplitMix64 (Steele, Lea and Flood,
//! "Fast splittable pseudorandom number generators", OOPSLA 2014) passes BigCrush and is ten lines.

/// SplitMix64: a 64-bit state advanced by the golden-ratio gamma and passed through a mixer.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// The SplitMix64 / MurmurHash3 finaliser: a bijection on u64 that spreads every input bit.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl SplitMix64 {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The generator of worker `index` for a run seeded with `seed`. Streams of different workers
    /// start at unrelated points, not at shifted copies of one stream.
    pub fn for_worker(seed: u64, index: u32) -> Self {
        Self::new(mix64(seed ^ mix64(u64::from(index).wrapping_add(1))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// A uniform draw in [0, 1), from the top 53 bits (every double that step apart).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform integer in `0..n` (Lemire's multiply-and-reject method, no modulo bias).
    /// Returns 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let threshold = n.wrapping_neg() % n; // (2^64 - n) mod n
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// A uniform integer in `lo..=hi` (`lo` when `hi < lo`).
    pub fn in_range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.below(span),
            None => self.next_u64(), // the whole u64 range
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_values() {
        // First outputs of SplitMix64 seeded with 0, as published with the algorithm (and used by
        // the xoshiro authors to seed their generators).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn same_seed_same_stream_and_workers_differ() {
        let stream = |seed| {
            let mut r = SplitMix64::new(seed);
            (0..8).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(stream(7), stream(7));
        assert_ne!(stream(7), stream(8));
        let mut w0 = SplitMix64::for_worker(1, 0);
        let mut w1 = SplitMix64::for_worker(1, 1);
        assert_ne!(w0.next_u64(), w1.next_u64());
    }

    #[test]
    fn in_range_is_inclusive_and_covers_everything() {
        let mut r = SplitMix64::new(1);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let v = r.in_range(1, 10);
            assert!((1..=10).contains(&v), "{v} outside 1..=10");
            seen[(v - 1) as usize] += 1;
        }
        // Uniform: each value is expected 1000 times; 800..1200 is over 6 sigma wide.
        for (i, n) in seen.iter().enumerate() {
            assert!(
                (800..1200).contains(n),
                "value {} drawn {n} times of 10000",
                i + 1
            );
        }
        assert_eq!(r.in_range(5, 5), 5);
        assert_eq!(r.in_range(5, 4), 5);
        assert_eq!(r.below(0), 0);
        let _ = r.in_range(0, u64::MAX);
    }
}
