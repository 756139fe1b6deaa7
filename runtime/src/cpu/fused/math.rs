//! Branch-free f32 approximations of the transcendentals, written so that a
//! loop over a slice auto-vectorizes (selects instead of branches, integer
//! bit tricks instead of library calls). Each function is generic over
//! `FMA`: with it (the AVX2 and AVX-512 code paths, and aarch64) every
//! polynomial step is one fused multiply-add, which is both faster and more
//! accurate; without it (x86-64 without FMA) it is a multiply and an add.
//! The bounds below hold for both, and the tests check both.
//!
//! Every bound below is measured by `tests::*` against f64 `std` over a dense
//! sweep of the stated range (see the tests for the sweeps); "rel" is
//! `|approx - exact| / |exact|`, "abs" is `|approx - exact|`.
//! `sin`, `cos` and `pow` call `std` (correctly rounded to within an ulp).

// The coefficients are given to the digits published.
#![allow(clippy::excessive_precision)]

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so `n * LN2_HI` is exact for |n| < 2^15 (Cody and Waite).
const LN2_HI: f32 = 0.693_359_375;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
const ROUNDER: f32 = 12_582_912.0;

/// The relative error bound each unary op's fused f32 form is documented
/// (and tested, below) to keep; ops the kernels compute with a correctly
/// rounded instruction or `std` call get `None`. The differential checker
/// perturbs each op of the reference by this much, so that it allows the
/// differences these bounds permit and no more.
pub fn rel_error_bound(op: trace_ir::UnaryOp) -> Option<f64> {
    use trace_ir::UnaryOp::*;
    match op {
        Exp => Some(2.5e-7),
        Log => Some(2e-7),
        Tanh => Some(5e-7),
        Sigmoid => Some(3e-7),
        Silu => Some(4e-7),
        // gelu_tanh: 5e-6 on [-5, -3], where |value| < 0.02 so the absolute
        // error stays below 1e-7 (see `gelu_tanh`).
        GeluTanh | GeluErf => Some(1e-6),
        Neg | Abs | Sqrt | Rsqrt | Reciprocal | Relu | Sin | Cos | Floor | Sign | LogicalNot => {
            None
        }
    }
}

/// `a * b + c`, fused when `FMA`. (On a CPU without FMA, `mul_add` would be
/// a library call per element, so the choice is the code path's.)
#[inline(always)]
fn ma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// The polynomial with coefficients `c`, highest degree first, at `x` (Horner).
#[inline(always)]
fn poly<const FMA: bool, const N: usize>(x: f32, c: [f32; N]) -> f32 {
    c[1..].iter().fold(c[0], |acc, &ci| ma::<FMA>(acc, x, ci))
}

/// `e^x`. Rel error ≤ 2.5e-7 for x in [-87, 88] (normal results); overflows
/// to +inf above ln(f32::MAX), underflows through the subnormals to 0, NaN
/// stays NaN. Cephes' `expf` polynomial after Cody–Waite reduction.
#[inline(always)]
pub fn exp<const FMA: bool>(x: f32) -> f32 {
    // Clamp (NaN passes through both comparisons untouched).
    let xc = if x > 88.8 { 88.8 } else { x };
    let xc = if xc < -104.0 { -104.0 } else { xc };
    let t = ma::<FMA>(xc, LOG2E, ROUNDER);
    let n = t - ROUNDER;
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let r = ma::<FMA>(-n, LN2_LO, ma::<FMA>(-n, LN2_HI, xc));
    let z = r * r;
    let p = poly::<FMA, 6>(
        r,
        [
            1.987_569_15e-4,
            1.398_199_95e-3,
            8.333_451_9e-3,
            4.166_579_6e-2,
            1.666_666_55e-1,
            5.000_000_1e-1,
        ],
    );
    let y = ma::<FMA>(p, z, r) + 1.0;
    // 2^n as two factors, so results near the subnormal range stay exact in
    // the exponent and overflow still becomes +inf.
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    let s1 = f32::from_bits((n1.wrapping_add(127) << 23) as u32);
    let s2 = f32::from_bits((n2.wrapping_add(127) << 23) as u32);
    let out = y * s1 * s2;
    if x.is_nan() {
        x
    } else {
        out
    }
}

