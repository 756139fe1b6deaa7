//! The e-graph language: one e-node kind per op of the trace IR (fused forms
//! included) plus [`Attr`] leaves.
//!
//! An e-node's children are its tensor inputs followed by its attribute
//! leaves, so patterns read like the op: `(sum ?x ?axes ?keepdim)`,
//! `(reshape ?x ?shape)`, `(layer_norm ?x ?eps ?axes)`. The names are those of
//! [`Op::name`] and of the unary and binary kinds (`exp`, `mul`, ...).

use std::cmp::Ordering;
use std::fmt;

use egg::{FromOpError, Id, Language};
use smallvec::SmallVec;
use trace_ir::{ArgReduceOp, BinaryOp, Distribution, Op, ReduceOp, UnaryOp};

use crate::Attr;

/// What an e-node is: an op kind without its attributes, or an attribute.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// An attribute leaf; never a tensor.
    Attr(Attr),
    /// `(parameter index shape dtype)`
    Parameter,
    /// `(full value shape dtype)`
    Full,
    /// `(arange start step len dtype)`
    Arange,
    /// `(rand seed shape dtype)`
    Rand,
    /// `(randn seed shape dtype)`
    Randn,
    /// `(exp ?x)`, `(neg ?x)`, ...
    Unary(UnaryOp),
    /// `(add ?a ?b)`, `(mul ?a ?b)`, ...
    Binary(BinaryOp),
    /// `(where ?cond ?a ?b)`
    Where,
    /// `(cast ?x dtype)`
    Cast,
    /// `(sum ?x axes keepdim)`, `(max ...)`, ...
    Reduce(ReduceOp),
    /// `(argmax ?x axis keepdim)`
    ArgReduce(ArgReduceOp),
    /// `(expand ?x shape)`
    Expand,
    /// `(reshape ?x shape)`
    Reshape,
    /// `(permute ?x perm)`
    Permute,
    /// `(slice ?x axis start stop step)`
    Slice,
    /// `(concat ?a ?b ... axis)`
    Concat,
    /// `(matmul ?a ?b)`
    MatMul,
    /// `(softmax ?x axes)` with a one-axis list, so that it binds the axes of
    /// the reductions it replaces.
    Softmax,
    /// `(log_softmax ?x axes)`, as softmax.
    LogSoftmax,
    /// `(layer_norm ?x ?eps axes)`
    LayerNorm,
    /// `(rms_norm ?x ?eps axes)`
    RmsNorm,
    /// `(gather_rows ?table ?indices)`
    GatherRows,
    /// `(scatter_add_rows ?indices ?updates rows)`
    ScatterAddRows,
}

impl NodeKind {
    /// A code that identifies the kind apart from an attribute's value; it
    /// orders e-nodes and is the discriminant egg indexes e-classes by.
    fn code(&self) -> (u8, u8) {
        use NodeKind::*;
        match self {
            Attr(_) => (0, 0),
            Parameter => (1, 0),
            Full => (2, 0),
            Arange => (3, 0),
            Rand => (4, 0),
            Randn => (5, 0),
            Unary(k) => (6, *k as u8),
            Binary(k) => (7, *k as u8),
            Where => (8, 0),
            Cast => (9, 0),
            Reduce(k) => (10, *k as u8),
            ArgReduce(k) => (11, *k as u8),
            Expand => (12, 0),
            Reshape => (13, 0),
            Permute => (14, 0),
            Slice => (15, 0),
            Concat => (16, 0),
            MatMul => (17, 0),
            Softmax => (18, 0),
            LogSoftmax => (19, 0),
            LayerNorm => (20, 0),
            RmsNorm => (21, 0),
            GatherRows => (22, 0),
            ScatterAddRows => (23, 0),
        }
    }

    /// How many attribute children the kind takes (they come last).
    pub fn num_attrs(&self) -> usize {
        use NodeKind::*;
        match self {
            Attr(_) | Unary(_) | Binary(_) | Where | MatMul | GatherRows => 0,
            Cast | Expand | Reshape | Permute | Concat | Softmax | LogSoftmax | LayerNorm
            | RmsNorm | ScatterAddRows => 1,
            Reduce(_) | ArgReduce(_) => 2,
            Parameter | Full | Rand | Randn => 3,
            Arange | Slice => 4,
        }
    }

