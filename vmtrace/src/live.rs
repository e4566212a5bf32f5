//! Pieces of the live pipeline shared by `vmtrace top`, `vmtrace record` and `vmtrace serve`:
//! turning ring-buffer items into trace records with contention stacks resolved to lock classes,
//! exactly as `vmtrace record` writes them, so every consumer counts the same events the same
//! way.

use std::collections::HashMap;
use std::task::Poll;

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use crate::probe::contention::Classifier;
use crate::probe::{decode, LoadedProbes};
use crate::trace::Record;

/// The probes' event rings (one per CPU, see `vmtrace_common::RINGS`), each registered with
/// the async runtime, so a reader wakes when any of them asks for it.
pub struct EventRings {
    rings: Vec<AsyncFd<RingBuf<MapData>>>,
}

impl EventRings {
    /// Takes the rings from `probes` and registers them; needs a running tokio runtime.
    pub fn take(probes: &mut LoadedProbes) -> anyhow::Result<Self> {
        let rings = probes.take_rings()?;
        let rings = rings
            .into_iter()
            .map(|r| {
                // SAFETY: the RingBuf owns its map fd and borrows nothing; the AsyncFd owns it.
                unsafe { AsyncFd::register_with_interest(r, tokio::io::Interest::READABLE) }
                    .map_err(|e| e.into_parts().1)
            })
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| anyhow::anyhow!("polling the ring buffers: {e}"))?;
        Ok(EventRings { rings })
    }

    /// Waits until at least one ring woke its reader, and clears that readiness; the caller then
    /// drains every ring. Cancel-safe, so it can sit in a `select!` beside timers.
    pub async fn readable(&mut self) -> std::io::Result<()> {
        std::future::poll_fn(|cx| {
            let mut woke = false;
            for fd in &mut self.rings {
                match fd.poll_read_ready_mut(cx) {
                    Poll::Ready(Ok(mut guard)) => {
                        guard.clear_ready();
                        woke = true;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {}
                }
            }
            if woke {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        })
        .await
    }

    pub fn len(&self) -> usize {
        self.rings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rings.is_empty()
    }

    /// Ring `i` (`i < len()`).
    pub fn ring(&mut self, i: usize) -> &mut RingBuf<MapData> {
        self.rings[i].get_mut()
    }
}

/// Takes the next item of ring `i`, for [`crate::record::Reorder::merge_from`]: `None` when
/// the ring is empty, `Some(None)` for a record that could not be decoded.
pub fn pull_one(
    rings: &mut EventRings,
    i: usize,
    probes: &LoadedProbes,
    classifier: &mut Classifier,
    stacks: &mut HashMap<i64, Vec<String>>,
) -> Option<Option<Record>> {
    let mut head = None;
    let (taken, _) = drain_ring(rings.ring(i), probes, classifier, stacks, 1, |r| {
        head = Some(r)
    });
    (taken > 0).then_some(head)
}

/// Tells the classifier and the probe the vmap lock addresses known without a wait. Once per
/// drain, not per record: [`pull_one`] runs for every record.
pub fn know_static_locks(probes: &LoadedProbes, classifier: &mut Classifier) {
    for &(lock, class) in probes.static_locks() {
        if classifier.know(lock, class) {
            probes.mark_known_lock(lock, class);
        }
    }
}

/// The kernel symbol at `addr`, or the address when there is no symbol table.
fn function_name(probes: &LoadedProbes, addr: u64) -> String {
    probes
        .ksyms
        .as_ref()
        .and_then(|k| k.resolve(addr))
        .map(|(s, _)| s.name.clone())
        .unwrap_or_else(|| format!("{addr:#x}"))
}

/// Drains one ring, stopping after `max` ring records, so a reader that holds what it drains
/// can bound what it holds: the rest waits in the ring buffer, whose memory is already paid
/// for. Returns the records taken (decodable or not) and how many of them could not be decoded.
pub fn drain_at_most(
    ring: &mut RingBuf<MapData>,
    probes: &LoadedProbes,
    classifier: &mut Classifier,
    stacks: &mut HashMap<i64, Vec<String>>,
    max: usize,
    push: impl FnMut(Record),
) -> (usize, u64) {
    know_static_locks(probes, classifier);
    drain_ring(ring, probes, classifier, stacks, max, push)
}

/// [`drain_at_most`] without the static locks, which the caller has made known.
fn drain_ring(
    ring: &mut RingBuf<MapData>,
    probes: &LoadedProbes,
    classifier: &mut Classifier,
    stacks: &mut HashMap<i64, Vec<String>>,
    max: usize,
    mut push: impl FnMut(Record),
) -> (usize, u64) {
    let mut taken = 0;
    let mut undecodable = 0;
    while taken < max {
        let Some(item) = ring.next() else {
            break;
        };
        taken += 1;
        let Some(mut rec) = decode(&item) else {
            undecodable += 1;
            continue;
        };
        if let Record::Contention(c) = &mut rec {
            if c.stack_id >= 0 {
                c.stack = stacks
                    .entry(c.stack_id)
                    .or_insert_with(|| probes.stack_frames(c.stack_id).unwrap_or_default())
                    .clone();
            }
            let r = classifier.classify_wait(c.stack_id, &c.stack, c.lock.0, c.flags);
            c.class = r.class;
            c.node = r.node;
            for (lock, class) in classifier.take_newly_known() {
                probes.mark_known_lock(lock, class);
            }
        }
        // Work records carry the function's address; replay finds the drain item by its name,
        // so every reader of the rings (record, serve, top) gets the name here.
        if let Record::Work(w) = &mut rec {
            w.function = function_name(probes, w.function_addr.0);
            // A decay record's `work` is the node itself: its locks are known from now on,
            // so the hold probe times them without waiting for classified waits.
            if w.function == crate::probe::ladder::DECAY_FUNCTION {
                for (lock, class) in probes.node_locks(w.work.0) {
                    if classifier.know(lock, class) {
                        probes.mark_known_lock(lock, class);
                    }
                }
            }
        } else if let Record::WorkStart(w) = &mut rec {
            w.function = function_name(probes, w.function_addr.0);
        }
        push(rec);
    }
    (taken, undecodable)
}
