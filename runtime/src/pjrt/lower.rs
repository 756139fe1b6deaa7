//! Lowering of a trace to StableHLO, as MLIR text.
//!
//! One trace becomes one module with one function, `@main`: its arguments
//! are the trace's parameters in parameter order (`%argK` is parameter K),
//! its results the trace's outputs in order. XLA fuses inside the module.
//!
//! The text is canonical: nodes no output needs are dropped, values are
//! numbered `%0, %1, ...` in emission order, which follows the trace's node
//! order, and every op is printed in MLIR's generic form with attributes in
//! a fixed order. Structurally equal traces give byte-equal text, so a hash
//! of it keys the executable cache.
//!
//! Numerics follow the native CPU backend's rules where XLA allows:
//! - bf16 and f16 compute in f32 and round once at each op's output (the
//!   fused row forms round once at their output);
//! - integer ops wrap in their own width (what the CPU backend's i64
//!   arithmetic gives after wrapping back);
//! - float sums, means and products accumulate in f32 (the CPU backend uses
//!   f64; [`LowerOptions::accumulate_f64`] matches it at some speed cost);
//! - argmax/argmin return the first extreme index, NaN counting as the
//!   extreme, via a two-operand `reduce`;
//! - `Random` reproduces the CPU backend's documented stream (splitmix64 over
//!   the flat element index, in `ui64`; Box-Muller in f64 for normals).

use std::fmt::Write;

use half::{bf16, f16};
use trace_ir::consts;
use trace_ir::{ArgReduceOp, BinaryOp, DType, Error, Meta, Op, ReduceOp, Result, Trace, UnaryOp};

/// Knobs of the lowering; part of the cache key through the text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LowerOptions {
    /// Accumulate float reductions in f64 (as the CPU reference does).
    pub accumulate_f64: bool,
}

/// The lowered module and what its signature holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Lowered {
    pub text: String,
    /// Meta of each argument, in parameter order.
    pub params: Vec<Meta>,
    /// Meta of each result, in output order.
    pub outputs: Vec<Meta>,
}

impl Lowered {
    /// The module with each `(param, output)` pair of `aliases` marked
    /// `tf.aliasing_output`: XLA writes that output into the parameter's
    /// buffer (buffer donation), which the caller must no longer need. Pairs
    /// must match in shape and dtype; no parameter or output twice.
    pub fn with_aliases(&self, aliases: &[(usize, usize)]) -> String {
        if aliases.is_empty() {
            return self.text.clone();
        }
        let args: Vec<String> = self
            .params
            .iter()
            .enumerate()
            .map(|(k, m)| {
                let ty = tensor(&m.shape, Ty::of(m.dtype));
                match aliases.iter().find(|(p, _)| *p == k) {
                    Some((_, out)) => format!("%arg{k}: {ty} {{tf.aliasing_output = {out} : i32}}"),
                    None => format!("%arg{k}: {ty}"),
                }
            })
            .collect();
        let plain: Vec<String> = self
            .params
            .iter()
            .enumerate()
            .map(|(k, m)| format!("%arg{k}: {}", tensor(&m.shape, Ty::of(m.dtype))))
            .collect();
        let (old, new) =
            (format!("@main({})", plain.join(", ")), format!("@main({})", args.join(", ")));
        debug_assert!(self.text.contains(&old));
        self.text.replacen(&old, &new, 1)
    }
}

/// Lowers `trace` to a StableHLO module (MLIR text) with default options.
pub fn lower(trace: &Trace) -> Result<String> {
    Ok(lower_with(trace, LowerOptions::default())?.text)
}

/// Lowers `trace` to a StableHLO module.
pub fn lower_with(trace: &Trace, options: LowerOptions) -> Result<Lowered> {
    trace.validate()?;
    let mut e = Emitter { body: String::new(), next: 0, options };
    let n = trace.len();
    let mut live = vec![false; n];
    for &o in &trace.outputs {
        live[o] = true;
    }
    for id in (0..n).rev() {
        if live[id] {
            for &i in &trace.nodes[id].inputs {
                live[i] = true;
            }
        }
    }
    let params = trace.parameters();
    let mut vals: Vec<Option<V>> = vec![None; n];
    for (k, &id) in params.iter().enumerate() {
        let m = &trace.nodes[id].meta;
        vals[id] =
            Some(V { name: format!("%arg{k}"), shape: m.shape.to_vec(), ty: Ty::of(m.dtype) });
    }
    for (id, node) in trace.nodes.iter().enumerate() {
        if !live[id] || matches!(node.op, Op::Parameter { .. }) {
            continue;
        }
        let args: Vec<V> = node
            .inputs
            .iter()
            .map(|&i| {
                vals[i].clone().ok_or_else(|| {
                    Error::InvalidTrace(format!("node {id} reads node {i} before it has a value"))
                })
            })
            .collect::<Result<_>>()?;
        let v = e.node(&node.op, &args, &node.meta).map_err(|err| match err {
            Error::Backend { backend, msg } => Error::Backend {
                backend,
                msg: format!("lowering node {id} ({}): {msg}", node.op.name()),
            },
            other => other,
        })?;
        debug_assert_eq!(v.shape, node.meta.shape.to_vec());
        vals[id] = Some(v);
    }
    let outs: Vec<V> = trace
        .outputs
        .iter()
        .map(|&o| {
            vals[o]
                .clone()
                .ok_or_else(|| Error::InvalidTrace(format!("output node {o} has no value")))
        })
        .collect::<Result<_>>()?;

    let param_metas: Vec<Meta> = params.iter().map(|&id| trace.nodes[id].meta.clone()).collect();
    let mut text = String::from("module @deferfuse {\n  func.func public @main(");
    for (k, m) in param_metas.iter().enumerate() {
        if k > 0 {
            text.push_str(", ");
        }
        let _ = write!(text, "%arg{k}: {}", tensor(&m.shape, Ty::of(m.dtype)));
    }
    text.push_str(") -> (");
    let out_types: Vec<String> = outs.iter().map(V::ty_str).collect();
    text.push_str(&out_types.join(", "));
    text.push_str(") {\n");
    text.push_str(&e.body);
    let names: Vec<&str> = outs.iter().map(|v| v.name.as_str()).collect();
    let _ = writeln!(
        text,
        "    \"func.return\"({}) : ({}) -> ()",
        names.join(", "),
        out_types.join(", ")
    );
    text.push_str("  }\n}\n");
    Ok(Lowered {
        text,
        params: param_metas,
        outputs: trace.outputs.iter().map(|&o| trace.nodes[o].meta.clone()).collect(),
    })
}

