//! The PJRT backend: traces lower to StableHLO ([`lower`]), compile through a
//! PJRT plugin (XLA's CPU plugin from the `xla-cpu-pjrt` wheel, `libtpu`, or
//! any plugin named by `TORCH_TPU_PJRT_PLUGIN`), and run on its first device.
//!
//! - [`ffi`]: hand-written declarations of the C API (header 0.81);
//! - [`api`]: safe, `Send + Sync` handles that free what they own;
//! - [`lower`]: the StableHLO lowering;
//! - [`PjrtBackend`]: the runtime [`Backend`].
//!
//! Buffers live on the device: [`Backend::upload`] copies host data there,
//! a run's outputs stay there (as [`Storage::Device`]) and feed later runs
//! directly, and only [`Backend::download`] (a read) copies back. Compiled
//! executables are cached in memory by the text of their module (canonical,
//! see [`lower`]) and, with an [`ArtifactStore`], serialized across
//! processes under a key that names the plugin build ([`PjrtBackend::identity`]).
//!
//! Plugin discovery ([`plugin_candidates`]): `TORCH_TPU_PJRT_PLUGIN` alone
//! when set; else the `libtpu` package's library, then the `xla-cpu-pjrt`
//! wheel's plugin, each looked up in the active virtual environment
//! (`$VIRTUAL_ENV`) and the project's `.venv` (found from the current
//! directory upwards). [`PjrtBackend::new`] takes the first candidate that
//! creates a client, so an installed libtpu on a machine without a TPU
//! falls through to the CPU plugin. Run `.ci/setup_python` to install the
//! CPU plugin into `.venv`.

pub mod api;
pub mod ffi;
pub mod lower;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rewrite_rules::program::{KernelKind, Program};
use trace_ir::{Error, Meta, NodeId, Result, Trace};

pub use api::{Client, DeviceBuffer, LoadedExecutable, Plugin};
pub use lower::{lower, lower_with, LowerOptions, Lowered};

use crate::backend::{ArtifactStore, Backend, BackendStats, Executable};
use crate::buffer::{Buffer, Storage};
use crate::host_data::HostData;
use crate::memory::MemoryTracker;
use api::err;

/// The environment variable naming a plugin library explicitly.
pub const PLUGIN_VAR: &str = "TORCH_TPU_PJRT_PLUGIN";

/// Where the plugin of the `xla-cpu-pjrt` wheel lives inside site-packages.
const XLA_CPU_PLUGIN: &str = "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";
/// Where the `libtpu` package's library lives inside site-packages.
const LIBTPU: &str = "libtpu/libtpu.so";

/// The plugin library [`PjrtBackend::new`] tries first (see [`plugin_candidates`]).
pub fn find_plugin() -> Result<PathBuf> {
    Ok(plugin_candidates()?.remove(0))
}

/// The plugin libraries to try, in order: `TORCH_TPU_PJRT_PLUGIN` alone when
/// set (it must name a file), else every libtpu, then every XLA CPU plugin
/// found in the active or project virtual environment. Never empty.
pub fn plugin_candidates() -> Result<Vec<PathBuf>> {
    if let Some(p) = std::env::var_os(PLUGIN_VAR).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            return Err(err(format!("{PLUGIN_VAR}={} does not name a file", p.display())));
        }
        return Ok(vec![p]);
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

/// Counters of the backend's in-memory executable cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Modules compiled by the plugin.
    pub compiles: usize,
    /// Compiles avoided because the module was cached.
    pub hits: usize,
}

