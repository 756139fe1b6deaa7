//! DeferAndFuse flushes that nobody waits for run on the context's stream,
//! and a read runs only what it needs before the rest goes there too: the
//! values are Strict's, and nothing runs twice.

use deferfuse::{Config, Context, DType, Mode, Result, Tensor};

fn context(mode: Mode, max_pending_ops: usize) -> Context {
    let config = Config { mode, max_pending_ops, cache_dir: None, ..Config::default() };
    Context::new(config).unwrap()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
    }
}

/// A loss that needs a little of the trace and an update that needs the
/// rest, sharing `h`, which nobody holds once both are recorded.
fn step(ctx: &Context) -> Result<(Tensor, Tensor)> {
    let x = ctx.randn(&[32, 32], DType::F32, 3)?;
    let h = x.mul(0.5)?.add(1.0)?;
    let loss = h.sum_all()?;
    let update = h.matmul(&x)?.tanh()?.sub(&x)?;
    Ok((loss, update))
}

#[test]
fn a_read_runs_what_it_needs_and_sends_the_rest_to_the_stream() {
    let ctx = context(Mode::DeferAndFuse, 4096);
    let (loss, update) = step(&ctx).unwrap();
    let loss = loss.to_vec::<f32>().unwrap();
    assert_eq!(ctx.stats().flushes, 1);
    let update = update.to_vec::<f32>().unwrap();
    assert_eq!(ctx.stats().flushes, 1, "the update ran in the read's flush, on the stream");
    let strict = context(Mode::Strict, 4096);
    let (want_loss, want_update) = step(&strict).unwrap();
    close(&loss, &want_loss.to_vec::<f32>().unwrap());
    close(&update, &want_update.to_vec::<f32>().unwrap());
}

#[test]
fn flushes_cut_by_the_cap_run_on_the_stream_and_match_strict() {
    // A chain far longer than the cap: every cut but the last is a flush
    // nobody waits for, each reading the one before it.
    let chain = |ctx: &Context| -> Vec<f32> {
        let mut y = ctx.randn(&[16, 8], DType::F32, 5).unwrap();
        for i in 0..200 {
            y = y.mul(0.99).unwrap().add(0.01 * f64::from(i % 7)).unwrap().tanh().unwrap();
        }
        y.to_vec::<f32>().unwrap()
    };
    let ctx = context(Mode::DeferAndFuse, 64);
    let got = chain(&ctx);
    assert!(ctx.stats().flushes >= 9, "{} flushes", ctx.stats().flushes);
    close(&got, &chain(&context(Mode::Strict, 64)));
}