fn unsupported(msg: impl Into<String>) -> Error {
    Error::backend("pjrt", msg)
}

/// Element types of the module (ours plus the f64 used for arange and
/// optional accumulation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    I1,
    I32,
    I64,
    BF16,
    F16,
    F32,
    F64,
    /// For the random stream only.
    U64,
}

impl Ty {
    fn of(d: DType) -> Ty {
        match d {
            DType::Bool => Ty::I1,
            DType::I32 => Ty::I32,
            DType::I64 => Ty::I64,
            DType::BF16 => Ty::BF16,
            DType::F16 => Ty::F16,
            DType::F32 => Ty::F32,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Ty::I1 => "i1",
            Ty::I32 => "i32",
            Ty::I64 => "i64",
            Ty::BF16 => "bf16",
            Ty::F16 => "f16",
            Ty::F32 => "f32",
            Ty::F64 => "f64",
            Ty::U64 => "ui64",
        }
    }
    fn is_float(self) -> bool {
        matches!(self, Ty::BF16 | Ty::F16 | Ty::F32 | Ty::F64)
    }
    /// The type elementwise math runs in: half floats widen to f32.
    fn compute(self) -> Ty {
        match self {
            Ty::BF16 | Ty::F16 => Ty::F32,
            t => t,
        }
    }
    fn compare_type(self) -> &'static str {
        match self {
            Ty::I1 | Ty::U64 => "UNSIGNED",
            Ty::I32 | Ty::I64 => "SIGNED",
            _ => "FLOAT",
        }
    }
    /// A scalar literal of this type, converted as a cast would convert it.
    fn literal(self, v: f64) -> String {
        match self {
            Ty::I1 => (if v != 0.0 { "true" } else { "false" }).to_string(),
            Ty::I32 => (v as i32).to_string(),
            Ty::I64 => (v as i64).to_string(),
            Ty::U64 => (v as u64).to_string(),
            Ty::BF16 => format!("0x{:04X}", bf16::from_f64(v).to_bits()),
            Ty::F16 => format!("0x{:04X}", f16::from_f64(v).to_bits()),
            Ty::F32 => format!("0x{:08X}", (v as f32).to_bits()),
            Ty::F64 => format!("0x{:016X}", v.to_bits()),
        }
    }
    /// Lowest and highest values (infinities for floats).
    fn lowest(self) -> String {
        match self {
            Ty::I1 => "false".into(),
            Ty::I32 => i32::MIN.to_string(),
            Ty::I64 => i64::MIN.to_string(),
            Ty::U64 => "0".into(),
            t => t.literal(f64::NEG_INFINITY),
        }
    }
    fn highest(self) -> String {
        match self {
            Ty::I1 => "true".into(),
            Ty::I32 => i32::MAX.to_string(),
            Ty::I64 => i64::MAX.to_string(),
            Ty::U64 => u64::MAX.to_string(),
            t => t.literal(f64::INFINITY),
        }
    }
}

fn tensor(shape: &[usize], ty: Ty) -> String {
    let mut s = String::from("tensor<");
    for d in shape {
        let _ = write!(s, "{d}x");
    }
    s.push_str(ty.name());
    s.push('>');
    s
}

/// `name = [a, b], ` for a dimension-numbers attribute, or nothing for no
/// dimensions (the field's default).
fn dims_field(name: &str, dims: impl IntoIterator<Item = usize>) -> String {
    let items: Vec<String> = dims.into_iter().map(|x| x.to_string()).collect();
    if items.is_empty() {
        String::new()
    } else {
        format!("{name} = [{}], ", items.join(", "))
    }
}

fn i64_array(v: impl IntoIterator<Item = usize>) -> String {
    let items: Vec<String> = v.into_iter().map(|x| x.to_string()).collect();
    if items.is_empty() {
        "array<i64>".into()
    } else {
        format!("array<i64: {}>", items.join(", "))
    }
}

/// An SSA value with its shape and element type.
#[derive(Debug, Clone)]
struct V {
    name: String,
    shape: Vec<usize>,
    ty: Ty,
}

impl V {
    fn ty_str(&self) -> String {
        tensor(&self.shape, self.ty)
    }
    fn scalar_ty(&self) -> String {
        tensor(&[], self.ty)
    }
}

struct Emitter {
    body: String,
    next: usize,
    options: LowerOptions,
}

const INDENT: &str = "    ";

impl Emitter {
    fn fresh(&mut self) -> String {
        let n = format!("%{}", self.next);
        self.next += 1;
        n
    }

    /// Emits `%N = "name"(operands) {attrs} : (types) -> result` at `indent`.
    fn emit_at(
        &mut self,
        indent: &str,
        name: &str,
        operands: &[&V],
        attrs: &str,
        shape: &[usize],
        ty: Ty,
    ) -> V {
        let out = V { name: self.fresh(), shape: shape.to_vec(), ty };
        let names: Vec<&str> = operands.iter().map(|v| v.name.as_str()).collect();
        let types: Vec<String> = operands.iter().map(|v| v.ty_str()).collect();
        let attrs = if attrs.is_empty() { String::new() } else { format!(" {{{attrs}}}") };
        let _ = writeln!(
            self.body,
            "{indent}{} = \"{name}\"({}){attrs} : ({}) -> {}",
            out.name,
            names.join(", "),
            types.join(", "),
            out.ty_str()
        );
        out
    }

