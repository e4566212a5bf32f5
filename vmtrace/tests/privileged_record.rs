//! Privileged end-to-end tests of `vmtrace record` on the running kernel.
//!
//! They load the real probes, drive a real workload and check the trace against the kernel's own
//! view: the tracepoint `format` files, `/sys` CPU lists, the kernel's run counts of each BPF
//! program (`kernel.bpf_stats_enabled`), and `/proc/vmallocinfo`. Run one at a time
//! (`--test-threads=1`): they share kernel settings. Without BPF privileges they skip loudly,
//! unless `VMTRACE_REQUIRE_PRIVILEGED=1` (set by `cargo xtask test` as root), where they fail.

mod common;

use common::privileged;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vmtrace::trace::{Header, Record, StopReason, TraceReader};

const VMTRACE: &str = env!("CARGO_BIN_EXE_vmtrace");

/// Sets a sysctl for the test and puts the old value back on drop.
struct Sysctl {
    path: &'static str,
    old: String,
    /// Held until the value is restored: two tests run side by side would each read the
    /// other's value as the old one, and the later restore would leave the setting changed.
    _serial: std::sync::MutexGuard<'static, ()>,
}

static SYSCTL_SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Sysctl {
    fn set(path: &'static str, value: &str) -> Self {
        let serial = SYSCTL_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::fs::read_to_string(path).unwrap().trim().to_string();
        std::fs::write(path, value).unwrap();
        Sysctl {
            path,
            old,
            _serial: serial,
        }
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, &self.old);
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory effects.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}

fn read_trace(path: &Path) -> (Header, Vec<Record>) {
    let file = std::fs::File::open(path).unwrap();
    let mut reader = TraceReader::new(std::io::BufReader::new(file));
    let header = reader.read_header().unwrap();
    let records = reader.map(|r| r.unwrap()).collect();
    (header, records)
}

fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("vmtrace-test")
        .tempdir()
        .unwrap()
}

/// Offsets straight from the format file, parsed here independently of the library.
fn format_offsets(category: &str, name: &str) -> Vec<(String, u16)> {
    let text = std::fs::read_to_string(format!(
        "/sys/kernel/tracing/events/{category}/{name}/format"
    ))
    .unwrap();
    text.lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("field:")?;
            let (decl, rest) = l.split_once(';')?;
            let name = decl.split_whitespace().last()?.to_string();
            let off = rest
                .split("offset:")
                .nth(1)?
                .split(';')
                .next()?
                .parse()
                .ok()?;
            (!name.starts_with("common_")).then_some((name, off))
        })
        .collect()
}

#[test]
fn record_fix_size_stress_matches_the_kernel() {
    fix_size_stress_matches_the_kernel(None);
}

/// The same against the perf tracepoint programs, the fallback where raw tracepoints are
/// refused: both attach paths must give the kernel's view.
#[test]
fn record_on_perf_tracepoints_matches_the_kernel() {
    fix_size_stress_matches_the_kernel(Some("perf"));
}

