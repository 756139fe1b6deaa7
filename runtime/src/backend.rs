//! The narrow interface every backend implements.

use std::sync::Arc;

use rewrite_rules::program::Program;
use trace_ir::{Meta, Result};

use crate::buffer::Buffer;
use crate::host_data::HostData;
use crate::memory::MemoryTracker;

/// A compiled program, ready to run many times on new inputs.
pub trait Executable: Send + Sync {
    /// Runs on `inputs` (one per program parameter, in parameter order) and
    /// returns one buffer per program output. Inputs are passed by value so
    /// the executable can free each one after its last use, or reuse its memory.
    fn run(&self, inputs: Vec<Arc<Buffer>>) -> Result<Vec<Arc<Buffer>>>;

    /// This executable for `program`, which is the program it was compiled
    /// from at other sizes ([`Program::resized`]), without compiling again.
    /// `None` where executables are specialized to their sizes (the
    /// default), and the program must be compiled anew.
    fn resized(&self, program: &Program) -> Option<Arc<dyn Executable>> {
        let _ = program;
        None
    }
}

/// A place where programs compile and buffers live.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;

    /// Compiles a program (from [`Program::unfused`] or the planner) into an
    /// executable.
    fn compile(&self, program: &Program) -> Result<Arc<dyn Executable>>;

    /// Moves host data into a new buffer of this backend.
    fn upload(&self, meta: Meta, data: HostData) -> Result<Arc<Buffer>>;

    /// Copies a buffer back to the host.
    fn download(&self, buffer: &Buffer) -> Result<HostData>;

    /// The tracker every buffer of this backend counts against.
    fn memory(&self) -> &Arc<MemoryTracker>;

    /// True when the backend compiles a whole trace into one module and
    /// fuses inside it itself (PJRT: XLA does). DeferAndFuse then hands it
    /// [`Program::unfused`] of the optimized trace instead of planned kernels.
    fn fuses_itself(&self) -> bool {
        false
    }

    /// The library the backend runs on (a PJRT plugin), where there is one.
    fn plugin_path(&self) -> Option<std::path::PathBuf> {
        None
    }

    /// Compiles, host/device transfers and kernel time so far (zero where
    /// not counted).
    fn stats(&self) -> BackendStats {
        BackendStats::default()
    }
}

/// Counters of a backend's compiler, transfers and kernels, for tests and
/// `Context::stats`. The native CPU backend counts only its kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BackendStats {
    /// Programs compiled from scratch.
    pub compiled: u64,
    /// Executables loaded from an [`ArtifactStore`] instead of compiled.
    pub loaded: u64,
    /// Stored executables that failed to load and were compiled again.
    pub load_failures: u64,
    /// Entries the [`ArtifactStore`] refused (not authentic, truncated, not a
    /// regular file, or failed to load), removed and rebuilt.
    pub store_rejected: u64,
    /// Buffers copied from the host to the device, and back.
    pub host_to_device: u64,
    pub device_to_host: u64,
    /// Inputs whose memory a run reused for an output (buffer donation).
    pub donated: u64,
    /// Kernels run and the time they took, by kind (the native backend
    /// counts these; PJRT's executables run as one call and do not).
    pub kernels: KernelStats,
}

/// Kernels a backend ran, by kind: where a program's time goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct KernelStats {
    /// Single ops on the reference code (Strict's ops, and what the planner
    /// left unfused).
    pub single: KernelTime,
    /// Fused elementwise, reduction and row loops.
    pub loops: KernelTime,
    /// Matrix products with their epilogues.
    pub matmul: KernelTime,
    /// Floating-point operations of those products (2 per multiply-add).
    pub matmul_flops: u64,
}

/// How many kernels of one kind ran, and their wall time in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct KernelTime {
    pub runs: u64,
    pub ns: u64,
}

/// Where a backend keeps compiled executables across processes (tier 3 of
/// the engine's cache). Keys are stable bytes the backend chooses; a store
/// must return exactly what was put under a key, or nothing.
pub trait ArtifactStore: Send + Sync {
    fn get(&self, key: &[u8]) -> Option<Vec<u8>>;
    /// Failing to store only costs a compile later, so it is not an error.
    fn put(&self, key: &[u8], bytes: &[u8]);
    /// What [`ArtifactStore::get`] returned for `key` could not be loaded:
    /// the store drops it (so it is rebuilt, not read again) and counts it.
    fn reject(&self, _key: &[u8], _why: &str) {}
    /// Entries refused so far, by [`ArtifactStore::reject`] or by the
    /// store's own checks.
    fn rejected(&self) -> u64 {
        0
    }
}
