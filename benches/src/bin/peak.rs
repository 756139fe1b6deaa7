//! The arithmetic roofline of one core: GFLOP/s of a stream of independent
//! f32 FMAs and of bf16 dot products (`vdpbf16ps`), nothing else, so the
//! matmul figures of `bf16_matmul.py` and `gemm_table` can be read against
//! what the instructions allow. No kernel that uses them can go faster.
//!
//! Run: taskset -c 0 cargo run --release -p benches --bin peak

use std::time::Instant;

/// Independent accumulators: enough to cover the instructions' latency.
const CHAINS: usize = 12;
const ROUNDS: usize = 20_000_000;

fn main() {
    #[cfg(target_arch = "x86_64")]
    {
        let has = |f: &str| match f {
            "fma" => is_x86_feature_detected!("fma"),
            "avx512f" => is_x86_feature_detected!("avx512f"),
            "avx512bf16" => is_x86_feature_detected!("avx512bf16"),
            _ => false,
        };
        println!("| instruction stream | FLOP per instruction | GFLOP/s, one core |");
        println!("| --- | ---: | ---: |");
        if has("fma") {
            // SAFETY: the CPU has FMA (checked above).
            report("vfmadd231ps ymm (f32 FMA, 8 lanes)", 16, unsafe { fma_ymm() });
        }
        if has("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            report("vfmadd231ps zmm (f32 FMA, 16 lanes)", 32, unsafe { fma_zmm() });
        }
        if has("avx512f") && has("avx512bf16") {
            // SAFETY: the CPU has AVX-512 BF16.
            report("vdpbf16ps zmm (bf16 pairs into f32, 16 lanes)", 64, unsafe { dpbf16_zmm() });
        } else {
            println!("| vdpbf16ps zmm | 64 | not on this CPU |");
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    println!("peak: x86_64 only");
}

fn report(name: &str, flops: usize, seconds: f64) {
    let total = (ROUNDS * CHAINS * flops) as f64;
    println!("| {name} | {flops} | {:.1} |", total / seconds / 1e9);
}

/// The best of three timed runs of `f`.
fn best(mut f: impl FnMut()) -> f64 {
    (0..3)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_ymm() -> f64 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_ps(0.999), _mm256_set1_ps(1e-3));
    best(|| {
        let mut acc = [_mm256_set1_ps(1.0); CHAINS];
        for _ in 0..ROUNDS {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, a, b);
            }
        }
        std::hint::black_box(acc);
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_zmm() -> f64 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_ps(0.999), _mm512_set1_ps(1e-3));
    best(|| {
        let mut acc = [_mm512_set1_ps(1.0); CHAINS];
        for _ in 0..ROUNDS {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        std::hint::black_box(acc);
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dpbf16_zmm() -> f64 {
    use std::arch::x86_64::*;
    // bf16 pairs of small values, so the sums stay finite.
    let pair: __m512bh = std::mem::transmute(_mm512_set1_epi32(0x3c00_3c00));
    best(|| {
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..ROUNDS {
            for x in acc.iter_mut() {
                *x = _mm512_dpbf16_ps(*x, pair, pair);
            }
        }
        std::hint::black_box(acc);
    })
}
