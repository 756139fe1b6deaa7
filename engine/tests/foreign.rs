//! Values crossing contexts (the PyTorch binding keeps one context per mode).

use deferfuse::{Context, Mode};

#[test]
fn a_value_moves_between_modes_and_keeps_its_data() -> deferfuse::Result<()> {
    let strict = Context::with_mode(Mode::Strict)?;
    let lazy = Context::with_mode(Mode::DeferAndFuse)?;
    let x = (strict.from_vec(vec![1.0f32, -2.0, 3.0], &[3])? * 2.0)?;
    let moved = x.to_context(&lazy)?;
    assert!(moved.context().same_as(&lazy));
    assert!(!moved.context().same_as(&strict));
    let y = moved.relu()?.sum(&[0], false)?;
    assert_eq!(y.item::<f32>()?, 8.0);
    // The original is untouched and still usable in its own context.
    assert_eq!(x.to_vec::<f32>()?, vec![2.0, -4.0, 6.0]);
    Ok(())
}

#[test]
fn a_value_already_in_the_context_is_the_same_tensor() -> deferfuse::Result<()> {
    let ctx = Context::with_mode(Mode::Debug)?;
    let x = ctx.from_vec(vec![1i64, 2], &[2])?;
    assert!(x.to_context(&ctx)?.same_as(&x));
    Ok(())
}

#[test]
fn a_deferred_value_is_flushed_before_it_moves() -> deferfuse::Result<()> {
    let lazy = Context::with_mode(Mode::DeferAndFuse)?;
    let debug = Context::with_mode(Mode::Debug)?;
    let x = lazy.from_vec(vec![0.5f32, 1.5], &[2])?.exp()?; // recorded, not run
    let moved = x.to_context(&debug)?;
    let expected: Vec<f32> = vec![0.5f32.exp(), 1.5f32.exp()];
    let got = moved.to_vec::<f32>()?;
    assert!(got.iter().zip(&expected).all(|(a, b)| (a - b).abs() <= 1e-6 * b.abs()), "{got:?}");
    Ok(())
}

#[test]
fn ops_import_operands_of_other_contexts() -> deferfuse::Result<()> {
    let strict = Context::with_mode(Mode::Strict)?;
    let lazy = Context::with_mode(Mode::DeferAndFuse)?;
    let debug = Context::with_mode(Mode::Debug)?;
    let a = strict.from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    let b = lazy.from_vec(vec![10.0f32, 20.0, 30.0, 40.0], &[2, 2])?.neg()?; // deferred
    let c = debug.from_vec(vec![true, false, true, false], &[2, 2])?;
    // The result belongs to the context of the op's receiver.
    let sum = a.add(&b)?;
    assert!(sum.context().same_as(&strict));
    assert_eq!(sum.to_vec::<f32>()?, vec![-9.0, -18.0, -27.0, -36.0]);
    assert_eq!(c.where_cond(&a, &b)?.to_vec::<f32>()?, vec![1.0, -20.0, 3.0, -40.0]);
    assert_eq!(b.matmul(&a)?.to_vec::<f32>()?, vec![-70.0, -100.0, -150.0, -220.0]);
    let joined = deferfuse::Tensor::cat(&[&c, &a, &b], 0)?;
    assert!(joined.context().same_as(&debug));
    assert_eq!(joined.shape(), &[6, 2]);
    assert_eq!(joined.sum_all()?.item::<f32>()?, 2.0 + 10.0 - 100.0);
    Ok(())
}
