//! How far the built-in calibration's free-running predictions were checked, printed beside
//! every prediction made with it.
//!
//! A what-if table gives a page-table count, a purge count and a lock-wait share with the same
//! number of digits, yet they are not equally trustworthy: on recordings the calibration was
//! not fitted on, some of them land within their targets nearly every time and the lock waits
//! mostly do not (docs/fidelity.md). A reader of the table cannot know which unless the tool
//! says so where the figures are. `cargo xtask fidelity --costs vmtrace/assets/calibration.json
//! --write-check vmtrace/assets/calibration-check.json` measures it, on the corpus recordings
//! whose file names the calibration was not made from, over several seeds, and the file ships
//! beside the calibration. Its SHA-256 of the calibration is checked by a test, so the two
//! cannot drift apart unnoticed.

use serde::{Deserialize, Serialize};

use super::validate::Target;

/// The held-out check of `assets/calibration.json`.
pub const BUILTIN_CHECK: &str = include_str!("../../assets/calibration-check.json");

/// The file `cargo xtask fidelity --write-check` writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationCheck {
    pub format: String,
    pub version: u32,
    /// Of the calibration file the check ran with.
    pub calibration_sha256: String,
    /// The vmtrace commit that ran the check.
    pub checked_at: String,
    pub corpus: CorpusFacts,
    /// The recordings the calibration was not fitted on, which the figures come from.
    pub recordings: Vec<String>,
    pub seeds: u32,
    pub metrics: Vec<MetricCheck>,
    /// A second recording of the corpus's workloads (`cargo xtask fidelity --repeat`), whose
    /// figures set the kernel against itself; absent in checks made without one.
    #[serde(default)]
    pub repeat: Option<RepeatFacts>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RepeatFacts {
    pub commit: String,
    pub workloads: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CorpusFacts {
    pub commit: String,
    pub kernel: String,
    pub cpus: u32,
    pub duration: String,
}

/// One validation metric (docs/model.md, "Validation against recordings") over every held-out
/// recording and seed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricCheck {
    pub metric: String,
    pub target: Target,
    pub within: u32,
    pub checked: u32,
    /// Mean |ln(predicted / observed)|, or for the pool-hit share the mean distance in points;
    /// a prediction of 0 against an observed figure has no ratio and is only counted.
    pub mean_error: Option<f64>,
    /// One recording of each workload taken as the prediction of another recording of it
    /// (counts and totals per allocation): a prediction cannot be judged closer than this.
    #[serde(default)]
    pub kernel: Option<KernelCheck>,
}

/// How closely the kernel reproduced itself on one metric (each pair of recordings counted
/// both ways).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelCheck {
    pub within: u32,
    pub checked: u32,
    pub mean_error: f64,
}

/// The metrics that answer one question a what-if row asks, counted together.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupCheck {
    pub label: &'static str,
    pub target: Target,
    pub within: u32,
    pub checked: u32,
    /// The mean error over the group's figures that have one, on the target's scale: a factor
    /// (exp of the mean |ln ratio|) or points.
    pub typical: Option<f64>,
    /// The kernel against itself on the same metrics, `(within, checked)`, when the check has it.
    pub kernel: Option<(u32, u32)>,
}

/// Whether a validation metric belongs to a group.
type Takes = fn(&str) -> bool;

/// The groups, in the order of a what-if row's columns, and the metric names each takes.
const GROUPS: [(&str, Takes); 5] = [
    ("page-table slots and VA high-water", |m| {
        m == "pte_tables" || m == "high_water_bytes"
    }),
    ("purges and mean npurged", |m| {
        m == "purges" || m == "npurged_mean"
    }),
    ("pool-hit share", |m| m == "pool_hit_share"),
    ("lazy backlog", |m| m == "nr_lazy_mean"),
    ("lock waits and wait time per class", |m| {
        m.starts_with("waits:") || m.starts_with("wait_ns:")
    }),
];