#[derive(Debug, Default)]
struct Counters {
    compiled: AtomicU64,
    memory_hits: AtomicU64,
    loaded: AtomicU64,
    load_failures: AtomicU64,
    host_to_device: AtomicU64,
    device_to_host: AtomicU64,
    donated: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A backend that runs traces through a PJRT plugin.
pub struct PjrtBackend {
    compiler: Arc<Compiler>,
}

/// What compiles modules: the client, the executable caches and the
/// counters. Shared with every [`PjrtExecutable`], which compiles its
/// donating variants ([`Lowered::with_aliases`]) when a run first needs one.
struct Compiler {
    client: Arc<Client>,
    tracker: Arc<MemoryTracker>,
    options: LowerOptions,
    /// Debug-option overrides sent with every compile ([`compile_overrides`]);
    /// empty when the plugin rejected them.
    overrides: Mutex<Vec<(&'static str, OptionValue)>>,
    /// Module text -> compiled executable (the tier-2 cache of this backend).
    cache: Mutex<HashMap<String, Arc<LoadedExecutable>>>,
    /// Serialized executables across processes (tier 3), when given.
    store: Option<Arc<dyn ArtifactStore>>,
    identity: OnceLock<Result<String>>,
    counters: Arc<Counters>,
    /// Zero-dimensional uploads by dtype and bits ([`SharedScalar`]).
    scalars: Mutex<HashMap<(trace_ir::DType, u64), Arc<DeviceBuffer>>>,
}

/// The most scalars [`Compiler::scalars`] keeps (it starts over when full).
const MAX_SCALARS: usize = 1024;

/// A device scalar shared by every upload of the same value: a Rust scalar
/// in an op (`x.mul(0.125)`) is a parameter of the trace, uploaded at each
/// call, and a training loop passes the same few values every step. Shared
/// buffers are never donated.
#[derive(Debug)]
struct SharedScalar(Arc<DeviceBuffer>);

impl crate::buffer::DeviceData for SharedScalar {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The PJRT buffer behind device storage, and whether it is shared.
fn device_buffer(d: &dyn crate::buffer::DeviceData) -> Option<(&DeviceBuffer, bool)> {
    let any = d.as_any();
    any.downcast_ref::<DeviceBuffer>()
        .map(|b| (b, false))
        .or_else(|| any.downcast_ref::<SharedScalar>().map(|s| (&*s.0, true)))
}

/// The bits of a one-element value, as a cache key.
fn scalar_bits(data: &HostData) -> Option<u64> {
    Some(match data {
        HostData::Bool(v) => u64::from(*v.first()?),
        HostData::I32(v) => u64::from(*v.first()? as u32),
        HostData::I64(v) => *v.first()? as u64,
        HostData::BF16(v) => u64::from(v.first()?.to_bits()),
        HostData::F16(v) => u64::from(v.first()?.to_bits()),
        HostData::F32(v) => u64::from(v.first()?.to_bits()),
    })
}

impl std::fmt::Debug for PjrtBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PjrtBackend").field("client", &self.compiler.client).finish()
    }
}

/// The value of a debug-option override (`CompileOptionsProto.env_option_overrides`).
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// For enums and repeated fields too: names, comma-separated.
    Str(&'static str),
    Bool(bool),
}

/// The XLA debug options every CPU compile overrides: the values jax
/// (0.10) sends with each compile, where they differ from what an XLA CPU
/// plugin does with its own defaults. jax compiles with a full
/// `DebugOptions` of its own defaults; a plain PJRT client gets the
/// plugin's, under which `xla-cpu-pjrt` 0.0.1 lowers dots and reductions
/// to its generic loops instead of YNNPACK. An option the user sets in
/// `XLA_FLAGS` is left to the user.
pub fn compile_overrides() -> Vec<(&'static str, OptionValue)> {
    let all = [
        (
            "xla_cpu_experimental_ynn_fusion_type",
            OptionValue::Str("LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"),
        ),
        ("xla_cpu_enable_concurrency_optimized_scheduler", OptionValue::Bool(false)),
        // NaN propagates through max/min, as in the native backend.
        ("xla_cpu_enable_fast_min_max", OptionValue::Bool(false)),
    ];
    let user = std::env::var("XLA_FLAGS").unwrap_or_default();
    all.into_iter().filter(|(name, _)| !user.contains(name)).collect()
}

impl PjrtBackend {
    /// A backend on the first of [`plugin_candidates`] that loads and creates
    /// a client; the error lists why each candidate failed.
    pub fn new(tracker: Arc<MemoryTracker>) -> Result<PjrtBackend> {
        let mut failures = Vec::new();
        for path in plugin_candidates()? {
            match Self::with_plugin(&path, tracker.clone()) {
                Ok(b) => return Ok(b),
                Err(e) => {
                    tracing::warn!(plugin = %path.display(), error = %e, "PJRT plugin unusable; trying the next one");
                    failures.push(e.to_string());
                }
            }
        }
        Err(err(format!("no usable PJRT plugin: {}", failures.join("; "))))
    }