fn fix_size_stress_matches_the_kernel(mode: Option<&str>) {
    if !privileged() {
        return;
    }
    let dir = tmpdir();
    let out = dir.path().join("t.jsonl");
    let _stats = Sysctl::set("/proc/sys/kernel/bpf_stats_enabled", "1");
    let mut cmd = Command::new(VMTRACE);
    if let Some(mode) = mode {
        cmd.env("VMTRACE_TRACEPOINTS", mode);
    }
    let status = cmd
        .args(["record", "-o"])
        .arg(&out)
        .args([
            "--", VMTRACE, "stress", "fix-size", "--pages", "16", "--loops", "20000",
        ])
        .status()
        .unwrap();
    assert!(status.success(), "vmtrace record failed: {status}");
    common::assert_trace_valid(&out);
    let (header, records) = read_trace(&out);
    for p in header.probes.iter().filter(|p| p.logical.is_none()) {
        assert_eq!(
            p.attach.as_deref(),
            Some(common::expected_attach(mode == Some("perf"))),
            "{}: {:?}",
            p.probe,
            p.attach_fallback
        );
        if mode == Some("perf") {
            let why = p.attach_fallback.as_deref().unwrap_or("");
            assert!(why.contains("VMTRACE_TRACEPOINTS=perf"), "{why}");
        }
    }

    // Header against /sys and tracefs.
    let cpus = |f: &str| {
        vmtrace::host::system::parse_cpulist(&std::fs::read_to_string(f).unwrap()).unwrap()
    };
    let possible = cpus("/sys/devices/system/cpu/possible");
    let online = cpus("/sys/devices/system/cpu/online");
    assert_eq!(header.system.possible_cpus, possible);
    assert_eq!(header.system.online_cpus, online);
    assert_eq!(header.system.page_size, page_size());
    let uname = Command::new("uname").arg("-r").output().unwrap();
    assert_eq!(
        header.system.kernel_release,
        String::from_utf8_lossy(&uname.stdout).trim()
    );
    let nodes = possible.clamp(1, 128);
    assert_eq!(header.vmap.nr_vmap_nodes, nodes);
    assert_eq!(
        header.vmap.zone_size,
        if nodes > 1 { 16 * page_size() } else { 1 }
    );
    let fls = 32 - online.leading_zeros() as u64;
    assert_eq!(
        header.vmap.lazy_max_pages_computed,
        fls * (32 << 20) / page_size()
    );
    assert_eq!(
        header.vmap.lazy_max_pages_tracepoint,
        Some(header.vmap.lazy_max_pages_computed),
        "the kernel's nr_lazy_max differs from fls(online) * 32 MiB"
    );
    // The ladder probes (entries with `logical`) are checked in privileged_probes.rs.
    for probe in header.probes.iter().filter(|p| p.logical.is_none()) {
        let (cat, name) = probe.probe.split_once(':').unwrap();
        let expected = format_offsets(cat, name);
        for f in &probe.fields {
            let off = expected.iter().find(|(n, _)| *n == f.name).map(|(_, o)| *o);
            assert_eq!(off, Some(f.offset), "{}: field {}", probe.probe, f.name);
        }
        assert_eq!(
            probe.fields.len(),
            expected.len(),
            "{}: not every field is carried",
            probe.probe
        );
        assert_eq!(probe.rung, "tracepoint");
    }
    let lo = header
        .vmap
        .vmalloc_start
        .expect("calibration saw no allocation")
        .0;
    let hi = header
        .vmap
        .vmalloc_end
        .expect("calibration saw no allocation")
        .0;
    assert!(lo < hi);

    // Events: the exact documented size, at least once per loop.
    let area = vmtrace::workload::fix_size_area_bytes(16, page_size());
    let snapshot = match &records[0] {
        Record::Vmallocinfo(s) => s,
        other => panic!("second line is not the vmallocinfo snapshot: {other:?}"),
    };
    assert!(snapshot.real_addresses, "snapshot addresses are hashed");
    let mut known: HashSet<u64> = snapshot.areas.iter().map(|a| a.start.0).collect();
    let (mut exact, mut frees, mut unmatched, mut early_unmatched) = (0u64, 0u64, Vec::new(), 0u64);
    let mut last_ts = 0;
    let in_range = |a: u64| a >= lo && a <= hi;
    for rec in &records[1..] {
        if let Some(ts) = rec.ts_ns() {
            assert!(ts >= last_ts, "events out of timestamp order at ts {ts}");
            last_ts = ts;
        }
        match rec {
            Record::Alloc(a) if a.failed == 0 => {
                assert!(
                    in_range(a.addr.0),
                    "alloc {} outside VMALLOC {lo:#x}..{hi:#x}",
                    a.addr
                );
                known.insert(a.addr.0);
                if a.size == area {
                    exact += 1;
                }
            }
            Record::Free(f) => {
                frees += 1;
                assert!(
                    in_range(f.va_start.0),
                    "free {} outside VMALLOC",
                    f.va_start
                );
                // Before the snapshot read ended, a free may name an area allocated before attach
                // and purged before the read: neither the snapshot nor an event can show it.
                if !known.contains(&f.va_start.0) {
                    if f.ctx.ts_ns > snapshot.ts_end_ns {
                        unmatched.push(f.va_start);
                    } else {
                        early_unmatched += 1;
                    }
                }
            }
            Record::Purge(p) if p.npurged > 0 => {
                assert!(
                    in_range(p.start.0) && in_range(p.end.0 - 1),
                    "purge range outside VMALLOC"
                );
            }
            _ => {}
        }
    }
    assert!(
        exact >= 20_000,
        "only {exact} allocations of {area} bytes, expected >= 20000"
    );
    assert!(frees >= 20_000, "only {frees} frees");
    // Two kernel blind spots can leave a free with no known area, both from other activity on
    // the machine, never from the stress: per-CPU chunks (`pcpu_get_vm_areas`) are allocated
    // without the alloc tracepoint, and /proc/vmallocinfo skips areas still marked
    // VM_UNINITIALIZED (a vmalloc in progress while the snapshot was read). Tolerate one in
    // 10,000 frees (at least 2), and show them.
    let tolerated = (frees / 10_000).max(2) as usize;
    assert!(
        unmatched.len() <= tolerated,
        "{} frees of unknown areas (tolerated {tolerated}), e.g. {:?}",
        unmatched.len(),
        &unmatched[..unmatched.len().min(5)]
    );
    if !unmatched.is_empty() {
        eprintln!(
            "frees of areas neither allocated in the trace nor in the snapshot: {unmatched:?}"
        );
    }

    // Footer: nothing lost, and the kernel's run counts equal what we received.
    let Some(Record::Footer(footer)) = records.last() else {
        panic!("trace has no footer");
    };
    assert_eq!(footer.reason, StopReason::CommandExited);
    assert_eq!(footer.command_exit_code, Some(0));
    assert_eq!(
        footer.lost_total, 0,
        "lost events: {:?}",
        footer.lost_per_cpu
    );
    assert_eq!(footer.lost_per_cpu.len() as u32, possible);
    assert_eq!(footer.late_events, 0);
    let stats = footer
        .kernel_run_stats
        .as_ref()
        .expect("bpf_stats were enabled");
    let counted = |probe: &str| stats.iter().find(|s| s.probe == probe).unwrap().run_count;
    assert_eq!(counted("vmalloc:alloc_vmap_area"), footer.events.alloc);
    assert_eq!(
        counted("vmalloc:free_vmap_area_noflush"),
        footer.events.free
    );
    assert_eq!(counted("vmalloc:purge_vmap_area_lazy"), footer.events.purge);
    let n = |kind: &str| {
        records
            .iter()
            .filter(|r| vmtrace::trace::reader::kind_name(r) == kind)
            .count() as u64
    };
    assert_eq!(
        (n("alloc"), n("free"), n("purge")),
        (footer.events.alloc, footer.events.free, footer.events.purge)
    );
    eprintln!(
        "recorded {} alloc / {} free / {} purge; {exact} allocations of {area} B; \
         {early_unmatched} unmatched frees during the snapshot read; kernel run time {} ns/alloc event",
        footer.events.alloc,
        footer.events.free,
        footer.events.purge,
        stats[0].run_time_ns / stats[0].run_count.max(1)
    );
}