impl CalibrationCheck {
    pub fn builtin() -> Result<Self, serde_json::Error> {
        serde_json::from_str(BUILTIN_CHECK)
    }

    /// The check of the costs `--costs SPEC` gives, when one exists: only the built-in
    /// calibration has one, and only as shipped (no `--cost` override, no fit).
    pub fn for_costs(spec: &str, changed: bool) -> Option<Self> {
        (spec == "builtin" && !changed)
            .then(Self::builtin)
            .and_then(Result::ok)
            .filter(|c| !c.metrics.is_empty())
    }

    pub fn groups(&self) -> Vec<GroupCheck> {
        GROUPS
            .iter()
            .filter_map(|&(label, takes)| {
                let ms: Vec<&MetricCheck> =
                    self.metrics.iter().filter(|m| takes(&m.metric)).collect();
                let target = ms.first()?.target;
                let (sum, n) = ms
                    .iter()
                    .filter_map(|m| m.mean_error.map(|e| (e * f64::from(m.checked), m.checked)))
                    .fold((0.0, 0), |(s, n), (e, c)| (s + e, n + c));
                let mean = (n > 0).then(|| sum / f64::from(n));
                let kernel = ms
                    .iter()
                    .filter_map(|m| m.kernel)
                    .map(|k| (k.within, k.checked))
                    .reduce(|a, b| (a.0 + b.0, a.1 + b.1));
                Some(GroupCheck {
                    label,
                    target,
                    kernel,
                    within: ms.iter().map(|m| m.within).sum(),
                    checked: ms.iter().map(|m| m.checked).sum(),
                    typical: match target {
                        Target::Points(_) => mean,
                        _ => mean.map(f64::exp),
                    },
                })
            })
            .collect()
    }