    /// A backend on the plugin at `path`.
    pub fn with_plugin(path: &Path, tracker: Arc<MemoryTracker>) -> Result<PjrtBackend> {
        let plugin = Plugin::load(path)?;
        let client = Client::new(plugin)?;
        // The overrides name XLA CPU options; other platforms keep their defaults.
        let overrides = if client.platform_name.eq_ignore_ascii_case("cpu") {
            compile_overrides()
        } else {
            Vec::new()
        };
        Ok(PjrtBackend {
            compiler: Arc::new(Compiler {
                client,
                tracker,
                options: LowerOptions::default(),
                overrides: Mutex::new(overrides),
                cache: Mutex::new(HashMap::new()),
                store: None,
                identity: OnceLock::new(),
                counters: Arc::new(Counters::default()),
                scalars: Mutex::new(HashMap::new()),
            }),
        })
    }

    fn compiler_mut(&mut self) -> &mut Compiler {
        Arc::get_mut(&mut self.compiler).expect("a PjrtBackend is configured before it compiles")
    }

    /// Changes the lowering options (affects later compiles only).
    pub fn with_options(mut self, options: LowerOptions) -> Self {
        self.compiler_mut().options = options;
        self
    }

    /// Keeps serialized executables in `store` (the on-disk tier 3).
    pub fn with_store(mut self, store: Arc<dyn ArtifactStore>) -> Self {
        self.compiler_mut().store = Some(store);
        self
    }

    /// Sends no debug-option overrides with compiles (see [`compile_overrides`]).
    pub fn without_overrides(mut self) -> Self {
        self.compiler_mut().overrides = Mutex::new(Vec::new());
        self
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        self.compiler.client.plugin()
    }

    pub fn client(&self) -> &Arc<Client> {
        &self.compiler.client
    }

    pub fn cache_stats(&self) -> CacheStats {
        let c = &self.compiler.counters;
        CacheStats {
            compiles: c.compiled.load(Ordering::Relaxed) as usize,
            hits: c.memory_hits.load(Ordering::Relaxed) as usize,
        }
    }

    /// A one-line description: plugin path, API version, XLA version, platform.
    pub fn describe(&self) -> String {
        let p = self.plugin();
        let client = &self.compiler.client;
        format!(
            "{} (PJRT API {}.{}, xla_version {}, stablehlo {}, platform {} {})",
            p.path.display(),
            p.api_version.0,
            p.api_version.1,
            p.attribute("xla_version").unwrap_or("?"),
            p.attribute("stablehlo_current_version").unwrap_or("?"),
            client.platform_name,
            client.platform_version
        )
    }

    /// Everything a serialized executable depends on besides its module:
    /// the PJRT API version, the platform and its version, the plugin's
    /// version attributes, a hash of the plugin file (XLA's own executable
    /// fingerprint is equal across plugin builds, and a newer build's
    /// executable loaded by an older one can compute wrong numbers
    /// silently), the host CPU (XLA's CPU code uses its features), the
    /// lowering options and the compile options. Stable across processes
    /// and machines.
    pub fn identity(&self) -> Result<String> {
        self.compiler.identity()
    }

    /// Lowers and compiles `trace`: from the in-memory cache, else from the
    /// store, else by the plugin (then saved to the store).
    pub fn compile_trace(&self, trace: &Trace) -> Result<Arc<PjrtExecutable>> {
        let lowered = lower_with(trace, self.compiler.options)?;
        let exe = match lowered.outputs.is_empty() {
            true => None,
            false => Some(self.compiler.executable(&lowered.text, lowered.outputs.len())?),
        };
        Ok(Arc::new(PjrtExecutable {
            exe,
            lowered,
            compiler: self.compiler.clone(),
            donating: Mutex::new(HashMap::new()),
        }))
    }
}

impl Compiler {
    fn identity(&self) -> Result<String> {
        self.identity.get_or_init(|| self.compute_identity()).clone()
    }

