//! The deferfuse runtime: the narrow [`Backend`] interface, host buffers and
//! their memory accounting, and the native CPU reference backend.
//!
//! - [`backend`]: the [`Backend`] and [`Executable`] traits;
//! - [`buffer`]: [`HostData`], [`Buffer`] and its [`Storage`] (host, or a
//!   device backend's [`DeviceData`]);
//! - [`memory`]: [`MemoryTracker`], live and peak bytes per context;
//! - [`cpu`]: [`CpuBackend`], which runs a trace op by op (unfused) and is the
//!   reference every other backend is compared against.

// `trace_ir::Error` is the workspace's one error type, large by design (it
// carries shapes for messages); boxing it is trace_ir's call, not ours.
#![allow(clippy::result_large_err)]

pub mod backend;
pub mod buffer;
pub mod cpu;
pub mod memory;
#[cfg(feature = "pjrt")]
pub mod pjrt;

pub use backend::{ArtifactStore, Backend, BackendStats, Executable};
pub use buffer::{Buffer, DeviceData, HostData, Storage};
pub use cpu::CpuBackend;
pub use memory::{MemoryStats, MemoryTracker};
