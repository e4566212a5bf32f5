//! Loads the embedded BPF object with field layouts taken from tracefs, and attaches it.

use std::path::Path;

use aya::{
    maps::{MapData, PerCpuArray, RingBuf},
    programs::TracePoint,
    Ebpf, EbpfLoader,
};
use vmtrace_common::{kind, names, FieldLoc, TpLayout, MAX_FIELDS};

use crate::host::{
    self,
    tracefs::{self, Field, Format},
    HostError,
};
use crate::trace::{ProbeInfo, ProbeRunStats};

/// A tracepoint vmtrace attaches to, with the fields it reads in wire order.
#[derive(Debug, Clone, Copy)]
pub struct TracepointSpec {
    pub category: &'static str,
    pub name: &'static str,
    pub program: &'static str,
    pub layout_global: &'static str,
    pub kind: u32,
    /// Field names in the order the probe stores them in `Event::fields`.
    pub fields: &'static [&'static str],
    /// Fields without which the event is meaningless; a kernel lacking them is refused.
    pub required: &'static [&'static str],
}

pub const TRACEPOINTS: [TracepointSpec; 3] = [
    TracepointSpec {
        category: "vmalloc",
        name: "alloc_vmap_area",
        program: names::PROG_ALLOC,
        layout_global: names::ALLOC_LAYOUT,
        kind: kind::ALLOC,
        fields: &["addr", "size", "align", "vstart", "vend", "failed"],
        required: &["addr", "size"],
    },
    TracepointSpec {
        category: "vmalloc",
        name: "free_vmap_area_noflush",
        program: names::PROG_FREE,
        layout_global: names::FREE_LAYOUT,
        kind: kind::FREE,
        fields: &["va_start", "nr_lazy", "nr_lazy_max"],
        required: &["va_start"],
    },
    TracepointSpec {
        category: "vmalloc",
        name: "purge_vmap_area_lazy",
        program: names::PROG_PURGE,
        layout_global: names::PURGE_LAYOUT,
        kind: kind::PURGE,
        fields: &["start", "end", "npurged"],
        required: &["start", "end"],
    },
];

