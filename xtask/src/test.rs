//! `cargo xtask test`: every check CI runs, in order, stopping at the first failure.
//!
//! The eBPF crate is linted on its own (nightly, `bpfel-unknown-none`) because a workspace-wide
//! clippy would build it for the host, where its `no_std` panic handler clashes with std's.
//! Integration tests whose target name starts with `privileged_` load probes and share kernel
//! state (tracepoints, `kernel.kptr_restrict`), so each runs alone with one test thread, and in
//! the release profile, because some of them check throughput of the shipped build.

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::cmd::{self, banner, is_root, Metadata};
use crate::setup::setup;

/// Integration test targets with this prefix need root and run one at a time.
const PRIVILEGED_PREFIX: &str = "privileged_";
/// Integration test targets with this prefix boot the test box guest (`cargo xtask testbox`);
/// they run last, one at a time, with the xtask binary named in `VMTRACE_XTASK`.
const TESTBOX_PREFIX: &str = "testbox_";
/// Set for every test when running as root, so privileged tests fail instead of skipping: CI is
/// root on a real kernel, and a skipped test there would hide a regression.
const REQUIRE_PRIVILEGED: &str = "VMTRACE_REQUIRE_PRIVILEGED";
/// The kernel-side crate, which builds only for the BPF target.
const EBPF_CRATE: &str = "vmtrace-ebpf";

type Action = Box<dyn FnOnce() -> Result<()>>;

struct Step {
    name: String,
    action: Action,
}

impl Step {
    fn new(name: impl Into<String>, action: impl FnOnce() -> Result<()> + 'static) -> Self {
        Step {
            name: name.into(),
            action: Box::new(action),
        }
    }

    /// A step that runs one command.
    fn command(name: impl Into<String>, mut cmd: Command) -> Self {
        Step::new(name, move || cmd::run(&mut cmd))
    }
}

pub fn test() -> Result<ExitCode> {
    let metadata = cmd::metadata()?;
    let steps = plan(&metadata);
    let total = steps.len();
    let mut finished: Vec<(String, Duration)> = Vec::new();
    let started = Instant::now();

    for (i, step) in steps.into_iter().enumerate() {
        banner(&format!("[{}/{total}] {}", i + 1, step.name));
        let t0 = Instant::now();
        if let Err(err) = (step.action)() {
            let elapsed = t0.elapsed();
            print_summary(
                &finished,
                Some((&step.name, elapsed)),
                total,
                started.elapsed(),
            );
            eprintln!("xtask: error: {err:#}");
            eprintln!("cargo xtask test: FAILED at step `{}`", step.name);
            return Ok(ExitCode::FAILURE);
        }
        finished.push((step.name, t0.elapsed()));
    }
    print_summary(&finished, None, total, started.elapsed());
    println!("cargo xtask test: all {total} steps passed");
    Ok(ExitCode::SUCCESS)
}

