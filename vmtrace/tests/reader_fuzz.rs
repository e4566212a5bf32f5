//! Fuzzing of the trace reader and of observed-timing replay with proptest: arbitrary bytes and
//! mutated valid traces (truncated lines, flipped bytes, wrong types, huge numbers, deep
//! nesting, invalid UTF-8, missing header, wrong version, timestamps going backwards, unknown
//! kinds, blank and CRLF lines) must never panic, and every error must name a line of the input.
//!
//! Issue 3 asks that bad input gets a clear message with its line number or a counted warning
//! that `--strict` makes fatal. cargo-fuzz needs nightly; proptest runs in every `cargo test`,
//! shrinks what it finds to a small input, and is enough for a line-oriented JSON format.
//!
//! Besides "no panic", three properties can fail here:
//! - every reader or replay error's message starts with `line N:` where N is a line of the
//!   input (or one past the last, for an input that ends early);
//! - the reader returns, for every event line, exactly what the general serde path
//!   (`serde_json::from_str::<Record>`) makes of it: the reader's fast path for alloc, free and
//!   purge lines must not accept, refuse or read anything differently;
//! - a non-strict replay that counted warnings fails in strict mode at the line of the first
//!   warning, and a strict replay that succeeds means the non-strict one counted none.

use std::io::BufReader;

use proptest::prelude::*;
use proptest::sample::Index;
use vmtrace::model::Variant;
use vmtrace::replay::{free_run, replay, FreeRunOptions, ReplayError, ReplayOptions};
use vmtrace::synth::{generate, SynthParams};
use vmtrace::trace::{ReadError, Record, TraceReader};

/// A small but complete synthetic trace: header, snapshot, allocs, frees, purges, footer.
fn synth_trace() -> Vec<u8> {
    let p = SynthParams {
        mask: 0b1001, // fix_size and random_size
        threads: 2,
        cpus: 2,
        loops: 40,
        seed: 3,
        ..SynthParams::default()
    };
    let mut out = Vec::new();
    generate(&p, vec!["reader_fuzz".into()], &mut out).expect("synth writes to memory");
    out
}

/// The bundled real trace cut to its header, snapshot, the first `events` events and footer.
fn sample_trace(events: usize) -> Vec<u8> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/sample-trace.jsonl.zst");
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut vmtrace::trace::compress::open(std::path::Path::new(path))
            .expect("the bundled sample trace is readable"),
        &mut text,
    )
    .expect("the bundled sample trace decompresses");
    let lines: Vec<&str> = text.lines().collect();
    let mut kept: Vec<&str> = lines.iter().take(2 + events).copied().collect();
    if let Some(last) = lines.last() {
        kept.push(last);
    }
    (kept.join("\n") + "\n").into_bytes()
}

/// Number of lines a reader can report for `bytes`: a last line without a newline counts.
fn line_count(bytes: &[u8]) -> usize {
    let newlines = bytes.iter().filter(|&&b| b == b'\n').count();
    newlines + usize::from(!bytes.ends_with(b"\n"))
}

/// `line N:` at the start of an error message, as a number.
fn message_line(msg: &str) -> Option<usize> {
    msg.strip_prefix("line ")?.split(':').next()?.parse().ok()
}

/// Reads everything; checks the line numbers of errors and that the reader always advances.
fn check_reader(bytes: &[u8]) -> Result<(), TestCaseError> {
    let lines = line_count(bytes);
    let mut items = 0;
    for item in TraceReader::new(bytes) {
        items += 1;
        // One item per line at most, plus the end: a reader that stops advancing loops here.
        prop_assert!(items <= lines + 1, "more items than lines ({lines})");
        if let Err(e) = item {
            let msg = e.to_string();
            prop_assert!(
                e.line() >= 1 && e.line() <= lines.max(1),
                "{msg} (lines: {lines})"
            );
            prop_assert_eq!(message_line(&msg), Some(e.line()), "{}", msg);
        }
    }
    Ok(())
}

