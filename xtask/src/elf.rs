//! Reads the dynamic-linking facts of an ELF64 little-endian executable: which shared libraries
//! it needs (DT_NEEDED) and where it looks for them (DT_RUNPATH / DT_RPATH).
//!
//! Setup uses this to tell whether an installed bpf-linker was linked against the current
//! nightly's libLLVM and loads it from vmtrace's durable prefix. `bpf-linker --version` alone
//! cannot tell: a linker built against an older nightly keeps working as long as its old libLLVM
//! is still on disk, yet it emits code from another LLVM than rustc's.

use anyhow::{bail, Context as _, Result};

/// The dynamic section of an executable, reduced to what setup checks.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DynamicInfo {
    /// DT_NEEDED entries: sonames of the shared libraries the executable needs.
    pub needed: Vec<String>,
    /// DT_RUNPATH and DT_RPATH entries, split at `:`.
    pub search_path: Vec<String>,
}

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;

/// Parses the dynamic section of an ELF64 little-endian image held in memory.
pub fn dynamic_info(image: &[u8]) -> Result<DynamicInfo> {
    if image.get(..4) != Some(b"\x7fELF".as_slice()) {
        bail!("not an ELF file");
    }
    if image.get(4) != Some(&2) || image.get(5) != Some(&1) {
        bail!("not a 64-bit little-endian ELF file");
    }
    let phoff = to_usize(u64_at(image, 0x20)?)?;
    let phentsize = usize::from(u16_at(image, 0x36)?);
    let phnum = usize::from(u16_at(image, 0x38)?);
    if phentsize < 56 {
        bail!("program header entries of {phentsize} bytes are too small");
    }

    struct Segment {
        kind: u32,
        offset: u64,
        vaddr: u64,
        filesz: u64,
    }
    let mut segments = Vec::with_capacity(phnum);
    for i in 0..phnum {
        let base = phoff
            .checked_add(
                i.checked_mul(phentsize)
                    .context("program header overflow")?,
            )
            .context("program header overflow")?;
        segments.push(Segment {
            kind: u32_at(image, base)?,
            offset: u64_at(image, base + 8)?,
            vaddr: u64_at(image, base + 16)?,
            filesz: u64_at(image, base + 32)?,
        });
    }
    let Some(dynamic) = segments.iter().find(|s| s.kind == PT_DYNAMIC) else {
        // A static executable needs no shared library at all.
        return Ok(DynamicInfo::default());
    };

    let mut strtab_vaddr = None;
    let mut needed = Vec::new();
    let mut paths = Vec::new();
    let start = to_usize(dynamic.offset)?;
    let len = to_usize(dynamic.filesz)?;
    for entry in (0..len / 16).map(|i| start + i * 16) {
        let tag = u64_at(image, entry)?;
        let value = u64_at(image, entry + 8)?;
        match tag {
            DT_NULL => break,
            DT_NEEDED => needed.push(value),
            DT_RPATH | DT_RUNPATH => paths.push(value),
            DT_STRTAB => strtab_vaddr = Some(value),
            _ => {}
        }
    }
    let strtab_vaddr = strtab_vaddr.context("the dynamic section has no string table")?;
    let strtab = segments
        .iter()
        .find(|s| {
            s.kind == PT_LOAD
                && s.vaddr <= strtab_vaddr
                && strtab_vaddr < s.vaddr.saturating_add(s.filesz)
        })
        .map(|s| s.offset + (strtab_vaddr - s.vaddr))
        .context("the dynamic string table lies in no loaded segment")?;
    let string = |offset: u64| -> Result<String> {
        let at = to_usize(
            strtab
                .checked_add(offset)
                .context("string offset overflow")?,
        )?;
        let tail = image
            .get(at..)
            .context("string offset past the end of the file")?;
        let end = tail
            .iter()
            .position(|&b| b == 0)
            .context("unterminated string")?;
        Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
    };

    let mut info = DynamicInfo::default();
    for offset in needed {
        info.needed.push(string(offset)?);
    }
    for offset in paths {
        let joined = string(offset)?;
        info.search_path.extend(
            joined
                .split(':')
                .filter(|p| !p.is_empty())
                .map(String::from),
        );
    }
    Ok(info)
}

fn bytes_at<const N: usize>(image: &[u8], at: usize) -> Result<[u8; N]> {
    image
        .get(at..at.checked_add(N).context("offset overflow")?)
        .and_then(|s| s.try_into().ok())
        .with_context(|| format!("truncated ELF file (wanted {N} bytes at offset {at:#x})"))
}

fn u16_at(image: &[u8], at: usize) -> Result<u16> {
    bytes_at(image, at).map(u16::from_le_bytes)
}

fn u32_at(image: &[u8], at: usize) -> Result<u32> {
    bytes_at(image, at).map(u32::from_le_bytes)
}

fn u64_at(image: &[u8], at: usize) -> Result<u64> {
    bytes_at(image, at).map(u64::from_le_bytes)
}

fn to_usize(v: u64) -> Result<usize> {
    usize::try_from(v).with_context(|| format!("offset {v:#x} does not fit in memory"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test binary itself is a dynamically linked ELF64 LE executable that needs libc.
    #[test]
    fn reads_own_executable() {
        let exe = std::env::current_exe().expect("current exe");
        let image = std::fs::read(exe).expect("read current exe");
        let info = dynamic_info(&image).expect("parse current exe");
        assert!(
            info.needed.iter().any(|n| n.starts_with("libc.so")),
            "{info:?}"
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(dynamic_info(b"").is_err());
        assert!(dynamic_info(b"#!/bin/sh\necho hi\n").is_err());
        let mut truncated = b"\x7fELF\x02\x01\x01".to_vec();
        truncated.resize(0x30, 0);
        assert!(dynamic_info(&truncated).is_err());
    }
}
