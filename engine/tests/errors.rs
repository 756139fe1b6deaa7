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

/// An op that fails only when it runs (on the stream, in Strict): 64 TiB of
/// zeros, which no allocation on a test machine holds.
fn failing_alloc(ctx: &Context) -> deferfuse::Tensor {
    ctx.zeros(&[1 << 22, 1 << 22], DType::F32).unwrap()
}

#[test]
fn after_a_failed_op_strict_names_it_once_and_later_errors_are_their_own() {
    let ctx = Context::with_mode(Mode::Strict).unwrap();
    let failed = failing_alloc(&ctx);
    // The failed value itself: its own error, nothing about "earlier".
    let own = failed.to_vec::<f32>().unwrap_err().to_string();
    assert!(own.contains("cannot allocate") && own.contains("4194304"), "{own}");
    assert!(!own.contains("earlier"), "{own}");

    // A chain of ops after it: each says once which op failed first.
    let mut y = failed.clone();
    for _ in 0..5 {
        y = y.exp().unwrap().add(1.0).unwrap();
    }
    let err = y.to_vec::<f32>().unwrap_err();
    let text = err.to_string();
    assert_eq!(text.matches("failed earlier").count(), 1, "{text}");
    assert_eq!(text.matches("cannot allocate").count(), 1, "{text}");
    assert!(text.contains("the full op"), "{text}");
    match &err {
        Error::Poisoned { op, cause } => {
            assert_eq!(op, "the full op");
            assert!(!matches!(**cause, Error::Poisoned { .. }), "{cause:?}");
        }
        other => panic!("expected Poisoned, got {other:?}"),
    }

    // Another failure later has its own message, not the first one's.
    let other = ctx.ones(&[1 << 23, 1 << 23], DType::I32).unwrap();
    let text = other.to_vec::<i32>().unwrap_err().to_string();
    assert!(text.contains("8388608") && !text.contains("earlier"), "{text}");
    // And unrelated work goes on.
    let ok = ctx.ones(&[3], DType::F32).unwrap().mul(2.0).unwrap();
    assert_eq!(ok.to_vec::<f32>().unwrap(), vec![2.0; 3]);
}

#[test]
fn a_failed_flush_poisons_what_reads_it_once() {
    // Unfused, so the flush runs the reference ops one by one.
    let config = Config { fusion: false, ..Config::with_mode(Mode::DeferAndFuse) };
    let lazy = Context::new(config).unwrap();
    let failed = failing_alloc(&lazy);
    let own = failed.to_vec::<f32>().unwrap_err().to_string();
    assert!(own.contains("cannot allocate") && !own.contains("earlier"), "{own}");
    // DeferAndFuse refuses a failed input when the op is recorded.
    for _ in 0..3 {
        let text = failed.exp().unwrap_err().to_string();
        assert_eq!(text.matches("failed earlier").count(), 1, "{text}");
        assert!(
            text.contains("a DeferAndFuse flush") && text.contains("cannot allocate"),
            "{text}"
        );
    }
}

const DUMP_CHILD: &str = "DEFERFUSE_TEST_DUMP_CHILD";

/// Run by the next test in a child process: contexts that dump into the
/// path the parent names, and flushes that would write dumps there.
#[test]
fn child_dumps_into_a_bad_place() {
    let Ok(dir) = std::env::var(DUMP_CHILD) else { return };
    for _ in 0..2 {
        let config = Config::from_vars(|k| {
            (k == "TORCH_TPU_FUSION_DUMP")
                .then(|| dir.clone())
                .or_else(|| (k == "TORCH_TPU_EAGER_MODE").then(|| "defer_and_fuse".to_string()))
        })
        .unwrap();
        let ctx = Context::new(Config { cache_dir: None, ..config }).unwrap();
        for _ in 0..2 {
            let x = ctx.from_vec(vec![1.0f32, -2.0], &[2]).unwrap();
            assert_eq!(x.relu().unwrap().sum_all().unwrap().item::<f32>().unwrap(), 1.0);
        }
    }
}

/// The warnings a child that dumps into `dir` printed.
fn dump_warnings(dir: &std::path::Path) -> Vec<String> {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_dumps_into_a_bad_place", "--nocapture", "--test-threads", "1"])
        .env(DUMP_CHILD, dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr.lines().filter(|l| l.contains("deferfuse: warning")).map(str::to_string).collect()
}

#[test]
fn a_dump_path_that_is_a_file_or_unwritable_is_warned_about_once() {
    let file = std::env::temp_dir().join(format!("deferfuse-dump-file-{}", std::process::id()));
    std::fs::write(&file, b"not a directory").unwrap();
    let warnings = dump_warnings(&file);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let w = &warnings[0];
    assert!(
        w.contains("TORCH_TPU_FUSION_DUMP")
            && w.contains(&file.display().to_string())
            && w.contains("not a directory"),
        "{w}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory");
    let _ = std::fs::remove_file(&file);

    // /sys refuses new files even to root.
    let warnings = dump_warnings(std::path::Path::new("/sys"));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("/sys") && warnings[0].contains("cannot write"),
        "{}",
        warnings[0]
    );
}

#[test]
fn max_and_min_over_an_empty_axis_fail_at_the_op_in_every_mode() {
    for mode in [Mode::Strict, Mode::Debug, Mode::DeferAndFuse] {
        let ctx = Context::with_mode(mode).unwrap();
        let x = ctx.zeros(&[0, 3], DType::F32).unwrap();
        for err in [x.max(&[0], false).unwrap_err(), x.min(&[-2], true).unwrap_err()] {
            let text = err.to_string();
            assert!(text.contains("empty axis") && text.contains("[0, 3]"), "{mode:?}: {text}");
        }
        // Over the other axis there is something to reduce: an empty result.
        assert_eq!(x.max(&[1], false).unwrap().to_vec::<f32>().unwrap(), Vec::<f32>::new());
    }
}
