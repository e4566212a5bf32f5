//! The change between two snapshots, per tag or per group.
//!
//! Semantics, also in docs/allocinfo.md: a row's delta is NEW minus OLD, with a missing side
//! counting as zero (an added tag's delta is its whole value). Totals cover every row the
//! `--filter` keeps; `--min-delta` and `--top` only shorten the listing. For `accurate:no` tags the
//! kernel documents that absolute values are too low but deltas are exact, so deltas are used as
//! they are and only the absolute values are flagged.

use serde::Serialize;

use super::marks::Marks;
use super::model::{Counts, Format, Snapshot};
use super::query::{fast_map, Entry, EntryKey, FastMap, GroupBy, Selection};
use super::render::{signed, table, SizeStyle};

/// What happened to a key between the two snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Added,
    Removed,
    Changed,
    Unchanged,
}

/// One key's change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiffRow {
    #[serde(flatten)]
    pub key: EntryKey,
    pub status: Status,
    pub old_bytes: Option<i64>,
    pub new_bytes: Option<i64>,
    pub delta_bytes: i64,
    pub old_calls: Option<u64>,
    pub new_calls: Option<u64>,
    pub delta_calls: i64,
    /// False when a summed tag was `accurate:no` on that side: its absolute value is too low.
    pub old_accurate: Option<bool>,
    pub new_accurate: Option<bool>,
    #[serde(flatten)]
    pub marks: Marks,
}

impl DiffRow {
    pub fn is_inaccurate(&self) -> bool {
        self.old_accurate == Some(false) || self.new_accurate == Some(false)
    }
}

/// Sums over all rows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DiffTotals {
    pub old_bytes: i64,
    pub new_bytes: i64,
    pub delta_bytes: i64,
    pub old_calls: u64,
    pub new_calls: u64,
    pub delta_calls: i64,
    pub added: usize,
    pub removed: usize,
    pub changed: usize,
    pub unchanged: usize,
    /// Rows whose absolute values are flagged (`accurate:no` on either side).
    pub inaccurate: usize,
}

/// Where a side of the diff came from, for reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceInfo {
    pub source: String,
    pub format: Format,
    pub tags: usize,
    pub skipped_lines: usize,
    pub rounded: bool,
}

impl SourceInfo {
    pub fn of(snapshot: &Snapshot) -> SourceInfo {
        SourceInfo {
            source: snapshot.source_name.clone(),
            format: snapshot.format(),
            tags: snapshot.tags.len(),
            skipped_lines: snapshot.skipped.len(),
            rounded: snapshot.rounded,
        }
    }
}

/// The whole comparison; `rows` are in no particular order until [`Diff::listing`] picks and
/// sorts them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diff {
    pub old: SourceInfo,
    pub new: SourceInfo,
    pub group_by: Option<GroupBy>,
    /// Things that make the numbers less than they seem: format mismatches, rounded sizes.
    pub warnings: Vec<String>,
    pub totals: DiffTotals,
    pub rows: Vec<DiffRow>,
}

/// What `diff --json` prints.
#[derive(Debug, Serialize)]
pub struct DiffJson<'a> {
    pub old: &'a SourceInfo,
    pub new: &'a SourceInfo,
    pub group_by: Option<GroupBy>,
    pub warnings: &'a [String],
    pub totals: &'a DiffTotals,
    pub rows: Vec<&'a DiffRow>,
}

/// Diffs two snapshots after applying the same selection to both.
pub fn diff(old: &Snapshot, new: &Snapshot, selection: &Selection) -> Diff {
    // The two sides are independent; folding them on two threads halves this step's time.
    let (old_entries, new_entries) = std::thread::scope(|scope| {
        let other = scope.spawn(|| selection.entries(old));
        let new_entries = selection.entries(new);
        let old_entries = other
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (old_entries, new_entries)
    });
    let rows = diff_entries(old_entries, new_entries);
    Diff {
        old: SourceInfo::of(old),
        new: SourceInfo::of(new),
        group_by: selection.group_by,
        warnings: warnings(old, new, &rows),
        totals: totals(&rows),
        rows,
    }
}

