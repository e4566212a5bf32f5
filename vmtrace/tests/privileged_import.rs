//! `vmtrace import` against a native recording of the same events: one workload recorded at
//! once by `vmtrace record` and by `perf record -e vmalloc:…`, the `perf script` text imported
//! with the native recording's start snapshot as the dump.
//!
//! Needs root, BPF and perf (installed by `cargo xtask setup`). Run: `cargo test --release -p
//! vmtrace --test privileged_import -- --nocapture`.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::Command;

use common::privileged;
use vmtrace::trace::{AreaKind, Record, TraceReader};

const VMTRACE: &str = env!("CARGO_BIN_EXE_vmtrace");

fn records(path: &Path) -> Vec<Record> {
    TraceReader::new(vmtrace::trace::compress::open(path).unwrap())
        .map(|r| r.unwrap())
        .collect()
}

/// `(kind, address, time, CPU)` of each vmalloc event.
type Ev = (&'static str, u64, u64, u32);

fn events(records: &[Record]) -> Vec<Ev> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Alloc(a) => Some(("alloc", a.addr.0, a.ctx.ts_ns, a.ctx.cpu)),
            Record::Free(f) => Some(("free", f.va_start.0, f.ctx.ts_ns, f.ctx.cpu)),
            Record::Purge(p) => Some(("purge", p.start.0, p.ctx.ts_ns, p.ctx.cpu)),
            _ => None,
        })
        .collect()
}

fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and an owned timespec.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn strict(replay: &serde_json::Value, metric: &str) -> f64 {
    let s = &replay[0]["strict"][metric];
    100.0 * s["agreed"].as_f64().unwrap() / s["compared"].as_f64().unwrap()
}

