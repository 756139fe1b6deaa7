//! `Root`: the value of one `tpu` storage.
//!
//! Each storage's C++ block owns one reference to a [`Cell`] (a raw
//! `Arc<Cell>`), so the value lives exactly as long as the storage. The cell
//! holds an engine tensor, or a CPU `torch.Tensor` for dtypes the engine
//! lacks, whose row-major elements are the storage's elements. Both the C++
//! kernels (without the GIL, through [`crate::native`]) and the Python
//! package (through the `Root` class below) read and replace it, so it sits
//! behind a mutex.

use std::sync::{Arc, Mutex, MutexGuard};

use deferfuse::{Context, DType, Tensor};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::PyTuple;

use crate::engine::PyEngine;
use crate::tensor::PyTensor;

/// What a storage holds: its elements, row-major, in the value's shape.
pub enum State {
    Engine(Tensor),
    /// A CPU `torch.Tensor`, its `torch.dtype` and its shape.
    Host {
        tensor: Py<PyAny>,
        dtype: Py<PyAny>,
        shape: Vec<usize>,
    },
    /// A storage shared with other processes (`torch.multiprocessing`): a
    /// contiguous CPU `torch.Tensor` in shared memory, of the root's dtype
    /// and shape, that every process holding the storage reads and writes.
    /// Reads take a snapshot of it; writes copy into it.
    Shared {
        memory: Py<PyAny>,
        dtype: Py<PyAny>,
        shape: Vec<usize>,
    },
}

impl State {
    pub fn shape(&self) -> &[usize] {
        match self {
            State::Engine(t) => t.shape(),
            State::Host { shape, .. } | State::Shared { shape, .. } => shape,
        }
    }
}

pub struct Cell(Mutex<State>);

impl Cell {
    pub fn new(state: State) -> Arc<Cell> {
        Arc::new(Cell(Mutex::new(state)))
    }

    /// The state. A panic while it was held cannot leave it half-written
    /// (every write replaces it whole), so a poisoned lock is still usable.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `tensor` the value.
    pub fn set_engine(&self, tensor: Tensor) {
        let old = std::mem::replace(&mut *self.lock(), State::Engine(tensor));
        drop(old); // outside the lock
    }
}

/// The engine tensor of a root, when it is one of `ctx`'s.
pub fn engine_value<'a>(state: &'a State, ctx: &Context) -> Option<&'a Tensor> {
    match state {
        State::Engine(t) if t.belongs_to(ctx) => Some(t),
        _ => None,
    }
}

/// PyTorch's `ScalarType` codes of the engine's dtypes (c10/core/ScalarType.h).
pub fn scalar_type(dtype: DType) -> i8 {
    match dtype {
        DType::I32 => 3,
        DType::I64 => 4,
        DType::F16 => 5,
        DType::F32 => 6,
        DType::Bool => 11,
        DType::BF16 => 15,
    }
}

pub fn from_scalar_type(code: i8) -> Option<DType> {
    Some(match code {
        3 => DType::I32,
        4 => DType::I64,
        5 => DType::F16,
        6 => DType::F32,
        11 => DType::Bool,
        15 => DType::BF16,
        _ => return None,
    })
}

/// The `torch.dtype` objects of the engine's dtypes, looked up once.
fn torch_dtype(py: Python<'_>, dtype: DType) -> PyResult<Py<PyAny>> {
    static DTYPES: GILOnceCell<Vec<(DType, Py<PyAny>)>> = GILOnceCell::new();
    let table = DTYPES.get_or_try_init(py, || -> PyResult<_> {
        let torch = py.import("torch")?;
        let names = [
            (DType::F32, "float32"),
            (DType::BF16, "bfloat16"),
            (DType::F16, "float16"),
            (DType::I32, "int32"),
            (DType::I64, "int64"),
            (DType::Bool, "bool"),
        ];
        names.iter().map(|&(d, n)| Ok((d, torch.getattr(n)?.unbind()))).collect()
    })?;
    let (_, obj) = table.iter().find(|(d, _)| *d == dtype).expect("every engine dtype is listed");
    Ok(obj.clone_ref(py))
}

/// The state holding `value` (an engine tensor or a CPU torch.Tensor) in
/// `shape` (the value's own when None; an engine value is reshaped to it).
fn state_of(value: &Bound<'_, PyAny>, shape: Option<Vec<usize>>) -> PyResult<State> {
    if let Ok(t) = value.downcast::<PyTensor>() {
        let t = &t.get().inner;
        return match shape {
            Some(shape) if shape != t.shape() => {
                t.reshape(&shape).map(State::Engine).map_err(crate::to_py)
            }
            _ => Ok(State::Engine(t.clone())),
        };
    }
    // A CPU torch.Tensor (duck-typed: torch is not a Rust dependency).
    let own: Vec<usize> = value.getattr("shape").and_then(|s| s.extract()).map_err(|_| {
        PyTypeError::new_err("Root: the value must be an engine tensor or a torch.Tensor")
    })?;
    let dtype = value.getattr("dtype")?.unbind();
    Ok(State::Host { tensor: value.clone().unbind(), dtype, shape: shape.unwrap_or(own) })
}

/// The value of one storage, seen from Python (`_handles`).
#[pyclass(module = "deferfuse._engine", name = "Root", frozen)]
pub struct PyRoot {
    pub(crate) cell: Arc<Cell>,
}