    /// The lines printed under a table of predictions, each starting with `prefix`.
    pub fn render(&self, prefix: &str) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{prefix}how far the built-in calibration's predictions were checked: free-running \
             `nodes` against {} recordings it was not fitted on (Linux {}, {} CPUs, {} each), {} \
             seeds, at {} (docs/fidelity.md):",
            self.recordings.len(),
            self.corpus.kernel,
            self.corpus.cpus,
            self.corpus.duration,
            self.seeds,
            self.checked_at
        );
        for g in self.groups() {
            let typical = match (g.typical, g.target) {
                (None, _) => String::new(),
                (Some(p), Target::Points(_)) => format!("; mean error {p:.1} pt"),
                (Some(f), _) => format!("; typical error ×{f:.2}"),
            };
            let kernel = match g.kernel {
                Some((w, c)) => format!("; the kernel against itself {w} of {c}"),
                None => String::new(),
            };
            let _ = writeln!(
                s,
                "{prefix}  {:<36} {:>3} of {:<3} within {}{typical}{kernel}",
                g.label,
                g.within,
                g.checked,
                g.target.label()
            );
        }
        if let Some(r) = &self.repeat {
            let _ = writeln!(
                s,
                "{prefix}  the kernel against itself: {} workloads recorded again at {}, one \
                 recording taken as the prediction of the other (counts per allocation); no \
                 prediction can be judged closer",
                r.workloads, r.commit
            );
        }
        let _ = writeln!(
            s,
            "{prefix}  checked at the recordings' CPU count only; other CPU counts and designs are unchecked"
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped check is of the shipped calibration: regenerating one without the other
    /// fails here.
    #[test]
    fn the_builtin_check_is_of_the_builtin_calibration() {
        use sha2::{Digest as _, Sha256};
        let c = CalibrationCheck::builtin().expect("the built-in check parses");
        assert_eq!(c.format, "vmtrace-calibration-check");
        let sha: String = Sha256::digest(include_bytes!("../../assets/calibration.json"))
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            c.calibration_sha256, sha,
            "assets/calibration-check.json was made with another calibration: rerun \
             `cargo xtask fidelity --costs vmtrace/assets/calibration.json --write-check \
             vmtrace/assets/calibration-check.json`"
        );
        assert!(!c.recordings.is_empty());
        let groups = c.groups();
        assert_eq!(groups.len(), GROUPS.len(), "{groups:?}");
        assert!(groups
            .iter()
            .all(|g| g.checked > 0 && g.within <= g.checked));
    }

    fn check_of(metrics: Vec<MetricCheck>, repeat: Option<RepeatFacts>) -> CalibrationCheck {
        CalibrationCheck {
            format: "vmtrace-calibration-check".into(),
            version: 1,
            calibration_sha256: String::new(),
            checked_at: "c".into(),
            corpus: CorpusFacts {
                commit: "c".into(),
                kernel: "k".into(),
                cpus: 2,
                duration: "10s".into(),
            },
            recordings: vec!["a".into()],
            seeds: 2,
            metrics,
            repeat,
        }
    }

    fn metric(name: &str, target: Target, within: u32, checked: u32, err: f64) -> MetricCheck {
        MetricCheck {
            metric: name.into(),
            target,
            within,
            checked,
            mean_error: Some(err),
            kernel: None,
        }
    }

    /// A group sums its metrics' counts and weighs their errors by their figures; a worse
    /// metric shows in both.
    #[test]
    fn groups_sum_counts_and_weigh_errors() {
        let check = |wait_err: f64, wait_within: u32| {
            check_of(
                vec![
                    metric(
                        "waits:node_lazy_lock",
                        Target::Factor(1.5),
                        wait_within,
                        10,
                        wait_err,
                    ),
                    metric("wait_ns:node_lazy_lock", Target::Factor(1.5), 5, 10, 0.0),
                    metric("pool_hit_share", Target::Points(3.0), 9, 10, 1.5),
                ],
                None,
            )
        };
        let good = check(0.0, 8);
        let g = good.groups();
        let waits = g.iter().find(|g| g.label.starts_with("lock")).unwrap();
        assert_eq!((waits.within, waits.checked), (13, 20));
        assert_eq!(waits.typical, Some(1.0));
        let pool = g.iter().find(|g| g.label == "pool-hit share").unwrap();
        assert_eq!(pool.typical, Some(1.5));
        let bad = check(2.0, 2);
        let b = bad.groups();
        let waits_bad = b.iter().find(|g| g.label.starts_with("lock")).unwrap();
        assert_eq!((waits_bad.within, waits_bad.checked), (7, 20));
        assert!((waits_bad.typical.unwrap() - 1f64.exp()).abs() < 1e-9);
        let text = bad.render("x: ");
        assert!(text.contains("7 of 20"), "{text}");
        assert!(text.lines().all(|l| l.starts_with("x: ")), "{text}");
        assert!(!text.contains("against itself"), "{text}");
    }

    /// With a repeat corpus the kernel's own counts sum per group and print beside the model's.
    #[test]
    fn the_kernel_against_itself_is_summed_per_group_and_printed() {
        let k = |within, checked| {
            Some(KernelCheck {
                within,
                checked,
                mean_error: 0.4,
            })
        };
        let mut a = metric("waits:node_lazy_lock", Target::Factor(1.5), 2, 10, 1.0);
        a.kernel = k(8, 18);
        let mut b = metric("wait_ns:node_lazy_lock", Target::Factor(1.5), 3, 10, 1.0);
        b.kernel = k(4, 18);
        let c = check_of(
            vec![a, b, metric("purges", Target::Relative(0.1), 9, 10, 0.05)],
            Some(RepeatFacts {
                commit: "r".into(),
                workloads: 9,
            }),
        );
        let g = c.groups();
        let locks = g.iter().find(|g| g.label.starts_with("lock")).unwrap();
        assert_eq!(locks.kernel, Some((12, 36)));
        let purges = g.iter().find(|g| g.label.starts_with("purges")).unwrap();
        assert_eq!(purges.kernel, None);
        let text = c.render("");
        assert!(
            text.contains("the kernel against itself 12 of 36"),
            "{text}"
        );
        assert!(text.contains("9 workloads recorded again at r"), "{text}");
    }
}
