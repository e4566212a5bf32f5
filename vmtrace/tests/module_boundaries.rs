//! The crate's layering, checked on its source: a module that must not depend on another stays
//! that way without anyone remembering to look.
//!
//! - `trace` (the file format) depends on nothing else in the crate: the types it embeds from
//!   `host` and `allocinfo` live in `trace::wire`.
//! - `model` (the kernel's algorithm) depends on nothing but the trace's address layout.
//! - `value_parsers` is a leaf that every subcommand's arguments may use.
//! - Only `cli` (which assembles the command enum) names the subcommands together; no subcommand
//!   imports `cli`, so there is no cycle between it and them.

use std::fs;
use std::path::{Path, PathBuf};

fn sources(dir: &Path) -> Vec<PathBuf> {
    if dir.is_file() {
        return vec![dir.to_path_buf()];
    }
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `crate::NAME` a file mentions outside comments, with its line number.
fn crate_paths(path: &Path) -> Vec<(usize, String)> {
    let text = fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let tail = &rest[at + "crate::".len()..];
            let name: String = tail
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push((i + 1, name));
            rest = tail;
        }
    }
    out
}

/// Files under `dir` that name a top-level module outside `allowed`, as `file:line: crate::x`.
fn violations(dir: &Path, allowed: &[&str]) -> Vec<String> {
    let mut bad = Vec::new();
    for file in sources(dir) {
        for (line, name) in crate_paths(&file) {
            if !allowed.contains(&name.as_str()) {
                bad.push(format!("{}:{line}: crate::{name}", file.display()));
            }
        }
    }
    bad
}

#[test]
fn the_trace_format_depends_on_nothing_else() {
    let bad = violations(&src().join("trace"), &["trace"]);
    assert!(bad.is_empty(), "trace/ reaches out: {bad:#?}");
}

#[test]
fn the_model_depends_only_on_the_address_layout() {
    let bad = violations(&src().join("model"), &["model", "trace"]);
    assert!(bad.is_empty(), "model/ reaches out: {bad:#?}");
    // And of the trace, only its address layout.
    for file in sources(&src().join("model")) {
        let text = fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if let Some(at) = code.find("crate::trace::") {
                assert!(
                    code[at..].starts_with("crate::trace::addr::"),
                    "{}:{}: {code}",
                    file.display(),
                    i + 1
                );
            }
        }
    }
}

#[test]
fn value_parsers_are_a_leaf() {
    let bad = violations(&src().join("value_parsers.rs"), &[]);
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn no_subcommand_imports_the_cli() {
    let cli = src().join("cli.rs");
    let mut bad = Vec::new();
    for file in sources(&src()) {
        if file == cli {
            continue;
        }
        for (line, name) in crate_paths(&file) {
            if name == "cli" {
                bad.push(format!("{}:{line}", file.display()));
            }
        }
    }
    assert!(bad.is_empty(), "these import crate::cli: {bad:#?}");
}

/// The check itself can fail: a file that names another module is reported.
#[test]
fn a_reaching_import_is_reported() {
    let dir = std::env::temp_dir().join(format!("vmtrace-boundaries-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("x.rs"),
        "use crate::trace::Record; // crate::host in a comment is fine\nfn f() { crate::host::x(); }\n",
    )
    .unwrap();
    let bad = violations(&dir, &["trace"]);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].ends_with(":2: crate::host"), "{bad:?}");
}
