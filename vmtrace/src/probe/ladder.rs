//! The strategy ladder: for each logical probe, try fentry/fexit, then kprobe/kretprobe, then
//! the tracepoint rung, and remember why each richer rung was refused.
//!
//! Availability is detected, never assumed: kernel BTF (`/sys/kernel/btf/vmlinux`), kprobe
//! support (`/sys/bus/event_source/devices/kprobe` or `<tracefs>/kprobe_events`), and a trial
//! load (and for kprobes a trial attach) of the real program from the embedded object. On the
//! reference kernel fentry loads fail with EPERM and `CONFIG_KPROBES` is off, so every probe
//! lands on its tracepoint rung; test boxes that allow more get the richer rungs.

use std::path::Path;

use aya::{
    programs::{FEntry, FExit, KProbe},
    Btf, Ebpf, EbpfLoader,
};
use vmtrace_common::names;

use crate::host::kallsyms::Kallsyms;

/// A rung of the ladder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rung {
    Fentry,
    Kprobe,
    Tracepoint,
    /// Nothing could attach (or, for allocation latency, no rung below kprobe can measure it).
    None,
}

impl Rung {
    pub fn name(self) -> &'static str {
        match self {
            Rung::Fentry => "fentry",
            Rung::Kprobe => "kprobe",
            Rung::Tracepoint => "tracepoint",
            Rung::None => "none",
        }
    }
}

/// One BPF program of a rung and where it goes.
#[derive(Clone, Copy, Debug)]
pub struct ProgSpec {
    pub program: &'static str,
    /// Kernel function (fentry/kprobe rungs), or `category:name` (tracepoint rung).
    pub target: &'static str,
    /// fexit / kretprobe rather than fentry / kprobe.
    pub ret: bool,
}

/// A logical probe and its programs on each rung.
#[derive(Clone, Copy, Debug)]
pub struct Logical {
    pub name: &'static str,
    pub fentry: &'static [ProgSpec],
    pub kprobe: &'static [ProgSpec],
    pub tracepoint: &'static [ProgSpec],
    /// Said in the header when the tracepoint rung is chosen and it lacks something.
    pub tracepoint_note: Option<&'static str>,
}

/// Placeholder target resolved from kallsyms: the queued-spinlock slow path is
/// `__pv_queued_spin_lock_slowpath` on paravirt kernels, `native_queued_spin_lock_slowpath`
/// elsewhere.
pub const SPIN_SLOWPATH: &str = "<spin slowpath>";

const fn p(program: &'static str, target: &'static str, ret: bool) -> ProgSpec {
    ProgSpec {
        program,
        target,
        ret,
    }
}

/// The pool decay `__purge_vmap_area_lazy` runs for each node right before detaching its lazy
/// list: timed on the richer rungs of `purge_work`, it marks every node's detach.
pub const DECAY_FUNCTION: &str = "decay_va_pool_node";

pub const NO_LATENCY: &str = "n/a: no latency without fentry/kprobe";

pub const NO_HOLDS: &str = "n/a: lock holds need fentry (no tracepoint marks a lock's release)";

