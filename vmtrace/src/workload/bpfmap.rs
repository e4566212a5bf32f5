//! BPF array maps as a user-space handle on `vmalloc`, through the raw `bpf(2)` system call.
//!
//! `bpf(BPF_MAP_CREATE)` of a `BPF_MAP_TYPE_ARRAY` map with `BPF_F_MMAPABLE` always takes its
//! memory from `vmalloc` (`array_map_alloc` → `bpf_map_area_mmapable_alloc`, no kmalloc path for
//! small sizes): one page for the `struct bpf_array` header, page-aligned so the values start on a
//! page boundary, then the values. With `value_size` = one page, a map of N entries is therefore one
//! vmalloc of N + 1 pages, and its vmap area is **N + 2 pages** with the guard page.
//!
//! Verified on Linux 6.18 (x86_64, 4 KiB pages) by comparing `/proc/vmallocinfo` before and after
//! creating 20 maps (caller `array_map_alloc`):
//!
//! | data pages N | vmap areas (bytes)        |
//! |--------------|---------------------------|
//! | 1            | 12288                     |
//! | 2            | 16384                     |
//! | 16           | 73728                     |
//! | 100          | 417792                    |
//! | 256          | 1056768                   |
//! | 511          | 2101248                   |
//! | 512          | 2105344 + 12288           |
//! | 1024         | 4202496 + 16384           |
//!
//! From N = 512 on (N + 1 > 512 pages), `__vmalloc_area_node` vmallocs its `struct page *` array as
//! well, a second area of `PAGE_ALIGN(8 × (N + 1)) + PAGE_SIZE` bytes (once the array is larger
//! than `PAGE_SIZE` it comes from a nested `__vmalloc_node`, with its own guard page).
//!
//! Without CAP_PERFMON (and CAP_SYS_ADMIN), and unless the kernel runs with `mitigations=off`, the
//! kernel rounds `max_entries` up to a power of two against Spectre v1 (`bpf_bypass_spec_v1`):
//! measured with CAP_BPF alone, 3 pages gave 24576-byte areas and 5 pages 40960. [`MapSizing`]
//! carries that choice.
//!
//! Closing the map's file descriptor frees the area, but not at once: the map is freed from a
//! workqueue (`bpf_map_free_in_work`), and the vmap area then goes to the lazy-free list like any
//! `vfree`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::error::WorkloadError;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_F_MMAPABLE: u32 = 1 << 10;
/// The name the maps carry (visible in `bpftool map`): at most 15 bytes of `[A-Za-z0-9_.]`.
const MAP_NAME: &[u8] = b"vmtrace_stress";

/// Largest map this tool creates, in data pages (1 GiB of 4 KiB pages).
pub const MAX_MAP_PAGES: u64 = 1 << 18;

/// The `BPF_MAP_CREATE` member of `union bpf_attr` (`include/uapi/linux/bpf.h`), up to
/// `map_extra`. The kernel accepts a shorter attr than its own and requires the bytes it knows
/// beyond ours to be zero, which they are since it zero-fills the rest.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    map_ifindex: u32,
    btf_fd: u32,
    btf_key_type_id: u32,
    btf_value_type_id: u32,
    btf_vmlinux_value_type_id: u32,
    map_extra: u64,
}

// The layout must match the kernel's: 13 u32 fields and the 16-byte name reach offset 64, where
// the 8-byte map_extra sits without padding.
const _: () = assert!(std::mem::size_of::<MapCreateAttr>() == 72);
const _: () = assert!(std::mem::offset_of!(MapCreateAttr, map_extra) == 64);

/// How the kernel sizes an array map's allocation for this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MapSizing {
    /// `max_entries` is used as given (CAP_PERFMON or CAP_SYS_ADMIN, or `mitigations=off`).
    Exact,
    /// `max_entries` is rounded up to a power of two (Spectre v1 hardening for processes without
    /// CAP_PERFMON).
    PowerOfTwo,
}

impl MapSizing {
    /// Works out the sizing for this process from its effective capabilities and the kernel
    /// command line (`bpf_bypass_spec_v1()` = `cpu_mitigations_off() || perfmon_capable()`).
    pub fn detect() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
        Self::from_proc(&status, &cmdline)
    }

    /// [`MapSizing::detect`] on given contents of `/proc/self/status` and `/proc/cmdline`.
    pub fn from_proc(status: &str, cmdline: &str) -> Self {
        const CAP_SYS_ADMIN: u32 = 21;
        const CAP_PERFMON: u32 = 38;
        if cmdline.split_whitespace().any(|w| w == "mitigations=off") {
            return Self::Exact;
        }
        let cap_eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0);
        let has = |cap: u32| cap_eff & (1u64 << cap) != 0;
        if has(CAP_PERFMON) || has(CAP_SYS_ADMIN) {
            Self::Exact
        } else {
            Self::PowerOfTwo
        }
    }

    /// The number of entries the kernel allocates for `pages` requested.
    pub fn entries(self, pages: u64) -> u64 {
        match self {
            Self::Exact => pages,
            Self::PowerOfTwo => pages.checked_next_power_of_two().unwrap_or(pages),
        }
    }
}

