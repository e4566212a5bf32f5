//! `vmtrace replay --report DIR`: every chart exists in SVG and PNG, the SVGs are well-formed
//! XML with the title and legend text the data calls for, the PNGs decode at the documented
//! size with text and data drawn (not a blank canvas), and index.html links every image and
//! shows the figures `--json` prints. Runs the bundled real trace and small synthetic ones.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use vmtrace::model::Variant;
use vmtrace::replay::charts::{write_report, ReportInput, CHARTS, HEIGHT, WIDTH};
use vmtrace::replay::{free_run, replay, FreeRunOptions, ReplayOptions};
use vmtrace::sim::timing::HistBucket;
use vmtrace::synth::{generate, SynthParams};

fn bundled() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/sample-trace.jsonl.zst")
}

fn vmtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(args)
        .output()
        .expect("run vmtrace")
}

fn synth_bytes() -> Vec<u8> {
    let p = SynthParams {
        mask: 7,
        threads: 16,
        cpus: 4,
        loops: 40,
        junk: Some(8),
        busy_list: 10,
        seed: 3,
        ..SynthParams::default()
    };
    let mut out = Vec::new();
    generate(&p, vec!["vmtrace".into(), "synth".into()], &mut out).expect("synth");
    out
}

/// The synthetic trace with meminfo samples added after the snapshot, as `record` writes them.
fn synth_with_meminfo(dir: &Path) -> PathBuf {
    let text = String::from_utf8(synth_bytes()).expect("utf-8");
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let ts_of = |l: &str| {
        serde_json::from_str::<Value>(l)
            .ok()
            .and_then(|v| v["ts_ns"].as_u64())
    };
    let ts: Vec<u64> = lines.iter().skip(2).filter_map(|l| ts_of(l)).collect();
    let (first, last) = (ts[0], ts[ts.len() - 1]);
    // In time order among the events, after the header and the snapshot, as `record` would
    // have written them.
    for i in 0..5u64 {
        let t = first + (last - first) * i / 4;
        let at = (2..lines.len())
            .find(|&j| ts_of(&lines[j]).is_some_and(|x| x > t))
            .unwrap_or(lines.len());
        lines.insert(
            at,
            format!(
                r#"{{"type":"meminfo","ts_ns":{t},"page_tables_kb":{},"vmalloc_used_kb":{}}}"#,
                1000 + i,
                20_000 + 4_000 * i
            ),
        );
    }
    let path = dir.join("synth.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").expect("write trace");
    path
}

/// Every text node of an SVG, which must parse as XML.
fn svg_text(path: &Path) -> String {
    let src = std::fs::read_to_string(path).expect("read svg");
    let doc = roxmltree::Document::parse(&src)
        .unwrap_or_else(|e| panic!("{} is not well-formed XML: {e}", path.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let w = doc.root_element().attribute("width");
    assert_eq!(w, Some(WIDTH.to_string().as_str()));
    doc.descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect::<Vec<_>>()
        .join("\n")
}

struct Png {
    rgb: Vec<u8>,
}

impl Png {
    fn read(path: &Path) -> Self {
        let file = std::fs::File::open(path).expect("open png");
        let mut dec = png::Decoder::new(std::io::BufReader::new(file))
            .read_info()
            .unwrap_or_else(|e| panic!("{} does not decode: {e}", path.display()));
        let info = dec.info();
        assert_eq!(
            (info.width, info.height),
            (WIDTH, HEIGHT),
            "{}",
            path.display()
        );
        assert_eq!(info.color_type, png::ColorType::Rgb);
        let mut rgb = vec![0; dec.output_buffer_size().expect("size")];
        dec.next_frame(&mut rgb).expect("frame");
        Self { rgb }
    }

    fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        let i = 3 * (y as usize * WIDTH as usize + x as usize);
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }

    fn colours(&self) -> HashSet<[u8; 3]> {
        self.rgb
            .chunks_exact(3)
            .map(|c| [c[0], c[1], c[2]])
            .collect()
    }

    /// Dark pixels in the title band: the title was rendered with the embedded font.
    fn title_ink(&self) -> usize {
        (0..30)
            .flat_map(|y| (0..WIDTH).map(move |x| (x, y)))
            .filter(|&(x, y)| self.pixel(x, y).iter().all(|&c| c < 100))
            .count()
    }

    fn has(&self, c: [u8; 3]) -> bool {
        self.rgb.chunks_exact(3).any(|p| p == c)
    }
}

const NODES_BLUE: [u8; 3] = [31, 119, 180];
const CAPPED_GREEN: [u8; 3] = [44, 160, 44];
const GLOBAL_RED: [u8; 3] = [214, 39, 40];

/// Checks every file of a report directory; returns each chart's SVG text by stem.
fn check_files(dir: &Path) -> Vec<(&'static str, String)> {
    let mut texts = Vec::new();
    for (stem, title) in CHARTS {
        let svg = dir.join(format!("{stem}.svg"));
        let png = dir.join(format!("{stem}.png"));
        assert!(svg.is_file() && png.is_file(), "{stem} missing in {dir:?}");
        let text = svg_text(&svg);
        assert!(
            text.contains(title),
            "{stem}.svg lacks its title {title:?}:\n{text}"
        );
        let img = Png::read(&png);
        let colours = img.colours();
        assert!(
            colours.len() >= 8,
            "{stem}.png has {} colours",
            colours.len()
        );
        assert!(img.title_ink() > 200, "{stem}.png: no title drawn");
        texts.push((stem, text));
    }
    let html = std::fs::read_to_string(dir.join("index.html")).expect("index.html");
    for (stem, _) in CHARTS {
        assert!(
            html.contains(&format!("src=\"{stem}.svg\"")),
            "{stem}.svg not shown"
        );
        assert!(
            html.contains(&format!("href=\"{stem}.png\"")),
            "{stem}.png not linked"
        );
    }
    texts
}

fn text_of<'a>(texts: &'a [(&str, String)], stem: &str) -> &'a str {
    &texts.iter().find(|(s, _)| *s == stem).expect("chart").1
}