fn kptr() -> String {
    std::fs::read_to_string("/proc/sys/kernel/kptr_restrict")
        .unwrap()
        .trim()
        .to_string()
}

/// Starts a recording of a stress run, waits until events are being written, then signals it.
fn record_and_signal(signal: i32) -> (PathBuf, tempfile::TempDir, std::process::ExitStatus) {
    let dir = tmpdir();
    let out = dir.path().join("t.jsonl");
    let mut child = Command::new(VMTRACE)
        .args(["record", "-o"])
        .arg(&out)
        .args([
            "--",
            VMTRACE,
            "stress",
            "fix-size",
            "--pages",
            "4",
            "--duration",
            "20s",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    // Wait until the trace has more than header and snapshot, i.e. capture is under way.
    loop {
        let lines = std::fs::read(&out)
            .map(|b| b.iter().filter(|&&c| c == b'\n').count())
            .unwrap_or(0);
        if lines > 1000 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "recording never got going"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, signal) };
    let status = child.wait().unwrap();
    // Stop the stress command too (SIGKILL leaves it orphaned; SIGINT only stops the recorder).
    let _ = Command::new("pkill")
        .args(["-f", "stress fix-size --pages 4 --duration 20s"])
        .status();
    (out, dir, status)
}

#[test]
fn sigint_writes_a_footer_and_restores_kptr_restrict() {
    if !privileged() {
        return;
    }
    let _k = Sysctl::set("/proc/sys/kernel/kptr_restrict", "2");
    let (out, _dir, status) = record_and_signal(libc::SIGINT);
    assert_eq!(kptr(), "2", "kptr_restrict was not restored");
    assert!(status.success(), "exit status after SIGINT: {status}");
    common::assert_trace_valid(&out);
    let (_, records) = read_trace(&out);
    match records.last() {
        Some(Record::Footer(f)) => assert_eq!(f.reason, StopReason::Sigint),
        other => panic!("last record is not a footer: {other:?}"),
    }
    let Record::Vmallocinfo(snap) = &records[0] else {
        panic!("no snapshot")
    };
    assert!(
        snap.real_addresses,
        "kptr_restrict=2 was not lowered for the snapshot"
    );
}

#[test]
fn sigkill_leaves_complete_lines_and_kptr_restrict() {
    if !privileged() {
        return;
    }
    let _k = Sysctl::set("/proc/sys/kernel/kptr_restrict", "2");
    let (out, _dir, status) = record_and_signal(libc::SIGKILL);
    assert!(!status.success());
    assert_eq!(kptr(), "2", "kptr_restrict was not restored");
    let bytes = std::fs::read(&out).unwrap();
    let mut complete = 0;
    for (i, line) in bytes.split_inclusive(|&c| c == b'\n').enumerate() {
        if line.ends_with(b"\n") {
            serde_json::from_slice::<Record>(line)
                .unwrap_or_else(|e| panic!("line {} does not parse: {e}", i + 1));
            complete += 1;
        }
    }
    assert!(complete > 1000, "only {complete} complete lines");
    // The library reader agrees: everything up to a possibly cut last line reads.
    let summary =
        vmtrace::summary::summarize(std::io::BufReader::new(std::fs::File::open(&out).unwrap()))
            .unwrap();
    assert!(
        summary.cut_short_at_line.is_some(),
        "a killed recording cannot have a footer"
    );
    assert!(summary.lost_total.is_none());
}

#[test]
fn unprivileged_user_gets_one_clear_error_and_no_file() {
    if !privileged() {
        return;
    }
    let dir = tmpdir();
    // World-writable, so a missing file proves vmtrace did not create one, not that it could not.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let out = dir.path().join("t.jsonl");
    let result = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            VMTRACE,
            "record",
            "-o",
        ])
        .arg(&out)
        .args(["--duration", "1s"])
        .output()
        .expect("setpriv (util-linux) is needed");
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        !result.status.success(),
        "unprivileged record succeeded: {stderr}"
    );
    assert!(
        stderr.contains("insufficient privileges"),
        "unclear error: {stderr}"
    );
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "expected one line of error, got: {stderr}"
    );
    assert!(!out.exists(), "an output file was left behind");
}