/// The reader's record for each line equals what the general serde path makes of that line
/// (once the header is accepted, the reader's only other rule is the line number).
fn check_fast_path(bytes: &[u8]) -> Result<(), TestCaseError> {
    let mut reader = TraceReader::new(bytes);
    if reader.read_header().is_err() {
        return Ok(());
    }
    let text_lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    while let Some(item) = reader.next() {
        let n = match &item {
            Ok(_) => reader.line(),
            Err(e) => e.line(),
        };
        let Some(raw) = text_lines.get(n - 1) else {
            prop_assert!(false, "line {n} is not in the input: {item:?}");
            break;
        };
        let general = serde_json::from_slice::<Record>(raw.trim_ascii());
        match (&item, &general) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "line {}", n),
            (Err(ReadError::Json { .. } | ReadError::Truncated { .. }), Err(_)) => {}
            // Not UTF-8: serde refuses the bytes too, unless the bad byte is in whitespace it
            // would not look at; either way the reader's refusal is the right one.
            (Err(ReadError::Io { .. }), _) => prop_assert!(std::str::from_utf8(raw).is_err()),
            _ => prop_assert!(false, "line {n}: reader {item:?}, serde {general:?}"),
        }
    }
    Ok(())
}

/// Replays non-strict and strict and checks the errors and the warning/strict relation.
fn check_replay(bytes: &[u8]) -> Result<(), TestCaseError> {
    let lines = line_count(bytes);
    let lax = replay(BufReader::new(bytes), &ReplayOptions::default());
    let strict_opts = ReplayOptions {
        strict: true,
        ..ReplayOptions::default()
    };
    let strict = replay(BufReader::new(bytes), &strict_opts);
    // Free-running what-if replays (and the contention simulation behind them) read the same
    // input: they may refuse it, but never panic (overflow checks are on in test builds).
    for variant in [Variant::Nodes, Variant::Global] {
        let opts = ReplayOptions {
            variant,
            ..ReplayOptions::default()
        };
        let _ = free_run(BufReader::new(bytes), &opts, &FreeRunOptions::default());
    }
    for r in [&lax, &strict] {
        if let Err(e) = r {
            let msg = e.to_string();
            let line = message_line(&msg);
            // One past the last line: the input ended where a record was expected.
            prop_assert!(
                line.is_some_and(|l| l >= 1 && l <= lines + 1),
                "{msg} (lines: {lines})"
            );
        }
    }
    match (&lax, &strict) {
        (Ok(report), Err(ReplayError::Strict { line, .. })) => {
            let first = report.first_warnings.first().map(String::as_str);
            prop_assert!(
                !report.warnings.is_empty(),
                "strict failed without warnings"
            );
            prop_assert_eq!(first.and_then(message_line), Some(*line));
        }
        (Ok(report), Ok(_)) => {
            prop_assert!(report.warnings.is_empty(), "{:?}", report.warnings);
        }
        (Ok(_), Err(e)) => prop_assert!(false, "only strict failed, not on a warning: {e}"),
        (Err(_), Ok(_)) => prop_assert!(false, "only the non-strict replay failed"),
        (Err(a), Err(b)) => {
            // The same read error, or strict stopped earlier on a warning.
            if !matches!(b, ReplayError::Strict { .. }) {
                prop_assert_eq!(a.to_string(), b.to_string());
            }
        }
    }
    Ok(())
}

fn check_all(bytes: &[u8]) -> Result<(), TestCaseError> {
    check_reader(bytes)?;
    check_fast_path(bytes)?;
    check_replay(bytes)
}

/// Values to put in place of a field's: plausible ones (which a wrong reading of a field
/// shows up on) and ones that do not belong where a number or an address is expected.
const ODD_VALUES: &[&str] = &[
    "1",
    "7",
    "4096",
    "\"0xffffc90000001000\"",
    "\"cc1\"",
    "18446744073709551616",
    "99999999999999999999999999999",
    "-1",
    "-9223372036854775809",
    "1e400",
    "1.5",
    "0",
    "null",
    "true",
    "\"\"",
    "\"0x\"",
    "\"0xffffffffffffffffff\"",
    "\"0xzz\"",
    "\"\\ud800\"",
    "{}",
    "[]",
];

const KINDS: &[&str] = &[
    "header",
    "vmallocinfo",
    "alloc",
    "free",
    "purge",
    "footer",
    "work",
    "pt_page",
    "meminfo",
    "bogus",
    "",
    "Alloc",
];

