use std::io::{BufRead, Cursor};

use super::*;
use crate::trace::TraceReader;

/// 600 lines of `perf script` after `perf record -e 'vmalloc:*' -a -- vmtrace stress
/// random-size --loops 3000` on the reference machine (Linux 6.18, 2 CPUs).
const PERF: &str = include_str!("../../tests/fixtures/import/perf-script.txt");
/// The tracefs `trace` file after `vmtrace stress random-size --threads 2 --loops 300` with
/// `events/vmalloc/enable` set, on the same machine.
const FTRACE: &str = include_str!("../../tests/fixtures/import/ftrace.txt");
/// `trace-cmd report` (trace-cmd 3.1.6) of the same workload on the same machine. `trace-cmd
/// record` cannot run there (the kernel refuses its write of `ftrace_enabled`), so the events
/// were enabled in tracefs and the buffer taken with `trace-cmd extract`, as a user of such a
/// kernel would.
/// 251 lines of `perf script` after `perf record -e 'vmalloc:*' -e
/// workqueue:workqueue_execute_start -e workqueue:workqueue_execute_end -a -- vmtrace stress
/// fix-size --pages 16 --threads 2 --loops 3000`, same machine: two drain items among other
/// work items.
const PERF_WQ: &str = include_str!("../../tests/fixtures/import/perf-script-workqueue.txt");
const TRACE_CMD: &str = include_str!("../../tests/fixtures/import/trace-cmd.txt");
/// `perf script --ns` after `perf record -a -g -e lock:contention_begin -e lock:contention_end
/// -e 'vmalloc:*' -- sleep 1.5` during `vmtrace stress fix-size --pages 16 --threads 2`, same
/// machine: the first 150 events, then the stretches from the begin to the end of 36 waits whose
/// stacks pass through mm/vmalloc.c, lines unchanged and in order (every line of the text is
/// perf's, but the stretches between them are left out).
const PERF_LOCKS: &str = include_str!("../../tests/fixtures/import/perf-script-locks.txt");

fn run(text: &str, opts: &ImportOptions) -> Result<(ImportSummary, Vec<Record>), ImportError> {
    let mut out = Vec::new();
    let s = import(|| Ok(Cursor::new(text.as_bytes())), opts, &mut out)?;
    let records = TraceReader::new(Cursor::new(out))
        .map(|r| r.expect("the imported trace reads back"))
        .collect();
    Ok((s, records))
}

/// The vmalloc event lines of a fixture, by kind.
fn kinds(text: &str) -> EventCounts {
    let mut c = EventCounts::default();
    for l in text.lines() {
        if l.contains("alloc_vmap_area:") {
            c.alloc += 1;
        } else if l.contains("free_vmap_area_noflush:") {
            c.free += 1;
        } else if l.contains("purge_vmap_area_lazy:") {
            c.purge += 1;
        }
    }
    c
}

fn header(records: &[Record]) -> &Header {
    match &records[0] {
        Record::Header(h) => h,
        other => panic!("first record {other:?}"),
    }
}

fn check_fixture(text: &str, want: Format) {
    let (s, records) = run(text, &ImportOptions::default()).unwrap();
    assert_eq!(s.format, want);
    assert_eq!(s.events, kinds(text));
    assert!(s.events.alloc > 0 && s.events.free > 0 && s.events.purge > 0);
    let h = header(&records);
    let imported = h.imported.as_ref().expect("imported header");
    assert_eq!(imported.from, want.name());
    assert_eq!(h.vmap.lazy_max_pages_tracepoint, Some(16384));
    assert_eq!(h.vmap.vmalloc_start, Some(KAddr(0xffff_c900_0000_0000)));
    assert_eq!(h.vmap.vmalloc_end, Some(KAddr(0xffff_e8ff_ffff_ffff)));
    assert!(h.system.possible_cpus >= 1);
    assert!(imported
        .inferred
        .iter()
        .any(|n| n.contains("possible CPUs")));
    assert!(matches!(records[1], Record::Vmallocinfo(_)));
    assert!(matches!(records.last(), Some(Record::Footer(_))));
    // Time order kept, strictly within each µs of the input.
    let mut last = 0;
    let mut n = 0;
    for r in &records {
        let ts = match r {
            Record::Alloc(a) => a.ctx.ts_ns,
            Record::Free(f) => f.ctx.ts_ns,
            Record::Purge(p) => p.ctx.ts_ns,
            _ => continue,
        };
        assert!(ts > last, "{ts} after {last}");
        last = ts;
        n += 1;
    }
    assert_eq!(n, s.events.total());
}