pub const LOGICAL: [Logical; 6] = [
    Logical {
        name: "lock_waits",
        fentry: &[
            p(names::PROG_FENTRY_SPIN, SPIN_SLOWPATH, false),
            p(names::PROG_FEXIT_SPIN, SPIN_SLOWPATH, true),
        ],
        kprobe: &[
            p(names::PROG_KPROBE_SPIN, SPIN_SLOWPATH, false),
            p(names::PROG_KRETPROBE_SPIN, SPIN_SLOWPATH, true),
        ],
        tracepoint: &[
            p(names::PROG_LOCK_BEGIN, "lock:contention_begin", false),
            p(names::PROG_LOCK_END, "lock:contention_end", false),
        ],
        tracepoint_note: None,
    },
    Logical {
        name: "purge_work",
        fentry: &[
            p(names::PROG_FENTRY_PURGE_NODE, "purge_vmap_node", false),
            p(names::PROG_FEXIT_PURGE_NODE, "purge_vmap_node", true),
            p(names::PROG_FENTRY_DECAY, DECAY_FUNCTION, false),
            p(names::PROG_FEXIT_DECAY, DECAY_FUNCTION, true),
        ],
        kprobe: &[
            p(names::PROG_KPROBE_PURGE_NODE, "purge_vmap_node", false),
            p(names::PROG_KRETPROBE_PURGE_NODE, "purge_vmap_node", true),
            p(names::PROG_KPROBE_DECAY, DECAY_FUNCTION, false),
            p(names::PROG_KRETPROBE_DECAY, DECAY_FUNCTION, true),
        ],
        tracepoint: &[
            p(
                names::PROG_WQ_START,
                "workqueue:workqueue_execute_start",
                false,
            ),
            p(names::PROG_WQ_END, "workqueue:workqueue_execute_end", false),
        ],
        tracepoint_note: Some("per work item, not per node; no nr_purged; no detach times"),
    },
    Logical {
        name: "page_tables",
        fentry: &[p(names::PROG_FENTRY_PTE, "__pte_alloc_kernel", false)],
        kprobe: &[p(names::PROG_KPROBE_PTE, "__pte_alloc_kernel", false)],
        tracepoint: &[p(names::PROG_PAGE_ALLOC, "kmem:mm_page_alloc", false)],
        tracepoint_note: Some("level and time, no virtual address"),
    },
    Logical {
        name: "backing_pages",
        fentry: &[],
        kprobe: &[],
        tracepoint: &[p(names::PROG_PAGE_ALLOC, "kmem:mm_page_alloc", false)],
        tracepoint_note: Some(
            "order histogram in the footer; bulk order-0 allocations that bypass the \
             mm_page_alloc tracepoint are not counted",
        ),
    },
    Logical {
        name: "alloc_latency",
        fentry: &[
            p(names::PROG_FENTRY_ALLOC, "alloc_vmap_area", false),
            p(names::PROG_FEXIT_ALLOC, "alloc_vmap_area", true),
        ],
        kprobe: &[
            p(names::PROG_KPROBE_ALLOC, "alloc_vmap_area", false),
            p(names::PROG_KRETPROBE_ALLOC, "alloc_vmap_area", true),
        ],
        tracepoint: &[],
        tracepoint_note: Some(NO_LATENCY),
    },
    // Every spinlock in the kernel passes both functions, so a kprobe rung (an int3 trap on
    // each) would slow the whole machine far more than the fentry trampolines do: fentry only.
    Logical {
        name: "lock_holds",
        fentry: &[
            p(names::PROG_FEXIT_SPIN_LOCK, "_raw_spin_lock", true),
            p(names::PROG_FENTRY_SPIN_UNLOCK, "_raw_spin_unlock", false),
        ],
        kprobe: &[],
        tracepoint: &[],
        tracepoint_note: Some(NO_HOLDS),
    },
];

/// What the detection found for one logical probe.
#[derive(Clone, Debug)]
pub struct Choice {
    pub logical: Logical,
    pub rung: Rung,
    /// `(rung, reason)` for each rung refused above the chosen one.
    pub refused: Vec<(Rung, String)>,
    /// Left off because the user did not ask for it (`vmtrace record --probes`).
    pub not_requested: bool,
}

/// The programs of a choice's rung (none when it has none).
pub fn rung_programs(choice: &Choice) -> &'static [ProgSpec] {
    match choice.rung {
        Rung::Fentry => choice.logical.fentry,
        Rung::Kprobe => choice.logical.kprobe,
        Rung::Tracepoint => choice.logical.tracepoint,
        Rung::None => &[],
    }
}

/// Names of the optional logical probes, for `--probes` validation and help.
pub fn logical_names() -> Vec<&'static str> {
    LOGICAL.iter().map(|l| l.name).collect()
}

