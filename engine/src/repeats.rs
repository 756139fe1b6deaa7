//! Where the DeferAndFuse op stream starts to repeat itself.
//!
//! A loop that never reads a value gives the engine one endless stream of
//! ops. Cut at a fixed count (the pending cap), the chunks drift against the
//! loop's iterations and every chunk is a new trace to rewrite and compile.
//! Cut where the stream repeats, the chunks fall on the same places in every
//! iteration, so from the second or third iteration on every flush hits the
//! cache.
//!
//! The rule, as TorchTPU's eager mode has it: every recorded op gets a cheap
//! hash of what it is (the op's name and its output's shape and dtype; not
//! its attributes' values, so a learning rate that changes each step does not
//! hide the repetition, and not its operands' node numbers, which shift as
//! parameters join the trace). The detector keeps the last [`HISTORY`]
//! hashes and cuts as soon as, for some period `p` in
//! [`MIN_PERIOD`]`..=`[`MAX_PERIOD`], the last `p` hashes equal the `p`
//! before them. Every flush, whatever caused it, starts a new pending trace
//! with a new detector, so the cuts depend only on the ops since the last
//! flush.
//!
//! The cost per op is one pass over the candidate periods (118 compares of
//! `u64`s), a few tens of nanoseconds.

use std::hash::{Hash, Hasher};

use trace_ir::{Meta, Op};

/// How many op hashes the detector keeps (a power of two).
pub const HISTORY: usize = 256;
/// The shortest period that counts: shorter runs (a chain of adds, the same
/// update on a few parameters of one shape) are fused better whole.
pub const MIN_PERIOD: usize = 11;
/// The longest period the history can show twice.
pub const MAX_PERIOD: usize = HISTORY / 2;

/// Allocates nothing until its first op: a Strict op group of one op, or a
/// flush of a few, pays nothing for it.
#[derive(Default)]
pub(crate) struct RepeatDetector {
    /// Ring buffer of the last hashes; `seen % HISTORY` is the next slot.
    history: Vec<u64>,
    /// Ops seen since the last reset.
    seen: usize,
    /// `runs[p]`: how many of the latest ops, in a row, equal the op `p`
    /// before them.
    runs: Vec<u32>,
}

impl RepeatDetector {
    /// Takes the next op's hash; true when the stream has just repeated a
    /// period, and so should be cut after this op.
    pub fn push(&mut self, hash: u64) -> bool {
        if self.history.is_empty() {
            self.history = vec![0; HISTORY];
            self.runs = vec![0; MAX_PERIOD + 1];
        }
        let now = self.seen;
        let mut repeated = false;
        for p in MIN_PERIOD..=MAX_PERIOD.min(now) {
            let before = self.history[(now - p) % HISTORY];
            let run = if before == hash { self.runs[p] + 1 } else { 0 };
            self.runs[p] = run;
            repeated |= run as usize >= p;
        }
        self.history[now % HISTORY] = hash;
        self.seen = now + 1;
        repeated
    }
}

/// The hash the detector compares: the op's name and the output's shape and
/// dtype.
pub(crate) fn op_hash(op: &Op, out: &Meta) -> u64 {
    let mut h = ahash::AHasher::default();
    op.name().hash(&mut h);
    out.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `ops` and returns the positions (1-based op counts since the
    /// last cut) at which the detector cut, resetting at each cut.
    fn cuts(ops: impl IntoIterator<Item = u64>) -> Vec<usize> {
        let mut d = RepeatDetector::default();
        let mut out = Vec::new();
        for h in ops {
            if d.push(h) {
                out.push(d.seen);
                d = RepeatDetector::default();
            }
        }
        out
    }

    #[test]
    fn a_body_repeated_is_cut_after_its_second_copy() {
        for period in [MIN_PERIOD, 37, MAX_PERIOD] {
            let body: Vec<u64> = (0..period as u64).map(|i| i * 7 + 1).collect();
            let stream = body.iter().copied().cycle().take(period * 9);
            // Two copies per chunk, every chunk alike: 9 copies give 4 cuts.
            assert_eq!(cuts(stream), vec![2 * period; 4], "period {period}");
        }
    }

    #[test]
    fn short_or_long_periods_and_non_repeating_streams_are_not_cut() {
        let short: Vec<u64> = (0..(MIN_PERIOD as u64 - 1)).collect();
        assert!(cuts(short.iter().copied().cycle().take(2 * (MIN_PERIOD - 1))).is_empty());
        assert!(cuts(0..10_000u64).is_empty());
        let long: Vec<u64> = (0..(MAX_PERIOD as u64 + 1)).collect();
        assert!(cuts(long.iter().copied().cycle().take(3 * (MAX_PERIOD + 1))).is_empty());
    }

    #[test]
    fn a_loop_entered_mid_stream_settles_on_one_chunk() {
        // A prologue, then a body of 50 ops forever: after the first cut the
        // chunks are whole, identical pairs of bodies.
        let prologue = 1000..1033u64;
        let body: Vec<u64> = (0..50).collect();
        let stream = prologue.chain(body.iter().copied().cycle().take(50 * 12));
        let c = cuts(stream);
        assert!(c.len() >= 4, "{c:?}");
        assert!(c[1..].iter().all(|&n| n == 100), "{c:?}");
    }

    #[test]
    fn a_run_of_one_op_is_cut_at_twice_the_shortest_period() {
        assert_eq!(
            cuts(std::iter::repeat_n(5u64, 100)),
            vec![2 * MIN_PERIOD; 100 / (2 * MIN_PERIOD)]
        );
    }
}
