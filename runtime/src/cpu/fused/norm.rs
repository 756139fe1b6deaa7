//! LayerNorm rows without the register interpreter.
//!
//! A loop kernel runs each instruction over a whole tile before the next
//! one (see [`super::tile`]): a LayerNorm is then seven passes over scratch
//! registers of several rows, which live in L2, between the pass that reads
//! the input from memory and the one that writes the output. At transformer
//! widths that costs about as much as the memory traffic itself. This module
//! recognizes the LayerNorm a decomposition plans into one loop kernel,
//!
//! ```text
//! m = mean(x); d = x - m; v = mean(d * d); r = rsqrt(v + eps)
//! out = d * r [* w] [+ b]
//! ```
//!
//! and runs it row by row: one pass reads the row (summing it), one forms
//! `d * d` in an L1 buffer, one sums that, one writes the output, while
//! the next row is prefetched. Every value is computed with the same
//! operations in the same order as the interpreter computes it (the sums
//! are [`reduce_row`]'s, `d` is recomputed as `x - m`, no fused
//! multiply-add), so both paths give the same bits.

use rewrite_rules::program::{Instr, LoopKernel, Reg};
use trace_ir::{BinaryOp, ReduceOp, UnaryOp};

use super::io::{Access, Data, Dst};
use super::loops::{Home, Level, LoadRt, RunState, Scratch, StoreLayout, StoreSpec, Tile};
use super::tile::reduce_row;

/// The registers of a recognized LayerNorm kernel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NormForm {
    /// The row input.
    x: Reg,
    /// `mean(x)`, `x - m`, `d * d`, `mean(q)`, `v + eps`, `rsqrt(ve)`.
    m: Reg,
    q: Reg,
    v: Reg,
    ve: Reg,
    r: Reg,
    /// The scalar `eps`.
    eps: Reg,
    /// The weight and bias loads, when the kernel applies them.
    w: Option<Reg>,
    b: Option<Reg>,
    /// The register stored as the normalized output, and its output.
    out: Reg,
    out_index: usize,
    /// Which of `m`, `v`, `ve`, `r` the kernel stores.
    stored: [bool; 4],
}

impl NormForm {
    /// The form of `kernel` when it is exactly a LayerNorm over its one row
    /// dimension: its only element-level store is the normalized output,
    /// any other store is one of the per-row statistics.
    pub(crate) fn recognize(
        kernel: &LoopKernel,
        level: &[Level],
        stores: &[StoreSpec],
    ) -> Option<NormForm> {
        if kernel.row_dims != 1 {
            return None;
        }
        let ins = &kernel.instrs;
        let bin = |reg: Reg, want: BinaryOp| match ins.get(reg)? {
            Instr::Binary { op, a, b } if *op == want => Some((*a, *b)),
            _ => None,
        };
        let elem_load = |reg: Reg| {
            matches!(ins.get(reg), Some(Instr::Load { .. })) && level[reg] == Level::Elem
        };
        let full: Vec<&StoreSpec> =
            stores.iter().filter(|s| s.layout == StoreLayout::Full).collect();
        let [store] = full.as_slice() else { return None };
        let out = store.reg;
        // out = ((d * r) [* w]) [+ b], operands in either order.
        let mut y = out;
        let mut b = None;
        if let Some((p, q)) = bin(y, BinaryOp::Add) {
            let (p, q) = if elem_load(q) { (p, q) } else { (q, p) };
            if elem_load(q) {
                b = Some(q);
                y = p;
            }
        }
        let mut w = None;
        let (p, q) = bin(y, BinaryOp::Mul)?;
        if elem_load(p) || elem_load(q) {
            // y * w: `d * r` is the other operand.
            let (p, q) = if elem_load(q) { (p, q) } else { (q, p) };
            w = Some(q);
            y = p;
        }
        let (mut d, mut r) = bin(y, BinaryOp::Mul)?;
        if level[r] != Level::Row {
            (d, r) = (r, d);
        }
        let (x, m) = bin(d, BinaryOp::Sub)?;
        let ve = match ins.get(r)? {
            Instr::Unary { op: UnaryOp::Rsqrt, x } => *x,
            _ => return None,
        };
        let (mut v, mut eps) = bin(ve, BinaryOp::Add)?;
        if level[v] != Level::Row {
            (v, eps) = (eps, v);
        }
        let q = match ins.get(v)? {
            Instr::Reduce { op: ReduceOp::Mean, x } => *x,
            _ => return None,
        };
        let sq = bin(q, BinaryOp::Mul)? == (d, d);
        let mean_of_x =
            matches!(ins.get(m)?, Instr::Reduce { op: ReduceOp::Mean, x: mx } if *mx == x);
        let ok = sq
            && mean_of_x
            && elem_load(x)
            && level[eps] == Level::Scalar
            && [m, v, ve, r].iter().all(|&g| level[g] == Level::Row)
            && level[q] == Level::Elem
            // Row stores may be statistics only: nothing else is computed.
            && stores.iter().all(|s| s.layout == StoreLayout::Full || [m, v, ve, r].contains(&s.reg));
        let stored = [m, v, ve, r].map(|g| stores.iter().any(|s| s.reg == g));
        ok.then_some(NormForm {
            x,
            m,
            q,
            v,
            ve,
            r,
            eps,
            w,
            b,
            out,
            out_index: store.output,
            stored,
        })
    }

