//! The PJRT backend: traces lower to StableHLO ([`lower`]), compile through a
//! PJRT plugin (XLA's CPU plugin from the `xla-cpu-pjrt` wheel, `libtpu`, or
//! any plugin named by `TORCH_TPU_PJRT_PLUGIN`), and run on its first device.
//!
//! - [`ffi`]: hand-written declarations of the C API (header 0.81);
//! - [`api`]: safe, `Send + Sync` handles that free what they own;
//! - [`lower`]: the StableHLO lowering;
//! - [`PjrtBackend`]: the runtime [`Backend`].
//!
//! Buffers: the runtime's [`Buffer`] has host storage only, so a run uploads
//! its inputs, executes, and downloads its outputs; device buffers live for
//! the duration of one run. Compiled executables are cached by the text of
//! their module (canonical, see [`lower`]).
//!
//! Plugin discovery ([`find_plugin`]): `TORCH_TPU_PJRT_PLUGIN`, else the
//! `libtpu` package's library, else the `xla-cpu-pjrt` wheel's plugin, both
//! looked up in the active virtual environment (`$VIRTUAL_ENV`) or the
//! project's `.venv` (found from the current directory upwards). Run
//! `.ci/setup_python` to install the CPU plugin into `.venv`.

pub mod api;
pub mod ffi;
pub mod lower;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rewrite_rules::program::{KernelKind, Program};
use trace_ir::{Error, Meta, NodeId, Result, Trace};

pub use api::{Client, DeviceBuffer, LoadedExecutable, Plugin};
pub use lower::{lower, lower_with, LowerOptions, Lowered};

use crate::backend::{Backend, Executable};
use crate::buffer::{Buffer, HostData};
use crate::memory::MemoryTracker;
use api::err;

/// The environment variable naming a plugin library explicitly.
pub const PLUGIN_VAR: &str = "TORCH_TPU_PJRT_PLUGIN";

/// Where the plugin of the `xla-cpu-pjrt` wheel lives inside site-packages.
const XLA_CPU_PLUGIN: &str = "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";
/// Where the `libtpu` package's library lives inside site-packages.
const LIBTPU: &str = "libtpu/libtpu.so";

