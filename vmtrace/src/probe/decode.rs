//! Ring-buffer record → trace record.

use vmtrace_common::{contention as c, kind, ptpage as pt, work as w, Event};

use crate::trace::{
    Alloc, Contention, Ctx, Free, KAddr, Latency, LockClass, PtLevel, PtPage, Purge, Record, Work,
    WorkStart,
};

/// A task name, inline (no heap allocation: at most 15 bytes). Nearly always valid UTF-8;
/// anything else is replaced lossily, on the slow path.
fn comm(bytes: &[u8]) -> compact_str::CompactString {
    match std::str::from_utf8(bytes) {
        Ok(s) => compact_str::CompactString::new(s),
        Err(_) => compact_str::CompactString::from(String::from_utf8_lossy(bytes)),
    }
}

/// Decodes one ring-buffer record; `None` for a short record or an unknown kind (a newer probe
/// object than this reader), which the caller counts.
///
/// Contention and work records come out with what the ring record alone gives: the caller
/// fills in the stack, lock class and node (`Contention::stack`, `class`, `node`) and the work
/// function's name, which need the stack map and kallsyms.
pub fn decode(bytes: &[u8]) -> Option<Record> {
    if bytes.len() < std::mem::size_of::<Event>() {
        return None;
    }
    // SAFETY: the length was checked and Event is plain old data; the ring buffer gives 8-byte
    // alignment but read_unaligned does not rely on it.
    let ev: Event = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let comm_len = ev
        .comm
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(ev.comm.len());
    let ctx = Ctx {
        ts_ns: ev.ts_ns,
        cpu: ev.cpu,
        tgid: ev.tgid,
        pid: ev.pid,
        comm: comm(&ev.comm[..comm_len]),
    };
    let f = ev.fields;
    Some(match ev.kind {
        kind::ALLOC => Record::Alloc(Alloc {
            ctx,
            addr: KAddr(f[0]),
            size: f[1],
            align: f[2],
            vstart: KAddr(f[3]),
            vend: KAddr(f[4]),
            failed: f[5] as i64 as i32,
        }),
        kind::FREE => Record::Free(Free {
            ctx,
            va_start: KAddr(f[0]),
            nr_lazy: f[1],
            nr_lazy_max: f[2],
        }),
        kind::PURGE => Record::Purge(Purge {
            ctx,
            start: KAddr(f[0]),
            end: KAddr(f[1]),
            npurged: f[2] as u32,
        }),
        kind::CONTENTION => Record::Contention(Box::new(Contention {
            ctx,
            lock: KAddr(f[c::LOCK]),
            flags: f[c::FLAGS] as u32,
            wait_ns: f[c::WAIT_NS],
            ret: f[c::RET] as i64 as i32,
            class: LockClass::Other,
            node: None,
            stack_id: f[c::STACK_ID] as i64,
            stack: Vec::new(),
            probe_ns: Some(f[c::PROBE_NS]),
        })),
        kind::WORK => Record::Work(Box::new(Work {
            ctx,
            function: String::new(),
            function_addr: KAddr(f[w::FUNCTION]),
            work: KAddr(f[w::WORK]),
            start_ns: f[w::START_NS],
            duration_ns: f[w::DURATION_NS],
            start_cpu: f[w::START_CPU] as u32,
            nr_purged: (f[w::NR_PURGED] != u64::MAX).then_some(f[w::NR_PURGED]),
            flush_ns: (f[w::FLUSH_NS] != u64::MAX).then_some(f[w::FLUSH_NS]),
        })),
        kind::WORK_START => Record::WorkStart(WorkStart {
            ctx,
            function: String::new(),
            function_addr: KAddr(f[w::FUNCTION]),
            work: KAddr(f[w::WORK]),
        }),
        kind::PT_PAGE => Record::PtPage(PtPage {
            ctx,
            level: match f[pt::LEVEL] {
                0 => PtLevel::Pte,
                1 => PtLevel::Pmd,
                2 => PtLevel::Pud,
                3 => PtLevel::P4d,
                _ => return None,
            },
            pfn: f[pt::PFN],
            order: f[pt::ORDER] as u32,
        }),
        kind::LATENCY => Record::Latency(Latency {
            ctx,
            function: "alloc_vmap_area".into(),
            start_ns: f[0],
            latency_ns: f[1],
        }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(ev: &Event) -> Vec<u8> {
        // SAFETY: Event is repr(C) POD.
        unsafe {
            std::slice::from_raw_parts(
                (ev as *const Event).cast::<u8>(),
                std::mem::size_of::<Event>(),
            )
        }
        .to_vec()
    }

    #[test]
    fn decodes_an_alloc_with_a_negative_failed() {
        let mut ev = Event::ZERO;
        ev.kind = kind::ALLOC;
        ev.ts_ns = 42;
        ev.cpu = 1;
        ev.comm[..6].copy_from_slice(b"stress");
        ev.fields = [
            0xffffc90000170000,
            73728,
            1,
            0xffffc90000000000,
            0xffffe8ffffffffff,
            (-12i64) as u64,
            0,
            0,
        ];
        let Some(Record::Alloc(a)) = decode(&raw(&ev)) else {
            panic!("not an alloc")
        };
        assert_eq!(a.ctx.comm, "stress");
        assert_eq!(a.addr, KAddr(0xffffc90000170000));
        assert_eq!(a.size, 73728);
        assert_eq!(a.failed, -12);
        assert_eq!(a.ctx.ts_ns, 42);
    }

    #[test]
    fn decodes_a_contention_with_a_failed_stack() {
        let mut ev = Event::ZERO;
        ev.kind = kind::CONTENTION;
        ev.fields[c::LOCK] = 0xffff888100055820;
        ev.fields[c::FLAGS] = 1;
        ev.fields[c::WAIT_NS] = 1234;
        ev.fields[c::STACK_ID] = (-17i64) as u64;
        ev.fields[c::PROBE_NS] = 987;
        let Some(Record::Contention(r)) = decode(&raw(&ev)) else {
            panic!("not a contention")
        };
        assert_eq!((r.wait_ns, r.stack_id, r.flags), (1234, -17, 1));
        assert_eq!(r.probe_ns, Some(987));
        ev.kind = kind::PT_PAGE;
        ev.fields[pt::LEVEL] = 9;
        assert!(decode(&raw(&ev)).is_none(), "bad level");
    }

    #[test]
    fn short_and_unknown_records_are_refused() {
        let mut ev = Event::ZERO;
        ev.kind = 99;
        assert!(decode(&raw(&ev)).is_none());
        assert!(decode(&[0u8; 8]).is_none());
    }
}
