//! Creates the backend a [`Config`] asks for (`TORCH_TPU_BACKEND=cpu|pjrt`).
//!
//! - `cpu` (the default): the native CPU backend and its fused kernels;
//! - `pjrt`: a PJRT plugin (`TORCH_TPU_PJRT_PLUGIN`, else libtpu, else XLA's
//!   CPU plugin from the `xla-cpu-pjrt` wheel in the active or project
//!   virtual environment), when deferfuse is built with the `pjrt` feature.
//!   DeferAndFuse hands it one unfused module per flush (XLA fuses inside
//!   it); compiled executables are kept on disk under
//!   `<TORCH_TPU_CACHE_DIR>/pjrt-executables`.

use std::path::PathBuf;
use std::sync::Arc;

use runtime::{Backend, CpuBackend, MemoryTracker};
use trace_ir::Result;

use crate::config::{BackendKind, Config};

/// The folder, under the cache directory, of serialized PJRT executables.
pub const PJRT_EXECUTABLES_DIR: &str = "pjrt-executables";

/// The backend `config` asks for.
pub(crate) fn create(config: &Config, tracker: Arc<MemoryTracker>) -> Result<Arc<dyn Backend>> {
    match config.backend {
        BackendKind::Cpu => Ok(Arc::new(CpuBackend::new(tracker).with_simd(config.simd))),
        BackendKind::Pjrt => pjrt(config.pjrt_plugin.as_ref(), config, tracker),
    }
}

#[cfg(feature = "pjrt")]
fn pjrt(
    plugin: Option<&PathBuf>,
    config: &Config,
    tracker: Arc<MemoryTracker>,
) -> Result<Arc<dyn Backend>> {
    use runtime::pjrt::PjrtBackend;
    let backend = match plugin {
        Some(path) => PjrtBackend::with_plugin(path, tracker)?,
        None => PjrtBackend::new(tracker)?,
    };
    let store = config.cache_dir.as_ref().and_then(|dir| {
        crate::disk_cache::DiskCache::open_or_warn(
            dir.join(PJRT_EXECUTABLES_DIR),
            crate::disk_cache::DiskCacheLimits::from_config(config),
        )
    });
    let backend = match store {
        Some(store) => backend.with_store(Arc::new(store)),
        None => backend,
    };
    tracing::debug!(plugin = %backend.describe(), "pjrt backend");
    Ok(Arc::new(backend))
}

#[cfg(not(feature = "pjrt"))]
fn pjrt(_: Option<&PathBuf>, _: &Config, _: Arc<MemoryTracker>) -> Result<Arc<dyn Backend>> {
    Err(trace_ir::Error::Config {
        var: crate::config::ENV_BACKEND.into(),
        value: "pjrt".into(),
        valid: "cpu (this build of deferfuse has no PJRT backend; build it with `--features pjrt`)"
            .into(),
    })
}

/// The disk cache keeps the PJRT backend's serialized executables.
impl runtime::ArtifactStore for crate::disk_cache::DiskCache {
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        crate::disk_cache::DiskCache::get(self, key)
    }

    fn put(&self, key: &[u8], bytes: &[u8]) {
        crate::disk_cache::DiskCache::put(self, key, bytes)
    }

    fn reject(&self, key: &[u8], why: &str) {
        crate::disk_cache::DiskCache::reject(self, key, why)
    }

    fn rejected(&self) -> u64 {
        self.stats().rejected
    }
}
