//! `Shared`: the engine state behind a [`Context`](crate::Context) and all
//! its tensors: the backend, the pipeline and its caches, the Strict stream
//! or the DeferAndFuse pending trace. It records ops on [`Value`]s, flushes
//! and materializes them; it knows nothing of the `Tensor` handles.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rewrite_rules::planner::PlanConfig;
use runtime::{Backend, Buffer, Executable, HostData, MemoryStats};
use smallvec::SmallVec;
use trace_ir::{Error, Meta, Op, Result, Trace};

use crate::config::{Config, Mode};
use crate::disk_cache::{DiskCache, DiskCacheLimits};
use crate::dump::{Dumps, FlushFacts, FlushReason, Probe};
use crate::op_group;
use crate::pending::{FlushPlan, PendingTrace};
use crate::pipeline::{CacheStats, Pipeline, Preparation, Prepared, TierLimits};
use crate::repeats::{op_hash, unit};
use crate::stream::{computed, Job, Stream};
use crate::value::{resolve_all, Cell, Value, FLUSH};

/// How many DeferAndFuse flushes may wait on the stream at once. The
/// recording thread runs ahead of the programs by at most this many, which
/// bounds the memory held by programs not run yet. A training step that
/// reads its loss issues up to three (a repeat cut in the forward, its
/// read-ahead, the rest at the read): with room for a fourth, recording
/// the next step does not wait for the previous one's backward to run.
const MAX_IN_FLIGHT: usize = 4;

pub(crate) struct Shared {
    pub config: Config,
    pub backend: Arc<dyn Backend>,
    pipeline: Arc<Pipeline>,
    /// What the last DeferAndFuse flush ran, for inspection.
    last_flush: Mutex<Option<FlushReport>>,
    /// The stream: Strict's ops and DeferAndFuse's flushes that nobody
    /// waits for; absent in Debug.
    pub(crate) stream: Option<Stream>,
    /// The DeferAndFuse pending trace. Its lock also serializes flushes.
    pending: Mutex<PendingTrace<Arc<Value>>>,
    /// An output of each DeferAndFuse flush issued to the stream and
    /// perhaps not run yet, oldest first (see [`MAX_IN_FLIGHT`]).
    in_flight: Mutex<VecDeque<Arc<Value>>>,
    ops_recorded: AtomicU64,
    flushes: AtomicU64,
    /// The last DeferAndFuse flush was a read-ahead (`read_ahead.rs`) or
    /// the pending cap: the next read ends the trace recorded since, as it
    /// would have had the read flushed it. A loop whose step is longer than
    /// the cap (its loss computed in a chunk the cap cut off) then starts
    /// every step's traces at the same op, and they repeat. Written under
    /// the pending trace's lock, read without it first.
    cut_at_read: AtomicBool,
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
    /// the PJRT backend counts them, and kernel time by kind, as the native
    /// CPU backend counts it.
    pub backend: runtime::BackendStats,
    /// Live and peak bytes of this context's buffers.
    pub memory: MemoryStats,
}

/// What one DeferAndFuse flush ran: read it with [`Context::last_flush`].
#[derive(Debug, Clone)]
pub struct FlushReport {
    /// Nodes of the pending trace after pruning.
    pub trace_nodes: usize,
    /// What made this flush happen.
    pub reason: FlushReason,
    /// Kernels of the program that ran.
    pub kernels: usize,
    /// Rules that fired, when this flush rewrote (a cache hit did not).
    pub rules_fired: Option<std::collections::BTreeMap<String, usize>>,
    /// The program itself.
    pub program: Arc<rewrite_rules::program::Program>,
}

impl FlushReport {
    fn new(trace_nodes: usize, reason: FlushReason, prepared: &Prepared) -> Self {
        FlushReport {
            trace_nodes,
            reason,
            kernels: prepared.program.kernels.len(),
            rules_fired: prepared.rewrite.as_ref().map(|r| r.rules_fired.clone()),
            program: prepared.program.clone(),
        }
    }
}

