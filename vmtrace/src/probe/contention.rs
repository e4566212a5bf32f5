//! Classifying lock waits into the vmap lock classes (the locks of mm/vmalloc.c and
//! `init_mm.page_table_lock`), from the waiter's kernel stack and the lock's address.
//!
//! `CONFIG_KALLSYMS_ALL` is off on the reference kernel, so lock addresses cannot be looked up
//! by name. The class comes from two facts instead:
//!
//! - the **acquirer**, the first frame below the lock primitives (`_raw_spin_lock`,
//!   `queued_spin_lock_slowpath`, `mutex_lock`, …), is the function that takes the lock, and
//!   most vmap functions take exactly one kind of lock;
//! - **where the lock lives**: the global locks (`free_vmap_area_lock`, `vmap_purge_lock`,
//!   `init_mm.page_table_lock`) are in the kernel image (x86_64: at or above
//!   `0xffffffff80000000`), the per-node locks are in the `vmap_nodes` array on the heap.
//!
//! `alloc_vmap_area` takes two per-node locks (the pool lock, then the busy lock), and
//! `vmalloc_info_show` the busy and lazy locks. For those the lock address decides: every
//! per-node lock has a fixed address, and the unambiguous acquirers (`find_unlink_vmap_area`
//! and `find_vmap_area` → busy, `free_vmap_area_noflush` → lazy, `purge_vmap_node` and
//! `decay_va_pool_node` → pool) teach the classifier which address is which. An ambiguous wait
//! on an address not learnt yet falls back to the call site (`function+offset`), learnt the same
//! way; failing both, it is `other`.
//!
//! **Node id.** `vmap_nodes` is one array, so the nodes' locks of one class lie in node order at
//! a fixed stride. Once as many distinct addresses of a class have been learnt as there are
//! nodes, a lock's node id is its rank among them. Before that it is unknown (`None`).

use std::collections::{BTreeSet, HashMap};

use crate::trace::LockClass;

/// `LCB_F_MUTEX`.
const F_MUTEX: u32 = 1 << 5;

/// Start of the x86_64 kernel text/data mapping; heap (direct map, vmalloc) is below it.
const KERNEL_IMAGE_START: u64 = 0xffff_ffff_8000_0000;

/// Frames that belong to the locking code itself, not to the lock's user.
fn is_lock_primitive(name: &str) -> bool {
    const PREFIXES: [&str; 16] = [
        "_raw_spin_lock",
        "_raw_read_lock",
        "_raw_write_lock",
        "__raw_spin_lock",
        "do_raw_spin_lock",
        "queued_spin_lock",
        "__pv_queued_spin_lock",
        "native_queued_spin_lock",
        "queued_read_lock",
        "queued_write_lock",
        "__mutex_lock",
        "mutex_lock",
        "mutex_spin_on_owner",
        "rwsem_down",
        "down_read",
        "down_write",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p)) || name == "osq_lock"
}

/// `name` of a `name+0xoff` frame, without compiler suffixes (`.part.0`, `.isra.0`, `.cold`).
fn frame_function(frame: &str) -> &str {
    let name = frame.split('+').next().unwrap_or(frame);
    crate::host::kallsyms::base_name(name)
}

/// Which kinds of lock a vmap function takes directly.
fn acquirer_classes(function: &str) -> &'static [LockClass] {
    use LockClass::*;
    match function {
        "find_vmap_area"
        | "find_unlink_vmap_area"
        | "find_vmap_area_exceed_addr_lock"
        | "vread_iter"
        | "vmalloc_dump_obj"
        | "insert_vmap_area"
        | "vrealloc_node_align_noprof" => &[NodeBusyLock],
        "free_vmap_area_noflush" => &[NodeLazyLock],
        "purge_vmap_node" => &[NodePoolLock, FreeAreaLock],
        "decay_va_pool_node" | "node_pool_add_va" | "node_pool_del_va" | "node_alloc" => {
            &[NodePoolLock]
        }
        "reclaim_list_global" | "preload_this_cpu_lock" | "free_vmap_area" => &[FreeAreaLock],
        "__purge_vmap_area_lazy" => &[NodeLazyLock, NodePoolLock, FreeAreaLock],
        "alloc_vmap_area" => &[NodePoolLock, NodeBusyLock, FreeAreaLock],
        "pcpu_get_vm_areas" => &[NodeBusyLock, FreeAreaLock],
        "vmalloc_info_show" => &[NodeBusyLock, NodeLazyLock],
        "vmap_node_shrink_scan" => &[NodePoolLock],
        _ => &[],
    }
}

