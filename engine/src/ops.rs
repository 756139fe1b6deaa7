//! The user-facing ops of [`Tensor`]. Each one applies PyTorch's type
//! promotion (inserting explicit casts) and argument conventions (negative
//! axes, Python-style slices), then records primitives of the trace IR.
//! Composites (softmax, layer_norm, linear, ...) are built from primitives.

use trace_ir::shape::{broadcast_shapes, normalize_axis};
use trace_ir::{
    result_type, ArgReduceOp, Axes, BinaryOp, Category, DType, Distribution, Error, Meta, Op,
    Operand, ReduceOp, Result, Shape, UnaryOp,
};

use crate::{BoundsMessage, Context, Tensor};

/// A Rust number passed to an op. Its value becomes a runtime parameter of the
/// trace, so changing it recompiles nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Float(f64),
    Int(i64),
    Bool(bool),
}

impl Scalar {
    fn category(self) -> Category {
        match self {
            Scalar::Float(_) => Category::Float,
            Scalar::Int(_) => Category::Int,
            Scalar::Bool(_) => Category::Bool,
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Scalar::Float(v) => v,
            Scalar::Int(v) => v as f64,
            Scalar::Bool(v) => v as u8 as f64,
        }
    }
}

/// The right-hand side of a binary op: a tensor or a scalar.
#[derive(Debug, Clone)]
pub enum ScalarOrTensor {
    Tensor(Tensor),
    Scalar(Scalar),
}

impl From<&Tensor> for ScalarOrTensor {
    fn from(t: &Tensor) -> Self {
        ScalarOrTensor::Tensor(t.clone())
    }
}
impl From<Tensor> for ScalarOrTensor {
    fn from(t: Tensor) -> Self {
        ScalarOrTensor::Tensor(t)
    }
}
macro_rules! scalar_from {
    ($($t:ty => $variant:ident as $cast:ty),*) => {$(
        impl From<$t> for ScalarOrTensor {
            fn from(v: $t) -> Self {
                ScalarOrTensor::Scalar(Scalar::$variant(v as $cast))
            }
        }
    )*};
}
scalar_from!(f64 => Float as f64, f32 => Float as f64, i64 => Int as i64, i32 => Int as i64, usize => Int as i64);
impl From<bool> for ScalarOrTensor {
    fn from(v: bool) -> Self {
        ScalarOrTensor::Scalar(Scalar::Bool(v))
    }
}

/// Which GELU to compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GeluApproximation {
    /// The exact form, with erf (PyTorch's default).
    #[default]
    None,
    /// PyTorch's `approximate="tanh"`.
    Tanh,
}

impl ScalarOrTensor {
    fn operand(&self) -> Operand {
        match self {
            ScalarOrTensor::Tensor(t) => t.operand(),
            ScalarOrTensor::Scalar(s) => Operand::Scalar(s.category()),
        }
    }

    fn shape(&self) -> &[usize] {
        match self {
            ScalarOrTensor::Tensor(t) => t.shape(),
            ScalarOrTensor::Scalar(_) => &[],
        }
    }

    /// The operand as a tensor of `dtype`: a scalar becomes a zero-dimensional
    /// parameter already converted to `dtype` (one rounding, as PyTorch does).
    /// In DeferAndFuse the few values rewrites need to see ([`is_rewrite_literal`])
    /// are recorded as literal constants instead.
    #[track_caller]
    fn to_tensor(&self, ctx: &Context, dtype: DType) -> Result<Tensor> {
        match self {
            // A tensor of another context (the binding's other modes) is
            // imported, as `to_context` does, rather than refused.
            ScalarOrTensor::Tensor(t) => t.to_context(ctx)?.to_dtype(dtype),
            ScalarOrTensor::Scalar(s)
                if ctx.mode() == crate::Mode::DeferAndFuse
                    && is_rewrite_literal(s.as_f64(), dtype) =>
            {
                ctx.full(s.as_f64(), &[], dtype)
            }
            ScalarOrTensor::Scalar(s) => ctx.tensor_from_host(
                Meta::new(Shape::new(), dtype),
                runtime::HostData::filled(dtype, s.as_f64(), 1),
            ),
        }
    }
}

