//! Temporarily lowering `kernel.kptr_restrict` so `/proc/vmallocinfo` shows real addresses.
//!
//! With the default setting the kernel hashes `%pK` pointers, and a hashed snapshot cannot seed
//! the model. The guard restores the previous value when dropped, which covers early returns,
//! errors and panics (unwinding); signals are handled by the caller's async handlers, so they do
//! not kill the process while the setting is changed.

use std::path::PathBuf;

use super::{read_to_string, HostError};

const KPTR_RESTRICT: &str = "/proc/sys/kernel/kptr_restrict";

/// Holds `kptr_restrict` at a value and puts the old one back on drop.
#[derive(Debug)]
pub struct KptrRestrictGuard {
    old: Option<String>,
}

impl KptrRestrictGuard {
    /// Sets `kptr_restrict` to `value` if it differs. The guard restores the old value on drop.
    pub fn set(value: u8) -> Result<Self, HostError> {
        let old = read_to_string(KPTR_RESTRICT)?.trim().to_string();
        if old == value.to_string() {
            return Ok(Self { old: None });
        }
        write(&value.to_string())?;
        log::debug!("kptr_restrict {old} -> {value}");
        Ok(Self { old: Some(old) })
    }

    /// The value in force before the guard changed it (or the unchanged current value).
    pub fn previous(&self) -> Option<&str> {
        self.old.as_deref()
    }
}

impl Drop for KptrRestrictGuard {
    fn drop(&mut self) {
        if let Some(old) = self.old.take() {
            if let Err(e) = write(&old) {
                // Nothing better can be done from a destructor; say so loudly.
                eprintln!("vmtrace: warning: could not restore kernel.kptr_restrict={old}: {e}");
            } else {
                log::debug!("kptr_restrict restored to {old}");
            }
        }
    }
}

fn write(value: &str) -> Result<(), HostError> {
    std::fs::write(KPTR_RESTRICT, value).map_err(|source| HostError::Write {
        path: PathBuf::from(KPTR_RESTRICT),
        source,
    })
}

/// Current value, for tests and the trace header.
pub fn current() -> Result<String, HostError> {
    Ok(read_to_string(KPTR_RESTRICT)?.trim().to_string())
}
