//! `vmtrace compare A B`: two recordings side by side, like `perf diff`, with each difference
//! tested against the recordings' own noise.
//!
//! Every kernel result in this area is an A/B comparison (a baseline against a patched kernel,
//! one thread count against another), so each row gives A, B and B/A, and says whether B/A is
//! outside what A's run would give again (the window bootstrap of [`stats`]). Figures a run gives
//! once (VA high-water, page-table slots, backing-page orders) are shown and not tested: one
//! recording has no spread for them. Pure over two [`Profile`]s: no I/O here.

pub mod charts;
pub mod cli;
pub mod profile;
pub mod stats;

use std::collections::BTreeSet;

use serde::Serialize;

pub use profile::{Facts, Profile, Samples};
use stats::{Interval, Noise, Summary, WINDOWS};

use crate::trace::LockClass;

/// One figure of both recordings.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub group: String,
    pub metric: String,
    pub unit: &'static str,
    pub a: Option<f64>,
    pub b: Option<f64>,
    /// B / A, when both exist and A is not 0.
    pub ratio: Option<f64>,
    /// 95 % bootstrap interval of B / A; `None` when untested.
    pub interval: Option<Interval>,
    pub tested: bool,
    pub flagged: bool,
    /// Smallest B/A (or A/B) flagged: rows of wait and run times move with where the scheduler
    /// put the threads in each run, so theirs is wider (`compare::stats`).
    pub min_effect_ratio: f64,
    /// Why it was not tested, when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A header fact that differs between the two recordings.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FactDiff {
    pub field: &'static str,
    pub a: String,
    pub b: String,
}

/// Allocations per task name on both sides.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CommRow {
    pub comm: String,
    pub a: u64,
    pub b: u64,
}

/// How the noise test works, in the report and `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct Method {
    pub windows: usize,
    pub resamples: usize,
    pub confidence: f64,
    pub min_effect_ratio: f64,
    pub timing_min_effect_ratio: f64,
    pub seed: u64,
    pub text: &'static str,
}

pub const METHOD_TEXT: &str =
    "each recording is cut into equal time windows and each figure taken per window; \
a percentile bootstrap over the windows (each side resampled with replacement) gives a 95 % \
interval for B/A; a row is flagged (*) when the interval leaves out 1 and B/A is beyond ±10 %, or beyond a \
factor of 1.6 for wait and run times (lock waits, drain latency and run time), which follow \
where the scheduler put the threads in each run. A rate is tested when its events fall in 8 \
windows or more on each side. The floors cover noise that stays constant through a run; \
on held-out pairs of recordings of one workload 6 % of tested rows were flagged, 10 % of the \
wait-time rows (docs/compare.md)";

/// The whole comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub a_name: String,
    pub b_name: String,
    pub a_facts: Facts,
    pub b_facts: Facts,
    /// Listed first: the two recordings may not be of the same kind of machine or run.
    pub header_differences: Vec<FactDiff>,
    pub a_duration_s: f64,
    pub b_duration_s: f64,
    pub rows: Vec<Row>,
    /// Allocation sizes, pages rounded up to powers of two: (bucket, A share, B share).
    pub size_rows: Vec<Row>,
    pub comms: Vec<CommRow>,
    /// Backing pages by order, from each footer (`backing_pages` probe).
    pub backing_page_orders: Vec<Row>,
    pub flagged: usize,
    pub tested: usize,
    pub method: Method,
}

/// Per-window values of a figure, and its value over the whole recording.
struct Windowed {
    whole: Option<f64>,
    windows: Vec<f64>,
    /// Windows holding at least one event: a rate with its events in a few windows has no
    /// spread to resample.
    occupied: usize,
    how: Summary,
}

/// Which window of `p` a timestamp falls in.
fn window_of(p: &Profile, ts: u64) -> usize {
    let span = p.span_ns().max(1) as u128;
    let off = u128::from(ts.saturating_sub(p.first_ts));
    ((off * WINDOWS as u128 / span) as usize).min(WINDOWS - 1)
}

