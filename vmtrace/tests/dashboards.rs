//! The shipped fleet files are checked: `promtool check config` and `check rules` on the
//! examples, `promtool check metrics` on a unit-built registry's exposition, and the Grafana
//! dashboard parses, has its datasource and instance variables, and refers only to metrics the
//! exporter emits. (The privileged end-to-end test also runs every expression against a live
//! Prometheus.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use vmtrace::export::{Features, Metrics};

fn dashboards() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards")
}

/// `promtool` when installed (`cargo xtask setup` installs Debian's prometheus); skips loudly
/// otherwise unless VMTRACE_REQUIRE_PRIVILEGED=1 asks for the full suite.
fn promtool(test: &str) -> Option<&'static str> {
    let found = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some("promtool");
    }
    if std::env::var("VMTRACE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        panic!("{test}: promtool is not installed (cargo xtask setup installs it)");
    }
    eprintln!("SKIPPED {test}: promtool not installed");
    None
}

fn run_promtool(tool: &str, args: &[&str], stdin: Option<&str>) {
    use std::io::Write as _;
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write to promtool");
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().expect("promtool runs");
    assert!(
        out.status.success() && out.stdout.len() + out.stderr.len() < 4096,
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if stdin.is_some() {
        // `check metrics` prints lint problems and still exits 0 on some versions.
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.trim().is_empty(), "promtool check metrics: {text}");
    }
}

#[test]
fn promtool_accepts_the_scrape_config_and_rules() {
    let Some(tool) = promtool("promtool_accepts_the_scrape_config_and_rules") else {
        return;
    };
    let dir = dashboards();
    let config = dir.join("prometheus.yml");
    let rules = dir.join("vmtrace.rules.yml");
    run_promtool(tool, &["check", "config", &config.to_string_lossy()], None);
    run_promtool(tool, &["check", "rules", &rules.to_string_lossy()], None);
}

/// A registry with every optional family, rendered.
pub fn full_exposition() -> String {
    let m = Metrics::new(Features::ALL);
    m.set_lost(vec![0, 0]);
    let probe: vmtrace::trace::ProbeInfo = serde_json::from_value(serde_json::json!({
        "probe": "vmalloc:alloc_vmap_area", "rung": "tracepoint", "program": "p",
        "fields": [], "missing_fields": [], "refused": []
    }))
    .expect("a probe info");
    m.set_probes(&[probe]);
    // The meminfo gauges appear from the first sample on.
    m.observe(&vmtrace::trace::Record::Meminfo(vmtrace::trace::Meminfo {
        ts_ns: 1,
        page_tables_kb: 1,
        vmalloc_used_kb: 1,
    }));
    m.render()
}

#[test]
fn promtool_lints_the_exposition_clean() {
    let Some(tool) = promtool("promtool_lints_the_exposition_clean") else {
        return;
    };
    run_promtool(tool, &["check", "metrics"], Some(&full_exposition()));
}

/// Metric names a scrape exposes: every sample name (histograms with their suffixes).
fn exposed_names(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Every PromQL expression of every panel.
pub fn panel_exprs(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        let title = p["title"].as_str().unwrap_or("?").to_string();
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((title.clone(), e.to_string()));
            }
        }
    }
    out
}

#[test]
fn dashboard_parses_and_uses_only_exported_metrics() {
    let path = dashboards().join("vmtrace.json");
    let text = std::fs::read_to_string(&path).expect("dashboard readable");
    let d: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let vars: Vec<(&str, &str)> = d["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap_or(""),
                v["type"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(vars.contains(&("datasource", "datasource")), "{vars:?}");
    assert!(vars.contains(&("instance", "query")), "{vars:?}");
    let names = exposed_names(&full_exposition());
    let exprs = panel_exprs(&d);
    assert!(exprs.len() >= 10, "only {} expressions", exprs.len());
    let metric = regex::Regex::new(r"\bvmtrace_[a-z0-9_]+").expect("regex");
    let titles: Vec<&str> = exprs.iter().map(|(t, _)| t.as_str()).collect();
    for want in [
        "rates",
        "Lazy backlog",
        "Purge work",
        "Page-table",
        "lock class",
        "Lost",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(want)),
            "no panel about {want}: {titles:?}"
        );
    }
    for (title, e) in &exprs {
        assert!(e.contains("$instance"), "{title}: {e} ignores $instance");
        let used: Vec<&str> = metric.find_iter(e).map(|m| m.as_str()).collect();
        assert!(!used.is_empty(), "{title}: {e} uses no vmtrace metric");
        for m in used {
            assert!(names.contains(m), "{title}: {m} is not exported ({e})");
        }
    }
    // Every panel uses the datasource variable.
    for p in d["panels"].as_array().into_iter().flatten() {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
    }
}