/// Functions that take `vmap_purge_lock`.
fn takes_purge_mutex(function: &str) -> bool {
    matches!(
        function,
        "drain_vmap_area_work"
            | "_vm_unmap_aliases"
            | "vm_unmap_aliases"
            | "purge_vmap_area_lazy"
            | "alloc_vmap_area"
            | "vmap_node_shrink_scan"
            | "reclaim_and_purge_vmap_areas"
            | "__vmalloc_node_range_noprof"
    )
}

fn is_pt_allocator(function: &str) -> bool {
    matches!(
        function,
        "__pte_alloc_kernel" | "__pmd_alloc" | "__pud_alloc" | "__p4d_alloc"
    )
}

/// Walked waits that must agree on an address's class, with none disagreeing, before the
/// address is marked known and its waits are kept without a walk. One would do for the static
/// locks; the per-node ones are learnt from acquirers, and a few agreeing stacks guard against
/// an address that only looked like one class so far.
pub const KNOWN_AFTER: u32 = 8;

/// The classes whose locks belong to mm/vmalloc.c alone, so that every wait on their address
/// is on a vmap path and needs no stack to be kept. `init_mm.page_table_lock` is not one: other
/// kernel page-table code takes it too, and those waits must still be filtered out.
fn knowable(class: LockClass) -> bool {
    use LockClass::*;
    matches!(
        class,
        FreeAreaLock | NodeBusyLock | NodeLazyLock | NodePoolLock | PurgeMutex
    )
}

/// What the walked waits said about one lock address.
#[derive(Debug, Clone, Copy)]
struct Evidence {
    class: LockClass,
    agreeing: u32,
    /// Another knowable class was seen on the same address: never mark it.
    conflict: bool,
}

/// The classifier, with what it learnt so far about lock addresses and call sites.
#[derive(Debug, Default)]
pub struct Classifier {
    nr_nodes: u32,
    by_addr: HashMap<u64, LockClass>,
    by_site: HashMap<String, LockClass>,
    node_locks: HashMap<LockClass, BTreeSet<u64>>,
    evidence: HashMap<u64, Evidence>,
    /// Addresses marked known, with their class: the probe keeps their waits without a stack.
    known: HashMap<u64, LockClass>,
    /// Marked since the last [`Classifier::take_newly_known`].
    newly_known: Vec<(u64, LockClass)>,
}

/// One classified wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified {
    pub class: LockClass,
    pub node: Option<u32>,
}

impl Classifier {
    pub fn new(nr_nodes: u32) -> Self {
        Self {
            nr_nodes: nr_nodes.max(1),
            ..Self::default()
        }
    }

    /// Classifies one wait from its frames (innermost first, `symbol+0xoff`), lock address and
    /// `LCB_F_*` flags, and learns from it when it is unambiguous.
    pub fn classify(&mut self, frames: &[String], lock: u64, flags: u32) -> Classified {
        let class = self.class_of(frames, lock, flags);
        self.learn_address(lock, class);
        self.with_node(class, lock)
    }

    /// Classifies a wait the probe kept without a stack
    /// ([`vmtrace_common::contention::STACK_NOT_WALKED`]): its lock was marked known, so the
    /// address alone gives the class. An address this classifier never marked (a probe
    /// shared with another reader) is `other`.
    pub fn classify_unwalked(&mut self, lock: u64) -> Classified {
        let class = self.known.get(&lock).copied().unwrap_or(LockClass::Other);
        self.with_node(class, lock)
    }

