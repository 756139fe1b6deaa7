//! The [`Program`]: the unit a backend compiles.
//!
//! A program is a list of kernels in execution order over *values*. A value
//! id is the [`trace_ir::NodeId`] of the trace node whose result it is, so a
//! dump or `fusion-debug explain` can map every buffer back to the user's op;
//! [`Program::values`] holds the meta of every node (values no kernel stores
//! are never materialized). Parameters come first in the backend's input list,
//! in [`Program::params`] order.
//!
//! Kernels come in three kinds ([`KernelKind`]):
//! - [`KernelKind::Single`]: one primitive run by the backend's reference code
//!   (layout ops, concat, arg-reductions, integer work, anything not fused);
//! - [`KernelKind::Loop`]: a fused elementwise or row-reduction pass, an SSA
//!   instruction list over f32 registers ([`LoopKernel`]);
//! - [`KernelKind::MatMul`]: a batched GEMM whose operands may be strided views
//!   (folded transposes) with an optional elementwise epilogue.
//!
//! The planner also records, for every trace edge that crosses kernels, why
//! it was cut ([`Cut`], [`CutReason`]).
//!
//! ```
//! use rewrite_rules::program::Program;
//! use trace_ir::{Meta, Op, Trace, UnaryOp, DType};
//!
//! let mut t = Trace::new();
//! let x = t.push_parameter(Meta::new([4].into_iter().collect(), DType::F32));
//! let y = t.push(Op::Unary { kind: UnaryOp::Exp }, &[x]).unwrap();
//! t.outputs = vec![y];
//! let p = Program::unfused(&t);
//! assert_eq!(p.kernels.len(), 1);
//! assert_eq!(p.fingerprint(), Program::unfused(&t).fingerprint());
//! ```

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use trace_ir::shape::numel;
use trace_ir::{BinaryOp, DType, Meta, NodeId, Op, ReduceOp, Shape, Trace, UnaryOp};

/// Id of a value: the trace node that produces it.
pub type ValueId = NodeId;

/// A register of a loop body: the index of the instruction that defines it.
pub type Reg = usize;

/// Format version of the serialized program (part of the fingerprint).
pub const PROGRAM_FORMAT_VERSION: u32 = 2;

/// What a backend compiles: parameters, kernels in execution order, outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Program {
    /// Format version, [`PROGRAM_FORMAT_VERSION`].
    pub version: u32,
    /// The value of each runtime input, in parameter order.
    pub params: Vec<ValueId>,
    /// The meta of every value id (one per trace node).
    pub values: Vec<Meta>,
    /// Kernels in an order that respects their data dependencies.
    pub kernels: Vec<Kernel>,
    /// The values returned by a run, in order (may repeat, may be parameters).
    pub outputs: Vec<ValueId>,
    /// Why each trace edge between two kernels was not fused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cuts: Vec<Cut>,
    /// The passes whose step budget ran out before they were done, so the
    /// program may be less fused (or less optimized) than it could be.
    /// Empty, and then absent from the serialized form, almost always: a
    /// program without it serializes exactly as before the field existed,
    /// and readers of [`PROGRAM_FORMAT_VERSION`] 2 that predate it ignore
    /// it, so the version is unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets_exhausted: Vec<BudgetExhausted>,
}

/// A pass stopped by its step budget rather than by running out of work.
///
/// Passes named today: `merge` (the planner's loop merging,
/// [`crate::planner::PlanConfig::merge_budget`]), and, recorded by the engine
/// from the rewrite that produced the planned trace, `extract` (the greedy
/// DAG extraction, `32 × e-nodes + e-classes` steps) and `refine` (its
/// refinement of the roots' choices). The pass is a string so a dump or
/// cached program that names a pass this build does not know still reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BudgetExhausted {
    /// The pass: `merge`, `extract`, `refine`.
    pub pass: String,
    /// The budget it had, in its own steps.
    pub budget: usize,
}

impl std::fmt::Display for BudgetExhausted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: budget of {} steps exhausted", self.pass, self.budget)
    }
}

