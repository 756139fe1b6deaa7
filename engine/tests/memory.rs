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