    fn emit(&mut self, name: &str, operands: &[&V], attrs: &str, shape: &[usize], ty: Ty) -> V {
        self.emit_at(INDENT, name, operands, attrs, shape, ty)
    }

    /// A scalar constant (given as a literal of `ty`) broadcast to `shape`.
    fn splat_lit(&mut self, lit: &str, ty: Ty, shape: &[usize]) -> V {
        let c = self.emit(
            "stablehlo.constant",
            &[],
            &format!("value = dense<{lit}> : {}", tensor(&[], ty)),
            &[],
            ty,
        );
        self.broadcast(&c, shape, &[])
    }

    fn splat(&mut self, v: f64, ty: Ty, shape: &[usize]) -> V {
        let lit = ty.literal(v);
        self.splat_lit(&lit, ty, shape)
    }

    fn broadcast(&mut self, v: &V, shape: &[usize], dims: &[usize]) -> V {
        if v.shape == shape && dims.iter().copied().eq(0..shape.len()) {
            return v.clone();
        }
        let attrs = format!("broadcast_dimensions = {}", i64_array(dims.iter().copied()));
        self.emit("stablehlo.broadcast_in_dim", &[v], &attrs, shape, v.ty)
    }

    /// NumPy broadcasting of `v` to `shape` (dimensions aligned on the right).
    fn broadcast_to(&mut self, v: &V, shape: &[usize]) -> Result<V> {
        if v.shape == shape {
            return Ok(v.clone());
        }
        let r = shape.len();
        if v.shape.len() > r {
            return Err(unsupported(format!("cannot broadcast {:?} to {shape:?}", v.shape)));
        }
        let off = r - v.shape.len();
        let dims: Vec<usize> = (off..r).collect();
        Ok(self.broadcast(v, shape, &dims))
    }

    fn convert(&mut self, v: &V, ty: Ty) -> V {
        if v.ty == ty {
            return v.clone();
        }
        let shape = v.shape.clone();
        self.emit("stablehlo.convert", &[v], "", &shape, ty)
    }

    fn unary(&mut self, name: &str, v: &V) -> V {
        let shape = v.shape.clone();
        self.emit(name, &[v], "", &shape, v.ty)
    }

    fn binary(&mut self, name: &str, a: &V, b: &V) -> V {
        let shape = a.shape.clone();
        self.emit(name, &[a, b], "", &shape, a.ty)
    }

    fn compare_at(&mut self, indent: &str, dir: &str, a: &V, b: &V) -> V {
        let attrs = format!(
            "comparison_direction = #stablehlo<comparison_direction {dir}>, compare_type = #stablehlo<comparison_type {}>",
            a.ty.compare_type()
        );
        let shape = a.shape.clone();
        self.emit_at(indent, "stablehlo.compare", &[a, b], &attrs, &shape, Ty::I1)
    }

    fn reshape(&mut self, v: &V, shape: &[usize]) -> V {
        if v.shape == shape {
            return v.clone();
        }
        self.emit("stablehlo.reshape", &[v], "", shape, v.ty)
    }

    /// The region of a reduce or a scatter, after the op's opening line: two
    /// scalars of `ty` combined by the binary op `body`.
    fn combiner(&mut self, body: &str, ty: Ty) {
        let (a, b) = (self.fresh(), self.fresh());
        let st = tensor(&[], ty);
        let _ = writeln!(self.body, "{INDENT}^bb0({a}: {st}, {b}: {st}):");
        let av = V { name: a, shape: vec![], ty };
        let bv = V { name: b, shape: vec![], ty };
        let r = self.emit_at("      ", body, &[&av, &bv], "", &[], ty);
        let _ = writeln!(self.body, "      \"stablehlo.return\"({}) : ({st}) -> ()", r.name);
    }

    /// `reduce` of `v` over `axes` with the binary op `body` and the initial
    /// value `init` (a literal of `v`'s type). The result drops the axes.
    fn reduce(&mut self, v: &V, axes: &[usize], init: &str, body: &str) -> V {
        let init_v = self.emit(
            "stablehlo.constant",
            &[],
            &format!("value = dense<{init}> : {}", v.scalar_ty()),
            &[],
            v.ty,
        );
        let out_shape: Vec<usize> = v
            .shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect();
        let out = V { name: self.fresh(), shape: out_shape, ty: v.ty };
        let st = v.scalar_ty();
        let mut sorted = axes.to_vec();
        sorted.sort_unstable();
        let _ = writeln!(
            self.body,
            "{INDENT}{} = \"stablehlo.reduce\"({}, {}) ({{",
            out.name, v.name, init_v.name
        );
        self.combiner(body, v.ty);
        let _ = writeln!(
            self.body,
            "{INDENT}}}) {{dimensions = {}}} : ({}, {st}) -> {}",
            i64_array(sorted),
            v.ty_str(),
            out.ty_str()
        );
        out
    }

    /// 1-d indices as the `[m, 1]` column gather and scatter index with.
    fn index_column(&mut self, idx: &V) -> V {
        let m = idx.shape[0];
        self.reshape(idx, &[m, 1])
    }

