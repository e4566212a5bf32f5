//! RLIMIT_NOFILE: each live BPF map holds one file descriptor, so patterns that keep thousands of
//! areas alive (long-busy-list, full-fit) need the soft limit raised, and must say so clearly when
//! even the hard limit is too low.

use std::io;

/// File descriptors kept free for everything else (stdio, worker threads, libraries).
pub const FD_RESERVE: u64 = 64;

/// The descriptor budget after [`ensure_fds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdBudget {
    /// Soft limit now in force.
    pub soft: u64,
    /// Hard limit now in force.
    pub hard: u64,
    /// Descriptors open when the budget was taken.
    pub open: u64,
}

impl FdBudget {
    /// New descriptors that can still be opened, keeping [`FD_RESERVE`] free.
    pub fn available(&self) -> u64 {
        self.soft
            .saturating_sub(self.open)
            .saturating_sub(FD_RESERVE)
    }
}

fn getrlimit() -> io::Result<libc::rlimit> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a valid rlimit to write into.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rl)
}

fn setrlimit(soft: u64, hard: u64) -> io::Result<()> {
    let rl = libc::rlimit {
        rlim_cur: soft as libc::rlim_t,
        rlim_max: hard as libc::rlim_t,
    };
    // SAFETY: rl is a valid rlimit to read from.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(FD_RESERVE)
}

/// Makes room for `extra` more open descriptors if the limits allow it: raises the soft limit
/// (towards the hard limit), and tries to raise the hard limit too (up to `fs.nr_open`, which needs
/// CAP_SYS_RESOURCE; failure is not an error). Returns the budget in force afterwards; the caller
/// compares [`FdBudget::available`] with what it needs.
pub fn ensure_fds(extra: u64) -> io::Result<FdBudget> {
    let open = open_fds();
    let want = open.saturating_add(extra).saturating_add(FD_RESERVE);
    let rl = getrlimit()?;
    let (soft, hard) = (rl.rlim_cur as u64, rl.rlim_max as u64);
    if soft < want {
        if hard < want {
            let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(hard);
            let target = want.min(nr_open).max(hard);
            if target > hard && setrlimit(target, target).is_ok() {
                log::info!("raised RLIMIT_NOFILE to {target}");
            } else {
                setrlimit(hard, hard)?;
                log::info!("raised the RLIMIT_NOFILE soft limit to the hard limit {hard}");
            }
        } else {
            setrlimit(want, hard)?;
            log::info!("raised the RLIMIT_NOFILE soft limit to {want}");
        }
    }
    let rl = getrlimit()?;
    Ok(FdBudget {
        soft: rl.rlim_cur as u64,
        hard: rl.rlim_max as u64,
        open,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_arithmetic_saturates() {
        let b = FdBudget {
            soft: 1024,
            hard: 4096,
            open: 10,
        };
        assert_eq!(b.available(), 1024 - 10 - FD_RESERVE);
        let tiny = FdBudget {
            soft: 16,
            hard: 16,
            open: 10,
        };
        assert_eq!(tiny.available(), 0);
    }

    #[test]
    fn asking_for_nothing_changes_nothing_and_reports_the_limits() {
        let before = getrlimit().expect("getrlimit");
        let b = ensure_fds(0).expect("ensure_fds");
        assert!(b.soft >= before.rlim_cur as u64);
        assert!(b.hard >= b.soft);
        assert!(b.open >= 3, "stdio should be open, saw {}", b.open);
    }
}
