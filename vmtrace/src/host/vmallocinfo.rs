//! `/proc/vmallocinfo`: the kernel's own list of vmap areas, busy and lazily freed.
//!
//! It is the ground truth a trace is checked against, and the start state a replay seeds the
//! model from. Addresses are `%pK`, so a useful read needs `kptr_restrict` lowered (see
//! [`super::kptr`]).

use crate::trace::{AreaKind, KAddr, VmallocArea, VmallocSnapshot};

use super::{kptr::KptrRestrictGuard, read_to_string, system::boottime_ns, HostError};

const PATH: &str = "/proc/vmallocinfo";

/// Parses the whole file; the error carries the 1-based line number and the bad token.
pub fn parse(text: &str) -> Result<Vec<VmallocArea>, (usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| parse_line(l).map_err(|m| (i + 1, m)))
        .collect()
}

/// `0xstart-0xend size [caller] [pages=n] [phys=p] [flags…]`, or `… size unpurged vm_area`, or
/// `… size vm_map_ram`.
pub fn parse_line(line: &str) -> Result<VmallocArea, String> {
    let mut tokens = line.split_whitespace();
    let range = tokens.next().ok_or("empty line")?;
    let (s, e) = range
        .split_once('-')
        .ok_or_else(|| format!("expected `0xSTART-0xEND`, found `{range}`"))?;
    let start = KAddr::parse(s).ok_or_else(|| format!("bad start address `{s}`"))?;
    let end = KAddr::parse(e).ok_or_else(|| format!("bad end address `{e}`"))?;
    let size_tok = tokens.next().ok_or("missing size")?;
    let size: u64 = size_tok
        .parse()
        .map_err(|_| format!("bad size `{size_tok}`"))?;
    let rest: Vec<&str> = tokens.collect();
    let mut area = VmallocArea {
        start,
        end,
        size,
        kind: AreaKind::Busy,
        caller: None,
        pages: None,
        phys: None,
        flags: Vec::new(),
    };
    match rest.as_slice() {
        ["unpurged", "vm_area"] => area.kind = AreaKind::Unpurged,
        ["vm_map_ram"] => area.kind = AreaKind::VmMapRam,
        _ => {
            for (i, tok) in rest.iter().enumerate() {
                if let Some(v) = tok.strip_prefix("pages=") {
                    area.pages = Some(v.parse().map_err(|_| format!("bad page count `{tok}`"))?);
                } else if let Some(v) = tok.strip_prefix("phys=") {
                    area.phys = Some(v.to_string());
                } else if i == 0 && tok.contains('+') {
                    area.caller = Some(tok.to_string());
                } else if tok.starts_with('[') && area.caller.is_some() && i == 1 {
                    // `func+0x1/0x2 [module]`
                    if let Some(c) = area.caller.as_mut() {
                        c.push(' ');
                        c.push_str(tok);
                    }
                } else {
                    area.flags.push(tok.to_string());
                }
            }
        }
    }
    Ok(area)
}

/// Reads `/proc/vmallocinfo` with real addresses, lowering `kptr_restrict` to 1 for the read
/// only. If it cannot be lowered (not root) the snapshot is still taken, marked as hashed.
pub fn snapshot() -> Result<VmallocSnapshot, HostError> {
    let guard = match KptrRestrictGuard::set(1) {
        Ok(g) => Some(g),
        Err(e) => {
            log::warn!("cannot lower kptr_restrict, vmallocinfo addresses will be hashed: {e}");
            None
        }
    };
    let ts_start_ns = boottime_ns();
    let text = read_to_string(PATH);
    let ts_end_ns = boottime_ns();
    drop(guard);
    let text = text?;
    let areas = parse(&text).map_err(|(line, message)| HostError::Parse {
        path: PATH.into(),
        line,
        message,
    })?;
    let real_addresses = looks_real(&areas);
    Ok(VmallocSnapshot {
        ts_start_ns,
        ts_end_ns,
        real_addresses,
        pools_drained: false,
        areas,
    })
}

