//! `allocinfo watch`: re-read the file at an interval and print what changed.
//!
//! Each update shows two deltas per row, against the previous sample (what is moving now) and
//! against the first (what has accumulated), which is what one otherwise does by hand with two
//! `diff` runs.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::diff::{diff_entries, Status};
use super::error::AllocinfoError;
use super::marks::Marks;
use super::model::{Counts, Snapshot};
use super::parse::{parse, Mode};
use super::query::{Entry, EntryKey, Selection};
use super::render::{signed, table, SizeStyle};

/// A changed row of one update.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WatchRow {
    #[serde(flatten)]
    pub key: EntryKey,
    /// Against the previous sample.
    pub status: Status,
    /// Now (zero once removed).
    pub bytes: i64,
    pub calls: u64,
    pub delta_bytes: i64,
    pub delta_calls: i64,
    pub since_first_bytes: i64,
    pub since_first_calls: i64,
    #[serde(flatten)]
    pub marks: Marks,
}

/// What one new sample changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WatchUpdate {
    /// 1 for the first sample after the baseline.
    pub sample: usize,
    pub total: Counts,
    pub delta_bytes: i64,
    pub since_first_bytes: i64,
    /// Changed rows, largest byte change first, cut to `top`.
    pub rows: Vec<WatchRow>,
    /// How many rows changed in all, before `top`.
    pub changed: usize,
}

/// Keeps the first and previous samples and turns each new one into an update.
#[derive(Debug)]
pub struct Watcher {
    selection: Selection,
    top: Option<usize>,
    first: Vec<Entry>,
    previous: Vec<Entry>,
    samples: usize,
}

impl Watcher {
    pub fn new(selection: Selection, top: Option<usize>, baseline: &Snapshot) -> Watcher {
        let first = selection.entries(baseline);
        Watcher {
            previous: first.clone(),
            first,
            selection,
            top,
            samples: 0,
        }
    }

    /// Total of the baseline, for the opening line.
    pub fn baseline_total(&self) -> Counts {
        total(&self.first)
    }

    pub fn step(&mut self, snapshot: &Snapshot) -> WatchUpdate {
        self.samples += 1;
        let current = self.selection.entries(snapshot);
        let since_first: HashMap<EntryKey, (i64, i64)> =
            diff_entries(self.first.clone(), current.clone())
                .into_iter()
                .map(|r| (r.key, (r.delta_bytes, r.delta_calls)))
                .collect();
        let mut rows: Vec<WatchRow> = diff_entries(self.previous.clone(), current.clone())
            .into_iter()
            .filter(|r| r.status != Status::Unchanged)
            .map(|r| {
                let (since_first_bytes, since_first_calls) =
                    since_first.get(&r.key).copied().unwrap_or_default();
                WatchRow {
                    status: r.status,
                    bytes: r.new_bytes.unwrap_or(0),
                    calls: r.new_calls.unwrap_or(0),
                    delta_bytes: r.delta_bytes,
                    delta_calls: r.delta_calls,
                    since_first_bytes,
                    since_first_calls,
                    marks: r.marks,
                    key: r.key,
                }
            })
            .collect();
        rows.sort_by(|a, b| {
            b.delta_bytes
                .unsigned_abs()
                .cmp(&a.delta_bytes.unsigned_abs())
                .then(
                    b.delta_calls
                        .unsigned_abs()
                        .cmp(&a.delta_calls.unsigned_abs()),
                )
                .then_with(|| a.key.cmp(&b.key))
        });
        let changed = rows.len();
        if let Some(top) = self.top {
            rows.truncate(top);
        }
        let now = total(&current);
        let update = WatchUpdate {
            sample: self.samples,
            total: now,
            delta_bytes: now.bytes.saturating_sub(total(&self.previous).bytes),
            since_first_bytes: now.bytes.saturating_sub(total(&self.first).bytes),
            rows,
            changed,
        };
        self.previous = current;
        update
    }
}

fn total(entries: &[Entry]) -> Counts {
    let mut t = Counts::default();
    for e in entries {
        t.add(e.counts);
    }
    t
}

impl WatchUpdate {
    pub fn to_text(&self, elapsed: Duration, style: SizeStyle) -> String {
        let mut out = format!(
            "[+{:.1}s] sample {}: {} since previous, {} since start, total {}; {} row(s) changed\n",
            elapsed.as_secs_f64(),
            self.sample,
            style.delta(self.delta_bytes),
            style.delta(self.since_first_bytes),
            style.size(self.total.bytes),
            self.changed,
        );
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    style.delta(r.delta_bytes),
                    signed(r.delta_calls.to_string(), r.delta_calls),
                    style.delta(r.since_first_bytes),
                    signed(r.since_first_calls.to_string(), r.since_first_calls),
                    style.size(r.bytes),
                    r.marks.label().to_string(),
                    r.key.to_string(),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "CHANGE",
                "CALLS",
                "SINCE-START",
                "CALLS",
                "NOW",
                "MARK",
                "NAME",
            ],
            &rows,
        ));
        out
    }
}

