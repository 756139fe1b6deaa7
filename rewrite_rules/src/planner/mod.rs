//! The kernel planner: a trace (optimized or not) in, a fused [`Program`] out.
//!
//! # Rules
//!
//! A node is *realized* (gets a buffer, stored by the kernel that computes
//! it) when it is a parameter, a program output, a node that does not fuse
//! (`Single`), an input of such a node, or when one of the cuts below
//! applies. Every other node is computed inline by each kernel that needs it.
//! Each realized node roots a kernel, whose body is everything reachable
//! from the root through unrealized nodes; then kernels are merged.
//!
//! - **Elementwise chains** (unary, binary with implicit broadcasting,
//!   where, float/bool casts, `expand`, float/bool literals) fuse into one
//!   loop. Casts from integers fuse as converting loads. Integer-valued work
//!   stays in `Single` kernels: f32 registers cannot hold i64.
//! - **Reductions over trailing axes** (and the fused row forms softmax,
//!   log_softmax, layer_norm, rms_norm over trailing axes) fuse with their
//!   elementwise producers and with elementwise consumers that broadcast the
//!   per-row result back: softmax or layer norm written out is one row loop.
//!   All reductions of a loop reduce the same trailing axes of the same
//!   iteration shape; a conflicting one is realized (`ReductionBoundary`).
//!   Reductions over other axes run alone.
//! - **Matrix products** take an elementwise epilogue (bias, activation,
//!   residual, cast) when the epilogue's iteration shape is the product's
//!   shape and nothing else reads the product. Operands reached through
//!   permutes, reshapes of contiguous buffers, slices and expands of a
//!   realized buffer are read in place as strided views (a transposed weight
//!   is never copied). A product never runs twice and a loop holds one at most.
//! - **Views of computed values**: a reshape, permute or slice whose input
//!   is computed inline realizes that input first (`ShapeChange`); views of
//!   realized buffers are folded into the loads of the kernels that read them.
//! - **Recomputation**: a node needed by several kernels is recomputed in
//!   each when its inline closure has at most [`RECOMPUTE_MAX_OPS`] (8)
//!   elementwise ops and reads no reduction and no matrix product;
//!   otherwise it is realized (`SecondConsumer`). Reductions and matrix
//!   products are therefore never duplicated.
//! - **Limits**: a loop holds at most [`PlanConfig::max_kernel_ops`] ops; a
//!   larger one is split at a node near its middle (`Limit`).
//! - **Multi-output kernels**: two loops with the same iteration space are
//!   merged when one reads the other's output (vertical), or when they read
//!   a common non-scalar input (horizontal), provided no third kernel lies on
//!   a path between them. Adam's `p`, `m` and `v` come out of one pass.
//!
//! Every trace edge that ends up crossing kernels gets the reason its
//! producer was realized ([`Program::cuts`]).
//!
//! # Numbers
//!
//! Fused kernels compute in f32 and, with [`Rounding::Once`], round once at
//! their outputs: where a value is stored, and where a cast takes it out of
//! its dtype (a bf16 value cast to f32 is rounded to bf16 first; a cast to
//! bf16/f16 rounds). Loads of a bf16 value that is already stored are exact.
//! [`Rounding::PerOp`] rounds the result of every fused op whose dtype is
//! bf16 or f16, matching eager execution bit for bit on those dtypes as long
//! as the trace was not rewritten with the `patterns` set (a lifted GELU or
//! softmax is one op here, so it rounds once); the engine turns that set off
//! under `per_op`.

use std::collections::{BTreeMap, BTreeSet};

use smallvec::SmallVec;
use trace_ir::shape::numel;
use trace_ir::{BinaryOp, DType, Error, NodeId, Op, ReduceOp, Result, Shape, Trace, UnaryOp};

use crate::program::{
    fold_layout, live_nodes, row_major, Cut, CutReason, Frame, Instr, Kernel, KernelKind,
    LoopKernel, MatMulKernel, Program, Reg, Store, View, PROGRAM_FORMAT_VERSION,
};

/// The most elementwise ops a node's inline closure may have for it to be
/// recomputed in every kernel that needs it instead of being realized.
pub const RECOMPUTE_MAX_OPS: usize = 8;

/// Where fused kernels round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rounding {
    /// Compute in f32 and round once at the kernel's outputs (and at explicit casts).
    #[default]
    Once,
    /// Round every fused op's result to its storage dtype, as eager execution does.
    PerOp,
}

/// What the planner may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanConfig {
    /// Where fused kernels round.
    pub rounding: Rounding,
    /// The most ops one loop kernel may hold.
    pub max_kernel_ops: usize,
}

impl Default for PlanConfig {
    /// Round once, at most 256 ops per kernel.
    fn default() -> Self {
        PlanConfig { rounding: Rounding::Once, max_kernel_ops: 256 }
    }
}

