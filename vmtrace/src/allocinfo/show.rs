//! `allocinfo show`: one snapshot as a sorted, filtered, optionally grouped table.

use std::collections::BTreeMap;

use serde::Serialize;

use super::diff::SourceInfo;
use super::marks::Marks;
use super::model::{Counts, Snapshot};
use super::query::{sort_entries, Entry, EntryKey, GroupBy, Selection, ShowSort};
use super::render::{table, SizeStyle};

/// A row of `show --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShowRow {
    #[serde(flatten)]
    pub key: EntryKey,
    pub bytes: i64,
    pub calls: u64,
    /// Tag lines summed into this row.
    pub tags: usize,
    /// False when some summed tag is `accurate:no` (the absolute values are too low).
    pub accurate: bool,
    pub extra: BTreeMap<String, String>,
    #[serde(flatten)]
    pub marks: Marks,
}

/// The result of `show`, ready to print as text or JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Show {
    #[serde(flatten)]
    pub source: SourceInfo,
    pub group_by: Option<GroupBy>,
    pub sort: ShowSort,
    /// Over every row the filter kept, not only the `--top` ones printed.
    pub total: Counts,
    pub rows: Vec<ShowRow>,
}

/// Builds the `show` report.
pub fn show(
    snapshot: &Snapshot,
    selection: &Selection,
    sort: ShowSort,
    top: Option<usize>,
) -> Show {
    let entries: Vec<Entry> = selection.entries(snapshot);
    let mut total = Counts::default();
    for e in &entries {
        total.add(e.counts);
    }
    let mut order: Vec<&Entry> = entries.iter().collect();
    sort_entries(&mut order, sort);
    if let Some(top) = top {
        order.truncate(top);
    }
    let rows = order
        .into_iter()
        .map(|e| ShowRow {
            key: e.key.clone(),
            bytes: e.counts.bytes,
            calls: e.counts.calls,
            tags: e.tags,
            accurate: e.accurate(),
            extra: e.extra.clone(),
            marks: e.marks,
        })
        .collect();
    Show {
        source: SourceInfo::of(snapshot),
        group_by: selection.group_by,
        sort,
        total,
        rows,
    }
}

impl Show {
    pub fn to_text(&self, style: SizeStyle) -> String {
        let grouped = self.group_by.is_some();
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                let flag = if r.accurate { "" } else { "~" };
                let mut row = vec![
                    format!("{flag}{}", style.size(r.bytes)),
                    r.calls.to_string(),
                ];
                if grouped {
                    row.push(r.tags.to_string());
                }
                row.push(r.marks.label().to_string());
                row.push(r.key.to_string());
                row
            })
            .collect();
        let header: &[&str] = if grouped {
            &["BYTES", "CALLS", "TAGS", "MARK", "GROUP"]
        } else {
            &["BYTES", "CALLS", "MARK", "TAG"]
        };
        let mut out = table(header, &rows);
        out.push_str(&format!(
            "\ntotal: {} in {} calls ({}, {}, {} tags)\n",
            style.size(self.total.bytes),
            self.total.calls,
            self.source.source,
            self.source.format,
            self.source.tags
        ));
        if self.rows.iter().any(|r| !r.accurate) {
            out.push_str("~ = accurate:no: the absolute value is too low (deltas stay exact)\n");
        }
        if self.source.rounded {
            out.push_str("note: the input had human-readable sizes, so bytes are rounded\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocinfo::parse::{parse_str, Mode};

    #[test]
    fn text_report() {
        let snap = parse_str(
            "snap.txt",
            "allocinfo - version: 2.0\n\
             #     <size>  <calls> <tag info>\n\
             4096 1 include/linux/mm.h:2990 func:pagetable_alloc \n\
             2936012 30 mm/vmalloc.c:10 func:alloc_vmap_area accurate:no \n\
             100 7 kernel/fork.c:1 func:dup_task_struct \n",
            Mode::Strict,
        )
        .expect("parses");
        let report = show(&snap, &Selection::default(), ShowSort::Bytes, Some(2));
        assert_eq!(
            report.to_text(SizeStyle::Iec),
            "BYTES  CALLS  MARK  TAG\n\
             ~2.8M     30    vm  mm/vmalloc.c:10 func:alloc_vmap_area\n \
             4.0K      1    pt  include/linux/mm.h:2990 func:pagetable_alloc\n\
             \ntotal: 2.9M in 38 calls (snap.txt, version 2.0, 3 tags)\n\
             ~ = accurate:no: the absolute value is too low (deltas stay exact)\n"
        );
    }
}
