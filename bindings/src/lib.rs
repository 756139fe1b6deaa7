//! `deferfuse._engine`: the native half of the PyTorch binding. It exposes
//! engine contexts ([`PyEngine`]) and engine tensors ([`PyTensor`]) to the
//! Python package `deferfuse`, which maps aten ops onto them. Every engine
//! error becomes a `deferfuse.EngineError` whose message names the op and
//! the shapes; nothing here panics across the FFI.

mod config;
mod engine;
mod host;
mod native;
mod root;
mod tensor;

use pyo3::create_exception;
use pyo3::exceptions::{PyIndexError, PyRuntimeError};
use pyo3::prelude::*;

pub use engine::PyEngine;
pub use tensor::PyTensor;

create_exception!(_engine, EngineError, PyRuntimeError, "An error raised by the deferfuse engine.");

/// Converts an engine error into the Python exception. An index out of
/// range raises what PyTorch raises for it (`IndexError` or
/// `RuntimeError`), so code that catches PyTorch's errors catches ours.
pub(crate) fn to_py(e: deferfuse::Error) -> PyErr {
    match &e {
        deferfuse::Error::IndexOutOfBounds(bad) => match bad.class {
            deferfuse::IndexErrorClass::IndexError => PyIndexError::new_err(e.to_string()),
            deferfuse::IndexErrorClass::RuntimeError => PyRuntimeError::new_err(e.to_string()),
        },
        _ => EngineError::new_err(e.to_string()),
    }
}

#[pymodule]
fn _engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngine>()?;
    m.add_class::<PyTensor>()?;
    m.add_class::<root::PyRoot>()?;
    m.add_function(wrap_pyfunction!(native::set_current, m)?)?;
    m.add_function(wrap_pyfunction!(native::native_ops, m)?)?;
    m.add("_native_api", native::abi::capsule(m.py())?)?;
    m.add("EngineError", m.py().get_type::<EngineError>())?;
    m.add_function(wrap_pyfunction!(config::env_config, m)?)?;
    m.add_function(wrap_pyfunction!(config::parse_mode, m)?)?;
    Ok(())
}
