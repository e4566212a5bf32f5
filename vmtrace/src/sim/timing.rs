//! Timing: what each critical section and operation costs, what the simulation predicts per
//! lock class, and what a trace observed.
//!
//! Pure arithmetic, no I/O, deterministic (kept out of `model` because it speaks the trace's
//! lock classes; the model depends on nothing else in the crate). `vmtrace synth` uses [`Costs`]
//! to lay out per-CPU operation streams in time; free-running replay turns every operation the
//! model runs into critical sections with these costs and simulates their queueing
//! ([`super::des`]). `docs/model.md` ("Timing and contention model") gives the assumptions.

use std::collections::BTreeMap;

use serde::Serialize;

use super::des::OpWaits;
use crate::trace::LockClass;

/// A `--cost NAME=NS` that names no cost or has no valid value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CostError {
    #[error("unknown cost `{0}`: expected one of {names}", names = Costs::NAMES.join(", "))]
    Unknown(String),
    #[error("`{0}`: expected NAME=NANOSECONDS, e.g. free_area_lock_ns=300")]
    Syntax(String),
}

/// Documented default costs, in nanoseconds. They are round figures of the order measured for
/// small vmalloc calls on a current x86_64 server, not fitted to any machine: predictions built
/// on them are comparisons between variants, not absolute forecasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Costs {
    /// `vmalloc` of N pages, uncontended: fixed part (vm_struct, `alloc_vmap_area`).
    pub alloc_base_ns: u64,
    /// The part of `alloc_base_ns` spent in `alloc_vmap_area` outside its locks (the vmap_area
    /// object, the preload): with the sections and their waits, the latency that `latency`
    /// events measure.
    pub alloc_vmap_area_ns: u64,
    /// Per mapped page (page allocation and PTE set-up).
    pub alloc_per_page_ns: u64,
    /// `vfree` of N pages, uncontended: fixed part (lookup, lazy free).
    pub free_base_ns: u64,
    /// Per mapped page (unmap, page freeing).
    pub free_per_page_ns: u64,
    /// Critical section of `free_vmap_area_lock` for one search-and-split or one merge.
    pub free_area_lock_ns: u64,
    /// Per area merged back while a purge holds `free_vmap_area_lock`.
    pub merge_per_area_ns: u64,
    /// `vn->busy.lock` (or the global `vmap_area_lock`): one insert or unlink.
    pub busy_lock_ns: u64,
    /// `vn->lazy.lock` (or `purge_vmap_area_lock`): one insert or a detach.
    pub lazy_lock_ns: u64,
    /// `vn->pool_lock`: one head take or push.
    pub pool_lock_ns: u64,
    /// `init_mm.page_table_lock`: one new page-table page.
    pub page_table_lock_ns: u64,
    /// `vmap_purge_lock` held by one purge: fixed part (TLB flush) ...
    pub purge_base_ns: u64,
    /// ... plus this per purged object.
    pub purge_per_object_ns: u64,
    /// A contended spinlock's handoff: from the holder's release to the waiter's entry, the
    /// `contention` probes' own cost included. Every observed wait contains it, whatever the
    /// class, so waits never fall below it; the simulation adds it to each wait, and no one else
    /// takes the lock meanwhile. 0 (nothing measured, or an older calibration) adds none.
    #[serde(default)]
    pub spin_handoff_ns: u64,
}

impl Default for Costs {
    fn default() -> Self {
        Self {
            alloc_base_ns: 1000,
            alloc_vmap_area_ns: 300,
            alloc_per_page_ns: 200,
            free_base_ns: 400,
            free_per_page_ns: 50,
            free_area_lock_ns: 250,
            merge_per_area_ns: 100,
            busy_lock_ns: 80,
            lazy_lock_ns: 60,
            pool_lock_ns: 40,
            page_table_lock_ns: 150,
            purge_base_ns: 2000,
            purge_per_object_ns: 100,
            spin_handoff_ns: 0,
        }
    }
}

impl Costs {
    /// Every cost's name, as `--cost` and the trace header's `synthetic.params` spell it.
    pub const NAMES: [&'static str; 14] = [
        "alloc_base_ns",
        "alloc_vmap_area_ns",
        "alloc_per_page_ns",
        "free_base_ns",
        "free_per_page_ns",
        "free_area_lock_ns",
        "merge_per_area_ns",
        "busy_lock_ns",
        "lazy_lock_ns",
        "pool_lock_ns",
        "page_table_lock_ns",
        "purge_base_ns",
        "purge_per_object_ns",
        "spin_handoff_ns",
    ];