/// Finds the plugin library to load: `TORCH_TPU_PJRT_PLUGIN`, else libtpu,
/// else the XLA CPU plugin, in the active or project virtual environment.
pub fn find_plugin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(PLUGIN_VAR).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            return Err(err(format!("{PLUGIN_VAR}={} does not name a file", p.display())));
        }
        return Ok(p);
    }
    let dirs = site_packages_dirs();
    for rel in [LIBTPU, XLA_CPU_PLUGIN] {
        if let Some(p) = dirs.iter().map(|d| d.join(rel)).find(|p| p.is_file()) {
            return Ok(p);
        }
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Err(err(format!(
        "no PJRT plugin found: set {PLUGIN_VAR}=/path/to/plugin.so, or run .ci/setup_python to install \
         the xla-cpu-pjrt wheel into the project's .venv (looked for {LIBTPU} and {XLA_CPU_PLUGIN} in: {})",
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
                .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python3")))
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

/// Counters of the backend's executable cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Modules compiled by the plugin.
    pub compiles: usize,
    /// Compiles avoided because the module was cached.
    pub hits: usize,
}

/// A backend that runs traces through a PJRT plugin.
pub struct PjrtBackend {
    client: Arc<Client>,
    tracker: Arc<MemoryTracker>,
    options: LowerOptions,
    /// Module text -> compiled executable (the tier-2 cache of this backend).
    cache: Mutex<HashMap<String, Arc<LoadedExecutable>>>,
    stats: Mutex<CacheStats>,
}

impl std::fmt::Debug for PjrtBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PjrtBackend").field("client", &self.client).finish()
    }
}

impl PjrtBackend {
    /// A backend on the plugin [`find_plugin`] finds.
    pub fn new(tracker: Arc<MemoryTracker>) -> Result<PjrtBackend> {
        Self::with_plugin(&find_plugin()?, tracker)
    }

    /// A backend on the plugin at `path`.
    pub fn with_plugin(path: &Path, tracker: Arc<MemoryTracker>) -> Result<PjrtBackend> {
        let plugin = Plugin::load(path)?;
        let client = Client::new(plugin)?;
        Ok(PjrtBackend {
            client,
            tracker,
            options: LowerOptions::default(),
            cache: Mutex::new(HashMap::new()),
            stats: Mutex::new(CacheStats::default()),
        })
    }

    /// Changes the lowering options (affects later compiles only).
    pub fn with_options(mut self, options: LowerOptions) -> Self {
        self.options = options;
        self
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        self.client.plugin()
    }

    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    pub fn cache_stats(&self) -> CacheStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A one-line description: plugin path, API version, XLA version, platform.
    pub fn describe(&self) -> String {
        let p = self.plugin();
        format!(
            "{} (PJRT API {}.{}, xla_version {}, stablehlo {}, platform {} {})",
            p.path.display(),
            p.api_version.0,
            p.api_version.1,
            p.attribute("xla_version").unwrap_or("?"),
            p.attribute("stablehlo_current_version").unwrap_or("?"),
            self.client.platform_name,
            self.client.platform_version
        )
    }

    /// Lowers and compiles `trace`, reusing a cached executable for an equal module.
    pub fn compile_trace(&self, trace: &Trace) -> Result<Arc<PjrtExecutable>> {
        let lowered = lower_with(trace, self.options)?;
        let cached = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&lowered.text).cloned();
        let exe = match cached {
            Some(exe) => {
                self.stats.lock().unwrap_or_else(|p| p.into_inner()).hits += 1;
                exe
            }
            None if lowered.outputs.is_empty() => {
                return Ok(Arc::new(PjrtExecutable { exe: None, lowered, tracker: self.tracker.clone(), client: self.client.clone() }))
            }
            None => {
                let exe = Arc::new(self.client.compile(&lowered.text).map_err(|e| match e {
                    Error::Backend { backend, msg } => Error::Backend { backend, msg: format!("compiling the lowered trace: {msg}") },
                    other => other,
                })?);
                if exe.num_outputs() != lowered.outputs.len() {
                    return Err(err(format!(
                        "the compiled module has {} outputs, the trace {}",
                        exe.num_outputs(),
                        lowered.outputs.len()
                    )));
                }
                self.stats.lock().unwrap_or_else(|p| p.into_inner()).compiles += 1;
                let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                cache.entry(lowered.text.clone()).or_insert(exe).clone()
            }
        };
        Ok(Arc::new(PjrtExecutable { exe: Some(exe), lowered, tracker: self.tracker.clone(), client: self.client.clone() }))
    }
}

/// Rebuilds the trace of a program whose kernels are all single ops (what
/// [`Program::unfused`] gives). XLA fuses the lowered module itself, so the
/// PJRT backend takes unfused programs; a planned program with fused
/// `Loop`/`MatMul` kernels is an error naming the kernel.
pub fn program_trace(program: &Program) -> Result<Trace> {
    let bad = |msg: String| Error::InvalidTrace(format!("program: {msg}"));
    let mut map: Vec<Option<NodeId>> = vec![None; program.values.len()];
    let mut t = Trace::new();
    for &p in &program.params {
        let meta = program.values.get(p).ok_or_else(|| bad(format!("parameter value {p} does not exist")))?;
        if map[p].is_some() {
            return Err(bad(format!("value {p} is a parameter twice")));
        }
        map[p] = Some(t.push_parameter(meta.clone()));
    }
    let lookup = |map: &[Option<NodeId>], v: usize| -> Result<NodeId> {
        map.get(v).copied().flatten().ok_or_else(|| bad(format!("value {v} is read before it is written")))
    };
    for (k, kernel) in program.kernels.iter().enumerate() {
        match &kernel.kind {
            KernelKind::Single { op } if !matches!(op, trace_ir::Op::Parameter { .. }) => {
                let [out] = kernel.outputs.as_slice() else {
                    return Err(bad(format!("kernel {k}: a single-op kernel writes one value")));
                };
                let inputs = kernel.inputs.iter().map(|&i| lookup(&map, i)).collect::<Result<Vec<_>>>()?;
                let id = t.push(op.clone(), &inputs).map_err(|e| bad(format!("kernel {k}: {e}")))?;
                if Some(t.meta(id)) != program.values.get(*out) {
                    return Err(bad(format!("kernel {k}: {} does not produce its output's meta", op.name())));
                }
                map[*out] = Some(id);
            }
            KernelKind::Single { .. } => return Err(bad(format!("kernel {k} is a parameter"))),
            KernelKind::Loop(_) | KernelKind::MatMul(_) => {
                return Err(err(format!(
                    "{}: the pjrt backend compiles unfused programs (Program::unfused); XLA fuses the lowered module itself",
                    program.describe_kernel(k)
                )))
            }
        }
    }
    t.outputs = program.outputs.iter().map(|&o| lookup(&map, o)).collect::<Result<_>>()?;
    Ok(t)
}

