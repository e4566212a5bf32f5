//! When a `/proc/vmallocinfo` dump was taken, estimated from the events around it.
//!
//! A dump taken "just before" `perf record` started is rarely just before the first event: the
//! tool starts, the workload may already run. Replay seeds its model from the dump and skips
//! the events before its time, so a dump placed too early or too late makes every address the
//! events touched in between look wrong.
//!
//! **The estimate.** Cut the events at position `p` (the dump taken after event `p − 1` and
//! before event `p`). At that cut each address the events touch is in a state: busy after an
//! allocation there, not busy after a free; before its first event, the opposite of what that
//! event does. The dump disagrees with a busy state when it does not list the address as busy,
//! and with a not-busy state when it lists it as busy. The estimate is the cut with the fewest
//! disagreements (the earliest, on a tie). Each address's state is constant between its
//! events, so every run between two of its events adds its disagreement to an interval of
//! cuts: a difference array over the events gives every cut's count in one pass.

use std::collections::HashMap;

use crate::trace::{AreaKind, VmallocArea};

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Busy,
    NotBusy,
}

/// Fed every vmalloc event of the first pass, in order.
pub struct DumpCut {
    busy: HashMap<u64, ()>,
    /// Per address: the index of its last event and the state that event left.
    last: HashMap<u64, (usize, State)>,
    /// `diff[i]` − `diff[i − 1]` of the disagreement count at cut `i`.
    diff: Vec<i64>,
    n: usize,
}

/// The chosen cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    /// Events before the dump.
    pub index: usize,
    /// Addresses whose state disagreed with the dump at that cut, and at the first event.
    pub disagreements: i64,
    pub at_start: i64,
}

impl DumpCut {
    pub fn new(areas: &[VmallocArea]) -> Self {
        let busy = areas
            .iter()
            .filter(|a| a.kind != AreaKind::Unpurged)
            .map(|a| (a.start.0, ()))
            .collect();
        DumpCut {
            busy,
            last: HashMap::new(),
            diff: Vec::new(),
            n: 0,
        }
    }

    fn disagrees(&self, addr: u64, s: State) -> bool {
        self.busy.contains_key(&addr) != (s == State::Busy)
    }

    /// Adds 1 to the disagreement of cuts `from..to` (`to` exclusive).
    fn add(&mut self, from: usize, to: usize) {
        if from >= to {
            return;
        }
        if self.diff.len() < to + 1 {
            self.diff.resize(to + 1, 0);
        }
        self.diff[from] += 1;
        self.diff[to] -= 1;
    }

    /// The next event: an allocation (`busy` true) or a free of the area at `addr`.
    pub fn event(&mut self, addr: u64, busy: bool) {
        let i = self.n;
        self.n += 1;
        let now = if busy { State::Busy } else { State::NotBusy };
        // The state up to this event: what the previous event left, or before the first one
        // the opposite of what this one does.
        let (from, before) = match self.last.get(&addr) {
            Some(&(j, s)) => (j + 1, s),
            None => (0, if busy { State::NotBusy } else { State::Busy }),
        };
        if self.disagrees(addr, before) {
            self.add(from, i + 1);
        }
        self.last.insert(addr, (i, now));
    }

    /// An event that names no area (a failed attempt, a purge): it only counts.
    pub fn other(&mut self) {
        self.n += 1;
    }

    /// Events seen so far.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The cut with the fewest disagreements, or the one given (`at`: events before the dump,
    /// when its time is known), with its count.
    pub fn cut(mut self, at: Option<usize>) -> Cut {
        let n = self.n;
        // After each address's last event, its state holds to the end.
        for (addr, (j, s)) in std::mem::take(&mut self.last) {
            if self.disagrees(addr, s) {
                self.add(j + 1, n + 1);
            }
        }
        self.diff.resize(n + 2, 0);
        let mut run = 0i64;
        let mut best = Cut {
            index: 0,
            disagreements: i64::MAX,
            at_start: 0,
        };
        for (i, d) in self.diff.iter().take(n + 1).enumerate() {
            run += d;
            if i == 0 {
                best.at_start = run;
            }
            let chosen = match at {
                Some(k) => i == k.min(n),
                None => run < best.disagreements,
            };
            if chosen {
                best.index = i;
                best.disagreements = run;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::KAddr;

    fn area(start: u64, kind: AreaKind) -> VmallocArea {
        VmallocArea {
            start: KAddr(start),
            end: KAddr(start + 0x2000),
            size: 0x2000,
            kind,
            caller: None,
            pages: None,
            phys: None,
            flags: Vec::new(),
        }
    }

    /// Events on three addresses; the dump was taken after the third event.
    #[test]
    fn the_cut_that_fits_the_dump_is_found() {
        // a: alloc(0), free(3); b: alloc(1); c: alloc(2), free(4).
        // At the cut after event 2 (index 3): a busy, b busy, c busy.
        let dump = [
            area(0xa000, AreaKind::Busy),
            area(0xb000, AreaKind::Busy),
            area(0xc000, AreaKind::Busy),
        ];
        let mut d = DumpCut::new(&dump);
        for (addr, busy) in [
            (0xa000, true),
            (0xb000, true),
            (0xc000, true),
            (0xa000, false),
            (0xc000, false),
        ] {
            d.event(addr, busy);
        }
        let cut = d.cut(None);
        assert_eq!(cut.index, 3);
        assert_eq!(cut.disagreements, 0);
        assert_eq!(cut.at_start, 3);
    }

    #[test]
    fn a_dump_before_every_event_stays_at_the_start() {
        // Nothing busy in the dump, and everything is allocated after it.
        let mut d = DumpCut::new(&[]);
        for a in [0x1000, 0x2000, 0x3000] {
            d.event(a, true);
        }
        let cut = d.cut(None);
        assert_eq!((cut.index, cut.disagreements), (0, 0));
    }

    #[test]
    fn an_area_the_dump_calls_lazy_is_not_busy() {
        // alloc then free of x; the dump lists it unpurged: any cut after the free fits.
        let mut d = DumpCut::new(&[area(0x5000, AreaKind::Unpurged)]);
        d.event(0x5000, true);
        d.event(0x5000, false);
        d.event(0x6000, true);
        let cut = d.cut(None);
        assert_eq!((cut.index, cut.disagreements), (0, 0));
        // Busy in the dump instead: only the cut between the alloc and the free fits.
        let mut d = DumpCut::new(&[area(0x5000, AreaKind::Busy)]);
        d.event(0x5000, true);
        d.event(0x5000, false);
        d.event(0x6000, true);
        let cut = d.cut(None);
        assert_eq!((cut.index, cut.disagreements), (1, 0));
    }

    #[test]
    fn a_given_cut_reports_its_own_disagreements() {
        let mut d = DumpCut::new(&[area(0x5000, AreaKind::Busy)]);
        d.event(0x5000, true);
        d.event(0x5000, false);
        // Before the allocation: x is not busy, the dump says busy.
        let cut = d.cut(Some(0));
        assert_eq!((cut.index, cut.disagreements, cut.at_start), (0, 1, 1));
    }
}
