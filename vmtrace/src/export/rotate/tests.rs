use super::*;
use crate::record::Pipeline;
use crate::trace::{Alloc, Ctx, Free, KAddr, Purge, TraceReader};

const PAGE: u64 = 4096;
const BASE: u64 = 0xffff_c900_0000_0000;

#[test]
fn sizes_parse_with_binary_units() {
    for (text, want) in [
        ("1", 1),
        ("4096", 4096),
        ("64K", 64 << 10),
        ("64k", 64 << 10),
        ("64M", 64 << 20),
        ("64MiB", 64 << 20),
        ("64mb", 64 << 20),
        ("1G", 1 << 30),
        ("1Gi", 1 << 30),
        ("2T", 2 << 40),
        (" 8M ", 8 << 20),
    ] {
        assert_eq!(parse_size(text), Ok(want), "{text}");
    }
}

#[test]
fn bad_sizes_say_what_is_accepted() {
    for text in ["", "M", "1.5G", "-1M", "10X", "10 MB extra", "0", "0M"] {
        let err = parse_size(text).expect_err(text);
        assert!(err.contains(text.trim()), "{err}");
    }
    assert!(parse_size("99999999999T")
        .unwrap_err()
        .contains("too large"));
    assert!(parse_size("64Q").unwrap_err().contains("K, M, G or T"));
}

fn ctx(ts: u64) -> Ctx {
    Ctx {
        ts_ns: ts,
        cpu: 0,
        tgid: 1,
        pid: 1,
        comm: "t".into(),
    }
}

fn alloc(ts: u64, addr: u64, size: u64) -> Record {
    Record::Alloc(Alloc {
        ctx: ctx(ts),
        addr: KAddr(addr),
        size,
        align: PAGE,
        vstart: KAddr(BASE),
        vend: KAddr(BASE + (1 << 40)),
        failed: 0,
    })
}

fn free(ts: u64, addr: u64) -> Record {
    Record::Free(Free {
        ctx: ctx(ts),
        va_start: KAddr(addr),
        nr_lazy: 0,
        nr_lazy_max: 1 << 15,
    })
}

fn purge(ts: u64, npurged: u32) -> Record {
    Record::Purge(Purge {
        ctx: ctx(ts),
        start: KAddr(BASE),
        end: KAddr(BASE + (1 << 30)),
        npurged,
    })
}

fn area(start: u64, size: u64, kind: AreaKind) -> VmallocArea {
    VmallocArea {
        start: KAddr(start),
        end: KAddr(start + size),
        size,
        kind,
        caller: (kind == AreaKind::Busy).then(|| "kernel_clone+0x94/0x3e0".into()),
        pages: (kind == AreaKind::Busy).then_some(size / PAGE - 1),
        phys: None,
        flags: if kind == AreaKind::Busy {
            vec!["vmalloc".into()]
        } else {
            Vec::new()
        },
    }
}

fn seed() -> VmallocSnapshot {
    VmallocSnapshot {
        ts_start_ns: 1_000,
        ts_end_ns: 1_100,
        real_addresses: true,
        pools_drained: false,
        areas: vec![
            area(BASE, 5 * PAGE, AreaKind::Busy),
            area(BASE + 8 * PAGE, 2 * PAGE, AreaKind::Unpurged),
            area(BASE + 16 * PAGE, 4 * PAGE, AreaKind::VmMapRam),
        ],
    }
}

/// `(start, size, kind)` of every area, by address.
fn shape(s: &VmallocSnapshot) -> Vec<(u64, u64, AreaKind)> {
    s.areas
        .iter()
        .map(|a| (a.start.0, a.size, a.kind))
        .collect()
}