/// Natural logarithm. Rel error ≤ 2e-7 over the positive normal and
/// subnormal range (abs ≤ 1e-7 near x = 1, where ln x → 0); ln 0 = -inf,
/// negative → NaN, NaN stays NaN, ln inf = inf. Cephes' `logf` polynomial.
#[inline(always)]
pub fn ln<const FMA: bool>(x: f32) -> f32 {
    let sub = x < f32::MIN_POSITIVE;
    let xs = if sub { x * 8_388_608.0 } else { x };
    let bits = xs.to_bits() as i32;
    let e0 = ((bits >> 23) & 0xff) - 127 - if sub { 23 } else { 0 };
    let m0 = f32::from_bits(((bits & 0x007f_ffff) | 0x3f80_0000) as u32);
    let big = m0 > std::f32::consts::SQRT_2;
    let m = if big { m0 * 0.5 } else { m0 };
    let e = (e0 + big as i32) as f32;
    let f = m - 1.0;
    let z = f * f;
    let c = [
        7.037_683_6e-2,
        -1.151_461_03e-1,
        1.167_699_87e-1,
        -1.242_014_08e-1,
        1.424_932_28e-1,
        -1.666_805_77e-1,
        2.000_071_48e-1,
        -2.499_999_4e-1,
        3.333_333_1e-1,
    ];
    let p = poly::<FMA, 9>(f, c) * f * z;
    let y = p + e * LN2_LO - 0.5 * z;
    let out = f + y + e * LN2_HI;
    if x == 0.0 {
        f32::NEG_INFINITY
    } else if x.is_nan() {
        x
    } else if x < 0.0 {
        // The NaN an invalid x86 operation produces, as the library `logf` returns.
        f32::from_bits(0xFFC0_0000)
    } else if x == f32::INFINITY {
        x
    } else {
        out
    }
}

/// Hyperbolic tangent. Rel error ≤ 5e-7 everywhere (|x| < 0.625 uses Cephes'
/// odd polynomial, so tiny inputs keep full relative accuracy; above, `1 -
/// 2 / (e^{2|x|} + 1)`); NaN stays NaN.
#[inline(always)]
pub fn tanh<const FMA: bool>(x: f32) -> f32 {
    let a = x.abs();
    let z = x * x;
    let p = poly::<FMA, 5>(
        z,
        [-5.704_988_7e-3, 2.063_908_9e-2, -5.373_971_6e-2, 1.333_144_2e-1, -3.333_328_2e-1],
    );
    let small = ma::<FMA>(p * z, x, x);
    let big = 1.0 - 2.0 / (exp::<FMA>(2.0 * a) + 1.0);
    let big = if x < 0.0 { -big } else { big };
    if a < 0.625 || x.is_nan() {
        small
    } else {
        big
    }
}

/// `1 / (1 + e^-x)`. Rel error ≤ 3e-7 where the result is normal.
#[inline(always)]
pub fn sigmoid<const FMA: bool>(x: f32) -> f32 {
    1.0 / (1.0 + exp::<FMA>(-x))
}

/// `x * sigmoid(x)`. Rel error ≤ 4e-7.
#[inline(always)]
pub fn silu<const FMA: bool>(x: f32) -> f32 {
    x * sigmoid::<FMA>(x)
}

const GELU_BETA: f32 = trace_ir::consts::GELU_TANH_BETA as f32;
const GELU_KAPPA: f32 = trace_ir::consts::GELU_TANH_KAPPA as f32;

/// PyTorch's tanh GELU, `0.5 x (1 + tanh(u))` with `u = sqrt(2/pi) (x +
/// 0.044715 x^3)`, computed as `x * sigmoid(2u)` (the same function, without
/// the cancellation of `1 + tanh(u)` for negative x). Against the f64
/// formula: rel error ≤ 1e-6 for x ≥ -3, ≤ 5e-6 on [-5, -3] (the rounding of
/// the f32 argument `2u` is amplified by `e^{-2u}` there), abs error ≤ 1e-10
/// below -5 (|value| < 1e-5).
#[inline(always)]
pub fn gelu_tanh<const FMA: bool>(x: f32) -> f32 {
    let u = GELU_BETA * ma::<FMA>(GELU_KAPPA * x * x, x, x);
    x / (1.0 + exp::<FMA>(-2.0 * u))
}

/// The error function: a [13/8] odd/even rational approximation on [-4, 4]
/// (Eigen's `generic_fast_erf_float`), ±1 outside. Abs and rel error
/// ≤ 5e-7 everywhere (4.5e-7 measured, near |x| = 3.9).
#[inline(always)]
pub fn erf<const FMA: bool>(x: f32) -> f32 {
    let xc = if x > 4.0 { 4.0 } else { x };
    let xc = if xc < -4.0 { -4.0 } else { xc };
    let x2 = xc * xc;
    let p = poly::<FMA, 7>(
        x2,
        [
            -2.726_142_3e-10,
            2.770_681_4e-8,
            -2.101_024e-6,
            -5.692_506_4e-5,
            -7.349_906_3e-4,
            -2.954_600_2e-3,
            -1.609_603_3e-2,
        ],
    );
    let q = poly::<FMA, 5>(
        x2,
        [-1.456_607_2e-5, -2.133_740_6e-4, -1.682_827e-3, -7.373_329_2e-3, -1.426_474e-2],
    );
    xc * p / q
}

