//! Loop kernels: compiled once from a [`LoopKernel`] (register levels and
//! slots), then run on buffers of any size with the compiled rank and
//! broadcast pattern (the iteration shape is read from the inputs).
//!
//! A run splits the iteration space into tiles of about [`TILE`] elements
//! (whole rows for row kernels, so each reduction sees its row at once; a
//! row longer than a tile is a tile of its own), evaluates scalar-only
//! instructions once, and runs the tiles on rayon when the work is large.

use std::sync::Arc;

use rayon::prelude::*;
use rewrite_rules::program::{Frame, Instr, LoopKernel, Reg, View};
use smallvec::SmallVec;
use trace_ir::shape::numel;
use trace_ir::{DType, Meta, Result, Shape};

use super::io::{alloc_output, Access, Data, Donated, Dst};
use super::norm::NormForm;
use super::softmax::SoftmaxForm;
use super::tile::{reduce_const, round_to, run_tile, with_binary, with_unary, Isa};
use crate::buffer::Buffer;
use crate::cpu::elem::{row_major, Strides};
use crate::cpu::{check_alloc, host, internal};
use crate::host_data::HostData;
use crate::memory::MemoryTracker;

/// Elements per tile: a handful of f32 registers of this size stay in L1/L2.
pub(crate) const TILE: usize = 8192;
/// Runs with at least this many elements use rayon.
const PAR_ELEMS: usize = 128 * 1024;

/// How many values a register holds per tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Scalar,
    Row,
    Elem,
}

/// Where a store writes: over the whole iteration space, or one value per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreLayout {
    Full,
    Rows,
}

#[derive(Debug)]
pub(crate) struct StoreSpec {
    pub reg: Reg,
    pub output: usize,
    pub layout: StoreLayout,
    frame: Frame,
}

#[derive(Debug)]
struct LoadSpec {
    /// Kernel input, or `None` for the matmul accumulator.
    input: Option<usize>,
    view: View,
    frame: Frame,
    /// The compile-time shape, aligned to the iteration rank.
    aligned: Shape,
}

/// A loop kernel ready to run.
pub(crate) struct LoopExec {
    pub kernel: LoopKernel,
    pub level: Vec<Level>,
    /// Register slot within its level's pool.
    pub slot: Vec<usize>,
    n_elem: usize,
    n_row: usize,
    scalar_order: Vec<Reg>,
    pub tile_order: Vec<Reg>,
    pub stores: Vec<StoreSpec>,
    loads: Vec<Option<LoadSpec>>,
    inputs: Vec<Meta>,
    outputs: Vec<Meta>,
    /// Whether each register depends on a reduction's result.
    pub after_reduce: Vec<bool>,
    /// No per-element register depends on a reduction: long rows can be
    /// walked in chunks.
    pub chunked: bool,
    /// The kernel is a LayerNorm, which runs row by row when its operands
    /// allow (see [`super::norm`]).
    pub(crate) norm: Option<NormForm>,
    /// The kernel is a softmax, which runs row by row when its operands
    /// allow (see [`super::softmax`]).
    pub(crate) softmax: Option<SoftmaxForm>,
}

/// What one run shares with every tile.
pub(crate) struct RunState<'a> {
    pub shape: Shape,
    pub outer: Shape,
    pub cols: usize,
    pub scalars: Vec<f32>,
    /// Per register; only loads' entries are used.
    pub loads: Vec<LoadRt<'a>>,
    /// Per register: where its element values live during a tile.
    pub homes: Vec<Home<'a>>,
    pub outputs: Vec<Dst>,
    /// This run's LayerNorm form, when it runs row by row.
    pub norm: Option<NormForm>,
    /// This run's softmax form, when it runs row by row.
    pub softmax: Option<SoftmaxForm>,
}

/// The operand whose memory an output takes (see `LoopExec::donors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Donor {
    Input(usize),
    /// The matmul product an epilogue reads.
    Acc,
}

/// Where an element-level register lives. Contiguous f32 inputs are read in
/// place and a value stored to an f32 output is computed straight into it,
/// so the common elementwise kernel makes no copies through scratch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Home<'a> {
    Scratch,
    /// An f32 load over contiguous data: the tile reads `data[start..]`.
    Input(&'a [f32]),
    /// Computed into this (f32, full-layout) output.
    Output(usize),
    /// A load that repeats with a period every tile starts on (a bias or a
    /// LayerNorm weight along the rows): read once per worker into this
    /// scratch register, which every tile then reads in place.
    Repeated(usize),
}

pub(crate) struct LoadRt<'a> {
    pub data: Data<'a>,
    pub access: Access,
}

/// One worker's registers.
pub(crate) struct Scratch {
    pub elem: Vec<Vec<f32>>,
    pub row: Vec<Vec<f32>>,
    pub tmp: [Vec<f32>; 3],
}

