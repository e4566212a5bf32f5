//! One parser for every text form of /proc/allocinfo users have captured.
//!
//! Rather than detect a format first and then parse it, each line is read on its own: a header
//! line, a comment, or a record whose fields after `file:line` may come in any order. That one rule
//! covers the pre-merge series, v1.0, v2.0 and whatever `sort`, `tail` or `numfmt` made of them, and
//! keeps working when a header has been sorted into the middle of a file.

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::error::{ParseError, ParseErrorKind};
use super::model::{Snapshot, Tag, TagKey, Version};
use super::size::{is_unit_token, parse_number};

/// What to do with a line that is not a record, header or comment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Stop at the first bad line: a diff of half a file would be silently wrong.
    #[default]
    Strict,
    /// Skip bad lines and keep them in [`Snapshot::skipped`], for captures mangled by hand.
    Lenient,
}

const HEADER_PREFIX: &str = "allocinfo";
const VERSION_PREFIX: &str = "allocinfo - version:";

/// Parses an allocinfo text of any known format.
///
/// `source_name` is only used in errors and reports. Input need not be UTF-8 (a bad line is an
/// error like any other), and no input makes this panic.
pub fn parse(source_name: &str, input: &[u8], mode: Mode) -> Result<Snapshot, ParseError> {
    // One tag per line, near enough: reserving up front avoids re-copying large tag vectors.
    let lines = input.iter().filter(|&&b| b == b'\n').count() + 1;
    let mut snapshot = Snapshot {
        source_name: source_name.to_string(),
        tags: Vec::with_capacity(lines),
        ..Snapshot::default()
    };
    for (index, raw) in input.split(|&b| b == b'\n').enumerate() {
        let line = index + 1;
        let outcome = match std::str::from_utf8(raw) {
            Ok(text) => parse_line(text, &mut snapshot),
            Err(_) => Err((
                ParseErrorKind::NotUtf8,
                String::from_utf8_lossy(raw).into_owned(),
            )),
        };
        if let Err((kind, token)) = outcome {
            let error = ParseError::new(source_name, line, kind, &token);
            match mode {
                Mode::Strict => return Err(error),
                Mode::Lenient => snapshot.skipped.push(error),
            }
        }
    }
    Ok(snapshot)
}

/// [`parse`] for text already in memory as a string.
pub fn parse_str(source_name: &str, input: &str, mode: Mode) -> Result<Snapshot, ParseError> {
    parse(source_name, input.as_bytes(), mode)
}

type LineError = (ParseErrorKind, String);

fn parse_line(text: &str, snapshot: &mut Snapshot) -> Result<(), LineError> {
    let trimmed = text.trim();
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return Ok(());
    }
    if trimmed.starts_with(HEADER_PREFIX) {
        let version = trimmed
            .strip_prefix(VERSION_PREFIX)
            .and_then(|v| Version::parse(v.trim()))
            .ok_or_else(|| (ParseErrorKind::BadVersion, trimmed.to_string()))?;
        return match snapshot.version {
            Some(seen) if seen != version => {
                Err((ParseErrorKind::ConflictingVersion, trimmed.to_string()))
            }
            _ => {
                snapshot.version = Some(version);
                Ok(())
            }
        };
    }
    let record = parse_record(trimmed)?;
    snapshot.module_fields |= record.module_field;
    snapshot.rounded |= record.rounded;
    snapshot.tags.push(record.tag);
    Ok(())
}

struct Record {
    tag: Tag,
    module_field: bool,
    rounded: bool,
}

