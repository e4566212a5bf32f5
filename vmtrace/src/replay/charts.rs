//! `vmtrace replay --report DIR`: charts of a replay, in SVG (to read and zoom) and PNG (to
//! paste anywhere), and an `index.html` that shows them beside the summary tables.
//!
//! Pure in the sense that matters here: the figures come in as [`Report`]s and [`WhatIf`]s,
//! files go out to the directory given, nothing else is read. Text is drawn with DejaVu Sans
//! embedded in the binary (plotters' `ab_glyph` backend), not with system fonts, so a PNG made
//! on a machine without any font installed still has its titles, axes and legends.
//!
//! The charts, one file stem each ([`CHARTS`]):
//!
//! - `footprint`: VA high-water mark over time, observed (from the trace's addresses, and
//!   meminfo `VmallocUsed` when the trace has it) against each free-running variant;
//! - `lazy_backlog`: the lazy backlog against the drain threshold, purges marked;
//! - `node_share`: share of allocations per vmap node (of the allocating CPU);
//! - `lock_waits`: the predicted wait distribution per lock class when the timing model gives
//!   one, otherwise the mean wait per section per class (the chart says which);
//! - `variants`: lock-wait share, throughput, footprint and page-table pages per variant.

use std::fmt::Write as _;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::backend::RGBPixel;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::free_run::WhatIf;
use super::Report;
use crate::model::Variant;
use crate::sim::timing::ClassWait;
use crate::trace::LockClass;

/// Size of every chart, in pixels (PNG) and user units (SVG).
pub const WIDTH: u32 = 1000;
pub const HEIGHT: u32 = 600;

/// Every chart [`write_report`] writes: file stem and title (the title is drawn on the chart
/// and used as its caption in `index.html`).
pub const CHARTS: [(&str, &str); 5] = [
    (
        "footprint",
        "VA footprint over time: observed and what-if variants",
    ),
    (
        "lazy_backlog",
        "Lazy backlog against the drain threshold, purges marked",
    ),
    ("node_share", "Allocations per vmap node"),
    ("lock_waits", "Predicted lock-wait time per lock class"),
    ("variants", "Variant comparison (free-running what-if)"),
];

/// Most purge markers drawn per series: beyond this every k-th purge is marked (and the legend
/// says so), which keeps the SVGs small for traces with thousands of purges.
const MAX_MARKERS: usize = 400;

const OBSERVED: RGBColor = RGBColor(0, 0, 0);
const MEMINFO: RGBColor = RGBColor(255, 127, 14);
const THRESHOLD: RGBColor = RGBColor(120, 120, 120);

#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("cannot create {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot draw the {chart} chart: {message}")]
    Draw {
        chart: &'static str,
        message: String,
    },
    #[error("cannot encode {path}: {source}")]
    Png {
        path: PathBuf,
        #[source]
        source: png::EncodingError,
    },
    #[error("the embedded DejaVu Sans font does not parse")]
    Font,
}

/// What the report shows.
#[derive(Clone, Copy, Debug)]
pub struct ReportInput<'a> {
    /// The trace, as the user named it (shown in `index.html`).
    pub trace: &'a str,
    /// Observed-timing replays. The observed series (footprint, backlog, purges, per-node
    /// allocations) come from the first one: they are the kernel's, whatever the variant.
    pub fidelity: &'a [Report],
    /// Free-running replays, one per variant.
    pub what_if: &'a [WhatIf],
}

/// Writes every chart as `STEM.svg` and `STEM.png`, then `index.html`, into `dir` (created if
/// missing). Returns the paths written, `index.html` last.
pub fn write_report(dir: &Path, input: &ReportInput<'_>) -> Result<Vec<PathBuf>, ChartError> {
    fonts()?;
    std::fs::create_dir_all(dir).map_err(|source| ChartError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files = Vec::new();
    render(dir, &Footprint(input), &mut files)?;
    render(dir, &Backlog(input), &mut files)?;
    render(dir, &NodeShare(input), &mut files)?;
    render(dir, &LockWaits(input), &mut files)?;
    render(dir, &Variants(input), &mut files)?;
    let path = dir.join("index.html");
    std::fs::write(&path, index_html(input)).map_err(|source| ChartError::Io {
        path: path.clone(),
        source,
    })?;
    files.push(path);
    Ok(files)
}

/// Registers the embedded font once per process (plotters keeps a global font table).
fn fonts() -> Result<(), ChartError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .is_ok()
            && plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold())
                .is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(ChartError::Font)
    }
}

pub(crate) type DrawResult<DB> =
    Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Anything drawable on any plotters backend (the same code makes the SVG and the PNG).
pub(crate) trait Draw {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB>;
}

/// One chart of [`write_report`].
trait Chart: Draw {
    /// Index into [`CHARTS`].
    const INDEX: usize;
}

/// Writes any drawable as `STEM.svg` and `STEM.png` into `dir` (which must exist), with the
/// embedded font registered: other reports (`vmtrace compare --report`) draw through it.
pub(crate) fn write_drawn<C: Draw>(
    dir: &Path,
    stem: &'static str,
    chart: &C,
    files: &mut Vec<PathBuf>,
) -> Result<(), ChartError> {
    fonts()?;
    render_as(dir, stem, chart, files)
}