/// One kernel: what it reads, what it writes, how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    /// How the kernel computes.
    pub kind: KernelKind,
    /// Values read, in the order the kernel's instructions index them.
    pub inputs: Vec<ValueId>,
    /// Values written (each is stored by exactly one kernel).
    pub outputs: Vec<ValueId>,
    /// The trace nodes computed in this kernel (a cheap node recomputed in
    /// several kernels is listed in each), ascending.
    pub nodes: Vec<NodeId>,
}

/// How a kernel computes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)] // one per kernel; boxing would only obscure the format
pub enum KernelKind {
    /// One primitive op on `inputs`, producing `outputs[0]`.
    Single {
        /// The op, with its attributes.
        op: Op,
    },
    /// A fused loop.
    Loop(LoopKernel),
    /// A batched matrix product with an optional epilogue.
    MatMul(MatMulKernel),
}

/// How a kernel input is indexed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "view", rename_all = "snake_case")]
pub enum View {
    /// The buffer as it is, broadcast by right-alignment. Sizes come from the
    /// buffer at run time.
    Direct,
    /// The buffer with its last two dimensions swapped (a folded transpose).
    Transposed,
    /// A strided window of the buffer: element `i` (multi-index over
    /// `shape`) is at `offset + sum(i[d] * strides[d])`. The buffer must have
    /// `source` shape; `shape`, `strides` and `offset` are `steps` folded
    /// over it ([`fold_layout`]), so a resized program folds them again.
    Strided {
        /// The viewed shape.
        shape: Shape,
        /// Element strides, one per viewed dimension (0 for broadcast ones).
        strides: SmallVec<[usize; 6]>,
        /// Offset of the first element.
        offset: usize,
        /// The shape the buffer must have.
        source: Shape,
        /// The layout ops (permute, expand, slice, reshape) from the buffer
        /// to the view, the first applied first.
        steps: Vec<Op>,
    },
}

/// Row-major element strides of `shape`.
pub fn row_major(shape: &[usize]) -> SmallVec<[usize; 6]> {
    let mut s: SmallVec<[usize; 6]> = SmallVec::from_elem(1, shape.len());
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

/// The shape, strides and offset of `steps` applied to a row-major buffer
/// of shape `source`, or the index of the first step that is no strided
/// window of what it reads (a reshape that merges or splits strided
/// dimensions, or an op that is not a layout op).
pub fn fold_layout(
    source: &[usize],
    steps: &[Op],
) -> std::result::Result<(Shape, SmallVec<[usize; 6]>, usize), usize> {
    let mut shape: Shape = source.into();
    let mut strides = row_major(source);
    let mut offset = 0usize;
    for (i, op) in steps.iter().enumerate() {
        let read = Meta::new(shape.clone(), DType::F32);
        let out = trace_ir::infer(op, &[&read]).map_err(|_| i)?.shape;
        match op {
            Op::Permute { perm } => strides = perm.iter().map(|&p| strides[p]).collect(),
            Op::Expand { .. } => {
                let lead = out.len() - shape.len();
                let mut st: SmallVec<[usize; 6]> = SmallVec::from_elem(0, lead);
                st.extend(strides.iter().enumerate().map(|(d, &s)| {
                    if shape[d] == 1 && out[lead + d] != 1 {
                        0
                    } else {
                        s
                    }
                }));
                strides = st;
            }
            Op::Slice { axis, start, step, .. } => {
                offset += start * strides[*axis];
                strides[*axis] *= step;
            }
            Op::Reshape { .. } => {
                if strides == row_major(&shape) || numel(&shape) <= 1 {
                    strides = row_major(&out);
                } else {
                    // Only size-1 dimensions may come and go.
                    let kept: Vec<(usize, usize)> = shape
                        .iter()
                        .zip(&strides)
                        .filter(|(d, _)| **d != 1)
                        .map(|(d, s)| (*d, *s))
                        .collect();
                    let to: Vec<usize> = out.iter().copied().filter(|&d| d != 1).collect();
                    if kept.len() != to.len() || kept.iter().zip(&to).any(|(x, y)| x.0 != *y) {
                        return Err(i);
                    }
                    let mut it = kept.iter();
                    strides = out
                        .iter()
                        .map(|&d| if d == 1 { 0 } else { it.next().map_or(0, |p| p.1) })
                        .collect();
                }
            }
            _ => return Err(i),
        }
        shape = out;
    }
    Ok((shape, strides, offset))
}

impl View {
    /// The shape the view presents, given the buffer's shape.
    pub fn shape(&self, source: &[usize]) -> Shape {
        match self {
            View::Direct => source.into(),
            View::Transposed => {
                let mut s: Shape = source.into();
                let r = s.len();
                if r >= 2 {
                    s.swap(r - 2, r - 1);
                }
                s
            }
            View::Strided { shape, .. } => shape.clone(),
        }
    }
}

/// Which of a loop's two index spaces a value lives in: the whole iteration
/// shape (`Elem`), or the rows left after reducing the trailing `row_dims`
/// dimensions (`Row`, for reduction results without `keepdim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Frame {
    /// Right-aligned into the iteration shape.
    Elem,
    /// Right-aligned into the outer (kept) dimensions.
    Row,
}

