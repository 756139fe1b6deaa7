//! One tile of a loop kernel: every instruction is a tight loop over the
//! tile's registers (f32 slices), so the compiler vectorizes each one; the
//! instruction list is dispatched once per tile, never per element.
//!
//! The body is compiled three times, for AVX-512, AVX2+FMA and the portable
//! baseline, and [`Isa::detect`] picks one at run time: no RUSTFLAGS needed.
//! A backend built without SIMD ([`crate::CpuBackend::with_simd`]) runs the
//! portable one ([`Isa::choose`]).

use rewrite_rules::program::{Instr, Reg};
use trace_ir::{BinaryOp, ReduceOp};

use super::io::round_bf16;
use super::loops::{Home, Level, LoopExec, RunState, Scratch, StoreLayout, Tile};

/// The instruction sets the tile loop is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    Avx512,
    Avx2,
    Portable,
}

impl Isa {
    /// The best set this CPU runs, detected once per process.
    pub(crate) fn detect() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
                {
                    return Isa::Avx512;
                }
                if is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
                {
                    return Isa::Avx2;
                }
            }
            Isa::Portable
        })
    }

    /// The set a backend's kernels run: the detected one, or the portable
    /// baseline when `simd` is off (to bisect a difference to the SIMD code).
    pub(crate) fn choose(simd: bool) -> Isa {
        if simd {
            Isa::detect()
        } else {
            Isa::Portable
        }
    }
}

/// Whether the portable code path has fused multiply-add: aarch64 always
/// does; x86-64 without AVX2 may not.
pub(crate) const PORTABLE_FMA: bool = cfg!(target_arch = "aarch64");

