//! `Context`: one engine instance with its mode, backend, caches and memory
//! accounting. Several contexts may live on several threads at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rewrite_rules::planner::PlanConfig;
use runtime::{Backend, Buffer, Executable, HostData, MemoryStats, MemoryTracker};
use trace_ir::{Error, Meta, Op, Result, Trace};

use crate::config::{Config, Mode};
use crate::disk_cache::DiskCache;
use crate::dump::{Dumps, FlushFacts, Probe};
use crate::element::Element;
use crate::pending::PendingTrace;
use crate::pipeline::{CacheStats, Pipeline, Preparation, Prepared};
use crate::stream::{Job, Stream};
use crate::tensor::{Cell, Tensor, TensorInner};

pub(crate) struct Shared {
    pub config: Config,
    pub backend: Arc<dyn Backend>,
    pipeline: Arc<Pipeline>,
    /// What the last DeferAndFuse flush ran, for inspection.
    last_flush: Mutex<Option<FlushReport>>,
    /// The Strict stream; absent in the other modes.
    pub(crate) stream: Option<Stream>,
    /// The DeferAndFuse pending trace. Its lock also serializes flushes.
    pending: Mutex<PendingTrace>,
    ops_recorded: AtomicU64,
    flushes: AtomicU64,
    /// Fusion dumps (`TORCH_TPU_FUSION_DUMP`); absent when off.
    dumps: Option<Dumps>,
    /// Bounds checks of indexing ops not read yet (see `checks.rs`).
    pub(crate) checks: crate::checks::Outstanding,
}

/// Counters of one context, read through [`Context::stats`]. Serializes to
/// nested maps of numbers (the binding's `deferfuse.stats()` is this).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineStats {
    /// Primitive ops recorded (composites count each primitive they use).
    pub ops_recorded: u64,
    /// DeferAndFuse flushes that ran a program.
    pub flushes: u64,
    pub cache: CacheStats,
    /// Compiles, executables loaded from disk and host/device transfers, as
    /// the backend counts them (the PJRT backend does; the native one does not).
    pub backend: runtime::BackendStats,
    /// Live and peak bytes of this context's buffers.
    pub memory: MemoryStats,
}

/// What one DeferAndFuse flush ran: read it with [`Context::last_flush`].
#[derive(Debug, Clone)]
pub struct FlushReport {
    /// Nodes of the pending trace after pruning.
    pub trace_nodes: usize,
    /// Kernels of the program that ran.
    pub kernels: usize,
    /// Rules that fired, when this flush rewrote (a cache hit did not).
    pub rules_fired: Option<std::collections::BTreeMap<String, usize>>,
    /// The program itself.
    pub program: Arc<rewrite_rules::program::Program>,
}

