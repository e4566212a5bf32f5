//! The noise test of `vmtrace compare`: is B's figure outside what A's run would give again?
//!
//! One recording gives no second run to measure run-to-run noise against, but a steady workload
//! repeats itself over time, so the recording is cut into [`WINDOWS`] equal time windows and the
//! metric is taken in each. The windows of A and of B are two samples of the metric; a
//! percentile bootstrap over them (each trace's windows resampled with replacement, the
//! statistic recomputed, [`RESAMPLES`] times) gives an interval for B's statistic over A's. A
//! difference is flagged when that 95 % interval leaves out 1 and the change is larger than
//! the row's floor: [`MIN_EFFECT`] for what the workload does, [`TIMING_MIN_EFFECT`] for how long
//! it waited.
//!
//! Windows rather than events are resampled because events are not independent: a purge
//! follows the frees that filled the backlog, a lock wait comes in bursts. Resampling events one
//! by one would call a 1 % shift in a median of 10⁶ events a difference; resampling windows
//! keeps each window's bursts together, so the interval is as wide as the workload's own
//! variation over time. What it cannot see is noise that stays constant through a run (another
//! boot, a warmer cache, a host that schedules the VM differently); the floors stand for that,
//! measured on pairs of recordings of one workload (docs/compare.md).

use crate::workload::rng::SplitMix64;

/// Time windows per recording.
pub const WINDOWS: usize = 20;

/// Bootstrap resamples per tested figure.
pub const RESAMPLES: usize = 2000;

/// Fewer windows with data on either side and the figure is shown but not tested.
pub const MIN_WINDOWS: usize = 8;

/// Smallest change flagged in what the workload did (event rates, sizes, purge sizes, the
/// backlog), as |ln(B/A)|: `ln 1.10`. Over ten pairs of recordings of one workload these rows
/// differed by 12 % at most (docs/compare.md).
pub const MIN_EFFECT: f64 = 0.095_310_179_804_324_86;

/// Smallest change flagged in how long things waited or ran (lock waits, drain latency, drain
/// item run time, `alloc_vmap_area` latency): `ln 1.6`. These follow which CPU the workload's
/// thread and the kworkers ran on, which is set by the scheduler once per run and drifts
/// little within it: between two recordings of one workload, busy-lock waits per second ranged
/// 0.46–1.48× and 28 of 142 timing rows were flagged under the ±10 % floor. A factor of 1.6
/// either way is the smallest floor that kept those ten pairs' flagged timing rows under one in twenty; other
/// workloads, recorded apart from them, check it (docs/compare.md).
pub const TIMING_MIN_EFFECT: f64 = 0.470_003_629_245_735_5;

/// Which noise a figure carries, and so which floor it is flagged against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Noise {
    /// What the workload did: [`MIN_EFFECT`].
    Work,
    /// How long it waited or ran: [`TIMING_MIN_EFFECT`].
    Timing,
}

impl Noise {
    /// The floor as |ln(B/A)|.
    pub fn min_effect(self) -> f64 {
        match self {
            Noise::Work => MIN_EFFECT,
            Noise::Timing => TIMING_MIN_EFFECT,
        }
    }
}

/// How the per-window values of one figure are summarised into the figure's statistic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Summary {
    /// Rates: each window's count over its length, averaged (equal windows: the overall rate).
    Mean,
    /// Quantiles: each window's quantile, and the median of those.
    Median,
}

/// Result of one test.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Interval {
    /// 2.5th and 97.5th percentiles of the bootstrapped B/A.
    pub lo: f64,
    pub hi: f64,
}

impl Interval {
    pub fn excludes_one(&self) -> bool {
        self.lo > 1.0 || self.hi < 1.0
    }
}

fn summarise(values: &[f64], how: Summary, scratch: &mut Vec<f64>) -> f64 {
    match how {
        Summary::Mean => values.iter().sum::<f64>() / values.len().max(1) as f64,
        Summary::Median => {
            scratch.clear();
            scratch.extend_from_slice(values);
            scratch.sort_by(f64::total_cmp);
            let n = scratch.len();
            if n == 0 {
                0.0
            } else if n % 2 == 1 {
                scratch[n / 2]
            } else {
                (scratch[n / 2 - 1] + scratch[n / 2]) / 2.0
            }
        }
    }
}

