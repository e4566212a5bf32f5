//! Compressed traces: zstd or gzip around the same JSON Lines.
//!
//! A plain trace costs about 200 bytes per event (a 3 s, 16-thread stress recording is 424 MB),
//! which is too much to keep a corpus or carry a recording off a test box. JSON Lines of hex
//! addresses and counters compress about 15-20×, so the writer picks zstd or gzip from the output
//! file's extension and every reader recognises either by its magic bytes, whatever the name.
//!
//! A recording must survive SIGKILL up to its last flush. A compressed stream is only readable up
//! to its last complete frame, so the writer ends a frame (a zstd frame, a gzip member) at every
//! flush rather than only at the end: both formats define a file as the concatenation of its
//! frames. A reader that meets a stream cut inside its last frame stops there with a warning
//! instead of failing, as it does for a plain trace cut inside its last line.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;

/// zstd's frame magic number, little-endian (RFC 8878, 3.1.1).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// gzip's ID1 and ID2 (RFC 1952, 2.3.1).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// zstd level 1: on 100 MB of a fix-size recording (`zstd -b1 -e3`) it compressed 15.7× at
/// 1,173 MB/s against level 3's 13.9× at 808 MB/s, and the recorder must keep up with the
/// 600 k events/s (120 MB/s of JSON) a 16-thread stress makes on 16 CPUs.
const ZSTD_LEVEL: i32 = 1;
/// Compression runs on one worker thread of zstd's own, so the recorder's thread only hands
/// over its buffer and goes back to draining the rings: compressing in line, level 3 lost 5 %
/// of the events of that 16-thread stress (21 % without the lock probe's slower pace), where
/// the plain recorder lost none.
const ZSTD_WORKERS: i32 = 1;

/// How a trace file's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Zstd,
    Gzip,
}

impl Compression {
    /// The compression a new file gets from its name: `.zst`/`.zstd` or `.gz`, else none.
    pub fn for_path(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some("zst" | "zstd") => Compression::Zstd,
            Some("gz") => Compression::Gzip,
            _ => Compression::None,
        }
    }

    /// The file-name ending of a trace stored so: `.jsonl`, `.jsonl.zst` or `.jsonl.gz`.
    pub fn suffix(self) -> &'static str {
        match self {
            Compression::None => ".jsonl",
            Compression::Zstd => ".jsonl.zst",
            Compression::Gzip => ".jsonl.gz",
        }
    }

    /// Parses `none`, `zstd` (or `zst`) and `gzip` (or `gz`), for command-line options.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Compression::None),
            "zstd" | "zst" => Ok(Compression::Zstd),
            "gzip" | "gz" => Ok(Compression::Gzip),
            other => Err(format!("`{other}`: expected none, zstd or gzip")),
        }
    }

    /// The compression a stream's first bytes show.
    pub fn sniff(head: &[u8]) -> Self {
        if head.starts_with(&ZSTD_MAGIC) {
            Compression::Zstd
        } else if head.starts_with(&GZIP_MAGIC) {
            Compression::Gzip
        } else {
            Compression::None
        }
    }
}

/// Opens a trace for reading, `-` for stdin, decompressing whatever its magic bytes say.
pub fn open(path: &Path) -> io::Result<Box<dyn BufRead + Send>> {
    let name = path.display().to_string();
    if path.as_os_str() == "-" {
        return reader(io::stdin(), "stdin".into());
    }
    reader(File::open(path)?, name)
}

/// Wraps a byte stream in the decompressor its first bytes call for.
pub fn reader<R: Read + Send + 'static>(
    mut input: R,
    name: String,
) -> io::Result<Box<dyn BufRead + Send>> {
    // A pipe may hand over fewer bytes than the magic number in one read.
    let mut head = Vec::with_capacity(ZSTD_MAGIC.len());
    (&mut input)
        .take(ZSTD_MAGIC.len() as u64)
        .read_to_end(&mut head)?;
    let kind = Compression::sniff(&head);
    let input = BufReader::with_capacity(1 << 20, io::Cursor::new(head).chain(input));
    Ok(match kind {
        Compression::None => Box::new(input),
        Compression::Zstd => Box::new(BufReader::with_capacity(
            1 << 20,
            CutTolerant::new(zstd::stream::read::Decoder::with_buffer(input)?, name),
        )),
        Compression::Gzip => Box::new(BufReader::with_capacity(
            1 << 20,
            CutTolerant::new(flate2::bufread::MultiGzDecoder::new(input), name),
        )),
    })
}