#[derive(Clone, Debug)]
enum Mutation {
    FlipByte(Index, Index, u8),
    Truncate(Index, Index),
    DropLine(Index),
    DuplicateLine(Index, Index),
    SwapLines(Index, Index),
    InsertBytes(Index, Index, Vec<u8>),
    /// Replace the value of the nth `"key":` of a line.
    ReplaceValue(Index, Index, &'static str),
    NestDeeply(Index, Index, usize),
    InvalidUtf8(Index, Index),
    SetTimestamp(Index, u64),
    SetKind(Index, &'static str),
    SetVersion(u32),
    /// Append a copy of the nth `"key":value` pair of a line at its end.
    DuplicateKey(Index, Index),
    /// Remove the nth `"key":value` pair of a line.
    DropKey(Index, Index),
    DropHeader,
    BlankLine(Index),
    Crlf,
    NoFinalNewline,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    use Mutation::*;
    prop_oneof![
        (any::<Index>(), any::<Index>(), 1u8..=255).prop_map(|(l, p, m)| FlipByte(l, p, m)),
        (any::<Index>(), any::<Index>()).prop_map(|(l, p)| Truncate(l, p)),
        any::<Index>().prop_map(DropLine),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| DuplicateLine(a, b)),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| SwapLines(a, b)),
        (
            any::<Index>(),
            any::<Index>(),
            prop::collection::vec(any::<u8>(), 1..8)
        )
            .prop_map(|(l, p, b)| InsertBytes(l, p, b)),
        (
            any::<Index>(),
            any::<Index>(),
            prop::sample::select(ODD_VALUES)
        )
            .prop_map(|(l, k, v)| ReplaceValue(l, k, v)),
        (any::<Index>(), any::<Index>(), 1usize..3000).prop_map(|(l, k, d)| NestDeeply(l, k, d)),
        (any::<Index>(), any::<Index>()).prop_map(|(l, p)| InvalidUtf8(l, p)),
        (
            any::<Index>(),
            prop_oneof![Just(0u64), 0u64..2_000_000_000, Just(u64::MAX)]
        )
            .prop_map(|(l, t)| SetTimestamp(l, t)),
        (any::<Index>(), prop::sample::select(KINDS)).prop_map(|(l, k)| SetKind(l, k)),
        prop_oneof![Just(0u32), Just(2), Just(u32::MAX)].prop_map(SetVersion),
        (any::<Index>(), any::<Index>()).prop_map(|(l, k)| DuplicateKey(l, k)),
        (any::<Index>(), any::<Index>()).prop_map(|(l, k)| DropKey(l, k)),
        Just(DropHeader),
        any::<Index>().prop_map(BlankLine),
        Just(Crlf),
        Just(NoFinalNewline),
    ]
}

/// Byte offsets just after each `"key":` of a line.
fn value_starts(line: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < line.len() {
        if line[i] == b'"' && line[i + 1] == b':' {
            out.push(i + 2);
        }
        i += 1;
    }
    out
}

/// End of the JSON value starting at `start` (a scalar, string or bracketed value), roughly:
/// good enough to cut a value out, and harmless when wrong (the result is just other bad input).
fn value_end(line: &[u8], start: usize) -> usize {
    let mut depth = 0i32;
    let mut in_str = false;
    let mut i = start;
    while i < line.len() {
        let c = line[i];
        if in_str {
            if c == b'\\' {
                i += 1;
            } else if c == b'"' {
                in_str = false;
                if depth == 0 {
                    return i + 1;
                }
            }
        } else {
            match c {
                b'"' => in_str = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth == 0 => return i,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                b',' if depth == 0 => return i,
                _ => {}
            }
        }
        i += 1;
    }
    line.len()
}

/// Byte range of the nth `"key":value` pair of a line, key quotes included.
fn pair(line: &[u8], key: &Index) -> Option<(usize, usize)> {
    let starts = value_starts(line);
    if starts.is_empty() {
        return None;
    }
    let v = starts[key.index(starts.len())];
    // The key's opening quote: the last quote before the closing one at v - 2.
    let s = line[..v - 2].iter().rposition(|&b| b == b'"')?;
    Some((s, value_end(line, v)))
}

fn replace_value(line: &mut Vec<u8>, key: &Index, value: &[u8]) {
    let starts = value_starts(line);
    if starts.is_empty() {
        return;
    }
    let s = starts[key.index(starts.len())];
    let e = value_end(line, s);
    line.splice(s..e, value.iter().copied());
}