#[pymethods]
impl PyRoot {
    #[new]
    #[pyo3(signature = (value, shape=None))]
    fn new(value: &Bound<'_, PyAny>, shape: Option<Vec<usize>>) -> PyResult<Self> {
        Ok(PyRoot { cell: Cell::new(state_of(value, shape)?) })
    }

    /// Replaces the value (and the shape: the value's own when not given).
    #[pyo3(signature = (value, shape=None))]
    fn set(&self, value: &Bound<'_, PyAny>, shape: Option<Vec<usize>>) -> PyResult<()> {
        let py = value.py();
        let shared = match &*self.cell.lock() {
            State::Shared { memory, .. } => Some(memory.clone_ref(py)),
            _ => None,
        };
        if let Some(memory) = shared {
            return write_shared(memory.bind(py), value);
        }
        let new = state_of(value, shape)?;
        let old = std::mem::replace(&mut *self.cell.lock(), new);
        drop(old); // outside the lock: a host value's release may run Python
        Ok(())
    }

    /// The engine tensor, or the CPU torch.Tensor.
    #[getter]
    fn value(&self, py: Python<'_>) -> PyResult<PyObject> {
        match &*self.cell.lock() {
            State::Engine(t) => Ok(Py::new(py, PyTensor::from(t.clone()))?.into_any()),
            State::Host { tensor, .. } => Ok(tensor.clone_ref(py)),
            State::Shared { memory, .. } => Ok(memory.clone_ref(py)),
        }
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.cell.lock().shape())
    }

    /// The value's `torch.dtype`.
    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &*self.cell.lock() {
            State::Engine(t) => torch_dtype(py, t.dtype()),
            State::Host { dtype, .. } | State::Shared { dtype, .. } => Ok(dtype.clone_ref(py)),
        }
    }

    /// Makes `memory` (a contiguous CPU tensor in shared memory, holding
    /// the current value) the storage's value from now on, for this process
    /// and every process it is sent to.
    fn share(&self, memory: &Bound<'_, PyAny>) -> PyResult<()> {
        let State::Host { tensor, dtype, shape } = state_of(memory, None)? else {
            return Err(PyTypeError::new_err("Root.share: the memory must be a CPU torch.Tensor"));
        };
        let old = std::mem::replace(
            &mut *self.cell.lock(),
            State::Shared { memory: tensor, dtype, shape },
        );
        drop(old);
        Ok(())
    }

    /// True once the storage is shared with other processes ([`State::Shared`]).
    #[getter]
    fn shared(&self) -> bool {
        matches!(&*self.cell.lock(), State::Shared { .. })
    }

    /// For a transport that writes the storage in place (a collective): the
    /// address and byte length of the value's host elements, which only this
    /// storage holds from now on (`deferfuse::Tensor::exclusive_host`: a
    /// value another tensor shares is copied first). Valid until the value
    /// is replaced. None when the value is no engine tensor, lives in a
    /// device's memory, or is bool.
    fn exclusive_host(&self, py: Python<'_>) -> PyResult<Option<(usize, usize)>> {
        let mut state = self.cell.lock();
        let State::Engine(t) = &mut *state else { return Ok(None) };
        let got = py.allow_threads(|| {
            t.exclusive_host().map(|got| got.map(|(addr, nbytes)| (addr as usize, nbytes)))
        });
        got.map_err(crate::to_py)
    }

    /// True when the value is an engine tensor of `engine`'s context (no
    /// import needed to compute with it there). Anything else is no engine.
    fn owned_by(&self, engine: &Bound<'_, PyAny>) -> bool {
        let Ok(engine) = engine.downcast::<PyEngine>() else {
            return false;
        };
        engine_value(&self.cell.lock(), &engine.get().ctx).is_some()
    }
}

/// Copies `value` (an engine tensor, materialized here, or a CPU tensor) into
/// the shared `memory`, element for element in row-major order. Shared
/// memory keeps its size and dtype, as a shared CPU storage does.
fn write_shared(memory: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = value.py();
    let numel: usize = memory.call_method0("numel")?.extract()?;
    let refuse = || {
        PyRuntimeError::new_err(format!(
            "a tpu storage shared with another process keeps its {numel} elements and its \
             dtype: it cannot be resized or written through a view of another dtype"
        ))
    };
    if let Ok(t) = value.downcast::<PyTensor>() {
        let t = t.get().inner.clone();
        if t.shape().iter().product::<usize>() != numel || !has_dtype(memory, t.dtype())? {
            return Err(refuse());
        }
        let addr: usize = memory.call_method0("data_ptr")?.extract()?;
        let data = py.allow_threads(|| t.host_data()).map_err(crate::to_py)?;
        // SAFETY: `memory` is a live contiguous CPU tensor of `numel`
        // elements of the data's dtype at `addr`.
        return unsafe { crate::host::write(&data, addr, numel * t.dtype().size_in_bytes()) };
    }
    if value.call_method0("numel")?.extract::<usize>()? != numel {
        return Err(refuse());
    }
    memory
        .call_method1("view", (-1,))?
        .call_method1("copy_", (value.call_method1("reshape", (-1,))?,))?;
    Ok(())
}

/// True when the CPU tensor `memory` has the engine dtype `dtype`.
fn has_dtype(memory: &Bound<'_, PyAny>, dtype: DType) -> PyResult<bool> {
    let py = memory.py();
    Ok(memory.getattr("dtype")?.is(torch_dtype(py, dtype)?.bind(py)))
}