pub use rewrite_rules::literals::is_rule_literal as is_rewrite_literal;

/// Constructors.
impl Context {
    /// A literal constant: its value is part of the trace (use a scalar
    /// operand instead for values that change between calls).
    #[track_caller]
    pub fn full(&self, value: f64, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.record(Op::Full { value, shape: shape.into(), dtype }, &[])
    }

    #[track_caller]
    pub fn zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.full(0.0, shape, dtype)
    }

    #[track_caller]
    pub fn ones(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.full(1.0, shape, dtype)
    }

    /// `start, start + step, ...` below `end` (above it for a negative step).
    #[track_caller]
    pub fn arange(&self, start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(Error::attr("arange", format!("invalid range {start}..{end} step {step}")));
        }
        let len = ((end - start) / step).ceil().max(0.0) as usize;
        self.record(Op::Arange { start, step, len, dtype }, &[])
    }

    /// Uniform values on [0, 1), a pure function of `seed`.
    #[track_caller]
    pub fn rand(&self, shape: &[usize], dtype: DType, seed: u64) -> Result<Tensor> {
        self.record(
            Op::Random { seed, dist: Distribution::Uniform, shape: shape.into(), dtype },
            &[],
        )
    }

    /// Standard normal values, a pure function of `seed`.
    #[track_caller]
    pub fn randn(&self, shape: &[usize], dtype: DType, seed: u64) -> Result<Tensor> {
        self.record(
            Op::Random { seed, dist: Distribution::Normal, shape: shape.into(), dtype },
            &[],
        )
    }
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $kind:ident),* $(,)?) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(&self) -> Result<Tensor> {
            self.unary(UnaryOp::$kind)
        }
    )*};
}

macro_rules! binary_methods {
    ($($name:ident => $kind:ident),* $(,)?) => {$(
        #[track_caller]
        pub fn $name(&self, rhs: impl Into<ScalarOrTensor>) -> Result<Tensor> {
            self.binary(BinaryOp::$kind, rhs.into())
        }
    )*};
}

/// Elementwise ops.
impl Tensor {
    fn operand(&self) -> Operand {
        if self.rank() == 0 {
            Operand::ZeroDim(self.dtype())
        } else {
            Operand::Tensor(self.dtype())
        }
    }

    /// The dtype `self` and `rhs` promote to, as `torch.result_type` gives it.
    pub fn result_type(&self, rhs: &ScalarOrTensor) -> DType {
        result_type(&[self.operand(), rhs.operand()])
    }

    fn ctx(&self) -> Context {
        self.context()
    }

