//! Matrix-product kernels: a batched GEMM through the `gemm` crate whose
//! operands are strided views of their buffers (a folded transpose or head
//! split is just other strides), followed by the elementwise epilogue.

use std::sync::Arc;

use gemm::Parallelism;
use half::{bf16, f16};
use rewrite_rules::program::{MatMulKernel, View};
use trace_ir::shape::{broadcast_shapes, numel};
use trace_ir::{DType, Error, Meta, Result, Shape};

use super::bf16_gemm;
use super::io::{bf16_to_f32, f32_to_bf16_bits};
use super::loops::{view_geometry, LoopExec};
use super::tile::Isa;
use crate::buffer::Buffer;
use crate::cpu::clock::KernelClock;
use crate::cpu::elem::{walk, Strides};
use crate::cpu::{check_alloc, host, internal};
use crate::host_data::HostData;
use crate::memory::{Lease, MemoryTracker};

/// A matrix-product kernel ready to run.
pub(crate) struct MatMulExec {
    lhs: View,
    rhs: View,
    out: Meta,
    epilogue: Option<LoopExec>,
}

/// An operand widened to f32 (borrowed when it already is).
enum F32Data<'a> {
    Borrowed(&'a [f32]),
    Owned(Vec<f32>, #[allow(dead_code)] Lease),
}

impl F32Data<'_> {
    fn as_slice(&self) -> &[f32] {
        match self {
            F32Data::Borrowed(s) => s,
            F32Data::Owned(v, _) => v,
        }
    }
}

fn widen<'a>(d: &'a HostData, tracker: &Arc<MemoryTracker>) -> Result<F32Data<'a>> {
    Ok(match d {
        HostData::F32(v) => F32Data::Borrowed(v),
        HostData::BF16(v) => {
            let lease = Lease::new(tracker, v.len() * 4);
            F32Data::Owned(v.iter().map(|&b| bf16_to_f32(b)).collect(), lease)
        }
        HostData::F16(v) => {
            let lease = Lease::new(tracker, v.len() * 4);
            F32Data::Owned(v.iter().map(|&b| b.to_f32()).collect(), lease)
        }
        other => {
            return Err(Error::dtype(
                "matmul",
                "operands must share one floating dtype",
                &[other.dtype()],
            ))
        }
    })
}

impl MatMulExec {
    pub(crate) fn new(
        k: &MatMulKernel,
        inputs: Vec<Meta>,
        outputs: Vec<Meta>,
    ) -> Result<MatMulExec> {
        if inputs.len() < 2 {
            return Err(internal("a matmul kernel needs two operands"));
        }
        let epilogue = match &k.epilogue {
            Some(body) => {
                if body.shape != k.shape || body.row_dims != 0 {
                    return Err(internal("a matmul epilogue must run over the product's shape"));
                }
                Some(LoopExec::new(body, inputs.clone(), outputs.clone(), true)?)
            }
            None => {
                if outputs.len() != 1 {
                    return Err(internal("a matmul without epilogue has one output"));
                }
                None
            }
        };
        let dtype = inputs[0].dtype;
        Ok(MatMulExec {
            lhs: k.lhs.clone(),
            rhs: k.rhs.clone(),
            out: Meta::new(k.shape.clone(), dtype),
            epilogue,
        })
    }