/// The vmap areas one mmapable array map of `pages` data pages (value size one page) occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapAreas {
    /// The map's own area: header page + data pages + guard page, in bytes.
    pub main: u64,
    /// The area holding the `struct page *` array, when it is larger than a page (more than 512
    /// pages with 4 KiB pages); allocated after `main` and freed after it.
    pub pages_array: Option<u64>,
}

impl MapAreas {
    /// The areas, `main` first.
    pub fn iter(self) -> impl Iterator<Item = u64> {
        std::iter::once(self.main).chain(self.pages_array)
    }
}

/// The vmap areas of one array map with `pages` data pages, value size `page_size`.
pub fn map_areas(pages: u64, page_size: u64, sizing: MapSizing) -> MapAreas {
    let nr_pages = sizing.entries(pages) + 1; // + the bpf_array header page
    let main = (nr_pages + 1) * page_size; // + the guard page
    let ptr_array = nr_pages * std::mem::size_of::<usize>() as u64;
    let pages_array =
        (ptr_array > page_size).then(|| ptr_array.div_ceil(page_size) * page_size + page_size);
    MapAreas { main, pages_array }
}

/// The system page size (`sysconf(_SC_PAGESIZE)`).
pub fn page_size() -> Result<u64, WorkloadError> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(v)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| WorkloadError::System {
            what: "the page size (sysconf(_SC_PAGESIZE))",
            source: io::Error::last_os_error(),
        })
}

/// A live BPF array map; dropping it closes the fd, which frees its vmap area (lazily).
#[derive(Debug)]
pub struct ArrayMap {
    fd: OwnedFd,
    pages: u64,
}

impl ArrayMap {
    /// Creates an mmapable array map of `pages` entries of `page_size` bytes each.
    pub fn create(pages: u64, page_size: u64) -> Result<Self, WorkloadError> {
        let invalid = |msg: String| WorkloadError::MapCreate {
            pages,
            source: io::Error::new(io::ErrorKind::InvalidInput, msg),
        };
        let max_entries = u32::try_from(pages)
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| invalid(format!("{pages} entries is outside 1..=u32::MAX")))?;
        let value_size = u32::try_from(page_size)
            .map_err(|_| invalid(format!("page size {page_size} does not fit the value size")))?;
        let attr = MapCreateAttr {
            map_type: BPF_MAP_TYPE_ARRAY,
            key_size: 4,
            value_size,
            max_entries,
            map_flags: BPF_F_MMAPABLE,
            ..MapCreateAttr::default()
        };
        let fd = map_create(attr, pages)?;
        Ok(Self { fd, pages })
    }

    /// Data pages (entries) asked for.
    pub fn pages(&self) -> u64 {
        self.pages
    }
}

/// `bpf(BPF_MAP_CREATE)` with our map name; the fd of the new map.
fn map_create(mut attr: MapCreateAttr, pages: u64) -> Result<OwnedFd, WorkloadError> {
    attr.map_name[..MAP_NAME.len()].copy_from_slice(MAP_NAME);
    // SAFETY: attr is a valid, initialised BPF_MAP_CREATE attr of the size passed; the kernel
    // only reads it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            &attr as *const MapCreateAttr,
            std::mem::size_of::<MapCreateAttr>(),
        )
    };
    if ret < 0 {
        let err = io::Error::last_os_error();
        return Err(if err.raw_os_error() == Some(libc::EPERM) {
            WorkloadError::NotPermitted {
                unprivileged_bpf_disabled: std::fs::read_to_string(
                    "/proc/sys/kernel/unprivileged_bpf_disabled",
                )
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            }
        } else {
            WorkloadError::MapCreate { pages, source: err }
        });
    }
    let raw = RawFd::try_from(ret).map_err(|_| WorkloadError::MapCreate {
        pages,
        source: io::Error::new(io::ErrorKind::InvalidData, format!("bpf() returned {ret}")),
    })?;
    // SAFETY: a non-negative return of BPF_MAP_CREATE is a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A BPF arena map held only for the vmalloc address space it reserves.
///
/// `arena_map_alloc` takes a 4 GiB (+ guard) sparse vmap area with `get_vm_area` at creation
/// but maps no page and allocates no page table until a program or an mmap faults pages in
/// (checked on 6.18: `PageTables` unchanged after three arenas). That makes it the one user-space
/// handle that moves where later vmalloc allocations land, by lowest fit, without touching page
/// tables itself: the page-table test parks arenas above the live areas so that its measured
/// maps land in address space no earlier run can have mapped.
#[derive(Debug)]
pub struct VaReservation {
    fd: OwnedFd,
}

