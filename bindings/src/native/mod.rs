//! The native hot path: aten ops that the C++ layer runs without Python.
//!
//! The C++ kernel of each op in [`OPS`] reads its arguments off PyTorch's
//! stack into [`abi::Arg`] records and calls [`call`], which records the op
//! in the calling thread's engine context and hands back the results. When
//! the arguments are outside what the native lowering covers (a view that is
//! not a permutation of its storage, a value held in another context or on
//! the CPU, bool arithmetic, a non-unit `alpha` on a scalar, ...), `call`
//! answers NOT_HANDLED before it records or writes anything, and the C++
//! kernel runs the op's Python lowering instead, which covers every case.
//! Each native lowering makes the same engine calls as its Python twin, so
//! the two paths give the same values.

pub mod abi;
mod ops;

use std::cell::RefCell;
use std::ffi::c_void;

use deferfuse::{Context, DType, Scalar, ScalarOrTensor, Tensor};
use pyo3::prelude::*;
use smallvec::SmallVec;

use abi::{kind, Arg, Out};

use crate::engine::PyEngine;
use crate::root::{engine_value, from_scalar_type, scalar_type, Cell};

pub use ops::OPS;

thread_local! {
    /// The calling thread's context: the Python package's `_state.local.current`,
    /// mirrored here by `set_current` so that C++ kernels need no Python.
    static CURRENT: RefCell<Option<Context>> = const { RefCell::new(None) };
}

/// Sets the calling thread's context (anything but an `Engine` clears it:
/// native kernels then defer to Python, which picks one).
#[pyfunction]
pub fn set_current(engine: &Bound<'_, PyAny>) {
    let ctx = engine.downcast::<PyEngine>().ok().map(|e| e.get().ctx.clone());
    CURRENT.with(|c| *c.borrow_mut() = ctx);
}

/// The aten op names with a native kernel, in the order of their ids.
#[pyfunction]
pub fn native_ops() -> Vec<&'static str> {
    OPS.iter().map(|op| op.name).collect()
}

/// An argument resolved against the engine.
#[derive(Clone)]
pub enum A<'a> {
    None,
    Tensor(Operand<'a>),
    Int(i64),
    Float(f64),
    Bool(bool),
    Ints(&'a [i64]),
    List(Vec<A<'a>>),
    Str(&'a str),
}

/// A tensor argument: its value, and its root when the tensor is all of it
/// (so that an in-place op may replace the root's value).
#[derive(Clone)]
pub struct Operand<'a> {
    pub value: Tensor,
    pub whole: Option<&'a Cell>,
}

impl A<'_> {
    pub fn tensor(&self) -> Option<&Tensor> {
        match self {
            A::Tensor(o) => Some(&o.value),
            _ => None,
        }
    }

    pub fn scalar(&self) -> Option<Scalar> {
        Some(match *self {
            A::Int(v) => Scalar::Int(v),
            A::Float(v) => Scalar::Float(v),
            A::Bool(v) => Scalar::Bool(v),
            _ => return None,
        })
    }

    /// A tensor or a number, as the engine's binary ops take them.
    pub fn operand(&self) -> Option<ScalarOrTensor> {
        match self {
            A::Tensor(o) => Some(ScalarOrTensor::Tensor(o.value.clone())),
            _ => self.scalar().map(ScalarOrTensor::Scalar),
        }
    }

    pub fn is_bool(&self) -> bool {
        match self {
            A::Tensor(o) => o.value.dtype() == DType::Bool,
            A::Bool(_) => true,
            _ => false,
        }
    }

    /// Python's `x == 1` for an `alpha`, `beta` or `value` argument.
    pub fn is_one(&self) -> bool {
        match *self {
            A::None => true,
            A::Int(v) => v == 1,
            A::Float(v) => v == 1.0,
            A::Bool(v) => v,
            _ => false,
        }
    }
}

/// Results of a native op: what it returns, and the roots it replaces
/// (applied only once the whole op has succeeded, so that NOT_HANDLED
/// never follows a partial write).
#[derive(Default)]
pub struct Done<'a> {
    pub outs: SmallVec<[Ret; 2]>,
    pub writes: SmallVec<[(&'a Cell, Tensor); 1]>,
}

pub enum Ret {
    Fresh(Tensor),
    Input(usize),
    /// An undefined tensor (a gradient the output mask did not ask for).
    Undefined,
}

/// `Ok(None)`: not handled natively.
pub type Outcome<'a> = deferfuse::Result<Option<Done<'a>>>;

/// Reads a C argument. `None` when it cannot be used natively.
///
/// # Safety
/// The pointers in `arg` are valid for `'a` (the C++ kernel's call).
unsafe fn resolve<'a>(arg: &'a Arg, ctx: &Context) -> Option<A<'a>> {
    Some(match arg.kind {
        kind::NONE => A::None,
        kind::INT => A::Int(arg.int),
        kind::FLOAT => A::Float(arg.float),
        kind::BOOL => A::Bool(arg.int != 0),
        kind::INT_LIST => A::Ints(slice(arg.sizes, arg.len)),
        kind::STR => A::Str(std::str::from_utf8(slice(arg.str, arg.len)).ok()?),
        kind::LIST => {
            let items = slice(arg.items, arg.len);
            A::List(items.iter().map(|item| resolve(item, ctx)).collect::<Option<_>>()?)
        }
        kind::TENSOR => A::Tensor(operand(arg, ctx)?),
        _ => return None,
    })
}