fn check_data(what: &str, meta: &Meta, data: &HostData) -> Result<()> {
    if data.dtype() != meta.dtype || data.len() != meta.numel() {
        return Err(err(format!(
            "{what}: {} data of {} elements does not fit {:?} {}",
            data.dtype(),
            data.len(),
            meta.shape.as_slice(),
            meta.dtype
        )));
    }
    Ok(())
}

impl Backend for PjrtBackend {
    fn name(&self) -> &'static str {
        "pjrt"
    }

    fn compile(&self, program: &Program) -> Result<Arc<dyn Executable>> {
        Ok(self.compile_trace(&program_trace(program)?)?)
    }

    fn upload(&self, meta: Meta, data: HostData) -> Result<Arc<Buffer>> {
        if data.dtype() != meta.dtype {
            return Err(Error::dtype("upload", "data dtype differs from the buffer's", &[meta.dtype, data.dtype()]));
        }
        if data.len() != meta.numel() {
            return Err(Error::DataLength { op: "upload".into(), len: data.len(), shape: meta.shape.clone(), numel: meta.numel() });
        }
        Ok(Arc::new(Buffer::host(meta, data, &self.tracker)))
    }

    fn download(&self, buffer: &Buffer) -> Result<HostData> {
        buffer.host_data().cloned().ok_or_else(|| err("buffer does not live on the host"))
    }

    fn memory(&self) -> &Arc<MemoryTracker> {
        &self.tracker
    }
}

/// A compiled trace: uploads inputs, executes, downloads outputs.
pub struct PjrtExecutable {
    /// `None` for a trace without outputs (nothing to run).
    exe: Option<Arc<LoadedExecutable>>,
    lowered: Lowered,
    tracker: Arc<MemoryTracker>,
    client: Arc<Client>,
}

impl PjrtExecutable {
    /// The StableHLO module this executable was compiled from.
    pub fn module(&self) -> &str {
        &self.lowered.text
    }

    pub fn loaded(&self) -> Option<&Arc<LoadedExecutable>> {
        self.exe.as_ref()
    }
}

impl Executable for PjrtExecutable {
    fn run(&self, inputs: Vec<Arc<Buffer>>) -> Result<Vec<Arc<Buffer>>> {
        let params = &self.lowered.params;
        if inputs.len() != params.len() {
            return Err(err(format!("the trace takes {} inputs, got {}", params.len(), inputs.len())));
        }
        let Some(exe) = &self.exe else { return Ok(Vec::new()) };
        let mut device = Vec::with_capacity(inputs.len());
        for (k, (buf, want)) in inputs.iter().zip(params).enumerate() {
            if buf.meta() != want {
                return Err(err(format!(
                    "input {k} is {:?} {} but the trace expects {:?} {}",
                    buf.meta().shape.as_slice(),
                    buf.meta().dtype,
                    want.shape.as_slice(),
                    want.dtype
                )));
            }
            let data = buf.host_data().ok_or_else(|| err(format!("input {k} does not live on the host")))?;
            check_data(&format!("input {k}"), want, data)?;
            device.push(self.client.upload(data, &want.shape)?);
        }
        drop(inputs);
        let refs: Vec<&DeviceBuffer> = device.iter().collect();
        let outs = exe.execute(&refs)?;
        drop(device);
        outs.into_iter()
            .zip(&self.lowered.outputs)
            .map(|(mut d, meta)| {
                d.set_meta(meta.dtype, meta.numel());
                let data = d.to_host()?;
                Ok(Arc::new(Buffer::host(meta.clone(), data, &self.tracker)))
            })
            .collect()
    }
}
