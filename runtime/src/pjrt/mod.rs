//! The PJRT backend: traces lower to StableHLO ([`lower`]), compile through a
//! PJRT plugin (XLA's CPU plugin from the `xla-cpu-pjrt` wheel, `libtpu`, or
//! any plugin named explicitly), and run on its first device.
//!
//! - [`ffi`]: hand-written declarations of the C API (header 0.81);
//! - [`api`]: safe, `Send + Sync` handles that free what they own;
//! - [`lower`]: the StableHLO lowering;
//! - `plugin`: plugin discovery ([`plugin_candidates`]);
//! - `options`: the XLA debug options sent with compiles ([`compile_overrides`]);
//! - `compiler`: compiles modules, with the in-memory and stored executable caches;
//! - `scalars`: device scalars shared by every upload of the same value;
//! - `program`: the trace of an unfused program ([`program_trace`]);
//! - `backend`: [`PjrtBackend`], the runtime [`Backend`](crate::Backend);
//! - `executable`: [`PjrtExecutable`] and buffer donation.
//!
//! Buffers live on the device: [`Backend::upload`](crate::Backend::upload) copies host data there,
//! a run's outputs stay there (as [`Storage::Device`](crate::Storage::Device)) and feed later runs
//! directly, and only [`Backend::download`](crate::Backend::download) (a read) copies back. Compiled
//! executables are cached in memory by the text of their module (canonical,
//! see [`lower`]) and, with an [`ArtifactStore`](crate::ArtifactStore), serialized across
//! processes under a key that names the plugin build ([`PjrtBackend::identity`]).
//!
//! Plugin discovery ([`plugin_candidates`]): a plugin named explicitly
//! ([`PjrtBackend::with_plugin`]; the engine's `Config` reads it from
//! `TORCH_TPU_PJRT_PLUGIN`), else the `libtpu` package's library, then the
//! `xla-cpu-pjrt` wheel's plugin, each looked up in the active virtual
//! environment (`$VIRTUAL_ENV`) and the project's `.venv` (found from the
//! current directory upwards). [`PjrtBackend::new`] takes the first
//! candidate that creates a client, so an installed libtpu on a machine
//! without a TPU falls through to the CPU plugin. Run `.ci/setup_python` to
//! install the CPU plugin into `.venv`.

pub mod api;
pub mod ffi;
pub mod lower;

mod backend;
mod compiler;
mod executable;
mod options;
mod plugin;
mod program;
mod scalars;

pub use api::{Client, DeviceBuffer, LoadedExecutable, Plugin};
pub use backend::{CacheStats, PjrtBackend};
pub use executable::PjrtExecutable;
pub use lower::{lower, lower_with, LowerOptions, Lowered};
pub use options::{compile_overrides, OptionValue};
pub use plugin::{find_plugin, plugin_candidates};
pub use program::program_trace;