unsafe fn slice<'a, T>(ptr: *const T, len: u32) -> &'a [T] {
    if len == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(ptr, len as usize)
    }
}

/// A tensor argument: its root's value when the tensor is all of the root,
/// else the view's elements read out of the root (a permutation, a run, a
/// strided box: what `_views.read` reads without padding the root), in the
/// current context and the root's dtype.
unsafe fn operand<'a>(arg: &'a Arg, ctx: &Context) -> Option<Operand<'a>> {
    let cell = arg.cell.as_ref()?;
    let dtype = from_scalar_type(arg.dtype)?;
    let sizes = slice(arg.sizes, arg.len);
    let strides = slice(arg.strides, arg.len);
    let state = cell.lock();
    let value = engine_value(&state, ctx)?;
    if value.dtype() != dtype {
        return None;
    }
    let offset = arg.int;
    let numel: i64 = sizes.iter().product();
    let root_numel = value.shape().iter().product::<usize>() as i64;
    if offset == 0 && numel == root_numel && contiguous(sizes, strides) {
        // Every element of the root in order: the tensor is all of it, in
        // its own shape (a write makes that the root's shape, as Python's does).
        let value = match abi::same_sizes(value.shape(), sizes) {
            true => value.clone(),
            false => value.reshape(&sizes.iter().map(|&n| n as usize).collect::<Vec<_>>()).ok()?,
        };
        return Some(Operand { value, whole: Some(cell) });
    }
    let permutation = offset == 0 && numel == root_numel;
    let value = match permutation.then(|| permuted(value, sizes, strides)).flatten() {
        Some(v) => v,
        None => view(value, sizes, strides, offset)?,
    };
    Some(Operand { value, whole: None })
}