/// A fused loop: an iteration shape, an SSA instruction list over f32
/// registers, and the registers stored to outputs.
///
/// The iteration shape is split into outer dimensions and `row_dims`
/// trailing reduced ones. With `row_dims == 0` the loop is purely
/// elementwise. Each register holds one value per element (varies along the
/// row dimensions), one per row (constant along them), or one scalar; the
/// backend derives which from the instruction list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopKernel {
    /// The iteration shape at compile time.
    pub shape: Shape,
    /// How many trailing dimensions of `shape` the reductions reduce.
    pub row_dims: usize,
    /// Register `i` is defined by `instrs[i]`.
    pub instrs: Vec<Instr>,
    /// `(register, index into the kernel's outputs)` pairs.
    pub stores: Vec<Store>,
}

/// A register written to one of the kernel's outputs, rounded to its dtype.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Store {
    /// The register stored.
    pub reg: Reg,
    /// Index into [`Kernel::outputs`].
    pub output: usize,
    /// The frame the output's shape is aligned in.
    pub frame: Frame,
}

/// One instruction of a loop body. Registers hold f32; bool values are 0/1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "i", rename_all = "snake_case")]
pub enum Instr {
    /// Reads kernel input `input` through `view`, aligned in `frame`,
    /// converting its dtype to f32 (bool to 0/1, integers with `as`).
    Load {
        /// Index into [`Kernel::inputs`].
        input: usize,
        /// How the buffer is indexed.
        view: View,
        /// How the view aligns with the iteration shape.
        frame: Frame,
    },
    /// The matrix product of a [`MatMulKernel`], in an epilogue.
    Acc,
    /// A constant.
    Literal {
        /// The value (already rounded to the literal's dtype).
        #[serde(with = "trace_ir::literal::f32")]
        value: f32,
    },
    /// A unary op on a float or bool register.
    Unary {
        /// The op.
        op: UnaryOp,
        /// Operand.
        x: Reg,
    },
    /// A binary op; comparisons and logical ops give 0/1.
    Binary {
        /// The op.
        op: BinaryOp,
        /// Left operand.
        a: Reg,
        /// Right operand.
        b: Reg,
    },
    /// `c != 0 ? a : b`.
    Where {
        /// Condition.
        c: Reg,
        /// Value where the condition holds.
        a: Reg,
        /// Value elsewhere.
        b: Reg,
    },
    /// Rounds to a storage dtype and back (bf16, f16; bool gives `x != 0`;
    /// f32 is the identity).
    Round {
        /// The dtype rounded to.
        to: DType,
        /// Operand.
        x: Reg,
    },
    /// Reduces a per-element register over the row dimensions, giving one
    /// value per row. Sums and products accumulate in f64.
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// Operand.
        x: Reg,
    },
}

impl Instr {
    /// The registers this instruction reads.
    pub fn operands(&self) -> SmallVec<[Reg; 3]> {
        match *self {
            Instr::Load { .. } | Instr::Acc | Instr::Literal { .. } => SmallVec::new(),
            Instr::Unary { x, .. } | Instr::Round { x, .. } | Instr::Reduce { x, .. } => {
                smallvec::smallvec![x]
            }
            Instr::Binary { a, b, .. } => smallvec::smallvec![a, b],
            Instr::Where { c, a, b } => smallvec::smallvec![c, a, b],
        }
    }
}

