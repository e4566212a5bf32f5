//! Text rendering of the fidelity report.

use std::fmt::Write as _;

use super::free_run::CostFit;
use super::{Agreement, Report, WhatIf};
use crate::sim::timing::Costs;

fn agreement(a: &Agreement) -> String {
    format!("{:>7.3} %  ({} of {})", a.percent(), a.agreed, a.compared)
}

/// The report as a human reads it.
pub fn render_text(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "variant {}: {} node(s), zone {} B, lazy_max_pages {}, VMALLOC {}..={}",
        r.variant.name(),
        r.nodes,
        r.zone_size,
        r.lazy_max_pages,
        r.vmalloc_start,
        r.vmalloc_end
    );
    if !r.rules_off.is_empty() {
        let names: Vec<String> = r
            .rules_off
            .iter()
            .map(|rule| {
                clap::ValueEnum::to_possible_value(rule)
                    .map_or_else(|| format!("{rule:?}"), |v| v.get_name().to_string())
            })
            .collect();
        let _ = writeln!(o, "rules off (--without): {}", names.join(", "));
    }
    let s = &r.seed;
    let _ = writeln!(
        o,
        "seeded from the snapshot: {} busy, {} vm_map_ram, {} unpurged ({} purged before it, by the records; {} lazy pages), {} outside VMALLOC, {} rejected; {} events before the snapshot skipped, {} in its window already reflected",
        s.busy, s.vm_map_ram, s.unpurged, s.purged_before_snapshot, s.lazy_pages, s.outside_range, s.rejected,
        s.events_before_snapshot, s.events_in_window_reflected
    );
    let _ = writeln!(
        o,
        "pools at the start: {}",
        if s.pools_drained {
            "drained before the snapshot (record --drain-pools)"
        } else {
            "unknown: entries from before the trace look free (record with --drain-pools to empty them)"
        }
    );
    if let Some(off) = s.first_free_nr_lazy_offset {
        let _ = writeln!(
            o,
            "seeded backlog check: first free's nr_lazy was {off:+} pages off the model's"
        );
    }
    let e = &r.events;
    let _ = writeln!(
        o,
        "events replayed: {} alloc ({} failed attempts), {} free, {} purge; out of model (other windows): {} alloc, {} free",
        e.alloc, e.alloc_failed, e.free, e.purge, e.alloc_out_of_model, e.free_out_of_model
    );
    let warm = match r.warmup_line {
        Some(l) => format!("after warm-up (line {l})"),
        None => "after warm-up (never)".into(),
    };
    let t = &r.strict;
    let _ = writeln!(
        o,
        "\nfidelity, strict (nothing read ahead; each event scored before it is used)"
    );
    let _ = writeln!(o, "  placement, all           {}", agreement(&t.placement));
    let _ = writeln!(
        o,
        "  placement, after warm-up {}",
        agreement(&t.placement_after_warmup)
    );
    let _ = writeln!(o, "  nr_lazy per free, exact  {}", agreement(&t.nr_lazy));
    let _ = writeln!(o, "  npurged per purge        {}", agreement(&t.npurged));
    let _ = writeln!(
        o,
        "\n{}",
        if r.causal {
            "fidelity, causal replay (--causal: nothing read ahead, so these are strict too)"
        } else {
            "fidelity, explained (observed timing; read-ahead and the rules counted below may help)"
        }
    );
    let _ = writeln!(o, "  placement, all           {}", agreement(&r.placement));
    let _ = writeln!(
        o,
        "  placement, {warm:<13} {}",
        agreement(&r.placement_after_warmup)
    );
    let _ = writeln!(o, "  failed attempts          {}", agreement(&r.failures));
    let _ = writeln!(o, "  nr_lazy per free         {}", agreement(&r.nr_lazy));
    let _ = writeln!(
        o,
        "  nr_lazy after warm-up    {}",
        agreement(&r.nr_lazy_after_warmup)
    );
    let _ = writeln!(o, "  npurged per purge        {}", agreement(&r.npurged));
    let d = &r.drain_work;
    if d.purges_in_work + d.purges_without_work > 0 {
        // Without the purge_work probe every purge lands in "without": say what that costs.
        let _ = writeln!(
            o,
            "  purges in drain work     {} of {} ({} early purges refused, {} frees between an \
             item's start and its purge)",
            d.purges_in_work,
            d.purges_in_work + d.purges_without_work,
            d.early_refused,
            d.frees_after_work_start
        );
        let _ = writeln!(
            o,
            "  purges started at item   {} ({} areas topped up at the event to the observed npurged)",
            r.purges_started_at_work, r.purged_late
        );
        if let Some(step) = r.detach_step_fitted_ns {
            let _ = writeln!(
                o,
                "  detach step fitted       {:.0} µs between two nodes' detaches (from {} purges)",
                step as f64 / 1000.0,
                r.detach_step_fit_purges
            );
        }
    }
    let _ = writeln!(
        o,
        "  VA high-water mark       observed {}  predicted {}",
        r.observed_high_water, r.predicted_high_water
    );
    let _ = writeln!(
        o,
        "  page-table slots         observed {} PTE / {} PMD / {} PUD  predicted {} / {} / {}",
        r.observed_slots.pte_tables,
        r.observed_slots.pmd_tables,
        r.observed_slots.pud_tables,
        r.predicted_slots.pte_tables,
        r.predicted_slots.pmd_tables,
        r.predicted_slots.pud_tables
    );
    let g = &r.page_table_growth;
    let opt = |v: Option<String>| v.unwrap_or_else(|| "n/a".into());
    let _ = writeln!(
        o,
        "  page-table growth        predicted +{} tables; observed: pt_page events {}, meminfo PageTables {}, allocinfo pagetable_alloc {}",
        g.predicted_new_tables,
        opt(g.observed_pt_page_events.map(|v| format!("+{v}"))),
        opt(g.meminfo_page_tables_delta_kb.map(|v| format!("{v:+} kB"))),
        opt(g.allocinfo_pagetable_delta_bytes.map(|v| format!("{v:+} B"))),
    );
    if !r.purges.is_empty() {
        let _ = writeln!(
            o,
            "\npurges (line: observed/predicted npurged, pages, pooled, decayed, helpers)"
        );
        for p in r.purges.iter().take(20) {
            let _ = writeln!(
                o,
                "  {:>8}: {:>6}/{:<6} {:>8} {:>6} {:>6} {}{}{}",
                p.line,
                p.observed_npurged,
                p.predicted_npurged,
                p.pages,
                p.pooled,
                p.decayed,
                p.helpers,
                if p.full { " full" } else { "" },
                if p.observed_npurged == p.predicted_npurged {
                    ""
                } else {
                    "  <- differs"
                }
            );
        }
        if r.purges.len() > 20 {
            let _ = writeln!(o, "  … {} more", r.purges.len() - 20);
        }
    }
    if !r.divergence_classes.is_empty() {
        let _ = writeln!(o, "\ndivergences by class");
        for (k, v) in &r.divergence_classes {
            let _ = writeln!(o, "  {k:<36} {v}");
        }
        let _ = writeln!(o, "\nfirst divergences");
        for d in &r.first_divergences {
            let _ = writeln!(
                o,
                "  line {} {} cpu {} size {} align {}: observed {} predicted {} [{}]\n      {}",
                d.line, d.kind, d.cpu, d.size, d.align, d.observed, d.predicted, d.class, d.context
            );
        }
    }
    if !r.warnings.is_empty() {
        let _ = writeln!(o, "\nwarnings (--strict makes them fatal)");
        for (k, v) in &r.warnings {
            let _ = writeln!(o, "  {k:<36} {v}");
        }
        for w in &r.first_warnings {
            let _ = writeln!(o, "  {w}");
        }
    }
    let m = &r.model;
    let _ = writeln!(
        o,
        "\nmodel ({} purges applied before their event, {} pooled ranges found free, {} ranges hidden, {} of them used later, {} pooled from below a pick, {} freed above one, {} split at a top pick, {} pool entries put back, {} purge-loop entries withheld ({} taken early)): {} allocs ({} pool hits, {} rotations; fits FL {} LE {} RE {} NE {}), {} frees, {} purges, {} drains triggered; at end {} pooled, {} lazy pages",
        r.early_purges, r.pooled_found_free, r.hidden_ranges, r.hidden_ranges_used, r.hidden_ranges_pooled, r.hidden_ranges_freed, r.hidden_ranges_split, r.pool_entries_restored, r.loop_entries_withheld, r.loop_entries_caught_up, m.allocs, m.pool_hits, m.pool_rotations, m.fit_fl, m.fit_le, m.fit_re, m.fit_ne,
        m.frees, m.purges, m.drains_triggered, r.pooled_objects_at_end, r.lazy_pages_at_end
    );
    let l = &r.locks;
    let _ = writeln!(
        o,
        "lock sections: free_vmap_area_lock {}, vmap_purge_lock {}, page_table_lock {}, busy {:?}, lazy {:?}, pool {:?}",
        l.free_vmap_area_lock, l.vmap_purge_lock, l.page_table_lock, l.busy, l.lazy, l.pool
    );
    o
}

