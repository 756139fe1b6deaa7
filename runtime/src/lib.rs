//! The deferfuse runtime: the narrow [`Backend`] interface, host data and
//! buffers with their memory accounting, the native CPU backend and the PJRT
//! backend.
//!
//! - [`backend`]: the [`Backend`] and [`Executable`] traits;
//! - [`host_data`]: [`HostData`], typed element vectors on the host;
//! - [`buffer`]: [`Buffer`] and its [`Storage`] (host, or a device backend's
//!   [`DeviceData`]);
//! - [`memory`]: [`MemoryTracker`], live and peak bytes per context;
//! - [`cpu`]: [`CpuBackend`]: the unfused reference kernels every other path
//!   is compared against, and the fused loop, row and GEMM kernels;
//! - `pjrt` (feature `pjrt`): programs lowered to StableHLO and run by a PJRT
//!   plugin (XLA's CPU plugin in tests, libtpu on a TPU VM) through the C API.

pub mod backend;
pub mod buffer;
pub mod cpu;
pub mod host_data;
pub mod memory;
#[cfg(feature = "pjrt")]
pub mod pjrt;

pub use backend::{ArtifactStore, Backend, BackendStats, Executable};
pub use buffer::{Buffer, DeviceData, Storage};
pub use cpu::CpuBackend;
pub use host_data::HostData;
pub use memory::{MemoryStats, MemoryTracker};
