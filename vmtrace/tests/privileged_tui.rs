//! End to end: `vmtrace top` in a real terminal (tmux), live while `vmtrace stress` runs and
//! on a replay of the bundled trace. Captures the pane twice, checks that the counts moved and
//! are non-zero, quits with `q` and checks the terminal came back (no raw mode, cursor shown,
//! main screen). Needs root for the live half; run with `--release -- --test-threads=1`.

mod common;

use common::privileged;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_vmtrace");

/// A detached tmux session, killed on drop.
struct Tmux {
    name: String,
}

impl Tmux {
    fn start(tag: &str, command: &str) -> Self {
        let name = format!("vmtrace-tui-{}-{tag}", std::process::id());
        // After top exits, the shell reports its status and the terminal modes, then waits so
        // the pane can still be captured.
        let script =
            format!("{command}; echo EXIT=$?; echo STTY: $(stty -a | tr '\\n' ' '); sleep 60");
        let ok = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                &name,
                "-x",
                "160",
                "-y",
                "50",
                &script,
            ])
            .status()
            .expect("tmux runs (installed by `cargo xtask setup`)")
            .success();
        assert!(ok, "tmux new-session failed");
        Self { name }
    }

    fn capture(&self) -> String {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.name])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn display(&self, format: &str) -> String {
        let out = Command::new("tmux")
            .args(["display-message", "-p", "-t", &self.name, format])
            .output()
            .expect("tmux display-message");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn keys(&self, keys: &str) {
        Command::new("tmux")
            .args(["send-keys", "-t", &self.name, keys])
            .status()
            .expect("tmux send-keys");
    }

    /// Waits until the pane shows `needle`; returns the capture.
    fn wait_for(&self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let c = self.capture();
            if c.contains(needle) {
                return c;
            }
            assert!(
                Instant::now() < deadline,
                "`{needle}` did not appear within {within:?}; pane:\n{c}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.name])
            .status();
    }
}

/// `(rate, total)` of the `alloc` and `free` lines of the rates panel.
fn counts(pane: &str) -> PaneCounts {
    let re = regex::Regex::new(r"(alloc|free)\s+(\d+)/s\s+total (\d+)").unwrap();
    let mut out = [(0, 0); 2];
    for c in re.captures_iter(pane) {
        let i = usize::from(&c[1] == "free");
        out[i] = (c[2].parse().unwrap(), c[3].parse().unwrap());
    }
    out
}

/// `(rate per second, total)` for alloc and free, as one pane capture shows them.
type PaneCounts = [(u64, u64); 2];

/// The model panel's first line: strict and explained placement in percent, and the
/// allocations compared; `None` while it says "n/a".
fn placement(pane: &str) -> Option<(f64, f64, u64)> {
    let re =
        regex::Regex::new(r"placement strict ([\d.]+)%\s+explained ([\d.]+)% \((\d+)\)").unwrap();
    let c = re.captures(pane)?;
    Some((c[1].parse().ok()?, c[2].parse().ok()?, c[3].parse().ok()?))
}

/// The model panel moved between two captures: numeric both times, more allocations
/// compared the second time.
fn assert_model_moved(first: &str, second: &str) {
    let (Some(a), Some(b)) = (placement(first), placement(second)) else {
        panic!("no numeric model agreement in the captures above");
    };
    assert!(
        b.2 > a.2,
        "model compared no more allocations: {a:?} → {b:?}"
    );
    for p in [a.0, a.1, b.0, b.1] {
        assert!((0.0..=100.0).contains(&p), "placement {p} %");
    }
}

/// Captures twice, quits, and checks counts and the restored terminal. Returns the counts of
/// both captures, and the captures.
fn watch_and_quit(t: &Tmux, ready: &str) -> (PaneCounts, PaneCounts, String, String) {
    t.wait_for(ready, Duration::from_secs(30));
    // Let a full second of rate buckets fill.
    std::thread::sleep(Duration::from_millis(2500));
    let first = t.capture();
    std::thread::sleep(Duration::from_millis(2000));
    let second = t.capture();
    let (a, b) = (counts(&first), counts(&second));
    eprintln!("first capture:\n{first}\nsecond capture:\n{second}");
    eprintln!("alloc/free (rate, total): first {a:?}, second {b:?}");
    assert_eq!(
        t.display("#{alternate_on}"),
        "1",
        "top draws on the alternate screen"
    );
    t.keys("q");
    let end = t.wait_for("STTY:", Duration::from_secs(10));
    assert!(end.contains("EXIT=0"), "top did not exit cleanly:\n{end}");
    // `stty -a` is wider than the pane, so the capture wraps it: join the wrapped lines.
    let stty: String = end
        .find("STTY:")
        .map(|i| end[i..].lines().collect::<Vec<_>>().join(""))
        .unwrap_or_default();
    assert!(
        stty.contains(" icanon") && stty.contains(" echo"),
        "terminal left in raw mode: {stty}"
    );
    assert_eq!(t.display("#{alternate_on}"), "0", "alternate screen left");
    assert_eq!(t.display("#{cursor_flag}"), "1", "cursor shown again");
    (a, b, first, second)
}

fn assert_moved(a: [(u64, u64); 2], b: [(u64, u64); 2]) {
    for (i, kind) in ["alloc", "free"].iter().enumerate() {
        assert!(
            a[i].1 > 0 && b[i].1 > a[i].1,
            "{kind} total did not grow: {a:?} → {b:?}"
        );
        assert!(
            a[i].0 > 0 || b[i].0 > 0,
            "{kind} rate stayed 0: {a:?} → {b:?}"
        );
    }
}

#[test]
fn top_live_while_stress_runs() {
    if !privileged() {
        return;
    }
    let t = Tmux::start("live", &format!("{BIN} top"));
    t.wait_for("vmtrace top | live", Duration::from_secs(30));
    let mut stress = Command::new(BIN)
        .args(["stress", "fix-size", "--pages", "16", "--duration", "12s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("vmtrace stress starts");
    // The page probes start off; `t` attaches them and the panel gives their measured cost
    // and the probe's table pages beside the model's.
    t.wait_for("page probes off, t attaches", Duration::from_secs(10));
    t.keys("t");
    let pages = t.wait_for("ns/event", Duration::from_secs(10));
    eprintln!("after t:\n{pages}");
    let cost = regex::Regex::new(r"cost (\d+) ns/event, (\d+)/s, ([\d.]+) % of one CPU").unwrap();
    let c = cost.captures(&pages).expect("the cost line");
    let (ns, rate): (u64, u64) = (c[1].parse().unwrap(), c[2].parse().unwrap());
    assert!(ns > 0 && rate > 0, "page probe cost {ns} ns at {rate}/s");
    let pte = regex::Regex::new(r"pte table pages\s+(\d+)\s+(\d+)\s+(\d+)").unwrap();
    assert!(pte.is_match(&pages), "no numeric page-table row after t");
    // Detached and attached again: the programs stay loaded and are linked anew.
    t.keys("t");
    t.wait_for("page probes off, t attaches", Duration::from_secs(10));
    t.keys("t");
    t.wait_for("ns/event", Duration::from_secs(10));
    let (a, b, first, second) = watch_and_quit(&t, "vmtrace top | live");
    let _ = stress.kill();
    let _ = stress.wait();
    assert_moved(a, b);
    // The size panel shows the stress's own size (16 pages and the guard page) with the bulk
    // of the allocations, whatever its height: as the 17-32 row, or the merged tail from 17 on
    // when rows run out (top's own larger areas fill the buckets above).
    let row = regex::Regex::new(r"17(?:-32|\+)\s+(\d+)").unwrap();
    let bulk: u64 = row
        .captures(&second)
        .map(|c| c[1].parse().unwrap())
        .expect("no 17-32 or 17+ row in the size panel");
    assert!(
        bulk * 2 > b[0].1,
        "17 pages and up: {bulk} of {} allocations",
        b[0].1
    );
    // The model replays the live stream from the start snapshot: its figures are numbers that
    // move with the stream (docs/tui.md gives what they were under this stress).
    assert_model_moved(&first, &second);
}

#[test]
fn top_replays_the_bundled_trace() {
    if !privileged() {
        return;
    }
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/sample-trace.jsonl.zst");
    let t = Tmux::start("replay", &format!("{BIN} top --replay {trace} --loop"));
    let (a, b, first, second) = watch_and_quit(&t, "vmtrace top | replay");
    assert_moved(a, b);
    // Each round of the loop replays the model from the snapshot again, so the counts need
    // not grow between captures here; the figures must be numbers.
    assert!(placement(&first).is_some() && placement(&second).is_some());
}

#[test]
fn top_batch_mode_prints_screens_and_exits() {
    // No terminal and no root needed: --replay in batch mode.
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/sample-trace.jsonl.zst");
    let out = Command::new(BIN)
        .args(["top", "--replay", trace, "--loop", "-n", "2", "-d", "500ms"])
        .output()
        .expect("vmtrace top runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("vmtrace top | replay").count(), 2, "{text}");
    assert!(text.contains("lazy backlog") && text.contains("top callers"));
}

/// What `cargo xtask run` does for a user without privileges when stdout is not a terminal:
/// `vmtrace top --batch` falls back to the bundled trace under a banner giving the kernel's
/// reason. Run as `nobody` through setpriv, the same binary and arguments.
#[test]
fn unprivileged_top_replays_the_bundled_trace_with_a_banner() {
    if !privileged() {
        return;
    }
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            BIN,
        ])
        .args(["top", "--batch", "--iterations", "2", "--interval", "0.3s"])
        .output()
        .expect("setpriv (util-linux) is needed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("live capture unavailable")
            && stdout.contains("replaying the bundled trace"),
        "no fallback banner:\n{stdout}"
    );
    assert!(
        stdout.contains("insufficient privileges"),
        "banner does not give the reason:\n{stdout}"
    );
    assert!(
        stdout.contains("vmtrace top | replay"),
        "not replaying:\n{stdout}"
    );
}
