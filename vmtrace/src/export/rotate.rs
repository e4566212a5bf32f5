//! `vmtrace serve --record DIR --rotate SIZE --keep N`: the record pipeline's trace files,
//! written by a daemon that never stops, so cut into files that each stand alone.
//!
//! Every file is a complete trace in the format of `vmtrace record` (docs/trace-format.md):
//! header, vmallocinfo snapshot, events in timestamp order, footer. Its footer counts only its
//! own events and the losses while it was written, so each file can be checked, summarised and
//! replayed without the others.
//!
//! The snapshot is the hard part. The first file's is read from `/proc/vmallocinfo` before the
//! daemon drops its capabilities. Later files cannot read one: without CAP_SYSLOG the kernel
//! prints `%pK` addresses hashed (or as zeros), and lowering `kptr_restrict` needs
//! CAP_SYS_ADMIN, which is gone. So [`LiveAreas`] keeps the area list up to date from the events
//! as they are written, and each new file starts with that list: exactly the state a replay of
//! the previous files would have reached, as of the previous file's last event.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::host::system;
use crate::record::{footer, Pipeline, ProbeCounters, TraceFile};
use crate::trace::compress::{Compression, FileSink};
use crate::trace::{AreaKind, Header, Record, StopReason, VmallocArea, VmallocSnapshot};

/// File names are `vmtrace-<UTC start of the daemon>-<sequence>.jsonl` (`.jsonl.zst`,
/// `.jsonl.gz` when compressed), so names sort in the order the files were written, across
/// restarts too.
const PREFIX: &str = "vmtrace-";
/// Every ending a kept file may have: `--keep` counts them all, whatever this run writes.
const SUFFIXES: [Compression; 3] = [Compression::None, Compression::Zstd, Compression::Gzip];

/// Parses a size such as `64M`, `1G`, `512KiB` or `1048576` into bytes. Units are powers of
/// 1024 (`K`, `M`, `G`, `T`, optionally followed by `i`, `B` or `iB`, any case); a bare number
/// is bytes. Zero is refused: a file must be allowed to hold something.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let bad = || {
        format!("invalid size `{s}`: expected a whole number with an optional unit K, M, G or T (powers of 1024), e.g. 64M or 1G")
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b'))
        .or_else(|| unit.strip_suffix('i'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(bad()),
    };
    let bytes = n
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size `{s}` is too large"))?;
    if bytes == 0 {
        return Err(format!("size `{s}` is zero; give at least one byte"));
    }
    Ok(bytes)
}

/// The vmap areas as of the last event applied: a snapshot with every later allocation, lazy
/// free and purge applied the way a replay applies them, so a file seeded from it replays on
/// from where the previous file ended.
///
/// What it cannot know, and what that costs a replay of a later file:
/// * Areas allocated after the first snapshot have no `caller`, `pages`, `phys` or flags, and
///   are all `busy` (a `vm_map_ram` area looks the same in the alloc event); replay uses the
///   kind only to leave the guard page out of its page-table estimate.
/// * A purge removes the `npurged` earliest-freed `unpurged` areas (areas already lazy in the
///   first snapshot count as earliest, in address order). The kernel detaches each node's lazy
///   list at the start of the purge and emits the event at its end, so a free landing during
///   the purge stays lazy; removing every lazy area would drop those and leave the next file's
///   lazy backlog short by their pages (a replay of it would then disagree on almost every
///   `nr_lazy`). The order across nodes is the free order, which matches the kernel's
///   per-node detach up to the microseconds between two nodes' detaches.
/// * A purge frees its areas before it emits its event, so an allocation may reuse the range
///   of an area the list still holds as lazy. That area was in the purge's batch: it counts
///   toward the next purge's `npurged`, which then removes that many fewer. Without this the
///   purge took one area too many per reuse, an area the kernel still held lazy, and the next
///   file started one area short of the kernel's `nr_lazy` (seen in a real recording: every
///   `nr_lazy` of the next file off by 18 pages until its first purge).
/// * A lost event leaves the list wrong until the address is reused: an allocation over an area
///   the list still holds replaces it, since the kernel never hands out overlapping areas.
#[derive(Debug)]
pub struct LiveAreas {
    areas: BTreeMap<u64, VmallocArea>,
    /// Events before this are already in the seed snapshot (the read started after them).
    seed_ts: u64,
    /// Timestamp of the last event applied: the time the list is true at.
    as_of_ns: u64,
    real_addresses: bool,
    /// Frees of areas the list did not hold (their allocation was lost, or the snapshot missed
    /// an area being set up).
    pub unknown_frees: u64,
    /// Lazy areas in free order: sequence number → start. Entries whose area was since
    /// replaced (only after lost events) are skipped when a purge takes them.
    lazy_order: BTreeMap<u64, u64>,
    next_seq: u64,
    /// Lazy areas an allocation reused since the last purge: purged by a purge whose event
    /// has not arrived yet.
    reused_lazy: u64,
}

