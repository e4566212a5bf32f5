//! Drawing: one function per panel, all reading an [`App`] and doing no I/O.
//!
//! [`draw`] is generic over the ratatui `Backend`, so tests render into `TestBackend` and the
//! batch mode (`top -b`) prints the same screen as text.

use ratatui::backend::Backend;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Gauge, Paragraph, Sparkline, Wrap};
use ratatui::{Frame, Terminal};

use super::app::{size_label, App, Mode, Panel, SIZE_BUCKETS};
use crate::trace::LockClass;

/// Draws one frame.
pub fn draw<B: Backend>(term: &mut Terminal<B>, app: &App) -> Result<(), B::Error> {
    term.draw(|f| frame(f, app))?;
    Ok(())
}

/// Lays out the whole screen.
pub fn frame(f: &mut Frame, app: &App) {
    let banner = app.info.as_ref().and_then(|i| i.banner.as_ref()).is_some();
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(3 + u16::from(banner) + u16::from(app.ended.is_some())),
        Constraint::Min(4),
        Constraint::Length(1),
    ])
    .areas(f.area());
    header(f, head, app);
    if app.zoomed {
        panel(f, body, app, app.focus);
    } else {
        let rows = Layout::vertical([
            Constraint::Length(8),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Min(6),
        ])
        .split(body);
        let grid: [[Panel; 2]; 3] = [
            [Panel::Rates, Panel::Lazy],
            [Panel::Sizes, Panel::Nodes],
            [Panel::Footprint, Panel::PageTables],
        ];
        for (row, panels) in rows.iter().zip(grid) {
            let cols = Layout::horizontal([Constraint::Percentage(50); 2]).split(*row);
            for (area, p) in cols.iter().zip(panels) {
                panel(f, *area, app, p);
            }
        }
        let [left, right] = Layout::horizontal([Constraint::Percentage(50); 2]).areas(rows[3]);
        panel(f, left, app, Panel::Callers);
        let [locks, model] =
            Layout::vertical([Constraint::Fill(1), Constraint::Length(8)]).areas(right);
        panel(f, locks, app, Panel::Locks);
        panel(f, model, app, Panel::Model);
    }
    footer(f, foot, app);
    if app.help {
        help(f, f.area());
    }
}

/// Draws one panel in its bordered block, highlighted when focused.
pub fn panel(f: &mut Frame, area: Rect, app: &App, p: Panel) {
    let style = if app.focus == p {
        Style::default()
            .fg(Color::Cyan)
            .add_modifier(Modifier::BOLD)
    } else {
        Style::default()
    };
    let block = Block::bordered().title(p.title()).border_style(style);
    let inner = block.inner(area);
    f.render_widget(Clear, area);
    f.render_widget(block, area);
    match p {
        Panel::Rates => rates(f, inner, app),
        Panel::Sizes => sizes(f, inner, app),
        Panel::Lazy => lazy(f, inner, app),
        Panel::Nodes => nodes(f, inner, app),
        Panel::Footprint => footprint(f, inner, app),
        Panel::PageTables => page_tables(f, inner, app),
        Panel::Locks => locks(f, inner, app),
        Panel::Callers => callers(f, inner, app),
        Panel::Model => model(f, inner, app),
    }
}

/// Kernel, CPUs, nodes, probe rungs, lost events, mode and state.
pub fn header(f: &mut Frame, area: Rect, app: &App) {
    let mut lines = Vec::new();
    let state = if app.paused {
        format!(" PAUSED ({} held)", app.pending_records())
    } else {
        String::new()
    };
    match &app.info {
        None => lines.push(Line::from("vmtrace top: waiting for the event source…")),
        Some(i) => {
            let mode = match &i.mode {
                Mode::Live => "live".to_string(),
                Mode::Replay { name, speed } => format!("replay {name} at {speed}x"),
            };
            let lost_style = if app.lost() > 0 {
                Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)
            } else {
                Style::default()
            };
            lines.push(Line::from(vec![
                Span::styled("vmtrace top", Style::default().add_modifier(Modifier::BOLD)),
                Span::raw(format!(" | {mode} | window {}s | ", app.window_secs)),
                Span::styled(format!("lost {}", app.lost()), lost_style),
                Span::styled(state, Style::default().fg(Color::Yellow)),
            ]));
            lines.push(Line::from(format!(
                "kernel {} | {} CPUs | {} vmap nodes (zone {}) | lazy_max_pages {}",
                i.kernel,
                i.cpus,
                i.nodes,
                bytes(i.zone_size),
                i.lazy_max_pages
            )));
            let probes: Vec<String> = i
                .probes
                .iter()
                .map(|p| {
                    let name = p.logical.clone().unwrap_or_else(|| {
                        p.probe.rsplit(':').next().unwrap_or(&p.probe).to_string()
                    });
                    format!("{name}={}", p.rung)
                })
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            lines.push(Line::from(format!("probes: {}", probes.join(" "))));
            if let Some(b) = &i.banner {
                lines.push(Line::styled(
                    format!(" {b} "),
                    Style::default()
                        .fg(Color::Black)
                        .bg(Color::Yellow)
                        .add_modifier(Modifier::BOLD),
                ));
            }
        }
    }
    if let Some(e) = &app.ended {
        lines.push(Line::styled(e.clone(), Style::default().fg(Color::Yellow)));
    }
    f.render_widget(Paragraph::new(lines), area);
}