fn agreement(v: &Value) -> (f64, u64, u64) {
    let compared = v["compared"].as_u64().expect("compared");
    let agreed = v["agreed"].as_u64().expect("agreed");
    let pct = if compared == 0 {
        100.0
    } else {
        100.0 * agreed as f64 / compared as f64
    };
    (pct, agreed, compared)
}

/// The summary tables show exactly the figures of `--json`.
fn check_html_numbers(html: &str, json: &Value) {
    for r in json["fidelity"].as_array().expect("fidelity") {
        for key in ["placement", "placement_after_warmup", "nr_lazy", "npurged"] {
            let (pct, agreed, compared) = agreement(&r[key]);
            let cell = format!("{pct:.3} % <small>({agreed} of {compared})</small>");
            assert!(html.contains(&cell), "{key}: {cell} not in index.html");
        }
        for key in ["observed_high_water", "predicted_high_water"] {
            assert!(html.contains(r[key].as_str().expect("hex")), "{key}");
        }
    }
    let what_if = json["what_if"].as_array().expect("what_if");
    assert!(!what_if.is_empty());
    for w in what_if {
        let name = w["variant"].as_str().expect("variant");
        let share = format!(
            "{:.1} %",
            100.0 * w["lock_wait_share"].as_f64().expect("share")
        );
        let tput = format!(
            "{:.3}",
            w["throughput_ops_per_s"].as_f64().expect("tput") / 1e6
        );
        let mib = format!(
            "{:.1}",
            w["high_water_bytes"].as_u64().expect("hw") as f64 / 1048576.0
        );
        let s = &w["slots"];
        let slots = format!(
            "{}/{}/{}",
            s["pte_tables"], s["pmd_tables"], s["pud_tables"]
        );
        let row = format!(
            "<tr><td>{name}</td><td>{}</td><td>{}</td><td>{share}</td><td>{tput}</td><td>{mib}</td><td>{slots}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            w["nodes"], w["lazy_max_pages"], w["page_table_pages"], w["purges"], w["alloc_failures"]
        );
        assert!(html.contains(&row), "row {row} not in index.html:\n{html}");
    }
}

