//! Shape and dtype inference: the single place that decides whether an op
//! accepts its inputs. It runs when an op is recorded (so errors surface at the
//! user's call in every mode) and again when a trace is loaded from JSON.

use serde::{Deserialize, Serialize};

use crate::shape::{broadcast_shapes, checked_numel, numel, shape};
use crate::{DType, Error, Op, Result, Shape};

/// What a node produces.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Meta {
    pub shape: Shape,
    pub dtype: DType,
}

impl Meta {
    pub fn new(shape: Shape, dtype: DType) -> Self {
        Meta { shape, dtype }
    }
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    pub fn size_in_bytes(&self) -> usize {
        self.numel() * self.dtype.size_in_bytes()
    }
}

/// Infers the output of `op` applied to `inputs`, or says why it cannot apply.
pub fn infer(op: &Op, inputs: &[&Meta]) -> Result<Meta> {
    let meta = infer_unchecked(op, inputs)?;
    if checked_numel(&meta.shape).is_none() {
        return Err(Error::attr(
            op.name(),
            format!("output shape {:?} has too many elements", meta.shape.as_slice()),
        ));
    }
    Ok(meta)
}

fn infer_unchecked(op: &Op, inputs: &[&Meta]) -> Result<Meta> {
    let name = op.name();
    let arity = match op {
        Op::Parameter { .. } | Op::Full { .. } | Op::Arange { .. } | Op::Random { .. } => Some(0),
        Op::Unary { .. } | Op::Cast { .. } | Op::Reduce { .. } | Op::ArgReduce { .. } => Some(1),
        Op::Expand { .. } | Op::Reshape { .. } | Op::Permute { .. } | Op::Slice { .. } => Some(1),
        Op::Softmax { .. } | Op::LogSoftmax { .. } => Some(1),
        Op::Binary { .. } | Op::MatMul | Op::LayerNorm { .. } | Op::RmsNorm { .. } => Some(2),
        Op::GatherRows | Op::ScatterAddRows { .. } => Some(2),
        Op::Where => Some(3),
        Op::Concat { .. } => None,
    };
    if let Some(n) = arity {
        if inputs.len() != n {
            return Err(Error::attr(name, format!("takes {n} inputs, got {}", inputs.len())));
        }
    }
    let shapes: Vec<&Shape> = inputs.iter().map(|m| &m.shape).collect();
    let new_shape = match op {
        Op::Parameter { shape, .. } | Op::Full { shape, .. } | Op::Random { shape, .. } => {
            Some(shape.as_slice())
        }
        Op::Expand { shape } | Op::Reshape { shape } => Some(shape.as_slice()),
        Op::Arange { len, .. } => Some(std::slice::from_ref(len)),
        _ => None,
    };
    if let Some(s) = new_shape.filter(|s| checked_numel(s).is_none()) {
        return Err(Error::attr(name, format!("shape {s:?} has too many elements")));
    }
    let dtypes: Vec<DType> = inputs.iter().map(|m| m.dtype).collect();
    match op {
        Op::Parameter { shape, dtype, .. } | Op::Full { shape, dtype, .. } => {
            Ok(Meta::new(shape.clone(), *dtype))
        }
        Op::Arange { len, dtype, .. } => Ok(Meta::new(shape(&[*len]), *dtype)),
        Op::Random { shape, dtype, .. } => {
            if !dtype.is_float() {
                return Err(Error::dtype(name, "random values need a floating dtype", &[*dtype]));
            }
            Ok(Meta::new(shape.clone(), *dtype))
        }
        Op::Unary { kind } => {
            let d = dtypes[0];
            let ok = if *kind == crate::UnaryOp::LogicalNot {
                d == DType::Bool
            } else if kind.needs_float() {
                d.is_float()
            } else {
                d != DType::Bool
            };
            if !ok {
                return Err(Error::dtype(name, "input dtype not supported", &dtypes));
            }
            Ok(Meta::new(shapes[0].clone(), d))
        }
        Op::Binary { kind } => {
            let out_shape = broadcast_shapes(name, shapes[0], shapes[1])?;
            if dtypes[0] != dtypes[1] {
                return Err(Error::dtype(name, "operands must share one dtype", &dtypes));
            }
            let d = dtypes[0];
            let ok = if kind.is_logical() {
                d == DType::Bool
            } else if *kind == crate::BinaryOp::Div {
                d.is_float()
            } else if kind.returns_bool() {
                true
            } else {
                d != DType::Bool
            };
            if !ok {
                return Err(Error::dtype(name, "operand dtype not supported", &dtypes));
            }
            Ok(Meta::new(out_shape, if kind.returns_bool() { DType::Bool } else { d }))
        }
        Op::Where => {
            if dtypes[0] != DType::Bool {
                return Err(Error::dtype(name, "condition must be bool", &dtypes));
            }
            if dtypes[1] != dtypes[2] {
                return Err(Error::dtype(name, "branches must share one dtype", &dtypes));
            }
            let s = broadcast_shapes(name, shapes[0], shapes[1])?;
            let s = broadcast_shapes(name, &s, shapes[2]).map_err(|_| {
                Error::shape(name, "cannot broadcast condition and branches", &shapes)
            })?;
            Ok(Meta::new(s, dtypes[1]))
        }
        Op::Cast { to } => Ok(Meta::new(shapes[0].clone(), *to)),
        Op::Reduce { kind, axes, keepdim } => {
            let rank = shapes[0].len();
            check_axes(name, axes, rank)?;
            if dtypes[0] == DType::Bool || (*kind == crate::ReduceOp::Mean && !dtypes[0].is_float())
            {
                return Err(Error::dtype(name, "input dtype not supported", &dtypes));
            }
            // A max or min of nothing has no value, even where no output
            // element asks for one: PyTorch raises at the call.
            let extreme = matches!(kind, crate::ReduceOp::Max | crate::ReduceOp::Min);
            if extreme && axes.iter().any(|&a| shapes[0][a] == 0) {
                return Err(Error::shape(name, "cannot reduce over an empty axis", &shapes));
            }
            Ok(Meta::new(reduced_shape(shapes[0], axes, *keepdim), dtypes[0]))
        }
        Op::ArgReduce { axis, keepdim, .. } => {
            check_axes(name, &[*axis], shapes[0].len())?;
            if dtypes[0] == DType::Bool {
                return Err(Error::dtype(name, "input dtype not supported", &dtypes));
            }
            if shapes[0][*axis] == 0 {
                return Err(Error::shape(
                    name,
                    "cannot take an arg-reduction over an empty axis",
                    &shapes,
                ));
            }
            Ok(Meta::new(reduced_shape(shapes[0], &[*axis], *keepdim), DType::I64))
        }
        Op::Expand { shape } => {
            let b = broadcast_shapes(name, shapes[0], shape)?;
            if b != *shape {
                return Err(Error::shape(
                    name,
                    "cannot expand to a smaller or incompatible shape",
                    &[shapes[0], shape],
                ));
            }
            Ok(Meta::new(shape.clone(), dtypes[0]))
        }
        Op::Reshape { shape } => {
            if numel(shape) != numel(shapes[0]) {
                return Err(Error::shape(name, "element counts differ", &[shapes[0], shape]));
            }
            Ok(Meta::new(shape.clone(), dtypes[0]))
        }
        Op::Permute { perm } => {
            let rank = shapes[0].len();
            let mut seen = vec![false; rank];
            for &p in perm {
                if p >= rank || std::mem::replace(&mut seen[p], true) {
                    return Err(Error::attr(
                        name,
                        format!("{perm:?} is not a permutation of 0..{rank}"),
                    ));
                }
            }
            if perm.len() != rank {
                return Err(Error::attr(
                    name,
                    format!("{perm:?} is not a permutation of 0..{rank}"),
                ));
            }
            Ok(Meta::new(perm.iter().map(|&p| shapes[0][p]).collect(), dtypes[0]))
        }
        Op::Slice { axis, start, stop, step } => {
            check_axes(name, &[*axis], shapes[0].len())?;
            let dim = shapes[0][*axis];
            if *step == 0 || start > stop || *stop > dim {
                return Err(Error::attr(
                    name,
                    format!("slice {start}..{stop} step {step} is invalid for axis {axis} of size {dim}"),
                ));
            }
            let mut s = shapes[0].clone();
            s[*axis] = (stop - start).div_ceil(*step);
            Ok(Meta::new(s, dtypes[0]))
        }
        Op::Concat { axis } => {
            let Some(first) = inputs.first() else {
                return Err(Error::attr(name, "needs at least one input"));
            };
            check_axes(name, &[*axis], first.shape.len())?;
            let mut out = first.shape.clone();
            out[*axis] = 0;
            for m in inputs {
                if m.dtype != first.dtype {
                    return Err(Error::dtype(name, "inputs must share one dtype", &dtypes));
                }
                let same_rank = m.shape.len() == first.shape.len();
                if !same_rank || (0..out.len()).any(|i| i != *axis && m.shape[i] != first.shape[i])
                {
                    return Err(Error::shape(
                        name,
                        format!("inputs must match except along axis {axis}"),
                        &shapes,
                    ));
                }
                out[*axis] += m.shape[*axis];
            }
            Ok(Meta::new(out, first.dtype))
        }
        Op::MatMul => {
            let (a, b) = (shapes[0], shapes[1]);
            if a.len() < 2 || b.len() < 2 {
                return Err(Error::shape(name, "operands need at least two dimensions", &shapes));
            }
            if dtypes[0] != dtypes[1] || !dtypes[0].is_float() {
                return Err(Error::dtype(name, "operands must share one floating dtype", &dtypes));
            }
            let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
            let (k2, n) = (b[b.len() - 2], b[b.len() - 1]);
            if k != k2 {
                return Err(Error::shape(
                    name,
                    format!("inner dimensions differ ({k} vs {k2})"),
                    &shapes,
                ));
            }
            let mut out = broadcast_shapes(name, &a[..a.len() - 2], &b[..b.len() - 2])
                .map_err(|_| Error::shape(name, "batch dimensions do not broadcast", &shapes))?;
            out.push(m);
            out.push(n);
            Ok(Meta::new(out, dtypes[0]))
        }
        Op::GatherRows | Op::ScatterAddRows { .. } => {
            let gather = matches!(op, Op::GatherRows);
            let (rows, idx) = if gather { (0, 1) } else { (1, 0) };
            if !matches!(dtypes[idx], DType::I32 | DType::I64) {
                return Err(Error::dtype(name, "indices must be i32 or i64", &dtypes));
            }
            if !gather && dtypes[rows] == DType::Bool {
                return Err(Error::dtype(name, "cannot add bool updates", &dtypes));
            }
            if shapes[idx].len() != 1 || shapes[rows].is_empty() {
                return Err(Error::shape(
                    name,
                    "needs 1-d indices and a table of at least one dimension",
                    &shapes,
                ));
            }
            let mut out = shapes[rows].clone();
            match op {
                Op::ScatterAddRows { rows: n } => {
                    if out[0] != shapes[idx][0] {
                        return Err(Error::shape(
                            name,
                            "needs one row of updates per index",
                            &shapes,
                        ));
                    }
                    out[0] = *n;
                }
                _ => out[0] = shapes[idx][0],
            }
            Ok(Meta::new(out, dtypes[rows]))
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => check_row_op(op, name, inputs, &[*axis]),
        Op::LayerNorm { axes } | Op::RmsNorm { axes } => check_row_op(op, name, inputs, axes),
    }
}

fn check_row_op(op: &Op, name: &str, inputs: &[&Meta], axes: &[usize]) -> Result<Meta> {
    let x = inputs[0];
    check_axes(name, axes, x.shape.len())?;
    if !x.dtype.is_float() {
        return Err(Error::dtype(name, "needs a floating input", &[x.dtype]));
    }
    if matches!(op, Op::LayerNorm { .. } | Op::RmsNorm { .. }) {
        let eps = inputs[1];
        if !eps.shape.is_empty() || eps.dtype != x.dtype {
            return Err(Error::shape(
                name,
                "eps must be a zero-dimensional tensor of the input's dtype",
                &[&x.shape, &eps.shape],
            ));
        }
    }
    Ok(x.clone())
}

fn check_axes(op: &str, axes: &[usize], rank: usize) -> Result<()> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= rank {
            return Err(Error::attr(op, format!("axis {a} is out of range for rank {rank}")));
        }
        if axes[..i].contains(&a) {
            return Err(Error::attr(op, format!("axis {a} is repeated")));
        }
    }
    Ok(())
}

/// The shape left after reducing `axes`.
pub fn reduced_shape(input: &[usize], axes: &[usize], keepdim: bool) -> Shape {
    let mut out = Shape::new();
    for (i, &d) in input.iter().enumerate() {
        if axes.contains(&i) {
            if keepdim {
                out.push(1);
            }
        } else {
            out.push(d);
        }
    }
    out
}