    /// Runs on the kernel's inputs; the epilogue may write its output into
    /// the product's memory (see `LoopExec::run`).
    pub(crate) fn run(
        &self,
        inputs: Vec<Arc<Buffer>>,
        tracker: &Arc<MemoryTracker>,
        isa: Isa,
        clock: &KernelClock,
    ) -> Result<Vec<Buffer>> {
        let (a, b) = (&inputs[0], &inputs[1]);
        if a.meta().dtype != b.meta().dtype {
            return Err(Error::dtype(
                "matmul",
                "operands must share one floating dtype",
                &[a.meta().dtype, b.meta().dtype],
            ));
        }
        let (sa, sta, oa) = view_geometry(&self.lhs, &a.meta().shape)?;
        let (sb, stb, ob) = view_geometry(&self.rhs, &b.meta().shape)?;
        let bad = |msg: &str| Error::shape("matmul", msg.to_string(), &[&sa, &sb]);
        if sa.len() < 2 || sb.len() < 2 {
            return Err(bad("operands need at least two dimensions"));
        }
        let (m, kk) = (sa[sa.len() - 2], sa[sa.len() - 1]);
        let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
        if kk != k2 {
            return Err(bad("inner dimensions differ"));
        }
        let batch = broadcast_shapes("matmul", &sa[..sa.len() - 2], &sb[..sb.len() - 2])?;
        let mut out_shape: Shape = batch.clone();
        out_shape.push(m);
        out_shape.push(n);
        let total = numel(&out_shape);
        clock.add_flops(2 * (total as u64).saturating_mul(kk as u64));
        let out_meta = Meta::new(out_shape.clone(), self.out.dtype);
        check_alloc(&out_meta)?;
        // The product goes straight into the output when nothing follows and
        // it is f32; otherwise into a counted scratch buffer.
        let direct = self.epilogue.is_none() && self.out.dtype == DType::F32;
        let mut result = match tracker.reuse(DType::F32, total) {
            Some(HostData::F32(v)) => v,
            _ => vec![0.0f32; total],
        };
        let lease = Lease::new(tracker, total * 4);
        let operands = ((&sa[..], &sta, oa), (&sb[..], &stb, ob));
        match (host(a)?, host(b)?) {
            _ if m * n == 0 || kk == 0 => result.fill(0.0),
            (HostData::BF16(x), HostData::BF16(y)) if bf16_gemm::available() => {
                bf16_batched(&mut result, x, y, operands, &batch, (m, kk, n))
            }
            (ha, hb) => {
                let (x, y) = (widen(ha, tracker)?, widen(hb, tracker)?);
                gemm_batched(&mut result, x.as_slice(), y.as_slice(), operands, &batch, (m, kk, n));
            }
        }
        if direct {
            return Ok(vec![Buffer::from_reused(out_meta, HostData::F32(result), lease)]);
        }
        // The product is scratch from here: an epilogue output takes its
        // memory, or it goes back to the cache.
        let result = Buffer::from_reused(
            Meta::new(out_shape.clone(), DType::F32),
            HostData::F32(result),
            lease,
        );
        match &self.epilogue {
            Some(ep) => ep.run(inputs, Some(result), &out_shape, tracker, isa),
            None => {
                let acc = match result.host_data() {
                    Some(HostData::F32(v)) => v.as_slice(),
                    _ => return Err(internal("matmul scratch is not f32")),
                };
                let data = match self.out.dtype {
                    DType::BF16 => HostData::BF16(
                        acc.iter().map(|&v| bf16::from_bits(f32_to_bf16_bits(v))).collect(),
                    ),
                    DType::F16 => HostData::F16(acc.iter().map(|&v| f16::from_f32(v)).collect()),
                    other => {
                        return Err(Error::dtype(
                            "matmul",
                            "operands must share one floating dtype",
                            &[other],
                        ))
                    }
                };
                Ok(vec![Buffer::host(out_meta, data, tracker)])
            }
        }
    }
}

/// A strided operand view: shape, strides, offset.
type ViewGeometry<'a> = (&'a [usize], &'a Strides, usize);

/// The operand offsets of each output matrix of a batched product whose
/// batch dimensions broadcast.
fn batch_offsets(
    (sa, sta, oa): ViewGeometry<'_>,
    (sb, stb, ob): ViewGeometry<'_>,
    batch: &[usize],
) -> Vec<(usize, usize)> {
    // Batch strides of each operand over the output's batch dimensions.
    let batch_strides = |s: &[usize], st: &Strides| -> Strides {
        let nb = s.len() - 2;
        let lead = batch.len() - nb;
        (0..batch.len())
            .map(|d| if d < lead || s[d - lead] == 1 { 0 } else { st[d - lead] })
            .collect()
    };
    let (ba, bb) = (batch_strides(sa, sta), batch_strides(sb, stb));
    let batches = numel(batch);
    let mut offsets = Vec::with_capacity(batches);
    let (ia, ib) = (ba.last().copied().unwrap_or(0), bb.last().copied().unwrap_or(0));
    walk(batch, [&ba, &bb], 0, batches, |_, [pa, pb], run| {
        offsets.extend((0..run).map(|t| (oa + pa + t * ia, ob + pb + t * ib)));
    });
    offsets
}