    fn field(&mut self, name: &str) -> Option<&mut u64> {
        Some(match name {
            "alloc_base_ns" => &mut self.alloc_base_ns,
            "alloc_vmap_area_ns" => &mut self.alloc_vmap_area_ns,
            "alloc_per_page_ns" => &mut self.alloc_per_page_ns,
            "free_base_ns" => &mut self.free_base_ns,
            "free_per_page_ns" => &mut self.free_per_page_ns,
            "free_area_lock_ns" => &mut self.free_area_lock_ns,
            "merge_per_area_ns" => &mut self.merge_per_area_ns,
            "busy_lock_ns" => &mut self.busy_lock_ns,
            "lazy_lock_ns" => &mut self.lazy_lock_ns,
            "pool_lock_ns" => &mut self.pool_lock_ns,
            "page_table_lock_ns" => &mut self.page_table_lock_ns,
            "purge_base_ns" => &mut self.purge_base_ns,
            "purge_per_object_ns" => &mut self.purge_per_object_ns,
            "spin_handoff_ns" => &mut self.spin_handoff_ns,
            _ => return None,
        })
    }

    /// The cost called `name`.
    pub fn get(&self, name: &str) -> Option<u64> {
        let mut c = *self;
        c.field(name).map(|v| *v)
    }

    /// Overrides the cost called `name`.
    pub fn set(&mut self, name: &str, ns: u64) -> Result<(), CostError> {
        let f = self
            .field(name)
            .ok_or_else(|| CostError::Unknown(name.to_string()))?;
        *f = ns;
        Ok(())
    }

    /// Parses `NAME=NS` (a `--cost` argument) into a known name and a value.
    pub fn parse_override(s: &str) -> Result<(String, u64), CostError> {
        let (name, ns) = crate::value_parsers::name_and_number(s)
            .ok_or_else(|| CostError::Syntax(s.to_string()))?;
        if Costs::default().get(name).is_none() {
            return Err(CostError::Unknown(name.to_string()));
        }
        Ok((name.to_string(), ns))
    }

    /// The costs that make up the sections of `class`: the ones fitting scales when the
    /// class's predicted wait differs from the observed one. The purge mutex is held through a
    /// whole purge, so its waits follow the purge's own costs.
    pub fn class_costs(class: LockClass) -> &'static [&'static str] {
        match class {
            LockClass::FreeAreaLock => &["free_area_lock_ns", "merge_per_area_ns"],
            LockClass::NodeBusyLock => &["busy_lock_ns"],
            LockClass::NodeLazyLock => &["lazy_lock_ns"],
            LockClass::NodePoolLock => &["pool_lock_ns"],
            LockClass::PageTableLock => &["page_table_lock_ns"],
            LockClass::PurgeMutex => &["purge_base_ns", "purge_per_object_ns"],
            LockClass::Other => &[],
        }
    }

    /// Uncontended time of one allocation mapping `pages` pages.
    pub fn alloc_ns(&self, pages: u64) -> u64 {
        self.alloc_base_ns + self.alloc_per_page_ns * pages
    }

    /// Uncontended time of one free of an area mapping `pages` pages.
    pub fn free_ns(&self, pages: u64) -> u64 {
        self.free_base_ns + self.free_per_page_ns * pages
    }

    /// Section cost of one ordinary (non-purge) section of a lock class.
    pub fn section_ns(&self, class: LockClass) -> u64 {
        match class {
            LockClass::FreeAreaLock => self.free_area_lock_ns,
            LockClass::NodeBusyLock => self.busy_lock_ns,
            LockClass::NodeLazyLock => self.lazy_lock_ns,
            LockClass::NodePoolLock => self.pool_lock_ns,
            LockClass::PageTableLock => self.page_table_lock_ns,
            LockClass::PurgeMutex => self.purge_base_ns,
            LockClass::Other => 0,
        }
    }
}

/// Predicted waits of one lock class.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassWait {
    pub class: LockClass,
    /// Lock instances of this class that saw at least one section.
    pub instances: u32,
    pub sections: u64,
    /// Time the locks of this class were held (a mutex: from acquisition to release).
    pub held_ns: u64,
    /// Predicted queueing wait, all sections together.
    pub wait_ns: u64,
    /// Highest utilisation of one instance in one window (time held / window, at most 1).
    pub max_utilisation: f64,
    /// Distribution of the wait of the sections that waited (wait > 0, as a `contention` event
    /// is only written for a wait), in exp2 buckets. Charts and `--json` consumers read it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub wait_histogram: Vec<HistBucket>,
    /// Sections that waited at all.
    pub waits: u64,
    /// The wait split by the operation that waited.
    pub wait_by_op: OpWaits,
    /// Wait per allocation or free (all of this class's wait over the callers' operations).
    pub wait_per_op_ns: f64,
}

/// One exp2 bucket of a wait distribution: `count` sections waited at most `le_ns` (and more
/// than the previous bucket's bound). Prometheus-style upper bounds, so the exporter's and the
/// model's distributions read the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HistBucket {
    pub le_ns: u64,
    pub count: u64,
}

/// Lock waits one class showed in the trace's `contention` events.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ObservedWait {
    pub class: LockClass,
    pub count: u64,
    pub wait_ns: u64,
    /// The same exp2 buckets as [`ClassWait::wait_histogram`].
    pub wait_histogram: Vec<HistBucket>,
}