    /// How many tensor inputs the kind takes; `None` for concat (any, at least one).
    pub fn num_inputs(&self) -> Option<usize> {
        use NodeKind::*;
        match self {
            Attr(_) | Parameter | Full | Arange | Rand | Randn => Some(0),
            Unary(_) | Cast | Reduce(_) | ArgReduce(_) | Expand | Reshape | Permute | Slice
            | Softmax | LogSoftmax => Some(1),
            Binary(_) | MatMul | LayerNorm | RmsNorm | GatherRows | ScatterAddRows => Some(2),
            Where => Some(3),
            Concat => None,
        }
    }

    /// The name patterns use for this kind.
    pub fn name(&self) -> String {
        use NodeKind::*;
        match self {
            Attr(a) => a.to_string(),
            Parameter => "parameter".into(),
            Full => "full".into(),
            Arange => "arange".into(),
            Rand => "rand".into(),
            Randn => "randn".into(),
            Unary(k) => k.name().into(),
            Binary(k) => k.name().into(),
            Where => "where".into(),
            Cast => "cast".into(),
            Reduce(k) => k.name().into(),
            ArgReduce(ArgReduceOp::Argmax) => "argmax".into(),
            ArgReduce(ArgReduceOp::Argmin) => "argmin".into(),
            Expand => "expand".into(),
            Reshape => "reshape".into(),
            Permute => "permute".into(),
            Slice => "slice".into(),
            Concat => "concat".into(),
            MatMul => "matmul".into(),
            Softmax => "softmax".into(),
            LogSoftmax => "log_softmax".into(),
            LayerNorm => "layer_norm".into(),
            RmsNorm => "rms_norm".into(),
            GatherRows => "gather_rows".into(),
            ScatterAddRows => "scatter_add_rows".into(),
        }
    }

    /// The kind a pattern names, or an attribute leaf.
    fn parse(name: &str) -> Option<NodeKind> {
        use NodeKind::*;
        const REDUCES: [ReduceOp; 5] =
            [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod];
        let fixed = [
            Parameter,
            Full,
            Arange,
            Rand,
            Randn,
            Where,
            Cast,
            ArgReduce(ArgReduceOp::Argmax),
            ArgReduce(ArgReduceOp::Argmin),
            Expand,
            Reshape,
            Permute,
            Slice,
            Concat,
            MatMul,
            Softmax,
            LogSoftmax,
            LayerNorm,
            RmsNorm,
            GatherRows,
            ScatterAddRows,
        ];
        let all = fixed
            .into_iter()
            .chain(UnaryOp::ALL.map(Unary))
            .chain(BinaryOp::ALL.map(Binary))
            .chain(REDUCES.map(Reduce));
        let mut all = all;
        all.find(|k| k.name() == name).or_else(|| name.parse().ok().map(Attr))
    }

    /// The trace op of this kind with the given attribute values, or `None`
    /// when they are not the attributes this kind takes.
    pub fn to_op(&self, attrs: &[&Attr]) -> Option<Op> {
        use crate::Attr as A;
        let int = |i: usize| attrs.get(i).and_then(|a| a.as_usize());
        let dims = |i: usize| attrs.get(i).and_then(|a| a.as_dims()).cloned();
        let lit = |i: usize| match attrs.get(i) {
            Some(A::Lit(bits)) => Some(f64::from_bits(*bits)),
            _ => None,
        };
        let dtype = |i: usize| match attrs.get(i) {
            Some(A::DType(d)) => Some(*d),
            _ => None,
        };
        let flag = |i: usize| match attrs.get(i) {
            Some(A::Flag(b)) => Some(*b),
            _ => None,
        };
        if attrs.len() != self.num_attrs() {
            return None;
        }
        let random = |dist| match attrs.first() {
            Some(A::Int(seed)) => {
                Some(Op::Random { seed: *seed, dist, shape: dims(1)?, dtype: dtype(2)? })
            }
            _ => None,
        };
        Some(match self {
            NodeKind::Attr(_) => return None,
            NodeKind::Parameter => {
                Op::Parameter { index: int(0)?, shape: dims(1)?, dtype: dtype(2)? }
            }
            NodeKind::Full => Op::Full { value: lit(0)?, shape: dims(1)?, dtype: dtype(2)? },
            NodeKind::Arange => {
                Op::Arange { start: lit(0)?, step: lit(1)?, len: int(2)?, dtype: dtype(3)? }
            }
            NodeKind::Rand => random(Distribution::Uniform)?,
            NodeKind::Randn => random(Distribution::Normal)?,
            NodeKind::Unary(kind) => Op::Unary { kind: *kind },
            NodeKind::Binary(kind) => Op::Binary { kind: *kind },
            NodeKind::Where => Op::Where,
            NodeKind::Cast => Op::Cast { to: dtype(0)? },
            NodeKind::Reduce(kind) => Op::Reduce { kind: *kind, axes: dims(0)?, keepdim: flag(1)? },
            NodeKind::ArgReduce(kind) => {
                Op::ArgReduce { kind: *kind, axis: int(0)?, keepdim: flag(1)? }
            }
            NodeKind::Expand => Op::Expand { shape: dims(0)? },
            NodeKind::Reshape => Op::Reshape { shape: dims(0)? },
            NodeKind::Permute => Op::Permute { perm: dims(0)? },
            NodeKind::Slice => {
                Op::Slice { axis: int(0)?, start: int(1)?, stop: int(2)?, step: int(3)? }
            }
            NodeKind::Concat => Op::Concat { axis: int(0)? },
            NodeKind::MatMul => Op::MatMul,
            NodeKind::Softmax | NodeKind::LogSoftmax => {
                let axes = dims(0)?;
                let axis = match axes.as_slice() {
                    [axis] => *axis,
                    _ => return None,
                };
                if *self == NodeKind::Softmax {
                    Op::Softmax { axis }
                } else {
                    Op::LogSoftmax { axis }
                }
            }
            NodeKind::LayerNorm => Op::LayerNorm { axes: dims(0)? },
            NodeKind::RmsNorm => Op::RmsNorm { axes: dims(0)? },
            NodeKind::GatherRows => Op::GatherRows,
            NodeKind::ScatterAddRows => Op::ScatterAddRows { rows: int(0)? },
        })
    }

