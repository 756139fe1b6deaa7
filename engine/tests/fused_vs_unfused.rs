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
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/fused_vs_unfused");
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