/// The free-running comparison of variants: one row per variant, the waits per lock class, and
/// what the trace itself observed beside the predictions.
pub fn render_comparison(w: &[WhatIf]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "what-if (free-running: the model places every area and purges on its own threshold; lock waits from a discrete-event simulation of the CPUs' operation streams, docs/model.md)"
    );
    let _ = writeln!(
        o,
        "  {:<13} {:>5} {:>9} {:>10} {:>11} {:>10} {:>10} {:>14} {:>7} {:>8}",
        "variant",
        "nodes",
        "lazy_max",
        "lock wait",
        "throughput",
        "makespan",
        "footprint",
        "PT slots",
        "purges",
        "failures"
    );
    let _ = writeln!(
        o,
        "  {:<13} {:>5} {:>9} {:>10} {:>11} {:>10} {:>10} {:>14} {:>7} {:>8}",
        "", "", "pages", "share", "Mops/s", "ms", "MiB", "PTE/PMD/PUD", "", ""
    );
    for v in w {
        let _ = writeln!(
            o,
            "  {:<13} {:>5} {:>9} {:>9.1}% {:>11.3} {:>10.3} {:>10.1} {:>14} {:>7} {:>8}",
            v.variant.name(),
            v.nodes,
            v.lazy_max_pages,
            100.0 * v.lock_wait_share,
            v.throughput_ops_per_s / 1e6,
            v.makespan_ns as f64 / 1e6,
            v.high_water_bytes as f64 / f64::from(1u32 << 20),
            format!(
                "{}/{}/{}",
                v.slots.pte_tables, v.slots.pmd_tables, v.slots.pud_tables
            ),
            v.purges,
            v.alloc_failures
        );
    }
    let _ = writeln!(
        o,
        "\n  lock waits per class (instances, sections, held ms, sections that waited, predicted wait ms, wait per alloc/free, peak utilisation of one instance in a window)"
    );
    for v in w {
        let _ = writeln!(
            o,
            "  {} ({} allocs, {} frees over {:.3} ms of trace, {:.3} ms simulated, on {} CPUs; {} frees of unknown areas; {} purges, {} of them follow-ups{}):",
            v.variant.name(),
            v.allocs,
            v.frees,
            v.duration_ns as f64 / 1e6,
            v.makespan_ns as f64 / 1e6,
            v.cpus,
            v.frees_unknown,
            v.purges,
            v.follow_up_purges,
            match (v.late_starts, v.unfinished_ops) {
                (0, 0) => String::new(),
                (l, 0) => format!("; {l} operations started late (pending cap)"),
                (l, u) => format!(
                    "; {l} operations started late, {u} never finished (a simulation bug)"
                ),
            }
        );
        for c in &v.lock_waits {
            let _ = writeln!(
                o,
                "    {:<16} {:>3} inst {:>9} sections {:>9.3} held {:>9} waited {:>11.3} wait {:>9.1} ns/op  peak {:>5.2}",
                c.class.name(),
                c.instances,
                c.sections,
                c.held_ns as f64 / 1e6,
                c.waits,
                c.wait_ns as f64 / 1e6,
                c.wait_per_op_ns,
                c.max_utilisation
            );
        }
    }
    if let Some(first) = w.first() {
        o.push_str(&render_observed(first, w));
    }
    o
}

