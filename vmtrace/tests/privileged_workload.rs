//! Privileged: the vmap area sizes each `vmtrace stress` pattern documents, checked against the
//! running kernel's `/proc/vmallocinfo`, and the `vmtrace stress` command end to end.
//!
//! Each test holds the areas of some loop iterations alive (through the library API, the same code
//! the stress loop runs) and checks that the busy areas of the documented sizes, with the expected
//! caller, rose by at least the number held. `/proc/vmallocinfo` shows sizes (guard page included)
//! and callers even when addresses are hashed.
//!
//! Without root/CAP_BPF the tests print `SKIPPED: <reason>` and pass, unless
//! `VMTRACE_REQUIRE_PRIVILEGED=1`, which turns the skip into a failure (CI).

use std::collections::HashMap;
use std::io::Write as _;
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use vmtrace::workload::{
    fix_size_area_bytes, thread_stack_area_bytes, ArrayMap, Count, Held, MapSizing, Shape,
    SplitMix64, Workload, WorkloadError,
};

/// Busy areas of one size can also come and go in other processes while a test looks (another
/// `vmtrace stress`, thread exits): tolerated shortfall in a count that should rise by N.
const NOISE: u64 = 4;
/// Callers of the kernel stack allocation, depending on inlining and kernel version.
const STACK_CALLERS: &[&str] = &[
    "kernel_clone",
    "copy_process",
    "dup_task_struct",
    "alloc_thread_stack_node",
];
const MAP_CALLER: &str = "array_map_alloc";

/// The tests share kernel state; run them one at a time even without `--test-threads=1`.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Returns whether the test may go on; prints the skip reason, or panics when privileges are
/// required.
fn privileged(test: &str) -> bool {
    let ps = match vmtrace::workload::bpfmap::page_size() {
        Ok(ps) => ps,
        Err(e) => return skip(test, &format!("no page size: {e}")),
    };
    match ArrayMap::create(1, ps) {
        Ok(_) => {}
        Err(e @ WorkloadError::NotPermitted { .. }) => return skip(test, &e.to_string()),
        Err(e) => return skip(test, &format!("cannot create a BPF array map: {e:?}")),
    }
    if let Err(e) = std::fs::read_to_string("/proc/vmallocinfo") {
        return skip(test, &format!("cannot read /proc/vmallocinfo: {e}"));
    }
    true
}

fn skip(test: &str, reason: &str) -> bool {
    if std::env::var("VMTRACE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        panic!("{test}: privileges required (VMTRACE_REQUIRE_PRIVILEGED=1) but: {reason}");
    }
    // Straight to fd 2, past the test harness's output capture, so the skip is seen.
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED: {test}: {reason} ***\n");
    false
}

/// Busy vmap areas by (caller symbol, size in bytes). Lazily freed (`unpurged vm_area`) and
/// `vm_map_ram` lines are left out.
fn busy_areas() -> HashMap<(String, u64), u64> {
    let text = std::fs::read_to_string("/proc/vmallocinfo").expect("read /proc/vmallocinfo");
    let mut counts = HashMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(_range), Some(size), Some(caller)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let Ok(size) = size.parse::<u64>() else {
            continue;
        };
        let symbol = caller.split('+').next().unwrap_or(caller);
        if symbol == "unpurged" || symbol == "vm_map_ram" {
            continue;
        }
        *counts.entry((symbol.to_string(), size)).or_insert(0) += 1;
    }
    counts
}

