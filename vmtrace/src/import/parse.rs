//! One line of text output of the vmalloc tracepoints, as `perf script`, `trace-cmd report`
//! and the tracefs `trace` file print it.
//!
//! The three share the kernel's own rendering of each event (its `print fmt`) and differ only
//! in the columns before it:
//!
//! - `perf script`: `COMM PID[/TID] [CPU] SECS.FRAC: vmalloc:EVENT: FIELDS`;
//! - `trace-cmd report`: `COMM-PID [CPU] [FLAGS] SECS.FRAC: EVENT: FIELDS`;
//! - tracefs `trace` / `trace_pipe`: `COMM-PID [(TGID)] [CPU] FLAGS SECS.FRAC: EVENT: FIELDS`.
//!
//! A command name may hold spaces and dashes, so the line is read from its CPU column
//! (`[NNN]`) outwards rather than split on whitespace. Fields are taken by name, as the kernel
//! prints them (`va_start: <decimal>` on `alloc_vmap_area`, `va_start=0x…` on the free), so
//! their order does not matter.

use compact_str::CompactString;

use crate::trace::{Alloc, Ctx, Free, KAddr, Purge, Record};

/// Where the text came from; each tool puts the task's id in its own place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    PerfScript,
    TraceCmd,
    Ftrace,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::PerfScript => "perf-script",
            Format::TraceCmd => "trace-cmd",
            Format::Ftrace => "ftrace",
        }
    }

    pub fn from_name(s: &str) -> Option<Format> {
        match s {
            "perf-script" | "perf" => Some(Format::PerfScript),
            "trace-cmd" => Some(Format::TraceCmd),
            "ftrace" => Some(Format::Ftrace),
            _ => None,
        }
    }
}

/// The columns before the event's own text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prefix {
    pub comm: CompactString,
    pub pid: u32,
    pub cpu: u32,
    /// Nanoseconds, as printed (microsecond output times 1000).
    pub ts_ns: u64,
    /// Digits after the decimal point: 6 (µs) or 9 (ns).
    pub frac_digits: usize,
    /// `vmalloc:alloc_vmap_area` or `alloc_vmap_area`: the system is optional.
    pub event: String,
    /// What follows the event name.
    pub rest: String,
    /// The task id was printed as `COMM-PID` (trace-cmd, ftrace) rather than `COMM PID` (perf).
    pub dashed: bool,
    /// The latency flags column (`d..1.`) stood between CPU and time: the tracefs `trace` file
    /// prints it, `trace-cmd report` only with `-l`.
    pub flags: bool,
}

