//! The `vmtrace allocinfo` commands end to end, on fixture files and on this machine's kernel.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// Inside a module named `allocinfo`, so `cargo test allocinfo` selects these tests too.
mod allocinfo {
    use super::*;

    fn fixture(name: &str) -> String {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/allocinfo")
            .join(name)
            .display()
            .to_string()
    }

    /// Runs vmtrace from the fixture directory so that file names in the output are short and the
    /// same on every machine.
    fn vmtrace(args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_vmtrace"))
            .current_dir(fixture(""))
            .args(args)
            .env_remove("RUST_LOG")
            .output()
            .expect("vmtrace runs")
    }

    fn stdout(out: &Output) -> String {
        assert!(
            out.status.success(),
            "exit {:?}, stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout.clone()).expect("utf-8")
    }

    fn stderr(out: &Output) -> String {
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn json(out: &Output) -> Value {
        serde_json::from_str(&stdout(out)).expect("valid JSON")
    }

    #[test]
    fn show_sorted_by_bytes() {
        let out = vmtrace(&["allocinfo", "show", "v2.txt", "--top", "4"]);
        insta::assert_snapshot!(stdout(&out), @r"
    BYTES  CALLS  MARK  TAG
     122M  31168        mm/page_ext.c:270 func:alloc_page_ext
      58M  14848    pt  include/linux/mm.h:2990 func:pagetable_alloc
      24M      6        kernel/bpf/syscall.c:320 func:__bpf_map_area_alloc
      14M      7    vm  mm/vmalloc.c:3159 func:__get_vm_area_node

    total: 222M in 68869 calls (v2.txt, version 2.0, 11 tags)
    ");
    }

    #[test]
    fn show_sort_calls_exact_bytes_and_filter() {
        let out = vmtrace(&[
            "allocinfo",
            "show",
            "v1.txt",
            "--sort",
            "calls",
            "--bytes",
            "--filter",
            "^mm/|ext4",
        ]);
        insta::assert_snapshot!(stdout(&out), @r"
        BYTES  CALLS  MARK  TAG
    127664128  31168        mm/page_ext.c:270 func:alloc_page_ext
     12582912      6    vm  mm/vmalloc.c:3159 func:__get_vm_area_node
         8192      2        fs/ext4/super.c:1408 [ext4] func:ext4_alloc_inode
        -4096      1        mm/memory.c:5150 func:__do_fault

    total: 140251136 in 31177 calls (v1.txt, version 1.0, 10 tags)
    ");
    }

    #[test]
    fn show_grouped() {
        let out = vmtrace(&[
            "allocinfo",
            "show",
            "v2.txt",
            "--group-by",
            "dir",
            "--sort",
            "name",
        ]);
        insta::assert_snapshot!(stdout(&out), @r"
    BYTES  CALLS  TAGS  MARK  GROUP
     ~48K     48     1        arch/x86/kernel/cpu/mce
      12K      3     2        fs/ext4
     2.8M  22648     1        fs/kernfs
      58M  14848     1    pt  include/linux
        0      0     1        init
     560K    140     1        kernel
      24M      6     1        kernel/bpf
     1.0K      1     1        lib
     136M  31175     2    vm  mm

    total: 222M in 68869 calls (v2.txt, version 2.0, 11 tags)
    ~ = accurate:no: the absolute value is too low (deltas stay exact)
    ");
        let out = vmtrace(&[
            "allocinfo",
            "show",
            "v2.txt",
            "--group-by",
            "module",
            "--json",
            "--bytes",
        ]);
        let v = json(&out);
        let rows: Vec<(String, i64, u64, u64)> = v["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .map(|r| {
                (
                    r["group"].as_str().expect("group").to_string(),
                    r["bytes"].as_i64().expect("bytes"),
                    r["calls"].as_u64().expect("calls"),
                    r["tags"].as_u64().expect("tags"),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("(built-in)".to_string(), 231887052, 68866, 9),
                ("ext4".to_string(), 12288, 3, 2)
            ]
        );
    }

    #[test]
    fn show_json() {
        let out = vmtrace(&[
            "allocinfo",
            "show",
            "v2.txt",
            "--sort",
            "name",
            "--top",
            "3",
            "--json",
        ]);
        insta::assert_json_snapshot!(json(&out));
    }

    #[test]
    fn show_reads_stdin() {
        let mut child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
            .args(["allocinfo", "show", "-", "--json"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        let text = std::fs::read(fixture("premerge.txt")).expect("fixture");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), &text).expect("write");
        let out = child.wait_with_output().expect("wait");
        let v = json(&out);
        assert_eq!(v["source"], "-");
        assert_eq!(v["format"], "pre-merge");
        assert_eq!(v["rounded"], true);
        assert_eq!(v["total"]["bytes"], 1376896148i64);
        assert_eq!(v["rows"][0]["module"], "page_ext");
    }

    #[test]
    fn diff_text() {
        let out = vmtrace(&["allocinfo", "diff", "v1.txt", "v2.txt"]);
        insta::assert_snapshot!(stdout(&out), @r"
    old: v1.txt (version 1.0, 10 tags)
    new: v2.txt (version 2.0, 11 tags)
    warning: formats differ: v1.txt is version 1.0, v2.txt is version 2.0; tags are still matched on file, line, module and function
    warning: 1 row(s) are accurate:no (marked ~): their absolute values are too low, their deltas are exact

    DELTA  CALLS    OLD   NEW   STATUS  MARK  TAG
    -8.0M     -2    32M   24M                 kernel/bpf/syscall.c:320 func:__bpf_map_area_alloc
    +4.0M  +1024    54M   58M             pt  include/linux/mm.h:2990 func:pagetable_alloc
    -4.0M  -1010   4.0M     -  removed        drivers/staging/ctagmod/ctagmod.c:20 [ctagmod] func:ctagmod_start
    +2.0M     +1    12M   14M             vm  mm/vmalloc.c:3159 func:__get_vm_area_node
     +80K    +20   480K  560K                 kernel/fork.c:311 func:alloc_thread_stack_node
     +48K    +48      -  ~48K    added        arch/x86/kernel/cpu/mce/core.c:2709 func:mce_device_create
    +4.0K     +1   8.0K   12K                 fs/ext4/super.c:1408 [ext4] func:ext4_alloc_inode
    +4.0K     -1  -4.0K     -  removed        mm/memory.c:5150 func:__do_fault
    +1.0K     +1      -  1.0K    added        lib/xarray.c:378 func:xas_alloc

    total: -5.9M bytes, +82 calls (old 227M in 68787 calls, new 222M in 68869 calls); 2 added, 2 removed, 5 changed, 3 unchanged
    marks: pt = page tables (pagetable_alloc), vm = vmalloc call site; ~ = accurate:no
    ");
    }

    #[test]
    fn diff_json_with_exact_values() {
        let out = vmtrace(&[
            "allocinfo",
            "diff",
            "v1.txt",
            "v2.txt",
            "--json",
            "--min-delta",
            "1M",
        ]);
        let v = json(&out);
        assert_eq!(
            v["totals"],
            serde_json::json!({
                "old_bytes": 237993164i64, "new_bytes": 231899340i64, "delta_bytes": -6093824i64,
                "old_calls": 68787, "new_calls": 68869, "delta_calls": 82,
                "added": 2, "removed": 2, "changed": 5, "unchanged": 3, "inaccurate": 1
            })
        );
        let rows: Vec<(&str, i64)> = v["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .map(|r| {
                (
                    r["function"].as_str().expect("function"),
                    r["delta_bytes"].as_i64().expect("delta"),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("__bpf_map_area_alloc", -8388608),
                ("pagetable_alloc", 4194304),
                ("ctagmod_start", -4136960),
                ("__get_vm_area_node", 2097152)
            ]
        );
        insta::assert_json_snapshot!(v);
    }

    #[test]
    fn diff_sorts_groups_and_marks_vmalloc_callers() {
        let out = vmtrace(&[
            "allocinfo",
            "diff",
            "v1.txt",
            "v2.txt",
            "--group-by",
            "func",
            "--sort",
            "delta-calls",
            "--top",
            "3",
            "--vmallocinfo",
            "vmallocinfo.txt",
            "--bytes",
        ]);
        insta::assert_snapshot!(stdout(&out), @r"
    old: v1.txt (version 1.0, 10 tags)
    new: v2.txt (version 2.0, 11 tags)
    warning: formats differ: v1.txt is version 1.0, v2.txt is version 2.0; tags are still matched on file, line, module and function
    warning: 1 row(s) are accurate:no (marked ~): their absolute values are too low, their deltas are exact

       DELTA  CALLS       OLD       NEW   STATUS  MARK  GROUP
    +4194304  +1024  56623104  60817408             pt  pagetable_alloc
    -4136960  -1010   4136960         -  removed        ctagmod_start
      +49152    +48         -    ~49152    added        mce_device_create

    total: -6093824 bytes, +82 calls (old 237993164 in 68787 calls, new 231899340 in 68869 calls); 2 added, 2 removed, 5 changed, 3 unchanged
    marks: pt = page tables (pagetable_alloc), vm = vmalloc call site; ~ = accurate:no
    ");
        let out = vmtrace(&[
            "allocinfo",
            "diff",
            "v1.txt",
            "v2.txt",
            "--json",
            "--vmallocinfo",
            "vmallocinfo.txt",
            "--sort",
            "name",
        ]);
        let v = json(&out);
        let vmalloc: Vec<&str> = v["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .filter(|r| r["vmalloc"] == true)
            .map(|r| r["function"].as_str().expect("function"))
            .collect();
        assert_eq!(
            vmalloc,
            [
                "__bpf_map_area_alloc",
                "alloc_thread_stack_node",
                "__get_vm_area_node"
            ]
        );
    }

    #[test]
    fn diff_across_human_and_raw_formats_warns() {
        let out = vmtrace(&["allocinfo", "diff", "premerge.txt", "v1.txt", "--json"]);
        let v = json(&out);
        let warnings: Vec<&str> = v["warnings"]
            .as_array()
            .expect("warnings")
            .iter()
            .map(|w| w.as_str().expect("string"))
            .collect();
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].starts_with("formats differ: premerge.txt is pre-merge"));
        assert!(warnings[1].starts_with("pre-merge captures name a module on every line"));
        assert!(warnings[2].starts_with("premerge.txt has human-readable sizes"));
    }

    #[test]
    fn diff_of_a_file_with_itself_is_empty() {
        let out = vmtrace(&["allocinfo", "diff", "v2.txt", "v2.txt", "--json"]);
        let v = json(&out);
        assert_eq!(v["rows"], serde_json::json!([]));
        assert_eq!(v["totals"]["delta_bytes"], 0);
        assert_eq!(v["totals"]["delta_calls"], 0);
        assert_eq!(v["totals"]["unchanged"], 10);
    }

    #[test]
    fn strict_and_lenient_input() {
        let out = vmtrace(&["allocinfo", "show", "bad.txt"]);
        assert!(!out.status.success());
        assert_eq!(
        stderr(&out),
        "vmtrace: error: bad.txt:4: bad size: expected a byte count such as 4096 or -4096, or a \
         human size such as 2.8M, 4.0Mi or 27.2MiB: `12x34`\n"
    );
        let out = vmtrace(&["allocinfo", "show", "bad.txt", "--lenient", "--bytes"]);
        assert!(stdout(&out).contains("total: 20480 in 5 calls"));
        assert_eq!(
            stderr(&out),
            "vmtrace: warning: skipped 3 bad line(s) in bad.txt; the first: bad.txt:4: bad size: \
         expected a byte count such as 4096 or -4096, or a human size such as 2.8M, 4.0Mi or \
         27.2MiB: `12x34`\n"
        );
    }

    #[test]
    fn bad_arguments_say_what_is_accepted() {
        let out = vmtrace(&[
            "allocinfo",
            "diff",
            "v1.txt",
            "v2.txt",
            "--min-delta",
            "lots",
        ]);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("`lots` is not a size"),
            "{}",
            stderr(&out)
        );
        let out = vmtrace(&["allocinfo", "show", "v1.txt", "--filter", "("]);
        assert!(stderr(&out).contains("`(` is not a valid regular expression"));
        let out = vmtrace(&["allocinfo", "show", "missing.txt"]);
        assert!(stderr(&out).starts_with("vmtrace: error: cannot read missing.txt: "));
    }

    #[test]
    fn help_texts() {
        for sub in ["snapshot", "show", "diff", "watch"] {
            let out = vmtrace(&["allocinfo", sub, "--help"]);
            insta::assert_snapshot!(format!("help_{sub}"), stdout(&out));
        }
    }

    /// What the kernel config says decides the exact message; the test reads it the same way an
    /// administrator would, with zcat.
    fn config_says_not_set() -> bool {
        Command::new("zcat")
            .arg("/proc/config.gz")
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l == "# CONFIG_MEM_ALLOC_PROFILING is not set")
            })
            .unwrap_or(false)
    }

    fn assert_explains_unavailable(out: &Output) {
        assert!(!out.status.success(), "must fail without /proc/allocinfo");
        let err = stderr(out);
        assert!(
            err.starts_with("vmtrace: error: /proc/allocinfo does not exist")
                || err.contains("permission denied reading /proc/allocinfo"),
            "{err}"
        );
        assert!(
            err.contains("CONFIG_MEM_ALLOC_PROFILING") || err.contains("0400"),
            "{err}"
        );
        if config_says_not_set() {
            assert_eq!(
                err,
                "vmtrace: error: /proc/allocinfo does not exist: this kernel was built without \
             CONFIG_MEM_ALLOC_PROFILING (/proc/config.gz has `# CONFIG_MEM_ALLOC_PROFILING is not \
             set`). Memory allocation profiling needs a kernel built with \
             CONFIG_MEM_ALLOC_PROFILING=y; `vmtrace allocinfo show` and `diff` still work on files \
             saved elsewhere\n"
            );
        }
    }

    /// On machines without the feature (the project's test machines) snapshot and watch must say
    /// why; where the file exists they must work, so this test never skips.
    #[test]
    fn live_file_on_this_machine() {
        let dir = tempfile::tempdir().expect("tempdir");
        let saved = dir.path().join("snap.txt");
        let snapshot = vmtrace(&["allocinfo", "snapshot", "-o", &saved.display().to_string()]);
        let watch = vmtrace(&["allocinfo", "watch", "--count", "1", "--interval", "10ms"]);
        if std::fs::read(Path::new("/proc/allocinfo")).is_ok() {
            stdout(&snapshot);
            let bytes = std::fs::read(&saved).expect("snapshot written");
            vmtrace::allocinfo::parse("snap", &bytes, vmtrace::allocinfo::Mode::Strict)
                .expect("the live file parses");
            assert!(stdout(&watch).starts_with("watching /proc/allocinfo every 10ms: "));
        } else {
            assert_explains_unavailable(&snapshot);
            assert!(!saved.exists(), "nothing written on failure");
            assert_explains_unavailable(&watch);
        }
    }

    #[test]
    fn snapshot_of_a_file_is_a_byte_copy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let saved = dir.path().join("copy.txt");
        let out = vmtrace(&[
            "allocinfo",
            "snapshot",
            "--file",
            "v2.txt",
            "-o",
            &saved.display().to_string(),
        ]);
        stdout(&out);
        assert_eq!(
            std::fs::read(&saved).expect("written"),
            std::fs::read(fixture("v2.txt")).expect("fixture")
        );
        let out = vmtrace(&["allocinfo", "snapshot", "--file", "bad.txt"]);
        assert_eq!(
            stdout(&out).as_bytes(),
            std::fs::read(fixture("bad.txt")).expect("fixture")
        );
        assert!(stderr(&out).contains("skipped 3 bad line(s) in bad.txt"));
    }

    /// The watcher prints its baseline line after the first read, so replacing the file once that
    /// line has arrived makes the second sample see the new contents without any timing guess.
    #[test]
    fn watch_prints_changes_of_a_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("allocinfo");
        std::fs::copy(fixture("v1.txt"), &path).expect("copy");
        for json in [false, true] {
            std::fs::copy(fixture("v1.txt"), &path).expect("copy");
            let mut args = vec![
                "allocinfo".to_string(),
                "watch".into(),
                "--file".into(),
                path.display().to_string(),
                "--count".into(),
                "1".into(),
                "--interval".into(),
                "1s".into(),
                "--top".into(),
                "2".into(),
            ];
            if json {
                args.push("--json".into());
            }
            let mut child = Command::new(env!("CARGO_BIN_EXE_vmtrace"))
                .args(&args)
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn");
            let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
            let mut first = String::new();
            reader.read_line(&mut first).expect("baseline line");
            std::fs::copy(fixture("v2.txt"), dir.path().join("next")).expect("copy");
            std::fs::rename(dir.path().join("next"), &path).expect("replace");
            let mut rest = String::new();
            std::io::Read::read_to_string(&mut reader, &mut rest).expect("rest");
            assert!(child.wait().expect("exit").success());
            if json {
                let base: Value = serde_json::from_str(&first).expect("json");
                assert_eq!(base["sample"], 0);
                assert_eq!(base["total"]["bytes"], 237993164i64);
                let update: Value = serde_json::from_str(rest.trim()).expect("json");
                assert_eq!(update["sample"], 1);
                assert_eq!(update["changed"], 9);
                assert_eq!(update["delta_bytes"], -6093824i64);
                assert_eq!(update["rows"][0]["function"], "__bpf_map_area_alloc");
                assert_eq!(update["rows"][0]["since_first_bytes"], -8388608i64);
                assert_eq!(update["rows"][1]["pagetable"], true);
            } else {
                assert_eq!(
                    first,
                    format!(
                        "watching {} every 1s: 10 tags, 227M in 68787 calls\n",
                        path.display()
                    )
                );
                let lines: Vec<&str> = rest.lines().collect();
                assert!(lines[0].starts_with("[+1."), "{rest}");
                assert!(
                lines[0].ends_with(
                    "sample 1: -5.9M since previous, -5.9M since start, total 222M; 9 row(s) changed"
                ),
                "{rest}"
            );
                assert_eq!(
                &lines[1..],
                [
                    "CHANGE  CALLS  SINCE-START  CALLS  NOW  MARK  NAME",
                    " -8.0M     -2        -8.0M     -2  24M        kernel/bpf/syscall.c:320 func:__bpf_map_area_alloc",
                    " +4.0M  +1024        +4.0M  +1024  58M    pt  include/linux/mm.h:2990 func:pagetable_alloc",
                    "",
                ]
            );
            }
        }
    }
}