impl Shared {
    /// The engine state of a new context in `config.mode` on `backend`.
    pub fn new(config: Config, backend: Arc<dyn Backend>) -> Result<Shared> {
        let disk = config.cache_dir.as_ref().and_then(|dir| {
            DiskCache::open_or_warn(dir.join(backend.name()), DiskCacheLimits::from_config(&config))
        });
        let plan = PlanConfig { rounding: config.fused_rounding, ..PlanConfig::default() };
        let rewrite = config.effective_rewrite();
        let limits = TierLimits::from_config(&config);
        let pipeline =
            Arc::new(Pipeline::new(backend.clone(), rewrite.clone(), plan, disk, limits));
        let stream = match config.mode {
            Mode::Strict | Mode::DeferAndFuse => {
                Some(Stream::start(backend.clone(), pipeline.clone(), how(&config))?)
            }
            Mode::Debug => None,
        };
        let dumps = config.fusion_dump.as_ref().map(|dir| Dumps::new(dir, &rewrite));
        if dumps.is_some() {
            pipeline.keep_extracted();
        }
        tracing::debug!(mode = %config.mode, backend = backend.name(), "new context");
        let deferring = config.mode == Mode::DeferAndFuse;
        let mut pending = PendingTrace::new(0, deferring && config.cut_repeats);
        if deferring && config.read_ahead {
            pending.read_ahead = Some(Default::default());
        }
        Ok(Shared {
            config,
            backend,
            pipeline,
            last_flush: Mutex::new(None),
            stream,
            pending: Mutex::new(pending),
            in_flight: Mutex::new(VecDeque::new()),
            ops_recorded: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            cut_at_read: AtomicBool::new(false),
            dumps,
            checks: Default::default(),
        })
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            ops_recorded: self.ops_recorded.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            cache: self.pipeline.stats(),
            backend: self.backend.stats(),
            memory: self.backend.memory().stats(),
        }
    }

    pub fn last_flush(&self) -> Option<FlushReport> {
        self.last_flush.lock().unwrap().clone()
    }

    /// Raises the first failed bounds check not read yet (`checks.rs`).
    pub fn raise_failed_checks(&self) -> Result<()> {
        self.checks.raise_failed(self.config.mode, &*self.backend)
    }

    /// Runs everything issued so far, then raises a failed bounds check.
    pub fn sync(&self) -> Result<()> {
        match self.config.mode {
            Mode::DeferAndFuse => {
                self.flush(&mut self.pending.lock().unwrap(), FlushReason::Sync)?;
                self.wait_for_room(0);
            }
            Mode::Strict => self.stream.as_ref().map_or(Ok(()), |s| s.synchronize())?,
            Mode::Debug => {}
        }
        self.raise_failed_checks()
    }

    /// A value whose data `read` produces on the stream, after the work
    /// issued before it, while the caller goes on; here when there is no
    /// stream to run it on (Debug, or a forked child).
    pub fn upload_async(
        &self,
        meta: Meta,
        read: impl FnOnce() -> HostData + Send + 'static,
    ) -> Result<Arc<Value>> {
        let numel = meta.numel();
        let (dtype, shape) = (meta.dtype, meta.shape.to_vec());
        let read: Box<dyn FnOnce() -> Result<HostData> + Send> = Box::new(move || {
            let data = read();
            if data.dtype() != dtype {
                let msg = "the data read has another dtype than the tensor".to_string();
                return Err(Error::DType {
                    op: "upload".into(),
                    msg,
                    dtypes: vec![dtype, data.dtype()],
                });
            }
            if data.len() != numel {
                return Err(Error::DataLength {
                    op: "upload".into(),
                    len: data.len(),
                    shape,
                    numel,
                });
            }
            Ok(data)
        });
        let Some(stream) = self.stream.as_ref().filter(|s| !s.forked()) else {
            let buffer = self.backend.upload(meta.clone(), read()?)?;
            return Ok(Value::new(meta, Cell::Ready(buffer)));
        };
        let output = Value::new(meta, Cell::Queued);
        if self.config.mode == Mode::DeferAndFuse {
            // Counted with the flushes on the stream: `sync` waits for it,
            // and a loop that uploads without reading cannot run ahead.
            self.wait_for_room(MAX_IN_FLIGHT - 1);
            self.in_flight.lock().unwrap().push_back(output.clone());
        }
        stream.submit(Job::Upload { read, output: output.clone() })?;
        Ok(output)
    }

    /// Records `op` on `inputs`, values of this context, in its mode.
    #[track_caller]
    pub fn record(&self, op: Op, inputs: &[&Arc<Value>]) -> Result<Arc<Value>> {
        let metas: SmallVec<[&Meta; 4]> = inputs.iter().map(|v| &v.meta).collect();
        let meta = trace_ir::infer(&op, &metas)?;
        self.ops_recorded.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(op = op.name(), shape = ?meta.shape.as_slice(), "record");
        match self.config.mode {
            Mode::Strict => {
                if op_group::is_open(self.id()) {
                    let limit = self.config.max_pending_ops;
                    let (value, cut) = op_group::record(self.id(), op, inputs, meta, limit)?;
                    if cut {
                        if let Some(ready) = op_group::cut(self.id()) {
                            self.submit_group(ready)?;
                        }
                    }
                    return Ok(value);
                }
                let output = Value::new(meta, Cell::Queued);
                let inputs = inputs.iter().map(|v| Arc::clone(v)).collect();
                let stream = self.stream.as_ref().expect("Strict contexts have a stream");
                let name = op.name().into();
                stream.submit(Job::Run { name, op, inputs, output: output.clone() })?;
                Ok(output)
            }
            Mode::Debug => {
                let buffers =
                    inputs.iter().map(|v| self.materialize(v)).collect::<Result<Vec<_>>>()?;
                let input_metas: Vec<Meta> = metas.into_iter().cloned().collect();
                let trace = Trace::single_op(&op, &input_metas)?;
                let (exe, _) = self.pipeline.executable(&trace, how(&self.config))?;
                let out = exe
                    .run(buffers)?
                    .pop()
                    .ok_or_else(|| Error::backend(self.backend.name(), "no output"))?;
                self.check_finite(&op, &input_metas, &out)?;
                Ok(Value::new(meta, Cell::Ready(out)))
            }
            Mode::DeferAndFuse => {
                let mut pending = self.pending.lock().unwrap();
                let nodes = inputs
                    .iter()
                    .map(|v| pending.node_of(v))
                    .collect::<Result<SmallVec<[_; 4]>>>()?;
                let hash = op_hash(&op, &meta);
                let in_group = unit::fold(self.id(), hash);
                let node = pending.push(op, &nodes, meta.clone())?;
                let epoch = pending.epoch;
                let value = Value::new(meta, Cell::Deferred { node, epoch });
                pending.set_owner(node, Arc::downgrade(&value));
                if self.dumps.is_some() {
                    pending.set_call_site(node, std::panic::Location::caller());
                }
                if let Some(reason) = (!in_group).then(|| pending.end_unit(hash)).flatten() {
                    tracing::debug!(ops = pending.len(), %reason, "cut");
                    self.flush(&mut pending, reason)?;
                } else if pending.len() >= self.config.max_pending_ops {
                    tracing::debug!(limit = self.config.max_pending_ops, "pending trace is full");
                    self.flush(&mut pending, FlushReason::Cap)?;
                }
                Ok(value)
            }
        }
    }

    /// This state's identity, for the op groups of this thread.
    fn id(&self) -> usize {
        self as *const Shared as usize
    }

    /// Opens an op group named `name`: in Strict its primitives run as one
    /// program (see `op_group.rs`); in DeferAndFuse they are one unit for
    /// the repeat detector (see `repeats::unit`).
    pub fn begin_group(&self, name: &str) {
        match self.config.mode {
            Mode::Strict => op_group::begin(self.id(), name),
            Mode::DeferAndFuse => unit::begin(self.id()),
            Mode::Debug => {}
        }
    }

    /// Closes one level of this thread's op group: at the outermost, Strict
    /// submits its program and DeferAndFuse shows it to the repeat detector,
    /// which may cut the stream after it.
    pub fn end_group(&self) -> Result<()> {
        match self.config.mode {
            Mode::Strict => match op_group::end(self.id()) {
                Some(ready) => self.submit_group(ready),
                None => Ok(()),
            },
            Mode::DeferAndFuse => {
                let Some(hash) = unit::end(self.id()) else { return Ok(()) };
                let mut pending = self.pending.lock().unwrap();
                match pending.end_unit(hash) {
                    Some(reason) => self.flush(&mut pending, reason),
                    None => Ok(()),
                }
            }
            Mode::Debug => Ok(()),
        }
    }

    /// Queues a group's work on the stream; its held values wait there.
    fn submit_group(&self, ready: op_group::Ready) -> Result<()> {
        let stream = self.stream.as_ref().expect("Strict contexts have a stream");
        match ready {
            op_group::Ready::Single { name, op, inputs, output } => {
                *output.cell.lock().unwrap() = Cell::Queued;
                stream.submit(Job::Run { name: name.into(), op, inputs, output })
            }
            op_group::Ready::Program { name, plan } => {
                for value in &plan.holders {
                    *value.cell.lock().unwrap() = Cell::Queued;
                }
                stream.submit(Job::Program {
                    name,
                    trace: plan.trace,
                    inputs: plan.inputs,
                    outputs: plan.holders,
                })
            }
        }
    }

    /// The buffer of `value`, running whatever it still waits on.
    pub fn materialize(&self, value: &Value) -> Result<Arc<Buffer>> {
        let deferred = matches!(*value.cell.lock().unwrap(), Cell::Deferred { .. });
        if deferred && self.config.mode == Mode::Strict {
            // A value of this thread's open op group, read inside it.
            if let Some(ready) = op_group::cut(self.id()) {
                self.submit_group(ready)?;
            }
        } else if deferred {
            let mut pending = self.pending.lock().unwrap();
            // Another thread may have flushed while we waited for the lock.
            let node = match *value.cell.lock().unwrap() {
                Cell::Deferred { node, epoch } if epoch == pending.epoch => Some(node),
                _ => None,
            };
            if let Some(node) = node {
                if let Some(r) = pending.read_ahead.as_mut() {
                    r.learn(node);
                }
                self.flush_reading(&mut pending, FlushReason::Read, Some(value))?;
            }
        } else if self.cut_at_read.load(Ordering::Relaxed) {
            let mut pending = self.pending.lock().unwrap();
            if self.cut_at_read.load(Ordering::Relaxed) {
                self.flush(&mut pending, FlushReason::Read)?;
            }
        }
        value.wait_buffer()
    }

    /// Runs the pending trace and binds its outputs to the tensors still held.
    pub fn flush(&self, pending: &mut PendingTrace<Arc<Value>>, reason: FlushReason) -> Result<()> {
        self.flush_reading(pending, reason, None)
    }

    /// [`Self::flush`] for a read of `read`: what `read` needs runs first,
    /// and the rest of the trace (see [`FlushPlan::split_for`]) on the
    /// stream, as a flush nobody waits for.
    fn flush_reading(
        &self,
        pending: &mut PendingTrace<Arc<Value>>,
        reason: FlushReason,
        read: Option<&Value>,
    ) -> Result<()> {
        let plan = pending.take();
        let cut_at_read = matches!(reason, FlushReason::ReadAhead | FlushReason::Cap);
        self.cut_at_read.store(cut_at_read, Ordering::Relaxed);
        let Some(plan) = plan else { return Ok(()) };
        self.flushes.fetch_add(1, Ordering::Relaxed);
        let how = how(&self.config);
        let waited_for = read.is_some() || reason == FlushReason::Sync;
        // A trace run whole before runs whole again: splitting it would
        // compile two new programs for what the cache already has. Fusion
        // dumps show one program per flush, so they never split.
        let read = read.filter(|_| self.dumps.is_none());
        let cached = read.and_then(|_| self.pipeline.cached(&plan.trace, how));
        let (plan, rest) = match read {
            Some(value) if cached.is_none() => plan.split_for(value),
            _ => (plan, None),
        };
        let ran = self.run_plan(plan, reason, waited_for, cached);
        if let Some(rest) = rest {
            // Issued even when the read's part failed (its values then fail
            // as poisoned); an error of the rest stays with its values and is
            // raised where they are read, as for any flush on the stream.
            let _ = self.run_plan(rest, reason, false, None);
        }
        ran
    }

    /// Prepares a flush's program here (so preparation errors reach the op
    /// that caused the flush) and runs it: here when someone waits for it
    /// (a read, a sync, fusion dumps timing it), on the stream otherwise,
    /// while the caller records on. Either way it runs after every program
    /// issued before it that computes its inputs. `ready`: its executable,
    /// when the caller looked it up already.
    fn run_plan(
        &self,
        plan: FlushPlan<Arc<Value>>,
        reason: FlushReason,
        wait: bool,
        ready: Option<(Arc<dyn Executable>, Prepared)>,
    ) -> Result<()> {
        tracing::debug!(nodes = plan.trace.len(), outputs = plan.holders.len(), ?reason, "flush");
        let nodes = plan.trace.len();
        let probe = self.dumps.as_ref().map(|d| d.start(self.pipeline.stats(), reason));
        let ready = ready
            .map(Ok)
            .unwrap_or_else(|| self.pipeline.executable(&plan.trace, how(&self.config)));
        let (exe, prepared) = match ready {
            Ok(ready) => ready,
            Err(e) => return resolve_all(&plan.holders, Err(e), &FLUSH),
        };
        *self.last_flush.lock().unwrap() = Some(FlushReport::new(nodes, reason, &prepared));
        if let (Some(stream), None, false) = (&self.stream, &probe, wait) {
            for value in &plan.holders {
                *value.cell.lock().unwrap() = Cell::Queued;
            }
            self.wait_for_room(MAX_IN_FLIGHT - 1);
            let last = plan.holders[plan.holders.len() - 1].clone();
            self.in_flight.lock().unwrap().push_back(last);
            return stream.submit(Job::Execute { exe, inputs: plan.inputs, outputs: plan.holders });
        }
        let result = computed(plan.inputs).and_then(|inputs| match probe {
            None => exe.run(inputs),
            Some(probe) => {
                self.run_dumped(probe, &*exe, inputs, &plan.trace, &plan.call_sites, &prepared)
            }
        });
        resolve_all(&plan.holders, result, &FLUSH)
    }

    /// Waits until at most `room` flushes are on the stream. The last
    /// value a flush resolves stands for it: once that is ready, so is
    /// everything the flush computed.
    fn wait_for_room(&self, room: usize) {
        let mut in_flight = self.in_flight.lock().unwrap();
        while let Some(oldest) = in_flight.front() {
            let queued = matches!(*oldest.cell.lock().unwrap(), Cell::Queued);
            if queued && in_flight.len() <= room {
                break;
            }
            // Its error, if any, stays with its values, raised where they are read.
            let _ = oldest.wait_buffer();
            in_flight.pop_front();
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

/// How every mode prepares its programs: with the rewrites and the fused
/// compiler, or, with `TORCH_TPU_FUSION=off`, as the reference kernels.
fn how(config: &Config) -> Preparation {
    if config.fusion {
        Preparation::Fused
    } else {
        Preparation::Unfused
    }
}