#[test]
fn a_perf_script_recording_imports_every_event() {
    check_fixture(PERF, Format::PerfScript);
    // The first alloc of the fixture, field by field.
    let (_, records) = run(PERF, &ImportOptions::default()).unwrap();
    let Some(Record::Alloc(a)) = records.iter().find(|r| matches!(r, Record::Alloc(_))) else {
        panic!("no alloc");
    };
    assert_eq!(a.ctx.comm.as_str(), "vmtrace");
    assert_eq!(a.ctx.pid, 13057);
    assert_eq!(a.addr, KAddr(18446683600571846656));
    assert_eq!((a.size, a.align, a.failed), (12288, 4096, 0));
}

#[test]
fn an_ftrace_file_imports_every_event() {
    check_fixture(FTRACE, Format::Ftrace);
}

#[test]
fn drain_work_items_become_work_records_and_other_work_is_skipped() {
    let (s, records) = run(PERF_WQ, &ImportOptions::default()).unwrap();
    assert_eq!(s.events, kinds(PERF_WQ));
    let drain_lines = PERF_WQ
        .lines()
        .filter(|l| l.contains("function drain_vmap_area_work"))
        .count();
    assert_eq!(drain_lines, 4);
    assert_eq!(s.drain_items, 2);
    let other_work = PERF_WQ.lines().filter(|l| l.contains("workqueue:")).count() - drain_lines;
    assert!(other_work > 0 && s.other_events >= other_work as u64);
    let works: Vec<&Work> = records
        .iter()
        .filter_map(|r| match r {
            Record::Work(w) => Some(&**w),
            _ => None,
        })
        .collect();
    let starts = records
        .iter()
        .filter(|r| matches!(r, Record::WorkStart(_)))
        .count();
    assert_eq!((works.len(), starts), (2, 2));
    // The first item, as perf printed it: 38971.999661 to .999838 on CPU 0.
    let w = works[0];
    assert_eq!(w.function, "drain_vmap_area_work");
    assert_eq!(w.work, KAddr(0xffff_ffff_82f3_11a0));
    assert_eq!((w.start_ns, w.duration_ns), (38_971_999_661_000, 177_000));
    assert_eq!((w.start_cpu, w.ctx.comm.as_str()), (0, "kworker/u8:0-ev"));
    // Its purge lies inside it, as in a native recording, so replay pairs them.
    let purge = records
        .iter()
        .find_map(|r| match r {
            Record::Purge(p) => Some(p),
            _ => None,
        })
        .unwrap();
    assert!(purge.ctx.ts_ns >= w.start_ns && purge.ctx.ts_ns <= w.ctx.ts_ns);
    let h = header(&records);
    assert!(h
        .imported
        .as_ref()
        .unwrap()
        .inferred
        .iter()
        .any(|n| n.starts_with("drain work: 2 ")));
    // Without the workqueue lines, the same vmalloc events and no work records.
    let bare: String = PERF_WQ
        .lines()
        .filter(|l| !l.contains("workqueue:"))
        .map(|l| format!("{l}\n"))
        .collect();
    let (s2, records2) = run(&bare, &ImportOptions::default()).unwrap();
    assert_eq!((s2.events, s2.drain_items), (s.events, 0));
    assert!(!records2.iter().any(|r| matches!(r, Record::Work(_))));
}

