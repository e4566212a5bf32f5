//! Filtering, grouping and sorting, shared by `show`, `diff` and `watch` so that the same flags
//! mean the same thing everywhere.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use regex::Regex;
use serde::Serialize;

use super::marks::{Marker, Marks};
use super::model::{Counts, Snapshot, TagKey};

/// Name of the group of built-in code under `--group-by module`; parentheses cannot occur in a
/// module name, so it cannot collide with one.
pub const BUILTIN_GROUP: &str = "(built-in)";

/// How tags are folded together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    /// By function name: all call sites in one function.
    Func,
    /// By source file.
    File,
    /// By module; built-in code is `(built-in)`.
    Module,
    /// By the source file's directory (`mm`, `fs/ext4`, `include/linux`).
    Dir,
}

impl GroupBy {
    pub fn group_of(self, key: &TagKey) -> String {
        match self {
            GroupBy::Func => key.function.clone(),
            GroupBy::File => key.file.clone(),
            GroupBy::Module => key
                .module
                .clone()
                .unwrap_or_else(|| BUILTIN_GROUP.to_string()),
            GroupBy::Dir => key
                .file
                .rsplit_once('/')
                .map_or(".", |(dir, _)| dir)
                .to_string(),
        }
    }
}

/// What a row of a report stands for: one tag, or one group of tags.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EntryKey {
    Tag(TagKey),
    Group(String),
}

impl fmt::Display for EntryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryKey::Tag(key) => key.fmt(f),
            EntryKey::Group(name) => f.write_str(name),
        }
    }
}

/// One row: the tags under a key, summed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: EntryKey,
    pub counts: Counts,
    /// How many tag lines were summed (more than one for a repeated key or a group).
    pub tags: usize,
    /// How many of them were `accurate:no`.
    pub inaccurate: usize,
    pub marks: Marks,
    /// The v2.0 `key:value` pairs of the tags, merged.
    pub extra: BTreeMap<String, String>,
}

impl Entry {
    fn new(key: EntryKey) -> Entry {
        Entry {
            key,
            counts: Counts::default(),
            tags: 0,
            inaccurate: 0,
            marks: Marks::default(),
            extra: BTreeMap::new(),
        }
    }

    pub fn accurate(&self) -> bool {
        self.inaccurate == 0
    }
}

/// Which tags to keep and how to fold them.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Keep a tag when this matches its file, function or module.
    pub filter: Option<Regex>,
    pub group_by: Option<GroupBy>,
    pub marker: Marker,
}

impl Selection {
    pub fn keeps(&self, key: &TagKey) -> bool {
        self.filter.as_ref().is_none_or(|re| {
            re.is_match(&key.file)
                || re.is_match(&key.function)
                || key.module.as_deref().is_some_and(|m| re.is_match(m))
        })
    }