/// Observed contention per lock class (the trace's `contention` events) beside each variant's
/// predicted waits for the same workload, and observed against predicted `alloc_vmap_area`
/// latency.
fn render_observed(first: &WhatIf, w: &[WhatIf]) -> String {
    let mut o = String::new();
    let obs = &first.observed;
    if obs.contention.is_empty() {
        let _ = writeln!(
            o,
            "\n  observed contention: none in the trace (record with the lock_waits probe to compare with the prediction)"
        );
    } else {
        let _ = writeln!(
            o,
            "\n  observed contention (trace) beside predicted waits (waits, ms)"
        );
        let mut head = format!("    {:<16} {:>20}", "class", "observed");
        for v in w {
            let _ = write!(head, " {:>20}", v.variant.name());
        }
        let _ = writeln!(o, "{head}");
        let mut classes: Vec<_> = obs.contention.iter().map(|c| c.class).collect();
        for v in w {
            for c in &v.lock_waits {
                if !classes.contains(&c.class) {
                    classes.push(c.class);
                }
            }
        }
        classes.sort_by_key(|c| crate::trace::LockClass::ALL.iter().position(|k| k == c));
        for class in classes {
            let (n, ns) = obs
                .contention
                .iter()
                .find(|c| c.class == class)
                .map_or((0, 0), |c| (c.count, c.wait_ns));
            let mut line = format!(
                "    {:<16} {:>20}",
                class.name(),
                format!("{n} / {:.3}", ns as f64 / 1e6)
            );
            for v in w {
                let (n, ns) = v
                    .lock_waits
                    .iter()
                    .find(|c| c.class == class)
                    .map_or((0, 0), |c| (c.waits, c.wait_ns));
                let _ = write!(line, " {:>20}", format!("{n} / {:.3}", ns as f64 / 1e6));
            }
            let _ = writeln!(o, "{line}");
        }
    }
    if obs.latency_count > 0 {
        let mut line = format!(
            "  alloc_vmap_area latency, mean: observed {:.0} ns ({} events)",
            obs.latency_ns as f64 / obs.latency_count as f64,
            obs.latency_count
        );
        for v in w {
            let _ = write!(
                line,
                "; {} {:.0} ns",
                v.variant.name(),
                v.alloc_vmap_area_mean_ns
            );
        }
        let _ = writeln!(o, "{line}");
    }
    o
}