/// Hashed `%pK` values are 32-bit-looking and do not line up with sizes; real ones are kernel
/// addresses (in the kernel half of 4- or 5-level paging) whose `end - start` equals the size
/// column.
fn looks_real(areas: &[VmallocArea]) -> bool {
    !areas.is_empty()
        && areas
            .iter()
            .all(|a| a.start.is_kernel() && a.end.0.wrapping_sub(a.start.0) == a.size)
}

const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

/// Empties the vmap nodes' pools before a snapshot, which cannot show them: pooled areas are
/// in no busy list and not in the free tree, so a snapshot taken with full pools lists as free
/// space the kernel cannot hand out. Writing 2 to `vm.drop_caches` runs every slab shrinker
/// (`drop_slab`), the `vmap-node` one among them, which decays every pool fully into the free
/// tree. It also drops reclaimable slab (dentries, inodes): an action, not a setting, so there
/// is nothing to restore.
pub fn drain_pools() -> Result<(), HostError> {
    std::fs::write(DROP_CACHES, "2\n").map_err(|source| HostError::Write {
        path: DROP_CACHES.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
0xffffc90000000000-0xffffc90000005000   20480 irq_init_percpu_irqstack+0xca/0x100 vmap
0xffffc90000006000-0xffffc90000008000    8192 acpi_os_map_iomem+0x1bc/0x1e0 phys=0x00000000000a0000 ioremap
0xffffc90000010000-0xffffc90000015000   20480 kernel_clone+0x94/0x3e0 pages=4 vmalloc N0=4
0xffffc90000347000-0xffffc9000034c000   20480 xt_alloc_table_info+0xfe/0x130 [x_tables] pages=4 vmalloc N0=4
0xffffc900000c4000-0xffffc900000c9000   20480 unpurged vm_area  
0xffffc90000400000-0xffffc90000410000   65536 vm_map_ram
";

    #[test]
    fn parses_every_line_kind() {
        let areas = parse(SAMPLE).unwrap();
        assert_eq!(areas.len(), 6);
        assert_eq!(
            areas[0].caller.as_deref(),
            Some("irq_init_percpu_irqstack+0xca/0x100")
        );
        assert_eq!(areas[0].flags, ["vmap"]);
        assert_eq!(areas[1].phys.as_deref(), Some("0x00000000000a0000"));
        assert_eq!(areas[2].pages, Some(4));
        assert_eq!(areas[2].flags, ["vmalloc", "N0=4"]);
        assert_eq!(
            areas[3].caller.as_deref(),
            Some("xt_alloc_table_info+0xfe/0x130 [x_tables]")
        );
        assert_eq!(areas[4].kind, AreaKind::Unpurged);
        assert_eq!(areas[4].start, KAddr(0xffffc900000c4000));
        assert_eq!(areas[5].kind, AreaKind::VmMapRam);
        assert!(looks_real(&areas));
    }

    #[test]
    fn five_level_addresses_are_real() {
        // The layout a 6.12 guest with LA57 and KASLR printed.
        let text = "0xff78b1b780000000-0xff78b1b780005000   20480 irq_init_percpu_irqstack+0xca/0x100 vmap\n";
        assert!(looks_real(&parse(text).unwrap()));
    }

    #[test]
    fn hashed_addresses_are_detected() {
        let text = "0x00000000f841eac3-0x00000000167f8695   20480 irq_init_percpu_irqstack+0xca/0x100 vmap\n";
        assert!(!looks_real(&parse(text).unwrap()));
    }

    #[test]
    fn bad_lines_name_line_and_token() {
        let text = format!("{SAMPLE}0xffffc9-0xzz 4096 vmalloc\n");
        let (line, msg) = parse(&text).unwrap_err();
        assert_eq!(line, 7);
        assert!(msg.contains("`0xzz`"), "{msg}");
        let (_, msg) = parse("0xffffc90000000000-0xffffc90000005000 big x\n").unwrap_err();
        assert!(msg.contains("`big`"), "{msg}");
    }
}