fn replace_key(line: &mut Vec<u8>, key: &str, value: &[u8]) {
    let pat = format!("\"{key}\":");
    if let Some(pos) = line.windows(pat.len()).position(|w| w == pat.as_bytes()) {
        let s = pos + pat.len();
        let e = value_end(line, s);
        line.splice(s..e, value.iter().copied());
    }
}

fn apply(trace: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut lines: Vec<Vec<u8>> = trace.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
    if lines.last().is_some_and(Vec::is_empty) {
        lines.pop();
    }
    let mut crlf = false;
    let mut final_newline = true;
    for m in mutations {
        if lines.is_empty() {
            lines.push(Vec::new());
        }
        let n = lines.len();
        let pos = |line: &Vec<u8>, p: &Index| p.index(line.len() + 1);
        match m {
            Mutation::FlipByte(l, p, mask) => {
                let line = &mut lines[l.index(n)];
                if !line.is_empty() {
                    let i = p.index(line.len());
                    line[i] ^= mask;
                }
            }
            Mutation::Truncate(l, p) => {
                let i = l.index(n);
                let cut = pos(&lines[i], p);
                lines[i].truncate(cut);
                // A truncation is usually where the file ends.
                if p.index(2) == 0 {
                    lines.truncate(i + 1);
                    final_newline = false;
                }
            }
            Mutation::DropLine(l) => {
                lines.remove(l.index(n));
            }
            Mutation::DuplicateLine(a, b) => {
                let line = lines[a.index(n)].clone();
                lines.insert(b.index(n + 1), line);
            }
            Mutation::SwapLines(a, b) => lines.swap(a.index(n), b.index(n)),
            Mutation::InsertBytes(l, p, bytes) => {
                let line = &mut lines[l.index(n)];
                let at = pos(line, p);
                line.splice(at..at, bytes.iter().copied());
            }
            Mutation::ReplaceValue(l, k, v) => {
                replace_value(&mut lines[l.index(n)], k, v.as_bytes())
            }
            Mutation::NestDeeply(l, k, depth) => {
                let nested = "[".repeat(*depth) + &"]".repeat(*depth);
                replace_value(&mut lines[l.index(n)], k, nested.as_bytes());
            }
            Mutation::InvalidUtf8(l, p) => {
                let line = &mut lines[l.index(n)];
                let at = pos(line, p);
                line.splice(at..at, [0xc3, 0x28, 0xff]);
            }
            Mutation::SetTimestamp(l, ts) => {
                replace_key(&mut lines[l.index(n)], "ts_ns", ts.to_string().as_bytes());
            }
            Mutation::SetKind(l, kind) => {
                replace_key(
                    &mut lines[l.index(n)],
                    "type",
                    format!("\"{kind}\"").as_bytes(),
                );
            }
            Mutation::SetVersion(v) => {
                replace_key(&mut lines[0], "version", v.to_string().as_bytes())
            }
            Mutation::DuplicateKey(l, k) => {
                let line = &mut lines[l.index(n)];
                if let Some((s, e)) = pair(line, k) {
                    let copy: Vec<u8> = line[s..e].to_vec();
                    if line.ends_with(b"}") {
                        line.pop();
                        line.push(b',');
                        line.extend_from_slice(&copy);
                        line.push(b'}');
                    }
                }
            }
            Mutation::DropKey(l, k) => {
                let line = &mut lines[l.index(n)];
                if let Some((s, e)) = pair(line, k) {
                    // Take the comma after the pair, or the one before it for the last pair.
                    let (s, e) = if line.get(e) == Some(&b',') {
                        (s, e + 1)
                    } else if s > 0 && line[s - 1] == b',' {
                        (s - 1, e)
                    } else {
                        (s, e)
                    };
                    line.drain(s..e);
                }
            }
            Mutation::DropHeader => {
                lines.remove(0);
            }
            Mutation::BlankLine(l) => lines.insert(l.index(n + 1), Vec::new()),
            Mutation::Crlf => crlf = true,
            Mutation::NoFinalNewline => final_newline = false,
        }
    }
    let sep: &[u8] = if crlf { b"\r\n" } else { b"\n" };
    let mut out = lines.join(sep);
    if final_newline && !out.is_empty() {
        out.extend_from_slice(sep);
    }
    out
}