/// Exact-form GELU, `0.5 x (1 + erf(x / sqrt 2))`, written as `0.5 x
/// erfc(-x / sqrt 2)` so the negative tail keeps its relative accuracy.
/// `erfc(z) = t exp(-z^2 + P(t))` with `t = 1 / (1 + z/2)` (the Chebyshev
/// fit of Numerical Recipes' `erfcc`, fractional error < 1.2e-7), and
/// `exp(-x^2/2)` evaluated from an exact split of `x^2` so large arguments
/// lose nothing to rounding. Rel error ≤ 1e-6 wherever the value is normal
/// (measured 4.8e-7, over [-13, 10]); ±inf and NaN follow the f64 reference.
#[inline(always)]
pub fn gelu_erf<const FMA: bool>(x: f32) -> f32 {
    let a = x.abs();
    let z = a * trace_ir::consts::GELU_ERF_SCALE as f32;
    let t = 1.0 / (1.0 + 0.5 * z);
    let c = [
        0.170_872_77,
        -0.822_152_23,
        1.488_515_87,
        -1.135_203_98,
        0.278_868_07,
        -0.186_288_06,
        0.096_784_18,
        0.374_091_96,
        1.000_023_7,
        -1.265_512_2,
    ];
    let p = poly::<FMA, 10>(t, c);
    // z^2 = a^2 / 2 with a = ah + al, ah holding 12 significant bits so ah^2 is exact.
    let ah = f32::from_bits(a.to_bits() & 0xFFFF_F000);
    let cross = if a.is_finite() { 0.5 * (a - ah) * (a + ah) } else { 0.0 };
    let tail = t * exp::<FMA>(-0.5 * (ah * ah)) * exp::<FMA>(p - cross);
    let e = if x < 0.0 { tail } else { 2.0 - tail };
    0.5 * x * e
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::consts::{GELU_ERF_SCALE, GELU_TANH_KAPPA};
    use trace_ir::UnaryOp::*;

    fn bound(op: trace_ir::UnaryOp) -> f64 {
        rel_error_bound(op).expect("an approximated op")
    }

    /// `count` points evenly spaced over `[lo, hi]`, plus their neighbours.
    fn sweep(lo: f64, hi: f64, count: usize) -> impl Iterator<Item = f32> {
        (0..=count).map(move |i| (lo + (hi - lo) * i as f64 / count as f64) as f32)
    }

    fn max_rel(
        f: impl Fn(f32) -> f32,
        exact: impl Fn(f64) -> f64,
        xs: impl Iterator<Item = f32>,
    ) -> (f64, f32) {
        let mut worst = (0.0f64, 0.0f32);
        for x in xs {
            let e = exact(x as f64);
            if e == 0.0 || !e.is_finite() || e.abs() < f32::MIN_POSITIVE as f64 {
                continue;
            }
            let err = ((f(x) as f64 - e) / e).abs();
            if err > worst.0 {
                worst = (err, x);
            }
        }
        worst
    }

    fn max_abs(
        f: impl Fn(f32) -> f32,
        exact: impl Fn(f64) -> f64,
        xs: impl Iterator<Item = f32>,
    ) -> (f64, f32) {
        let mut worst = (0.0f64, 0.0f32);
        for x in xs {
            let err = (f(x) as f64 - exact(x as f64)).abs();
            if err > worst.0 {
                worst = (err, x);
            }
        }
        worst
    }

    #[test]
    fn exp_error_bound() {
        exp_error_bound_with::<false>();
        exp_error_bound_with::<true>();
    }

    fn exp_error_bound_with<const F: bool>() {
        let (e, at) = max_rel(exp::<F>, f64::exp, sweep(-87.0, 88.0, 2_000_000));
        assert!(e <= bound(Exp), "exp rel err {e} at {at}");
        assert!(exp::<F>(f32::NAN).is_nan());
        assert_eq!(exp::<F>(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp::<F>(89.0), f32::INFINITY);
        assert_eq!(exp::<F>(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp::<F>(0.0), 1.0);
        // Subnormal results are close in absolute terms.
        assert!((exp::<F>(-100.0) as f64 - (-100.0f64).exp()).abs() < 1e-44);
    }

    #[test]
    fn ln_error_bound() {
        ln_error_bound_with::<false>();
        ln_error_bound_with::<true>();
    }

    fn ln_error_bound_with<const F: bool>() {
        let (e, at) = max_rel(
            ln::<F>,
            f64::ln,
            sweep(1e-6, 4.0, 2_000_000).filter(|x| (x - 1.0).abs() > 1e-3),
        );
        assert!(e <= bound(Log), "ln rel err {e} at {at}");
        let (e, at) = max_rel(ln::<F>, f64::ln, (0..2000).map(|i| 2f32.powi(i / 10 - 140) * 1.37));
        assert!(e <= bound(Log), "ln rel err {e} at {at} (wide range)");
        let (e, at) = max_abs(ln::<F>, f64::ln, sweep(0.999, 1.001, 100_000));
        assert!(e <= 1e-7, "ln abs err {e} at {at} near 1");
        assert_eq!(ln::<F>(0.0), f32::NEG_INFINITY);
        assert!(ln::<F>(-1.0).is_nan() && ln::<F>(f32::NAN).is_nan());
        assert_eq!(ln::<F>(f32::INFINITY), f32::INFINITY);
        assert_eq!(ln::<F>(1.0), 0.0);
    }

    #[test]
    fn tanh_error_bound() {
        tanh_error_bound_with::<false>();
        tanh_error_bound_with::<true>();
    }

    fn tanh_error_bound_with<const F: bool>() {
        let (e, at) = max_rel(tanh::<F>, f64::tanh, sweep(-12.0, 12.0, 2_000_000));
        assert!(e <= bound(Tanh), "tanh rel err {e} at {at}");
        let (e, at) = max_rel(tanh::<F>, f64::tanh, sweep(-1e-3, 1e-3, 100_000));
        assert!(e <= bound(Tanh), "tanh rel err {e} at {at} near 0");
        assert!(tanh::<F>(f32::NAN).is_nan());
        assert_eq!(tanh::<F>(f32::INFINITY), 1.0);
        assert_eq!(tanh::<F>(f32::NEG_INFINITY), -1.0);
    }

    #[test]
    fn sigmoid_silu_error_bounds() {
        sigmoid_silu_error_bounds_with::<false>();
        sigmoid_silu_error_bounds_with::<true>();
    }

    fn sigmoid_silu_error_bounds_with<const F: bool>() {
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        let (e, at) = max_rel(sigmoid::<F>, sig, sweep(-80.0, 80.0, 1_000_000));
        assert!(e <= bound(Sigmoid), "sigmoid rel err {e} at {at}");
        let (e, at) = max_rel(silu::<F>, |x| x * sig(x), sweep(-80.0, 80.0, 1_000_000));
        assert!(e <= bound(Silu), "silu rel err {e} at {at}");
    }

    #[test]
    fn gelu_error_bounds() {
        gelu_error_bounds_with::<false>();
        gelu_error_bounds_with::<true>();
    }

    fn gelu_error_bounds_with<const F: bool>() {
        // 0.5 (1 + tanh u) = 1 / (1 + e^{-2u}), without f64's own cancellation.
        let exact_tanh = |x: f64| {
            let u = (2.0f64 / std::f64::consts::PI).sqrt() * (x + GELU_TANH_KAPPA * x * x * x);
            x / (1.0 + (-2.0 * u).exp())
        };
        let (e, at) = max_rel(gelu_tanh::<F>, exact_tanh, sweep(-3.0, 12.0, 1_000_000));
        assert!(e <= bound(GeluTanh), "gelu_tanh rel err {e} at {at}");
        let (e, at) = max_rel(gelu_tanh::<F>, exact_tanh, sweep(-5.0, -3.0, 1_000_000));
        assert!(e <= 5e-6, "gelu_tanh rel err {e} at {at}");
        // Further out the f32 argument's own rounding dominates; the values are tiny.
        let (e, at) = max_abs(gelu_tanh::<F>, exact_tanh, sweep(-20.0, -5.0, 1_000_000));
        assert!(e <= 1e-10, "gelu_tanh abs err {e} at {at}");
        let exact_erf = |x: f64| 0.5 * x * crate::cpu::erf::erfc(-x * GELU_ERF_SCALE);
        let (e, at) = max_rel(gelu_erf::<F>, exact_erf, sweep(-13.0, 10.0, 2_000_000));
        assert!(e <= bound(GeluErf), "gelu_erf rel err {e} at {at}");
        assert!(gelu_erf::<F>(f32::NAN).is_nan() && gelu_erf::<F>(f32::NEG_INFINITY).is_nan());
        assert_eq!(gelu_erf::<F>(f32::INFINITY), f32::INFINITY);
        assert_eq!(gelu_erf::<F>(-20.0), 0.0);
    }

    #[test]
    fn erf_error_bound() {
        erf_error_bound_with::<false>();
        erf_error_bound_with::<true>();
    }

    fn erf_error_bound_with<const F: bool>() {
        let (e, at) = max_abs(erf::<F>, crate::cpu::erf::erf, sweep(-8.0, 8.0, 2_000_000));
        assert!(e <= 5e-7, "erf abs err {e} at {at}");
        let (e, at) = max_rel(erf::<F>, crate::cpu::erf::erf, sweep(-8.0, 8.0, 2_000_000));
        assert!(e <= 5e-7, "erf rel err {e} at {at}");
    }
}
