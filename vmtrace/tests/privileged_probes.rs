//! End-to-end tests of the ladder probes (issue 4) on the real kernel: lock contention on vmap
//! paths, purge work items, page-table pages, and the ladder's refusal reasons.
//!
//! Run as root, one at a time: `cargo test --release -p vmtrace --test privileged_probes --
//! --test-threads=1`. They print the measured numbers (`--nocapture` shows them).

mod common;

use common::privileged;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use vmtrace::trace::{
    Contention, Footer, Header, LockClass, ProbeInfo, PtLevel, Record, TraceReader,
};
use vmtrace_common::contention::STACK_NOT_WALKED;

const VMTRACE: &str = env!("CARGO_BIN_EXE_vmtrace");

fn read_trace(path: &Path) -> (Header, Vec<Record>, Footer) {
    let file = std::fs::File::open(path).unwrap();
    let mut reader = TraceReader::new(std::io::BufReader::new(file));
    let header = reader.read_header().unwrap();
    let records: Vec<Record> = reader.map(|r| r.unwrap()).collect();
    let footer = records
        .iter()
        .find_map(|r| match r {
            Record::Footer(f) => Some((**f).clone()),
            _ => None,
        })
        .expect("a footer");
    (header, records, footer)
}

fn tmp(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("vmtrace-probes")
        .tempdir()
        .unwrap();
    let path = dir.path().join(name);
    (dir, path)
}

/// Records a 2-thread stress mix meant to contend on the vmap locks: BPF-map churn on two
/// threads plus thread-stack churn on two more.
fn record_contending_mix(mode: &str, walk_always: bool) -> (tempfile::TempDir, PathBuf) {
    let (dir, out) = tmp("mix.jsonl");
    let mix = format!(
        "{VMTRACE} stress fix-size --threads 2 -d 4s >/dev/null & \
         {VMTRACE} stress thread-churn --threads 2 -d 4s >/dev/null; wait"
    );
    let mut cmd = Command::new(VMTRACE);
    cmd.env("VMTRACE_TRACEPOINTS", mode);
    if walk_always {
        cmd.env("VMTRACE_LOCK_WALK", "always");
    } else {
        cmd.env_remove("VMTRACE_LOCK_WALK");
    }
    let status = cmd
        .args(["record", "-q", "--probes", "all", "-o"])
        .arg(&out)
        .args(["--", "sh", "-c", &mix])
        .status()
        .unwrap();
    assert!(status.success(), "vmtrace record: {status}");
    (dir, out)
}

/// A wait the probe kept without a stack, on an address marked known.
fn unwalked(w: &Contention) -> bool {
    w.stack_id == STACK_NOT_WALKED
}

#[test]
fn contention_on_vmap_paths_is_classified() {
    contention_is_classified("raw", false);
}

/// The perf tracepoint programs, the fallback where raw tracepoints are refused, classify the
/// same: their stacks start at the call site without the raw program's own frames.
#[test]
fn contention_is_classified_on_perf_tracepoints_too() {
    contention_is_classified("perf", false);
}

/// With `VMTRACE_LOCK_WALK=always` no address is marked known: every wait is walked and
/// classified from its stack, as the known-lock path's answers are checked against.
#[test]
fn contention_is_classified_with_every_wait_walked() {
    contention_is_classified("raw", true);
}