proptest! {
    /// Arbitrary bytes, and arbitrary bytes after a valid header.
    #[test]
    fn arbitrary_bytes(junk in prop::collection::vec(any::<u8>(), 0..600), after_header: bool) {
        let mut bytes = Vec::new();
        if after_header {
            let trace = synth_trace();
            let end = trace.iter().position(|&b| b == b'\n').map_or(trace.len(), |i| i + 1);
            bytes.extend_from_slice(&trace[..end]);
        }
        bytes.extend_from_slice(&junk);
        check_all(&bytes)?;
    }

    /// JSON-ish lines assembled from trace fragments: more of them get past the JSON syntax
    /// than random bytes do, so the field checks are exercised too.
    #[test]
    fn fragment_soup(parts in prop::collection::vec(prop::sample::select(&[
        "{", "}", "[", "]", ",", ":", "\n", "\"type\"", "\"alloc\"", "\"free\"", "\"purge\"",
        "\"ts_ns\"", "\"addr\"", "\"0xffffc90000000000\"", "1", "-2", "null", "\"comm\"",
        "\"va_start\"", "\"nr_lazy\"", "\"npurged\"", "\"header\"", "\"version\"",
    ][..]), 0..80)) {
        let trace = synth_trace();
        let end = trace.iter().position(|&b| b == b'\n').map_or(trace.len(), |i| i + 1);
        let mut bytes = trace[..end].to_vec();
        bytes.extend(parts.concat().into_bytes());
        check_all(&bytes)?;
    }

    /// A valid synthetic trace with one to four mutations.
    #[test]
    fn mutated_synth_trace(muts in prop::collection::vec(mutation(), 1..5)) {
        let bytes = apply(&synth_trace(), &muts);
        check_all(&bytes)?;
    }

    /// The bundled real trace (header, snapshot, 120 events, footer) with one to four mutations.
    #[test]
    fn mutated_sample_trace(muts in prop::collection::vec(mutation(), 1..5)) {
        let bytes = apply(&sample_trace(120), &muts);
        check_all(&bytes)?;
    }
}

/// Mutations that stay within one line.
fn line_mutation() -> impl Strategy<Value = Mutation> {
    mutation().prop_filter("a mutation of one line", |m| {
        !matches!(
            m,
            Mutation::DropLine(_)
                | Mutation::DuplicateLine(..)
                | Mutation::SwapLines(..)
                | Mutation::SetVersion(_)
                | Mutation::DropHeader
                | Mutation::BlankLine(_)
                | Mutation::Crlf
        )
    })
}