/// Why a probe is off when the user left it out.
pub const NOT_REQUESTED: &str = "off: not requested (see `vmtrace record --probes`)";

/// Resolves a program target (the spin slow-path placeholder) against kallsyms.
pub fn resolve_target(target: &'static str, ksyms: Option<&Kallsyms>) -> String {
    if target != SPIN_SLOWPATH {
        return target.to_string();
    }
    let pv = "__pv_queued_spin_lock_slowpath";
    let has_pv = ksyms.is_some_and(|k| k.addr_of(pv).is_some());
    if has_pv && PvSpinFacts::read().pv_in_use() {
        pv.into()
    } else {
        "native_queued_spin_lock_slowpath".into()
    }
}

/// What decides which queued-spinlock slow path `pv_ops` calls. A paravirt kernel always has
/// `__pv_queued_spin_lock_slowpath`, but it calls it only after `kvm_spinlock_init` (or Xen's
/// or Hyper-V's) switched it in; everywhere else (bare metal, QEMU's TCG) it calls
/// `native_queued_spin_lock_slowpath`, and a probe on the other symbol never fires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PvSpinFacts {
    /// CPUID 0x40000000 names KVM.
    pub kvm: bool,
    /// KVM_FEATURE_PV_UNHALT (CPUID 0x40000001 EAX bit 7): the host can wake a halted waiter.
    pub pv_unhalt: bool,
    /// KVM_HINTS_REALTIME (CPUID 0x40000001 EDX bit 0): vCPUs are never preempted.
    pub realtime_hint: bool,
    /// CPUID 0x40000000 names Xen or Hyper-V, whose own init installs the pv slow path.
    pub other_pv_hypervisor: bool,
    pub possible_cpus: u32,
    /// `nopvspin` on the kernel command line.
    pub nopvspin: bool,
}

impl PvSpinFacts {
    /// Reads the facts from CPUID, `/sys/devices/system/cpu/possible` and `/proc/cmdline`.
    pub fn read() -> Self {
        let (signature, features) = hypervisor_cpuid();
        let possible_cpus = std::fs::read_to_string("/sys/devices/system/cpu/possible")
            .ok()
            .and_then(|t| crate::host::system::parse_cpulist(&t).ok())
            .unwrap_or(1);
        let nopvspin = std::fs::read_to_string("/proc/cmdline")
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "nopvspin"));
        PvSpinFacts {
            kvm: &signature == b"KVMKVMKVM\0\0\0",
            pv_unhalt: features.0 & (1 << 7) != 0,
            realtime_hint: features.1 & 1 != 0,
            other_pv_hypervisor: &signature == b"XenVMMXenVMM" || &signature == b"Microsoft Hv",
            possible_cpus,
            nopvspin,
        }
    }

    /// `kvm_spinlock_init`'s conditions (arch/x86/kernel/kvm.c): PV unhalt offered, no
    /// realtime hint, more than one possible CPU, no `nopvspin`.
    pub fn pv_in_use(&self) -> bool {
        let smp = self.possible_cpus > 1 && !self.nopvspin;
        if self.kvm {
            self.pv_unhalt && !self.realtime_hint && smp
        } else {
            self.other_pv_hypervisor && smp
        }
    }
}

