//! Running a loop's read values ahead of the read.
//!
//! A training loop that reads its loss every step records the forward, the
//! backward and the update, then reads the loss. Flushed at the read, the
//! forward runs while the caller waits, and nothing runs while it records.
//! But the loss is recorded at the same place in every step: remembered
//! there, the next step's ops up to it can be flushed as soon as they are
//! recorded, asynchronously. The forward then runs on the stream while the
//! backward and the update are recorded, and the read waits for what is left
//! of it, if anything.
//!
//! The rule: the stream is counted in units (an op group, or one op outside
//! any: what the repeat detector sees), and each unit's hash folded into a
//! running hash of the trace so far. A read of a value still pending
//! remembers its *read point*: how many units the trace held once the value's
//! unit ended, and the running hash there, if the trace went on past that
//! unit before the read (else nothing would be recorded while it ran
//! ahead). When a later trace reaches a read
//! point with the same hash (the same units, in the same order, since its
//! flush), it is flushed there, asynchronously. The next read ends the trace
//! as a read does (`Shared::materialize`), so every step's traces start at
//! the same place and hit the cache. [`POINTS`] read points are kept, the
//! latest learned, so a step that reads two values keeps both.

use smallvec::SmallVec;
use trace_ir::NodeId;

/// How many read points are remembered.
pub const POINTS: usize = 4;

/// Where the pending trace is, in units, and where values were read before.
#[derive(Default)]
pub(crate) struct ReadAhead {
    /// Units recorded into this trace so far.
    units: u32,
    /// `prefixes[i]`: the hash of the first `i + 1` units.
    prefixes: Vec<u64>,
    /// `unit_of[node]`: the units completed before `node` was recorded.
    unit_of: Vec<u32>,
    /// Read points learned: (units, hash of those units), oldest first.
    points: SmallVec<[(u32, u64); POINTS]>,
}

impl ReadAhead {
    /// This state for a new trace: its position starts over, its read
    /// points stay.
    pub fn restarted(mut self) -> Self {
        self.units = 0;
        self.prefixes.clear();
        self.unit_of.clear();
        self
    }

    /// `node` (and any parameter before it) was just recorded.
    pub fn recorded(&mut self, node: NodeId) {
        self.unit_of.resize(node + 1, self.units);
    }

    /// A unit ending with `hash`; true when the trace has reached a read
    /// point and should be flushed ahead of the read.
    pub fn end_unit(&mut self, hash: u64) -> bool {
        let before = self.prefixes.last().copied().unwrap_or(0);
        let prefix = (before.rotate_left(7) ^ hash).wrapping_mul(FOLD);
        self.prefixes.push(prefix);
        self.units += 1;
        self.points.contains(&(self.units, prefix))
    }

    /// `node`, still pending, is read: remember where its unit ended, if
    /// the trace went on past it. A value read right after its unit gains
    /// nothing from running ahead (nothing is left to record meanwhile),
    /// and a node of a unit still open (a read inside an op group) has no
    /// read point.
    pub fn learn(&mut self, node: NodeId) {
        let Some(&before) = self.unit_of.get(node) else { return };
        if before + 1 >= self.units {
            return;
        }
        let prefix = self.prefixes[before as usize];
        let point = (before + 1, prefix);
        if self.points.contains(&point) {
            return;
        }
        if self.points.len() == POINTS {
            self.points.remove(0);
        }
        self.points.push(point);
    }
}

/// An odd 64-bit multiplier (FNV's prime) that spreads the folded bits.
const FOLD: u64 = 0x0000_0100_0000_01b3;

#[cfg(test)]
mod tests {
    use super::*;

    /// Records `units` (each one node), reads the node of unit `read`
    /// (0-based) and returns where the next trace of the same units is cut.
    fn cut_after(units: &[u64], read: usize) -> Vec<usize> {
        let mut r = ReadAhead::default();
        for (node, &h) in units.iter().enumerate() {
            r.recorded(node);
            assert!(!r.end_unit(h));
        }
        r.learn(read);
        let mut r = r.restarted();
        let mut cuts = Vec::new();
        for (node, &h) in units.iter().enumerate() {
            r.recorded(node);
            if r.end_unit(h) {
                cuts.push(node + 1);
            }
        }
        cuts
    }

    #[test]
    fn the_next_trace_is_cut_where_the_read_value_was_recorded() {
        let step: Vec<u64> = (0..40).collect();
        assert_eq!(cut_after(&step, 12), vec![13]);
        assert_eq!(cut_after(&step, 38), vec![39]);
    }

    #[test]
    fn a_value_read_right_after_its_unit_learns_nothing() {
        let step: Vec<u64> = (0..40).collect();
        assert_eq!(cut_after(&step, 39), Vec::<usize>::new());
    }

    #[test]
    fn a_trace_that_differs_before_the_point_is_not_cut() {
        let mut r = ReadAhead::default();
        for (node, h) in [1u64, 2, 3].into_iter().enumerate() {
            r.recorded(node);
            r.end_unit(h);
        }
        r.learn(1);
        assert_eq!(r.points.len(), 1);
        let mut r = r.restarted();
        let cut: Vec<bool> = [5u64, 2, 3]
            .iter()
            .enumerate()
            .map(|(n, &h)| {
                r.recorded(n);
                r.end_unit(h)
            })
            .collect();
        assert_eq!(cut, vec![false; 3]);
    }

    #[test]
    fn a_read_inside_an_open_unit_learns_nothing() {
        let mut r = ReadAhead::default();
        r.recorded(0);
        r.end_unit(7);
        r.recorded(1); // its unit has not ended
        r.learn(1);
        assert!(r.points.is_empty());
    }

    #[test]
    fn the_latest_read_points_are_kept() {
        let mut r = ReadAhead::default();
        for node in 0..10 {
            r.recorded(node);
            r.end_unit(node as u64);
        }
        for node in 0..9 {
            r.learn(node);
            r.learn(node);
        }
        let kept: Vec<u32> = r.points.iter().map(|p| p.0).collect();
        assert_eq!(kept, vec![6, 7, 8, 9]);
    }
}
