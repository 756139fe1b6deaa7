//! Builds random valid traces from a stream of bytes. One generator serves the
//! property tests (which feed it random bytes) and the fuzz targets (which feed
//! it the fuzzer's input), so a failure found by either replays in both.
//!
//! The generator covers what fusion must get right: elementwise chains with
//! broadcasting, casts through bf16/f16, reductions over every axis with and
//! without keepdim, matmuls (with transposes), views (permute, slice,
//! reshape, expand), concat, row gathers and scatter-adds, and the fused
//! forms; every op and dtype of the IR, with empty and size-1 dimensions.
//! [`well_conditioned`] makes a trace comparable across implementations
//! within a fixed tolerance.

use crate::shape::shape;
use crate::{
    ArgReduceOp, Axes, BinaryOp, DType, Distribution, Meta, NodeId, Op, ReduceOp, Shape, Trace,
    UnaryOp,
};

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

/// Sizes of generated dimensions: the broadcast size 1, small sizes, and 17,
/// which is not a multiple of any SIMD width or tile.
const DIMS: [usize; 5] = [1, 3, 4, 8, 17];
const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
const OTHERS: [DType; 3] = [DType::I32, DType::I64, DType::Bool];

/// Generates a trace of at most `max_ops` ops (plus parameters). Every value
/// left without a consumer becomes an output.
///
/// It draws every op of the IR, every dtype (parameters are mostly f32, some
/// bf16/f16, some integer or bool) and ranks 0 to 4, with sizes 1 (the
/// broadcast pattern), 0 (empty tensors, rarely) and several others.
pub fn random_trace(bytes: &mut Bytes, max_ops: usize) -> Generated {
    let mut trace = Trace::new();
    let mut params = Vec::new();
    // A few parameters sharing dimensions, so broadcasting and matmul happen.
    let mut base = [0usize; 4];
    for d in &mut base {
        *d = DIMS[1 + bytes.below(DIMS.len() - 1)];
    }
    if bytes.below(16) == 0 {
        base[3 - bytes.below(2)] = 0;
    }
    for _ in 0..2 + bytes.below(3) {
        let rank = [1, 2, 2, 3, 3, 0, 4][bytes.below(7)];
        let dims: Vec<usize> =
            (0..rank).map(|i| if bytes.below(5) == 0 { 1 } else { base[4 - rank + i] }).collect();
        let dtype = match bytes.below(8) {
            0 => FLOATS[1 + bytes.below(2)],
            1 => OTHERS[bytes.below(OTHERS.len())],
            _ => DType::F32,
        };
        let meta = Meta::new(shape(&dims), dtype);
        params.push(meta.clone());
        trace.push_parameter(meta);
    }
    let mut ops = 0;
    while ops < max_ops && !bytes.exhausted() {
        let n = trace.len();
        let a = n - 1 - bytes.below(n.min(4));
        let b = bytes.below(n);
        if let Some(op_inputs) = pick(bytes, &mut trace, a, b) {
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
fn pick(bytes: &mut Bytes, trace: &mut Trace, a: NodeId, b: NodeId) -> Option<(Op, Vec<NodeId>)> {
    let ma = &trace.meta(a).clone();
    let rank = ma.shape.len();
    let float = |m: &Meta| m.dtype.is_float();
    let axis = |bytes: &mut Bytes| bytes.below(rank.max(1));
    // Trailing axes, as the norms take them.
    let trailing =
        |bytes: &mut Bytes| -> Axes { (rank - 1 - bytes.below(rank.min(2))..rank).collect() };
    Some(match bytes.below(16) {
        0..=2 => (Op::Unary { kind: UnaryOp::ALL[bytes.below(UnaryOp::ALL.len())] }, vec![a]),
        3..=5 => {
            let b = if trace.meta(b).dtype == ma.dtype {
                b
            } else {
                return cast_to(trace, b, ma.dtype);
            };
            (Op::Binary { kind: BinaryOp::ALL[bytes.below(BinaryOp::ALL.len())] }, vec![a, b])
        }
        6 => {
            let to = DType::ALL[bytes.below(DType::ALL.len())];
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
            let stop = start + bytes.below(dim - start + 1);
            (Op::Slice { axis, start, stop, step: 1 + bytes.below(2) }, vec![a])
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
        12 => match bytes.below(8) {
            // Rows in reverse, then added back into one more row than there
            // were: in-range indices, as the binding's bounds checks ensure.
            6 | 7 if rank > 0 && ma.shape[0] > 0 => {
                let n = ma.shape[0];
                let idx = trace
                    .push(
                        Op::Arange { start: (n - 1) as f64, step: -1.0, len: n, dtype: DType::I64 },
                        &[],
                    )
                    .ok()?;
                if bytes.below(2) == 0 || ma.dtype == DType::Bool {
                    (Op::GatherRows, vec![a, idx])
                } else {
                    (Op::ScatterAddRows { rows: n + 1 }, vec![idx, a])
                }
            }
            0 if float(ma) && rank > 0 => (Op::Softmax { axis: axis(bytes) }, vec![a]),
            1 if float(ma) && rank > 0 => (Op::LogSoftmax { axis: axis(bytes) }, vec![a]),
            2 if rank > 0 => {
                let kind = [ArgReduceOp::Argmax, ArgReduceOp::Argmin][bytes.below(2)];
                (Op::ArgReduce { kind, axis: axis(bytes), keepdim: bytes.below(2) == 0 }, vec![a])
            }
            3 => (Op::Reshape { shape: shape(&[ma.numel()]) }, vec![a]),
            _ if rank > 0 => (Op::Concat { axis: axis(bytes) }, vec![a, a]),
            _ => return None,
        },
        13 => {
            if !float(ma) || rank == 0 {
                return None;
            }
            // The norms' epsilon is a zero-dimensional literal of x's dtype.
            // At least 0.01, so that rows of nearly equal values do not amplify
            // an ulp beyond the differential check's tolerance.
            let value = [1e-2, 0.1, 0.5][bytes.below(3)];
            let eps =
                trace.push(Op::Full { value, shape: shape(&[]), dtype: ma.dtype }, &[]).ok()?;
            let axes = trailing(bytes);
            let op =
                if bytes.below(2) == 0 { Op::LayerNorm { axes } } else { Op::RmsNorm { axes } };
            (op, vec![a, eps])
        }
        14 => {
            // Values from nothing, in a's shape, so they combine with it.
            let dtype = ma.dtype;
            match bytes.below(3) {
                0 => (
                    Op::Full {
                        value: [0.0, 1.0, -2.5, 0.5][bytes.below(4)],
                        shape: ma.shape.clone(),
                        dtype,
                    },
                    vec![],
                ),
                1 => {
                    let len = ma.shape.last().copied().unwrap_or(1);
                    let start = bytes.below(5) as f64 - 2.0;
                    let step = [1.0, -1.0, 2.0, 0.5][bytes.below(4)];
                    (Op::Arange { start, step, len, dtype }, vec![])
                }
                _ => {
                    let dist = [Distribution::Uniform, Distribution::Normal][bytes.below(2)];
                    let seed = bytes.below(256) as u64;
                    (Op::Random { seed, dist, shape: ma.shape.clone(), dtype }, vec![])
                }
            }
        }
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

/// Ops whose float result every correct implementation computes bit for bit
/// from exact inputs.
fn exact_float(op: &Op) -> bool {
    match op {
        Op::Parameter { .. } | Op::Full { .. } | Op::Arange { .. } => true,
        Op::Unary { kind } => {
            matches!(
                kind,
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Floor | UnaryOp::Sign
            )
        }
        Op::Binary { kind } => matches!(kind, BinaryOp::Maximum | BinaryOp::Minimum),
        Op::Reduce { kind, .. } => matches!(kind, ReduceOp::Max | ReduceOp::Min),
        Op::Where
        | Op::Cast { .. }
        | Op::Expand { .. }
        | Op::Reshape { .. }
        | Op::Permute { .. }
        | Op::Slice { .. }
        | Op::Concat { .. }
        | Op::GatherRows => true,
        _ => false,
    }
}

/// `trace` made well conditioned for a differential check, keeping every
/// op of the IR that can be compared within a fixed tolerance:
///
/// - Ops with discontinuities (floor, sign, comparisons, casts to integers
///   or bool, arg-reductions, the condition of `where`) are kept only when
///   their inputs are *exact*: computed by ops whose result every correct
///   implementation gives bit for bit (parameters and literals, neg, abs,
///   relu, max, min, views, integer arithmetic, ...). Elsewhere a 1-ulp
///   difference of a fused transcendental may legitimately flip them, which
///   would hide real bugs behind noise. Such an op and everything that
///   depends on it is dropped.
/// - Every operand at a pole or domain edge (the input of sqrt, rsqrt, log
///   and reciprocal, every divisor, the base of pow) and the inexact terms
///   of a sum are replaced by `|x| + 1` (see `guarded`); the exponent of
///   pow, the factors of a product and the inexact operands of matmul, sin,
///   cos, exp, softmax, log-softmax and layer norm by `tanh(y)` (see
///   `bounded`).
///
/// Each unconsumed value is an output.
pub fn well_conditioned(trace: &Trace) -> Trace {
    let discontinuous = |op: &Op, from: DType| match op {
        Op::Unary { kind } => matches!(kind, UnaryOp::Floor | UnaryOp::Sign),
        Op::Binary { kind } => kind.returns_bool(),
        Op::Cast { to } => from.is_float() && !to.is_float(),
        Op::ArgReduce { .. } | Op::Where => true,
        _ => false,
    };
    // Inputs made `|x| + 1`: domain edges, and an inexact sum's terms,
    // which may cancel (the deviations that a layer norm or `x - mean(x)`
    // leave sum to about 0) and keep an absolute error that grows with
    // their count; positive terms keep it relative.
    let guarded = |op: &Op, input: usize, exact: bool| match op {
        Op::Unary { kind } => {
            matches!(kind, UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Log | UnaryOp::Reciprocal)
        }
        Op::Binary { kind: BinaryOp::Div } => input == 1,
        Op::Binary { kind: BinaryOp::Pow } => input == 0,
        Op::Reduce { kind: ReduceOp::Sum, .. } => !exact,
        _ => false,
    };
    // Inputs bounded by tanh instead: pow's exponent; the factors of a
    // product, whose overflow (and 0 * inf) depends on the order of the
    // multiplications otherwise; and, when they are not exact, the operands
    // of a matmul (a sum of large terms that cancel keeps their absolute
    // error, far above the result's relative tolerance), of sin and cos
    // (a large argument turns an ulp into a large difference), and of exp,
    // softmax, log-softmax and layer norm (their result's error is their
    // argument's absolute error, or that divided by a deviation that eps
    // bounds only to 1 / sqrt(eps)).
    let bounded = |op: &Op, input: usize, exact: bool| match op {
        Op::Binary { kind: BinaryOp::Pow } => input == 1,
        Op::Reduce { kind: ReduceOp::Prod, .. } => true,
        Op::MatMul | Op::Unary { kind: UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Exp } => !exact,
        Op::Softmax { .. } | Op::LogSoftmax { .. } | Op::LayerNorm { .. } => input == 0 && !exact,
        _ => false,
    };
    let mut out = Trace::new();
    // Each node's id in `out` and whether it is exact; `None` when dropped.
    let mut remap: Vec<Option<(usize, bool)>> = Vec::with_capacity(trace.len());
    for node in &trace.nodes {
        let Some(kept) = node.inputs.iter().map(|&i| remap[i]).collect::<Option<Vec<_>>>() else {
            remap.push(None);
            continue;
        };
        let exact_inputs = kept.iter().all(|&(_, exact)| exact);
        let from = node.inputs.first().map_or(node.meta.dtype, |&i| trace.meta(i).dtype);
        // Where's branches may be inexact; its condition may not.
        let needed = match node.op {
            Op::Where => kept[0].1,
            _ => exact_inputs,
        };
        if discontinuous(&node.op, from) && !needed {
            remap.push(None);
            continue;
        }
        let mut inputs: Vec<usize> = Vec::with_capacity(kept.len());
        for (k, &(mut id, exact)) in kept.iter().enumerate() {
            let dtype = out.meta(id).dtype;
            if bounded(&node.op, k, exact) && dtype.is_float() {
                id = out.push(Op::Unary { kind: UnaryOp::Tanh }, &[id]).expect("tanh of a float");
            } else if guarded(&node.op, k, exact) && dtype.is_float() {
                let abs =
                    out.push(Op::Unary { kind: UnaryOp::Abs }, &[id]).expect("abs of a float");
                let one = Op::Full { value: 1.0, shape: Default::default(), dtype };
                let one = out.push(one, &[]).expect("a literal");
                id = out.push(Op::Binary { kind: BinaryOp::Add }, &[abs, one]).expect("same dtype");
            }
            inputs.push(id);
        }
        let id = match &node.op {
            Op::Parameter { .. } => out.push_parameter(node.meta.clone()),
            op => out.push(op.clone(), &inputs).expect("the same op on inputs of the same metas"),
        };
        // Integer and bool values are exact: integer arithmetic is, and they
        // only come from floats through a kept (exact-input) discontinuous op.
        let exact = !node.meta.dtype.is_float() || (exact_float(&node.op) && exact_inputs);
        remap.push(Some((id, exact)));
    }
    let uses = out.use_counts();
    out.outputs = (0..out.len())
        .filter(|&i| uses[i] == 0 && !matches!(out.nodes[i].op, Op::Parameter { .. }))
        .collect();
    if out.outputs.is_empty() {
        out.outputs.push(out.len() - 1);
    }
    out
}

/// `trace` with a rounding-size error put into every value that is not
/// exact (see [`well_conditioned`]): each such float value is multiplied by
/// pseudo-random factors in `[1 - d, 1 + d)`, with `d` a few units in the
/// last place of its dtype, times the square root of the number of terms
/// of a reduction. How far the outputs move is how sensitive they
/// are to the roundings a correct implementation may do differently (the
/// order of a sum, a polynomial exp): an empirical condition number.
/// Exact values, and so every discontinuous op's input in a well-conditioned
/// trace, are left alone.
///
/// `approx_error` gives, for an op the implementation under test
/// approximates (a polynomial tanh), the relative error it is documented to
/// keep in f32; where that is larger than `d`, the op's value is perturbed
/// by that instead, so the sensitivity covers what the approximation may do.
pub fn perturbed(trace: &Trace, seed: u64, approx_error: impl Fn(&Op) -> Option<f64>) -> Trace {
    let mut p = Perturber { out: Trace::new(), seed, approx_error, count: 0 };
    let mut remap: Vec<NodeId> = Vec::with_capacity(trace.len());
    let mut exact: Vec<bool> = Vec::with_capacity(trace.len());
    for node in &trace.nodes {
        let inputs: Vec<NodeId> = node.inputs.iter().map(|&i| remap[i]).collect();
        let is_exact = !node.meta.dtype.is_float()
            || (exact_float(&node.op) && node.inputs.iter().all(|&i| exact[i]));
        exact.push(is_exact);
        remap.push(match &node.op {
            Op::Parameter { .. } => p.out.push_parameter(node.meta.clone()),
            op if is_exact => {
                p.out.push(op.clone(), &inputs).expect("the same op on the same metas")
            }
            op => p.rounded(op, &inputs),
        });
    }
    let mut out = p.out;
    out.outputs = trace.outputs.iter().map(|&o| remap[o]).collect();
    out
}

/// Records ops into a perturbed trace (see [`perturbed`]).
struct Perturber<F> {
    out: Trace,
    seed: u64,
    approx_error: F,
    /// Ops perturbed so far: each gets its own random stream.
    count: u64,
}

impl<F: Fn(&Op) -> Option<f64>> Perturber<F> {
    /// `op` on `inputs`, with the error of its roundings put in. An f32
    /// norm or softmax is recorded as the primitive ops it computes, each
    /// perturbed: its mean is one value shared by its row, so that error
    /// shifts the whole row alike, and a later sum over the row (a matmul)
    /// adds up what independent errors would partly cancel.
    fn rounded(&mut self, op: &Op, inputs: &[NodeId]) -> NodeId {
        let f32_row_op = self.out.meta(inputs[0]).dtype == DType::F32;
        match op {
            Op::LayerNorm { axes } if f32_row_op => {
                let (x, eps) = (inputs[0], inputs[1]);
                let mu = self.rounded(&mean(axes), &[x]);
                let d = self.rounded(&binary(BinaryOp::Sub), &[x, mu]);
                self.scaled_by_rms(d, eps, axes)
            }
            Op::RmsNorm { axes } if f32_row_op => self.scaled_by_rms(inputs[0], inputs[1], axes),
            Op::Softmax { axis } | Op::LogSoftmax { axis } if f32_row_op => {
                let axes: Axes = [*axis].into_iter().collect();
                let max = Op::Reduce { kind: ReduceOp::Max, axes: axes.clone(), keepdim: true };
                let m = self.out.push(max, &[inputs[0]]).expect("max of a float");
                let d = self.rounded(&binary(BinaryOp::Sub), &[inputs[0], m]);
                let e = self.rounded(&Op::Unary { kind: UnaryOp::Exp }, &[d]);
                let sum = Op::Reduce { kind: ReduceOp::Sum, axes, keepdim: true };
                let s = self.rounded(&sum, &[e]);
                if matches!(op, Op::Softmax { .. }) {
                    self.rounded(&binary(BinaryOp::Div), &[e, s])
                } else {
                    let l = self.rounded(&Op::Unary { kind: UnaryOp::Log }, &[s]);
                    self.rounded(&binary(BinaryOp::Sub), &[d, l])
                }
            }
            op => {
                let id = self.out.push(op.clone(), inputs).expect("the same op on the same metas");
                self.perturb(id, op, inputs)
            }
        }
    }

    /// `x * rsqrt(mean(x * x) + eps)` over `axes`, each step perturbed.
    fn scaled_by_rms(&mut self, x: NodeId, eps: NodeId, axes: &Axes) -> NodeId {
        let sq = self.rounded(&binary(BinaryOp::Mul), &[x, x]);
        let ms = self.rounded(&mean(axes), &[sq]);
        let ve = self.rounded(&binary(BinaryOp::Add), &[ms, eps]);
        let rs = self.rounded(&Op::Unary { kind: UnaryOp::Rsqrt }, &[ve]);
        self.rounded(&binary(BinaryOp::Mul), &[x, rs])
    }

    /// `id`, the value of `op` on `inputs`, times random factors in `[1 - d,
    /// 1 + d)`: `d` is a few units in the last place of its dtype, times the
    /// square root of the number of terms of a reduction (a sum of n terms
    /// rounds every partial result, so its error grows like sqrt(n)
    /// roundings), or the documented error of an approximated op.
    fn perturb(&mut self, id: NodeId, op: &Op, inputs: &[NodeId]) -> NodeId {
        let meta = self.out.meta(id).clone();
        let unit = match meta.dtype {
            DType::BF16 => 1.0 / 64.0,
            DType::F16 => 1.0 / 512.0,
            _ => 1.0 / 4_194_304.0, // 2^-22: four units of f32's rounding
        };
        let input_shape = self.out.meta(inputs[0]).shape.clone();
        let terms: usize = match op {
            Op::Reduce { axes, .. } | Op::LayerNorm { axes } | Op::RmsNorm { axes } => {
                axes.iter().map(|&a| input_shape[a]).product()
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => input_shape[*axis],
            Op::MatMul => input_shape.last().copied().unwrap_or(1),
            _ => 1,
        };
        let d = unit * (terms.max(1) as f64).sqrt();
        let d = match (self.approx_error)(op) {
            Some(bound) if meta.dtype == DType::F32 => d.max(bound),
            _ => d,
        };
        self.count += 1;
        let seed = self.seed ^ self.count.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        scale_randomly(&mut self.out, id, &meta.shape, d, seed)
    }
}

fn mean(axes: &Axes) -> Op {
    Op::Reduce { kind: ReduceOp::Mean, axes: axes.clone(), keepdim: true }
}

fn binary(kind: BinaryOp) -> Op {
    Op::Binary { kind }
}

/// `value` times pseudo-random factors uniform in `[1 - d, 1 + d)`, one per
/// element of `shape` (which broadcasts to `value`'s shape).
fn scale_randomly(out: &mut Trace, value: NodeId, shape: &Shape, d: f64, seed: u64) -> NodeId {
    let dtype = out.meta(value).dtype;
    let mut lit = |value: f64| {
        out.push(Op::Full { value, shape: Default::default(), dtype }, &[]).expect("a literal")
    };
    let (two_d, one_minus_d) = (lit(2.0 * d), lit(1.0 - d));
    let random = Op::Random { seed, dist: Distribution::Uniform, shape: shape.clone(), dtype };
    let u = out.push(random, &[]).expect("random of a float shape");
    let scaled = out.push(Op::Binary { kind: BinaryOp::Mul }, &[u, two_d]).expect("floats");
    let factor =
        out.push(Op::Binary { kind: BinaryOp::Add }, &[scaled, one_minus_d]).expect("floats");
    out.push(Op::Binary { kind: BinaryOp::Mul }, &[value, factor]).expect("broadcasting floats")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_bytes_give_a_valid_trace() {
        for seed in 0..500u64 {
            let data: Vec<u8> = (0..200u64)
                .map(|i| {
                    (seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(i.wrapping_mul(1442695040888963407))
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