impl LiveAreas {
    /// Starts from a snapshot read from the kernel.
    pub fn new(snapshot: &VmallocSnapshot) -> Self {
        let areas: BTreeMap<u64, VmallocArea> = snapshot
            .areas
            .iter()
            .map(|a| (a.start.0, a.clone()))
            .collect();
        let lazy_order: BTreeMap<u64, u64> = areas
            .values()
            .filter(|a| a.kind == AreaKind::Unpurged)
            .map(|a| a.start.0)
            .enumerate()
            .map(|(i, start)| (i as u64, start))
            .collect();
        LiveAreas {
            next_seq: lazy_order.len() as u64,
            areas,
            seed_ts: snapshot.ts_start_ns,
            as_of_ns: snapshot.ts_end_ns,
            real_addresses: snapshot.real_addresses,
            unknown_frees: 0,
            lazy_order,
            reused_lazy: 0,
        }
    }

    /// Removes the `n` earliest-freed areas still lazy: what the purge reclaimed.
    fn purge_earliest(&mut self, n: u64) {
        let mut left = n;
        while left > 0 {
            let Some((_, start)) = self.lazy_order.pop_first() else {
                break;
            };
            if self
                .areas
                .get(&start)
                .is_some_and(|a| a.kind == AreaKind::Unpurged)
            {
                self.areas.remove(&start);
                left -= 1;
            }
        }
    }

    /// Applies one written record; records other than alloc, free and purge only move the
    /// clock.
    pub fn apply(&mut self, rec: &Record) {
        let Some(ts) = rec.ts_ns() else {
            return;
        };
        if ts < self.seed_ts {
            return;
        }
        self.as_of_ns = self.as_of_ns.max(ts);
        match rec {
            Record::Alloc(a) if a.failed == 0 && a.size > 0 => {
                let (start, end) = (a.addr.0, a.addr.0.saturating_add(a.size));
                self.remove_overlapping(start, end);
                self.areas.insert(
                    start,
                    VmallocArea {
                        start: a.addr,
                        end: crate::trace::KAddr(end),
                        size: a.size,
                        kind: AreaKind::Busy,
                        caller: None,
                        pages: None,
                        phys: None,
                        flags: Vec::new(),
                    },
                );
            }
            Record::Free(f) => match self.areas.get_mut(&f.va_start.0) {
                Some(area) => {
                    // As /proc/vmallocinfo prints a lazily freed area: range and size only.
                    area.kind = AreaKind::Unpurged;
                    area.caller = None;
                    area.pages = None;
                    area.phys = None;
                    area.flags.clear();
                    self.lazy_order.insert(self.next_seq, f.va_start.0);
                    self.next_seq += 1;
                }
                None => self.unknown_frees += 1,
            },
            Record::Purge(p) => {
                let npurged = u64::from(p.npurged);
                let reused = self.reused_lazy.min(npurged);
                self.reused_lazy = 0;
                self.purge_earliest(npurged - reused);
            }
            _ => {}
        }
    }

    /// Drops every area overlapping `[start, end)`: the kernel just handed that range out, so
    /// whatever the list still had there is stale.
    fn remove_overlapping(&mut self, start: u64, end: u64) {
        let stale: Vec<u64> = self
            .areas
            .range(..end)
            .rev()
            .take_while(|(s, a)| a.end.0 > start || **s >= start)
            .map(|(s, _)| *s)
            .collect();
        for s in stale {
            if self
                .areas
                .remove(&s)
                .is_some_and(|a| a.kind == AreaKind::Unpurged)
            {
                self.reused_lazy += 1;
            }
        }
    }