#[test]
fn live_areas_follow_allocs_frees_and_purges() {
    let mut live = LiveAreas::new(&seed());
    // Before the read started: already in the snapshot, so ignored.
    live.apply(&free(999, BASE));
    assert_eq!(shape(&live.snapshot()), shape(&seed()));

    live.apply(&alloc(2_000, BASE + 32 * PAGE, 3 * PAGE));
    live.apply(&free(2_100, BASE)); // a seeded busy area becomes lazy, losing its details
    live.apply(&free(2_200, BASE + 16 * PAGE));
    live.apply(&free(2_300, BASE + 64 * PAGE)); // never seen
    let s = live.snapshot();
    assert_eq!(
        shape(&s),
        [
            (BASE, 5 * PAGE, AreaKind::Unpurged),
            (BASE + 8 * PAGE, 2 * PAGE, AreaKind::Unpurged),
            (BASE + 16 * PAGE, 4 * PAGE, AreaKind::Unpurged),
            (BASE + 32 * PAGE, 3 * PAGE, AreaKind::Busy),
        ]
    );
    assert!(s.areas.iter().all(|a| a.kind == AreaKind::Busy
        || (a.caller.is_none() && a.pages.is_none() && a.flags.is_empty())));
    assert_eq!(live.unknown_frees, 1);
    assert_eq!((s.ts_start_ns, s.ts_end_ns), (2_300, 2_300));

    live.apply(&purge(2_400, 3));
    assert_eq!(
        shape(&live.snapshot()),
        [(BASE + 32 * PAGE, 3 * PAGE, AreaKind::Busy)]
    );
}

#[test]
fn a_free_landing_during_a_purge_stays_lazy() {
    // The kernel detached the lazy lists before the last free, so its event counts only the
    // seeded lazy area and the first free: the second stays lazy for the next purge.
    let mut live = LiveAreas::new(&seed());
    live.apply(&free(2_000, BASE + 16 * PAGE));
    live.apply(&free(2_100, BASE));
    live.apply(&purge(2_200, 2));
    assert_eq!(
        shape(&live.snapshot()),
        [(BASE, 5 * PAGE, AreaKind::Unpurged)]
    );
    // The next purge takes it, and more than is lazy takes no busy area.
    live.apply(&alloc(2_300, BASE + 32 * PAGE, 3 * PAGE));
    live.apply(&purge(2_400, 5));
    assert_eq!(
        shape(&live.snapshot()),
        [(BASE + 32 * PAGE, 3 * PAGE, AreaKind::Busy)]
    );
}

#[test]
fn a_lazy_area_reused_before_its_purge_event_counts_toward_that_purge() {
    // The purge freed the seeded lazy area and an allocation took its range before the purge
    // emitted its event (npurged 2: that area and the first free). The second free raced the
    // detach and stays lazy: the purge must not take it in place of the reused area.
    let mut live = LiveAreas::new(&seed());
    live.apply(&free(2_000, BASE + 16 * PAGE));
    live.apply(&alloc(2_050, BASE + 8 * PAGE, 2 * PAGE));
    live.apply(&free(2_100, BASE));
    live.apply(&purge(2_200, 2));
    assert_eq!(
        shape(&live.snapshot()),
        [
            (BASE, 5 * PAGE, AreaKind::Unpurged),
            (BASE + 8 * PAGE, 2 * PAGE, AreaKind::Busy),
        ]
    );
    // The credit lasts one purge: the next takes what it says.
    live.apply(&purge(2_300, 1));
    assert_eq!(
        shape(&live.snapshot()),
        [(BASE + 8 * PAGE, 2 * PAGE, AreaKind::Busy)]
    );
}

#[test]
fn an_allocation_replaces_stale_overlapping_areas() {
    let mut live = LiveAreas::new(&seed());
    // Overlaps the end of the first busy area and all of the lazy one: both must be stale
    // (a lost free and a lost purge), since the kernel never hands out overlapping areas.
    live.apply(&alloc(2_000, BASE + 4 * PAGE, 6 * PAGE));
    assert_eq!(
        shape(&live.snapshot()),
        [
            (BASE + 4 * PAGE, 6 * PAGE, AreaKind::Busy),
            (BASE + 16 * PAGE, 4 * PAGE, AreaKind::VmMapRam),
        ]
    );
    // Failed attempts change nothing.
    let mut failed = alloc(2_100, BASE + 16 * PAGE, PAGE);
    if let Record::Alloc(a) = &mut failed {
        a.failed = -12;
    }
    live.apply(&failed);
    assert_eq!(live.len(), 2);
}

