//! bf16 matrix products on the CPU's bf16 dot-product unit.
//!
//! AVX-512 BF16's `vdpbf16ps` multiplies two pairs of bf16 values per f32
//! lane and adds both products to an f32 accumulator: twice the
//! multiply-adds of an f32 FMA per instruction, with no widening pass over
//! the operands. The products of bf16 values are exact in f32 and the sums
//! accumulate in f32, as PyTorch's bf16 matmul does; only the order of the
//! additions differs (pairs first).
//!
//! Layout, as the instruction wants it: `b` is packed once per product into
//! panels of 32 columns where each 32-bit slot holds rows `2p` and `2p + 1`
//! of one column; `a` is packed per block of 8 rows the same way, one slot
//! per row and pair, broadcast to all lanes. The micro-kernel keeps an
//! 8 x 32 block of the output in 16 registers over the whole `k`.

use half::bf16;
use rayon::prelude::*;

/// Rows of the micro-kernel's output block.
const MR: usize = 8;
/// Columns of the micro-kernel's output block (two 16-lane registers).
const NR: usize = 32;
/// Products larger than this many multiply-adds split their row blocks over the cores.
const PAR_FLOPS: usize = 1 << 21;

/// True when this CPU has the instruction (checked once).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// A strided matrix operand: elements, offset of element (0, 0), row and column strides.
#[derive(Clone, Copy)]
pub(crate) struct Operand<'a> {
    pub data: &'a [bf16],
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
}

impl Operand<'_> {
    #[inline(always)]
    fn bits(&self, i: usize, j: usize) -> u32 {
        self.data[self.offset + i * self.rows + j * self.cols].to_bits() as u32
    }
}

/// `dst[m, n] = a[m, k] @ b[k, n]`, row-major `dst`, accumulated in f32.
///
/// # Panics
/// If [`available`] is false, or an operand view leaves its buffer.
pub(crate) fn gemm(
    dst: &mut [f32],
    a: Operand<'_>,
    b: Operand<'_>,
    (m, k, n): (usize, usize, usize),
) {
    assert!(available(), "bf16_gemm::gemm needs AVX-512 BF16");
    assert_eq!(dst.len(), m * n);
    if m == 0 || n == 0 {
        return;
    }
    let pairs = k.div_ceil(2);
    let packed_b = pack_b(b, pairs, k, n);
    let block = |(rb, rows): (usize, &mut [f32])| {
        let i0 = rb * MR;
        let mr = MR.min(m - i0);
        let packed_a = pack_a(a, i0, mr, pairs, k);
        for (cb, panel) in packed_b.chunks_exact(pairs * NR).enumerate() {
            let j0 = cb * NR;
            let mut tile = [[0.0f32; NR]; MR];
            // SAFETY: the CPU has AVX-512 BF16 (asserted above); the packed
            // blocks hold `pairs` steps of MR and NR slots.
            unsafe { micro_kernel(&packed_a, panel, pairs, &mut tile) };
            let nr = NR.min(n - j0);
            for (r, row) in tile.iter().enumerate().take(mr) {
                rows[r * n + j0..r * n + j0 + nr].copy_from_slice(&row[..nr]);
            }
        }
    };
    let chunks = dst.chunks_mut(MR * n).enumerate();
    if m * n * k > PAR_FLOPS {
        dst.par_chunks_mut(MR * n).enumerate().for_each(block);
    } else {
        chunks.for_each(block);
    }
}

/// `b`'s columns in panels of NR: slot (p, j) of a panel holds rows 2p and
/// 2p + 1 of column j (zero past `k` and past `n`).
fn pack_b(b: Operand<'_>, pairs: usize, k: usize, n: usize) -> Vec<u32> {
    let panels = n.div_ceil(NR);
    let mut packed = vec![0u32; panels * pairs * NR];
    if b.rows == 1 && b.cols != 1 {
        // Transposed (a weight read through `w.t()`): each column is a run
        // of pairs.
        for j in 0..n {
            let (panel, slot) = (j / NR, j % NR);
            let column = &b.data[b.offset + j * b.cols..][..k];
            for (p, pair) in column.chunks(2).enumerate() {
                let hi = pair.get(1).map_or(0, |h| h.to_bits() as u32);
                packed[(panel * pairs + p) * NR + slot] = pair[0].to_bits() as u32 | (hi << 16);
            }
        }
        return packed;
    }
    for (cb, panel) in packed.chunks_exact_mut(pairs * NR).enumerate() {
        let j0 = cb * NR;
        let nr = NR.min(n - j0);
        for p in 0..pairs {
            let slots = &mut panel[p * NR..p * NR + nr];
            if b.cols == 1 {
                // Row-major: two rows, read as runs.
                let row = |i: usize| &b.data[b.offset + i * b.rows + j0..][..nr];
                let lo = row(2 * p);
                match (2 * p + 1 < k).then(|| row(2 * p + 1)) {
                    Some(hi) => {
                        for ((slot, &l), &h) in slots.iter_mut().zip(lo).zip(hi) {
                            *slot = l.to_bits() as u32 | ((h.to_bits() as u32) << 16);
                        }
                    }
                    None => {
                        for (slot, &l) in slots.iter_mut().zip(lo) {
                            *slot = l.to_bits() as u32;
                        }
                    }
                }
                continue;
            }
            for (j, slot) in slots.iter_mut().enumerate() {
                let lo = b.bits(2 * p, j0 + j);
                let hi = if 2 * p + 1 < k { b.bits(2 * p + 1, j0 + j) } else { 0 };
                *slot = lo | (hi << 16);
            }
        }
    }
    packed
}