impl VaReservation {
    /// Reserves one arena's worth of vmalloc address space: 4 GiB plus the guard of the
    /// sparse area (`KERN_VM_SZ`; 4295036928 bytes in `/proc/vmallocinfo` on 6.18, vmap guard
    /// page included). Fails with `MapCreate` where the kernel has no arena maps (before 6.9,
    /// or a JIT without arena support).
    pub fn create(page_size: u64) -> Result<Self, WorkloadError> {
        const BPF_MAP_TYPE_ARENA: u32 = 33;
        // The arena's user-visible size; the kernel reserves its full 4 GiB window whatever
        // this is, so the largest allowed value says nothing new.
        let pages = (1u64 << 32) / page_size.max(1);
        let attr = MapCreateAttr {
            map_type: BPF_MAP_TYPE_ARENA,
            max_entries: u32::try_from(pages).unwrap_or(u32::MAX),
            map_flags: BPF_F_MMAPABLE,
            ..MapCreateAttr::default()
        };
        Ok(Self {
            fd: map_create(attr, pages)?,
        })
    }

    /// Pins the arena at `path` on a mounted bpffs (`bpf(BPF_OBJ_PIN)`), so its reservation
    /// outlives this process until the pin is removed or the machine reboots. Kernel page
    /// tables live as long, which is why a reservation that must keep later allocations out of
    /// once-mapped space has to as well.
    pub fn pin(&self, path: &std::path::Path) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt as _;
        const BPF_OBJ_PIN: libc::c_long = 6;
        #[repr(C)]
        struct PinAttr {
            pathname: u64,
            bpf_fd: u32,
            file_flags: u32,
        }
        let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let attr = PinAttr {
            pathname: c_path.as_ptr() as u64,
            bpf_fd: self.fd.as_raw_fd() as u32,
            file_flags: 0,
        };
        // SAFETY: attr is a valid BPF_OBJ_PIN attr whose path outlives the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_OBJ_PIN,
                &attr as *const PinAttr,
                std::mem::size_of::<PinAttr>(),
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl AsRawFd for ArrayMap {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: u64 = 4096;

    #[test]
    fn measured_sizes_on_6_18() {
        // Numbers read off /proc/vmallocinfo on Linux 6.18, x86_64, as root.
        for (n, main, extra) in [
            (1, 12288, None),
            (2, 16384, None),
            (16, 73728, None),
            (100, 417792, None),
            (256, 1056768, None),
            (510, 2097152, None),
            (511, 2101248, None),
            (512, 2105344, Some(12288)),
            (513, 2109440, Some(12288)),
            (1024, 4202496, Some(16384)),
        ] {
            let a = map_areas(n, PS, MapSizing::Exact);
            assert_eq!((a.main, a.pages_array), (main, extra), "{n} pages");
        }
    }

    #[test]
    fn power_of_two_rounding_without_perfmon() {
        // Measured with CAP_BPF but neither CAP_PERFMON nor CAP_SYS_ADMIN.
        assert_eq!(map_areas(3, PS, MapSizing::PowerOfTwo).main, 24576);
        assert_eq!(map_areas(5, PS, MapSizing::PowerOfTwo).main, 40960);
        assert_eq!(map_areas(16, PS, MapSizing::PowerOfTwo).main, 73728);
        assert_eq!(MapSizing::PowerOfTwo.entries(1), 1);
    }

    #[test]
    fn sizing_from_capabilities() {
        let root = "Name:\tx\nCapEff:\t000001fffeffffff\n";
        let bpf_only = "CapEff:\t0000008000000000\n"; // CAP_BPF (39) only
        let perfmon = "CapEff:\t0000004000000000\n"; // CAP_PERFMON (38)
        assert_eq!(MapSizing::from_proc(root, ""), MapSizing::Exact);
        assert_eq!(MapSizing::from_proc(perfmon, ""), MapSizing::Exact);
        assert_eq!(
            MapSizing::from_proc(bpf_only, "quiet"),
            MapSizing::PowerOfTwo
        );
        assert_eq!(
            MapSizing::from_proc(bpf_only, "ro mitigations=off"),
            MapSizing::Exact
        );
        assert_eq!(MapSizing::from_proc("garbage", ""), MapSizing::PowerOfTwo);
    }

    #[test]
    fn zero_pages_is_rejected_before_the_syscall() {
        let err = ArrayMap::create(0, PS).unwrap_err();
        assert!(
            matches!(err, WorkloadError::MapCreate { pages: 0, .. }),
            "{err:?}"
        );
    }
}