fn parse_record(line: &str) -> Result<Record, LineError> {
    // An iterator, not a collected Vec: this runs once per line of files with 10^4 lines.
    let mut tokens = line.split_ascii_whitespace();
    let mut rounded = false;

    // The size, possibly spaced from its unit as in `27.2 MiB`.
    let first = tokens
        .next()
        .ok_or_else(|| (ParseErrorKind::MissingField("size"), line.to_string()))?;
    let second = tokens.next();
    let (size_text, calls_text): (Cow<str>, Option<&str>) = match second {
        Some(unit)
            if is_unit_token(unit) && first.bytes().all(|b| b.is_ascii_digit() || b == b'.') =>
        {
            (Cow::Owned(format!("{first}{unit}")), tokens.next())
        }
        _ => (Cow::Borrowed(first), second),
    };
    let size =
        parse_number(&size_text).ok_or_else(|| (ParseErrorKind::BadSize, size_text.to_string()))?;
    let bytes = if size.exact {
        i64::try_from(size.value).map_err(|_| (ParseErrorKind::BadSize, size_text.to_string()))?
    } else {
        // numfmt prints i64::MAX as `8.0E`, a little above it: a rounded value saturates.
        size.value.clamp(i64::MIN.into(), i64::MAX.into()) as i64
    };
    rounded |= !size.exact;

    let calls_text =
        calls_text.ok_or_else(|| (ParseErrorKind::MissingField("call count"), line.to_string()))?;
    let calls = parse_number(calls_text)
        .filter(|n| n.value >= 0)
        .and_then(|n| {
            rounded |= !n.exact;
            match n.exact {
                true => u64::try_from(n.value).ok(),
                false => Some(n.value.min(u64::MAX.into()) as u64),
            }
        })
        .ok_or_else(|| (ParseErrorKind::BadCalls, calls_text.to_string()))?;

    let location = tokens
        .next()
        .ok_or_else(|| (ParseErrorKind::MissingField("FILE:LINE"), line.to_string()))?;
    let (file, line_no) = parse_location(location)
        .ok_or_else(|| (ParseErrorKind::BadLocation, location.to_string()))?;

    let mut module = None;
    let mut module_field = false;
    let mut function = None;
    let mut accurate = None;
    let mut extra = BTreeMap::new();
    for token in tokens {
        let duplicate = || (ParseErrorKind::DuplicateField, token.to_string());
        if let Some(name) = token.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            if name.is_empty() || name.contains(['[', ']']) {
                return Err((ParseErrorKind::UnknownToken, token.to_string()));
            }
            set_once(&mut module, name, duplicate)?;
        } else if let Some(name) = token.strip_prefix("func:").filter(|n| !n.is_empty()) {
            set_once(&mut function, name, duplicate)?;
        } else if let Some(name) = token.strip_prefix("module:").filter(|n| !n.is_empty()) {
            set_once(&mut module, name, duplicate)?;
            module_field = true;
        } else if let Some((key, value)) = key_value(token) {
            match (key, value) {
                ("accurate", "no" | "yes") => {
                    if accurate.replace(value == "yes").is_some() {
                        return Err(duplicate());
                    }
                }
                _ => {
                    if extra.insert(key.to_string(), value.to_string()).is_some() {
                        return Err(duplicate());
                    }
                }
            }
        } else {
            return Err((ParseErrorKind::UnknownToken, token.to_string()));
        }
    }
    let function =
        function.ok_or_else(|| (ParseErrorKind::MissingField("func:NAME"), line.to_string()))?;
    Ok(Record {
        tag: Tag {
            key: TagKey {
                file: file.to_string(),
                line: line_no,
                module,
                function,
            },
            bytes,
            calls,
            accurate: accurate.unwrap_or(true),
            extra,
        },
        module_field,
        rounded,
    })
}

fn set_once(
    slot: &mut Option<String>,
    value: &str,
    duplicate: impl FnOnce() -> LineError,
) -> Result<(), LineError> {
    if slot.is_some() {
        return Err(duplicate());
    }
    *slot = Some(value.to_string());
    Ok(())
}