/// Joins two entry lists on their keys; rows come in no particular order (listings sort them).
///
/// The lists are consumed so that each row takes its key from them instead of cloning it.
pub fn diff_entries(old: Vec<Entry>, new: Vec<Entry>) -> Vec<DiffRow> {
    let partner: Vec<Option<usize>> = {
        let mut index: FastMap<&EntryKey, usize> = fast_map(new.len());
        index.extend(new.iter().enumerate().map(|(i, e)| (&e.key, i)));
        old.iter().map(|e| index.get(&e.key).copied()).collect()
    };
    let mut new: Vec<Option<Entry>> = new.into_iter().map(Some).collect();
    let mut rows = Vec::with_capacity(old.len().max(new.len()));
    for (o, j) in old.into_iter().zip(partner) {
        let n = j.and_then(|j| new.get_mut(j)).and_then(Option::take);
        rows.push(row(Some(o), n));
    }
    rows.extend(new.into_iter().flatten().map(|n| row(None, Some(n))));
    rows
}

fn row(old: Option<Entry>, new: Option<Entry>) -> DiffRow {
    let counts = |e: &Option<Entry>| e.as_ref().map(|e| e.counts).unwrap_or_default();
    let (before, after) = (counts(&old), counts(&new));
    let delta_bytes = saturate(i128::from(after.bytes) - i128::from(before.bytes));
    let delta_calls = saturate(i128::from(after.calls) - i128::from(before.calls));
    let status = match (&old, &new) {
        (None, _) => Status::Added,
        (_, None) => Status::Removed,
        _ if delta_bytes == 0 && delta_calls == 0 => Status::Unchanged,
        _ => Status::Changed,
    };
    let mut marks = Marks::default();
    for entry in old.iter().chain(new.iter()) {
        marks.merge(entry.marks);
    }
    let old_accurate = old.as_ref().map(Entry::accurate);
    let new_accurate = new.as_ref().map(Entry::accurate);
    let (old_bytes, old_calls) = (
        old.as_ref().map(|e| e.counts.bytes),
        old.as_ref().map(|e| e.counts.calls),
    );
    let (new_bytes, new_calls) = (
        new.as_ref().map(|e| e.counts.bytes),
        new.as_ref().map(|e| e.counts.calls),
    );
    // Either side has the key; prefer NEW's (identical by construction).
    let key = match (new, old) {
        (Some(e), _) | (None, Some(e)) => e.key,
        (None, None) => EntryKey::Group(String::new()),
    };
    DiffRow {
        key,
        status,
        old_bytes,
        new_bytes,
        delta_bytes,
        old_calls,
        new_calls,
        delta_calls,
        old_accurate,
        new_accurate,
        marks,
    }
}

/// Deltas of extreme (fuzzed or corrupt) values are clamped rather than wrapped.
fn saturate(value: i128) -> i64 {
    i64::try_from(value).unwrap_or(if value < 0 { i64::MIN } else { i64::MAX })
}

fn totals(rows: &[DiffRow]) -> DiffTotals {
    let mut old = Counts::default();
    let mut new = Counts::default();
    let mut t = DiffTotals::default();
    for row in rows {
        old.add(Counts {
            bytes: row.old_bytes.unwrap_or(0),
            calls: row.old_calls.unwrap_or(0),
        });
        new.add(Counts {
            bytes: row.new_bytes.unwrap_or(0),
            calls: row.new_calls.unwrap_or(0),
        });
        match row.status {
            Status::Added => t.added += 1,
            Status::Removed => t.removed += 1,
            Status::Changed => t.changed += 1,
            Status::Unchanged => t.unchanged += 1,
        }
        t.inaccurate += usize::from(row.is_inaccurate());
    }
    t.old_bytes = old.bytes;
    t.new_bytes = new.bytes;
    t.old_calls = old.calls;
    t.new_calls = new.calls;
    t.delta_bytes = saturate(i128::from(new.bytes) - i128::from(old.bytes));
    t.delta_calls = saturate(i128::from(new.calls) - i128::from(old.calls));
    t
}

