//! CPU counts, page size, clocks and the vmap-node parameters the kernel derives from them.

use super::{read_to_string, HostError};

/// Parses a kernel CPU list such as `0-3,5,7-8` into the number of CPUs it names.
pub fn parse_cpulist(s: &str) -> Result<u32, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(0);
    }
    let mut n = 0u32;
    for part in s.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let lo: u32 = lo
            .parse()
            .map_err(|_| format!("bad CPU number `{lo}` in `{s}`"))?;
        let hi: u32 = hi
            .parse()
            .map_err(|_| format!("bad CPU number `{hi}` in `{s}`"))?;
        if hi < lo {
            return Err(format!("descending CPU range `{part}` in `{s}`"));
        }
        n += hi - lo + 1;
    }
    Ok(n)
}

fn cpulist(path: &str) -> Result<(u32, String), HostError> {
    let text = read_to_string(path)?;
    let n = parse_cpulist(&text).map_err(|message| HostError::Parse {
        path: path.into(),
        line: 1,
        message,
    })?;
    Ok((n, text.trim().to_string()))
}

/// The node layer of the vmap allocator as `vmap_init_nodes` (mm/vmalloc.c) sets it up: one
/// node per *possible* CPU, capped at 128, with 16-page zones dealt round-robin; a single node
/// otherwise.
pub fn vmap_nodes(possible_cpus: u32, page_size: u64) -> (u32, u64) {
    let n = possible_cpus.clamp(1, 128);
    if n > 1 {
        (n, 16 * page_size)
    } else {
        (1, 1)
    }
}

/// `lazy_max_pages()` (mm/vmalloc.c): `fls(online CPUs) * 32 MiB / PAGE_SIZE`.
pub fn lazy_max_pages(online_cpus: u32, page_size: u64) -> u64 {
    let fls = u64::from(32 - online_cpus.leading_zeros());
    fls * ((32 << 20) / page_size)
}

pub use crate::trace::wire::SystemFacts;

impl SystemFacts {
    pub fn read() -> Result<Self, HostError> {
        // SAFETY: uname fills a caller-owned struct; sysconf has no memory effects.
        let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
        if unsafe { libc::uname(&mut uts) } != 0 {
            return Err(HostError::Read {
                path: "uname(2)".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        let field = |f: &[libc::c_char]| {
            let bytes: Vec<u8> = f
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let page_size = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let (possible_cpus, possible_cpu_list) = cpulist("/sys/devices/system/cpu/possible")?;
        let (online_cpus, online_cpu_list) = cpulist("/sys/devices/system/cpu/online")?;
        Ok(SystemFacts {
            kernel_release: field(&uts.release),
            kernel_version: field(&uts.version),
            machine: field(&uts.machine),
            hostname: field(&uts.nodename),
            page_size,
            possible_cpus,
            possible_cpu_list,
            online_cpus,
            online_cpu_list,
            btf: std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
        })
    }
}

/// Reads a clock in nanoseconds. CLOCK_BOOTTIME is what `bpf_ktime_get_boot_ns` returns, so event
/// timestamps and user-space marks (snapshot start and end) are on one time line.
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the caller-owned timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn boottime_ns() -> u64 {
    clock_ns(libc::CLOCK_BOOTTIME)
}

pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// Whether the effective capability set holds what loading and attaching tracepoint programs
/// needs: CAP_BPF with CAP_PERFMON (5.8+), or CAP_SYS_ADMIN.
pub fn bpf_capable() -> Result<bool, HostError> {
    let status = read_to_string("/proc/self/status")?;
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let has = |c: u32| cap_eff & (1u64 << c) != 0;
    Ok(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists() {
        assert_eq!(parse_cpulist("0-1\n"), Ok(2));
        assert_eq!(parse_cpulist("0-3,5,7-8"), Ok(7));
        assert_eq!(parse_cpulist("0"), Ok(1));
        assert!(parse_cpulist("0-x").unwrap_err().contains("`x`"));
        assert!(parse_cpulist("3-1").is_err());
    }

    #[test]
    fn nodes_follow_possible_cpus() {
        assert_eq!(vmap_nodes(1, 4096), (1, 1));
        assert_eq!(vmap_nodes(2, 4096), (2, 65536));
        assert_eq!(vmap_nodes(300, 4096), (128, 65536));
    }

    #[test]
    fn lazy_max_matches_the_spec_table() {
        assert_eq!(lazy_max_pages(1, 4096), 8192);
        assert_eq!(lazy_max_pages(2, 4096), 16384);
        assert_eq!(lazy_max_pages(3, 4096), 16384);
        assert_eq!(lazy_max_pages(16, 4096), 5 * 8192);
        assert_eq!(lazy_max_pages(256, 4096), 9 * 8192);
    }
}
