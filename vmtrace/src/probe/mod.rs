//! Loading and attaching the probes, and turning ring-buffer records into trace events.
//!
//! The only rung on the vmalloc tracepoints is the tracepoint itself: the kernel exposes exactly
//! the fields we want, with a stable name, at the point the allocator decides. Richer rungs
//! (fentry, kprobe) belong to the probes that have no tracepoint (issue 4). Every tracepoint
//! attaches as a raw tracepoint where kernel BTF describes its arguments, and as a perf
//! tracepoint otherwise ([`raw`]).

pub mod contention;
pub mod decode;
pub mod ladder;
pub mod loader;
pub mod raw;
pub mod selection;
pub mod table;

pub use decode::decode;
pub use loader::{LoadedProbes, ProbeError, TracepointSpec, TRACEPOINTS};