/// Splits a line into its columns; `None` for a line that is not an event line at all
/// (headers, comments, blank lines, perf's own notices), `Some(Err)` for one that looks like
/// an event line but cannot be read.
pub fn prefix(line: &str) -> Option<Result<Prefix, String>> {
    let t = line.trim_end();
    if t.trim_start().is_empty() || t.trim_start().starts_with('#') {
        return None;
    }
    // The CPU column: the first `[digits]` that is followed by the timestamp. A command name
    // could hold brackets too, so try each candidate.
    let mut from = 0;
    while let Some(open) = t[from..].find('[').map(|i| from + i) {
        from = open + 1;
        let Some(close) = t[open..].find(']').map(|i| open + i) else {
            break;
        };
        let inner = &t[open + 1..close];
        if inner.is_empty() || !inner.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Some(after) = after_cpu(&t[close + 1..]) else {
            continue;
        };
        let cpu = match inner.parse::<u32>() {
            Ok(c) => c,
            Err(e) => return Some(Err(format!("CPU [{inner}]: {e}"))),
        };
        let (comm, pid, dashed) = match task(t[..open].trim()) {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        let (ts_ns, frac_digits, event, rest, flags) = after;
        return Some(Ok(Prefix {
            comm: CompactString::from(comm),
            pid,
            cpu,
            ts_ns,
            frac_digits,
            event,
            rest,
            dashed,
            flags,
        }));
    }
    None
}

/// After `[CPU]`: optional flags (`d..1.`), then `SECS.FRAC:`, then `EVENT:` and the fields.
fn after_cpu(s: &str) -> Option<(u64, usize, String, String, bool)> {
    let mut rest = s.trim_start();
    let mut tok = rest.split_whitespace();
    let first = tok.next()?;
    let flags = !first.ends_with(':');
    if flags {
        // The latency-format flags column (ftrace, trace-cmd with -l).
        rest = rest[first.len()..].trim_start();
    }
    let ts_tok = rest.split_whitespace().next()?;
    let ts_text = ts_tok.strip_suffix(':')?;
    let (secs, frac) = ts_text.split_once('.')?;
    if secs.is_empty()
        || frac.is_empty()
        || frac.len() > 9
        || !secs.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let secs: u64 = secs.parse().ok()?;
    let frac_v: u64 = frac.parse().ok()?;
    let ts_ns = secs
        .checked_mul(1_000_000_000)?
        .checked_add(frac_v * 10u64.pow(9 - frac.len() as u32))?;
    rest = rest[ts_tok.len()..].trim_start();
    let ev_tok = rest.split_whitespace().next()?;
    let event = ev_tok.strip_suffix(':')?.to_string();
    let fields = rest[ev_tok.len()..].trim().to_string();
    Some((ts_ns, frac.len(), event, fields, flags))
}

/// `COMM PID[/TID]` (perf) or `COMM-PID` with an optional `(TGID)` column (ftrace).
fn task(s: &str) -> Result<(&str, u32, bool), String> {
    // ftrace's `(  TGID)` column, when the `record-tgid` option is on.
    let s = match s.rfind('(') {
        Some(i) if s.ends_with(')') => s[..i].trim_end(),
        _ => s,
    };
    if let Some((comm, id)) = s.rsplit_once(char::is_whitespace) {
        let id = id.split('/').next_back().unwrap_or(id);
        if let Ok(pid) = id.parse::<u32>() {
            return Ok((comm.trim(), pid, false));
        }
        // perf prints a sample whose task it lost track of (one that had exited) as
        // `:-1    -1`: the task is unknown, written as `UNKNOWN_PID`.
        if id == "-1" {
            return Ok((comm.trim(), UNKNOWN_PID, false));
        }
    }
    if let Some((comm, id)) = s.rsplit_once('-') {
        if let Ok(pid) = id.parse::<u32>() {
            return Ok((comm.trim(), pid, true));
        }
    }
    Err(format!("no task id before the CPU column in {s:?}"))
}

/// The pid written for a task perf printed as `-1`.
pub const UNKNOWN_PID: u32 = u32::MAX;

/// The name of a vmalloc event, without its system; `None` for other events.
pub fn vmalloc_event(event: &str) -> Option<&str> {
    let name = event.strip_prefix("vmalloc:").unwrap_or(event);
    matches!(
        name,
        "alloc_vmap_area" | "free_vmap_area_noflush" | "purge_vmap_area_lazy"
    )
    .then_some(name)
}

/// Which edge of a work item a `workqueue:workqueue_execute_start/end` line is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkEdge {
    Start,
    End,
}

/// The workqueue execute events, with or without their system.
pub fn workqueue_event(event: &str) -> Option<WorkEdge> {
    match event.strip_prefix("workqueue:").unwrap_or(event) {
        "workqueue_execute_start" => Some(WorkEdge::Start),
        "workqueue_execute_end" => Some(WorkEdge::End),
        _ => None,
    }
}

/// `work struct %p: function %ps`, as both execute events print it: the work item's address
/// (raw from perf and trace-cmd, hashed in the tracefs file, which is enough to pair the two
/// edges) and its function's name.
pub fn work_fields(rest: &str) -> Result<(u64, &str), String> {
    let s = rest.trim();
    let addr = s
        .strip_prefix("work struct ")
        .and_then(|r| r.split_once(':'))
        .ok_or_else(|| format!("`{s}`: expected `work struct ADDR: function NAME`"))?;
    let text = addr.0.trim();
    let work = hex_pointer(text).map_err(|e| format!("work struct {text}: {e}"))?;
    let function = addr
        .1
        .trim()
        .strip_prefix("function ")
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .ok_or_else(|| format!("`{s}`: no `function NAME`"))?;
    Ok((work, function))
}