fn render<C: Chart>(dir: &Path, chart: &C, files: &mut Vec<PathBuf>) -> Result<(), ChartError> {
    render_as(dir, CHARTS[C::INDEX].0, chart, files)
}

/// Writes `chart` as `STEM.svg` and `STEM.png` into `dir`.
fn render_as<C: Draw>(
    dir: &Path,
    stem: &'static str,
    chart: &C,
    files: &mut Vec<PathBuf>,
) -> Result<(), ChartError> {
    let draw_err = |e: &dyn std::fmt::Display| ChartError::Draw {
        chart: stem,
        message: e.to_string(),
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(&e))?;
        chart.draw(&root).map_err(|e| draw_err(&e))?;
        root.present().map_err(|e| draw_err(&e))?;
    }
    let svg_path = dir.join(format!("{stem}.svg"));
    std::fs::write(&svg_path, svg).map_err(|source| ChartError::Io {
        path: svg_path.clone(),
        source,
    })?;
    files.push(svg_path);

    let mut rgb = vec![0u8; WIDTH as usize * HEIGHT as usize * 3];
    {
        let backend = BitMapBackend::<RGBPixel>::with_buffer_and_format(&mut rgb, (WIDTH, HEIGHT))
            .map_err(|e| draw_err(&e))?;
        let root = backend.into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(&e))?;
        chart.draw(&root).map_err(|e| draw_err(&e))?;
        root.present().map_err(|e| draw_err(&e))?;
    }
    let png_path = dir.join(format!("{stem}.png"));
    write_png(&png_path, &rgb)?;
    files.push(png_path);
    Ok(())
}

fn write_png(path: &Path, rgb: &[u8]) -> Result<(), ChartError> {
    let file = std::fs::File::create(path).map_err(|source| ChartError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let png_err = |source| ChartError::Png {
        path: path.to_path_buf(),
        source,
    };
    let mut enc = png::Encoder::new(BufWriter::new(file), WIDTH, HEIGHT);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(png_err)?;
    w.write_image_data(rgb).map_err(png_err)?;
    w.finish().map_err(png_err)
}

/// A variant keeps its colour in every chart.
pub(crate) fn variant_colour(v: Variant) -> RGBColor {
    match v {
        Variant::Nodes => RGBColor(31, 119, 180),
        Variant::NodesCapped => RGBColor(44, 160, 44),
        Variant::Global => RGBColor(214, 39, 40),
    }
}

pub(crate) fn title_font() -> TextStyle<'static> {
    ("sans-serif", 24, FontStyle::Bold).into_text_style(&(WIDTH, HEIGHT))
}

fn caption_font() -> FontDesc<'static> {
    ("sans-serif", 18).into_font()
}

/// Draws the chart's title and returns the area below it.
fn titled<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    index: usize,
) -> Result<DrawingArea<DB, Shift>, DrawingAreaErrorKind<DB::ErrorType>> {
    root.titled(CHARTS[index].1, title_font())
}

/// The time axis: nanosecond timestamps shown from the first one, in a unit that suits the
/// span (synthetic traces last milliseconds, recordings minutes).
struct TimeAxis {
    t0: u64,
    div: f64,
    unit: &'static str,
    span: f64,
}

impl TimeAxis {
    fn new(stamps: impl Iterator<Item = u64>) -> Self {
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        for t in stamps {
            lo = lo.min(t);
            hi = hi.max(t);
        }
        if lo > hi {
            lo = 0;
            hi = 0;
        }
        let span_ns = hi - lo;
        let (div, unit) = if span_ns >= 2_000_000_000 {
            (1e9, "s")
        } else if span_ns >= 2_000_000 {
            (1e6, "ms")
        } else {
            (1e3, "µs")
        };
        let span = (span_ns as f64 / div).max(1e-3);
        Self {
            t0: lo,
            div,
            unit,
            span,
        }
    }

    fn x(&self, ts: u64) -> f64 {
        ts.saturating_sub(self.t0) as f64 / self.div
    }

    fn desc(&self) -> String {
        format!("time since the first event ({})", self.unit)
    }
}

/// The last value of a series at or before `ts` (the first one before the series starts).
fn value_at(points: &[(u64, f64)], ts: u64) -> f64 {
    let i = points.partition_point(|&(t, _)| t <= ts);
    points
        .get(i.saturating_sub(1))
        .map_or(0.0, |&(_, v)| if v.is_finite() { v } else { 0.0 })
}

/// Every k-th of `times` so that at most [`MAX_MARKERS`] remain, and k.
fn thin_markers(times: &[u64]) -> (Vec<u64>, usize) {
    let k = times.len().div_ceil(MAX_MARKERS).max(1);
    (times.iter().step_by(k).copied().collect(), k)
}

/// Drops a decimal tail of zeros: "2.50" -> "2.5", "3.0" -> "3".
fn trim_zeros(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Axis tick label: short, no ".0" tails (plotters' default prints every float with them).
pub(crate) fn tick(v: &f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim_zeros(format!("{:.2}", v / 1e6)))
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        trim_zeros(format!("{v:.3}"))
    }
}