/// The view (`sizes`, `strides`, `offset`) of `root`'s row-major elements,
/// as the engine ops `_views.read` makes: a reshape, a slice of the flat
/// root, or the root reshaped into a grid whose dimensions have the view's
/// strides, sliced to the view's box, permuted into its order and expanded
/// along its broadcast (stride 0) dimensions. `None` where `_views.read`
/// pads the root or goes through the CPU, or for an empty view.
fn view(root: &Tensor, sizes: &[i64], strides: &[i64], offset: i64) -> Option<Tensor> {
    let shape = |v: &[i64]| v.iter().map(|&n| n as usize).collect::<Vec<_>>();
    let numel = root.shape().iter().product::<usize>() as i64;
    let count: i64 = sizes.iter().product();
    if count == 0 || offset < 0 {
        return None;
    }
    let flat = || root.reshape(&[numel as usize]);
    // One row-major run of the root's elements, at an offset (`operand`
    // took a run of all of them as the whole root).
    if contiguous(sizes, strides) && offset + count <= numel {
        return flat()
            .and_then(|f| f.slice(0, offset, offset + count, 1))
            .and_then(|f| f.reshape(&shape(sizes)))
            .ok();
    }
    // Dimensions that step through the root, by decreasing stride.
    let real: Vec<usize> = (0..sizes.len()).filter(|&d| sizes[d] > 1 && strides[d] != 0).collect();
    let mut order = real.clone();
    order.sort_by_key(|&d| std::cmp::Reverse(strides[d]));
    let ss: Vec<i64> = order.iter().map(|&d| strides[d]).collect();
    if ss.is_empty() || ss.iter().any(|&s| s < 0) || ss.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    let end = offset + real.iter().map(|&d| (sizes[d] - 1) * strides[d]).sum::<i64>() + 1;
    let outer = ss[0];
    let padded = (numel.max(end) + outer - 1) / outer * outer;
    if padded > numel {
        return None;
    }
    let mut grid = vec![padded / outer];
    for w in ss.windows(2) {
        if w[0] % w[1] != 0 {
            return None;
        }
        grid.push(w[0] / w[1]);
    }
    grid.push(ss[ss.len() - 1]);
    let mut starts = Vec::with_capacity(grid.len());
    let mut rest = offset;
    for &s in &ss {
        starts.push(rest / s);
        rest %= s;
    }
    starts.push(rest);
    let lengths: Vec<i64> = order.iter().map(|&d| sizes[d]).chain([1]).collect();
    if starts.iter().zip(&lengths).zip(&grid).any(|((a, n), g)| a + n > *g) {
        return None;
    }
    let mut v = flat().ok()?.reshape(&shape(&grid)).ok()?;
    for (axis, ((&a, &n), &g)) in starts.iter().zip(&lengths).zip(&grid).enumerate() {
        if a != 0 || n != g {
            v = v.slice(axis as i64, a, a + n, 1).ok()?;
        }
    }
    v = v.reshape(&shape(&lengths[..order.len()])).ok()?;
    let perm: Vec<usize> =
        real.iter().map(|d| order.iter().position(|o| o == d).unwrap()).collect();
    if perm.windows(2).any(|w| w[0] > w[1]) {
        v = v.permute(&perm).ok()?;
    }
    let real_shape: Vec<usize> =
        (0..sizes.len()).map(|d| if real.contains(&d) { sizes[d] as usize } else { 1 }).collect();
    v = v.reshape(&real_shape).ok()?;
    if sizes.iter().zip(strides).any(|(&n, &s)| n > 1 && s == 0) {
        v = v.expand(&shape(sizes)).ok()?;
    }
    Some(v)
}

fn contiguous(sizes: &[i64], strides: &[i64]) -> bool {
    let mut expect = 1;
    for (&n, &s) in sizes.iter().zip(strides).rev() {
        if n != 1 && s != expect {
            return false;
        }
        expect *= n;
    }
    true
}

/// The view (`sizes`, `strides`, offset 0) of a contiguous buffer holding
/// `value`'s elements, when its strides are a permutation of contiguous ones.
fn permuted(value: &Tensor, sizes: &[i64], strides: &[i64]) -> Option<Tensor> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| strides[b].cmp(&strides[a]));
    let base: Vec<i64> = order.iter().map(|&d| sizes[d]).collect();
    let base_strides: Vec<i64> = order.iter().map(|&d| strides[d]).collect();
    if !contiguous(&base, &base_strides) {
        return None;
    }
    let mut perm = vec![0; sizes.len()];
    for (k, &d) in order.iter().enumerate() {
        perm[d] = k;
    }
    let base: Vec<usize> = base.iter().map(|&n| n as usize).collect();
    value.reshape(&base).and_then(|b| b.permute(&perm)).ok()
}