/// An edge of a lock wait, `lock:contention_begin` or `lock:contention_end`, with its fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockEdge {
    Begin { lock: u64, flags: u32 },
    End { lock: u64, ret: i32 },
}

/// The lock contention events, with or without their system: true for the begin.
pub fn lock_event(event: &str) -> Option<bool> {
    match event.strip_prefix("lock:").unwrap_or(event) {
        "contention_begin" => Some(true),
        "contention_end" => Some(false),
        _ => None,
    }
}

/// A `%p` as the tools print it: hex, with `0x` (raw, perf and trace-cmd) or without (hashed,
/// the tracefs file).
fn hex_pointer(text: &str) -> Result<u64, std::num::ParseIntError> {
    let hex = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    u64::from_str_radix(hex, 16)
}

/// `LCB_F_*` names as `__print_flags` writes them in `include/trace/events/lock.h`.
const LCB_FLAGS: [(&str, u32); 6] = [
    ("SPIN", 1 << 0),
    ("READ", 1 << 1),
    ("WRITE", 1 << 2),
    ("RT", 1 << 3),
    ("PERCPU", 1 << 4),
    ("MUTEX", 1 << 5),
];

/// `%p (flags=%s)` (begin) and `%p (ret=%d)` (end). The lock's address is raw from perf and
/// trace-cmd and hashed in the tracefs file, which still pairs a wait's two edges.
pub fn lock_fields(begin: bool, rest: &str) -> Result<LockEdge, String> {
    let s = rest.trim();
    let (addr, tail) = s
        .split_once(' ')
        .ok_or_else(|| format!("`{s}`: expected `ADDR (flags=…)` or `ADDR (ret=…)`"))?;
    let lock = hex_pointer(addr).map_err(|e| format!("lock {addr}: {e}"))?;
    // perf prints an event recorded without a callchain in a `-g` session with its sample's
    // address and symbol after the fields (`(ret=0) ffffffff8224df0f sym+0x3cf (…)`).
    let inner = tail
        .trim()
        .strip_prefix('(')
        .and_then(|t| t.split_once(')'))
        .map(|(fields, _)| fields)
        .ok_or_else(|| format!("`{s}`: the fields are not in parentheses"))?;
    if begin {
        let names = inner
            .strip_prefix("flags=")
            .ok_or_else(|| format!("`{s}`: no flags="))?;
        let mut flags = 0u32;
        for name in names.split('|').filter(|n| !n.is_empty()) {
            flags |= match LCB_FLAGS.iter().find(|(n, _)| *n == name) {
                Some((_, bit)) => *bit,
                // `__print_flags` writes bits it has no name for as a hex number.
                None => name
                    .strip_prefix("0x")
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("flags {names}: unknown flag {name}"))?,
            };
        }
        Ok(LockEdge::Begin { lock, flags })
    } else {
        let ret = inner
            .strip_prefix("ret=")
            .ok_or_else(|| format!("`{s}`: no ret="))?;
        let ret = ret.parse::<i32>().map_err(|e| format!("ret={ret}: {e}"))?;
        Ok(LockEdge::End { lock, ret })
    }
}

/// One frame of a kernel stack printed under an event, as `symbol+0xoff`: perf's callchain
/// lines (`\tADDR symbol+0xoff ([kernel.kallsyms])`) and the `=> symbol+0xoff/0xsize` lines of
/// ftrace's and trace-cmd's stack traces. `None` for anything else, user-space frames and
/// unresolved addresses included.
pub fn frame(line: &str) -> Option<String> {
    if !line.starts_with(char::is_whitespace) {
        return None;
    }
    let t = line.trim();
    if let Some(f) = t.strip_prefix("=> ") {
        let f = f.trim();
        let f = f.split_once('/').map_or(f, |(sym, _)| sym);
        return (!f.is_empty() && !f.starts_with("0x")).then(|| f.to_string());
    }
    let (addr, rest) = t.split_once(' ')?;
    if !addr.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let (symbol, module) = rest.trim().rsplit_once(" (")?;
    (module.starts_with("[kernel") && symbol != "[unknown]").then(|| symbol.to_string())
}

