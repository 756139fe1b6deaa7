//! The benchmark workloads of deferfuse, shared by the criterion benches
//! (`benches/`) and the side-by-side comparison runner (`src/bin/compare.rs`).
//!
//! The op sequences themselves are [`deferfuse::workloads`] (shared with the
//! engine's tests); this crate builds their inputs at each [`Size`].

use deferfuse::workloads::{
    adam_step, gelu_tanh, layer_norm, mlp_block, softmax, transformer_block,
    transformer_weight_shapes,
};
use deferfuse::{Context, DType, Result, Tensor};

pub mod reference64;

/// How large to make each workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// The sizes the fusion issue names.
    Full,
    /// Smaller sizes, for a quick run.
    Quick,
    /// An eighth of the quick sizes (at least 1), for tests.
    Tiny,
}

/// A workload: inputs built once, and a step that records the computation
/// and returns the tensors a user would keep.
pub struct Workload {
    pub name: &'static str,
    pub inputs: Vec<Tensor>,
    pub step: Step,
    /// The step's first `carried` outputs replace its first `carried` inputs
    /// (an optimizer step's new state replaces the old, as in a training loop).
    pub carried: usize,
}

pub use deferfuse::workloads::NAMES;

/// A workload's step: the inputs in, the tensors a user keeps out.
pub type Step = fn(&[Tensor]) -> Result<Vec<Tensor>>;

/// Builds workload `name` in `ctx`.
pub fn workload(ctx: &Context, name: &str, size: Size) -> Result<Workload> {
    let pick = |full: usize, small: usize| match size {
        Size::Full => full,
        Size::Quick => small,
        Size::Tiny => (small / 8).max(1),
    };
    let randn =
        |shape: &[usize], seed: u64, scale: f64| ctx.randn(shape, DType::F32, seed)?.mul(scale);
    let (inputs, step): (Vec<Tensor>, Step) = match name {
        "gelu_tanh" => {
            (vec![randn(&[pick(4 << 20, 1 << 20)], 1, 1.0)?], |t| Ok(vec![gelu_tanh(&t[0])?]))
        }
        "layer_norm" => {
            let rows = pick(8192, 2048);
            (
                vec![
                    randn(&[rows, 1024], 2, 1.0)?,
                    randn(&[1024], 3, 1.0)?,
                    randn(&[1024], 4, 1.0)?,
                ],
                |t| Ok(vec![layer_norm(&t[0], &t[1], &t[2])?]),
            )
        }
        "softmax" => {
            (vec![randn(&[pick(8192, 2048), 1024], 5, 2.0)?], |t| Ok(vec![softmax(&t[0])?]))
        }
        "mlp_block" => {
            let (rows, width, hidden) = (256, pick(1024, 512), pick(4096, 2048));
            let inputs = vec![
                randn(&[rows, width], 6, 1.0)?,
                randn(&[hidden, width], 7, 1.0 / (width as f64).sqrt())?,
                randn(&[hidden], 8, 0.1)?,
                randn(&[width, hidden], 9, 1.0 / (hidden as f64).sqrt())?,
                randn(&[width], 10, 0.1)?,
                randn(&[width], 11, 1.0)?,
                randn(&[width], 12, 0.1)?,
            ];
            (inputs, |t| Ok(vec![mlp_block(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6])?]))
        }
        "adam_step" => {
            let n = pick(10_000_000, 2_000_000);
            // p, m, v (a second moment: non-negative), g.
            let inputs = vec![
                randn(&[n], 13, 1.0)?,
                randn(&[n], 14, 0.01)?,
                ctx.rand(&[n], DType::F32, 16)?.mul(1e-4)?,
                randn(&[n], 15, 0.01)?,
            ];
            (inputs, |t| adam_step(&t[0], &t[1], &t[2], &t[3], 3))
        }
        "transformer_block" => {
            let (batch, seq, width) = (pick(8, 2), 128, 256);
            let s = 1.0 / (width as f64).sqrt();
            let mut inputs = vec![randn(&[batch, seq, width], 20, 1.0)?];
            for (i, shape) in transformer_weight_shapes(width).iter().enumerate() {
                inputs.push(randn(shape, 21 + i as u64, s)?);
            }
            for i in 0..4 {
                inputs.push(randn(&[width], 30 + i, 0.1)?.add(if i % 2 == 0 {
                    1.0
                } else {
                    0.0
                })?);
            }
            (inputs, |t| Ok(vec![transformer_block(t)?]))
        }
        other => {
            return Err(deferfuse::Error::attr(
                "workload",
                format!("unknown workload {other:?}; known: {NAMES:?}"),
            ))
        }
    };
    ctx.sync()?;
    let carried = if name == "adam_step" { 3 } else { 0 };
    let name = NAMES.iter().find(|n| **n == name).copied().unwrap_or("unknown");
    Ok(Workload { name, inputs, step, carried })
}
