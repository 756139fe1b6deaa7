//! [`PjrtBackend`], the runtime [`Backend`] on a PJRT plugin: uploads to and
//! downloads from its first device, compiles through a [`Compiler`] shared
//! with its executables, and counts what it moves and compiles.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rewrite_rules::program::Program;
use trace_ir::{Meta, Result, Trace};

use super::api::{err, Client, Plugin};
use super::compiler::{bump, Compiler};
use super::executable::PjrtExecutable;
use super::lower::{lower_with, LowerOptions};
use super::options::compile_overrides;
use super::plugin::plugin_candidates;
use super::program::program_trace;
use super::scalars::{device_buffer, ScalarCache};
use crate::backend::{ArtifactStore, Backend, BackendStats, Executable};
use crate::buffer::{Buffer, Storage};
use crate::host_data::HostData;
use crate::memory::MemoryTracker;

/// Counters of the backend's in-memory executable cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Modules compiled by the plugin.
    pub compiles: usize,
    /// Compiles avoided because the module was cached.
    pub hits: usize,
}

/// A backend that runs traces through a PJRT plugin.
pub struct PjrtBackend {
    compiler: Arc<Compiler>,
    /// Zero-dimensional uploads, shared by value.
    scalars: ScalarCache,
}

impl std::fmt::Debug for PjrtBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PjrtBackend").field("client", &self.compiler.client).finish()
    }
}

impl PjrtBackend {
    /// A backend on the first plugin discovery finds ([`plugin_candidates`]
    /// with none named) that loads and creates a client, so an installed
    /// libtpu on a machine without a TPU falls through to the CPU plugin;
    /// the error lists why each candidate failed. [`Self::with_plugin`]
    /// takes a plugin named explicitly.
    pub fn new(tracker: Arc<MemoryTracker>) -> Result<PjrtBackend> {
        let mut failures = Vec::new();
        for path in plugin_candidates(None)? {
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
            compiler: Arc::new(Compiler::new(client, tracker, overrides)),
            scalars: ScalarCache::default(),
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
        Ok(Arc::new(PjrtExecutable::new(exe, lowered, self.compiler.clone())))
    }
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
        if let Some(shared) = self.scalars.get(&c.client, &meta, &data, &c.counters)? {
            return Ok(Arc::new(Buffer::device(meta, Box::new(shared), &c.tracker)));
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
                data.check_holds("pjrt", "download", buffer.meta())?;
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
            store_rejected: self.compiler.store.as_ref().map_or(0, |s| s.rejected()),
            host_to_device: get(&c.host_to_device),
            device_to_host: get(&c.device_to_host),
            donated: get(&c.donated),
            kernels: Default::default(),
        }
    }
}