thread_local! {
    /// Scratch registers of finished runs on this thread, for the next run:
    /// in a loop, a kernel launch then allocates and zeroes nothing.
    static SPARE: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// At most this many spare registers are kept per thread (up to a tile each).
const SPARE_LIMIT: usize = 64;

/// A register of at least `len` floats (the tiles slice it to their length);
/// only what grows is zeroed.
fn spare(len: usize) -> Vec<f32> {
    if len == 0 {
        return Vec::new(); // an unused register (`tmp` without a `where`)
    }
    let mut v = SPARE.with_borrow_mut(Vec::pop).unwrap_or_default();
    if v.len() < len {
        v.resize(len, 0.0);
    }
    v
}

impl Scratch {
    fn new(n_elem: usize, elem_cap: usize, n_row: usize, row_cap: usize, tmp: bool) -> Scratch {
        let tmp_cap = if tmp { elem_cap.max(row_cap) } else { 0 };
        Scratch {
            elem: (0..n_elem).map(|_| spare(elem_cap)).collect(),
            row: (0..n_row).map(|_| spare(row_cap)).collect(),
            tmp: [spare(tmp_cap), spare(tmp_cap), spare(tmp_cap)],
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        SPARE.with_borrow_mut(|spare| {
            let regs = self.elem.drain(..).chain(self.row.drain(..));
            let regs = regs.chain(self.tmp.iter_mut().map(std::mem::take));
            for v in regs.filter(|v| v.capacity() > 0) {
                if spare.len() >= SPARE_LIMIT {
                    break;
                }
                spare.push(v);
            }
        })
    }
}

/// A tile: elements `start..start + len` of the space, rows `r0..r0 + nr`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tile {
    pub start: usize,
    pub len: usize,
    pub r0: usize,
    pub nr: usize,
}

/// Right-aligns `shape` to the iteration rank `r` in `frame` (`k` row dims).
fn align_frame(shape: &[usize], frame: Frame, r: usize, k: usize) -> Option<Shape> {
    let width = match frame {
        Frame::Elem => r,
        Frame::Row => r - k,
    };
    if shape.len() > width {
        return None;
    }
    let mut a: Shape = SmallVec::from_elem(1, width - shape.len());
    a.extend_from_slice(shape);
    a.extend(std::iter::repeat_n(1, r - width));
    Some(a)
}

/// Position in the iteration shape of each dimension of a value of rank `len` in `frame`.
fn positions(len: usize, frame: Frame, r: usize, k: usize) -> impl Iterator<Item = usize> {
    let width = if frame == Frame::Elem { r } else { r - k };
    (0..len).map(move |i| width - len + i)
}

/// The view's shape, strides and offset over a buffer of shape `source`.
pub(crate) fn view_geometry(view: &View, source: &[usize]) -> Result<(Shape, Strides, usize)> {
    Ok(match view {
        View::Direct => (source.into(), row_major(source), 0),
        View::Transposed => {
            let r = source.len();
            if r < 2 {
                return Err(internal("a transposed view needs two dimensions"));
            }
            let (mut s, mut st): (Shape, Strides) = (source.into(), row_major(source));
            s.swap(r - 2, r - 1);
            st.swap(r - 2, r - 1);
            (s, st, 0)
        }
        View::Strided { shape, strides, offset, source: want, .. } => {
            if want.as_slice() != source {
                return Err(internal(format!(
                    "a strided view expects a buffer of shape {:?}, got {source:?}",
                    want.as_slice()
                )));
            }
            if shape.len() != strides.len() {
                return Err(internal("a strided view has mismatched strides"));
            }
            // Every element the view reaches must be in the buffer.
            let last: usize = offset
                + shape.iter().zip(strides).map(|(&d, &s)| d.saturating_sub(1) * s).sum::<usize>();
            if numel(shape) > 0 && last >= numel(source) {
                return Err(internal("a strided view reaches past its buffer"));
            }
            (shape.clone(), strides.clone(), *offset)
        }
    })
}

/// A loop kernel checked against its operands' metas: what each register
/// holds per tile and how its loads and stores read and write.
#[derive(Debug)]
pub(crate) struct Checked {
    /// Per register.
    pub level: Vec<Level>,
    /// Per register: `Some` for loads and the accumulator.
    loads: Vec<Option<LoadSpec>>,
    pub stores: Vec<StoreSpec>,
}

/// Checks `kernel` against its inputs' and outputs' metas and derives each
/// register's [`Level`]. `epilogue` allows [`Instr::Acc`]. Every index in
/// the kernel is checked, so a malformed kernel is an error, not a panic.
pub(crate) fn check(
    kernel: &LoopKernel,
    inputs: &[Meta],
    outputs: &[Meta],
    epilogue: bool,
) -> Result<Checked> {
    let s = &kernel.shape;
    let (r, k) = (s.len(), kernel.row_dims);
    if k > r {
        return Err(internal(format!("loop reduces {k} dims of a rank-{r} space")));
    }
    let n = kernel.instrs.len();
    let mut level = Vec::with_capacity(n);
    let mut loads = Vec::with_capacity(n);
    for (i, ins) in kernel.instrs.iter().enumerate() {
        if ins.operands().iter().any(|&o| o >= i) {
            return Err(internal(format!("instruction {i} reads a register defined later")));
        }
        let lv = |j: usize| level[j];
        let (l, spec) = match ins {
            Instr::Load { input, view, frame } => {
                let meta = inputs
                    .get(*input)
                    .ok_or_else(|| internal(format!("load of missing input {input}")))?;
                let (vshape, _, _) = view_geometry(view, &meta.shape)?;
                let aligned = align_frame(&vshape, *frame, r, k)
                    .filter(|a| a.iter().zip(s).all(|(&x, &y)| x == y || x == 1))
                    .ok_or_else(|| {
                        internal(format!(
                            "input {input} of shape {:?} does not fit loop {:?}",
                            vshape.as_slice(),
                            s.as_slice()
                        ))
                    })?;
                let l = if aligned.iter().all(|&d| d == 1) {
                    Level::Scalar
                } else if k > 0 && aligned[r - k..].iter().all(|&d| d == 1) {
                    Level::Row
                } else {
                    Level::Elem
                };
                let spec =
                    LoadSpec { input: Some(*input), view: view.clone(), frame: *frame, aligned };
                (l, Some(spec))
            }
            Instr::Acc => {
                if !epilogue {
                    return Err(internal("the matmul accumulator is read outside an epilogue"));
                }
                let spec = LoadSpec {
                    input: None,
                    view: View::Direct,
                    frame: Frame::Elem,
                    aligned: s.clone(),
                };
                (Level::Elem, Some(spec))
            }
            Instr::Literal { .. } => (Level::Scalar, None),
            Instr::Unary { x, .. } | Instr::Round { x, .. } => (lv(*x), None),
            Instr::Binary { a, b, .. } => (lv(*a).max(lv(*b)), None),
            Instr::Where { c, a, b } => (lv(*c).max(lv(*a)).max(lv(*b)), None),
            Instr::Reduce { x, .. } => {
                if k == 0 {
                    return Err(internal("a reduction in a loop without row dimensions"));
                }
                (if lv(*x) == Level::Scalar { Level::Scalar } else { Level::Row }, None)
            }
        };
        level.push(l);
        loads.push(spec);
    }
    let mut outer = s.clone();
    for d in outer.iter_mut().skip(r - k) {
        *d = 1;
    }
    let mut stores = Vec::new();
    for st in &kernel.stores {
        let meta = outputs
            .get(st.output)
            .ok_or_else(|| internal(format!("store to missing output {}", st.output)))?;
        if st.reg >= n {
            return Err(internal(format!("store of missing register {}", st.reg)));
        }
        if !(meta.dtype.is_float() || meta.dtype == DType::Bool) {
            return Err(internal(format!("a loop cannot store {} values", meta.dtype)));
        }
        let a = align_frame(&meta.shape, st.frame, r, k);
        let layout = match a {
            Some(a) if a == *s => StoreLayout::Full,
            Some(a) if k > 0 && a == outer && level[st.reg] != Level::Elem => StoreLayout::Rows,
            _ => {
                return Err(internal(format!(
                    "output of shape {:?} does not match loop {:?}",
                    meta.shape.as_slice(),
                    s.as_slice()
                )))
            }
        };
        stores.push(StoreSpec { reg: st.reg, output: st.output, layout, frame: st.frame });
    }
    Ok(Checked { level, loads, stores })
}

/// The order a tile runs a kernel's instructions in, and where their
/// per-tile values live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Schedule {
    /// Per register: its slot in its level's pool (0 for scalars, which
    /// have no slot).
    pub slot: Vec<usize>,
    /// Slots of the element-level pool.
    pub n_elem: usize,
    /// Slots of the row-level pool.
    pub n_row: usize,
    /// Scalar registers, evaluated once per run, in order.
    pub scalar_order: Vec<Reg>,
    /// Row- and element-level registers, evaluated per tile, in order.
    pub tile_order: Vec<Reg>,
    /// Per register: whether it depends on a reduction's result.
    pub after_reduce: Vec<bool>,
    /// No element-level register depends on a reduction, so a row longer
    /// than a tile can be walked in chunks.
    pub chunked: bool,
}

/// Register slots for a run order ([`assign_slots`]); see [`Schedule`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slots {
    pub slot: Vec<usize>,
    pub n_elem: usize,
    pub n_row: usize,
    pub scalar_order: Vec<Reg>,
    pub tile_order: Vec<Reg>,
}

/// Checks that `instrs` only read earlier registers, `level` has one entry
/// per instruction and `stored` names registers: what [`run_order`] and
/// [`assign_slots`] index by.
fn check_indices(instrs: &[Instr], level: &[Level], stored: &[Reg]) -> Result<()> {
    if level.len() != instrs.len() {
        return Err(internal(format!("{} levels for {} instructions", level.len(), instrs.len())));
    }
    if let Some(i) = (0..instrs.len()).find(|&i| instrs[i].operands().iter().any(|&o| o >= i)) {
        return Err(internal(format!("instruction {i} reads a register defined later")));
    }
    if let Some(r) = stored.iter().find(|&&r| r >= instrs.len()) {
        return Err(internal(format!("store of missing register {r}")));
    }
    Ok(())
}

