//! Helpers shared by the integration tests: validate traces against `docs/trace.schema.json`.
//!
//! Use with `mod common;` and, for a recorded trace, `common::assert_trace_valid(&path)`.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Records `vmtrace stress STRESS` (its output discarded) with the default probes into
/// `trace`, and asserts the recording succeeded.
pub fn record_stress(trace: &Path, stress: &str) {
    record_stress_with(trace, &[], stress);
}

/// [`record_stress`] with more `vmtrace record` options.
pub fn record_stress_with(trace: &Path, record: &[&str], stress: &str) {
    let vmtrace = env!("CARGO_BIN_EXE_vmtrace");
    let script = format!("{vmtrace} stress {stress} >/dev/null");
    let status = std::process::Command::new(vmtrace)
        .args(["record", "-q"])
        .args(record)
        .arg("-o")
        .arg(trace)
        .args(["--", "sh", "-c", &script])
        .status()
        .unwrap();
    assert!(status.success(), "vmtrace record failed: {status}");
}

/// Runs `vmtrace ARGS FILE`, asserts it succeeded, and parses what it printed as JSON (the
/// command is expected to be given `--json`).
pub fn vmtrace_json(args: &[&str], file: &Path) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(args)
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vmtrace {} {} failed: {}",
        args.join(" "),
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Path of the shipped schema, `docs/trace.schema.json` at the workspace root.
pub fn schema_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("docs")
        .join("trace.schema.json")
}

/// The schema document, parsed.
pub fn schema_json() -> Value {
    let path = schema_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()))
}

/// A validator for one trace line, compiled from the shipped schema (which is itself checked
/// against the draft 2020-12 meta-schema).
pub fn schema_validator() -> jsonschema::Validator {
    compile(&schema_json())
}

fn compile(schema: &Value) -> jsonschema::Validator {
    jsonschema::validator_for(schema).unwrap_or_else(|e| {
        panic!(
            "{} is not a valid JSON Schema: {e}",
            schema_path().display()
        )
    })
}

/// Record kinds, i.e. the values of `type` and the `$defs` entries that describe them.
pub const KINDS: [&str; 13] = [
    "header",
    "vmallocinfo",
    "alloc",
    "free",
    "purge",
    "contention",
    "work",
    "work_start",
    "pt_page",
    "latency",
    "meminfo",
    "allocinfo",
    "footer",
];

/// Validates one parsed line and returns readable errors (empty when valid).
///
/// The top-level schema is a `oneOf` over the record kinds, whose failure message only says that no
/// branch matched; for a line with a known `type` the errors are recomputed against that kind's
/// schema alone, so they name the offending member (`"typo" was unexpected`, `"size" is a required
/// property`, …).
pub fn line_errors(validator: &jsonschema::Validator, line: &Value) -> Vec<String> {
    if validator.is_valid(line) {
        return Vec::new();
    }
    let kind = line.get("type").and_then(Value::as_str).unwrap_or("");
    let precise;
    let v = if KINDS.contains(&kind) {
        let mut schema = schema_json();
        let obj = schema.as_object_mut().expect("the schema is an object");
        obj.remove("oneOf");
        obj.insert("$ref".into(), Value::String(format!("#/$defs/{kind}")));
        precise = compile(&schema);
        &precise
    } else {
        validator
    };
    let mut errors: Vec<String> = v
        .iter_errors(line)
        .map(|e| {
            let at = e.instance_path.to_string();
            format!("at `{}`: {e}", if at.is_empty() { "/" } else { &at })
        })
        .collect();
    if errors.is_empty() {
        // Only possible if the kind schema accepts what the oneOf refused.
        errors = validator
            .iter_errors(line)
            .map(|e| format!("at `{}`: {e}", e.instance_path))
            .collect();
    }
    errors
}