fn contention_is_classified(mode: &str, walk_always: bool) {
    if !privileged() {
        return;
    }
    let (_dir, out) = record_contending_mix(mode, walk_always);
    let (header, records, footer) = read_trace(&out);
    let lock = header
        .probes
        .iter()
        .find(|p| p.logical.as_deref() == Some("lock_waits"))
        .expect("a lock_waits probe in the header");
    assert_eq!(lock.rung, "tracepoint");
    let want = common::expected_attach(mode == "perf");
    assert_eq!(
        lock.attach.as_deref(),
        Some(want),
        "{:?}",
        lock.attach_fallback
    );
    let waits: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Contention(c) => Some(c),
            _ => None,
        })
        .collect();
    assert!(!waits.is_empty(), "no contention event in a contending mix");
    let mut per_class = std::collections::BTreeMap::<LockClass, (u64, u64)>::new();
    for w in &waits {
        assert!(w.wait_ns > 0, "zero wait: {w:?}");
        if unwalked(w) {
            // Only addresses classified from agreeing stacks are marked, and only the classes
            // whose locks belong to mm/vmalloc.c.
            assert!(w.stack.is_empty(), "{w:?}");
            assert!(
                matches!(
                    w.class,
                    LockClass::FreeAreaLock
                        | LockClass::NodeBusyLock
                        | LockClass::NodeLazyLock
                        | LockClass::NodePoolLock
                        | LockClass::PurgeMutex
                ),
                "an unwalked wait outside the vmap locks: {w:?}"
            );
        }
        if w.stack_id >= 0 {
            assert!(!w.stack.is_empty(), "stack {} unresolved", w.stack_id);
            assert!(
                w.stack.iter().any(|f| f.contains("vmap")
                    || f.contains("vmalloc")
                    || f.contains("pte_alloc")
                    || f.contains("vm_area")),
                "stack does not pass the vmap filter: {:?}",
                w.stack
            );
            // Waits on the ring buffer's own lock are vmtrace's (its programs run inside vmap
            // functions) and are dropped in the kernel.
            assert!(
                !w.stack.iter().any(|f| f.contains("bpf_ringbuf")),
                "a wait on vmtrace's own ring buffer was kept: {:?}",
                w.stack
            );
        }
        let e = per_class.entry(w.class).or_default();
        e.0 += 1;
        e.1 += w.wait_ns;
    }
    // Every walked wait carries the begin program's own time before its stamp: the stack
    // walk, so it cannot be 0 for most of them. An unwalked one has none.
    let mut walks: Vec<u64> = waits
        .iter()
        .filter(|w| !unwalked(w))
        .map(|w| w.probe_ns.unwrap_or_else(|| panic!("no probe_ns: {w:?}")))
        .collect();
    walks.sort_unstable();
    assert!(!walks.is_empty(), "no wait was walked");
    let median_walk = walks[walks.len() / 2];
    assert!(median_walk > 0, "the walk took no time: {walks:?}");
    let n_unwalked = waits.iter().filter(|w| unwalked(w)).count();
    assert!(
        waits
            .iter()
            .filter(|w| unwalked(w))
            .all(|w| w.probe_ns == Some(0)),
        "an unwalked wait with probe time"
    );
    println!(
        "probe_ns median {median_walk} ns over {} walked waits; {n_unwalked} kept unwalked",
        walks.len()
    );
    let ladder = footer.ladder.expect("ladder stats in the footer");
    assert_eq!(ladder.contention_known, n_unwalked as u64);
    if walk_always {
        assert_eq!(n_unwalked, 0);
    } else {
        // Thousands of waits on a handful of addresses: all but the first few per address
        // skip the walk.
        assert!(
            n_unwalked * 2 > waits.len(),
            "{n_unwalked} of {} waits unwalked",
            waits.len()
        );
    }
    assert_eq!(ladder.events.contention, waits.len() as u64);
    assert_eq!(ladder.lost.contention, 0);
    for t in &ladder.contention_by_class {
        let (n, ns) = per_class.get(&t.class).copied().unwrap_or_default();
        assert_eq!((t.count, t.wait_ns), (n, ns), "{:?}", t.class);
    }
    let other = per_class.get(&LockClass::Other).map(|e| e.0).unwrap_or(0);
    println!("contention events ({want}): {}", waits.len());
    for (class, (n, ns)) in &per_class {
        println!("  {:<16} {n:>6} waits  {ns:>12} ns total", class.name());
    }
    println!(
        "  other: {other} of {} ({:.2} %); filtered in kernel: {}; stack-map failures: {}",
        waits.len(),
        100.0 * other as f64 / waits.len() as f64,
        ladder.contention_filtered,
        ladder.stack_map_failures
    );
    assert!(
        (other as f64) <= 0.05 * waits.len() as f64,
        "too many unclassified waits: {other} of {}",
        waits.len()
    );
}

