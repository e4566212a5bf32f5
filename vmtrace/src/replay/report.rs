//! Text rendering of the fidelity report.

use std::fmt::Write as _;

use super::{Agreement, Report, WhatIf};

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
    let s = &r.seed;
    let _ = writeln!(
        o,
        "seeded from the snapshot: {} busy, {} vm_map_ram, {} unpurged ({} lazy pages), {} outside VMALLOC, {} rejected; {} events before the snapshot skipped, {} in its window already reflected",
        s.busy, s.vm_map_ram, s.unpurged, s.lazy_pages, s.outside_range, s.rejected,
        s.events_before_snapshot, s.events_in_window_reflected
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
    let _ = writeln!(o, "\nfidelity (observed timing)");
    let _ = writeln!(o, "  placement, all           {}", agreement(&r.placement));
    let warm = match r.warmup_line {
        Some(l) => format!("after warm-up (line {l})"),
        None => "after warm-up (never)".into(),
    };
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
        "\nmodel ({} purges applied before their event, {} shrinker decays inferred, {} ranges hidden, {} of them used later): {} allocs ({} pool hits, {} rotations; fits FL {} LE {} RE {} NE {}), {} frees, {} purges, {} drains triggered; at end {} pooled, {} lazy pages",
        r.early_purges, r.shrinks_inferred, r.hidden_ranges, r.hidden_ranges_used, m.allocs, m.pool_hits, m.pool_rotations, m.fit_fl, m.fit_le, m.fit_re, m.fit_ne,
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

/// The free-running comparison of variants: one row per variant, then the waits per lock class.
pub fn render_comparison(w: &[WhatIf]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "what-if (free-running: the model places every area and purges on its own threshold; predicted lock waits from the contention model, docs/model.md)"
    );
    let _ = writeln!(
        o,
        "  {:<13} {:>5} {:>9} {:>10} {:>12} {:>12} {:>14} {:>8} {:>9}",
        "variant",
        "nodes",
        "lazy_max",
        "lock wait",
        "throughput",
        "footprint",
        "PT slots",
        "purges",
        "failures"
    );
    let _ = writeln!(
        o,
        "  {:<13} {:>5} {:>9} {:>10} {:>12} {:>12} {:>14} {:>8} {:>9}",
        "", "", "pages", "share", "Mops/s", "MiB", "PTE/PMD/PUD", "", ""
    );
    for v in w {
        let _ = writeln!(
            o,
            "  {:<13} {:>5} {:>9} {:>9.1}% {:>12.3} {:>12.1} {:>14} {:>8} {:>9}",
            v.variant.name(),
            v.nodes,
            v.lazy_max_pages,
            100.0 * v.lock_wait_share,
            v.throughput_ops_per_s / 1e6,
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
        "\n  lock waits per class (sections, held ms, predicted wait ms, peak utilisation of one instance in a window)"
    );
    for v in w {
        let _ = writeln!(
            o,
            "  {} ({} allocs, {} frees over {:.3} ms on {} CPUs, {} frees of unknown areas):",
            v.variant.name(),
            v.allocs,
            v.frees,
            v.duration_ns as f64 / 1e6,
            v.cpus,
            v.frees_unknown
        );
        for c in &v.lock_waits {
            let _ = writeln!(
                o,
                "    {:<16} {:>3} inst {:>10} sections {:>10.3} held {:>12.3} wait  peak {:>6.2}",
                c.class.name(),
                c.instances,
                c.sections,
                c.held_ns as f64 / 1e6,
                c.wait_ns as f64 / 1e6,
                c.max_utilisation
            );
        }
    }
    o
}