/// [`busy_areas`] once the map areas stop changing: maps closed by an earlier test are freed from
/// a workqueue and would otherwise vanish from under a "before" snapshot.
fn settled_busy_areas() -> HashMap<(String, u64), u64> {
    let maps = |s: &HashMap<(String, u64), u64>| -> u64 {
        s.iter()
            .filter(|((c, _), _)| c == MAP_CALLER)
            .map(|(_, n)| n)
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = busy_areas();
    loop {
        std::thread::sleep(Duration::from_millis(30));
        let now = busy_areas();
        if maps(&now) == maps(&last) || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

fn count(snapshot: &HashMap<(String, u64), u64>, callers: &[&str], size: u64) -> u64 {
    callers
        .iter()
        .map(|c| snapshot.get(&(c.to_string(), size)).copied().unwrap_or(0))
        .sum()
}

/// How much busy areas of `size` by `callers` rose from `before` to now.
fn rise(before: &HashMap<(String, u64), u64>, callers: &[&str], size: u64) -> i64 {
    count(&busy_areas(), callers, size) as i64 - count(before, callers, size) as i64
}

fn hold(w: &Workload, loops: usize) -> Vec<Held> {
    let mut rng = SplitMix64::new(1);
    (0..loops)
        .map(|_| w.run_loop(&mut rng).expect("run one loop"))
        .collect()
}

/// Expected busy areas by size for the maps in `held`, from the documented formula.
fn expected_map_areas(w: &Workload, held: &[Held]) -> HashMap<u64, u64> {
    let mut want = HashMap::new();
    for pages in held.iter().flat_map(Held::map_pages) {
        for size in w.map_areas(pages).iter() {
            *want.entry(size).or_insert(0) += 1;
        }
    }
    want
}

fn assert_rises(before: &HashMap<(String, u64), u64>, want: &HashMap<u64, u64>, what: &str) {
    let now = busy_areas();
    for (&size, &n) in want {
        let got =
            count(&now, &[MAP_CALLER], size) as i64 - count(before, &[MAP_CALLER], size) as i64;
        assert!(
            got + NOISE as i64 >= n as i64,
            "{what}: expected {n} more busy {MAP_CALLER} areas of {size} bytes, /proc/vmallocinfo \
             shows {got} more"
        );
    }
    // And no other sizes: map areas of undocumented sizes did not rise by anything like that.
    let held: u64 = want.values().sum();
    let stray: i64 = now
        .iter()
        .filter(|((c, size), _)| c == MAP_CALLER && !want.contains_key(size))
        .map(|(k, &n)| n as i64 - before.get(k).copied().unwrap_or(0) as i64)
        .filter(|&d| d > 0)
        .sum();
    assert!(
        (stray as u64) <= held / 20 + NOISE,
        "{what}: {stray} busy {MAP_CALLER} areas of undocumented sizes appeared while {held} \
         were expected; documented sizes {:?}",
        want.keys().collect::<Vec<_>>()
    );
}

#[test]
fn fix_size_areas_match_the_kernel() {
    let _g = serial();
    if !privileged("fix_size_areas_match_the_kernel") {
        return;
    }
    for pages in [1, 16, 37, 600] {
        let w = Workload::new(Shape::FixSize { pages }).expect("workload");
        if w.sizing() == MapSizing::Exact {
            assert_eq!(
                w.area_bytes()[..],
                {
                    let mut v: Vec<u64> = w.map_areas(pages).iter().collect();
                    v.sort_unstable();
                    v
                }[..]
            );
            assert_eq!(
                w.map_areas(pages).main,
                fix_size_area_bytes(pages, w.page_size())
            );
        }
        let before = settled_busy_areas();
        let held = hold(&w, 24);
        let want = expected_map_areas(&w, &held);
        assert_eq!(want.len(), if pages >= 512 { 2 } else { 1 }, "{want:?}");
        assert_rises(&before, &want, &format!("fix-size --pages {pages}"));
        for size in w.area_bytes() {
            assert!(
                want.contains_key(&size),
                "documented size {size} not produced: {want:?}"
            );
        }
    }
}

#[test]
fn random_size_areas_match_the_kernel() {
    let _g = serial();
    if !privileged("random_size_areas_match_the_kernel") {
        return;
    }
    // Few sizes, many draws: every size is drawn about 20 times, so a formula off by a page
    // shows up both as missing documented sizes and as strays.
    let w = Workload::new(Shape::RandomSize { max_pages: 6 }).expect("workload");
    let documented = w.area_bytes();
    assert_eq!(documented.len(), 6, "{documented:?}");
    let before = settled_busy_areas();
    let held = hold(&w, 120);
    let want = expected_map_areas(&w, &held);
    assert_eq!(
        want.len(),
        6,
        "120 draws from 1..=6 pages gave only sizes {want:?}"
    );
    for size in want.keys() {
        assert!(
            documented.contains(size),
            "size {size} not in documented {documented:?}"
        );
    }
    assert_rises(&before, &want, "random-size --pages 6");
    // Reproducible from the seed.
    let again = hold(&w, 120);
    let pages = |h: &[Held]| h.iter().flat_map(Held::map_pages).collect::<Vec<_>>();
    assert_eq!(pages(&held), pages(&again));
}

#[test]
fn long_busy_list_keeps_and_churns_documented_sizes() {
    let _g = serial();
    if !privileged("long_busy_list_keeps_and_churns_documented_sizes") {
        return;
    }
    let keep = 500;
    let shape = Shape::LongBusyList {
        keep: Count {
            n: keep,
            explicit: true,
        },
        pages: 100,
    };
    let w = Workload::new(shape).expect("workload");
    let small = w.map_areas(1).main;
    let before = settled_busy_areas();
    let prepared = w.prepare(1).expect("prepare the kept maps");
    assert_eq!(prepared.live_areas(), keep);
    let kept = rise(&before, &[MAP_CALLER], small);
    assert!(
        kept + NOISE as i64 >= keep as i64,
        "{keep} kept maps, {kept} more {small}-byte areas"
    );
    let mid = busy_areas();
    let held = hold(&w, 16);
    let want = expected_map_areas(&w, &held);
    assert_eq!(want.get(&small), Some(&16));
    assert_eq!(want.len(), 2);
    assert_rises(&mid, &want, "long-busy-list churn");
    let mut documented = want.keys().copied().collect::<Vec<_>>();
    documented.sort_unstable();
    assert_eq!(w.area_bytes(), documented);
}

#[test]
fn full_fit_leaves_holes_and_fills_them_with_documented_sizes() {
    let _g = serial();
    if !privileged("full_fit_leaves_holes_and_fills_them_with_documented_sizes") {
        return;
    }
    let pairs = 300;
    let w = Workload::new(Shape::FullFit {
        pairs: Count {
            n: pairs,
            explicit: true,
        },
    })
    .expect("workload");
    let size = w.map_areas(1).main;
    assert_eq!(w.area_bytes(), vec![size]);
    let before = settled_busy_areas();
    let prepared = w.prepare(1).expect("fill");
    assert_eq!(prepared.live_areas(), pairs);
    // The junk half is freed from a workqueue: wait until only the kept half is busy.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut now = rise(&before, &[MAP_CALLER], size);
    while now > (pairs + NOISE) as i64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        now = rise(&before, &[MAP_CALLER], size);
    }
    assert!(
        (pairs as i64 - NOISE as i64..=(pairs + NOISE) as i64).contains(&now),
        "after freeing every other of {pairs} pairs, {now} more busy {size}-byte areas (want \
         about {pairs})"
    );
    let mid = busy_areas();
    let held = hold(&w, 16);
    assert_rises(&mid, &expected_map_areas(&w, &held), "full-fit churn");
}

#[test]
fn thread_churn_stacks_have_the_documented_size() {
    let _g = serial();
    if !privileged("thread_churn_stacks_have_the_documented_size") {
        return;
    }
    let batch = 64;
    let w = Workload::new(Shape::ThreadChurn { batch }).expect("workload");
    let size = thread_stack_area_bytes(w.page_size());
    assert_eq!(w.area_bytes(), vec![size]);
    let before = settled_busy_areas();
    let held = hold(&w, 1);
    assert_eq!(held[0].ops(), batch);
    let snapshot = busy_areas();
    drop(held);
    // Every kernel stack in the system has the documented size...
    let stacks: Vec<_> = snapshot
        .iter()
        .filter(|((c, _), _)| STACK_CALLERS.contains(&c.as_str()))
        .collect();
    assert!(
        !stacks.is_empty(),
        "no kernel stack areas (callers {STACK_CALLERS:?}) found"
    );
    for ((caller, s), n) in &stacks {
        assert_eq!(
            *s, size,
            "{n} stack areas by {caller} of {s} bytes, documented {size}"
        );
    }
    // ...and our 64 live threads added about that many (the kernel caches 2 freed stacks per CPU).
    let cached = 2 * std::thread::available_parallelism().map_or(64, |n| n.get() as u64);
    let got =
        count(&snapshot, STACK_CALLERS, size) as i64 - count(&before, STACK_CALLERS, size) as i64;
    let floor = batch as i64 - cached as i64 - 4 * NOISE as i64;
    assert!(
        got >= floor,
        "{batch} live threads added only {got} stack areas (want >= {floor})"
    );
}

fn vmtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(args)
        .output()
        .expect("run the vmtrace binary")
}

fn json(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "vmtrace failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "--json must print one line: {stdout}"
    );
    serde_json::from_str(&stdout).expect("stdout is one JSON object")
}

