//! `Context`: one engine instance with its mode, backend, caches and memory
//! accounting, and the tensors it makes. Several contexts may live on
//! several threads at once. The state behind it is [`Shared`].

use std::sync::Arc;

use runtime::{Backend, HostData, MemoryStats, MemoryTracker};
use trace_ir::{DType, Error, Meta, Op, Result};

use crate::config::{Config, Mode};
use crate::element::Element;
use crate::shared::{EngineStats, FlushReport, Shared};
use crate::tensor::Tensor;
use crate::value::{Cell, Value};

/// An engine instance. Cloning shares it.
#[derive(Clone)]
pub struct Context {
    pub(crate) shared: Arc<Shared>,
}

impl Context {
    /// A context on the backend `config.backend` names (the native CPU
    /// backend by default).
    pub fn new(config: Config) -> Result<Context> {
        let backend = crate::backend_select::create(&config, MemoryTracker::new())?;
        Context::with_backend(config, backend)
    }

    /// A context configured by the `TORCH_TPU_*` environment variables.
    pub fn from_env() -> Result<Context> {
        Context::new(Config::from_env()?)
    }

    /// A context in `mode` with default settings otherwise.
    pub fn with_mode(mode: Mode) -> Result<Context> {
        Context::new(Config::with_mode(mode))
    }

    pub fn with_backend(config: Config, backend: Arc<dyn Backend>) -> Result<Context> {
        Ok(Context { shared: Arc::new(Shared::new(config, backend)?) })
    }

    pub fn mode(&self) -> Mode {
        self.shared.config.mode
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    pub fn backend_name(&self) -> &'static str {
        self.shared.backend.name()
    }

    /// The library the backend runs on (the PJRT plugin's path), if any.
    pub fn backend_plugin(&self) -> Option<std::path::PathBuf> {
        self.shared.backend.plugin_path()
    }

    /// Live and peak bytes of every buffer this context's backend holds.
    pub fn memory(&self) -> MemoryStats {
        self.shared.backend.memory().stats()
    }

    /// Starts a new peak-memory window at the bytes live now.
    pub fn reset_peak_memory(&self) {
        self.shared.backend.memory().reset_peak()
    }

    pub fn stats(&self) -> EngineStats {
        self.shared.stats()
    }

    /// What the last DeferAndFuse flush ran (kernels, rules fired, program).
    pub fn last_flush(&self) -> Option<FlushReport> {
        self.shared.last_flush()
    }

    /// Runs everything issued so far: DeferAndFuse flushes its pending trace,
    /// Strict waits for its stream. Fails with an index out of range that an
    /// indexing op found since the last read.
    pub fn sync(&self) -> Result<()> {
        self.shared.sync()
    }

    /// Opens an op group for the primitives of one user-level op named
    /// `name`: in Strict they are recorded together and run on the stream as
    /// one program (one fused kernel where the planner fuses them), as
    /// PyTorch runs one kernel per op; the other modes run them as usual.
    /// [`OpGroup::end`] closes it; so does dropping it (an early return).
    /// Groups nest: an inner one joins the outer. Reading a value inside a
    /// group runs what it recorded so far.
    pub fn op_group(&self, name: &str) -> OpGroup {
        self.begin_group(name);
        OpGroup { shared: self.shared.clone(), open: true }
    }

    /// Opens an op group on this thread, for bindings that cannot hold an
    /// [`OpGroup`]; every `begin_group` needs its [`Context::end_group`].
    pub fn begin_group(&self, name: &str) {
        self.shared.begin_group(name)
    }

    /// Closes the innermost op group of this thread; the outermost submits
    /// what the group recorded.
    pub fn end_group(&self) -> Result<()> {
        self.shared.end_group()
    }

    /// A tensor of `shape` and `dtype` whose data `read` produces on the
    /// context's stream, after the work issued before it, while the caller
    /// goes on: a non-blocking upload, like a CUDA copy from pinned memory.
    /// What `read` reads must stay unchanged until it has run; reading the
    /// tensor, or [`Context::sync`], waits for it. Debug, which has no
    /// stream, runs `read` here. Data of another length or dtype fails the
    /// tensor, and what reads it.
    pub fn from_host_async(
        &self,
        shape: &[usize],
        dtype: DType,
        read: impl FnOnce() -> HostData + Send + 'static,
    ) -> Result<Tensor> {
        let meta = Meta::new(shape.into(), dtype);
        let value = self.shared.upload_async(meta, read)?;
        Ok(Tensor::new(self.shared.clone(), value))
    }

    /// A tensor holding `data` (row-major) with the given shape.
    pub fn from_vec<T: Element>(&self, data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        let meta = Meta::new(shape.into(), T::DTYPE);
        if data.len() != meta.numel() {
            return Err(Error::DataLength {
                op: "from_vec".into(),
                len: data.len(),
                numel: meta.numel(),
                shape: meta.shape.to_vec(),
            });
        }
        self.tensor_from_host(meta, T::into_host(data))
    }

    pub fn from_slice<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        self.from_vec(data.to_vec(), shape)
    }

    /// A zero-dimensional tensor.
    pub fn scalar<T: Element>(&self, value: T) -> Result<Tensor> {
        self.from_vec(vec![value], &[])
    }

    pub(crate) fn tensor_from_host(&self, meta: Meta, data: HostData) -> Result<Tensor> {
        let buffer = self.shared.backend.upload(meta.clone(), data)?;
        Ok(Tensor::new(self.shared.clone(), Value::new(meta, Cell::Ready(buffer))))
    }

    /// Records `op` on `inputs` in this context's mode. Shapes and dtypes are
    /// checked here, at the call, in every mode.
    #[track_caller]
    pub(crate) fn record(&self, op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
        if let Some(t) = inputs.iter().find(|t| !Arc::ptr_eq(&t.ctx, &self.shared)) {
            return Err(Error::attr(op.name(), format!("input {t:?} belongs to another context")));
        }
        let values: smallvec::SmallVec<[&Arc<Value>; 4]> =
            inputs.iter().map(|t| &t.value).collect();
        Ok(Tensor::new(self.shared.clone(), self.shared.record(op, &values)?))
    }
}

impl Tensor {
    /// The context this tensor belongs to.
    pub fn context(&self) -> Context {
        Context { shared: self.ctx.clone() }
    }
}

/// An open op group of one thread ([`Context::op_group`]).
#[must_use = "an op group closes when it is dropped"]
pub struct OpGroup {
    shared: Arc<Shared>,
    open: bool,
}

impl OpGroup {
    /// Closes the group, then gives `result` back, or the error of
    /// submitting the group's program.
    pub fn end<R>(mut self, result: Result<R>) -> Result<R> {
        self.open = false;
        let ended = self.shared.end_group();
        let out = result?;
        ended.map(|()| out)
    }
}

impl Drop for OpGroup {
    /// Closes a group left by an early return or a panic; the op failed, and
    /// its own error is the one that reaches the caller.
    fn drop(&mut self) {
        if self.open {
            let _ = self.shared.end_group();
        }
    }
}