/// Plans `trace` into fused kernels. See the module docs for the rules.
///
/// ```
/// use rewrite_rules::planner::{plan, PlanConfig};
/// use rewrite_rules::program::KernelKind;
/// use trace_ir::{BinaryOp, DType, Meta, Op, Trace, UnaryOp};
///
/// let mut t = Trace::new();
/// let x = t.push_parameter(Meta::new([1024].into_iter().collect(), DType::F32));
/// let e = t.push(Op::Unary { kind: UnaryOp::Exp }, &[x]).unwrap();
/// let y = t.push(Op::Binary { kind: BinaryOp::Mul }, &[e, x]).unwrap();
/// t.outputs = vec![y];
/// let p = plan(&t, &PlanConfig::default()).unwrap();
/// assert_eq!(p.kernels.len(), 1);
/// assert!(matches!(p.kernels[0].kind, KernelKind::Loop(_)));
/// ```
pub fn plan(trace: &Trace, config: &PlanConfig) -> Result<Program> {
    trace.validate()?;
    Planner::new(trace, config).run()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Param,
    /// A float or bool `full`: a literal inside loops.
    Literal,
    /// Elementwise on float/bool values (casts from integers included).
    Elem,
    /// Broadcast: an identity inside loops.
    Expand,
    /// Reshape, permute, slice of float/bool values: folded into loads.
    View,
    /// A float reduction over trailing axes.
    Reduce,
    /// A fused row form over trailing axes.
    RowOp,
    MatMul,
    Single,
}

/// Why a tentative plan is not valid yet: realize these nodes and retry.
type Violations = Vec<(NodeId, CutReason)>;

#[derive(Debug, Clone)]
enum Draft {
    Single(NodeId),
    /// A matrix product without epilogue.
    MatMul(NodeId),
    Loop(LoopDraft),
}

#[derive(Debug, Clone)]
struct LoopDraft {
    roots: Vec<NodeId>,
    /// Nodes computed inline (literals and expands included), ascending.
    members: BTreeSet<NodeId>,
    /// View nodes folded into loads.
    folded: BTreeSet<NodeId>,
    /// Realized values read.
    reads: BTreeSet<NodeId>,
    mm: Option<NodeId>,
    shape: Shape,
    row_dims: usize,
    frames: BTreeMap<NodeId, Frame>,
    ops: usize,
}

impl Draft {
    fn roots(&self) -> Vec<NodeId> {
        match self {
            Draft::Single(n) | Draft::MatMul(n) => vec![*n],
            Draft::Loop(l) => l.roots.clone(),
        }
    }
}

struct Planner<'a> {
    t: &'a Trace,
    cfg: &'a PlanConfig,
    live: Vec<bool>,
    users: Vec<Vec<NodeId>>,
    class: Vec<Class>,
    realized: Vec<Option<CutReason>>,
}

fn trailing(axes: &[usize], rank: usize) -> bool {
    let mut a: SmallVec<[usize; 6]> = axes.into();
    a.sort_unstable();
    !a.is_empty() && a.iter().enumerate().all(|(i, &x)| x == rank - a.len() + i)
}

fn float_or_bool(d: DType) -> bool {
    d.is_float() || d == DType::Bool
}

/// Right-aligns `shape` into rank `r` (None when it has more dimensions).
fn align(shape: &[usize], r: usize) -> Option<Shape> {
    if shape.len() > r {
        return None;
    }
    let mut s: Shape = SmallVec::from_elem(1, r - shape.len());
    s.extend_from_slice(shape);
    Some(s)
}

/// Whether `shape` in `frame` broadcasts into the iteration space.
fn fits(shape: &[usize], frame: Frame, s: &[usize], k: usize) -> bool {
    let space = match frame {
        Frame::Elem => s,
        Frame::Row => &s[..s.len() - k],
    };
    match align(shape, space.len()) {
        Some(a) => a.iter().zip(space).all(|(&x, &y)| x == y || x == 1),
        None => false,
    }
}

/// The aligned (rank of `s`) shape of a value in `frame`.
fn aligned(shape: &[usize], frame: Frame, s: &[usize], k: usize) -> Option<Shape> {
    match frame {
        Frame::Elem => align(shape, s.len()),
        Frame::Row => {
            let mut a = align(shape, s.len() - k)?;
            a.extend(std::iter::repeat_n(1, k));
            Some(a)
        }
    }
}

/// The value of a literal as it is stored in its dtype, read back as f32.
fn literal_value(value: f64, dtype: DType) -> f32 {
    match dtype {
        DType::Bool => (value != 0.0) as u8 as f32,
        DType::BF16 => half::bf16::from_f64(value).to_f32(),
        DType::F16 => half::f16::from_f64(value).to_f32(),
        _ => value as f32,
    }
}

impl<'a> Planner<'a> {
    fn new(t: &'a Trace, cfg: &'a PlanConfig) -> Self {
        let live = live_nodes(t);
        let mut users = vec![Vec::new(); t.len()];
        for (id, n) in t.nodes.iter().enumerate() {
            if live[id] {
                for &i in &n.inputs {
                    if !users[i].contains(&id) {
                        users[i].push(id);
                    }
                }
            }
        }
        let class = t.nodes.iter().enumerate().map(|(id, _)| Self::classify(t, id)).collect();
        Planner { t, cfg, live, users, class, realized: vec![None; t.len()] }
    }

    fn classify(t: &Trace, id: NodeId) -> Class {
        let n = &t.nodes[id];
        let dt = n.meta.dtype;
        let in_dt = |i: usize| t.nodes[n.inputs[i]].meta.dtype;
        let in_rank = |i: usize| t.nodes[n.inputs[i]].meta.shape.len();
        match &n.op {
            Op::Parameter { .. } => Class::Param,
            Op::Full { dtype, .. } if float_or_bool(*dtype) => Class::Literal,
            Op::Unary { .. } | Op::Where if float_or_bool(dt) => Class::Elem,
            Op::Binary { .. } if float_or_bool(in_dt(0)) => Class::Elem,
            Op::Cast { to } if float_or_bool(*to) => Class::Elem,
            Op::Expand { .. } if float_or_bool(dt) => Class::Expand,
            Op::Reshape { .. } | Op::Permute { .. } | Op::Slice { .. } if float_or_bool(dt) => {
                Class::View
            }
            Op::Reduce { axes, .. } if dt.is_float() && trailing(axes, in_rank(0)) => Class::Reduce,
            Op::Softmax { axis } | Op::LogSoftmax { axis } if trailing(&[*axis], in_rank(0)) => {
                Class::RowOp
            }
            Op::LayerNorm { axes } | Op::RmsNorm { axes } if trailing(axes, in_rank(0)) => {
                Class::RowOp
            }
            Op::MatMul => Class::MatMul,
            _ => Class::Single,
        }
    }

