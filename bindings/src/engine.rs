//! `Engine`: one deferfuse context, in one mode, seen from Python.

use deferfuse::{BoundsMessage, Config, Context, DType, HostData, IndexBound, Mode, Tensor};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::tensor::PyTensor;
use crate::{host, to_py};

#[pyclass(module = "deferfuse._engine", name = "Engine", frozen)]
pub struct PyEngine {
    pub(crate) ctx: Context,
}

pub(crate) fn parse_dtype(name: &str) -> PyResult<DType> {
    name.parse::<DType>().map_err(to_py)
}

#[pymethods]
impl PyEngine {
    /// A context configured by the `TORCH_TPU_*` variables, in `mode`
    /// (`strict`, `debug` or `defer_and_fuse`).
    #[new]
    fn new(mode: &str) -> PyResult<Self> {
        let mut config = Config::from_env().map_err(to_py)?;
        config.mode = mode.parse::<Mode>().map_err(to_py)?;
        Ok(PyEngine { ctx: Context::new(config).map_err(to_py)? })
    }

    #[getter]
    fn mode(&self) -> &'static str {
        self.ctx.mode().name()
    }

    /// Opens an op group on the calling thread ([`Context::op_group`]).
    fn begin_group(&self, name: &str) {
        self.ctx.begin_group(name)
    }

    /// Closes the calling thread's innermost op group.
    fn end_group(&self) -> PyResult<()> {
        self.ctx.end_group().map_err(to_py)
    }

    /// Runs everything issued so far (flushes DeferAndFuse, drains Strict).
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.ctx.sync()).map_err(to_py)
    }

    /// A tensor holding a copy of the `numel` elements of `dtype` at `addr`
    /// (the data pointer of a contiguous CPU tensor the caller keeps alive).
    fn tensor_from_address(
        &self,
        addr: usize,
        shape: Vec<usize>,
        dtype: &str,
    ) -> PyResult<PyTensor> {
        let dtype = parse_dtype(dtype)?;
        let numel = shape.iter().product();
        // SAFETY: the Python caller passes the data pointer of a live,
        // contiguous tensor of this dtype and shape.
        let data = unsafe { host::read(addr, numel, dtype) }
            .ok_or_else(|| host::out_of_memory(numel, dtype))?;
        let ctx = &self.ctx;
        let t = match data {
            HostData::F32(v) => ctx.from_vec(v, &shape),
            HostData::BF16(v) => ctx.from_vec(v, &shape),
            HostData::F16(v) => ctx.from_vec(v, &shape),
            HostData::I32(v) => ctx.from_vec(v, &shape),
            HostData::I64(v) => ctx.from_vec(v, &shape),
            HostData::Bool(v) => ctx.from_vec(v, &shape),
        };
        t.map(PyTensor::from).map_err(to_py)
    }

    /// A tensor whose data is copied from `addr` (the data pointer of the
    /// contiguous CPU tensor `source`) on the context's stream, while the
    /// caller goes on: a non-blocking copy from pinned memory. `source` is
    /// held until the copy has run, as CUDA's host allocator keeps a pinned
    /// block until the copy that reads it is done; changing it before then
    /// is the caller's race, as on CUDA.
    fn tensor_from_pinned(
        &self,
        py: Python<'_>,
        source: Py<PyAny>,
        addr: usize,
        shape: Vec<usize>,
        dtype: &str,
    ) -> PyResult<PyTensor> {
        let dtype = parse_dtype(dtype)?;
        let numel = shape.iter().product();
        let read = move || {
            // SAFETY: `source` keeps the memory at `addr` alive until the
            // copy is done; it holds `numel` elements of `dtype`.
            // Without memory for the copy: no data, which fails the tensor
            // (and what reads it) instead of aborting the process.
            let data = unsafe { host::read(addr, numel, dtype) }
                .unwrap_or_else(|| HostData::filled(dtype, 0.0, 0));
            // Dropped without the GIL: pyo3 releases it the next time it holds the GIL.
            drop(source);
            data
        };
        // Without the GIL: a DeferAndFuse upload may wait for room on the stream.
        py.allow_threads(|| self.ctx.from_host_async(&shape, dtype, read))
            .map(PyTensor::from)
            .map_err(to_py)
    }

    /// A constant (part of the trace, unlike scalar operands).
    fn full(&self, value: f64, shape: Vec<usize>, dtype: &str) -> PyResult<PyTensor> {
        self.ctx.full(value, &shape, parse_dtype(dtype)?).map(PyTensor::from).map_err(to_py)
    }

    fn arange(&self, start: f64, end: f64, step: f64, dtype: &str) -> PyResult<PyTensor> {
        self.ctx.arange(start, end, step, parse_dtype(dtype)?).map(PyTensor::from).map_err(to_py)
    }

    /// Joins tensors along `axis`, with type promotion.
    fn cat(&self, tensors: Vec<PyRef<'_, PyTensor>>, axis: i64) -> PyResult<PyTensor> {
        let owned = tensors
            .iter()
            .map(|t| t.inner.to_context(&self.ctx))
            .collect::<Result<Vec<Tensor>, _>>()
            .map_err(to_py)?;
        let refs: Vec<&Tensor> = owned.iter().collect();
        Tensor::cat(&refs, axis).map(PyTensor::from).map_err(to_py)
    }

    /// `tensor` as a tensor of this context (no copy on the CPU backend).
    fn adopt(&self, py: Python<'_>, tensor: &PyTensor) -> PyResult<PyTensor> {
        let t = tensor.inner.clone();
        py.allow_threads(|| t.to_context(&self.ctx)).map(PyTensor::from).map_err(to_py)
    }

    /// True when `tensor` belongs to this context.
    fn owns(&self, tensor: &PyTensor) -> bool {
        tensor.inner.context().same_as(&self.ctx)
    }

    /// Checks that the index tensors (of one shape, read together element by
    /// element) are in range for the sizes of the dimensions they index, as
    /// the PyTorch op `op` would; `kind` names PyTorch's message family
    /// (`out_of_bounds`, `gather_out_of_bounds`, `index_copy`,
    /// `out_of_range_in_self`, `indices_out_of_data`, `take`,
    /// `embedding_bag`, `embedding_bag_idx`, `target`) and `dims` the dimension numbers it
    /// prints. Debug raises here; the other modes at the next read or sync.
    fn check_indices(
        &self,
        indices: Vec<PyRef<'_, PyTensor>>,
        sizes: Vec<usize>,
        dims: Vec<usize>,
        op: &str,
        kind: &str,
        site: &str,
    ) -> PyResult<()> {
        let message = BoundsMessage::from_name(kind)
            .ok_or_else(|| PyValueError::new_err(format!("unknown bounds message {kind:?}")))?;
        if sizes.len() != indices.len() || dims.len() != indices.len() {
            return Err(PyValueError::new_err(format!(
                "check_indices: {} indices, {} sizes and {} dims",
                indices.len(),
                sizes.len(),
                dims.len()
            )));
        }
        let bounds: Vec<IndexBound<'_>> = indices
            .iter()
            .zip(sizes.iter().zip(&dims))
            .map(|(t, (&size, &dim))| IndexBound { index: &t.inner, size, dim })
            .collect();
        self.ctx.check_indices(&bounds, op, message, site).map_err(to_py)
    }

    /// Counters of this context as nested dicts of numbers: ops recorded,
    /// flushes, each cache tier's hits and misses and the phase times, the
    /// backend's counters, memory, and the size of the last flush.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let value = serde_json::to_value(self.ctx.stats())
            .map_err(|e| to_py(deferfuse::Error::internal("stats", e.to_string())))?;
        let d = json_to_py(py, &value)?.downcast_into::<PyDict>()?;
        if let Some(f) = self.ctx.last_flush() {
            d.set_item("last_flush_kernels", f.kernels)?;
            d.set_item("last_flush_nodes", f.trace_nodes)?;
        }
        Ok(d)
    }
}

/// A JSON value as the Python object `json.loads` would make of it.
fn json_to_py<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_pyobject(py)?.into_any(),
            (None, Some(i)) => i.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = pyo3::types::PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let d = PyDict::new(py);
            for (k, v) in map {
                d.set_item(k, json_to_py(py, v)?)?;
            }
            d.into_any()
        }
    })
}