#[test]
fn stress_command_reports_json() {
    let _g = serial();
    if !privileged("stress_command_reports_json") {
        return;
    }
    let v = json(&vmtrace(&[
        "stress", "fix-size", "--pages", "16", "--loops", "2000", "-t", "2", "--json",
    ]));
    let ps = v["page_size"].as_u64().expect("page_size");
    assert_eq!(v["pattern"], "fix-size");
    assert_eq!(v["threads"], 2);
    assert_eq!(v["total_ops"], 4000);
    assert_eq!(
        v["area_bytes"],
        serde_json::json!([fix_size_area_bytes(16, ps)])
    );
    assert!(v["ops_per_sec"].as_f64().is_some_and(|r| r > 0.0), "{v}");
    assert!(v["elapsed_s"].as_f64().is_some_and(|r| r > 0.0), "{v}");
    let per = v["per_thread"].as_array().expect("per_thread");
    assert_eq!(per.len(), 2);
    for (i, t) in per.iter().enumerate() {
        assert_eq!(t["thread"], i);
        assert_eq!(t["ops"], 2000);
        assert!(t["ops_per_sec"].as_f64().is_some_and(|r| r > 0.0), "{t}");
    }

    let v = json(&vmtrace(&[
        "stress",
        "thread-churn",
        "--batch",
        "4",
        "--duration",
        "200ms",
        "--json",
    ]));
    assert_eq!(
        v["area_bytes"],
        serde_json::json!([thread_stack_area_bytes(ps)])
    );
    let ops = v["total_ops"].as_u64().expect("total_ops");
    assert!(
        ops > 0 && ops.is_multiple_of(4),
        "thread-churn ops {ops} should be whole batches of 4"
    );
    let elapsed = v["elapsed_s"].as_f64().expect("elapsed_s");
    assert!(
        (0.2..2.0).contains(&elapsed),
        "--duration 200ms ran {elapsed} s"
    );
}

