//! Differential test of the three modes: random op sequences give bitwise
//! equal results in Strict, Debug and DeferAndFuse with fusion off
//! (`TORCH_TPU_FUSION=off`: the pending trace runs op by op), and the same
//! errors at the same calls. Fused results are compared with a tolerance in
//! `fused_vs_unfused.rs`.

use deferfuse::{Config, Context, DType, DebugChecks, GeluApproximation, Mode, Result, Tensor};
use proptest::prelude::*;

/// One step of a random program: an op kind and the pool slots it reads.
#[derive(Debug, Clone)]
struct Step {
    kind: u8,
    a: usize,
    b: usize,
    c: usize,
    arg: i64,
}

fn step() -> impl Strategy<Value = Step> {
    (0u8..40, 0usize..64, 0usize..64, 0usize..64, -3i64..4).prop_map(|(kind, a, b, c, arg)| Step {
        kind,
        a,
        b,
        c,
        arg,
    })
}

fn context(mode: Mode, max_pending_ops: usize) -> Context {
    let config = Config {
        mode,
        max_pending_ops,
        debug_checks: DebugChecks { nan: false, inf: false },
        fusion: false,
        ..Config::default()
    };
    Context::new(config).unwrap()
}

fn apply(ctx: &Context, pool: &[Tensor], s: &Step) -> Result<Tensor> {
    let a = &pool[s.a % pool.len()];
    let b = &pool[s.b % pool.len()];
    let c = &pool[s.c % pool.len()];
    let scalar = s.arg as f64 * 0.75;
    match s.kind {
        0 => a.add(b),
        1 => a.sub(b),
        2 => a.mul(b),
        3 => a.div(b),
        4 => a.maximum(b),
        5 => a.minimum(b),
        6 => a.pow(b),
        7 => a.add(scalar),
        8 => a.mul(scalar),
        9 => a.lt(b),
        10 => a.ge(scalar),
        11 => a.eq(b),
        12 => a.gt(b)?.where_cond(b, c),
        13 => a.exp(),
        14 => a.log(),
        15 => a.tanh(),
        16 => a.sigmoid(),
        17 => a.gelu(GeluApproximation::None),
        18 => a.gelu(GeluApproximation::Tanh),
        19 => a.silu(),
        20 => a.sqrt()?.neg(),
        21 => a.abs()?.rsqrt(),
        22 => a.sin()?.add(&a.cos()?),
        23 => a.floor()?.sign(),
        24 => a.sum(&[s.arg], s.b.is_multiple_of(2)),
        25 => a.mean(&[s.arg], s.b.is_multiple_of(2)),
        26 => a.max(&[s.arg], false),
        27 => a.prod(&[], false),
        28 => a.argmax(Some(s.arg), s.b.is_multiple_of(2)),
        29 => a.to_dtype(DType::BF16)?.to_dtype(DType::F32),
        30 => a.to_dtype(DType::I32),
        31 => a.t(),
        32 => a.reshape(&[a.numel()]),
        33 => a.slice(s.arg, 1, 4, (s.b % 3) + 1),
        34 => Tensor::cat(&[a, b], s.arg),
        35 => a.matmul(b),
        36 => a.softmax(s.arg),
        37 => a.layer_norm(&a.shape()[a.rank().saturating_sub(1)..], None, None, 1e-5),
        38 => a.expand(&[2, 4, 3]),
        _ => ctx.randn(&[4, 3], DType::F32, s.a as u64),
    }
}

/// Runs a program and returns, per step, either the error text or the value
/// of every pool tensor read at the end, as exact bits.
/// What one step left: the shape, dtype and bits of its result, or its error.
type Outcome = std::result::Result<(Vec<usize>, DType, Vec<u32>), String>;

fn run(mode: Mode, max_pending_ops: usize, steps: &[Step], drop_every: usize) -> Vec<Outcome> {
    let ctx = context(mode, max_pending_ops);
    let mut pool = vec![
        ctx.randn(&[4, 3], DType::F32, 1).unwrap(),
        ctx.rand(&[3], DType::F32, 2).unwrap(),
        ctx.randn(&[4, 1], DType::F32, 3).unwrap(),
        ctx.from_vec(vec![1i32, -2, 3], &[3]).unwrap(),
        ctx.arange(0.0, 12.0, 1.0, DType::F32).unwrap().reshape(&[3, 4]).unwrap(),
    ];
    let mut errors = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        match apply(&ctx, &pool, s) {
            Ok(t) => pool.push(t),
            Err(e) => errors.push(Err(format!("step {i}: {e}"))),
        }
        // Drop some values before anything is read, so DeferAndFuse prunes
        // and frees intermediates.
        if drop_every > 0 && i % drop_every == 0 && pool.len() > 6 {
            pool.remove(5);
        }
    }
    let mut out = errors;
    for t in &pool {
        let bits = t.to_vec::<f32>().unwrap().into_iter().map(f32::to_bits).collect();
        out.push(Ok((t.shape().to_vec(), t.dtype(), bits)));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x0de5),
        ..ProptestConfig::default()
    })]

    #[test]
    fn modes_agree_bitwise(steps in prop::collection::vec(step(), 1..40), drop_every in 0usize..4, limit in 1usize..50) {
        let strict = run(Mode::Strict, 4096, &steps, drop_every);
        let debug = run(Mode::Debug, 4096, &steps, drop_every);
        let deferred = run(Mode::DeferAndFuse, limit, &steps, drop_every);
        prop_assert_eq!(&strict, &debug);
        prop_assert_eq!(&strict, &deferred);
    }
}

#[test]
fn many_contexts_on_many_threads() {
    let handles: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let mode = Mode::ALL[i % 3];
                let ctx = context(mode, 7);
                let x = ctx.arange(0.0, 100.0, 1.0, DType::F32).unwrap();
                let mut y = x.clone();
                for _ in 0..20 {
                    y = y.mul(0.5).unwrap().add(&x).unwrap();
                }
                y.sum_all().unwrap().item::<f32>().unwrap()
            })
        })
        .collect();
    let results: Vec<f32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
}

#[test]
fn tensors_are_shared_across_threads() {
    let ctx = context(Mode::DeferAndFuse, 4096);
    let x = ctx.randn(&[64], DType::F32, 9).unwrap().exp().unwrap();
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let x = x.clone();
            std::thread::spawn(move || x.to_vec::<f32>().unwrap())
        })
        .collect();
    let values: Vec<Vec<f32>> = readers.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(values.windows(2).all(|w| w[0] == w[1]));
    assert!(values[0].iter().all(|v| *v > 0.0));
}
