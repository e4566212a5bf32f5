//! End to end: `vmtrace serve` scraped by a real Prometheus (1 s interval) while
//! `vmtrace stress` runs and idle and half-written HTTP connections are held open. Checks the
//! allocation counter rose by at least the stress's ops in Prometheus, the lazy-pages gauge and
//! the size histogram have samples, lost events stayed zero, /metrics answered within 1 s,
//! every dashboard expression runs, /healthz, and a clean exit on SIGTERM.
//! Needs root; run with `--release -- --test-threads=1`.

mod common;

use common::privileged;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_vmtrace");

/// A child process killed (and reaped) on drop, so a failing assertion leaves nothing behind.
struct Guard(Option<Child>);

impl Guard {
    fn pid(&self) -> i32 {
        self.0.as_ref().map_or(0, |c| c.id() as i32)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// GET over HTTP/1.0 (no chunked replies); `(status, body)`.
fn get(addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < within {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("timed out after {within:?} waiting for {what}");
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query; the parsed `data.result` array, or the error Prometheus gave.
fn query(prom: SocketAddr, q: &str) -> Result<Vec<serde_json::Value>, String> {
    let (status, body) = get(
        prom,
        &format!("/api/v1/query?query={}", urlencode(q)),
        Duration::from_secs(5),
    )
    .map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    if status != 200 || v["status"] != "success" {
        return Err(format!("{status}: {body}"));
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

/// The first sample's value of a query, if any.
fn scalar(prom: SocketAddr, q: &str) -> Option<f64> {
    query(prom, q).ok()?.first()?["value"][1]
        .as_str()?
        .parse()
        .ok()
}

fn start_prometheus(dir: &Path, target: SocketAddr, port: u16) -> Guard {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: vmtrace\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .expect("write prometheus.yml");
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("log file");
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("prometheus starts (cargo xtask setup installs it)");
    Guard(Some(child))
}

#[test]
fn serve_is_scraped_by_prometheus_while_stress_runs() {
    if !privileged() {
        return;
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    let serve_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let serve_log = tmp.path().join("serve.log");
    let mut serve = Guard(Some(
        Command::new(BIN)
            .args(["serve", "--listen", &serve_addr.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&serve_log).expect("log"))
            .spawn()
            .expect("vmtrace serve starts"),
    ));
    wait_for("/healthz", Duration::from_secs(30), || {
        matches!(
            get(serve_addr, "/healthz", Duration::from_secs(1)),
            Ok((200, _))
        )
    });
    // Every thread gave up its capabilities once the probes were attached.
    for task in std::fs::read_dir(format!("/proc/{}/task", serve.pid())).expect("tasks") {
        let status =
            std::fs::read_to_string(task.expect("task").path().join("status")).unwrap_or_default();
        let eff = status
            .lines()
            .find(|l| l.starts_with("CapEff:"))
            .unwrap_or("");
        assert!(
            eff.ends_with("0000000000000000"),
            "a serve thread kept capabilities: {eff}"
        );
    }

    let prom_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let _prom = start_prometheus(tmp.path(), serve_addr, prom_addr.port());
    wait_for("prometheus ready", Duration::from_secs(60), || {
        matches!(
            get(prom_addr, "/-/ready", Duration::from_secs(1)),
            Ok((200, _))
        )
    });
    wait_for("a first scrape", Duration::from_secs(30), || {
        scalar(prom_addr, "vmtrace_allocations_total").is_some()
    });
    // Let a scrape land after serve has settled, then take the starting value.
    std::thread::sleep(Duration::from_millis(1500));
    let before = scalar(prom_addr, "vmtrace_allocations_total").expect("counter");

    // Slow clients: idle connections and half-written requests, held through the stress.
    let mut held = Vec::new();
    for i in 0..64 {
        let mut s = TcpStream::connect(serve_addr).expect("connect");
        if i % 2 == 1 {
            let _ = s.write_all(b"GET /metr");
        }
        held.push(s);
    }
    let stress = Command::new(BIN)
        .args(["stress", "fix-size", "--loops", "3000", "--json"])
        .stderr(Stdio::inherit())
        .output()
        .expect("stress runs");
    assert!(stress.status.success(), "stress failed");
    let report: serde_json::Value =
        serde_json::from_slice(&stress.stdout).expect("stress --json prints JSON");
    let ops = report["total_ops"].as_f64().expect("total_ops");

    let t = Instant::now();
    let (status, body) = get(serve_addr, "/metrics", Duration::from_secs(2)).expect("/metrics");
    let took = t.elapsed();
    assert_eq!(status, 200);
    assert!(
        took < Duration::from_secs(1),
        "/metrics took {took:?} with slow clients open"
    );
    assert!(body.contains("vmtrace_allocations_total"));

    let mut rose = 0.0;
    wait_for(
        "the counter to rise by the stress ops",
        Duration::from_secs(20),
        || {
            rose = scalar(prom_addr, "vmtrace_allocations_total").unwrap_or(0.0) - before;
            rose >= ops
        },
    );
    eprintln!(
        "serve e2e: vmtrace_allocations_total rose by {rose} in Prometheus; stress reported {ops} ops; /metrics took {took:?} with {} slow connections open",
        held.len()
    );
    drop(held);
    assert!(
        !query(prom_addr, "vmtrace_lazy_pages")
            .expect("query")
            .is_empty(),
        "no lazy-pages samples"
    );
    let sizes = scalar(prom_addr, "vmtrace_allocation_size_bytes_count").unwrap_or(0.0);
    assert!(
        sizes >= ops,
        "size histogram has {sizes} observations, want >= {ops}"
    );
    let lost = scalar(prom_addr, "sum(vmtrace_events_lost_total)").unwrap_or(f64::NAN);
    assert_eq!(lost, 0.0, "events were lost");

    // Every dashboard expression runs against this Prometheus.
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards/vmtrace.json"),
        )
        .expect("dashboard"),
    )
    .expect("dashboard JSON");
    let mut n = 0;
    for p in dash["panels"].as_array().into_iter().flatten() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let Some(e) = t["expr"].as_str() else {
                continue;
            };
            let e = e
                .replace("$instance", ".*")
                .replace("$__rate_interval", "1m");
            if let Err(why) = query(prom_addr, &e) {
                panic!("panel {}: {e}: {why}", p["title"]);
            }
            n += 1;
        }
    }
    assert!(n >= 10, "only {n} dashboard expressions");

    // Clean stop: SIGTERM detaches the probes and exits 0.
    // SAFETY: kill on our own child's pid.
    assert_eq!(unsafe { libc::kill(serve.pid(), libc::SIGTERM) }, 0);
    let mut child = serve.0.take().expect("child");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve did not exit within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(&serve_log).unwrap_or_default();
    assert!(status.success(), "serve exited {status}: {log}");
    assert!(log.contains("probes detached"), "{log}");
}