/// Allocation, free and purge rates as sparklines over the time window.
pub fn rates(f: &mut Frame, area: Rect, app: &App) {
    let c = &app.c;
    let rows = Layout::vertical([
        Constraint::Length(1),
        Constraint::Fill(1),
        Constraint::Length(1),
        Constraint::Fill(1),
        Constraint::Length(1),
        Constraint::Fill(1),
    ])
    .split(area);
    let w = (area.width as usize).min(app.window_secs);
    let series = [
        ("alloc", &c.alloc_rate, c.alloc, Color::Green),
        ("free", &c.free_rate, c.free, Color::Blue),
        ("purge", &c.purge_rate, c.purge, Color::Magenta),
    ];
    for (i, (name, s, total, color)) in series.into_iter().enumerate() {
        let extra = if name == "alloc" && c.failed > 0 {
            format!(", {} failed", c.failed)
        } else {
            String::new()
        };
        f.render_widget(
            Paragraph::new(format!("{name:<5} {:>8}/s  total {total}{extra}", s.rate())),
            rows[i * 2],
        );
        let data = s.last(w);
        f.render_widget(
            Sparkline::default()
                .data(&data)
                .style(Style::default().fg(color)),
            rows[i * 2 + 1],
        );
    }
}

/// Allocation sizes in pages (guard page included), as horizontal bars.
pub fn sizes(f: &mut Frame, area: Rect, app: &App) {
    let rows = size_rows(&app.c.sizes, area.height as usize);
    let max = rows.iter().map(|r| r.count).max().unwrap_or(0).max(1);
    let marker = |r: &SizeRow| (r.merged > 1).then(|| format!(" ({} merged)", r.merged));
    // The merged row's marker must stay on screen, so the bars leave room for it.
    let marker_w = rows
        .iter()
        .filter_map(marker)
        .map(|m| m.len())
        .max()
        .unwrap_or(0);
    let bar_w = (area.width as usize).saturating_sub(18 + marker_w).max(1);
    let lines: Vec<Line> = rows
        .iter()
        .map(|r| {
            let len = (r.count as usize * bar_w).div_ceil(max as usize);
            let mut spans = vec![
                Span::raw(format!("{:>8} {:>7} ", r.label, r.count)),
                Span::styled("█".repeat(len), Style::default().fg(Color::Green)),
            ];
            if let Some(m) = marker(r) {
                spans.push(Span::styled(m, Style::default().fg(Color::DarkGray)));
            }
            Line::from(spans)
        })
        .collect();
    f.render_widget(Paragraph::new(lines), area);
}

/// One row of the size panel: a bucket, or the tail of buckets merged into one.
#[derive(Debug, PartialEq, Eq)]
pub struct SizeRow {
    pub label: String,
    pub count: u64,
    /// Buckets in this row; more than one only in a merged last row.
    pub merged: usize,
}

/// The rows the size panel shows in `height` lines: from the first bucket that holds
/// allocations to the last, so a workload of 18-page areas is never cut off below empty small
/// sizes; when they do not fit, the last row merges the rest and says how many it holds.
pub fn size_rows(sizes: &[u64; SIZE_BUCKETS], height: usize) -> Vec<SizeRow> {
    let (Some(first), Some(last)) = (
        sizes.iter().position(|&n| n > 0),
        sizes.iter().rposition(|&n| n > 0),
    ) else {
        return Vec::new();
    };
    if height == 0 {
        return Vec::new();
    }
    let single = |b: usize| SizeRow {
        label: size_label(b),
        count: sizes[b],
        merged: 1,
    };
    if last - first < height {
        return (first..=last).map(single).collect();
    }
    let tail = first + height - 1;
    let mut rows: Vec<SizeRow> = (first..tail).map(single).collect();
    rows.push(SizeRow {
        label: format!("{}+", size_lower_bound(tail)),
        count: sizes[tail..=last].iter().sum(),
        merged: last - tail + 1,
    });
    rows
}