    /// Converts to `dtype`; a no-op (the same tensor) when it already is.
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        self.ctx().record(Op::Cast { to: dtype }, &[self])
    }

    #[track_caller]
    fn unary(&self, kind: UnaryOp) -> Result<Tensor> {
        let x = match kind {
            k if k.needs_float() && !self.dtype().is_float() => self.to_dtype(DType::F32)?,
            UnaryOp::LogicalNot => self.to_dtype(DType::Bool)?,
            _ => self.clone(),
        };
        self.ctx().record(Op::Unary { kind }, &[&x])
    }

    unary_methods! {
        neg => Neg, abs => Abs, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt,
        reciprocal => Reciprocal, tanh => Tanh, sigmoid => Sigmoid, relu => Relu, silu => Silu,
        sin => Sin, cos => Cos, floor => Floor, sign => Sign, logical_not => LogicalNot,
    }

    #[track_caller]
    pub fn gelu(&self, approximate: GeluApproximation) -> Result<Tensor> {
        self.unary(match approximate {
            GeluApproximation::None => UnaryOp::GeluErf,
            GeluApproximation::Tanh => UnaryOp::GeluTanh,
        })
    }

    #[track_caller]
    fn binary(&self, kind: BinaryOp, rhs: ScalarOrTensor) -> Result<Tensor> {
        let name = kind.name();
        // Check shapes before any cast is recorded, so a bad call records nothing.
        broadcast_shapes(name, self.shape(), rhs.shape())?;
        let common = self.result_type(&rhs);
        let compute = match kind {
            BinaryOp::LogicalAnd | BinaryOp::LogicalOr => DType::Bool,
            BinaryOp::Div if !common.is_float() => DType::F32,
            _ => common,
        };
        if compute == DType::Bool && !kind.returns_bool() {
            return Err(Error::dtype(
                name,
                "arithmetic on bool tensors is not supported",
                &[self.dtype(), common],
            ));
        }
        let ctx = self.ctx();
        let a = self.to_dtype(compute)?;
        let b = rhs.to_tensor(&ctx, compute)?;
        ctx.record(Op::Binary { kind }, &[&a, &b])
    }

    binary_methods! {
        add => Add, sub => Sub, mul => Mul, div => Div, pow => Pow, maximum => Maximum, minimum => Minimum,
        eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge,
        logical_and => LogicalAnd, logical_or => LogicalOr,
    }

    /// `self ? on_true : on_false`, elementwise with broadcasting; `self` is
    /// the condition (cast to bool if it is not).
    #[track_caller]
    pub fn where_cond(
        &self,
        on_true: impl Into<ScalarOrTensor>,
        on_false: impl Into<ScalarOrTensor>,
    ) -> Result<Tensor> {
        let (t, f) = (on_true.into(), on_false.into());
        let s = broadcast_shapes("where", self.shape(), t.shape())?;
        broadcast_shapes("where", &s, f.shape())?;
        let dtype = result_type(&[t.operand(), f.operand()]);
        let ctx = self.ctx();
        let cond = self.to_dtype(DType::Bool)?;
        let (t, f) = (t.to_tensor(&ctx, dtype)?, f.to_tensor(&ctx, dtype)?);
        ctx.record(Op::Where, &[&cond, &t, &f])
    }
}

/// Reductions.
impl Tensor {
    fn axes(&self, op: &str, axes: &[i64]) -> Result<Axes> {
        let mut out = Axes::new();
        for &a in axes {
            let a = normalize_axis(op, a, self.rank())?;
            if out.contains(&a) {
                return Err(Error::attr(op, format!("axis {a} is repeated")));
            }
            out.push(a);
        }
        out.sort_unstable();
        Ok(out)
    }

    #[track_caller]
    fn reduce(&self, kind: ReduceOp, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        let axes = self.axes(kind.name(), axes)?;
        let x = match kind {
            // PyTorch sums and multiplies integers and bools in i64.
            ReduceOp::Sum | ReduceOp::Prod if !self.dtype().is_float() => {
                self.to_dtype(DType::I64)?
            }
            ReduceOp::Mean if !self.dtype().is_float() => {
                return Err(Error::dtype(
                    "mean",
                    "needs a floating input; cast it first",
                    &[self.dtype()],
                ))
            }
            _ => self.clone(),
        };
        self.ctx().record(Op::Reduce { kind, axes, keepdim }, &[&x])
    }

