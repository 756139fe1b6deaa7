//! Random traces run fused (rewrites + planner + fused kernels) and op by op
//! agree within the written tolerance per dtype; the fuzz target's seed
//! corpus is replayed here too.

use deferfuse::differential::check_generated;
use proptest::prelude::*;

proptest! {
    // A fixed seed: CI runs the same 300 cases every time; PROPTEST_CASES and
    // a different seed explore further (the fuzz target explores without end).
    #![proptest_config(ProptestConfig {
        cases: 300,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_traces_agree(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Err(msg) = check_generated(&bytes) {
            prop_assert!(false, "{}", msg);
        }
    }
}

#[test]
fn fuzz_corpus_agrees() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/fused_vs_unfused");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        check_generated(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        count += 1;
    }
    assert!(count >= 10, "corpus at {} has {count} files", dir.display());
}

/// Reductions over empty rows still produce their rows, and what follows
/// them in the kernel runs: `sum` of nothing is 0 and `mean` is NaN, as in
/// Strict (and PyTorch).
#[test]
fn reductions_over_empty_rows_feed_the_rest_of_the_kernel() {
    use deferfuse::{Config, Context, DType, Mode};
    let run = |mode| -> Vec<Vec<f32>> {
        let ctx = Context::new(Config { mode, ..Config::default() }).unwrap();
        let all = ctx.ones(&[0, 3], DType::F32).unwrap();
        let rows = ctx.ones(&[4, 0], DType::F32).unwrap();
        // Data from the host, so nothing folds: producer, empty sum, consumer.
        let data = ctx.from_vec(Vec::<f32>::new(), &[0]).unwrap();
        let outs = [
            data.mul(2.0).unwrap().sum(&[0], false).unwrap().add(0.25).unwrap(),
            data.abs().unwrap().pow(3.5).unwrap().sum(&[0], false).unwrap().pow(1.0 / 3.5).unwrap(),
            all.sum(&[0, 1], false).unwrap().add(1.0).unwrap(),
            rows.sum(&[-1], false).unwrap().add(1.0).unwrap().exp().unwrap(),
            rows.mean(&[-1], true).unwrap().mul(2.0).unwrap(),
            all.mean(&[0, 1], false).unwrap(),
        ];
        outs.iter().map(|t| t.to_vec::<f32>().unwrap()).collect()
    };
    let (fused, strict) = (run(Mode::DeferAndFuse), run(Mode::Strict));
    assert_eq!(fused[0], vec![0.25]);
    assert_eq!(fused[1], vec![0.0]);
    assert_eq!(fused[2], vec![1.0]);
    assert_eq!(fused[3], vec![std::f32::consts::E; 4]);
    assert!(fused[4].len() == 4 && fused[4].iter().all(|v| v.is_nan()), "{:?}", fused[4]);
    assert!(fused[5].len() == 1 && fused[5][0].is_nan(), "{:?}", fused[5]);
    assert_eq!(format!("{fused:?}"), format!("{strict:?}"));
}

#[test]
fn long_rows_keep_row_values_read_after_their_reduction() {
    // Rows longer than a tile are walked in chunks, and the reduction and
    // what reads it run after the last chunk: per-row values computed before
    // the reduction (lo < hi, mid + 1) must still be there then. A binary
    // search like the binding's searchsorted (whose plan, with its kernel
    // cuts, bindings/tests/test_compositions.py checks at 9000 entries).
    use deferfuse::{Config, Context, DType, Mode};
    let n = 9000usize;
    let run = |mode| -> Vec<f32> {
        let ctx = Context::new(Config { mode, ..Config::default() }).unwrap();
        let table =
            ctx.from_vec((0..n).map(|i| i as f32 / n as f32).collect::<Vec<f32>>(), &[n]).unwrap();
        let values = ctx.from_vec(vec![0.25f32, 0.75, 0.5], &[3]).unwrap();
        let mut lo = ctx.full(0.0, &[3], DType::F32).unwrap();
        let mut hi = ctx.full(n as f64, &[3], DType::F32).unwrap();
        let positions = ctx.arange(0.0, n as f64, 1.0, DType::F32).unwrap();
        for _ in 0..usize::BITS - n.leading_zeros() {
            let active = lo.lt(&hi).unwrap();
            let mid = lo.add(&hi).unwrap().mul(0.5).unwrap().floor().unwrap();
            let picked = mid
                .reshape(&[3, 1])
                .unwrap()
                .eq(&positions)
                .unwrap()
                .where_cond(&table, 0.0f32)
                .unwrap();
            let at_mid = picked.sum(&[-1], false).unwrap();
            let right = at_mid.ge(&values).unwrap().logical_not().unwrap();
            lo =
                active.logical_and(&right).unwrap().where_cond(mid.add(1.0).unwrap(), &lo).unwrap();
            hi = active
                .logical_and(right.logical_not().unwrap())
                .unwrap()
                .where_cond(&mid, &hi)
                .unwrap();
        }
        lo.to_vec::<f32>().unwrap()
    };
    let (fused, strict) = (run(Mode::DeferAndFuse), run(Mode::Strict));
    assert_eq!(strict, vec![2250.0, 6750.0, 4500.0]);
    assert_eq!(fused, strict);
}

/// A log-softmax over an empty axis, summed: the sum of nothing is 0 in the
/// fused kernel as in Strict, whatever the (absent) rows' scalars are.
#[test]
fn a_sum_over_an_empty_log_softmax_is_zero() {
    use deferfuse::{Config, Context, DType, Mode};
    let run = |mode| -> Vec<f32> {
        let ctx = Context::new(Config { mode, ..Config::default() }).unwrap();
        let x = ctx.ones(&[0], DType::F32).unwrap();
        let ls = x.log_softmax(0).unwrap().abs().unwrap().add(1.0).unwrap();
        ls.sum(&[0], false)
            .unwrap()
            .gelu(deferfuse::GeluApproximation::None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    assert_eq!(run(Mode::Strict), vec![0.0]);
    assert_eq!(run(Mode::DeferAndFuse), vec![0.0]);
}

/// Traces of the differential run at scale that once failed (replay one with
/// `cargo run --release -p deferfuse --example differential -- --from I
/// --traces 1 --verbose`).
#[test]
fn traces_the_differential_run_found_agree() {
    for i in [17162, 39230, 79499, 97038, 127861, 128078, 175454, 626740, 727766, 934201] {
        let bytes = deferfuse::differential::trace_bytes(i);
        check_generated(&bytes).unwrap_or_else(|e| panic!("trace {i}: {e}"));
    }
}
