//! Compressed traces read like plain ones: `summary` and `replay` give the same figures on the
//! bundled trace stored plain, as zstd and as gzip, whatever the file is called and from stdin;
//! and a zstd trace cut inside its last frame (SIGKILL between two flushes) reads up to the cut.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use vmtrace::trace::compress::{self, Compression};

mod common;

/// The bundled trace written out plain, so that each test compares formats of the same lines.
fn plain_sample(dir: &Path) -> (PathBuf, String) {
    let text = common::sample_trace_text();
    let path = dir.join("plain.jsonl");
    std::fs::write(&path, &text).unwrap();
    (path, text)
}

/// Writes `text` compressed, ending a frame every `lines_per_frame` lines as the recorder's
/// flushes do; returns the byte length after each frame.
fn write_compressed(
    path: &Path,
    text: &str,
    kind: Compression,
    lines_per_frame: usize,
) -> Vec<usize> {
    let file = std::fs::File::create(path).unwrap();
    let mut w = compress::writer(file, kind).unwrap();
    let mut ends = Vec::new();
    for (i, line) in text.lines().enumerate() {
        writeln!(w, "{line}").unwrap();
        if (i + 1) % lines_per_frame == 0 {
            w.flush().unwrap();
            ends.push(std::fs::metadata(path).unwrap().len() as usize);
        }
    }
    w.flush().unwrap();
    drop(w);
    ends
}

fn vmtrace(args: &[&str], file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(args)
        .arg(file)
        .output()
        .unwrap()
}

fn json_of(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn summary_and_replay_agree_on_plain_zstd_and_gzip() {
    let dir = tempfile::tempdir().unwrap();
    let (sample, text) = plain_sample(dir.path());
    let zst = dir.path().join("t.jsonl.zst");
    let gz = dir.path().join("t.jsonl.gz");
    // A compressed file under a plain name: the magic bytes decide, not the name.
    let disguised = dir.path().join("t.jsonl");
    write_compressed(&zst, &text, Compression::Zstd, 700);
    write_compressed(&gz, &text, Compression::Gzip, 700);
    write_compressed(&disguised, &text, Compression::Zstd, 100_000);
    let plain_size = text.len() as u64;
    for f in [&zst, &gz] {
        let size = std::fs::metadata(f).unwrap().len();
        assert!(
            size * 8 < plain_size,
            "{}: {size} of {plain_size} bytes",
            f.display()
        );
    }

    let want_summary = json_of(&vmtrace(&["summary", "--json"], &sample));
    let want_replay = json_of(&vmtrace(&["replay", "--json"], &sample));
    for f in [&zst, &gz, &disguised] {
        assert_eq!(
            json_of(&vmtrace(&["summary", "--json"], f)),
            want_summary,
            "summary of {}",
            f.display()
        );
        assert_eq!(
            json_of(&vmtrace(&["replay", "--json"], f)),
            want_replay,
            "replay of {}",
            f.display()
        );
    }

    // From stdin too.
    let mut child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
        .args(["summary", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&std::fs::read(&zst).unwrap())
        .unwrap();
    assert_eq!(json_of(&child.wait_with_output().unwrap()), want_summary);
}

#[test]
fn a_zstd_trace_cut_inside_a_frame_reads_up_to_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (sample, text) = plain_sample(dir.path());
    let zst = dir.path().join("cut.jsonl.zst");
    let ends = write_compressed(&zst, &text, Compression::Zstd, 1000);
    assert!(ends.len() >= 3, "{ends:?}");
    // Cut halfway through the third frame: the first two frames (2000 lines) must survive.
    let bytes = std::fs::read(&zst).unwrap();
    let cut = ends[1] + (ends[2] - ends[1]) / 2;
    std::fs::write(&zst, &bytes[..cut]).unwrap();

    let out = vmtrace(&["summary", "--json"], &zst);
    let v = json_of(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ends inside a frame"), "{stderr}");
    let events = &v["events"];
    let seen = ["alloc", "free", "purge"]
        .iter()
        .map(|k| events[k].as_u64().unwrap())
        .sum::<u64>();
    let full = json_of(&vmtrace(&["summary", "--json"], &sample));
    let total = ["alloc", "free", "purge"]
        .iter()
        .map(|k| full["events"][k].as_u64().unwrap())
        .sum::<u64>();
    // 2000 lines minus the header and the snapshot's lines at most.
    assert!(seen > 1000 && seen < total, "{seen} of {total} events");
    assert!(v["lost_total"].is_null(), "a cut trace has no footer: {v}");
}