/// Ends the stream quietly, after one warning, where the compressed input stops inside a frame:
/// what a recording killed between two flushes leaves. Corrupt data is an error, except where it
/// damages a frame's header or its last block so that the decoder, too, sees a frame that stops
/// early: both decoders report that as an unexpected end, and it reads as a cut there.
struct CutTolerant<R> {
    inner: R,
    name: String,
    ended: bool,
}

impl<R> CutTolerant<R> {
    fn new(inner: R, name: String) -> Self {
        Self {
            inner,
            name,
            ended: false,
        }
    }
}

impl<R: Read> Read for CutTolerant<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.ended {
            return Ok(0);
        }
        match self.inner.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                log::warn!(
                    "{}: the compressed stream ends inside a frame (a recording cut before its last flush); reading stops at the last complete data",
                    self.name
                );
                self.ended = true;
                Ok(0)
            }
            other => other,
        }
    }
}

/// Creates a trace file, compressed as its name asks ([`Compression::for_path`]).
pub fn create(path: &Path) -> io::Result<Box<dyn Write + Send>> {
    let file = File::create(path)?;
    writer(file, Compression::for_path(path))
}

/// Wraps a sink in the compressor asked for. For a compressed sink, `flush` ends the current
/// frame, so everything flushed survives the process being killed.
pub fn writer<W: Write + Send + 'static>(
    out: W,
    kind: Compression,
) -> io::Result<Box<dyn Write + Send>> {
    Ok(match kind {
        Compression::None => Box::new(out),
        Compression::Zstd | Compression::Gzip => Box::new(FramedWriter::new(out, kind)?),
    })
}

/// A trace file being written, compressed or not, that hands its `File` back when finished
/// (`serve --record` fsyncs each closed file off the event thread). Every flush ends a frame,
/// as with [`writer`].
pub struct FileSink(Sink);

enum Sink {
    Plain(File),
    Framed(FramedWriter<File>),
}

impl FileSink {
    pub fn new(file: File, kind: Compression) -> io::Result<Self> {
        Ok(FileSink(match kind {
            Compression::None => Sink::Plain(file),
            _ => Sink::Framed(FramedWriter::new(file, kind)?),
        }))
    }

    /// Ends the last frame and returns the file.
    pub fn finish(self) -> io::Result<File> {
        match self.0 {
            Sink::Plain(f) => Ok(f),
            Sink::Framed(w) => w.finish(),
        }
    }
}

impl Write for FileSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.0 {
            Sink::Plain(f) => f.write(buf),
            Sink::Framed(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.0 {
            Sink::Plain(f) => f.flush(),
            Sink::Framed(w) => w.flush(),
        }
    }
}

type ZstdWriter<W> = zstd::stream::zio::Writer<W, zstd::stream::raw::Encoder<'static>>;

enum Encoder<W: Write> {
    /// The raw encoder outlives its frames, so its worker thread is started once.
    Zstd(ZstdWriter<W>),
    Gzip(flate2::write::GzEncoder<W>),
}