    /// Whether this run's registers live where [`NormForm::tile`] reads
    /// them: the input contiguous f32 (read in place, or donated to the
    /// output, which then overwrites it row by row), the output f32 and
    /// computed into directly, the weight and bias one row long and
    /// repeated.
    pub(crate) fn fits(&self, rs: &RunState<'_>, elem_cap: usize) -> bool {
        let repeated = |g: Option<Reg>| {
            g.is_none_or(|g| matches!(rs.homes[g], Home::Repeated(_)) && elem_cap >= rs.cols)
        };
        let output = match Source::of(rs, self.x) {
            Some(Source::Input(_)) => rs.homes[self.out] == Home::Output(self.out_index),
            // Donated: the output's memory is the input's.
            Some(Source::Donated(p)) => {
                matches!(rs.outputs[self.out_index], Dst::F32(o) if o == p)
            }
            None => false,
        };
        output
            && rs.homes[self.q] == Home::Scratch
            && repeated(self.w)
            && repeated(self.b)
            && rs.cols > 0
    }

    /// Runs tile `t` row by row. Per-row statistics the kernel stores are
    /// left in their row registers, for the caller's row stores.
    #[inline(always)]
    pub(crate) fn tile(&self, slot: &[usize], rs: &RunState<'_>, s: &mut Scratch, t: Tile) {
        let cols = rs.cols;
        let Some(source) = Source::of(rs, self.x) else { return };
        let Dst::F32(out) = rs.outputs[self.out_index] else { return };
        let pattern = |g: Option<Reg>| match g.map(|g| rs.homes[g]) {
            Some(Home::Repeated(p)) => Some(p),
            _ => None,
        };
        let (wp, bp) = (pattern(self.w), pattern(self.b));
        let eps = rs.scalars[self.eps];
        let mut q = std::mem::take(&mut s.elem[slot[self.q]]);
        let stream = streamed(rs);
        for i in 0..t.nr {
            let at = t.start + i * cols;
            // SAFETY: row `at..at + cols` is in bounds of the input, and of
            // the output, which only this tile writes; a donated input is
            // only read through `x` before `row` is formed.
            let (x, row) = unsafe { (source.row(at, cols), out.add(at)) };
            let m = reduce_row(ReduceOp::Mean, x);
            let q = &mut q[..cols];
            for (o, &v) in q.iter_mut().zip(x) {
                let d = v - m;
                *o = d * d;
            }
            let v = reduce_row(ReduceOp::Mean, q);
            let ve = v + eps;
            let r = 1.0 / ve.sqrt();
            let (w, b) = (wp.map(|p| &s.elem[p][..cols]), bp.map(|p| &s.elem[p][..cols]));
            match source {
                Source::Input(_) if stream => {
                    // Formed in L1, then streamed past the caches (see `stream`).
                    finish(q.iter_mut().zip(x.iter().copied()), m, r, w, b);
                    // SAFETY: see above; the output does not alias the input.
                    unsafe { stream_row(row, q) };
                }
                Source::Input(_) => {
                    // SAFETY: see above; the output does not alias the input.
                    let out = unsafe { std::slice::from_raw_parts_mut(row, cols) };
                    finish(out.iter_mut().zip(x.iter().copied()), m, r, w, b);
                }
                Source::Donated(_) => {
                    // SAFETY: see above; `x` is not read after this.
                    let out = unsafe { std::slice::from_raw_parts_mut(row, cols) };
                    finish(out.iter_mut().map(|o| (o as *mut f32, *o)), m, r, w, b);
                }
            }
            let stats = [(self.m, m), (self.v, v), (self.ve, ve), (self.r, r)];
            for ((g, value), stored) in stats.into_iter().zip(self.stored) {
                if stored {
                    s.row[slot[g]][i] = value;
                }
            }
        }
        s.elem[slot[self.q]] = q;
        if stream {
            end_streaming();
        }
    }
}

