//! Property tests: every text format round-trips, a snapshot diffed with itself is all zeros,
//! and no input, however mangled, makes the parser (or the reports built on it) panic.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::Config;

use vmtrace::allocinfo::diff::{diff, Listing, Status};
use vmtrace::allocinfo::query::{GroupBy, Selection, ShowSort};
use vmtrace::allocinfo::render::SizeStyle;
use vmtrace::allocinfo::show::show;
use vmtrace::allocinfo::write::{to_text, TextFormat};
use vmtrace::allocinfo::{parse, parse_str, Mode, ParseErrorKind, Snapshot, Tag, TagKey};

/// Inside a module named `allocinfo`, so `cargo test allocinfo` selects these tests too.
mod allocinfo {
    use super::*;

    fn key_strategy() -> impl Strategy<Value = TagKey> {
        (
            "[a-z][a-z0-9_/.-]{0,24}\\.[ch]",
            0u32..=u32::MAX,
            prop::option::of("[a-z_][a-z0-9_]{0,12}"),
            "[A-Za-z_][A-Za-z0-9_.]{0,24}",
        )
            .prop_map(|(file, line, module, function)| TagKey {
                file,
                line,
                module,
                function,
            })
    }

    /// Values and v2.0 markers; keys that the format reserves (func, module, accurate) are avoided
    /// because they mean something else.
    fn value_strategy() -> impl Strategy<Value = (i64, u64, bool, BTreeMap<String, String>)> {
        (
            prop_oneof![0i64..4096, -(1i64 << 20)..(1i64 << 40), any::<i64>(),],
            prop_oneof![0u64..100_000, any::<u64>()],
            prop::bool::weighted(0.8),
            prop::collection::btree_map(
                "[a-z_][a-z0-9_]{0,8}".prop_filter("reserved", |k| {
                    !matches!(k.as_str(), "func" | "module" | "accurate")
                }),
                "[A-Za-z0-9_.:=-]{1,12}",
                0..3,
            ),
        )
    }

    /// Tags with distinct keys, so that a reordering format (sort -g, sort -h) can be compared with
    /// the original tag by tag.
    fn tags_strategy() -> impl Strategy<Value = Vec<Tag>> {
        prop::collection::btree_map(key_strategy(), value_strategy(), 0..40).prop_map(|m| {
            m.into_iter()
                .map(|(key, (bytes, calls, accurate, extra))| Tag {
                    key,
                    bytes,
                    calls,
                    accurate,
                    extra,
                })
                .collect()
        })
    }

    /// What a format keeps of a tag.
    fn expected(tag: &Tag, format: TextFormat) -> Tag {
        let mut t = tag.clone();
        if !format.has_markers() {
            t.accurate = true;
            t.extra.clear();
        }
        if format == TextFormat::PreMerge {
            t.bytes = t.bytes.max(0);
        }
        t
    }

    /// How far a human size may be from the value it was printed from: `numfmt --to=iec` keeps two
    /// significant digits and rounds away from zero; `string_get_size()` keeps three.
    fn tolerance(format: TextFormat, bytes: i64) -> u128 {
        let magnitude = u128::from(bytes.unsigned_abs());
        match format {
            TextFormat::PreMerge => magnitude / 100 + 1,
            f if f.is_exact() => 0,
            _ => magnitude / 10 + 1,
        }
    }

    fn arbitrary_snapshot() -> impl Strategy<Value = Snapshot> {
        // Repeated keys on purpose: real files have them and the diff must sum them.
        (
            prop::collection::vec((key_strategy(), value_strategy()), 0..30),
            prop::sample::select(vec![0usize, 1, 2]),
        )
            .prop_map(|(items, dup)| {
                let mut tags: Vec<Tag> = items
                    .into_iter()
                    .map(|(key, (bytes, calls, accurate, extra))| Tag {
                        key,
                        bytes,
                        calls,
                        accurate,
                        extra,
                    })
                    .collect();
                let copies: Vec<Tag> = tags.iter().take(dup).cloned().collect();
                tags.extend(copies);
                Snapshot {
                    source_name: "generated".into(),
                    tags,
                    ..Snapshot::default()
                }
            })
    }

    fn group_strategy() -> impl Strategy<Value = Option<GroupBy>> {
        prop::option::of(prop::sample::select(vec![
            GroupBy::Func,
            GroupBy::File,
            GroupBy::Module,
            GroupBy::Dir,
        ]))
    }

