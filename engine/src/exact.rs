//! Tier 1's front: the traces looked up lately, exactly as they were, with
//! what tier 1 gave them. A trace seen before (each op of Strict after its
//! first call, each flush of a loop in its steady state) is found by a hash
//! of its nodes and one comparison, without the copy and serialization that
//! its shape class costs.

use std::hash::{BuildHasher, Hash, Hasher};

use trace_ir::Trace;

use crate::lru::Lru;
use crate::pipeline::{Preparation, TierLimits};

/// Traces of one hash: different traces rarely share one, and a bucket
/// keeps the latest few.
const BUCKET: usize = 4;

pub(crate) struct ExactTraces<V> {
    map: Lru<(Preparation, u64), Vec<(Trace, V)>>,
    hasher: ahash::RandomState,
}

impl<V: Clone> ExactTraces<V> {
    /// Bounded as the tiers are.
    pub fn new(limits: TierLimits) -> Self {
        ExactTraces {
            map: Lru::new(limits.entries, limits.bytes),
            hasher: ahash::RandomState::with_seeds(1, 2, 3, 4),
        }
    }

    /// What `trace`, prepared `how`, was given before, if it was.
    pub fn get(&mut self, trace: &Trace, how: Preparation) -> Option<V> {
        let bucket = self.map.get(&(how, self.hash(trace)))?;
        bucket.iter().find(|(t, _)| t.identical(trace)).map(|(_, v)| v.clone())
    }

    pub fn insert(&mut self, trace: &Trace, how: Preparation, value: V) {
        let key = (how, self.hash(trace));
        let mut entry = Some((trace.clone(), value));
        let weigh = |bucket: &Vec<(Trace, V)>| bucket.iter().map(|(t, _)| weight(t)).sum();
        self.map.update(
            &key,
            |bucket| {
                if bucket.len() >= BUCKET {
                    bucket.remove(0);
                }
                bucket.extend(entry.take());
            },
            weigh,
        );
        if let Some(entry) = entry {
            let bucket = vec![entry];
            let bytes = weigh(&bucket);
            self.map.insert(key, bucket, bytes);
        }
    }

    /// A hash of the nodes' kinds, edges, shapes and dtypes: attributes
    /// that do not show in the shapes are left to the comparison.
    fn hash(&self, trace: &Trace) -> u64 {
        let mut h = self.hasher.build_hasher();
        for node in &trace.nodes {
            std::mem::discriminant(&node.op).hash(&mut h);
            node.inputs.hash(&mut h);
            node.meta.hash(&mut h);
        }
        trace.outputs.hash(&mut h);
        h.finish()
    }
}

/// What an entry holds, roughly: its nodes.
fn weight(trace: &Trace) -> u64 {
    (trace.len() * std::mem::size_of::<trace_ir::Node>()) as u64
}

#[cfg(test)]
mod tests {
    use trace_ir::shape::shape;
    use trace_ir::{BinaryOp, DType, Meta, Op, Trace};

    use super::*;

    /// `x + c` for a constant `c`, on `n` floats.
    fn add_constant(c: f64, n: usize) -> Trace {
        let mut t = Trace::new();
        let x = t.push_parameter(Meta::new(shape(&[n]), DType::F32));
        let c = t.push(Op::Full { value: c, shape: shape(&[n]), dtype: DType::F32 }, &[]).unwrap();
        let y = t.push(Op::Binary { kind: BinaryOp::Add }, &[x, c]).unwrap();
        t.outputs = vec![y];
        t
    }

    fn front() -> ExactTraces<&'static str> {
        ExactTraces::new(TierLimits::default())
    }

    #[test]
    fn a_trace_is_found_exactly_and_only_exactly() {
        let mut f = front();
        f.insert(&add_constant(2.0, 8), Preparation::Fused, "two");
        assert_eq!(f.get(&add_constant(2.0, 8), Preparation::Fused), Some("two"));
        // Another literal shares the hash and is told apart by comparison.
        assert_eq!(f.get(&add_constant(3.0, 8), Preparation::Fused), None);
        assert_eq!(f.get(&add_constant(2.0, 9), Preparation::Fused), None);
        assert_eq!(f.get(&add_constant(2.0, 8), Preparation::Unfused), None);
        f.insert(&add_constant(3.0, 8), Preparation::Fused, "three");
        assert_eq!(f.get(&add_constant(3.0, 8), Preparation::Fused), Some("three"));
        assert_eq!(f.get(&add_constant(2.0, 8), Preparation::Fused), Some("two"));
    }

    #[test]
    fn literals_compare_bit_for_bit() {
        // -0.0 == 0.0 and NaN != NaN as numbers; as programs, the first two
        // differ (1 / x) and a NaN constant is itself.
        assert!(!add_constant(-0.0, 4).identical(&add_constant(0.0, 4)));
        assert!(add_constant(f64::NAN, 4).identical(&add_constant(f64::NAN, 4)));
        let mut f = front();
        f.insert(&add_constant(0.0, 4), Preparation::Fused, "zero");
        assert_eq!(f.get(&add_constant(-0.0, 4), Preparation::Fused), None);
        f.insert(&add_constant(f64::NAN, 4), Preparation::Fused, "nan");
        assert_eq!(f.get(&add_constant(f64::NAN, 4), Preparation::Fused), Some("nan"));
    }

    #[test]
    fn a_bucket_keeps_the_latest_few_and_the_front_is_bounded() {
        let mut f = front();
        for c in 0..BUCKET + 1 {
            f.insert(&add_constant(c as f64, 8), Preparation::Fused, "c");
        }
        assert_eq!(f.get(&add_constant(0.0, 8), Preparation::Fused), None);
        assert!(f.get(&add_constant(BUCKET as f64, 8), Preparation::Fused).is_some());
        let mut f = ExactTraces::new(TierLimits { entries: 2, bytes: u64::MAX });
        for n in 2..6 {
            f.insert(&add_constant(1.0, n), Preparation::Fused, "n");
        }
        assert_eq!(f.map.len(), 2);
        assert!(f.get(&add_constant(1.0, 2), Preparation::Fused).is_none());
        assert!(f.get(&add_constant(1.0, 5), Preparation::Fused).is_some());
    }
}
