//! Dropping Linux capabilities once the probes are attached.
//!
//! Loading and attaching BPF programs needs CAP_BPF, CAP_PERFMON (or CAP_SYS_ADMIN) and
//! CAP_SYSLOG for kernel addresses; once attached, the daemon only reads the ring buffer (an
//! mmap), looks up its own maps through fds it already holds (no capability check on this
//! kernel's `bpf()` for map lookups), reads world-readable /proc files and serves HTTP on a
//! socket bound before the drop. So it drops every capability: effective, permitted and
//! inheritable sets, the ambient set and the bounding set, and sets no_new_privs so nothing it
//! could exec regains them. Capabilities are per thread in Linux: each thread that exists at the
//! drop calls [`drop_all`], and threads started later inherit the empty sets.

/// Why a drop failed.
#[derive(Debug, thiserror::Error)]
pub enum CapsError {
    #[error("{call} failed: {source}")]
    Syscall {
        call: &'static str,
        source: std::io::Error,
    },
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets in two 32-bit words.
const VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The highest capability number this kernel knows (`/proc/sys/kernel/cap_last_cap`), 63 when
/// the file cannot be read (dropping unknown numbers fails harmlessly with EINVAL).
fn last_cap() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

fn check(call: &'static str, rc: libc::c_long) -> Result<(), CapsError> {
    if rc < 0 {
        Err(CapsError::Syscall {
            call,
            source: std::io::Error::last_os_error(),
        })
    } else {
        Ok(())
    }
}

/// Drops every capability of the calling thread (see the module docs) and sets no_new_privs.
pub fn drop_all() -> Result<(), CapsError> {
    // The bounding set first: dropping from it needs CAP_SETPCAP, which goes last.
    for cap in 0..=last_cap() {
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if rc < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            check("prctl(PR_CAPBSET_DROP)", rc.into())?;
        }
    }
    // SAFETY: as above.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    check("prctl(PR_CAP_AMBIENT_CLEAR_ALL)", rc.into())?;
    // SAFETY: as above.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    check("prctl(PR_SET_NO_NEW_PRIVS)", rc.into())?;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let data = [Data::default(); 2];
    // SAFETY: capset reads a valid header and two data structs (version 3) that outlive the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) };
    check("capset", rc)
}

/// The calling thread's effective set as `/proc/thread-self/status` shows it (`CapEff`), for the
/// log line; `None` when unreadable.
pub fn effective() -> Option<String> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| v.trim().to_string())
}
