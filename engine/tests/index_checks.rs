//! Bounds checks of indexing ops (`Tensor::check_index`): Debug fails at the
//! check, Strict and DeferAndFuse at the next read of any value or at sync,
//! from a flag computed with the ops, never by a flush of their own.

use deferfuse::{
    BoundsMessage, Context, DType, Error, IndexBound, IndexErrorClass, IndexOutOfBounds, Mode,
    Tensor,
};

fn out_of_bounds(err: Error) -> IndexOutOfBounds {
    match err {
        Error::IndexOutOfBounds(bad) => *bad,
        other => panic!("expected IndexOutOfBounds, got {other:?}"),
    }
}

fn table(ctx: &Context) -> Tensor {
    ctx.arange(0.0, 5.0, 1.0, DType::F32).unwrap()
}

#[test]
fn an_index_past_the_size_fails_at_the_check_in_debug_and_at_the_next_read_otherwise() {
    for mode in Mode::ALL {
        let ctx = Context::with_mode(mode).unwrap();
        let t = table(&ctx);
        let idx = ctx.from_vec(vec![1i64, 7], &[2]).unwrap();
        let checked = idx.check_index(5, "aten::index", 0, BoundsMessage::OutOfBounds);
        let err = match mode {
            Mode::Debug => checked.unwrap_err(),
            _ => {
                checked.unwrap();
                // The value read does not depend on the index at all.
                t.sum_all().unwrap().item::<f32>().unwrap_err()
            }
        };
        let bad = out_of_bounds(err.clone());
        assert_eq!(bad.class, IndexErrorClass::IndexError, "{mode}");
        assert_eq!(bad.message, "index 7 is out of bounds for dimension 0 with size 5", "{mode}");
        assert_eq!(bad.op, "aten::index", "{mode}");
        assert!(bad.site.contains("index_checks.rs:"), "{mode}: {}", bad.site);
        assert!(err.to_string().contains("(aten::index at engine/tests/index_checks.rs:"), "{err}");

        // Raised once; the context goes on working.
        assert_eq!(t.sum_all().unwrap().item::<f32>().unwrap(), 10.0, "{mode}");
        ctx.sync().unwrap();
        let fine = ctx.from_vec(vec![4i64, -5, 0], &[3]).unwrap();
        fine.check_index(5, "aten::index", 0, BoundsMessage::OutOfBounds).unwrap();
        assert_eq!(t.mul(2.0).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 2.0, 4.0, 6.0, 8.0]);
    }
}

#[test]
fn negative_indices_are_valid_only_where_pytorch_counts_them_from_the_end() {
    for mode in Mode::ALL {
        let ctx = Context::with_mode(mode).unwrap();
        let check = |values: Vec<i32>, message| {
            let idx = ctx.from_vec(values, &[1]).unwrap();
            idx.check_index(5, "op", 2, message).and_then(|()| ctx.sync())
        };
        check(vec![-5], BoundsMessage::OutOfBounds).unwrap();
        check(vec![-1], BoundsMessage::Take).unwrap();
        let err = out_of_bounds(check(vec![-6], BoundsMessage::OutOfBounds).unwrap_err());
        assert_eq!(err.message, "index -6 is out of bounds for dimension 2 with size 5");
        let err = out_of_bounds(check(vec![-1], BoundsMessage::GatherOutOfBounds).unwrap_err());
        assert_eq!(err.class, IndexErrorClass::RuntimeError, "{mode}");
        assert_eq!(err.message, "index -1 is out of bounds for dimension 2 with size 5");
        let err = out_of_bounds(check(vec![-1], BoundsMessage::OutOfRangeInSelf).unwrap_err());
        assert_eq!(err.message, "index out of range in self");
        let err = out_of_bounds(check(vec![5], BoundsMessage::IndexCopy).unwrap_err());
        assert_eq!(
            err.message,
            "index_copy_(): index 5 is out of bounds for dimension 2 with size 5"
        );
        let err = out_of_bounds(check(vec![-6], BoundsMessage::Take).unwrap_err());
        assert_eq!(
            err.message,
            "out of range: tried to access index -6 on a tensor of 5 elements."
        );
    }
}