/// The order tiles run `instrs` in (levels `level`, `row_dims` reduced
/// dimensions), with each register's dependence on a reduction and whether
/// long rows may be walked in chunks. A kernel that may be chunked runs its
/// reductions, and what reads them, after everything else (see
/// `chunked_body`); it runs in that order on every path, so slots
/// allocated in this order are right on every path.
pub(crate) fn run_order(
    instrs: &[Instr],
    level: &[Level],
    row_dims: usize,
) -> Result<(Vec<Reg>, Vec<bool>, bool)> {
    check_indices(instrs, level, &[])?;
    let n = instrs.len();
    let mut after_reduce = vec![false; n];
    for (i, ins) in instrs.iter().enumerate() {
        after_reduce[i] = ins
            .operands()
            .iter()
            .any(|&o| after_reduce[o] || matches!(instrs[o], Instr::Reduce { .. }));
    }
    let chunked = row_dims > 0 && (0..n).all(|i| !(after_reduce[i] && level[i] == Level::Elem));
    let late = |i: usize| after_reduce[i] || matches!(instrs[i], Instr::Reduce { .. });
    let order: Vec<Reg> = if chunked {
        (0..n).filter(|&i| !late(i)).chain((0..n).filter(|&i| late(i))).collect()
    } else {
        (0..n).collect()
    };
    Ok((order, after_reduce, chunked))
}

/// Register slots for running `instrs` in `order` (a permutation of the
/// registers in which each runs after its operands): a linear scan that
/// frees a slot after the last instruction reading it, never frees a
/// stored register's (stores run after the tile), and never gives an
/// instruction the slot of one of its own operands (the tile takes the
/// output slot out of its pool while it reads the operands).
pub(crate) fn assign_slots(
    instrs: &[Instr],
    level: &[Level],
    order: &[Reg],
    stored: &[Reg],
) -> Result<Slots> {
    check_indices(instrs, level, stored)?;
    let n = instrs.len();
    let mut position = vec![usize::MAX; n];
    for (pos, &i) in order.iter().enumerate() {
        if i >= n || position[i] != usize::MAX {
            return Err(internal("the run order is not a permutation of the registers"));
        }
        position[i] = pos;
    }
    if order.len() != n {
        return Err(internal("the run order is not a permutation of the registers"));
    }
    if let Some(&i) =
        order.iter().find(|&&i| instrs[i].operands().iter().any(|&o| position[o] > position[i]))
    {
        return Err(internal(format!("the run order puts instruction {i} before an operand")));
    }
    let mut last_use = vec![0usize; n];
    for (pos, &i) in order.iter().enumerate() {
        last_use[i] = last_use[i].max(pos);
        for o in instrs[i].operands() {
            last_use[o] = last_use[o].max(pos);
        }
    }
    for &r in stored {
        last_use[r] = usize::MAX;
    }
    let mut slot = vec![0usize; n];
    let (mut free_e, mut free_r): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let (mut n_elem, mut n_row) = (0usize, 0usize);
    let (mut scalar_order, mut tile_order) = (Vec::new(), Vec::new());
    for (pos, &i) in order.iter().enumerate() {
        match level[i] {
            Level::Scalar => {
                scalar_order.push(i);
                continue;
            }
            Level::Elem => {
                slot[i] = free_e.pop().unwrap_or_else(|| {
                    n_elem += 1;
                    n_elem - 1
                })
            }
            Level::Row => {
                slot[i] = free_r.pop().unwrap_or_else(|| {
                    n_row += 1;
                    n_row - 1
                })
            }
        }
        tile_order.push(i);
        // Freed only now, after `i` took its slot.
        let mut ops: Vec<usize> = instrs[i].operands().to_vec();
        ops.push(i);
        ops.sort_unstable();
        ops.dedup();
        for o in ops {
            if last_use[o] == pos {
                match level[o] {
                    Level::Elem => free_e.push(slot[o]),
                    Level::Row => free_r.push(slot[o]),
                    Level::Scalar => {}
                }
            }
        }
    }
    Ok(Slots { slot, n_elem, n_row, scalar_order, tile_order })
}

/// [`run_order`] then [`assign_slots`] in that order.
pub(crate) fn schedule(
    instrs: &[Instr],
    level: &[Level],
    stored: &[Reg],
    row_dims: usize,
) -> Result<Schedule> {
    let (order, after_reduce, chunked) = run_order(instrs, level, row_dims)?;
    let Slots { slot, n_elem, n_row, scalar_order, tile_order } =
        assign_slots(instrs, level, &order, stored)?;
    Ok(Schedule { slot, n_elem, n_row, scalar_order, tile_order, after_reduce, chunked })
}

impl LoopExec {
    /// Checks `kernel` against its inputs' and outputs' metas ([`check`])
    /// and schedules its registers ([`schedule`]). `epilogue` allows
    /// [`Instr::Acc`].
    pub(crate) fn new(
        kernel: &LoopKernel,
        inputs: Vec<Meta>,
        outputs: Vec<Meta>,
        epilogue: bool,
    ) -> Result<LoopExec> {
        let Checked { level, loads, stores } = check(kernel, &inputs, &outputs, epilogue)?;
        let stored: Vec<Reg> = stores.iter().map(|st| st.reg).collect();
        let Schedule { slot, n_elem, n_row, scalar_order, tile_order, after_reduce, chunked } =
            schedule(&kernel.instrs, &level, &stored, kernel.row_dims)?;
        let norm = NormForm::recognize(kernel, &level, &stores);
        let softmax = SoftmaxForm::recognize(kernel, &level, &stores);
        Ok(LoopExec {
            norm,
            softmax,
            after_reduce,
            chunked,
            kernel: kernel.clone(),
            level,
            slot,
            n_elem,
            n_row,
            scalar_order,
            tile_order,
            stores,
            loads,
            inputs,
            outputs,
        })
    }

    /// The iteration shape of a run: each dimension from the inputs that
    /// span it, else from `planned` (the program's shape at this run's sizes).
    fn runtime_shape(
        &self,
        inputs: &[Arc<Buffer>],
        acc: Option<&[usize]>,
        planned: &[usize],
    ) -> Result<Shape> {
        let ct = &self.kernel.shape;
        if planned.len() != ct.len() {
            return Err(internal("the planned iteration shape changed rank"));
        }
        let (r, k) = (ct.len(), self.kernel.row_dims);
        let mut rt: SmallVec<[Option<usize>; 6]> = SmallVec::from_elem(None, r);
        for spec in self.loads.iter().flatten() {
            let shape: Shape = match spec.input {
                Some(i) => {
                    let m = inputs[i].meta();
                    if m.dtype != self.inputs[i].dtype
                        || m.shape.len() != self.inputs[i].shape.len()
                    {
                        return Err(internal(format!(
                            "input {i} is {:?} {} but the loop was compiled for {:?} {}",
                            m.shape.as_slice(),
                            m.dtype,
                            self.inputs[i].shape.as_slice(),
                            self.inputs[i].dtype
                        )));
                    }
                    view_geometry(&spec.view, &m.shape)?.0
                }
                None => acc.ok_or_else(|| internal("no accumulator"))?.into(),
            };
            let a = align_frame(&shape, spec.frame, r, k)
                .ok_or_else(|| internal("input rank changed"))?;
            for d in 0..r {
                if spec.aligned[d] != 1 {
                    match rt[d] {
                        None => rt[d] = Some(a[d]),
                        Some(v) if v != a[d] => {
                            return Err(internal(format!(
                                "inputs disagree on dimension {d} ({v} vs {})",
                                a[d]
                            )))
                        }
                        _ => {}
                    }
                }
            }
            if let Some(d) = (0..r).find(|&d| spec.aligned[d] == 1 && a[d] != 1) {
                return Err(internal(format!(
                    "an input broadcast along dimension {d} at compile time has size {} now",
                    a[d]
                )));
            }
        }
        Ok((0..r).map(|d| rt[d].unwrap_or(planned[d])).collect())
    }

