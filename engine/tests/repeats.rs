//! DeferAndFuse cuts a loop that never reads where its op stream repeats,
//! so its iterations become identical traces that hit the cache: loops of
//! several shapes stop missing tier 1 after a few steps, and compute what
//! Strict computes. A loop that reads a value every step is cut where the
//! value was recorded, ahead of its read (`read_ahead.rs`), and settles too.

use deferfuse::{Config, Context, DType, Mode, Result, Tensor};

/// A two-layer MLP trained by hand-written SGD: the weights after `steps`.
struct Mlp {
    w1: Tensor,
    w2: Tensor,
}

impl Mlp {
    fn new(ctx: &Context, width: usize, seed: u64) -> Mlp {
        let w1 = ctx.randn(&[16, width], DType::F32, seed).unwrap().mul(0.1).unwrap();
        let w2 = ctx.randn(&[width, 4], DType::F32, seed + 1).unwrap().mul(0.1).unwrap();
        Mlp { w1, w2 }
    }

    /// One step on `x`: forward, the gradient of `sum(y^2)`, and the update.
    fn step(&mut self, x: &Tensor, lr: f64) -> Result<()> {
        self.step_with_loss(x, lr, false).map(drop)
    }

    /// [`Mlp::step`], recording the loss `sum(y^2)` after the forward when
    /// `loss` (for a loop that reads it after the update).
    fn step_with_loss(&mut self, x: &Tensor, lr: f64, loss: bool) -> Result<Option<Tensor>> {
        let h = x.matmul(&self.w1)?.relu()?;
        let y = h.matmul(&self.w2)?;
        let loss = loss.then(|| y.mul(&y)?.sum_all()).transpose()?;
        let dy = y.mul(2.0)?;
        let dw2 = h.t()?.matmul(&dy)?;
        let dh = dy.matmul(&self.w2.t()?)?.mul(&h.gt(0.0)?.to_dtype(DType::F32)?)?;
        let dw1 = x.t()?.matmul(&dh)?;
        self.w1 = self.w1.sub(&dw1.mul(lr)?)?;
        self.w2 = self.w2.sub(&dw2.mul(lr)?)?;
        Ok(loss)
    }
}

fn context(mode: Mode, cut_repeats: bool) -> Context {
    Context::new(Config { mode, cut_repeats, cache_dir: None, ..Config::default() }).unwrap()
}

/// Runs `body(step)` for `steps` steps without reading anything and
/// returns the tier-1 misses of `ctx` after each step.
fn misses_per_step(
    ctx: &Context,
    steps: usize,
    mut body: impl FnMut(usize) -> Result<()>,
) -> Vec<u64> {
    (0..steps)
        .map(|i| {
            body(i).unwrap();
            ctx.stats().cache.tier1.misses
        })
        .collect()
}

/// Misses stop growing after `warm` steps.
fn settles(misses: &[u64], warm: usize) -> bool {
    misses[warm..].iter().all(|&m| m == misses[warm])
}

/// The loop was cut by the detector, not run whole at the end: nothing was
/// read, and the cap is far away, so every flush so far was a repeat.
fn was_cut(ctx: &Context, steps: usize) {
    let flushes = ctx.stats().flushes;
    assert!(flushes as usize >= steps / 4, "{flushes} flushes in {steps} steps");
    assert_eq!(ctx.last_flush().unwrap().reason, deferfuse::FlushReason::Repeat);
}

fn close(a: &[f32], b: &[f32]) -> bool {
    // f32, fused against op by op (docs/numerics.md): a few ulps of the
    // largest value.
    let scale = b.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 * scale)
}

#[test]
fn a_training_loop_that_never_reads_settles_on_cached_traces_and_matches_strict() {
    let run = |mode: Mode, cut: bool, cap: usize| {
        let ctx = Context::new(Config {
            mode,
            cut_repeats: cut,
            max_pending_ops: cap,
            cache_dir: None,
            ..Config::default()
        })
        .unwrap();
        let x = ctx.randn(&[8, 16], DType::F32, 7).unwrap();
        let mut mlp = Mlp::new(&ctx, 32, 1);
        let misses = misses_per_step(&ctx, 40, |i| mlp.step(&x, 0.01 / (1.0 + i as f64)));
        (misses, mlp.w1.to_vec::<f32>().unwrap(), mlp.w2.to_vec::<f32>().unwrap())
    };
    // A step is 19 ops. The cap (50 nodes, parameters included) is no
    // multiple of it, so without the detector its cuts drift and keep
    // missing; with it, every chunk is two whole steps.
    let (cut, w1, w2) = run(Mode::DeferAndFuse, true, 50);
    let (drift, ..) = run(Mode::DeferAndFuse, false, 50);
    let (_, s1, s2) = run(Mode::Strict, true, 50);
    assert!(settles(&cut, 3), "misses per step with the detector: {cut:?}");
    assert!(!settles(&drift, 3), "the cap alone settled too: {drift:?}");
    assert!(close(&w1, &s1) && close(&w2, &s2));
}

