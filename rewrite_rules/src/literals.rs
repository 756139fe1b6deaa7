//! The scalar values the rules must see as literals. A scalar operand the
//! user passes is a runtime parameter of the trace, so that a new learning
//! rate or epsilon compiles nothing; but a rule cannot match a value it
//! cannot see, so the engine records these values as literal constants
//! instead ([`is_rule_literal`]). The rules take their values from here.

use trace_ir::consts::{GELU_TANH_BETA, GELU_TANH_KAPPA};
use trace_ir::DType;

use crate::conditions::is_near;

/// Identities of `mul`, `div`, `add` and `sub` (`algebraic`).
pub const ZERO: f64 = 0.0;
/// See [`ZERO`]; also GELU's `1 + tanh(..)` (`patterns`).
pub const ONE: f64 = 1.0;
/// GELU's outer `0.5 * x` (`patterns`).
pub const HALF: f64 = 0.5;
/// The exponent of `pow(x, 2)` in RMSNorm written with `pow` (`patterns`).
pub const TWO: f64 = 2.0;
/// The exponent of `pow(x, 3)` in GELU written with `pow` (`patterns`).
pub const THREE: f64 = 3.0;

/// Values matched exactly, and the negatives of the exponents and scales,
/// which constant folding turns into them (`x * -1 * -1`, `pow(pow(x, -2), -0.5)`).
const EXACT: [f64; 8] = [ZERO, ONE, HALF, TWO, THREE, -ONE, -HALF, -TWO];

/// Values matched up to rounding ([`crate::conditions::near`]): users write
/// GELU's constants to various numbers of digits (`0.7978845608`).
pub const NEAR: [f64; 2] = [GELU_TANH_BETA, GELU_TANH_KAPPA];

/// Whether a scalar operand of value `v`, converted to `dtype`, must be
/// recorded as a literal constant for the rules to see it: with the
/// tolerance of [`crate::conditions::near`], so that no value a rule would
/// match hides in a parameter.
pub fn is_rule_literal(v: f64, dtype: DType) -> bool {
    EXACT.contains(&v) || NEAR.iter().any(|&t| is_near(v, t, dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_users_write_are_literals_and_others_are_not() {
        for v in [0.0, 1.0, 0.5, 2.0, 3.0, -1.0, 0.044715, 0.7978845608, 0.7978845608028654] {
            assert!(is_rule_literal(v, DType::F32), "{v}");
        }
        for v in [1e-3, 1e-5, 0.9, 0.999, 4.0, 0.1, 0.8, 0.045] {
            assert!(!is_rule_literal(v, DType::F32), "{v}");
        }
        // bf16 rounds sqrt(2/pi) to 0.796875: a rule on bf16 values matches that.
        assert!(is_rule_literal(0.796875, DType::BF16));
    }
}
