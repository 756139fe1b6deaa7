//! Builds random valid traces from a stream of bytes. One generator serves the
//! property tests (which feed it random bytes) and the fuzz targets (which feed
//! it the fuzzer's input), so a failure found by either replays in both.
//!
//! The generator covers what fusion must get right: elementwise chains with
//! broadcasting, casts through bf16/f16, reductions over every axis with and
//! without keepdim, matmuls (with transposes), views (permute, slice,
//! reshape, expand), concat, and the fused forms.

use crate::shape::shape;
use crate::{ArgReduceOp, Axes, BinaryOp, DType, Meta, NodeId, Op, ReduceOp, Trace, UnaryOp};

/// Reads choices from bytes; when they run out every choice is 0, so any
/// input (even empty) yields a trace.
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data, pos: 0 }
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        let b = self.data.get(self.pos).copied().unwrap_or(0) as usize;
        self.pos += 1;
        b % n.max(1)
    }

    pub fn exhausted(&self) -> bool {
        self.pos >= self.data.len()
    }
}

/// The generated trace and the shapes/dtypes of its parameters (the caller
/// makes random data for them).
pub struct Generated {
    pub trace: Trace,
    pub params: Vec<Meta>,
}

const DIMS: [usize; 4] = [1, 3, 4, 8];
const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// Generates a trace of at most `max_ops` ops (plus parameters). Every value
/// left without a consumer becomes an output.
pub fn random_trace(bytes: &mut Bytes, max_ops: usize) -> Generated {
    let mut trace = Trace::new();
    let mut params = Vec::new();
    // A few parameters sharing dimensions, so broadcasting and matmul happen.
    let base = [DIMS[1 + bytes.below(3)], DIMS[1 + bytes.below(3)], DIMS[1 + bytes.below(3)]];
    for _ in 0..2 + bytes.below(3) {
        let rank = 1 + bytes.below(3);
        let dims: Vec<usize> =
            (0..rank).map(|i| if bytes.below(5) == 0 { 1 } else { base[3 - rank + i] }).collect();
        let dtype = if bytes.below(4) == 0 { FLOATS[1 + bytes.below(2)] } else { DType::F32 };
        let meta = Meta::new(shape(&dims), dtype);
        params.push(meta.clone());
        trace.push_parameter(meta);
    }
    let mut ops = 0;
    while ops < max_ops && !bytes.exhausted() {
        let n = trace.len();
        let a = n - 1 - bytes.below(n.min(4));
        let b = bytes.below(n);
        if let Some(op_inputs) = pick(bytes, &trace, a, b) {
            let (op, inputs) = op_inputs;
            if trace.push(op, &inputs).is_ok() {
                ops += 1;
            }
        }
    }
    let uses = trace.use_counts();
    trace.outputs = (0..trace.len())
        .filter(|&i| uses[i] == 0 && !matches!(trace.nodes[i].op, Op::Parameter { .. }))
        .collect();
    if trace.outputs.is_empty() {
        trace.outputs.push(trace.len() - 1);
    }
    Generated { trace, params }
}

