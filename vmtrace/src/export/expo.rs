//! Prometheus text exposition format 0.0.4, written by hand: the format is small and stable,
//! and a hand-written writer keeps the metric types lock-free (plain atomics) so the event path
//! never waits on a scrape. See <https://prometheus.io/docs/instrumenting/exposition_formats/>.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// The `Content-Type` a scrape of this text is served with.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Escapes a label value: backslash, double quote and line feed, as the format requires.
pub fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes HELP text: backslash and line feed (quotes stay as they are).
pub fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// `{a="x",b="y"}`, or nothing without labels.
pub fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// Formats a sample value the way Prometheus parses it (`+Inf`, integers without a fraction).
pub fn value(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.is_nan() {
        "NaN".into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Writes the `# HELP` and `# TYPE` lines of a metric family.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Writes one sample line.
pub fn sample(out: &mut String, name: &str, pairs: &[(&str, &str)], v: f64) {
    let _ = writeln!(out, "{name}{} {}", labels(pairs), value(v));
}

/// A histogram over exp2 buckets (`le` = `scale` × 2^i), updated with relaxed atomics only.
///
/// Bucket counts are kept non-cumulative so an observation touches one bucket; they are
/// summed on render, and `_count` is taken from that sum so `_count` always equals the `+Inf`
/// bucket even while events arrive during a scrape.
#[derive(Debug)]
pub struct Exp2Histogram {
    /// Upper bounds in the raw unit (bytes, nanoseconds), ascending.
    bounds: Vec<u64>,
    /// One more than `bounds`: the last is the overflow (`+Inf`) bucket.
    counts: Vec<AtomicU64>,
    /// Sum of observations in the raw unit.
    sum: AtomicU64,
}

impl Exp2Histogram {
    /// Buckets `first`, `2·first`, … up to `2^(n-1)·first`, in the raw unit.
    pub fn new(first: u64, n: u32) -> Self {
        let bounds: Vec<u64> = (0..n).map(|i| first.saturating_mul(1u64 << i)).collect();
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self {
            bounds,
            counts,
            sum: AtomicU64::new(0),
        }
    }

    /// Counts one observation (raw unit).
    pub fn observe(&self, raw: u64) {
        let i = self.bounds.partition_point(|&b| b < raw);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(raw, Ordering::Relaxed);
    }

    /// Number of observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Writes `_bucket`, `_sum` and `_count` lines; raw values are divided by `per_unit` to get
    /// the exposed base unit (1 for bytes, 1e9 for nanoseconds to seconds). Dividing, not
    /// multiplying by 1e-9, keeps bounds such as `0.000001` exact in the text.
    pub fn render(&self, out: &mut String, name: &str, pairs: &[(&str, &str)], per_unit: f64) {
        let mut cumulative = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = match self.bounds.get(i) {
                Some(&b) => value(b as f64 / per_unit),
                None => "+Inf".into(),
            };
            let mut with_le: Vec<(&str, &str)> = pairs.to_vec();
            with_le.push(("le", &le));
            sample(out, &format!("{name}_bucket"), &with_le, cumulative as f64);
        }
        let sum = self.sum.load(Ordering::Relaxed) as f64 / per_unit;
        sample(out, &format!("{name}_sum"), pairs, sum);
        sample(out, &format!("{name}_count"), pairs, cumulative as f64);
    }
}