    /// The kind and attribute values of a trace op (the inverse of [`NodeKind::to_op`]).
    pub fn from_op(op: &Op) -> (NodeKind, Vec<Attr>) {
        use crate::Attr as A;
        let shape = |s: &trace_ir::Shape| A::Dims(s.clone());
        match op {
            Op::Parameter { index, shape: s, dtype } => {
                (NodeKind::Parameter, vec![A::int(*index), shape(s), A::DType(*dtype)])
            }
            Op::Full { value, shape: s, dtype } => {
                (NodeKind::Full, vec![A::lit(*value), shape(s), A::DType(*dtype)])
            }
            Op::Arange { start, step, len, dtype } => (
                NodeKind::Arange,
                vec![A::lit(*start), A::lit(*step), A::int(*len), A::DType(*dtype)],
            ),
            Op::Random { seed, dist, shape: s, dtype } => {
                let kind =
                    if *dist == Distribution::Uniform { NodeKind::Rand } else { NodeKind::Randn };
                (kind, vec![A::Int(*seed), shape(s), A::DType(*dtype)])
            }
            Op::Unary { kind } => (NodeKind::Unary(*kind), vec![]),
            Op::Binary { kind } => (NodeKind::Binary(*kind), vec![]),
            Op::Where => (NodeKind::Where, vec![]),
            Op::Cast { to } => (NodeKind::Cast, vec![A::DType(*to)]),
            Op::Reduce { kind, axes, keepdim } => {
                (NodeKind::Reduce(*kind), vec![shape(axes), A::Flag(*keepdim)])
            }
            Op::ArgReduce { kind, axis, keepdim } => {
                (NodeKind::ArgReduce(*kind), vec![A::int(*axis), A::Flag(*keepdim)])
            }
            Op::Expand { shape: s } => (NodeKind::Expand, vec![shape(s)]),
            Op::Reshape { shape: s } => (NodeKind::Reshape, vec![shape(s)]),
            Op::Permute { perm } => (NodeKind::Permute, vec![shape(perm)]),
            Op::Slice { axis, start, stop, step } => {
                (NodeKind::Slice, vec![A::int(*axis), A::int(*start), A::int(*stop), A::int(*step)])
            }
            Op::Concat { axis } => (NodeKind::Concat, vec![A::int(*axis)]),
            Op::MatMul => (NodeKind::MatMul, vec![]),
            Op::Softmax { axis } => {
                (NodeKind::Softmax, vec![A::Dims([*axis].into_iter().collect())])
            }
            Op::LogSoftmax { axis } => {
                (NodeKind::LogSoftmax, vec![A::Dims([*axis].into_iter().collect())])
            }
            Op::LayerNorm { axes } => (NodeKind::LayerNorm, vec![shape(axes)]),
            Op::RmsNorm { axes } => (NodeKind::RmsNorm, vec![shape(axes)]),
            Op::GatherRows => (NodeKind::GatherRows, vec![]),
            Op::ScatterAddRows { rows } => (NodeKind::ScatterAddRows, vec![A::int(*rows)]),
        }
    }
}

