//! Observed-timing replay fed one record at a time, as records arrive: the model panel of
//! `vmtrace top`, live or replaying.
//!
//! [`super::replay`] pulls records from a reader and reads ahead of the one it replays; a live
//! stream cannot be pulled from. Here the records are pushed, the causal replay (the strict
//! figures) takes each at once, since it reads nothing ahead, and the explained replay takes a
//! record once the records after it cover the same window the reader would have read
//! ([`Ahead::pop_ready`]). The figures therefore lag the stream by that window (200 ms of trace
//! time, or [`lookahead::MAX_RECORDS`] records), and, fed a whole trace, come out exactly as
//! `vmtrace replay` gives them (tested).

use std::collections::VecDeque;

use super::lookahead::{self, Ahead, Blind};
use super::{
    params_for, Agreement, Divergence, Model, ReplayError, ReplayOptions, Replayer, Report, Strict,
};
use crate::model::SlotCounts;
use crate::trace::{Header, Record, VmallocSnapshot};

/// Divergences the live view keeps, newest last.
pub const RECENT_DIVERGENCES: usize = 5;

/// The model fed as records arrive.
pub struct LiveReplay<'o> {
    causal: Replayer<'o>,
    explained: Option<Replayer<'o>>,
    ahead: Ahead,
    /// Line the next record stands for: a live stream has no file, so records are numbered as
    /// a recording of it would number them (header 1, snapshot 2).
    next_line: usize,
    fed: u64,
}

/// What the live view shows, taken without stopping the replay.
#[derive(Clone, Debug)]
pub struct LiveFigures {
    pub strict: Strict,
    /// The explained figures, from the replay that reads ahead (absent with `opts.causal`).
    pub explained: Option<Explained>,
    /// Trace time of the purge that ended the warm-up, and of the newest record replayed.
    pub warmup_ts: Option<u64>,
    pub warmup_line: Option<usize>,
    pub last_ts: u64,
    /// The newest divergences, newest last.
    pub recent: Vec<Divergence>,
    pub pooled_objects: u64,
    pub lazy_pages: u64,
    pub predicted_slots: SlotCounts,
    pub observed_slots: SlotCounts,
    pub predicted_high_water: u64,
    pub observed_high_water: u64,
    /// Records taken in, and those of them still held for the explained replay's read-ahead.
    pub fed: u64,
    pub held: usize,
}

/// The explained agreements (docs/model.md, "Strict and explained figures").
#[derive(Clone, Copy, Debug)]
pub struct Explained {
    pub placement: Agreement,
    pub placement_after_warmup: Agreement,
    pub nr_lazy: Agreement,
    pub npurged: Agreement,
}

impl<'o> LiveReplay<'o> {
    /// A replay of the stream that starts at `snapshot`, for the kernel `header` describes.
    pub fn new(
        header: &Header,
        snapshot: &VmallocSnapshot,
        opts: &'o ReplayOptions,
    ) -> Result<Self, ReplayError> {
        let params = params_for(header, snapshot, opts)?;
        let mut causal = Replayer::new(Model::new(params.clone())?, opts);
        causal.causal = true;
        causal.rules.node_counts.recorded = super::infer::node_counts::decays_recorded(header);
        causal.seed(snapshot);
        let explained = if opts.causal {
            None
        } else {
            let mut r = Replayer::new(Model::new(params)?, opts);
            r.seed(snapshot);
            Some(r)
        };
        Ok(Self {
            causal,
            explained,
            ahead: Ahead::new(lookahead::WINDOW_NS, lookahead::MAX_RECORDS),
            next_line: 3,
            fed: 0,
        })
    }

    /// Takes the next record of the stream, in time order.
    pub fn push(&mut self, rec: Record) -> Result<(), ReplayError> {
        let line = self.next_line;
        self.push_at(line, rec)
    }

    /// [`LiveReplay::push`] for a record read from `line` of a file.
    pub(crate) fn push_at(&mut self, line: usize, rec: Record) -> Result<(), ReplayError> {
        self.next_line = line + 1;
        self.fed += 1;
        self.causal.line = line;
        self.causal.event(&rec, &Blind)?;
        if self.explained.is_some() {
            self.ahead.push(line, Ok(rec));
        }
        self.release(false)
    }

    /// Replays what the read-ahead can release; everything when `at_end`.
    fn release(&mut self, at_end: bool) -> Result<(), ReplayError> {
        let Some(r) = self.explained.as_mut() else {
            return Ok(());
        };
        while let Some(rec) = self.ahead.pop_ready(at_end) {
            r.line = self.ahead.line();
            r.event(&rec?, &self.ahead)?;
        }
        Ok(())
    }

    /// The stream ended: replays the records held for read-ahead, so that the figures are
    /// `vmtrace replay`'s for the whole stream.
    pub fn flush(&mut self) -> Result<(), ReplayError> {
        self.release(true)
    }