    /// Runs on `inputs` (the kernel's inputs, in order) and, in an epilogue,
    /// the f32 product `acc` of shape `acc_shape`, with the tile code of
    /// `isa`. `planned` is the program's iteration shape at this run's
    /// sizes (it matters only for dimensions no input spans).
    pub(crate) fn run(
        &self,
        mut inputs: Vec<Arc<Buffer>>,
        acc: Option<Buffer>,
        planned: &[usize],
        tracker: &Arc<MemoryTracker>,
        isa: Isa,
    ) -> Result<Vec<Buffer>> {
        let acc_shape: Option<Shape> = acc.as_ref().map(|b| b.meta().shape.clone());
        let shape = self.runtime_shape(&inputs, acc_shape.as_deref(), planned)?;
        let (r, k) = (shape.len(), self.kernel.row_dims);
        let metas: Vec<Meta> = (0..self.outputs.len())
            .map(|o| {
                let meta = &self.outputs[o];
                let frame =
                    self.stores.iter().find(|s| s.output == o).map_or(Frame::Elem, |s| s.frame);
                let mut dims = meta.shape.clone();
                for (i, p) in positions(dims.len(), frame, r, k).enumerate() {
                    if dims[i] != 1 {
                        dims[i] = shape[p];
                    }
                }
                Meta::new(dims, meta.dtype)
            })
            .collect();
        // Rows of no columns are fine: a max or min in a kernel belongs to a
        // softmax (whose output is as empty as its rows), because a user's
        // max or min over an empty axis is refused when it is recorded
        // (`trace_ir::infer`), as PyTorch refuses it.
        // Operands this run may overwrite with an output, and their memory.
        let donors = self.donors(&mut inputs, acc.is_some(), &metas, &shape);
        let mut acc = acc.and_then(Buffer::into_host_data);
        let donated = |data: Option<&mut HostData>| match data {
            Some(HostData::F32(v)) => Ok(Donated { ptr: v.as_mut_ptr(), len: v.len() }),
            _ => Err(internal("a donated operand is not f32 host data")),
        };
        let mut raw: Vec<Option<Donated>> = vec![None; inputs.len()];
        let mut acc_raw = None;
        for &donor in donors.iter().flatten() {
            match donor {
                Donor::Input(i) => {
                    let buffer = Arc::get_mut(&mut inputs[i])
                        .ok_or_else(|| internal("a donated input is shared"))?;
                    raw[i] = Some(donated(buffer.host_data_mut())?);
                }
                Donor::Acc => acc_raw = Some(donated(acc.as_mut().map(|a| &mut a.0))?),
            }
        }
        // Outputs, allocated (and counted) before the work starts; donated
        // ones are written into their donor.
        let mut outputs: Vec<Option<Buffer>> = Vec::with_capacity(metas.len());
        let mut dsts = Vec::with_capacity(metas.len());
        for (m, donor) in metas.iter().zip(&donors) {
            if let Some(donor) = donor {
                let d = match donor {
                    Donor::Input(i) => raw[*i],
                    Donor::Acc => acc_raw,
                };
                dsts.push(Dst::F32(d.ok_or_else(|| internal("a donor has no memory"))?.ptr));
                outputs.push(None);
                continue;
            }
            check_alloc(m)?;
            let (data, dst) = alloc_output(m.dtype, m.numel(), tracker)
                .ok_or_else(|| internal(format!("a loop cannot store {}", m.dtype)))?;
            outputs.push(Some(Buffer::host(m.clone(), data, tracker)));
            dsts.push(dst);
        }
        self.execute(
            &inputs,
            acc.as_ref().map(|a| &a.0),
            acc_shape.as_deref(),
            (&raw, acc_raw),
            &shape,
            dsts,
            &donors,
            isa,
        )?;
        // Hand each donor's memory to its output.
        let mut inputs: Vec<Option<Arc<Buffer>>> = inputs.into_iter().map(Some).collect();
        for (o, donor) in donors.iter().enumerate() {
            let Some(donor) = donor else { continue };
            let (data, lease) = match donor {
                Donor::Input(i) => inputs[*i]
                    .take()
                    .and_then(|b| Arc::try_unwrap(b).ok())
                    .and_then(Buffer::into_host_data)
                    .ok_or_else(|| internal("a donated input is shared"))?,
                Donor::Acc => {
                    acc.take().ok_or_else(|| internal("the accumulator was donated twice"))?
                }
            };
            outputs[o] = Some(Buffer::from_reused(metas[o].clone(), data, lease));
        }
        if let (Some((data, lease)), Some(s)) = (acc, acc_shape) {
            // Not donated: back to the tracker's cache.
            drop(Buffer::from_reused(Meta::new(s, DType::F32), data, lease));
        }
        outputs
            .into_iter()
            .map(|b| b.ok_or_else(|| internal("an output was not written")))
            .collect()
    }

    /// For each output, the operand whose memory it may take: an f32 operand of the output's size that this
    /// run holds the only reference to, and that every load reads element
    /// for element in iteration order, so each tile reads what it then
    /// overwrites before overwriting it and no tile reads another's part.
    fn donors(
        &self,
        inputs: &mut [Arc<Buffer>],
        has_acc: bool,
        metas: &[Meta],
        shape: &[usize],
    ) -> Vec<Option<Donor>> {
        let total = numel(shape);
        let (r, k) = (shape.len(), self.kernel.row_dims);
        let in_order = |source: Option<usize>| {
            self.loads.iter().enumerate().all(|(reg, spec)| match spec {
                Some(spec) if spec.input == source => {
                    let geometry = match source {
                        Some(i) => {
                            view_geometry(&spec.view, &inputs[i].meta().shape).ok().map(|g| g.0)
                        }
                        None => Some(Shape::from_slice(shape)),
                    };
                    self.level[reg] == Level::Elem
                        && spec.view == View::Direct
                        && geometry
                            .and_then(|g| align_frame(&g, spec.frame, r, k))
                            .is_some_and(|a| a.as_slice() == shape)
                }
                _ => true,
            })
        };
        let eligible: Vec<bool> = (0..inputs.len())
            .map(|i| {
                let m = inputs[i].meta();
                m.dtype == DType::F32 && m.numel() == total && in_order(Some(i))
            })
            .collect();
        let mut acc_free = has_acc && in_order(None);
        let mut free: Vec<bool> = (0..inputs.len())
            .map(|i| eligible[i] && Arc::get_mut(&mut inputs[i]).is_some())
            .collect();
        metas
            .iter()
            .enumerate()
            .map(|(o, m)| {
                let full = self
                    .stores
                    .iter()
                    .filter(|s| s.output == o)
                    .all(|s| s.layout == StoreLayout::Full);
                if m.dtype != DType::F32 || m.numel() != total || total == 0 || !full {
                    return None;
                }
                if acc_free {
                    acc_free = false;
                    return Some(Donor::Acc);
                }
                let i = free.iter().position(|&f| f)?;
                free[i] = false;
                Some(Donor::Input(i))
            })
            .collect()
    }

