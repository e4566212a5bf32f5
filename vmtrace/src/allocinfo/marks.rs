//! Which tags matter to a vmalloc investigation: page tables and vmalloc call sites.
//!
//! allocinfo does not say which allocator a tag used: `alloc_hooks()` tags every allocation at
//! its caller, so a `vmalloc()` in `bpf_map_area_alloc` shows up as `func:bpf_map_area_alloc`.
//! Page tables are easy (one known function). For vmalloc, two sources of truth are used: the
//! vmalloc allocator's own bookkeeping (`mm/vmalloc.c`), and, when the user supplies one, a
//! /proc/vmallocinfo capture, whose third column names the caller of each live vmalloc area.

use std::collections::BTreeSet;

use serde::Serialize;

use super::model::TagKey;

/// The function under which the kernel tags page-table pages (`include/linux/mm.h`); its line
/// number changes between kernels, so only the name is matched.
pub const PAGETABLE_FUNCTION: &str = "pagetable_alloc";

/// The vmalloc allocator's own file: its tags are vmap_area, vm_struct and page-array allocations.
pub const VMALLOC_FILE: &str = "mm/vmalloc.c";

pub fn is_pagetable(key: &TagKey) -> bool {
    key.function == PAGETABLE_FUNCTION
}

/// Marks of one tag or group, printed next to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Marks {
    pub pagetable: bool,
    pub vmalloc: bool,
}

impl Marks {
    pub fn merge(&mut self, other: Marks) {
        self.pagetable |= other.pagetable;
        self.vmalloc |= other.vmalloc;
    }

    /// A short column for text output: `pt` for page tables, `vm` for vmalloc sites.
    pub fn label(&self) -> &'static str {
        match (self.pagetable, self.vmalloc) {
            (true, true) => "pt,vm",
            (true, false) => "pt",
            (false, true) => "vm",
            (false, false) => "",
        }
    }
}

/// Decides the marks of a tag.
#[derive(Debug, Clone, Default)]
pub struct Marker {
    vmalloc_callers: BTreeSet<String>,
}

impl Marker {
    /// A marker that also knows the vmalloc callers listed in a /proc/vmallocinfo text.
    pub fn with_vmallocinfo(text: &str) -> Marker {
        Marker {
            vmalloc_callers: vmalloc_callers(text),
        }
    }

    pub fn caller_count(&self) -> usize {
        self.vmalloc_callers.len()
    }

    pub fn marks(&self, key: &TagKey) -> Marks {
        Marks {
            pagetable: is_pagetable(key),
            vmalloc: key.file == VMALLOC_FILE || self.vmalloc_callers.contains(&key.function),
        }
    }
}

/// Function names of the callers of vmalloc()-backed areas in a /proc/vmallocinfo text (its
/// third column, `dup_task_struct+0x4f/0x1c0`). Only areas with pages count: ioremap and vmap
/// areas map memory that some other tag allocated.
///
/// Lines the host parser rejects are ignored: this only adds marks, so a partial read is better
/// than none.
pub fn vmalloc_callers(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| crate::host::vmallocinfo::parse_line(line).ok())
        .filter(|area| area.pages.is_some() || area.flags.iter().any(|f| f == "vmalloc"))
        .filter_map(|area| area.caller)
        .filter_map(|caller| caller.split_once('+').map(|(name, _)| name.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(file: &str, function: &str) -> TagKey {
        TagKey {
            file: file.into(),
            line: 1,
            module: None,
            function: function.into(),
        }
    }

    #[test]
    fn builtin_rules() {
        let marker = Marker::default();
        assert_eq!(
            marker.marks(&key("include/linux/mm.h", "pagetable_alloc")),
            Marks {
                pagetable: true,
                vmalloc: false
            }
        );
        assert!(
            marker
                .marks(&key("mm/vmalloc.c", "alloc_vmap_area"))
                .vmalloc
        );
        assert_eq!(
            marker.marks(&key("kernel/fork.c", "dup_task_struct")),
            Marks::default()
        );
    }

    #[test]
    fn vmallocinfo_callers_mark_tags() {
        let text = "\
0xffffc90000000000-0xffffc90000005000   20480 dup_task_struct+0x4f/0x1c0 pages=4 vmalloc N0=4
0xffffc90000005000-0xffffc90000007000    8192 unpurged vm_area
0xffffc90000008000-0xffffc9000000a000    8192 xt_alloc_table_info+0xfe/0x130 [x_tables] pages=1 vmalloc
0xffffc9000000a000-0xffffc9000000c000    8192 vm_map_ram
0xffffc90000006000-0xffffc90000008000    8192 acpi_os_map_iomem+0x1bc/0x1e0 phys=0x00000000000a0000 ioremap
not a vmallocinfo line
";
        let marker = Marker::with_vmallocinfo(text);
        assert_eq!(marker.caller_count(), 2);
        assert!(
            marker
                .marks(&key("kernel/fork.c", "dup_task_struct"))
                .vmalloc
        );
        assert!(
            marker
                .marks(&key("net/netfilter/x_tables.c", "xt_alloc_table_info"))
                .vmalloc
        );
        assert!(!marker.marks(&key("mm/slub.c", "vm_map_ram")).vmalloc);
        assert!(
            !marker
                .marks(&key("drivers/acpi/osl.c", "acpi_os_map_iomem"))
                .vmalloc
        );
    }

    #[test]
    fn labels() {
        let mut m = Marks::default();
        assert_eq!(m.label(), "");
        m.merge(Marks {
            pagetable: true,
            vmalloc: false,
        });
        m.merge(Marks {
            pagetable: false,
            vmalloc: true,
        });
        assert_eq!(m.label(), "pt,vm");
    }
}