#[test]
fn purges_from_drain_work_match_a_work_item() {
    if !privileged() {
        return;
    }
    let (_dir, out) = record_contending_mix("raw", false);
    let (header, records, footer) = read_trace(&out);
    let works: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Work(w) => Some(w),
            _ => None,
        })
        .collect();
    assert!(!works.is_empty(), "no purge work item recorded");
    for w in &works {
        assert!(
            w.function == "drain_vmap_area_work" || w.function == "purge_vmap_node",
            "{w:?}"
        );
        assert!(w.duration_ns > 0);
    }
    let ladder = footer.ladder.unwrap();
    // Recomputed here from the lines, independently of the recorder's tally.
    let worker_purges: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Purge(p) if p.ctx.comm.starts_with("kworker") => Some(p),
            _ => None,
        })
        .collect();
    let covered = |p: &vmtrace::trace::Purge| {
        works.iter().any(|w| {
            w.ctx.pid == p.ctx.pid
                && w.start_ns <= p.ctx.ts_ns
                && p.ctx.ts_ns <= w.start_ns + w.duration_ns
        })
    };
    let matched = worker_purges.iter().filter(|p| covered(p)).count();
    assert_eq!(ladder.purges_from_work, worker_purges.len() as u64);
    assert_eq!(ladder.purges_matched, matched as u64);
    // A work item already running when the recording began has no start event, and one still
    // running when it ended has no end event (its record is emitted at the end), so their
    // purges cannot be matched; a drain work item can hold several purges (it loops while the
    // backlog stays over the threshold) and last 100 ms under load. Work items on one worker
    // run one after the other, so a purge with a recorded item of its worker both before and
    // after it lies in an item that began and ended inside the recording: those must match.
    let inner: Vec<_> = worker_purges
        .iter()
        .filter(|p| {
            let mine = || works.iter().filter(|w| w.ctx.pid == p.ctx.pid);
            mine().any(|w| w.start_ns + w.duration_ns < p.ctx.ts_ns)
                && mine().any(|w| w.start_ns > p.ctx.ts_ns)
        })
        .collect();
    let inner_matched = inner.iter().filter(|p| covered(p)).count();
    println!(
        "purge work items: {}; purges from workers: {}; matched: {} ({:.1} %); between two \
         recorded items of their worker: {inner_matched} of {} matched",
        works.len(),
        worker_purges.len(),
        matched,
        100.0 * matched as f64 / worker_purges.len().max(1) as f64,
        inner.len()
    );
    assert!(!worker_purges.is_empty(), "no drain purge in 4 s of churn");
    assert_eq!(inner_matched, inner.len(), "unmatched drain purges");

    // Each drain item that ran a purge queued the purge's TLB flush (csd:csd_queue_cpu for
    // do_flush_tlb_all or do_kernel_range_flush) between its start and its end.
    let note = ladder_entry(&header.probes, "purge_work")
        .note
        .clone()
        .unwrap_or_default();
    assert!(note.contains("timed at their TLB flush"), "{note}");
    let drains: Vec<_> = works
        .iter()
        .filter(|w| w.function == "drain_vmap_area_work")
        .collect();
    for w in &drains {
        if let Some(f) = w.flush_ns {
            assert!(
                w.start_ns <= f && f <= w.start_ns + w.duration_ns,
                "flush outside its item: {w:?}"
            );
        }
    }
    let purging: Vec<_> = drains
        .iter()
        .filter(|w| {
            worker_purges.iter().any(|p| {
                p.npurged > 0
                    && w.ctx.pid == p.ctx.pid
                    && w.start_ns <= p.ctx.ts_ns
                    && p.ctx.ts_ns <= w.start_ns + w.duration_ns
            })
        })
        .collect();
    let flushed = purging.iter().filter(|w| w.flush_ns.is_some()).count();
    println!(
        "drain items that purged: {}; with a TLB flush time: {flushed}",
        purging.len()
    );
    assert!(!purging.is_empty());
    assert!(
        flushed * 100 >= purging.len() * 95,
        "{flushed} of {} purging drain items have a flush time",
        purging.len()
    );
}

fn ladder_entry<'a>(probes: &'a [ProbeInfo], name: &str) -> &'a ProbeInfo {
    probes
        .iter()
        .find(|p| p.logical.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in {probes:?}"))
}