/// The smallest size, in pages, of a bucket.
fn size_lower_bound(bucket: usize) -> u64 {
    match bucket {
        0 => 1,
        b => (1u64 << (b - 1)) + 1,
    }
}

/// Lazy backlog against `lazy_max_pages`, with its peak per second and purge markers.
pub fn lazy(f: &mut Frame, area: Rect, app: &App) {
    let max = app.info.as_ref().map_or(0, |i| i.lazy_max_pages);
    let rows = Layout::vertical([
        Constraint::Length(1),
        Constraint::Fill(1),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .split(area);
    let ratio = if max > 0 {
        (app.lazy_pages as f64 / max as f64).clamp(0.0, 1.0)
    } else {
        0.0
    };
    f.render_widget(
        Gauge::default()
            .ratio(ratio)
            .label(format!(
                "{} / {} pages ({:.0}%)",
                app.lazy_pages,
                max,
                ratio * 100.0
            ))
            .gauge_style(Style::default().fg(Color::Yellow)),
        rows[0],
    );
    let w = (area.width as usize).min(app.window_secs);
    let data = app.c.lazy_peak.last(w);
    f.render_widget(
        Sparkline::default()
            .data(&data)
            .max(max.max(1))
            .style(Style::default().fg(Color::Yellow)),
        rows[1],
    );
    // One column per second, aligned with the sparkline: `^` where a purge ran.
    let first = app.now_sec + 1 - data.len() as u64;
    let marks: String = (0..data.len() as u64)
        .map(|i| {
            if app.c.purge_marks.contains(&(first + i)) {
                '^'
            } else {
                ' '
            }
        })
        .collect();
    f.render_widget(
        Paragraph::new(Line::styled(marks, Style::default().fg(Color::Magenta))),
        rows[2],
    );
    f.render_widget(
        Paragraph::new(format!(
            "purges {} (^), {} objects purged",
            app.c.purge, app.c.purged_objects
        )),
        rows[3],
    );
}

/// Share of successful allocations per vmap node, node = (addr / zone_size) % nodes.
pub fn nodes(f: &mut Frame, area: Rect, app: &App) {
    let total: u64 = app.c.node_allocs.iter().sum();
    let bar_w = (area.width as usize).saturating_sub(30).max(1);
    let mut lines = Vec::new();
    if let Some(i) = &app.info {
        lines.push(Line::from(format!(
            "node = (addr / {}) % {}",
            bytes(i.zone_size),
            i.nodes
        )));
    }
    for (n, (&a, &b)) in app.c.node_allocs.iter().zip(&app.c.node_bytes).enumerate() {
        let pct = if total > 0 {
            100.0 * a as f64 / total as f64
        } else {
            0.0
        };
        let len = (pct / 100.0 * bar_w as f64).round() as usize;
        lines.push(Line::from(vec![
            Span::raw(format!("n{n:<3} {pct:>5.1}% {a:>7} {:>9} ", bytes(b))),
            Span::styled("█".repeat(len), Style::default().fg(Color::Cyan)),
        ]));
    }
    f.render_widget(Paragraph::new(lines), area);
}

/// Busy, lazy, the model's pooled estimate and the high-water mark of the VA footprint.
pub fn footprint(f: &mut Frame, area: Rect, app: &App) {
    let pooled = match &app.model {
        Ok(m) => format!("{} objects (model)", m.pooled_objects),
        Err(why) => format!("n/a: {why}"),
    };
    let lines = vec![
        Line::from(format!("busy        {:>10}", bytes(app.busy_bytes))),
        Line::from(format!("lazy        {:>10}", bytes(app.lazy_bytes))),
        Line::from(format!(
            "busy+lazy   {:>10}",
            bytes(app.busy_bytes + app.lazy_bytes)
        )),
        Line::from(format!("high-water  {:>10}", bytes(app.c.high_water))),
        Line::from(format!("pooled      {pooled}")),
    ];
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), area);
}

