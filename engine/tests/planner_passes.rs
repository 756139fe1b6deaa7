//! Each planner pass switched off alone still computes what the op-by-op
//! reference computes, on the random traces the differential tests use.
//!
//! The trace is rewritten as DeferAndFuse rewrites it, then planned with one
//! switch of `PlanConfig` off (and, for the split pass, a kernel size limit
//! small enough to make it matter), run on the native CPU backend, and
//! compared with the reference by `deferfuse::differential::check_conditioned`:
//! the written tolerance per dtype (f32 rtol = atol = 1e-5, f16 8e-3, bf16
//! 6.25e-2, integers and bool exact; see `differential.rs`), widened only
//! for elements whose measured sensitivity to rounding explains the
//! difference. Fused kernels round per op, as in the differential tests, so
//! what is compared is the fusion decisions, not the rounding mode.

use deferfuse::differential::{
    check_conditioned, checked_trace, random_inputs, run_program, run_reference,
};
use deferfuse::{Config, FusedRounding};
use proptest::prelude::*;
use rewrite_rules::planner::{plan, PlanConfig, Rounding};
use runtime::{CpuBackend, MemoryTracker};

/// The default plan, and each switch off alone.
fn configs() -> Vec<(&'static str, PlanConfig)> {
    let d = || PlanConfig { rounding: Rounding::PerOp, ..PlanConfig::default() };
    vec![
        ("default", d()),
        ("recompute off", PlanConfig { recompute: false, ..d() }),
        ("merge off", PlanConfig { merge: false, ..d() }),
        ("epilogues off", PlanConfig { epilogues: false, ..d() }),
        // With 256 ops a kernel, generated traces never split: compare a
        // limit of 4 with splitting on against the same limit with it off.
        ("split at 4 ops", PlanConfig { max_kernel_ops: 4, ..d() }),
        ("split off", PlanConfig { max_kernel_ops: 4, split: false, ..d() }),
        ("merge budget 1", PlanConfig { merge_budget: Some(1), ..d() }),
    ]
}

/// Checks every config on the trace `bytes` generates; the fingerprints of
/// the programs, in [`configs`] order.
fn check(bytes: &[u8]) -> Result<Vec<u64>, String> {
    let trace = checked_trace(bytes);
    let seed = trace_ir::signature::stable_hash64(bytes);
    let params: Vec<_> = trace.parameters().iter().map(|&p| trace.meta(p).clone()).collect();
    let inputs = random_inputs(&params, seed);
    let rewrite = Config { fused_rounding: FusedRounding::PerOp, ..Config::default() };
    let optimized = rewrite_rules::optimize(&trace, &rewrite.effective_rewrite())
        .map_err(|e| format!("optimize: {e}"))?
        .trace;
    let expected = run_reference(&trace, &inputs);
    let backend = CpuBackend::new(MemoryTracker::new());
    let mut fingerprints = Vec::new();
    for (name, config) in configs() {
        let program = plan(&optimized, &config).map_err(|e| format!("{name}: plan: {e}"))?;
        fingerprints.push(program.fingerprint());
        match (run_program(&program, &optimized, &inputs, &backend), &expected) {
            (Ok(actual), Ok(expected)) => {
                check_conditioned(&trace, &inputs, &actual, expected, seed)
                    .map_err(|e| format!("{name}: {e}\n{}", trace.to_json()))?;
            }
            // A reduction over an empty axis without identity fails both ways.
            (Err(_), Err(_)) => {}
            (Err(e), Ok(_)) => return Err(format!("{name}: fused failed: {e}")),
            (Ok(_), Err(e)) => return Err(format!("{name}: reference failed, fused did not: {e}")),
        }
    }
    Ok(fingerprints)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x9a55),
        ..ProptestConfig::default()
    })]

    #[test]
    fn each_pass_off_alone_matches_the_reference(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Err(msg) = check(&bytes) {
            prop_assert!(false, "{}", msg);
        }
    }
}

/// The fuzz corpus of the differential target, which holds the traces that
/// once broke fusion, under every switch too.
#[test]
fn fuzz_corpus_matches_the_reference_with_each_pass_off() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/fused_vs_unfused");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        check(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// The check is not vacuous: over a fixed set of generated traces, each
/// switch changes some program (and passes the check there).
#[test]
fn each_switch_changes_some_program() {
    let mut state = 0x5eed_u64;
    let mut changed = vec![0usize; configs().len()];
    for case in 0..300usize {
        let bytes: Vec<u8> = (0..case % 300)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 56) as u8
            })
            .collect();
        let fingerprints = check(&bytes).unwrap_or_else(|e| panic!("case {case}: {e}"));
        for (i, (name, _)) in configs().iter().enumerate() {
            // Splitting off is compared with splitting at the same limit.
            let base = if *name == "split off" { i - 1 } else { 0 };
            changed[i] += usize::from(fingerprints[i] != fingerprints[base]);
        }
    }
    for ((name, _), n) in configs().iter().zip(&changed).skip(1) {
        assert!(*n > 0, "{name}: no generated trace planned differently");
    }
}