    fn realize(&mut self, n: NodeId, reason: CutReason) {
        if self.realized[n].is_none() {
            self.realized[n] = Some(reason);
        }
    }

    fn is_realized(&self, n: NodeId) -> bool {
        self.realized[n].is_some()
    }

    fn shape(&self, n: NodeId) -> &Shape {
        &self.t.nodes[n].meta.shape
    }

    fn run(mut self) -> Result<Program> {
        let t = self.t;
        for (id, n) in t.nodes.iter().enumerate() {
            if !self.live[id] {
                continue;
            }
            match self.class[id] {
                Class::Param => self.realize(id, CutReason::Parameter),
                Class::Single => {
                    self.realize(id, CutReason::NotFusible { op: n.op.name().into() });
                    for &i in &n.inputs {
                        self.realize(i, CutReason::NotFusible { op: n.op.name().into() });
                    }
                }
                _ => {}
            }
        }
        for &o in &t.outputs {
            self.realize(o, CutReason::Output);
        }
        // Fixpoint: each round realizes at least one more node, so this ends.
        let mut drafts = loop {
            match self.drafts() {
                Ok(d) => break d,
                Err(v) => {
                    let before = self.realized.iter().filter(|r| r.is_some()).count();
                    for (n, r) in v {
                        self.realize(n, r);
                    }
                    let after = self.realized.iter().filter(|r| r.is_some()).count();
                    if after == before {
                        return Err(Error::internal("planner", "planning made no progress"));
                    }
                }
            }
        };
        self.merge(&mut drafts);
        self.emit(drafts)
    }

    // ------------------------------------------------------------ drafts

    /// Kernels rooted at every realized node, or the nodes to realize first.
    fn drafts(&self) -> std::result::Result<Vec<Draft>, Violations> {
        let mut drafts = Vec::new();
        let mut violations = Violations::new();
        for id in 0..self.t.len() {
            if !self.live[id] || !self.is_realized(id) || self.class[id] == Class::Param {
                continue;
            }
            match self.draft_for(&[id]) {
                Ok(d) => drafts.push(d),
                Err(v) => violations.extend(v),
            }
        }
        if !violations.is_empty() {
            return Err(violations);
        }
        // Nodes computed by several kernels must be cheap.
        let mut count: BTreeMap<NodeId, usize> = BTreeMap::new();
        for d in &drafts {
            if let Draft::Loop(l) = d {
                for &m in &l.members {
                    *count.entry(m).or_default() += 1;
                }
            }
        }
        for (&n, &c) in &count {
            if c > 1 && !self.cheap_to_recompute(n) {
                violations.push((n, CutReason::SecondConsumer));
            }
        }
        if violations.is_empty() {
            Ok(drafts)
        } else {
            Err(violations)
        }
    }

    /// Whether `n`'s inline closure is at most [`RECOMPUTE_MAX_OPS`]
    /// elementwise ops and holds no reduction or product.
    fn cheap_to_recompute(&self, n: NodeId) -> bool {
        let mut seen = BTreeSet::new();
        let mut stack = vec![n];
        let mut ops = 0;
        while let Some(m) = stack.pop() {
            if !seen.insert(m) {
                continue;
            }
            match self.class[m] {
                Class::Reduce | Class::RowOp | Class::MatMul => return false,
                Class::Elem => ops += 1,
                _ => {}
            }
            if ops > RECOMPUTE_MAX_OPS {
                return false;
            }
            for &i in &self.t.nodes[m].inputs {
                if !self.is_realized(i)
                    && matches!(
                        self.class[i],
                        Class::Elem
                            | Class::Expand
                            | Class::Literal
                            | Class::Reduce
                            | Class::RowOp
                            | Class::MatMul
                    )
                {
                    stack.push(i);
                }
            }
        }
        true
    }

    fn draft_for(&self, roots: &[NodeId]) -> std::result::Result<Draft, Violations> {
        let id = roots[0];
        let node = &self.t.nodes[id];
        if roots.len() == 1 {
            match self.class[id] {
                Class::Single | Class::View | Class::Literal => {
                    let missing: Violations = node
                        .inputs
                        .iter()
                        .filter(|&&i| !self.is_realized(i))
                        .map(|&i| (i, CutReason::NotFusible { op: node.op.name().into() }))
                        .collect();
                    return if missing.is_empty() { Ok(Draft::Single(id)) } else { Err(missing) };
                }
                Class::MatMul => {
                    self.matmul_operands(id)?;
                    return Ok(Draft::MatMul(id));
                }
                _ => {}
            }
        }
        self.loop_draft(roots).map(Draft::Loop)
    }

