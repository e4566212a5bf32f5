//! What a snapshot of /proc/allocinfo holds, independent of the text format it came in.

use std::fmt;

use serde::Serialize;

use super::error::ParseError;

pub use crate::trace::wire::{Counts, Tag, TagKey};

impl fmt::Display for TagKey {
    /// The kernel's own `codetag_to_text()` layout, so users can grep their captures for it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)?;
        if let Some(module) = &self.module {
            write!(f, " [{module}]")?;
        }
        write!(f, " func:{}", self.function)
    }
}

impl Tag {
    pub fn counts(&self) -> Counts {
        Counts {
            bytes: self.bytes,
            calls: self.calls,
        }
    }
}

impl Counts {
    pub fn add(&mut self, other: Counts) {
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.calls = self.calls.saturating_add(other.calls);
    }
}

/// The `allocinfo - version: MAJOR.MINOR` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
}

impl Version {
    pub const V1_0: Version = Version { major: 1, minor: 0 };
    pub const V2_0: Version = Version { major: 2, minor: 0 };

    /// Parses `1.0`; `None` for anything else, so a malformed header is reported, not guessed.
    pub fn parse(text: &str) -> Option<Version> {
        let (major, minor) = text.split_once('.')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(major) || !digits(minor) {
            return None;
        }
        Some(Version {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Which generation of the text format a snapshot was written in, as far as the text shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The 2024 pre-merge series: no header, `module:NAME` on every line.
    PreMerge,
    /// A file with the `allocinfo - version:` header (1.0 since Linux 6.10, 2.0 since 6.18).
    Versioned(Version),
    /// No header: `sort`/`tail` output, or the v6 series that printed raw bytes before the header
    /// was added.
    Headerless,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Format::PreMerge => f.write_str("pre-merge (module:NAME fields)"),
            Format::Versioned(v) => write!(f, "version {v}"),
            Format::Headerless => f.write_str("headerless"),
        }
    }
}

impl Serialize for Format {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Format::PreMerge => s.serialize_str("pre-merge"),
            Format::Versioned(v) => s.collect_str(&format_args!("v{v}")),
            Format::Headerless => s.serialize_str("headerless"),
        }
    }
}

/// A parsed allocinfo text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// The name errors and reports use for this input (a path, or `-`).
    pub source_name: String,
    /// From the header; `None` when the text had none.
    pub version: Option<Version>,
    /// Some line had a `module:NAME` field (pre-merge series).
    pub module_fields: bool,
    /// Some size was human-readable (`2.8M`), so bytes are rounded to 2-3 significant digits.
    pub rounded: bool,
    /// The records in input order; a key can repeat (see [`TagKey`]).
    pub tags: Vec<Tag>,
    /// Lines skipped in lenient mode, with why.
    pub skipped: Vec<ParseError>,
}

impl Snapshot {
    pub fn format(&self) -> Format {
        match (self.version, self.module_fields) {
            (Some(v), _) => Format::Versioned(v),
            (None, true) => Format::PreMerge,
            (None, false) => Format::Headerless,
        }
    }

    /// Sum over all tags.
    pub fn total(&self) -> Counts {
        let mut total = Counts::default();
        for tag in &self.tags {
            total.add(tag.counts());
        }
        total
    }

    /// Sum over the page-table tags (`func:pagetable_alloc`): page tables are vmalloc's hidden
    /// cost, and replay compares this growth with the model's predicted page-table pages.
    pub fn pagetable(&self) -> Counts {
        let mut total = Counts::default();
        for tag in self
            .tags
            .iter()
            .filter(|t| super::marks::is_pagetable(&t.key))
        {
            total.add(tag.counts());
        }
        total
    }

    /// True when some tag says its absolute values are low (`accurate:no`).
    pub fn has_inaccurate(&self) -> bool {
        self.tags.iter().any(|t| !t.accurate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn key_prints_like_the_kernel() {
        let mut key = TagKey {
            file: "drivers/staging/ctagmod/ctagmod.c".into(),
            line: 20,
            module: Some("ctagmod".into()),
            function: "ctagmod_start".into(),
        };
        assert_eq!(
            key.to_string(),
            "drivers/staging/ctagmod/ctagmod.c:20 [ctagmod] func:ctagmod_start"
        );
        key.module = None;
        assert_eq!(
            key.to_string(),
            "drivers/staging/ctagmod/ctagmod.c:20 func:ctagmod_start"
        );
    }

    #[test]
    fn versions() {
        assert_eq!(Version::parse("2.0"), Some(Version::V2_0));
        assert_eq!(
            Version::parse("10.12"),
            Some(Version {
                major: 10,
                minor: 12
            })
        );
        for bad in [
            "",
            "1",
            "1.",
            ".0",
            "1.0.0",
            "a.b",
            "-1.0",
            "1.+0",
            "99999999999.0",
        ] {
            assert_eq!(Version::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tags_round_trip_through_json() {
        let tag = Tag {
            key: TagKey {
                file: "include/linux/mm.h".into(),
                line: 2990,
                module: None,
                function: "pagetable_alloc".into(),
            },
            bytes: 4096,
            calls: 1,
            accurate: false,
            extra: BTreeMap::new(),
        };
        let text = serde_json::to_string(&tag).expect("serializes");
        assert_eq!(
            text,
            r#"{"file":"include/linux/mm.h","line":2990,"module":null,"function":"pagetable_alloc","bytes":4096,"calls":1,"accurate":false}"#
        );
        assert_eq!(serde_json::from_str::<Tag>(&text).expect("parses"), tag);
    }

    #[test]
    fn totals_saturate() {
        let mut c = Counts {
            bytes: i64::MAX,
            calls: u64::MAX,
        };
        c.add(Counts { bytes: 1, calls: 1 });
        assert_eq!(
            c,
            Counts {
                bytes: i64::MAX,
                calls: u64::MAX
            }
        );
    }
}
