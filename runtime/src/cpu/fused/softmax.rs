//! Softmax rows without the register interpreter.
//!
//! The interpreter runs each instruction over a whole tile of rows before
//! the next, so a softmax is four passes over scratch registers that spill
//! from L1 (see [`super::norm`], which does the same for LayerNorm). This
//! module recognizes the softmax a decomposition plans into one loop kernel,
//!
//! ```text
//! m = max(x); e = exp(x - m); s = sum(e); out = e / s
//! ```
//!
//! and runs it row by row: one pass reads the row (its maximum), one forms
//! `e` in an L1 buffer, one sums it and one writes the output (streamed
//! when large), while the next row is prefetched. Each value is computed
//! with the interpreter's operations in its order (the same `exp`, the sums
//! are [`reduce_row`]'s), so both paths give the same bits.

use rewrite_rules::program::{Instr, LoopKernel, Reg};
use trace_ir::{BinaryOp, ReduceOp, UnaryOp};

use super::io::Dst;
use super::loops::{Home, Level, RunState, Scratch, StoreLayout, StoreSpec, Tile};
use super::norm::{end_streaming, stream_row, streamed, Source};
use super::tile::reduce_row;

/// The registers of a recognized softmax kernel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SoftmaxForm {
    /// The row input and `exp(x - max(x))`.
    x: Reg,
    e: Reg,
    /// The register stored, and its output.
    out: Reg,
    out_index: usize,
}

impl SoftmaxForm {
    /// The form of `kernel` when it is exactly a softmax over its one row
    /// dimension and stores nothing but the result.
    pub(crate) fn recognize(
        kernel: &LoopKernel,
        level: &[Level],
        stores: &[StoreSpec],
    ) -> Option<SoftmaxForm> {
        let [store] = stores else { return None };
        if kernel.row_dims != 1 || store.layout != StoreLayout::Full {
            return None;
        }
        let ins = &kernel.instrs;
        let (e, s) = match ins.get(store.reg)? {
            Instr::Binary { op: BinaryOp::Div, a, b } => (*a, *b),
            _ => return None,
        };
        let d = match ins.get(e)? {
            Instr::Unary { op: UnaryOp::Exp, x } => *x,
            _ => return None,
        };
        let (x, m) = match ins.get(d)? {
            Instr::Binary { op: BinaryOp::Sub, a, b } => (*a, *b),
            _ => return None,
        };
        let reduces = |reg: Reg, want: ReduceOp, of: Reg| matches!(ins.get(reg), Some(Instr::Reduce { op, x }) if *op == want && *x == of);
        let ok = reduces(m, ReduceOp::Max, x)
            && reduces(s, ReduceOp::Sum, e)
            && matches!(ins.get(x), Some(Instr::Load { .. }))
            && [x, d, e, store.reg].iter().all(|&g| level[g] == Level::Elem)
            && [m, s].iter().all(|&g| level[g] == Level::Row);
        ok.then_some(SoftmaxForm { x, e, out: store.reg, out_index: store.output })
    }

    /// Whether this run's registers live where [`SoftmaxForm::tile`] reads
    /// them: the input contiguous f32 (read in place, or donated to the
    /// output), the output f32 and computed into directly, `e` in scratch
    /// of at least a row (`elem_cap` values).
    pub(crate) fn fits(&self, rs: &RunState<'_>, elem_cap: usize) -> bool {
        let output = match Source::of(rs, self.x) {
            Some(Source::Input(_)) => rs.homes[self.out] == Home::Output(self.out_index),
            Some(Source::Donated(p)) => {
                matches!(rs.outputs[self.out_index], Dst::F32(o) if o == p)
            }
            None => false,
        };
        output && rs.homes[self.e] == Home::Scratch && rs.cols > 0 && elem_cap >= rs.cols
    }

    /// Runs the rows of tile `t`. Inlined into the tile functions, so that
    /// `exp` is vector code of their instruction set.
    #[inline(always)]
    pub(crate) fn tile<const FMA: bool>(
        &self,
        slot: &[usize],
        rs: &RunState<'_>,
        s: &mut Scratch,
        t: Tile,
    ) {
        let cols = rs.cols;
        let Some(source) = Source::of(rs, self.x) else { return };
        let Dst::F32(out) = rs.outputs[self.out_index] else { return };
        let stream = streamed(rs);
        let mut e = std::mem::take(&mut s.elem[slot[self.e]]);
        for i in 0..t.nr {
            let at = t.start + i * cols;
            // SAFETY: row `at..at + cols` is in bounds of the input and of
            // the output, which only this tile writes; a donated input is
            // read whole into `e` before the row is written.
            let (x, row) = unsafe { (source.row(at, cols), out.add(at)) };
            let m = reduce_row(ReduceOp::Max, x);
            let e = &mut e[..cols];
            for (o, &v) in e.iter_mut().zip(x) {
                *o = super::math::exp::<FMA>(v - m);
            }
            let sum = reduce_row(ReduceOp::Sum, e);
            if stream && matches!(source, Source::Input(_)) {
                for v in e.iter_mut() {
                    *v /= sum;
                }
                // SAFETY: see above; the output does not alias the input.
                unsafe { stream_row(row, e) };
            } else {
                // SAFETY: see above.
                let out = unsafe { std::slice::from_raw_parts_mut(row, cols) };
                for (o, &v) in out.iter_mut().zip(e.iter()) {
                    *o = v / sum;
                }
            }
        }
        s.elem[slot[self.e]] = e;
        if stream {
            end_streaming();
        }
    }
}