/// About three significant digits, for values written on bars.
fn sig3(v: f64) -> String {
    let a = v.abs();
    let decimals = if a >= 100.0 || a == 0.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        (2 - a.log10().floor() as i64).clamp(0, 9) as usize
    };
    trim_zeros(format!("{v:.decimals$}"))
}

pub(crate) fn upper(max: f64) -> f64 {
    if max.is_finite() && max > 0.0 {
        max * 1.15
    } else {
        1.0
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> DrawResult<DB> {
    legend_sized(chart, position, 14)
}

fn legend_sized<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
    font_px: u32,
) -> DrawResult<DB> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", font_px))
        .draw()
}

/// Writes "no data" in the middle of an area (a chart of nothing is still a valid file).
fn no_data<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, why: &str) -> DrawResult<DB> {
    let (w, h) = area.dim_in_pixel();
    let style = ("sans-serif", 20).into_font().color(&THRESHOLD).pos(
        plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Center,
        ),
    );
    area.draw(&Text::new(
        why.to_string(),
        (w as i32 / 2, h as i32 / 2),
        style,
    ))
}

// ---------------------------------------------------------------------------------------------

struct Footprint<'a>(&'a ReportInput<'a>);

impl Chart for Footprint<'_> {
    const INDEX: usize = 0;
}

impl Draw for Footprint<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let area = titled(root, Self::INDEX)?;
        let obs = self.0.fidelity.first();
        let observed: Vec<(u64, f64)> = obs
            .map(|r| {
                r.observed_series
                    .iter()
                    .map(|s| (s.ts_ns, mib(s.high_water_bytes)))
                    .collect()
            })
            .unwrap_or_default();
        let used: Vec<(u64, f64)> = obs
            .map(|r| {
                r.vmalloc_used_series
                    .iter()
                    .map(|s| (s.ts_ns, mib(s.bytes)))
                    .collect()
            })
            .unwrap_or_default();
        let variants: Vec<(Variant, Vec<(u64, f64)>)> = self
            .0
            .what_if
            .iter()
            .map(|w| {
                let pts = w
                    .series
                    .iter()
                    .map(|s| (s.ts_ns, mib(s.high_water_bytes)))
                    .collect();
                (w.variant, pts)
            })
            .collect();
        let all = || {
            observed
                .iter()
                .chain(used.iter())
                .chain(variants.iter().flat_map(|(_, p)| p.iter()))
        };
        if all().next().is_none() {
            return no_data(&area, "no allocations in the trace");
        }
        let time = TimeAxis::new(all().map(|&(t, _)| t));
        let ymax = upper(all().map(|&(_, v)| v).fold(0.0, f64::max));
        let mut chart = ChartBuilder::on(&area)
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..time.span, 0.0..ymax)?;
        chart
            .configure_mesh()
            .x_desc(time.desc())
            .y_desc("MiB from VMALLOC_START to the highest end")
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 13))
            .draw()?;
        if !observed.is_empty() {
            chart
                .draw_series(LineSeries::new(
                    observed.iter().map(|&(t, v)| (time.x(t), v)),
                    OBSERVED.stroke_width(3),
                ))?
                .label("observed high-water (trace addresses)")
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], OBSERVED.stroke_width(3))
                });
        }
        if !used.is_empty() {
            chart
                .draw_series(LineSeries::new(
                    used.iter().map(|&(t, v)| (time.x(t), v)),
                    MEMINFO.stroke_width(2),
                ))?
                .label("observed VmallocUsed (meminfo, pages in use)")
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], MEMINFO.stroke_width(2))
                });
        }
        // Earlier variants are drawn wider, so that a later one on the same values leaves them
        // visible as a border instead of hiding them.
        let n = variants.len() as u32;
        for (i, (v, pts)) in (0u32..).zip(&variants) {
            let c = variant_colour(*v);
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|&(t, y)| (time.x(t), y)),
                    c.stroke_width(2 + 3 * (n - 1 - i)),
                ))?
                .label(format!("what-if {} (free-running)", v.name()))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)
    }
}

// ---------------------------------------------------------------------------------------------

struct Backlog<'a>(&'a ReportInput<'a>);

impl Chart for Backlog<'_> {
    const INDEX: usize = 1;
}

