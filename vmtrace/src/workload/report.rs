//! The result of a stress run: the `--json` object and the human-readable text.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::bpfmap::MapSizing;
use super::patterns::Pattern;

/// One worker's share of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadReport {
    /// Worker index, 0-based.
    pub thread: u32,
    /// Ops (one allocation + its free) this worker completed.
    pub ops: u64,
    /// `ops` over this worker's own elapsed time.
    pub ops_per_sec: f64,
    /// This worker's elapsed time, from the common start to its last op.
    pub elapsed_s: f64,
}

/// The result of a stress run; `--json` prints it as one object.
///
/// The fields `pattern`, `threads`, `elapsed_s`, `total_ops`, `ops_per_sec`, `per_thread`,
/// `area_bytes` and `page_size` are the stable interface benchmark harnesses parse; the others
/// are informative.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StressReport {
    pub pattern: Pattern,
    /// Worker threads.
    pub threads: u32,
    /// Wall time of the timed part: from the common start until the last worker finished.
    pub elapsed_s: f64,
    /// Ops by all workers; an op is one allocation + its free (see `op`).
    pub total_ops: u64,
    /// `total_ops / elapsed_s`.
    pub ops_per_sec: f64,
    pub per_thread: Vec<ThreadReport>,
    /// The vmap area sizes, in bytes, the run produces (data + map header + guard page; see the
    /// pattern's documentation).
    pub area_bytes: Vec<u64>,
    pub page_size: u64,
    /// What one op is for this pattern.
    pub op: String,
    /// The PRNG seed.
    pub seed: u64,
    /// Maps kept alive during the timed part (long-busy-list, full-fit), else 0.
    pub live_areas: u64,
    /// Time spent setting up the kept maps, not included in `elapsed_s`.
    pub setup_s: f64,
    /// Whether the kernel sizes maps as asked or rounds them to powers of two (no CAP_PERFMON).
    pub map_sizing: MapSizing,
    /// Adjustments made to the request (e.g. a default lowered to fit RLIMIT_NOFILE).
    pub notes: Vec<String>,
}

/// `n / secs`, or 0 when no time passed (JSON has no infinity).
pub fn rate(n: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

impl StressReport {
    /// The report as text, one line per worker and a total.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "vmtrace stress {}: {} thread{}, seed {}{}",
            self.pattern,
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            self.seed,
            if self.live_areas > 0 {
                format!(
                    ", {} maps kept alive (set up in {:.3} s)",
                    self.live_areas, self.setup_s
                )
            } else {
                String::new()
            }
        );
        let _ = writeln!(s, "op = {}", self.op);
        let sizes: Vec<String> = self.area_bytes.iter().map(u64::to_string).collect();
        let sizes = if sizes.len() > 8 {
            format!(
                "{} sizes from {} to {}",
                sizes.len(),
                sizes.first().map_or("", String::as_str),
                sizes.last().map_or("", String::as_str)
            )
        } else {
            sizes.join(", ")
        };
        let _ = writeln!(s, "vmap area sizes (bytes, incl. guard page): {sizes}");
        for t in &self.per_thread {
            let _ = writeln!(
                s,
                "  thread {:>3}: {:>10} ops in {:>8.3} s = {:>10.0} ops/s",
                t.thread, t.ops, t.elapsed_s, t.ops_per_sec
            );
        }
        let _ = writeln!(
            s,
            "  total     : {:>10} ops in {:>8.3} s = {:>10.0} ops/s",
            self.total_ops, self.elapsed_s, self.ops_per_sec
        );
        s
    }
}

/// The progress line for long runs: elapsed time, ops so far and the rate over the last interval.
pub fn progress_line(
    pattern: Pattern,
    elapsed: Duration,
    total_ops: u64,
    recent_rate: f64,
) -> String {
    format!(
        "vmtrace stress {pattern}: {:>6.1} s, {total_ops} ops, {recent_rate:.0} ops/s",
        elapsed.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StressReport {
        StressReport {
            pattern: Pattern::FixSize,
            threads: 2,
            elapsed_s: 0.5,
            total_ops: 1000,
            ops_per_sec: 2000.0,
            per_thread: vec![
                ThreadReport {
                    thread: 0,
                    ops: 500,
                    ops_per_sec: 1000.0,
                    elapsed_s: 0.5,
                },
                ThreadReport {
                    thread: 1,
                    ops: 500,
                    ops_per_sec: 1010.1,
                    elapsed_s: 0.495,
                },
            ],
            area_bytes: vec![73728],
            page_size: 4096,
            op: "create + close one BPF array map of 16 data pages".into(),
            seed: 1,
            live_areas: 0,
            setup_s: 0.0,
            map_sizing: MapSizing::Exact,
            notes: vec![],
        }
    }

    #[test]
    fn json_has_the_interface_fields() {
        let v: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&sample()).expect("serialise"))
                .expect("parse");
        assert_eq!(v["pattern"], "fix-size");
        assert_eq!(v["threads"], 2);
        assert_eq!(v["total_ops"], 1000);
        assert_eq!(v["ops_per_sec"], 2000.0);
        assert_eq!(v["elapsed_s"], 0.5);
        assert_eq!(v["page_size"], 4096);
        assert_eq!(v["area_bytes"], serde_json::json!([73728]));
        assert_eq!(v["per_thread"][1]["thread"], 1);
        assert_eq!(v["per_thread"][1]["ops"], 500);
        assert!(v["per_thread"][0]["ops_per_sec"].is_f64());
        assert_eq!(v["map_sizing"], "exact");
    }

    #[test]
    fn text_names_the_op_and_totals() {
        let t = sample().to_text();
        assert!(t.contains("op = create + close"), "{t}");
        assert!(t.contains("thread   1:"), "{t}");
        assert!(t.contains("total     :       1000 ops"), "{t}");
        assert!(t.contains("2000 ops/s"), "{t}");
        assert!(t.contains("73728"), "{t}");
    }

    #[test]
    fn rate_never_divides_by_zero() {
        assert_eq!(rate(5, Duration::ZERO), 0.0);
        assert_eq!(rate(5, Duration::from_millis(500)), 10.0);
    }

    #[test]
    fn progress_line_shape() {
        let l = progress_line(Pattern::ThreadChurn, Duration::from_secs(3), 42, 10.4);
        assert_eq!(l, "vmtrace stress thread-churn:    3.0 s, 42 ops, 10 ops/s");
    }
}