/// Runs one tile with the code compiled for `isa`.
pub(crate) fn run_tile(isa: Isa, exec: &LoopExec, rs: &RunState<'_>, s: &mut Scratch, t: Tile) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` saw every feature these functions enable.
        Isa::Avx512 => unsafe { tile_avx512(exec, rs, s, t) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { tile_avx2(exec, rs, s, t) },
        _ => tile_body::<PORTABLE_FMA>(exec, rs, s, t),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(
    enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi1,bmi2,lzcnt,popcnt"
)]
unsafe fn tile_avx512(exec: &LoopExec, rs: &RunState<'_>, s: &mut Scratch, t: Tile) {
    tile_body::<true>(exec, rs, s, t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,bmi1,bmi2,lzcnt,popcnt")]
unsafe fn tile_avx2(exec: &LoopExec, rs: &RunState<'_>, s: &mut Scratch, t: Tile) {
    tile_body::<true>(exec, rs, s, t)
}

/// A register as an operand: a scalar, one value per row, or one per element.
#[derive(Clone, Copy)]
pub(crate) enum A<'a> {
    S(f32),
    R(&'a [f32]),
    E(&'a [f32]),
}

/// Binds `$f` to the scalar function of a unary op; `$fma` says whether
/// the code path has fused multiply-add (see [`super::math`]).
macro_rules! with_unary {
    ($fma:expr, $op:expr, |$f:ident| $body:expr) => {{
        use trace_ir::UnaryOp::*;
        match $op {
            Neg => {
                let $f = |x: f32| -x;
                $body
            }
            Abs => {
                let $f = |x: f32| x.abs();
                $body
            }
            Exp => {
                let $f = $crate::cpu::fused::math::exp::<{ $fma }>;
                $body
            }
            Log => {
                let $f = $crate::cpu::fused::math::ln::<{ $fma }>;
                $body
            }
            Sqrt => {
                let $f = |x: f32| x.sqrt();
                $body
            }
            Rsqrt => {
                let $f = |x: f32| 1.0 / x.sqrt();
                $body
            }
            Reciprocal => {
                let $f = |x: f32| 1.0 / x;
                $body
            }
            Tanh => {
                let $f = $crate::cpu::fused::math::tanh::<{ $fma }>;
                $body
            }
            Sigmoid => {
                let $f = $crate::cpu::fused::math::sigmoid::<{ $fma }>;
                $body
            }
            Relu => {
                let $f = |x: f32| if x > 0.0 || x.is_nan() { x } else { 0.0 };
                $body
            }
            GeluErf => {
                let $f = $crate::cpu::fused::math::gelu_erf::<{ $fma }>;
                $body
            }
            GeluTanh => {
                let $f = $crate::cpu::fused::math::gelu_tanh::<{ $fma }>;
                $body
            }
            Silu => {
                let $f = $crate::cpu::fused::math::silu::<{ $fma }>;
                $body
            }
            Sin => {
                let $f = |x: f32| x.sin();
                $body
            }
            Cos => {
                let $f = |x: f32| x.cos();
                $body
            }
            Floor => {
                let $f = |x: f32| x.floor();
                $body
            }
            Sign => {
                let $f = $crate::cpu::elementwise::sign;
                $body
            }
            LogicalNot => {
                let $f = |x: f32| (x == 0.0) as u8 as f32;
                $body
            }
        }
    }};
}
pub(crate) use with_unary;

/// Binds `$f` to the scalar function of a binary op (bool results as 0/1).
macro_rules! with_binary {
    ($op:expr, |$f:ident| $body:expr) => {{
        use trace_ir::BinaryOp::*;
        match $op {
            Add => {
                let $f = |x: f32, y: f32| x + y;
                $body
            }
            Sub => {
                let $f = |x: f32, y: f32| x - y;
                $body
            }
            Mul => {
                let $f = |x: f32, y: f32| x * y;
                $body
            }
            Div => {
                let $f = |x: f32, y: f32| x / y;
                $body
            }
            Pow => {
                let $f = |x: f32, y: f32| x.powf(y);
                $body
            }
            Maximum => {
                let $f = |x: f32, y: f32| {
                    if x.is_nan() || y.is_nan() {
                        f32::NAN
                    } else if y > x {
                        y
                    } else {
                        x
                    }
                };
                $body
            }
            Minimum => {
                let $f = |x: f32, y: f32| {
                    if x.is_nan() || y.is_nan() {
                        f32::NAN
                    } else if y < x {
                        y
                    } else {
                        x
                    }
                };
                $body
            }
            Eq => {
                let $f = |x: f32, y: f32| (x == y) as u8 as f32;
                $body
            }
            Ne => {
                let $f = |x: f32, y: f32| (x != y) as u8 as f32;
                $body
            }
            Lt => {
                let $f = |x: f32, y: f32| (x < y) as u8 as f32;
                $body
            }
            Le => {
                let $f = |x: f32, y: f32| (x <= y) as u8 as f32;
                $body
            }
            Gt => {
                let $f = |x: f32, y: f32| (x > y) as u8 as f32;
                $body
            }
            Ge => {
                let $f = |x: f32, y: f32| (x >= y) as u8 as f32;
                $body
            }
            LogicalAnd => {
                let $f = |x: f32, y: f32| ((x != 0.0) & (y != 0.0)) as u8 as f32;
                $body
            }
            LogicalOr => {
                let $f = |x: f32, y: f32| ((x != 0.0) | (y != 0.0)) as u8 as f32;
                $body
            }
        }
    }};
}
pub(crate) use with_binary;

/// `x` rounded to a storage dtype and back.
#[inline(always)]
pub(crate) fn round_to(to: trace_ir::DType, x: f32) -> f32 {
    match to {
        trace_ir::DType::BF16 => round_bf16(x),
        trace_ir::DType::F16 => half::f16::from_f32(x).to_f32(),
        trace_ir::DType::Bool => (x != 0.0) as u8 as f32,
        _ => x,
    }
}

#[inline(always)]
fn un<F: Fn(f32) -> f32>(f: F, out: &mut [f32], x: &[f32]) {
    for (o, &a) in out.iter_mut().zip(x) {
        *o = f(a);
    }
}

/// `out = f(a, b)` with `a`, `b` broadcast to `out`'s level; rows have `cols` elements.
#[inline(always)]
fn bin<F: Fn(f32, f32) -> f32>(f: F, out: &mut [f32], a: A<'_>, b: A<'_>, cols: usize) {
    if out.is_empty() {
        return; // rows of no columns: nothing to write (and no chunk size)
    }
    match (a, b) {
        (A::E(x), A::E(y)) | (A::R(x), A::R(y)) => {
            for ((o, &p), &q) in out.iter_mut().zip(x).zip(y) {
                *o = f(p, q);
            }
        }
        (A::E(x), A::S(q)) | (A::R(x), A::S(q)) => {
            for (o, &p) in out.iter_mut().zip(x) {
                *o = f(p, q);
            }
        }
        (A::S(p), A::E(y)) | (A::S(p), A::R(y)) => {
            for (o, &q) in out.iter_mut().zip(y) {
                *o = f(p, q);
            }
        }
        (A::E(x), A::R(r)) => {
            for ((o, x), &q) in out.chunks_exact_mut(cols).zip(x.chunks_exact(cols)).zip(r) {
                for (o, &p) in o.iter_mut().zip(x) {
                    *o = f(p, q);
                }
            }
        }
        (A::R(r), A::E(y)) => {
            for ((o, y), &p) in out.chunks_exact_mut(cols).zip(y.chunks_exact(cols)).zip(r) {
                for (o, &q) in o.iter_mut().zip(y) {
                    *o = f(p, q);
                }
            }
        }
        (A::S(p), A::S(q)) => out.fill(f(p, q)),
    }
}

/// Writes `a` broadcast to `out` (a register at `a`'s level or above).
#[inline(always)]
fn spread(a: A<'_>, out: &mut [f32], cols: usize) {
    match a {
        A::E(x) => out.copy_from_slice(&x[..out.len()]),
        A::R(r) if r.len() == out.len() => out.copy_from_slice(r),
        A::R(r) => {
            for (o, &v) in out.chunks_exact_mut(cols.max(1)).zip(r) {
                o.fill(v);
            }
        }
        A::S(v) => out.fill(v),
    }
}

/// Independent f32 accumulators of a row sum: four AVX2 registers (two
/// AVX-512 ones, eight SSE ones), enough to hide the latency of the adds.
const SUM_LANES: usize = 32;

/// Elements summed in f32 before the partial sum is carried in f64: each
/// lane then adds at most `SUM_BLOCK / SUM_LANES` values, which bounds the
/// rounding error of a block (see [`sum_block`]) whatever the row length.
const SUM_BLOCK: usize = 1024;

/// Sum of at most [`SUM_BLOCK`] values: lane `i` adds every
/// `SUM_LANES`-th value in f32 (a loop the compiler turns into vector adds;
/// the tail is padded with zeros into one more step), then the lanes' sums
/// are widened and added pairwise in f64. Only the lanes round in f32, each
/// at most `ceil(len / SUM_LANES)` times, so the error is at most about
/// `ceil(len / SUM_LANES) * 2^-24 * sum |x|` (32 units of f32 rounding for a
/// full block, against `len` units for a serial f32 sum). The order is fixed
/// by the source, so every instruction set computes the same bits.
///
/// Every index is a constant after unrolling, so the lanes stay in
/// registers: a lane picked at run time would spill them to the stack.
#[inline(always)]
fn sum_block(x: &[f32]) -> f64 {
    let mut acc = [0.0f32; SUM_LANES];
    let chunks = x.chunks_exact(SUM_LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..SUM_LANES {
            acc[i] += c[i];
        }
    }
    if !rest.is_empty() {
        let mut last = [0.0f32; SUM_LANES];
        last[..rest.len()].copy_from_slice(rest);
        for i in 0..SUM_LANES {
            acc[i] += last[i];
        }
    }
    // The lanes' sums are the block's largest partial sums, so adding them
    // in f32 would round most: they are widened first.
    let mut wide = [0.0f64; SUM_LANES];
    for i in 0..SUM_LANES {
        wide[i] = acc[i] as f64;
    }
    for width in [16, 8, 4, 2, 1] {
        for i in 0..width {
            wide[i] += wide[i + width];
        }
    }
    wide[0]
}

/// Sum of a row: blocks of [`SUM_BLOCK`] values summed in f32 lanes
/// ([`sum_block`]), the blocks' sums added in f64, so a long row (or a row
/// walked in chunks) loses no more than one block does. Starts from +0.0,
/// as PyTorch's sums do.
///
/// A plain loop: an iterator adapter's closure need not be inlined, and
/// out of line it would lose the tile's target features (no AVX2).
#[inline(always)]
fn sum_row(x: &[f32]) -> f64 {
    let mut s = 0.0f64;
    for block in x.chunks(SUM_BLOCK) {
        s += sum_block(block);
    }
    s
}

#[inline(always)]
fn prod_f64(x: &[f32]) -> f64 {
    let mut acc = [1.0f64; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] *= c[i] as f64;
        }
    }
    let mut s = acc.iter().product::<f64>();
    for &v in rest {
        s *= v as f64;
    }
    s
}

/// NaN-propagating max (or min) of a non-empty row.
#[inline(always)]
fn extreme(x: &[f32], max: bool) -> f32 {
    let init = if max { f32::NEG_INFINITY } else { f32::INFINITY };
    let mut acc = [init; 16];
    let mut nan = [0u32; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            let v = c[i];
            let better = if max { v > acc[i] } else { v < acc[i] };
            acc[i] = if better { v } else { acc[i] };
            nan[i] |= v.is_nan() as u32;
        }
    }
    let mut m = init;
    let mut any_nan = nan.iter().any(|&n| n != 0);
    for &v in acc.iter().chain(rest) {
        any_nan |= v.is_nan();
        if (max && v > m) || (!max && v < m) {
            m = v;
        }
    }
    if any_nan {
        f32::NAN
    } else {
        m
    }
}

/// One reduction over a row of `cols` values.
#[inline(always)]
pub(crate) fn reduce_row(op: ReduceOp, x: &[f32]) -> f32 {
    let n = x.len();
    match op {
        ReduceOp::Sum => sum_row(x) as f32,
        ReduceOp::Mean if n == 0 => f32::NAN,
        ReduceOp::Mean => (sum_row(x) / n as f64) as f32,
        ReduceOp::Prod => prod_f64(x) as f32,
        ReduceOp::Max => extreme(x, true),
        ReduceOp::Min => extreme(x, false),
    }
}

/// A reduction of a value constant along the row (`cols` copies of `v`).
#[inline(always)]
pub(crate) fn reduce_const(op: ReduceOp, v: f32, cols: usize) -> f32 {
    // A row of nothing reduces to the identity whatever `v` is: `v * 0` would
    // make an infinite `v` (a log-softmax of an empty row) NaN.
    if cols == 0 {
        return match op {
            ReduceOp::Sum => 0.0,
            ReduceOp::Prod => 1.0,
            ReduceOp::Mean => f32::NAN,
            ReduceOp::Max => f32::NEG_INFINITY,
            ReduceOp::Min => f32::INFINITY,
        };
    }
    match op {
        ReduceOp::Sum => (v as f64 * cols as f64) as f32,
        ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min => v,
        ReduceOp::Prod => (v as f64).powi(cols as i32) as f32,
    }
}

#[inline(always)]
fn tile_body<const FMA: bool>(exec: &LoopExec, rs: &RunState<'_>, s: &mut Scratch, t: Tile) {
    if exec.chunked && rs.cols > t.len {
        return chunked_body::<FMA>(exec, rs, s, t);
    }
    if let Some(norm) = &rs.norm {
        norm.tile(&exec.slot, rs, s, t);
        return store(exec, rs, s, t, |l| l == Level::Row);
    }
    if let Some(softmax) = &rs.softmax {
        // Its one store, the result, is written row by row.
        return softmax.tile::<FMA>(&exec.slot, rs, s, t);
    }
    for &reg in &exec.tile_order {
        exec_instr::<FMA>(exec, rs, s, t, reg, rs.cols);
    }
    store(exec, rs, s, t, |_| true);
}

/// A row longer than a tile, in a kernel whose per-element work never
/// reads a reduction: the row is walked in chunks of `t.len` elements,
/// reductions accumulate across chunks, and what depends on them runs once
/// at the end.
#[inline(always)]
fn chunked_body<const FMA: bool>(exec: &LoopExec, rs: &RunState<'_>, s: &mut Scratch, t: Tile) {
    let cols = rs.cols;
    let n = exec.kernel.instrs.len();
    // (sum of the chunks' sums or product in f64, extreme in f32, saw NaN)
    let mut acc: Vec<(f64, f32, bool)> = vec![(0.0, 0.0, false); n];
    for &reg in &exec.tile_order {
        if let Instr::Reduce { op, .. } = exec.kernel.instrs[reg] {
            acc[reg] = match op {
                ReduceOp::Prod => (1.0, 0.0, false),
                ReduceOp::Max => (0.0, f32::NEG_INFINITY, false),
                ReduceOp::Min => (0.0, f32::INFINITY, false),
                _ => (-0.0, 0.0, false),
            };
        }
    }
    let mut done = 0;
    while done < cols {
        let len = t.len.min(cols - done);
        let c = Tile { start: t.start + done, len, r0: t.r0, nr: 1 };
        for &reg in &exec.tile_order {
            if exec.after_reduce[reg] {
                continue;
            }
            match &exec.kernel.instrs[reg] {
                Instr::Reduce { op, x } if exec.level[*x] == Level::Elem => {
                    let xs = elem_of(exec, rs, &s.elem, c, *x);
                    let a = &mut acc[reg];
                    match op {
                        ReduceOp::Sum | ReduceOp::Mean => a.0 += sum_row(xs),
                        ReduceOp::Prod => a.0 *= prod_f64(xs),
                        ReduceOp::Max | ReduceOp::Min => {
                            let v = extreme(xs, *op == ReduceOp::Max);
                            a.2 |= v.is_nan();
                            if (*op == ReduceOp::Max && v > a.1)
                                || (*op == ReduceOp::Min && v < a.1)
                            {
                                a.1 = v;
                            }
                        }
                    }
                }
                Instr::Reduce { .. } => {}
                _ => exec_instr::<FMA>(exec, rs, s, c, reg, len),
            }
        }
        store(exec, rs, s, c, |l| l == Level::Elem);
        done += len;
    }
    // Finish the reductions, then everything that reads them.
    let one = Tile { start: t.start, len: 1, r0: t.r0, nr: 1 };
    for &reg in &exec.tile_order {
        if let Instr::Reduce { op, x } = exec.kernel.instrs[reg] {
            if exec.level[x] == Level::Elem {
                let a = acc[reg];
                let v = match op {
                    ReduceOp::Sum | ReduceOp::Prod => a.0 as f32,
                    ReduceOp::Mean => (a.0 / cols as f64) as f32,
                    ReduceOp::Max | ReduceOp::Min => {
                        if a.2 {
                            f32::NAN
                        } else {
                            a.1
                        }
                    }
                };
                s.row[exec.slot[reg]][0] = v;
                continue;
            }
        }
        if exec.after_reduce[reg] || matches!(exec.kernel.instrs[reg], Instr::Reduce { .. }) {
            exec_instr::<FMA>(exec, rs, s, one, reg, cols);
        }
    }
    store(exec, rs, s, Tile { start: t.start, len: cols, r0: t.r0, nr: 1 }, |l| l != Level::Elem);
}

/// The values of element-level register `r` over tile `t`, wherever they
/// live (see [`Home`]).
#[inline(always)]
fn elem_of<'b>(
    exec: &LoopExec,
    rs: &'b RunState<'_>,
    elem: &'b [Vec<f32>],
    t: Tile,
    r: Reg,
) -> &'b [f32] {
    match rs.homes[r] {
        Home::Input(d) => &d[t.start..t.start + t.len],
        // SAFETY: the tile's own range of the output, which only this tile
        // writes, and which the instruction homed there has written.
        Home::Output(o) => unsafe { rs.outputs[o].f32_run(t.start, t.len) },
        Home::Scratch => &elem[exec.slot[r]][..t.len],
        Home::Repeated(slot) => &elem[slot][..t.len],
    }
}