/// The C ABI entry: runs native op `op` on `args`, writing up to `cap`
/// results to `outs`.
///
/// # Safety
/// The C++ caller passes `nargs` valid arguments and room for `cap` results.
pub unsafe extern "C" fn call(
    op: u32,
    args: *const Arg,
    nargs: usize,
    outs: *mut Out,
    cap: usize,
    nouts: *mut usize,
    error: *mut *mut c_void,
) -> i32 {
    let run = || -> i32 {
        let Some(ctx) = CURRENT.with(|c| c.borrow().clone()) else {
            return abi::NOT_HANDLED;
        };
        let Some(spec) = OPS.get(op as usize) else {
            return abi::NOT_HANDLED;
        };
        let raw = slice(args, nargs as u32);
        // The aten op is one op group: in Strict its primitives run as one
        // program, as the Python path does, with the reads of its operands
        // (a transpose that a matmul then reads in place), so the group
        // opens first; in DeferAndFuse the repeat detector cuts the stream
        // only between aten ops.
        let group = ctx.op_group(spec.name);
        // Inline: most aten ops take a few arguments, and this is the hot path.
        let Some(resolved) =
            raw.iter().map(|a| resolve(a, &ctx)).collect::<Option<SmallVec<[A; 8]>>>()
        else {
            return abi::NOT_HANDLED;
        };
        let result = (spec.run)(&ctx, &resolved);
        // The operands' views are not the op's results: released before
        // the group ends, they are not kept as outputs of its program.
        drop(resolved);
        let result = group.end(result);
        match result {
            Ok(Some(done)) => {
                if done.outs.len() > cap || !done.outs.iter().all(fits) {
                    return abi::NOT_HANDLED;
                }
                for (cell, value) in done.writes {
                    cell.set_engine(value);
                }
                *nouts = done.outs.len();
                for (i, ret) in done.outs.into_iter().enumerate() {
                    *outs.add(i) = out_record(ret);
                }
                abi::DONE
            }
            Ok(None) => abi::NOT_HANDLED,
            Err(e) => {
                *error = Box::into_raw(Box::new(e)).cast();
                abi::FAILED
            }
        }
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|_| {
        let name = OPS.get(op as usize).map_or("?", |o| o.name);
        let e = deferfuse::Error::internal("native kernel", format!("aten op {name} panicked"));
        *error = Box::into_raw(Box::new(e)).cast();
        abi::FAILED
    })
}

/// The C ABI's `root_zeros` (see [`abi::Api`]).
pub unsafe extern "C" fn root_zeros(numel: i64, dtype: i8) -> *const Cell {
    let make = || {
        let ctx = CURRENT.with(|c| c.borrow().clone())?;
        let zeros =
            ctx.full(0.0, &[usize::try_from(numel).ok()?], from_scalar_type(dtype)?).ok()?;
        Some(std::sync::Arc::into_raw(Cell::new(crate::root::State::Engine(zeros))))
    };
    std::panic::catch_unwind(make).ok().flatten().unwrap_or(std::ptr::null())
}

fn fits(ret: &Ret) -> bool {
    match ret {
        Ret::Fresh(t) => t.shape().len() <= abi::MAX_RANK,
        Ret::Input(_) | Ret::Undefined => true,
    }
}

fn out_record(ret: Ret) -> Out {
    match ret {
        Ret::Input(i) => Out {
            cell: std::ptr::null(),
            input: i as i32,
            dtype: 0,
            rank: 0,
            sizes: [0; abi::MAX_RANK],
        },
        Ret::Undefined => {
            Out { cell: std::ptr::null(), input: -1, dtype: 0, rank: 0, sizes: [0; abi::MAX_RANK] }
        }
        Ret::Fresh(t) => {
            let mut sizes = [0i64; abi::MAX_RANK];
            for (s, &n) in sizes.iter_mut().zip(t.shape()) {
                *s = n as i64;
            }
            let dtype = scalar_type(t.dtype());
            let rank = t.shape().len() as u32;
            let cell = Cell::new(crate::root::State::Engine(t));
            Out { cell: std::sync::Arc::into_raw(cell), input: -1, dtype, rank, sizes }
        }
    }
}