fn window_s(p: &Profile) -> f64 {
    p.span_ns() as f64 / 1e9 / WINDOWS as f64
}

/// Events per second (`sum`: the values per second).
fn rate(p: &Profile, s: &Samples, sum: bool) -> Windowed {
    let len = window_s(p);
    if len <= 0.0 {
        return Windowed {
            whole: None,
            windows: Vec::new(),
            occupied: 0,
            how: Summary::Mean,
        };
    }
    let mut w = vec![0.0; WINDOWS];
    let mut events = [0u64; WINDOWS];
    for &(ts, v) in s {
        let k = window_of(p, ts);
        w[k] += if sum { v as f64 } else { 1.0 };
        events[k] += 1;
    }
    let total: f64 = w.iter().sum();
    Windowed {
        whole: Some(total / (len * WINDOWS as f64)),
        occupied: events.iter().filter(|&&n| n > 0).count(),
        windows: w.into_iter().map(|x| x / len).collect(),
        how: Summary::Mean,
    }
}

/// Fewest samples in a window for its quantile to count.
const MIN_PER_WINDOW: usize = 5;

/// The `q` quantile (`None`: the mean).
fn spread(p: &Profile, s: &Samples, q: Option<f64>) -> Windowed {
    let mut per: Vec<Vec<u64>> = vec![Vec::new(); WINDOWS];
    for &(ts, v) in s {
        per[window_of(p, ts)].push(v);
    }
    let stat = |v: &mut Vec<u64>| -> Option<f64> {
        match q {
            Some(q) => {
                v.sort_unstable();
                stats::quantile_sorted(v, q).map(|x| x as f64)
            }
            None if v.is_empty() => None,
            None => Some(v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64),
        }
    };
    let mut all: Vec<u64> = s.iter().map(|&(_, v)| v).collect();
    let windows: Vec<f64> = per
        .iter_mut()
        .filter(|v| v.len() >= MIN_PER_WINDOW)
        .filter_map(stat)
        .collect();
    Windowed {
        whole: stat(&mut all),
        occupied: windows.len(),
        windows,
        how: if q.is_some() {
            Summary::Median
        } else {
            Summary::Mean
        },
    }
}

struct Builder<'a> {
    a: &'a Profile,
    b: &'a Profile,
    seed: u64,
    rows: Vec<Row>,
}