/// The product of bf16 operands on the bf16 dot-product unit (`bf16_gemm`).
fn bf16_batched(
    dst: &mut [f32],
    x: &[bf16],
    y: &[bf16],
    (va, vb): (ViewGeometry<'_>, ViewGeometry<'_>),
    batch: &[usize],
    (m, k, n): (usize, usize, usize),
) {
    let (sta, stb) = (va.1, vb.1);
    let (ra, ca) = (sta[sta.len() - 2], sta[sta.len() - 1]);
    let (rb, cb) = (stb[stb.len() - 2], stb[stb.len() - 1]);
    for (d, &(pa, pb)) in dst.chunks_mut(m * n).zip(&batch_offsets(va, vb, batch)) {
        let a = bf16_gemm::Operand { data: x, offset: pa, rows: ra, cols: ca };
        let b = bf16_gemm::Operand { data: y, offset: pb, rows: rb, cols: cb };
        bf16_gemm::gemm(d, a, b, (m, k, n));
    }
}

/// `dst[batch, m, n] = lhs[batch, m, k] @ rhs[batch, k, n]` over strided
/// operand views (shape, strides, offset) whose batch dimensions broadcast.
fn gemm_batched(
    dst: &mut [f32],
    x: &[f32],
    y: &[f32],
    (va, vb): (ViewGeometry<'_>, ViewGeometry<'_>),
    batch: &[usize],
    (m, k, n): (usize, usize, usize),
) {
    let offsets = batch_offsets(va, vb, batch);
    let (sta, stb) = (va.1, vb.1);
    let (ra, ca) = (sta[sta.len() - 2], sta[sta.len() - 1]);
    let (rb, cb) = (stb[stb.len() - 2], stb[stb.len() - 1]);
    // A transposed rhs (a weight read through `w.t()`, as `F.linear` reads
    // it) goes to `matrixmultiply`, which packs it at memory speed; the
    // `gemm` crate packs that layout one strided scalar at a time (38% of
    // the fused mlp_block's time under perf). `gemm_table` measured
    // matrixmultiply faster on every `nt` shape and `gemm` on the others
    // (docs/results/gemm.md).
    let transposed_rhs = rb == 1 && cb != 1;
    let one = |d: &mut [f32], rows: usize, (pa, pb): (usize, usize), par: Parallelism| {
        // SAFETY: the views were checked to stay inside their buffers
        // (`view_geometry`), `d` holds rows*n elements written row-major, and
        // it does not alias the operands; `rows` is m, or m times the batches
        // of a folded product whose lhs rows continue at stride `ra` (checked
        // by `folded_rows`).
        unsafe {
            let (xp, yp) = (x.as_ptr().add(pa), y.as_ptr().add(pb));
            if transposed_rhs {
                sgemm_by_columns(d, (rows, k, n), (xp, ra, ca), (yp, rb, cb), par);
                return;
            }
            gemm::gemm(
                rows,
                n,
                k,
                d.as_mut_ptr(),
                1,
                n as isize,
                false,
                xp,
                ca as isize,
                ra as isize,
                yp,
                cb as isize,
                rb as isize,
                0.0f32,
                1.0f32,
                false,
                false,
                false,
                par,
            )
        }
    };
    if let Some(rows) = folded_rows(&offsets, m, ra) {
        crate::cpu::matmul::for_each_batch(dst, &[offsets[0]], (rows, k, n), |d, o, par| {
            one(d, rows, o, par)
        });
        return;
    }
    crate::cpu::matmul::for_each_batch(dst, &offsets, (m, k, n), |d, o, par| one(d, m, o, par));
}

/// Columns of the output per task of [`sgemm_by_columns`]: a multiple of
/// matrixmultiply's register block, so that only the last task has a ragged
/// edge.
const COLUMN_BLOCK: usize = 64;

/// A pointer that crosses to the rayon tasks of one product.
#[derive(Clone, Copy)]
struct SendPtr<T>(*const T);
// SAFETY: the tasks of `sgemm_by_columns` read the operands and write
// disjoint columns of the output while the caller waits for them.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so that closures capture the whole wrapper and
    /// not its field).
    fn get(self) -> *const T {
        self.0
    }
}

