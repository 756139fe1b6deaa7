//! The program cache: trace signature → executable. Every mode goes through
//! it, so the same op sequence compiles once per context.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ahash::AHashMap;
use runtime::{Backend, Executable};
use trace_ir::{Result, Signature, Trace};

#[derive(Default)]
pub(crate) struct ProgramCache {
    map: Mutex<AHashMap<Signature, Arc<dyn Executable>>>,
    hits: AtomicU64,
    misses: AtomicU64,
    compile_ns: AtomicU64,
}

/// Counters of the program cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Total time spent compiling on misses.
    pub compile_ns: u64,
}

impl ProgramCache {
    /// The executable for `trace`, compiled on the first request only.
    pub fn get_or_compile(&self, backend: &dyn Backend, trace: &Trace) -> Result<Arc<dyn Executable>> {
        let sig = Signature::of(trace);
        if let Some(exe) = self.map.lock().unwrap().get(&sig) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(exe.clone());
        }
        // Compile outside the lock; a racing thread may compile the same
        // program too, and the first insert wins.
        let start = Instant::now();
        let exe = backend.compile(trace)?;
        self.compile_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.misses.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(nodes = trace.len(), hash = sig.stable_hash(), "compiled program");
        Ok(self.map.lock().unwrap().entry(sig).or_insert(exe).clone())
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            compile_ns: self.compile_ns.load(Ordering::Relaxed),
        }
    }
}