/// What `--fit-costs` fitted: per observed class the observed wait, the prediction with the
/// starting costs and with the fitted ones, and the costs that moved.
pub fn render_fit(f: &CostFit) -> String {
    let mut o = String::new();
    let (Some(first), Some(last)) = (f.rounds.first(), f.rounds.last()) else {
        return o;
    };
    let _ = writeln!(
        o,
        "cost fit (variant nodes, free-running, from the trace's contention and latency events; {} simulation(s), {})",
        f.rounds.len(),
        if f.converged {
            "every observed figure within 5 %"
        } else if first.classes.is_empty() && first.observed_latency_mean_ns.is_none() {
            "nothing observed to fit: costs unchanged"
        } else {
            "not converged: the last costs are used"
        }
    );
    if !last.classes.is_empty() {
        let _ = writeln!(
            o,
            "  {:<16} {:>22} {:>22} {:>22}",
            "class", "observed waits / ms", "predicted, start", "predicted, fitted"
        );
    }
    for c in &last.classes {
        let start = first
            .classes
            .iter()
            .find(|s| s.class == c.class)
            .map_or((0, 0), |s| (s.predicted_waits, s.predicted_wait_ns));
        let cell = |n: u64, ns: u64| format!("{n} / {:.3}", ns as f64 / 1e6);
        let _ = writeln!(
            o,
            "  {:<16} {:>22} {:>22} {:>22}",
            c.class.name(),
            cell(c.observed_waits, c.observed_wait_ns),
            cell(start.0, start.1),
            cell(c.predicted_waits, c.predicted_wait_ns)
        );
    }
    if let Some(obs) = last.observed_latency_mean_ns {
        let _ = writeln!(
            o,
            "  alloc_vmap_area latency, mean: observed {obs:.0} ns, predicted {:.0} ns at the start, {:.0} ns fitted",
            first.predicted_latency_mean_ns, last.predicted_latency_mean_ns
        );
    }
    let moved: Vec<String> = Costs::NAMES
        .iter()
        .filter_map(|&n| {
            let (a, b) = (f.initial.get(n)?, f.fitted.get(n)?);
            (a != b).then(|| format!("{n} {a} -> {b}"))
        })
        .collect();
    if !moved.is_empty() {
        let _ = writeln!(o, "  costs: {}", moved.join(", "));
    }
    if !f.unobserved.is_empty() {
        let names: Vec<&str> = f.unobserved.iter().map(|c| c.name()).collect();
        let _ = writeln!(
            o,
            "  not fitted (no contention observed): {}",
            names.join(", ")
        );
    }
    o
}
