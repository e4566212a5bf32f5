//! The trace format, checked without privileges: records of every kind built with the library's
//! own types and written by its own writer must validate against `docs/trace.schema.json`, the
//! schema must reject what the format forbids, and `TraceReader` must read back exactly what
//! `TraceWriter` wrote, with line numbers in its errors.

mod common;

use serde_json::{json, Value};
use vmtrace::allocinfo::{Counts, Tag, TagKey};
use vmtrace::host::system::SystemFacts;
use vmtrace::host::tracefs::Field;
use vmtrace::trace::{
    Alloc, AllocinfoSample, AreaKind, ClassHolds, ClassTotal, Contention, Ctx, EventCounts, Footer,
    Free, Header, KAddr, LadderCounts, LadderStats, Latency, LockClass, Meminfo, ProbeInfo,
    ProbeRunStats, PtLevel, PtPage, Purge, ReadError, Record, RungRefusal, StopReason, Synthetic,
    Tool, TraceReader, TraceWriter, VmallocArea, VmallocSnapshot, VmapFacts, Work, WorkStart,
    FORMAT, VERSION,
};

// ---------------------------------------------------------------------------------------------
// Sample records
// ---------------------------------------------------------------------------------------------

const VSTART: u64 = 0xffffc90000000000;
const VEND: u64 = 0xffffe8ffffffffff;
/// `-ENOENT` as the kernel passes it in a failed attempt's `addr`.
const ENOENT_ADDR: u64 = (-2i64) as u64;

fn field(name: &str, decl: &str, offset: u16, size: u8, signed: bool) -> Field {
    Field {
        name: name.into(),
        decl: decl.into(),
        offset,
        size,
        signed,
    }
}

fn header() -> Header {
    Header {
        format: FORMAT.into(),
        version: VERSION,
        tool: Tool {
            name: "vmtrace".into(),
            version: "0.1.0".into(),
        },
        command_line: ["vmtrace", "record", "-o", "t.jsonl", "--", "true"]
            .map(String::from)
            .to_vec(),
        system: SystemFacts {
            kernel_release: "6.18.4".into(),
            kernel_version: "#1 SMP PREEMPT_DYNAMIC".into(),
            machine: "x86_64".into(),
            hostname: "vm".into(),
            page_size: 4096,
            possible_cpus: 2,
            possible_cpu_list: "0-1".into(),
            online_cpus: 2,
            online_cpu_list: "0-1".into(),
            btf: true,
        },
        vmap: VmapFacts {
            nr_vmap_nodes: 2,
            zone_size: 65536,
            lazy_max_pages_computed: 16384,
            lazy_max_pages_tracepoint: Some(16384),
            vmalloc_start: Some(KAddr(VSTART)),
            vmalloc_end: Some(KAddr(VEND)),
            source: "test".into(),
        },
        probes: vec![
            ProbeInfo {
                probe: "vmalloc:alloc_vmap_area".into(),
                rung: "tracepoint".into(),
                program: "vmalloc_alloc_vmap_area".into(),
                fields: vec![
                    field("addr", "unsigned long addr", 8, 8, false),
                    field("size", "unsigned long size", 16, 8, false),
                    field("align", "unsigned long align", 24, 8, false),
                    field("vstart", "unsigned long vstart", 32, 8, false),
                    field("vend", "unsigned long vend", 40, 8, false),
                    field("failed", "int failed", 48, 4, true),
                ],
                missing_fields: vec![],
                logical: None,
                refused: vec![],
                note: None,
                attach: None,
                attach_fallback: None,
            },
            ProbeInfo {
                probe: "vmalloc:free_vmap_area_noflush".into(),
                rung: "raw_tracepoint".into(),
                program: "vmalloc_free_vmap_area_noflush".into(),
                fields: vec![field("va_start", "unsigned long va_start", 8, 8, false)],
                missing_fields: vec!["nr_lazy".into(), "nr_lazy_max".into()],
                logical: None,
                refused: vec![],
                note: None,
                attach: None,
                attach_fallback: None,
            },
            ProbeInfo {
                probe: "lock:contention_begin+lock:contention_end".into(),
                rung: "tracepoint".into(),
                program: "lock_contention_begin+lock_contention_end".into(),
                fields: vec![field("lock_addr", "void * lock_addr", 8, 8, false)],
                missing_fields: vec![],
                logical: Some("lock_waits".into()),
                refused: vec![
                    RungRefusal {
                        rung: "fentry".into(),
                        reason: "fentry load on __pv_queued_spin_lock_slowpath failed: EPERM"
                            .into(),
                    },
                    RungRefusal {
                        rung: "kprobe".into(),
                        reason: "kprobes not configured".into(),
                    },
                ],
                note: Some("n/a: no latency without fentry/kprobe".into()),
                attach: None,
                attach_fallback: None,
            },
            ProbeInfo {
                probe: "vmalloc:purge_vmap_area_lazy".into(),
                rung: "fentry".into(),
                program: "vmalloc_purge_vmap_area_lazy".into(),
                fields: vec![field("npurged", "unsigned int npurged", 65535, 255, false)],
                missing_fields: vec![],
                logical: None,
                refused: vec![],
                note: None,
                attach: None,
                attach_fallback: None,
            },
        ],
        clock: "CLOCK_BOOTTIME".into(),
        start_boottime_ns: 713_746_841_851,
        start_realtime_ns: 1_796_048_083_233_733_736,
        ring_buffer_bytes: 64 << 20,
        synthetic: None,
        imported: None,
    }
}