#[test]
fn a_trace_cmd_report_imports_every_event() {
    check_fixture(TRACE_CMD, Format::TraceCmd);
    let (_, records) = run(TRACE_CMD, &ImportOptions::default()).unwrap();
    let Some(Record::Purge(p)) = records.iter().find(|r| matches!(r, Record::Purge(_))) else {
        panic!("no purge");
    };
    assert_eq!(p.npurged, 456);
    let Some(Record::Free(f)) = records.iter().find(|r| matches!(r, Record::Free(_))) else {
        panic!("no free");
    };
    assert_eq!(f.ctx.comm.as_str(), "kworker/u8:5");
    assert_eq!((f.ctx.pid, f.ctx.cpu), (17460, 0));
    assert_eq!((f.va_start, f.nr_lazy), (KAddr(0xffff_c900_0563_4000), 804));
}

#[test]
fn given_facts_win_over_inferred_ones() {
    let dump = "0xffffc90000000000-0xffffc90000005000   20480 fork_idle+0x5b/0x150 pages=4 vmalloc\n\
                0xffffc90000005000-0xffffc90000007000    8192 acpi_os_map_iomem+0x1ae/0x1e0 phys=0x000000007ffe0000 ioremap\n";
    let areas = crate::host::vmallocinfo::parse(dump).unwrap();
    let opts = ImportOptions {
        from: Some(Format::PerfScript),
        cpus: Some(16),
        lazy_max: Some(40960),
        snapshot: Some(areas),
        ..ImportOptions::default()
    };
    let (s, records) = run(PERF, &opts).unwrap();
    assert_eq!(s.cpus, 16);
    let h = header(&records);
    assert_eq!(h.vmap.nr_vmap_nodes, 16);
    assert_eq!(h.vmap.lazy_max_pages_tracepoint, Some(40960));
    let Record::Vmallocinfo(v) = &records[1] else {
        panic!("no snapshot");
    };
    assert_eq!(v.areas.len(), 2);
    assert!(!s.inferred.iter().any(|n| n.contains("possible CPUs")));
}

fn error_line(text: &str) -> (u64, String) {
    match run(text, &ImportOptions::default()) {
        Err(ImportError::Line { line, msg }) => (line, msg),
        other => panic!("expected a line error, got {:?}", other.map(|r| r.0)),
    }
}

/// perf prints an event that missed its ordering round a few µs late: the line is kept, written
/// at the time of the line before it, and the header says how many and how far back.
#[test]
fn a_line_a_little_out_of_time_order_is_kept_at_the_time_before_it() {
    let lines: Vec<&str> = PERF
        .lines()
        .filter(|l| l.contains("alloc_vmap_area:"))
        .take(2)
        .collect();
    assert!(lines[1].contains("16736.414666"), "{}", lines[1]);
    let earlier = lines[0].replace("16736.414516", "16736.414662");
    let text = format!("{}\n{earlier}\n", lines[1]);
    let (s, records) = run(&text, &ImportOptions::default()).unwrap();
    assert_eq!(s.events.alloc, 2);
    let ts: Vec<u64> = records
        .iter()
        .filter_map(|r| match r {
            Record::Alloc(a) => Some(a.ctx.ts_ns),
            _ => None,
        })
        .collect();
    assert_eq!(ts.len(), 2);
    assert!(ts[1] >= ts[0], "{ts:?}");
    assert!(
        s.inferred
            .iter()
            .any(|n| n.contains("1 event line(s) printed out of time order, up to 4000 ns back")),
        "{:?}",
        s.inferred
    );
}

#[test]
fn bad_input_gets_its_line_number() {
    let mut lines: Vec<&str> = PERF.lines().take(40).collect();
    let at = (20..40)
        .find(|&i| lines[i].contains("alloc_vmap_area:"))
        .unwrap();
    let broken = lines[at].replace("size=", "size=x");
    lines[at] = &broken;
    let (line, msg) = error_line(&lines.join("\n"));
    assert_eq!(line, at as u64 + 1, "{msg}");
    assert!(msg.contains("size"), "{msg}");

    // Time going backwards, further than perf's rounds put a late event.
    let a = PERF.lines().next().unwrap();
    let earlier = a.replace("16736.414516", "16736.000001");
    let (line, msg) = error_line(&format!("{a}\n{earlier}\n"));
    assert_eq!(line, 2);
    assert!(msg.contains("backwards"), "{msg}");

    // A perf line in ftrace input.
    let f = FTRACE
        .lines()
        .find(|l| l.contains("alloc_vmap_area:"))
        .unwrap();
    let (line, msg) = error_line(&format!("{f}\n{a}\n"));
    assert_eq!(line, 2);
    assert!(msg.contains("perf-script"), "{msg}");

    // No vmalloc event at all: other events are counted, nothing is written.
    let other = "  bash  1 [000] 1.000001: sched:sched_switch: prev_comm=bash\n# comment\n";
    match run(other, &ImportOptions::default()) {
        Err(ImportError::Empty { lines, other }) => assert_eq!((lines, other), (2, 1)),
        r => panic!("{:?}", r.map(|r| r.0)),
    }
}