    /// The views of a product's operands over realized buffers.
    fn matmul_operands(
        &self,
        mm: NodeId,
    ) -> std::result::Result<[(NodeId, View, Vec<NodeId>); 2], Violations> {
        let ins = &self.t.nodes[mm].inputs;
        let a = self.compose(ins[0], CutReason::MatMulBoundary);
        let b = self.compose(ins[1], CutReason::MatMulBoundary);
        match (a, b) {
            (Ok(a), Ok(b)) => Ok([a, b]),
            (a, b) => Err(a.err().into_iter().chain(b.err()).collect()),
        }
    }

    /// Folds the chain of unrealized views above a realized buffer into one
    /// strided view: `(base, view, folded view nodes)`.
    fn compose(
        &self,
        u: NodeId,
        reason: CutReason,
    ) -> std::result::Result<(NodeId, View, Vec<NodeId>), (NodeId, CutReason)> {
        let mut chain = Vec::new();
        let mut cur = u;
        while !self.is_realized(cur) && matches!(self.class[cur], Class::View | Class::Expand) {
            chain.push(cur);
            cur = self.t.nodes[cur].inputs[0];
        }
        if !self.is_realized(cur) {
            let why = if chain.is_empty() { reason } else { CutReason::ShapeChange };
            return Err((cur, why));
        }
        let base = cur;
        let base_shape = self.shape(base).clone();
        let steps: Vec<Op> = chain.iter().rev().map(|&v| self.t.nodes[v].op.clone()).collect();
        let (shape, strides, offset) = fold_layout(&base_shape, &steps).map_err(|i| {
            // A reshape that does not fold cuts below itself; any other step at itself.
            let at = chain.len() - 1 - i;
            let below = if i == 0 { base } else { chain[at + 1] };
            (
                if matches!(steps[i], Op::Reshape { .. }) { below } else { chain[at] },
                CutReason::ShapeChange,
            )
        })?;
        let view = if chain.is_empty()
            || (shape == base_shape && offset == 0 && strides == row_major(&shape))
        {
            View::Direct
        } else if shape.len() >= 2 && shape.len() == base_shape.len() && offset == 0 && {
            let r = shape.len();
            let mut sw = base_shape.clone();
            sw.swap(r - 2, r - 1);
            let mut st = row_major(&base_shape);
            st.swap(r - 2, r - 1);
            sw == shape && st == strides
        } {
            View::Transposed
        } else {
            View::Strided { shape, strides, offset, source: base_shape, steps }
        };
        Ok((base, view, chain))
    }

