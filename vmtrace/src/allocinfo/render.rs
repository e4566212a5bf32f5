//! Text-table helpers shared by `show`, `diff` and `watch`.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use super::query::EntryKey;
use super::size::format_iec;

/// How sizes are printed in text output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SizeStyle {
    /// Like `numfmt --to=iec`, the way kernel developers read allocinfo today.
    #[default]
    Iec,
    /// Exact byte counts, for scripts that want text rather than JSON.
    Exact,
}

impl SizeStyle {
    pub fn size(self, bytes: i64) -> String {
        match self {
            SizeStyle::Iec => format_iec(i128::from(bytes)),
            SizeStyle::Exact => bytes.to_string(),
        }
    }

    /// A change, always signed so growth and shrinkage read at a glance.
    pub fn delta(self, bytes: i64) -> String {
        signed(self.size(bytes), bytes)
    }
}

/// Prefixes `+` to non-negative values (negative ones carry their `-` already).
pub fn signed(text: String, value: i64) -> String {
    if value >= 0 {
        format!("+{text}")
    } else {
        text
    }
}

/// Right-aligns every column but the last, which is the free-form tag name. Widths come from the
/// content, so columns line up whatever the magnitudes.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate().take(columns) {
            if i > 0 {
                line.push_str("  ");
            }
            if i + 1 == columns {
                line.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// In JSON a tag row carries its four identity fields and a group row its name, so scripts can
/// select on either without parsing the tag text.
impl Serialize for EntryKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            EntryKey::Tag(key) => key.serialize(serializer),
            EntryKey::Group(name) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("group", name)?;
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_deltas() {
        assert_eq!(SizeStyle::Iec.size(2936012), "2.8M");
        assert_eq!(SizeStyle::Iec.delta(2936012), "+2.8M");
        assert_eq!(SizeStyle::Iec.delta(-1025), "-1.1K");
        assert_eq!(SizeStyle::Exact.delta(0), "+0");
        assert_eq!(SizeStyle::Exact.size(-7), "-7");
    }

    #[test]
    fn table_aligns() {
        let rows = vec![
            vec![
                "1.0K".to_string(),
                "3".to_string(),
                "a.c:1 func:f".to_string(),
            ],
            vec![
                "12M".to_string(),
                "1000".to_string(),
                "b.c:2 func:g".to_string(),
            ],
        ];
        assert_eq!(
            table(&["BYTES", "CALLS", "TAG"], &rows),
            "BYTES  CALLS  TAG\n 1.0K      3  a.c:1 func:f\n  12M   1000  b.c:2 func:g\n"
        );
    }
}