#[test]
fn the_check_adds_no_flush_in_defer_and_fuse() {
    let flushes = |with_check: bool| {
        let ctx = Context::with_mode(Mode::DeferAndFuse).unwrap();
        let t = table(&ctx);
        let idx = ctx.from_vec(vec![0i64, 9], &[2]).unwrap();
        let y = t.mul(3.0).unwrap().add(1.0).unwrap();
        if with_check {
            idx.check_index(5, "aten::gather", 0, BoundsMessage::GatherOutOfBounds).unwrap();
            // Recorded, not run: the check reads nothing back.
            assert_eq!(ctx.stats().flushes, 0);
        }
        let read = y.to_vec::<f32>();
        assert_eq!(read.is_err(), with_check);
        ctx.sync().unwrap();
        ctx.stats().flushes
    };
    assert_eq!(flushes(true), flushes(false));
    assert_eq!(flushes(true), 1);
}

#[test]
fn sync_raises_the_check_and_clears_it() {
    for mode in [Mode::Strict, Mode::DeferAndFuse] {
        let ctx = Context::with_mode(mode).unwrap();
        let idx = ctx.from_vec(vec![3i64, 5, 6], &[3]).unwrap();
        idx.check_index(5, "aten::scatter", 0, BoundsMessage::GatherOutOfBounds).unwrap();
        let err = out_of_bounds(ctx.sync().unwrap_err());
        // The first offending element, not the largest.
        assert_eq!(err.message, "index 5 is out of bounds for dimension 0 with size 5");
        ctx.sync().unwrap();
    }
}

#[test]
fn strict_raises_even_when_the_value_read_was_already_computed() {
    let ctx = Context::with_mode(Mode::Strict).unwrap();
    let ready = ctx.from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let idx = ctx.from_vec(vec![2i64], &[1]).unwrap();
    idx.check_index(2, "aten::take", 0, BoundsMessage::Take).unwrap();
    let err = out_of_bounds(ready.to_vec::<f32>().unwrap_err());
    assert_eq!(err.message, "out of range: tried to access index 2 on a tensor of 2 elements.");
    assert_eq!(ready.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
}

#[test]
fn defer_and_fuse_keeps_the_check_for_the_next_flush_when_a_read_runs_none() {
    let ctx = Context::with_mode(Mode::DeferAndFuse).unwrap();
    let ready = ctx.from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let idx = ctx.from_vec(vec![2i64], &[1]).unwrap();
    idx.check_index(2, "aten::take", 0, BoundsMessage::Take).unwrap();
    // Reading a value that is already there runs no flush, and the check
    // has not run yet: it stays outstanding rather than forcing one.
    assert_eq!(ready.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    assert_eq!(ctx.stats().flushes, 0);
    assert!(matches!(ctx.sync().unwrap_err(), Error::IndexOutOfBounds(_)));
    assert_eq!(ctx.stats().flushes, 1);
}

#[test]
fn index_tensors_read_together_name_the_first_bad_element_then_the_first_tensor() {
    for mode in Mode::ALL {
        let ctx = Context::with_mode(mode).unwrap();
        let rows = ctx.from_vec(vec![0i64, 3, 0], &[3]).unwrap();
        let cols = ctx.from_vec(vec![0i64, 9, 9], &[3]).unwrap();
        let bounds = [
            IndexBound { index: &rows, size: 2, dim: 0 },
            IndexBound { index: &cols, size: 5, dim: 1 },
        ];
        let err = ctx
            .check_indices(&bounds, "aten::index", BoundsMessage::OutOfBounds, "model.py:3")
            .and_then(|()| ctx.sync())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "index 3 is out of bounds for dimension 0 with size 2 (aten::index at model.py:3)"
        );
        let cols = ctx.from_vec(vec![0i64, 9, 1], &[3]).unwrap();
        let late_rows = ctx.from_vec(vec![0i64, 1, 2], &[3]).unwrap();
        let bounds = [
            IndexBound { index: &late_rows, size: 2, dim: 0 },
            IndexBound { index: &cols, size: 5, dim: 1 },
        ];
        let err = ctx
            .check_indices(&bounds, "aten::index", BoundsMessage::OutOfBounds, "")
            .and_then(|()| ctx.sync())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "index 9 is out of bounds for dimension 1 with size 5 (aten::index)",
            "{mode}"
        );
    }
}

