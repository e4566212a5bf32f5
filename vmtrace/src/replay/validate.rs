//! Free-running predictions beside what the trace shows.
//!
//! Free-running replay of variant `nodes`, on the recording's own node count and threshold, is
//! a prediction of the kernel that made the recording: it uses no observed purge and no
//! observed address. So each of its figures can be put beside the trace's own, and a what-if
//! built on it inherits exactly that much trust. The targets are issue 18's: purges and mean
//! `npurged` within ±10 %, pool-hit share within 3 points, footprint within ±5 %, each lock
//! class's total wait within a factor of 1.5.

use serde::{Deserialize, Serialize};

use super::free_run::WhatIf;
use super::Report;
use crate::trace::LockClass;

/// How close a prediction must come.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "value")]
pub enum Target {
    /// |predicted / observed − 1| at most this.
    Relative(f64),
    /// |predicted − observed| at most this many percentage points (shares in [0, 1]).
    Points(f64),
    /// predicted / observed within [1 / f, f].
    Factor(f64),
}

impl Target {
    pub fn holds(self, observed: f64, predicted: f64) -> bool {
        if observed == 0.0 {
            return match self {
                Target::Points(p) => 100.0 * predicted.abs() <= p,
                _ => predicted == 0.0,
            };
        }
        match self {
            Target::Relative(t) => (predicted / observed - 1.0).abs() <= t,
            Target::Points(p) => 100.0 * (predicted - observed).abs() <= p,
            Target::Factor(f) => {
                let r = predicted / observed;
                r >= 1.0 / f && r <= f
            }
        }
    }

    pub fn label(self) -> String {
        match self {
            Target::Relative(t) => format!("±{:.0} %", 100.0 * t),
            Target::Points(p) => format!("±{p:.0} pt"),
            Target::Factor(f) => format!("×{f}"),
        }
    }
}

/// One prediction beside the trace's figure.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Validation {
    pub metric: String,
    pub observed: f64,
    pub predicted: f64,
    /// predicted / observed; `None` when nothing was observed.
    pub ratio: Option<f64>,
    pub target: Target,
    pub within: bool,
}

fn entry(metric: String, observed: f64, predicted: f64, target: Target) -> Validation {
    Validation {
        ratio: (observed != 0.0).then(|| predicted / observed),
        within: target.holds(observed, predicted),
        metric,
        observed,
        predicted,
        target,
    }
}

/// Each figure of `w` beside the trace's. `fidelity` is the observed-timing replay of the same
/// trace with the same variant: the pool-hit share and page-table slots as it attributes them
/// (the trace itself does not say which allocations a pool served).
pub fn validate(w: &WhatIf, fidelity: Option<&Report>) -> Vec<Validation> {
    let mut v = vec![
        entry(
            "purges".into(),
            w.trace.purges as f64,
            w.purges as f64,
            Target::Relative(0.10),
        ),
        entry(
            "npurged_mean".into(),
            w.trace.npurged_mean,
            if w.purges == 0 {
                0.0
            } else {
                w.purged_objects as f64 / w.purges as f64
            },
            Target::Relative(0.10),
        ),
    ];
    if let Some(r) = fidelity {
        let share = if r.model.allocs == 0 {
            0.0
        } else {
            // Predicted hits that agreed, plus the kernel's hits the model had to claim.
            (r.model.pool_hits + r.model.pool_claims) as f64 / r.model.allocs as f64
        };
        v.push(entry(
            "pool_hit_share".into(),
            share,
            w.pool_hit_share,
            Target::Points(3.0),
        ));
    }
    v.push(entry(
        "high_water_bytes".into(),
        w.trace.high_water_bytes as f64,
        w.high_water_bytes as f64,
        Target::Relative(0.05),
    ));
    if let Some(r) = fidelity {
        // The tables the trace added: the snapshot's are the same on both sides and would
        // make the figure agree whatever the model did (57,500 of 57,540 on a 10 s trace).
        v.push(entry(
            "pte_tables".into(),
            r.observed_slots
                .pte_tables
                .saturating_sub(r.seeded_slots.pte_tables) as f64,
            w.slots.pte_tables.saturating_sub(w.seeded_slots.pte_tables) as f64,
            Target::Relative(0.05),
        ));
    }
    v.push(entry(
        "nr_lazy_mean".into(),
        w.trace.nr_lazy_mean,
        w.nr_lazy_mean,
        Target::Relative(0.10),
    ));
    for o in &w.observed.contention {
        if o.class == LockClass::Other {
            continue;
        }
        let (waits, wait_ns) = w
            .lock_waits
            .iter()
            .find(|c| c.class == o.class)
            .map_or((0, 0), |c| (c.waits, c.wait_ns));
        let name = o.class.name();
        v.push(entry(
            format!("waits:{name}"),
            o.count as f64,
            waits as f64,
            Target::Factor(1.5),
        ));
        v.push(entry(
            format!("wait_ns:{name}"),
            o.wait_ns as f64,
            wait_ns as f64,
            Target::Factor(1.5),
        ));
    }
    // The holds the simulation gave each section, against those the kernel's were timed at:
    // whether a calibration measured on other recordings carries over to this one.
    for o in &w.observed.holds {
        if o.class == LockClass::Other {
            continue;
        }
        let predicted = w
            .lock_waits
            .iter()
            .find(|c| c.class == o.class && c.sections > 0)
            .map_or(0.0, |c| c.held_ns as f64 / c.sections as f64);
        v.push(entry(
            format!("hold_ns:{}", o.class.name()),
            o.mean_ns,
            predicted,
            Target::Factor(1.5),
        ));
    }
    v
}

