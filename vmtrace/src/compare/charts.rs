//! `vmtrace compare --report DIR`: CDF overlays of A and B, the size histogram as bars, the
//! B/A of every tested row with its interval, and an `index.html` with the tables. Drawn with
//! the replay report's plotters setup (embedded font, SVG and PNG of each chart).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{Comparison, Profile, Row, Samples};
use crate::replay::charts::{
    escape_html, tick, title_font, upper, write_drawn, ChartError, Draw, DrawResult,
};

const A_COLOUR: RGBColor = RGBColor(31, 119, 180);
const B_COLOUR: RGBColor = RGBColor(255, 127, 14);
const FLAG_COLOUR: RGBColor = RGBColor(214, 39, 40);
const GREY: RGBColor = RGBColor(150, 150, 150);

/// Points kept per CDF line: enough for its shape, few enough for a small SVG.
const CDF_POINTS: usize = 400;

/// One CDF panel: a figure of both recordings.
struct Cdf {
    title: String,
    /// x axis in log10 (latencies, waits, sizes spanning decades).
    log_x: bool,
    a: Vec<u64>,
    b: Vec<u64>,
}

fn values(s: &Samples) -> Vec<u64> {
    let mut v: Vec<u64> = s.iter().map(|&(_, x)| x).collect();
    v.sort_unstable();
    v
}

fn cdf_points(sorted: &[u64], log_x: bool) -> Vec<(f64, f64)> {
    let n = sorted.len();
    let step = n.div_ceil(CDF_POINTS).max(1);
    let x = |v: u64| {
        if log_x {
            (v.max(1) as f64).log10()
        } else {
            v as f64
        }
    };
    let mut pts: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (x(sorted[i]), (i + 1) as f64 / n as f64))
        .collect();
    if let Some(&last) = sorted.last() {
        pts.push((x(last), 1.0));
    }
    pts
}

impl Cdf {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let la = cdf_points(&self.a, self.log_x);
        let lb = cdf_points(&self.b, self.log_x);
        if la.is_empty() && lb.is_empty() {
            let area = area.titled(&self.title, ("sans-serif", 16))?;
            area.draw(&Text::new(
                "in neither recording",
                (20, 20),
                ("sans-serif", 14).into_font(),
            ))?;
            return Ok(());
        }
        let (mut x0, mut x1) = la
            .iter()
            .chain(&lb)
            .fold((f64::MAX, f64::MIN), |(a, b), &(x, _)| (a.min(x), b.max(x)));
        if x1 - x0 < 1e-9 {
            x0 -= 1.0;
            x1 += 1.0;
        }
        let log = self.log_x;
        // On a log axis only the powers of ten are labelled: 10^2.5 reads badly.
        let label = move |v: &f64| {
            if !log {
                tick(v)
            } else if (v - v.round()).abs() < 0.05 {
                tick(&10f64.powf(v.round()))
            } else {
                String::new()
            }
        };
        let mut chart = ChartBuilder::on(area)
            .caption(&self.title, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(40)
            .build_cartesian_2d(x0..x1, 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_labels(6)
            .y_labels(5)
            .x_label_formatter(&label)
            .label_style(("sans-serif", 12))
            .draw()?;
        for (name, pts, colour) in [("A", &la, A_COLOUR), ("B", &lb, B_COLOUR)] {
            if pts.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), colour.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .draw()?;
        Ok(())
    }
}

/// Six CDF panels in one chart.
struct Cdfs(Vec<Cdf>);

impl Draw for Cdfs {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let area = root.titled("Distributions: A (blue) against B (orange)", title_font())?;
        let panels = area.split_evenly((2, 3));
        for (panel, cdf) in panels.iter().zip(&self.0) {
            cdf.draw(panel)?;
        }
        Ok(())
    }
}

/// Grouped bars of the allocation size histogram.
struct Sizes<'a>(&'a [Row]);

