//! The f64 reference of the workloads is right, and fusing bf16 with
//! `TORCH_TPU_FUSED_ROUNDING=once` is no less accurate than eager bf16.
//!
//! First the reference is checked against the engine's f32 Strict run on the
//! same f32 inputs, within the written f32 tolerance: a reference with a
//! wrong formula, head split or bias correction fails here, so the bf16
//! comparisons below measure the engine and not a mistake of the reference.

use benches::reference64::{
    error_stats, reference, run_step, workload_inputs, Array, HostInput, RELATIVE_FLOOR,
};
use benches::{Size, NAMES};
use deferfuse::differential::{close, tolerance};
use deferfuse::{Config, DType, FusedRounding, HostData, Mode};

fn strict() -> Config {
    Config { mode: Mode::Strict, ..Config::default() }
}

fn fused(rounding: FusedRounding) -> Config {
    Config { mode: Mode::DeferAndFuse, fused_rounding: rounding, ..Config::default() }
}

/// The reference on the exact values the engine saw.
fn reference_on(name: &str, inputs: &[HostInput]) -> Vec<Array> {
    reference(name, &inputs.iter().map(HostInput::to_array).collect::<Vec<_>>()).unwrap()
}

#[test]
fn reference_agrees_with_f32_strict_within_the_f32_tolerance() {
    let tol = tolerance(DType::F32);
    for name in NAMES {
        let (inputs, step) = workload_inputs(name, Size::Tiny, DType::F32).unwrap();
        let actual = run_step(strict(), step, &inputs).unwrap();
        let expected = reference_on(name, &inputs);
        assert_eq!(actual.len(), expected.len(), "{name}: number of outputs");
        for (i, (a, e)) in actual.iter().zip(&expected).enumerate() {
            assert_eq!(a.dtype(), DType::F32, "{name}[{i}]");
            let a = a.to_f64_vec();
            assert_eq!(a.len(), e.data.len(), "{name}[{i}]: number of elements");
            if let Some(j) = (0..a.len()).find(|&j| !close(a[j], e.data[j], tol)) {
                panic!("{name}[{i}] element {j}: f32 Strict {} vs f64 reference {} (tolerance {tol:?})", a[j], e.data[j]);
            }
            // A reference of NaNs would agree with an engine of NaNs, so most
            // elements must be finite. Adam's new parameters are NaN in about
            // half the places: the workload draws the second moment `v` from
            // randn, and the square root of a negative `v` is NaN.
            let stats = error_stats(&a, &e.data);
            assert!(
                stats.compared * 3 >= a.len() && stats.ref_rms > 0.0,
                "{name}[{i}]: too few finite values: {stats:?}"
            );
        }
    }
}

#[test]
fn bf16_fused_once_is_no_less_accurate_than_eager_on_elementwise_workloads() {
    for name in ["gelu_tanh", "layer_norm", "softmax"] {
        let (inputs, step) = workload_inputs(name, Size::Tiny, DType::BF16).unwrap();
        let expected = &reference_on(name, &inputs)[0];
        let error = |config: Config| {
            let out = run_step(config, step, &inputs).unwrap().remove(0);
            assert_eq!(out.dtype(), DType::BF16, "{name}: the bf16 path must stay in bf16");
            error_stats(&out.to_f64_vec(), &expected.data)
        };
        let (eager, once) = (error(strict()), error(fused(FusedRounding::Once)));
        assert!(eager.rms > 0.0, "{name}: bf16 Strict equals the f64 reference exactly, so nothing was rounded: {eager:?}");
        assert!(
            once.rms <= eager.rms,
            "{name}: fused `once` RMS error {} exceeds eager bf16's {}",
            once.rms,
            eager.rms
        );
        assert_eq!(
            once.nonfinite_disagree + eager.nonfinite_disagree,
            0,
            "{name}: non-finite values where the reference has none"
        );
    }
}

#[test]
fn per_op_repeats_eager_bit_for_bit() {
    // `per_op` turns pattern lifting off (a lifted GELU, softmax or LayerNorm
    // would round only at its output), so it rounds exactly where eager does.
    let per_op = fused(FusedRounding::PerOp);
    assert!(per_op.rewrite.rule_sets.patterns, "the check is of the default rule sets");
    for name in NAMES {
        let (inputs, step) = workload_inputs(name, Size::Tiny, DType::BF16).unwrap();
        let eager = run_step(strict(), step, &inputs).unwrap();
        let fused = run_step(per_op.clone(), step, &inputs).unwrap();
        for (i, (e, f)) in eager.iter().zip(&fused).enumerate() {
            let (HostData::BF16(e), HostData::BF16(f)) = (e, f) else {
                panic!("{name}[{i}]: outputs are not bf16")
            };
            let differ = e
                .iter()
                .zip(f)
                .filter(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()))
                .count();
            assert_eq!(
                differ,
                0,
                "{name}[{i}]: {differ} of {} elements differ from eager",
                e.len()
            );
        }
    }
}

#[test]
fn error_stats_measure_what_they_say() {
    let reference = [1.0, -2.0, 0.0005, f64::NAN, 4.0];
    let actual = [1.5, -2.0, 0.0015, f64::NAN, f64::INFINITY];
    let s = error_stats(&actual, &reference);
    assert_eq!((s.compared, s.nonfinite_agree, s.nonfinite_disagree), (3, 1, 1));
    assert_eq!(s.max_abs, 0.5);
    // 0.0005 is below the floor, so its relative error of 2 is left out.
    const { assert!(0.0005 < RELATIVE_FLOOR) };
    assert_eq!(s.max_rel, 0.5);
    assert!((s.rms - ((0.25 + 0.0 + 1e-6) / 3.0f64).sqrt()).abs() < 1e-15);
}