/// `perf script` printed one sample twice (identical to the nanosecond) in a recording beside
/// vmtrace's own: the repeat is dropped and counted, and the import is the one of the text
/// without it. The same line one microsecond later is another event, and is kept.
#[test]
fn a_line_printed_twice_is_imported_once() {
    let lines: Vec<&str> = PERF.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.contains("alloc_vmap_area:"))
        .expect("an allocation");
    let with = |repeat: &str| {
        let mut v: Vec<&str> = lines.clone();
        v.insert(i + 1, repeat);
        v.join("\n") + "\n"
    };
    let (plain, plain_records) = run(PERF, &ImportOptions::default()).unwrap();
    let (s, records) = run(&with(lines[i]), &ImportOptions::default()).unwrap();
    assert_eq!(s.repeated_lines, 1);
    assert_eq!(s.events, plain.events);
    // The same records after the header, whose notes say what was dropped.
    assert!(records[1..] == plain_records[1..], "the records differ");
    assert!(s
        .inferred
        .iter()
        .any(|n| n.contains("1 event line(s) identical")));
    // Not a repeat: a microsecond apart (and so out of the fixture's time order only if the
    // next line is within that microsecond, which the fixture's first lines are not).
    let (ts, _) = lines[i].split_once(": ").expect("time");
    let later = lines[i].replacen(ts, &bump_last_digit(ts), 1);
    let (s, _) = run(&with(&later), &ImportOptions::default()).unwrap();
    assert_eq!(s.repeated_lines, 0);
    assert_eq!(s.events.alloc, plain.events.alloc + 1);
}

/// `ts` (the line up to its time) with the time's last digit one higher, carrying.
fn bump_last_digit(ts: &str) -> String {
    let (head, num) = ts.rsplit_once(' ').expect("a time column");
    let (secs, frac) = num.split_once('.').expect("fractional time");
    let width = frac.len();
    let v: u64 = frac.parse::<u64>().expect("digits") + 1;
    format!("{head} {secs}.{v:0width$}")
}

#[test]
fn events_of_other_tracepoints_are_counted_and_skipped() {
    let mut text = String::new();
    for l in PERF.lines().take(30) {
        text.push_str(l);
        text.push('\n');
        text.push_str(
            "     swapper     0 [001] 16736.500000: sched:sched_switch: prev_comm=swapper prev_pid=0\n",
        );
    }
    // The interleaved lines are out of time order only for other events, which are skipped
    // before the order is checked.
    let (s, _) = run(&text, &ImportOptions::default()).unwrap();
    assert_eq!(s.other_events, 30);
    assert_eq!(s.events.total(), 30);
}

#[test]
fn both_passes_see_the_same_input() {
    // The reader is opened twice; a second open that differed would show in the counts.
    let opens = std::cell::Cell::new(0);
    let mut out = Vec::new();
    let s = import(
        || -> std::io::Result<Box<dyn BufRead>> {
            opens.set(opens.get() + 1);
            Ok(Box::new(Cursor::new(PERF.as_bytes())))
        },
        &ImportOptions::default(),
        &mut out,
    )
    .unwrap();
    assert_eq!(opens.get(), 2);
    assert_eq!(s.events, kinds(PERF));
}

