//! Finding a PJRT plugin library: one named explicitly, else the `libtpu`
//! package's library, then the `xla-cpu-pjrt` wheel's plugin, each looked
//! up in the active virtual environment (`$VIRTUAL_ENV`) and the project's
//! `.venv` (found from the current directory upwards). The runtime reads
//! no configuration of its own: the engine's `Config` parses
//! `TORCH_TPU_PJRT_PLUGIN` and passes the path in.

use std::path::{Path, PathBuf};

use trace_ir::Result;

use super::api::err;

/// Where the plugin of the `xla-cpu-pjrt` wheel lives inside site-packages.
const XLA_CPU_PLUGIN: &str = "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";
/// Where the `libtpu` package's library lives inside site-packages.
const LIBTPU: &str = "libtpu/libtpu.so";

/// The plugin library [`super::PjrtBackend::new`] tries first (see
/// [`plugin_candidates`]).
pub fn find_plugin(explicit: Option<&Path>) -> Result<PathBuf> {
    Ok(plugin_candidates(explicit)?.remove(0))
}

/// The plugin libraries to try, in order: `explicit` alone when given (it
/// must name a file), else every libtpu, then every XLA CPU plugin found in
/// the active or project virtual environment. Never empty.
pub fn plugin_candidates(explicit: Option<&Path>) -> Result<Vec<PathBuf>> {
    if let Some(p) = explicit {
        if !p.is_file() {
            return Err(err(format!("the PJRT plugin {} does not name a file", p.display())));
        }
        return Ok(vec![p.to_path_buf()]);
    }
    let dirs = site_packages_dirs();
    let found: Vec<PathBuf> = [LIBTPU, XLA_CPU_PLUGIN]
        .iter()
        .flat_map(|rel| dirs.iter().map(move |d| d.join(rel)))
        .filter(|p| p.is_file())
        .collect();
    if !found.is_empty() {
        return Ok(found);
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Err(err(format!(
        "no PJRT plugin found: name a plugin explicitly (TORCH_TPU_PJRT_PLUGIN=/path/to/plugin.so), \
         or run .ci/setup_python to install the xla-cpu-pjrt wheel into the project's .venv \
         (looked for {LIBTPU} and {XLA_CPU_PLUGIN} in: {})",
        if looked.is_empty() { "no virtual environment found".to_string() } else { looked.join(", ") }
    )))
}

/// `site-packages` folders of `$VIRTUAL_ENV` and of the nearest `.venv`
/// above the current directory (and above this crate, for tests).
fn site_packages_dirs() -> Vec<PathBuf> {
    let mut venvs: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV").filter(|v| !v.is_empty()) {
        venvs.push(PathBuf::from(v));
    }
    let mut starts: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        starts.push(cwd);
    }
    starts.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for start in starts {
        if let Some(v) = start.ancestors().map(|a| a.join(".venv")).find(|v| v.is_dir()) {
            if !venvs.contains(&v) {
                venvs.push(v);
            }
        }
    }
    let mut out = Vec::new();
    for venv in venvs {
        for lib in ["lib", "lib64"] {
            let Ok(entries) = std::fs::read_dir(venv.join(lib)) else { continue };
            let mut pys: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python3"))
                })
                .map(|p| p.join("site-packages"))
                .filter(|p| p.is_dir())
                .collect();
            pys.sort();
            for p in pys {
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
    }
    out
}