#[cfg(test)]
mod tests {
    use rewrite_rules::program::{Frame, Instr, LoopKernel, Store};
    use trace_ir::{BinaryOp, DType, Meta, ReduceOp, UnaryOp};

    use crate::cpu::fused::loops::{LoopExec, TILE};
    use crate::cpu::fused::norm::tests::{bin, load, run};

    fn reduce(op: ReduceOp, x: usize) -> Instr {
        Instr::Reduce { op, x }
    }

    /// Row by row and through the interpreter, a softmax gives the same
    /// bits: rows narrower and wider than a tile, one column, rows split
    /// across threads, an output large enough to be streamed (with rows off
    /// the streaming stores' alignment), held and donated inputs.
    #[test]
    fn rows_match_the_interpreter_bit_for_bit() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 40.0 - 20.0
        };
        let instrs = vec![
            load(0),                                 // 0 x
            reduce(ReduceOp::Max, 0),                // 1 m
            bin(BinaryOp::Sub, 0, 1),                // 2 d
            Instr::Unary { op: UnaryOp::Exp, x: 2 }, // 3 e
            reduce(ReduceOp::Sum, 3),                // 4 s
            bin(BinaryOp::Div, 3, 4),                // 5 out
        ];
        let stores = vec![Store { reg: 5, output: 0, frame: Frame::Elem }];
        for (rows, cols) in [(3, 1), (5, 7), (64, 64), (300, 1024), (2, TILE + 5), (2051, 1023)] {
            let kernel = LoopKernel {
                shape: [rows, cols].as_slice().into(),
                row_dims: 1,
                instrs: instrs.clone(),
                stores: stores.clone(),
            };
            let meta = Meta::new([rows, cols].as_slice().into(), DType::F32);
            let inputs = vec![(0..rows * cols).map(|_| next()).collect::<Vec<f32>>()];
            let metas = vec![meta.clone()];
            let fast = LoopExec::new(&kernel, metas.clone(), vec![meta.clone()], false).unwrap();
            // One column loads as one value per row: the interpreter's case.
            assert_eq!(fast.softmax.is_some(), cols > 1, "{rows}x{cols} recognized");
            let mut slow = LoopExec::new(&kernel, metas.clone(), vec![meta], false).unwrap();
            slow.softmax = None;
            let planned = [rows, cols];
            let want = run(&slow, &inputs, &metas, &planned, true);
            for donate in [false, true] {
                let got = run(&fast, &inputs, &metas, &planned, donate);
                let same = got[0].iter().zip(&want[0]).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(
                    same,
                    "{rows}x{cols} donate={donate}: {:?} vs {:?}",
                    &got[0][..3.min(cols)],
                    &want[0][..3.min(cols)]
                );
            }
        }
    }

    /// A kernel that only looks like a softmax keeps the interpreter.
    #[test]
    fn near_misses_are_not_recognized() {
        let recognized = |instrs: Vec<Instr>| {
            let kernel = LoopKernel {
                shape: [4, 8].as_slice().into(),
                row_dims: 1,
                instrs,
                stores: vec![Store { reg: 5, output: 0, frame: Frame::Elem }],
            };
            let meta = Meta::new([4, 8].as_slice().into(), DType::F32);
            LoopExec::new(&kernel, vec![meta.clone()], vec![meta], false).unwrap().softmax.is_some()
        };
        let softmax = |max: ReduceOp, unary: UnaryOp, sum: ReduceOp, div: BinaryOp| {
            vec![
                load(0),
                reduce(max, 0),
                bin(BinaryOp::Sub, 0, 1),
                Instr::Unary { op: unary, x: 2 },
                reduce(sum, 3),
                bin(div, 3, 4),
            ]
        };
        assert!(recognized(softmax(ReduceOp::Max, UnaryOp::Exp, ReduceOp::Sum, BinaryOp::Div)));
        assert!(!recognized(softmax(ReduceOp::Min, UnaryOp::Exp, ReduceOp::Sum, BinaryOp::Div)));
        assert!(!recognized(softmax(ReduceOp::Max, UnaryOp::Tanh, ReduceOp::Sum, BinaryOp::Div)));
        assert!(!recognized(softmax(ReduceOp::Max, UnaryOp::Exp, ReduceOp::Mean, BinaryOp::Div)));
        assert!(!recognized(softmax(ReduceOp::Max, UnaryOp::Exp, ReduceOp::Sum, BinaryOp::Mul)));
    }
}