/// The validation of one variant as a text table.
pub fn render(w: &WhatIf) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let queued = if w.drains_queued_behind > 0 {
        format!(
            ", {} drains waited for the deferred frees queued ahead",
            w.drains_queued_behind
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "Validation: free-running {} against the trace (no observed purge or address used; drain latency {}{queued})",
        w.variant.name(),
        w.drain_latency_source
    );
    let _ = writeln!(
        s,
        "  {:<26} {:>14} {:>14} {:>8} {:>8}  ",
        "metric", "observed", "predicted", "ratio", "target"
    );
    for e in &w.validation {
        let ratio = e
            .ratio
            .map_or_else(|| "-".to_string(), |r| format!("{r:.2}"));
        let _ = writeln!(
            s,
            "  {:<26} {:>14} {:>14} {:>8} {:>8}  {}",
            e.metric,
            number(e.observed),
            number(e.predicted),
            ratio,
            e.target.label(),
            if e.within { "ok" } else { "MISS" }
        );
    }
    let held = w.validation.iter().filter(|e| e.within).count();
    let _ = writeln!(s, "  {held} of {} within target", w.validation.len());
    if let Some(max) = w.trace.pool_hit_share_max {
        // The observed pool-hit share is replay's inference; the bound is the trace's own.
        let share = w.validation.iter().find(|e| e.metric == "pool_hit_share");
        let over: Vec<String> = share
            .into_iter()
            .flat_map(|e| [("observed", e.observed), ("predicted", e.predicted)])
            .filter(|&(_, v)| v > max + 1e-9)
            .map(|(side, v)| format!("the {side} {v:.4} exceeds it"))
            .collect();
        let _ = writeln!(
            s,
            "  pool_hit_share from the trace alone: at most {max:.4} (an address never shown before, or last allocated on another node or at another size, came from the free tree){}",
            if over.is_empty() {
                String::new()
            } else {
                format!("; {}", over.join(", "))
            }
        );
    }
    if !w.trace.pools_drained {
        let _ = writeln!(
            s,
            "  the pools were not emptied before the snapshot (record with --drain-pools): their entries looked free to the model, so high_water_bytes and pte_tables may come out low"
        );
    }
    s
}

fn number(x: f64) -> String {
    if x.fract() == 0.0 || x.abs() >= 1000.0 {
        format!("{x:.0}")
    } else if x.abs() < 1.0 {
        format!("{x:.4}")
    } else {
        format!("{x:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_hold_only_inside_their_bounds() {
        assert!(Target::Relative(0.1).holds(100.0, 109.0));
        assert!(!Target::Relative(0.1).holds(100.0, 111.0));
        assert!(Target::Points(3.0).holds(0.50, 0.52));
        assert!(!Target::Points(3.0).holds(0.50, 0.54));
        assert!(Target::Factor(1.5).holds(100.0, 66.7));
        assert!(!Target::Factor(1.5).holds(100.0, 66.0));
        assert!(!Target::Factor(1.5).holds(100.0, 151.0));
        assert!(Target::Factor(1.5).holds(0.0, 0.0));
        assert!(!Target::Factor(1.5).holds(0.0, 1.0));
    }
}
