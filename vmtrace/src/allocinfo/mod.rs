//! /proc/allocinfo (memory allocation profiling): parse every format the kernel has printed,
//! show, diff and watch.
//!
//! allocinfo is the only kernel interface that shows page-table pages (`func:pagetable_alloc`)
//! and vmalloc call sites by size, so vmtrace reads it beside its own events. To parse a capture:
//!
//! ```
//! use vmtrace::allocinfo::{parse, Mode};
//! let text = "allocinfo - version: 1.0\n#     <size>  <calls> <tag info>\n\
//!             4096 1 include/linux/mm.h:2990 func:pagetable_alloc \n";
//! let snapshot = parse("example", text.as_bytes(), Mode::Strict).unwrap();
//! assert_eq!(snapshot.pagetable().bytes, 4096);
//! ```

pub mod cli;
pub mod diff;
pub mod error;
pub mod marks;
pub mod model;
pub mod parse;
pub mod query;
pub mod render;
pub mod show;
pub mod size;
pub mod snapshot;
pub mod watch;
pub mod write;

pub use error::{AllocinfoError, ParseError, ParseErrorKind, Unavailable};
pub use model::{Counts, Format, Snapshot, Tag, TagKey, Version};
pub use parse::{parse, parse_str, Mode};