/// Event lines of both base traces (alloc, free and purge: the reader's fast path).
fn event_lines() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for trace in [synth_trace(), sample_trace(400)] {
        for line in trace.split(|&b| b == b'\n') {
            let kinds: [&[u8]; 3] = [
                b"{\"type\":\"alloc\"",
                b"{\"type\":\"free\"",
                b"{\"type\":\"purge\"",
            ];
            if kinds.iter().any(|k| line.starts_with(k)) {
                out.push(line.to_vec());
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// One event line, mutated a few times, after a valid header: the reader's record equals
    /// serde's for it. Many cases, because each one is a single line.
    #[test]
    fn fast_path_agrees_with_serde(
        line in prop::sample::select(event_lines()),
        muts in prop::collection::vec(line_mutation(), 1..4),
    ) {
        let trace = synth_trace();
        let end = trace.iter().position(|&b| b == b'\n').map_or(trace.len(), |i| i + 1);
        let mut bytes = trace[..end].to_vec();
        bytes.extend(apply(&line, &muts));
        check_reader(&bytes)?;
        check_fast_path(&bytes)?;
    }
}

/// The mutations have to reach the checks: unmutated traces replay cleanly, and a few targeted
/// mutations produce exactly the error or warning the issue names.
#[test]
fn unmutated_traces_replay_without_warnings() {
    for trace in [synth_trace(), sample_trace(120)] {
        check_all(&trace).unwrap();
        let report = replay(BufReader::new(&trace[..]), &ReplayOptions::default()).unwrap();
        assert!(report.events.alloc > 0 && report.events.free > 0);
    }
    let report = replay(
        BufReader::new(&synth_trace()[..]),
        &ReplayOptions::default(),
    )
    .unwrap();
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
}

fn strict_error(bytes: &[u8]) -> (ReplayError, vmtrace::replay::Report) {
    let lax = replay(BufReader::new(bytes), &ReplayOptions::default()).expect("non-strict replay");
    let strict = ReplayOptions {
        strict: true,
        ..ReplayOptions::default()
    };
    let err = replay(BufReader::new(bytes), &strict).expect_err("strict replay must fail");
    (err, lax)
}

#[test]
fn backwards_timestamp_is_a_counted_warning_and_fatal_when_strict() {
    let trace = synth_trace();
    // Line 40 is an event well after the snapshot: give it a time just before line 39's.
    let mut lines: Vec<Vec<u8>> = trace.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
    let ts_of = |l: &[u8]| -> u64 {
        let v: serde_json::Value = serde_json::from_slice(l).unwrap();
        v["ts_ns"].as_u64().unwrap()
    };
    let earlier = ts_of(&lines[38]) - 1;
    assert!(
        earlier > ts_of(&lines[2]),
        "line 39 must come after the first event"
    );
    replace_key(&mut lines[39], "ts_ns", earlier.to_string().as_bytes());
    let bytes = lines.join(&b'\n');
    let (err, lax) = strict_error(&bytes);
    assert_eq!(lax.warnings.get("timestamp-backwards"), Some(&1));
    match err {
        ReplayError::Strict { line, ref message } => {
            assert_eq!(line, 40);
            assert!(message.contains("earlier than the previous"), "{message}");
        }
        other => panic!("expected a strict error, got {other}"),
    }
    assert!(err.to_string().starts_with("line 40: "));
}

#[test]
fn free_of_an_unknown_address_is_a_counted_warning_and_fatal_when_strict() {
    let trace = synth_trace();
    let text = String::from_utf8(trace).unwrap();
    let (n, line) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.starts_with(r#"{"type":"free""#))
        .expect("the synth trace has frees");
    let mut bad = line.to_string();
    replace_key_str(&mut bad, "va_start", "\"0xffffc9ffff000000\"");
    let bytes: Vec<u8> = text
        .lines()
        .enumerate()
        .map(|(i, l)| if i == n { bad.as_str() } else { l })
        .collect::<Vec<_>>()
        .join("\n")
        .into_bytes();
    let (err, lax) = strict_error(&bytes);
    assert!(
        lax.warnings.contains_key("free-unknown-address"),
        "{:?}",
        lax.warnings
    );
    assert!(
        err.to_string().starts_with(&format!("line {}: ", n + 1)),
        "{err}"
    );
}

fn replace_key_str(line: &mut String, key: &str, value: &str) {
    let mut bytes = std::mem::take(line).into_bytes();
    replace_key(&mut bytes, key, value.as_bytes());
    *line = String::from_utf8(bytes).unwrap();
}

#[test]
fn unknown_kind_deep_nesting_and_invalid_utf8_name_their_line() {
    let trace = synth_trace();
    let mut lines: Vec<Vec<u8>> = trace.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
    lines.pop();
    let cases: Vec<(usize, Vec<u8>, &str)> = vec![
        (
            5,
            br#"{"type":"mystery","ts_ns":1}"#.to_vec(),
            "unknown variant",
        ),
        (
            6,
            format!(
                r#"{{"type":"alloc","ts_ns":{}{}}}"#,
                "[".repeat(100_000),
                "]".repeat(100_000)
            )
            .into_bytes(),
            "recursion limit",
        ),
        (
            7,
            b"{\"type\":\"free\",\"comm\":\"\xff\"}".to_vec(),
            "UTF-8",
        ),
        (8, br#"{"type":"alloc","ts_ns":1e999}"#.to_vec(), ""),
    ];
    for (at, replacement, what) in cases {
        let mut l = lines.clone();
        l[at - 1] = replacement;
        let bytes = l.join(&b'\n');
        let err = replay(BufReader::new(&bytes[..]), &ReplayOptions::default())
            .expect_err("a malformed line is an error");
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("line {at}: ")), "{msg}");
        assert!(msg.contains(what), "{msg}");
    }
}
