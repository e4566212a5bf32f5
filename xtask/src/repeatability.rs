//! How closely the kernel reproduces itself: a second recording of the fidelity corpus set
//! against the first, figure by figure, on the free-running validation's own metrics and
//! targets (`cargo xtask fidelity --repeat DIR`).
//!
//! A prediction cannot be judged closer than the kernel repeats itself. Two recordings of one
//! workload differ in their lock waits by up to several times on the reference machine, so a
//! ×1.5 target that the second recording misses on the first says nothing about a model that
//! misses it too; a model error well beyond the kernel's spread, on every recording, is a
//! missing cause. This puts the two side by side, per metric.
//!
//! The two recordings of a workload ran for the same time but not at the same pace, so the
//! figures a faster run has more of (purges, wait counts, total wait) are compared per
//! allocation. The model never needs that: it replays the very recording it is scored on.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fidelity::Check;

/// One recording's observed side of the validation: its allocations and the figures the
/// validation compared (observed values and targets; the predictions are not used).
#[derive(Debug, Clone)]
pub struct Observed {
    pub allocations: f64,
    pub checks: Vec<Check>,
}

impl Observed {
    /// From `vmtrace replay --free-running --json` output.
    pub fn from_replay(doc: &Value, checks: Vec<Check>) -> Option<Self> {
        let what_if = doc["what_if"]
            .as_array()?
            .iter()
            .find(|w| !w["validation"].is_null())?;
        Some(Observed {
            allocations: what_if["allocs"].as_f64()?,
            checks,
        })
    }

    /// `metric`'s observed value, per allocation where a faster run has more of it, with its
    /// target. None when the metric is absent or nothing was observed.
    fn value(&self, metric: &str) -> Option<(f64, &Value)> {
        let c = self.checks.iter().find(|c| c.metric == metric)?;
        if c.observed <= 0.0 || self.allocations <= 0.0 {
            return None;
        }
        let v = if scales_with_rate(metric) {
            c.observed / self.allocations
        } else {
            c.observed
        };
        Some((v, &c.target))
    }
}

/// Counts and totals: a run that allocated more in its ten seconds has more of them.
fn scales_with_rate(metric: &str) -> bool {
    metric == "purges" || metric.starts_with("waits:") || metric.starts_with("wait_ns:")
}

/// Whether `predicted` meets `target` against `observed`, with the rules `vmtrace` applies
/// to its own validation (`replay::validate::Target`, written as `{"kind", "value"}`).
pub fn holds(target: &Value, observed: f64, predicted: f64) -> Option<bool> {
    let v = target["value"].as_f64()?;
    Some(match target["kind"].as_str()? {
        "relative" => (predicted / observed - 1.0).abs() <= v,
        "points" => 100.0 * (predicted - observed).abs() <= v,
        "factor" => {
            let r = predicted / observed;
            r >= 1.0 / v && r <= v
        }
        _ => return None,
    })
}

/// The distance between two figures on the scale their target uses: |ln ratio|, or points for
/// a share.
fn error(metric: &str, a: f64, b: f64) -> f64 {
    if metric == "pool_hit_share" {
        100.0 * (a - b).abs()
    } else {
        (b / a).ln().abs()
    }
}

/// One metric: how often one recording of a workload, standing in for a prediction, meets
/// the target on the other.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricSpread {
    /// Each pair counts twice, each recording in turn the observed one.
    pub within: usize,
    pub checked: usize,
    /// Mean distance between the two recordings (|ln ratio| per allocation, or points).
    pub mean_error: f64,
    /// Per workload, second recording over first (per allocation where the metric scales
    /// with the pace; the difference in points for a share).
    pub per_workload: BTreeMap<String, f64>,
}

/// The kernel against itself over every workload both corpora hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelSpread {
    /// The second corpus: where it is and the commit that recorded it.
    pub corpus: String,
    pub commit: String,
    pub workloads: Vec<String>,
    pub metrics: BTreeMap<String, MetricSpread>,
}

/// Sets each workload's two recordings against each other. `pairs`: (workload, first
/// corpus's recording, second's).
pub fn spread(
    corpus: String,
    commit: String,
    pairs: &[(String, Observed, Observed)],
) -> KernelSpread {
    let mut out = KernelSpread {
        corpus,
        commit,
        workloads: pairs.iter().map(|(n, _, _)| n.clone()).collect(),
        metrics: BTreeMap::new(),
    };
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    for (name, a, b) in pairs {
        for c in &a.checks {
            let m = c.metric.as_str();
            let (Some((va, target)), Some((vb, _))) = (a.value(m), b.value(m)) else {
                continue;
            };
            let (Some(ab), Some(ba)) = (holds(target, va, vb), holds(target, vb, va)) else {
                continue;
            };
            let e = out.metrics.entry(m.to_string()).or_default();
            e.checked += 2;
            e.within += usize::from(ab) + usize::from(ba);
            let shown = if m == "pool_hit_share" {
                100.0 * (vb - va)
            } else {
                vb / va
            };
            e.per_workload.insert(name.clone(), shown);
            *sums.entry(m.to_string()).or_default() += error(m, va, vb);
        }
    }
    for (m, e) in &mut out.metrics {
        let pairs = e.checked / 2;
        e.mean_error = sums.get(m).copied().unwrap_or(0.0) / pairs.max(1) as f64;
    }
    out
}