impl Builder<'_> {
    fn push(
        &mut self,
        (group, metric, unit): (&str, &str, &'static str),
        noise: Noise,
        wa: Windowed,
        wb: Windowed,
    ) {
        let ratio = match (wa.whole, wb.whole) {
            (Some(x), Some(y)) if x > 0.0 => Some(y / x),
            (Some(x), Some(y)) if x == 0.0 && y == 0.0 => Some(1.0),
            _ => None,
        };
        let seed = self.seed ^ crate::workload::rng::mix64(self.rows.len() as u64 + 1);
        let enough = wa.occupied >= stats::MIN_WINDOWS && wb.occupied >= stats::MIN_WINDOWS;
        let interval = if wa.whole.is_some() && wb.whole.is_some() && enough {
            stats::ratio_interval(&wa.windows, &wb.windows, wa.how, seed)
        } else {
            None
        };
        let note = match (wa.whole, wb.whole) {
            (None, None) => Some("in neither".to_string()),
            (None, _) => Some("not in A".to_string()),
            (_, None) => Some("not in B".to_string()),
            _ if interval.is_none() => Some(format!(
                "too few windows with data (needs {} of {WINDOWS} on each side)",
                stats::MIN_WINDOWS
            )),
            _ => None,
        };
        let flagged = ratio.is_some_and(|r| stats::flagged(r, interval, noise));
        self.rows.push(Row {
            group: group.to_string(),
            metric: metric.to_string(),
            unit,
            a: wa.whole,
            b: wb.whole,
            ratio,
            interval,
            tested: interval.is_some(),
            flagged,
            min_effect_ratio: noise.min_effect().exp(),
            note,
        });
    }

    /// A figure each run gives once: shown, never tested.
    fn once(
        &mut self,
        group: &str,
        metric: &str,
        unit: &'static str,
        a: Option<f64>,
        b: Option<f64>,
    ) {
        let ratio = match (a, b) {
            (Some(x), Some(y)) if x > 0.0 => Some(y / x),
            _ => None,
        };
        self.rows.push(Row {
            group: group.to_string(),
            metric: metric.to_string(),
            unit,
            a,
            b,
            ratio,
            interval: None,
            tested: false,
            flagged: false,
            min_effect_ratio: stats::MIN_EFFECT.exp(),
            note: Some("one value per run: no spread to test against".into()),
        });
    }

    fn both(
        &mut self,
        group: &str,
        metric: &str,
        unit: &'static str,
        s: fn(&Profile) -> &Samples,
        how: Kind,
        noise: Noise,
    ) {
        let (a, b) = (self.a, self.b);
        let w = |p: &Profile| match how {
            Kind::Rate => rate(p, s(p), false),
            Kind::Quantile(q) => spread(p, s(p), Some(q)),
            Kind::Mean => spread(p, s(p), None),
        };
        let (wa, wb) = (w(a), w(b));
        self.push((group, metric, unit), noise, wa, wb);
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Rate,
    Quantile(f64),
    Mean,
}

fn fact_diffs(a: &Facts, b: &Facts) -> Vec<FactDiff> {
    let mut d = Vec::new();
    let mut add = |field, x: String, y: String| {
        if x != y {
            d.push(FactDiff { field, a: x, b: y });
        }
    };
    add("origin", a.origin.clone(), b.origin.clone());
    add("kernel", a.kernel.clone(), b.kernel.clone());
    add("machine", a.machine.clone(), b.machine.clone());
    add(
        "online CPUs",
        a.online_cpus.to_string(),
        b.online_cpus.to_string(),
    );
    add(
        "possible CPUs",
        a.possible_cpus.to_string(),
        b.possible_cpus.to_string(),
    );
    add(
        "vmap nodes",
        a.vmap_nodes.to_string(),
        b.vmap_nodes.to_string(),
    );
    let lm = |x: Option<u64>| x.map_or("unknown".into(), |v| v.to_string());
    add("lazy_max_pages", lm(a.lazy_max_pages), lm(b.lazy_max_pages));
    add(
        "page size",
        a.page_size.to_string(),
        b.page_size.to_string(),
    );
    add("probes", a.probes.join(" "), b.probes.join(" "));
    add("command", a.command.clone(), b.command.clone());
    d
}

/// Bucket of an allocation of `pages`: ⌈log2⌉, so 1, 2, 3–4, 5–8…
fn size_bucket(pages: u64) -> usize {
    (64 - pages.max(1).saturating_sub(1).leading_zeros()) as usize
}

fn bucket_label(k: usize) -> String {
    match k {
        0 => "1".into(),
        1 => "2".into(),
        _ => format!("{}–{}", (1u64 << (k - 1)) + 1, 1u64 << k),
    }
}

/// Smallest share (either side) for a size bucket's share to be tested.
const SIZE_SHARE_TESTED: f64 = 0.01;

fn size_rows(a: &Profile, b: &Profile, seed: u64) -> Vec<Row> {
    let hist = |p: &Profile| {
        let mut whole = [0u64; 65];
        let mut per = vec![[0u64; 65]; WINDOWS];
        for &(ts, pages) in &p.allocs {
            let k = size_bucket(pages);
            whole[k] += 1;
            per[window_of(p, ts)][k] += 1;
        }
        (whole, per)
    };
    let (ha, hb) = (hist(a), hist(b));
    let (na, nb) = (a.allocs.len().max(1) as f64, b.allocs.len().max(1) as f64);
    let mut rows = Vec::new();
    for k in 0..65 {
        if ha.0[k] == 0 && hb.0[k] == 0 {
            continue;
        }
        let (sa, sb) = (ha.0[k] as f64 / na, hb.0[k] as f64 / nb);
        let shares = |per: &Vec<[u64; 65]>| -> Vec<f64> {
            per.iter()
                .filter(|w| w.iter().sum::<u64>() > 0)
                .map(|w| w[k] as f64 / w.iter().sum::<u64>() as f64)
                .collect()
        };
        let tested = sa.max(sb) >= SIZE_SHARE_TESTED;
        let interval = tested
            .then(|| {
                stats::ratio_interval(
                    &shares(&ha.1),
                    &shares(&hb.1),
                    Summary::Mean,
                    seed ^ crate::workload::rng::mix64(1000 + k as u64),
                )
            })
            .flatten();
        let ratio = (sa > 0.0).then(|| sb / sa);
        let flagged = match ratio {
            Some(r) => stats::flagged(r, interval, Noise::Work),
            // A size B allocates in a share worth testing and A never did.
            None => tested,
        };
        rows.push(Row {
            group: "allocation sizes (share of allocations)".into(),
            metric: format!("{} pages", bucket_label(k)),
            unit: "share",
            a: Some(sa),
            b: Some(sb),
            ratio,
            interval,
            tested: interval.is_some() || flagged,
            flagged,
            min_effect_ratio: stats::MIN_EFFECT.exp(),
            note: if !tested {
                Some("under 1 % on both sides".to_string())
            } else if ratio.is_none() {
                Some("not in A".to_string())
            } else {
                None
            },
        });
    }
    rows
}

/// Compares B against A.
pub fn compare(a: &Profile, b: &Profile, a_name: &str, b_name: &str, seed: u64) -> Comparison {
    let mut bl = Builder {
        a,
        b,
        seed,
        rows: Vec::new(),
    };
    use Kind::{Mean, Quantile, Rate};
    use Noise::{Timing, Work};
    bl.both("events", "allocations", "/s", |p| &p.allocs, Rate, Work);
    bl.both("events", "lazy frees", "/s", |p| &p.frees, Rate, Work);
    bl.both("events", "purges", "/s", |p| &p.purges, Rate, Work);
    if !a.failed_allocs.is_empty() || !b.failed_allocs.is_empty() {
        let s: fn(&Profile) -> &Samples = |p| &p.failed_allocs;
        bl.both("events", "failed allocations", "/s", s, Rate, Work);
    }
    let g = "sizes";
    bl.both(
        g,
        "allocation size p50",
        "pages",
        |p| &p.allocs,
        Quantile(0.5),
        Work,
    );
    bl.both(
        g,
        "allocation size p99",
        "pages",
        |p| &p.allocs,
        Quantile(0.99),
        Work,
    );
    if !a.latency.is_empty() || !b.latency.is_empty() {
        let g = "alloc_vmap_area latency";
        bl.both(g, "p50", "ns", |p| &p.latency, Quantile(0.5), Timing);
        bl.both(g, "p99", "ns", |p| &p.latency, Quantile(0.99), Timing);
    }
    let classes: BTreeSet<LockClass> = a.waits.keys().chain(b.waits.keys()).copied().collect();
    for class in classes {
        let g = format!("lock waits: {}", class.name());
        let s = |p: &Profile| -> Samples { p.waits.get(&class).cloned().unwrap_or_default() };
        let (sa, sb) = (s(a), s(b));
        let row = |m, u| (g.as_str(), m, u);
        // A lock's waits are all timing rows: how often a thread found it held depends on
        // which CPUs the holders ran on, as much as how long it waited.
        bl.push(
            row("waits", "/s"),
            Timing,
            rate(a, &sa, false),
            rate(b, &sb, false),
        );
        // ns waited per second of recording: the lock's cost to the workload.
        let (ta, tb) = (rate(a, &sa, true), rate(b, &sb, true));
        bl.push(row("time waiting", "ns/s"), Timing, ta, tb);
        for (m, q) in [("wait p50", 0.5), ("wait p99", 0.99)] {
            let (qa, qb) = (spread(a, &sa, Some(q)), spread(b, &sb, Some(q)));
            bl.push(row(m, "ns"), Timing, qa, qb);
        }
    }
    let g = "purges";
    bl.both(g, "npurged mean", "areas", |p| &p.purges, Mean, Work);
    bl.both(
        g,
        "npurged p90",
        "areas",
        |p| &p.purges,
        Quantile(0.9),
        Work,
    );
    if !a.drain_latency.is_empty() || !b.drain_latency.is_empty() {
        let lat: fn(&Profile) -> &Samples = |p| &p.drain_latency;
        let run: fn(&Profile) -> &Samples = |p| &p.drain_run;
        bl.both(g, "drain latency p50", "ns", lat, Quantile(0.5), Timing);
        bl.both(g, "drain latency p90", "ns", lat, Quantile(0.9), Timing);
        bl.both(g, "drain item run p50", "ns", run, Quantile(0.5), Timing);
        bl.both(g, "drain item run p90", "ns", run, Quantile(0.9), Timing);
    }
    let g = "lazy backlog (at each free)";
    bl.both(g, "nr_lazy p50", "pages", |p| &p.frees, Quantile(0.5), Work);
    bl.both(g, "nr_lazy p90", "pages", |p| &p.frees, Quantile(0.9), Work);
    let levels: BTreeSet<&str> = a
        .pt_pages
        .keys()
        .chain(b.pt_pages.keys())
        .copied()
        .collect();
    for level in levels {
        let s = |p: &Profile| -> Samples { p.pt_pages.get(level).cloned().unwrap_or_default() };
        let (sa, sb) = (s(a), s(b));
        let row = ("page-table pages (page_tables probe)", level, "/s");
        bl.push(row, Work, rate(a, &sa, false), rate(b, &sb, false));
    }
    let mib = |x: Option<u64>| x.map(|v| v as f64 / (1u64 << 20) as f64);
    bl.once(
        "footprint",
        "VA high-water",
        "MiB",
        mib(a.high_water_bytes),
        mib(b.high_water_bytes),
    );
    bl.once(
        "footprint",
        "2 MiB PTE slots added",
        "slots",
        Some(a.pte_slots_added as f64),
        Some(b.pte_slots_added as f64),
    );
    bl.once(
        "recording",
        "lost events",
        "events",
        a.lost_events.map(|v| v as f64),
        b.lost_events.map(|v| v as f64),
    );
    let rows = bl.rows;
    let size_rows = size_rows(a, b, seed);
    let mut comms: Vec<CommRow> = a
        .comms
        .keys()
        .chain(b.comms.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|c| CommRow {
            comm: c.clone(),
            a: a.comms.get(c).copied().unwrap_or(0),
            b: b.comms.get(c).copied().unwrap_or(0),
        })
        .collect();
    comms.sort_by(|x, y| (y.a + y.b).cmp(&(x.a + x.b)).then(x.comm.cmp(&y.comm)));
    comms.truncate(10);
    let orders = a
        .backing_page_orders
        .as_ref()
        .map_or(0, Vec::len)
        .max(b.backing_page_orders.as_ref().map_or(0, Vec::len));
    let order = |p: &Profile, k: usize| {
        p.backing_page_orders
            .as_ref()
            .map(|o| o.get(k).copied().unwrap_or(0) as f64)
    };
    let backing_page_orders = (0..orders)
        .filter(|&k| order(a, k).unwrap_or(0.0) + order(b, k).unwrap_or(0.0) > 0.0)
        .map(|k| {
            let (x, y) = (order(a, k), order(b, k));
            Row {
                group: "backing pages".into(),
                metric: format!("order {k}{}", if k + 1 == orders { "+" } else { "" }),
                unit: "pages",
                a: x,
                b: y,
                ratio: x.zip(y).filter(|(x, _)| *x > 0.0).map(|(x, y)| y / x),
                interval: None,
                tested: false,
                flagged: false,
                min_effect_ratio: stats::MIN_EFFECT.exp(),
                note: Some("footer totals: no spread to test against".into()),
            }
        })
        .collect();
    let flagged = rows.iter().chain(&size_rows).filter(|r| r.flagged).count();
    let tested = rows.iter().chain(&size_rows).filter(|r| r.tested).count();
    Comparison {
        a_name: a_name.to_string(),
        b_name: b_name.to_string(),
        header_differences: fact_diffs(&a.facts, &b.facts),
        a_facts: a.facts.clone(),
        b_facts: b.facts.clone(),
        a_duration_s: a.span_ns() as f64 / 1e9,
        b_duration_s: b.span_ns() as f64 / 1e9,
        rows,
        size_rows,
        comms,
        backing_page_orders,
        flagged,
        tested,
        method: Method {
            windows: WINDOWS,
            resamples: stats::RESAMPLES,
            confidence: 0.95,
            min_effect_ratio: stats::MIN_EFFECT.exp(),
            timing_min_effect_ratio: stats::TIMING_MIN_EFFECT.exp(),
            seed,
            text: METHOD_TEXT,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::rng::SplitMix64;

    /// A steady workload of `secs` seconds: allocations of `pages` at `rate` per second (gaps
    /// drawn uniformly around the mean), a lazy free after each, a purge every `purge_every`
    /// frees, and a busy-lock wait every 50 allocations.
    fn steady(seed: u64, secs: u64, rate: f64, pages: u64, wait_ns: u64) -> Profile {
        let mut r = SplitMix64::new(seed);
        let mut p = Profile {
            facts: Facts {
                kernel: "6.18".into(),
                online_cpus: 2,
                ..Facts::default()
            },
            ..Profile::default()
        };
        let mut t = 1_000_000_000u64;
        let end = t + secs * 1_000_000_000;
        let mut n = 0u64;
        while t < end {
            t += (2.0 * r.unit() * 1e9 / rate) as u64 + 1;
            n += 1;
            p.allocs.push((t, pages));
            p.frees.push((t + 10, 1000 + r.below(1000)));
            if n.is_multiple_of(500) {
                p.purges.push((t + 20, 400 + r.below(100)));
            }
            if n.is_multiple_of(50) {
                p.waits
                    .entry(LockClass::NodeBusyLock)
                    .or_default()
                    .push((t + 5, wait_ns / 2 + r.below(wait_ns)));
            }
            *p.comms.entry("stress-0".into()).or_default() += 1;
        }
        p.first_ts = p.allocs[0].0;
        p.last_ts = p.purges.last().map_or(t, |x| x.0).max(t + 20);
        p
    }

    fn flagged(c: &Comparison) -> Vec<String> {
        c.rows
            .iter()
            .chain(&c.size_rows)
            .filter(|r| r.flagged)
            .map(|r| format!("{}: {}", r.group, r.metric))
            .collect()
    }

    #[test]
    fn a_recording_against_itself_flags_nothing() {
        let a = steady(1, 4, 20_000.0, 18, 800);
        let c = compare(&a, &a, "a", "a", 1);
        assert!(flagged(&c).is_empty(), "{:?}", flagged(&c));
        assert!(c.tested >= 10, "{}", c.tested);
        assert!(c.header_differences.is_empty());
        for r in c.rows.iter().filter(|r| r.tested) {
            assert_eq!(r.ratio, Some(1.0), "{r:?}");
        }
    }

    #[test]
    fn the_same_workload_again_flags_nothing() {
        let a = steady(1, 4, 20_000.0, 18, 800);
        let b = steady(2, 4, 20_000.0, 18, 800);
        let c = compare(&a, &b, "a", "b", 1);
        assert!(flagged(&c).is_empty(), "{:?}", flagged(&c));
    }

    #[test]
    fn each_changed_figure_is_flagged_and_only_those() {
        let a = steady(1, 4, 20_000.0, 18, 800);
        // Half again the rate, and waits twice as long.
        let b = steady(2, 4, 30_000.0, 18, 1600);
        let c = compare(&a, &b, "a", "b", 1);
        let f = flagged(&c);
        for want in [
            "events: allocations",
            "events: lazy frees",
            "events: purges",
            "lock waits: node_busy_lock: wait p50",
            "lock waits: node_busy_lock: time waiting",
        ] {
            assert!(f.iter().any(|x| x == want), "{want} not in {f:?}");
        }
        // 1.5 times the busy-lock waits is within what the scheduler alone moves between
        // two runs: tested, not flagged.
        let waits = c.rows.iter().find(|r| r.metric == "waits").unwrap();
        assert!(waits.tested && !waits.flagged, "{waits:?}");
        assert!(waits.interval.unwrap().lo > 1.0, "{waits:?}");
        for unchanged in ["sizes:", "purges: npurged", "lazy backlog"] {
            assert!(
                !f.iter().any(|x| x.starts_with(unchanged)),
                "{unchanged} in {f:?}"
            );
        }
        // Another size: its bucket appears in B only, and the old one shrinks.
        let b = steady(2, 4, 20_000.0, 40, 800);
        let c = compare(&a, &b, "a", "b", 1);
        let f = flagged(&c);
        assert!(f.iter().any(|x| x.ends_with("33–64 pages")), "{f:?}");
        assert!(f.iter().any(|x| x == "sizes: allocation size p50"), "{f:?}");
    }

    #[test]
    fn header_differences_are_listed() {
        let a = steady(1, 2, 5_000.0, 4, 800);
        let mut b = steady(1, 2, 5_000.0, 4, 800);
        b.facts.online_cpus = 16;
        b.facts.kernel = "6.12".into();
        let c = compare(&a, &b, "a", "b", 1);
        let fields: Vec<_> = c.header_differences.iter().map(|d| d.field).collect();
        assert_eq!(fields, ["kernel", "online CPUs"]);
    }

    #[test]
    fn a_short_or_empty_recording_is_shown_but_not_tested() {
        let a = steady(1, 4, 20_000.0, 18, 800);
        let empty = Profile::default();
        let c = compare(&a, &empty, "a", "empty", 1);
        assert_eq!(c.flagged, 0);
        let allocs = &c.rows[0];
        assert_eq!(allocs.metric, "allocations");
        assert!(!allocs.tested && allocs.note.is_some(), "{allocs:?}");
    }

    #[test]
    fn a_rate_with_its_events_in_a_few_windows_is_not_tested() {
        let a = steady(1, 4, 20_000.0, 18, 800);
        let mut b = steady(2, 4, 20_000.0, 18, 800);
        // Two waits, in the last window: far fewer than A's, but no spread to resample.
        let w = b.waits.get_mut(&LockClass::NodeBusyLock).unwrap();
        w.drain(..w.len() - 2);
        let c = compare(&a, &b, "a", "b", 1);
        let waits = c.rows.iter().find(|r| r.metric == "waits").unwrap();
        assert!(!waits.tested && !waits.flagged, "{waits:?}");
        assert!(
            waits.note.as_deref().unwrap().contains("windows"),
            "{waits:?}"
        );
        // In every window, the same drop is flagged.
        let mut b = steady(2, 4, 20_000.0, 18, 800);
        let w = b.waits.get_mut(&LockClass::NodeBusyLock).unwrap();
        let kept: Vec<_> = w.iter().copied().step_by(8).collect();
        *w = kept;
        let c = compare(&a, &b, "a", "b", 1);
        let waits = c.rows.iter().find(|r| r.metric == "waits").unwrap();
        assert!(waits.flagged, "{waits:?}");
    }

    #[test]
    fn size_buckets_round_up_to_powers_of_two() {
        let b: Vec<_> = [1, 2, 3, 4, 5, 8, 9, 18]
            .iter()
            .map(|&p| size_bucket(p))
            .collect();
        assert_eq!(b, [0, 1, 2, 2, 3, 3, 4, 5]);
        assert_eq!(bucket_label(5), "17–32");
    }
}