fn warnings(old: &Snapshot, new: &Snapshot, rows: &[DiffRow]) -> Vec<String> {
    let mut out = Vec::new();
    let (old_format, new_format) = (old.format(), new.format());
    if old_format != new_format {
        out.push(format!(
            "formats differ: {} is {old_format}, {} is {new_format}; tags are still matched on file, \
             line, module and function",
            old.source_name, new.source_name
        ));
        if (old_format == Format::PreMerge) != (new_format == Format::PreMerge) {
            out.push(
                "pre-merge captures name a module on every line (module:NAME, even for built-in \
                 code), so their tags will not match those of a newer kernel"
                    .to_string(),
            );
        }
    }
    for snap in [old, new] {
        if snap.rounded {
            out.push(format!(
                "{} has human-readable sizes (2-3 significant digits): byte deltas are approximate",
                snap.source_name
            ));
        }
    }
    let inaccurate = rows.iter().filter(|r| r.is_inaccurate()).count();
    if inaccurate > 0 {
        out.push(format!(
            "{inaccurate} row(s) are accurate:no (marked ~): their absolute values are too low, \
             their deltas are exact"
        ));
    }
    out
}

/// Orders of `diff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiffSort {
    /// Largest change in bytes first, growth or shrinkage alike.
    #[default]
    DeltaBytes,
    /// Largest change in calls first.
    DeltaCalls,
    /// Largest byte count in NEW first (OLD for removed tags).
    Bytes,
    /// Most calls in NEW first (OLD for removed tags).
    Calls,
    /// By name: file, line, module, function for tags; the group name for groups.
    Name,
}

/// Which rows to print and in what order.
#[derive(Debug, Clone, Copy, Default)]
pub struct Listing {
    pub sort: DiffSort,
    /// Only rows whose byte change is at least this large (either sign).
    pub min_delta: u64,
    pub top: Option<usize>,
    /// Also list rows that did not change.
    pub all: bool,
}

impl Diff {
    /// The rows to print: changed (or all), at least `min_delta`, sorted, cut to `top`.
    pub fn listing(&self, listing: &Listing) -> Vec<&DiffRow> {
        let mut rows: Vec<&DiffRow> = self
            .rows
            .iter()
            .filter(|r| listing.all || r.status != Status::Unchanged)
            .filter(|r| r.delta_bytes.unsigned_abs() >= listing.min_delta)
            .collect();
        let current = |r: &DiffRow| -> (i64, u64) {
            (
                r.new_bytes.or(r.old_bytes).unwrap_or(0),
                r.new_calls.or(r.old_calls).unwrap_or(0),
            )
        };
        match listing.sort {
            DiffSort::DeltaBytes => rows.sort_by(|a, b| {
                b.delta_bytes
                    .unsigned_abs()
                    .cmp(&a.delta_bytes.unsigned_abs())
                    .then(b.delta_bytes.cmp(&a.delta_bytes))
                    .then_with(|| a.key.cmp(&b.key))
            }),
            DiffSort::DeltaCalls => rows.sort_by(|a, b| {
                b.delta_calls
                    .unsigned_abs()
                    .cmp(&a.delta_calls.unsigned_abs())
                    .then(b.delta_calls.cmp(&a.delta_calls))
                    .then_with(|| a.key.cmp(&b.key))
            }),
            DiffSort::Bytes => rows.sort_by(|a, b| {
                current(b)
                    .0
                    .cmp(&current(a).0)
                    .then_with(|| a.key.cmp(&b.key))
            }),
            DiffSort::Calls => rows.sort_by(|a, b| {
                current(b)
                    .1
                    .cmp(&current(a).1)
                    .then_with(|| a.key.cmp(&b.key))
            }),
            DiffSort::Name => rows.sort_by(|a, b| a.key.cmp(&b.key)),
        }
        if let Some(top) = listing.top {
            rows.truncate(top);
        }
        rows
    }