/// What this kernel should refuse: the development machines' 6.18 kernel has no kprobes
/// (`CONFIG_KPROBES` off) and refuses fentry loads with EPERM (docs/testbox.md).
fn assert_expected_refusals(probes: &[ProbeInfo]) {
    let kprobes_off = !Path::new("/sys/bus/event_source/devices/kprobe").exists()
        && !Path::new("/sys/kernel/tracing/kprobe_events").exists();
    for name in ["lock_waits", "purge_work", "page_tables", "alloc_latency"] {
        let p = ladder_entry(probes, name);
        let fentry = p.refused.iter().find(|r| r.rung == "fentry");
        let kprobe = p.refused.iter().find(|r| r.rung == "kprobe");
        if p.rung == "tracepoint" || p.rung == "none" {
            let fentry = fentry.unwrap_or_else(|| panic!("{name}: no fentry refusal"));
            // The reference kernel refuses fentry loads with EPERM.
            assert!(fentry.reason.contains("EPERM"), "{name}: {}", fentry.reason);
            let kprobe = kprobe.unwrap_or_else(|| panic!("{name}: no kprobe refusal"));
            if kprobes_off {
                assert!(
                    kprobe.reason.contains("kprobes not configured"),
                    "{name}: {}",
                    kprobe.reason
                );
            }
        }
        if name == "alloc_latency" {
            assert_eq!(p.rung, "none");
            assert_eq!(
                p.note.as_deref(),
                Some("n/a: no latency without fentry/kprobe")
            );
        } else {
            assert_eq!(p.rung, "tracepoint", "{name}");
        }
    }
    // The hold probe has fentry programs alone: refused here, it says why and what it needs.
    let holds = ladder_entry(probes, "lock_holds");
    assert_eq!(holds.rung, "none");
    let fentry = holds.refused.iter().find(|r| r.rung == "fentry");
    assert!(
        fentry.is_some_and(|r| r.reason.contains("EPERM")),
        "lock_holds: {:?}",
        holds.refused
    );
    assert_eq!(
        holds.note.as_deref(),
        Some("n/a: lock holds need fentry (no tracepoint marks a lock's release)")
    );
}