    fn loop_draft(&self, roots: &[NodeId]) -> std::result::Result<LoopDraft, Violations> {
        let t = self.t;
        let mut members = BTreeSet::new();
        let mut folded = BTreeSet::new();
        let mut reads = BTreeSet::new();
        let mut mm: Option<NodeId> = None;
        let mut v = Violations::new();
        let mut stack: Vec<NodeId> = roots.to_vec();
        while let Some(n) = stack.pop() {
            if !members.insert(n) {
                continue;
            }
            if self.class[n] == Class::MatMul {
                match self.matmul_operands(n) {
                    Ok(ops) => {
                        for (base, _, chain) in ops {
                            reads.insert(base);
                            folded.extend(chain);
                        }
                    }
                    Err(e) => v.extend(e),
                }
                continue;
            }
            for &u in &t.nodes[n].inputs {
                // A root read by another member is computed inline (merged loops).
                if roots.contains(&u) {
                    continue;
                }
                if self.is_realized(u) {
                    reads.insert(u);
                    continue;
                }
                match self.class[u] {
                    Class::Literal | Class::Elem | Class::Expand | Class::Reduce | Class::RowOp => {
                        stack.push(u)
                    }
                    Class::View => match self.compose(u, CutReason::ShapeChange) {
                        Ok((base, _, chain)) => {
                            reads.insert(base);
                            folded.extend(chain);
                        }
                        Err(e) => v.push(e),
                    },
                    Class::MatMul => {
                        if mm.is_some_and(|m| m != u) {
                            v.push((u, CutReason::MatMulBoundary));
                        } else {
                            mm = Some(u);
                            stack.push(u);
                        }
                    }
                    Class::Param | Class::Single => {
                        v.push((u, CutReason::NotFusible { op: t.nodes[n].op.name().into() }))
                    }
                }
            }
        }
        if !v.is_empty() {
            return Err(v);
        }
        // A loop cannot read (through a view) a value it computes itself;
        // only a merge of two loops gets here.
        if let Some(&r) = roots.iter().find(|r| reads.contains(r)) {
            // (Direct reads of roots were skipped above, so this is a view.)
            return Err(vec![(r, CutReason::ShapeChange)]);
        }
        // The iteration space: set by the reduction nearest the outputs.
        let reds: Vec<NodeId> = members
            .iter()
            .rev()
            .copied()
            .filter(|&m| matches!(self.class[m], Class::Reduce | Class::RowOp))
            .collect();
        let red_axes = |m: NodeId| -> usize {
            match &t.nodes[m].op {
                Op::Reduce { axes, .. } | Op::LayerNorm { axes } | Op::RmsNorm { axes } => {
                    axes.len()
                }
                _ => 1,
            }
        };
        let (shape, row_dims) = if let Some(&r0) = reds.first() {
            if let Some(m) = mm {
                return Err(vec![(m, CutReason::MatMulBoundary)]);
            }
            let s = self.shape(t.nodes[r0].inputs[0]).clone();
            let k = red_axes(r0);
            for &r in &reds[1..] {
                if *self.shape(t.nodes[r].inputs[0]) != s || red_axes(r) != k {
                    v.push((r, CutReason::ReductionBoundary));
                }
            }
            (s, k)
        } else if let Some(m) = mm {
            (self.shape(m).clone(), 0)
        } else {
            let big = roots
                .iter()
                .copied()
                .max_by_key(|&r| (self.shape(r).len(), numel(self.shape(r))))
                .unwrap_or(roots[0]);
            (self.shape(big).clone(), 0)
        };
        if !v.is_empty() {
            return Err(v);
        }
        let k = row_dims;
        // Frames, bottom-up; `None` is free (only loads and literals below).
        let mut frames: BTreeMap<NodeId, Option<Frame>> = BTreeMap::new();
        for &m in &members {
            let node = &t.nodes[m];
            let f = match self.class[m] {
                Class::Literal => None,
                Class::MatMul => Some(Frame::Elem),
                Class::Reduce | Class::RowOp => {
                    let x = node.inputs[0];
                    if members.contains(&x) && frames[&x] == Some(Frame::Row) {
                        v.push((x, CutReason::ShapeChange));
                    }
                    match node.op {
                        Op::Reduce { keepdim: false, .. } => Some(Frame::Row),
                        _ => Some(Frame::Elem),
                    }
                }
                _ => {
                    let fs: BTreeSet<Frame> = node
                        .inputs
                        .iter()
                        .filter(|&&i| members.contains(&i) && numel(self.shape(i)) != 1)
                        .filter_map(|i| frames[i])
                        .collect();
                    if fs.len() > 1 {
                        for &i in &node.inputs {
                            if members.contains(&i) && frames[&i] == Some(Frame::Row) {
                                v.push((i, CutReason::ShapeChange));
                            }
                        }
                    }
                    fs.into_iter().next()
                }
            };
            frames.insert(m, f);
        }
        // Free nodes take the frame their readers need.
        let mut resolved: BTreeMap<NodeId, Frame> = BTreeMap::new();
        for &m in members.iter().rev() {
            let f = frames[&m].unwrap_or_else(|| {
                let readers: Vec<Frame> = self.users[m]
                    .iter()
                    .filter(|u| members.contains(u))
                    .map(|u| match self.class[*u] {
                        Class::Reduce | Class::RowOp | Class::MatMul => Frame::Elem,
                        _ => resolved.get(u).copied().unwrap_or(Frame::Elem),
                    })
                    .collect();
                if !roots.contains(&m)
                    && !readers.is_empty()
                    && readers.iter().all(|&f| f == Frame::Row)
                {
                    Frame::Row
                } else {
                    Frame::Elem
                }
            });
            resolved.insert(m, f);
        }
        // Every node must fit the iteration space in its frame.
        for &m in &members {
            if self.class[m] == Class::Literal {
                continue;
            }
            if !fits(self.shape(m), resolved[&m], &shape, k) {
                let inner: Vec<NodeId> =
                    t.nodes[m].inputs.iter().copied().filter(|i| members.contains(i)).collect();
                let why = if reds.is_empty() {
                    CutReason::ShapeChange
                } else {
                    CutReason::ReductionBoundary
                };
                if inner.is_empty() {
                    v.push((m, why));
                } else {
                    v.extend(inner.into_iter().map(|i| (i, why.clone())));
                }
            }
        }
        // Operands' frames must match their readers' (scalars fit anywhere).
        for &m in &members {
            if matches!(self.class[m], Class::Elem | Class::Expand) {
                for &i in &t.nodes[m].inputs {
                    if members.contains(&i)
                        && numel(self.shape(i)) != 1
                        && resolved[&i] != resolved[&m]
                    {
                        v.push((i, CutReason::ShapeChange));
                    }
                }
            }
        }
        if !v.is_empty() {
            return Err(v);
        }
        // Roots are stored over the whole space or one value per row.
        let mut outer = shape.clone();
        for d in outer.iter_mut().skip(shape.len() - k) {
            *d = 1;
        }
        for &r in roots {
            let a = aligned(self.shape(r), resolved[&r], &shape, k);
            if a.as_ref() != Some(&shape) && a.as_ref() != Some(&outer) {
                if reds.is_empty() {
                    // Only a merge of unlike loops gets here.
                    return Err(vec![(r, CutReason::ShapeChange)]);
                }
                return Err(reds.iter().map(|&x| (x, CutReason::ReductionBoundary)).collect());
            }
        }
        let ops: usize = members
            .iter()
            .map(|&m| match self.class[m] {
                Class::Elem | Class::Reduce | Class::MatMul => 1,
                Class::RowOp => 7,
                _ => 0,
            })
            .sum();
        if ops > self.cfg.max_kernel_ops.max(1) {
            // Split near the middle: realize the node whose closure is closest to half.
            let half = ops / 2;
            let pick = members
                .iter()
                .copied()
                .filter(|m| {
                    !roots.contains(m)
                        && matches!(self.class[*m], Class::Elem | Class::Reduce | Class::RowOp)
                })
                .min_by_key(|&m| self.closure_ops(m, &members).abs_diff(half));
            if let Some(p) = pick {
                return Err(vec![(p, CutReason::Limit)]);
            }
        }
        Ok(LoopDraft {
            roots: roots.to_vec(),
            members,
            folded,
            reads,
            mm,
            shape,
            row_dims,
            frames: resolved,
            ops,
        })
    }

    fn closure_ops(&self, n: NodeId, members: &BTreeSet<NodeId>) -> usize {
        let mut seen = BTreeSet::new();
        let mut stack = vec![n];
        while let Some(m) = stack.pop() {
            if seen.insert(m) {
                stack
                    .extend(self.t.nodes[m].inputs.iter().copied().filter(|i| members.contains(i)));
            }
        }
        seen.len()
    }

