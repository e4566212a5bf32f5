//! Streaming trace reader with line numbers in every error.

use std::io::BufRead;

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::{Alloc, Ctx, Free, Header, KAddr, Purge, Record, FORMAT, OLDEST_VERSION, VERSION};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("line {line}: cannot read: {source}")]
    Io {
        line: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line}: not a valid trace record: {source}")]
    Json {
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("line {line}: the first record must be a header, found `{found}`")]
    NoHeader { line: usize, found: String },
    /// `line` is the header's: 1, unless blank lines come first.
    #[error("line {line}: format `{found}` is not a vmtrace trace (expected `{FORMAT}`)")]
    WrongFormat { line: usize, found: String },
    #[error("line {line}: trace format version {found} is not supported (this vmtrace reads versions {OLDEST_VERSION} to {VERSION})")]
    UnsupportedVersion { line: usize, found: u32 },
    #[error("line {line}: the last line is incomplete (the recording was cut short)")]
    Truncated { line: usize },
}

impl ReadError {
    pub fn line(&self) -> usize {
        match self {
            ReadError::Io { line, .. }
            | ReadError::Json { line, .. }
            | ReadError::NoHeader { line, .. }
            | ReadError::Truncated { line }
            | ReadError::WrongFormat { line, .. }
            | ReadError::UnsupportedVersion { line, .. } => *line,
        }
    }
}

/// Iterates over the records of a trace, checking the header first.
///
/// A last line without a newline that does not parse is reported as [`ReadError::Truncated`], so
/// callers can tell a trace cut by SIGKILL from a corrupt one.
pub struct TraceReader<R: BufRead> {
    input: R,
    line: usize,
    /// The current line's bytes, reused from line to line. Bytes rather than a `String`, so
    /// that a line that is not UTF-8 is an error of that line and is still counted: with
    /// `read_line` it was consumed uncounted, and every later line number was one short.
    buf: Vec<u8>,
    header_seen: bool,
}

impl<R: BufRead> TraceReader<R> {
    pub fn new(input: R) -> Self {
        Self {
            input,
            line: 0,
            buf: Vec::new(),
            header_seen: false,
        }
    }

    /// Line number of the record most recently returned.
    pub fn line(&self) -> usize {
        self.line
    }

    /// Reads the header; call before iterating (iteration also checks it).
    pub fn read_header(&mut self) -> Result<Header, ReadError> {
        match self.next_record() {
            Some(Ok(Record::Header(h))) => Ok(*h),
            Some(Ok(other)) => Err(ReadError::NoHeader {
                line: self.line,
                found: kind_name(&other).into(),
            }),
            Some(Err(e)) => Err(e),
            None => Err(ReadError::NoHeader {
                line: self.line.max(1),
                found: "end of file".into(),
            }),
        }
    }

    fn next_record(&mut self) -> Option<Result<Record, ReadError>> {
        loop {
            self.buf.clear();
            let n = match self.input.read_until(b'\n', &mut self.buf) {
                Ok(n) => n,
                Err(source) => {
                    return Some(Err(ReadError::Io {
                        line: self.line + 1,
                        source,
                    }))
                }
            };
            if n == 0 {
                return None;
            }
            self.line += 1;
            let complete = self.buf.ends_with(b"\n");
            let text = match std::str::from_utf8(&self.buf) {
                Ok(text) => text.trim(),
                // A recording cut short can end inside a multi-byte character.
                Err(_) if !complete => return Some(Err(ReadError::Truncated { line: self.line })),
                Err(e) => {
                    return Some(Err(ReadError::Io {
                        line: self.line,
                        source: std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("not valid UTF-8 at byte {}", e.valid_up_to() + 1),
                        ),
                    }))
                }
            };
            if text.is_empty() {
                continue;
            }
            if !self.header_seen {
                // Check format and version before the full parse, so a future header with other
                // fields is refused for its version, not as malformed JSON.
                if let Some(e) = check_identity(text, self.line) {
                    return Some(Err(e));
                }
            }
            let parsed = match parse_hot(text) {
                Some(r) => Ok(r),
                None => serde_json::from_str::<Record>(text),
            };
            let record = match parsed {
                Ok(r) => r,
                Err(_) if !complete => return Some(Err(ReadError::Truncated { line: self.line })),
                Err(source) => {
                    return Some(Err(ReadError::Json {
                        line: self.line,
                        source,
                    }))
                }
            };
            if !self.header_seen {
                match &record {
                    Record::Header(h) => {
                        if h.format != FORMAT {
                            return Some(Err(ReadError::WrongFormat {
                                line: self.line,
                                found: h.format.clone(),
                            }));
                        }
                        if !(OLDEST_VERSION..=VERSION).contains(&h.version) {
                            return Some(Err(ReadError::UnsupportedVersion {
                                line: self.line,
                                found: h.version,
                            }));
                        }
                        self.header_seen = true;
                    }
                    other => {
                        return Some(Err(ReadError::NoHeader {
                            line: self.line,
                            found: kind_name(other).into(),
                        }))
                    }
                }
            }
            return Some(Ok(record));
        }
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<Record, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record()
    }
}

