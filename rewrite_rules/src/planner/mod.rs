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
//!
//! # Passes
//!
//! [`plan`] runs these in order, each in its own module:
//!
//! 1. `classify`: the class of every node, and the seed realizations
//!    (parameters, outputs, nodes that do not fuse and their inputs);
//! 2. `draft`: a kernel per realized node, with `frames` (index spaces)
//!    and `views` (loads through strided views) deciding what fits in one
//!    loop; the cuts found are realized and the drafts redone, to a fixpoint
//!    in which `recompute` (shared nodes) and `split` (the size limit) take
//!    part;
//! 3. `merge`: loops over one iteration space become multi-output loops;
//! 4. `emit`: the drafts become ordered kernels and instruction lists.
//!
//! The optional decisions each have a switch in [`PlanConfig`], all on by
//! default: `recompute`, `split`, `merge` and `epilogues`. Turning one off
//! still gives a correct program (every switch only adds cuts or removes
//! merges), so a numerical difference between fused and eager results can be
//! bisected to one kind of fusion decision.

mod classify;
mod draft;
mod emit;
mod frames;
mod merge;
mod recompute;
mod split;
mod views;

use trace_ir::{NodeId, Result, Shape, Trace};

use crate::program::{BudgetExhausted, CutReason, Program};
use classify::Class;

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
///
/// The switches turn single fusion decisions off, to bisect a numerical
/// difference; each one off still plans a correct, if slower, program. The
/// default (everything on) is what the engine runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanConfig {
    /// Where fused kernels round.
    pub rounding: Rounding,
    /// The most ops one loop kernel may hold (see `split`).
    pub max_kernel_ops: usize,
    /// Recompute cheap shared nodes in each kernel that needs them (at most
    /// [`RECOMPUTE_MAX_OPS`] elementwise ops, no reduction or product). Off:
    /// a node computed by two kernels is always realized (`SecondConsumer`).
    pub recompute: bool,
    /// Split loops over `max_kernel_ops` (`Limit`). Off: loops of any size.
    pub split: bool,
    /// Merge loops over one iteration space into multi-output loops
    /// (vertical and horizontal). Off: one kernel per realized node.
    pub merge: bool,
    /// Fuse elementwise consumers into a matrix product as its epilogue.
    /// Off: every product is stored by its own kernel (`MatMulBoundary`).
    pub epilogues: bool,
    /// The merge pass's step budget; `None` is `4 × drafts + 16`. A plan
    /// that ran out records it in [`Program::budgets_exhausted`].
    pub merge_budget: Option<usize>,
}

impl Default for PlanConfig {
    /// Round once, at most 256 ops per kernel, every pass on, the default budget.
    fn default() -> Self {
        PlanConfig {
            rounding: Rounding::Once,
            max_kernel_ops: 256,
            recompute: true,
            split: true,
            merge: true,
            epilogues: true,
            merge_budget: None,
        }
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

/// Why a tentative plan is not valid yet: realize these nodes and retry.
type Violations = Vec<(NodeId, CutReason)>;

/// The state the passes share: the trace, its classes, what is realized.
struct Planner<'a> {
    t: &'a Trace,
    cfg: &'a PlanConfig,
    live: Vec<bool>,
    users: Vec<Vec<NodeId>>,
    class: Vec<Class>,
    /// Why each realized node is (the first reason found is kept).
    realized: Vec<Option<CutReason>>,
    /// Passes a budget stopped, for [`Program::budgets_exhausted`].
    budgets: Vec<BudgetExhausted>,
}

impl Planner<'_> {
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

    /// The passes, in order (see the module docs).
    fn run(mut self) -> Result<Program> {
        self.seed();
        let mut drafts = self.draft_all()?;
        if self.cfg.merge {
            if let Some(stop) = self.merge(&mut drafts) {
                self.budgets.push(stop);
            }
        }
        self.emit(drafts)
    }
}