/// The percentile-bootstrap interval of `stat(b) / stat(a)` over the windows' values. `None`
/// when either side has fewer than [`MIN_WINDOWS`] values, or A's statistic is 0 in more than
/// one resample in forty (a ratio to nothing).
pub fn ratio_interval(a: &[f64], b: &[f64], how: Summary, seed: u64) -> Option<Interval> {
    if a.len() < MIN_WINDOWS || b.len() < MIN_WINDOWS {
        return None;
    }
    let mut rng = SplitMix64::new(seed);
    let (mut ra, mut rb, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
    let mut ratios = Vec::with_capacity(RESAMPLES);
    let mut undefined = 0usize;
    for _ in 0..RESAMPLES {
        ra.clear();
        rb.clear();
        ra.extend((0..a.len()).map(|_| a[rng.below(a.len() as u64) as usize]));
        rb.extend((0..b.len()).map(|_| b[rng.below(b.len() as u64) as usize]));
        let sa = summarise(&ra, how, &mut scratch);
        let sb = summarise(&rb, how, &mut scratch);
        if sa > 0.0 {
            ratios.push(sb / sa);
        } else if sb > 0.0 {
            ratios.push(f64::INFINITY);
            undefined += 1;
        } else {
            ratios.push(1.0);
        }
    }
    if undefined * 40 > RESAMPLES {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((q * (RESAMPLES - 1) as f64).round() as usize).min(RESAMPLES - 1)];
    Some(Interval {
        lo: at(0.025),
        hi: at(0.975),
    })
}

/// Whether a tested difference is flagged: its interval leaves out 1 and the observed ratio is
/// beyond the floor of its kind of noise.
pub fn flagged(ratio: f64, interval: Option<Interval>, noise: Noise) -> bool {
    interval.is_some_and(|i| i.excludes_one())
        && ratio.is_finite()
        && ratio.ln().abs() > noise.min_effect()
}

/// The `q` quantile (nearest rank) of sorted values.
pub fn quantile_sorted(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((q * (sorted.len() - 1) as f64).round() as usize).min(sorted.len() - 1);
    Some(sorted[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noisy(n: usize, level: f64, seed: u64) -> Vec<f64> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| level * (0.9 + 0.2 * r.unit())).collect()
    }

    #[test]
    fn the_same_level_is_not_flagged_and_a_shift_is() {
        let a = noisy(WINDOWS, 100.0, 1);
        let same = noisy(WINDOWS, 100.0, 2);
        let i = ratio_interval(&a, &same, Summary::Mean, 7).unwrap();
        assert!(!i.excludes_one(), "{i:?}");
        let up = noisy(WINDOWS, 130.0, 3);
        let i = ratio_interval(&a, &up, Summary::Median, 7).unwrap();
        assert!(i.excludes_one() && i.lo > 1.15 && i.hi < 1.45, "{i:?}");
        assert!(flagged(1.3, Some(i), Noise::Work));
        // A real but small change stays below the effect floor.
        assert!(!flagged(
            1.05,
            Some(Interval { lo: 1.04, hi: 1.06 }),
            Noise::Work
        ));
        // A wait time moves with where the scheduler put the threads: 1.3× is within that.
        assert!(!flagged(1.3, Some(i), Noise::Timing));
        assert!(flagged(
            1.0 / 1.7,
            Some(Interval { lo: 0.5, hi: 0.7 }),
            Noise::Timing
        ));
    }

    #[test]
    fn too_few_windows_or_nothing_in_a_is_not_tested() {
        let a = noisy(MIN_WINDOWS - 1, 100.0, 1);
        assert!(ratio_interval(&a, &noisy(WINDOWS, 1.0, 2), Summary::Mean, 1).is_none());
        let zeros = vec![0.0; WINDOWS];
        assert!(ratio_interval(&zeros, &noisy(WINDOWS, 1.0, 2), Summary::Mean, 1).is_none());
        let i = ratio_interval(&zeros, &zeros, Summary::Mean, 1).unwrap();
        assert_eq!((i.lo, i.hi), (1.0, 1.0));
    }

    /// Under the null (both sides drawn alike) the interval leaves out 1 about one time in
    /// twenty: the stated false-positive rate before the effect floor.
    #[test]
    fn false_positive_rate_is_near_five_percent() {
        let mut hits = 0;
        for k in 0..400u64 {
            let a = noisy(WINDOWS, 50.0, 2 * k + 100);
            let b = noisy(WINDOWS, 50.0, 2 * k + 101);
            if ratio_interval(&a, &b, Summary::Mean, k)
                .unwrap()
                .excludes_one()
            {
                hits += 1;
            }
        }
        // 5 % of 400 is 20; a percentile bootstrap on 20 values runs a little liberal.
        assert!((5..=45).contains(&hits), "{hits} of 400");
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile_sorted(&v, 0.5), Some(51));
        assert_eq!(quantile_sorted(&v, 0.99), Some(99));
        assert_eq!(quantile_sorted(&[], 0.5), None);
    }
}