    fn compute_identity(&self) -> Result<String> {
        let p = self.client.plugin();
        let (hash, len) = p.file_hash()?;
        let mut attrs: Vec<String> = p
            .attributes
            .iter()
            .filter(|(k, _)| k.contains("version"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        attrs.sort();
        Ok(format!(
            "pjrt api {}.{}; platform {} {}; {}; plugin file {hash:016x} of {len} bytes; host {} cpu {:016x}; lowering {:?}; overrides {:?}",
            p.api_version.0,
            p.api_version.1,
            self.client.platform_name,
            self.client.platform_version,
            attrs.join(" "),
            std::env::consts::ARCH,
            trace_ir::signature::stable_hash64(host_cpu_features().as_bytes()),
            self.options,
            self.overrides.lock().unwrap_or_else(|p| p.into_inner()),
        ))
    }

    /// The executable of `module` (with `outputs` results): from the
    /// in-memory cache, else from the store, else compiled (and stored).
    fn executable(&self, module: &str, outputs: usize) -> Result<Arc<LoadedExecutable>> {
        let cached = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(module).cloned();
        if let Some(exe) = cached {
            bump(&self.counters.memory_hits);
            return Ok(exe);
        }
        let store_key = match &self.store {
            Some(_) => Some(self.store_key(module)?),
            None => None,
        };
        let exe = match self.load(store_key.as_deref(), outputs) {
            Some(exe) => exe,
            None => {
                let exe = self.compile_module(module, outputs)?;
                if let (Some(store), Some(key)) = (&self.store, &store_key) {
                    match exe.serialize() {
                        Ok(bytes) => store.put(key, &bytes),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot serialize a PJRT executable; it is not stored")
                        }
                    }
                }
                exe
            }
        };
        let exe = Arc::new(exe);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        Ok(cache.entry(module.to_string()).or_insert(exe).clone())
    }

    fn store_key(&self, module: &str) -> Result<Vec<u8>> {
        let mut key = format!(
            "deferfuse {} pjrt executable\n{}\n",
            env!("CARGO_PKG_VERSION"),
            self.identity()?
        )
        .into_bytes();
        key.extend_from_slice(module.as_bytes());
        Ok(key)
    }

    /// The stored executable of a module, if the store has a loadable one.
    fn load(&self, key: Option<&[u8]>, outputs: usize) -> Option<LoadedExecutable> {
        let bytes = self.store.as_ref()?.get(key?)?;
        let loaded =
            self.client.deserialize(&bytes).and_then(|exe| match exe.num_outputs() == outputs {
                true => Ok(exe),
                false => {
                    Err(err(format!("it has {} outputs, the module {outputs}", exe.num_outputs())))
                }
            });
        match loaded {
            Ok(exe) => {
                bump(&self.counters.loaded);
                Some(exe)
            }
            Err(e) => {
                tracing::warn!(error = %e, "a stored PJRT executable did not load; compiling again");
                bump(&self.counters.load_failures);
                None
            }
        }
    }

    fn compile_module(&self, module: &str, outputs: usize) -> Result<LoadedExecutable> {
        let context = |e: Error| match e {
            Error::Backend { backend, msg } => {
                Error::Backend { backend, msg: format!("compiling the lowered trace: {msg}") }
            }
            other => other,
        };
        let overrides = self.overrides.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let exe = match self.client.compile(module, &api::compile_options(&overrides)) {
            Err(Error::Backend { msg, .. })
                if !overrides.is_empty()
                    && (msg.contains("compile option") || msg.contains("setting option")) =>
            {
                // A plugin whose XLA lacks one of the options ("No such compile
                // option", "While setting option"): compile with its defaults
                // from now on.
                tracing::warn!(error = %msg, "the PJRT plugin rejected the compile-option overrides; compiling without them");
                self.overrides.lock().unwrap_or_else(|p| p.into_inner()).clear();
                self.client.compile(module, &api::compile_options(&[])).map_err(context)?
            }
            other => other.map_err(context)?,
        };
        if exe.num_outputs() != outputs {
            return Err(err(format!(
                "the compiled module has {} outputs, the trace {outputs}",
                exe.num_outputs()
            )));
        }
        bump(&self.counters.compiled);
        Ok(exe)
    }
}

/// The host CPU's feature flags as the kernel reports them (XLA's CPU
/// plugin compiles for the host's features); the architecture elsewhere.
fn host_cpu_features() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("flags") || l.starts_with("Features"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, flags)| flags.trim().to_string())
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
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
        let meta = program
            .values
            .get(p)
            .ok_or_else(|| bad(format!("parameter value {p} does not exist")))?;
        if map[p].is_some() {
            return Err(bad(format!("value {p} is a parameter twice")));
        }
        map[p] = Some(t.push_parameter(meta.clone()));
    }
    let lookup = |map: &[Option<NodeId>], v: usize| -> Result<NodeId> {
        map.get(v)
            .copied()
            .flatten()
            .ok_or_else(|| bad(format!("value {v} is read before it is written")))
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

    /// Copies `data` to the device; the buffer stays there.
    fn upload(&self, meta: Meta, data: HostData) -> Result<Arc<Buffer>> {
        data.check_fits("upload", &meta)?;
        let c = &self.compiler;
        if let (true, Some(bits)) = (meta.shape.is_empty(), scalar_bits(&data)) {
            let key = (meta.dtype, bits);
            let cached = c.scalars.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
            let shared = match cached {
                Some(b) => b,
                None => {
                    let b = Arc::new(c.client.upload(&data, &meta.shape)?);
                    bump(&c.counters.host_to_device);
                    let mut scalars = c.scalars.lock().unwrap_or_else(|p| p.into_inner());
                    if scalars.len() >= MAX_SCALARS {
                        scalars.clear();
                    }
                    scalars.entry(key).or_insert(b).clone()
                }
            };
            return Ok(Arc::new(Buffer::device(meta, Box::new(SharedScalar(shared)), &c.tracker)));
        }
        let device = c.client.upload(&data, &meta.shape)?;
        bump(&c.counters.host_to_device);
        Ok(Arc::new(Buffer::device(meta, Box::new(device), &c.tracker)))
    }

    fn download(&self, buffer: &Buffer) -> Result<HostData> {
        match buffer.storage() {
            Storage::Host(d) => Ok(d.clone()),
            Storage::Device(d) => {
                let (device, _) = device_buffer(d.as_ref())
                    .ok_or_else(|| err("the buffer lives on another device backend"))?;
                let data = device.to_host()?;
                bump(&self.compiler.counters.device_to_host);
                check_data("download", buffer.meta(), &data)?;
                Ok(data)
            }
        }
    }

    fn memory(&self) -> &Arc<MemoryTracker> {
        &self.compiler.tracker
    }

    fn fuses_itself(&self) -> bool {
        true
    }

    fn plugin_path(&self) -> Option<PathBuf> {
        Some(self.plugin().path.clone())
    }

    fn stats(&self) -> BackendStats {
        let c = &self.compiler.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BackendStats {
            compiled: get(&c.compiled),
            loaded: get(&c.loaded),
            load_failures: get(&c.load_failures),
            host_to_device: get(&c.host_to_device),
            device_to_host: get(&c.device_to_host),
            donated: get(&c.donated),
        }
    }
}

