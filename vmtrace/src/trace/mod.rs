//! The vmtrace trace format: JSON Lines with a header, a start snapshot, events and a footer.
//!
//! `docs/trace-format.md` documents every field and `docs/trace.schema.json` is the JSON Schema
//! the tests validate traces against. Bump [`VERSION`] on any incompatible change.

pub mod addr;
pub mod compress;
pub mod reader;
pub mod schema;
pub mod wire;
pub mod writer;

pub use addr::KAddr;
pub use reader::{ReadError, TraceReader};
pub use schema::*;
pub use writer::TraceWriter;

/// Value of the header's `format` field.
pub const FORMAT: &str = "vmtrace-trace";
/// Format version written; readers refuse versions they do not know. Version 2 added the
/// `work_start` record, which a version-1 reader cannot parse.
pub const VERSION: u32 = 2;
/// The oldest version this reader still reads: a version-1 trace is a version-2 trace without
/// `work_start` records.
pub const OLDEST_VERSION: u32 = 1;