/// The hypervisor signature (CPUID 0x40000000 EBX:ECX:EDX) and the KVM feature leaf
/// (0x40000001 EAX, EDX); zeros when CPUID.1:ECX bit 31 says no hypervisor is there.
#[cfg(target_arch = "x86_64")]
fn hypervisor_cpuid() -> ([u8; 12], (u32, u32)) {
    use std::arch::x86_64::__cpuid;
    // Leaves 0x4000_00xx are reserved for hypervisors and only read when the hypervisor bit
    // is set.
    let leaf1 = __cpuid(1);
    if leaf1.ecx & (1 << 31) == 0 {
        return ([0; 12], (0, 0));
    }
    let base = __cpuid(0x4000_0000);
    let mut signature = [0u8; 12];
    signature[..4].copy_from_slice(&base.ebx.to_le_bytes());
    signature[4..8].copy_from_slice(&base.ecx.to_le_bytes());
    signature[8..].copy_from_slice(&base.edx.to_le_bytes());
    let features = if base.eax >= 0x4000_0001 {
        let f = __cpuid(0x4000_0001);
        (f.eax, f.edx)
    } else {
        (0, 0)
    };
    (signature, features)
}

#[cfg(not(target_arch = "x86_64"))]
fn hypervisor_cpuid() -> ([u8; 12], (u32, u32)) {
    ([0; 12], (0, 0))
}

/// Why kprobes cannot be used at all here, if that can be told without trying.
pub fn kprobe_unavailable(tracefs: Option<&Path>) -> Option<String> {
    let pmu = Path::new("/sys/bus/event_source/devices/kprobe");
    let events = tracefs.map(|t| t.join("kprobe_events"));
    if pmu.exists() || events.as_ref().is_some_and(|e| e.exists()) {
        return None;
    }
    Some(format!(
        "kprobes not configured: no {} and no {} (CONFIG_KPROBES off)",
        pmu.display(),
        events
            .map(|e| e.display().to_string())
            .unwrap_or_else(|| "tracefs kprobe_events".into())
    ))
}

/// Names an errno in a load/attach error chain so the reason is greppable (`EPERM`, …).
pub fn describe_error(action: &str, e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        text.push_str(": ");
        text.push_str(&s.to_string());
        src = s.source();
    }
    let errno = [
        ("Operation not permitted", "EPERM"),
        ("Permission denied", "EACCES"),
        ("Invalid argument", "EINVAL"),
        ("No such file or directory", "ENOENT"),
        ("not supported", "EOPNOTSUPP"),
        ("No such process", "ESRCH"),
    ]
    .iter()
    .find(|(needle, _)| text.contains(needle))
    .map(|(_, name)| *name);
    match errno {
        Some(name) => format!("{action} failed: {name} ({text})"),
        None => format!("{action} failed: {text}"),
    }
}

/// Environment variable capping the ladder: `kprobe` skips fentry, `tracepoint` skips both
/// richer rungs. It exists to exercise a lower rung on a kernel that offers a higher one (the
/// test box checks the kprobe programs that way), like `VMTRACE_TRACEPOINTS=perf` for the
/// tracepoint attach.
pub const MAX_RUNG_ENV: &str = "VMTRACE_MAX_RUNG";

/// The highest rung [`MAX_RUNG_ENV`] allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RungCap(Option<Rung>);

impl RungCap {
    fn parse(value: Option<&str>) -> Self {
        RungCap(match value {
            Some("kprobe") => Some(Rung::Kprobe),
            Some("tracepoint") => Some(Rung::Tracepoint),
            _ => None,
        })
    }

    /// Why `rung` is skipped, when the cap is below it.
    fn refuses(self, rung: Rung) -> Option<String> {
        let cap = self.0?;
        let order = |r: Rung| match r {
            Rung::Fentry => 3,
            Rung::Kprobe => 2,
            Rung::Tracepoint => 1,
            Rung::None => 0,
        };
        (order(rung) > order(cap)).then(|| {
            format!(
                "skipped: {MAX_RUNG_ENV}={}",
                if cap == Rung::Kprobe {
                    "kprobe"
                } else {
                    "tracepoint"
                }
            )
        })
    }
}

fn max_rung_from_env() -> RungCap {
    RungCap::parse(std::env::var(MAX_RUNG_ENV).ok().as_deref())
}