    /// Classifies one wait as the probe sent it: by its stack when it was walked and stored,
    /// by its address when it was not walked, or when the walk's stack could not be stored.
    /// `bpf_get_stackid` fails when another stack holds the hash bucket (the map has no
    /// `BPF_F_REUSE_STACKID`, so stored ids stay valid), and a popular stack that lost its
    /// bucket fails every time: those waits would all read `other` though their lock's
    /// address was learnt from agreeing stacks like any unwalked wait's.
    pub fn classify_wait(
        &mut self,
        stack_id: i64,
        frames: &[String],
        lock: u64,
        flags: u32,
    ) -> Classified {
        if stack_id < 0 {
            self.classify_unwalked(lock)
        } else {
            self.classify(frames, lock, flags)
        }
    }

    /// Takes `lock` as `class` without waits to learn from: its address came from the kernel
    /// itself (kallsyms, or a `vmap_node` and BTF offsets). True when it was not known yet.
    pub fn know(&mut self, lock: u64, class: LockClass) -> bool {
        if self.known.contains_key(&lock) {
            return false;
        }
        self.known.insert(lock, class);
        true
    }

    /// Addresses that became known since the last call, for the probe's `KNOWN_LOCKS` map.
    pub fn take_newly_known(&mut self) -> Vec<(u64, LockClass)> {
        std::mem::take(&mut self.newly_known)
    }

    fn learn_address(&mut self, lock: u64, class: LockClass) {
        if !knowable(class) || self.known.contains_key(&lock) {
            return;
        }
        let e = self.evidence.entry(lock).or_insert(Evidence {
            class,
            agreeing: 0,
            conflict: false,
        });
        if e.class != class {
            e.conflict = true;
        } else {
            e.agreeing += 1;
        }
        if !e.conflict && e.agreeing >= KNOWN_AFTER {
            self.known.insert(lock, class);
            self.newly_known.push((lock, class));
        }
    }

    fn with_node(&mut self, class: LockClass, lock: u64) -> Classified {
        let node = if matches!(
            class,
            LockClass::NodeBusyLock | LockClass::NodeLazyLock | LockClass::NodePoolLock
        ) {
            let set = self.node_locks.entry(class).or_default();
            set.insert(lock);
            (set.len() as u32 == self.nr_nodes)
                .then(|| set.iter().position(|&a| a == lock).map(|i| i as u32))
                .flatten()
        } else {
            None
        };
        Classified { class, node }
    }

