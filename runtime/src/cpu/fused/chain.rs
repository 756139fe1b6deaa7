//! Chains: element-wise work kept in vector registers.
//!
//! A tile runs each instruction as a loop over the whole tile, so every
//! intermediate value goes to scratch and is read back by the next
//! instruction. A register whose only reader is an element-wise
//! instruction (or a sum over its row) is instead *inlined* into that
//! reader, and so is one that is cheap to compute again (one op on values
//! already in memory, like `x - mean`) when all its readers can take it.
//! The reader then evaluates its whole chain (`x - mean`, `* rstd`,
//! `* weight`, `+ bias`) [`STRIP`] values at a time in registers, and only
//! the chain's end is written, or summed. A LayerNorm then reads its input
//! three times and writes once, as a hand-written kernel does.
//!
//! A chain computes every value with the same f32 operations in the same
//! order as the unfused instructions, and a chained sum adds in the lanes
//! and blocks of the tile's row sums, so fusing changes no bit of a result.

use rewrite_rules::program::{Instr, Reg};
use smallvec::SmallVec;
use trace_ir::{BinaryOp, ReduceOp};

use super::loops::{Home, Level, LoopExec, RunState, Scratch, Tile};
use super::tile::{elem_of, widen_lanes, Isa, SUM_BLOCK, SUM_LANES};

/// Values per strip: a row sum's lanes, so a chained sum adds each value
/// in the lane the unfused sum adds it in, in its order.
pub(crate) const STRIP: usize = SUM_LANES;

/// One step of a chain, applied to the running value `v` (an
/// [`arithmetic`] op).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// `op(v, other)`, or `op(other, v)` when `swapped`.
    Binary { op: BinaryOp, other: Reg, swapped: bool },
    /// `op(v, v)`: a square, say.
    Both(BinaryOp),
}

/// What a reader evaluates: `head`, then `steps` in order (its own op
/// last, unless it is a sum, which adds the chain's values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chain {
    pub head: Reg,
    pub steps: Vec<Step>,
}

impl Chain {
    /// The registers the chain reads: its head and the steps' operands.
    pub(crate) fn leaves(&self) -> SmallVec<[Reg; 4]> {
        let mut out: SmallVec<[Reg; 4]> = SmallVec::new();
        let others = self.steps.iter().filter_map(|s| match s {
            Step::Binary { other, .. } => Some(*other),
            _ => None,
        });
        for r in std::iter::once(self.head).chain(others) {
            if !out.contains(&r) {
                out.push(r);
            }
        }
        out
    }
}

/// Which registers are inlined, and the chain each of their readers runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fusion {
    pub inlined: Vec<bool>,
    pub chains: Vec<Option<Chain>>,
}

impl Fusion {
    /// Nothing fused: every instruction runs on its own.
    pub(crate) fn none(n: usize) -> Fusion {
        Fusion { inlined: vec![false; n], chains: vec![None; n] }
    }
}

/// The chains of a kernel (`level` per register, `stored` registers,
/// `row_dims` reduced dimensions).
pub(crate) fn fuse(instrs: &[Instr], level: &[Level], stored: &[Reg], row_dims: usize) -> Fusion {
    let n = instrs.len();
    // Without row dimensions a row value has no row to be constant along.
    if row_dims == 0 && level.contains(&Level::Row) {
        return Fusion::none(n);
    }
    let mut readers: Vec<SmallVec<[Reg; 2]>> = vec![SmallVec::new(); n];
    for (i, ins) in instrs.iter().enumerate() {
        for o in ins.operands() {
            if !readers[o].contains(&i) {
                readers[o].push(i);
            }
        }
    }
    let step = |i: usize| {
        level[i] == Level::Elem && matches!(instrs[i], Instr::Binary { op, .. } if arithmetic(op))
    };
    let sum_of_elems = |i: usize| {
        matches!(instrs[i], Instr::Reduce { op: ReduceOp::Sum | ReduceOp::Mean, x }
            if row_dims > 0 && level[x] == Level::Elem)
    };
    // In memory when a tile reads it: loads, and values per row or run.
    let in_memory =
        |r: usize| level[r] != Level::Elem || matches!(instrs[r], Instr::Load { .. } | Instr::Acc);
    let candidate: Vec<bool> = (0..n)
        .map(|r| {
            step(r)
                && !stored.contains(&r)
                && !readers[r].is_empty()
                && readers[r].iter().all(|&c| step(c) || sum_of_elems(c))
                && (readers[r].len() == 1 || instrs[r].operands().iter().all(|&o| in_memory(o)))
        })
        .collect();
    // The operand a reader would chain: one per reader.
    let chosen = |c: usize| -> Option<Reg> {
        match instrs[c] {
            Instr::Reduce { x, .. } => candidate[x].then_some(x),
            Instr::Binary { a, b, .. } => [a, b].into_iter().find(|&o| candidate[o]),
            _ => None,
        }
    };
    let inlined: Vec<bool> =
        (0..n).map(|r| candidate[r] && readers[r].iter().all(|&c| chosen(c) == Some(r))).collect();
    let chains = (0..n)
        .map(|c| {
            if inlined[c] || !instrs[c].operands().iter().any(|&o| inlined[o]) {
                return None;
            }
            let mut steps = Vec::new();
            let head = match instrs[c] {
                Instr::Reduce { x, .. } => expr(instrs, &inlined, x, &mut steps),
                _ => expr(instrs, &inlined, c, &mut steps),
            };
            Some(Chain { head, steps })
        })
        .collect();
    Fusion { inlined, chains }
}