    /// Parses with both modes and checks what must hold for any input: no panic, every error on a
    /// real line, lenient mode never failing, and each skipped line failing on its own too.
    fn check_any_input(input: &[u8]) -> Result<(), TestCaseError> {
        let lines = input.split(|&b| b == b'\n').count();
        match parse("fuzz", input, Mode::Strict) {
            Ok(_) => {}
            Err(e) => {
                prop_assert!(
                    e.line >= 1 && e.line <= lines,
                    "line {} of {}",
                    e.line,
                    lines
                );
                prop_assert_eq!(e.source_name.as_str(), "fuzz");
                let prefix = format!("fuzz:{}: ", e.line);
                prop_assert!(e.to_string().starts_with(&prefix), "{}", e);
            }
        }
        let lenient = parse("fuzz", input, Mode::Lenient);
        prop_assert!(lenient.is_ok(), "lenient mode never fails");
        let snap = lenient.unwrap_or_default();
        prop_assert!(snap.tags.len() + snap.skipped.len() <= lines);
        let raw_lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
        for e in &snap.skipped {
            prop_assert!(e.line >= 1 && e.line <= lines);
            if e.kind != ParseErrorKind::ConflictingVersion {
                let alone = parse("line", raw_lines[e.line - 1], Mode::Strict);
                prop_assert!(alone.is_err(), "line {} fails alone too", e.line);
            }
        }
        // The reports built on a parsed file must not panic either.
        let sel = Selection {
            group_by: Some(GroupBy::Dir),
            ..Selection::default()
        };
        let _ = show(&snap, &sel, ShowSort::Bytes, Some(5)).to_text(SizeStyle::Iec);
        let d = diff(&snap, &Snapshot::default(), &Selection::default());
        let _ = d.to_text(&Listing::default(), SizeStyle::Iec);
        prop_assert!(serde_json::to_string(&d.to_json(&Listing::default())).is_ok());
        Ok(())
    }

    /// One random edit of a valid text.
    #[derive(Debug, Clone)]
    enum Mutation {
        Delete { at: usize, len: usize },
        Insert { at: usize, text: String },
        ReplaceToken { index: usize, with: String },
        DuplicateToken { index: usize },
        SwapTokens { a: usize, b: usize },
        Truncate { at: usize },
    }

