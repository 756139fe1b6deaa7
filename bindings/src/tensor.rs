//! `Tensor`: an engine tensor seen from Python, with the engine's ops. The
//! Python layer maps aten ops to these methods; names follow the engine.

use deferfuse::{GeluApproximation, Scalar, ScalarOrTensor, Tensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};

use crate::engine::{parse_dtype, PyEngine};
use crate::{host, to_py};

#[pyclass(module = "deferfuse._engine", name = "Tensor", frozen)]
pub struct PyTensor {
    pub(crate) inner: Tensor,
}

impl From<Tensor> for PyTensor {
    fn from(inner: Tensor) -> Self {
        PyTensor { inner }
    }
}

type R = PyResult<PyTensor>;

fn wrap(t: deferfuse::Result<Tensor>) -> R {
    t.map(PyTensor::from).map_err(to_py)
}

/// A Python operand: an engine tensor, a bool, an int or a float.
fn operand(value: &Bound<'_, PyAny>) -> PyResult<ScalarOrTensor> {
    if let Ok(t) = value.downcast::<PyTensor>() {
        return Ok(ScalarOrTensor::Tensor(t.get().inner.clone()));
    }
    if value.is_instance_of::<PyBool>() {
        return Ok(ScalarOrTensor::Scalar(Scalar::Bool(value.extract()?)));
    }
    if value.is_instance_of::<PyInt>() {
        return Ok(ScalarOrTensor::Scalar(Scalar::Int(value.extract()?)));
    }
    if value.is_instance_of::<PyFloat>() {
        return Ok(ScalarOrTensor::Scalar(Scalar::Float(value.extract()?)));
    }
    Err(PyTypeError::new_err(format!(
        "expected an engine tensor or a number, got {}",
        value.get_type().name()?
    )))
}

/// The engine's unary op `name` (None for an unknown name). Python's
/// `Tensor.unary` and the native kernels share this table.
pub fn unary_op(t: &Tensor, name: &str) -> Option<deferfuse::Result<Tensor>> {
    Some(match name {
        "neg" => t.neg(),
        "abs" => t.abs(),
        "exp" => t.exp(),
        "log" => t.log(),
        "sqrt" => t.sqrt(),
        "rsqrt" => t.rsqrt(),
        "reciprocal" => t.reciprocal(),
        "tanh" => t.tanh(),
        "sigmoid" => t.sigmoid(),
        "relu" => t.relu(),
        "silu" => t.silu(),
        "sin" => t.sin(),
        "cos" => t.cos(),
        "floor" => t.floor(),
        "sign" => t.sign(),
        "logical_not" => t.logical_not(),
        "gelu" => t.gelu(GeluApproximation::None),
        "gelu_tanh" => t.gelu(GeluApproximation::Tanh),
        _ => return None,
    })
}

/// The engine's binary op `name` (None for an unknown name), shared as
/// [`unary_op`] is.
pub fn binary_op(t: &Tensor, name: &str, rhs: ScalarOrTensor) -> Option<deferfuse::Result<Tensor>> {
    Some(match name {
        "add" => t.add(rhs),
        "sub" => t.sub(rhs),
        "mul" => t.mul(rhs),
        "div" => t.div(rhs),
        "pow" => t.pow(rhs),
        "maximum" => t.maximum(rhs),
        "minimum" => t.minimum(rhs),
        "eq" => t.eq(rhs),
        "ne" => t.ne(rhs),
        "lt" => t.lt(rhs),
        "le" => t.le(rhs),
        "gt" => t.gt(rhs),
        "ge" => t.ge(rhs),
        "logical_and" => t.logical_and(rhs),
        "logical_or" => t.logical_or(rhs),
        _ => return None,
    })
}