    /// `base` with row `idx[i]` plus `updates[i]` for each `i` (rows out of
    /// range are skipped, as `Op::ScatterAddRows` says).
    fn scatter_add(&mut self, base: &V, idx: &V, updates: &V) -> V {
        let out = V { name: self.fresh(), shape: base.shape.clone(), ty: base.ty };
        let _ = writeln!(
            self.body,
            "{INDENT}{} = \"stablehlo.scatter\"({}, {}, {}) ({{",
            out.name, base.name, idx.name, updates.name
        );
        self.combiner("stablehlo.add", base.ty);
        let _ = writeln!(
            self.body,
            "{INDENT}}}) {{scatter_dimension_numbers = #stablehlo.scatter<{}inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false}} : ({}, {}, {}) -> {}",
            dims_field("update_window_dims", 1..updates.shape.len()),
            base.ty_str(),
            idx.ty_str(),
            updates.ty_str(),
            out.ty_str()
        );
        out
    }

    /// Broadcasts a reduced value back over the input shape `shape`.
    fn expand_reduced(&mut self, r: &V, shape: &[usize], axes: &[usize]) -> V {
        let dims: Vec<usize> = (0..shape.len()).filter(|i| !axes.contains(i)).collect();
        self.broadcast(r, shape, &dims)
    }

    fn acc_float(&self) -> Ty {
        if self.options.accumulate_f64 {
            Ty::F64
        } else {
            Ty::F32
        }
    }

    /// Sum over `axes` in the accumulation type, returned in `out_ty`.
    fn sum(&mut self, v: &V, axes: &[usize], out_ty: Ty) -> V {
        let acc = if v.ty.is_float() { self.acc_float() } else { v.ty };
        let x = self.convert(v, acc);
        let zero = acc.literal(0.0);
        let r = self.reduce(&x, axes, &zero, "stablehlo.add");
        self.convert(&r, out_ty)
    }

    /// Mean over `axes`, returned in `out_ty`.
    fn mean(&mut self, v: &V, axes: &[usize], out_ty: Ty) -> V {
        let acc = self.acc_float();
        let x = self.convert(v, acc);
        let zero = acc.literal(0.0);
        let s = self.reduce(&x, axes, &zero, "stablehlo.add");
        let count: usize = axes.iter().map(|&a| v.shape[a]).product();
        let shape = s.shape.clone();
        let c = self.splat(count as f64, acc, &shape);
        let m = self.binary("stablehlo.divide", &s, &c);
        self.convert(&m, out_ty)
    }

    fn node(&mut self, op: &Op, args: &[V], meta: &Meta) -> Result<V> {
        let shape: Vec<usize> = meta.shape.to_vec();
        let ty = Ty::of(meta.dtype);
        Ok(match op {
            Op::Parameter { .. } => return Err(unsupported("parameters are arguments, not ops")),
            Op::Full { value, .. } => self.splat(*value, ty, &shape),
            Op::Arange { start, step, len, .. } => {
                let i =
                    self.emit("stablehlo.iota", &[], "iota_dimension = 0 : i64", &[*len], Ty::F64);
                let st = self.splat(*step, Ty::F64, &[*len]);
                let s0 = self.splat(*start, Ty::F64, &[*len]);
                let m = self.binary("stablehlo.multiply", &i, &st);
                let v = self.binary("stablehlo.add", &s0, &m);
                self.convert(&v, ty)
            }
            Op::Random { seed, dist, .. } => self.random(*seed, *dist, &shape, ty)?,
            Op::Unary { kind } => self.unary_op(*kind, &args[0])?,
            Op::Binary { kind } => {
                let a = self.broadcast_to(&args[0], &shape)?;
                let b = self.broadcast_to(&args[1], &shape)?;
                self.binary_op(*kind, &a, &b)?
            }
            Op::Where => {
                let c = self.broadcast_to(&args[0], &shape)?;
                let a = self.broadcast_to(&args[1], &shape)?;
                let b = self.broadcast_to(&args[2], &shape)?;
                self.emit("stablehlo.select", &[&c, &a, &b], "", &shape, ty)
            }
            Op::Cast { .. } => self.convert(&args[0], ty),
            Op::Reduce { kind, axes, .. } => {
                let x = &args[0];
                let r = if axes.is_empty() {
                    x.clone()
                } else {
                    match kind {
                        ReduceOp::Sum => self.sum(x, axes, ty),
                        ReduceOp::Mean => self.mean(x, axes, ty),
                        ReduceOp::Prod => {
                            let acc = if x.ty.is_float() { self.acc_float() } else { x.ty };
                            let xc = self.convert(x, acc);
                            let one = acc.literal(1.0);
                            let r = self.reduce(&xc, axes, &one, "stablehlo.multiply");
                            self.convert(&r, ty)
                        }
                        ReduceOp::Max => {
                            let init = x.ty.lowest();
                            self.reduce(x, axes, &init, "stablehlo.maximum")
                        }
                        ReduceOp::Min => {
                            let init = x.ty.highest();
                            self.reduce(x, axes, &init, "stablehlo.minimum")
                        }
                    }
                };
                self.reshape(&r, &shape)
            }
            Op::ArgReduce { kind, axis, .. } => {
                let r = self.arg_reduce(*kind, &args[0], *axis);
                self.reshape(&r, &shape)
            }
            Op::Expand { .. } => self.broadcast_to(&args[0], &shape)?,
            Op::Reshape { .. } => self.reshape(&args[0], &shape),
            Op::Permute { perm } => {
                let attrs = format!("permutation = {}", i64_array(perm.iter().copied()));
                self.emit("stablehlo.transpose", &[&args[0]], &attrs, &shape, ty)
            }
            Op::Slice { axis, start, stop, step } => {
                let x = &args[0];
                let r = x.shape.len();
                let starts = (0..r).map(|d| if d == *axis { *start } else { 0 });
                let limits = (0..r).map(|d| if d == *axis { *stop } else { x.shape[d] });
                let strides = (0..r).map(|d| if d == *axis { *step } else { 1 });
                let attrs = format!(
                    "start_indices = {}, limit_indices = {}, strides = {}",
                    i64_array(starts),
                    i64_array(limits),
                    i64_array(strides)
                );
                self.emit("stablehlo.slice", &[x], &attrs, &shape, ty)
            }
            Op::Concat { axis } => {
                if args.len() == 1 {
                    args[0].clone()
                } else {
                    let refs: Vec<&V> = args.iter().collect();
                    self.emit(
                        "stablehlo.concatenate",
                        &refs,
                        &format!("dimension = {axis} : i64"),
                        &shape,
                        ty,
                    )
                }
            }
            Op::MatMul => self.matmul(&args[0], &args[1], &shape)?,
            Op::GatherRows => {
                let (table, idx) = (&args[0], self.index_column(&args[1]));
                let rank = table.shape.len();
                let mut sizes = table.shape.clone();
                sizes[0] = 1;
                let attrs = format!(
                    "dimension_numbers = #stablehlo.gather<{}collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = {}, indices_are_sorted = false",
                    dims_field("offset_dims", 1..rank),
                    i64_array(sizes)
                );
                self.emit("stablehlo.gather", &[table, &idx], &attrs, &shape, ty)
            }
            Op::ScatterAddRows { .. } => {
                let (idx, updates) = (self.index_column(&args[0]), &args[1]);
                let zero = self.splat(0.0, ty, &shape);
                self.scatter_add(&zero, &idx, updates)
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                let x = self.convert(&args[0], args[0].ty.compute());
                let axes = [*axis];
                let init = x.ty.lowest();
                let m = self.reduce(&x, &axes, &init, "stablehlo.maximum");
                let mb = self.expand_reduced(&m, &shape, &axes);
                let d = self.binary("stablehlo.subtract", &x, &mb);
                let e = self.unary("stablehlo.exponential", &d);
                let s = self.sum(&e, &axes, x.ty);
                let out = if matches!(op, Op::Softmax { .. }) {
                    let sb = self.expand_reduced(&s, &shape, &axes);
                    self.binary("stablehlo.divide", &e, &sb)
                } else {
                    let l = self.unary("stablehlo.log", &s);
                    let lb = self.expand_reduced(&l, &shape, &axes);
                    self.binary("stablehlo.subtract", &d, &lb)
                };
                self.convert(&out, ty)
            }
            Op::LayerNorm { axes } | Op::RmsNorm { axes } => {
                let ct = args[0].ty.compute();
                let x = self.convert(&args[0], ct);
                let eps = self.convert(&args[1], ct);
                let centered = if matches!(op, Op::LayerNorm { .. }) {
                    let mu = self.mean(&x, axes, ct);
                    let mub = self.expand_reduced(&mu, &shape, axes);
                    self.binary("stablehlo.subtract", &x, &mub)
                } else {
                    x.clone()
                };
                let sq = self.binary("stablehlo.multiply", &centered, &centered);
                let var = self.mean(&sq, axes, ct);
                let vshape = var.shape.clone();
                let epsb = self.broadcast(&eps, &vshape, &[]);
                let ve = self.binary("stablehlo.add", &var, &epsb);
                let inv = self.unary("stablehlo.rsqrt", &ve);
                let invb = self.expand_reduced(&inv, &shape, axes);
                let out = self.binary("stablehlo.multiply", &centered, &invb);
                self.convert(&out, ty)
            }
        })
    }

