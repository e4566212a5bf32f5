//! How the tracepoint rung attaches: as a raw tracepoint where the kernel allows it, as a perf
//! tracepoint otherwise.
//!
//! Both programs of a tracepoint run the same body (`tracepoint_programs!` in the eBPF crate);
//! they differ in what the kernel does before calling them. For a perf tracepoint it reserves a
//! per-CPU record, fills every field of the `format` file and then runs the program; for a raw
//! tracepoint it passes the `TP_PROTO` arguments as they are. On the hot tracepoints
//! (`kmem:mm_page_alloc` fires for every page, `lock:contention_begin` for every contended lock
//! in the system) building that record cost more than the programs themselves: bpftrace counting
//! `mm_page_alloc` and `contention_begin` alone slowed `vmtrace stress fix-size` by 13–14 % on the
//! reference machine.
//!
//! The argument slots are detected, never assumed: kernel BTF declares every tracepoint as
//! `btf_trace_<name>(void *__data, <TP_PROTO args>)`, and a probe's values are found there by
//! name. A tracepoint whose prototype lacks one of them (renamed, reordered away, no BTF) keeps
//! the perf tracepoint, and the trace header says why. `VMTRACE_TRACEPOINTS=perf` forces the
//! perf tracepoints everywhere (to compare, or on a kernel where a raw attach misbehaves).

use vmtrace_common::{kind, names, FieldLoc, TpLayout, MAX_FIELDS};

use crate::host::btf::KernelBtf;

/// Environment variable choosing how tracepoints attach: `raw` (default: raw where possible)
/// or `perf`.
pub const ENV: &str = "VMTRACE_TRACEPOINTS";

/// The raw twin of one tracepoint program.
#[derive(Debug, Clone, Copy)]
pub struct RawTwin {
    /// `category:name`.
    pub target: &'static str,
    pub perf_program: &'static str,
    pub raw_program: &'static str,
    pub layout_global: &'static str,
    /// For each wire field of the perf program, the `TP_PROTO` argument holding it, or `""`
    /// when the program finds that value another way (`workqueue_execute_start`'s function is
    /// read from the work item).
    pub args: &'static [&'static str],
    /// How many leading argument slots the raw program loads straight from its context. The
    /// kernel refuses to attach a raw program that loads past the tracepoint's last argument;
    /// a prototype that names every one of `args` has at least this many (a test checks).
    pub direct_slots: usize,
    /// The event kind whose `RAW_DIRECT` bit user space sets when the layout is exactly the
    /// first `direct_slots` arguments in order (0: the program has no such fast path).
    pub direct_kind: u32,
}

pub const TWINS: [RawTwin; 9] = [
    RawTwin {
        target: "vmalloc:alloc_vmap_area",
        perf_program: names::PROG_ALLOC,
        raw_program: names::PROG_RAW_ALLOC,
        layout_global: names::ALLOC_RAW_LAYOUT,
        args: &["addr", "size", "align", "vstart", "vend", "failed"],
        direct_slots: 6,
        direct_kind: kind::ALLOC,
    },
    RawTwin {
        target: "vmalloc:free_vmap_area_noflush",
        perf_program: names::PROG_FREE,
        raw_program: names::PROG_RAW_FREE,
        layout_global: names::FREE_RAW_LAYOUT,
        args: &["va_start", "nr_lazy", "nr_lazy_max"],
        direct_slots: 3,
        direct_kind: kind::FREE,
    },
    RawTwin {
        target: "vmalloc:purge_vmap_area_lazy",
        perf_program: names::PROG_PURGE,
        raw_program: names::PROG_RAW_PURGE,
        layout_global: names::PURGE_RAW_LAYOUT,
        args: &["start", "end", "npurged"],
        direct_slots: 3,
        direct_kind: kind::PURGE,
    },
    RawTwin {
        target: "lock:contention_begin",
        perf_program: names::PROG_LOCK_BEGIN,
        raw_program: names::PROG_RAW_LOCK_BEGIN,
        layout_global: names::LOCK_BEGIN_RAW_LAYOUT,
        args: &["lock", "flags"],
        direct_slots: 2,
        direct_kind: 0,
    },
    RawTwin {
        target: "lock:contention_end",
        perf_program: names::PROG_LOCK_END,
        raw_program: names::PROG_RAW_LOCK_END,
        layout_global: names::LOCK_END_RAW_LAYOUT,
        args: &["lock", "ret"],
        direct_slots: 2,
        direct_kind: 0,
    },
    RawTwin {
        target: "workqueue:workqueue_execute_start",
        perf_program: names::PROG_WQ_START,
        raw_program: names::PROG_RAW_WQ_START,
        layout_global: names::WQ_START_RAW_LAYOUT,
        args: &["work", ""],
        direct_slots: 1,
        direct_kind: 0,
    },
    RawTwin {
        target: "workqueue:workqueue_execute_end",
        perf_program: names::PROG_WQ_END,
        raw_program: names::PROG_RAW_WQ_END,
        layout_global: names::WQ_END_RAW_LAYOUT,
        args: &["work", "function"],
        direct_slots: 2,
        direct_kind: 0,
    },
    RawTwin {
        target: "kmem:mm_page_alloc",
        perf_program: names::PROG_PAGE_ALLOC,
        raw_program: names::PROG_RAW_PAGE_ALLOC,
        layout_global: names::PAGE_ALLOC_RAW_LAYOUT,
        // The `struct page` address stands in for the pfn (see docs/trace-format.md).
        args: &["page", "order", "gfp_flags"],
        direct_slots: 3,
        direct_kind: 0,
    },
    RawTwin {
        target: "csd:csd_queue_cpu",
        perf_program: names::PROG_CSD_QUEUE,
        raw_program: names::PROG_RAW_CSD_QUEUE,
        layout_global: names::CSD_QUEUE_RAW_LAYOUT,
        args: &["cpu", "callsite", "func"],
        direct_slots: 3,
        direct_kind: 0,
    },
];

