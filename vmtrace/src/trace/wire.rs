//! Types the trace format embeds that other modules also produce: the header's system facts
//! and tracepoint fields (made by `host`), and allocinfo samples (made by `allocinfo`). They
//! live here so that the trace format depends on nothing else in the crate; the modules that
//! fill them add their own `impl` blocks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Kernel and CPU facts that go into the trace header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemFacts {
    pub kernel_release: String,
    pub kernel_version: String,
    pub machine: String,
    pub hostname: String,
    pub page_size: u64,
    pub possible_cpus: u32,
    pub possible_cpu_list: String,
    pub online_cpus: u32,
    pub online_cpu_list: String,
    pub btf: bool,
}

/// One `field:` line of a format file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Field {
    pub name: String,
    /// The C declaration as the kernel prints it, e.g. `unsigned long addr`.
    pub decl: String,
    pub offset: u16,
    pub size: u8,
    pub signed: bool,
}

/// The identity of an allocation tag.
///
/// file:line alone is not enough: macros and inlined helpers put several tags on one line, and a
/// module's tags share file names with built-in code, so all four fields are the key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TagKey {
    pub file: String,
    pub line: u32,
    /// The loadable module (`[mod]` since v6) or, in pre-merge captures, the KBUILD_MODNAME that
    /// every line carried (`module:NAME`, even for built-in code). `None` means built-in.
    pub module: Option<String>,
    pub function: String,
}

/// One line of /proc/allocinfo. (De)serializable so traces can carry allocinfo samples.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tag {
    #[serde(flatten)]
    pub key: TagKey,
    /// Signed because the kernel prints it with `%lli`: a free charged to another tag can drive
    /// one below zero.
    pub bytes: i64,
    pub calls: u64,
    /// False for `accurate:no` (v2.0): the absolute values are too low because some allocations
    /// could not be tracked, but deltas between two snapshots are still exact.
    pub accurate: bool,
    /// Other `key:value` pairs of v2.0+ lines, kept so that a newer kernel's markers are not lost.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, String>,
}

/// Bytes and calls, summed with saturation: parsed input can hold any i64, and an overflowing
/// total must not abort a report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub bytes: i64,
    pub calls: u64,
}
