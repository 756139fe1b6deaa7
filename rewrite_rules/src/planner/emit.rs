//! Pass 6, emit: valid drafts become the [`Program`]'s kernels.
//!
//! Kernels are ordered by a topological sort of their data dependencies
//! (earliest roots first, so the order is stable), each loop draft is
//! lowered to its SSA instruction list (row forms expand to their
//! reductions; rounding follows [`Rounding`]), and every trace edge between
//! two kernels gets the reason its producer was realized. This pass decides
//! nothing about fusion: given the same drafts it always writes the same
//! program, which is what makes program fingerprints stable cache keys.

use std::collections::{BTreeMap, BTreeSet};

use trace_ir::{BinaryOp, DType, Error, NodeId, Op, ReduceOp, Result, UnaryOp};

use super::draft::{Draft, LoopDraft};
use super::{Planner, Rounding};
use crate::program::{
    Cut, CutReason, Frame, Instr, Kernel, KernelKind, LoopKernel, MatMulKernel, Program, Reg,
    Store, View, PROGRAM_FORMAT_VERSION,
};

/// The value of a literal as it is stored in its dtype, read back as f32.
fn literal_value(value: f64, dtype: DType) -> f32 {
    match dtype {
        DType::Bool => (value != 0.0) as u8 as f32,
        DType::BF16 => half::bf16::from_f64(value).to_f32(),
        DType::F16 => half::f16::from_f64(value).to_f32(),
        _ => value as f32,
    }
}

impl Planner<'_> {
    pub(super) fn emit(&self, drafts: Vec<Draft>) -> Result<Program> {
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
            budgets_exhausted: self.budgets.clone(),
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