impl FlushReport {
    fn new(trace_nodes: usize, prepared: &Prepared) -> Self {
        FlushReport {
            trace_nodes,
            kernels: prepared.program.kernels.len(),
            rules_fired: prepared.rewrite.as_ref().map(|r| r.rules_fired.clone()),
            program: prepared.program.clone(),
        }
    }
}

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
        let disk = config.cache_dir.as_ref().and_then(|dir| {
            DiskCache::open_or_warn(dir.join(backend.name()), config.disk_cache_limits())
        });
        let plan = PlanConfig { rounding: config.fused_rounding, ..PlanConfig::default() };
        let rewrite = config.effective_rewrite();
        let limits = config.memory_cache_limits();
        let pipeline =
            Arc::new(Pipeline::new(backend.clone(), rewrite.clone(), plan, disk, limits));
        let stream = match config.mode {
            Mode::Strict => Some(Stream::start(backend.clone(), pipeline.clone())?),
            _ => None,
        };
        let dumps = config.fusion_dump.as_ref().map(|dir| Dumps::new(dir, &rewrite));
        if dumps.is_some() {
            pipeline.keep_extracted();
        }
        tracing::debug!(mode = %config.mode, backend = backend.name(), "new context");
        Ok(Context {
            shared: Arc::new(Shared {
                config,
                backend,
                pipeline,
                last_flush: Mutex::new(None),
                stream,
                pending: Mutex::new(PendingTrace::new(0)),
                ops_recorded: AtomicU64::new(0),
                flushes: AtomicU64::new(0),
                dumps,
                checks: Default::default(),
            }),
        })
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
        EngineStats {
            ops_recorded: self.shared.ops_recorded.load(Ordering::Relaxed),
            flushes: self.shared.flushes.load(Ordering::Relaxed),
            cache: self.shared.pipeline.stats(),
            backend: self.shared.backend.stats(),
            memory: self.memory(),
        }
    }

    /// What the last DeferAndFuse flush ran (kernels, rules fired, program).
    pub fn last_flush(&self) -> Option<FlushReport> {
        self.shared.last_flush.lock().unwrap().clone()
    }

    /// Runs everything issued so far: DeferAndFuse flushes its pending trace,
    /// Strict waits for its stream. Fails with an index out of range that an
    /// indexing op found since the last read.
    pub fn sync(&self) -> Result<()> {
        match self.mode() {
            Mode::DeferAndFuse => self.shared.flush(&mut self.shared.pending.lock().unwrap())?,
            Mode::Strict => self.shared.stream.as_ref().map_or(Ok(()), |s| s.synchronize())?,
            Mode::Debug => {}
        }
        self.shared.raise_failed_checks()
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
        Ok(Tensor(TensorInner::new(self.shared.clone(), meta, Cell::Ready(buffer))))
    }

    /// Records `op` on `inputs` in this context's mode. Shapes and dtypes are
    /// checked here, at the call, in every mode.
    #[track_caller]
    pub(crate) fn record(&self, op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
        self.shared.record(op, inputs)
    }
}

/// What computed a DeferAndFuse value, in the errors of values that need it.
const FLUSH: &str = "a DeferAndFuse flush";

impl Shared {
    #[track_caller]
    fn record(self: &Arc<Self>, op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
        if let Some(t) = inputs.iter().find(|t| !Arc::ptr_eq(&t.0.ctx, self)) {
            return Err(Error::attr(op.name(), format!("input {t:?} belongs to another context")));
        }
        let metas: Vec<&Meta> = inputs.iter().map(|t| &t.0.meta).collect();
        let meta = trace_ir::infer(&op, &metas)?;
        self.ops_recorded.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(op = op.name(), shape = ?meta.shape.as_slice(), "record");
        match self.config.mode {
            Mode::Strict => {
                let output = TensorInner::new(self.clone(), meta, Cell::Queued);
                let inputs = inputs.iter().map(|t| t.0.clone()).collect();
                let stream = self.stream.as_ref().expect("Strict contexts have a stream");
                stream.submit(Job::Run { op, inputs, output: output.clone() })?;
                Ok(Tensor(output))
            }
            Mode::Debug => {
                let buffers =
                    inputs.iter().map(|t| self.materialize(&t.0)).collect::<Result<Vec<_>>>()?;
                let input_metas: Vec<Meta> = metas.into_iter().cloned().collect();
                let trace = Trace::single_op(&op, &input_metas)?;
                let (exe, _) = self.pipeline.executable(&trace, Preparation::Unfused)?;
                let out = exe
                    .run(buffers)?
                    .pop()
                    .ok_or_else(|| Error::backend(self.backend.name(), "no output"))?;
                self.check_finite(&op, &input_metas, &out)?;
                Ok(Tensor(TensorInner::new(self.clone(), meta, Cell::Ready(out))))
            }
            Mode::DeferAndFuse => {
                let mut pending = self.pending.lock().unwrap();
                let nodes =
                    inputs.iter().map(|t| pending.node_of(&t.0)).collect::<Result<Vec<_>>>()?;
                let node = pending.push(op, &nodes)?;
                let epoch = pending.epoch;
                let tensor = TensorInner::new(self.clone(), meta, Cell::Deferred { node, epoch });
                pending.set_owner(node, Arc::downgrade(&tensor));
                if self.dumps.is_some() {
                    pending.set_call_site(node, std::panic::Location::caller());
                }
                if pending.len() >= self.config.max_pending_ops {
                    tracing::debug!(limit = self.config.max_pending_ops, "pending trace is full");
                    self.flush(&mut pending)?;
                }
                Ok(Tensor(tensor))
            }
        }
    }