    // ------------------------------------------------------------ merging

    /// Which drafts read each draft's outputs.
    fn successors(&self, drafts: &[Draft]) -> Vec<BTreeSet<usize>> {
        let mut by_value: BTreeMap<NodeId, usize> = BTreeMap::new();
        for (k, d) in drafts.iter().enumerate() {
            for r in d.roots() {
                by_value.insert(r, k);
            }
        }
        let mut succ = vec![BTreeSet::new(); drafts.len()];
        for (k, d) in drafts.iter().enumerate() {
            for v in self.reads_of(d) {
                if let Some(&p) = by_value.get(&v) {
                    if p != k {
                        succ[p].insert(k);
                    }
                }
            }
        }
        succ
    }

    fn reads_of(&self, d: &Draft) -> Vec<NodeId> {
        match d {
            Draft::Single(n) => self.t.nodes[*n].inputs.to_vec(),
            Draft::MatMul(n) => match self.matmul_operands(*n) {
                Ok(ops) => ops.iter().map(|o| o.0).collect(),
                Err(_) => self.t.nodes[*n].inputs.to_vec(),
            },
            Draft::Loop(l) => l.reads.iter().copied().collect(),
        }
    }

    /// Whether `to` is reachable from `from` through at least one other draft.
    fn indirect_path(succ: &[BTreeSet<usize>], from: usize, to: usize) -> bool {
        let mut seen = vec![false; succ.len()];
        let mut stack: Vec<usize> = succ[from].iter().copied().filter(|&s| s != to).collect();
        while let Some(k) = stack.pop() {
            if k == to {
                return true;
            }
            if std::mem::replace(&mut seen[k], true) {
                continue;
            }
            stack.extend(succ[k].iter().copied());
        }
        false
    }