/// A header from a run whose calibration saw nothing: the `null`s of the format.
fn header_uncalibrated() -> Header {
    let mut h = header();
    h.vmap.lazy_max_pages_tracepoint = None;
    h.vmap.vmalloc_start = None;
    h.vmap.vmalloc_end = None;
    h.vmap.nr_vmap_nodes = 1;
    h.vmap.zone_size = 1;
    h.command_line = vec![];
    h.probes = vec![];
    h
}

/// A header as `vmtrace synth` writes it: the optional `synthetic` member present.
fn header_synthetic() -> Header {
    let mut h = header();
    h.probes = vec![];
    h.synthetic = Some(Synthetic {
        generator: "vmtrace synth".into(),
        workload: "lib/test_vmalloc.c".into(),
        tests: vec!["fix_size_alloc_test".into(), "full_fit_alloc_test".into()],
        params: [("mask".to_string(), 3u64), ("seed".to_string(), u64::MAX)]
            .into_iter()
            .collect(),
    });
    h
}

fn area(start: u64, size: u64, kind: AreaKind) -> VmallocArea {
    VmallocArea {
        start: KAddr(start),
        end: KAddr(start + size),
        size,
        kind,
        caller: None,
        pages: None,
        phys: None,
        flags: vec![],
    }
}

fn snapshot() -> VmallocSnapshot {
    let mut vmalloc = area(VSTART + 0xc000, 20480, AreaKind::Busy);
    vmalloc.caller = Some("kernel_clone+0x94/0x3e0".into());
    vmalloc.pages = Some(4);
    vmalloc.flags = vec!["vmalloc".into(), "N0=4".into()];
    let mut ioremap = area(VSTART + 0x5000, 8192, AreaKind::Busy);
    ioremap.caller = Some("acpi_os_map_iomem+0x1bc/0x1e0".into());
    ioremap.phys = Some("0x00000000000a0000".into());
    ioremap.flags = vec!["ioremap".into()];
    let mut module = area(VSTART + 0x347000, 20480, AreaKind::Busy);
    module.caller = Some("xt_alloc_table_info+0xfe/0x130 [x_tables]".into());
    module.pages = Some(4);
    module.flags = vec!["vmalloc".into(), "N0=4".into()];
    VmallocSnapshot {
        ts_start_ns: 713_742_295_272,
        ts_end_ns: 713_743_598_664,
        real_addresses: true,
        pools_drained: false,
        areas: vec![
            area(VSTART, 20480, AreaKind::Busy), // nothing after the size at all
            ioremap,
            vmalloc,
            module,
            area(VSTART + 0xc4000, 20480, AreaKind::Unpurged),
            area(VSTART + 0x400000, 65536, AreaKind::VmMapRam),
        ],
    }
}

fn ctx(ts_ns: u64) -> Ctx {
    Ctx {
        ts_ns,
        cpu: 1,
        tgid: 4242,
        pid: 4243,
        comm: "stress".into(),
    }
}

fn alloc(ts_ns: u64, addr: u64, size: u64) -> Alloc {
    Alloc {
        ctx: ctx(ts_ns),
        addr: KAddr(addr),
        size,
        align: 1,
        vstart: KAddr(VSTART),
        vend: KAddr(VEND),
        failed: 0,
    }
}

fn footer(reason: StopReason, command_exit_code: Option<i32>) -> Footer {
    Footer {
        end_boottime_ns: 715_854_652_215,
        reason,
        command_exit_code,
        events: EventCounts {
            alloc: 4,
            free: 2,
            purge: 2,
        },
        lost_per_cpu: vec![0, 3],
        lost_by_kind: EventCounts {
            alloc: 1,
            free: 2,
            purge: 0,
        },
        lost_total: 3,
        late_events: 0,
        kernel_run_stats: None,
        ladder: None,
    }
}

fn ladder_stats() -> LadderStats {
    LadderStats {
        events: LadderCounts {
            contention: 2,
            work: 1,
            pt_page: 1,
            latency: 1,
        },
        lost: LadderCounts::default(),
        stack_map_failures: 0,
        stack_read_failures: 1,
        contention_filtered: 100,
        contention_nested: 0,
        contention_known: 1,
        page_stack_walks: 5000,
        work_unmatched_end: 0,
        contention_by_class: LockClass::ALL
            .iter()
            .map(|&class| ClassTotal {
                class,
                count: 1,
                wait_ns: 700,
            })
            .collect(),
        backing_page_orders: vec![4000, 0, 2],
        purges_from_work: 1,
        purges_matched: 1,
        lock_holds: vec![ClassHolds {
            class: LockClass::NodeBusyLock,
            count: 3,
            hold_ns: 2_100,
            histogram: vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2],
        }],
        hold_nested: 1,
    }
}