    fn u64_splat(&mut self, v: u64, shape: &[usize]) -> V {
        self.splat_lit(&v.to_string(), Ty::U64, shape)
    }

    /// `bits(s) = splitmix64(seed ^ s * GOLDEN)` (see `cpu::random`), wrapping in ui64.
    fn random_bits(&mut self, seed: u64, s: &V) -> V {
        const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
        let shape = s.shape.clone();
        let golden = self.u64_splat(GOLDEN, &shape);
        let seed_v = self.u64_splat(seed, &shape);
        let sg = self.binary("stablehlo.multiply", s, &golden);
        let x = self.binary("stablehlo.xor", &seed_v, &sg);
        let mut z = self.binary("stablehlo.add", &x, &golden);
        for (shift, mul) in
            [(30u64, Some(0xBF58_476D_1CE4_E5B9u64)), (27, Some(0x94D0_49BB_1331_11EB)), (31, None)]
        {
            let sh = self.u64_splat(shift, &shape);
            let zs = self.binary("stablehlo.shift_right_logical", &z, &sh);
            z = self.binary("stablehlo.xor", &z, &zs);
            if let Some(m) = mul {
                let mv = self.u64_splat(m, &shape);
                z = self.binary("stablehlo.multiply", &z, &mv);
            }
        }
        z
    }

    /// `u(s, p) = (bits(s) >> (64 - p)) * 2^-p`, in f64.
    fn uniform(&mut self, seed: u64, s: &V, p: u32) -> V {
        let shape = s.shape.clone();
        let bits = self.random_bits(seed, s);
        let sh = self.u64_splat(64 - p as u64, &shape);
        let top = self.binary("stablehlo.shift_right_logical", &bits, &sh);
        let f = self.convert(&top, Ty::F64);
        let scale = self.splat((-(p as f64)).exp2(), Ty::F64, &shape);
        self.binary("stablehlo.multiply", &f, &scale)
    }