/// Checks one line (without its newline): `Err` names the line number and every schema error.
pub fn check_line(
    validator: &jsonschema::Validator,
    lineno: usize,
    text: &str,
) -> Result<(), String> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| format!("line {lineno}: not JSON: {e}\n  line: {}", clip(text)))?;
    let errors = line_errors(validator, &value);
    if errors.is_empty() {
        return Ok(());
    }
    Err(format!(
        "line {lineno}: does not match {}:\n  {}\n  line: {}",
        schema_path().display(),
        errors.join("\n  "),
        clip(text)
    ))
}

/// Panics with the line number and every schema error unless `text` (one line, without its
/// newline) is valid JSON that the schema accepts.
pub fn assert_line_valid(validator: &jsonschema::Validator, lineno: usize, text: &str) {
    if let Err(msg) = check_line(validator, lineno, text) {
        panic!("{msg}");
    }
}

/// Validates every complete line of the trace at `path` against the schema and returns how many
/// lines were checked. Blank lines are skipped. A last line without a newline is the line being
/// written when the recorder was killed: it is checked only if it is complete JSON, and skipped
/// otherwise. Panics with the line number and error at the first bad line.
pub fn assert_trace_valid(path: &Path) -> usize {
    let input = vmtrace::trace::compress::open(path)
        .unwrap_or_else(|e| panic!("cannot open trace {}: {e}", path.display()));
    assert_reader_valid(input, &path.display().to_string())
}

/// The bundled real trace, `vmtrace/assets/sample-trace.jsonl.zst`.
pub fn sample_trace_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/sample-trace.jsonl.zst")
}

/// The bundled real trace's JSON Lines, decompressed.
pub fn sample_trace_text() -> String {
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut vmtrace::trace::compress::open(&sample_trace_path()).unwrap(),
        &mut text,
    )
    .unwrap();
    text
}

/// [`assert_trace_valid`] for a trace in memory.
pub fn assert_bytes_valid(bytes: &[u8]) -> usize {
    assert_reader_valid(bytes, "<memory>")
}

fn assert_reader_valid(mut input: impl BufRead, name: &str) -> usize {
    let validator = schema_validator();
    let mut buf = String::new();
    let mut lineno = 0;
    let mut checked = 0;
    loop {
        buf.clear();
        let n = input
            .read_line(&mut buf)
            .unwrap_or_else(|e| panic!("{name}: line {}: cannot read: {e}", lineno + 1));
        if n == 0 {
            break;
        }
        lineno += 1;
        let complete = buf.ends_with('\n');
        let text = buf.trim_end_matches(['\n', '\r']);
        if text.trim().is_empty() {
            continue;
        }
        if !complete && serde_json::from_str::<Value>(text).is_err() {
            // Cut short mid-line (SIGKILL): the one partial line a trace may end with.
            break;
        }
        if let Err(msg) = check_line(&validator, lineno, text) {
            panic!("{name}: {msg}");
        }
        checked += 1;
    }
    checked
}

fn clip(text: &str) -> String {
    const MAX: usize = 400;
    if text.len() <= MAX {
        return text.to_string();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// Whether this process may load BPF probes. Without privileges a test skips loudly, unless
/// `VMTRACE_REQUIRE_PRIVILEGED=1` (set by `cargo xtask test` as root, as in CI), where it fails:
/// CI is root on a real kernel, and a silent skip there would hide a regression.
pub fn privileged() -> bool {
    let ok = vmtrace::host::system::bpf_capable().unwrap_or(false);
    if !ok {
        let msg = "needs root (CAP_BPF + CAP_PERFMON or CAP_SYS_ADMIN) to load BPF probes";
        if std::env::var("VMTRACE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
            panic!("VMTRACE_REQUIRE_PRIVILEGED=1 but this test {msg}");
        }
        eprintln!("\n!!!!!!!! SKIPPED: this test {msg} !!!!!!!!\n");
    }
    ok
}

/// How vmtrace's tracepoints attach on this machine: raw wherever kernel BTF exists, unless
/// `VMTRACE_TRACEPOINTS=perf` forces perf tracepoints.
pub fn expected_attach(perf_forced: bool) -> &'static str {
    if perf_forced || !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        "perf"
    } else {
        "raw_tp"
    }
}
