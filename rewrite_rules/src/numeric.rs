//! How values are rounded, so that folding computes what the kernels would.
//!
//! The reference backend stores a `full` literal by converting its f64 value
//! to the dtype once; kernels compute in f32 (integers exactly) and round once
//! to the output dtype. A folded constant must be exactly what that
//! computation stores.

use half::{bf16, f16};
use trace_ir::DType;

/// The value a `full` literal of `dtype` holds at run time.
pub fn stored_value(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::Bool => (v != 0.0) as u8 as f64,
        DType::I32 => v as i32 as f64,
        DType::I64 => v as i64 as f64,
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::F32 => v as f32 as f64,
    }
}

/// The largest integer magnitude below which f64 arithmetic on integers is
/// exact; integer folds outside it are left to the kernels (which wrap).
const EXACT_INT: f64 = 4_503_599_627_370_496.0; // 2^52

/// The value a kernel stores for the exact result `v` of one arithmetic step
/// in `dtype`, or `None` when folding could disagree with the kernel.
///
/// Floats: f64 then f32 rounding of `+ - * /` and `sqrt` equals one f32
/// rounding (53 >= 2 * 24 + 2 bits), and bf16/f16 kernels round that f32
/// once more, which the second step here repeats. Integers: only results
/// that are exact and in range, so overflow semantics never matter.
pub fn kernel_result(dtype: DType, v: f64) -> Option<f64> {
    let in_range = |lo: f64, hi: f64| v.fract() == 0.0 && v.abs() < EXACT_INT && v >= lo && v <= hi;
    match dtype {
        DType::Bool => None,
        DType::I32 => in_range(i32::MIN as f64, i32::MAX as f64).then_some(v),
        DType::I64 => in_range(i64::MIN as f64, i64::MAX as f64).then_some(v),
        DType::F32 => Some(v as f32 as f64),
        DType::BF16 => Some(bf16::from_f32(v as f32).to_f64()),
        DType::F16 => Some(f16::from_f32(v as f32).to_f64()),
    }
}

/// The value of `cast(v, to)` for a `v` held in dtype `from`, with the
/// reference backend's semantics: float to int truncates (saturating, NaN to
/// 0), int to int wraps, anything to bool is `!= 0`, and everything reaches
/// bf16/f16 through f32. `None` for integers too large to be exact in f64.
pub fn cast_value(v: f64, from: DType, to: DType) -> Option<f64> {
    if !from.is_float() && v.abs() >= EXACT_INT {
        return None;
    }
    Some(match to {
        DType::Bool => (v != 0.0) as u8 as f64,
        DType::I32 if from.is_float() => v as i32 as f64,
        DType::I32 => v as i64 as i32 as f64,
        DType::I64 => v as i64 as f64,
        DType::F32 => v as f32 as f64,
        DType::BF16 => bf16::from_f32(v as f32).to_f64(),
        DType::F16 => f16::from_f32(v as f32).to_f64(),
    })
}

/// The rounding unit of a dtype: literal constants written by users are
/// compared with this much relative slack, since `0.7978845608` becomes
/// `0.796875` in bf16.
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_follows_the_kernels() {
        assert_eq!(stored_value(DType::F32, 0.1), 0.1f32 as f64);
        assert_eq!(stored_value(DType::I32, -2.7), -2.0);
        assert_eq!(stored_value(DType::Bool, f64::NAN), 1.0);
        assert_eq!(kernel_result(DType::BF16, 1.0 + 1.0 / 512.0), Some(1.0));
        assert_eq!(kernel_result(DType::I32, 3e9), None);
        assert_eq!(kernel_result(DType::I64, 0.5), None);
        assert_eq!(cast_value(3e9, DType::I64, DType::I32), Some(3e9 as i64 as i32 as f64));
        assert_eq!(cast_value(3e9, DType::F32, DType::I32), Some(i32::MAX as f64));
        assert_eq!(cast_value(f64::NAN, DType::F32, DType::I64), Some(0.0));
        assert_eq!(cast_value(1e10, DType::F32, DType::F16), Some(f64::INFINITY));
    }
}
