//! `/proc/meminfo` `PageTables` and `VmallocUsed`, sampled into the trace: the kernel's own
//! totals, to check the page-table events against.

use std::path::Path;

use super::HostError;

/// The two `/proc/meminfo` values vmtrace samples, in kB as the file prints them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MeminfoSample {
    pub page_tables_kb: u64,
    pub vmalloc_used_kb: u64,
}

pub fn read() -> Result<MeminfoSample, HostError> {
    let path = Path::new("/proc/meminfo");
    let text = std::fs::read_to_string(path).map_err(|source| HostError::Read {
        path: path.into(),
        source,
    })?;
    parse(&text).ok_or_else(|| HostError::Parse {
        path: path.into(),
        line: 0,
        message: "no PageTables or VmallocUsed line".into(),
    })
}

pub fn parse(text: &str) -> Option<MeminfoSample> {
    let mut pt = None;
    let mut vm = None;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(key), Some(val)) = (it.next(), it.next()) else {
            continue;
        };
        match key {
            "PageTables:" => pt = val.parse().ok(),
            "VmallocUsed:" => vm = val.parse().ok(),
            _ => {}
        }
    }
    Some(MeminfoSample {
        page_tables_kb: pt?,
        vmalloc_used_kb: vm?,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_the_two_lines() {
        let s = super::parse("MemTotal: 1 kB\nPageTables:     5244 kB\nVmallocUsed:   40736 kB\n")
            .unwrap();
        assert_eq!((s.page_tables_kb, s.vmalloc_used_kb), (5244, 40736));
        assert!(super::parse("PageTables: 1 kB\n").is_none());
    }
}
