//! E-graph rewrites of deferfuse traces, and the planner that cuts the
//! rewritten trace into kernels.
//!
//! [`optimize()`] turns a [`trace_ir::Trace`] into an e-graph, runs the named
//! rule sets within the limits of a [`RewriteConfig`], extracts the cheapest
//! equivalent trace under a bytes-moved cost model, and reports what it did
//! in a [`RewriteReport`].
//!
//! ```
//! use rewrite_rules::{optimize, RewriteConfig};
//! use trace_ir::{BinaryOp, DType, Meta, Op, Trace};
//!
//! // x * 1.0, with the 1.0 a literal: `mul-one` removes the multiply.
//! let mut t = Trace::new();
//! let x = t.push_parameter(Meta::new([4].into_iter().collect(), DType::F32));
//! let one = t.push(Op::Full { value: 1.0, shape: Default::default(), dtype: DType::F32 }, &[]).unwrap();
//! let y = t.push(Op::Binary { kind: BinaryOp::Mul }, &[x, one]).unwrap();
//! t.outputs = vec![y];
//!
//! let out = optimize(&t, &RewriteConfig::default()).unwrap();
//! assert_eq!(out.trace.outputs, vec![0]); // the output is the parameter itself
//! assert!(out.report.rules_fired.contains_key("mul-one"));
//! ```
//!
//! The map of the crate:
//! - [`language`]: the e-node type [`TensorNode`] (every trace op, fused
//!   forms included) and [`attr`]: attribute leaves ([`Attr`]);
//! - [`analysis`]: each e-class's meta and constant value;
//! - [`guard`]: the meta check every rule goes through; [`conditions`]: what
//!   rules check on their matches; [`any_of`]: one rule, several spellings;
//! - the rule sets, each a module that documents its rules:
//!   [`algebraic`], [`layout`], [`fold`], [`patterns`], chosen by [`RuleSets`] ([`rule_sets`]);
//! - [`numeric`]: how folded values round, exactly as the kernels do;
//! - [`cost`]: the bytes-moved model; [`extract`]: DAG-aware extraction;
//! - [`build`] and [`rebuild`]: trace to e-graph and back;
//! - [`optimize`](mod@optimize): the driver, its limits and its report;
//! - [`planner`]: [`plan()`] groups the optimized trace into fused kernels
//!   (elementwise loops, reductions, matmuls with epilogues), the
//!   [`program::Program`] the backends compile.

#![warn(missing_docs)]

pub mod algebraic;
pub mod analysis;
pub mod any_of;
pub mod attr;
pub mod build;
pub mod conditions;
pub mod cost;
pub mod extract;
pub mod fold;
pub mod guard;
pub mod language;
pub mod layout;
pub mod literals;
pub mod numeric;
pub mod optimize;
pub mod patterns;
pub mod rebuild;
pub mod rule_sets;

pub use analysis::{Data, TensorAnalysis, TensorGraph};
pub use attr::Attr;
pub use cost::BytesMoved;
pub use extract::DagExtractor;
pub use guard::TensorRewrite;
pub use language::{NodeKind, TensorNode};
pub use optimize::{optimize, trace_cost, Optimized, RewriteConfig, RewriteReport, Stop};
pub use rule_sets::RuleSets;

// The fused program format and the kernel planner.
pub mod planner;
pub mod program;
pub use planner::{plan, PlanConfig, Rounding};
pub use program::{
    BudgetExhausted, Cut, CutReason, Frame, Instr, Kernel, KernelKind, LoopKernel, MatMulKernel,
    Program, Store, View,
};