proptest::proptest! {
    /// Against an oracle of fixed slots: whatever the order of allocs, frees and purges, the
    /// list holds exactly the busy and the lazily freed slots.
    #[test]
    fn live_areas_match_a_slot_oracle(ops in proptest::collection::vec((0u8..3, 0u64..16), 0..200)) {
        let empty = VmallocSnapshot { ts_start_ns: 0, ts_end_ns: 0, real_addresses: true, pools_drained: false, areas: vec![] };
        let mut live = LiveAreas::new(&empty);
        // None: free; Some(false): busy; Some(true): lazy.
        let mut slots = [None::<bool>; 16];
        for (i, (op, slot)) in ops.iter().enumerate() {
            let ts = 10 + i as u64;
            let addr = BASE + slot * 4 * PAGE;
            match op {
                0 if slots[*slot as usize].is_none() => {
                    live.apply(&alloc(ts, addr, 2 * PAGE));
                    slots[*slot as usize] = Some(false);
                }
                1 if slots[*slot as usize] == Some(false) => {
                    live.apply(&free(ts, addr));
                    slots[*slot as usize] = Some(true);
                }
                2 => {
                    let lazy = slots.iter().filter(|s| **s == Some(true)).count() as u32;
                    live.apply(&purge(ts, lazy));
                    for s in &mut slots {
                        if *s == Some(true) {
                            *s = None;
                        }
                    }
                }
                _ => {}
            }
        }
        let want: Vec<(u64, u64, AreaKind)> = slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|lazy| (
                BASE + i as u64 * 4 * PAGE,
                2 * PAGE,
                if lazy { AreaKind::Unpurged } else { AreaKind::Busy },
            )))
            .collect();
        proptest::prop_assert_eq!(shape(&live.snapshot()), want);
    }
}

fn header() -> Header {
    let mut h = crate::synth::header(&crate::synth::SynthParams::default(), &[], vec![]);
    h.synthetic = None;
    h
}

/// Reads a whole file: header, snapshot, events, footer (panics on anything else).
fn read(path: &Path) -> (Header, VmallocSnapshot, Vec<Record>, crate::trace::Footer) {
    let f = File::open(path).expect("open");
    let mut r = TraceReader::new(io::BufReader::new(f));
    let header = r.read_header().expect("header");
    let Some(Ok(Record::Vmallocinfo(snap))) = r.next() else {
        panic!("{}: no snapshot on line 2", path.display());
    };
    let mut events = Vec::new();
    let mut footer = None;
    for rec in r {
        match rec.expect("record") {
            Record::Footer(f) => footer = Some(*f),
            other => {
                assert!(footer.is_none(), "an event after the footer");
                events.push(other);
            }
        }
    }
    (
        header,
        *snap,
        events,
        footer.unwrap_or_else(|| panic!("{} has no footer", path.display())),
    )
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".jsonl"))
        .collect();
    v.sort();
    v
}

/// Allocs and frees of 64 slots in turn, with a purge every 50 events.
fn workload(n: u64) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let ts = 10_000 + i * 10;
            let addr = BASE + (1 << 20) + (i / 2 % 64) * 8 * PAGE;
            if i % 50 == 49 {
                // Every area freed so far is purged: a purge that raced no free.
                purge(ts, u32::MAX)
            } else if i % 2 == 0 {
                alloc(ts, addr, 4 * PAGE)
            } else {
                free(ts, addr)
            }
        })
        .collect()
}

