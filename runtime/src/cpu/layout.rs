//! Data movement: expand, permute, slice (strided gathers) and concat.
//! Reshape needs no kernel: the data keeps its order.

use rayon::prelude::*;
use trace_ir::shape::numel;
use trace_ir::{Error, Result};

use super::elem::{
    broadcast, build, by_any, by_dtype, row_major, typed, walk, with_room, Elem, Strides,
};
use crate::host_data::HostData;

/// `out[i] = data[base + sum_d idx_d(i) * strides[d]]` over `out_shape`.
fn gather<T: Elem>(data: &[T], out_shape: &[usize], strides: &Strides, base: usize) -> Vec<T> {
    let inner = strides.last().copied().unwrap_or(0);
    build(numel(out_shape), |start, out: &mut [T]| {
        walk(out_shape, [strides], start, out.len(), |k, [o], run| {
            let dst = &mut out[k..k + run];
            let o = base + o;
            match inner {
                1 => dst.copy_from_slice(&data[o..o + run]),
                0 => dst.fill(data[o]),
                s => {
                    for (t, e) in dst.iter_mut().enumerate() {
                        *e = data[o + t * s];
                    }
                }
            }
        })
    })
}

fn gather_any(
    data: &HostData,
    out_shape: &[usize],
    strides: &Strides,
    base: usize,
) -> Result<HostData> {
    Ok(by_any!(data.dtype(), T => T::wrap(gather(typed::<T>(data)?, out_shape, strides, base))))
}

/// A copy of `data` (a reshape of a value someone else still reads).
pub(crate) fn copy(data: &HostData) -> HostData {
    by_any!(data.dtype(), T => {
        let src = T::unwrap_ref(data).unwrap_or_default();
        let mut out = with_room(src.len());
        out.extend_from_slice(src);
        T::wrap(out)
    })
}

/// Materializes `data` (of shape `shape`) broadcast to `out_shape`.
pub(crate) fn expand(data: &HostData, shape: &[usize], out_shape: &[usize]) -> Result<HostData> {
    gather_any(data, out_shape, &broadcast(shape, out_shape), 0)
}

/// Output dimension `j` is input dimension `perm[j]`.
pub(crate) fn permute(data: &HostData, shape: &[usize], perm: &[usize]) -> Result<HostData> {
    if perm.len() != shape.len() || perm.iter().any(|&p| p >= shape.len()) {
        return Err(Error::attr(
            "permute",
            format!("{perm:?} is not a permutation of 0..{}", shape.len()),
        ));
    }
    let strides = row_major(shape);
    let out_shape: Strides = perm.iter().map(|&p| shape[p]).collect();
    let out_strides: Strides = perm.iter().map(|&p| strides[p]).collect();
    gather_any(data, &out_shape, &out_strides, 0)
}

/// Elements `start, start + step, ...` below `stop` along `axis`.
pub(crate) fn slice(
    data: &HostData,
    shape: &[usize],
    axis: usize,
    start: usize,
    stop: usize,
    step: usize,
) -> Result<HostData> {
    if axis >= shape.len() || step == 0 || start > stop || stop > shape[axis] {
        return Err(Error::attr(
            "slice",
            format!("slice {start}..{stop} step {step} is invalid for axis {axis} of {shape:?}"),
        ));
    }
    let mut strides = row_major(shape);
    let mut out_shape: Strides = shape.into();
    out_shape[axis] = (stop - start).div_ceil(step);
    let base = if numel(&out_shape) == 0 { 0 } else { start * strides[axis] };
    strides[axis] = strides[axis].saturating_mul(step);
    gather_any(data, &out_shape, &strides, base)
}

/// Joins `inputs` (data, shape) along `axis`; shapes agree elsewhere.
pub(crate) fn concat(inputs: &[(&HostData, &[usize])], axis: usize) -> Result<HostData> {
    let Some(&(first, first_shape)) = inputs.first() else {
        return Err(Error::attr("concat", "needs at least one input"));
    };
    if axis >= first_shape.len() {
        return Err(Error::attr(
            "concat",
            format!("axis {axis} is out of range for rank {}", first_shape.len()),
        ));
    }
    let outer = numel(&first_shape[..axis]);
    let inner = numel(&first_shape[axis + 1..]);
    let total: usize = inputs.iter().map(|(d, _)| d.len()).sum();
    Ok(by_any!(first.dtype(), T => {
        let parts = inputs
            .iter()
            .map(|&(d, s)| Ok((typed::<T>(d)?, s.get(axis).copied().unwrap_or(0) * inner)))
            .collect::<Result<Vec<_>>>()?;
        if parts.iter().any(|&(d, block)| d.len() != outer * block) {
            return Err(super::internal("concat input of the wrong length"));
        }
        // Each output line (one index of the leading axes) is the inputs'
        // blocks side by side; a chunk may start and end inside a block.
        let line: usize = parts.iter().map(|&(_, block)| block).sum();
        let starts: Vec<usize> = parts
            .iter()
            .scan(0, |at, &(_, block)| Some(std::mem::replace(at, *at + block)))
            .collect();
        T::wrap(build(total, |start, out: &mut [T]| {
            // Line `o`, offset `w` in it, inside part `j`: found once per
            // chunk, then advanced block by block.
            let (mut o, mut w) = (start / line, start % line);
            let mut j = starts.partition_point(|&s| s <= w) - 1;
            let mut k = 0;
            while k < out.len() {
                let (d, block) = parts[j];
                let c = w - starts[j];
                let run = (block - c).min(out.len() - k);
                out[k..k + run].copy_from_slice(&d[o * block + c..o * block + c + run]);
                k += run;
                w += run;
                if w == line {
                    (o, w, j) = (o + 1, 0, 0);
                }
                while k < out.len() && w >= starts[j] + parts[j].1 {
                    j += 1;
                }
            }
        }))
    }))
}