/// Runs instruction `reg` over tile `t`, whose rows have `cols` elements.
#[inline(always)]
fn exec_instr<const FMA: bool>(
    exec: &LoopExec,
    rs: &RunState<'_>,
    s: &mut Scratch,
    t: Tile,
    reg: usize,
    cols: usize,
) {
    let level = exec.level[reg];
    let n = match level {
        Level::Elem => t.len,
        Level::Row => t.nr,
        Level::Scalar => return,
    };
    if level == Level::Elem {
        match rs.homes[reg] {
            // Read in place by whoever uses it.
            Home::Input(_) | Home::Repeated(_) => return,
            Home::Output(o) => {
                // SAFETY: tiles write disjoint ranges of every output.
                let out = unsafe { rs.outputs[o].f32_run(t.start, n) };
                return compute::<FMA>(exec, rs, &s.elem, &s.row, &mut s.tmp, t, reg, cols, out);
            }
            Home::Scratch => {}
        }
    }
    let slot = exec.slot[reg];
    let pool = if level == Level::Elem { &mut s.elem } else { &mut s.row };
    let mut out = std::mem::take(&mut pool[slot]);
    compute::<FMA>(exec, rs, &s.elem, &s.row, &mut s.tmp, t, reg, cols, &mut out[..n]);
    let pool = if level == Level::Elem { &mut s.elem } else { &mut s.row };
    pool[slot] = out;
}

