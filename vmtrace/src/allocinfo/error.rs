//! Errors of the allocinfo library. Callers match on these; only `cli.rs` turns them into text.

use std::fmt;
use std::path::PathBuf;

/// Longest token kept in an error: a fuzzed or binary line can be megabytes long, and the message
/// only has to let the user find the spot.
const MAX_TOKEN_CHARS: usize = 80;

/// One line that could not be read as an allocinfo record or header.
///
/// It always names the input, a 1-based line number and the offending token, so that a user can
/// open the file at that line; in `--lenient` mode these are collected instead of returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}:{line}: {kind}: `{token}`")]
pub struct ParseError {
    /// The input's name as the user gave it (a path, or `-` for stdin).
    pub source_name: String,
    /// 1-based line number.
    pub line: usize,
    /// The offending token, cut to a readable length.
    pub token: String,
    pub kind: ParseErrorKind,
}

impl ParseError {
    pub(crate) fn new(source_name: &str, line: usize, kind: ParseErrorKind, token: &str) -> Self {
        ParseError {
            source_name: source_name.to_string(),
            line,
            token: shorten(token),
            kind,
        }
    }
}

/// What was wrong with a line; the message says what would have been accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// The first column is not a byte count.
    BadSize,
    /// The second column is not a call count.
    BadCalls,
    /// The third column is not `file:line`.
    BadLocation,
    /// A column that every record has is absent.
    MissingField(&'static str),
    /// `func:`, `module:` or `[module]` appears twice, or a `key:value` key repeats.
    DuplicateField,
    /// A token after `file:line` that is none of `[module]`, `module:NAME`, `func:NAME`, `key:value`.
    UnknownToken,
    /// `allocinfo - version: X` where X is not `MAJOR.MINOR`.
    BadVersion,
    /// A second header with a different version: two files were probably concatenated.
    ConflictingVersion,
    /// The line is not UTF-8; /proc/allocinfo is always ASCII.
    NotUtf8,
}

impl fmt::Display for ParseErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseErrorKind::BadSize => f.write_str(
                "bad size: expected a byte count such as 4096 or -4096, or a human size such as \
                 2.8M, 4.0Mi or 27.2MiB",
            ),
            ParseErrorKind::BadCalls => f.write_str(
                "bad call count: expected a non-negative integer such as 6970 (or a numfmt size such as 9.6M)",
            ),
            ParseErrorKind::BadLocation => {
                f.write_str("bad location: expected FILE:LINE such as mm/memory.c:1122")
            }
            ParseErrorKind::MissingField(what) => write!(f, "missing {what} in line"),
            ParseErrorKind::DuplicateField => f.write_str("field given twice"),
            ParseErrorKind::UnknownToken => f.write_str(
                "unexpected token: after FILE:LINE expected [module], module:NAME, func:NAME or key:value",
            ),
            ParseErrorKind::BadVersion => {
                f.write_str("bad header: expected `allocinfo - version: MAJOR.MINOR`")
            }
            ParseErrorKind::ConflictingVersion => f.write_str(
                "second header with a different version (were two files concatenated?)",
            ),
            ParseErrorKind::NotUtf8 => f.write_str("line is not UTF-8 text"),
        }
    }
}

/// Why the live /proc/allocinfo cannot be read. Each variant carries what was checked, so the
/// message can tell the user which of the possible causes applies and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// The kernel configuration says `CONFIG_MEM_ALLOC_PROFILING` is not set (`detail` quotes
    /// what it says).
    NotBuilt {
        path: PathBuf,
        config_source: String,
        detail: String,
    },
    /// The kernel has the feature but the file is missing: profiling was turned off at boot
    /// (`sysctl.vm.mem_profiling=never`) or its setup failed.
    DisabledAtBoot {
        path: PathBuf,
        config_source: String,
    },
    /// The file is missing and the kernel configuration could not be read to say why.
    Missing { path: PathBuf },
    /// The file exists but the caller may not read it (it is mode 0400, root only).
    PermissionDenied { path: PathBuf },
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NotBuilt {
                path,
                config_source,
                detail,
            } => write!(
                f,
                "{} does not exist: this kernel was built without CONFIG_MEM_ALLOC_PROFILING \
                 ({config_source} has {detail}). Memory allocation \
                 profiling needs a kernel built with CONFIG_MEM_ALLOC_PROFILING=y; `vmtrace allocinfo \
                 show` and `diff` still work on files saved elsewhere",
                path.display()
            ),
            Unavailable::DisabledAtBoot {
                path,
                config_source,
            } => write!(
                f,
                "{} does not exist although the kernel has CONFIG_MEM_ALLOC_PROFILING=y \
                 ({config_source}): profiling was disabled at boot with `sysctl.vm.mem_profiling=never`, \
                 or setting it up failed (look for alloc_tag messages in `dmesg`). Boot without \
                 `never` (e.g. `sysctl.vm.mem_profiling=1`) to get the file",
                path.display()
            ),
            Unavailable::Missing { path } => write!(
                f,
                "{} does not exist, and the kernel configuration (/proc/config.gz, \
                 /boot/config-$(uname -r)) could not be read to tell why. Either the kernel was built \
                 without CONFIG_MEM_ALLOC_PROFILING, or profiling was disabled at boot with \
                 `sysctl.vm.mem_profiling=never`, or its setup failed",
                path.display()
            ),
            Unavailable::PermissionDenied { path } => write!(
                f,
                "permission denied reading {}: the file is mode 0400 (root only); run vmtrace as root",
                path.display()
            ),
        }
    }
}

/// Everything the allocinfo library can fail with.
#[derive(Debug, thiserror::Error)]
pub enum AllocinfoError {
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error("{0}")]
    Unavailable(Unavailable),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Cuts a token on a character boundary so errors stay one readable line.
fn shorten(token: &str) -> String {
    let mut out: String = token.chars().take(MAX_TOKEN_CHARS).collect();
    if out.len() < token.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_file_line_and_token() {
        let e = ParseError::new("a.txt", 7, ParseErrorKind::BadSize, "12x");
        let msg = e.to_string();
        assert!(msg.starts_with("a.txt:7: bad size: "), "{msg}");
        assert!(msg.ends_with("`12x`"), "{msg}");
    }

    #[test]
    fn long_tokens_are_cut_on_char_boundaries() {
        let token = "é".repeat(200);
        let e = ParseError::new("x", 1, ParseErrorKind::UnknownToken, &token);
        assert_eq!(e.token.chars().count(), MAX_TOKEN_CHARS + 1);
        assert!(e.token.ends_with('…'));
    }
}