#[test]
fn probes_table_and_header_give_the_refusal_reasons() {
    if !privileged() {
        return;
    }
    let out = Command::new(VMTRACE)
        .args(["probes", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let probes: Vec<ProbeInfo> = serde_json::from_slice(&out.stdout).unwrap();
    assert_expected_refusals(&probes);
    let table = Command::new(VMTRACE).arg("probes").output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    println!("{text}");
    assert!(
        text.contains("lock_waits") && text.contains("EPERM"),
        "{text}"
    );

    let (_dir, path) = tmp("h.jsonl");
    let st = Command::new(VMTRACE)
        .args(["record", "-q", "-d", "0.2", "--probes", "all", "-o"])
        .arg(&path)
        .status()
        .unwrap();
    assert!(st.success());
    let (header, _, _) = read_trace(&path);
    assert_expected_refusals(&header.probes);
}

/// 2 MiB slots of `[start, end)`.
fn slots(start: u64, end: u64) -> impl Iterator<Item = u64> {
    (start >> 21)..=((end - 1) >> 21)
}

/// Arenas parked above the live areas before the measured maps are created: 4 × 4 GiB of
/// address space, far more than any earlier test or stress run on the box has ever mapped.
const ARENAS: usize = 4;

/// Pins the arenas in bpffs so that they outlive this run: page tables do (until reboot), so a
/// later run in the same boot must not be able to put its maps where this run's were. Its
/// arenas then fill this run's freed map space and its maps land above, in space never mapped
/// again. Each run leaves 16 GiB of the 32 TiB vmalloc space reserved and no memory used;
/// `rm /sys/fs/bpf/vmtrace-test-pt-arena-*` releases them.
fn pin_for_later_runs(arenas: &[vmtrace::workload::VaReservation]) {
    let dir = std::path::Path::new("/sys/fs/bpf");
    let mounted = std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf") && l.contains(" bpf "));
    if !mounted {
        // Where bpftool and systemd mount it.
        let ok = Command::new("mount")
            .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            eprintln!("!!! cannot mount bpffs at /sys/fs/bpf: a later run of this test in this boot may find its maps in space this run mapped");
            return;
        }
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    for (i, a) in arenas.iter().enumerate() {
        let path = dir.join(format!("vmtrace-test-pt-arena-{stamp}-{i}"));
        if let Err(e) = a.pin(&path) {
            eprintln!("!!! pinning {} failed: {e}", path.display());
        }
    }
}

#[test]
fn page_table_pages_follow_new_2mib_slots() {
    if !privileged() {
        return;
    }
    let page = 4096;
    let (_dir, path) = tmp("pt.jsonl");
    let mut rec = Command::new(VMTRACE)
        .args([
            "record",
            "-q",
            "--probes",
            "page_tables",
            "-d",
            "60",
            "--meminfo-interval",
            "200ms",
            "-o",
        ])
        .arg(&path)
        .spawn()
        .unwrap();
    // The file appears once the probes are attached and calibrated.
    let t0 = Instant::now();
    while std::fs::read_to_string(&path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
        < 2
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "recorder did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    // Kernel page tables are never freed, so address space that earlier runs mapped gets no new
    // table and no event. Arenas reserve address space without mapping it, and by lowest fit
    // they take the bottom of the free space above the live areas, where earlier runs' areas
    // were; the maps below then land above the arenas, in space nothing has mapped since boot.
    let arenas: Result<Vec<_>, _> = (0..ARENAS)
        .map(|_| vmtrace::workload::VaReservation::create(page))
        .collect();
    let arenas = match arenas {
        Ok(a) => {
            pin_for_later_runs(&a);
            Some(a)
        }
        Err(e) => {
            eprintln!(
                "!!! no BPF arena maps on this kernel ({e}): cannot move the test's maps into \
                 never-mapped address space, so only the upper bound (events <= slots) and the \
                 meminfo check are asserted"
            );
            None
        }
    };
    std::thread::sleep(Duration::from_millis(200));
    // 32 × 64 MiB = 2 GiB of vmalloc space alive at once.
    let maps: Vec<_> = (0..32)
        .map(|_| vmtrace::workload::ArrayMap::create(16384, page).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    drop(maps);
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(rec.id() as i32, libc::SIGINT) };
    assert!(rec.wait().unwrap().success());
    let had_arenas = arenas.is_some();
    drop(arenas);

    let (_header, records, _footer) = read_trace(&path);
    let me = std::process::id();
    let arena_bytes = 1u64 << 32;
    // Where the arenas went, from their alloc events: everything at or above the end of the
    // highest one is address space no earlier run reached.
    let fresh_from = records
        .iter()
        .filter_map(|r| match r {
            Record::Alloc(a) if a.failed == 0 && a.ctx.tgid == me && a.size > arena_bytes => {
                Some(a.addr.0 + a.size)
            }
            _ => None,
        })
        .max();
    // Slots our map areas cover, computed from the alloc events alone (the guard page is never
    // mapped), split at the arenas' end.
    let mut fresh_slots = std::collections::BTreeSet::new();
    let mut other_slots = std::collections::BTreeSet::new();
    let mut ours = 0;
    let mut first_map_ts = u64::MAX;
    for r in &records {
        if let Record::Alloc(a) = r {
            if a.failed == 0 && a.ctx.tgid == me && a.size >= 16384 * page && a.size < arena_bytes {
                ours += 1;
                first_map_ts = first_map_ts.min(a.ctx.ts_ns);
                let set = match fresh_from {
                    Some(b) if a.addr.0 >= b => &mut fresh_slots,
                    _ => &mut other_slots,
                };
                set.extend(slots(a.addr.0, a.addr.0 + a.size - page));
            }
        }
    }
    assert_eq!(ours, 32, "our 32 areas were not all seen");
    let pte = records
        .iter()
        .filter(|r| {
            matches!(r, Record::PtPage(p) if p.level == PtLevel::Pte
                && p.ctx.tgid == me && p.ctx.ts_ns >= first_map_ts)
        })
        .count();
    let pmd = records
        .iter()
        .filter(|r| {
            matches!(r, Record::PtPage(p) if p.level == PtLevel::Pmd
                && p.ctx.tgid == me && p.ctx.ts_ns >= first_map_ts)
        })
        .count();
    let all_pt: u64 = records
        .iter()
        .filter(|r| matches!(r, Record::PtPage(_)))
        .count() as u64;
    // PageTables before the maps (lowest sample) and while they were alive (highest sample).
    let mem_before = records
        .iter()
        .filter_map(|r| match r {
            Record::Meminfo(m) if m.ts_ns < first_map_ts => Some(m.page_tables_kb),
            _ => None,
        })
        .min()
        .unwrap_or(0);
    let mem_during = records
        .iter()
        .filter_map(|r| match r {
            Record::Meminfo(m) if m.ts_ns >= first_map_ts => Some(m.page_tables_kb),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let pt_delta_kb = mem_during.saturating_sub(mem_before);
    let fresh_gib: std::collections::BTreeSet<u64> = fresh_slots.iter().map(|s| s >> 9).collect();
    let fresh_from_text = fresh_from.map_or_else(|| "-".to_string(), |b| format!("{b:#x}"));
    println!(
        "arenas end at {fresh_from_text}; PTE pages for our maps: {pte}; 2 MiB slots of our maps \
         in never-mapped space (above the arenas): {}, elsewhere: {}; PMD pages: {pmd} for {} \
         1 GiB slots above the arenas; all pt_page events: {all_pt}; meminfo PageTables delta: \
         {pt_delta_kb} kB",
        fresh_slots.len(),
        other_slots.len(),
        fresh_gib.len()
    );
    let upper = (fresh_slots.len() + other_slots.len()) as f64;
    assert!(
        pte as f64 <= upper * 1.05,
        "more PTE pages ({pte}) than 2 MiB slots ({upper})"
    );
    if had_arenas {
        assert!(
            fresh_from.is_some(),
            "{ARENAS} arenas were created but the trace has no alloc event of their areas"
        );
        // Every slot above the arenas is new and must have cost exactly one PTE page; slots
        // below may or may not have been mapped before, so they only widen the upper bound.
        let fresh = fresh_slots.len() as f64;
        assert!(
            fresh >= 256.0,
            "only {fresh} of our slots landed above the arenas: the arenas did not move the maps"
        );
        assert!(
            pte as f64 >= fresh * 0.95,
            "{pte} PTE pages for {fresh} never-mapped 2 MiB slots (want within 5 %)"
        );
        // One PMD page per new 1 GiB slot, give or take the one the arenas' end shares with
        // space mapped before.
        assert!(
            pmd <= fresh_gib.len() + 1 && pmd + 1 >= fresh_gib.len(),
            "{pmd} PMD pages for {} new 1 GiB slots",
            fresh_gib.len()
        );
    }
    // PageTables counts every page table (user ones too): it must have grown by about the
    // kernel tables we saw, give or take user-space page tables of other processes coming and
    // going (a compile on the same box moves it by a few MB).
    assert!(
        pt_delta_kb as f64 >= 0.8 * 4.0 * all_pt as f64,
        "PageTables grew {pt_delta_kb} kB for {all_pt} table pages"
    );
}

/// The kprobe rung cannot attach on the reference kernel (no `CONFIG_KPROBES`), but its programs
/// still go through the verifier here, so a box with kprobes does not meet them untested.
#[test]
fn kprobe_rung_programs_pass_the_verifier() {
    if !privileged() {
        return;
    }
    let refused = vmtrace::probe::loader::verify_kprobe_programs().expect("probe object loads");
    assert!(refused.is_empty(), "refused by the verifier: {refused:?}");
}

/// The probes load in a process with no tokio runtime (this test's), and their programs write
/// events. The log ring's fd was closed there before the programs were loaded, so the verifier
/// refused the first program ("fd N is not pointing to valid bpf_map"); in a process where a
/// map took the freed number, the programs would have logged into that map.
#[test]
fn probes_load_and_fire_in_a_process_without_a_runtime() {
    if !privileged() {
        return;
    }
    assert!(tokio::runtime::Handle::try_current().is_err());
    let names = vmtrace::probe::ladder::logical_names();
    let mut probes = vmtrace::probe::loader::LoadedProbes::load_and_attach(1 << 22, &names)
        .expect("probes load and attach without a runtime");
    // Files opened after the load take the lowest free fds, the ones a dropped map would free.
    let _files: Vec<std::fs::File> = (0..8)
        .map(|_| std::fs::File::open("/proc/self/stat").unwrap())
        .collect();
    let mut rings = probes.take_rings().expect("event rings");
    let status = Command::new(VMTRACE)
        .args(["stress", "fix-size", "--threads", "1", "-d", "1s"])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let events: usize = rings
        .iter_mut()
        .map(|r| std::iter::from_fn(|| r.next().map(|_| ())).count())
        .sum();
    // Nothing drains the rings during the stress, so most events are dropped as lost; the
    // count only shows that they fired.
    let lost: u64 = probes.lost().unwrap().iter().flatten().sum();
    println!("{events} ring items and {lost} lost after a 1 s fix-size stress");
    assert!(events > 100, "only {events} ring items");
}