/// Evaluates instruction `reg` over tile `t` into `out`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn compute<const FMA: bool>(
    exec: &LoopExec,
    rs: &RunState<'_>,
    elem: &[Vec<f32>],
    row: &[Vec<f32>],
    tmp: &mut [Vec<f32>; 3],
    t: Tile,
    reg: usize,
    cols: usize,
    out: &mut [f32],
) {
    let n = out.len();
    let level = exec.level[reg];
    let arg = |r: usize| -> A<'_> {
        match exec.level[r] {
            Level::Scalar => A::S(rs.scalars[r]),
            Level::Row => A::R(&row[exec.slot[r]][..t.nr]),
            Level::Elem => A::E(elem_of(exec, rs, elem, t, r)),
        }
    };
    match &exec.kernel.instrs[reg] {
        Instr::Load { .. } | Instr::Acc => {
            let ld = &rs.loads[reg];
            match level {
                Level::Elem => ld.access.read(&ld.data, &rs.shape, t.start, out),
                _ => ld.access.read(&ld.data, &rs.outer, t.r0, out),
            }
        }
        Instr::Literal { .. } => {}
        Instr::Unary { op, x } => match arg(*x) {
            A::E(x) | A::R(x) => with_unary!(FMA, *op, |f| un(f, out, x)),
            A::S(v) => with_unary!(FMA, *op, |f| out.fill(f(v))),
        },
        Instr::Binary { op, a, b } => {
            let (aa, ba) = (arg(*a), arg(*b));
            match (op, ba) {
                // x ** 2 is the common square; skip the library call.
                (BinaryOp::Pow, A::S(2.0)) => bin(|x, _| x * x, out, aa, ba, cols),
                _ => with_binary!(*op, |f| bin(f, out, aa, ba, cols)),
            }
        }
        Instr::Where { c, a, b } => {
            let (ca, aa, ba) = (arg(*c), arg(*a), arg(*b));
            let [tc, ta, tb] = tmp;
            for (buf, v) in [(&mut *tc, ca), (&mut *ta, aa), (&mut *tb, ba)] {
                spread(v, &mut buf[..n], cols);
            }
            for (((o, &c), &x), &y) in out.iter_mut().zip(&tc[..n]).zip(&ta[..n]).zip(&tb[..n]) {
                *o = if c != 0.0 { x } else { y };
            }
        }
        Instr::Round { to, x } => match arg(*x) {
            A::E(x) | A::R(x) => {
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = round_to(*to, v);
                }
            }
            A::S(v) => out.fill(round_to(*to, v)),
        },
        Instr::Reduce { op, x } => match arg(*x) {
            _ if cols == 0 => out.fill(reduce_row(*op, &[])),
            A::E(x) => {
                for (o, row) in out.iter_mut().zip(x.chunks_exact(cols.max(1))) {
                    *o = reduce_row(*op, row);
                }
            }
            A::R(x) => {
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = reduce_const(*op, v, cols);
                }
            }
            A::S(v) => out.fill(reduce_const(*op, v, cols)),
        },
    }
}