#[test]
fn rotated_files_each_stand_alone_and_together_hold_every_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = RotateOptions {
        dir: dir.path().join("traces"),
        max_bytes: 16 << 10,
        compression: Compression::None,
        keep: 0,
    };
    let mut r =
        Rotating::start(opts, header(), &seed(), ProbeCounters::default(), 0).expect("start");
    let mut pipeline = Pipeline::new(1, true);
    let events = workload(1_000);
    for e in &events {
        pipeline.push(e.clone());
    }
    let mut lost_so_far = 0u64;
    // Each rotation reads the counters once: 3 more lost allocations on CPU 0 each time.
    let mut counters = || {
        lost_so_far += 3;
        Ok(ProbeCounters {
            lost: vec![vec![lost_so_far, 0]],
            ..ProbeCounters::default()
        })
    };
    // Half now, the rest later: a rotation may happen inside either batch.
    r.emit(&mut pipeline, 10_000 + 500 * 10, &mut counters)
        .expect("emit");
    r.emit(&mut pipeline, u64::MAX, &mut counters)
        .expect("emit");
    let rotations = r.rotations;
    let last_counters = ProbeCounters {
        lost: vec![vec![lost_so_far + 1, 0]],
        ..ProbeCounters::default()
    };
    let last = r
        .finish(StopReason::Sigterm, 0, &last_counters)
        .expect("finish");

    let paths = files(dir.path().join("traces").as_path());
    assert!(paths.len() >= 3, "{} files", paths.len());
    assert_eq!(paths.len() as u64, rotations + 1);
    assert_eq!(paths.last(), Some(&last));

    // Replaying the files in turn from the first snapshot must reach each next snapshot.
    let mut replayed = LiveAreas::new(&seed());
    let mut all = Vec::new();
    let mut lost_total = 0;
    for (i, p) in paths.iter().enumerate() {
        let (h, snap, evs, footer) = read(p);
        assert_eq!(h.vmap, header().vmap, "{}", p.display());
        if i == 0 {
            assert_eq!(snap, seed());
        } else {
            assert_eq!(shape(&snap), shape(&replayed.snapshot()), "{}", p.display());
            let prev_last = all.last().and_then(Record::ts_ns).expect("events");
            assert_eq!(snap.ts_start_ns, prev_last);
        }
        let size = std::fs::metadata(p).expect("size").len();
        let want_reason = if i + 1 == paths.len() {
            StopReason::Sigterm
        } else {
            // Full, but by no more than one event line and the footer.
            assert!(size >= 16 << 10, "{}: {size} bytes", p.display());
            assert!(size < (16 << 10) + 4096, "{}: {size} bytes", p.display());
            StopReason::Rotated
        };
        assert_eq!(footer.reason, want_reason);
        let count = |k: fn(&Record) -> bool| evs.iter().filter(|e| k(e)).count() as u64;
        assert_eq!(
            footer.events.alloc,
            count(|e| matches!(e, Record::Alloc(_)))
        );
        assert_eq!(footer.events.free, count(|e| matches!(e, Record::Free(_))));
        assert_eq!(
            footer.events.purge,
            count(|e| matches!(e, Record::Purge(_)))
        );
        assert!(!evs.is_empty());
        lost_total += footer.lost_total;
        for e in &evs {
            replayed.apply(e);
        }
        all.extend(evs);
    }
    assert_eq!(
        all, events,
        "events lost, duplicated or reordered across files"
    );
    // Every file's losses are its own; together they are the probes' total.
    assert_eq!(lost_total, lost_so_far + 1);
}