    /// Runs the tiles, writing `dsts`.
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        inputs: &[Arc<Buffer>],
        acc: Option<&HostData>,
        acc_shape: Option<&[usize]>,
        (raw, acc_raw): (&[Option<Donated>], Option<Donated>),
        shape: &[usize],
        dsts: Vec<Dst>,
        donors: &[Option<Donor>],
        isa: Isa,
    ) -> Result<()> {
        let shape: Shape = shape.into();
        let (r, k) = (shape.len(), self.kernel.row_dims);
        let outer: Shape = shape[..r - k].into();
        let rows = numel(&outer);
        let cols = numel(&shape[r - k..]);
        let total = numel(&shape);
        // Loads and scalars.
        let full = row_major(&shape);
        let outer_full = row_major(&outer);
        let mut scalars = vec![0.0f32; self.kernel.instrs.len()];
        let mut loads: Vec<LoadRt<'_>> = Vec::with_capacity(self.kernel.instrs.len());
        for (reg, spec) in self.loads.iter().enumerate() {
            let Some(spec) = spec else {
                loads.push(LoadRt { data: Data::F32(&[]), access: Access::Contig { offset: 0 } });
                continue;
            };
            let (data, vshape, vstrides, offset) = match spec.input {
                Some(i) => {
                    let d = match raw[i] {
                        Some(d) => Data::F32Donated(d),
                        None => Data::of(host(&inputs[i])?),
                    };
                    let (vs, st, off) = view_geometry(&spec.view, &inputs[i].meta().shape)?;
                    (d, vs, st, off)
                }
                None => {
                    let s = acc_shape.ok_or_else(|| internal("no accumulator"))?;
                    let d = match (acc_raw, acc) {
                        (Some(d), _) => Data::F32Donated(d),
                        (None, Some(HostData::F32(a))) => Data::F32(a),
                        _ => return Err(internal("no f32 accumulator")),
                    };
                    (d, Shape::from_slice(s), row_major(s), 0)
                }
            };
            if data.len() < numel(&vshape).min(1) {
                return Err(internal("an input buffer is empty"));
            }
            // Strides over the iteration space: broadcast dimensions read stride 0.
            let mut strides: Strides = SmallVec::from_elem(0, r);
            for (i, p) in positions(vshape.len(), spec.frame, r, k).enumerate() {
                strides[p] = if vshape[i] == 1 { 0 } else { vstrides[i] };
            }
            let access = match self.level[reg] {
                Level::Scalar => {
                    // Read even when the iteration space is empty: a reduction
                    // over no elements still feeds the scalars after it.
                    if !data.is_empty() {
                        scalars[reg] = data.get(offset);
                    }
                    Access::Contig { offset }
                }
                Level::Row => {
                    let os: Strides = strides[..r - k].into();
                    if same_walk(&os, &outer_full, &outer) {
                        Access::Contig { offset }
                    } else {
                        Access::Strided { strides: os, offset }
                    }
                }
                Level::Elem => {
                    if same_walk(&strides, &full, &shape) {
                        Access::Contig { offset }
                    } else {
                        Access::Strided { strides, offset }
                    }
                }
            };
            loads.push(LoadRt { data, access });
        }
        for &reg in &self.scalar_order {
            let sc = &scalars;
            let v = match &self.kernel.instrs[reg] {
                Instr::Load { .. } | Instr::Acc => sc[reg],
                Instr::Literal { value } => *value,
                Instr::Unary { op, x } => {
                    with_unary!(super::tile::PORTABLE_FMA, *op, |f| f(sc[*x]))
                }
                Instr::Binary { op, a, b } => with_binary!(*op, |f| f(sc[*a], sc[*b])),
                Instr::Where { c, a, b } => {
                    if sc[*c] != 0.0 {
                        sc[*a]
                    } else {
                        sc[*b]
                    }
                }
                Instr::Round { to, x } => round_to(*to, sc[*x]),
                Instr::Reduce { op, x } => reduce_const(*op, sc[*x], cols),
            };
            scalars[reg] = v;
        }
        if rows == 0 {
            return Ok(());
        }
        let donated: Vec<bool> = donors.iter().map(Option::is_some).collect();
        let chunked = self.chunked && cols > TILE && k > 0;
        // Every tile starts on a multiple of this (a long row walked in
        // chunks has no such step).
        let step = match (k, chunked) {
            (0, _) => TILE,
            (_, true) => 0,
            _ => cols,
        };
        let homes = self.homes(&loads, &dsts, (&shape, step), &donated);
        let mut rs = RunState {
            shape,
            outer,
            cols,
            scalars,
            loads,
            homes,
            outputs: dsts,
            norm: None,
            softmax: None,
        };
        // Tiles.
        let (ntiles, per) = if k == 0 {
            (total.div_ceil(TILE), TILE)
        } else {
            let per = (TILE / cols.max(1)).max(1);
            (rows.div_ceil(per), per)
        };
        let tile = |i: usize| -> Tile {
            if k == 0 {
                let start = i * per;
                Tile { start, len: per.min(total - start), r0: 0, nr: 0 }
            } else if chunked {
                // One long row, walked in chunks of TILE.
                Tile { start: i * cols, len: TILE, r0: i, nr: 1 }
            } else {
                let r0 = i * per;
                let nr = per.min(rows - r0);
                Tile { start: r0 * cols, len: nr * cols, r0, nr }
            }
        };
        let (elem_cap, row_cap) = if k == 0 {
            (TILE.min(total), 0)
        } else if chunked {
            (TILE, 1)
        } else {
            (per * cols, per)
        };
        rs.norm = self.norm.filter(|f| !chunked && f.fits(&rs, elem_cap));
        rs.softmax = self.softmax.filter(|f| !chunked && f.fits(&rs, elem_cap));
        let has_where = self.kernel.instrs.iter().any(|i| matches!(i, Instr::Where { .. }));
        let repeated: Vec<(usize, usize)> = (0..rs.homes.len())
            .filter_map(|reg| match rs.homes[reg] {
                Home::Repeated(slot) => Some((reg, slot)),
                _ => None,
            })
            .collect();
        let scratch = || {
            let n_elem = self.n_elem + repeated.len();
            let mut s = Scratch::new(n_elem, elem_cap, self.n_row, row_cap, has_where);
            // The pattern, as long as a tile: every tile starts on a period.
            for &(reg, slot) in &repeated {
                let ld = &rs.loads[reg];
                ld.access.read(&ld.data, &rs.shape, 0, &mut s.elem[slot][..elem_cap.min(total)]);
            }
            s
        };
        if total >= PAR_ELEMS && ntiles > 1 {
            (0..ntiles)
                .into_par_iter()
                .for_each_init(scratch, |s, i| run_tile(isa, self, &rs, s, tile(i)));
        } else {
            let mut s = scratch();
            for i in 0..ntiles {
                run_tile(isa, self, &rs, &mut s, tile(i));
            }
        }
        Ok(())
    }
}

impl LoopExec {
    /// Where each element-level register lives in this run (see [`Home`]).
    /// A donated output is stored at the end of each tile, after every load
    /// of the tile has read its donor. Every tile starts on a multiple of
    /// `step` (0: no such step), which says which loads repeat per tile.
    fn homes<'a>(
        &self,
        loads: &[LoadRt<'a>],
        dsts: &[Dst],
        (shape, step): (&[usize], usize),
        donated: &[bool],
    ) -> Vec<Home<'a>> {
        let total = numel(shape);
        let mut repeated = self.n_elem;
        (0..self.kernel.instrs.len())
            .map(|reg| {
                if self.level[reg] != Level::Elem {
                    return Home::Scratch;
                }
                if matches!(self.kernel.instrs[reg], Instr::Load { .. } | Instr::Acc) {
                    return match (&loads[reg].data, &loads[reg].access) {
                        (Data::F32(v), Access::Contig { offset }) if v.len() >= offset + total => {
                            Home::Input(&v[*offset..])
                        }
                        (_, Access::Strided { strides, .. })
                            if period(strides, shape)
                                .is_some_and(|p| p < total && step > 0 && step % p == 0) =>
                        {
                            repeated += 1;
                            Home::Repeated(repeated - 1)
                        }
                        _ => Home::Scratch,
                    };
                }
                self.stores
                    .iter()
                    .find(|st| {
                        st.reg == reg
                            && st.layout == StoreLayout::Full
                            && matches!(dsts[st.output], Dst::F32(_))
                            && !donated[st.output]
                    })
                    .map_or(Home::Scratch, |st| Home::Output(st.output))
            })
            .collect()
    }
}