#[test]
fn perf_script_imports_as_the_native_recording() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let native = dir.path().join("native.jsonl");
    let data = dir.path().join("perf.data");
    // perf 6.1 cannot stamp with CLOCK_BOOTTIME (`-k boot`); the monotonic clock differs from
    // it only by the time the machine was suspended, measured here.
    let offset = clock_ns(libc::CLOCK_BOOTTIME) - clock_ns(libc::CLOCK_MONOTONIC);
    let status = Command::new("perf")
        .args(["record", "-q", "-k", "mono", "-a", "-e"])
        .arg("vmalloc:alloc_vmap_area,vmalloc:free_vmap_area_noflush,vmalloc:purge_vmap_area_lazy")
        .arg("-o")
        .arg(&data)
        .args(["--", VMTRACE, "record", "-q", "--probes", "none", "-o"])
        .arg(&native)
        .args(["--", VMTRACE, "stress", "random-size", "--threads", "2"])
        .args(["--duration", "2s"])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("perf is installed by cargo xtask setup");
    assert!(status.success(), "perf record: {status}");
    let script = Command::new("perf")
        .args(["script", "--ns", "-i"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(script.status.success());
    let text = String::from_utf8(script.stdout).unwrap();

    let nat = records(&native);
    let nat_events = events(&nat);
    let (first, last) = (nat_events[0].2, nat_events.last().unwrap().2);
    // perf ran before the recorder attached and after it stopped: keep its lines within the
    // native recording's span.
    let mut window = String::new();
    for line in text.lines() {
        let Some(Ok(p)) = vmtrace::import::parse::prefix(line) else {
            continue;
        };
        let ts = p.ts_ns + offset;
        if (first..=last).contains(&ts) {
            window.push_str(line);
            window.push('\n');
        }
    }
    let txt = dir.path().join("perf.txt");
    std::fs::write(&txt, &window).unwrap();

    // The dump: the native recording's start snapshot, as /proc/vmallocinfo prints it.
    let Record::Vmallocinfo(snap) = &nat[1] else {
        panic!("no snapshot in the native recording");
    };
    let dump = dir.path().join("vmallocinfo.txt");
    let mut f = std::fs::File::create(&dump).unwrap();
    for a in &snap.areas {
        let what = match a.kind {
            AreaKind::Unpurged => "unpurged vm_area".to_string(),
            AreaKind::VmMapRam => "vm_map_ram".to_string(),
            AreaKind::Busy => format!(
                "{} {}",
                a.caller.as_deref().unwrap_or(""),
                a.flags.join(" ")
            ),
        };
        writeln!(f, "{}-{} {:7} {what}", a.start, a.end, a.size).unwrap();
    }
    drop(f);

    let Record::Header(h) = &nat[0] else {
        panic!("no header");
    };
    let cpus = h.system.possible_cpus.to_string();
    let imported = dir.path().join("imported.jsonl.zst");
    let out = Command::new(VMTRACE)
        .arg("import")
        .arg(&txt)
        .arg("--vmallocinfo")
        .arg(&dump)
        .args(["--cpus", &cpus, "-o"])
        .arg(&imported)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{}", String::from_utf8_lossy(&out.stderr));
    common::assert_trace_valid(&imported);
    let imp = records(&imported);
    let imp_events = events(&imp);

    // The same events in the same order, once every probe of the recorder is attached (it
    // attaches the three tracepoints one after another, so the first milliseconds of the
    // native recording lack the kinds attached last).
    let settled = nat_events
        .iter()
        .find(|e| e.0 == "free")
        .map(|e| e.2 + 10_000_000)
        .unwrap();
    let tail = last - 10_000_000;
    // The two tools stamp an event at different points of the tracepoint, so a time window
    // would cut them differently at its ends: anchor both ends on the same event instead.
    let s = nat_events.iter().position(|e| e.2 >= settled).unwrap();
    let e = nat_events.iter().rposition(|e| e.2 <= tail).unwrap();
    let find = |n: &Ev| -> usize {
        imp_events
            .iter()
            .enumerate()
            .filter(|(_, m)| m.0 == n.0 && m.1 == n.1)
            .min_by_key(|(_, m)| (m.2 + offset).abs_diff(n.2))
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("{n:?} is not in the imported trace"))
    };
    let (s2, e2) = (find(&nat_events[s]), find(&nat_events[e]));
    let strip = |ev: &[Ev]| -> Vec<(&'static str, u64, u32)> {
        ev.iter().map(|e| (e.0, e.1, e.3)).collect()
    };
    let a = strip(&nat_events[s..=e]);
    let b = strip(&imp_events[s2..=e2]);
    println!(
        "native {} events, imported {}; compared {} against {} in the settled window",
        nat_events.len(),
        imp_events.len(),
        a.len(),
        b.len()
    );
    assert!(a.len() > 10_000, "{} events", a.len());
    let count = |v: &[(&str, u64, u32)], k: &str| v.iter().filter(|e| e.0 == k).count();
    for k in ["alloc", "free", "purge"] {
        assert_eq!(count(&a, k), count(&b, k), "{k} count");
    }
    // The tools order events of different CPUs by their own stamps, so two events close in
    // time may swap; on one CPU the order is the kernel's, and must be the same.
    let cpus = a.iter().map(|e| e.2).max().unwrap_or(0);
    for cpu in 0..=cpus {
        let on = |v: &[(&'static str, u64, u32)]| -> Vec<(&'static str, u64)> {
            v.iter()
                .filter(|e| e.2 == cpu)
                .map(|e| (e.0, e.1))
                .collect()
        };
        let (x, y) = (on(&a), on(&b));
        let first = x.iter().zip(&y).position(|(p, q)| p != q);
        assert!(
            first.is_none() && x.len() == y.len(),
            "CPU {cpu}: sequences differ at {first:?} ({} and {} events)",
            x.len(),
            y.len()
        );
    }

    // Replay agrees with itself across the two sources.
    let rn = common::vmtrace_json(&["replay", "--json"], &native);
    let ri = common::vmtrace_json(&["replay", "--json"], &imported);
    for m in ["placement", "placement_after_warmup", "nr_lazy", "npurged"] {
        let (x, y) = (strict(&rn, m), strict(&ri, m));
        println!("strict {m}: native {x:.2} %, imported {y:.2} %");
        assert!((x - y).abs() <= 0.5, "{m}: native {x:.2}, imported {y:.2}");
    }
}