#[test]
fn stress_without_cap_bpf_fails_with_one_reason() {
    let _g = serial();
    if !privileged("stress_without_cap_bpf_fails_with_one_reason") {
        return;
    }
    // Drop CAP_BPF and CAP_SYS_ADMIN from the bounding set: as root, exec then leaves them out.
    let out = Command::new("setpriv")
        .args([
            "--bounding-set=-bpf,-sys_admin",
            "--inh-caps=-bpf,-sys_admin",
        ])
        .arg(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["stress", "fix-size", "--loops", "10", "--json"])
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            skip(
                "stress_without_cap_bpf_fails_with_one_reason",
                &format!("no setpriv: {e}"),
            );
            return;
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("setpriv:") {
        skip("stress_without_cap_bpf_fails_with_one_reason", &stderr);
        return;
    }
    assert!(
        !out.status.success(),
        "must fail without CAP_BPF; stderr: {stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "no output on failure: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains("CAP_BPF") && stderr.contains("EPERM"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one reason: {stderr}");
}

#[test]
fn fd_limit_is_reported_or_respected() {
    let _g = serial();
    if !privileged("fd_limit_is_reported_or_respected") {
        return;
    }
    let limited = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vmtrace"));
        cmd.args(args);
        // SAFETY: setrlimit is async-signal-safe and touches only the child.
        unsafe {
            use std::os::unix::process::CommandExt as _;
            cmd.pre_exec(|| {
                let rl = libc::rlimit {
                    rlim_cur: 256,
                    rlim_max: 256,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.output().expect("run vmtrace")
    };
    // An explicit count over the limit is an error that names the limit.
    let out = limited(&["stress", "long-busy-list", "--keep", "1000", "--loops", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "--keep 1000 under a 256-fd limit must fail: {stderr}"
    );
    assert!(
        stderr.contains("RLIMIT_NOFILE") && stderr.contains("--keep 1000"),
        "{stderr}"
    );
    // A default count is lowered to fit, with a note.
    let v = json(&limited(&["stress", "full-fit", "--loops", "10", "--json"]));
    let live = v["live_areas"].as_u64().expect("live_areas");
    assert!(
        (1..=100).contains(&live),
        "full-fit under a 256-fd limit kept {live} maps"
    );
    assert!(v["notes"].to_string().contains("RLIMIT_NOFILE"), "{v}");
    assert_eq!(v["total_ops"], 10);
}