    fn mutation_strategy() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<usize>(), 1usize..8).prop_map(|(at, len)| Mutation::Delete { at, len }),
            (
                any::<usize>(),
                prop_oneof!["\\PC{1,4}", "[ :\\[\\]\\-.0-9a-zA-Z\n\t]{1,4}"]
            )
                .prop_map(|(at, text)| Mutation::Insert { at, text }),
            (
                any::<usize>(),
                prop_oneof![
                    "\\PC{0,8}",
                    "[0-9.]{1,25}[KMGTPEZYRQ]?i?B?",
                    "-?[0-9]{18,22}",
                    "func:|module:|\\[\\]|\\[a\\]b\\]|accurate:no|k:",
                    "allocinfo - version: [0-9.]{0,5}",
                ]
            )
                .prop_map(|(index, with)| Mutation::ReplaceToken { index, with }),
            any::<usize>().prop_map(|index| Mutation::DuplicateToken { index }),
            (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapTokens { a, b }),
            any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        ]
    }

    fn apply(text: &str, m: &Mutation) -> String {
        let chars: Vec<char> = text.chars().collect();
        let n = chars.len();
        let tokens: Vec<&str> = text.split(' ').collect();
        let t = tokens.len();
        match m {
            Mutation::Delete { at, len } if n > 0 => {
                let at = at % n;
                let end = (at + len).min(n);
                chars[..at].iter().chain(&chars[end..]).collect()
            }
            Mutation::Insert { at, text: ins } => {
                let at = if n == 0 { 0 } else { at % (n + 1) };
                let mut s: String = chars[..at].iter().collect();
                s.push_str(ins);
                s.extend(&chars[at..]);
                s
            }
            Mutation::ReplaceToken { index, with } if t > 0 => {
                let mut v: Vec<String> = tokens.iter().map(|s| s.to_string()).collect();
                v[index % t] = with.clone();
                v.join(" ")
            }
            Mutation::DuplicateToken { index } if t > 0 => {
                let mut v: Vec<&str> = tokens.clone();
                v.insert(index % t, tokens[index % t]);
                v.join(" ")
            }
            Mutation::SwapTokens { a, b } if t > 0 => {
                let mut v: Vec<&str> = tokens.clone();
                v.swap(a % t, b % t);
                v.join(" ")
            }
            Mutation::Truncate { at } if n > 0 => chars[..at % n].iter().collect(),
            _ => text.to_string(),
        }
    }

    proptest! {
        #![proptest_config(Config::with_cases(512))]

        /// A generated snapshot printed in each format and parsed back gives the same tags (exactly
        /// for the raw formats, within the printed precision for the human ones).
        #[test]
        fn every_format_round_trips(tags in tags_strategy()) {
            for format in TextFormat::ALL {
                let text = to_text(&tags, format);
                let parsed = parse_str("generated", &text, Mode::Strict)
                    .map_err(|e| TestCaseError::fail(format!("{format:?}: {e}\n{text}")))?;
                prop_assert_eq!(parsed.tags.len(), tags.len());
                if format.is_exact() {
                    prop_assert!(!parsed.rounded);
                }
                let mut want: Vec<Tag> = tags.iter().map(|t| expected(t, format)).collect();
                let mut got = parsed.tags.clone();
                want.sort_by(|a, b| a.key.cmp(&b.key));
                got.sort_by(|a, b| a.key.cmp(&b.key));
                for (w, g) in want.iter().zip(&got) {
                    prop_assert_eq!(&g.key, &w.key, "{:?}", format);
                    prop_assert_eq!(g.calls, w.calls, "{:?}", format);
                    prop_assert_eq!(g.accurate, w.accurate, "{:?}", format);
                    prop_assert_eq!(&g.extra, &w.extra, "{:?}", format);
                    let error = (i128::from(g.bytes) - i128::from(w.bytes)).unsigned_abs();
                    prop_assert!(
                        error <= tolerance(format, w.bytes),
                        "{:?}: {} printed and read back as {}", format, w.bytes, g.bytes
                    );
                }
            }
        }

        /// A diff of a snapshot with itself is all zeros, grouped or not.
        #[test]
        fn self_diff_is_all_zeros(snap in arbitrary_snapshot(), group_by in group_strategy()) {
            let sel = Selection { group_by, ..Selection::default() };
            let d = diff(&snap, &snap, &sel);
            for row in &d.rows {
                prop_assert_eq!(row.status, Status::Unchanged);
                prop_assert_eq!((row.delta_bytes, row.delta_calls), (0, 0));
                prop_assert_eq!(row.old_bytes, row.new_bytes);
            }
            prop_assert_eq!((d.totals.delta_bytes, d.totals.delta_calls), (0, 0));
            prop_assert_eq!((d.totals.added, d.totals.removed, d.totals.changed), (0, 0, 0));
            prop_assert!(d.listing(&Listing::default()).is_empty());
        }

        /// Swapping OLD and NEW negates every delta and swaps added and removed.
        #[test]
        fn diff_is_antisymmetric(a in arbitrary_snapshot(), b in arbitrary_snapshot(), group_by in group_strategy()) {
            let sel = Selection { group_by, ..Selection::default() };
            let mut ab = diff(&a, &b, &sel);
            let mut ba = diff(&b, &a, &sel);
            ab.rows.sort_by(|x, y| x.key.cmp(&y.key));
            ba.rows.sort_by(|x, y| x.key.cmp(&y.key));
            prop_assert_eq!(ab.rows.len(), ba.rows.len());
            for (x, y) in ab.rows.iter().zip(&ba.rows) {
                prop_assert_eq!(&x.key, &y.key);
                if x.delta_bytes != i64::MIN && x.delta_bytes != i64::MAX {
                    prop_assert_eq!(x.delta_bytes, -y.delta_bytes);
                }
                if x.delta_calls != i64::MIN && x.delta_calls != i64::MAX {
                    prop_assert_eq!(x.delta_calls, -y.delta_calls);
                }
            }
            prop_assert_eq!((ab.totals.added, ab.totals.removed), (ba.totals.removed, ba.totals.added));
        }
    }

    proptest! {
        #![proptest_config(Config::with_cases(2048))]

        /// Arbitrary bytes: never a panic, every error on a real line.
        #[test]
        fn fuzz_bytes(input in prop::collection::vec(any::<u8>(), 0..512)) {
            check_any_input(&input)?;
        }

        /// Arbitrary text, biased towards the characters the format is made of.
        #[test]
        fn fuzz_text(input in prop_oneof![
            "\\PC{0,200}",
            "([ \t]{0,3}[-+0-9.]{0,22}[KMGTPEkBi]{0,3}[ \t]{1,3}[0-9]{0,21}[ \t]{1,3}[a-z/.:0-9]{0,12}( \\[[a-z]{0,3}\\]| func:[a-z]{0,4}| [a-z]{0,3}:[a-z]{0,3}){0,4}\r?\n){0,12}",
        ]) {
            check_any_input(input.as_bytes())?;
        }
    }

    proptest! {
        #![proptest_config(Config::with_cases(1024))]

        /// Valid files in every format with a few random edits: no panic, errors located, and the
        /// untouched lines still parse.
        #[test]
        fn fuzz_mutated_valid_files(
            tags in tags_strategy(),
            format in prop::sample::select(TextFormat::ALL.to_vec()),
            mutations in prop::collection::vec((any::<prop::sample::Index>(), mutation_strategy()), 1..4),
        ) {
            let text = to_text(&tags, format);
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            if lines.is_empty() {
                lines.push(String::new());
            }
            for (index, m) in &mutations {
                let i = index.index(lines.len());
                lines[i] = apply(&lines[i], m);
            }
            let mutated = lines.join("\n");
            check_any_input(mutated.as_bytes())?;
        }
    }
}
