//! The error function in f64, for GELU's exact form. Rust's std has no erf, so
//! this is W. J. Cody's rational Chebyshev approximation (the SPECFUN `CALERF`
//! routine, "Rational Chebyshev approximations for the error function", Math.
//! Comp. 1969), accurate to about 1e-16 relative over the whole real line.
//! `erfc` is computed directly (not as `1 - erf`), so GELU keeps its relative
//! accuracy far into the negative tail.

// The coefficients are Cody's, to the digits published.
#![allow(clippy::excessive_precision)]

const SQRPI: f64 = 5.641_895_835_477_562_9e-1; // 1 / sqrt(pi)
const THRESH: f64 = 0.46875;
const XBIG: f64 = 26.543;

const A: [f64; 5] = [
    3.161_123_743_870_565_6e00,
    1.138_641_541_510_501_6e02,
    3.774_852_376_853_020_2e02,
    3.209_377_589_138_469_5e03,
    1.857_777_061_846_031_5e-1,
];
const B: [f64; 4] = [
    2.360_129_095_234_412_1e01,
    2.440_246_379_344_441_7e02,
    1.282_616_526_077_372_3e03,
    2.844_236_833_439_170_6e03,
];
const C: [f64; 9] = [
    5.641_884_969_886_700_9e-1,
    8.883_149_794_388_376e00,
    6.611_919_063_714_163e01,
    2.986_351_381_974_001_3e02,
    8.819_522_212_417_691e02,
    1.712_047_612_634_070_6e03,
    2.051_078_377_826_071_5e03,
    1.230_339_354_797_997_2e03,
    2.153_115_354_744_038_5e-8,
];
const D: [f64; 8] = [
    1.574_492_611_070_983_5e01,
    1.176_939_508_913_125e02,
    5.371_811_018_620_098_6e02,
    1.621_389_574_566_690_2e03,
    3.290_799_235_733_459_6e03,
    4.362_619_090_143_247e03,
    3.439_367_674_143_721_6e03,
    1.230_339_354_803_749_4e03,
];
const P: [f64; 6] = [
    3.053_266_349_612_323_4e-1,
    3.603_448_999_498_044_4e-1,
    1.257_817_261_112_292_5e-1,
    1.608_378_514_874_227_7e-2,
    6.587_491_615_298_378e-4,
    1.631_538_713_730_209_8e-2,
];
const Q: [f64; 5] = [
    2.568_520_192_289_822_4e00,
    1.872_952_849_923_467_3e00,
    5.279_051_029_514_284e-1,
    6.051_834_131_244_132e-2,
    2.335_204_976_268_691_8e-3,
];

/// erf(x) for |x| <= THRESH.
fn erf_small(x: f64) -> f64 {
    let z = x * x;
    let mut num = A[4] * z;
    let mut den = z;
    for i in 0..3 {
        num = (num + A[i]) * z;
        den = (den + B[i]) * z;
    }
    x * (num + A[3]) / (den + B[3])
}

/// exp(-y*y) with the square split so the exponent keeps its precision.
fn exp_neg_sq(y: f64) -> f64 {
    let ysq = (y * 16.0).trunc() / 16.0;
    let del = (y - ysq) * (y + ysq);
    (-ysq * ysq).exp() * (-del).exp()
}

/// erfc(y) for y > THRESH.
fn erfc_large(y: f64) -> f64 {
    if y >= XBIG {
        return 0.0;
    }
    let r = if y <= 4.0 {
        let mut num = C[8] * y;
        let mut den = y;
        for i in 0..7 {
            num = (num + C[i]) * y;
            den = (den + D[i]) * y;
        }
        (num + C[7]) / (den + D[7])
    } else {
        let z = 1.0 / (y * y);
        let mut num = P[5] * z;
        let mut den = z;
        for i in 0..4 {
            num = (num + P[i]) * z;
            den = (den + Q[i]) * z;
        }
        let r = z * (num + P[4]) / (den + Q[4]);
        (SQRPI - r) / y
    };
    exp_neg_sq(y) * r
}

/// The error function.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let y = x.abs();
    if y <= THRESH {
        erf_small(x)
    } else {
        let r = 1.0 - erfc_large(y);
        if x < 0.0 {
            -r
        } else {
            r
        }
    }
}

/// The complementary error function, `1 - erf(x)`, accurate in both tails.
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let y = x.abs();
    if y <= THRESH {
        return 1.0 - erf_small(x);
    }
    let r = erfc_large(y);
    if x < 0.0 {
        2.0 - r
    } else {
        r
    }
}
