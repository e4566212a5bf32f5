//! vmtrace: observe and explain the Linux kernel's vmalloc allocator.
//!
//! The binary is a thin shell over this library; see `docs/architecture.md` for the data flow.

pub mod allocinfo;
pub mod cli;
pub mod compare;
pub mod export;
pub mod host;
pub mod import;
pub mod live;
pub mod model;
pub mod probe;
pub mod record;
pub mod replay;
pub mod sim;
pub mod summary;
pub mod synth;
pub mod trace;
pub mod tui;
pub mod value_parsers;
pub mod whatif;
pub mod workload;