/// The probe object compiled by `build.rs` from `vmtrace-ebpf`.
static PROBES_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/vmtrace"));

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "insufficient privileges to load BPF programs: run as root, or grant CAP_BPF and \
         CAP_PERFMON (e.g. `sudo setcap cap_bpf,cap_perfmon+ep $(which vmtrace)`)"
    )]
    NoPrivilege,
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(
        "tracepoint {tracepoint} lacks the field `{field}` vmtrace needs (kernel format changed?)"
    )]
    MissingField { tracepoint: String, field: String },
    #[error("tracepoint {tracepoint}: field `{field}` has unsupported size {size}")]
    BadFieldSize {
        tracepoint: String,
        field: String,
        size: u8,
    },
    #[error("loading the BPF object failed: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("BPF program {program}: {action} failed: {source}")]
    Program {
        program: String,
        action: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("BPF map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("ring buffer size {0} bytes is not a power of two multiple of the page size")]
    BadRingSize(u64),
}

/// Maps a tracepoint's format onto the probe's wire layout, refusing kernels that lack a
/// required field.
pub fn build_layout(
    spec: &TracepointSpec,
    format: &Format,
) -> Result<(TpLayout, ProbeInfo), ProbeError> {
    let tp = format!("{}:{}", spec.category, spec.name);
    let mut layout = TpLayout::EMPTY;
    let mut fields: Vec<Field> = Vec::new();
    let mut missing = Vec::new();
    for (i, name) in spec.fields.iter().enumerate().take(MAX_FIELDS) {
        match format.field(name) {
            Some(f) => {
                if !matches!(f.size, 1 | 2 | 4 | 8) {
                    return Err(ProbeError::BadFieldSize {
                        tracepoint: tp,
                        field: f.name.clone(),
                        size: f.size,
                    });
                }
                layout.fields[i] = FieldLoc {
                    offset: f.offset,
                    size: f.size,
                    signed: u8::from(f.signed),
                };
                fields.push(f.clone());
            }
            None if spec.required.contains(name) => {
                return Err(ProbeError::MissingField {
                    tracepoint: tp,
                    field: (*name).into(),
                })
            }
            None => missing.push((*name).to_string()),
        }
    }
    let info = ProbeInfo {
        probe: tp,
        rung: "tracepoint".into(),
        program: spec.program.into(),
        fields,
        missing_fields: missing,
    };
    Ok((layout, info))
}

/// Probes loaded and attached; dropping this detaches them.
pub struct LoadedProbes {
    ebpf: Ebpf,
    pub infos: Vec<ProbeInfo>,
    pub ring_bytes: u64,
    lost: PerCpuArray<MapData, u64>,
    links: Vec<(&'static str, aya::programs::trace_point::TracePointLinkId)>,
}

impl LoadedProbes {
    /// Checks privileges, reads the tracepoint formats, loads the object with those layouts and
    /// attaches every program. Any failure is reported with what to do about it.
    pub fn load_and_attach(ring_bytes: u64) -> Result<Self, ProbeError> {
        if !host::system::bpf_capable()? {
            return Err(ProbeError::NoPrivilege);
        }
        let page = host::system::SystemFacts::read()?.page_size;
        if !ring_bytes.is_power_of_two() || ring_bytes < page || ring_bytes > u64::from(u32::MAX) {
            return Err(ProbeError::BadRingSize(ring_bytes));
        }
        raise_memlock();
        let tracefs = tracefs::locate()?;
        Self::load_with(&tracefs, ring_bytes)
    }

    fn load_with(tracefs: &Path, ring_bytes: u64) -> Result<Self, ProbeError> {
        let mut layouts = Vec::new();
        let mut infos = Vec::new();
        for spec in &TRACEPOINTS {
            let format = tracefs::read_format(tracefs, spec.category, spec.name)?;
            let (layout, info) = build_layout(spec, &format)?;
            layouts.push((spec.layout_global, layout));
            infos.push(info);
        }
        let mut loader = EbpfLoader::new();
        for (global, layout) in &layouts {
            loader.override_global(global, layout, true);
        }
        // Checked above to fit.
        loader.map_max_entries(names::EVENTS, ring_bytes as u32);
        let mut ebpf = loader
            .load(PROBES_OBJECT)
            .map_err(|e| classify_load_error(Box::new(e)))?;
        start_probe_logger(&mut ebpf);
        let mut links = Vec::new();
        for spec in &TRACEPOINTS {
            let program: &mut TracePoint = ebpf
                .program_mut(spec.program)
                .ok_or_else(|| ProbeError::Program {
                    program: spec.program.into(),
                    action: "lookup",
                    source: Box::new(aya::programs::ProgramError::UnexpectedProgramType),
                })?
                .try_into()
                .map_err(|e| ProbeError::Program {
                    program: spec.program.into(),
                    action: "type check",
                    source: Box::new(e),
                })?;
            program.load().map_err(|e| ProbeError::Program {
                program: spec.program.into(),
                action: "verifier load",
                source: Box::new(e),
            })?;
            let link =
                program
                    .attach(spec.category, spec.name)
                    .map_err(|e| ProbeError::Program {
                        program: spec.program.into(),
                        action: "attach",
                        source: Box::new(e),
                    })?;
            links.push((spec.program, link));
            log::info!(
                "attached {} to tracepoint {}:{}",
                spec.program,
                spec.category,
                spec.name
            );
        }
        let lost_map = ebpf.take_map(names::LOST).ok_or(ProbeError::Map {
            map: names::LOST,
            source: Box::new(aya::maps::MapError::InvalidName {
                name: names::LOST.into(),
            }),
        })?;
        let lost = PerCpuArray::try_from(lost_map).map_err(|e| ProbeError::Map {
            map: names::LOST,
            source: Box::new(e),
        })?;
        Ok(Self {
            ebpf,
            infos,
            ring_bytes,
            lost,
            links,
        })
    }

    /// Detaches every program but keeps them loaded, so no event is produced after this while
    /// the run counts and lost counters can still be read and the ring buffer drained: the
    /// footer then balances exactly.
    pub fn detach(&mut self) {
        for (name, link) in self.links.drain(..) {
            let detached = self
                .ebpf
                .program_mut(name)
                .and_then(|p| <&mut TracePoint>::try_from(p).ok())
                .map(|p| p.detach(link));
            if let Some(Err(e)) = detached {
                log::warn!("detaching {name}: {e}");
            }
        }
    }

    /// Takes the event ring buffer; call once.
    pub fn take_ring(&mut self) -> Result<RingBuf<MapData>, ProbeError> {
        let map = self.ebpf.take_map(names::EVENTS).ok_or(ProbeError::Map {
            map: names::EVENTS,
            source: Box::new(aya::maps::MapError::InvalidName {
                name: names::EVENTS.into(),
            }),
        })?;
        RingBuf::try_from(map).map_err(|e| ProbeError::Map {
            map: names::EVENTS,
            source: Box::new(e),
        })
    }

    /// The kernel's own count of program runs, i.e. tracepoint hits, per probe. Only meaningful
    /// while `kernel.bpf_stats_enabled` is 1; `None` otherwise. Comparing it with events received
    /// plus events lost checks the whole pipeline against the kernel.
    pub fn run_stats(&self) -> Option<Vec<ProbeRunStats>> {
        if !bpf_stats_enabled() {
            return None;
        }
        TRACEPOINTS
            .iter()
            .map(|spec| {
                let info = self.ebpf.program(spec.program)?.info().ok()?;
                Some(ProbeRunStats {
                    probe: format!("{}:{}", spec.category, spec.name),
                    run_count: info.run_count(),
                    run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                })
            })
            .collect()
    }

    /// Reserve failures so far: `[kind][cpu]`, indexed by `vmtrace_common::kind`.
    pub fn lost(&self) -> Result<Vec<Vec<u64>>, ProbeError> {
        (0..kind::COUNT)
            .map(|k| {
                self.lost
                    .get(&k, 0)
                    .map(|v| v.iter().copied().collect())
                    .map_err(|e| ProbeError::Map {
                        map: names::LOST,
                        source: Box::new(e),
                    })
            })
            .collect()
    }
}

/// `kernel.bpf_stats_enabled`: whether the kernel counts program runs and run time.
pub fn bpf_stats_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .map(|v| v.trim() == "1")
        .unwrap_or(false)
}

/// EPERM from the kernel at load time means privileges even when the capability check passed
/// (e.g. a LSM or a user namespace); say so instead of printing a verifier dump.
fn classify_load_error(e: Box<aya::EbpfError>) -> ProbeError {
    let text = format!("{e:?}");
    if text.contains("EPERM") || text.contains("Operation not permitted") {
        ProbeError::NoPrivilege
    } else {
        ProbeError::Load(e)
    }
}

/// RLIMIT_MEMLOCK only matters on kernels before 5.11 (BPF memory is charged to the memory cgroup
/// since); failing to raise it, e.g. without CAP_SYS_RESOURCE, is not fatal.
fn raise_memlock() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a caller-owned struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        log::debug!(
            "could not raise RLIMIT_MEMLOCK ({}); fine on kernels >= 5.11",
            std::io::Error::last_os_error()
        );
    }
}