/// Page-table pages seen by the page_tables probe beside the tables the model's placements and
/// the kernel's placements need, meminfo PageTables, and, live, what the page probes cost.
pub fn page_tables(f: &mut Frame, area: Rect, app: &App) {
    let mut lines = Vec::new();
    if let Some(pp) = &app.page_probes {
        lines.extend(page_probe_lines(pp).into_iter().map(Line::from));
    }
    let attached = app
        .info
        .as_ref()
        .map_or(Err("no source yet".to_string()), |i| {
            i.probe_attached("page_tables")
        });
    let since = if app.page_probes.is_some() {
        "since attached or reset"
    } else {
        "since start or reset"
    };
    match (&app.model, attached) {
        (Ok(m), attached) => {
            let base = app.c.slot_base.unwrap_or_default();
            // A replay's trace may hold the probe's records whatever its header says.
            let seen = attached.is_ok() || !app.c.pt_pages.is_empty();
            let probe = |level: &str| match seen {
                true => app.c.pt_pages.get(level).copied().unwrap_or(0).to_string(),
                false => "n/a".into(),
            };
            lines.push(Line::from(format!(
                "{since:<24}{:>7}{:>7}{:>7}",
                "probe", "model", "kernel"
            )));
            let (p, o) = (m.predicted_slots, m.observed_slots);
            for (level, p, o, bp, bo) in [
                (
                    "pte",
                    p.pte_tables,
                    o.pte_tables,
                    base.0.pte_tables,
                    base.1.pte_tables,
                ),
                (
                    "pmd",
                    p.pmd_tables,
                    o.pmd_tables,
                    base.0.pmd_tables,
                    base.1.pmd_tables,
                ),
                (
                    "pud",
                    p.pud_tables,
                    o.pud_tables,
                    base.0.pud_tables,
                    base.1.pud_tables,
                ),
            ] {
                lines.push(Line::from(format!(
                    "{:<24}{:>7}{:>7}{:>7}",
                    format!("  {level} table pages"),
                    probe(level),
                    p.saturating_sub(bp),
                    o.saturating_sub(bo)
                )));
            }
            if let (false, Err(why)) = (seen, attached) {
                lines.push(Line::from(format!("probe: n/a: {why}")));
            }
        }
        (Err(why), attached) => {
            match attached {
                Err(w) => lines.push(Line::from(format!("probe pages: n/a: {w}"))),
                Ok(()) if app.c.pt_pages.is_empty() => {
                    lines.push(Line::from("probe pages: none yet"))
                }
                Ok(()) => {
                    let v: Vec<String> = app
                        .c
                        .pt_pages
                        .iter()
                        .map(|(l, n)| format!("{l} {n}"))
                        .collect();
                    lines.push(Line::from(format!("probe pages: {}", v.join(", "))));
                }
            }
            lines.push(Line::from(format!("model tables: n/a: {why}")));
        }
    }
    lines.push(Line::from(match app.meminfo_pt_kb {
        Some(kb) => format!("meminfo PageTables {}", bytes(kb * 1024)),
        None => "meminfo PageTables n/a: no sample".into(),
    }));
    if app.model.is_ok() {
        // A slot is counted the first time a placement touches it past the snapshot's areas;
        // the kernel also keeps the tables of areas freed before the snapshot.
        lines.push(Line::from(
            "model, kernel: 2 MiB/1 GiB slots first touched; a table can predate its slot's use",
        ));
    }
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), area);
}

/// The page probes' state and, while on, their cost as the kernel's run statistics give it.
fn page_probe_lines(pp: &crate::tui::app::PageProbes) -> Vec<String> {
    let mut lines = vec![if pp.on {
        format!("page probes on ({}), t detaches", pp.rung)
    } else {
        "page probes off, t attaches".to_string()
    }];
    if pp.on {
        lines.push(if pp.runs == 0 || pp.secs <= 0.0 {
            "cost: no page allocation yet".into()
        } else {
            format!(
                "cost {:.0} ns/event, {:.0}/s, {:.2} % of one CPU",
                pp.run_ns as f64 / pp.runs as f64,
                pp.runs as f64 / pp.secs,
                pp.run_ns as f64 / (pp.secs * 1e7)
            )
        });
    }
    if let Some(e) = &pp.error {
        lines.push(format!("last toggle failed: {e}"));
    }
    lines
}

/// Lock waits per vmap lock class (lock_waits probe).
pub fn locks(f: &mut Frame, area: Rect, app: &App) {
    let attached = app
        .info
        .as_ref()
        .map_or(Err("no source yet".to_string()), |i| {
            i.probe_attached("lock_waits")
        });
    let mut lines = Vec::new();
    if app.c.locks.is_empty() {
        match attached {
            Err(why) => lines.push(Line::from(format!("n/a: {why}"))),
            Ok(()) => lines.push(Line::from("no contention on vmap locks yet")),
        }
    } else {
        lines.push(Line::from(format!(
            "{:<16} {:>8} {:>12}",
            "class", "waits", "total wait"
        )));
        for class in LockClass::ALL {
            if let Some((n, ns)) = app.c.locks.get(&class) {
                lines.push(Line::from(format!(
                    "{:<16} {:>8} {:>12}",
                    class.name(),
                    n,
                    nanos(*ns)
                )));
            }
        }
    }
    f.render_widget(Paragraph::new(lines), area);
}