/// A matrix product `lhs @ rhs` over the last two dimensions (batch
/// dimensions broadcast), reading kernel inputs 0 and 1 through their views.
/// Without an epilogue the product is stored to `outputs[0]`; with one, the
/// epilogue ([`Instr::Acc`] reads the product) runs over the product's shape
/// and its stores write the outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatMulKernel {
    /// View of input 0.
    pub lhs: View,
    /// View of input 1.
    pub rhs: View,
    /// The product's shape at compile time.
    pub shape: Shape,
    /// Elementwise work applied to the product (row_dims is 0).
    pub epilogue: Option<LoopKernel>,
}

/// Why two neighbouring trace nodes run in different kernels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum CutReason {
    /// The producer is a runtime input.
    Parameter,
    /// The producer is a reduction whose result is used where the row kernel
    /// cannot follow (another iteration space, a non-trailing axis set).
    ReductionBoundary,
    /// The producer has consumers in several kernels and is too costly to
    /// recompute in each (or holds a reduction or a matmul).
    SecondConsumer,
    /// A reshape, permute or slice of a computed value, or a broadcast that
    /// does not line up with the kernel's iteration space.
    ShapeChange,
    /// A matrix product feeding something other than an elementwise epilogue.
    MatMulBoundary,
    /// The named op does not fuse (integer work, layout copies, ...).
    NotFusible {
        /// The op's name.
        op: String,
    },
    /// The kernel reached [`crate::planner::PlanConfig::max_kernel_ops`].
    Limit,
    /// The producer is a program output and its consumer runs in another kernel.
    Output,
}

impl std::fmt::Display for CutReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CutReason::Parameter => f.write_str("the producer is a program input"),
            CutReason::ReductionBoundary => f.write_str("reduction boundary"),
            CutReason::SecondConsumer => {
                f.write_str("second consumer: materialized rather than recomputed")
            }
            CutReason::ShapeChange => f.write_str("shape change"),
            CutReason::MatMulBoundary => f.write_str("matmul boundary"),
            CutReason::NotFusible { op } => write!(f, "{op} does not fuse"),
            CutReason::Limit => f.write_str("kernel size limit"),
            CutReason::Output => f.write_str("the producer is a program output"),
        }
    }
}

/// A trace edge `producer -> consumer` whose ends run in different kernels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cut {
    /// The node whose value crosses kernels.
    pub producer: NodeId,
    /// The node that reads it.
    pub consumer: NodeId,
    /// Why.
    pub reason: CutReason,
}

impl Program {
    /// One kernel per live op: what Strict and Debug compile, and the
    /// reference a fused plan is checked against.
    pub fn unfused(trace: &Trace) -> Program {
        let live = live_nodes(trace);
        let kernels = trace
            .nodes
            .iter()
            .enumerate()
            .filter(|(id, n)| live[*id] && !matches!(n.op, Op::Parameter { .. }))
            .map(|(id, n)| Kernel {
                kind: KernelKind::Single { op: n.op.clone() },
                inputs: n.inputs.to_vec(),
                outputs: vec![id],
                nodes: vec![id],
            })
            .collect();
        Program {
            version: PROGRAM_FORMAT_VERSION,
            params: trace.parameters(),
            values: trace.nodes.iter().map(|n| n.meta.clone()).collect(),
            kernels,
            outputs: trace.outputs.clone(),
            cuts: Vec::new(),
            budgets_exhausted: Vec::new(),
        }
    }

    /// A stable hash of the program's canonical form (its JSON bytes): the
    /// same on every machine and build, so it can key on-disk caches.
    pub fn fingerprint(&self) -> u64 {
        trace_ir::signature::stable_hash64(&self.canonical())
    }

    /// The canonical encoding the fingerprint hashes.
    pub fn canonical(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a program always serializes")
    }