/// Records 30 s of the highest event rate the stressor reaches on two threads into `file`
/// (plain or compressed by its extension) and checks that nothing was lost; returns the events
/// and the file's size in bytes.
fn sustained_capture(file: &str) -> (u64, u64) {
    let dir = tmpdir();
    let out = dir.path().join(file);
    let output = Command::new(VMTRACE)
        .args(["record", "--json", "-o"])
        .arg(&out)
        .args([
            "--",
            VMTRACE,
            "stress",
            "fix-size",
            "--pages",
            "1",
            "--threads",
            "2",
            "--duration",
            "30s",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "record failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let mut reader = TraceReader::new(vmtrace::trace::compress::open(&out).unwrap());
    reader.read_header().unwrap();
    let records: Vec<Record> = reader.map(|r| r.unwrap()).collect();
    let Some(Record::Footer(footer)) = records.last() else {
        panic!("no footer in {file}")
    };
    assert_eq!(
        footer.lost_total, 0,
        "{file}: lost {:?}",
        footer.lost_per_cpu
    );
    let first = records.iter().find_map(Record::ts_ns).unwrap();
    let last = records.iter().rev().find_map(Record::ts_ns).unwrap();
    let secs = (last - first) as f64 / 1e9;
    assert!(secs > 25.0, "{file}: recording covered only {secs:.1} s");
    let bytes = std::fs::metadata(&out).unwrap().len();
    let events = footer.events.total();
    eprintln!(
        "sustained {file}: {events} events in {secs:.1} s = {:.0} events/s, 0 lost, {:.1} bytes/event; \
         stress/record output: {}",
        events as f64 / secs,
        bytes as f64 / events as f64,
        stdout.lines().collect::<Vec<_>>().join(" | ")
    );
    (events, bytes)
}

/// The highest event rate the stressor reaches on two threads, for 30 s, with nothing lost,
/// in plain JSON Lines and in `.jsonl.zst` (compressed on its own thread), which must take at
/// least 8 times fewer bytes per event.
#[test]
fn sustained_two_thread_stress_loses_nothing_plain_or_compressed() {
    if !privileged() {
        return;
    }
    let (events, bytes) = sustained_capture("t.jsonl");
    let plain = bytes as f64 / events as f64;
    let (events, bytes) = sustained_capture("t.jsonl.zst");
    let zst = bytes as f64 / events as f64;
    eprintln!(
        "bytes per event: plain {plain:.1}, zstd {zst:.1} ({:.1}x)",
        plain / zst
    );
    assert!(
        zst * 8.0 <= plain,
        "{zst:.1} bytes per event compressed against {plain:.1} plain: under 8x"
    );
}

/// vmtrace must not blind other tracers: a tracepoint program returning 0 would suppress the
/// event for every perf user of that tracepoint.
#[test]
fn perf_still_sees_vmalloc_events_while_recording() {
    if !privileged() {
        return;
    }
    let dir = tmpdir();
    let out = dir.path().join("t.jsonl");
    let perf_data = dir.path().join("perf.data");
    let mut rec = Command::new(VMTRACE)
        .args(["record", "-q", "--duration", "20s", "-o"])
        .arg(&out)
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "recording never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let perf = Command::new("perf")
        .args(["record", "-q", "-e", "vmalloc:alloc_vmap_area", "-a", "-o"])
        .arg(&perf_data)
        .args([
            "--", VMTRACE, "stress", "fix-size", "--pages", "4", "--loops", "2000",
        ])
        .stdout(Stdio::null())
        .status()
        .expect("perf (linux-perf) is needed");
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(rec.id() as i32, libc::SIGINT) };
    assert!(rec.wait().unwrap().success());
    assert!(perf.success(), "perf record failed: {perf}");
    let script = Command::new("perf")
        .args(["script", "-i"])
        .arg(&perf_data)
        .output()
        .unwrap();
    let samples = String::from_utf8_lossy(&script.stdout)
        .lines()
        .filter(|l| l.contains("alloc_vmap_area"))
        .count();
    assert!(
        samples >= 2000,
        "perf saw only {samples} alloc_vmap_area events while vmtrace recorded"
    );
}

/// `--allocinfo-interval` samples the allocinfo file at the start, on the interval and at the
/// end; the sample's page-table and vmalloc figures are those of the file. This kernel has no
/// /proc/allocinfo, so the sampled file is a fixture, and the real path must give one warning
/// that says why and a trace without samples.
#[test]
fn allocinfo_samples_follow_the_file_and_a_missing_file_is_explained() {
    if !privileged() {
        return;
    }
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/allocinfo/v2.txt");
    let expected = vmtrace::allocinfo::parse(
        "v2.txt",
        &std::fs::read(&fixture).unwrap(),
        vmtrace::allocinfo::Mode::Lenient,
    )
    .unwrap();
    let dir = tmpdir();
    let out = dir.path().join("t.jsonl");
    let st = Command::new(VMTRACE)
        .args([
            "record",
            "-q",
            "--duration",
            "1.2s",
            "--allocinfo-interval",
            "0.3s",
            "--allocinfo-path",
        ])
        .arg(&fixture)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    common::assert_trace_valid(&out);
    let (_, records) = read_trace(&out);
    let samples: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Allocinfo(a) => Some(a),
            _ => None,
        })
        .collect();
    assert!(
        samples.len() >= 4,
        "only {} allocinfo samples in 1.2 s at 0.3 s",
        samples.len()
    );
    for s in &samples {
        assert_eq!(s.pagetable, expected.pagetable());
        assert_eq!(s.total, expected.total());
        assert!(!s.vmalloc_tags.is_empty());
        assert!(s.vmalloc_tags.iter().all(|t| t.key.file == "mm/vmalloc.c"));
    }
    assert!(samples.windows(2).all(|w| w[0].ts_ns < w[1].ts_ns));

    if std::path::Path::new("/proc/allocinfo").exists() {
        return;
    }
    let out2 = dir.path().join("t2.jsonl");
    let o = Command::new(VMTRACE)
        .args([
            "record",
            "-q",
            "--duration",
            "0.5s",
            "--allocinfo-interval",
            "0.1s",
            "-o",
        ])
        .arg(&out2)
        .output()
        .unwrap();
    assert!(o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        stderr.matches("not sampling allocinfo").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("CONFIG_MEM_ALLOC_PROFILING"), "{stderr}");
    let (_, records) = read_trace(&out2);
    assert!(!records.iter().any(|r| matches!(r, Record::Allocinfo(_))));
}