    /// The JSON document of `diff --json`: the struct with only the listed rows. It is
    /// serialized straight to text; going through `serde_json::Value` doubled the time of a
    /// 10 000-tag diff.
    pub fn to_json(&self, listing: &Listing) -> DiffJson<'_> {
        DiffJson {
            old: &self.old,
            new: &self.new,
            group_by: self.group_by,
            warnings: &self.warnings,
            totals: &self.totals,
            rows: self.listing(listing),
        }
    }

    /// The text report of `diff`.
    pub fn to_text(&self, listing: &Listing, style: SizeStyle) -> String {
        let mut out = format!(
            "old: {} ({}, {} tags)\nnew: {} ({}, {} tags)\n",
            self.old.source,
            self.old.format,
            self.old.tags,
            self.new.source,
            self.new.format,
            self.new.tags
        );
        for w in &self.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        let rows: Vec<Vec<String>> = self
            .listing(listing)
            .into_iter()
            .map(|r| {
                let flag = if r.is_inaccurate() { "~" } else { "" };
                let abs = |v: Option<i64>| {
                    v.map_or("-".to_string(), |b| format!("{flag}{}", style.size(b)))
                };
                vec![
                    style.delta(r.delta_bytes),
                    signed(r.delta_calls.to_string(), r.delta_calls),
                    abs(r.old_bytes),
                    abs(r.new_bytes),
                    status_label(r.status).to_string(),
                    r.marks.label().to_string(),
                    r.key.to_string(),
                ]
            })
            .collect();
        let name = if self.group_by.is_some() {
            "GROUP"
        } else {
            "TAG"
        };
        out.push('\n');
        out.push_str(&table(
            &["DELTA", "CALLS", "OLD", "NEW", "STATUS", "MARK", name],
            &rows,
        ));
        let t = &self.totals;
        out.push_str(&format!(
            "\ntotal: {} bytes, {} calls (old {} in {} calls, new {} in {} calls); \
             {} added, {} removed, {} changed, {} unchanged\n",
            style.delta(t.delta_bytes),
            signed(t.delta_calls.to_string(), t.delta_calls),
            style.size(t.old_bytes),
            t.old_calls,
            style.size(t.new_bytes),
            t.new_calls,
            t.added,
            t.removed,
            t.changed,
            t.unchanged
        ));
        out.push_str(
            "marks: pt = page tables (pagetable_alloc), vm = vmalloc call site; ~ = accurate:no\n",
        );
        out
    }
}