/// Where a held-out model error stands against the kernel's own spread on the same metric:
/// `noise` when it is no larger, `beyond` when it is more than twice as large, `near`
/// between.
pub fn verdict(model_error: f64, kernel_error: f64) -> &'static str {
    if model_error <= kernel_error {
        "noise"
    } else if model_error > 2.0 * kernel_error {
        "beyond"
    } else {
        "near"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(metric: &str, observed: f64, target: Value) -> Check {
        Check {
            metric: metric.into(),
            observed,
            predicted: 0.0,
            ratio: None,
            target,
            within: false,
        }
    }

    fn recording(allocations: f64, waits: f64, share: f64) -> Observed {
        Observed {
            allocations,
            checks: vec![
                check(
                    "waits:node_lazy_lock",
                    waits,
                    json!({"kind": "factor", "value": 1.5}),
                ),
                check(
                    "pool_hit_share",
                    share,
                    json!({"kind": "points", "value": 3.0}),
                ),
                check(
                    "npurged_mean",
                    900.0,
                    json!({"kind": "relative", "value": 0.1}),
                ),
            ],
        }
    }

    #[test]
    fn a_recording_repeated_exactly_meets_every_target() {
        let pairs = vec![
            (
                "fix1".to_string(),
                recording(1e5, 300.0, 0.9),
                recording(1e5, 300.0, 0.9),
            ),
            (
                "lbl1".to_string(),
                recording(2e5, 50.0, 0.5),
                recording(2e5, 50.0, 0.5),
            ),
        ];
        let s = spread("b".into(), "c".into(), &pairs);
        for (m, e) in &s.metrics {
            assert_eq!((e.within, e.checked), (4, 4), "{m}");
            assert_eq!(e.mean_error, 0.0, "{m}");
        }
    }

    #[test]
    fn counts_are_compared_per_allocation() {
        // Twice the allocations and twice the waits: the same rate of waiting.
        let pairs = vec![(
            "fix1".to_string(),
            recording(1e5, 300.0, 0.9),
            recording(2e5, 600.0, 0.9),
        )];
        let s = spread("b".into(), "c".into(), &pairs);
        let w = &s.metrics["waits:node_lazy_lock"];
        assert_eq!((w.within, w.checked), (2, 2));
        assert!(w.mean_error.abs() < 1e-12);
    }

    #[test]
    fn a_perturbed_repeat_drops_the_figure() {
        let base = vec![(
            "fix1".to_string(),
            recording(1e5, 300.0, 0.9),
            recording(1e5, 330.0, 0.91),
        )];
        let s = spread("b".into(), "c".into(), &base);
        assert_eq!(s.metrics["waits:node_lazy_lock"].within, 2);
        assert_eq!(s.metrics["pool_hit_share"].within, 2);
        // Three times the waits, and a pool-hit share five points off.
        let perturbed = vec![(
            "fix1".to_string(),
            recording(1e5, 300.0, 0.9),
            recording(1e5, 900.0, 0.85),
        )];
        let p = spread("b".into(), "c".into(), &perturbed);
        let w = &p.metrics["waits:node_lazy_lock"];
        assert_eq!(w.within, 0);
        assert!((w.mean_error - 3f64.ln()).abs() < 1e-9);
        assert_eq!(p.metrics["pool_hit_share"].within, 0);
        assert!((p.metrics["pool_hit_share"].per_workload["fix1"] + 5.0).abs() < 1e-9);
    }

    #[test]
    fn nothing_observed_on_either_side_is_left_out() {
        let pairs = vec![(
            "churn1".to_string(),
            recording(1e5, 0.0, 0.9),
            recording(1e5, 12.0, 0.9),
        )];
        let s = spread("b".into(), "c".into(), &pairs);
        assert!(!s.metrics.contains_key("waits:node_lazy_lock"));
        assert_eq!(s.metrics["npurged_mean"].checked, 2);
    }

    #[test]
    fn targets_read_as_vmtrace_applies_them() {
        let f = json!({"kind": "factor", "value": 1.5});
        assert_eq!(holds(&f, 100.0, 149.0), Some(true));
        assert_eq!(holds(&f, 100.0, 66.0), Some(false));
        let r = json!({"kind": "relative", "value": 0.1});
        assert_eq!(holds(&r, 100.0, 109.0), Some(true));
        assert_eq!(holds(&r, 100.0, 89.0), Some(false));
        let p = json!({"kind": "points", "value": 3.0});
        assert_eq!(holds(&p, 0.50, 0.52), Some(true));
        assert_eq!(holds(&p, 0.50, 0.46), Some(false));
        assert_eq!(holds(&json!(null), 1.0, 1.0), None);
    }

    #[test]
    fn verdicts_split_at_the_kernel_spread_and_twice_it() {
        assert_eq!(verdict(0.3, 0.4), "noise");
        assert_eq!(verdict(0.6, 0.4), "near");
        assert_eq!(verdict(0.9, 0.4), "beyond");
    }
}