impl Draw for Sizes<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let area = root.titled("Allocation sizes: share of allocations", title_font())?;
        let n = self.0.len().max(1);
        let top = self
            .0
            .iter()
            .flat_map(|r| [r.a.unwrap_or(0.0), r.b.unwrap_or(0.0)])
            .fold(0.0, f64::max);
        let labels: Vec<String> = self
            .0
            .iter()
            .map(|r| r.metric.replace(" pages", ""))
            .collect();
        let label = |x: &f64| {
            let r = x.round();
            if (x - r).abs() < 1e-6 && r >= 0.0 {
                labels.get(r as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        let mut chart = ChartBuilder::on(&area)
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5..(n as f64 - 0.5), 0.0..upper(top * 100.0))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n + 1)
            .x_label_formatter(&label)
            .x_desc("pages per allocation")
            .y_desc("% of allocations")
            .y_label_formatter(&tick)
            .label_style(("sans-serif", 13))
            .draw()?;
        for (j, (name, colour)) in [("A", A_COLOUR), ("B", B_COLOUR)].into_iter().enumerate() {
            let x0 = |i: usize| i as f64 - 0.4 + j as f64 * 0.4;
            chart
                .draw_series(self.0.iter().enumerate().map(|(i, r)| {
                    let v = 100.0 * if j == 0 { r.a } else { r.b }.unwrap_or(0.0);
                    Rectangle::new([(x0(i), 0.0), (x0(i) + 0.37, v)], colour.filled())
                }))?
                .label(name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], colour.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    }
}

/// Rows shown in the ratio chart: the largest changes first.
const RATIO_ROWS: usize = 24;

/// B/A of the tested rows, each with its interval, flagged ones in red.
struct Ratios(Vec<Row>);

impl Draw for Ratios {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let area = root.titled(
            "B/A of each tested figure (log scale), 95 % interval",
            title_font(),
        )?;
        let rows = &self.0;
        let n = rows.len().max(1);
        let l = |x: f64| x.max(1e-3).log2();
        let extent = rows
            .iter()
            .filter_map(|r| r.interval.map(|i| l(i.lo).abs().max(l(i.hi).abs())))
            .fold(0.5f64, f64::max)
            .min(10.0);
        let names: Vec<String> = rows
            .iter()
            .map(|r| format!("{}: {}", short_group(&r.group), r.metric))
            .collect();
        let ylabel = |y: &f64| {
            let r = y.round();
            if (y - r).abs() < 1e-6 && r >= 0.0 {
                names.get(r as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        let xlabel = |x: &f64| tick(&x.exp2());
        let mut chart = ChartBuilder::on(&area)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(330)
            .build_cartesian_2d(-extent * 1.05..extent * 1.05, -0.5..(n as f64 - 0.5))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n + 1)
            .y_label_formatter(&ylabel)
            .x_label_formatter(&xlabel)
            .x_desc("B / A")
            .label_style(("sans-serif", 12))
            .draw()?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, -0.5), (0.0, n as f64 - 0.5)],
            BLACK.stroke_width(1),
        )))?;
        for (i, r) in rows.iter().enumerate() {
            let colour = if r.flagged { FLAG_COLOUR } else { GREY };
            let y = i as f64;
            let x = r.ratio.map_or(0.0, l).clamp(-extent, extent);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(0.0f64.min(x), y - 0.3), (0.0f64.max(x), y + 0.3)],
                colour.filled(),
            )))?;
            if let Some(iv) = r.interval {
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![
                        (l(iv.lo).clamp(-extent, extent), y),
                        (l(iv.hi).clamp(-extent, extent), y),
                    ],
                    BLACK.stroke_width(2),
                )))?;
            }
        }
        Ok(())
    }
}

fn short_group(g: &str) -> &str {
    g.split(" (")
        .next()
        .unwrap_or(g)
        .trim_start_matches("lock waits: ")
}

/// The rows of the ratio chart: tested ones, largest |ln B/A| first.
fn ratio_rows(c: &Comparison) -> Vec<Row> {
    let mut rows: Vec<Row> = c
        .rows
        .iter()
        .chain(&c.size_rows)
        .filter(|r| r.tested && r.ratio.is_some_and(|x| x > 0.0 && x.is_finite()))
        .cloned()
        .collect();
    rows.sort_by(|x, y| {
        let k = |r: &Row| r.ratio.map_or(0.0, |v| v.ln().abs());
        k(y).total_cmp(&k(x))
    });
    rows.truncate(RATIO_ROWS);
    rows.reverse();
    rows
}

