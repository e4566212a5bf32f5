//! Exposition-format tests with exact expected text.

use super::expo::{escape_help, escape_label, labels, value, Exp2Histogram};
use super::http::{parse_request_line, respond, Handler, RequestLine};
use super::*;

const CTX: &str = r#""ts_ns":1,"cpu":0,"tgid":1,"pid":1,"comm":"t""#;

fn rec(kind: &str, rest: &str) -> Record {
    let line = format!(r#"{{"type":"{kind}",{CTX},{rest}}}"#);
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// The lines of one family (HELP, TYPE and samples) from a render.
fn family(text: &str, name: &str) -> String {
    text.lines()
        .filter(|l| {
            let bare = l
                .strip_prefix("# HELP ")
                .or_else(|| l.strip_prefix("# TYPE "))
                .unwrap_or(l);
            bare.split([' ', '{']).next().is_some_and(|n| {
                n == name
                    || n.strip_prefix(name)
                        .is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s))
            })
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn label_values_are_escaped() {
    assert_eq!(escape_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    assert_eq!(escape_help("x\\y\nz \"q\""), "x\\\\y\\nz \"q\"");
    assert_eq!(labels(&[]), "");
    assert_eq!(
        labels(&[("probe", "kprobe:\"x\""), ("rung", "a\nb")]),
        "{probe=\"kprobe:\\\"x\\\"\",rung=\"a\\nb\"}"
    );
}

#[test]
fn values_are_formatted_as_prometheus_parses_them() {
    assert_eq!(value(3.0), "3");
    assert_eq!(value(0.5), "0.5");
    assert_eq!(value(1000.0 / 1e9), "0.000001");
    assert_eq!(value(f64::INFINITY), "+Inf");
    assert_eq!(value(f64::NAN), "NaN");
}

#[test]
fn histogram_buckets_are_cumulative_and_count_matches_inf() {
    let h = Exp2Histogram::new(1, 3);
    for v in [1, 2, 5, 0] {
        h.observe(v);
    }
    let mut o = String::new();
    h.render(&mut o, "x_bytes", &[("k", "v")], 1.0);
    assert_eq!(
        o,
        "x_bytes_bucket{k=\"v\",le=\"1\"} 2\n\
         x_bytes_bucket{k=\"v\",le=\"2\"} 3\n\
         x_bytes_bucket{k=\"v\",le=\"4\"} 3\n\
         x_bytes_bucket{k=\"v\",le=\"+Inf\"} 4\n\
         x_bytes_sum{k=\"v\"} 8\n\
         x_bytes_count{k=\"v\"} 4\n"
    );
    let s = Exp2Histogram::new(1000, 2);
    s.observe(1500);
    let mut o = String::new();
    s.render(&mut o, "y_seconds", &[], 1e9);
    assert_eq!(
        o,
        "y_seconds_bucket{le=\"0.000001\"} 0\n\
         y_seconds_bucket{le=\"0.000002\"} 1\n\
         y_seconds_bucket{le=\"+Inf\"} 1\n\
         y_seconds_sum 0.0000015\n\
         y_seconds_count 1\n"
    );
}

fn sample_metrics(features: Features) -> Metrics {
    let m = Metrics::new(features);
    m.set_nodes(2);
    m.set_lazy_threshold(100);
    m.set_lost(vec![0, 3]);
    m.set_probes(&[]);
    for r in [
        rec(
            "alloc",
            r#""addr":"0x1000","size":8192,"align":1,"vstart":"0x0","vend":"0x0","failed":0"#,
        ),
        rec(
            "alloc",
            r#""addr":"0x0","size":8192,"align":1,"vstart":"0x0","vend":"0x0","failed":-12"#,
        ),
        rec(
            "free",
            r#""va_start":"0x1000","nr_lazy":7,"nr_lazy_max":32768"#,
        ),
        rec("purge", r#""start":"0x0","end":"0x1000","npurged":5"#),
    ] {
        m.observe(&r);
    }
    m.observe(&Record::Meminfo(crate::trace::Meminfo {
        ts_ns: 1,
        page_tables_kb: 4,
        vmalloc_used_kb: 2,
    }));
    m
}

#[test]
fn scalar_families_render_exactly() {
    let text = sample_metrics(Features::default()).render();
    let version = env!("CARGO_PKG_VERSION");
    let expected = format!(
        "# HELP vmtrace_build_info vmtrace build, always 1.\n\
# TYPE vmtrace_build_info gauge\n\
vmtrace_build_info{{version=\"{version}\"}} 1\n\
# HELP vmtrace_probe_info Attached probe programs and the rung each attached on (fentry, kprobe, tracepoint), always 1.\n\
# TYPE vmtrace_probe_info gauge\n\
# HELP vmtrace_allocations_total alloc_vmap_area calls seen (successful and failed).\n\
# TYPE vmtrace_allocations_total counter\n\
vmtrace_allocations_total 2\n\
# HELP vmtrace_allocation_failures_total alloc_vmap_area calls that failed.\n\
# TYPE vmtrace_allocation_failures_total counter\n\
vmtrace_allocation_failures_total 1\n\
# HELP vmtrace_frees_total vmap areas freed lazily (free_vmap_area_noflush).\n\
# TYPE vmtrace_frees_total counter\n\
vmtrace_frees_total 1\n\
# HELP vmtrace_purges_total Lazy purges (purge_vmap_area_lazy).\n\
# TYPE vmtrace_purges_total counter\n\
vmtrace_purges_total 1\n\
# HELP vmtrace_purged_areas_total vmap areas released by lazy purges.\n\
# TYPE vmtrace_purged_areas_total counter\n\
vmtrace_purged_areas_total 5\n\
# HELP vmtrace_events_lost_total Events the probes could not hand over (ring buffer full), by CPU.\n\
# TYPE vmtrace_events_lost_total counter\n\
vmtrace_events_lost_total{{cpu=\"0\"}} 0\n\
vmtrace_events_lost_total{{cpu=\"1\"}} 3\n\
# HELP vmtrace_lazy_pages Lazily freed pages awaiting a purge (nr_lazy at the last free).\n\
# TYPE vmtrace_lazy_pages gauge\n\
vmtrace_lazy_pages 7\n\
# HELP vmtrace_lazy_threshold_pages Lazy pages that trigger a purge (lazy_max_pages).\n\
# TYPE vmtrace_lazy_threshold_pages gauge\n\
vmtrace_lazy_threshold_pages 32768\n\
# HELP vmtrace_vmap_nodes vmap nodes (nr_vmap_nodes).\n\
# TYPE vmtrace_vmap_nodes gauge\n\
vmtrace_vmap_nodes 2\n\
# HELP vmtrace_vmalloc_used_bytes VmallocUsed from /proc/meminfo.\n\
# TYPE vmtrace_vmalloc_used_bytes gauge\n\
vmtrace_vmalloc_used_bytes 2048\n\
# HELP vmtrace_page_tables_bytes PageTables from /proc/meminfo.\n\
# TYPE vmtrace_page_tables_bytes gauge\n\
vmtrace_page_tables_bytes 4096\n\
# HELP vmtrace_allocation_size_bytes Size of successful vmap-area allocations.\n\
# TYPE vmtrace_allocation_size_bytes histogram\n"
    );
    assert!(
        text.starts_with(&expected),
        "render differs:\n{text}\n--- expected prefix ---\n{expected}"
    );
    let size = family(&text, "vmtrace_allocation_size_bytes");
    assert!(size.contains("vmtrace_allocation_size_bytes_bucket{le=\"4096\"} 0\n"));
    assert!(size.contains("vmtrace_allocation_size_bytes_bucket{le=\"8192\"} 1\n"));
    assert!(size.contains("vmtrace_allocation_size_bytes_bucket{le=\"+Inf\"} 1\n"));
    assert!(size.ends_with(
        "vmtrace_allocation_size_bytes_sum 8192\nvmtrace_allocation_size_bytes_count 1\n"
    ));
    // Optional families stay out without their probes.
    assert!(!text.contains("vmtrace_lock_wait_seconds"));
    assert!(!text.contains("vmtrace_purge_work_duration_seconds"));
}

#[test]
fn optional_histograms_count_their_records() {
    let m = sample_metrics(Features::ALL);
    m.observe(&rec(
        "contention",
        r#""lock":"0x10","flags":0,"wait_ns":3000,"ret":0,"class":"purge_mutex","node":null,"stack_id":-1,"stack":[]"#,
    ));
    m.observe(&rec(
        "work",
        r#""function":"drain_vmap_area_work","function_addr":"0x1","work":"0x2","start_ns":0,"duration_ns":1000000,"start_cpu":0"#,
    ));
    m.observe(&rec(
        "latency",
        r#""function":"alloc_vmap_area","start_ns":0,"latency_ns":500"#,
    ));
    m.observe(&rec("pt_page", r#""level":"pte","pfn":1,"order":0"#));
    let text = m.render();
    let lock = family(&text, "vmtrace_lock_wait_seconds");
    assert!(
        lock.contains("vmtrace_lock_wait_seconds_count{class=\"purge_mutex\"} 1\n"),
        "{lock}"
    );
    assert!(lock.contains("vmtrace_lock_wait_seconds_count{class=\"free_area_lock\"} 0\n"));
    assert!(lock.contains("vmtrace_lock_wait_seconds_sum{class=\"purge_mutex\"} 0.000003\n"));
    let work = family(&text, "vmtrace_purge_work_duration_seconds");
    assert!(
        work.contains("vmtrace_purge_work_duration_seconds_sum 0.001\n"),
        "{work}"
    );
    let lat = family(&text, "vmtrace_allocation_latency_seconds");
    assert!(
        lat.contains("vmtrace_allocation_latency_seconds_bucket{le=\"0.000000512\"} 1\n"),
        "{lat}"
    );
    let pt = family(&text, "vmtrace_page_table_pages_allocated_total");
    assert!(
        pt.contains("vmtrace_page_table_pages_allocated_total{level=\"pte\"} 1\n"),
        "{pt}"
    );
}

#[test]
fn every_family_is_listed_named_and_typed() {
    let text = sample_metrics(Features::ALL).render();
    let mut typed = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert_eq!(
                lines[i - 1].split(' ').nth(2),
                Some(name),
                "HELP must precede TYPE for {name}"
            );
            assert!(name.starts_with("vmtrace_"), "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{name}"
            );
            match kind {
                "counter" => assert!(name.ends_with("_total"), "{name}"),
                "histogram" => assert!(
                    name.ends_with("_seconds") || name.ends_with("_bytes"),
                    "{name}"
                ),
                "gauge" => assert!(!name.ends_with("_total"), "{name}"),
                other => panic!("unexpected type {other}"),
            }
            typed.push(name.to_string());
        }
    }
    let mut listed: Vec<String> = FAMILIES.iter().map(|s| s.to_string()).collect();
    listed.sort();
    typed.sort();
    assert_eq!(
        typed, listed,
        "FAMILIES must list exactly what render emits"
    );
}

struct Fixed;
impl Handler for Fixed {
    fn metrics(&self) -> String {
        "m 1\n".into()
    }
    fn health(&self) -> Result<String, String> {
        Err("stale\n".into())
    }
}

#[test]
fn http_requests_are_routed() {
    assert_eq!(
        parse_request_line("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"),
        Some(RequestLine {
            method: "GET",
            path: "/metrics"
        })
    );
    assert_eq!(parse_request_line("GET /metrics\r\n\r\n"), None);
    assert_eq!(parse_request_line("GET / SPDY/3\r\n\r\n"), None);
    let status = |head: &str| respond(parse_request_line(head), &Fixed).0;
    assert_eq!(status("GET /metrics HTTP/1.1\r\n\r\n"), 200);
    assert_eq!(status("GET /healthz HTTP/1.0\r\n\r\n"), 503);
    assert_eq!(status("POST /metrics HTTP/1.1\r\n\r\n"), 405);
    assert_eq!(status("GET /nope HTTP/1.1\r\n\r\n"), 404);
    assert_eq!(status("garbage\r\n\r\n"), 400);
    let (_, ctype, body) = respond(parse_request_line("GET /metrics HTTP/1.1\r\n\r\n"), &Fixed);
    assert_eq!(ctype, "text/plain; version=0.0.4; charset=utf-8");
    assert_eq!(body, "m 1\n");
}