    fn class_of(&mut self, frames: &[String], lock: u64, flags: u32) -> LockClass {
        use LockClass::*;
        // On the fentry and kprobe rungs the stack starts in the BPF program and its trampoline
        // (JIT addresses that kallsyms resolves to whatever symbol precedes them), then the
        // traced slow path: the acquirer is the first frame after the lock primitives.
        let first_primitive = frames
            .iter()
            .position(|f| is_lock_primitive(frame_function(f)))
            .unwrap_or(0);
        let Some(site) = frames[first_primitive..]
            .iter()
            .find(|f| !is_lock_primitive(frame_function(f)))
        else {
            return Other;
        };
        let acquirer = frame_function(site);
        let global = lock >= KERNEL_IMAGE_START;
        if flags & F_MUTEX != 0 {
            return if global && takes_purge_mutex(acquirer) {
                PurgeMutex
            } else {
                Other
            };
        }
        if is_pt_allocator(acquirer) {
            // Only init_mm's lock is in the kernel image; a user mm's is on the heap.
            return if global { PageTableLock } else { Other };
        }
        let candidates = acquirer_classes(acquirer);
        if candidates.is_empty() {
            return Other;
        }
        if global {
            return if candidates.contains(&FreeAreaLock) {
                FreeAreaLock
            } else {
                Other
            };
        }
        let per_node: Vec<LockClass> = candidates
            .iter()
            .copied()
            .filter(|c| *c != FreeAreaLock)
            .collect();
        match per_node.as_slice() {
            [] => Other,
            [only] => {
                self.by_addr.insert(lock, *only);
                self.by_site.insert(site.clone(), *only);
                *only
            }
            several => {
                if let Some(c) = self.by_addr.get(&lock).filter(|c| several.contains(c)) {
                    let c = *c;
                    self.by_site.insert(site.clone(), c);
                    c
                } else if let Some(c) = self.by_site.get(site).filter(|c| several.contains(c)) {
                    *c
                } else {
                    Other
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real stacks recorded on the reference machine (6.18, 2 vmap nodes) with
    /// `bpftrace -e 'tracepoint:lock:contention_begin { @[kstack(perf), args->flags,
    /// args->lock_addr] = count(); }'` during `vmtrace stress fix-size --threads 2` plus
    /// `thread-churn --threads 2`; see `tests/fixtures/contention/stacks.txt`.
    const FIXTURE: &str = include_str!("../../tests/fixtures/contention/stacks.txt");

    struct Sample {
        frames: Vec<String>,
        flags: u32,
        lock: u64,
    }

    fn samples() -> Vec<Sample> {
        let mut out = Vec::new();
        let mut frames = Vec::new();
        for line in FIXTURE.lines() {
            let t = line.trim();
            if t.starts_with("@[") || t.is_empty() || t.starts_with('#') {
                frames.clear();
            } else if let Some(rest) = t.strip_prefix(", ") {
                // `, flags, lock]: count`
                let mut it = rest.split([',', ']']).map(str::trim);
                let flags = it.next().and_then(|f| f.parse().ok()).unwrap_or(0);
                let lock = it
                    .next()
                    .and_then(|l| u64::from_str_radix(l.trim_start_matches("0x"), 16).ok())
                    .unwrap_or(0);
                out.push(Sample {
                    frames: std::mem::take(&mut frames),
                    flags,
                    lock,
                });
            } else if let Some((_, sym)) = t.split_once(' ') {
                frames.push(sym.to_string());
            }
        }
        out
    }

    fn classify_all() -> Vec<(Sample, Classified)> {
        let mut c = Classifier::new(2);
        // Two passes, as a long recording would: the second sees what the first learnt.
        for s in samples() {
            c.classify(&s.frames, s.lock, s.flags);
        }
        samples()
            .into_iter()
            .map(|s| {
                let r = c.classify(&s.frames, s.lock, s.flags);
                (s, r)
            })
            .collect()
    }

    fn class_at(results: &[(Sample, Classified)], acquirer_frame: &str) -> Vec<Classified> {
        results
            .iter()
            .filter(|(s, _)| s.frames.get(2).map(String::as_str) == Some(acquirer_frame))
            .map(|(_, r)| *r)
            .collect()
    }

    #[test]
    fn trampoline_frames_before_the_slow_path_are_skipped() {
        // A stack the fentry rung recorded in a 6.12 guest: two JIT frames, the traced slow
        // path, then the real call chain.
        let frames: Vec<String> = [
            "handshake_exit+0x25c314fa",
            "handshake_exit+0x25c32bc6",
            "native_queued_spin_lock_slowpath+0x9",
            "_raw_spin_lock+0x29",
            "alloc_vmap_area+0x4fc",
            "handshake_exit+0x25c388e9",
            "alloc_vmap_area+0x5",
            "__get_vm_area_node+0xcc",
        ]
        .map(String::from)
        .into();
        let mut c = Classifier::new(4);
        let r = c.classify(&frames, 0xffff_ffff_9a5d_6730, 1);
        assert_eq!(r.class, LockClass::FreeAreaLock);
    }

    #[test]
    fn the_fixture_holds_real_vmap_stacks() {
        let s = samples();
        assert!(s.len() >= 20, "{} samples", s.len());
        assert!(s.iter().all(|s| !s.frames.is_empty() && s.lock != 0));
    }

    #[test]
    fn each_vmap_site_gets_its_lock_class() {
        use LockClass::*;
        let r = classify_all();
        let expect = [
            ("find_unlink_vmap_area+85", NodeBusyLock),
            ("find_vmap_area+88", NodeBusyLock),
            ("free_vmap_area_noflush+179", NodeLazyLock),
            ("purge_vmap_node+402", NodePoolLock),
            ("decay_va_pool_node+756", NodePoolLock),
            ("alloc_vmap_area+329", NodePoolLock),
            ("alloc_vmap_area+759", NodeBusyLock),
            ("alloc_vmap_area+1052", FreeAreaLock),
        ];
        for (site, class) in expect {
            let got = class_at(&r, site);
            assert!(!got.is_empty(), "no sample at {site}");
            assert!(
                got.iter().all(|g| g.class == class),
                "{site}: {got:?}, want {class:?}"
            );
        }
    }

    #[test]
    fn unrelated_locks_on_vmap_stacks_are_other() {
        let r = classify_all();
        // Zone lock taken while vfree returns pages, and run-queue locks under cond_resched.
        for (s, c) in &r {
            let acquirer = frame_function(
                &s.frames[1..]
                    .iter()
                    .find(|f| !is_lock_primitive(frame_function(f)))
                    .cloned()
                    .unwrap_or_default(),
            )
            .to_string();
            if acquirer_classes(&acquirer).is_empty() && !is_pt_allocator(&acquirer) {
                assert_eq!(c.class, LockClass::Other, "{:?}", s.frames);
            }
        }
    }

    #[test]
    fn node_ids_follow_the_address_order_of_the_node_array() {
        let r = classify_all();
        // Busy locks of the two nodes, 0x1880 (sizeof(struct vmap_node)) apart.
        for (s, c) in &r {
            if c.class == LockClass::NodeBusyLock {
                let want = match s.lock {
                    0xffff888100055820 => 0,
                    0xffff8881000570a0 => 1,
                    other => panic!("unexpected busy lock {other:#x}"),
                };
                assert_eq!(c.node, Some(want));
            }
        }
    }

    #[test]
    fn mutex_waits_in_purge_paths_are_the_purge_mutex() {
        let mut c = Classifier::new(2);
        let frames: Vec<String> = [
            "__mutex_lock.constprop.0+1234",
            "__mutex_lock_slowpath+19",
            "mutex_lock+56",
            "drain_vmap_area_work+21",
            "process_one_work+396",
        ]
        .map(String::from)
        .to_vec();
        let r = c.classify(&frames, 0xffffffff83b8e000, 0x20 | 1);
        assert_eq!(r.class, LockClass::PurgeMutex);
        let r = c.classify(&frames, 0xffff888100000000, 0x20);
        assert_eq!(r.class, LockClass::Other);
        let pt: Vec<String> = [
            "__pv_queued_spin_lock_slowpath+270",
            "_raw_spin_lock+59",
            "__pte_alloc_kernel+80",
            "vmap_small_pages_range_noflush+600",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            c.classify(&pt, 0xffffffff83a0c0e8, 1).class,
            LockClass::PageTableLock
        );
        assert_eq!(
            c.classify(&pt, 0xffff888100000000, 1).class,
            LockClass::Other
        );
    }

    fn stack(acquirer: &str) -> Vec<String> {
        [
            "native_queued_spin_lock_slowpath+0x9",
            "_raw_spin_lock+0x29",
            acquirer,
            "vfree+0x40",
        ]
        .map(String::from)
        .into()
    }

    const NODE0_LAZY: u64 = 0xffff_8880_0410_0040;
    const NODE1_LAZY: u64 = 0xffff_8880_0410_0240;

    #[test]
    fn an_address_is_known_after_enough_agreeing_walks() {
        let mut c = Classifier::new(2);
        let lazy = stack("free_vmap_area_noflush+0xb3");
        for i in 1..KNOWN_AFTER {
            assert_eq!(
                c.classify(&lazy, NODE0_LAZY, 1).class,
                LockClass::NodeLazyLock
            );
            assert!(c.take_newly_known().is_empty(), "marked after {i} walks");
        }
        c.classify(&lazy, NODE0_LAZY, 1);
        assert_eq!(
            c.take_newly_known(),
            [(NODE0_LAZY, LockClass::NodeLazyLock)]
        );
        // Marked once: a late walked wait (one already pending when the map was written)
        // does not mark it again.
        c.classify(&lazy, NODE0_LAZY, 1);
        assert!(c.take_newly_known().is_empty());
        assert_eq!(
            c.classify_unwalked(NODE0_LAZY).class,
            LockClass::NodeLazyLock
        );
        // An address never marked is not guessed.
        assert_eq!(c.classify_unwalked(NODE1_LAZY).class, LockClass::Other);
    }

    #[test]
    fn a_walk_whose_stack_was_not_stored_is_classified_by_its_known_address() {
        let mut c = Classifier::new(2);
        let lazy = stack("free_vmap_area_noflush+0xb3");
        const EEXIST: i64 = -17;
        // Before the address is known a failed walk is not guessed, and teaches nothing.
        assert_eq!(
            c.classify_wait(EEXIST, &[], NODE0_LAZY, 1).class,
            LockClass::Other
        );
        for id in 0..i64::from(KNOWN_AFTER) {
            assert_eq!(
                c.classify_wait(id, &lazy, NODE0_LAZY, 1).class,
                LockClass::NodeLazyLock
            );
        }
        assert_eq!(
            c.classify_wait(EEXIST, &[], NODE0_LAZY, 1).class,
            LockClass::NodeLazyLock
        );
        assert_eq!(
            c.classify_wait(EEXIST, &[], NODE1_LAZY, 1).class,
            LockClass::Other
        );
        assert_eq!(
            c.classify_wait(
                vmtrace_common::contention::STACK_NOT_WALKED,
                &[],
                NODE0_LAZY,
                1
            )
            .class,
            LockClass::NodeLazyLock
        );
    }

    #[test]
    fn an_address_seen_as_two_classes_is_never_known() {
        let mut c = Classifier::new(2);
        c.classify(&stack("find_vmap_area+0x58"), NODE0_LAZY, 1);
        for _ in 0..2 * KNOWN_AFTER {
            c.classify(&stack("free_vmap_area_noflush+0xb3"), NODE0_LAZY, 1);
        }
        assert!(c.take_newly_known().is_empty());
        assert_eq!(c.classify_unwalked(NODE0_LAZY).class, LockClass::Other);
    }

    #[test]
    fn the_page_table_lock_is_never_known() {
        // Other page-table code takes init_mm's lock too: its waits need the walk's filter.
        let mut c = Classifier::new(2);
        let ptl = 0xffff_ffff_9a5d_1100;
        for _ in 0..2 * KNOWN_AFTER {
            let r = c.classify(&stack("__pte_alloc_kernel+0x20"), ptl, 1);
            assert_eq!(r.class, LockClass::PageTableLock);
        }
        assert!(c.take_newly_known().is_empty());
    }

    #[test]
    fn unwalked_waits_keep_the_node_rank() {
        let mut c = Classifier::new(2);
        let lazy = stack("free_vmap_area_noflush+0xb3");
        for _ in 0..KNOWN_AFTER {
            c.classify(&lazy, NODE0_LAZY, 1);
            c.classify(&lazy, NODE1_LAZY, 1);
        }
        assert_eq!(c.take_newly_known().len(), 2);
        assert_eq!(c.classify_unwalked(NODE0_LAZY).node, Some(0));
        assert_eq!(c.classify_unwalked(NODE1_LAZY).node, Some(1));
    }
}