fn run_stats() -> Vec<ProbeRunStats> {
    [
        ("vmalloc:alloc_vmap_area", 5),
        ("vmalloc:free_vmap_area_noflush", 4),
        ("vmalloc:purge_vmap_area_lazy", 2),
    ]
    .map(|(probe, run_count)| ProbeRunStats {
        probe: probe.into(),
        run_count,
        run_time_ns: u64::MAX,
    })
    .to_vec()
}

/// One trace holding every record kind and every optional/nullable variant the format has.
fn sample_records() -> Vec<Record> {
    let failed = Alloc {
        addr: KAddr(ENOENT_ADDR),
        failed: 1,
        ..alloc(1_000_000_300, 0, 8192)
    };
    // A negative `failed` (the field is a C int) must be representable too.
    let failed_negative = Alloc {
        addr: KAddr(VEND),
        failed: i32::MIN,
        ..alloc(1_000_000_350, 0, 8192)
    };
    let extremes = Alloc {
        ctx: Ctx {
            ts_ns: u64::MAX,
            cpu: u32::MAX,
            tgid: 0,
            pid: 0,
            comm: "kworker/u16:123".into(),
        },
        addr: KAddr(0),
        size: u64::MAX,
        align: u64::MAX,
        vstart: KAddr(0),
        vend: KAddr(u64::MAX),
        failed: i32::MAX,
    };
    vec![
        Record::Header(Box::new(header())),
        Record::Vmallocinfo(Box::new(snapshot())),
        Record::Alloc(alloc(1_000_000_000, VSTART + 0x170000, 73728)),
        Record::Free(Free {
            ctx: ctx(1_000_000_100),
            va_start: KAddr(VSTART + 0x170000),
            nr_lazy: 18,
            nr_lazy_max: 16384,
        }),
        Record::Purge(Purge {
            ctx: Ctx {
                comm: "kworker/0:1".into(),
                ..ctx(1_000_000_200)
            },
            start: KAddr(VSTART + 0x170000),
            end: KAddr(VSTART + 0x182000),
            npurged: 1,
        }),
        Record::Alloc(failed),
        Record::Alloc(failed_negative),
        // Drain with nothing lazy: the caller's ULONG_MAX..0.
        Record::Purge(Purge {
            ctx: ctx(1_000_000_400),
            start: KAddr(u64::MAX),
            end: KAddr(0),
            npurged: u32::MAX,
        }),
        Record::Free(Free {
            ctx: Ctx {
                comm: Default::default(),
                ..ctx(1_000_000_500)
            },
            va_start: KAddr(VSTART + 0xc000),
            nr_lazy: u64::MAX,
            nr_lazy_max: 0,
        }),
        Record::Alloc(extremes),
        Record::Contention(Box::new(Contention {
            ctx: ctx(1_000_000_600),
            lock: KAddr(0xffff888100055820),
            flags: 1,
            wait_ns: 1432,
            ret: 0,
            class: LockClass::NodeBusyLock,
            node: Some(0),
            stack_id: 17,
            stack: vec![
                "__pv_queued_spin_lock_slowpath+0x10e".into(),
                "_raw_spin_lock+0x3b".into(),
                "find_unlink_vmap_area+0x55".into(),
            ],
            probe_ns: Some(812),
        })),
        Record::Contention(Box::new(Contention {
            ctx: ctx(1_000_000_610),
            lock: KAddr(0xffffffff83b8da50),
            flags: 0x21,
            wait_ns: 1,
            ret: -4,
            class: LockClass::Other,
            node: None,
            stack_id: -17,
            stack: vec![],
            probe_ns: None,
        })),
        Record::Work(Box::new(Work {
            ctx: Ctx {
                comm: "kworker/0:1".into(),
                ..ctx(1_000_000_700)
            },
            function: "drain_vmap_area_work".into(),
            function_addr: KAddr(0xffffffff81609280),
            work: KAddr(0xffffffff83b8db00),
            start_ns: 1_000_000_150,
            duration_ns: 550,
            start_cpu: 0,
            nr_purged: None,
            flush_ns: Some(1_000_000_300),
        })),
        Record::Work(Box::new(Work {
            ctx: ctx(1_000_000_710),
            function: "purge_vmap_node".into(),
            function_addr: KAddr(0xffffffff816089d0),
            work: KAddr(0xffff888100054000),
            start_ns: 1_000_000_705,
            duration_ns: 5,
            start_cpu: 1,
            nr_purged: Some(12),
            flush_ns: None,
        })),
        Record::WorkStart(WorkStart {
            ctx: Ctx {
                comm: "kworker/0:1".into(),
                ..ctx(1_000_000_720)
            },
            function: "drain_vmap_area_work".into(),
            function_addr: KAddr(0xffffffff81609280),
            work: KAddr(0xffffffff83b8db00),
        }),
        Record::PtPage(PtPage {
            ctx: ctx(1_000_000_800),
            level: PtLevel::Pte,
            pfn: 0x1234,
            order: 0,
        }),
        Record::Latency(Latency {
            ctx: ctx(1_000_000_900),
            function: "alloc_vmap_area".into(),
            start_ns: 1_000_000_850,
            latency_ns: 50,
        }),
        Record::Meminfo(Meminfo {
            ts_ns: 1_000_001_000,
            page_tables_kb: 5244,
            vmalloc_used_kb: 40736,
        }),
        Record::Allocinfo(Box::new(AllocinfoSample {
            ts_ns: 1_000_001_100,
            total: Counts {
                bytes: 1 << 30,
                calls: 123_456,
            },
            pagetable: Counts {
                bytes: 60_817_408,
                calls: 14_848,
            },
            vmalloc_tags: vec![
                Tag {
                    key: TagKey {
                        file: "mm/vmalloc.c".into(),
                        line: 3159,
                        module: None,
                        function: "__get_vm_area_node".into(),
                    },
                    bytes: 14_680_064,
                    calls: 7,
                    accurate: true,
                    extra: Default::default(),
                },
                Tag {
                    key: TagKey {
                        file: "mm/vmalloc.c".into(),
                        line: 1068,
                        module: Some("x".into()),
                        function: "alloc_vmap_area".into(),
                    },
                    bytes: -4096,
                    calls: 0,
                    accurate: false,
                    extra: [("future".to_string(), "yes".to_string())]
                        .into_iter()
                        .collect(),
                },
            ],
            inaccurate: true,
            skipped_lines: 2,
        })),
        Record::Footer(Box::new(Footer {
            ladder: Some(ladder_stats()),
            kernel_run_stats: Some(run_stats()),
            ..footer(StopReason::CommandExited, Some(-1))
        })),
    ]
}

