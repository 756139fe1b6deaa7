//! Building traces as the engine records them, and checking the contract of `optimize`.
#![allow(dead_code)]

pub mod rule_traces;

use std::time::Duration;

use rewrite_rules::{optimize, Optimized, RewriteConfig};
use trace_ir::{BinaryOp, DType, Meta, NodeId, Op, ReduceOp, Trace, UnaryOp};

/// A trace under construction; every op must be valid.
#[derive(Default)]
pub struct B {
    pub t: Trace,
}

impl B {
    pub fn param(&mut self, shape: &[usize], dtype: DType) -> NodeId {
        self.t.push_parameter(Meta::new(shape.into(), dtype))
    }
    /// A Rust scalar operand: the engine records a 0-d parameter of the op's dtype.
    pub fn scalar(&mut self, dtype: DType) -> NodeId {
        self.param(&[], dtype)
    }
    pub fn full(&mut self, value: f64, shape: &[usize], dtype: DType) -> NodeId {
        self.op(Op::Full { value, shape: shape.into(), dtype }, &[])
    }
    pub fn op(&mut self, op: Op, inputs: &[NodeId]) -> NodeId {
        let name = op.name();
        self.t.push(op, inputs).unwrap_or_else(|e| panic!("test trace: {name}: {e}"))
    }
    pub fn un(&mut self, kind: UnaryOp, x: NodeId) -> NodeId {
        self.op(Op::Unary { kind }, &[x])
    }
    pub fn bin(&mut self, kind: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        self.op(Op::Binary { kind }, &[a, b])
    }
    pub fn reduce(&mut self, kind: ReduceOp, x: NodeId, axes: &[usize], keepdim: bool) -> NodeId {
        self.op(Op::Reduce { kind, axes: axes.into(), keepdim }, &[x])
    }
    pub fn done(mut self, outputs: &[NodeId]) -> Trace {
        self.t.outputs = outputs.to_vec();
        self.t
    }

    // The engine's composites (engine/src/ops.rs), op for op.

    pub fn softmax(&mut self, x: NodeId, axis: usize) -> NodeId {
        let m = self.reduce(ReduceOp::Max, x, &[axis], true);
        let shifted = self.bin(BinaryOp::Sub, x, m);
        let e = self.un(UnaryOp::Exp, shifted);
        let s = self.reduce(ReduceOp::Sum, e, &[axis], true);
        self.bin(BinaryOp::Div, e, s)
    }
    pub fn log_softmax(&mut self, x: NodeId, axis: usize) -> NodeId {
        let m = self.reduce(ReduceOp::Max, x, &[axis], true);
        let shifted = self.bin(BinaryOp::Sub, x, m);
        let e = self.un(UnaryOp::Exp, shifted);
        let s = self.reduce(ReduceOp::Sum, e, &[axis], true);
        let l = self.un(UnaryOp::Log, s);
        self.bin(BinaryOp::Sub, shifted, l)
    }
    pub fn layer_norm(&mut self, x: NodeId, axes: &[usize]) -> NodeId {
        let dtype = self.t.meta(x).dtype;
        let mean = self.reduce(ReduceOp::Mean, x, axes, true);
        let centered = self.bin(BinaryOp::Sub, x, mean);
        let sq = self.bin(BinaryOp::Mul, centered, centered);
        let var = self.reduce(ReduceOp::Mean, sq, axes, true);
        let eps = self.scalar(dtype);
        let v = self.bin(BinaryOp::Add, var, eps);
        let r = self.un(UnaryOp::Rsqrt, v);
        self.bin(BinaryOp::Mul, centered, r)
    }
    pub fn rms_norm(&mut self, x: NodeId, axes: &[usize]) -> NodeId {
        let dtype = self.t.meta(x).dtype;
        let sq = self.bin(BinaryOp::Mul, x, x);
        let ms = self.reduce(ReduceOp::Mean, sq, axes, true);
        let eps = self.scalar(dtype);
        let v = self.bin(BinaryOp::Add, ms, eps);
        let r = self.un(UnaryOp::Rsqrt, v);
        self.bin(BinaryOp::Mul, x, r)
    }
    /// `0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)))`, as
    /// a user writes it with literal constants.
    pub fn gelu_tanh_by_hand(&mut self, x: NodeId) -> NodeId {
        let d = self.t.meta(x).dtype;
        let (half, one) = (self.full(0.5, &[], d), self.full(1.0, &[], d));
        let (c, k) = (self.full(0.7978845608, &[], d), self.full(0.044715, &[], d));
        let xx = self.bin(BinaryOp::Mul, x, x);
        let cube = self.bin(BinaryOp::Mul, xx, x);
        let kc = self.bin(BinaryOp::Mul, k, cube);
        let inner = self.bin(BinaryOp::Add, x, kc);
        let scaled = self.bin(BinaryOp::Mul, c, inner);
        let t = self.un(UnaryOp::Tanh, scaled);
        let s = self.bin(BinaryOp::Add, one, t);
        let hx = self.bin(BinaryOp::Mul, half, x);
        self.bin(BinaryOp::Mul, hx, s)
    }
}

/// Room for every rule to fire, even on a busy machine.
pub fn roomy() -> RewriteConfig {
    RewriteConfig { time_limit: Duration::from_secs(5), ..RewriteConfig::default() }
}

/// Runs `optimize` and checks its contract: a valid trace, the same output
/// metas in order, the same parameters.
pub fn optimize_checked(t: &Trace, config: &RewriteConfig) -> Optimized {
    let out = optimize(t, config).unwrap_or_else(|e| panic!("optimize failed: {e}\n{t:#?}"));
    assert_contract(t, &out.trace);
    out
}

pub fn assert_contract(before: &Trace, after: &Trace) {
    after.validate().unwrap();
    let metas = |t: &Trace| t.outputs.iter().map(|&o| t.meta(o).clone()).collect::<Vec<_>>();
    assert_eq!(metas(before), metas(after));
    let params =
        |t: &Trace| t.parameters().into_iter().map(|p| t.nodes[p].op.clone()).collect::<Vec<_>>();
    assert_eq!(params(before), params(after));
    for (i, n) in after.nodes.iter().enumerate() {
        assert!(n.inputs.iter().all(|&j| j < i), "not topological");
    }
}

/// How many nodes of `t` satisfy `pred`.
pub fn count(t: &Trace, pred: impl Fn(&Op) -> bool) -> usize {
    t.nodes.iter().filter(|n| pred(&n.op)).count()
}

pub fn is_unary(op: &Op, k: UnaryOp) -> bool {
    matches!(op, Op::Unary { kind } if *kind == k)
}