    fn merge(&self, drafts: &mut Vec<Draft>) {
        let mut changed = true;
        let mut budget = 4 * drafts.len() + 16;
        while changed && budget > 0 {
            changed = false;
            let succ = self.successors(drafts);
            'outer: for a in 0..drafts.len() {
                let Draft::Loop(la) = &drafts[a] else { continue };
                for b in 0..drafts.len() {
                    if a == b {
                        continue;
                    }
                    let Draft::Loop(lb) = &drafts[b] else { continue };
                    // A row loop takes an elementwise loop over its space
                    // either way (a layer norm whose statistics are also
                    // outputs stays one pass); two row loops must reduce
                    // the same trailing axes.
                    if la.shape != lb.shape
                        || (la.row_dims != lb.row_dims && la.row_dims != 0 && lb.row_dims != 0)
                        || la.mm.is_some()
                    {
                        continue;
                    }
                    let vertical = succ[a].contains(&b);
                    let horizontal = !vertical
                        && a < b
                        && la.reads.intersection(&lb.reads).any(|&v| numel(self.shape(v)) > 1)
                        && !succ[b].contains(&a);
                    if !vertical && !horizontal {
                        continue;
                    }
                    if Self::indirect_path(&succ, a, b)
                        || (horizontal && Self::indirect_path(&succ, b, a))
                    {
                        continue;
                    }
                    budget = budget.saturating_sub(1);
                    let mut roots: Vec<NodeId> =
                        la.roots.iter().chain(&lb.roots).copied().collect();
                    roots.sort_unstable();
                    roots.dedup();
                    let Ok(merged) = self.loop_draft(&roots) else { continue };
                    // Merging must not make anything else recomputed.
                    if merged.members.len() > la.members.len() + lb.members.len() {
                        continue;
                    }
                    let (lo, hi) = (a.min(b), a.max(b));
                    drafts.remove(hi);
                    drafts[lo] = Draft::Loop(merged);
                    changed = true;
                    break 'outer;
                }
            }
        }
    }

    // ------------------------------------------------------------ emission

    fn emit(&self, drafts: Vec<Draft>) -> Result<Program> {
        let t = self.t;
        // Order: a topological sort of the drafts, earliest roots first.
        let succ = self.successors(&drafts);
        let mut indeg = vec![0usize; drafts.len()];
        for s in &succ {
            for &k in s {
                indeg[k] += 1;
            }
        }
        let key = |k: usize| drafts[k].roots().into_iter().max().unwrap_or(0);
        let mut ready: BTreeSet<(NodeId, usize)> =
            (0..drafts.len()).filter(|&k| indeg[k] == 0).map(|k| (key(k), k)).collect();
        let mut order = Vec::with_capacity(drafts.len());
        while let Some(first) = ready.pop_first() {
            let k = first.1;
            order.push(k);
            for &s in &succ[k] {
                indeg[s] -= 1;
                if indeg[s] == 0 {
                    ready.insert((key(s), s));
                }
            }
        }
        if order.len() != drafts.len() {
            return Err(Error::internal("planner", "kernels depend on each other in a cycle"));
        }
        let mut kernels = Vec::with_capacity(drafts.len());
        let mut computed_in: Vec<Option<usize>> = vec![None; t.len()];
        for (pos, &k) in order.iter().enumerate() {
            let kernel = self.emit_draft(&drafts[k])?;
            for &n in &kernel.nodes {
                computed_in[n] = Some(pos);
            }
            kernels.push(kernel);
        }
        // Cuts: every live edge whose consumer's kernel loads the producer.
        let mut cuts = Vec::new();
        for kernel in &kernels {
            let inside: BTreeSet<NodeId> = kernel.nodes.iter().copied().collect();
            for &c in &kernel.nodes {
                for &p in &t.nodes[c].inputs {
                    if !inside.contains(&p) {
                        let reason = self.realized[p].clone().unwrap_or(CutReason::ShapeChange);
                        let cut = Cut { producer: p, consumer: c, reason };
                        if !cuts.contains(&cut) {
                            cuts.push(cut);
                        }
                    }
                }
            }
        }
        Ok(Program {
            version: PROGRAM_FORMAT_VERSION,
            params: t.parameters(),
            values: t.nodes.iter().map(|n| n.meta.clone()).collect(),
            kernels,
            outputs: t.outputs.clone(),
            cuts,
        })
    }

    fn emit_draft(&self, d: &Draft) -> Result<Kernel> {
        let t = self.t;
        match d {
            Draft::Single(n) => Ok(Kernel {
                kind: KernelKind::Single { op: t.nodes[*n].op.clone() },
                inputs: t.nodes[*n].inputs.to_vec(),
                outputs: vec![*n],
                nodes: vec![*n],
            }),
            Draft::MatMul(n) => {
                let [a, b] = self
                    .matmul_operands(*n)
                    .map_err(|_| Error::internal("planner", "matmul operands"))?;
                let mut nodes: Vec<NodeId> = a.2.iter().chain(&b.2).copied().collect();
                nodes.push(*n);
                nodes.sort_unstable();
                nodes.dedup();
                Ok(Kernel {
                    kind: KernelKind::MatMul(MatMulKernel {
                        lhs: a.1,
                        rhs: b.1,
                        shape: self.shape(*n).clone(),
                        epilogue: None,
                    }),
                    inputs: vec![a.0, b.0],
                    outputs: vec![*n],
                    nodes,
                })
            }
            Draft::Loop(l) => self.emit_loop(l),
        }
    }

    fn emit_loop(&self, l: &LoopDraft) -> Result<Kernel> {
        let t = self.t;
        let mut e = Emitter {
            instrs: Vec::new(),
            inputs: Vec::new(),
            reserved: 0,
            loads: Vec::new(),
            regs: BTreeMap::new(),
            acc: None,
        };
        let mut nodes: BTreeSet<NodeId> = l.members.iter().chain(&l.folded).copied().collect();
        let mut mm_kernel = None;
        if let Some(m) = l.mm {
            let [a, b] = self
                .matmul_operands(m)
                .map_err(|_| Error::internal("planner", "matmul operands"))?;
            e.inputs.push(a.0);
            e.inputs.push(b.0);
            e.reserved = 2;
            nodes.extend(a.2.iter().chain(&b.2));
            mm_kernel = Some((a.1, b.1, self.shape(m).clone()));
        }
        let per_op = self.cfg.rounding == Rounding::PerOp;
        for &m in &l.members {
            let node = &t.nodes[m];
            let dt = node.meta.dtype;
            let frame = l.frames[&m];
            let round = |e: &mut Emitter, r: Reg| -> Reg {
                if per_op && matches!(dt, DType::BF16 | DType::F16) {
                    e.push(Instr::Round { to: dt, x: r })
                } else {
                    r
                }
            };
            let reg = match &node.op {
                Op::Full { value, dtype, .. } => {
                    e.push(Instr::Literal { value: literal_value(*value, *dtype) })
                }
                Op::MatMul => {
                    let r = e.push(Instr::Acc);
                    round(&mut e, r)
                }
                Op::Expand { .. } => self.operand(&mut e, l, node.inputs[0], frame),
                Op::Unary { kind } => {
                    let x = self.operand(&mut e, l, node.inputs[0], frame);
                    let r = e.push(Instr::Unary { op: *kind, x });
                    round(&mut e, r)
                }
                Op::Binary { kind } => {
                    let a = self.operand(&mut e, l, node.inputs[0], frame);
                    let b = self.operand(&mut e, l, node.inputs[1], frame);
                    let r = e.push(Instr::Binary { op: *kind, a, b });
                    if kind.returns_bool() {
                        r
                    } else {
                        round(&mut e, r)
                    }
                }
                Op::Where => {
                    let c = self.operand(&mut e, l, node.inputs[0], frame);
                    let a = self.operand(&mut e, l, node.inputs[1], frame);
                    let b = self.operand(&mut e, l, node.inputs[2], frame);
                    e.push(Instr::Where { c, a, b })
                }
                Op::Cast { to } => {
                    let x = self.operand(&mut e, l, node.inputs[0], frame);
                    let from = t.nodes[node.inputs[0]].meta.dtype;
                    if *to == from {
                        x
                    } else {
                        // A value leaving a half-precision dtype is rounded to
                        // it first: where it is cast is one of its outputs.
                        let x = if matches!(from, DType::BF16 | DType::F16) && !per_op {
                            e.push(Instr::Round { to: from, x })
                        } else {
                            x
                        };
                        match to {
                            DType::F32 => x,
                            _ => e.push(Instr::Round { to: *to, x }),
                        }
                    }
                }
                Op::Reduce { kind, .. } => {
                    let x = self.operand(&mut e, l, node.inputs[0], Frame::Elem);
                    let r = e.push(Instr::Reduce { op: *kind, x });
                    round(&mut e, r)
                }
                Op::Softmax { .. } | Op::LogSoftmax { .. } => {
                    let x = self.operand(&mut e, l, node.inputs[0], Frame::Elem);
                    let mx = e.push(Instr::Reduce { op: ReduceOp::Max, x });
                    let d = e.push(Instr::Binary { op: BinaryOp::Sub, a: x, b: mx });
                    let ex = e.push(Instr::Unary { op: UnaryOp::Exp, x: d });
                    let s = e.push(Instr::Reduce { op: ReduceOp::Sum, x: ex });
                    let r = if matches!(node.op, Op::Softmax { .. }) {
                        e.push(Instr::Binary { op: BinaryOp::Div, a: ex, b: s })
                    } else {
                        let ls = e.push(Instr::Unary { op: UnaryOp::Log, x: s });
                        e.push(Instr::Binary { op: BinaryOp::Sub, a: d, b: ls })
                    };
                    round(&mut e, r)
                }
                Op::LayerNorm { .. } => {
                    let x = self.operand(&mut e, l, node.inputs[0], Frame::Elem);
                    let eps = self.operand(&mut e, l, node.inputs[1], Frame::Elem);
                    let mu = e.push(Instr::Reduce { op: ReduceOp::Mean, x });
                    let d = e.push(Instr::Binary { op: BinaryOp::Sub, a: x, b: mu });
                    let sq = e.push(Instr::Binary { op: BinaryOp::Mul, a: d, b: d });
                    let var = e.push(Instr::Reduce { op: ReduceOp::Mean, x: sq });
                    let ve = e.push(Instr::Binary { op: BinaryOp::Add, a: var, b: eps });
                    let rs = e.push(Instr::Unary { op: UnaryOp::Rsqrt, x: ve });
                    let r = e.push(Instr::Binary { op: BinaryOp::Mul, a: d, b: rs });
                    round(&mut e, r)
                }
                Op::RmsNorm { .. } => {
                    let x = self.operand(&mut e, l, node.inputs[0], Frame::Elem);
                    let eps = self.operand(&mut e, l, node.inputs[1], Frame::Elem);
                    let sq = e.push(Instr::Binary { op: BinaryOp::Mul, a: x, b: x });
                    let ms = e.push(Instr::Reduce { op: ReduceOp::Mean, x: sq });
                    let ve = e.push(Instr::Binary { op: BinaryOp::Add, a: ms, b: eps });
                    let rs = e.push(Instr::Unary { op: UnaryOp::Rsqrt, x: ve });
                    let r = e.push(Instr::Binary { op: BinaryOp::Mul, a: x, b: rs });
                    round(&mut e, r)
                }
                other => {
                    return Err(Error::internal(
                        "planner",
                        format!("{} in a loop kernel", other.name()),
                    ))
                }
            };
            e.regs.insert(m, reg);
        }
        let mut outputs = Vec::new();
        let mut stores = Vec::new();
        for &r in &l.roots {
            let reg = match e.regs.get(&r) {
                Some(&reg) => reg,
                None => {
                    self.operand(&mut e, l, r, l.frames.get(&r).copied().unwrap_or(Frame::Elem))
                }
            };
            stores.push(Store {
                reg,
                output: outputs.len(),
                frame: l.frames.get(&r).copied().unwrap_or(Frame::Elem),
            });
            outputs.push(r);
        }
        let body =
            LoopKernel { shape: l.shape.clone(), row_dims: l.row_dims, instrs: e.instrs, stores };
        let kind = match mm_kernel {
            Some((lhs, rhs, shape)) => {
                KernelKind::MatMul(MatMulKernel { lhs, rhs, shape, epilogue: Some(body) })
            }
            None => KernelKind::Loop(body),
        };
        let _ = l.ops;
        Ok(Kernel { kind, inputs: e.inputs, outputs, nodes: nodes.into_iter().collect() })
    }

    /// The register holding `u` as read by a node in `frame`.
    fn operand(&self, e: &mut Emitter, l: &LoopDraft, u: NodeId, frame: Frame) -> Reg {
        if let Some(&r) = e.regs.get(&u) {
            return r;
        }
        let (base, view) = if self.is_realized(u) {
            (u, View::Direct)
        } else {
            match self.compose(u, CutReason::ShapeChange) {
                Ok((base, view, _)) => (base, view),
                // Unreachable for a valid draft; read the value as it is.
                Err(_) => (u, View::Direct),
            }
        };
        let _ = l;
        e.load(base, view, frame)
    }
}

struct Emitter {
    instrs: Vec<Instr>,
    inputs: Vec<NodeId>,
    /// Inputs taken by a matmul's operands, which loads do not share.
    reserved: usize,
    loads: Vec<((NodeId, View, Frame), Reg)>,
    regs: BTreeMap<NodeId, Reg>,
    acc: Option<Reg>,
}

impl Emitter {
    fn push(&mut self, i: Instr) -> Reg {
        if matches!(i, Instr::Acc) {
            if let Some(r) = self.acc {
                return r;
            }
            self.acc = Some(self.instrs.len());
        }
        self.instrs.push(i);
        self.instrs.len() - 1
    }

    fn load(&mut self, value: NodeId, view: View, frame: Frame) -> Reg {
        let key = (value, view, frame);
        if let Some((_, r)) = self.loads.iter().find(|(k, _)| *k == key) {
            return *r;
        }
        let input = match self.inputs.iter().skip(self.reserved).position(|&v| v == value) {
            Some(p) => p + self.reserved,
            None => {
                self.inputs.push(value);
                self.inputs.len() - 1
            }
        };
        let reg = self.push(Instr::Load { input, view: key.1.clone(), frame });
        self.loads.push((key, reg));
        reg
    }
}