/// The three event kinds that make up nearly every line of a trace, parsed without serde's
/// internally-tagged machinery.
///
/// `Record` is tagged by its `type` field and the events flatten their `Ctx`; serde can only
/// handle both by first buffering the whole object into an intermediate tree of owned keys and
/// values, which made parsing four times slower than the replay behind it. The writer always
/// puts `"type"` first, so a line starting with `{"type":"alloc"` (or `free`, `purge`) is
/// parsed straight into a flat mirror of the record. Anything else, and any line the mirror
/// refuses, takes the general path, so the general path alone decides what is an error and how
/// it reads: the fast path only ever returns what `serde_json::from_str::<Record>` would.
fn parse_hot(text: &str) -> Option<Record> {
    let rest = text.strip_prefix(r#"{"type":""#)?;
    let kind = &rest[..rest.find('"')?];
    match kind {
        "alloc" => serde_json::from_str::<HotAlloc>(text).ok().map(|mut a| {
            Record::Alloc(Alloc {
                ctx: a.ctx(),
                addr: a.addr,
                size: a.size,
                align: a.align,
                vstart: a.vstart,
                vend: a.vend,
                failed: a.failed,
            })
        }),
        "free" => serde_json::from_str::<HotFree>(text).ok().map(|mut f| {
            Record::Free(Free {
                ctx: f.ctx(),
                va_start: f.va_start,
                nr_lazy: f.nr_lazy,
                nr_lazy_max: f.nr_lazy_max,
            })
        }),
        "purge" => serde_json::from_str::<HotPurge>(text).ok().map(|mut p| {
            Record::Purge(Purge {
                ctx: p.ctx(),
                start: p.start,
                end: p.end,
                npurged: p.npurged,
            })
        }),
        _ => None,
    }
}

/// Declares a flat mirror of an event record: the `type` tag (declared so that a second one is
/// a duplicate-field error, which sends the line to the general path), the `Ctx` fields, and
/// the record's own fields. A record of a later format version with more fields is therefore
/// read correctly, only more slowly.
macro_rules! hot_record {
    ($name:ident { $($field:ident: $ty:ty),* $(,)? }) => {
        // Unknown fields go to the general path: it refuses some values that `IgnoredAny`
        // would skip (a float out of range, say), and the fast path must not accept more.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct $name {
            #[serde(rename = "type")]
            _kind: IgnoredAny,
            ts_ns: u64,
            cpu: u32,
            tgid: u32,
            pid: u32,
            comm: compact_str::CompactString,
            $($field: $ty),*
        }

        impl $name {
            fn ctx(&mut self) -> Ctx {
                Ctx {
                    ts_ns: self.ts_ns,
                    cpu: self.cpu,
                    tgid: self.tgid,
                    pid: self.pid,
                    comm: std::mem::take(&mut self.comm),
                }
            }
        }
    };
}

hot_record!(HotAlloc {
    addr: KAddr,
    size: u64,
    align: u64,
    vstart: KAddr,
    vend: KAddr,
    failed: i32,
});
hot_record!(HotFree {
    va_start: KAddr,
    nr_lazy: u64,
    nr_lazy_max: u64,
});
hot_record!(HotPurge {
    start: KAddr,
    end: KAddr,
    npurged: u32,
});

/// `Some(error)` when the first line is a header of another format or version.
fn check_identity(text: &str, line: usize) -> Option<ReadError> {
    #[derive(serde::Deserialize)]
    struct Identity {
        #[serde(rename = "type")]
        kind: Option<String>,
        format: Option<String>,
        version: Option<u32>,
    }
    let id: Identity = serde_json::from_str(text).ok()?;
    if id.kind.as_deref() != Some("header") {
        return None;
    }
    match (id.format, id.version) {
        (Some(f), _) if f != FORMAT => Some(ReadError::WrongFormat { line, found: f }),
        (_, Some(v)) if !(OLDEST_VERSION..=VERSION).contains(&v) => {
            Some(ReadError::UnsupportedVersion { line, found: v })
        }
        _ => None,
    }
}

pub fn kind_name(r: &Record) -> &'static str {
    match r {
        Record::Header(_) => "header",
        Record::Vmallocinfo(_) => "vmallocinfo",
        Record::Alloc(_) => "alloc",
        Record::Free(_) => "free",
        Record::Purge(_) => "purge",
        Record::Contention(_) => "contention",
        Record::Work(_) => "work",
        Record::WorkStart(_) => "work_start",
        Record::PtPage(_) => "pt_page",
        Record::Latency(_) => "latency",
        Record::Meminfo(_) => "meminfo",
        Record::Allocinfo(_) => "allocinfo",
        Record::Footer(_) => "footer",
    }
}