/// `(parameter, output)` pairs a run donates.
type Aliases = Vec<(usize, usize)>;

/// A compiled trace: runs on device buffers (uploading any host inputs) and
/// leaves its outputs on the device.
///
/// Buffer donation: an input that only this run holds (no tensor, no other
/// pending use) and that has the shape and dtype of an output is donated to
/// it: the run executes a variant of the module whose parameter is marked
/// `tf.aliasing_output`, and XLA writes the output into the input's memory
/// instead of allocating (and page-faulting) a new buffer. An optimizer step
/// whose new state replaces the old allocates nothing. Each donation
/// pattern compiles once, when a run first meets it (through the same
/// in-memory cache and store as the module itself); inputs someone still
/// holds are never donated, so they stay readable.
pub struct PjrtExecutable {
    /// `None` for a trace without outputs (nothing to run).
    exe: Option<Arc<LoadedExecutable>>,
    lowered: Lowered,
    compiler: Arc<Compiler>,
    /// Donating variants by `(parameter, output)` pairs.
    donating: Mutex<HashMap<Aliases, Arc<LoadedExecutable>>>,
}

impl PjrtExecutable {
    /// The StableHLO module this executable was compiled from.
    pub fn module(&self) -> &str {
        &self.lowered.text
    }

    pub fn loaded(&self) -> Option<&Arc<LoadedExecutable>> {
        self.exe.as_ref()
    }