#[test]
fn bundled_trace_report_has_every_chart_and_the_json_figures() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("report");
    let trace = bundled();
    let out = vmtrace(&[
        "replay",
        trace.to_str().expect("utf-8 path"),
        "--report",
        dir.to_str().expect("utf-8 path"),
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&dir.join("index.html").display().to_string()),
        "stderr says where the report went: {stderr}"
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("json");
    // No --variant: fidelity for the kernel's design, what-if for all three.
    let names: Vec<&str> = json["what_if"]
        .as_array()
        .expect("what_if")
        .iter()
        .map(|w| w["variant"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["nodes", "nodes-capped", "global"]);
    assert_eq!(json["fidelity"].as_array().expect("fidelity").len(), 1);

    let texts = check_files(&dir);
    let html = std::fs::read_to_string(dir.join("index.html")).expect("html");
    check_html_numbers(&html, &json);

    let lazy_max = json["fidelity"][0]["lazy_max_pages"]
        .as_u64()
        .expect("lazy_max");
    let purges = json["fidelity"][0]["purges"]
        .as_array()
        .expect("purges")
        .len();
    let lazy = text_of(&texts, "lazy_backlog");
    assert!(
        lazy.contains(&format!("drain threshold lazy_max_pages = {lazy_max}")),
        "{lazy}"
    );
    assert!(
        !lazy.contains("kernel's threshold"),
        "same threshold drawn once: {lazy}"
    );
    assert!(
        lazy.contains(&format!("observed nr_lazy (at frees): purges ({purges})")),
        "{lazy}"
    );
    let foot = text_of(&texts, "footprint");
    for label in [
        "observed high-water (trace addresses)",
        "what-if nodes (free-running)",
        "what-if nodes-capped (free-running)",
        "what-if global (free-running)",
    ] {
        assert!(foot.contains(label), "footprint lacks {label:?}:\n{foot}");
    }
    // A VmallocUsed line exactly when the trace has meminfo samples: none is invented.
    let has_meminfo = std::io::BufRead::lines(vmtrace::trace::compress::open(&bundled()).unwrap())
        .any(|l| l.unwrap().contains("\"type\":\"meminfo\""));
    assert_eq!(foot.contains("VmallocUsed"), has_meminfo);
    let share = text_of(&texts, "node_share");
    assert!(
        share.contains("observed") && share.contains("vmap node"),
        "{share}"
    );
    let waits = text_of(&texts, "lock_waits");
    assert!(waits.contains("free_area_lock"), "{waits}");
    let variants = text_of(&texts, "variants");
    for label in [
        "lock-wait share",
        "throughput",
        "VA footprint",
        "page-table pages",
    ] {
        assert!(variants.contains(label), "{variants}");
    }
    for img in ["footprint", "lazy_backlog", "variants"] {
        let png = Png::read(&dir.join(format!("{img}.png")));
        for (name, c) in [
            ("nodes", NODES_BLUE),
            ("nodes-capped", CAPPED_GREEN),
            ("global", GLOBAL_RED),
        ] {
            assert!(png.has(c), "{img}.png shows no {name} colour");
        }
    }
}

#[test]
fn synthetic_trace_report_with_meminfo_and_chosen_variants() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let trace = synth_with_meminfo(tmp.path());
    let dir = tmp.path().join("out/nested");
    let out = vmtrace(&[
        "replay",
        trace.to_str().expect("utf-8"),
        "--variant",
        "nodes",
        "--variant",
        "global",
        "--zone-pages",
        "4",
        "--lazy-max",
        "64",
        "--report",
        dir.to_str().expect("utf-8"),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("json");
    for r in json["fidelity"].as_array().expect("fidelity") {
        assert_eq!(r["zone_size"], 4 * 4096, "--zone-pages reaches the model");
        assert_eq!(r["lazy_max_pages"], 64);
        let used = r["vmalloc_used_series"].as_array().expect("meminfo series");
        assert_eq!(used.len(), 5);
        assert_eq!(used[4]["bytes"], (20_000 + 4 * 4_000) * 1024);
    }
    let texts = check_files(&dir);
    let html = std::fs::read_to_string(dir.join("index.html")).expect("html");
    check_html_numbers(&html, &json);
    let foot = text_of(&texts, "footprint");
    assert!(
        foot.contains("observed VmallocUsed (meminfo, pages in use)"),
        "{foot}"
    );
    assert!(
        foot.contains("what-if global") && !foot.contains("nodes-capped"),
        "{foot}"
    );
    let lazy = text_of(&texts, "lazy_backlog");
    assert!(
        lazy.contains("drain threshold lazy_max_pages = 64"),
        "{lazy}"
    );
    let kernel = json["fidelity"][0]["observed_nr_lazy_max"]
        .as_u64()
        .expect("nr_lazy_max");
    assert_ne!(kernel, 64);
    assert!(
        lazy.contains(&format!(
            "kernel's threshold in the trace (nr_lazy_max = {kernel})"
        )),
        "{lazy}"
    );
    let png = Png::read(&dir.join("footprint.png"));
    assert!(png.has([255, 127, 14]), "VmallocUsed line drawn");
    assert!(!png.has(CAPPED_GREEN), "no variant that was not asked for");
}

#[test]
fn stdin_cannot_feed_a_report() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = vmtrace(&[
        "replay",
        "-",
        "--report",
        tmp.path().to_str().expect("utf-8"),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stdin") && stderr.contains("as a file"),
        "{stderr}"
    );
}

/// The lock-wait chart shows the timing model's distribution when it has one, and otherwise
/// says that it shows means instead.
#[test]
fn lock_wait_chart_draws_distributions_or_labelled_means() {
    let bytes = synth_bytes();
    let opts = |variant| ReplayOptions {
        variant,
        lazy_max_pages: Some(64),
        ..ReplayOptions::default()
    };
    let fidelity = vec![replay(&bytes[..], &opts(Variant::Nodes)).expect("replay")];
    let mut what_if: Vec<_> = [Variant::Nodes, Variant::Global]
        .into_iter()
        .map(|v| free_run(&bytes[..], &opts(v), &FreeRunOptions::default()).expect("free run"))
        .collect();
    let tmp = tempfile::tempdir().expect("tempdir");

    for w in &mut what_if {
        for c in &mut w.lock_waits {
            c.wait_histogram.clear();
        }
    }
    let input = ReportInput {
        trace: "synth <a&b>",
        fidelity: &fidelity,
        what_if: &what_if,
    };
    let means = tmp.path().join("means");
    let files = write_report(&means, &input).expect("report");
    assert_eq!(files.len(), 2 * CHARTS.len() + 1);
    let texts = check_files(&means);
    let waits = text_of(&texts, "lock_waits");
    assert!(
        waits.contains("mean predicted wait per critical section"),
        "{waits}"
    );
    assert!(waits.contains("mean wait per section (ns)"), "{waits}");
    let html = std::fs::read_to_string(means.join("index.html")).expect("html");
    assert!(html.contains("synth &lt;a&amp;b&gt;") && !html.contains("<a&b>"));

    // Distributions: free_area_lock gets two buckets in nodes and one in global.
    for (w, buckets) in what_if
        .iter_mut()
        .zip([vec![(1024, 30), (4096, 10)], vec![(65_536, 7)]])
    {
        let c = w
            .lock_waits
            .iter_mut()
            .find(|c| c.class == vmtrace::trace::LockClass::FreeAreaLock)
            .expect("free_area_lock sections");
        c.wait_histogram = buckets
            .into_iter()
            .map(|(le_ns, count)| HistBucket { le_ns, count })
            .collect();
    }
    let input = ReportInput {
        trace: "synth",
        fidelity: &fidelity,
        what_if: &what_if,
    };
    let dist = tmp.path().join("dist");
    write_report(&dist, &input).expect("report");
    let texts = check_files(&dist);
    let waits = text_of(&texts, "lock_waits");
    assert!(!waits.contains("mean predicted wait"), "{waits}");
    let sections = |w: &vmtrace::replay::WhatIf| {
        w.lock_waits
            .iter()
            .find(|c| c.class == vmtrace::trace::LockClass::FreeAreaLock)
            .expect("free_area_lock")
            .sections
    };
    let legend = [
        format!("nodes 40/{} waited", sections(&what_if[0])),
        format!("global 7/{} waited", sections(&what_if[1])),
    ];
    for label in [
        "free_area_lock",
        "% of sections that waited",
        "1 µs",
        "4.1 µs",
        "65.5 µs",
    ]
    .into_iter()
    .chain(legend.iter().map(String::as_str))
    {
        assert!(
            waits.contains(label),
            "lock_waits lacks {label:?}:\n{waits}"
        );
    }
    // Classes that never waited are named, not drawn as empty panels.
    assert!(
        waits.contains("no predicted wait in any variant: node_busy_lock, node_lazy_lock"),
        "{waits}"
    );
}