/// Lays out the steps, discovering the test targets from `cargo metadata` so that a new
/// `tests/*.rs` file is picked up without editing the xtask.
fn plan(metadata: &Metadata) -> Vec<Step> {
    let root = cmd::workspace_root();
    let packages: Vec<&str> = metadata
        .default_members()
        .map(|p| p.name.as_str())
        .collect();
    let package_args: Vec<String> = packages
        .iter()
        .flat_map(|p| ["--package".to_string(), p.to_string()])
        .collect();

    let mut steps = vec![
        Step::new("setup", setup),
        Step::command("rustfmt", {
            let mut c = cmd::cargo();
            c.args(["fmt", "--all", "--", "--check"]);
            c
        }),
        Step::command(format!("clippy (user space: {})", packages.join(", ")), {
            let mut c = cmd::cargo();
            c.arg("clippy")
                .args(&package_args)
                .args(["--all-targets", "--", "-D", "warnings"]);
            c
        }),
        Step::command(
            format!("clippy ({EBPF_CRATE}, nightly, bpfel-unknown-none)"),
            {
                // `rustup run nightly` rather than `cargo +nightly`: the xtask runs under
                // RUSTUP_TOOLCHAIN=stable and `rustup run` is how aya-build calls nightly too.
                let mut c = Command::new("rustup");
                c.current_dir(root.join(EBPF_CRATE))
                    .args([
                        "run",
                        "nightly",
                        "cargo",
                        "clippy",
                        "--target",
                        "bpfel-unknown-none",
                    ])
                    .args(["-Z", "build-std=core", "--", "-D", "warnings"]);
                c
            },
        ),
    ];

    if is_root() {
        println!("running as root: {REQUIRE_PRIVILEGED}=1, privileged tests must pass");
    } else {
        println!("not root: privileged tests will skip (they need CAP_BPF and CAP_PERFMON)");
    }
    let test_cmd = || {
        let mut c = cmd::cargo();
        c.arg("test");
        if is_root() {
            c.env(REQUIRE_PRIVILEGED, "1");
        }
        c
    };

    // `--lib` fails when no selected package has a library (and `--bins` likewise), so each
    // flag is passed only when some default member has such a target.
    let has_kind = |kind: &str| {
        metadata
            .default_members()
            .any(|p| p.targets.iter().any(|t| t.kind.iter().any(|k| k == kind)))
    };
    let unit_flags: Vec<&str> = [("lib", "--lib"), ("bin", "--bins")]
        .into_iter()
        .filter(|(kind, _)| has_kind(kind))
        .map(|(_, flag)| flag)
        .collect();
    if !unit_flags.is_empty() {
        steps.push(Step::command("unit tests (lib and bins)", {
            let mut c = test_cmd();
            c.args(&package_args).args(&unit_flags);
            c
        }));
    }
    // Doc tests only exist in library crates; cargo refuses `--doc` on a package without one.
    let with_lib: Vec<String> = metadata
        .default_members()
        .filter(|p| p.targets.iter().any(|t| t.kind.iter().any(|k| k == "lib")))
        .flat_map(|p| ["--package".to_string(), p.name.clone()])
        .collect();
    if !with_lib.is_empty() {
        steps.push(Step::command("doc tests", {
            let mut c = test_cmd();
            c.args(&with_lib).arg("--doc");
            c
        }));
    }

    let mut plain = Vec::new();
    let mut privileged = Vec::new();
    let mut guest = Vec::new();
    for package in metadata.default_members() {
        for target in package
            .targets
            .iter()
            .filter(|t| t.kind.iter().any(|k| k == "test"))
        {
            let entry = (package.name.clone(), target.name.clone());
            if target.name.starts_with(PRIVILEGED_PREFIX) {
                privileged.push(entry);
            } else if target.name.starts_with(TESTBOX_PREFIX) {
                guest.push(entry);
            } else {
                plain.push(entry);
            }
        }
    }
    if plain.is_empty() {
        println!("no unprivileged integration test targets yet");
    } else {
        let mut c = test_cmd();
        for (package, target) in &plain {
            c.args(["--package", package, "--test", target]);
        }
        steps.push(Step::command("integration tests", c));
    }
    for (package, target) in privileged {
        let mut c = test_cmd();
        // Release build: these tests measure the product as shipped (the sustained-rate test
        // must keep up with two stressing CPUs; an unoptimised serde_json cannot).
        c.arg("--release");
        c.args([
            "--package",
            &package,
            "--test",
            &target,
            "--",
            "--test-threads=1",
        ]);
        steps.push(Step::command(format!("privileged test {target}"), c));
    }
    if is_root() {
        // The whole fidelity pipeline on a short corpus of its own (record, replay strict and
        // explained, calibrate on train, validate free-running): it fails on any broken link,
        // and its figures are printed but not judged (3 s recordings are too short for that;
        // the privileged tests assert floors).
        steps.push(Step::new("fidelity pipeline (3 s corpus)", || {
            let out = cmd::metadata()?.target_directory.join("fidelity-ci");
            crate::fidelity::fidelity(&crate::fidelity::FidelityArgs {
                corpus: Some(out.join("corpus")),
                record: true,
                duration: "3s".into(),
                json: false,
                against: None,
                no_free_running: false,
                // Two seeds run the multi-seed path; its figures are not judged here either.
                seeds: 2,
                // The in-sample ceiling's path runs too, unjudged.
                no_in_sample: false,
                vmtrace: Some(crate::run::build_release()?),
                costs: None,
                // The held-out check's path runs too (on the `test` split), unjudged.
                write_check: Some(out.join("calibration-check.json")),
                // The repeat path runs against the corpus itself: one more replay per
                // recording rather than a second corpus to record. Its kernel figures are then
                // exact by construction and mean nothing.
                repeat: Some(out.join("corpus")),
                out: Some(out),
            })
        }));
    }
    for (package, target) in guest {
        steps.push(Step::new(format!("test box guest {target}"), move || {
            let mut c = test_cmd();
            c.arg("--release")
                .args(["--package", &package, "--test", &target])
                .args(["--", "--test-threads=1", "--nocapture"]);
            match std::env::current_exe() {
                Ok(exe) => {
                    c.env("VMTRACE_XTASK", exe);
                }
                Err(e) => {
                    c.env(
                        "VMTRACE_TESTBOX_UNAVAILABLE",
                        format!("no xtask binary: {e}"),
                    );
                }
            }
            if let Err(reason) = crate::testbox::prepare_default() {
                // Only a missing kernel (no network on a first run) or missing host tools end
                // here; the tests then skip and print the reason.
                println!("WARNING: the test box cannot boot here: {reason:#}");
                c.env("VMTRACE_TESTBOX_UNAVAILABLE", format!("{reason:#}"));
            }
            cmd::run(&mut c)
        }));
    }
    steps
}

fn print_summary(
    finished: &[(String, Duration)],
    failed: Option<(&str, Duration)>,
    total: usize,
    elapsed: Duration,
) {
    banner("summary");
    for (name, took) in finished {
        println!("  ok      {:>7}  {name}", secs(*took));
    }
    let mut shown = finished.len();
    if let Some((name, took)) = failed {
        println!("  FAILED  {:>7}  {name}", secs(took));
        shown += 1;
    }
    if shown < total {
        println!("  ({} later step(s) not run)", total - shown);
    }
    println!("  total   {:>7}", secs(elapsed));
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}