    /// The list as a snapshot record, by address; its read window is the instant of the last
    /// event applied.
    pub fn snapshot(&self) -> VmallocSnapshot {
        VmallocSnapshot {
            ts_start_ns: self.as_of_ns,
            ts_end_ns: self.as_of_ns,
            real_addresses: self.real_addresses,
            // Mid-trace the pools hold whatever the purges put there.
            pools_drained: false,
            areas: self.areas.values().cloned().collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.areas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.areas.is_empty()
    }
}

/// Where and how big.
#[derive(Clone, Debug)]
pub struct RotateOptions {
    pub dir: PathBuf,
    /// A file is closed once it holds at least one event and this many bytes of JSON Lines
    /// (before compression).
    pub max_bytes: u64,
    /// How each file is stored; its name ends accordingly.
    pub compression: Compression,
    /// Files named `vmtrace-*.jsonl` kept in `dir`, the one being written included; older ones
    /// are deleted. 0 keeps them all.
    pub keep: usize,
}

/// The file being written, and the counters at its start (its footer gives the difference).
struct Current {
    file: TraceFile<FileSink>,
    path: PathBuf,
    base: ProbeCounters,
    late_base: u64,
}

/// Writes the pipeline's records into rotating files (see the module docs).
pub struct Rotating {
    opts: RotateOptions,
    /// Every file's header is this one with fresh start times.
    header: Header,
    areas: LiveAreas,
    /// The daemon's start time in UTC, `20250131T235959Z`: part of every file name.
    stamp: String,
    seq: u32,
    current: Current,
    /// Closed files go to this thread to be fsynced off the event thread (started at the
    /// first rotation).
    fsync: Option<Fsync>,
    /// Files closed by rotation so far.
    pub rotations: u64,
}

impl Rotating {
    /// Creates `opts.dir` if needed and the first file, seeded with `snapshot` (read from the
    /// kernel). `counters` and `late` are the probes' counters now: the first footer counts
    /// from them.
    pub fn start(
        opts: RotateOptions,
        header: Header,
        snapshot: &VmallocSnapshot,
        counters: ProbeCounters,
        late: u64,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&opts.dir)
            .with_context(|| format!("creating {}", opts.dir.display()))?;
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace(['-', ':'], "");
        let mut seq = 0;
        let (path, file) = create_next(&opts.dir, &stamp, &mut seq, opts.compression)?;
        let file = TraceFile::start(file, &header, snapshot)
            .with_context(|| format!("writing {}", path.display()))?;
        let r = Rotating {
            areas: LiveAreas::new(snapshot),
            opts,
            header,
            stamp,
            seq,
            current: Current {
                file,
                path,
                base: counters,
                late_base: late,
            },
            fsync: None,
            rotations: 0,
        };
        r.prune()?;
        Ok(r)
    }

    /// The file being written.
    pub fn current_path(&self) -> &Path {
        &self.current.path
    }

    /// Writes every held event below `watermark`, starting a new file whenever the current one
    /// is full. `counters` reads the probes' counters (only at a rotation).
    pub fn emit(
        &mut self,
        pipeline: &mut Pipeline,
        watermark: u64,
        counters: &mut dyn FnMut() -> anyhow::Result<ProbeCounters>,
    ) -> anyhow::Result<()> {
        while let Some(rec) = pipeline.reorder.pop_one(watermark) {
            self.areas.apply(&rec);
            let cur = &mut self.current;
            cur.file
                .write_event(&rec)
                .with_context(|| format!("writing {}", cur.path.display()))?;
            if cur.file.bytes_written() >= self.opts.max_bytes && cur.file.event_lines() > 0 {
                self.rotate(pipeline.late_events(), counters()?)?;
            }
        }
        Ok(())
    }

    pub fn flush(&mut self) -> anyhow::Result<()> {
        self.current
            .file
            .flush()
            .with_context(|| format!("writing {}", self.current.path.display()))
    }