    /// The buffer of `tensor`, running whatever it still waits on.
    pub fn materialize(&self, tensor: &TensorInner) -> Result<Arc<Buffer>> {
        let deferred = matches!(*tensor.cell.lock().unwrap(), Cell::Deferred { .. });
        if deferred {
            let mut pending = self.pending.lock().unwrap();
            // Another thread may have flushed while we waited for the lock.
            let still = matches!(*tensor.cell.lock().unwrap(), Cell::Deferred { epoch, .. } if epoch == pending.epoch);
            if still {
                self.flush(&mut pending)?;
            }
        }
        tensor.wait_buffer()
    }

    /// Runs the pending trace and binds its outputs to the tensors still held.
    pub fn flush(&self, pending: &mut PendingTrace) -> Result<()> {
        let Some(plan) = pending.take() else { return Ok(()) };
        self.flushes.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(nodes = plan.trace.len(), outputs = plan.holders.len(), "flush");
        let how = if self.config.fusion { Preparation::Fused } else { Preparation::Unfused };
        let nodes = plan.trace.len();
        let probe = self.dumps.as_ref().map(|d| d.start(self.pipeline.stats()));
        let result = self.pipeline.executable(&plan.trace, how).and_then(|(exe, prepared)| {
            *self.last_flush.lock().unwrap() = Some(FlushReport::new(nodes, &prepared));
            match probe {
                None => exe.run(plan.inputs),
                Some(probe) => self.run_dumped(
                    probe,
                    &*exe,
                    plan.inputs,
                    &plan.trace,
                    &plan.call_sites,
                    &prepared,
                ),
            }
        });
        match result {
            Ok(buffers) => {
                for (tensor, buffer) in plan.holders.iter().zip(buffers) {
                    tensor.resolve(Ok(buffer), FLUSH);
                }
                Ok(())
            }
            Err(e) => {
                for tensor in &plan.holders {
                    tensor.resolve(Err(e.clone()), FLUSH);
                }
                Err(e)
            }
        }
    }

    /// Runs a flush's program measuring its time and peak bytes, and writes
    /// its fusion dump.
    fn run_dumped(
        &self,
        probe: Probe,
        exe: &dyn Executable,
        inputs: Vec<Arc<Buffer>>,
        recorded: &Trace,
        call_sites: &[Option<&'static std::panic::Location<'static>>],
        prepared: &Prepared,
    ) -> Result<Vec<Arc<Buffer>>> {
        let memory = self.backend.memory();
        let outer = memory.stats();
        memory.reset_peak();
        let start = std::time::Instant::now();
        let result = exe.run(inputs);
        let run_ns = start.elapsed().as_nanos() as u64;
        let peak = memory.stats().peak_bytes;
        memory.restore_peak(outer.peak_bytes);
        let Some(dumps) = &self.dumps else { return result };
        dumps.write(
            probe,
            FlushFacts {
                backend: self.backend.name(),
                fused: self.config.fusion,
                recorded,
                call_sites,
                program: &prepared.program,
                rewrote: prepared.rewrite.is_some(),
                resized_from: prepared.resized_from.as_ref(),
                prepared_graph: self.pipeline.take_extracted(),
                cache_after: self.pipeline.stats(),
                run_ns,
                live_before: outer.live_bytes as u64,
                peak: peak as u64,
            },
        );
        result
    }

    /// Debug mode's check of one op's output.
    fn check_finite(&self, op: &Op, inputs: &[Meta], out: &Buffer) -> Result<()> {
        let checks = self.config.debug_checks;
        if !out.meta().dtype.is_float() || !(checks.nan || checks.inf) {
            return Ok(());
        }
        let values = self.backend.download(out)?.to_f64_vec();
        let bad = values.iter().enumerate().find_map(|(i, v)| {
            if checks.nan && v.is_nan() {
                Some((i, "NaN"))
            } else if checks.inf && v.is_infinite() {
                Some((i, "Inf"))
            } else {
                None
            }
        });
        match bad {
            None => Ok(()),
            Some((index, kind)) => Err(Error::NonFinite(Box::new(trace_ir::NonFinite {
                op: op.name().into(),
                kind,
                index,
                in_shapes: inputs.iter().map(|m| m.shape.clone()).collect(),
                out_shape: out.meta().shape.to_vec(),
            }))),
        }
    }
}