#[test]
fn the_first_failed_check_is_raised_and_every_check_read_is_dropped() {
    let ctx = Context::with_mode(Mode::DeferAndFuse).unwrap();
    let a = ctx.from_vec(vec![8i64], &[1]).unwrap();
    let b = ctx.from_vec(vec![9i64], &[1]).unwrap();
    a.check_index(5, "first", 0, BoundsMessage::OutOfBounds).unwrap();
    b.check_index(5, "second", 0, BoundsMessage::OutOfBounds).unwrap();
    assert_eq!(out_of_bounds(ctx.sync().unwrap_err()).op, "first");
    ctx.sync().unwrap();
}

#[test]
fn checks_refuse_what_is_not_an_index() {
    for mode in Mode::ALL {
        let ctx = Context::with_mode(mode).unwrap();
        let f = table(&ctx);
        let err = f.check_index(5, "aten::take", 0, BoundsMessage::Take).unwrap_err();
        assert!(matches!(err, Error::DType { .. }), "{mode}: {err}");
        let empty = ctx.from_vec(Vec::<i64>::new(), &[0]).unwrap();
        empty.check_index(0, "aten::take", 0, BoundsMessage::Take).unwrap();
        let a = ctx.from_vec(vec![0i64], &[1]).unwrap();
        let b = ctx.from_vec(vec![0i64, 1], &[2]).unwrap();
        let bounds =
            [IndexBound { index: &a, size: 2, dim: 0 }, IndexBound { index: &b, size: 2, dim: 1 }];
        let err = ctx.check_indices(&bounds, "aten::index", BoundsMessage::OutOfBounds, "");
        assert!(matches!(err, Err(Error::Shape { .. })), "{mode}: {err:?}");
        ctx.sync().unwrap();
    }
}

#[test]
fn a_computed_index_is_checked_with_the_value_it_has_then() {
    for mode in Mode::ALL {
        let ctx = Context::with_mode(mode).unwrap();
        let base = ctx.from_vec(vec![0i32, 1, 2], &[3]).unwrap();
        let idx = base.mul(3).unwrap(); // [0, 3, 6]: 6 is past a size of 5
        let err = idx
            .check_index(5, "aten::take", 0, BoundsMessage::Take)
            .and_then(|()| ctx.sync())
            .unwrap_err();
        assert_eq!(
            out_of_bounds(err).message,
            "out of range: tried to access index 6 on a tensor of 5 elements.",
            "{mode}"
        );
    }
}

#[test]
fn row_gathers_and_scatters_check_their_indices_in_every_mode() {
    for mode in Mode::ALL {
        let ctx = Context::with_mode(mode).unwrap();
        let t = ctx.arange(0.0, 6.0, 1.0, DType::F32).unwrap().reshape(&[3, 2]).unwrap();
        let idx = ctx.from_vec(vec![2i64, 0, 2], &[3]).unwrap();
        let rows = t.gather_rows(&idx).unwrap();
        assert_eq!(rows.to_vec::<f32>().unwrap(), vec![4.0, 5.0, 0.0, 1.0, 4.0, 5.0], "{mode}");
        // The gradient of the gather: repeated rows add up.
        let back = rows.scatter_add_rows(&idx, 3).unwrap();
        assert_eq!(back.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 0.0, 0.0, 8.0, 10.0], "{mode}");

        let bad = ctx.from_vec(vec![1i64, 3], &[2]).unwrap();
        let err = match t.gather_rows(&bad) {
            Err(e) => e,
            Ok(picked) => picked.to_vec::<f32>().unwrap_err(),
        };
        let b = out_of_bounds(err);
        assert_eq!(
            (b.op.as_str(), b.message.as_str()),
            ("index_select", "index out of range in self")
        );
        let ones = ctx.from_vec(vec![1.0f32; 4], &[2, 2]).unwrap();
        let err = match ones.scatter_add_rows(&bad, 3) {
            Err(e) => e,
            Ok(summed) => summed.to_vec::<f32>().unwrap_err(),
        };
        assert_eq!(out_of_bounds(err).op, "index_add", "{mode}");
        // The context goes on working.
        assert_eq!(t.sum_all().unwrap().item::<f32>().unwrap(), 15.0, "{mode}");
    }
}