/// `mm/memory.c:1122` → (`mm/memory.c`, 1122). The last colon splits, so a path with a colon in
/// it still works.
fn parse_location(token: &str) -> Option<(&str, u32)> {
    let (file, line) = token.rsplit_once(':')?;
    if file.is_empty() || line.is_empty() || !line.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((file, line.parse().ok()?))
}

/// A v2.0 `key:value` pair. Keys look like C identifiers, which keeps a stray `file:line` or a
/// mangled token from being taken for a marker.
fn key_value(token: &str) -> Option<(&str, &str)> {
    let (key, value) = token.split_once(':')?;
    let mut chars = key.chars();
    let first = chars.next()?;
    let identifier = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    (identifier && !value.is_empty()).then_some((key, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocinfo::model::Format;

    fn one(line: &str) -> Tag {
        let snap = parse_str("t", line, Mode::Strict).expect("parses");
        assert_eq!(snap.tags.len(), 1);
        snap.tags.into_iter().next().expect("one tag")
    }

    fn error(text: &str) -> ParseError {
        parse_str("t", text, Mode::Strict).expect_err("must fail")
    }

    #[test]
    fn v1_builtin_and_module_lines() {
        let tag = one("   127664128    31168 mm/page_ext.c:270 func:alloc_page_ext ");
        assert_eq!(tag.key.file, "mm/page_ext.c");
        assert_eq!(tag.key.line, 270);
        assert_eq!(tag.key.module, None);
        assert_eq!(tag.key.function, "alloc_page_ext");
        assert_eq!(
            (tag.bytes, tag.calls, tag.accurate),
            (127664128, 31168, true)
        );

        let tag = one("     4136960     1010 drivers/staging/ctagmod/ctagmod.c:20 [ctagmod] func:ctagmod_start ");
        assert_eq!(tag.key.module.as_deref(), Some("ctagmod"));
        assert_eq!(tag.bytes, 4136960);
    }

    #[test]
    fn v2_markers() {
        let tag = one(
            "49152       48 arch/x86/kernel/cpu/mce/core.c:2709 func:mce_device_create accurate:no",
        );
        assert!(!tag.accurate);
        assert!(tag.extra.is_empty());
        let tag = one("1 2 a.c:3 func:f accurate:yes color:blue");
        assert!(tag.accurate);
        assert_eq!(tag.extra.get("color").map(String::as_str), Some("blue"));
        let tag = one("1 2 a.c:3 func:f accurate:maybe");
        assert!(tag.accurate);
        assert_eq!(tag.extra.get("accurate").map(String::as_str), Some("maybe"));
    }

    #[test]
    fn pre_merge_lines() {
        let snap = parse_str(
            "t",
            " 27.2MiB     6970 mm/memory.c:1122 module:memory func:folio_prealloc\n\
             1.20 GiB 2850 fs/ext4/super.c:1408 module:ext4 func:ext4_alloc_inode\n",
            Mode::Strict,
        )
        .expect("parses");
        assert_eq!(snap.format(), Format::PreMerge);
        assert!(snap.rounded);
        assert_eq!(snap.tags[0].bytes, 28521267);
        assert_eq!(snap.tags[0].key.module.as_deref(), Some("memory"));
        assert_eq!(snap.tags[1].bytes, 1288490189);
    }

    #[test]
    fn headers_anywhere_and_conflicts() {
        let text = "1 1 a.c:1 func:f\nallocinfo - version: 2.0\n#     <size>  <calls> <tag info>\n";
        let snap = parse_str("t", text, Mode::Strict).expect("parses");
        assert_eq!(snap.format(), Format::Versioned(Version::V2_0));
        let text = "allocinfo - version: 1.0\nallocinfo - version: 1.0\n";
        assert!(parse_str("t", text, Mode::Strict).is_ok());
        let e = error("allocinfo - version: 1.0\n1 1 a.c:1 func:f\nallocinfo - version: 2.0\n");
        assert_eq!((e.line, e.kind), (3, ParseErrorKind::ConflictingVersion));
        let e = error("allocinfo - version: one\n");
        assert_eq!((e.line, e.kind), (1, ParseErrorKind::BadVersion));
        assert_eq!(e.token, "allocinfo - version: one");
    }

    #[test]
    fn errors_name_line_and_token() {
        let cases: &[(&str, usize, ParseErrorKind, &str)] = &[
            (
                "\n\n12x 3 a.c:1 func:f\n",
                3,
                ParseErrorKind::BadSize,
                "12x",
            ),
            ("1 -3 a.c:1 func:f", 1, ParseErrorKind::BadCalls, "-3"),
            ("1 3 a.c func:f", 1, ParseErrorKind::BadLocation, "a.c"),
            ("1 3 a.c:x func:f", 1, ParseErrorKind::BadLocation, "a.c:x"),
            (
                "1 3 a.c:99999999999 func:f",
                1,
                ParseErrorKind::BadLocation,
                "a.c:99999999999",
            ),
            (
                "1 3 a.c:1",
                1,
                ParseErrorKind::MissingField("func:NAME"),
                "1 3 a.c:1",
            ),
            ("1", 1, ParseErrorKind::MissingField("call count"), "1"),
            ("1 2", 1, ParseErrorKind::MissingField("FILE:LINE"), "1 2"),
            (
                "1 3 a.c:1 func:f func:g",
                1,
                ParseErrorKind::DuplicateField,
                "func:g",
            ),
            (
                "1 3 a.c:1 [m] module:m func:f",
                1,
                ParseErrorKind::DuplicateField,
                "module:m",
            ),
            (
                "1 3 a.c:1 func:f k:1 k:2",
                1,
                ParseErrorKind::DuplicateField,
                "k:2",
            ),
            (
                "1 3 a.c:1 func:f garbage",
                1,
                ParseErrorKind::UnknownToken,
                "garbage",
            ),
            ("1 3 a.c:1 [] func:f", 1, ParseErrorKind::UnknownToken, "[]"),
            ("1 3 a.c:1 func:", 1, ParseErrorKind::UnknownToken, "func:"),
            (
                "9223372036854775808 3 a.c:1 func:f",
                1,
                ParseErrorKind::BadSize,
                "9223372036854775808",
            ),
        ];
        for &(text, line, kind, token) in cases {
            let e = error(text);
            assert_eq!(
                (e.line, e.kind, e.token.as_str()),
                (line, kind, token),
                "{text:?}"
            );
            assert_eq!(e.source_name, "t");
        }
        let e = parse("t", b"1 1 a.c:1 func:f\n\xff\xfe\n", Mode::Strict).expect_err("not utf-8");
        assert_eq!((e.line, e.kind), (2, ParseErrorKind::NotUtf8));
    }

    #[test]
    fn lenient_skips_and_counts() {
        let text = "1 1 a.c:1 func:f\nbad\n2 2 b.c:2 func:g\n3 x c.c:3 func:h\n";
        let snap = parse_str("t", text, Mode::Lenient).expect("lenient never fails");
        assert_eq!(snap.tags.len(), 2);
        let lines: Vec<usize> = snap.skipped.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![2, 4]);
    }

    #[test]
    fn numfmt_on_both_columns_and_crlf() {
        let tag = one("       12M    9.6M a.c:1 func:f\r\n");
        assert_eq!((tag.bytes, tag.calls), (12582912, 10066330));
    }

    #[test]
    fn rounded_values_saturate_exact_ones_do_not() {
        let tag = one("8.0E 16E a.c:1 func:f");
        assert_eq!((tag.bytes, tag.calls), (i64::MAX, u64::MAX));
        assert_eq!(one("-8.0E 0 a.c:1 func:f").bytes, i64::MIN);
        assert_eq!(
            error("1 18446744073709551616 a.c:1 func:f").kind,
            ParseErrorKind::BadCalls
        );
    }
}