/// Footers for every stop reason, with and without an exit code.
fn more_footers() -> Vec<Record> {
    [
        (StopReason::Duration, None),
        (StopReason::Sigint, None),
        (StopReason::Sigterm, None),
        (StopReason::CommandExited, Some(0)),
        (StopReason::CommandExited, Some(i32::MAX)),
        (StopReason::Error, None),
        (StopReason::Rotated, None),
    ]
    .into_iter()
    .map(|(r, c)| Record::Footer(Box::new(footer(r, c))))
    .chain([Record::Footer(Box::new(Footer {
        kernel_run_stats: Some(vec![]),
        ..footer(StopReason::Duration, None)
    }))])
    .chain([Record::Header(Box::new(header_uncalibrated()))])
    .chain([Record::Header(Box::new(header_synthetic()))])
    .chain([Record::Vmallocinfo(Box::new(VmallocSnapshot {
        ts_start_ns: 0,
        ts_end_ns: 0,
        real_addresses: false,
        pools_drained: false,
        areas: vec![area(0xf841eac3, 20480, AreaKind::Busy)],
    }))])
    .collect()
}

fn write_trace(records: &[Record]) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new());
    for r in records {
        w.write(r).expect("writing to memory cannot fail");
    }
    assert_eq!(w.lines_written(), records.len() as u64);
    let bytes_written = w.bytes_written();
    let out = w.into_inner().unwrap();
    assert_eq!(bytes_written, out.len() as u64);
    out
}