    /// The CPU backend's random stream over the flat element index.
    fn random(
        &mut self,
        seed: u64,
        dist: trace_ir::Distribution,
        shape: &[usize],
        ty: Ty,
    ) -> Result<V> {
        let n: usize = shape.iter().product();
        let idx = self.emit("stablehlo.iota", &[], "iota_dimension = 0 : i64", &[n], Ty::U64);
        let flat = match dist {
            trace_ir::Distribution::Uniform => {
                let p = match ty {
                    Ty::F32 => 24,
                    Ty::F16 => 11,
                    Ty::BF16 => 8,
                    t => {
                        return Err(unsupported(format!(
                            "random values need a floating dtype, got {}",
                            t.name()
                        )))
                    }
                };
                let u = self.uniform(seed, &idx, p);
                self.convert(&u, ty)
            }
            trace_ir::Distribution::Normal => {
                // sqrt(-2 ln(1 - u(2i, 24))) * cos(2 pi u(2i + 1, 24)), in f64, then f32.
                let two = self.u64_splat(2, &[n]);
                let one_u = self.u64_splat(1, &[n]);
                let i2 = self.binary("stablehlo.multiply", &idx, &two);
                let i21 = self.binary("stablehlo.add", &i2, &one_u);
                let u1 = self.uniform(seed, &i2, 24);
                let u2 = self.uniform(seed, &i21, 24);
                let one = self.splat(1.0, Ty::F64, &[n]);
                let m2 = self.splat(-2.0, Ty::F64, &[n]);
                let tau = self.splat(std::f64::consts::TAU, Ty::F64, &[n]);
                let d = self.binary("stablehlo.subtract", &one, &u1);
                let l = self.unary("stablehlo.log", &d);
                let r2 = self.binary("stablehlo.multiply", &m2, &l);
                let r = self.unary("stablehlo.sqrt", &r2);
                let a = self.binary("stablehlo.multiply", &tau, &u2);
                let c = self.unary("stablehlo.cosine", &a);
                let v = self.binary("stablehlo.multiply", &r, &c);
                let v32 = self.convert(&v, Ty::F32);
                self.convert(&v32, ty)
            }
        };
        Ok(self.reshape(&flat, shape))
    }

    fn unary_op(&mut self, kind: UnaryOp, x: &V) -> Result<V> {
        use UnaryOp::*;
        let out_ty = x.ty;
        if !x.ty.is_float() {
            return Ok(match kind {
                Neg => self.unary("stablehlo.negate", x),
                Abs => self.unary("stablehlo.abs", x),
                Relu => {
                    let shape = x.shape.clone();
                    let z = self.splat(0.0, x.ty, &shape);
                    self.binary("stablehlo.maximum", x, &z)
                }
                Floor => x.clone(),
                Sign => self.unary("stablehlo.sign", x),
                LogicalNot => self.unary("stablehlo.not", x),
                _ => {
                    return Err(unsupported(format!(
                        "{} needs a floating input, got {}",
                        kind.name(),
                        x.ty.name()
                    )))
                }
            });
        }
        let x = self.convert(x, x.ty.compute());
        let shape = x.shape.clone();
        let t = x.ty;
        let v = match kind {
            Neg => self.unary("stablehlo.negate", &x),
            Abs => self.unary("stablehlo.abs", &x),
            Exp => self.unary("stablehlo.exponential", &x),
            Log => self.unary("stablehlo.log", &x),
            Sqrt => self.unary("stablehlo.sqrt", &x),
            Rsqrt => self.unary("stablehlo.rsqrt", &x),
            Reciprocal => {
                let one = self.splat(1.0, t, &shape);
                self.binary("stablehlo.divide", &one, &x)
            }
            Tanh => self.unary("stablehlo.tanh", &x),
            Sigmoid => self.unary("stablehlo.logistic", &x),
            Relu => {
                let z = self.splat(0.0, t, &shape);
                self.binary("stablehlo.maximum", &x, &z)
            }
            GeluErf => {
                // 0.5 x (1 + erf(x / sqrt 2))
                let c = self.splat(consts::GELU_ERF_SCALE, t, &shape);
                let xs = self.binary("stablehlo.multiply", &x, &c);
                let erf = self.unary("chlo.erf", &xs);
                let one = self.splat(1.0, t, &shape);
                let p = self.binary("stablehlo.add", &one, &erf);
                let half = self.splat(0.5, t, &shape);
                let hx = self.binary("stablehlo.multiply", &half, &x);
                self.binary("stablehlo.multiply", &hx, &p)
            }
            GeluTanh => {
                // 0.5 x (1 + tanh(beta (x + kappa x^3))), in the CPU backend's order.
                let kappa = self.splat(consts::GELU_TANH_KAPPA, t, &shape);
                let beta = self.splat(consts::GELU_TANH_BETA, t, &shape);
                let k1 = self.binary("stablehlo.multiply", &kappa, &x);
                let k2 = self.binary("stablehlo.multiply", &k1, &x);
                let k3 = self.binary("stablehlo.multiply", &k2, &x);
                let inner = self.binary("stablehlo.add", &x, &k3);
                let scaled = self.binary("stablehlo.multiply", &beta, &inner);
                let th = self.unary("stablehlo.tanh", &scaled);
                let one = self.splat(1.0, t, &shape);
                let p = self.binary("stablehlo.add", &one, &th);
                let half = self.splat(0.5, t, &shape);
                let hx = self.binary("stablehlo.multiply", &half, &x);
                self.binary("stablehlo.multiply", &hx, &p)
            }
            Silu => {
                let s = self.unary("stablehlo.logistic", &x);
                self.binary("stablehlo.multiply", &x, &s)
            }
            Sin => self.unary("stablehlo.sine", &x),
            Cos => self.unary("stablehlo.cosine", &x),
            Floor => self.unary("stablehlo.floor", &x),
            Sign => self.unary("stablehlo.sign", &x),
            LogicalNot => return Err(unsupported("logical_not needs a bool input")),
        };
        Ok(self.convert(&v, out_ty))
    }