/// Appends the steps computing `r` from its chain's head, and returns the head.
fn expr(instrs: &[Instr], inlined: &[bool], r: Reg, steps: &mut Vec<Step>) -> Reg {
    let from = |x: Reg, steps: &mut Vec<Step>| {
        if inlined[x] {
            expr(instrs, inlined, x, steps)
        } else {
            x
        }
    };
    let (head, step) = match instrs[r] {
        Instr::Binary { op, a, b } if a == b && inlined[a] => (from(a, steps), Step::Both(op)),
        Instr::Binary { op, a, b } if inlined[b] && !inlined[a] => {
            (from(b, steps), Step::Binary { op, other: a, swapped: true })
        }
        Instr::Binary { op, a, b } => {
            (from(a, steps), Step::Binary { op, other: b, swapped: false })
        }
        // Only element-wise instructions are inlined (see `fuse`).
        _ => unreachable!("a chain through {:?}", instrs[r]),
    };
    steps.push(step);
    head
}

/// A chain operand over a tile.
#[derive(Clone, Copy)]
enum Val<'a> {
    /// One value per element of the tile.
    E(&'a [f32]),
    /// A scalar register.
    S(f32),
    /// One value per row of the tile: like a scalar along the row, except
    /// that a power of a row value of 2 is `powf`, as unfused.
    R(&'a [f32]),
}

/// Where a strip is: its row in the tile, and its first element's index in
/// the tile.
#[derive(Clone, Copy)]
struct At {
    row: usize,
    k: usize,
}

/// Runs chain `chain` of register `reg` over tile `t` with the code of
/// `isa`: into the register's home, or as its row sums. Compiled apart
/// from the tile body: inlined there, it made the body large enough that
/// LLVM left the transcendentals' closures out of line, without the
/// body's instruction set.
pub(crate) fn run_chain(
    isa: Isa,
    exec: &LoopExec,
    rs: &RunState<'_>,
    s: &mut Scratch,
    t: Tile,
    reg: Reg,
    chain: &Chain,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` saw every feature these functions enable.
        Isa::Avx512 => unsafe { chain_avx512(exec, rs, s, t, reg, chain) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { chain_avx2(exec, rs, s, t, reg, chain) },
        _ => chain_body(exec, rs, s, t, reg, chain),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn chain_avx512(
    exec: &LoopExec,
    rs: &RunState<'_>,
    s: &mut Scratch,
    t: Tile,
    reg: Reg,
    chain: &Chain,
) {
    chain_body(exec, rs, s, t, reg, chain)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chain_avx2(
    exec: &LoopExec,
    rs: &RunState<'_>,
    s: &mut Scratch,
    t: Tile,
    reg: Reg,
    chain: &Chain,
) {
    chain_body(exec, rs, s, t, reg, chain)
}

#[inline(always)]
fn chain_body(
    exec: &LoopExec,
    rs: &RunState<'_>,
    s: &mut Scratch,
    t: Tile,
    reg: Reg,
    chain: &Chain,
) {
    // The tile's rows (one, without row dimensions) and their length.
    let (rows, len) = if exec.kernel.row_dims > 0 { (t.nr, rs.cols) } else { (1, t.len) };
    let reduce = match exec.kernel.instrs[reg] {
        Instr::Reduce { op, .. } => Some(op),
        _ => None,
    };
    let slot = exec.slot[reg];
    let mut out = match (reduce, rs.homes[reg]) {
        (Some(_), _) => std::mem::take(&mut s.row[slot]),
        (None, Home::Output(_)) => Vec::new(),
        (None, _) => std::mem::take(&mut s.elem[slot]),
    };
    {
        let (elem, row) = (&s.elem, &s.row);
        let val = |r: Reg| -> Val<'_> {
            match exec.level[r] {
                Level::Scalar => Val::S(rs.scalars[r]),
                Level::Row => Val::R(&row[exec.slot[r]][..t.nr]),
                Level::Elem => Val::E(elem_of(exec, rs, elem, t, r)),
            }
        };
        let head = val(chain.head);
        let steps: SmallVec<[(Step, Val<'_>); 8]> = chain
            .steps
            .iter()
            .map(|&st| match st {
                Step::Binary { other, .. } => (st, val(other)),
                _ => (st, Val::S(0.0)),
            })
            .collect();
        match reduce {
            Some(op) => {
                for (j, o) in out[..rows].iter_mut().enumerate() {
                    *o = row_sum(op, head, &steps, j, len);
                }
            }
            None => {
                let dst: &mut [f32] = match rs.homes[reg] {
                    // SAFETY: tiles write disjoint ranges of every output.
                    Home::Output(o) => unsafe { rs.outputs[o].f32_run(t.start, t.len) },
                    _ => &mut out[..t.len],
                };
                for j in 0..rows {
                    fill(&mut dst[j * len..(j + 1) * len], head, &steps, j, len);
                }
            }
        }
    }
    match (reduce, rs.homes[reg]) {
        (Some(_), _) => s.row[slot] = out,
        (None, Home::Output(_)) => {}
        (None, _) => s.elem[slot] = out,
    }
}

/// `dst[i]` = the chain's value at element `i` of row `j` (`len` long).
#[inline(always)]
fn fill(dst: &mut [f32], head: Val<'_>, steps: &[(Step, Val<'_>)], j: usize, len: usize) {
    let full = len - len % STRIP;
    for k in (0..full).step_by(STRIP) {
        let v = strip(head, steps, At { row: j, k: j * len + k });
        let d: &mut [f32; STRIP] = (&mut dst[k..k + STRIP]).try_into().expect("a strip");
        *d = v;
    }
    if full < len {
        let v = tail(head, steps, At { row: j, k: j * len + full }, len - full);
        dst[full..].copy_from_slice(&v[..len - full]);
    }
}

/// The chain's sum (or mean) over row `j` (`len` long), added as
/// `tile::sum_row` adds the same values.
#[inline(always)]
fn row_sum(op: ReduceOp, head: Val<'_>, steps: &[(Step, Val<'_>)], j: usize, len: usize) -> f32 {
    let mut total = 0.0f64;
    let full = len - len % STRIP;
    let mut block_start = 0;
    while block_start < len {
        let block_end = (block_start + SUM_BLOCK).min(len);
        let mut acc = [0.0f32; SUM_LANES];
        let mut k = block_start;
        while k + STRIP <= block_end.min(full) {
            let v = strip(head, steps, At { row: j, k: j * len + k });
            for half in 0..STRIP / SUM_LANES {
                for i in 0..SUM_LANES {
                    acc[i] += v[half * SUM_LANES + i];
                }
            }
            k += STRIP;
        }
        if k < block_end {
            // The row's last values, padded with zeros as the sum pads them
            // (a round of lanes past them would add only zeros: skipped).
            let rem = block_end - k;
            let mut v = tail(head, steps, At { row: j, k: j * len + k }, rem);
            v[rem..].fill(0.0);
            for half in 0..rem.div_ceil(SUM_LANES) {
                for i in 0..SUM_LANES {
                    acc[i] += v[half * SUM_LANES + i];
                }
            }
        }
        total += widen_lanes(&acc);
        block_start = block_end;
    }
    match op {
        ReduceOp::Mean if len == 0 => f32::NAN,
        ReduceOp::Mean => (total / len as f64) as f32,
        _ => total as f32,
    }
}

/// The chain over the `rem < STRIP` elements at `at`, through copies
/// padded to a strip (the padding's values are garbage, never used).
#[inline(never)]
fn tail(head: Val<'_>, steps: &[(Step, Val<'_>)], at: At, rem: usize) -> [f32; STRIP] {
    let pad = |v: Val<'_>| -> [f32; STRIP] {
        let mut p = [0.0f32; STRIP];
        if let Val::E(x) = v {
            p[..rem].copy_from_slice(&x[at.k..at.k + rem]);
        }
        p
    };
    let head_pad = pad(head);
    let pads: SmallVec<[[f32; STRIP]; 8]> = steps.iter().map(|&(_, v)| pad(v)).collect();
    let head = match head {
        Val::E(_) => Val::E(&head_pad[..]),
        v => v,
    };
    let steps: SmallVec<[(Step, Val<'_>); 8]> = steps
        .iter()
        .zip(&pads)
        .map(|(&(st, v), p)| match v {
            Val::E(_) => (st, Val::E(&p[..])),
            v => (st, v),
        })
        .collect();
    strip(head, &steps, At { row: at.row, k: 0 })
}

/// The chain's values at the strip `at`, in registers.
///
/// `v` stays in vector registers only while every access to it has a
/// constant index after unrolling, as in the four arithmetic ops (an op
/// that took it through memory, or lane by lane, would spill it at every
/// step of every strip).
#[inline(always)]
fn strip(head: Val<'_>, steps: &[(Step, Val<'_>)], at: At) -> [f32; STRIP] {
    let mut v = [0.0f32; STRIP];
    let splat = |v: &mut [f32; STRIP], c: f32| {
        for x in v.iter_mut() {
            *x = c;
        }
    };
    match head {
        Val::E(x) => {
            v = x[at.k..at.k + STRIP].try_into().expect("a strip");
        }
        Val::S(c) => splat(&mut v, c),
        Val::R(r) => splat(&mut v, r[at.row]),
    }
    for &(step, other) in steps {
        apply(step, other, at, &mut v);
    }
    v
}

/// The ops a chain computes: those whose strips stay in registers (see
/// [`strip`]).
pub(crate) fn arithmetic(op: BinaryOp) -> bool {
    matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div)
}

/// `v = op(v, y)` (or `op(y, v)`), every index constant after unrolling.
#[inline(always)]
fn arith(op: BinaryOp, v: &mut [f32; STRIP], y: impl Fn(usize) -> f32, swapped: bool) {
    macro_rules! each {
        ($f:expr) => {{
            let f = $f;
            if swapped {
                for i in 0..STRIP {
                    v[i] = f(y(i), v[i]);
                }
            } else {
                for i in 0..STRIP {
                    v[i] = f(v[i], y(i));
                }
            }
        }};
    }
    match op {
        BinaryOp::Add => each!(|a: f32, b: f32| a + b),
        BinaryOp::Sub => each!(|a: f32, b: f32| a - b),
        BinaryOp::Mul => each!(|a: f32, b: f32| a * b),
        // Only the four arithmetic ops are chained (`fuse`).
        _ => each!(|a: f32, b: f32| a / b),
    }
}

#[inline(always)]
fn apply(step: Step, other: Val<'_>, at: At, v: &mut [f32; STRIP]) {
    match (step, other) {
        (Step::Both(op), _) => {
            let w = *v;
            arith(op, v, |i| w[i], false)
        }
        (Step::Binary { op, swapped, .. }, Val::S(c)) => arith(op, v, |_| c, swapped),
        (Step::Binary { op, swapped, .. }, Val::R(r)) => {
            let c = r[at.row];
            arith(op, v, |_| c, swapped)
        }
        (Step::Binary { op, swapped, .. }, Val::E(y)) => {
            let y: &[f32; STRIP] = y[at.k..at.k + STRIP].try_into().expect("a strip");
            arith(op, v, |i| y[i], swapped)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewrite_rules::program::{Frame, View};
    use trace_ir::UnaryOp;

    fn load(input: usize) -> Instr {
        Instr::Load { input, view: View::Direct, frame: Frame::Elem }
    }
    fn bin(op: BinaryOp, a: Reg, b: Reg) -> Instr {
        Instr::Binary { op, a, b }
    }
    fn mean(x: Reg) -> Instr {
        Instr::Reduce { op: ReduceOp::Mean, x }
    }
    fn levels(instrs: &[Instr]) -> Vec<Level> {
        let mut level: Vec<Level> = Vec::new();
        for ins in instrs {
            let l = match ins {
                Instr::Load { input: 1, .. } => Level::Scalar,
                Instr::Load { .. } => Level::Elem,
                Instr::Reduce { .. } => Level::Row,
                _ => ins.operands().iter().map(|&o| level[o]).max().unwrap_or(Level::Scalar),
            };
            level.push(l);
        }
        level
    }

    #[test]
    fn a_layer_norm_reads_its_input_in_three_chains_and_writes_once() {
        use BinaryOp::{Add, Mul, Sub};
        // x, eps, mu, d = x - mu, d * d, var, var + eps, rsqrt, d * rs, w, * w, b, + b
        let instrs = vec![
            load(0),
            load(1),
            mean(0),
            bin(Sub, 0, 2),
            bin(Mul, 3, 3),
            mean(4),
            bin(Add, 5, 1),
            Instr::Unary { op: UnaryOp::Rsqrt, x: 6 },
            bin(Mul, 3, 7),
            load(2),
            bin(Mul, 8, 9),
            load(3),
            bin(Add, 10, 11),
        ];
        let f = fuse(&instrs, &levels(&instrs), &[12], 1);
        let inlined: Vec<Reg> = (0..instrs.len()).filter(|&r| f.inlined[r]).collect();
        // `d` is one op on values in memory: computed again by both readers.
        assert_eq!(inlined, [3, 4, 8, 10]);
        let sub = Step::Binary { op: Sub, other: 2, swapped: false };
        assert_eq!(f.chains[5], Some(Chain { head: 0, steps: vec![sub, Step::Both(Mul)] }));
        let step = |op, other| Step::Binary { op, other, swapped: false };
        let out = Chain { head: 0, steps: vec![sub, step(Mul, 7), step(Mul, 9), step(Add, 11)] };
        assert_eq!(f.chains[12], Some(out));
        assert_eq!(f.chains[12].as_ref().map(Chain::leaves).unwrap().as_slice(), [0, 2, 7, 9, 11]);
        let chained: Vec<Reg> = (0..instrs.len()).filter(|&r| f.chains[r].is_some()).collect();
        assert_eq!(chained, [5, 12]);
    }

    #[test]
    fn only_values_every_reader_chains_are_inlined() {
        use BinaryOp::{Add, Mul, Sub};
        // s = x + y is read by an exp, which does not chain: computed.
        let instrs =
            vec![load(0), load(2), bin(Add, 0, 1), Instr::Unary { op: UnaryOp::Exp, x: 2 }];
        assert_eq!(fuse(&instrs, &levels(&instrs), &[3], 0), Fusion::none(4));
        // Stored: computed. A product of computed values read twice: computed
        // once, not twice.
        let instrs =
            vec![load(0), load(2), bin(Add, 0, 1), bin(Mul, 2, 2), bin(Sub, 3, 0), bin(Add, 3, 4)];
        let f = fuse(&instrs, &levels(&instrs), &[2, 5], 0);
        assert_eq!(f.inlined, [false, false, false, false, true, false]);
        let step = |op, other| Step::Binary { op, other, swapped: false };
        let add = Step::Binary { op: Add, other: 3, swapped: true }; // 3 + (3 - x)
        assert_eq!(f.chains[5], Some(Chain { head: 3, steps: vec![step(Sub, 0), add] }));
        // The right operand chained: the left one is the step's operand.
        let instrs = vec![load(0), load(2), bin(Mul, 0, 1), bin(Sub, 0, 2)];
        let f = fuse(&instrs, &levels(&instrs), &[3], 0);
        let swapped = Step::Binary { op: Sub, other: 0, swapped: true };
        assert_eq!(f.chains[3], Some(Chain { head: 0, steps: vec![step(Mul, 1), swapped] }));
        // Without row dimensions nothing is summed along a row.
        let instrs = vec![load(0), bin(Mul, 0, 0), mean(1)];
        assert!(fuse(&instrs, &levels(&instrs), &[2], 0).chains[2].is_none());
    }
}
