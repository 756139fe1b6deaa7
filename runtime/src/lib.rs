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
//!   is compared against, and the fused loop, row and GEMM kernels
//!   (`cpu::fused`: `loops` checks and schedules a loop kernel, `tile` runs
//!   its tiles with AVX-512, AVX2 or portable code, the latter always when
//!   the backend is built [`CpuBackend::with_simd`]`(false)`);
//! - `pjrt` (feature `pjrt`): programs lowered to StableHLO and run by a PJRT
//!   plugin (XLA's CPU plugin in tests, libtpu on a TPU VM) through the C API:
//!   `ffi` and `api` (the C API and safe handles), `lower` (StableHLO),
//!   `plugin` (discovery; a plugin named explicitly is passed in),
//!   `options` (XLA debug-option overrides), `compiler` (compiles, with the
//!   in-memory and stored executable caches), `scalars` (shared device
//!   scalars), `program` (an unfused program's trace), `backend`
//!   (`PjrtBackend`) and `executable` (`PjrtExecutable`, buffer donation).
//!
//! The runtime parses none of deferfuse's settings (`TORCH_TPU_*`): the
//! engine's `Config` does, and passes the choices in (a plugin path, SIMD
//! on or off). It reads only variables others define: `$VIRTUAL_ENV` to
//! find plugins, `XLA_FLAGS` so options the user sets win over its
//! overrides, and `TPU_SKIP_MDS_QUERY` (which it sets before loading libtpu).

pub mod backend;
pub mod buffer;
pub mod cpu;
pub mod fork;
pub mod host_data;
pub mod memory;
#[cfg(feature = "pjrt")]
pub mod pjrt;

pub use backend::{ArtifactStore, Backend, BackendStats, Executable, KernelStats, KernelTime};
pub use buffer::{Buffer, DeviceData, Storage};
pub use cpu::CpuBackend;
pub use host_data::HostData;
pub use memory::{MemoryStats, MemoryTracker};