impl<W: Write> Encoder<W> {
    fn new(out: W, kind: Compression) -> io::Result<Self> {
        Ok(match kind {
            Compression::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                out,
                flate2::Compression::default(),
            )),
            _ => {
                use zstd::zstd_safe::CParameter;
                let mut e = zstd::stream::raw::Encoder::new(ZSTD_LEVEL)?;
                // Four bytes a frame buy a reader that tells corrupt data from a cut.
                e.set_parameter(CParameter::ChecksumFlag(true))?;
                e.set_parameter(CParameter::NbWorkers(ZSTD_WORKERS as u32))?;
                Encoder::Zstd(zstd::stream::zio::Writer::new(out, e))
            }
        })
    }

    /// Ends the open frame, flushes the sink, and returns an encoder for the next frame on it.
    fn end_frame(self, kind: Compression) -> io::Result<Self> {
        match self {
            Encoder::Zstd(mut w) => {
                w.finish()?;
                let (mut out, mut e) = w.into_inner();
                out.flush()?;
                // A new session on the same context: same level, checksum and worker.
                zstd::stream::raw::Operation::reinit(&mut e)?;
                Ok(Encoder::Zstd(zstd::stream::zio::Writer::new(out, e)))
            }
            Encoder::Gzip(e) => {
                let mut out = e.finish()?;
                out.flush()?;
                Encoder::new(out, kind)
            }
        }
    }

    /// Ends the open frame for good and returns the sink.
    fn finish(self) -> io::Result<W> {
        match self {
            Encoder::Zstd(mut w) => {
                w.finish()?;
                Ok(w.into_inner().0)
            }
            Encoder::Gzip(e) => e.finish(),
        }
    }
}

/// A compressor that starts a new frame after every flush.
struct FramedWriter<W: Write> {
    kind: Compression,
    /// `None` only while a frame is being finished, or after an error that lost the sink.
    encoder: Option<Encoder<W>>,
    /// Bytes written into the open frame; an empty frame is not closed on flush.
    pending: u64,
}

impl<W: Write> FramedWriter<W> {
    fn new(out: W, kind: Compression) -> io::Result<Self> {
        Ok(Self {
            kind,
            encoder: Some(Encoder::new(out, kind)?),
            pending: 0,
        })
    }

    fn encoder(&mut self) -> io::Result<&mut Encoder<W>> {
        self.encoder.as_mut().ok_or_else(|| {
            io::Error::other("the compressed trace's sink was lost by an earlier error")
        })
    }

    /// Ends the open frame, if it holds anything, and returns the sink.
    fn finish(mut self) -> io::Result<W> {
        let Some(encoder) = self.encoder.take() else {
            return Err(io::Error::other(
                "the compressed trace's sink was lost by an earlier error",
            ));
        };
        let mut out = encoder.finish()?;
        out.flush()?;
        Ok(out)
    }

    /// Ends the open frame and flushes the sink; a new frame starts with the next write.
    fn end_frame(&mut self) -> io::Result<()> {
        let Some(encoder) = self.encoder.take() else {
            return Err(io::Error::other(
                "the compressed trace's sink was lost by an earlier error",
            ));
        };
        self.encoder = Some(encoder.end_frame(self.kind)?);
        self.pending = 0;
        Ok(())
    }
}

impl<W: Write> Write for FramedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = match self.encoder()? {
            Encoder::Zstd(e) => e.write(buf)?,
            Encoder::Gzip(e) => e.write(buf)?,
        };
        self.pending += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        self.end_frame()
    }
}

