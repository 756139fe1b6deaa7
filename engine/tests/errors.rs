//! Bad input gives a clear error at the op call, in every mode.

use deferfuse::{Config, Context, DType, Error, Mode};

#[test]
fn bad_shapes_raise_at_the_call_in_every_mode() {
    for mode in Mode::ALL {
        let ctx = Context::with_mode(mode).unwrap();
        let a = ctx.zeros(&[2, 3], DType::F32).unwrap();
        let b = ctx.zeros(&[4], DType::F32).unwrap();
        let err = a.add(&b).unwrap_err().to_string();
        assert!(
            err.contains("add") && err.contains("[2, 3]") && err.contains("[4]"),
            "{mode}: {err}"
        );

        let err = a.matmul(&a).unwrap_err().to_string();
        assert!(err.contains("matmul") && err.contains("[2, 3]"), "{mode}: {err}");

        let err = a.reshape(&[7]).unwrap_err().to_string();
        assert!(
            err.contains("reshape") && err.contains("[2, 3]") && err.contains("[7]"),
            "{mode}: {err}"
        );

        let err = a.sum(&[2], false).unwrap_err().to_string();
        assert!(err.contains("sum") && err.contains("axis 2"), "{mode}: {err}");

        let err = Tensor::cat(&[&a, &b], 0).unwrap_err().to_string();
        assert!(err.contains("concat") && err.contains("[2, 3]"), "{mode}: {err}");

        let scalar = ctx.scalar(1.5f32).unwrap();
        let err = scalar.slice(0, 0, 1, 1).unwrap_err().to_string();
        assert!(err.contains("slice") && err.contains("[]"), "{mode}: {err}");
        assert_eq!(scalar.transpose(0, -1).unwrap().item::<f32>().unwrap(), 1.5);

        // The context is still usable after the errors, and nothing was lost.
        assert_eq!(a.add(1.0).unwrap().sum_all().unwrap().item::<f32>().unwrap(), 6.0);
    }
}

use deferfuse::Tensor;

#[test]
fn bad_dtypes_raise_at_the_call_in_every_mode() {
    for mode in Mode::ALL {
        let ctx = Context::with_mode(mode).unwrap();
        let i = ctx.from_vec(vec![1i32, 2], &[2]).unwrap();
        let err = i.mean(&[0], false).unwrap_err();
        assert!(matches!(err, Error::DType { .. }), "{mode}: {err}");
        assert!(
            err.to_string().contains("mean") && err.to_string().contains("i32"),
            "{mode}: {err}"
        );
        let err = i.matmul(&i.reshape(&[2, 1]).unwrap()).unwrap_err().to_string();
        assert!(err.contains("matmul") && err.contains("i32"), "{mode}: {err}");
        let flag = ctx.from_vec(vec![true, false], &[2]).unwrap();
        let err = flag.add(&flag).unwrap_err().to_string();
        assert!(err.contains("add") && err.contains("bool"), "{mode}: {err}");
    }
}

#[test]
fn bad_host_data_is_an_error() {
    let ctx = Context::with_mode(Mode::Strict).unwrap();
    let err = ctx.from_vec(vec![1.0f32, 2.0, 3.0], &[2, 2]).unwrap_err().to_string();
    assert!(err.contains("3 values") && err.contains("[2, 2]"), "{err}");
}

#[test]
fn bad_environment_values_list_the_valid_ones() {
    let get = |value: &'static str| {
        move |k: &str| (k == "TORCH_TPU_EAGER_MODE").then(|| value.to_string())
    };
    let err = Config::from_vars(get("lazy")).unwrap_err().to_string();
    assert!(err.contains("TORCH_TPU_EAGER_MODE") && err.contains("\"lazy\""), "{err}");
    assert!(
        err.contains("strict") && err.contains("debug") && err.contains("defer_and_fuse"),
        "{err}"
    );
    assert_eq!(Config::from_vars(get("DEFER_AND_FUSE")).unwrap().mode, Mode::DeferAndFuse);
    assert_eq!(Config::from_vars(get("Debug")).unwrap().mode, Mode::Debug);
    assert_eq!(Config::from_vars(|_| None).unwrap().mode, Mode::Strict);

    let err = Config::from_vars(|k| (k == "TORCH_TPU_MAX_PENDING_OPS").then(|| "0".to_string()))
        .unwrap_err();
    assert!(err.to_string().contains("positive integer"), "{err}");
    let err =
        Config::from_vars(|k| (k == "TORCH_TPU_DEBUG_CHECKS").then(|| "nan,zero".to_string()))
            .unwrap_err();
    assert!(err.to_string().contains("nan, inf"), "{err}");
}

#[test]
fn debug_mode_names_the_op_and_first_bad_index() {
    let ctx = Context::with_mode(Mode::Debug).unwrap();
    let x = ctx.from_vec(vec![1.0f32, 4.0, -1.0, -2.0], &[2, 2]).unwrap();
    let err = x.log().unwrap_err();
    match &err {
        Error::NonFinite(at) => {
            assert_eq!((at.op.as_str(), at.kind, at.index), ("log", "NaN", 2));
        }
        other => panic!("expected NonFinite, got {other:?}"),
    }
    assert!(err.to_string().contains("[2, 2]"), "{err}");
    let err = x.sub(1.0).unwrap().reciprocal().unwrap_err().to_string();
    assert!(err.contains("reciprocal") && err.contains("Inf") && err.contains("index 0"), "{err}");

    // The check can be turned off.
    let config =
        Config { mode: Mode::Debug, debug_checks: "inf".parse().unwrap(), ..Config::default() };
    let ctx = Context::new(config).unwrap();
    let x = ctx.from_vec(vec![-1.0f32], &[1]).unwrap();
    assert!(x.log().unwrap().item::<f32>().unwrap().is_nan());
    // Strict and DeferAndFuse never check.
    for mode in [Mode::Strict, Mode::DeferAndFuse] {
        let ctx = Context::with_mode(mode).unwrap();
        let x = ctx.from_vec(vec![-1.0f32], &[1]).unwrap();
        assert!(x.log().unwrap().item::<f32>().unwrap().is_nan());
    }
}

#[test]
fn decompose_is_all_or_default_and_names_its_values() {
    let get = |value: &'static str| {
        move |k: &str| (k == "TORCH_TPU_DECOMPOSE").then(|| value.to_string())
    };
    assert!(Config::from_vars(get("ALL")).unwrap().decompose_all);
    assert!(!Config::from_vars(get("default")).unwrap().decompose_all);
    assert!(!Config::from_vars(get("")).unwrap().decompose_all);
    assert!(!Config::from_vars(|_| None).unwrap().decompose_all);
    let err = Config::from_vars(get("some")).unwrap_err().to_string();
    assert!(err.contains("TORCH_TPU_DECOMPOSE") && err.contains("\"some\""), "{err}");
    assert!(err.contains("all") && err.contains("default"), "{err}");
}