/// The period of a load that walks `shape` with `strides`, when it reads
/// the same contiguous run over and over: strides 0 over the leading
/// dimensions, row-major ones over the trailing ones (sizes 1 aside).
fn period(strides: &[usize], shape: &[usize]) -> Option<usize> {
    let (mut p, mut j) = (1, shape.len());
    while j > 0 && (shape[j - 1] == 1 || strides[j - 1] == p) {
        p *= shape[j - 1];
        j -= 1;
    }
    shape[..j].iter().zip(&strides[..j]).all(|(&d, &s)| d == 1 || s == 0).then_some(p)
}

/// Whether walking `shape` with `strides` visits memory in order (dimensions
/// of size 1 do not matter).
fn same_walk(strides: &[usize], contiguous: &[usize], shape: &[usize]) -> bool {
    strides.iter().zip(contiguous).zip(shape).all(|((&s, &c), &d)| d == 1 || s == c)
}

impl Data<'_> {
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewrite_rules::program::Store;
    use trace_ir::{BinaryOp, ReduceOp, UnaryOp};

    const ROWS: usize = 4;
    const COLS: usize = 8;

    fn f32_meta(dims: &[usize]) -> Meta {
        Meta::new(dims.into(), DType::F32)
    }

    /// Inputs 0, 1 and 2 load as a scalar, one value per row (an element
    /// per element without row dimensions) and one value per element of a
    /// `[ROWS, COLS]` loop.
    fn inputs() -> Vec<Meta> {
        vec![f32_meta(&[]), f32_meta(&[ROWS, 1]), f32_meta(&[ROWS, COLS])]
    }

    fn load(input: usize) -> Instr {
        Instr::Load { input, view: View::Direct, frame: Frame::Elem }
    }
    fn unary(x: Reg) -> Instr {
        Instr::Unary { op: UnaryOp::Exp, x }
    }
    fn add(a: Reg, b: Reg) -> Instr {
        Instr::Binary { op: BinaryOp::Add, a, b }
    }
    fn sum(x: Reg) -> Instr {
        Instr::Reduce { op: ReduceOp::Sum, x }
    }

    /// A `[ROWS, COLS]` loop of `instrs` reducing `row_dims` dimensions,
    /// storing each of `stored` to an output of the loop's shape.
    fn exec(instrs: Vec<Instr>, stored: &[Reg], row_dims: usize) -> Result<LoopExec> {
        let kernel = LoopKernel {
            shape: [ROWS, COLS].as_slice().into(),
            row_dims,
            instrs,
            stores: stored
                .iter()
                .enumerate()
                .map(|(output, &reg)| Store { reg, output, frame: Frame::Elem })
                .collect(),
        };
        let outputs = vec![f32_meta(&[ROWS, COLS]); stored.len()];
        LoopExec::new(&kernel, inputs(), outputs, false)
    }

    /// Replays the scratch-slot traffic of one tile the way `tile_body`
    /// runs it or, with `chunks`, the way `chunked_body` runs a long row in
    /// that many chunks, and fails at the first read of a slot that no
    /// longer holds the register read (an instruction takes its output slot
    /// before it reads its operands, so that slot may not be an operand's).
    /// Every element register is taken to live in scratch; one homed in an
    /// input or output only skips a write, which cannot break a replay
    /// that passes.
    fn replay(exec: &LoopExec, chunks: Option<usize>) -> std::result::Result<(), String> {
        let mut slots = Held { exec, held: [vec![None; exec.n_elem], vec![None; exec.n_row]] };
        let instrs = &exec.kernel.instrs;
        let Some(chunks) = chunks else {
            for &r in &exec.tile_order {
                slots.run(r)?;
            }
            return slots.stores(|_| true);
        };
        for _ in 0..chunks {
            for &r in &exec.tile_order {
                match instrs[r] {
                    _ if exec.after_reduce[r] => {}
                    Instr::Reduce { x, .. } if exec.level[x] == Level::Elem => {
                        slots.read(x, &format!("reduction {r}"))?
                    }
                    Instr::Reduce { .. } => {}
                    _ => slots.run(r)?,
                }
            }
            slots.stores(|l| l == Level::Elem)?;
        }
        for &r in &exec.tile_order {
            match instrs[r] {
                Instr::Reduce { x, .. } if exec.level[x] == Level::Elem => slots.set(r, Some(r))?,
                Instr::Reduce { .. } => slots.run(r)?,
                _ if exec.after_reduce[r] => slots.run(r)?,
                _ => {}
            }
        }
        slots.stores(|l| l != Level::Elem)
    }

    /// What each scratch slot of a tile holds, per pool (element, row).
    struct Held<'e> {
        exec: &'e LoopExec,
        held: [Vec<Option<Reg>>; 2],
    }

    impl Held<'_> {
        /// The slot of `r`; `None` for scalars, which have none.
        fn place(&mut self, r: Reg) -> std::result::Result<Option<&mut Option<Reg>>, String> {
            let pool = match self.exec.level[r] {
                Level::Elem => 0,
                Level::Row => 1,
                Level::Scalar => return Ok(None),
            };
            let slot = self.exec.slot[r];
            match self.held[pool].get_mut(slot) {
                Some(h) => Ok(Some(h)),
                None => Err(format!("register {r} has slot {slot}, past its pool")),
            }
        }

        fn set(&mut self, r: Reg, to: Option<Reg>) -> std::result::Result<(), String> {
            if let Some(h) = self.place(r)? {
                *h = to;
            }
            Ok(())
        }

        fn read(&mut self, r: Reg, by: &str) -> std::result::Result<(), String> {
            match self.place(r)? {
                Some(h) if *h != Some(r) => {
                    Err(format!("{by} reads register {r}, but its slot holds {h:?}"))
                }
                _ => Ok(()),
            }
        }

        /// Instruction `r`: takes its output slot, reads its operands, writes.
        fn run(&mut self, r: Reg) -> std::result::Result<(), String> {
            if self.exec.level[r] == Level::Scalar {
                return Ok(());
            }
            self.set(r, None)?;
            for o in self.exec.kernel.instrs[r].operands() {
                self.read(o, &format!("instruction {r}"))?;
            }
            self.set(r, Some(r))
        }

        /// The stores of registers whose level `which` accepts.
        fn stores(&mut self, which: impl Fn(Level) -> bool) -> std::result::Result<(), String> {
            let exec = self.exec;
            for st in exec.stores.iter().filter(|st| which(exec.level[st.reg])) {
                self.read(st.reg, &format!("the store to output {}", st.output))?;
            }
            Ok(())
        }
    }

    /// Every path a tile of `exec` may take replays cleanly.
    fn assert_slots_hold(exec: &LoopExec, what: &str) {
        replay(exec, None).unwrap_or_else(|e| panic!("{what}, in-tile path: {e}"));
        if exec.chunked {
            for chunks in [1, 3] {
                replay(exec, Some(chunks))
                    .unwrap_or_else(|e| panic!("{what}, {chunks} chunks of a long row: {e}"));
            }
        }
    }

    #[test]
    fn periods_are_found_only_for_repeated_contiguous_runs() {
        assert_eq!(period(&[0, 1], &[8, 5]), Some(5));
        assert_eq!(period(&[0, 0, 5, 1], &[2, 3, 4, 5]), Some(20));
        assert_eq!(period(&[0, 7, 1], &[2, 1, 5]), Some(5)); // size-1 dims do not matter
        assert_eq!(period(&[5, 1], &[8, 5]), Some(40)); // contiguous: one period
        assert_eq!(period(&[1, 0], &[8, 5]), None); // a column broadcast along the rows
        assert_eq!(period(&[0, 2], &[8, 5]), None); // strided
        assert_eq!(period(&[3, 0, 1], &[2, 3, 3]), None);
    }

    #[test]
    fn softmax_keeps_its_input_until_the_last_read() {
        // x, max, x - max, exp, sum, exp / sum: every element value depends
        // on a reduction, so rows are never chunked.
        let instrs = vec![
            load(2),
            Instr::Reduce { op: ReduceOp::Max, x: 0 },
            Instr::Binary { op: BinaryOp::Sub, a: 0, b: 1 },
            unary(2),
            sum(3),
            Instr::Binary { op: BinaryOp::Div, a: 3, b: 4 },
        ];
        let e = exec(instrs, &[5], 1).unwrap();
        assert!(!e.chunked);
        assert_eq!(e.tile_order, (0..6).collect::<Vec<_>>());
        assert_eq!(
            e.level,
            [Level::Elem, Level::Row, Level::Elem, Level::Elem, Level::Row, Level::Elem]
        );
        assert_slots_hold(&e, "softmax");
        // Slots are reused: x's is free once x - max is computed.
        assert!(e.n_elem < 4, "{} element slots", e.n_elem);
    }

    #[test]
    fn chunked_kernels_run_reductions_and_their_readers_last() {
        // b (row), x, s = sum x, t = s + b, u (row, stored), y = exp x (stored).
        let instrs = vec![load(1), load(2), sum(1), add(2, 0), load(1), unary(1)];
        let e = exec(instrs, &[3, 4, 5], 1).unwrap();
        assert!(e.chunked);
        assert_eq!(e.after_reduce, [false, false, false, true, false, false]);
        assert_eq!(e.tile_order, [0, 1, 4, 5, 2, 3]);
        assert_slots_hold(&e, "sum of a long row");
    }

    #[test]
    fn slots_allocated_in_program_order_break_long_rows() {
        // The chunked-row bug: slots allocated in program order while the
        // chunked path runs reductions last. `u` (4) gets the slot of `s`
        // (2), which is free in program order after `t` (3) reads it; the
        // chunked path writes `s` only after the last chunk, over `u`,
        // before `u` is stored.
        let instrs = vec![load(1), load(2), sum(1), add(2, 0), load(1)];
        let stored = [3, 4];
        let mut e = exec(instrs.clone(), &stored, 1).unwrap();
        assert!(e.chunked);
        assert_slots_hold(&e, "reordered");
        let program_order: Vec<Reg> = (0..instrs.len()).collect();
        let slots = assign_slots(&instrs, &e.level, &program_order, &stored).unwrap();
        (e.slot, e.n_elem, e.n_row, e.scalar_order, e.tile_order) =
            (slots.slot, slots.n_elem, slots.n_row, slots.scalar_order, slots.tile_order);
        assert_eq!(e.slot[4], e.slot[2], "the case needs u in the slot of s");
        replay(&e, None).unwrap();
        let err = replay(&e, Some(2)).unwrap_err();
        assert!(err.contains("output 1") && err.contains("register 4"), "{err}");
    }

    #[test]
    fn stored_registers_keep_their_slots_and_dead_ones_free_theirs() {
        // Five element values, each read once by the next; the first stored.
        let instrs = vec![load(2), unary(0), unary(1), unary(2), unary(3)];
        let e = exec(instrs, &[0, 4], 0).unwrap();
        assert_slots_hold(&e, "a chain");
        assert!(e.slot[1..].iter().all(|&s| s != e.slot[0]), "{:?}", e.slot);
        assert_eq!(e.n_elem, 3, "{:?}", e.slot);
        // A value nobody reads frees its slot at once.
        let e = exec(vec![load(2), unary(0), unary(0), add(0, 2)], &[3], 0).unwrap();
        assert_eq!(e.slot[1], e.slot[2], "{:?}", e.slot);
        assert_slots_hold(&e, "a dead value");
    }

    #[test]
    fn scalars_are_evaluated_once_and_take_no_slot() {
        let instrs = vec![load(0), Instr::Literal { value: 2.0 }, add(0, 1), load(2), add(3, 2)];
        let e = exec(instrs, &[4], 1).unwrap();
        assert_eq!(e.scalar_order, [0, 1, 2]);
        assert_eq!(e.tile_order, [3, 4]);
        assert_eq!((e.n_elem, e.n_row), (2, 0));
        assert_slots_hold(&e, "scalars");
    }

    /// A small deterministic generator (xorshift).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n.max(1) as u64) as usize
        }
    }

    /// A random well-formed kernel of `len` instructions over `inputs()`,
    /// with its registers' levels and whether each depends on a reduction,
    /// as the generator derives them. With `chunkable`, no element-level
    /// register depends on a reduction.
    fn random_kernel(
        rng: &mut Rng,
        len: usize,
        row_dims: usize,
        chunkable: bool,
    ) -> (Vec<Instr>, Vec<Level>, Vec<bool>) {
        let (mut instrs, mut level, mut late) = (Vec::new(), Vec::new(), Vec::new());
        let input_level = |i: usize| match i {
            0 => Level::Scalar,
            1 if row_dims > 0 => Level::Row,
            _ => Level::Elem,
        };
        for i in 0..len {
            // Operands are mostly recent registers, as in planned kernels.
            let pick = |rng: &mut Rng| {
                if rng.below(2) == 0 {
                    i - 1 - rng.below(i.min(4))
                } else {
                    rng.below(i)
                }
            };
            let choice = if i == 0 { 0 } else { rng.below(if row_dims > 0 { 7 } else { 6 }) };
            let (ins, ops): (Instr, Vec<Reg>) = match choice {
                0 => (load(rng.below(3)), vec![]),
                1 => (Instr::Literal { value: 0.5 }, vec![]),
                2 => {
                    let x = pick(rng);
                    (Instr::Round { to: DType::BF16, x }, vec![x])
                }
                3 => {
                    let x = pick(rng);
                    (unary(x), vec![x])
                }
                4 => {
                    let (a, b) = (pick(rng), pick(rng));
                    (add(a, b), vec![a, b])
                }
                5 => {
                    let (c, a, b) = (pick(rng), pick(rng), pick(rng));
                    (Instr::Where { c, a, b }, vec![c, a, b])
                }
                _ => {
                    let x = pick(rng);
                    (sum(x), vec![x])
                }
            };
            let l = match &ins {
                Instr::Load { input, .. } => input_level(*input),
                Instr::Literal { .. } => Level::Scalar,
                Instr::Reduce { x, .. } if level[*x] == Level::Scalar => Level::Scalar,
                Instr::Reduce { .. } => Level::Row,
                _ => ops.iter().map(|&o| level[o]).max().unwrap_or(Level::Scalar),
            };
            let depends = ops.iter().any(|&o| late[o] || matches!(instrs[o], Instr::Reduce { .. }));
            if chunkable && depends && l == Level::Elem {
                // Would make long rows unchunkable: a fresh row value instead.
                instrs.push(load(1));
                level.push(input_level(1));
                late.push(false);
                continue;
            }
            instrs.push(ins);
            level.push(l);
            late.push(depends);
        }
        (instrs, level, late)
    }

    #[test]
    fn random_kernels_never_read_a_reused_slot() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let (mut chunked, mut chunked_with_readers, mut unchunked_rows) = (0, 0, 0);
        for case in 0..3000 {
            let row_dims = rng.below(2);
            let chunkable = rng.below(2) == 0;
            let len = 1 + rng.below(24);
            let (instrs, level, after_reduce) = random_kernel(&mut rng, len, row_dims, chunkable);
            let stored: Vec<Reg> =
                (0..len).filter(|&r| r == len - 1 || rng.below(5) == 0).collect();
            let e = exec(instrs.clone(), &stored, row_dims)
                .unwrap_or_else(|err| panic!("case {case}: {err}\n{instrs:?}"));
            assert_eq!(e.level, level, "case {case}: levels\n{instrs:?}");
            assert_eq!(e.after_reduce, after_reduce, "case {case}\n{instrs:?}");
            let expect_chunked =
                row_dims > 0 && !(0..len).any(|r| after_reduce[r] && level[r] == Level::Elem);
            assert_eq!(e.chunked, expect_chunked, "case {case}\n{instrs:?}");
            assert_slots_hold(&e, &format!("case {case}: {instrs:?}, stored {stored:?}"));
            let reduces = instrs.iter().any(|i| matches!(i, Instr::Reduce { .. }));
            chunked += usize::from(e.chunked && reduces);
            chunked_with_readers += usize::from(e.chunked && after_reduce.contains(&true));
            unchunked_rows += usize::from(row_dims > 0 && !e.chunked);
        }
        // The cases cover both paths, and late work after reductions.
        assert!(
            chunked > 300 && chunked_with_readers > 200 && unchunked_rows > 100,
            "{chunked} {chunked_with_readers} {unchunked_rows}"
        );
    }

    #[test]
    fn malformed_kernels_are_errors() {
        // (what, instructions, stored registers, row dims, the error says)
        type Case = (&'static str, Vec<Instr>, Vec<Reg>, usize, &'static str);
        let cases: Vec<Case> = vec![
            ("forward read", vec![load(2), unary(1), unary(0)], vec![2], 0, "defined later"),
            ("self read", vec![load(2), add(1, 0)], vec![1], 0, "defined later"),
            ("missing input", vec![load(7)], vec![0], 0, "missing input 7"),
            ("accumulator", vec![Instr::Acc], vec![0], 0, "outside an epilogue"),
            ("reduce without rows", vec![load(2), sum(0)], vec![1], 0, "without row dimensions"),
            ("too many row dims", vec![load(2)], vec![0], 3, "reduces 3 dims"),
            ("missing register", vec![load(2)], vec![4], 0, "missing register 4"),
        ];
        for (what, instrs, stored, row_dims, want) in cases {
            let err = exec(instrs, &stored, row_dims).err().map(|e| e.to_string());
            assert!(err.as_deref().is_some_and(|e| e.contains(want)), "{what}: {err:?}");
        }
        let kernel = |stores: Vec<Store>| LoopKernel {
            shape: [ROWS, COLS].as_slice().into(),
            row_dims: 1,
            instrs: vec![load(2), sum(0)],
            stores,
        };
        let store = |reg, output| Store { reg, output, frame: Frame::Elem };
        let new = |stores, outputs: Vec<Meta>| {
            LoopExec::new(&kernel(stores), inputs(), outputs, false).err().map(|e| e.to_string())
        };
        let int_output = vec![Meta::new([ROWS, COLS].as_slice().into(), DType::I32)];
        let err = new(vec![store(0, 0)], int_output);
        assert!(err.as_deref().is_some_and(|e| e.contains("cannot store i32")), "{err:?}");
        let err = new(vec![store(0, 1)], vec![f32_meta(&[ROWS, COLS])]);
        assert!(err.as_deref().is_some_and(|e| e.contains("missing output 1")), "{err:?}");
        // One value per row fits a [ROWS, 1] output; one per element does not.
        assert_eq!(new(vec![store(1, 0)], vec![f32_meta(&[ROWS, 1])]), None);
        let err = new(vec![store(0, 0)], vec![f32_meta(&[ROWS, 1])]);
        assert!(err.as_deref().is_some_and(|e| e.contains("does not match loop")), "{err:?}");
        let err = new(vec![store(0, 0)], vec![f32_meta(&[ROWS, 3])]);
        assert!(err.as_deref().is_some_and(|e| e.contains("does not match loop")), "{err:?}");
        // An input that does not broadcast to the loop.
        let k = kernel(vec![store(1, 0)]);
        let err = LoopExec::new(
            &k,
            vec![f32_meta(&[]), f32_meta(&[]), f32_meta(&[ROWS, 5])],
            vec![f32_meta(&[ROWS, 1])],
            false,
        );
        let err = err.err().map(|e| e.to_string());
        assert!(err.as_deref().is_some_and(|e| e.contains("does not fit loop")), "{err:?}");
    }

    #[test]
    fn inconsistent_schedules_are_errors() {
        let instrs = vec![load(2), unary(0), add(0, 1)];
        let level = [Level::Elem; 3];
        assert!(schedule(&instrs, &level[..2], &[2], 0).is_err());
        assert!(schedule(&instrs, &level, &[3], 0).is_err());
        assert!(schedule(&[load(2), unary(1)], &level[..2], &[], 0).is_err());
        for order in [vec![0, 1], vec![0, 1, 1], vec![0, 1, 2, 3], vec![0, 2, 1], vec![5, 0, 1]] {
            let r = assign_slots(&instrs, &level, &order, &[2]);
            assert!(r.is_err(), "order {order:?}");
        }
        assert!(assign_slots(&instrs, &level, &[0, 1, 2], &[2]).is_ok());
    }

    #[test]
    fn garbage_kernels_are_errors_or_run_cleanly() {
        // Arbitrary indices everywhere: compiling never panics, and what
        // compiles has sound slots.
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut ok, mut rejected) = (0, 0);
        for _ in 0..5000 {
            let n = rng.below(10);
            let reg = |rng: &mut Rng| rng.below(n + 2);
            let instrs: Vec<Instr> = (0..n)
                .map(|_| match rng.below(6) {
                    0 => load(rng.below(5)),
                    1 => Instr::Acc,
                    2 => Instr::Literal { value: 1.0 },
                    3 => unary(reg(&mut rng)),
                    4 => add(reg(&mut rng), reg(&mut rng)),
                    _ => Instr::Reduce { op: ReduceOp::Max, x: reg(&mut rng) },
                })
                .collect();
            let stores: Vec<Store> = (0..rng.below(3))
                .map(|_| Store { reg: reg(&mut rng), output: rng.below(3), frame: Frame::Row })
                .collect();
            let kernel = LoopKernel {
                shape: [ROWS, COLS].as_slice().into(),
                row_dims: rng.below(4),
                instrs,
                stores,
            };
            let outputs = vec![f32_meta(&[ROWS, 1]), f32_meta(&[ROWS, COLS]), f32_meta(&[1])];
            match LoopExec::new(&kernel, inputs(), outputs, rng.below(2) == 0) {
                Ok(e) => {
                    assert_slots_hold(&e, &format!("{kernel:?}"));
                    ok += 1;
                }
                Err(_) => rejected += 1,
            }
        }
        assert!(ok > 100 && rejected > 100, "{ok} compiled, {rejected} rejected");
    }
}