impl<W: Write> Drop for FramedWriter<W> {
    /// A writer dropped without a last flush still leaves a complete stream.
    fn drop(&mut self) {
        if self.pending > 0 {
            if let Some(encoder) = self.encoder.take() {
                if let Ok(mut out) = encoder.finish() {
                    let _ = out.flush();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A sink whose bytes the test can still read after the writer is gone.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn lines(n: usize, from: usize) -> String {
        (from..from + n)
            .map(|i| format!("{{\"kind\":\"alloc\",\"ts\":{i},\"addr\":\"0xffffc9000{i:07x}\"}}\n"))
            .collect()
    }

    fn read_all(bytes: Vec<u8>) -> io::Result<String> {
        let mut s = String::new();
        reader(io::Cursor::new(bytes), "test".into())?.read_to_string(&mut s)?;
        Ok(s)
    }

    #[test]
    fn the_extension_chooses_the_compression() {
        assert_eq!(
            Compression::for_path(Path::new("t.jsonl.zst")),
            Compression::Zstd
        );
        assert_eq!(
            Compression::for_path(Path::new("t.jsonl.gz")),
            Compression::Gzip
        );
        assert_eq!(
            Compression::for_path(Path::new("t.jsonl")),
            Compression::None
        );
        assert_eq!(Compression::for_path(Path::new("zst")), Compression::None);
    }

    #[test]
    fn both_formats_round_trip_across_many_frames_and_plain_passes_through() {
        for kind in [Compression::Zstd, Compression::Gzip, Compression::None] {
            let sink = Shared::default();
            let mut w = writer(sink.clone(), kind).unwrap();
            let mut want = String::new();
            for frame in 0..5 {
                let text = lines(1000, frame * 1000);
                w.write_all(text.as_bytes()).unwrap();
                w.flush().unwrap();
                want.push_str(&text);
            }
            drop(w);
            let bytes = sink.0.lock().unwrap().clone();
            assert_eq!(Compression::sniff(&bytes), kind);
            if kind != Compression::None {
                assert!(
                    bytes.len() * 5 < want.len(),
                    "{kind:?}: {} bytes",
                    bytes.len()
                );
            }
            assert_eq!(read_all(bytes).unwrap(), want, "{kind:?}");
        }
    }

    /// What SIGKILL between two flushes leaves: every flushed frame is read back, the cut one
    /// ends the stream without an error.
    #[test]
    fn a_stream_cut_inside_its_last_frame_reads_up_to_the_cut() {
        for kind in [Compression::Zstd, Compression::Gzip] {
            let sink = Shared::default();
            let mut w = writer(sink.clone(), kind).unwrap();
            let first = lines(2000, 0);
            w.write_all(first.as_bytes()).unwrap();
            w.flush().unwrap();
            let flushed = sink.0.lock().unwrap().len();
            w.write_all(lines(2000, 2000).as_bytes()).unwrap();
            w.flush().unwrap();
            let mut bytes = sink.0.lock().unwrap().clone();
            std::mem::forget(w);
            // Cut the second frame in its middle.
            bytes.truncate(flushed + (bytes.len() - flushed) / 2);
            let text = read_all(bytes).unwrap();
            assert!(
                text.starts_with(&first),
                "{kind:?}: the first frame is lost"
            );
            assert!(text.len() < first.len() * 2, "{kind:?}: nothing was cut");
        }
    }

    /// A pipe that hands over one byte per read still has its magic number recognised.
    #[test]
    fn the_magic_number_is_read_whole_from_a_trickling_pipe() {
        struct Trickle(io::Cursor<Vec<u8>>);
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(1);
                self.0.read(&mut buf[..n])
            }
        }
        let sink = Shared::default();
        let mut w = writer(sink.clone(), Compression::Zstd).unwrap();
        let text = lines(50, 0);
        w.write_all(text.as_bytes()).unwrap();
        drop(w);
        let bytes = sink.0.lock().unwrap().clone();
        let mut got = String::new();
        reader(Trickle(io::Cursor::new(bytes)), "pipe".into())
            .unwrap()
            .read_to_string(&mut got)
            .unwrap();
        assert_eq!(got, text);
        let mut plain = String::new();
        reader(Trickle(io::Cursor::new(b"ab".to_vec())), "short".into())
            .unwrap()
            .read_to_string(&mut plain)
            .unwrap();
        assert_eq!(
            plain, "ab",
            "a stream shorter than any magic number is plain"
        );
    }

    #[test]
    fn corrupt_compressed_data_is_an_error_not_an_end() {
        let sink = Shared::default();
        let mut w = writer(sink.clone(), Compression::Zstd).unwrap();
        w.write_all(lines(3000, 0).as_bytes()).unwrap();
        drop(w);
        let mut bytes = sink.0.lock().unwrap().clone();
        let mid = bytes.len() / 2;
        for b in &mut bytes[mid..mid + 64] {
            *b ^= 0x5a;
        }
        assert!(read_all(bytes).is_err());
    }
}