/// Forwards aya-log records from the probes (error paths only) to the `log` facade.
fn start_probe_logger(ebpf: &mut Ebpf) {
    match aya_log::EbpfLogger::init(ebpf) {
        Ok(logger) => {
            let Ok(handle) = tokio::runtime::Handle::try_current() else {
                log::debug!("no tokio runtime: probe log records are not forwarded");
                return;
            };
            // SAFETY: the logger owns its ring-buffer fd and keeps it open while the AsyncFd
            // (which owns the logger) is registered.
            let registered = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(
                    logger,
                    tokio::io::Interest::READABLE,
                )
            };
            match registered {
                Ok(mut fd) => {
                    handle.spawn(async move {
                        loop {
                            let Ok(mut guard) = fd.readable_mut().await else {
                                break;
                            };
                            guard.get_inner_mut().flush();
                            guard.clear_ready();
                        }
                    });
                }
                Err(e) => log::debug!("probe logger not polled: {e}"),
            }
        }
        Err(e) => log::debug!("probe logger unavailable: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(fields: &[(&str, u16, u8, bool)]) -> Format {
        Format {
            name: "t".into(),
            id: 1,
            fields: fields
                .iter()
                .map(|&(n, o, s, sg)| Field {
                    name: n.into(),
                    decl: format!("unsigned long {n}"),
                    offset: o,
                    size: s,
                    signed: sg,
                })
                .collect(),
        }
    }

    #[test]
    fn layout_follows_the_format_not_the_wire_order() {
        // A kernel that put `failed` first and lacks `align`.
        let f = fmt(&[
            ("failed", 8, 4, true),
            ("addr", 16, 8, false),
            ("size", 24, 8, false),
            ("vstart", 32, 8, false),
            ("vend", 40, 8, false),
        ]);
        let (layout, info) = build_layout(&TRACEPOINTS[0], &f).unwrap();
        assert_eq!(
            layout.fields[0],
            FieldLoc {
                offset: 16,
                size: 8,
                signed: 0
            }
        );
        assert_eq!(
            layout.fields[5],
            FieldLoc {
                offset: 8,
                size: 4,
                signed: 1
            }
        );
        assert_eq!(layout.fields[2], FieldLoc::default());
        assert_eq!(info.missing_fields, ["align"]);
    }

    #[test]
    fn a_missing_required_field_is_refused() {
        let f = fmt(&[("size", 8, 8, false)]);
        let err = build_layout(&TRACEPOINTS[0], &f).unwrap_err();
        assert!(err.to_string().contains("`addr`"), "{err}");
        let f = fmt(&[("addr", 8, 3, false), ("size", 16, 8, false)]);
        assert!(matches!(
            build_layout(&TRACEPOINTS[0], &f),
            Err(ProbeError::BadFieldSize { .. })
        ));
    }
}