    /// Ends the stream: the held records are replayed, and the report is `vmtrace replay`'s
    /// for the same records.
    pub fn finish(mut self) -> Result<Report, ReplayError> {
        self.release(true)?;
        let lines = self.next_line - 1;
        self.causal.tally.lines = lines;
        let strict = self.causal.strict();
        let mut report = match self.explained {
            Some(mut r) => {
                r.tally.lines = lines;
                r.finish()
            }
            None => self.causal.finish(),
        };
        report.strict = strict;
        Ok(report)
    }

    pub fn figures(&self) -> LiveFigures {
        // The model state shown is the explained replay's, as `vmtrace replay` reports it.
        let shown = self.explained.as_ref().unwrap_or(&self.causal);
        LiveFigures {
            strict: self.causal.strict(),
            explained: self.explained.as_ref().map(|r| Explained {
                placement: r.score.placement,
                placement_after_warmup: r.score.placement_warm,
                nr_lazy: r.score.nr_lazy,
                npurged: r.score.npurged,
            }),
            warmup_ts: shown.score.warmup_ts,
            warmup_line: shown.score.warmup_line,
            last_ts: self.causal.last_ts,
            recent: shown.score.recent.iter().cloned().collect(),
            pooled_objects: shown.model.pools().objects(),
            lazy_pages: shown.model.lazy_pages(),
            predicted_slots: shown.score.pred_slots.counts(),
            observed_slots: shown.score.obs_slots.counts(),
            predicted_high_water: shown.score.pred_high,
            observed_high_water: shown.score.obs_high,
            fed: self.fed,
            held: self.ahead.len(),
        }
    }
}

/// Keeps `recent` at [`RECENT_DIVERGENCES`], dropping the oldest.
pub(super) fn remember(recent: &mut VecDeque<Divergence>, d: &Divergence) {
    if recent.len() >= RECENT_DIVERGENCES {
        recent.pop_front();
    }
    recent.push_back(d.clone());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceReader;

    /// A synthetic trace with purges, so that both replays warm up and diverge somewhere.
    fn trace() -> Vec<u8> {
        let p = crate::synth::SynthParams {
            mask: 7,
            threads: 4,
            cpus: 4,
            loops: 30,
            ..crate::synth::SynthParams::default()
        };
        let mut out = Vec::new();
        crate::synth::generate(&p, vec!["t".into()], &mut out).expect("synth");
        out
    }

    fn live_report(bytes: &[u8], opts: &ReplayOptions) -> (Report, Vec<LiveFigures>) {
        let mut reader = TraceReader::new(bytes);
        let header = reader.read_header().expect("header");
        let Some(Ok(Record::Vmallocinfo(snap))) = reader.next() else {
            panic!("no snapshot")
        };
        let mut live = LiveReplay::new(&header, &snap, opts).expect("live");
        let mut seen = Vec::new();
        while let Some(rec) = reader.next() {
            live.push_at(reader.line(), rec.expect("record"))
                .expect("push");
            if live.fed.is_multiple_of(5000) {
                seen.push(live.figures());
            }
        }
        (live.finish().expect("finish"), seen)
    }

    #[test]
    fn fed_a_whole_trace_it_reports_what_replay_reports() {
        let bytes = trace();
        for causal in [false, true] {
            let opts = ReplayOptions {
                causal,
                lazy_max_pages: Some(512),
                ..ReplayOptions::default()
            };
            let batch = super::super::replay(&bytes[..], &opts).expect("replay");
            let (live, seen) = live_report(&bytes, &opts);
            assert!(!batch.purges.is_empty(), "the trace must purge");
            assert_eq!(
                serde_json::to_value(&live).unwrap(),
                serde_json::to_value(&batch).unwrap(),
                "causal {causal}"
            );
            assert!(seen.len() > 3);
        }
    }

    #[test]
    fn the_figures_move_as_records_arrive_and_the_explained_side_lags() {
        let bytes = trace();
        let opts = ReplayOptions {
            lazy_max_pages: Some(512),
            ..ReplayOptions::default()
        };
        let (report, seen) = live_report(&bytes, &opts);
        let compared: Vec<u64> = seen.iter().map(|f| f.strict.placement.compared).collect();
        assert!(
            compared.windows(2).all(|w| w[0] <= w[1]) && compared[0] < compared[compared.len() - 1],
            "strict placement counts grow: {compared:?}"
        );
        for f in &seen {
            let e = f.explained.expect("explained replay");
            // The explained replay waits for its read-ahead: never ahead of the causal one.
            assert!(e.placement.compared <= f.strict.placement.compared);
            assert!(f.recent.len() <= RECENT_DIVERGENCES);
            assert!(f.held > 0 && f.held <= lookahead::MAX_RECORDS);
        }
        let last = seen.last().unwrap();
        assert!(last.warmup_ts.is_some(), "warmed up by the last look");
        assert_eq!(report.warmup_line, seen.last().unwrap().warmup_line);
    }
}
