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
//! before them, unless those `2p` ops repeat a shorter period still (a run
//! of one op, the same few-op update over many parameters): such runs are
//! fused better whole, and the pending cap cuts them if they go on. Every
//! flush, whatever caused it, starts a new pending trace with a new
//! detector, so the cuts depend only on the ops since the last flush.
//!
//! The cost per op is one pass over the periods up to [`MAX_PERIOD`] (128
//! compares of 32-bit lanes, eight to a vector), a few tens of nanoseconds.
//! The history keeps 32 bits of each op's hash: two different ops that
//! agree on those bits could only move a cut, and only if a whole period
//! of them agreed.

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
    history: Vec<u32>,
    /// Ops seen since the last reset.
    seen: usize,
    /// `runs[p - 1]`: how many of the latest ops, in a row, equal the op
    /// `p` before them (at most the ops of one pending trace).
    runs: Vec<u32>,
}

impl RepeatDetector {
    /// This detector as a new one, keeping its allocations (a flush every
    /// few tens of ops would otherwise allocate and clear them each time).
    /// The history needs no clearing: only slots written since are read;
    /// nor do the runs past the `seen` first, which no push has reached
    /// (a Strict op group of one op clears one).
    pub fn restarted(mut self) -> Self {
        let touched = self.seen.min(self.runs.len());
        self.runs[..touched].fill(0);
        self.seen = 0;
        self
    }

    /// Takes the next op's hash; true when the stream has just repeated a
    /// period, and so should be cut after this op.
    pub fn push(&mut self, hash: u64) -> bool {
        let hash = (hash ^ (hash >> 32)) as u32;
        if self.history.is_empty() {
            self.history = vec![0; 2 * HISTORY];
            self.runs = vec![0; MAX_PERIOD];
        }
        let now = self.seen;
        let limit = MAX_PERIOD.min(now);
        // The history runs backwards and is kept twice over, so that the hash
        // `p` ops back is `window[p - 1]` for every p: one branch-free pass
        // over equal-width arrays, which compiles to vector code.
        let at = HISTORY - 1 - now % HISTORY;
        let window = &self.history[at + 1..at + 1 + limit];
        let (short_run, repeat) = scan(&mut self.runs[..limit], window, hash);
        self.history[at] = hash;
        self.history[at + HISTORY] = hash;
        self.seen = now + 1;
        // A repetition inside a short-period run is that run, not a loop body.
        repeat > short_run
    }
}

/// Updates the runs of every period for the next op, `hash`; returns the
/// longest run of latest ops with a period under MIN_PERIOD, and the longest
/// repetition of a period of at least MIN_PERIOD. With AVX-512 or AVX2
/// (detected at run time, as the kernels do) the pass is vector code.
fn scan(runs: &mut [u32], window: &[u32], hash: u32) -> (u32, u32) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static LEVEL: OnceLock<u8> = OnceLock::new();
        let level = *LEVEL.get_or_init(|| {
            if is_x86_feature_detected!("avx512f") {
                2
            } else {
                u8::from(is_x86_feature_detected!("avx2"))
            }
        });
        match level {
            // SAFETY: the CPU has AVX-512F, checked above.
            2 => return unsafe { scan_avx512(runs, window, hash) },
            // SAFETY: the CPU has AVX2, checked above.
            1 => return unsafe { scan_avx2(runs, window, hash) },
            _ => {}
        }
    }
    scan_body(runs, window, hash)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scan_avx2(runs: &mut [u32], window: &[u32], hash: u32) -> (u32, u32) {
    scan_body(runs, window, hash)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scan_avx512(runs: &mut [u32], window: &[u32], hash: u32) -> (u32, u32) {
    scan_body(runs, window, hash)
}

#[inline(always)]
fn scan_body(runs: &mut [u32], window: &[u32], hash: u32) -> (u32, u32) {
    let (mut short_run, mut repeat) = (0u32, 0u32);
    for (i, (run, &before)) in runs.iter_mut().zip(window).enumerate() {
        let p = i as u32 + 1;
        let r = if before == hash { *run + 1 } else { 0 };
        *run = r;
        short_run = short_run.max(if p < MIN_PERIOD as u32 { r + p } else { 0 });
        repeat = repeat.max(if p >= MIN_PERIOD as u32 && r >= p { 2 * p } else { 0 });
    }
    (short_run, repeat)
}

thread_local! {
    /// The DeferAndFuse op groups open on this thread: (context, depth, hash
    /// of the primitives recorded in the group so far).
    static UNITS: std::cell::RefCell<Vec<(usize, u32, Option<u64>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// In DeferAndFuse an op group is one unit for the detector: its primitives
/// are folded into one hash, pushed when the group ends, so that the stream
/// is only ever cut between user-level ops. A LayerNorm or an optimizer's
/// `_foreach_` update over every parameter (whose second layer's parameters
/// repeat the first's shapes) then stays in one trace and fuses whole.
pub(crate) mod unit {
    use super::UNITS;

    /// Opens a unit of `owner` on this thread, or joins the one open.
    pub fn begin(owner: usize) {
        UNITS.with_borrow_mut(|units| match units.iter_mut().find(|u| u.0 == owner) {
            Some(u) => u.1 += 1,
            None => units.push((owner, 1, None)),
        })
    }

    /// Folds `hash` into `owner`'s open unit; false when none is open.
    pub fn fold(owner: usize, hash: u64) -> bool {
        UNITS.with_borrow_mut(|units| match units.iter_mut().find(|u| u.0 == owner) {
            Some(u) => {
                let acc = u.2.map_or(hash, |acc| (acc.rotate_left(7) ^ hash).wrapping_mul(FOLD));
                u.2 = Some(acc);
                true
            }
            None => false,
        })
    }

    /// Closes one level of `owner`'s unit; at the outermost, the hash of
    /// what it recorded (none when it recorded nothing).
    pub fn end(owner: usize) -> Option<u64> {
        UNITS.with_borrow_mut(|units| {
            let at = units.iter().position(|u| u.0 == owner)?;
            units[at].1 -= 1;
            if units[at].1 > 0 {
                return None;
            }
            units.swap_remove(at).2
        })
    }

    /// An odd 64-bit multiplier (FNV's prime) that spreads the folded bits.
    const FOLD: u64 = 0x0000_0100_0000_01b3;
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
                d = d.restarted();
            }
        }
        out
    }

    #[test]
    fn the_vector_pass_equals_the_plain_one() {
        // Whatever `scan` picks on this CPU gives the plain loop's answers.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 3) as u32
        };
        let window: Vec<u32> = (0..MAX_PERIOD).map(|_| next()).collect();
        let mut a: Vec<u32> = (0..MAX_PERIOD).map(|_| next() * 20).collect();
        let mut b = a.clone();
        for _ in 0..50 {
            let hash = next();
            assert_eq!(scan(&mut a, &window, hash), scan_body(&mut b, &window, hash));
            assert_eq!(a, b);
        }
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
    fn runs_of_a_short_period_are_fused_whole() {
        assert!(cuts(std::iter::repeat_n(5u64, 1000)).is_empty());
        let update = [1u64, 2, 3, 4, 5];
        assert!(cuts(update.iter().copied().cycle().take(1000)).is_empty());
    }

    #[test]
    fn a_body_of_one_op_repeated_then_another_is_still_a_loop_body() {
        // 11 identical ops and a different one: the period is 12.
        let body: Vec<u64> = std::iter::repeat_n(5u64, 11).chain([9]).collect();
        let stream = body.iter().copied().cycle().take(12 * 6);
        assert_eq!(cuts(stream), vec![24; 3]);
    }
}