impl Draw for Backlog<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let area = titled(root, Self::INDEX)?;
        let obs = self.0.fidelity.first();
        // (label, colour, backlog series, purge times); the observed one last, drawn on top.
        type Line = (String, RGBColor, Vec<(u64, f64)>, Vec<u64>);
        let mut lines: Vec<Line> = Vec::new();
        for w in self.0.what_if {
            lines.push((
                format!("what-if {}", w.variant.name()),
                variant_colour(w.variant),
                w.series
                    .iter()
                    .map(|s| (s.ts_ns, s.lazy_pages as f64))
                    .collect(),
                w.purge_times_ns.clone(),
            ));
        }
        if let Some(r) = obs {
            lines.push((
                "observed nr_lazy (at frees)".into(),
                OBSERVED,
                r.observed_series
                    .iter()
                    .map(|s| (s.ts_ns, s.lazy_pages as f64))
                    .collect(),
                r.purges.iter().map(|p| p.ts_ns).collect(),
            ));
        }
        let mut thresholds: Vec<u64> = obs
            .map(|r| r.lazy_max_pages)
            .into_iter()
            .chain(self.0.what_if.iter().map(|w| w.lazy_max_pages))
            .collect();
        thresholds.sort_unstable();
        thresholds.dedup();
        let kernel_threshold = obs
            .and_then(|r| r.observed_nr_lazy_max)
            .filter(|k| !thresholds.contains(k));
        let stamps = || {
            lines
                .iter()
                .flat_map(|(_, _, s, p)| s.iter().map(|&(t, _)| t).chain(p.iter().copied()))
        };
        if stamps().next().is_none() {
            return no_data(&area, "no frees or purges in the trace");
        }
        let time = TimeAxis::new(stamps());
        let top = lines
            .iter()
            .flat_map(|(_, _, s, _)| s.iter().map(|&(_, v)| v))
            .chain(
                thresholds
                    .iter()
                    .chain(kernel_threshold.iter())
                    .map(|&t| t as f64),
            )
            .fold(0.0, f64::max);
        let mut chart = ChartBuilder::on(&area)
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..time.span, 0.0..upper(top))?;
        chart
            .configure_mesh()
            .x_desc(time.desc())
            .y_desc("lazily freed pages (vmap_lazy_nr)")
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 13))
            .draw()?;
        for &t in &thresholds {
            let y = t as f64;
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, y), (time.span, y)],
                    10,
                    6,
                    THRESHOLD.stroke_width(2),
                ))?
                .label(format!("drain threshold lazy_max_pages = {t}"))
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], THRESHOLD.stroke_width(2))
                });
        }
        // The kernel drained on its own threshold, which a --lazy-max what-if changes only in
        // the model: show both so that the observed purges make sense.
        if let Some(k) = kernel_threshold {
            let y = k as f64;
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, y), (time.span, y)],
                    4,
                    4,
                    OBSERVED.stroke_width(1),
                ))?
                .label(format!(
                    "kernel's threshold in the trace (nr_lazy_max = {k})"
                ))
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], OBSERVED.stroke_width(1))
                });
        }
        let n = self.0.what_if.len() as u32;
        for (i, (label, c, series, purges)) in (0u32..).zip(&lines) {
            let c = *c;
            // What-ifs on the same values stay visible as borders of each other.
            let width = 2 + 2 * n.saturating_sub(i + 1);
            chart
                .draw_series(LineSeries::new(
                    series.iter().map(|&(t, v)| (time.x(t), v)),
                    c.stroke_width(width),
                ))?
                .label(label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
            let (marks, every) = thin_markers(purges);
            let purge_label = if every > 1 {
                format!(
                    "{label}: purges ({} in all, every {every}th marked)",
                    purges.len()
                )
            } else {
                format!("{label}: purges ({})", purges.len())
            };
            chart
                .draw_series(marks.iter().map(|&t| {
                    TriangleMarker::new((time.x(t), value_at(series, t)), 7, c.filled())
                }))?
                .label(purge_label)
                .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 7, c.filled()));
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    }
}

// ---------------------------------------------------------------------------------------------

/// Grouped bars: one group of bars per category, one bar per series.
struct Bars {
    caption: String,
    x_desc: String,
    y_desc: String,
    categories: Vec<String>,
    /// Legend label, colour, one value per category.
    series: Vec<(String, RGBColor, Vec<f64>)>,
    /// Write each bar's value above it (only where there are few bars).
    value_labels: Option<fn(f64) -> String>,
    legend: bool,
    /// Every series spans the whole category width (each has values in its own categories
    /// only, as in the variant comparison) instead of sharing it side by side.
    overlay: bool,
}

