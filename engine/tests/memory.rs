//! Peak-memory accounting through the API.

use deferfuse::{Context, DType, Mode, Tensor};

const N: usize = 1 << 20;

/// A chain of eight elementwise steps written as temporaries: nobody holds
/// an intermediate once the next step is recorded.
fn chain(ctx: &Context) -> (f32, usize) {
    let x = ctx.randn(&[N], DType::F32, 1).unwrap();
    ctx.sync().unwrap();
    ctx.reset_peak_memory();
    let mut y: Tensor = x.mul(0.5).unwrap();
    for i in 0..8 {
        y = if i % 2 == 0 { y.tanh().unwrap() } else { y.mul(0.5).unwrap() };
    }
    let value = y.sum_all().unwrap().item::<f32>().unwrap();
    (value, ctx.memory().peak_bytes)
}

#[test]
fn dropped_intermediates_lower_the_peak_in_defer_and_fuse() {
    let (strict_value, strict_peak) = chain(&Context::with_mode(Mode::Strict).unwrap());
    let (fused_value, fused_peak) = chain(&Context::with_mode(Mode::DeferAndFuse).unwrap());
    assert_eq!(strict_value, fused_value);
    let bytes = N * 4;
    // Strict materializes every op's output while its input is still alive:
    // the input x, plus two buffers at each step.
    assert!(strict_peak >= 3 * bytes, "strict peak {strict_peak}");
    // DeferAndFuse runs the chain at the read, when the temporaries are gone:
    // intermediates are freed after their last use or overwritten in place.
    assert!(fused_peak <= 2 * bytes + 1024, "fused peak {fused_peak}");
    assert!(fused_peak < strict_peak);
}

#[test]
fn live_bytes_return_to_zero_when_everything_is_dropped() {
    for mode in Mode::ALL {
        let ctx = Context::with_mode(mode).unwrap();
        {
            let x = ctx.ones(&[1000], DType::F32).unwrap();
            let y = x.exp().unwrap().add(&x).unwrap();
            assert_eq!(y.to_vec::<f32>().unwrap().len(), 1000);
            assert!(ctx.memory().live_bytes >= 4000);
        }
        ctx.sync().unwrap();
        assert_eq!(ctx.memory().live_bytes, 0, "{mode}");
    }
}

/// An optimizer-style update: the new state replaces the old, so the old
/// buffers are dropped before the flush and the fused kernel writes the new
/// values into them (buffer donation): the step allocates nothing.
#[test]
fn a_fused_step_writes_into_inputs_nobody_else_holds() {
    let ctx = Context::with_mode(Mode::DeferAndFuse).unwrap();
    let reference = Context::new(deferfuse::Config {
        mode: Mode::Strict,
        fusion: false,
        ..deferfuse::Config::default()
    })
    .unwrap();
    let mut state =
        [ctx.randn(&[N], DType::F32, 1).unwrap(), ctx.randn(&[N], DType::F32, 2).unwrap()];
    let grad = ctx.randn(&[N], DType::F32, 3).unwrap();
    let copy = |t: &Tensor| reference.from_vec(t.to_vec::<f32>().unwrap(), &[N]).unwrap();
    let mut expected = [copy(&state[0]), copy(&state[1])];
    let grad_ref = copy(&grad);
    let step = |[p, m]: [Tensor; 2], g: &Tensor| -> [Tensor; 2] {
        let m = m.mul(0.9).unwrap().add(g.mul(0.1).unwrap()).unwrap();
        let p = p.sub(m.mul(0.01).unwrap()).unwrap();
        [p, m]
    };
    ctx.sync().unwrap();
    let held = ctx.memory().live_bytes;
    ctx.reset_peak_memory();
    for _ in 0..3 {
        state = step(state, &grad);
        ctx.sync().unwrap();
        expected = step(expected, &grad_ref);
    }
    // Only the step's scalars (three f32 parameters) are new.
    let peak = ctx.memory().peak_bytes;
    assert!(peak <= held + 64, "the step allocated {} bytes beyond its inputs", peak - held);
    for (got, want) in state.iter().zip(&expected) {
        assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    }
}