/// How `run` samples and prints.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    pub interval: Duration,
    /// Stop after this many samples after the baseline; `None` runs until killed.
    pub count: Option<usize>,
    pub top: Option<usize>,
    pub mode: Mode,
    pub json: bool,
    pub style: SizeStyle,
}

/// Watches `path` until `count` samples are taken (or forever), writing updates to `out`.
/// Samples that change nothing print nothing, so a quiet system gives a quiet screen.
pub fn run(
    path: &Path,
    selection: Selection,
    options: &WatchOptions,
    out: &mut dyn Write,
) -> Result<(), AllocinfoError> {
    let source = path.display().to_string();
    let read = || -> Result<Snapshot, AllocinfoError> {
        let bytes = super::snapshot::read(path)?;
        Ok(parse(&source, &bytes, options.mode)?)
    };
    let out_error = |source| AllocinfoError::Write {
        path: "standard output".into(),
        source,
    };
    let start = Instant::now();
    let baseline = read()?;
    let mut watcher = Watcher::new(selection, options.top, &baseline);
    let total = watcher.baseline_total();
    if options.json {
        let line = serde_json::json!({
            "sample": 0,
            "source": source,
            "tags": baseline.tags.len(),
            "total": total,
        });
        writeln!(out, "{line}").map_err(out_error)?;
    } else {
        writeln!(
            out,
            "watching {source} every {}: {} tags, {} in {} calls",
            humantime::format_duration(options.interval),
            baseline.tags.len(),
            options.style.size(total.bytes),
            total.calls
        )
        .map_err(out_error)?;
    }
    out.flush().map_err(out_error)?;
    let mut taken = 0usize;
    while options.count.is_none_or(|c| taken < c) {
        std::thread::sleep(options.interval);
        let update = watcher.step(&read()?);
        taken += 1;
        if update.changed == 0 {
            continue;
        }
        if options.json {
            let mut value = serde_json::to_value(&update).unwrap_or(serde_json::Value::Null);
            if let Some(map) = value.as_object_mut() {
                map.insert(
                    "elapsed_s".into(),
                    serde_json::json!(start.elapsed().as_secs_f64()),
                );
            }
            writeln!(out, "{value}").map_err(out_error)?;
        } else {
            writeln!(out, "{}", update.to_text(start.elapsed(), options.style))
                .map_err(out_error)?;
        }
        out.flush().map_err(out_error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocinfo::parse::parse_str;

    fn snap(text: &str) -> Snapshot {
        parse_str("w", text, Mode::Strict).expect("parses")
    }

    #[test]
    fn deltas_against_previous_and_first() {
        let mut w = Watcher::new(
            Selection::default(),
            None,
            &snap("4096 1 include/linux/mm.h:1 func:pagetable_alloc\n100 1 a.c:1 func:f\n"),
        );
        let u = w.step(&snap(
            "8192 2 include/linux/mm.h:1 func:pagetable_alloc\n100 1 a.c:1 func:f\n",
        ));
        assert_eq!(u.changed, 1);
        assert_eq!(
            (u.rows[0].delta_bytes, u.rows[0].since_first_bytes),
            (4096, 4096)
        );
        assert!(u.rows[0].marks.pagetable);
        let u = w.step(&snap("12288 3 include/linux/mm.h:1 func:pagetable_alloc\n"));
        assert_eq!(u.sample, 2);
        assert_eq!(u.changed, 2);
        let pt = &u.rows[0];
        assert_eq!(
            (
                pt.delta_bytes,
                pt.delta_calls,
                pt.since_first_bytes,
                pt.since_first_calls
            ),
            (4096, 1, 8192, 2)
        );
        assert_eq!(
            (u.rows[1].status, u.rows[1].delta_bytes),
            (Status::Removed, -100)
        );
        assert_eq!((u.delta_bytes, u.since_first_bytes), (3996, 8092));
        let u = w.step(&snap("12288 3 include/linux/mm.h:1 func:pagetable_alloc\n"));
        assert_eq!(u.changed, 0);
        assert!(u.rows.is_empty());
    }

    #[test]
    fn text_update() {
        let mut w = Watcher::new(
            Selection::default(),
            Some(1),
            &snap("1024 1 a.c:1 func:f\n"),
        );
        let u = w.step(&snap("3072 3 a.c:1 func:f\n0 1 b.c:1 func:g\n"));
        assert_eq!(
            u.to_text(Duration::from_millis(1500), SizeStyle::Iec),
            "[+1.5s] sample 1: +2.0K since previous, +2.0K since start, total 3.0K; 2 row(s) changed\n\
             CHANGE  CALLS  SINCE-START  CALLS   NOW  MARK  NAME\n\
             \x20+2.0K     +2        +2.0K     +2  3.0K        a.c:1 func:f\n"
        );
    }
}