    fn binary_op(&mut self, kind: BinaryOp, a: &V, b: &V) -> Result<V> {
        use BinaryOp::*;
        let dir = match kind {
            Eq => Some("EQ"),
            Ne => Some("NE"),
            Lt => Some("LT"),
            Le => Some("LE"),
            Gt => Some("GT"),
            Ge => Some("GE"),
            _ => None,
        };
        if let Some(dir) = dir {
            return Ok(self.compare_at(INDENT, dir, a, b));
        }
        let name = match kind {
            Add => "stablehlo.add",
            Sub => "stablehlo.subtract",
            Mul => "stablehlo.multiply",
            Div => "stablehlo.divide",
            Pow => "stablehlo.power",
            Maximum => "stablehlo.maximum",
            Minimum => "stablehlo.minimum",
            LogicalAnd => "stablehlo.and",
            LogicalOr => "stablehlo.or",
            _ => unreachable!("comparisons handled above"),
        };
        if kind == Pow && !a.ty.is_float() {
            return Ok(self.int_pow(a, b));
        }
        let out_ty = a.ty;
        let ct = a.ty.compute();
        let (a, b) = (self.convert(a, ct), self.convert(b, ct));
        let v = self.binary(name, &a, &b);
        Ok(self.convert(&v, out_ty))
    }

    /// Integer power with PyTorch's rule for negative exponents (`1/base`
    /// truncated: 1 for base 1, ±1 for base -1, else 0). XLA's integer
    /// `power` is used for non-negative exponents.
    fn int_pow(&mut self, a: &V, b: &V) -> V {
        let shape = a.shape.clone();
        let t = a.ty;
        let zero = self.splat(0.0, t, &shape);
        let one = self.splat(1.0, t, &shape);
        let neg_one = self.splat(-1.0, t, &shape);
        let neg_exp = self.compare_at(INDENT, "LT", b, &zero);
        let safe_exp = self.binary("stablehlo.maximum", b, &zero);
        let p = self.binary("stablehlo.power", a, &safe_exp);
        // Negative exponent: base 1 -> 1; base -1 -> -1 for odd, 1 for even; else 0.
        let is_one = self.compare_at(INDENT, "EQ", a, &one);
        let is_neg_one = self.compare_at(INDENT, "EQ", a, &neg_one);
        let two = self.splat(2.0, t, &shape);
        let rem = self.binary("stablehlo.remainder", b, &two);
        let odd = self.compare_at(INDENT, "NE", &rem, &zero);
        let pm = self.emit("stablehlo.select", &[&odd, &neg_one, &one], "", &shape, t);
        let n1 = self.emit("stablehlo.select", &[&is_neg_one, &pm, &zero], "", &shape, t);
        let n0 = self.emit("stablehlo.select", &[&is_one, &one, &n1], "", &shape, t);
        self.emit("stablehlo.select", &[&neg_exp, &n0, &p], "", &shape, t)
    }

    /// First index of the max (min) along `axis`; NaN counts as the extreme.
    fn arg_reduce(&mut self, kind: ArgReduceOp, x: &V, axis: usize) -> V {
        let max = kind == ArgReduceOp::Argmax;
        let shape = x.shape.clone();
        let idx = self.emit(
            "stablehlo.iota",
            &[],
            &format!("iota_dimension = {axis} : i64"),
            &shape,
            Ty::I64,
        );
        let init = if max { x.ty.lowest() } else { x.ty.highest() };
        let iv = self.emit(
            "stablehlo.constant",
            &[],
            &format!("value = dense<{init}> : {}", x.scalar_ty()),
            &[],
            x.ty,
        );
        let ii = self.emit(
            "stablehlo.constant",
            &[],
            &format!("value = dense<{}> : {}", i64::MAX, tensor(&[], Ty::I64)),
            &[],
            Ty::I64,
        );
        let out_shape: Vec<usize> =
            shape.iter().enumerate().filter(|(i, _)| *i != axis).map(|(_, &d)| d).collect();
        let rv = self.fresh();
        let names = [self.fresh(), self.fresh(), self.fresh(), self.fresh()];
        let st = x.scalar_ty();
        let it = tensor(&[], Ty::I64);
        let _ = writeln!(
            self.body,
            "{INDENT}{rv}:2 = \"stablehlo.reduce\"({}, {}, {}, {}) ({{",
            x.name, idx.name, iv.name, ii.name
        );
        let _ = writeln!(
            self.body,
            "{INDENT}^bb0({}: {st}, {}: {it}, {}: {st}, {}: {it}):",
            names[0], names[1], names[2], names[3]
        );
        let a = V { name: names[0].clone(), shape: vec![], ty: x.ty };
        let ia = V { name: names[1].clone(), shape: vec![], ty: Ty::I64 };
        let b = V { name: names[2].clone(), shape: vec![], ty: x.ty };
        let ib = V { name: names[3].clone(), shape: vec![], ty: Ty::I64 };
        let ind = "      ";
        let better = self.compare_at(ind, if max { "GT" } else { "LT" }, &a, &b);
        let equal = self.compare_at(ind, "EQ", &a, &b);
        let lower_index = self.compare_at(ind, "LT", &ia, &ib);
        let (pick_value, same) = if x.ty.is_float() {
            let a_nan = self.compare_at(ind, "NE", &a, &a);
            let b_nan = self.compare_at(ind, "NE", &b, &b);
            let b_num = self.emit_at(ind, "stablehlo.not", &[&b_nan], "", &[], Ty::I1);
            let nan_wins = self.emit_at(ind, "stablehlo.and", &[&a_nan, &b_num], "", &[], Ty::I1);
            let both_nan = self.emit_at(ind, "stablehlo.and", &[&a_nan, &b_nan], "", &[], Ty::I1);
            let same = self.emit_at(ind, "stablehlo.or", &[&equal, &both_nan], "", &[], Ty::I1);
            (self.emit_at(ind, "stablehlo.or", &[&better, &nan_wins], "", &[], Ty::I1), same)
        } else {
            (better, equal)
        };
        let tie = self.emit_at(ind, "stablehlo.and", &[&same, &lower_index], "", &[], Ty::I1);
        let pick = self.emit_at(ind, "stablehlo.or", &[&pick_value, &tie], "", &[], Ty::I1);
        let v = self.emit_at(ind, "stablehlo.select", &[&pick, &a, &b], "", &[], x.ty);
        let i = self.emit_at(ind, "stablehlo.select", &[&pick, &ia, &ib], "", &[], Ty::I64);
        let _ = writeln!(
            self.body,
            "{ind}\"stablehlo.return\"({}, {}) : ({st}, {it}) -> ()",
            v.name, i.name
        );
        let _ = writeln!(
            self.body,
            "{INDENT}}}) {{dimensions = array<i64: {axis}>}} : ({}, {}, {st}, {it}) -> ({}, {})",
            x.ty_str(),
            idx.ty_str(),
            tensor(&out_shape, x.ty),
            tensor(&out_shape, Ty::I64)
        );
        V { name: format!("{rv}#1"), shape: out_shape, ty: Ty::I64 }
    }