/// The twin of a perf tracepoint program, if it has one.
pub fn twin_of(perf_program: &str) -> Option<&'static RawTwin> {
    TWINS.iter().find(|t| t.perf_program == perf_program)
}

/// Whether the user asked for perf tracepoints only.
pub fn perf_forced() -> bool {
    std::env::var(ENV).is_ok_and(|v| v.trim().eq_ignore_ascii_case("perf"))
}

/// The raw layout of `twin` given the argument names BTF declares for its tracepoint: each
/// wanted argument's slot, 8 bytes (the kernel widens every argument to `u64`, sign-extending
/// signed ones, so the value needs no further widening).
pub fn raw_layout(twin: &RawTwin, proto: &[String]) -> Result<TpLayout, String> {
    let mut layout = TpLayout::EMPTY;
    for (i, want) in twin.args.iter().enumerate().take(MAX_FIELDS) {
        if want.is_empty() {
            continue;
        }
        let slot = proto.iter().position(|a| a == want).ok_or_else(|| {
            format!(
                "its BTF prototype ({}) has no argument `{want}`",
                proto.join(", ")
            )
        })?;
        let offset = u16::try_from(slot * 8).map_err(|_| format!("argument `{want}` too far"))?;
        layout.fields[i] = FieldLoc {
            offset,
            size: 8,
            signed: 0,
        };
    }
    Ok(layout)
}

/// Per twin, the layout to attach it with, or why it stays a perf tracepoint (`force_perf`:
/// [`perf_forced`], passed in so the decision is a pure function of its inputs).
pub fn plan(
    btf: Result<&KernelBtf, &str>,
    work_func_offset: Option<u64>,
    force_perf: bool,
) -> Vec<RawPlan> {
    TWINS
        .iter()
        .map(|twin| {
            let layout = if force_perf {
                Err(format!("{ENV}=perf"))
            } else {
                match btf {
                    Err(why) => Err(why.to_string()),
                    Ok(btf) => {
                        let name = twin.target.split_once(':').map_or(twin.target, |(_, n)| n);
                        match btf.raw_tp_args(name) {
                            None => Err(format!("no btf_trace_{name} prototype in kernel BTF")),
                            Some(proto) => raw_layout(twin, &proto).and_then(|l| {
                                if twin.args.contains(&"") && work_func_offset.is_none() {
                                    Err("no `func` member of struct work_struct in BTF".into())
                                } else {
                                    Ok(l)
                                }
                            }),
                        }
                    }
                }
            };
            RawPlan { twin, layout }
        })
        .collect()
}