/// Whether this run's output is written with [`stream_row`]: an output much
/// larger than the caches, where a plain store would first read the line it
/// writes (a third of the traffic) and the rows would evict the input from
/// L3 anyway.
pub(super) fn streamed(rs: &RunState<'_>) -> bool {
    rs.shape.iter().product::<usize>() * 4 >= 8 << 20
}

/// Makes a tile's streaming stores, which are weakly ordered, visible
/// before the tile is reported done.
pub(super) fn end_streaming() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a fence has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Writes `row` to `dst` with streaming stores where `dst` is aligned for
/// them, plain stores elsewhere.
///
/// # Safety
/// `dst` is valid for `row.len()` writes and overlaps nothing `row` is in.
#[inline(always)]
pub(super) unsafe fn stream_row(dst: *mut f32, row: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        let head = dst.align_offset(16).min(row.len());
        std::ptr::copy_nonoverlapping(row.as_ptr(), dst, head);
        let body = (row.len() - head) / 4 * 4;
        for i in (head..head + body).step_by(4) {
            _mm_stream_ps(dst.add(i), _mm_loadu_ps(row.as_ptr().add(i)));
        }
        let done = head + body;
        std::ptr::copy_nonoverlapping(row.as_ptr().add(done), dst.add(done), row.len() - done);
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::ptr::copy_nonoverlapping(row.as_ptr(), dst, row.len());
}

/// The rows of a row kernel (a LayerNorm, a softmax): read from an input,
/// or from the output's own memory (a donated input).
#[derive(Clone, Copy)]
pub(super) enum Source<'a> {
    Input(&'a [f32]),
    Donated(*mut f32),
}

impl<'a> Source<'a> {
    /// Where register `x`'s rows come from: a contiguous f32 input read in
    /// place, or one donated to the output.
    pub(super) fn of(rs: &RunState<'a>, x: Reg) -> Option<Source<'a>> {
        match (rs.homes[x], &rs.loads[x]) {
            (Home::Input(d), _) => Some(Source::Input(d)),
            (_, LoadRt { data: Data::F32Donated(d), access: Access::Contig { offset } })
                if *offset == 0 =>
            {
                Some(Source::Donated(d.ptr))
            }
            _ => None,
        }
    }

    /// The row of `cols` values at `at`, with the next row prefetched.
    ///
    /// # Safety
    /// `at..at + cols` is in bounds, and a donated row is not written while
    /// the slice is read.
    #[inline(always)]
    pub(super) unsafe fn row(self, at: usize, cols: usize) -> &'a [f32] {
        let x = match self {
            Source::Input(d) => &d[at..at + cols],
            Source::Donated(p) => std::slice::from_raw_parts(p.add(at), cols),
        };
        prefetch(x.as_ptr().wrapping_add(cols), cols);
        x
    }
}

/// `out = (x - m) * r [* w] [+ b]` over pairs of (where to write, x).
#[inline(always)]
fn finish<O: Out>(
    pairs: impl Iterator<Item = (O, f32)>,
    m: f32,
    r: f32,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
) {
    match (w, b) {
        (Some(w), Some(b)) => {
            for (((o, v), &w), &b) in pairs.zip(w).zip(b) {
                o.put((v - m) * r * w + b);
            }
        }
        (Some(w), None) => {
            for ((o, v), &w) in pairs.zip(w) {
                o.put((v - m) * r * w);
            }
        }
        (None, Some(b)) => {
            for ((o, v), &b) in pairs.zip(b) {
                o.put((v - m) * r + b);
            }
        }
        (None, None) => {
            for (o, v) in pairs {
                o.put((v - m) * r);
            }
        }
    }
}

/// Where [`finish`] writes one value.
trait Out {
    fn put(self, v: f32);
}