    fn matmul(&mut self, a: &V, b: &V, out_shape: &[usize]) -> Result<V> {
        let nb = out_shape.len() - 2;
        let batch = &out_shape[..nb];
        let (m, k) = (a.shape[a.shape.len() - 2], a.shape[a.shape.len() - 1]);
        let n = b.shape[b.shape.len() - 1];
        let a_shape: Vec<usize> = batch.iter().copied().chain([m, k]).collect();
        let b_shape: Vec<usize> = batch.iter().copied().chain([k, n]).collect();
        let out_ty = a.ty;
        let ct = a.ty.compute();
        if nb > 0 && b.shape.len() == 2 && a.shape == a_shape {
            // `[batch.., m, k] @ [k, n]` (a linear layer on a batch): one
            // dot_general without batch dimensions, as jax lowers `x @ w`.
            // Broadcasting the weight over the batch would make XLA copy it
            // into a batched operand on every run.
            let (ac, bc) = (self.convert(a, ct), self.convert(b, ct));
            let dn = format!(
                "dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [{}], rhs_contracting_dimensions = [0]>",
                nb + 1
            );
            let v = self.emit("stablehlo.dot_general", &[&ac, &bc], &dn, out_shape, ct);
            return Ok(self.convert(&v, out_ty));
        }
        let ab = self.broadcast_to(a, &a_shape)?;
        let bb = self.broadcast_to(b, &b_shape)?;
        let (ab, bb) = (self.convert(&ab, ct), self.convert(&bb, ct));
        let batch_dims = (0..nb).map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
        let mut dn = String::from("dot_dimension_numbers = #stablehlo.dot<");
        if nb > 0 {
            let _ = write!(dn, "lhs_batching_dimensions = [{batch_dims}], rhs_batching_dimensions = [{batch_dims}], ");
        }
        let _ = write!(
            dn,
            "lhs_contracting_dimensions = [{}], rhs_contracting_dimensions = [{}]>",
            nb + 1,
            nb
        );
        let v = self.emit("stablehlo.dot_general", &[&ab, &bb], &dn, out_shape, ct);
        Ok(self.convert(&v, out_ty))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::shape::shape;

    #[test]
    fn text_is_canonical_and_drops_dead_nodes() {
        let mut t = Trace::new();
        let x = t.push_parameter(Meta::new(shape(&[2, 3]), DType::F32));
        let _dead = t.push(Op::Unary { kind: UnaryOp::Exp }, &[x]).unwrap();
        let y = t.push(Op::Unary { kind: UnaryOp::Neg }, &[x]).unwrap();
        t.outputs = vec![y];
        let a = lower(&t).unwrap();
        assert!(
            a.contains("func.func public @main(%arg0: tensor<2x3xf32>) -> (tensor<2x3xf32>)"),
            "{a}"
        );
        assert!(a.contains("%0 = \"stablehlo.negate\"(%arg0)"), "{a}");
        assert!(!a.contains("exponential"), "{a}");
        assert_eq!(a, lower(&t.clone()).unwrap());
    }

    #[test]
    fn a_linear_layer_on_a_batch_is_one_dot_without_broadcast() {
        let mut t = Trace::new();
        let x = t.push_parameter(Meta::new(shape(&[2, 3, 4]), DType::F32));
        let w = t.push_parameter(Meta::new(shape(&[4, 5]), DType::F32));
        let y = t.push(Op::MatMul, &[x, w]).unwrap();
        t.outputs = vec![y];
        let text = lower(&t).unwrap();
        assert!(!text.contains("broadcast_in_dim"), "{text}");
        assert!(
            text.contains("lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [0]"),
            "{text}"
        );
        assert!(text.contains("-> tensor<2x3x5xf32>"), "{text}");
    }

    #[test]
    fn aliases_mark_parameters() {
        let mut t = Trace::new();
        let x = t.push_parameter(Meta::new(shape(&[2]), DType::F32));
        let y = t.push_parameter(Meta::new(shape(&[2]), DType::F32));
        let s = t.push(Op::Binary { kind: BinaryOp::Add }, &[x, y]).unwrap();
        t.outputs = vec![s];
        let lowered = lower_with(&t, LowerOptions::default()).unwrap();
        assert_eq!(lowered.with_aliases(&[]), lowered.text);
        let text = lowered.with_aliases(&[(1, 0)]);
        assert!(
            text.contains(
                "@main(%arg0: tensor<2xf32>, %arg1: tensor<2xf32> {tf.aliasing_output = 0 : i32})"
            ),
            "{text}"
        );
    }

    #[test]
    fn random_lowers_to_integer_math() {
        let mut t = Trace::new();
        let r = t
            .push(
                Op::Random {
                    seed: 1,
                    dist: trace_ir::Distribution::Uniform,
                    shape: shape(&[2]),
                    dtype: DType::F32,
                },
                &[],
            )
            .unwrap();
        t.outputs = vec![r];
        let text = lower(&t).unwrap();
        assert!(text.contains("tensor<2xui64>") && text.contains("shift_right_logical"), "{text}");
    }
}