/// Whether `layout` is exactly the first `direct_slots` arguments of `twin`, in order, so its
/// raw program may copy them without consulting the layout.
pub fn direct_layout(twin: &RawTwin, layout: &TpLayout) -> bool {
    twin.direct_kind != 0
        && layout.fields.iter().enumerate().all(|(i, f)| {
            if i < twin.direct_slots {
                usize::from(f.offset) == i * 8 && f.size == 8
            } else {
                f.size == 0
            }
        })
}

/// The `RAW_DIRECT` global: bit `kind` for every twin planned raw with a direct layout.
pub fn direct_bits(plans: &[RawPlan]) -> u32 {
    plans
        .iter()
        .filter_map(|p| match &p.layout {
            Ok(l) if direct_layout(p.twin, l) => Some(1u32 << p.twin.direct_kind),
            _ => None,
        })
        .fold(0, |a, b| a | b)
}

/// The decision for one twin before loading.
#[derive(Debug, Clone)]
pub struct RawPlan {
    pub twin: &'static RawTwin,
    pub layout: Result<TpLayout, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn slots_follow_the_prototype_by_name() {
        let twin = twin_of(names::PROG_LOCK_BEGIN).expect("twin");
        // Reordered prototype: the layout follows the names, not the compiled-in order.
        let l = raw_layout(twin, &proto(&["flags", "lock"])).expect("layout");
        assert_eq!((l.fields[0].offset, l.fields[0].size), (8, 8));
        assert_eq!((l.fields[1].offset, l.fields[1].size), (0, 8));
        assert_eq!(l.fields[2].size, 0);
    }

    #[test]
    fn a_missing_argument_keeps_the_perf_tracepoint() {
        let twin = twin_of(names::PROG_ALLOC).expect("twin");
        let why = raw_layout(twin, &proto(&["addr", "size"])).expect_err("refused");
        assert!(why.contains("`align`"), "{why}");
    }

    #[test]
    fn vmalloc_prototypes_in_kernel_order_take_the_direct_path() {
        let alloc = twin_of(names::PROG_ALLOC).expect("twin");
        let kernel = proto(&["addr", "size", "align", "vstart", "vend", "failed"]);
        let l = raw_layout(alloc, &kernel).expect("layout");
        assert!(direct_layout(alloc, &l));
        // Another order still attaches raw, through the general layout-driven copy.
        let swapped = proto(&["size", "addr", "align", "vstart", "vend", "failed"]);
        let l = raw_layout(alloc, &swapped).expect("layout");
        assert!(!direct_layout(alloc, &l));
        let plans = plan(Err("no BTF"), None, false);
        assert_eq!(direct_bits(&plans), 0, "no raw plan, no direct bit");
    }

    #[test]
    fn direct_loads_never_pass_the_named_arguments() {
        for t in &TWINS {
            let named = t.args.iter().filter(|a| !a.is_empty()).count();
            assert!(t.direct_slots <= named, "{}", t.target);
        }
    }

    #[test]
    fn a_value_read_another_way_has_no_slot() {
        let twin = twin_of(names::PROG_WQ_START).expect("twin");
        let l = raw_layout(twin, &proto(&["work"])).expect("layout");
        assert_eq!((l.fields[0].offset, l.fields[0].size), (0, 8));
        assert_eq!(l.fields[1].size, 0);
    }

    #[test]
    fn without_btf_every_tracepoint_stays_perf_and_says_why() {
        let plans = plan(
            Err("no kernel BTF (/sys/kernel/btf/vmlinux missing)"),
            Some(24),
            false,
        );
        assert_eq!(plans.len(), TWINS.len());
        for p in &plans {
            let why = p.layout.as_ref().expect_err("no raw layout without BTF");
            assert!(why.contains("no kernel BTF"), "{}: {why}", p.twin.target);
        }
        for p in plan(Err("unused"), Some(24), true) {
            let why = p.layout.expect_err("perf forced");
            assert!(why.contains(ENV), "{}: {why}", p.twin.target);
        }
    }

    #[test]
    fn every_twin_names_distinct_programs_and_globals() {
        for (i, a) in TWINS.iter().enumerate() {
            assert_ne!(a.perf_program, a.raw_program);
            for b in &TWINS[i + 1..] {
                assert_ne!(a.raw_program, b.raw_program);
                assert_ne!(a.layout_global, b.layout_global);
                assert_ne!(a.target, b.target);
            }
        }
    }
}
