//! deferfuse: a lazy-trace fusion engine with PyTorch's eager modes.
//!
//! ```
//! use deferfuse::{Context, Mode};
//! # fn main() -> deferfuse::Result<()> {
//! let ctx = Context::with_mode(Mode::DeferAndFuse)?;
//! let x = ctx.from_vec(vec![1.0f32, -2.0, 3.0, -4.0], &[2, 2])?;
//! let y = (x.relu()? * 2.0)?.sum(&[-1], false)?; // recorded, not run
//! assert_eq!(y.to_vec::<f32>()?, vec![2.0, 6.0]); // flushed here
//! # Ok(())
//! # }
//! ```
//!
//! - [`Context`]: an engine instance (mode, backend, caches, memory accounting);
//! - [`Tensor`]: a cheap handle with PyTorch-like ops ([`ops`](crate::ops));
//! - [`Mode`], [`Config`]: the `TORCH_TPU_*` switches;
//! - [`BackendKind`]: `TORCH_TPU_BACKEND=cpu|pjrt` (PJRT with the `pjrt` feature).

pub mod backend_select;
mod bounds;
mod checks;
pub mod config;
mod context;
pub mod differential;
pub mod disk_cache;
mod display;
pub mod dump;
mod element;
mod exact;
mod foreign;
mod fs_guard;
mod lru;
mod op_group;
pub mod ops;
mod pending;
pub mod pipeline;
mod read_ahead;
mod repeats;
mod shared;
mod stream;
mod tensor;
mod value;
mod warn;
#[cfg(feature = "workloads")]
pub mod workloads;

pub use bounds::IndexBound;
pub use checks::BoundsMessage;
pub use config::{BackendKind, Config, DebugChecks, FusedRounding, Mode};
pub use context::{Context, OpGroup};
pub use dump::FlushReason;
pub use element::Element;
pub use ops::{GeluApproximation, Scalar, ScalarOrTensor};
pub use pipeline::{CacheStats, TierLimits, TierStats};
pub use runtime::{BackendStats, HostData, KernelStats, KernelTime, MemoryStats};
pub use shared::{EngineStats, FlushReport};
pub use tensor::Tensor;
pub use trace_ir::{DType, Error, IndexErrorClass, IndexOutOfBounds, Result, Shape};

pub use half::{bf16, f16};