proptest::proptest! {
    /// Arbitrary text and arbitrary mutations of real lines never panic the parser.
    #[test]
    fn the_line_parser_never_panics(s in "\\PC{0,200}", cut in 0usize..400, junk in "\\PC{0,8}") {
        let _ = parse::prefix(&s);
        for l in PERF.lines().take(3).chain(FTRACE.lines().skip(12).take(3)) {
            let at = l.char_indices().map(|(i, _)| i).nth(cut % l.chars().count().max(1)).unwrap_or(0);
            let mutated = format!("{}{junk}{}", &l[..at], &l[at..]);
            if let Some(Ok(p)) = parse::prefix(&mutated) {
                if let Some(name) = parse::vmalloc_event(&p.event) {
                    let _ = parse::record(name, &p.rest, parse::ctx(&p, 0));
                }
            }
        }
    }
}

#[test]
fn a_given_dump_time_places_the_snapshot() {
    let dump =
        "0xffffc90000000000-0xffffc90000005000   20480 fork_idle+0x5b/0x150 pages=4 vmalloc\n";
    let areas = crate::host::vmallocinfo::parse(dump).unwrap();
    // The 11th event line's time.
    let tenth = PERF
        .lines()
        .filter_map(|l| parse::prefix(l).and_then(Result::ok))
        .nth(10)
        .unwrap()
        .ts_ns;
    let opts = ImportOptions {
        snapshot: Some(areas),
        snapshot_at: Some(tenth),
        ..ImportOptions::default()
    };
    let (s, records) = run(PERF, &opts).unwrap();
    let Record::Vmallocinfo(v) = &records[1] else {
        panic!("no snapshot");
    };
    assert_eq!(v.ts_start_ns, tenth);
    let note = s
        .inferred
        .iter()
        .find(|n| n.starts_with("start snapshot"))
        .unwrap();
    assert!(
        note.contains("before event 10 of") && note.contains("at the time given"),
        "{note}"
    );
}

/// Seconds as perf prints them (`36002.183405123:`) on a line, in ns.
fn line_ts(line: &str) -> u64 {
    let p = parse::prefix(line).unwrap().unwrap();
    p.ts_ns
}

fn contentions(records: &[Record]) -> Vec<&crate::trace::Contention> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Contention(c) => Some(&**c),
            _ => None,
        })
        .collect()
}