/// Critical sections of one class the `lock_holds` probe timed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ObservedHold {
    pub class: LockClass,
    pub count: u64,
    pub mean_ns: f64,
}

/// What the trace itself says about timing, beside the simulation's prediction.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Observed {
    /// `contention` events per class (`lock_waits` probe), in [`LockClass::ALL`] order; empty
    /// when the trace has none.
    pub contention: Vec<ObservedWait>,
    /// Timed holds per class (`lock_holds` probe, from the footer); empty without it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<ObservedHold>,
    /// `latency` events (`alloc_vmap_area` entry to exit, richer probe rungs only).
    pub latency_count: u64,
    pub latency_ns: u64,
}

/// Collects [`Observed`] while a trace is read.
#[derive(Clone, Debug, Default)]
pub struct ObservedAcc {
    classes: BTreeMap<LockClass, (u64, u64, [u64; 64])>,
    holds: Vec<ObservedHold>,
    latency_count: u64,
    latency_ns: u64,
}

impl ObservedAcc {
    pub fn contention(&mut self, class: LockClass, wait_ns: u64) {
        let e = self.classes.entry(class).or_insert((0, 0, [0; 64]));
        e.0 += 1;
        e.1 += wait_ns;
        if wait_ns > 0 {
            e.2[exp2_bucket(wait_ns)] += 1;
        }
    }

    /// The footer's timed holds of one class.
    pub fn hold(&mut self, h: &crate::trace::ClassHolds) {
        if h.count > 0 {
            self.holds.push(ObservedHold {
                class: h.class,
                count: h.count,
                mean_ns: h.mean_ns(),
            });
        }
    }

    pub fn latency(&mut self, latency_ns: u64) {
        self.latency_count += 1;
        self.latency_ns += latency_ns;
    }

    pub fn finish(self) -> Observed {
        let mut contention: Vec<ObservedWait> = self
            .classes
            .into_iter()
            .map(|(class, (count, wait_ns, h))| ObservedWait {
                class,
                count,
                wait_ns,
                wait_histogram: exp2_histogram(&h),
            })
            .collect();
        contention.sort_by_key(|c| LockClass::ALL.iter().position(|&k| k == c.class));
        Observed {
            contention,
            holds: self.holds,
            latency_count: self.latency_count,
            latency_ns: self.latency_ns,
        }
    }
}

/// Bucket of a wait of `w >= 1` ns: the smallest `k` with `w <= 2^k`.
pub fn exp2_bucket(w: u64) -> usize {
    ((64 - w.saturating_sub(1).leading_zeros()) as usize).min(63)
}

/// The non-empty range of exp2 buckets, as Prometheus-style upper bounds (`le_ns` = 2^k).
pub fn exp2_histogram(h: &[u64; 64]) -> Vec<HistBucket> {
    let Some(lo) = h.iter().position(|&c| c > 0) else {
        return Vec::new();
    };
    let hi = h.iter().rposition(|&c| c > 0).unwrap_or(lo);
    (lo..=hi)
        .map(|k| HistBucket {
            le_ns: 1u64 << k,
            count: h[k],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_by_name() {
        let mut c = Costs::default();
        for name in Costs::NAMES {
            c.set(name, 7).expect(name);
            assert_eq!(c.get(name), Some(7), "{name}");
        }
        assert_eq!(
            Costs::parse_override("free_area_lock_ns=300"),
            Ok(("free_area_lock_ns".to_string(), 300))
        );
        assert!(matches!(
            Costs::parse_override("free_area_lock=300"),
            Err(CostError::Unknown(_))
        ));
        assert!(matches!(
            Costs::parse_override("free_area_lock_ns=-1"),
            Err(CostError::Syntax(_))
        ));
        assert!(matches!(
            Costs::parse_override("free_area_lock_ns"),
            Err(CostError::Syntax(_))
        ));
        for class in LockClass::ALL {
            for name in Costs::class_costs(class) {
                assert!(Costs::default().get(name).is_some(), "{name}");
            }
        }
    }

    #[test]
    fn exp2_buckets_are_upper_bounds() {
        for (w, k) in [
            (1, 0),
            (2, 1),
            (3, 2),
            (4, 2),
            (5, 3),
            (1024, 10),
            (1025, 11),
        ] {
            assert_eq!(exp2_bucket(w), k, "{w}");
            assert!(w <= 1u64 << k && (k == 0 || w > 1u64 << (k - 1)));
        }
        let mut h = [0u64; 64];
        h[3] = 2;
        h[5] = 1;
        let b = exp2_histogram(&h);
        assert_eq!(b.len(), 3);
        assert_eq!((b[0].le_ns, b[0].count), (8, 2));
        assert_eq!((b[1].le_ns, b[1].count), (16, 0));
        assert_eq!((b[2].le_ns, b[2].count), (32, 1));
    }
}
