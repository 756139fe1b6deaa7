//! Numeric constants that more than one crate writes into its code: the
//! GELU constants appear in the CPU reference kernels, the fused kernels,
//! the StableHLO lowering and the rewrite rule that recognizes GELU written
//! out, and all four must agree on them. They are given in f64; the f32
//! kernels and the lowering round them once (`as f32`).

/// `sqrt(2 / pi)`, the scale inside the tanh of GELU's tanh approximation
/// (PyTorch's `approximate="tanh"`): `0.5 x (1 + tanh(GELU_TANH_BETA (x +
/// GELU_TANH_KAPPA x^3)))`.
pub const GELU_TANH_BETA: f64 = 0.797_884_560_802_865_4;

/// The cubic coefficient of GELU's tanh approximation (see
/// [`GELU_TANH_BETA`]).
pub const GELU_TANH_KAPPA: f64 = 0.044_715;

/// `1 / sqrt(2)`, which scales the argument of the erf in GELU's exact
/// form, `0.5 x (1 + erf(x GELU_ERF_SCALE))`.
pub const GELU_ERF_SCALE: f64 = std::f64::consts::FRAC_1_SQRT_2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_constants_are_what_they_say() {
        let beta = (2.0 / std::f64::consts::PI).sqrt();
        assert!((GELU_TANH_BETA - beta).abs() <= f64::EPSILON, "{GELU_TANH_BETA} vs {beta}");
        assert!((GELU_ERF_SCALE - 0.5f64.sqrt()).abs() <= f64::EPSILON, "{GELU_ERF_SCALE}");
    }

    /// The kernels computed with f32 literals before these constants were
    /// shared; rounding the f64 values gives the same f32 bits, so no
    /// kernel's results changed.
    #[test]
    fn rounded_to_f32_they_are_the_f32_literals() {
        assert_eq!((GELU_TANH_BETA as f32).to_bits(), 0.797_884_6f32.to_bits());
        assert_eq!((GELU_TANH_KAPPA as f32).to_bits(), 0.044_715f32.to_bits());
        assert_eq!((GELU_ERF_SCALE as f32).to_bits(), std::f32::consts::FRAC_1_SQRT_2.to_bits());
    }
}