fn status_label(status: Status) -> &'static str {
    match status {
        Status::Added => "added",
        Status::Removed => "removed",
        Status::Changed => "",
        Status::Unchanged => "same",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocinfo::parse::{parse_str, Mode};

    const OLD: &str = "\
allocinfo - version: 1.0
#     <size>  <calls> <tag info>
        4096        1 include/linux/mm.h:2990 func:pagetable_alloc 
        8192        2 mm/vmalloc.c:100 func:alloc_vmap_area 
       16384        4 fs/ext4/super.c:5 [ext4] func:ext4_alloc_inode 
         512        8 kernel/fork.c:1 func:gone 
";
    const NEW: &str = "\
allocinfo - version: 2.0
#     <size>  <calls> <tag info>
       12288        3 include/linux/mm.h:2990 func:pagetable_alloc 
        8192        2 mm/vmalloc.c:100 func:alloc_vmap_area 
       10000        5 fs/ext4/super.c:5 [ext4] func:ext4_alloc_inode accurate:no 
         100        1 kernel/fork.c:2 func:born 
";

    fn snapshots() -> (Snapshot, Snapshot) {
        (
            parse_str("old", OLD, Mode::Strict).expect("old"),
            parse_str("new", NEW, Mode::Strict).expect("new"),
        )
    }

    #[test]
    fn rows_and_totals() {
        let (old, new) = snapshots();
        let d = diff(&old, &new, &Selection::default());
        let listed: Vec<(String, Status, i64, i64)> = d
            .listing(&Listing::default())
            .into_iter()
            .map(|r| (r.key.to_string(), r.status, r.delta_bytes, r.delta_calls))
            .collect();
        assert_eq!(
            listed,
            vec![
                (
                    "include/linux/mm.h:2990 func:pagetable_alloc".to_string(),
                    Status::Changed,
                    8192,
                    2
                ),
                (
                    "fs/ext4/super.c:5 [ext4] func:ext4_alloc_inode".to_string(),
                    Status::Changed,
                    -6384,
                    1
                ),
                (
                    "kernel/fork.c:1 func:gone".to_string(),
                    Status::Removed,
                    -512,
                    -8
                ),
                (
                    "kernel/fork.c:2 func:born".to_string(),
                    Status::Added,
                    100,
                    1
                ),
            ]
        );
        assert_eq!(
            d.totals,
            DiffTotals {
                old_bytes: 29184,
                new_bytes: 30580,
                delta_bytes: 1396,
                old_calls: 15,
                new_calls: 11,
                delta_calls: -4,
                added: 1,
                removed: 1,
                changed: 2,
                unchanged: 1,
                inaccurate: 1,
            }
        );
        assert_eq!(d.warnings.len(), 2, "{:?}", d.warnings);
        assert!(d.warnings[0].starts_with("formats differ: old is version 1.0, new is version 2.0"));
    }

    #[test]
    fn listing_options() {
        let (old, new) = snapshots();
        let d = diff(&old, &new, &Selection::default());
        let names = |l: Listing| -> Vec<String> {
            d.listing(&l)
                .into_iter()
                .map(|r| r.key.to_string())
                .collect()
        };
        assert_eq!(
            names(Listing {
                min_delta: 6000,
                ..Listing::default()
            })
            .len(),
            2
        );
        assert_eq!(
            names(Listing {
                all: true,
                sort: DiffSort::Name,
                ..Listing::default()
            })
            .len(),
            5
        );
        assert_eq!(
            names(Listing {
                sort: DiffSort::DeltaCalls,
                top: Some(1),
                ..Listing::default()
            }),
            vec!["kernel/fork.c:1 func:gone"]
        );
        assert_eq!(
            names(Listing {
                sort: DiffSort::Bytes,
                top: Some(1),
                ..Listing::default()
            }),
            vec!["include/linux/mm.h:2990 func:pagetable_alloc"]
        );
    }

    #[test]
    fn self_diff_is_zero() {
        let (old, _) = snapshots();
        let d = diff(&old, &old, &Selection::default());
        assert!(d.rows.iter().all(|r| r.status == Status::Unchanged));
        assert_eq!((d.totals.delta_bytes, d.totals.delta_calls), (0, 0));
        assert!(d.listing(&Listing::default()).is_empty());
    }

    #[test]
    fn extreme_values_saturate() {
        let old = parse_str("o", "-9223372036854775808 0 a.c:1 func:f", Mode::Strict).expect("o");
        let new = parse_str(
            "n",
            "9223372036854775807 18446744073709551615 a.c:1 func:f",
            Mode::Strict,
        )
        .expect("n");
        let d = diff(&old, &new, &Selection::default());
        assert_eq!(d.rows[0].delta_bytes, i64::MAX);
        assert_eq!(d.rows[0].delta_calls, i64::MAX);
    }
}
