//! Writes a trace line by line.
//!
//! Every record is serialised to one line and the buffer is flushed on a timer by the caller, so a
//! recording killed with SIGKILL leaves a file whose complete lines all parse; only the line being
//! written at that instant can be cut.

//!
//! Allocations, frees and purges (nearly every line of a trace) are written by hand into one
//! reused buffer: serde's generic path allocates a `Vec` per line, escapes every key and hex
//! string and goes through its flatten machinery, which together are most of the recorder's
//! CPU time (a profile during `stress fix-size`: 19 % string escaping, 10 % malloc/free). The
//! bytes are the same as serde_json's, which a property test checks.

use std::io::{self, Write};

use super::addr::format_hex;
use super::schema::Ctx;
use super::Record;

pub struct TraceWriter<W: Write> {
    out: io::BufWriter<W>,
    bytes: u64,
    lines: u64,
    line: Vec<u8>,
}

impl<W: Write> TraceWriter<W> {
    pub fn new(out: W) -> Self {
        Self {
            out: io::BufWriter::with_capacity(1 << 20, out),
            bytes: 0,
            lines: 0,
            line: Vec::with_capacity(512),
        }
    }

    pub fn write(&mut self, record: &Record) -> io::Result<()> {
        self.line.clear();
        encode(&mut self.line, record)?;
        self.line.push(b'\n');
        self.out.write_all(&self.line)?;
        self.bytes += self.line.len() as u64;
        self.lines += 1;
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes
    }

    pub fn lines_written(&self) -> u64 {
        self.lines
    }

    /// Flushes and returns the inner writer (for `sync_all` on files). The inner writer is
    /// flushed too: a compressing one ends its last frame there, and an error doing so (a full
    /// disk) must reach the caller rather than a `Drop` that cannot report it.
    pub fn into_inner(self) -> io::Result<W> {
        let mut inner = self.out.into_inner().map_err(|e| e.into_error())?;
        inner.flush()?;
        Ok(inner)
    }
}

/// One record as serde_json writes it, without the newline.
pub(crate) fn encode(buf: &mut Vec<u8>, record: &Record) -> io::Result<()> {
    match record {
        Record::Alloc(a) => {
            ctx(buf, "alloc", &a.ctx)?;
            hex(buf, "addr", a.addr.0);
            int(buf, "size", a.size);
            int(buf, "align", a.align);
            hex(buf, "vstart", a.vstart.0);
            hex(buf, "vend", a.vend.0);
            int(buf, "failed", a.failed);
        }
        Record::Free(f) => {
            ctx(buf, "free", &f.ctx)?;
            hex(buf, "va_start", f.va_start.0);
            int(buf, "nr_lazy", f.nr_lazy);
            int(buf, "nr_lazy_max", f.nr_lazy_max);
        }
        Record::Purge(p) => {
            ctx(buf, "purge", &p.ctx)?;
            hex(buf, "start", p.start.0);
            hex(buf, "end", p.end.0);
            int(buf, "npurged", p.npurged);
        }
        other => return serde_json::to_writer(&mut *buf, other).map_err(io::Error::other),
    }
    buf.push(b'}');
    Ok(())
}

/// `{"type":"<kind>"` and the task context every event starts with.
fn ctx(buf: &mut Vec<u8>, kind: &str, c: &Ctx) -> io::Result<()> {
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(kind.as_bytes());
    buf.push(b'"');
    int(buf, "ts_ns", c.ts_ns);
    int(buf, "cpu", c.cpu);
    int(buf, "tgid", c.tgid);
    int(buf, "pid", c.pid);
    buf.extend_from_slice(b",\"comm\":");
    // Task names are printable ASCII almost always; anything else goes through serde_json's
    // escaping so the line stays valid JSON.
    if c.comm
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        buf.push(b'"');
        buf.extend_from_slice(c.comm.as_bytes());
        buf.push(b'"');
    } else {
        serde_json::to_writer(&mut *buf, &c.comm).map_err(io::Error::other)?;
    }
    Ok(())
}

fn key(buf: &mut Vec<u8>, name: &str) {
    buf.extend_from_slice(b",\"");
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(b"\":");
}

fn int(buf: &mut Vec<u8>, name: &str, v: impl itoa::Integer) {
    key(buf, name);
    buf.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

fn hex(buf: &mut Vec<u8>, name: &str, v: u64) {
    key(buf, name);
    let mut digits = [0u8; 18];
    buf.push(b'"');
    buf.extend_from_slice(format_hex(v, &mut digits).as_bytes());
    buf.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::addr::KAddr;
    use crate::trace::schema::{Alloc, Free, Purge};
    use proptest::prelude::*;

    fn ctx_strategy() -> impl Strategy<Value = Ctx> {
        (
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            prop_oneof![
                "[a-z/:0-9._-]{0,15}",
                any::<String>(),
                Just("we\"ird\\na\u{7f}me\n".to_string()),
            ],
        )
            .prop_map(|(ts_ns, cpu, tgid, pid, comm)| Ctx {
                ts_ns,
                cpu,
                tgid,
                pid,
                comm: comm.into(),
            })
    }

    fn record_strategy() -> impl Strategy<Value = Record> {
        prop_oneof![
            (ctx_strategy(), any::<[u64; 5]>(), any::<i32>()).prop_map(|(ctx, v, failed)| {
                Record::Alloc(Alloc {
                    ctx,
                    addr: KAddr(v[0]),
                    size: v[1],
                    align: v[2],
                    vstart: KAddr(v[3]),
                    vend: KAddr(v[4]),
                    failed,
                })
            }),
            (ctx_strategy(), any::<[u64; 3]>()).prop_map(|(ctx, v)| {
                Record::Free(Free {
                    ctx,
                    va_start: KAddr(v[0]),
                    nr_lazy: v[1],
                    nr_lazy_max: v[2],
                })
            }),
            (ctx_strategy(), any::<[u64; 2]>(), any::<u32>()).prop_map(|(ctx, v, npurged)| {
                Record::Purge(Purge {
                    ctx,
                    start: KAddr(v[0]),
                    end: KAddr(v[1]),
                    npurged,
                })
            }),
        ]
    }

    proptest! {
        /// The hand-written lines are byte for byte what serde_json writes, so traces do not
        /// depend on which path wrote them.
        #[test]
        fn hand_written_lines_equal_serde_json(record in record_strategy()) {
            let mut fast = Vec::new();
            encode(&mut fast, &record).unwrap();
            let slow = serde_json::to_vec(&record).unwrap();
            prop_assert_eq!(String::from_utf8_lossy(&fast), String::from_utf8_lossy(&slow));
        }
    }
}