/// Tries each richer rung of every logical probe on a throw-away copy of the object.
pub fn detect(object: &[u8], tracefs: Option<&Path>, ksyms: Option<&Kallsyms>) -> Vec<Choice> {
    let btf_path = Path::new("/sys/kernel/btf/vmlinux");
    let btf = if btf_path.exists() {
        Btf::from_sys_fs().map_err(|e| describe_error("reading kernel BTF", &e))
    } else {
        Err(format!("no kernel BTF ({} missing)", btf_path.display()))
    };
    let cap = max_rung_from_env();
    let kprobe_off = kprobe_unavailable(tracefs);
    let mut trial: Option<Ebpf> = None;
    let mut choices = Vec::new();
    for logical in LOGICAL {
        let mut refused = Vec::new();
        let mut rung = None;
        if logical.fentry.is_empty() {
            refused.push((Rung::Fentry, "no fentry program for this probe".to_string()));
        } else if let Some(why) = cap.refuses(Rung::Fentry) {
            refused.push((Rung::Fentry, why));
        } else {
            match &btf {
                Err(reason) => refused.push((Rung::Fentry, reason.clone())),
                Ok(btf) => match trial_fentry(object, &mut trial, logical.fentry, btf, ksyms) {
                    Ok(()) => rung = Some(Rung::Fentry),
                    Err(reason) => refused.push((Rung::Fentry, reason)),
                },
            }
        }
        if rung.is_none() {
            if logical.kprobe.is_empty() {
                refused.push((Rung::Kprobe, "no kprobe program for this probe".to_string()));
            } else if let Some(why) = cap.refuses(Rung::Kprobe) {
                refused.push((Rung::Kprobe, why));
            } else if let Some(reason) = &kprobe_off {
                refused.push((Rung::Kprobe, reason.clone()));
            } else {
                match trial_kprobe(object, &mut trial, logical.kprobe, ksyms) {
                    Ok(()) => rung = Some(Rung::Kprobe),
                    Err(reason) => refused.push((Rung::Kprobe, reason)),
                }
            }
        }
        let rung = rung.unwrap_or(if logical.tracepoint.is_empty() {
            Rung::None
        } else {
            Rung::Tracepoint
        });
        choices.push(Choice {
            logical,
            rung,
            refused,
            not_requested: false,
        });
    }
    choices
}

/// Loads every kprobe-rung program of `object` through the kernel's verifier without attaching
/// it: `(program, why it was refused)` for each one refused. A kernel without kprobes (the
/// reference one) can still verify them, so the richer rungs are checked beyond compiling.
pub fn verify_kprobe_programs(object: &[u8]) -> Result<Vec<(&'static str, String)>, String> {
    let mut trial = None;
    let ebpf = trial_object(object, &mut trial)?;
    let mut refused = Vec::new();
    for spec in LOGICAL.iter().flat_map(|l| l.kprobe) {
        let Some(prog) = ebpf.program_mut(spec.program) else {
            refused.push((spec.program, "missing from the object".to_string()));
            continue;
        };
        let loaded = match <&mut KProbe>::try_from(prog) {
            Ok(p) => p.load().map_err(|e| describe_error("verifier load", &e)),
            Err(e) => Err(describe_error("type check", &e)),
        };
        if let Err(why) = loaded {
            refused.push((spec.program, why));
        }
    }
    Ok(refused)
}

fn trial_object<'a>(object: &[u8], trial: &'a mut Option<Ebpf>) -> Result<&'a mut Ebpf, String> {
    if trial.is_none() {
        let e = EbpfLoader::new()
            .load(object)
            .map_err(|e| describe_error("loading the probe object", &e))?;
        *trial = Some(e);
    }
    trial
        .as_mut()
        .ok_or_else(|| "probe object not loaded".to_string())
}