    #[track_caller]
    pub fn sum(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, axes, keepdim)
    }
    #[track_caller]
    pub fn mean(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, axes, keepdim)
    }
    #[track_caller]
    pub fn max(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, axes, keepdim)
    }
    #[track_caller]
    pub fn min(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, axes, keepdim)
    }
    #[track_caller]
    pub fn prod(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Prod, axes, keepdim)
    }

    /// Sum of every element, as a zero-dimensional tensor.
    #[track_caller]
    pub fn sum_all(&self) -> Result<Tensor> {
        let all: Vec<i64> = (0..self.rank() as i64).collect();
        self.sum(&all, false)
    }

    #[track_caller]
    fn arg_reduce(&self, kind: ArgReduceOp, axis: Option<i64>, keepdim: bool) -> Result<Tensor> {
        let name = if kind == ArgReduceOp::Argmax { "argmax" } else { "argmin" };
        match axis {
            Some(a) => {
                let axis = normalize_axis(name, a, self.rank())?;
                self.ctx().record(Op::ArgReduce { kind, axis, keepdim }, &[self])
            }
            // No axis: over the flattened tensor, as PyTorch does.
            None => self.reshape(&[self.numel()])?.arg_reduce(kind, Some(0), false),
        }
    }

    #[track_caller]
    pub fn argmax(&self, axis: Option<i64>, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(ArgReduceOp::Argmax, axis, keepdim)
    }
    #[track_caller]
    pub fn argmin(&self, axis: Option<i64>, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(ArgReduceOp::Argmin, axis, keepdim)
    }
}

/// Layout ops.
impl Tensor {
    #[track_caller]
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        self.ctx().record(Op::Reshape { shape: shape.into() }, &[self])
    }

    /// Broadcasts to `shape` (PyTorch's `expand`).
    #[track_caller]
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        self.ctx().record(Op::Expand { shape: shape.into() }, &[self])
    }

    #[track_caller]
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        self.ctx().record(Op::Permute { perm: perm.into() }, &[self])
    }

    #[track_caller]
    pub fn transpose(&self, a: i64, b: i64) -> Result<Tensor> {
        if self.rank() == 0 {
            return Ok(self.clone());
        }
        let (a, b) = (
            normalize_axis("transpose", a, self.rank())?,
            normalize_axis("transpose", b, self.rank())?,
        );
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// The transpose of the last two dimensions.
    #[track_caller]
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::shape("t", "needs at least two dimensions", &[&self.meta().shape]));
        }
        self.transpose(-2, -1)
    }

    #[track_caller]
    pub fn unsqueeze(&self, axis: i64) -> Result<Tensor> {
        let axis = normalize_axis("unsqueeze", axis, self.rank() + 1)?;
        let mut shape: Vec<usize> = self.shape().to_vec();
        shape.insert(axis, 1);
        self.reshape(&shape)
    }

    /// Python-style slice `[start:stop:step]` along `axis`: negative indices
    /// count from the end and out-of-range bounds are clamped.
    #[track_caller]
    pub fn slice(&self, axis: i64, start: i64, stop: i64, step: usize) -> Result<Tensor> {
        if self.rank() == 0 {
            return Err(Error::shape(
                "slice",
                "cannot slice a zero-dimensional tensor",
                &[&self.meta().shape],
            ));
        }
        let axis = normalize_axis("slice", axis, self.rank())?;
        if step == 0 {
            return Err(Error::attr("slice", "step must be positive"));
        }
        let dim = self.shape()[axis] as i64;
        let clamp = |i: i64| (if i < 0 { i + dim } else { i }).clamp(0, dim) as usize;
        let (start, stop) = (clamp(start), clamp(stop));
        let stop = stop.max(start);
        self.ctx().record(Op::Slice { axis, start, stop, step }, &[self])
    }

    /// Joins tensors along `axis` (with type promotion).
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], axis: i64) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(Error::attr("cat", "needs at least one tensor"));
        };
        let axis = normalize_axis("cat", axis, first.rank())?;
        let dtype =
            result_type(&tensors.iter().map(|t| Operand::Tensor(t.dtype())).collect::<Vec<_>>());
        // A loop, not a closure: a closure would end the `#[track_caller]` chain here.
        // Tensors of other contexts are imported into the first one's.
        let ctx = first.ctx();
        let mut cast = Vec::with_capacity(tensors.len());
        for t in tensors {
            cast.push(t.to_context(&ctx)?.to_dtype(dtype)?);
        }
        let refs: Vec<&Tensor> = cast.iter().collect();
        ctx.record(Op::Concat { axis }, &refs)
    }
}