impl Bars {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let n = self.categories.len().max(1);
        let top = self
            .series
            .iter()
            .flat_map(|(_, _, v)| v.iter().copied())
            .fold(0.0, f64::max);
        // Room above the bars for the value labels and the legend box (about 20 px an entry
        // in a plot area of the panel's height less caption, axis and margins).
        let ymax = if self.legend {
            let (_, h) = area.dim_in_pixel();
            let plot_px = (f64::from(h) - 100.0).max(60.0);
            let legend_px = 20.0 * self.series.len() as f64 + 20.0;
            upper(top) / (1.0 - (legend_px / plot_px).min(0.6))
        } else {
            upper(top)
        };
        let cats = &self.categories;
        // Panels of a grid get smaller text, and a category label only every `every`
        // categories, so that labels (about 7 px a character) do not run into each other.
        let (w_px, _) = area.dim_in_pixel();
        let small = w_px < 600;
        let plot_px = f64::from(w_px.saturating_sub(if small { 80 } else { 100 }).max(50));
        let widest = cats
            .iter()
            .map(|c| c.chars().count())
            .max()
            .unwrap_or(1)
            .max(1);
        let per_label = 7.0 * widest as f64 + 14.0;
        let every = ((n as f64 * per_label / plot_px).ceil() as usize).max(1);
        let label = |x: &f64| {
            let r = x.round();
            if (x - r).abs() < 1e-6 && r >= 0.0 && (r as usize).is_multiple_of(every) {
                cats.get(r as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        let mut chart = ChartBuilder::on(area)
            .caption(&self.caption, caption_font())
            .margin(if small { 8 } else { 12 })
            .x_label_area_size(45)
            .y_label_area_size(if small { 55 } else { 70 })
            .build_cartesian_2d(-0.5..(n as f64 - 0.5), 0.0..ymax)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n + 1)
            .x_label_formatter(&label)
            .x_desc(self.x_desc.as_str())
            .y_desc(self.y_desc.as_str())
            .y_label_formatter(&tick)
            .axis_desc_style(("sans-serif", 15))
            .label_style(("sans-serif", 13))
            .draw()?;
        let k = if self.overlay {
            1.0
        } else {
            self.series.len().max(1) as f64
        };
        let width = 0.8 / k;
        for (j, (name, c, values)) in self.series.iter().enumerate() {
            let c = *c;
            let slot = if self.overlay { 0.0 } else { j as f64 };
            let x0 = |i: usize| i as f64 - 0.4 + slot * width;
            chart
                .draw_series(
                    values
                        .iter()
                        .enumerate()
                        .filter(|(_, v)| v.is_finite())
                        .map(|(i, &v)| {
                            Rectangle::new([(x0(i), 0.0), (x0(i) + width * 0.92, v)], c.filled())
                        }),
                )?
                .label(name.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
            if let Some(fmt) = self.value_labels {
                let style = ("sans-serif", 13).into_font().color(&BLACK).pos(
                    plotters::style::text_anchor::Pos::new(
                        plotters::style::text_anchor::HPos::Center,
                        plotters::style::text_anchor::VPos::Bottom,
                    ),
                );
                chart.draw_series(
                    values
                        .iter()
                        .enumerate()
                        .filter(|(_, v)| v.is_finite())
                        .map(|(i, &v)| Text::new(fmt(v), (x0(i) + width * 0.46, v), style.clone())),
                )?;
            }
        }
        if self.legend {
            legend_sized(
                &mut chart,
                SeriesLabelPosition::UpperRight,
                if small { 12 } else { 14 },
            )?;
        }
        Ok(())
    }
}

struct NodeShare<'a>(&'a ReportInput<'a>);

impl Chart for NodeShare<'_> {
    const INDEX: usize = 2;
}

impl Draw for NodeShare<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let area = titled(root, Self::INDEX)?;
        let mut series = Vec::new();
        let share = |per: &[u64]| -> Vec<f64> {
            let total: u64 = per.iter().sum();
            per.iter()
                .map(|&n| {
                    if total == 0 {
                        0.0
                    } else {
                        100.0 * n as f64 / total as f64
                    }
                })
                .collect()
        };
        if let Some(r) = self.0.fidelity.first() {
            series.push(("observed".to_string(), OBSERVED, share(&r.allocs_per_node)));
        }
        for w in self.0.what_if {
            series.push((
                format!("what-if {}", w.variant.name()),
                variant_colour(w.variant),
                share(&w.allocs_per_node),
            ));
        }
        let nodes = series.iter().map(|(_, _, v)| v.len()).max().unwrap_or(0);
        if nodes == 0 {
            return no_data(&area, "no allocations in the trace");
        }
        Bars {
            caption: "node of the allocating CPU (the pool node_alloc uses): raw_smp_processor_id() % nr_vmap_nodes".into(),
            x_desc: "vmap node".into(),
            y_desc: "% of successful allocations".into(),
            categories: (0..nodes).map(|i| i.to_string()).collect(),
            series,
            value_labels: (nodes <= 8).then_some(sig3 as fn(f64) -> String),
            legend: true,
            overlay: false,
        }
        .draw(&area)
    }
}

// ---------------------------------------------------------------------------------------------

struct LockWaits<'a>(&'a ReportInput<'a>);

fn class_wait(w: &WhatIf, class: LockClass) -> Option<&ClassWait> {
    w.lock_waits.iter().find(|c| c.class == class)
}

/// A wait bound in a short unit, for the histogram's axis.
fn short_ns(ns: u64) -> String {
    match ns {
        0 => "0".into(),
        n if n < 1_000 => format!("{n} ns"),
        n if n < 1_000_000 => format!("{} µs", trim(n as f64 / 1e3)),
        n if n < 1_000_000_000 => format!("{} ms", trim(n as f64 / 1e6)),
        n => format!("{} s", trim(n as f64 / 1e9)),
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_string)
}

impl Chart for LockWaits<'_> {
    const INDEX: usize = 3;
}