/// Chooses an op for inputs `a` (recent) and `b` (any); `None` when the
/// choice does not apply. Invalid combinations are filtered by `Trace::push`.
fn pick(bytes: &mut Bytes, trace: &Trace, a: NodeId, b: NodeId) -> Option<(Op, Vec<NodeId>)> {
    let ma = trace.meta(a);
    let rank = ma.shape.len();
    let float = |m: &Meta| m.dtype.is_float();
    let axis = |bytes: &mut Bytes| bytes.below(rank.max(1));
    Some(match bytes.below(14) {
        0..=2 => {
            let kinds = [
                UnaryOp::Neg,
                UnaryOp::Abs,
                UnaryOp::Exp,
                UnaryOp::Log,
                UnaryOp::Sqrt,
                UnaryOp::Rsqrt,
                UnaryOp::Reciprocal,
                UnaryOp::Tanh,
                UnaryOp::Sigmoid,
                UnaryOp::Relu,
                UnaryOp::GeluErf,
                UnaryOp::GeluTanh,
                UnaryOp::Silu,
                UnaryOp::Sin,
                UnaryOp::Cos,
                UnaryOp::Floor,
                UnaryOp::Sign,
            ];
            (Op::Unary { kind: kinds[bytes.below(kinds.len())] }, vec![a])
        }
        3..=5 => {
            let kinds = [
                BinaryOp::Add,
                BinaryOp::Sub,
                BinaryOp::Mul,
                BinaryOp::Div,
                BinaryOp::Maximum,
                BinaryOp::Minimum,
                BinaryOp::Pow,
                BinaryOp::Lt,
                BinaryOp::Ge,
                BinaryOp::Eq,
            ];
            let b = if trace.meta(b).dtype == ma.dtype {
                b
            } else {
                return cast_to(trace, b, ma.dtype);
            };
            (Op::Binary { kind: kinds[bytes.below(kinds.len())] }, vec![a, b])
        }
        6 => {
            let to = if float(ma) {
                [DType::F32, DType::BF16, DType::F16, DType::I32][bytes.below(4)]
            } else {
                DType::F32
            };
            (Op::Cast { to }, vec![a])
        }
        7 => {
            let kinds =
                [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod];
            let mut axes: Axes = (0..rank).filter(|_| bytes.below(2) == 0).collect();
            if axes.is_empty() && rank > 0 {
                axes.push(rank - 1);
            }
            (
                Op::Reduce {
                    kind: kinds[bytes.below(kinds.len())],
                    axes,
                    keepdim: bytes.below(2) == 0,
                },
                vec![a],
            )
        }
        8 => {
            let mb = trace.meta(b);
            if rank < 2 || mb.shape.len() < 2 || mb.dtype != ma.dtype {
                return None;
            }
            // Transpose the right operand when that makes the inner dims agree.
            let rhs = if mb.shape[mb.shape.len() - 2] == ma.shape[rank - 1] {
                b
            } else {
                return permute_last(trace, b);
            };
            (Op::MatMul, vec![a, rhs])
        }
        9 => {
            let axis = axis(bytes);
            let dim = *ma.shape.get(axis)?;
            let start = bytes.below(dim.max(1));
            (Op::Slice { axis, start, stop: dim, step: 1 + bytes.below(2) }, vec![a])
        }
        10 => return permute_last(trace, a),
        11 => {
            let mut s = ma.shape.clone();
            if s.first() == Some(&1) {
                s[0] = 3;
            } else {
                s.insert(0, 2);
            }
            (Op::Expand { shape: s }, vec![a])
        }
        12 => match bytes.below(4) {
            0 if float(ma) && rank > 0 => (Op::Softmax { axis: rank - 1 }, vec![a]),
            1 if rank > 0 => (
                Op::ArgReduce { kind: ArgReduceOp::Argmax, axis: axis(bytes), keepdim: false },
                vec![a],
            ),
            2 => (Op::Reshape { shape: shape(&[ma.numel()]) }, vec![a]),
            _ if rank > 0 => (Op::Concat { axis: axis(bytes) }, vec![a, a]),
            _ => return None,
        },
        _ => {
            let c = trace.len() - 1;
            let cond = (0..trace.len()).rev().find(|&i| trace.meta(i).dtype == DType::Bool)?;
            if trace.meta(c).dtype != ma.dtype {
                return None;
            }
            (Op::Where, vec![cond, a, c])
        }
    })
}

fn cast_to(trace: &Trace, node: NodeId, to: DType) -> Option<(Op, Vec<NodeId>)> {
    (trace.meta(node).dtype != to).then(|| (Op::Cast { to }, vec![node]))
}

fn permute_last(trace: &Trace, node: NodeId) -> Option<(Op, Vec<NodeId>)> {
    let rank = trace.meta(node).shape.len();
    if rank < 2 {
        return None;
    }
    let mut perm: Axes = (0..rank).collect();
    perm.swap(rank - 2, rank - 1);
    Some((Op::Permute { perm }, vec![node]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_bytes_give_a_valid_trace() {
        for seed in 0..500u64 {
            let data: Vec<u8> = (0..200)
                .map(|i| {
                    (seed.wrapping_mul(6364136223846793005).wrapping_add(i * 1442695040888963407)
                        >> 33) as u8
                })
                .collect();
            let g = random_trace(&mut Bytes::new(&data), 30);
            g.trace.validate().unwrap();
            assert!(!g.trace.outputs.is_empty());
            assert_eq!(g.params.len(), g.trace.num_parameters());
        }
        random_trace(&mut Bytes::new(&[]), 10).trace.validate().unwrap();
    }
}