#[test]
fn keep_deletes_the_oldest_files_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Two files of an earlier run, and files that are not ours.
    for name in [
        "vmtrace-20000101T000000Z-000001.jsonl",
        "vmtrace-20000101T000000Z-000002.jsonl",
        "notes.txt",
        "other.jsonl",
    ] {
        std::fs::write(dir.path().join(name), "x\n").expect("write");
    }
    let opts = RotateOptions {
        dir: dir.path().to_path_buf(),
        max_bytes: 4 << 10,
        compression: Compression::None,
        keep: 2,
    };
    let mut r =
        Rotating::start(opts, header(), &seed(), ProbeCounters::default(), 0).expect("start");
    // Keeping 2 with one new file: the older of the earlier run's files is gone already.
    assert!(!dir
        .path()
        .join("vmtrace-20000101T000000Z-000001.jsonl")
        .exists());
    assert!(dir
        .path()
        .join("vmtrace-20000101T000000Z-000002.jsonl")
        .exists());

    let mut pipeline = Pipeline::new(1, true);
    for e in workload(400) {
        pipeline.push(e);
    }
    r.emit(
        &mut pipeline,
        u64::MAX,
        &mut || Ok(ProbeCounters::default()),
    )
    .expect("emit");
    assert!(r.rotations >= 4, "{} rotations", r.rotations);
    let current = r.current_path().to_path_buf();
    r.finish(StopReason::Sigint, 0, &ProbeCounters::default())
        .expect("finish");

    let names: Vec<String> = files(dir.path())
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let ours: Vec<&String> = names.iter().filter(|n| n.starts_with("vmtrace-")).collect();
    assert_eq!(ours.len(), 2, "{names:?}");
    assert!(
        ours.iter().all(|n| !n.starts_with("vmtrace-2000")),
        "{names:?}"
    );
    assert_eq!(
        ours.last().map(|n| n.as_str()),
        current.file_name().and_then(|n| n.to_str())
    );
    assert!(names.contains(&"other.jsonl".to_string()));
    assert!(dir.path().join("notes.txt").exists());
}

#[test]
fn a_name_taken_by_a_restart_in_the_same_second_is_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut seq = 0;
    let (a, _) =
        create_next(dir.path(), "20250101T000000Z", &mut seq, Compression::None).expect("first");
    let mut seq = 0;
    let (b, _) =
        create_next(dir.path(), "20250101T000000Z", &mut seq, Compression::None).expect("second");
    assert_ne!(a, b);
    assert_eq!(seq, 2);
    assert!(b.to_string_lossy().ends_with("-000002.jsonl"));
}

/// With --compress each file is a compressed trace that stands alone: every reader opens it,
/// the events of all files are the events pushed, and the files are much smaller than the
/// JSON they hold.
#[test]
fn compressed_files_stand_alone_and_hold_every_event() {
    for kind in [Compression::Zstd, Compression::Gzip] {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = RotateOptions {
            dir: dir.path().to_path_buf(),
            max_bytes: 16 << 10,
            compression: kind,
            keep: 0,
        };
        let mut r =
            Rotating::start(opts, header(), &seed(), ProbeCounters::default(), 0).expect("start");
        let mut pipeline = Pipeline::new(1, true);
        let events = workload(1_000);
        for e in &events {
            pipeline.push(e.clone());
        }
        r.emit(
            &mut pipeline,
            u64::MAX,
            &mut || Ok(ProbeCounters::default()),
        )
        .expect("emit");
        assert!(r.rotations >= 3, "{kind:?}: {} rotations", r.rotations);
        let last = r
            .finish(StopReason::Sigterm, 0, &ProbeCounters::default())
            .expect("finish");
        assert!(
            last.to_string_lossy().ends_with(kind.suffix()),
            "{}",
            last.display()
        );
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .collect();
        paths.sort();
        let mut all = Vec::new();
        let mut bytes = 0;
        for p in &paths {
            assert!(
                p.to_string_lossy().ends_with(kind.suffix()),
                "{}",
                p.display()
            );
            bytes += std::fs::metadata(p).expect("size").len();
            let input = crate::trace::compress::open(p).expect("open");
            let mut reader = TraceReader::new(input);
            reader.read_header().expect("header");
            let mut footer = None;
            for rec in reader {
                match rec.expect("record") {
                    Record::Vmallocinfo(_) => {}
                    Record::Footer(f) => footer = Some(f),
                    other => all.push(other),
                }
            }
            assert!(footer.is_some(), "{} has no footer", p.display());
        }
        assert_eq!(
            all, events,
            "{kind:?}: events lost, duplicated or reordered"
        );
        // Each file holds at least 16 KiB of JSON; stored, far less.
        assert!(
            bytes < (paths.len() as u64) * (8 << 10),
            "{kind:?}: {bytes} bytes in {} files",
            paths.len()
        );
    }
}