impl Draw for LockWaits<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let area = titled(root, Self::INDEX)?;
        let what_if = self.0.what_if;
        let classes: Vec<LockClass> = LockClass::ALL
            .into_iter()
            .filter(|&k| {
                what_if
                    .iter()
                    .any(|w| class_wait(w, k).is_some_and(|c| c.sections > 0))
            })
            .collect();
        if classes.is_empty() {
            return no_data(&area, "no critical sections (no free-running replay)");
        }
        let any_hist = what_if
            .iter()
            .flat_map(|w| w.lock_waits.iter())
            .any(|c| !c.wait_histogram.is_empty());
        if !any_hist {
            // The timing model gave no per-section waits: show what it did give, and say so.
            let series = what_if
                .iter()
                .map(|w| {
                    let means = classes
                        .iter()
                        .map(|&k| {
                            // No bar where the design has no such lock (global's pools).
                            class_wait(w, k)
                                .filter(|c| c.sections > 0)
                                .map_or(f64::NAN, |c| c.wait_ns as f64 / c.sections as f64)
                        })
                        .collect();
                    (
                        format!("what-if {}", w.variant.name()),
                        variant_colour(w.variant),
                        means,
                    )
                })
                .collect();
            return Bars {
                caption: "mean predicted wait per critical section (no wait distribution from the timing model)".into(),
                x_desc: "lock class".into(),
                y_desc: "mean wait per section (ns)".into(),
                categories: classes.iter().map(|k| k.name().to_string()).collect(),
                series,
                value_labels: Some(sig3),
                legend: true,
                overlay: false,
            }
            .draw(&area);
        }
        // One panel per class that waited anywhere. The histogram counts the sections that
        // waited; most sections of a lightly loaded lock wait nothing, and a "no wait" bar would
        // flatten the rest, so the bars are shares of the sections that waited and the legend
        // says how many did. Classes that never waited are named in a line below the panels.
        let (waiting, idle): (Vec<LockClass>, Vec<LockClass>) = classes.iter().partition(|&&k| {
            what_if
                .iter()
                .any(|w| class_wait(w, k).is_some_and(|c| !c.wait_histogram.is_empty()))
        });
        let (panels_area, foot) = if idle.is_empty() {
            (area.clone(), None)
        } else {
            let (_, h) = area.dim_in_pixel();
            let (a, f) = area.split_vertically(h.saturating_sub(28));
            (a, Some(f))
        };
        if let Some(foot) = foot {
            let names: Vec<&str> = idle.iter().map(|k| k.name()).collect();
            foot.draw(&Text::new(
                format!("no predicted wait in any variant: {}", names.join(", ")),
                (20, 4),
                ("sans-serif", 15).into_font(),
            ))?;
        }
        let (rows, cols) = match waiting.len() {
            0 | 1 => (1, 1),
            2 => (1, 2),
            3 | 4 => (2, 2),
            n => (n.div_ceil(3), 3),
        };
        let panels = panels_area.split_evenly((rows, cols));
        for (k, panel) in waiting.iter().zip(panels.iter()) {
            let mut bounds: Vec<u64> = what_if
                .iter()
                .filter_map(|w| class_wait(w, *k))
                .flat_map(|c| c.wait_histogram.iter().map(|b| b.le_ns))
                .collect();
            bounds.sort_unstable();
            bounds.dedup();
            let series = what_if
                .iter()
                .filter_map(|w| class_wait(w, *k).map(|c| (w, c)))
                .filter(|(_, c)| c.sections > 0)
                .map(|(w, c)| {
                    let waited: u64 = c.wait_histogram.iter().map(|b| b.count).sum();
                    let shares = bounds
                        .iter()
                        .map(|&le| {
                            let n: u64 = c
                                .wait_histogram
                                .iter()
                                .filter(|b| b.le_ns == le)
                                .map(|b| b.count)
                                .sum();
                            if waited == 0 {
                                f64::NAN
                            } else {
                                100.0 * n as f64 / waited as f64
                            }
                        })
                        .collect();
                    (
                        format!("{} {waited}/{} waited", w.variant.name(), c.sections),
                        variant_colour(w.variant),
                        shares,
                    )
                })
                .collect();
            Bars {
                caption: k.name().to_string(),
                x_desc: "wait ≤ (exp2 buckets)".into(),
                y_desc: "% of sections that waited".into(),
                categories: bounds.iter().map(|&b| short_ns(b)).collect(),
                series,
                value_labels: None,
                legend: true,
                overlay: false,
            }
            .draw(panel)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------

struct Variants<'a>(&'a ReportInput<'a>);

impl Chart for Variants<'_> {
    const INDEX: usize = 4;
}

impl Draw for Variants<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let area = titled(root, Self::INDEX)?;
        let w = self.0.what_if;
        if w.is_empty() {
            return no_data(&area, "no free-running replay");
        }
        type Metric = (
            &'static str,
            &'static str,
            fn(&WhatIf) -> f64,
            fn(f64) -> String,
        );
        let metrics: [Metric; 4] = [
            (
                "lock-wait share",
                "% of operation time spent waiting",
                |v| 100.0 * v.lock_wait_share,
                |x| format!("{} %", sig3(x)),
            ),
            (
                "throughput",
                "M allocations + frees per second",
                |v| v.throughput_ops_per_s / 1e6,
                sig3,
            ),
            (
                "VA footprint (high-water mark)",
                "MiB",
                |v| mib(v.high_water_bytes),
                sig3,
            ),
            (
                "page-table pages (PTE + PMD + PUD slots)",
                "pages",
                |v| v.page_table_pages as f64,
                sig3,
            ),
        ];
        let panels = area.split_evenly((2, 2));
        for ((caption, y_desc, value, fmt), panel) in metrics.iter().zip(panels.iter()) {
            Bars {
                caption: (*caption).to_string(),
                x_desc: "variant".into(),
                y_desc: (*y_desc).to_string(),
                categories: w.iter().map(|v| v.variant.name().to_string()).collect(),
                // One series per variant, each with its value at its own category, so that
                // the legend names the colours.
                series: w
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let mut vals = vec![f64::NAN; w.len()];
                        vals[i] = value(v);
                        (
                            v.variant.name().to_string(),
                            variant_colour(v.variant),
                            vals,
                        )
                    })
                    .collect(),
                value_labels: Some(*fmt),
                legend: true,
                overlay: true,
            }
            .draw(panel)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------