/// Top callers by bytes from the last `/proc/vmallocinfo` snapshot.
pub fn callers(f: &mut Frame, area: Rect, app: &App) {
    let lines = match &app.callers {
        Err(why) => vec![Line::from(format!("n/a: {why}"))],
        Ok(v) => v
            .iter()
            .take(area.height as usize)
            .map(|c| {
                Line::from(format!(
                    "{:>9} {:>5}  {}",
                    bytes(c.bytes),
                    c.areas,
                    c.caller
                ))
            })
            .collect(),
    };
    f.render_widget(Paragraph::new(lines), area);
}

/// Agreement of the reference model with the kernel, strict before explained, as records
/// arrive; then the newest divergences, as many as the panel has room for.
pub fn model(f: &mut Frame, area: Rect, app: &App) {
    let lines = match &app.model {
        Err(why) => vec![Line::from(format!("n/a: {why}"))],
        Ok(m) => {
            let mut lines = vec![
                Line::from(format!(
                    "placement strict {:.1}%  explained {:.1}% ({})",
                    m.strict_placement_pct, m.placement_pct, m.placement_compared
                )),
                Line::from(format!(
                    " warmed-up strict {:.1}%  explained {:.1}% ({})",
                    m.warm_strict_pct, m.warm_pct, m.warm_compared
                )),
                Line::from(format!(
                    "nr_lazy   strict {:.1}%  explained {:.1}%",
                    m.strict_nr_lazy_pct, m.nr_lazy_pct
                )),
                Line::from(format!(
                    "npurged   strict {:.1}%  explained {:.1}%",
                    m.strict_npurged_pct, m.npurged_pct
                )),
                Line::from(format!(
                    "high-water kernel {}, model {}",
                    m.observed_high_water,
                    high_water_gap(&m.observed_high_water, &m.predicted_high_water)
                )),
                Line::from(m.scope.clone()),
            ];
            lines.extend(m.recent.iter().map(|d| Line::from(format!("  {d}"))));
            lines
        }
    };
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), area);
}

/// The model's high-water mark against the kernel's, both `0x…` text: "same", or how far
/// above or below, so the panel needs one line for both.
fn high_water_gap(observed: &str, predicted: &str) -> String {
    let parse = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    match (parse(observed), parse(predicted)) {
        (Some(o), Some(p)) if o == p => "same".into(),
        (Some(o), Some(p)) if p > o => format!("+{}", bytes(p - o)),
        (Some(o), Some(p)) => format!("-{}", bytes(o - p)),
        _ => predicted.to_string(),
    }
}

/// The key line at the bottom.
pub fn footer(f: &mut Frame, area: Rect, app: &App) {
    let zoom = if app.zoomed {
        "Esc unzoom"
    } else {
        "Enter zoom"
    };
    f.render_widget(
        Paragraph::new(format!(
            "q quit  p pause  Tab/arrows focus ({})  {zoom}  +/- window  r reset  t page probes  ? help",
            app.focus.title()
        ))
        .style(Style::default().add_modifier(Modifier::DIM)),
        area,
    );
}

/// The `?` overlay.
pub fn help(f: &mut Frame, area: Rect) {
    let w = 60.min(area.width);
    let h = 14.min(area.height);
    let r = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    let text = vec![
        Line::from("q, Esc, Ctrl-C  quit"),
        Line::from("p, space       pause / resume (data is held, not lost)"),
        Line::from("Tab, arrows    move focus between panels"),
        Line::from("Enter          zoom the focused panel (Esc to unzoom)"),
        Line::from("+ / -          double / halve the time window"),
        Line::from("r              reset counters, rates and histograms"),
        Line::from("t              attach / detach the page probes (live)"),
        Line::from("?              this help (any key closes it)"),
        Line::from(""),
        Line::from("Rates are per second of trace time; see docs/tui.md."),
    ];
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(text).block(Block::bordered().title("help")),
        r,
    );
}

/// Bytes with a binary unit.
pub fn bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < U.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[u])
    }
}

fn nanos(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else {
        format!("{:.1} us", ns as f64 / 1e3)
    }
}
