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