    /// The snapshot's tags after filtering, one entry per key, in first-seen order. Repeated
    /// keys (a module that was unloaded with live allocations and loaded again) are summed.
    ///
    /// Keys are looked up by reference in a hash map and cloned once per distinct key: an
    /// ordered map of cloned keys took a large share of a 10 000-line diff.
    pub fn entries(&self, snapshot: &Snapshot) -> Vec<Entry> {
        let capacity = if self.group_by.is_none() {
            snapshot.tags.len()
        } else {
            0
        };
        let mut out: Vec<Entry> = Vec::with_capacity(capacity);
        let mut by_tag: FastMap<&TagKey, usize> = fast_map(capacity);
        let mut by_group: FastMap<String, usize> = fast_map(0);
        for tag in snapshot.tags.iter().filter(|t| self.keeps(&t.key)) {
            let index = match self.group_by {
                None => *by_tag.entry(&tag.key).or_insert_with(|| {
                    out.push(Entry::new(EntryKey::Tag(tag.key.clone())));
                    out.len() - 1
                }),
                Some(group_by) => {
                    let name = group_by.group_of(&tag.key);
                    match by_group.get(&name) {
                        Some(&i) => i,
                        None => {
                            out.push(Entry::new(EntryKey::Group(name.clone())));
                            by_group.insert(name, out.len() - 1);
                            out.len() - 1
                        }
                    }
                }
            };
            let Some(entry) = out.get_mut(index) else {
                continue;
            };
            entry.counts.add(tag.counts());
            entry.tags += 1;
            entry.inaccurate += usize::from(!tag.accurate);
            entry.marks.merge(self.marker.marks(&tag.key));
            for (k, v) in &tag.extra {
                entry.extra.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        out
    }
}

/// A hash map with [`FxHasher`]: keys are call-site names from a local file, so the DoS
/// resistance of the default SipHash buys nothing, while hashing was a seventh of a large diff.
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

pub fn fast_map<K, V>(capacity: usize) -> FastMap<K, V> {
    HashMap::with_capacity_and_hasher(capacity, BuildHasherDefault::default())
}

/// The multiply-rotate hash rustc uses for its own tables (FxHash).
#[derive(Debug, Default, Clone, Copy)]
pub struct FxHasher(u64);

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Orders of `show`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ShowSort {
    /// Largest byte count first.
    #[default]
    Bytes,
    /// Most calls first.
    Calls,
    /// By name: file, line, module, function for tags; the group name for groups.
    Name,
}

/// Sorts rows; ties fall back to the name so output is stable across runs. Sort references
/// (`&mut [&Entry]`) for large inputs: moving whole entries was a quarter of `show`'s time.
pub fn sort_entries<E: Borrow<Entry>>(entries: &mut [E], by: ShowSort) {
    let name = |a: &E, b: &E| a.borrow().key.cmp(&b.borrow().key);
    match by {
        ShowSort::Bytes => entries.sort_by(|a, b| {
            let (x, y) = (a.borrow().counts.bytes, b.borrow().counts.bytes);
            y.cmp(&x).then_with(|| name(a, b))
        }),
        ShowSort::Calls => entries.sort_by(|a, b| {
            let (x, y) = (a.borrow().counts.calls, b.borrow().counts.calls);
            y.cmp(&x).then_with(|| name(a, b))
        }),
        ShowSort::Name => entries.sort_by(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocinfo::parse::{parse_str, Mode};

    const TEXT: &str = "\
allocinfo - version: 2.0
#     <size>  <calls> <tag info>
        4096        1 mm/memory.c:10 func:a 
        8192        4 mm/memory.c:20 func:b 
       16384        2 fs/ext4/super.c:5 [ext4] func:a 
         100        9 mm/memory.c:10 func:a accurate:no 
";

    fn names(entries: &[Entry]) -> Vec<String> {
        entries.iter().map(|e| e.key.to_string()).collect()
    }

    #[test]
    fn repeated_keys_are_summed() {
        let snap = parse_str("t", TEXT, Mode::Strict).expect("parses");
        let entries = Selection::default().entries(&snap);
        assert_eq!(entries.len(), 3);
        let a = entries
            .iter()
            .find(|e| e.key.to_string() == "mm/memory.c:10 func:a")
            .expect("present");
        assert_eq!(
            (a.counts, a.tags, a.inaccurate),
            (
                Counts {
                    bytes: 4196,
                    calls: 10
                },
                2,
                1
            )
        );
    }

    #[test]
    fn groups_and_sorts() {
        let snap = parse_str("t", TEXT, Mode::Strict).expect("parses");
        let mut sel = Selection {
            group_by: Some(GroupBy::Dir),
            ..Selection::default()
        };
        let mut rows: Vec<Entry> = sel.entries(&snap);
        sort_entries(&mut rows, ShowSort::Bytes);
        assert_eq!(names(&rows), ["fs/ext4", "mm"]);
        assert_eq!(rows[1].counts.bytes, 12388);

        sel.group_by = Some(GroupBy::Module);
        let mut rows: Vec<Entry> = sel.entries(&snap);
        sort_entries(&mut rows, ShowSort::Calls);
        assert_eq!(names(&rows), [BUILTIN_GROUP, "ext4"]);
        assert_eq!(rows[0].counts.calls, 14);

        sel.group_by = Some(GroupBy::Func);
        let mut rows: Vec<Entry> = sel.entries(&snap);
        sort_entries(&mut rows, ShowSort::Name);
        assert_eq!(names(&rows), ["a", "b"]);
        assert_eq!(rows[0].tags, 3);
    }

    #[test]
    fn filter_matches_file_function_or_module() {
        let snap = parse_str("t", TEXT, Mode::Strict).expect("parses");
        let count = |re: &str| {
            Selection {
                filter: Some(Regex::new(re).expect("valid")),
                ..Selection::default()
            }
            .entries(&snap)
            .len()
        };
        assert_eq!(count("^ext4$"), 1);
        assert_eq!(count("^b$"), 1);
        assert_eq!(count("^mm/"), 2);
        assert_eq!(count("nothing"), 0);
    }
}