/// Writes the charts and `index.html`; returns the files written.
pub fn write_report(
    dir: &Path,
    c: &Comparison,
    a: &Profile,
    b: &Profile,
) -> Result<Vec<PathBuf>, ChartError> {
    let mut files = Vec::new();
    let all_waits = |p: &Profile| -> Samples { p.waits.values().flatten().copied().collect() };
    let no_latency = a.latency.is_empty() && b.latency.is_empty();
    fn latency_or_run(p: &Profile, no_latency: bool) -> &Samples {
        if no_latency {
            &p.drain_run
        } else {
            &p.latency
        }
    }
    let sixth = if no_latency {
        "drain item run time (ns)"
    } else {
        "alloc_vmap_area latency (ns)"
    };
    let cdfs = Cdfs(vec![
        Cdf {
            title: "lock waits, every vmap class (ns)".into(),
            log_x: true,
            a: values(&all_waits(a)),
            b: values(&all_waits(b)),
        },
        Cdf {
            title: "purge size (npurged)".into(),
            log_x: false,
            a: values(&a.purges),
            b: values(&b.purges),
        },
        Cdf {
            title: "drain latency (ns)".into(),
            log_x: true,
            a: values(&a.drain_latency),
            b: values(&b.drain_latency),
        },
        Cdf {
            title: "lazy backlog at each free (pages)".into(),
            log_x: false,
            a: values(&a.frees),
            b: values(&b.frees),
        },
        Cdf {
            title: "allocation size (pages)".into(),
            log_x: true,
            a: values(&a.allocs),
            b: values(&b.allocs),
        },
        Cdf {
            title: sixth.into(),
            log_x: true,
            a: values(latency_or_run(a, no_latency)),
            b: values(latency_or_run(b, no_latency)),
        },
    ]);
    write_drawn(dir, "cdfs", &cdfs, &mut files)?;
    write_drawn(dir, "sizes", &Sizes(&c.size_rows), &mut files)?;
    write_drawn(dir, "ratios", &Ratios(ratio_rows(c)), &mut files)?;
    let path = dir.join("index.html");
    std::fs::write(&path, index_html(c)).map_err(|source| ChartError::Io {
        path: path.clone(),
        source,
    })?;
    files.push(path);
    Ok(files)
}

fn table(out: &mut String, rows: &[Row]) {
    let _ = writeln!(
        out,
        "<table><tr><th>group</th><th>figure</th><th>A</th><th>B</th><th>B/A</th><th>95 % interval</th><th></th></tr>"
    );
    for r in rows.iter().filter(|r| r.a.is_some() || r.b.is_some()) {
        let interval = r
            .interval
            .map_or("not tested".into(), |i| format!("{:.2}–{:.2}", i.lo, i.hi));
        let _ = writeln!(
            out,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if r.flagged { " class=\"flag\"" } else { "" },
            escape_html(&r.group),
            escape_html(&r.metric),
            escape_html(&super::cli::value(r.a, r.unit)),
            escape_html(&super::cli::value(r.b, r.unit)),
            r.ratio.map_or("–".into(), |x| format!("{x:.2}")),
            interval,
            if r.flagged { "*" } else { "" }
        );
    }
    out.push_str("</table>\n");
}

fn index_html(c: &Comparison) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>vmtrace compare</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}\
         td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}td:first-child,td:nth-child(2){{text-align:left}}\
         tr.flag{{background:#fde0dc}}img{{max-width:100%}}</style></head><body>"
    );
    let _ = writeln!(
        out,
        "<h1>vmtrace compare</h1><p>A: <code>{}</code> ({:.1} s)<br>B: <code>{}</code> ({:.1} s)</p>",
        escape_html(&c.a_name),
        c.a_duration_s,
        escape_html(&c.b_name),
        c.b_duration_s
    );
    if c.header_differences.is_empty() {
        out.push_str("<p>Same kernel, machine, CPUs, probes and command line.</p>\n");
    } else {
        out.push_str(
            "<h2>Header differences</h2><table><tr><th>fact</th><th>A</th><th>B</th></tr>\n",
        );
        for d in &c.header_differences {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                d.field,
                escape_html(&d.a),
                escape_html(&d.b)
            );
        }
        out.push_str("</table>\n");
    }
    let _ = writeln!(
        out,
        "<h2>Figures</h2><p>{} of {} tested rows flagged. {}.</p>",
        c.flagged,
        c.tested,
        escape_html(c.method.text)
    );
    table(&mut out, &c.rows);
    out.push_str(
        "<img src=\"ratios.svg\" alt=\"B/A per figure\">\n<img src=\"cdfs.svg\" alt=\"CDFs\">\n",
    );
    out.push_str("<h2>Allocation sizes</h2>\n");
    table(&mut out, &c.size_rows);
    out.push_str("<img src=\"sizes.svg\" alt=\"size histogram\">\n");
    if !c.backing_page_orders.is_empty() {
        out.push_str("<h2>Backing pages</h2>\n");
        table(&mut out, &c.backing_page_orders);
    }
    if !c.comms.is_empty() {
        out.push_str(
            "<h2>Allocations by task</h2><table><tr><th>task</th><th>A</th><th>B</th></tr>\n",
        );
        for r in &c.comms {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape_html(&r.comm),
                r.a,
                r.b
            );
        }
        out.push_str("</table>\n");
    }
    out.push_str("</body></html>\n");
    out
}