impl PartialOrd for NodeKind {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

// The op kinds of trace_ir are not `Ord`; the code orders kinds, and
// attributes of one code order by value, which agrees with `Eq`.
impl Ord for NodeKind {
    fn cmp(&self, other: &Self) -> Ordering {
        self.code().cmp(&other.code()).then_with(|| match (self, other) {
            (NodeKind::Attr(a), NodeKind::Attr(b)) => a.cmp(b),
            _ => Ordering::Equal,
        })
    }
}

/// An e-node: a kind and its children (tensor inputs, then attribute leaves).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorNode {
    /// The op kind or attribute.
    pub kind: NodeKind,
    /// Tensor inputs first, then attribute leaves.
    pub children: SmallVec<[Id; 4]>,
}

impl TensorNode {
    /// An attribute leaf.
    pub fn attr(attr: Attr) -> Self {
        TensorNode { kind: NodeKind::Attr(attr), children: SmallVec::new() }
    }

    /// The number of leading children that are tensors.
    fn split(&self) -> usize {
        self.kind.num_inputs().unwrap_or(self.children.len().saturating_sub(self.kind.num_attrs()))
    }

    /// The tensor inputs, in op order.
    pub fn inputs(&self) -> &[Id] {
        &self.children[..self.split().min(self.children.len())]
    }

    /// The attribute children, in op order.
    pub fn attr_children(&self) -> &[Id] {
        &self.children[self.split().min(self.children.len())..]
    }

    /// The attribute value, if this is an attribute leaf.
    pub fn as_attr(&self) -> Option<&Attr> {
        match &self.kind {
            NodeKind::Attr(a) => Some(a),
            _ => None,
        }
    }
}

impl Language for TensorNode {
    type Discriminant = (u8, u8);

    fn discriminant(&self) -> (u8, u8) {
        self.kind.code()
    }

    fn matches(&self, other: &Self) -> bool {
        self.kind == other.kind && self.children.len() == other.children.len()
    }

    fn children(&self) -> &[Id] {
        &self.children
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.children
    }
}

impl fmt::Display for TensorNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.kind.name())
    }
}

impl egg::FromOp for TensorNode {
    type Error = FromOpError;

    fn from_op(op: &str, children: Vec<Id>) -> Result<Self, FromOpError> {
        let kind = NodeKind::parse(op).filter(|k| {
            let n = children.len();
            let attrs = k.num_attrs();
            match k.num_inputs() {
                Some(inputs) => n == inputs + attrs,
                None => n > attrs,
            }
        });
        match kind {
            Some(kind) => Ok(TensorNode { kind, children: children.into() }),
            None => Err(FromOpError::new(op, children)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_round_trips_through_its_kind() {
        use trace_ir::{DType, Shape};
        let s = Shape::from_slice(&[2, 3]);
        let ops = [
            Op::Parameter { index: 4, shape: s.clone(), dtype: DType::F16 },
            Op::Full { value: -0.0, shape: s.clone(), dtype: DType::F32 },
            Op::Arange { start: 1.0, step: 0.5, len: 4, dtype: DType::F32 },
            Op::Random {
                seed: 9,
                dist: Distribution::Normal,
                shape: s.clone(),
                dtype: DType::BF16,
            },
            Op::Unary { kind: UnaryOp::Silu },
            Op::Binary { kind: BinaryOp::Pow },
            Op::Where,
            Op::Cast { to: DType::I64 },
            Op::Reduce { kind: ReduceOp::Prod, axes: Shape::from_slice(&[0, 1]), keepdim: true },
            Op::ArgReduce { kind: ArgReduceOp::Argmin, axis: 1, keepdim: false },
            Op::Expand { shape: s.clone() },
            Op::Reshape { shape: s.clone() },
            Op::Permute { perm: Shape::from_slice(&[1, 0]) },
            Op::Slice { axis: 1, start: 0, stop: 3, step: 2 },
            Op::Concat { axis: 0 },
            Op::MatMul,
            Op::Softmax { axis: 1 },
            Op::LogSoftmax { axis: 0 },
            Op::LayerNorm { axes: Shape::from_slice(&[1]) },
            Op::RmsNorm { axes: Shape::from_slice(&[0, 1]) },
        ];
        for op in ops {
            let (kind, attrs) = NodeKind::from_op(&op);
            let refs: Vec<&Attr> = attrs.iter().collect();
            assert_eq!(kind.to_op(&refs).as_ref(), Some(&op));
            assert_eq!(NodeKind::parse(&kind.name()), Some(kind));
        }
    }
}