    /// The executable that donates `aliases` (the plain one for none).
    fn variant(
        &self,
        base: &Arc<LoadedExecutable>,
        aliases: &[(usize, usize)],
    ) -> Result<Arc<LoadedExecutable>> {
        if aliases.is_empty() {
            return Ok(base.clone());
        }
        if let Some(exe) = self.donating.lock().unwrap_or_else(|p| p.into_inner()).get(aliases) {
            return Ok(exe.clone());
        }
        let exe = self
            .compiler
            .executable(&self.lowered.with_aliases(aliases), self.lowered.outputs.len())?;
        self.donating
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(aliases.to_vec(), exe.clone());
        Ok(exe)
    }
}

/// `(input, output)` pairs to donate: each input that only the run holds
/// (`owned`) goes to the first output of its meta not taken yet.
fn donations(owned: &[bool], params: &[Meta], outputs: &[Meta]) -> Vec<(usize, usize)> {
    let mut taken = vec![false; outputs.len()];
    let mut pairs = Vec::new();
    for (k, meta) in params.iter().enumerate() {
        if !owned[k] || meta.numel() == 0 {
            continue;
        }
        if let Some(j) = (0..outputs.len()).find(|&j| !taken[j] && outputs[j] == *meta) {
            taken[j] = true;
            pairs.push((k, j));
        }
    }
    pairs
}

/// An input of a run: a device buffer it already has, or one uploaded for it.
enum Input<'a> {
    Resident(&'a DeviceBuffer),
    Uploaded(DeviceBuffer),
}

impl Input<'_> {
    fn buffer(&self) -> &DeviceBuffer {
        match self {
            Input::Resident(b) => b,
            Input::Uploaded(b) => b,
        }
    }
}

impl Executable for PjrtExecutable {
    fn run(&self, inputs: Vec<Arc<Buffer>>) -> Result<Vec<Arc<Buffer>>> {
        let params = &self.lowered.params;
        if inputs.len() != params.len() {
            return Err(err(format!(
                "the trace takes {} inputs, got {}",
                params.len(),
                inputs.len()
            )));
        }
        let Some(base) = &self.exe else { return Ok(Vec::new()) };
        let c = &self.compiler;
        let mut device = Vec::with_capacity(inputs.len());
        let mut owned = vec![false; inputs.len()];
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
            device.push(match buf.storage() {
                Storage::Device(d) => {
                    let (b, shared) = device_buffer(d.as_ref())
                        .ok_or_else(|| err(format!("input {k} lives on another device backend")))?;
                    if !Arc::ptr_eq(b.client(), &c.client) {
                        return Err(err(format!("input {k} lives on another PJRT client")));
                    }
                    // Only this run holds it: nobody can read it after the run.
                    owned[k] = !shared && Arc::strong_count(buf) == 1 && Arc::weak_count(buf) == 0;
                    Input::Resident(b)
                }
                Storage::Host(data) => {
                    check_data(&format!("input {k}"), want, data)?;
                    bump(&c.counters.host_to_device);
                    Input::Uploaded(c.client.upload(data, &want.shape)?)
                }
            });
        }
        let aliases = donations(&owned, params, &self.lowered.outputs);
        let exe = self.variant(base, &aliases)?;
        let refs: Vec<&DeviceBuffer> = device.iter().map(Input::buffer).collect();
        let outs = exe.execute(&refs)?;
        c.counters.donated.fetch_add(aliases.len() as u64, Ordering::Relaxed);
        drop(refs);
        drop(device);
        // Donated inputs are invalid now; dropping them only frees handles.
        drop(inputs);
        Ok(outs
            .into_iter()
            .zip(&self.lowered.outputs)
            .map(|(mut d, meta)| {
                d.set_meta(meta.dtype, meta.numel());
                Arc::new(Buffer::device(meta.clone(), Box::new(d), &c.tracker))
            })
            .collect())
    }
}