fn lines(bytes: &[u8]) -> Vec<String> {
    std::str::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

fn to_value(r: &Record) -> Value {
    serde_json::to_value(r).unwrap()
}

fn errors(v: &Value) -> Vec<String> {
    common::line_errors(&common::schema_validator(), v)
}

fn assert_invalid(v: &Value, expect_in_error: &str) {
    let errs = errors(v);
    assert!(
        !errs.is_empty(),
        "the schema accepted a line it must refuse: {v}"
    );
    assert!(
        errs.iter().any(|e| e.contains(expect_in_error)),
        "expected an error mentioning `{expect_in_error}` for {v}, got {errs:#?}"
    );
}

fn read_all(bytes: &[u8]) -> Vec<Result<Record, ReadError>> {
    TraceReader::new(bytes).collect()
}

// ---------------------------------------------------------------------------------------------
// The schema itself
// ---------------------------------------------------------------------------------------------

#[test]
fn schema_is_valid_draft_2020_12() {
    let schema = common::schema_json();
    assert_eq!(
        schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
        "the schema must declare draft 2020-12"
    );
    // Compiling checks the schema against the draft 2020-12 meta-schema.
    let _ = common::schema_validator();
    assert!(jsonschema::meta::is_valid(&schema));
}

/// Walks every sub-schema with `properties`, calling `f(path, object_schema)`.
fn walk_objects(v: &Value, path: &str, f: &mut impl FnMut(&str, &serde_json::Map<String, Value>)) {
    match v {
        Value::Object(map) => {
            if map.contains_key("properties") {
                f(path, map);
            }
            for (k, child) in map {
                walk_objects(child, &format!("{path}/{k}"), f);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                walk_objects(child, &format!("{path}/{i}"), f);
            }
        }
        _ => {}
    }
}

#[test]
fn every_object_is_closed_and_every_field_documented() {
    let schema = common::schema_json();
    let mut objects = 0;
    walk_objects(&schema, "#", &mut |path, obj| {
        // `if`/`then` and the top-level discriminator only constrain members declared elsewhere.
        if path == "#" || path.ends_with("/if") || path.ends_with("/then") {
            return;
        }
        objects += 1;
        assert_eq!(
            obj.get("additionalProperties"),
            Some(&Value::Bool(false)),
            "{path} must set additionalProperties: false"
        );
        assert!(obj.contains_key("description"), "{path} has no description");
        for (name, prop) in obj["properties"].as_object().unwrap() {
            assert!(
                prop.get("description").and_then(Value::as_str).is_some(),
                "{path}/properties/{name} has no description"
            );
        }
        for req in obj
            .get("required")
            .and_then(Value::as_array)
            .unwrap_or(&vec![])
        {
            let req = req.as_str().unwrap();
            assert!(
                obj["properties"].get(req).is_some(),
                "{path} requires `{req}` but does not define it"
            );
        }
    });
    assert!(objects >= 13, "only {objects} object schemas found");
}

/// The optional members of the format are exactly those serde skips when `None`/empty; every
/// other member is written on every line and so must be required.
#[test]
fn only_skipped_fields_are_optional() {
    let schema = common::schema_json();
    let mut optional = Vec::new();
    walk_objects(&schema, "#", &mut |path, obj| {
        if path == "#" || path.ends_with("/if") || path.ends_with("/then") {
            return;
        }
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for name in obj["properties"].as_object().unwrap().keys() {
            if !required.contains(&name.as_str()) {
                optional.push(format!("{path}.{name}"));
            }
        }
    });
    optional.sort();
    assert_eq!(
        optional,
        [
            "#/$defs/allocinfo_tag.extra",
            "#/$defs/area.caller",
            "#/$defs/area.flags",
            "#/$defs/area.pages",
            "#/$defs/area.phys",
            "#/$defs/contention.probe_ns",
            "#/$defs/footer.command_exit_code",
            "#/$defs/footer.kernel_run_stats",
            "#/$defs/footer.ladder",
            "#/$defs/header.imported",
            "#/$defs/header.synthetic",
            "#/$defs/ladder_stats.hold_nested",
            "#/$defs/ladder_stats.lock_holds",
            "#/$defs/probe.attach",
            "#/$defs/probe.attach_fallback",
            "#/$defs/probe.logical",
            "#/$defs/probe.note",
            "#/$defs/probe.refused",
            "#/$defs/vmallocinfo.pools_drained",
            "#/$defs/work.flush_ns",
            "#/$defs/work.nr_purged",
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// What the writer produces validates
// ---------------------------------------------------------------------------------------------

#[test]
fn every_record_kind_validates() {
    let mut records = sample_records();
    records.extend(more_footers());
    let bytes = write_trace(&records);
    let n = common::assert_bytes_valid(&bytes);
    assert_eq!(n, records.len());
    // Every kind really was exercised.
    let kinds: std::collections::BTreeSet<String> = records
        .iter()
        .map(|r| to_value(r)["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds.len(), common::KINDS.len(), "{kinds:?}");
}

#[test]
fn events_carry_the_context_flattened() {
    let v = to_value(&sample_records()[2]);
    let keys: std::collections::BTreeSet<&str> =
        v.as_object().unwrap().keys().map(String::as_str).collect();
    let expected: std::collections::BTreeSet<&str> = [
        "type", "ts_ns", "cpu", "tgid", "pid", "comm", "addr", "size", "align", "vstart", "vend",
        "failed",
    ]
    .into();
    assert_eq!(keys, expected);
    assert_eq!(v["addr"], "0xffffc90000170000");
}

#[test]
fn optional_fields_are_omitted_and_nullable_ones_are_null() {
    let snap = to_value(&Record::Vmallocinfo(Box::new(snapshot())));
    let bare = &snap["areas"][0];
    for k in ["caller", "pages", "phys", "flags"] {
        assert!(
            bare.get(k).is_none(),
            "`{k}` written although empty: {bare}"
        );
    }
    let f = to_value(&Record::Footer(Box::new(footer(StopReason::Sigint, None))));
    assert!(f.get("command_exit_code").is_none());
    assert!(f.get("kernel_run_stats").is_none());
    let h = to_value(&Record::Header(Box::new(header_uncalibrated())));
    for k in ["lazy_max_pages_tracepoint", "vmalloc_start", "vmalloc_end"] {
        assert_eq!(h["vmap"][k], Value::Null, "`{k}`");
    }
    assert!(
        h.get("synthetic").is_none(),
        "`synthetic` written for a recording"
    );
    assert!(errors(&h).is_empty(), "{:?}", errors(&h));
}

#[test]
fn real_recording_validates_if_given() {
    // `VMTRACE_VALIDATE_TRACE=/path/to/trace.jsonl cargo test --test trace_schema` checks a trace
    // recorded with `vmtrace record`; without the variable there is nothing to do.
    if let Some(path) = std::env::var_os("VMTRACE_VALIDATE_TRACE") {
        let n = common::assert_trace_valid(std::path::Path::new(&path));
        assert!(n >= 2, "only {n} lines");
    }
}

#[test]
fn a_partial_last_line_is_skipped_but_a_bad_complete_line_is_not() {
    let bytes = write_trace(&sample_records());
    let cut = &bytes[..bytes.len() - 30];
    assert_eq!(common::assert_bytes_valid(cut), sample_records().len() - 1);
    // Only the newline missing: the record is complete and is checked.
    let cut = &bytes[..bytes.len() - 1];
    assert_eq!(common::assert_bytes_valid(cut), sample_records().len());

    let mut bad = lines(&bytes);
    bad[3] = bad[3].replace("\"nr_lazy\"", "\"nr_lazzy\"");
    let bad = bad.join("\n") + "\n";
    let msg = std::panic::catch_unwind(|| common::assert_bytes_valid(bad.as_bytes()))
        .expect_err("a misspelt member must fail")
        .downcast::<String>()
        .unwrap();
    assert!(msg.contains("line 4"), "{msg}");
    assert!(msg.contains("nr_lazzy"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// What the format forbids is refused
// ---------------------------------------------------------------------------------------------

fn sample(kind: &str) -> Value {
    sample_records()
        .iter()
        .map(to_value)
        .find(|v| v["type"] == kind)
        .unwrap()
}

#[test]
fn extra_members_are_refused() {
    for kind in common::KINDS {
        let mut v = sample(kind);
        v["tyep"] = json!(kind);
        assert_invalid(&v, "tyep");
    }
    let mut h = sample("header");
    h["system"]["page_sise"] = json!(4096);
    assert_invalid(&h, "page_sise");
    let mut h = sample("header");
    h["probes"][0]["fields"][0]["sign"] = json!(true);
    assert_invalid(&h, "sign");
    let mut s = sample("vmallocinfo");
    s["areas"][2]["node"] = json!(0);
    assert_invalid(&s, "node");
    let mut f = sample("footer");
    f["events"]["vfree"] = json!(1);
    assert_invalid(&f, "vfree");
    // The context is flattened: a nested `ctx` object is not the format.
    let mut a = sample("alloc");
    a["ctx"] = json!({"ts_ns": 1});
    assert_invalid(&a, "ctx");
}

#[test]
fn addresses_must_be_canonical_hex_strings() {
    for (bad, why) in [
        (json!(18446612682069442560u64), "number"),
        (json!("ffffc90000170000"), "no 0x"),
        (json!("0XFFFFC90000170000"), "upper-case prefix"),
        (json!("0xFFFFC90000170000"), "upper-case digits"),
        (json!("0x00000000000a0000"), "leading zeros"),
        (json!("0x"), "no digits"),
        (json!("0x1ffffc90000170000"), "17 digits"),
        (json!(null), "null"),
    ] {
        let mut a = sample("alloc");
        a["addr"] = bad.clone();
        assert!(!errors(&a).is_empty(), "alloc.addr {bad} ({why}) accepted");
        let mut s = sample("vmallocinfo");
        s["areas"][1]["start"] = bad.clone();
        assert!(!errors(&s).is_empty(), "area.start {bad} ({why}) accepted");
        if !bad.is_null() {
            let mut h = sample("header");
            h["vmap"]["vmalloc_end"] = bad.clone();
            assert!(!errors(&h).is_empty(), "vmalloc_end {bad} ({why}) accepted");
        }
    }
    let mut a = sample("alloc");
    a["addr"] = json!(18446612682069442560u64);
    assert_invalid(&a, "addr");
    for good in ["0x0", "0x1", "0xffffffffffffffff", "0xa0000"] {
        let mut a = sample("alloc");
        a["vstart"] = json!(good);
        assert!(errors(&a).is_empty(), "{good} refused: {:?}", errors(&a));
    }
}

#[test]
fn missing_required_members_are_refused() {
    for kind in common::KINDS {
        let full = sample(kind);
        for key in full.as_object().unwrap().keys() {
            if [
                "command_exit_code",
                "kernel_run_stats",
                "ladder",
                "flush_ns",
                "probe_ns",
            ]
            .contains(&key.as_str())
            {
                continue;
            }
            let mut v = full.clone();
            v.as_object_mut().unwrap().remove(key);
            assert!(
                !errors(&v).is_empty(),
                "{kind} without `{key}` was accepted"
            );
        }
    }
    let mut a = sample("alloc");
    a.as_object_mut().unwrap().remove("size");
    assert_invalid(&a, "\"size\" is a required property");
    let mut h = sample("header");
    h["vmap"].as_object_mut().unwrap().remove("vmalloc_start");
    assert_invalid(&h, "vmalloc_start");
    let mut s = sample("vmallocinfo");
    s["areas"][0].as_object_mut().unwrap().remove("kind");
    assert_invalid(&s, "kind");
}

/// A record kind, a corruption of its sample, and a word the schema error must mention.
type Case = (&'static str, fn(&mut Value), &'static str);

#[test]
fn wrong_types_and_ranges_are_refused() {
    let cases: Vec<Case> = vec![
        ("alloc", |v| v["size"] = json!(-1), "size"),
        ("alloc", |v| v["size"] = json!(1.5), "size"),
        ("alloc", |v| v["size"] = json!("4096"), "size"),
        ("alloc", |v| v["cpu"] = json!(4294967296u64), "cpu"),
        ("alloc", |v| v["failed"] = json!(2147483648u64), "failed"),
        ("alloc", |v| v["failed"] = json!(true), "failed"),
        (
            "alloc",
            |v| v["comm"] = json!("a-comm-longer-than-16"),
            "comm",
        ),
        ("purge", |v| v["npurged"] = json!(4294967296u64), "npurged"),
        ("free", |v| v["nr_lazy"] = json!(null), "nr_lazy"),
        ("header", |v| v["version"] = json!(3), "version"),
        ("header", |v| v["format"] = json!("perf"), "format"),
        ("header", |v| v["clock"] = json!("CLOCK_MONOTONIC"), "clock"),
        (
            "header",
            |v| v["probes"][0]["rung"] = json!("uprobe"),
            "rung",
        ),
        (
            "header",
            |v| v["probes"][0]["fields"][0]["offset"] = json!(65536),
            "offset",
        ),
        (
            "header",
            |v| v["probes"][0]["fields"][0]["size"] = json!(256),
            "size",
        ),
        (
            "header",
            |v| v["vmap"]["nr_vmap_nodes"] = json!(0),
            "nr_vmap_nodes",
        ),
        (
            "header",
            |v| v["vmap"]["lazy_max_pages_tracepoint"] = json!(-1),
            "lazy_max",
        ),
        ("header", |v| v["system"]["btf"] = json!(1), "btf"),
        (
            "vmallocinfo",
            |v| v["areas"][0]["kind"] = json!("lazy"),
            "kind",
        ),
        ("vmallocinfo", |v| v["areas"][0]["end"] = json!(null), "end"),
        (
            "vmallocinfo",
            |v| v["areas"][1]["phys"] = json!(655360),
            "phys",
        ),
        (
            "vmallocinfo",
            |v| v["areas"][4]["caller"] = json!("f+0x1/0x2"),
            "caller",
        ),
        (
            "vmallocinfo",
            |v| v["areas"][5]["flags"] = json!(["vmap"]),
            "flags",
        ),
        ("footer", |v| v["reason"] = json!("sigkill"), "reason"),
        (
            "footer",
            |v| v["lost_per_cpu"] = json!([0, -1]),
            "lost_per_cpu",
        ),
        (
            "footer",
            |v| v["command_exit_code"] = json!(null),
            "command_exit_code",
        ),
    ];
    for (kind, mutate, expect) in cases {
        let mut v = sample(kind);
        mutate(&mut v);
        assert_invalid(&v, expect);
    }
}

#[test]
fn unknown_or_missing_type_is_refused() {
    let mut v = sample("alloc");
    v["type"] = json!("mmap");
    assert!(!errors(&v).is_empty());
    v.as_object_mut().unwrap().remove("type");
    assert_invalid(&v, "\"type\" is a required property");
    // A record of one kind labelled as another fails too.
    let mut v = sample("free");
    v["type"] = json!("purge");
    assert!(!errors(&v).is_empty());
    assert!(!errors(&json!([1, 2])).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Round trip through TraceWriter and TraceReader
// ---------------------------------------------------------------------------------------------

#[test]
fn every_record_round_trips() {
    let records = sample_records();
    let bytes = write_trace(&records);
    assert_eq!(lines(&bytes).len(), records.len(), "one record per line");
    assert!(bytes.ends_with(b"\n"));
    let mut reader = TraceReader::new(&bytes[..]);
    assert_eq!(
        Record::Header(Box::new(reader.read_header().unwrap())),
        records[0]
    );
    assert_eq!(reader.line(), 1);
    let rest: Vec<Record> = reader.by_ref().map(Result::unwrap).collect();
    assert_eq!(rest, records[1..]);
    assert_eq!(reader.line(), records.len());

    // Iterating without read_header yields the header as the first record.
    let again: Vec<Record> = read_all(&bytes).into_iter().map(Result::unwrap).collect();
    assert_eq!(again, records);

    // Every other variant, one at a time behind a header.
    for r in more_footers() {
        let trace = [Record::Header(Box::new(header())), r.clone()];
        let back: Vec<Record> = read_all(&write_trace(&trace))
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(back, trace);
    }
}

#[test]
fn a_trace_cut_mid_line_reads_up_to_its_last_complete_line() {
    let records = sample_records();
    let bytes = write_trace(&records);
    let n = records.len();
    // Cut inside the last line (the footer): SIGKILL while it was being written.
    let got = read_all(&bytes[..bytes.len() - 20]);
    assert_eq!(got.len(), n);
    for (i, r) in got[..n - 1].iter().enumerate() {
        assert_eq!(r.as_ref().unwrap(), &records[i], "line {}", i + 1);
    }
    match &got[n - 1] {
        Err(e @ ReadError::Truncated { line }) => {
            assert_eq!(*line, n);
            assert_eq!(e.line(), n);
        }
        other => panic!("expected Truncated at line {n}, got {other:?}"),
    }

    // Cut inside an event line: everything before it still reads.
    let cut_at = lines(&bytes)[..4]
        .iter()
        .map(|l| l.len() + 1)
        .sum::<usize>()
        + 10;
    let got = read_all(&bytes[..cut_at]);
    assert_eq!(got.len(), 5);
    assert!(got[..4].iter().all(Result::is_ok));
    assert!(
        matches!(got[4], Err(ReadError::Truncated { line: 5 })),
        "{:?}",
        got[4]
    );

    // Only the final newline missing: the last record is complete and reads normally.
    let got = read_all(&bytes[..bytes.len() - 1]);
    assert_eq!(got.len(), n);
    assert_eq!(got[n - 1].as_ref().unwrap(), &records[n - 1]);

    // A header cut short is reported as truncated, not as a missing header.
    let got = TraceReader::new(&bytes[..50]).read_header();
    assert!(
        matches!(got, Err(ReadError::Truncated { line: 1 })),
        "{got:?}"
    );
}

#[test]
fn a_bad_line_in_the_middle_is_a_json_error_with_its_line_number() {
    let bytes = write_trace(&sample_records());
    let mut ls = lines(&bytes);
    ls[4] = ls[4][..ls[4].len() / 2].to_string(); // line 5, cut but followed by more lines
    let text = ls.join("\n") + "\n";
    let got = read_all(text.as_bytes());
    assert!(got[..4].iter().all(Result::is_ok));
    match &got[4] {
        Err(e @ ReadError::Json { line: 5, .. }) => {
            assert_eq!(e.line(), 5);
            assert!(e.to_string().starts_with("line 5:"), "{e}");
        }
        other => panic!("expected Json at line 5, got {other:?}"),
    }
    // The reader goes on after a bad line; later records still parse.
    assert!(got[5..].iter().all(Result::is_ok));

    // Valid JSON that is not a record (unknown kind, address as a number) is a Json error too.
    for bad in [
        r#"{"type":"mmap","ts_ns":1}"#.to_string(),
        to_value(&sample_records()[2])
            .as_object()
            .map(|o| {
                let mut o = o.clone();
                o.insert("addr".into(), json!(18446612682069442560u64));
                serde_json::to_string(&o).unwrap()
            })
            .unwrap(),
    ] {
        let mut ls = lines(&bytes);
        ls[2] = bad;
        let text = ls.join("\n") + "\n";
        let got = read_all(text.as_bytes());
        assert!(
            matches!(got[2], Err(ReadError::Json { line: 3, .. })),
            "{:?}",
            got[2]
        );
    }
}

#[test]
fn blank_lines_are_skipped_but_counted() {
    let bytes = write_trace(&sample_records()[..3]);
    let ls = lines(&bytes);
    let text = format!("{}\n\n{}\n{{\"type\":\n{}\n", ls[0], ls[1], ls[2]);
    let got = read_all(text.as_bytes());
    assert_eq!(got.len(), 4);
    assert!(
        matches!(got[2], Err(ReadError::Json { line: 4, .. })),
        "{:?}",
        got[2]
    );
}

#[test]
fn a_trace_must_start_with_a_header() {
    let records = sample_records();
    let bytes = write_trace(&records[2..]);
    let mut reader = TraceReader::new(&bytes[..]);
    match reader.read_header() {
        Err(e @ ReadError::NoHeader { line: 1, .. }) => {
            assert!(e.to_string().contains("`alloc`"), "{e}");
        }
        other => panic!("expected NoHeader, got {other:?}"),
    }
    match read_all(&bytes).first() {
        Some(Err(ReadError::NoHeader { line: 1, found })) => assert_eq!(found, "alloc"),
        other => panic!("expected NoHeader, got {other:?}"),
    }
    let snapshot_first = write_trace(&records[1..2]);
    assert!(matches!(
        TraceReader::new(&snapshot_first[..]).read_header(),
        Err(ReadError::NoHeader { line: 1, ref found }) if found == "vmallocinfo"
    ));
    match TraceReader::new(&b""[..]).read_header() {
        Err(ReadError::NoHeader { line: 1, found }) => assert_eq!(found, "end of file"),
        other => panic!("expected NoHeader for an empty file, got {other:?}"),
    }
}

#[test]
fn unknown_versions_and_formats_are_refused() {
    let mut h = header();
    h.version = VERSION + 1;
    let bytes = write_trace(&[Record::Header(Box::new(h))]);
    match TraceReader::new(&bytes[..]).read_header() {
        Err(e @ ReadError::UnsupportedVersion { found, .. }) => {
            assert_eq!(found, VERSION + 1);
            assert_eq!(e.line(), 1);
        }
        other => panic!("expected UnsupportedVersion, got {other:?}"),
    }
    assert!(matches!(
        read_all(&bytes).first(),
        Some(Err(ReadError::UnsupportedVersion { found: 3, .. }))
    ));
    let mut h = header();
    h.version = 0;
    let bytes = write_trace(&[Record::Header(Box::new(h))]);
    assert!(matches!(
        TraceReader::new(&bytes[..]).read_header(),
        Err(ReadError::UnsupportedVersion { found: 0, .. })
    ));

    let mut h = header();
    h.format = "perf-script".into();
    let bytes = write_trace(&[Record::Header(Box::new(h))]);
    match TraceReader::new(&bytes[..]).read_header() {
        Err(ReadError::WrongFormat { found, .. }) => assert_eq!(found, "perf-script"),
        other => panic!("expected WrongFormat, got {other:?}"),
    }
}
