//! Pieces of the live pipeline shared by `vmtrace top`, `vmtrace record` and `vmtrace serve`:
//! turning ring-buffer items into trace records with contention stacks resolved to lock classes,
//! exactly as `vmtrace record` writes them, so every consumer counts the same events the same
//! way.

use std::collections::HashMap;

use crate::probe::contention::Classifier;
use crate::probe::{decode, LoadedProbes};
use crate::trace::Record;

/// Decodes everything in the ring buffer and hands each record to `push`, resolving contention
/// stacks (cached by stack id: the stack map is read once per distinct stack) to lock classes.
/// Returns how many ring records could not be decoded (`record` counts them in the footer).
pub fn drain(
    ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
    probes: &LoadedProbes,
    classifier: &mut Classifier,
    stacks: &mut HashMap<i64, Vec<String>>,
    push: impl FnMut(Record),
) -> u64 {
    drain_at_most(ring, probes, classifier, stacks, usize::MAX, push).1
}

/// [`drain`], stopping after `max` ring records, so a reader that holds what it drains can bound
/// what it holds: the rest waits in the ring buffer, whose memory is already paid for. Returns
/// the records taken (decodable or not) and how many of them could not be decoded.
pub fn drain_at_most(
    ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
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
            let r = classifier.classify(&c.stack, c.lock.0, c.flags);
            c.class = r.class;
            c.node = r.node;
        }
        push(rec);
    }
    (taken, undecodable)
}