/// Row gathers and scatters: embedding lookups and their gradients.
impl Tensor {
    /// Rows `indices[i]` of this table, as PyTorch's `index_select(0,
    /// indices)` for 1-d integer `indices` in `0..rows`. An index out of
    /// range fails as [`Tensor::check_index`] says, naming `index_select`.
    #[track_caller]
    pub fn gather_rows(&self, indices: &Tensor) -> Result<Tensor> {
        let indices = indices.to_context(&self.ctx())?;
        let out = self.gather_rows_unchecked(&indices)?;
        let rows = self.shape().first().copied().unwrap_or(0);
        indices.check_index(rows, "index_select", 0, BoundsMessage::OutOfRangeInSelf)?;
        Ok(out)
    }

    /// [`Tensor::gather_rows`] for a caller that checks the indices itself
    /// (a binding naming its own op and call site): an index out of range
    /// reads the nearest row.
    #[track_caller]
    pub fn gather_rows_unchecked(&self, indices: &Tensor) -> Result<Tensor> {
        let indices = indices.to_context(&self.ctx())?;
        self.ctx().record(Op::GatherRows, &[self, &indices])
    }

    /// `rows` rows of zeros, plus row `i` of this tensor added to row
    /// `indices[i]` in order of `i`: PyTorch's `index_add(0, indices, self)`
    /// into zeros, the gradient of [`Tensor::gather_rows`]. An index out of
    /// range fails as [`Tensor::check_index`] says, naming `index_add`.
    #[track_caller]
    pub fn scatter_add_rows(&self, indices: &Tensor, rows: usize) -> Result<Tensor> {
        let indices = indices.to_context(&self.ctx())?;
        let out = self.scatter_add_rows_unchecked(&indices, rows)?;
        indices.check_index(rows, "index_add", 0, BoundsMessage::OutOfRangeInSelf)?;
        Ok(out)
    }

    /// [`Tensor::scatter_add_rows`] for a caller that checks the indices
    /// itself: a row out of range adds nothing.
    #[track_caller]
    pub fn scatter_add_rows_unchecked(&self, indices: &Tensor, rows: usize) -> Result<Tensor> {
        let indices = indices.to_context(&self.ctx())?;
        self.ctx().record(Op::ScatterAddRows { rows }, &[&indices, self])
    }
}