/// Rows `i0..i0 + mr` of `a`: slot (p, r) holds columns 2p and 2p + 1 of row r.
fn pack_a(a: Operand<'_>, i0: usize, mr: usize, pairs: usize, k: usize) -> Vec<u32> {
    let mut packed = vec![0u32; pairs * MR];
    if a.rows == 1 && a.cols != 1 {
        // Transposed (an activation read through `x.t()`, as a weight
        // gradient reads it): rows 2p and 2p + 1 of `a` are two runs.
        for p in 0..pairs {
            let run = |c: usize| &a.data[a.offset + c * a.cols + i0..][..mr];
            let (lo, hi) = (run(2 * p), (2 * p + 1 < k).then(|| run(2 * p + 1)));
            for (r, slot) in packed[p * MR..p * MR + mr].iter_mut().enumerate() {
                let h = hi.map_or(0, |h| h[r].to_bits() as u32);
                *slot = lo[r].to_bits() as u32 | (h << 16);
            }
        }
        return packed;
    }
    if a.cols == 1 {
        // Row-major: each row is a run of pairs.
        for r in 0..mr {
            let row = &a.data[a.offset + (i0 + r) * a.rows..][..k];
            for (p, pair) in row.chunks(2).enumerate() {
                let hi = pair.get(1).map_or(0, |h| h.to_bits() as u32);
                packed[p * MR + r] = pair[0].to_bits() as u32 | (hi << 16);
            }
        }
        return packed;
    }
    for p in 0..pairs {
        for r in 0..mr {
            let lo = a.bits(i0 + r, 2 * p);
            let hi = if 2 * p + 1 < k { a.bits(i0 + r, 2 * p + 1) } else { 0 };
            packed[p * MR + r] = lo | (hi << 16);
        }
    }
    packed
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn micro_kernel(a: &[u32], b: &[u32], pairs: usize, tile: &mut [[f32; NR]; MR]) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for p in 0..pairs {
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.as_ptr().add(p * NR).cast()));
        let b1: __m512bh =
            std::mem::transmute(_mm512_loadu_si512(b.as_ptr().add(p * NR + 16).cast()));
        for (r, acc) in acc.iter_mut().enumerate() {
            let pair: __m512bh = std::mem::transmute(_mm512_set1_epi32(a[p * MR + r] as i32));
            acc[0] = _mm512_dpbf16_ps(acc[0], pair, b0);
            acc[1] = _mm512_dpbf16_ps(acc[1], pair, b1);
        }
    }
    for (row, acc) in tile.iter_mut().zip(acc) {
        _mm512_storeu_ps(row.as_mut_ptr(), acc[0]);
        _mm512_storeu_ps(row.as_mut_ptr().add(16), acc[1]);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn micro_kernel(_: &[u32], _: &[u32], _: usize, _: &mut [[f32; NR]; MR]) {
    unreachable!("bf16_gemm::available is false off x86_64")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_bf16(len: usize, seed: u64) -> Vec<bf16> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                bf16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0)
            })
            .collect()
    }

    /// Against an f64 product of the same bf16 values, for ragged tiles, an
    /// odd `k`, row-major and transposed operands and an offset `a`, single-
    /// and multi-threaded.
    #[test]
    fn products_match_an_f64_reference() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let shapes = [(1, 1, 1), (9, 7, 33), (17, 64, 70), (130, 257, 100)];
        for ((m, k, n), ta, tb) in
            shapes.into_iter().flat_map(|s| [(s, false, true), (s, true, false), (s, false, false)])
        {
            let a = random_bf16(3 + m * k, 1);
            let b = random_bf16(k * n, 2);
            // a: stored [m, k] after an offset of 3, or [k, m] and read transposed.
            let av = match ta {
                false => Operand { data: &a, offset: 3, rows: k, cols: 1 },
                true => Operand { data: &a, offset: 3, rows: 1, cols: m },
            };
            // b: stored [k, n], or [n, k] and read transposed.
            let bv = match tb {
                false => Operand { data: &b, offset: 0, rows: n, cols: 1 },
                true => Operand { data: &b, offset: 0, rows: 1, cols: k },
            };
            let at = |i: usize, p: usize| {
                f64::from(av.data[av.offset + i * av.rows + p * av.cols].to_f32())
            };
            let bt = |p: usize, j: usize| {
                f64::from(bv.data[bv.offset + p * bv.rows + j * bv.cols].to_f32())
            };
            let mut dst = vec![f32::NAN; m * n];
            gemm(&mut dst, av, bv, (m, k, n));
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
                    let scale: f64 = (0..k).map(|p| (at(i, p) * bt(p, j)).abs()).sum();
                    // f32 accumulation of k exact products: k ulps of the absolute sum.
                    let tol = scale * k as f64 * f64::from(f32::EPSILON) + 1e-30;
                    let got = f64::from(dst[i * n + j]);
                    assert!((got - want).abs() <= tol, "({m},{k},{n}) [{i},{j}]: {got} vs {want}");
                }
            }
        }
    }
}