/// `d[rows, n] = x[rows, k] @ y[k, n]` (strided operands given as pointer,
/// row stride, column stride) with `matrixmultiply`, its columns split over
/// the cores under `Parallelism::Rayon`: each task packs its own columns of
/// `y` (the large operand of a linear layer) and writes its own columns of
/// `d`, so no work is repeated. matrixmultiply runs single-threaded here
/// (no `threading` feature), so the only threads are the backend's rayon
/// pool, which survives `fork` (`crate::cpu::pool`).
///
/// # Safety
/// `x` and `y` must address `rows x k` and `k x n` elements with the strides
/// given, `d` must hold `rows * n` elements and alias neither.
unsafe fn sgemm_by_columns(
    d: &mut [f32],
    (rows, k, n): (usize, usize, usize),
    (x, ra, ca): (*const f32, usize, usize),
    (y, rb, cb): (*const f32, usize, usize),
    par: Parallelism,
) {
    debug_assert!(d.len() >= rows * n);
    let (x, y, out) = (SendPtr(x), SendPtr(y), SendPtr(d.as_mut_ptr() as *const f32));
    let columns = move |j0: usize, j1: usize| {
        // SAFETY: columns j0..j1 of the output and of y are inside the
        // regions the caller vouched for; tasks own disjoint column ranges.
        unsafe {
            matrixmultiply::sgemm(
                rows,
                k,
                j1 - j0,
                1.0,
                x.get(),
                ra as isize,
                ca as isize,
                y.get().add(j0 * cb),
                rb as isize,
                cb as isize,
                0.0,
                (out.get() as *mut f32).add(j0),
                n as isize,
                1,
            )
        }
    };
    let tasks = match par {
        Parallelism::Rayon(_) => rayon::current_num_threads().min(n.div_ceil(COLUMN_BLOCK)),
        _ => 1,
    };
    if tasks <= 1 {
        columns(0, n);
        return;
    }
    let width = n.div_ceil(tasks).div_ceil(COLUMN_BLOCK) * COLUMN_BLOCK;
    use rayon::prelude::*;
    (0..n.div_ceil(width))
        .into_par_iter()
        .for_each(|t| columns(t * width, ((t + 1) * width).min(n)));
}

/// The rows of one product that does the work of every batch, when every
/// batch multiplies the same rhs matrix and the lhs matrices follow one
/// another at the lhs row stride (a linear layer over `[batch, seq, in]`, a
/// batch folded into m): `batches * m`. One large product packs the rhs once
/// and splits its rows over the cores, where one product per batch would pack
/// the rhs again for each and split small products.
fn folded_rows(offsets: &[(usize, usize)], m: usize, row_stride: usize) -> Option<usize> {
    let (&(a0, b0), rest) = offsets.split_first()?;
    if rest.is_empty() || row_stride == 0 {
        return None;
    }
    let step = m.checked_mul(row_stride)?;
    let follows = offsets.iter().enumerate().all(|(t, &(a, b))| {
        b == b0 && t.checked_mul(step).and_then(|o| o.checked_add(a0)) == Some(a)
    });
    follows.then(|| m * offsets.len())
}

#[cfg(test)]
mod tests {
    use super::folded_rows;

    #[test]
    fn batches_fold_into_rows_only_over_one_rhs_and_continuing_lhs_rows() {
        // [3, 4, k] row-major (row stride 8) times one rhs: 12 rows.
        assert_eq!(folded_rows(&[(0, 5), (32, 5), (64, 5)], 4, 8), Some(12));
        // A different rhs per batch.
        assert_eq!(folded_rows(&[(0, 0), (32, 40)], 4, 8), None);
        // A gap between the lhs matrices (a slice of a larger batch).
        assert_eq!(folded_rows(&[(0, 0), (40, 0)], 4, 8), None);
        // A broadcast lhs (every batch reads the same matrix).
        assert_eq!(folded_rows(&[(0, 0), (0, 0)], 4, 8), None);
        // A transposed lhs (rows at stride 1, columns at stride m): the
        // batches do not continue its rows.
        assert_eq!(folded_rows(&[(0, 0), (32, 0)], 4, 1), None);
        // One batch: nothing to fold.
        assert_eq!(folded_rows(&[(0, 0)], 4, 8), None);
    }
}
