//! What compiles StableHLO modules on a PJRT client, shared by the backend
//! and its executables: the in-memory executable cache (tier 2), the
//! serialized executables of an [`ArtifactStore`] (tier 3) under a key
//! naming the plugin build, and compiles with the debug-option overrides
//! (dropped when the plugin rejects them).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use trace_ir::{Error, Result};

use super::api::{self, err, Client, LoadedExecutable};
use super::lower::LowerOptions;
use super::options::OptionValue;
use crate::backend::ArtifactStore;
use crate::memory::MemoryTracker;

/// What the backend counts ([`crate::BackendStats`], [`super::CacheStats`]).
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub compiled: AtomicU64,
    pub memory_hits: AtomicU64,
    pub loaded: AtomicU64,
    pub load_failures: AtomicU64,
    pub host_to_device: AtomicU64,
    pub device_to_host: AtomicU64,
    pub donated: AtomicU64,
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What compiles modules: the client, the executable caches and the
/// counters. Shared with every [`super::PjrtExecutable`], which compiles its
/// donating variants ([`super::Lowered::with_aliases`]) when a run first needs one.
pub(super) struct Compiler {
    pub client: Arc<Client>,
    pub tracker: Arc<MemoryTracker>,
    pub options: LowerOptions,
    /// Debug-option overrides sent with every compile ([`super::compile_overrides`]);
    /// empty when the plugin rejected them.
    pub overrides: Mutex<Vec<(&'static str, OptionValue)>>,
    /// Module text -> compiled executable (the tier-2 cache of this backend).
    cache: Mutex<HashMap<String, Arc<LoadedExecutable>>>,
    /// Serialized executables across processes (tier 3), when given.
    pub store: Option<Arc<dyn ArtifactStore>>,
    identity: OnceLock<Result<String>>,
    pub counters: Arc<Counters>,
}

impl Compiler {
    /// A compiler on `client` that sends `overrides` with every compile.
    pub(super) fn new(
        client: Arc<Client>,
        tracker: Arc<MemoryTracker>,
        overrides: Vec<(&'static str, OptionValue)>,
    ) -> Compiler {
        Compiler {
            client,
            tracker,
            options: LowerOptions::default(),
            overrides: Mutex::new(overrides),
            cache: Mutex::new(HashMap::new()),
            store: None,
            identity: OnceLock::new(),
            counters: Arc::new(Counters::default()),
        }
    }

    /// See [`super::PjrtBackend::identity`].
    pub(super) fn identity(&self) -> Result<String> {
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
    pub(super) fn executable(&self, module: &str, outputs: usize) -> Result<Arc<LoadedExecutable>> {
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
                // Dropped from the store, so the compile that follows replaces
                // it instead of every later process failing on it again.
                if let (Some(store), Some(key)) = (&self.store, key) {
                    store.reject(key, &format!("the stored PJRT executable did not load: {e}"));
                }
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