/// The stores of registers whose level `which` accepts, for tile `t`,
/// rounded to each output's dtype.
#[inline(always)]
fn store(exec: &LoopExec, rs: &RunState<'_>, s: &Scratch, t: Tile, which: impl Fn(Level) -> bool) {
    let cols = rs.cols;
    for st in exec.stores.iter().filter(|st| which(exec.level[st.reg])) {
        if rs.homes[st.reg] == Home::Output(st.output) {
            continue; // computed in place
        }
        let dst = &rs.outputs[st.output];
        let value = match exec.level[st.reg] {
            Level::Scalar => A::S(rs.scalars[st.reg]),
            Level::Row => A::R(&s.row[exec.slot[st.reg]][..t.nr]),
            Level::Elem => A::E(elem_of(exec, rs, &s.elem, t, st.reg)),
        };
        // SAFETY: tiles cover disjoint ranges of every output, in bounds
        // by construction of the tiling.
        unsafe {
            match (st.layout, value) {
                (StoreLayout::Full, A::E(x)) => dst.write(t.start, x),
                (StoreLayout::Full, A::R(r)) => {
                    for (i, &v) in r.iter().enumerate() {
                        dst.fill(t.start + i * cols, cols, v);
                    }
                }
                (StoreLayout::Full, A::S(v)) => dst.fill(t.start, t.len, v),
                (StoreLayout::Rows, A::R(r)) => dst.write(t.r0, r),
                (StoreLayout::Rows, A::S(v)) => dst.fill(t.r0, t.nr, v),
                // Rejected when the kernel is compiled.
                (StoreLayout::Rows, A::E(_)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The exact-enough sum of `x` and the sum of magnitudes, in f64.
    fn sums_f64(x: &[f32]) -> (f64, f64) {
        x.iter().fold((0.0, 0.0), |(s, a), &v| (s + v as f64, a + (v as f64).abs()))
    }

    /// The error bound [`sum_block`] documents, for a row of `len` values,
    /// one block at a time, plus the final rounding to f32.
    fn bound(len: usize, magnitude: f64) -> f64 {
        let per_block = SUM_BLOCK.min(len).div_ceil(SUM_LANES) as f64;
        (per_block + 1.0) * f64::from(f32::EPSILON) / 2.0 * magnitude
    }

    proptest! {
        #[test]
        fn row_sums_stay_within_the_documented_bound(
            x in prop::collection::vec(-1.0e3f32..1.0e3, 0..3000),
            shift in -1.0e3f32..1.0e3,
        ) {
            // Shifted values sum without cancellation, unshifted ones with
            // a lot of it: both must keep the bound relative to sum |x|.
            for row in [x.clone(), x.iter().map(|v| v + shift).collect()] {
                let (want, magnitude) = sums_f64(&row);
                let got = reduce_row(ReduceOp::Sum, &row) as f64;
                prop_assert!(
                    (got - want).abs() <= bound(row.len(), magnitude) + f64::from(f32::MIN_POSITIVE),
                    "{} values: got {got}, want {want}", row.len()
                );
            }
        }
    }

    #[test]
    fn sums_start_from_positive_zero() {
        for len in [1, 31, 32, 33, 1024, 1025] {
            let s = reduce_row(ReduceOp::Sum, &vec![-0.0; len]);
            assert!(s == 0.0 && s.is_sign_positive(), "{len} values of -0.0 sum to {s}");
        }
    }

    #[test]
    fn sums_of_many_ones_are_exact() {
        // Every partial sum is an integer far below 2^24.
        for len in [0, 1, 7, 32, 1000, 1024, 4097, 100_000] {
            assert_eq!(reduce_row(ReduceOp::Sum, &vec![1.0; len]), len as f32);
        }
    }

    #[test]
    fn sums_propagate_nan_and_infinity() {
        let mut x = vec![1.0f32; 100];
        x[57] = f32::INFINITY;
        assert_eq!(reduce_row(ReduceOp::Sum, &x), f32::INFINITY);
        x[3] = f32::NEG_INFINITY;
        assert!(reduce_row(ReduceOp::Sum, &x).is_nan());
        x[3] = f32::NAN;
        assert!(reduce_row(ReduceOp::Mean, &x).is_nan());
    }
}