    /// Closes the current file with a `rotated` footer and opens the next, seeded from the
    /// live area list.
    fn rotate(&mut self, late: u64, counters: ProbeCounters) -> anyhow::Result<()> {
        let (path, file) = create_next(
            &self.opts.dir,
            &self.stamp,
            &mut self.seq,
            self.opts.compression,
        )?;
        let mut header = self.header.clone();
        header.start_boottime_ns = system::boottime_ns();
        header.start_realtime_ns = system::realtime_ns();
        let file = TraceFile::start(file, &header, &self.areas.snapshot())
            .with_context(|| format!("writing {}", path.display()))?;
        let next = Current {
            file,
            path,
            base: counters.clone(),
            late_base: late,
        };
        let old = std::mem::replace(&mut self.current, next);
        let closed = close(old, StopReason::Rotated, late, &counters)?;
        if self.fsync.is_none() {
            self.fsync = Fsync::start();
        }
        match &self.fsync {
            Some(f) => f.sync(closed),
            None => drop(closed),
        }
        self.rotations += 1;
        self.prune()?;
        Ok(())
    }

    /// Writes the last footer and syncs the file; returns its path.
    pub fn finish(
        mut self,
        reason: StopReason,
        late: u64,
        counters: &ProbeCounters,
    ) -> anyhow::Result<PathBuf> {
        if let Some(f) = self.fsync.take() {
            f.finish();
        }
        let path = self.current.path.clone();
        let f = close(self.current, reason, late, counters)?;
        let _ = f.sync_data();
        Ok(path)
    }

    /// Deletes the oldest `vmtrace-*.jsonl` files beyond `keep` (never the current one).
    fn prune(&self) -> anyhow::Result<()> {
        if self.opts.keep == 0 {
            return Ok(());
        }
        let dir = &self.opts.dir;
        let mut older: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with(PREFIX)
                    && SUFFIXES.iter().any(|c| name.ends_with(c.suffix()))
                    && e.file_type().is_ok_and(|t| t.is_file())
            })
            .map(|e| e.path())
            .filter(|p| *p != self.current.path)
            .collect();
        older.sort();
        let excess = (older.len() + 1).saturating_sub(self.opts.keep);
        for p in older.into_iter().take(excess) {
            match std::fs::remove_file(&p) {
                Ok(()) => log::info!("deleted {} (--keep {})", p.display(), self.opts.keep),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("deleting {}", p.display())),
            }
        }
        Ok(())
    }
}

/// A thread that fsyncs closed files, so a rotation never waits for the disk on the event
/// thread. It takes one file at a time and one waiting: a disk slower than the rotations gets
/// the later files closed without an fsync (the kernel writes them back anyway) rather than a
/// growing queue or a stalled event thread.
struct Fsync {
    tx: std::sync::mpsc::SyncSender<File>,
    thread: std::thread::JoinHandle<()>,
}

impl Fsync {
    fn start() -> Option<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<File>(1);
        let thread = std::thread::Builder::new()
            .name("vmtrace-fsync".into())
            .spawn(move || {
                for f in rx {
                    let _ = f.sync_data();
                }
            })
            .map_err(|e| log::warn!("no fsync thread, closed files are not synced: {e}"))
            .ok()?;
        Some(Fsync { tx, thread })
    }

    fn sync(&self, f: File) {
        if self.tx.try_send(f).is_err() {
            log::debug!("fsync thread busy; a closed trace file is left to writeback");
        }
    }

    /// Waits for the pending fsyncs (at shutdown).
    fn finish(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

/// Writes a file's footer from the counters' progress since it began; returns the file.
fn close(
    cur: Current,
    reason: StopReason,
    late: u64,
    counters: &ProbeCounters,
) -> anyhow::Result<File> {
    let f = footer(
        reason,
        None,
        &cur.file.tally,
        late.saturating_sub(cur.late_base),
        &counters.since(&cur.base),
    );
    cur.file
        .finish(&f)
        .and_then(FileSink::finish)
        .with_context(|| format!("writing {}", cur.path.display()))
}

/// Creates the next file that does not exist yet (a restart within the same second finds its
/// predecessor's names taken), bumping `seq`.
fn create_next(
    dir: &Path,
    stamp: &str,
    seq: &mut u32,
    compression: Compression,
) -> anyhow::Result<(PathBuf, FileSink)> {
    loop {
        *seq += 1;
        let path = dir.join(format!(
            "{PREFIX}{stamp}-{:06}{}",
            *seq,
            compression.suffix()
        ));
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => {
                let sink = FileSink::new(f, compression)
                    .with_context(|| format!("starting {}", path.display()))?;
                return Ok((path, sink));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && *seq < 1_000_000 => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
    }
}

#[cfg(test)]
mod tests;
