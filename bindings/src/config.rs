//! The environment, parsed once, by the engine: the Python package asks
//! here instead of reading `TORCH_TPU_*` variables itself, so each variable's
//! valid values and its error message live in `deferfuse::config` only.

use deferfuse::{Config, Error, FusedRounding, Mode};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::to_py;

/// The `TORCH_TPU_*` variables of this process as `Config::from_env` reads
/// them, as a dict; a bad value raises `EngineError` naming the variable and
/// its valid values.
#[pyfunction]
pub fn env_config(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let c = Config::from_env().map_err(to_py)?;
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    let d = PyDict::new(py);
    d.set_item("mode", c.mode.name())?;
    d.set_item("max_pending_ops", c.max_pending_ops)?;
    d.set_item("cut_repeats", c.cut_repeats)?;
    d.set_item("read_ahead", c.read_ahead)?;
    let mut checks = Vec::new();
    if c.debug_checks.nan {
        checks.push("nan");
    }
    if c.debug_checks.inf {
        checks.push("inf");
    }
    d.set_item("debug_checks", checks)?;
    let rounding = match c.fused_rounding {
        FusedRounding::Once => "once",
        FusedRounding::PerOp => "per_op",
    };
    d.set_item("fused_rounding", rounding)?;
    d.set_item("fusion", c.fusion)?;
    d.set_item("cache_dir", path(&c.cache_dir))?;
    d.set_item("cache_bytes", c.cache_bytes)?;
    d.set_item("backend", c.backend.name())?;
    d.set_item("pjrt_plugin", path(&c.pjrt_plugin))?;
    d.set_item("fusion_dump", path(&c.fusion_dump))?;
    d.set_item("decompose", if c.decompose_all { "all" } else { "default" })?;
    d.set_item("dist_check_calls", c.dist_check_calls)?;
    Ok(d)
}

/// The canonical name of the mode `name` (any case, spaces around ignored);
/// anything else raises `ValueError` listing the valid modes.
#[pyfunction]
pub fn parse_mode(name: &str) -> PyResult<&'static str> {
    name.parse::<Mode>().map(Mode::name).map_err(|e| match e {
        // The engine's list of valid values, without its variable name: a
        // mode passed to `set_mode` did not come from the environment.
        Error::Config { valid, .. } => {
            PyValueError::new_err(format!("deferfuse: unknown mode {name:?}; valid modes: {valid}"))
        }
        other => to_py(other),
    })
}
