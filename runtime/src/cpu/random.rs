//! Source ops: `full`, `arange` and `random`.
//!
//! # The random stream (every backend must reproduce it)
//!
//! Element `i` (row-major flat index) of `Random { seed, dist, dtype }` is a
//! pure function of `(seed, i)`:
//!
//! ```text
//! bits(s)      = splitmix64(seed ^ s.wrapping_mul(0x9E37_79B9_7F4A_7C15))
//! splitmix64(x): z = x + 0x9E37_79B9_7F4A_7C15            (wrapping)
//!                z = (z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9 (wrapping)
//!                z = (z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB (wrapping)
//!                z ^ (z >> 31)
//! u(s, p)      = (bits(s) >> (64 - p)) as f64 * 2^-p        (p top bits, in [0, 1))
//! ```
//!
//! - Uniform: `u(i, p)` where `p` is the dtype's significand width (24 for f32,
//!   11 for f16, 8 for bf16). The value is exact in the dtype, so it stays
//!   in `[0, 1)` (rounding 24 bits to bf16 could give 1.0).
//! - Normal: Box–Muller on the streams `2i` and `2i + 1`, in f64:
//!   `sqrt(-2 ln(1 - u(2i, 24))) * cos(2 pi u(2i + 1, 24))`, rounded to f32
//!   and then to the dtype.

use half::{bf16, f16};
use trace_ir::{DType, Distribution, Error, Result};

use super::elem::build;
use crate::host_data::HostData;

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function for the state `x` (after its increment).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The random bits of stream `s` under `seed`.
pub fn random_bits(seed: u64, s: u64) -> u64 {
    splitmix64(seed ^ s.wrapping_mul(GOLDEN))
}

/// The top `p` bits of stream `s` as a uniform value in `[0, 1)`.
pub fn uniform(seed: u64, s: u64, p: u32) -> f64 {
    (random_bits(seed, s) >> (64 - p)) as f64 * (-(p as f64)).exp2()
}

/// Element `i` of a standard normal draw.
pub fn normal(seed: u64, i: u64) -> f32 {
    let u1 = uniform(seed, i.wrapping_mul(2), 24);
    let u2 = uniform(seed, i.wrapping_mul(2).wrapping_add(1), 24);
    ((-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// `f(i)` for every `i < n`, built in parallel chunks.
fn generate<T: Default + Clone + Send + 'static>(
    n: usize,
    f: impl Fn(u64) -> T + Sync + Send,
) -> Vec<T> {
    build(n, |start, out: &mut [T]| {
        for (k, o) in out.iter_mut().enumerate() {
            *o = f((start + k) as u64);
        }
    })
}

pub(crate) fn random(seed: u64, dist: Distribution, dtype: DType, n: usize) -> Result<HostData> {
    Ok(match (dist, dtype) {
        (Distribution::Uniform, DType::F32) => {
            HostData::F32(generate(n, |i| uniform(seed, i, 24) as f32))
        }
        (Distribution::Uniform, DType::F16) => {
            HostData::F16(generate(n, |i| f16::from_f64(uniform(seed, i, 11))))
        }
        (Distribution::Uniform, DType::BF16) => {
            HostData::BF16(generate(n, |i| bf16::from_f64(uniform(seed, i, 8))))
        }
        (Distribution::Normal, DType::F32) => HostData::F32(generate(n, |i| normal(seed, i))),
        (Distribution::Normal, DType::F16) => {
            HostData::F16(generate(n, |i| f16::from_f32(normal(seed, i))))
        }
        (Distribution::Normal, DType::BF16) => {
            HostData::BF16(generate(n, |i| bf16::from_f32(normal(seed, i))))
        }
        (_, d) => return Err(Error::dtype("random", "random values need a floating dtype", &[d])),
    })
}

/// `start + i * step` for `i < len`, computed in f64 and converted to `dtype`
/// as [`HostData::filled`] converts its value. Built as the random draws
/// are (in parallel, into a cached allocation when one fits): the index
/// vector of every device draw is one.
pub(crate) fn arange(start: f64, step: f64, len: usize, dtype: DType) -> HostData {
    let v = move |i: u64| start + i as f64 * step;
    match dtype {
        DType::Bool => HostData::Bool(generate(len, move |i| v(i) != 0.0)),
        DType::I32 => HostData::I32(generate(len, move |i| v(i) as i32)),
        DType::I64 => HostData::I64(generate(len, move |i| v(i) as i64)),
        DType::BF16 => HostData::BF16(generate(len, move |i| bf16::from_f64(v(i)))),
        DType::F16 => HostData::F16(generate(len, move |i| f16::from_f64(v(i)))),
        DType::F32 => HostData::F32(generate(len, move |i| v(i) as f32)),
    }
}