/// The task context of an event line, stamped `ts_ns` (the caller's, which keeps µs input in
/// order).
pub fn ctx(p: &Prefix, ts_ns: u64) -> Ctx {
    Ctx {
        ts_ns,
        cpu: p.cpu,
        tgid: p.pid,
        pid: p.pid,
        comm: p.comm.clone(),
    }
}

/// Reads the fields of one vmalloc event by name into its trace record.
pub fn record(name: &str, rest: &str, ctx: Ctx) -> Result<Record, String> {
    let f = Fields::new(rest);
    match name {
        "alloc_vmap_area" => Ok(Record::Alloc(Alloc {
            ctx,
            addr: KAddr(f.num("va_start")?),
            size: f.num("size")?,
            align: f.num("align")?,
            vstart: KAddr(f.num("vstart")?),
            vend: KAddr(f.num("vend")?),
            failed: f.signed("failed")? as i32,
        })),
        "free_vmap_area_noflush" => Ok(Record::Free(Free {
            ctx,
            va_start: KAddr(f.num("va_start")?),
            nr_lazy: f.num("nr_lazy")?,
            nr_lazy_max: f.num("nr_lazy_max")?,
        })),
        "purge_vmap_area_lazy" => {
            let n = f.num("num_purged")?;
            Ok(Record::Purge(Purge {
                ctx,
                start: KAddr(f.num("start")?),
                end: KAddr(f.num("end")?),
                npurged: u32::try_from(n).map_err(|_| format!("num_purged {n} too large"))?,
            }))
        }
        other => Err(format!("not a vmalloc event: {other}")),
    }
}

