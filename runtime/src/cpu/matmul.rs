//! Batched matrix product `[.., m, k] @ [.., k, n]` with broadcast batch
//! dimensions, through the `gemm` crate in f32 (bf16/f16 operands are widened
//! to f32 and the result rounded once).

use std::borrow::Cow;

use gemm::Parallelism;
use half::{bf16, f16};
use rayon::prelude::*;
use trace_ir::shape::numel;
use trace_ir::{Error, Result};

use super::elem::{broadcast, map_new, walk, Strides};
use crate::host_data::HostData;

/// Products with more multiply-adds than this use rayon. Below it (about
/// 150 µs on one core) waking the pool's threads costs more than they save
/// in a program of many small kernels: a training step of issue 15's small
/// language model took 10% longer with the bound at 1M.
const PAR_FLOPS: usize = 1 << 23;

fn as_f32(d: &HostData) -> Result<Cow<'_, [f32]>> {
    Ok(match d {
        HostData::F32(v) => Cow::Borrowed(v),
        HostData::BF16(v) => Cow::Owned(map_new(v, bf16::to_f32)),
        HostData::F16(v) => Cow::Owned(map_new(v, f16::to_f32)),
        other => {
            return Err(Error::dtype(
                "matmul",
                "operands must share one floating dtype",
                &[other.dtype()],
            ))
        }
    })
}

/// `dst[m, n] = lhs[m, k] @ rhs[k, n]`, all row-major and contiguous.
fn gemm_f32(
    dst: &mut [f32],
    lhs: &[f32],
    rhs: &[f32],
    m: usize,
    k: usize,
    n: usize,
    par: Parallelism,
) {
    debug_assert!(dst.len() == m * n && lhs.len() == m * k && rhs.len() == k * n);
    // SAFETY: the slices hold exactly m*n, m*k and k*n elements, addressed
    // with the row-major strides given here; dst does not alias the inputs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            1,
            k as isize,
            rhs.as_ptr(),
            1,
            n as isize,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        )
    }
}

/// `a` (shape `sa`) @ `b` (shape `sb`) into `out_shape`.
/// Runs `one` on each `m x n` output matrix of `dst` with its operand
/// offsets: a large product uses both cores inside gemm, many small ones are
/// spread over the cores by batch, tiny work stays on this thread.
pub(crate) fn for_each_batch<F>(
    dst: &mut [f32],
    offsets: &[(usize, usize)],
    (m, k, n): (usize, usize, usize),
    one: F,
) where
    F: Fn(&mut [f32], (usize, usize), Parallelism) + Sync,
{
    let flops = m.saturating_mul(n).saturating_mul(k);
    if flops > PAR_FLOPS {
        for (d, &o) in dst.chunks_mut(m * n).zip(offsets) {
            one(d, o, Parallelism::Rayon(0));
        }
    } else if flops.saturating_mul(offsets.len()) > PAR_FLOPS {
        dst.par_chunks_mut(m * n).zip(offsets).for_each(|(d, &o)| one(d, o, Parallelism::None));
    } else {
        for (d, &o) in dst.chunks_mut(m * n).zip(offsets) {
            one(d, o, Parallelism::None);
        }
    }
}

pub(crate) fn matmul(
    a: &HostData,
    sa: &[usize],
    b: &HostData,
    sb: &[usize],
    out_shape: &[usize],
) -> Result<HostData> {
    let bad = |msg: &str| Error::shape("matmul", msg.to_string(), &[&sa.into(), &sb.into()]);
    if sa.len() < 2 || sb.len() < 2 || out_shape.len() < 2 {
        return Err(bad("operands need at least two dimensions"));
    }
    if a.dtype() != b.dtype() {
        return Err(Error::dtype(
            "matmul",
            "operands must share one floating dtype",
            &[a.dtype(), b.dtype()],
        ));
    }
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    let out_batch = &out_shape[..out_shape.len() - 2];
    if k != k2 || out_shape[out_shape.len() - 2..] != [m, n] {
        return Err(bad("inner dimensions differ"));
    }
    let (x, y) = (as_f32(a)?, as_f32(b)?);
    if x.len() != numel(sa) || y.len() != numel(sb) {
        return Err(super::internal("matmul operand length does not match its shape"));
    }
    let batches = numel(out_batch);
    let mut out = vec![0.0f32; batches * m * n];
    if m * n > 0 && k > 0 {
        // Offsets of each batch's matrices, following broadcasting.
        let scale =
            |s: Strides, e: usize| -> Strides { s.iter().map(|&v| v.saturating_mul(e)).collect() };
        let astr = scale(broadcast(&sa[..sa.len() - 2], out_batch), m * k);
        let bstr = scale(broadcast(&sb[..sb.len() - 2], out_batch), k * n);
        let (ai, bi) = (astr.last().copied().unwrap_or(0), bstr.last().copied().unwrap_or(0));
        let mut offsets = Vec::with_capacity(batches);
        walk(out_batch, [&astr, &bstr], 0, batches, |_, [oa, ob], run| {
            offsets.extend((0..run).map(|t| (oa + t * ai, ob + t * bi)));
        });
        for_each_batch(&mut out, &offsets, (m, k, n), |dst, (oa, ob), par| {
            gemm_f32(dst, &x[oa..oa + m * k], &y[ob..ob + k * n], m, k, n, par)
        });
    }
    Ok(match a {
        HostData::BF16(_) => HostData::BF16(map_new(&out, bf16::from_f32)),
        HostData::F16(_) => HostData::F16(map_new(&out, f16::from_f32)),
        _ => HostData::F32(out),
    })
}
