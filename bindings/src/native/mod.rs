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

use deferfuse::{Context, DType, Mode, Scalar, ScalarOrTensor, Tensor};
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
/// or a permutation of it (`t()`, `transpose`, `permute` of a contiguous
/// tensor), in the current context and the root's dtype.
unsafe fn operand<'a>(arg: &'a Arg, ctx: &Context) -> Option<Operand<'a>> {
    let cell = arg.cell.as_ref()?;
    let dtype = from_scalar_type(arg.dtype)?;
    let sizes = slice(arg.sizes, arg.len);
    let strides = slice(arg.strides, arg.len);
    let state = cell.lock();
    let value = engine_value(&state, ctx)?;
    if value.dtype() != dtype || arg.int != 0 {
        return None;
    }
    if abi::same_sizes(value.shape(), sizes) && contiguous(sizes, strides) {
        return Some(Operand { value: value.clone(), whole: Some(cell) });
    }
    let numel: i64 = sizes.iter().product();
    if numel == 0 || numel != value.shape().iter().product::<usize>() as i64 {
        return None;
    }
    let value = permuted(value, sizes, strides)?;
    Some(Operand { value, whole: None })
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
        // Strict runs an aten op's primitives as one program, as the Python
        // path does: with the reads of its operands (a transpose that a
        // matmul then reads in place), so the group opens first.
        let group = (ctx.mode() == Mode::Strict).then(|| ctx.op_group(spec.name));
        let Some(resolved) = raw.iter().map(|a| resolve(a, &ctx)).collect::<Option<Vec<A>>>()
        else {
            return abi::NOT_HANDLED;
        };
        let result = (spec.run)(&ctx, &resolved);
        // The operands' views are not the op's results: released before
        // the group ends, they are not kept as outputs of its program.
        drop(resolved);
        drop(group);
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

fn fits(ret: &Ret) -> bool {
    match ret {
        Ret::Fresh(t) => t.shape().len() <= abi::MAX_RANK,
        Ret::Input(_) => true,
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