/// Matrix products and composites.
impl Tensor {
    /// PyTorch's `matmul`: 1-D operands are promoted to matrices and the added
    /// dimension removed again; batch dimensions broadcast.
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(Error::shape(
                "matmul",
                "operands must have at least one dimension",
                &[&self.meta().shape, &rhs.meta().shape],
            ));
        }
        let a = if self.rank() == 1 { self.unsqueeze(0)? } else { self.clone() };
        // A right-hand side of another context is imported into this one's.
        let rhs_here = rhs.to_context(&self.ctx())?;
        let b = if rhs.rank() == 1 { rhs_here.unsqueeze(-1)? } else { rhs_here };
        let out = self.ctx().record(Op::MatMul, &[&a, &b]).map_err(|e| match e {
            // Name the user's shapes, not the promoted ones.
            Error::Shape { msg, .. } => Error::Shape {
                op: "matmul".into(),
                msg,
                shapes: vec![self.meta().shape.clone(), rhs.meta().shape.clone()],
            },
            other => other,
        })?;
        let mut shape = out.shape().to_vec();
        if rhs.rank() == 1 {
            shape.pop();
        }
        if self.rank() == 1 {
            shape.remove(shape.len() - if rhs.rank() == 1 { 1 } else { 2 });
        }
        out.reshape(&shape)
    }

    #[track_caller]
    fn float(&self) -> Result<Tensor> {
        if self.dtype().is_float() {
            Ok(self.clone())
        } else {
            self.to_dtype(DType::F32)
        }
    }

    /// `exp(x - max) / sum(exp(x - max))` along `axis`.
    #[track_caller]
    pub fn softmax(&self, axis: i64) -> Result<Tensor> {
        let group = self.ctx().op_group("softmax");
        let shifted = self.float()?.shifted_by_max("softmax", axis)?;
        let e = shifted.exp()?;
        group.end(e.div(&e.sum(&[axis], true)?))
    }

    /// `x - max - log(sum(exp(x - max)))` along `axis`.
    #[track_caller]
    pub fn log_softmax(&self, axis: i64) -> Result<Tensor> {
        let group = self.ctx().op_group("log_softmax");
        let shifted = self.float()?.shifted_by_max("log_softmax", axis)?;
        group.end(shifted.sub(&shifted.exp()?.sum(&[axis], true)?.log()?))
    }

    /// `x - max(x)` along `axis`, the shift that keeps softmax's exp finite;
    /// `x` itself over an empty axis, where the result is empty and a max
    /// of nothing would be refused (PyTorch's softmax of an empty axis is
    /// empty, not an error).
    #[track_caller]
    fn shifted_by_max(&self, op: &str, axis: i64) -> Result<Tensor> {
        let a = trace_ir::shape::normalize_axis(op, axis, self.rank())?;
        if self.shape().get(a) == Some(&0) {
            return Ok(self.clone());
        }
        self.sub(&self.max(&[axis], true)?)
    }

    fn trailing_axes(&self, op: &str, normalized_shape: &[usize]) -> Result<Vec<i64>> {
        let n = normalized_shape.len();
        if n == 0 || n > self.rank() || self.shape()[self.rank() - n..] != *normalized_shape {
            return Err(Error::shape(
                op,
                "normalized_shape must match the trailing dimensions",
                &[&self.meta().shape, &normalized_shape.into()],
            ));
        }
        Ok((-(n as i64)..0).collect())
    }

    /// LayerNorm over the trailing `normalized_shape` dimensions (biased
    /// variance, as PyTorch), with optional elementwise affine parameters.
    #[track_caller]
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let axes = self.trailing_axes("layer_norm", normalized_shape)?;
        let group = self.ctx().op_group("layer_norm");
        let x = self.float()?;
        let centered = x.sub(&x.mean(&axes, true)?)?;
        let var = centered.mul(&centered)?.mean(&axes, true)?;
        let mut y = centered.mul(&var.add(eps)?.rsqrt()?)?;
        if let Some(w) = weight {
            y = y.mul(w)?;
        }
        if let Some(b) = bias {
            y = y.add(b)?;
        }
        group.end(Ok(y))
    }

    /// RMSNorm over the trailing `normalized_shape` dimensions.
    #[track_caller]
    pub fn rms_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let axes = self.trailing_axes("rms_norm", normalized_shape)?;
        let group = self.ctx().op_group("rms_norm");
        let x = self.float()?;
        let y = x.mul(&x.mul(&x)?.mean(&axes, true)?.add(eps)?.rsqrt()?)?;
        group.end(match weight {
            Some(w) => y.mul(w),
            None => Ok(y),
        })
    }

    /// `x @ weight.T + bias`, with `weight` of shape `[out, in]` as in `torch.nn.Linear`.
    #[track_caller]
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let group = self.ctx().op_group("linear");
        let y = self.matmul(&weight.t()?)?;
        group.end(match bias {
            Some(b) => y.add(b),
            None => Ok(y),
        })
    }
}

macro_rules! std_binary_op {
    ($trait:ident, $method:ident) => {
        impl<R: Into<ScalarOrTensor>> std::ops::$trait<R> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: R) -> Result<Tensor> {
                Tensor::$method(self, rhs)
            }
        }
        impl<R: Into<ScalarOrTensor>> std::ops::$trait<R> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: R) -> Result<Tensor> {
                Tensor::$method(&self, rhs)
            }
        }
    };
}

std_binary_op!(Add, add);
std_binary_op!(Sub, sub);
std_binary_op!(Mul, mul);
std_binary_op!(Div, div);

impl std::ops::Neg for &Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}

impl std::ops::Neg for Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(&self)
    }
}
