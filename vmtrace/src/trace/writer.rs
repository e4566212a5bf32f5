//! Writes a trace line by line.
//!
//! Every record is serialised to one line and the buffer is flushed on a timer by the caller, so a
//! recording killed with SIGKILL leaves a file whose complete lines all parse; only the line being
//! written at that instant can be cut.

use std::io::{self, Write};

use super::Record;

pub struct TraceWriter<W: Write> {
    out: io::BufWriter<W>,
    bytes: u64,
    lines: u64,
}

impl<W: Write> TraceWriter<W> {
    pub fn new(out: W) -> Self {
        Self {
            out: io::BufWriter::with_capacity(1 << 20, out),
            bytes: 0,
            lines: 0,
        }
    }

    pub fn write(&mut self, record: &Record) -> io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        self.out.write_all(&line)?;
        self.bytes += line.len() as u64;
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

    /// Flushes and returns the inner writer (for `sync_all` on files).
    pub fn into_inner(self) -> io::Result<W> {
        self.out.into_inner().map_err(|e| e.into_error())
    }
}