impl Out for &mut f32 {
    #[inline(always)]
    fn put(self, v: f32) {
        *self = v;
    }
}

impl Out for *mut f32 {
    #[inline(always)]
    fn put(self, v: f32) {
        // SAFETY: a pointer to an element of the row being finished, whose
        // value was read just before.
        unsafe { *self = v }
    }
}

/// Asks for the `n` values at `p` (the next row; past the end of the
/// buffer they are simply not there) to be cached, so that they arrive
/// while this row computes.
#[inline(always)]
fn prefetch(p: *const f32, n: usize) {
    #[cfg(target_arch = "x86_64")]
    for i in (0..n).step_by(16) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch reads nothing and never faults, whatever the
        // address; `wrapping_add` forms it without claiming it is in bounds.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, n);
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use rewrite_rules::program::{Frame, Instr, LoopKernel, Store, View};
    use trace_ir::{BinaryOp, DType, Meta, ReduceOp, UnaryOp};

    use crate::buffer::Buffer;
    use crate::cpu::fused::loops::{LoopExec, TILE};
    use crate::cpu::fused::Isa;
    use crate::host_data::HostData;
    use crate::memory::MemoryTracker;

    pub(crate) fn load(input: usize) -> Instr {
        Instr::Load { input, view: View::Direct, frame: Frame::Elem }
    }
    pub(crate) fn bin(op: BinaryOp, a: usize, b: usize) -> Instr {
        Instr::Binary { op, a, b }
    }
    fn mean(x: usize) -> Instr {
        Instr::Reduce { op: ReduceOp::Mean, x }
    }

    /// The LayerNorm kernel the planner emits for the binding's
    /// `native_layer_norm` over `[rows, cols]` (inputs x, eps, w, b), with
    /// or without the weight and bias, storing the output and, with
    /// `stats`, the mean and the inverse deviation per row.
    fn layer_norm(
        rows: usize,
        cols: usize,
        affine: bool,
        stats: bool,
        swap: bool,
    ) -> (LoopKernel, Vec<Meta>) {
        let mut instrs = vec![
            load(0),                                   // 0 x
            load(1),                                   // 1 eps
            mean(0),                                   // 2 m
            bin(BinaryOp::Sub, 0, 2),                  // 3 d
            bin(BinaryOp::Mul, 3, 3),                  // 4 q
            mean(4),                                   // 5 v
            bin(BinaryOp::Add, 5, 1),                  // 6 ve
            Instr::Unary { op: UnaryOp::Rsqrt, x: 6 }, // 7 r
            bin(BinaryOp::Mul, 3, 7),                  // 8 y
        ];
        let mut out = 8;
        if affine {
            // The planner writes `y * w + b`; either order means the same.
            let (mul, add) = if swap {
                (bin(BinaryOp::Mul, 9, 8), bin(BinaryOp::Add, 11, 10))
            } else {
                (bin(BinaryOp::Mul, 8, 9), bin(BinaryOp::Add, 10, 11))
            };
            instrs.extend([load(2), mul, load(3), add]);
            out = 12;
        }
        let mut stores = vec![Store { reg: out, output: 0, frame: Frame::Elem }];
        if stats {
            stores.push(Store { reg: 2, output: 1, frame: Frame::Elem });
            stores.push(Store { reg: 7, output: 2, frame: Frame::Elem });
        }
        let f32 = |dims: &[usize]| Meta::new(dims.into(), DType::F32);
        let mut outputs = vec![f32(&[rows, cols])];
        if stats {
            outputs.extend([f32(&[rows, 1]), f32(&[rows, 1])]);
        }
        let kernel =
            LoopKernel { shape: [rows, cols].as_slice().into(), row_dims: 1, instrs, stores };
        (kernel, outputs)
    }

    /// Runs `exec`; with `donate`, the inputs are the program's alone, and
    /// the output may take the memory of the row input.
    pub(crate) fn run(
        exec: &LoopExec,
        inputs: &[Vec<f32>],
        metas: &[Meta],
        planned: &[usize],
        donate: bool,
    ) -> Vec<Vec<f32>> {
        let tracker = MemoryTracker::new();
        let buffers: Vec<Arc<Buffer>> = inputs
            .iter()
            .zip(metas)
            .map(|(v, m)| Arc::new(Buffer::host(m.clone(), HostData::F32(v.clone()), &tracker)))
            .collect();
        let held = (!donate).then(|| buffers.clone());
        let outs = exec.run(buffers, None, planned, &tracker, Isa::detect()).unwrap();
        drop(held);
        outs.iter()
            .map(|b| match b.host_data() {
                Some(HostData::F32(v)) => v.clone(),
                _ => panic!("not f32"),
            })
            .collect()
    }

    /// Row by row and through the interpreter, a LayerNorm gives the same
    /// bits: rows narrower and wider than a tile, one column, rows split
    /// across threads, with and without the affine part and the stored
    /// statistics, on values with a large common offset (where the
    /// centring matters), and an output large enough to be streamed, with
    /// rows that start off the streaming stores' alignment.
    #[test]
    fn rows_match_the_interpreter_bit_for_bit() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 3.0
        };
        for (rows, cols) in
            [(3, 1), (5, 7), (64, 64), (200, 768), (300, 1024), (2, TILE + 5), (2051, 1023)]
        {
            for (affine, swap) in [(false, false), (true, false), (true, true)] {
                for stats in [false, true] {
                    let (kernel, outputs) = layer_norm(rows, cols, affine, stats, swap);
                    let f32 = |dims: &[usize]| Meta::new(dims.into(), DType::F32);
                    let mut metas = vec![f32(&[rows, cols]), f32(&[])];
                    let mut inputs =
                        vec![(0..rows * cols).map(|_| 100.0 + next()).collect(), vec![1e-5]];
                    if affine {
                        metas.extend([f32(&[cols]), f32(&[cols])]);
                        inputs.push((0..cols).map(|_| next()).collect());
                        inputs.push((0..cols).map(|_| next()).collect());
                    }
                    let fast =
                        LoopExec::new(&kernel, metas.clone(), outputs.clone(), false).unwrap();
                    // One column loads as one value per row: the interpreter's case.
                    assert_eq!(fast.norm.is_some(), cols > 1, "{rows}x{cols} recognized");
                    let mut slow = LoopExec::new(&kernel, metas.clone(), outputs, false).unwrap();
                    slow.norm = None;
                    let planned = [rows, cols];
                    let b = run(&slow, &inputs, &metas, &planned, true);
                    for donate in [false, true] {
                        let a = run(&fast, &inputs, &metas, &planned, donate);
                        for (x, y) in a.iter().zip(&b) {
                            let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
                            assert!(
                            same,
                            "{rows}x{cols} affine={affine} stats={stats} donate={donate}: {:?} vs {:?}",
                            &x[..3.min(x.len())],
                            &y[..3.min(y.len())]
                        );
                        }
                    }
                }
            }
        }
    }

    /// Kernels that only look like a LayerNorm keep the interpreter.
    #[test]
    fn near_misses_are_not_recognized() {
        let recognized = |instrs: Vec<Instr>, out: usize| {
            let kernel = LoopKernel {
                shape: [4, 8].as_slice().into(),
                row_dims: 1,
                instrs,
                stores: vec![Store { reg: out, output: 0, frame: Frame::Elem }],
            };
            let f32 = |dims: &[usize]| Meta::new(dims.into(), DType::F32);
            let exec =
                LoopExec::new(&kernel, vec![f32(&[4, 8]), f32(&[])], vec![f32(&[4, 8])], false)
                    .unwrap();
            exec.norm.is_some()
        };
        let base = |sub: Instr, sq: Instr, op: UnaryOp| {
            vec![
                load(0),
                load(1),
                mean(0),
                sub,
                sq,
                mean(4),
                bin(BinaryOp::Add, 5, 1),
                Instr::Unary { op, x: 6 },
                bin(BinaryOp::Mul, 3, 7),
            ]
        };
        let sub = bin(BinaryOp::Sub, 0, 2);
        let sq = bin(BinaryOp::Mul, 3, 3);
        assert!(recognized(base(sub.clone(), sq.clone(), UnaryOp::Rsqrt), 8));
        // m - x, x * d, sqrt: other computations.
        assert!(!recognized(base(bin(BinaryOp::Sub, 2, 0), sq.clone(), UnaryOp::Rsqrt), 8));
        assert!(!recognized(base(sub.clone(), bin(BinaryOp::Mul, 0, 3), UnaryOp::Rsqrt), 8));
        assert!(!recognized(base(sub, sq, UnaryOp::Sqrt), 8));
    }
}
