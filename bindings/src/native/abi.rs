//! The C ABI between the C++ PrivateUse1 layer (`bindings/csrc/`) and the
//! engine: a table of functions that the C++ side reads once from the
//! capsule `deferfuse._engine._native_api`, and the argument and result
//! records its kernels exchange with [`super::call`]. Keep in step with
//! `bindings/csrc/engine_api.h`.

use std::ffi::c_void;
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::engine::PyEngine;
use crate::root::{engine_value, scalar_type, Cell, PyRoot};
use crate::tensor::PyTensor;

/// Bumped whenever a record or a function below changes.
pub const VERSION: u32 = 2;

/// The most dimensions a result passes back inline.
pub const MAX_RANK: usize = 12;

pub mod kind {
    pub const NONE: u8 = 0;
    pub const TENSOR: u8 = 1;
    pub const INT: u8 = 2;
    pub const FLOAT: u8 = 3;
    pub const BOOL: u8 = 4;
    pub const INT_LIST: u8 = 5;
    /// A list of tensors or of scalars: `items` holds `len` arguments.
    pub const LIST: u8 = 6;
    pub const STR: u8 = 7;
}

/// One argument of an aten op, as the C++ kernel read it off the stack.
#[repr(C)]
pub struct Arg {
    pub kind: u8,
    /// Tensors: PyTorch's `ScalarType` code.
    pub dtype: i8,
    /// Tensors: the rank; lists and strings: the length.
    pub len: u32,
    /// Tensors: the storage's root (borrowed for the call).
    pub cell: *const Cell,
    /// Tensors: sizes; integer lists: the values.
    pub sizes: *const i64,
    pub strides: *const i64,
    /// Tensors: the storage offset; integers and bools: the value.
    pub int: i64,
    pub float: f64,
    pub items: *const Arg,
    pub str: *const u8,
}

/// One result: a fresh value (`cell`, which the C++ side adopts), or the
/// argument at `input` returned as is (in-place ops return `self`).
#[repr(C)]
pub struct Out {
    pub cell: *const Cell,
    pub input: i32,
    pub dtype: i8,
    pub rank: u32,
    pub sizes: [i64; MAX_RANK],
}

pub const DONE: i32 = 0;
/// The op has no native lowering for these arguments: the C++ kernel runs
/// the Python one.
pub const NOT_HANDLED: i32 = 1;
/// The engine raised: `*error` holds it, for `raise_error`.
pub const FAILED: i32 = 2;

#[repr(C)]
pub struct Api {
    pub version: u32,
    /// Drops a block's reference to its root (any thread, no GIL needed).
    pub root_release: unsafe extern "C" fn(*const Cell),
    /// A new reference to a Python `Root`'s cell, or null if `obj` is none (GIL held).
    pub root_from_py: unsafe extern "C" fn(*mut ffi::PyObject) -> *const Cell,
    /// A new Python `Root` for a borrowed cell (GIL held).
    pub root_to_py: unsafe extern "C" fn(*const Cell) -> *mut ffi::PyObject,
    /// The root's engine tensor as a new Python object when it is whole
    /// (`sizes`, `dtype`) and of `engine`'s context; else null, no error (GIL held).
    pub whole_value: unsafe extern "C" fn(
        *const Cell,
        *mut ffi::PyObject,
        *const i64,
        u32,
        i8,
    ) -> *mut ffi::PyObject,
    /// Runs native op `op` (see [`super::OPS`]); no GIL needed.
    pub call: unsafe extern "C" fn(
        u32,
        *const Arg,
        usize,
        *mut Out,
        usize,
        *mut usize,
        *mut *mut c_void,
    ) -> i32,
    /// Sets the Python error for a FAILED call's error, consuming it (takes the GIL).
    pub raise_error: unsafe extern "C" fn(*mut c_void),
    /// A fresh root of `numel` zeros of a `ScalarType` code in the calling
    /// thread's context, for a storage PyTorch allocated without one (whose
    /// bytes read as zeros, as `_handles.root_of` makes them); null for a
    /// dtype the engine lacks or no context. No GIL needed.
    pub root_zeros: unsafe extern "C" fn(i64, i8) -> *const Cell,
}

unsafe extern "C" fn root_release(cell: *const Cell) {
    if !cell.is_null() {
        drop(Arc::from_raw(cell));
    }
}

unsafe extern "C" fn root_from_py(obj: *mut ffi::PyObject) -> *const Cell {
    let py = Python::assume_gil_acquired();
    let obj = Bound::from_borrowed_ptr(py, obj);
    match obj.downcast::<PyRoot>() {
        Ok(root) => Arc::into_raw(root.get().cell.clone()),
        Err(_) => std::ptr::null(),
    }
}

unsafe extern "C" fn root_to_py(cell: *const Cell) -> *mut ffi::PyObject {
    let py = Python::assume_gil_acquired();
    Arc::increment_strong_count(cell);
    let cell = Arc::from_raw(cell);
    match Py::new(py, PyRoot { cell }) {
        Ok(root) => root.into_ptr(),
        Err(e) => {
            e.restore(py);
            std::ptr::null_mut()
        }
    }
}

unsafe extern "C" fn whole_value(
    cell: *const Cell,
    engine: *mut ffi::PyObject,
    sizes: *const i64,
    rank: u32,
    dtype: i8,
) -> *mut ffi::PyObject {
    let py = Python::assume_gil_acquired();
    let engine = Bound::from_borrowed_ptr(py, engine);
    let Ok(engine) = engine.downcast::<PyEngine>() else {
        return std::ptr::null_mut();
    };
    let sizes = std::slice::from_raw_parts(sizes, rank as usize);
    let tensor = {
        let state = (*cell).lock();
        match engine_value(&state, &engine.get().ctx) {
            Some(t) if scalar_type(t.dtype()) == dtype && same_sizes(t.shape(), sizes) => t.clone(),
            _ => return std::ptr::null_mut(),
        }
    };
    match Py::new(py, PyTensor::from(tensor)) {
        Ok(t) => t.into_ptr(),
        Err(_) => std::ptr::null_mut(),
    }
}

pub fn same_sizes(shape: &[usize], sizes: &[i64]) -> bool {
    shape.len() == sizes.len() && shape.iter().zip(sizes).all(|(&a, &b)| a as i64 == b)
}

unsafe extern "C" fn raise_error(error: *mut c_void) {
    let error = Box::from_raw(error.cast::<deferfuse::Error>());
    Python::with_gil(|py| crate::to_py(*error).restore(py));
}

static API: Api = Api {
    version: VERSION,
    root_release,
    root_from_py,
    root_to_py,
    whole_value,
    call: super::call,
    raise_error,
    root_zeros: super::root_zeros,
};

/// The capsule the C++ layer reads the table from.
pub fn capsule(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    let name = std::ffi::CString::new("deferfuse._engine._native_api").expect("no NUL");
    // SAFETY: API is a static that outlives every capsule.
    unsafe {
        let ptr = ffi::PyCapsule_New(
            (&API as *const Api).cast_mut().cast(),
            // The name must outlive the capsule: leak this one small string.
            Box::leak(name.into_boxed_c_str()).as_ptr(),
            None,
        );
        Bound::from_owned_ptr_or_err(py, ptr).map(|b| b.downcast_into_unchecked())
    }
}