/// Escapes text for HTML element content and attribute values.
pub fn escape_html(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn agreement_cell(a: &super::Agreement) -> String {
    format!(
        "{:.3} % <small>({} of {})</small>",
        a.percent(),
        a.agreed,
        a.compared
    )
}

/// The page: both summary tables, then every chart (SVG shown, PNG linked), all relative
/// links, no external resources, so the directory can be copied or served anywhere.
pub fn index_html(input: &ReportInput<'_>) -> String {
    let e = escape_html;
    let mut o = String::new();
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>vmtrace replay report: {trace}</title>\n<style>\n\
         body {{ font-family: sans-serif; margin: 2em; color: #222; }}\n\
         table {{ border-collapse: collapse; margin: 1em 0; }}\n\
         th, td {{ border: 1px solid #bbb; padding: 0.3em 0.6em; text-align: right; }}\n\
         th {{ background: #eee; }} td:first-child, th:first-child {{ text-align: left; }}\n\
         figure {{ margin: 2em 0; }} img {{ max-width: 100%; border: 1px solid #ddd; }}\n\
         </style>\n</head>\n<body>\n<h1>vmtrace replay report</h1>\n\
         <p>Trace: <code>{trace}</code></p>\n",
        trace = e(input.trace)
    );
    if !input.fidelity.is_empty() {
        o.push_str(
            "<h2>Fidelity (observed timing)</h2>\n<p>The model replays the trace with purges where \
             the kernel made them; each prediction is checked against what the kernel did.</p>\n\
             <table>\n<tr><th>variant</th><th>nodes</th><th>zone (B)</th><th>lazy_max_pages</th>\
             <th>placement</th><th>placement after warm-up</th><th>nr_lazy per free</th>\
             <th>npurged per purge</th><th>VA high water observed</th><th>predicted</th>\
             <th>PT slots observed (PTE/PMD/PUD)</th><th>predicted</th></tr>\n",
        );
        for r in input.fidelity {
            let _ = writeln!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td>{}/{}/{}</td><td>{}/{}/{}</td></tr>",
                e(r.variant.name()),
                r.nodes,
                r.zone_size,
                r.lazy_max_pages,
                agreement_cell(&r.placement),
                agreement_cell(&r.placement_after_warmup),
                agreement_cell(&r.nr_lazy),
                agreement_cell(&r.npurged),
                e(&r.observed_high_water),
                e(&r.predicted_high_water),
                r.observed_slots.pte_tables,
                r.observed_slots.pmd_tables,
                r.observed_slots.pud_tables,
                r.predicted_slots.pte_tables,
                r.predicted_slots.pmd_tables,
                r.predicted_slots.pud_tables,
            );
        }
        o.push_str("</table>\n");
    }
    if !input.what_if.is_empty() {
        o.push_str(
            "<h2>What-if (free-running)</h2>\n<p>The model places every area and purges on its \
             own threshold; lock waits come from the timing model (docs/model.md).</p>\n\
             <table>\n<tr><th>variant</th><th>nodes</th><th>lazy_max_pages</th>\
             <th>lock-wait share</th><th>throughput (M ops/s)</th><th>footprint (MiB)</th>\
             <th>PT slots (PTE/PMD/PUD)</th><th>page-table pages</th><th>purges</th>\
             <th>failures</th></tr>\n",
        );
        for w in input.what_if {
            let _ = writeln!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.1} %</td><td>{:.3}</td><td>{:.1}</td>\
                 <td>{}/{}/{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                e(w.variant.name()),
                w.nodes,
                w.lazy_max_pages,
                100.0 * w.lock_wait_share,
                w.throughput_ops_per_s / 1e6,
                mib(w.high_water_bytes),
                w.slots.pte_tables,
                w.slots.pmd_tables,
                w.slots.pud_tables,
                w.page_table_pages,
                w.purges,
                w.alloc_failures,
            );
        }
        o.push_str("</table>\n");
    }
    o.push_str("<h2>Charts</h2>\n");
    for (stem, title) in CHARTS {
        let _ = writeln!(
            o,
            "<figure id=\"{stem}\">\n<a href=\"{stem}.png\"><img src=\"{stem}.svg\" alt=\"{t}\" \
             width=\"{WIDTH}\" height=\"{HEIGHT}\"></a>\n<figcaption>{t} \
             (<a href=\"{stem}.svg\">SVG</a>, <a href=\"{stem}.png\">PNG</a>)</figcaption>\n\
             </figure>",
            t = e(title)
        );
    }
    o.push_str("</body>\n</html>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_escapes_everything_that_could_open_markup() {
        assert_eq!(
            escape_html(r#"<a href="x">&'"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        let page = index_html(&ReportInput {
            trace: "</code><script>alert(1)</script>",
            fidelity: &[],
            what_if: &[],
        });
        assert!(!page.contains("<script>"), "{page}");
        for (stem, _) in CHARTS {
            assert!(page.contains(&format!("src=\"{stem}.svg\"")));
            assert!(page.contains(&format!("href=\"{stem}.png\"")));
        }
    }

    #[test]
    fn time_axis_picks_a_unit_for_the_span() {
        let t = TimeAxis::new([5_000_000_000u64, 8_000_000_000].into_iter());
        assert_eq!((t.unit, t.span), ("s", 3.0));
        assert_eq!(t.x(6_500_000_000), 1.5);
        let t = TimeAxis::new([10u64, 3_000_010].into_iter());
        assert_eq!((t.unit, t.span), ("ms", 3.0));
        let t = TimeAxis::new(std::iter::empty());
        assert_eq!(t.unit, "µs");
        assert!(t.span > 0.0);
    }

    #[test]
    fn purge_markers_sit_on_the_series_and_are_thinned() {
        let s = [(10, 1.0), (20, 5.0), (30, 2.0)];
        assert_eq!(value_at(&s, 5), 1.0);
        assert_eq!(value_at(&s, 20), 5.0);
        assert_eq!(value_at(&s, 29), 5.0);
        assert_eq!(value_at(&s, 99), 2.0);
        assert_eq!(value_at(&[], 99), 0.0);
        let times: Vec<u64> = (0..1000).collect();
        let (kept, every) = thin_markers(&times);
        assert_eq!(every, 3);
        assert!(kept.len() <= MAX_MARKERS);
        assert_eq!(kept[1], 3);
    }

    #[test]
    fn numbers_read_short() {
        assert_eq!(tick(&35_000_000.0), "35M");
        assert_eq!(tick(&1250.0), "1250");
        assert_eq!(tick(&2.5), "2.5");
        assert_eq!(tick(&10.0), "10");
        assert_eq!(tick(&0.01), "0.01");
        assert_eq!(sig3(0.0740), "0.074");
        assert_eq!(sig3(2.604), "2.6");
        assert_eq!(sig3(181.23), "181");
        assert_eq!(sig3(0.0), "0");
    }

    #[test]
    fn wait_bounds_read_short() {
        assert_eq!(short_ns(512), "512 ns");
        assert_eq!(short_ns(1024), "1 µs");
        assert_eq!(short_ns(1536), "1.5 µs");
        assert_eq!(short_ns(4_194_304), "4.2 ms");
    }
}

// ---------------------------------------------------------------------------------------------

/// A line chart of one figure against a numeric parameter, one line per variant, each point
/// marked: `vmtrace whatif --report` draws its sweeps with it.
#[derive(Clone, Debug)]
pub struct LineChart {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    /// Base-2 logarithmic x axis (thread and CPU counts double from point to point).
    pub log2_x: bool,
    pub lines: Vec<(Variant, Vec<(f64, f64)>)>,
}

/// Writes `chart` as `STEM.svg` and `STEM.png` into `dir` (which must exist); appends the
/// paths to `files`.
pub fn write_line_chart(
    dir: &Path,
    stem: &'static str,
    chart: &LineChart,
    files: &mut Vec<PathBuf>,
) -> Result<(), ChartError> {
    write_drawn(dir, stem, chart, files)
}

impl Draw for LineChart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let area = root.titled(&self.title, title_font())?;
        let xs = |x: f64| if self.log2_x { x.max(1e-9).log2() } else { x };
        let all = || self.lines.iter().flat_map(|(_, p)| p.iter());
        if all().next().is_none() {
            return no_data(&area, "no sweep points");
        }
        let (mut x0, mut x1) = all().fold((f64::MAX, f64::MIN), |(a, b), &(x, _)| {
            (a.min(xs(x)), b.max(xs(x)))
        });
        if x1 - x0 < 1e-9 {
            x0 -= 1.0;
            x1 += 1.0;
        }
        let pad = (x1 - x0) * 0.05;
        let ymax = upper(all().map(|&(_, y)| y).fold(0.0, f64::max));
        let mut chart = ChartBuilder::on(&area)
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(90)
            .build_cartesian_2d((x0 - pad)..(x1 + pad), 0.0..ymax)?;
        let log2 = self.log2_x;
        let x_label = move |v: &f64| if log2 { tick(&v.exp2()) } else { tick(v) };
        // On a log2 axis, one label per power of two (the sweep's points are usually those).
        let x_labels = if log2 {
            ((x1 - x0).round() as usize + 1).clamp(2, 12)
        } else {
            10
        };
        chart
            .configure_mesh()
            .x_labels(x_labels)
            .x_desc(self.x_desc.as_str())
            .y_desc(self.y_desc.as_str())
            .x_label_formatter(&x_label)
            .y_label_formatter(&tick)
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 13))
            .draw()?;
        for (i, (variant, points)) in self.lines.iter().enumerate() {
            let colour = variant_colour(*variant);
            // Earlier lines wider, so that a later one on the same values leaves them visible.
            let width = 2 + 2 * (self.lines.len() - 1 - i) as u32;
            chart
                .draw_series(LineSeries::new(
                    points.iter().map(|&(x, y)| (xs(x), y)),
                    colour.stroke_width(width),
                ))?
                .label(variant.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(3))
                });
            chart.draw_series(
                points
                    .iter()
                    .map(|&(x, y)| Circle::new((xs(x), y), 4, colour.filled())),
            )?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    }
}
