//! Every fixture format parses to the exact tags written in it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use vmtrace::allocinfo::{parse, Format, Mode, ParseErrorKind, Snapshot, TagKey, Version};

/// Inside a module named `allocinfo`, so `cargo test allocinfo` selects these tests too.
mod allocinfo {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/allocinfo")
            .join(name)
    }

    fn load(name: &str) -> Snapshot {
        let bytes = std::fs::read(fixture(name)).expect("fixture exists");
        parse(name, &bytes, Mode::Strict).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn bytes(s: &Snapshot) -> Vec<i64> {
        s.tags.iter().map(|t| t.bytes).collect()
    }

    fn calls(s: &Snapshot) -> Vec<u64> {
        s.tags.iter().map(|t| t.calls).collect()
    }

    fn modules(s: &Snapshot) -> Vec<Option<&str>> {
        s.tags.iter().map(|t| t.key.module.as_deref()).collect()
    }

    #[test]
    fn pre_merge_series() {
        let s = load("premerge.txt");
        assert_eq!(s.format(), Format::PreMerge);
        assert!(s.rounded);
        assert_eq!(bytes(&s), [28521267, 1288490189, 3261071, 56623104, 512, 5]);
        assert_eq!(calls(&s), [6970, 31168, 2850, 13824, 4, 1]);
        assert_eq!(
            modules(&s),
            [
                Some("memory"),
                Some("page_ext"),
                Some("ext4"),
                Some("memory"),
                Some("fork"),
                Some("xarray")
            ]
        );
        assert_eq!(
            s.tags[0].key,
            TagKey {
                file: "mm/memory.c".into(),
                line: 1122,
                module: Some("memory".into()),
                function: "folio_prealloc".into()
            }
        );
        assert_eq!(s.pagetable().bytes, 56623104);
    }

    #[test]
    fn v6_series_without_header() {
        let s = load("v6-series.txt");
        assert_eq!(s.format(), Format::Headerless);
        assert!(!s.rounded);
        assert_eq!(bytes(&s), [127664128, 4136960]);
        assert_eq!(modules(&s), [None, Some("ctagmod")]);
    }

    #[test]
    fn version_1_0() {
        let s = load("v1.txt");
        assert_eq!(s.format(), Format::Versioned(Version::V1_0));
        assert!(!s.rounded);
        assert_eq!(s.tags.len(), 10);
        assert_eq!(
            bytes(&s),
            [0, 127664128, 56623104, 4136960, 2936012, 12582912, 33554432, 491520, -4096, 8192]
        );
        assert_eq!(calls(&s), [0, 31168, 13824, 1010, 22648, 6, 8, 120, 1, 2]);
        assert_eq!(s.total().bytes, 237993164);
        assert_eq!(s.total().calls, 68787);
        assert_eq!(s.pagetable().bytes, 56623104);
        assert!(s.tags.iter().all(|t| t.accurate && t.extra.is_empty()));
        assert_eq!(s.tags[3].key.module.as_deref(), Some("ctagmod"));
    }

    #[test]
    fn version_2_0() {
        let s = load("v2.txt");
        assert_eq!(s.format(), Format::Versioned(Version::V2_0));
        assert_eq!(s.tags.len(), 11);
        assert_eq!(s.total().bytes, 231899340);
        assert_eq!(s.total().calls, 68869);
        let inaccurate: Vec<&str> = s
            .tags
            .iter()
            .filter(|t| !t.accurate)
            .map(|t| t.key.function.as_str())
            .collect();
        assert_eq!(inaccurate, ["mce_device_create"]);
        let xas = s
            .tags
            .iter()
            .find(|t| t.key.function == "xas_alloc")
            .expect("present");
        assert_eq!(
            xas.extra,
            BTreeMap::from([("future".to_string(), "marker".to_string())])
        );
        let ext4 = s
            .tags
            .iter()
            .filter(|t| t.key.function == "ext4_alloc_inode")
            .count();
        assert_eq!(ext4, 2, "a repeated key is kept as two records");
    }

    #[test]
    fn sort_g_tail() {
        let s = load("sort-g-tail.txt");
        assert_eq!(s.format(), Format::Headerless);
        assert!(!s.rounded);
        assert_eq!(
            bytes(&s),
            [4136960, 12582912, 33554432, 56623104, 127664128]
        );
    }

    #[test]
    fn numfmt_iec() {
        let s = load("numfmt-iec.txt");
        assert_eq!(s.format(), Format::Headerless);
        assert!(s.rounded);
        assert_eq!(
            bytes(&s),
            [573440, 2936013, 14680064, 25165824, 60817408, 127926272]
        );
        assert_eq!(calls(&s), [140, 22648, 7, 6, 14848, 31168]);
    }

    #[test]
    fn numfmt_iec_i_on_both_columns_with_header() {
        let s = load("numfmt-iec-i-header.txt");
        assert_eq!(s.format(), Format::Versioned(Version::V2_0));
        assert_eq!(s.tags.len(), 11);
        assert_eq!(calls(&s)[..4], [0, 31744, 15360, 23552]);
        assert_eq!(bytes(&s)[..4], [0, 127926272, 60817408, 2936013]);
        assert!(!s.tags[7].accurate);
    }

    #[test]
    fn sort_h_with_headers_in_the_middle() {
        let s = load("sort-h.txt");
        assert_eq!(s.format(), Format::Versioned(Version::V1_0));
        assert_eq!(s.tags.len(), 10);
        assert_eq!(bytes(&s)[..3], [-4096, 0, 8192]);
    }

    /// Each derived fixture holds the same tags as the file it was made from, with sizes inside the
    /// rounding of its format.
    #[test]
    fn derived_fixtures_agree_with_their_source() {
        for (derived, source) in [
            ("sort-g-tail.txt", "v1.txt"),
            ("sort-h.txt", "v1.txt"),
            ("numfmt-iec.txt", "v2.txt"),
            ("numfmt-iec-i-header.txt", "v2.txt"),
        ] {
            let d = load(derived);
            let s = load(source);
            for tag in &d.tags {
                // A repeated key (v2.txt's ext4 tag) is matched to its nearest record.
                let original = s
                    .tags
                    .iter()
                    .filter(|t| t.key == tag.key && t.accurate == tag.accurate)
                    .min_by_key(|t| (i128::from(t.bytes) - i128::from(tag.bytes)).abs())
                    .unwrap_or_else(|| panic!("{derived}: {} not in {source}", tag.key));
                let tolerance = |v: i128| v.abs() / 10 + 1;
                let (a, b) = (i128::from(tag.bytes), i128::from(original.bytes));
                assert!(
                    (a - b).abs() <= tolerance(b),
                    "{derived}: {} {a} vs {b}",
                    tag.key
                );
                let (a, b) = (i128::from(tag.calls), i128::from(original.calls));
                assert!((a - b).abs() <= tolerance(b), "{derived}: {}", tag.key);
            }
        }
    }

    #[test]
    fn bad_lines_are_located() {
        let bytes = std::fs::read(fixture("bad.txt")).expect("fixture");
        let e = parse("bad.txt", &bytes, Mode::Strict).expect_err("strict fails");
        assert_eq!(
        e.to_string(),
        "bad.txt:4: bad size: expected a byte count such as 4096 or -4096, or a human size such as \
         2.8M, 4.0Mi or 27.2MiB: `12x34`"
    );
        let s = parse("bad.txt", &bytes, Mode::Lenient).expect("lenient");
        assert_eq!(s.tags.len(), 2);
        let skipped: Vec<(usize, ParseErrorKind, &str)> = s
            .skipped
            .iter()
            .map(|e| (e.line, e.kind, e.token.as_str()))
            .collect();
        assert_eq!(
            skipped,
            [
                (4, ParseErrorKind::BadSize, "12x34"),
                (5, ParseErrorKind::BadCalls, "mm/vmalloc.c:3160"),
                (
                    7,
                    ParseErrorKind::MissingField("func:NAME"),
                    "16384        4 kernel/fork.c:312"
                ),
            ]
        );
    }
}