/// `name=value` and `name: value` pairs of the kernel's print format.
struct Fields<'a> {
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Fields<'a> {
    fn new(s: &'a str) -> Self {
        let mut pairs = Vec::new();
        let toks: Vec<&str> = s.split_whitespace().collect();
        let mut i = 0;
        while i < toks.len() {
            let t = toks[i];
            if let Some((k, v)) = t.split_once('=') {
                pairs.push((k, v));
            } else if let Some(k) = t.strip_suffix(':') {
                if let Some(v) = toks.get(i + 1) {
                    pairs.push((k, v));
                    i += 1;
                }
            }
            i += 1;
        }
        Fields { pairs }
    }

    fn text(&self, name: &str) -> Result<&'a str, String> {
        self.pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("no {name} field"))
    }

    fn num(&self, name: &str) -> Result<u64, String> {
        let v = self.text(name)?.trim_end_matches(',');
        let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => v.parse::<u64>(),
        };
        parsed.map_err(|e| format!("{name}={v}: {e}"))
    }

    fn signed(&self, name: &str) -> Result<i64, String> {
        let v = self.text(name)?.trim_end_matches(',');
        v.parse::<i64>().map_err(|e| format!("{name}={v}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The record of a parsed line.
    fn parsed(p: &Prefix) -> Record {
        record(vmalloc_event(&p.event).unwrap(), &p.rest, ctx(p, p.ts_ns)).unwrap()
    }

    // Lines printed on the reference machine (Linux 6.18) by `perf script` after
    // `perf record -e 'vmalloc:*' -a`.
    const PERF_ALLOC: &str = "         vmtrace 13057 [000] 16736.414516:        vmalloc:alloc_vmap_area: va_start: 18446683600571846656 size=12288 align=4096 vstart=0xffffc90000000000 vend=0xffffe8ffffffffff failed=0";
    const PERF_FREE: &str = " kworker/u8:3-ev  3357 [000] 16736.414720: vmalloc:free_vmap_area_noflush: va_start=0xffffc900001bd000 nr_lazy=3140 nr_lazy_max=16384";
    const PERF_PURGE: &str = " kworker/u8:3-ev  3357 [000] 16736.428237:   vmalloc:purge_vmap_area_lazy: start=0xffffc900000d3000 end=0xffffc900414c5000 num_purged=858";

    #[test]
    fn perf_script_lines() {
        let p = prefix(PERF_ALLOC).unwrap().unwrap();
        assert_eq!(
            (p.comm.as_str(), p.pid, p.cpu, p.ts_ns, p.frac_digits),
            ("vmtrace", 13057, 0, 16_736_414_516_000, 6)
        );
        assert!(!p.dashed);
        assert_eq!(vmalloc_event(&p.event), Some("alloc_vmap_area"));
        let Record::Alloc(a) = parsed(&p) else {
            panic!("not an alloc")
        };
        assert_eq!(a.addr, KAddr(18446683600571846656));
        assert_eq!((a.size, a.align, a.failed), (12288, 4096, 0));
        assert_eq!(
            (a.vstart, a.vend),
            (KAddr(0xffffc90000000000), KAddr(0xffffe8ffffffffff))
        );
        assert_eq!((a.ctx.pid, a.ctx.cpu, a.ctx.ts_ns), (13057, 0, p.ts_ns));
        // A command name with a slash and a dash.
        let p = prefix(PERF_FREE).unwrap().unwrap();
        assert_eq!((p.comm.as_str(), p.pid), ("kworker/u8:3-ev", 3357));
        let Record::Free(f) = parsed(&p) else {
            panic!("not a free")
        };
        assert_eq!(
            (f.va_start, f.nr_lazy, f.nr_lazy_max),
            (KAddr(0xffffc900001bd000), 3140, 16384)
        );
        let p = prefix(PERF_PURGE).unwrap().unwrap();
        let Record::Purge(g) = parsed(&p) else {
            panic!("not a purge")
        };
        assert_eq!(
            (g.start, g.end, g.npurged),
            (KAddr(0xffffc900000d3000), KAddr(0xffffc900414c5000), 858)
        );
    }

    #[test]
    fn ftrace_and_trace_cmd_lines() {
        // tracefs `trace`, with the latency flags and the tgid column; a command with a space.
        let l = "     my worker-4242    (   4240) [001] d..1. 16736.414802123: free_vmap_area_noflush: va_start=0xffffc90000200000 nr_lazy=18 nr_lazy_max=16384";
        let p = prefix(l).unwrap().unwrap();
        assert_eq!(
            (p.comm.as_str(), p.pid, p.cpu, p.ts_ns, p.frac_digits),
            ("my worker", 4242, 1, 16_736_414_802_123, 9)
        );
        assert!(p.dashed && p.flags);
        // trace-cmd report: no flags column.
        let l = "        stress-0-13059 [000] 16736.414802: alloc_vmap_area:      va_start: 18446683600669249536 size=73728 align=4096 vstart=0xffffc90000000000 vend=0xffffe8ffffffffff failed=0";
        let p = prefix(l).unwrap().unwrap();
        assert_eq!((p.comm.as_str(), p.pid, p.cpu), ("stress-0", 13059, 0));
        assert!(p.dashed && !p.flags);
        assert!(matches!(parsed(&p), Record::Alloc(_)));
    }

    #[test]
    fn workqueue_lines() {
        let l = " kworker/u8:0-ev   409 [000] 38971.999661: workqueue:workqueue_execute_start: work struct 0xffffffff82f311a0: function drain_vmap_area_work";
        let p = prefix(l).unwrap().unwrap();
        assert_eq!(workqueue_event(&p.event), Some(WorkEdge::Start));
        assert_eq!(
            work_fields(&p.rest),
            Ok((0xffff_ffff_82f3_11a0, "drain_vmap_area_work"))
        );
        // The tracefs file hashes %p and prints it without 0x.
        assert_eq!(
            work_fields("work struct 00000000b1c2d3e4: function vmstat_update"),
            Ok((0xb1c2_d3e4, "vmstat_update"))
        );
        assert_eq!(
            workqueue_event("workqueue_execute_end"),
            Some(WorkEdge::End)
        );
        assert_eq!(workqueue_event("workqueue:workqueue_queue_work"), None);
        for bad in [
            "work struct: function f",
            "work struct 0xzz: function f",
            "work struct 0x1: f",
        ] {
            assert!(work_fields(bad).is_err(), "{bad}");
        }
    }

    /// Lines `perf script --ns` printed on the reference machine after `perf record -a -g -e
    /// lock:contention_begin -e lock:contention_end`.
    #[test]
    fn lock_lines_and_their_frames() {
        let begin = "stress-1 32268 [001] 36002.183405123:          lock:contention_begin: 0xffffffff83989964 (flags=SPIN)";
        let p = prefix(begin).unwrap().unwrap();
        assert_eq!(lock_event(&p.event), Some(true));
        assert_eq!(
            lock_fields(true, &p.rest),
            Ok(LockEdge::Begin {
                lock: 0xffff_ffff_8398_9964,
                flags: 1
            })
        );
        let end = "perf-exec 32269 [000] 36002.183098695:            lock:contention_end: 0xffff888627c2fbc0 (ret=0)";
        let p = prefix(end).unwrap().unwrap();
        assert_eq!(lock_event(&p.event), Some(false));
        assert_eq!(
            lock_fields(false, &p.rest),
            Ok(LockEdge::End {
                lock: 0xffff_8886_27c2_fbc0,
                ret: 0
            })
        );
        assert_eq!(
            lock_fields(true, "00000000b1c2d3e4 (flags=READ|MUTEX)"),
            Ok(LockEdge::Begin {
                lock: 0xb1c2_d3e4,
                flags: 2 | 32
            })
        );
        assert_eq!(
            lock_fields(true, "0x10 (flags=SPIN|0x80)"),
            Ok(LockEdge::Begin {
                lock: 0x10,
                flags: 0x81
            })
        );
        for bad in [
            "0x10",
            "0xzz (flags=SPIN)",
            "0x10 flags=SPIN",
            "0x10 (flags=SPIN|BOGUS)",
            "0x10 (ret=0)",
        ] {
            assert!(lock_fields(true, bad).is_err(), "{bad}");
        }
        assert!(lock_fields(false, "0x10 (ret=x)").is_err());
        // An event without a callchain in a `perf record -g` session: the sample's symbol follows.
        assert_eq!(
            lock_fields(
                false,
                "0xffff88810006ac78 (ret=0) ffffffff8224df0f rwsem_down_read_slowpath+0x3cf ([kernel.kallsyms])"
            ),
            Ok(LockEdge::End {
                lock: 0xffff_8881_0006_ac78,
                ret: 0
            })
        );
        assert_eq!(lock_event("sched:sched_switch"), None);

        assert_eq!(
            frame("\tffffffff82252c7e __pv_queued_spin_lock_slowpath+0x10e ([kernel.kallsyms])")
                .as_deref(),
            Some("__pv_queued_spin_lock_slowpath+0x10e")
        );
        assert_eq!(
            frame(" => find_unlink_vmap_area+0x55/0x140").as_deref(),
            Some("find_unlink_vmap_area+0x55")
        );
        assert_eq!(
            frame("\t           d4ad7 __GI___execve+0x7 (/usr/lib/x86_64-linux-gnu/libc.so.6)"),
            None,
            "user-space frames are not the kernel stack"
        );
        assert_eq!(
            frame("\tffffffff82252c7e [unknown] ([kernel.kallsyms])"),
            None
        );
        assert_eq!(frame(begin), None, "an event line is not a frame");

        // A sample perf could no longer give a task: still perf's column layout.
        let lost = ":-1    -1 [001] 36549.967804316:   lock:contention_begin: 0xffffffff82e08140 (flags=SPIN)";
        let p = prefix(lost).unwrap().unwrap();
        assert_eq!((p.pid, p.dashed, p.cpu), (UNKNOWN_PID, false, 1));
    }

    #[test]
    fn what_is_not_an_event_and_what_is_broken() {
        assert!(prefix("# tracer: nop").is_none());
        assert!(prefix("").is_none());
        assert!(prefix("cpus=2").is_none());
        let bad = " kworker/u8:3-ev  3357 [000] 16736.414720: vmalloc:free_vmap_area_noflush: va_start=0xzz nr_lazy=1 nr_lazy_max=2";
        let p = prefix(bad).unwrap().unwrap();
        let e = record("free_vmap_area_noflush", &p.rest, ctx(&p, 0)).unwrap_err();
        assert!(e.contains("va_start"), "{e}");
        let missing = record("purge_vmap_area_lazy", "start=0x1 end=0x2", ctx(&p, 0)).unwrap_err();
        assert!(missing.contains("num_purged"), "{missing}");
        assert!(vmalloc_event("sched:sched_switch").is_none());
    }
}