/// The indices of a row gather or scatter, widened to i64.
fn index_list(indices: &HostData) -> Result<std::borrow::Cow<'_, [i64]>> {
    match indices {
        HostData::I64(v) => Ok(std::borrow::Cow::Borrowed(v)),
        HostData::I32(v) => Ok(std::borrow::Cow::Owned(v.iter().map(|&i| i as i64).collect())),
        other => Err(Error::dtype("gather_rows", "indices must be i32 or i64", &[other.dtype()])),
    }
}

/// Rows `indices[i]` of `table` (of shape `shape`), each index clamped into
/// range as `Op::GatherRows` says.
pub(crate) fn gather_rows(
    table: &HostData,
    shape: &[usize],
    indices: &HostData,
) -> Result<HostData> {
    let idx = index_list(indices)?;
    let n = shape[0];
    let row = numel(&shape[1..]);
    if n == 0 && !idx.is_empty() {
        return Err(Error::shape(
            "gather_rows",
            "cannot gather from a table without rows",
            &[&trace_ir::shape::shape(shape)],
        ));
    }
    let pick = |i: i64| i.clamp(0, n as i64 - 1) as usize * row;
    Ok(by_any!(table.dtype(), T => {
        let t = typed::<T>(table)?;
        T::wrap(if row == 1 {
            // An element gather (im2col's windows): no per-row bookkeeping.
            build(idx.len(), |start, out: &mut [T]| {
                for (o, &i) in out.iter_mut().zip(&idx[start..]) {
                    *o = t[pick(i)];
                }
            })
        } else {
            build(idx.len() * row, |start, out: &mut [T]| {
                // A chunk may start and end inside a row.
                let mut k = 0;
                while k < out.len() {
                    let (r, c) = ((start + k) / row, (start + k) % row);
                    let run = (row - c).min(out.len() - k);
                    let src = pick(idx[r]) + c;
                    out[k..k + run].copy_from_slice(&t[src..src + run]);
                    k += run;
                }
            })
        })
    }))
}

/// Updates added (index entries times row length) above which
/// [`scatter_add_rows`] splits its destination rows over the cores: a
/// convolution's input gradient (one update per window tap and position) is
/// far above it, a bias gradient's handful of rows far below.
const PAR_SCATTER_ADDS: usize = 1 << 16;

/// `rows` rows of zeros plus `updates[i]` (of shape `shape`) added to row
/// `indices[i]`, in order of `i`, in the computing domain of the dtype (f32
/// for the float types, wrapping i64 for the integers); rows out of range
/// are skipped.
pub(crate) fn scatter_add_rows(
    indices: &HostData,
    updates: &HostData,
    shape: &[usize],
    rows: usize,
) -> Result<HostData> {
    fn add<T: Elem>(
        idx: &[i64],
        u: &[T],
        row: usize,
        rows: usize,
        plus: impl Fn(T::D, T::D) -> T::D + Sync,
    ) -> Vec<T> {
        let mut acc: Vec<T::D> = vec![T::default().load(); rows * row];
        // Each task owns a range of destination rows and adds the updates
        // that land there in update order: every row gets the same sums in
        // the same order as in one pass, however the rows are split. Each
        // task reads the whole index, so only large scatters split.
        let tasks = if row > 0 && idx.len() * row >= PAR_SCATTER_ADDS {
            rayon::current_num_threads().min(rows)
        } else {
            1
        };
        let run = |first: usize, dst: &mut [T::D]| {
            let range = first as i64..(first + dst.len() / row.max(1)) as i64;
            for (&i, src) in idx.iter().zip(u.chunks_exact(row.max(1))) {
                if range.contains(&i) {
                    let at = (i - range.start) as usize * row;
                    for (a, &x) in dst[at..at + row].iter_mut().zip(src) {
                        *a = plus(*a, x.load());
                    }
                }
            }
        };
        if tasks > 1 {
            let per = rows.div_ceil(tasks);
            acc.par_chunks_mut(per * row).enumerate().for_each(|(c, dst)| run(c * per, dst));
        } else {
            run(0, &mut acc);
        }
        acc.into_iter().map(T::store).collect()
    }
    let idx = index_list(indices)?;
    let row = numel(&shape[1..]);
    by_dtype!(updates.dtype();
        float T => Ok(T::wrap(add::<T>(&idx, typed::<T>(updates)?, row, rows, |a, b| a + b)));
        int T => Ok(T::wrap(add::<T>(&idx, typed::<T>(updates)?, row, rows, i64::wrapping_add)));
        bool => Err(Error::dtype("scatter_add_rows", "cannot add bool updates", &[updates.dtype()]))
    )
}