    /// Pretty JSON, for dumps.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a program always serializes")
    }

    /// Parses [`Program::to_json`] output.
    pub fn from_json(text: &str) -> trace_ir::Result<Program> {
        serde_json::from_str(text)
            .map_err(|e| trace_ir::Error::InvalidTrace(format!("not a program: {e}")))
    }

    /// The same program over other sizes of the same ranks and broadcast
    /// pattern: every size `d` of a value shape or size attribute (see
    /// [`Op::size_attrs_mut`]) becomes `map(d)`; strided views are folded again from their resized steps.
    /// `None` when a size has no image or a view no longer folds (then the
    /// trace must be planned again).
    pub fn resized(&self, map: impl Fn(usize) -> Option<usize>) -> Option<Program> {
        let resize = |shape: &mut Shape| -> Option<()> {
            for d in shape.iter_mut() {
                *d = map(*d)?;
            }
            Some(())
        };
        let resize_attrs = |op: &mut Op| -> Option<()> {
            for d in op.size_attrs_mut() {
                *d = map(*d)?;
            }
            Some(())
        };
        let refold = |view: &mut View| -> Option<()> {
            if let View::Strided { shape, strides, offset, source, steps } = view {
                resize(source)?;
                for step in steps.iter_mut() {
                    resize_attrs(step)?;
                }
                (*shape, *strides, *offset) = fold_layout(source, steps).ok()?;
            }
            Some(())
        };
        let loop_ok = |l: &mut LoopKernel| -> Option<()> {
            for instr in &mut l.instrs {
                if let Instr::Load { view, .. } = instr {
                    refold(view)?;
                }
            }
            resize(&mut l.shape)
        };
        let mut p = self.clone();
        for meta in &mut p.values {
            resize(&mut meta.shape)?;
        }
        for kernel in &mut p.kernels {
            match &mut kernel.kind {
                KernelKind::Single { op } => resize_attrs(op)?,
                KernelKind::Loop(l) => loop_ok(l)?,
                KernelKind::MatMul(mm) => {
                    refold(&mut mm.lhs)?;
                    refold(&mut mm.rhs)?;
                    resize(&mut mm.shape)?;
                    if let Some(e) = &mut mm.epilogue {
                        loop_ok(e)?;
                    }
                }
            }
        }
        Some(p)
    }

    /// The metas of the parameters, in parameter order.
    pub fn param_metas(&self) -> Vec<&Meta> {
        self.params.iter().map(|&p| &self.values[p]).collect()
    }

    /// The kernel that computes `node` and whether it stores it, for explain tools.
    pub fn kernels_of(&self, node: NodeId) -> Vec<usize> {
        (0..self.kernels.len()).filter(|&k| self.kernels[k].nodes.contains(&node)).collect()
    }

    /// Every recorded reason `producer`'s value crosses into another kernel
    /// on its way to `consumer`.
    pub fn why_cut(&self, producer: NodeId, consumer: NodeId) -> Option<&CutReason> {
        self.cuts
            .iter()
            .find(|c| c.producer == producer && c.consumer == consumer)
            .map(|c| &c.reason)
    }

    /// A one-line description of a kernel, for messages: its kind and ops.
    pub fn describe_kernel(&self, k: usize) -> String {
        let kernel = &self.kernels[k];
        let kind = match &kernel.kind {
            KernelKind::Single { op } => {
                return format!("kernel {k} ({}, node {:?})", op.name(), kernel.nodes)
            }
            KernelKind::Loop(l) if l.row_dims > 0 => "row loop",
            KernelKind::Loop(_) => "elementwise loop",
            KernelKind::MatMul(_) => "matmul",
        };
        format!("kernel {k} ({kind} over nodes {:?})", kernel.nodes)
    }
}

/// Nodes the outputs need.
pub(crate) fn live_nodes(trace: &Trace) -> Vec<bool> {
    let mut live = vec![false; trace.len()];
    for &o in &trace.outputs {
        if o < live.len() {
            live[o] = true;
        }
    }
    for id in (0..trace.len()).rev() {
        if live[id] {
            for &i in &trace.nodes[id].inputs {
                live[i] = true;
            }
        }
    }
    live
}