#[test]
fn a_step_with_an_inner_loop_settles() {
    let ctx = context(Mode::DeferAndFuse, true);
    let x = ctx.randn(&[8, 16], DType::F32, 3).unwrap();
    let mut mlp = Mlp::new(&ctx, 24, 5);
    let mut acc = ctx.zeros(&[8, 16], DType::F32).unwrap();
    let misses = misses_per_step(&ctx, 30, |_| {
        // Three rounds of a smoothing update inside each step.
        for _ in 0..3 {
            acc = acc.mul(0.9)?.add(&x.tanh()?.mul(0.1)?)?;
        }
        mlp.step(&acc, 0.01)
    });
    was_cut(&ctx, 30);
    assert!(settles(&misses, 4), "{misses:?}");
    assert!(acc.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
}

#[test]
fn two_models_trained_in_turn_settle() {
    let ctx = context(Mode::DeferAndFuse, true);
    let x = ctx.randn(&[8, 16], DType::F32, 11).unwrap();
    let (mut a, mut b) = (Mlp::new(&ctx, 32, 1), Mlp::new(&ctx, 48, 2));
    let misses = misses_per_step(&ctx, 30, |_| {
        a.step(&x, 0.01)?;
        b.step(&x, 0.01)
    });
    was_cut(&ctx, 30);
    assert!(settles(&misses, 4), "{misses:?}");
}

#[test]
fn a_loop_whose_body_changes_every_five_steps_settles_once_each_phase_was_seen() {
    let ctx = context(Mode::DeferAndFuse, true);
    let x = ctx.randn(&[8, 16], DType::F32, 13).unwrap();
    let (mut a, mut b) = (Mlp::new(&ctx, 32, 1), Mlp::new(&ctx, 40, 2));
    let misses = misses_per_step(&ctx, 60, |i| match (i / 5) % 2 {
        0 => a.step(&x, 0.01),
        _ => b.step(&x, 0.01),
    });
    // Two phases of five steps: from the third period on nothing is new.
    was_cut(&ctx, 60);
    assert!(settles(&misses, 30), "{misses:?}");
}

#[test]
fn the_detector_is_off_in_the_other_modes_and_with_its_switch() {
    for mode in [Mode::Strict, Mode::Debug] {
        let ctx = context(mode, true);
        let x = ctx.randn(&[8, 16], DType::F32, 7).unwrap();
        let mut mlp = Mlp::new(&ctx, 32, 1);
        (0..5).for_each(|_| mlp.step(&x, 0.01).unwrap());
        assert_eq!(ctx.stats().flushes, 0, "{mode}");
    }
    let ctx = context(Mode::DeferAndFuse, false);
    let x = ctx.randn(&[8, 16], DType::F32, 7).unwrap();
    let mut mlp = Mlp::new(&ctx, 32, 1);
    (0..20).for_each(|_| mlp.step(&x, 0.01).unwrap());
    assert_eq!(ctx.stats().flushes, 0, "no cut without the detector under the cap");
}

#[test]
fn a_loop_that_never_reads_keeps_a_constant_peak_memory() {
    // Without the detector only the cap (4096 nodes) bounds the pending
    // trace, and the peak grows until then (173 KiB after 20 steps, 182
    // KiB after 200, measured with the detector off).
    // The detector's flushes normally run on the stream while the next step
    // records, so which buffers are live together depends on timing (a CI
    // run saw 2% more after 200 steps than after 20). A fusion dump runs
    // every flush in place, which makes the peak a function of the program.
    let peak_after = |steps: usize| {
        let dumps =
            std::env::temp_dir().join(format!("repeats-peak-{}-{steps}", std::process::id()));
        let ctx = Context::new(Config {
            mode: Mode::DeferAndFuse,
            cache_dir: None,
            fusion_dump: Some(dumps.clone()),
            ..Config::default()
        })
        .unwrap();
        let x = ctx.randn(&[64, 16], DType::F32, 7).unwrap();
        let mut mlp = Mlp::new(&ctx, 256, 1);
        for _ in 0..steps {
            mlp.step(&x, 0.001).unwrap();
        }
        ctx.sync().unwrap();
        let _ = std::fs::remove_dir_all(&dumps);
        ctx.memory().peak_bytes
    };
    let (short, long) = (peak_after(20), peak_after(200));
    assert_eq!(long, short, "peak bytes after 20 steps and after 200");
}

#[test]
fn an_op_group_is_one_unit_for_the_detector() {
    // Adds on twelve shapes, twice over: a period of twelve primitives, which
    // the detector cuts after when they are recorded one by one. Recorded in
    // one op group (an optimizer's `_foreach_add` over two layers of the same
    // shapes, say), they are one unit, and the stream is not cut inside it.
    let flushes = |grouped: bool| {
        let ctx = context(Mode::DeferAndFuse, true);
        let xs: Vec<Tensor> =
            (1..=12).map(|n| ctx.ones(&[n], DType::F32).unwrap()).collect::<Vec<_>>();
        let group = grouped.then(|| ctx.op_group("_foreach_add"));
        let sums: Vec<Tensor> = xs.iter().chain(&xs).map(|x| x.add(1.0).unwrap()).collect();
        if let Some(group) = group {
            group.end(Ok(())).unwrap();
        }
        let flushes = ctx.stats().flushes;
        drop(sums);
        flushes
    };
    assert_eq!(flushes(false), 1, "recorded one by one");
    assert_eq!(flushes(true), 0, "recorded as one op group");
}

/// Trains with a read of the loss after every update: the losses read and
/// the context's flushes.
fn train_reading_loss(read_ahead: bool, steps: usize) -> (Vec<f32>, Context) {
    let ctx = Context::new(Config {
        mode: Mode::DeferAndFuse,
        read_ahead,
        cache_dir: None,
        ..Config::default()
    })
    .unwrap();
    let x = ctx.randn(&[8, 16], DType::F32, 7).unwrap();
    let mut mlp = Mlp::new(&ctx, 32, 1);
    let losses = (0..steps)
        .map(|i| {
            let loss = mlp.step_with_loss(&x, 0.01 / (1.0 + i as f64), true).unwrap().unwrap();
            loss.item::<f32>().unwrap()
        })
        .collect();
    (losses, ctx)
}

#[test]
fn a_loop_that_reads_its_loss_runs_the_forward_ahead_of_the_read() {
    let (ahead, ctx) = train_reading_loss(true, 12);
    let (at_read, plain) = train_reading_loss(false, 12);
    assert!(close(&ahead, &at_read), "{ahead:?} vs {at_read:?}");
    // From the second step on, the trace is flushed where the loss was
    // recorded (then at the read, the rest): two flushes a step, one of
    // them ahead; without read-ahead, one flush at each read.
    let flushes = ctx.stats().flushes;
    assert!(flushes >= 2 * 12 - 2, "{flushes} flushes in 12 steps");
    assert_eq!(plain.stats().flushes, 12);
    // A step's two traces are the same every step: nothing new after the third.
    let misses = ctx.stats().cache.tier1.misses;
    let (_, longer) = train_reading_loss(true, 30);
    assert_eq!(longer.stats().cache.tier1.misses, misses);
}

#[test]
fn the_forward_is_flushed_ahead_once_the_loss_was_read_before() {
    let ctx = context(Mode::DeferAndFuse, true);
    let x = ctx.randn(&[8, 16], DType::F32, 7).unwrap();
    let mut mlp = Mlp::new(&ctx, 32, 1);
    let mut reasons = Vec::new();
    for _ in 0..3 {
        // The forward and the loss alone, then the backward and the update.
        let h = x.matmul(&mlp.w1).unwrap().relu().unwrap();
        let y = h.matmul(&mlp.w2).unwrap();
        let loss = y.mul(&y).unwrap().sum_all().unwrap();
        reasons.push(ctx.last_flush().map(|f| f.reason));
        mlp.step(&x, 0.01).unwrap();
        loss.item::<f32>().unwrap();
    }
    use deferfuse::FlushReason::{Read, ReadAhead};
    assert_eq!(reasons, vec![None, Some(Read), Some(ReadAhead)]);
}

#[test]
fn a_step_longer_than_the_cap_that_reads_its_loss_settles() {
    // The cap (19 nodes, parameters included) cuts off the loss before its
    // read, which then computes nothing; it still ends the trace, so every
    // step's chunks start at the same op. (Without that, the chunks drift
    // through nine steps of misses here.)
    let ctx = Context::new(Config {
        mode: Mode::DeferAndFuse,
        max_pending_ops: 19,
        cut_repeats: false,
        read_ahead: false,
        cache_dir: None,
        ..Config::default()
    })
    .unwrap();
    let x = ctx.randn(&[8, 16], DType::F32, 7).unwrap();
    let mut mlp = Mlp::new(&ctx, 32, 1);
    let misses: Vec<u64> = (0..20)
        .map(|i| {
            let loss = mlp.step_with_loss(&x, 0.01 / (1.0 + i as f64), true).unwrap().unwrap();
            loss.item::<f32>().unwrap();
            ctx.stats().cache.tier1.misses
        })
        .collect();
    assert!(settles(&misses, 3), "misses per step: {misses:?}");
}
