//! The op set of the trace. These are primitives: user-facing composites
//! (softmax, layer_norm, linear, ...) are built from them by the engine, and
//! type promotion has already inserted explicit casts, so every primitive sees
//! operands of one dtype.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::{DType, Shape};

/// Axis lists are short.
pub type Axes = SmallVec<[usize; 6]>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Reciprocal,
    Tanh,
    Sigmoid,
    Relu,
    /// GELU with the exact erf form.
    GeluErf,
    /// GELU with PyTorch's tanh approximation.
    GeluTanh,
    Silu,
    Sin,
    Cos,
    Floor,
    Sign,
    LogicalNot,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 18] = [
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
        UnaryOp::LogicalNot,
    ];

    /// Ops that only make sense on floating inputs; the engine casts integer
    /// and bool inputs to f32 first, as PyTorch does.
    pub fn needs_float(self) -> bool {
        use UnaryOp::*;
        !matches!(self, Neg | Abs | Relu | Floor | Sign | LogicalNot)
    }

    pub fn name(self) -> &'static str {
        use UnaryOp::*;
        match self {
            Neg => "neg",
            Abs => "abs",
            Exp => "exp",
            Log => "log",
            Sqrt => "sqrt",
            Rsqrt => "rsqrt",
            Reciprocal => "reciprocal",
            Tanh => "tanh",
            Sigmoid => "sigmoid",
            Relu => "relu",
            GeluErf => "gelu_erf",
            GeluTanh => "gelu_tanh",
            Silu => "silu",
            Sin => "sin",
            Cos => "cos",
            Floor => "floor",
            Sign => "sign",
            LogicalNot => "logical_not",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    LogicalAnd,
    LogicalOr,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 15] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::LogicalAnd,
        BinaryOp::LogicalOr,
    ];

    /// Comparisons and logical ops produce bool.
    pub fn returns_bool(self) -> bool {
        use BinaryOp::*;
        matches!(self, Eq | Ne | Lt | Le | Gt | Ge | LogicalAnd | LogicalOr)
    }

    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::LogicalAnd | BinaryOp::LogicalOr)
    }

    pub fn name(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div => "div",
            Pow => "pow",
            Maximum => "maximum",
            Minimum => "minimum",
            Eq => "eq",
            Ne => "ne",
            Lt => "lt",
            Le => "le",
            Gt => "gt",
            Ge => "ge",
            LogicalAnd => "logical_and",
            LogicalOr => "logical_or",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgReduceOp {
    Argmax,
    Argmin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Distribution {
    /// Uniform on [0, 1).
    Uniform,
    /// Standard normal.
    Normal,
}

/// One primitive op with its attributes. A node's shape and dtype follow from
/// its op and its inputs (see [`crate::infer`]); they are stored on the node
/// and checked on load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// A runtime input: a materialized buffer or a scalar the user passed.
    /// Its data never enters the signature.
    Parameter {
        index: usize,
        shape: Shape,
        dtype: DType,
    },
    /// A literal constant filled with one value.
    Full {
        #[serde(with = "crate::literal")]
        value: f64,
        shape: Shape,
        dtype: DType,
    },
    /// `start, start + step, ...` with `len` elements.
    Arange {
        #[serde(with = "crate::literal")]
        start: f64,
        #[serde(with = "crate::literal")]
        step: f64,
        len: usize,
        dtype: DType,
    },
    /// Pseudo-random values, a pure function of `seed` and the element index,
    /// so every mode and every backend draws the same numbers.
    Random {
        seed: u64,
        dist: Distribution,
        shape: Shape,
        dtype: DType,
    },
    Unary {
        kind: UnaryOp,
    },
    /// Elementwise with NumPy broadcasting; both inputs share one dtype.
    Binary {
        kind: BinaryOp,
    },
    /// `cond ? a : b` with broadcasting; `cond` is bool.
    Where,
    Cast {
        to: DType,
    },
    Reduce {
        kind: ReduceOp,
        axes: Axes,
        keepdim: bool,
    },
    ArgReduce {
        kind: ArgReduceOp,
        axis: usize,
        keepdim: bool,
    },
    /// Broadcast to a larger shape (PyTorch's `expand`).
    Expand {
        shape: Shape,
    },
    Reshape {
        shape: Shape,
    },
    Permute {
        perm: Axes,
    },
    /// Elements `start, start + step, ...` below `stop` along `axis`.
    Slice {
        axis: usize,
        start: usize,
        stop: usize,
        step: usize,
    },
    Concat {
        axis: usize,
    },
    /// Batched matrix product over the last two dimensions; batch dimensions broadcast.
    MatMul,
    /// Rows of a table: inputs `table` `[n, ...]` and integer `indices`
    /// `[m]`, output `[m, ...]` with row `i` = `table[indices[i]]`. An index
    /// outside `0..n` reads the nearest row (XLA's gather clamps); callers
    /// that must reject one check the indices beside it.
    GatherRows,
    /// The adjoint of [`Op::GatherRows`]: inputs integer `indices` `[m]` and
    /// `updates` `[m, ...]`, output `[rows, ...]`, zero but for
    /// `out[indices[i]] += updates[i]`, added in order of `i`. An index
    /// outside `0..rows` adds nothing (XLA's scatter skips it).
    ScatterAddRows {
        rows: usize,
    },
    /// Fused forms. Users never record these (the engine builds composites
    /// from primitives); the rewrites recognise the decomposed patterns and
    /// lift them here so the planner can emit one kernel per pattern.
    ///
    /// `exp(x - max) / sum(exp(x - max))` along `axis`.
    Softmax {
        axis: usize,
    },
    /// `x - max - log(sum(exp(x - max)))` along `axis`.
    LogSoftmax {
        axis: usize,
    },
    /// `(x - mean) * rsqrt(var + eps)` over `axes` (biased variance); inputs
    /// `x` and a zero-dimensional `eps` of the same dtype.
    LayerNorm {
        axes: Axes,
    },
    /// `x * rsqrt(mean(x * x) + eps)` over `axes`; inputs `x` and `eps`.
    RmsNorm {
        axes: Axes,
    },
}

impl Op {
    /// The sizes an op carries as attributes, besides its value's shape:
    /// the dims of a parameter's, a constant's or an expand/reshape target's
    /// shape, and a slice's start and stop. These change with the batch
    /// size, or with a loop's slice bounds, so shape classes treat them as
    /// they treat the values' shapes and resized programs map them.
    pub fn size_attrs_mut(&mut self) -> SmallVec<[&mut usize; 6]> {
        match self {
            Op::Parameter { shape, .. }
            | Op::Full { shape, .. }
            | Op::Random { shape, .. }
            | Op::Expand { shape }
            | Op::Reshape { shape } => shape.iter_mut().collect(),
            Op::Slice { start, stop, .. } => SmallVec::from_iter([start, stop]),
            _ => SmallVec::new(),
        }
    }

    /// A short name for messages and dumps.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Parameter { .. } => "parameter",
            Op::Full { .. } => "full",
            Op::Arange { .. } => "arange",
            Op::Random { dist: Distribution::Uniform, .. } => "rand",
            Op::Random { dist: Distribution::Normal, .. } => "randn",
            Op::Unary { kind } => kind.name(),
            Op::Binary { kind } => kind.name(),
            Op::Where => "where",
            Op::Cast { .. } => "cast",
            Op::Reduce { kind, .. } => kind.name(),
            Op::ArgReduce { kind: ArgReduceOp::Argmax, .. } => "argmax",
            Op::ArgReduce { kind: ArgReduceOp::Argmin, .. } => "argmin",
            Op::Expand { .. } => "expand",
            Op::Reshape { .. } => "reshape",
            Op::Permute { .. } => "permute",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::MatMul => "matmul",
            Op::GatherRows => "gather_rows",
            Op::ScatterAddRows { .. } => "scatter_add_rows",
            Op::Softmax { .. } => "softmax",
            Op::LogSoftmax { .. } => "log_softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::RmsNorm { .. } => "rms_norm",
        }
    }

    /// Ops that read no other node.
    pub fn is_source(&self) -> bool {
        matches!(
            self,
            Op::Parameter { .. } | Op::Full { .. } | Op::Arange { .. } | Op::Random { .. }
        )
    }

    /// The fused forms that only the rewrites produce.
    pub fn is_fused_form(&self) -> bool {
        matches!(
            self,
            Op::Softmax { .. } | Op::LogSoftmax { .. } | Op::LayerNorm { .. } | Op::RmsNorm { .. }
        )
    }

    /// Elementwise ops: output element i depends only on input elements at i
    /// (after broadcasting). The fusion planner chains these.
    pub fn is_elementwise(&self) -> bool {
        matches!(self, Op::Unary { .. } | Op::Binary { .. } | Op::Where | Op::Cast { .. })
    }
}
