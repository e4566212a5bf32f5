//! Kernel function addresses from `/proc/kallsyms`, for the in-kernel stack filters and for
//! turning stack frames into `symbol+0xoff`.
//!
//! Root sees real addresses (with `kernel.kptr_restrict` ≤ 1); others see zeros, which is
//! detected and refused rather than producing filters that never match. A function's end is the
//! next symbol's start: kallsyms gives no sizes, and text symbols tile the text section.
//! `CONFIG_KALLSYMS_ALL` is off on the reference kernel, so only functions are listed, no data
//! (no lock addresses): locks are classified by the functions on the stack instead. Where it
//! is on, the static vmap locks ([`DATA_SYMBOLS`]) are kept too.

use std::path::Path;

use super::HostError;

/// One text symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub addr: u64,
    pub name: String,
    /// `[module]` for module code.
    pub module: Option<String>,
}

/// Data symbols kept (with `CONFIG_KALLSYMS_ALL`): the static vmap locks, whose addresses let
/// the lock probes know them before any wait.
pub const DATA_SYMBOLS: [&str; 2] = ["free_vmap_area_lock", "vmap_purge_lock"];

/// The kernel's text symbols, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct Kallsyms {
    syms: Vec<Symbol>,
    /// `(name, address)` of the [`DATA_SYMBOLS`] the kernel lists.
    data: Vec<(String, u64)>,
}

impl Kallsyms {
    /// Reads `/proc/kallsyms`; if the addresses are hidden (`kernel.kptr_restrict` = 2), lowers
    /// it to 1 for the read only and restores it, as the vmallocinfo snapshot does.
    pub fn read() -> Result<Self, HostError> {
        let path = Path::new("/proc/kallsyms");
        match Self::read_from(path) {
            Ok(k) => Ok(k),
            Err(first) => match super::kptr::KptrRestrictGuard::set(1) {
                Ok(guard) => {
                    let k = Self::read_from(path);
                    drop(guard);
                    k
                }
                Err(_) => Err(first),
            },
        }
    }

    pub fn read_from(path: &Path) -> Result<Self, HostError> {
        let text = std::fs::read_to_string(path).map_err(|source| HostError::Read {
            path: path.into(),
            source,
        })?;
        let k = Self::parse(&text);
        if k.syms.is_empty() {
            return Err(HostError::Parse {
                path: path.into(),
                line: 0,
                message: "no function symbol with a non-zero address: kallsyms addresses are \
                          hidden (run as root with kernel.kptr_restrict <= 1)"
                    .into(),
            });
        }
        Ok(k)
    }

    /// Parses kallsyms text; malformed lines and zero (hidden) addresses are skipped.
    pub fn parse(text: &str) -> Self {
        let mut data = Vec::new();
        let mut syms: Vec<Symbol> = text
            .lines()
            .filter_map(|line| {
                let mut it = line.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let ty = it.next()?;
                let name = it.next()?;
                if addr != 0 && matches!(ty, "d" | "D" | "b" | "B") && DATA_SYMBOLS.contains(&name)
                {
                    data.push((name.to_string(), addr));
                }
                let module = it
                    .next()
                    .map(|m| m.trim_matches(|c| c == '[' || c == ']').to_string());
                (addr != 0 && matches!(ty, "t" | "T" | "w" | "W")).then(|| Symbol {
                    addr,
                    name: name.to_string(),
                    module,
                })
            })
            .collect();
        syms.sort_by_key(|s| s.addr);
        Self { syms, data }
    }

    /// Address of one of the [`DATA_SYMBOLS`], when the kernel lists data symbols.
    pub fn data_addr(&self, name: &str) -> Option<u64> {
        self.data.iter().find(|(n, _)| n == name).map(|&(_, a)| a)
    }

    pub fn len(&self) -> usize {
        self.syms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }

    /// `[start, end)` of every symbol named `name` or a compiler-made part of it
    /// (`name.part.0`, `name.isra.0`, `name.constprop.0`, `name.cold`), in address order.
    pub fn ranges(&self, name: &str) -> Vec<(u64, u64, String)> {
        let mut out = Vec::new();
        for (i, s) in self.syms.iter().enumerate() {
            if s.module.is_some() || base_name(&s.name) != name {
                continue;
            }
            let end = self.syms[i + 1..]
                .iter()
                .find(|n| n.addr > s.addr)
                .map(|n| n.addr)
                .unwrap_or(s.addr + 1);
            out.push((s.addr, end, s.name.clone()));
        }
        out
    }

    /// Address of the function `name` exactly, if present.
    pub fn addr_of(&self, name: &str) -> Option<u64> {
        self.syms
            .iter()
            .find(|s| s.name == name && s.module.is_none())
            .map(|s| s.addr)
    }

    /// The symbol holding `addr`, and the offset into it.
    pub fn resolve(&self, addr: u64) -> Option<(&Symbol, u64)> {
        let i = self.syms.partition_point(|s| s.addr <= addr);
        let s = self.syms.get(i.checked_sub(1)?)?;
        Some((s, addr - s.addr))
    }

    /// `symbol+0xoff` (with ` [module]`), as `%pS` prints it without the length; the raw
    /// address when nothing holds it.
    pub fn format(&self, addr: u64) -> String {
        match self.resolve(addr) {
            Some((s, off)) => match &s.module {
                Some(m) => format!("{}+{:#x} [{}]", s.name, off, m),
                None => format!("{}+{:#x}", s.name, off),
            },
            None => format!("{addr:#x}"),
        }
    }
}

/// `name` without the suffixes the compiler adds to split or specialised copies.
pub fn base_name(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
ffffffff81609800 t alloc_vmap_area
ffffffff8160a690 T pcpu_get_vm_areas
ffffffff81214102 t alloc_vmap_area.cold
0000000000000000 t hidden
ffffffff8160d160 t vfree.part.0
ffffffff8160d4c0 T vfree
ffffffffc0000000 t foo\t[xfs]
ffffffff83b8da50 d some_data
";

    #[test]
    fn ranges_end_at_the_next_symbol_and_include_split_parts() {
        let k = Kallsyms::parse(TEXT);
        let r = k.ranges("alloc_vmap_area");
        assert_eq!(
            r.iter().map(|(a, b, _)| (*a, *b)).collect::<Vec<_>>(),
            [
                (0xffffffff81214102, 0xffffffff81609800),
                (0xffffffff81609800, 0xffffffff8160a690)
            ]
        );
        assert_eq!(k.ranges("vfree").len(), 2);
        assert!(k.ranges("hidden").is_empty());
        assert!(k.ranges("some_data").is_empty());
    }

    #[test]
    fn resolves_and_formats_frames() {
        let k = Kallsyms::parse(TEXT);
        assert_eq!(k.format(0xffffffff81609800 + 759), "alloc_vmap_area+0x2f7");
        assert_eq!(k.format(0xffffffffc0000010), "foo+0x10 [xfs]");
        assert_eq!(k.format(0x10), "0x10");
        assert_eq!(k.addr_of("vfree"), Some(0xffffffff8160d4c0));
    }

    #[test]
    fn keeps_the_static_vmap_locks_but_no_other_data() {
        let text = "ffffffff83a1c4c0 d free_vmap_area_lock\n\
                    ffffffff83a1c500 b vmap_purge_lock\n\
                    ffffffff83a1c600 d some_other_lock\n\
                    ffffffff81609800 t alloc_vmap_area\n";
        let k = Kallsyms::parse(text);
        assert_eq!(k.data_addr("free_vmap_area_lock"), Some(0xffffffff83a1c4c0));
        assert_eq!(k.data_addr("vmap_purge_lock"), Some(0xffffffff83a1c500));
        assert_eq!(k.data_addr("some_other_lock"), None);
        // Data stays out of the text symbols that frames resolve against.
        assert_eq!(k.len(), 1);
        assert_eq!(Kallsyms::parse(TEXT).data_addr("free_vmap_area_lock"), None);
    }
}