/// Waits whose begin's stack passes through a vmap lock's user become `contention` records,
/// timed from their begin to their end on the same CPU and classified from the stack; the
/// fixture's other waits (scheduler and workqueue locks) are left out.
#[test]
fn lock_waits_on_vmap_paths_become_contention_records() {
    let (s, records) = run(PERF_LOCKS, &ImportOptions::default()).unwrap();
    let waits = contentions(&records);
    let begins = PERF_LOCKS
        .lines()
        .filter(|l| l.contains("contention_begin:"))
        .count() as u64;
    assert_eq!(s.lock_waits, waits.len() as u64);
    assert!(
        s.lock_waits > 30 && s.lock_waits < begins,
        "{} of {begins} waits kept",
        s.lock_waits
    );
    for c in &waits {
        assert!(
            c.stack.iter().any(|f| f.starts_with("alloc_vmap_area+")
                || f.starts_with("find_unlink_vmap_area+")
                || f.starts_with("purge_vmap_node+")),
            "{:?}",
            c.stack
        );
    }
    // One wait read off the text: `find_unlink_vmap_area` takes the busy lock and nothing
    // else, so its class needs no learning.
    let lines: Vec<&str> = PERF_LOCKS.lines().collect();
    let begin = (0..lines.len())
        .find(|&i| {
            lines[i].contains("contention_begin:")
                && lines
                    .get(i + 3)
                    .is_some_and(|f| f.contains("find_unlink_vmap_area+"))
        })
        .expect("a wait in find_unlink_vmap_area");
    let lock = lines[begin]
        .split("contention_begin: ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let cpu = &lines[begin][lines[begin].find('[').unwrap()..=lines[begin].find(']').unwrap()];
    let end = (begin + 1..lines.len())
        .find(|&i| {
            lines[i].contains("contention_end:")
                && lines[i].contains(lock)
                && lines[i].contains(cpu)
        })
        .unwrap();
    let want = line_ts(lines[end]) - line_ts(lines[begin]);
    let c = waits
        .iter()
        .find(|c| c.ctx.ts_ns == line_ts(lines[end]))
        .expect("the wait's record");
    assert_eq!(c.wait_ns, want);
    assert_eq!(c.class, crate::trace::LockClass::NodeBusyLock);
    assert_eq!(format!("{:#x}", c.lock.0), lock);
    let classes: std::collections::BTreeSet<_> = waits.iter().map(|c| c.class).collect();
    assert!(
        classes.contains(&crate::trace::LockClass::NodePoolLock),
        "purge_vmap_node's waits on the pool lock: {classes:?}"
    );

    // The same text without its stacks shows no wait's path: none is kept, nothing else moves.
    let bare: String = PERF_LOCKS
        .lines()
        .filter(|l| !l.starts_with('\t'))
        .map(|l| format!("{l}\n"))
        .collect();
    let (b, bare_records) = run(&bare, &ImportOptions::default()).unwrap();
    assert_eq!(b.lock_waits, 0);
    assert!(contentions(&bare_records).is_empty());
    assert_eq!(b.events, s.events);
}

/// A spinning waiter is paired on its CPU, a sleeping one on its task, whatever CPU it wakes
/// on; ftrace's `=> symbol+off/size` stack lines count as frames.
#[test]
fn spinning_waits_pair_on_their_cpu_and_sleeping_ones_on_their_task() {
    let text = "\
 stress-0-10 [000] d..1. 100.000001000: alloc_vmap_area: va_start=18446683600571846656 size=12288 align=4096 vstart=0xffffc90000000000 vend=0xffffe8ffffffffff failed=0
 stress-0-10 [000] d..1. 100.000002000: contention_begin: 0xffff888100055820 (flags=SPIN)
 => __pv_queued_spin_lock_slowpath+0x10e/0x2a0
 => _raw_spin_lock+0x3b/0x50
 => find_unlink_vmap_area+0x55/0x140
 kworker-20 [001] d..1. 100.000002500: contention_begin: 0xffff888100055820 (flags=SPIN)
 => _raw_spin_lock+0x3b/0x50
 => find_unlink_vmap_area+0x55/0x140
 stress-0-10 [000] d..1. 100.000003000: contention_end: 0xffff888100055820 (ret=0)
 purger-30 [000] d..1. 100.000004000: contention_begin: 0xffffffff83989964 (flags=MUTEX)
 => __mutex_lock+0x10/0x300
 => __purge_vmap_area_lazy+0x30/0x600
 purger-30 [001] d..1. 100.000009000: contention_end: 0xffffffff83989964 (ret=0)
 kworker-20 [001] d..1. 100.000010000: contention_end: 0xffff888100055820 (ret=0)
";
    let (s, records) = run(text, &ImportOptions::default()).unwrap();
    let waits = contentions(&records);
    assert_eq!(s.lock_waits, 3);
    let got: Vec<(u32, u64)> = waits.iter().map(|c| (c.ctx.pid, c.wait_ns)).collect();
    assert_eq!(got, vec![(10, 1_000), (30, 5_000), (20, 7_500)]);
    assert_eq!(waits[0].class, crate::trace::LockClass::NodeBusyLock);
    assert_eq!(waits[1].flags, 32);
    assert_eq!(
        waits[0].stack,
        vec![
            "__pv_queued_spin_lock_slowpath+0x10e",
            "_raw_spin_lock+0x3b",
            "find_unlink_vmap_area+0x55"
        ]
    );
    // Lock waits alone are no trace: the import wants vmalloc events.
    let locks_only: String = text.lines().skip(1).map(|l| format!("{l}\n")).collect();
    match run(&locks_only, &ImportOptions::default()) {
        Err(ImportError::Empty { lines, other }) => assert_eq!((lines, other), (13, 6)),
        r => panic!("{:?}", r.map(|r| r.0)),
    }
    // A broken lock line stops the import at its number.
    let broken = text.replace("0xffff888100055820 (ret=0)", "0xffff888100055820 (ret=x)");
    let (line, msg) = error_line(&broken);
    assert_eq!(line, 9, "{msg}");
    assert!(msg.contains("ret"), "{msg}");
}