fn trial_fentry(
    object: &[u8],
    trial: &mut Option<Ebpf>,
    progs: &[ProgSpec],
    btf: &Btf,
    ksyms: Option<&Kallsyms>,
) -> Result<(), String> {
    let ebpf = trial_object(object, trial)?;
    for spec in progs {
        let target = resolve_target(spec.target, ksyms);
        let prog = ebpf
            .program_mut(spec.program)
            .ok_or_else(|| format!("program {} missing from the object", spec.program))?;
        let result = if spec.ret {
            let p: &mut FExit = prog
                .try_into()
                .map_err(|e| describe_error("type check", &e))?;
            p.load(&target, btf)
        } else {
            let p: &mut FEntry = prog
                .try_into()
                .map_err(|e| describe_error("type check", &e))?;
            p.load(&target, btf)
        };
        match result {
            Ok(()) | Err(aya::programs::ProgramError::AlreadyLoaded) => {}
            Err(e) => {
                let kind = if spec.ret { "fexit" } else { "fentry" };
                return Err(describe_error(&format!("{kind} load on {target}"), &e));
            }
        }
    }
    Ok(())
}

fn trial_kprobe(
    object: &[u8],
    trial: &mut Option<Ebpf>,
    progs: &[ProgSpec],
    ksyms: Option<&Kallsyms>,
) -> Result<(), String> {
    let ebpf = trial_object(object, trial)?;
    for spec in progs {
        let target = resolve_target(spec.target, ksyms);
        let prog = ebpf
            .program_mut(spec.program)
            .ok_or_else(|| format!("program {} missing from the object", spec.program))?;
        let p: &mut KProbe = prog
            .try_into()
            .map_err(|e| describe_error("type check", &e))?;
        match p.load() {
            Ok(()) | Err(aya::programs::ProgramError::AlreadyLoaded) => {}
            Err(e) => return Err(describe_error(&format!("kprobe load on {target}"), &e)),
        }
        // The attach is the real test (no kprobe PMU, a blacklisted function); the link is
        // dropped with the trial object.
        p.attach(&target, 0)
            .map_err(|e| describe_error(&format!("kprobe attach on {target}"), &e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rung_cap_skips_only_what_lies_above_it() {
        let kprobe = RungCap::parse(Some("kprobe"));
        assert!(kprobe.refuses(Rung::Fentry).is_some());
        assert_eq!(kprobe.refuses(Rung::Kprobe), None);
        let tp = RungCap::parse(Some("tracepoint"));
        assert!(tp.refuses(Rung::Fentry).is_some() && tp.refuses(Rung::Kprobe).is_some());
        assert_eq!(RungCap::parse(None).refuses(Rung::Fentry), None);
        assert_eq!(RungCap::parse(Some("fentry")).refuses(Rung::Fentry), None);
    }

    #[test]
    fn the_pv_slow_path_is_used_only_where_kvm_spinlock_init_installs_it() {
        let kvm = PvSpinFacts {
            kvm: true,
            pv_unhalt: true,
            possible_cpus: 4,
            ..PvSpinFacts::default()
        };
        assert!(kvm.pv_in_use());
        assert!(
            !PvSpinFacts {
                pv_unhalt: false,
                ..kvm
            }
            .pv_in_use(),
            "no host support"
        );
        assert!(
            !PvSpinFacts {
                realtime_hint: true,
                ..kvm
            }
            .pv_in_use(),
            "realtime hint"
        );
        assert!(
            !PvSpinFacts {
                possible_cpus: 1,
                ..kvm
            }
            .pv_in_use(),
            "one CPU"
        );
        assert!(
            !PvSpinFacts {
                nopvspin: true,
                ..kvm
            }
            .pv_in_use(),
            "nopvspin"
        );
        // Bare metal and QEMU's TCG offer no hypervisor leaves: the native path runs.
        let bare = PvSpinFacts {
            possible_cpus: 16,
            ..PvSpinFacts::default()
        };
        assert!(!bare.pv_in_use());
        let xen = PvSpinFacts {
            other_pv_hypervisor: true,
            ..bare
        };
        assert!(xen.pv_in_use());
    }
}
