//! One small trace per rule, on which that rule must fire. Shared by this
//! crate's tests and by the engine's numerical checks of every rule
//! (engine/tests/rule_numerics.rs includes this file).

use super::B;
use trace_ir::{BinaryOp, DType, Op, ReduceOp, Trace, UnaryOp};

use BinaryOp::*;
use DType::*;
use UnaryOp::*;

/// A trace on which rule `name` must fire.
pub fn trace_for(name: &str) -> Option<Trace> {
    let mut b = B::default();
    let x = b.param(&[2, 3], F32);
    let out = match name {
        "mul-commute" | "add-commute" => {
            let y = b.param(&[2, 3], F32);
            b.bin(if name == "mul-commute" { Mul } else { Add }, x, y)
        }
        "mul-one" | "div-one" => {
            let one = b.full(1.0, &[], F32);
            b.bin(if name == "mul-one" { Mul } else { Div }, x, one)
        }
        "sub-zero" => {
            let zero = b.full(0.0, &[3], F32);
            b.bin(Sub, x, zero)
        }
        "add-zero" => {
            let zero = b.full(-0.0, &[], F32);
            b.bin(Add, x, zero)
        }
        "neg-neg" => {
            let n = b.un(Neg, x);
            b.un(Neg, n)
        }
        "cast-same" => b.op(Op::Cast { to: F32 }, &[x]),
        "cast-widen-cast" => {
            let h = b.param(&[4], BF16);
            let w = b.op(Op::Cast { to: F32 }, &[h]);
            b.op(Op::Cast { to: F16 }, &[w])
        }
        "where-same" => {
            let c = b.param(&[2, 3], Bool);
            b.op(Op::Where, &[c, x, x])
        }
        "permute-identity" => b.op(Op::Permute { perm: [0, 1].into_iter().collect() }, &[x]),
        "permute-permute" => {
            let y = b.param(&[2, 3, 4], F32);
            let p = b.op(Op::Permute { perm: [1, 2, 0].into_iter().collect() }, &[y]);
            b.op(Op::Permute { perm: [2, 0, 1].into_iter().collect() }, &[p])
        }
        "reshape-reshape" => {
            let r = b.op(Op::Reshape { shape: [6].into_iter().collect() }, &[x]);
            b.op(Op::Reshape { shape: [3, 2].into_iter().collect() }, &[r])
        }
        "reshape-same" => b.op(Op::Reshape { shape: [2, 3].into_iter().collect() }, &[x]),
        "expand-expand" => {
            let e = b.op(Op::Expand { shape: [4, 2, 3].into_iter().collect() }, &[x]);
            b.op(Op::Expand { shape: [5, 4, 2, 3].into_iter().collect() }, &[e])
        }
        "expand-same" => b.op(Op::Expand { shape: [2, 3].into_iter().collect() }, &[x]),
        "fold-cast" => {
            let c = b.full(2.5, &[3], F32);
            b.op(Op::Cast { to: I32 }, &[c])
        }
        _ if name.starts_with("fold-") => {
            let kind = &name["fold-".len()..];
            let (a, c) = (b.full(2.25, &[3], F32), b.full(-4.0, &[2, 1], F32));
            if let Some(k) = UnaryOp::ALL.into_iter().find(|k| k.name() == kind) {
                b.un(k, a)
            } else {
                let k = BinaryOp::ALL.into_iter().find(|k| k.name() == kind)?;
                b.bin(k, a, c)
            }
        }
        "softmax" => b.softmax(x, 1),
        "log-softmax" => b.log_softmax(x, 0),
        "layer-norm" => b.layer_norm(x, &[1]),
        "layer-norm-div" => {
            let mean = b.reduce(ReduceOp::Mean, x, &[0, 1], true);
            let c = b.bin(Sub, x, mean);
            let sq = b.bin(Mul, c, c);
            let var = b.reduce(ReduceOp::Mean, sq, &[0, 1], true);
            let eps = b.full(1e-5, &[], F32);
            let v = b.bin(Add, var, eps);
            let s = b.un(Sqrt, v);
            b.bin(Div, c, s)
        }
        "rms-norm" => b.rms_norm(x, &[1]),
        "rms-norm-pow" => {
            let two = b.full(2.0, &[], F32);
            let sq = b.bin(Pow, x, two);
            let ms = b.reduce(ReduceOp::Mean, sq, &[1], true);
            let eps = b.scalar(F32);
            let v = b.bin(Add, eps, ms);
            let r = b.un(Rsqrt, v);
            b.bin(Mul, r, x)
        }
        "gelu-tanh" => b.gelu_tanh_by_hand(x),
        "gelu-tanh-pow" => {
            // HF's NewGELU: 0.5 * x * (1.0 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3.0))))
            let (half, one) = (b.full(0.5, &[], F32), b.full(1.0, &[], F32));
            let (c, k) = (b.full(0.7978845608028654, &[], F32), b.full(0.044715, &[], F32));
            let three = b.full(3.0, &[], F32);
            let cube = b.bin(Pow, x, three);
            let kc = b.bin(Mul, cube, k);
            let inner = b.bin(Add, x, kc);
            let scaled = b.bin(Mul, c, inner);
            let t = b.un(Tanh, scaled);
            let s = b.bin(Add, t, one);
            let xs = b.bin(Mul, x, s);
            b.bin(Mul, half, xs)
        }
        "silu" => {
            let s = b.un(Sigmoid, x);
            b.bin(Mul, s, x)
        }
        "silu-div" => {
            let one = b.full(1.0, &[], F32);
            let n = b.un(Neg, x);
            let e = b.un(Exp, n);
            let d = b.bin(Add, one, e);
            b.bin(Div, x, d)
        }
        _ => return None,
    };
    Some(b.done(&[out]))
}