#[pymethods]
impl PyTensor {
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.inner.shape().to_vec()
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype().name()
    }

    /// Copies the value (materializing it) into `nbytes` bytes at `addr`, the
    /// data pointer of a contiguous CPU tensor the caller keeps alive.
    fn copy_to_address(&self, py: Python<'_>, addr: usize, nbytes: usize) -> PyResult<()> {
        let t = self.inner.clone();
        // One copy, from the engine's buffer straight into PyTorch's.
        // SAFETY: the Python caller passes a live, contiguous, writable
        // tensor of this dtype; `write` checks the byte length.
        py.allow_threads(|| t.with_host_data(|data| unsafe { host::write(data, addr, nbytes) }))
            .map_err(to_py)?
    }

    /// The address and byte length of the materialized value's host
    /// elements, for a reader that keeps this tensor alive meanwhile; None
    /// where the value lives in a device's memory.
    fn host_address(&self, py: Python<'_>) -> PyResult<Option<(usize, usize)>> {
        let t = self.inner.clone();
        let got = py.allow_threads(|| {
            t.host_address().map(|got| got.map(|(addr, nbytes)| (addr as usize, nbytes)))
        });
        got.map_err(to_py)
    }

    fn unary(&self, name: &str) -> R {
        match unary_op(&self.inner, name) {
            Some(t) => wrap(t),
            None => Err(PyValueError::new_err(format!("unknown unary op {name:?}"))),
        }
    }

    fn binary(&self, name: &str, rhs: &Bound<'_, PyAny>) -> R {
        match binary_op(&self.inner, name, operand(rhs)?) {
            Some(t) => wrap(t),
            None => Err(PyValueError::new_err(format!("unknown binary op {name:?}"))),
        }
    }

    /// The dtype a binary op of `self` and `rhs` promotes to.
    fn result_type(&self, rhs: &Bound<'_, PyAny>) -> PyResult<&'static str> {
        Ok(self.inner.result_type(&operand(rhs)?).name())
    }

    /// `self ? on_true : on_false` (self is the condition).
    fn where_(&self, on_true: &Bound<'_, PyAny>, on_false: &Bound<'_, PyAny>) -> R {
        wrap(self.inner.where_cond(operand(on_true)?, operand(on_false)?))
    }

    fn reduce(&self, kind: &str, axes: Vec<i64>, keepdim: bool) -> R {
        let t = &self.inner;
        wrap(match kind {
            "sum" => t.sum(&axes, keepdim),
            "mean" => t.mean(&axes, keepdim),
            "max" => t.max(&axes, keepdim),
            "min" => t.min(&axes, keepdim),
            "prod" => t.prod(&axes, keepdim),
            other => return Err(PyValueError::new_err(format!("unknown reduction {other:?}"))),
        })
    }

    #[pyo3(signature = (kind, axis, keepdim))]
    fn arg_reduce(&self, kind: &str, axis: Option<i64>, keepdim: bool) -> R {
        wrap(match kind {
            "argmax" => self.inner.argmax(axis, keepdim),
            "argmin" => self.inner.argmin(axis, keepdim),
            other => return Err(PyValueError::new_err(format!("unknown arg reduction {other:?}"))),
        })
    }

    fn cast(&self, dtype: &str) -> R {
        wrap(self.inner.to_dtype(parse_dtype(dtype)?))
    }

    fn reshape(&self, shape: Vec<usize>) -> R {
        wrap(self.inner.reshape(&shape))
    }

    fn expand(&self, shape: Vec<usize>) -> R {
        wrap(self.inner.expand(&shape))
    }

    fn permute(&self, perm: Vec<usize>) -> R {
        wrap(self.inner.permute(&perm))
    }

    fn slice(&self, axis: i64, start: i64, stop: i64, step: usize) -> R {
        wrap(self.inner.slice(axis, start, stop, step))
    }

    /// Rows `indices[i]` of this table; the lowering checks the indices
    /// (`check_indices`) with its own op's message.
    fn gather_rows(&self, indices: &PyTensor) -> R {
        wrap(self.inner.gather_rows_unchecked(&indices.inner))
    }

    /// `rows` rows of zeros plus row `i` of this tensor added to row
    /// `indices[i]`; checked by the lowering as `gather_rows` is.
    fn scatter_add_rows(&self, indices: &PyTensor, rows: usize) -> R {
        wrap(self.inner.scatter_add_rows_unchecked(&indices.inner, rows))
    }

    fn matmul(&self, rhs: &PyTensor) -> R {
        wrap(self.inner.matmul(&rhs.inner))
    }

    fn softmax(&self, axis: i64) -> R {
        wrap(self.inner.softmax(axis))
    }

    fn log_softmax(&self, axis: i64) -> R {
        wrap(self.inner.log_softmax(axis))
    }

    /// This value in `engine`'s context (no copy on the CPU backend).
    fn to_engine(&self, py: Python<'_>, engine: &PyEngine) -> R {
        let t = self.inner.clone();
        wrap(py.allow_threads(|| t.to_context(&engine.ctx)))
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}
