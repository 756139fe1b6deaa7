//! The native CPU backend: buffers live on the host and a compiled trace runs
//! op by op, unfused. It is the reference that fused kernels and other
//! backends are compared against, so it favours plain, exact semantics:
//!
//! - floats (f32, bf16, f16) compute in f32 and round once to their dtype;
//!   integers compute in i64 and wrap to their dtype with `as`; bool is bool;
//! - reductions accumulate float sums and products in f64 (see [`reduce`]);
//! - GELU's erf form uses an f64 erf ([`erf`]) accurate to ~1e-16;
//! - random values follow the documented stream in [`random`];
//! - the fused row forms (softmax, log_softmax, layer_norm, rms_norm) follow
//!   their primitive decomposition step for step (bit-identical on f32).
//!
//! Nodes no output needs are skipped.
//!
//! Memory: each value is dropped right after its last use, and elementwise
//! ops (unary, same-size cast, binary) and reshape overwrite an input that is
//! at its last use and uniquely owned instead of allocating, so the
//! [`MemoryTracker`] sees the peak an eager executor would have.

mod clock;
mod elem;
mod elementwise;
pub mod erf;
pub mod fused;
mod layout;
mod matmul;
mod pool;
pub mod random;
mod reduce;
mod rows;

use std::sync::Arc;

use rewrite_rules::program::{Instr, KernelKind, LoopKernel, Program, View};
use smallvec::SmallVec;
use trace_ir::{Error, Meta, Op, Result};

pub use elementwise::{gelu_erf, gelu_tanh, int_pow, sigmoid};

use crate::backend::{Backend, Executable};
use crate::buffer::Buffer;
use crate::host_data::HostData;
use crate::memory::{Lease, MemoryTracker};
use clock::{KernelClock, Kind};
use elem::Src;

/// A runtime failure of this backend.
pub(crate) fn internal(msg: impl Into<String>) -> Error {
    Error::backend("cpu", msg)
}

/// The native CPU backend.
#[derive(Debug, Clone)]
pub struct CpuBackend {
    tracker: Arc<MemoryTracker>,
    /// Whether fused kernels use the SIMD code this CPU runs (see [`Self::with_simd`]).
    simd: bool,
    /// Kernel time of every executable this backend compiled.
    clock: Arc<KernelClock>,
}

impl CpuBackend {
    /// A backend whose fused kernels use the best SIMD code this CPU runs.
    pub fn new(tracker: Arc<MemoryTracker>) -> CpuBackend {
        CpuBackend { tracker, simd: true, clock: Arc::default() }
    }

    /// With `simd` off, the fused kernels of programs this backend compiles
    /// run their portable scalar code instead of AVX2 or AVX-512 (results
    /// agree within the documented bounds of the approximations; this is for
    /// bisecting a difference to the SIMD code). The unfused reference
    /// kernels and the matrix-product library are not affected.
    pub fn with_simd(self, simd: bool) -> Self {
        CpuBackend { simd, ..self }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn compile(&self, program: &Program) -> Result<Arc<dyn Executable>> {
        let isa = fused::Isa::choose(self.simd);
        let exec = CpuExecutable::with_isa(program, self.tracker.clone(), isa, self.clock.clone())?;
        Ok(Arc::new(exec))
    }

    fn upload(&self, meta: Meta, data: HostData) -> Result<Arc<Buffer>> {
        data.check_fits("upload", &meta)?;
        Ok(Arc::new(Buffer::host(meta, data, &self.tracker)))
    }

    fn download(&self, buffer: &Buffer) -> Result<HostData> {
        buffer.host_data().cloned().ok_or_else(|| internal("buffer does not live on the host"))
    }

    fn memory(&self) -> &Arc<MemoryTracker> {
        &self.tracker
    }

    /// Kernel time by kind; nothing is compiled or copied here.
    fn stats(&self) -> crate::BackendStats {
        crate::BackendStats { kernels: self.clock.snapshot(), ..Default::default() }
    }
}

/// How one kernel of a program runs.
#[allow(clippy::large_enum_variant)] // one per kernel, built once
enum Compiled {
    /// One op, by the reference code above.
    Single(Op),
    // Shared by the executables of one program at several sizes.
    Loop(Arc<fused::LoopExec>),
    MatMul(Arc<fused::MatMulExec>),
}

/// A program ready to run: `Single` kernels op by op on the reference code,
/// `Loop` and `MatMul` kernels on the fused executors ([`fused`]).
pub struct CpuExecutable {
    program: Program,
    kernels: Vec<Compiled>,
    /// Reads of each value by kernels plus output slots; values read by
    /// nothing are dropped as soon as they are produced.
    uses: Vec<usize>,
    tracker: Arc<MemoryTracker>,
    /// The tile code the fused loops run.
    isa: fused::Isa,
    /// Where the kernels' time is counted.
    clock: Arc<KernelClock>,
}

impl std::fmt::Debug for CpuExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuExecutable").field("kernels", &self.program.kernels.len()).finish()
    }
}

impl CpuExecutable {
    /// Checks `program` (every value read is a parameter or written by an
    /// earlier kernel) and compiles its fused kernels for the best SIMD code
    /// this CPU runs.
    pub fn new(program: &Program, tracker: Arc<MemoryTracker>) -> Result<CpuExecutable> {
        Self::with_isa(program, tracker, fused::Isa::detect(), Arc::default())
    }

    /// [`Self::new`], the fused loops running the tile code of `isa` and
    /// the kernels' time counted on `clock` (a backend's, shared by all it
    /// compiles).
    fn with_isa(
        program: &Program,
        tracker: Arc<MemoryTracker>,
        isa: fused::Isa,
        clock: Arc<KernelClock>,
    ) -> Result<CpuExecutable> {
        let nv = program.values.len();
        let bad = |msg: String| Error::InvalidTrace(format!("program: {msg}"));
        let mut defined = vec![false; nv];
        for &p in &program.params {
            *defined
                .get_mut(p)
                .ok_or_else(|| bad(format!("parameter value {p} does not exist")))? = true;
        }
        let mut uses = vec![0usize; nv];
        let mut kernels = Vec::with_capacity(program.kernels.len());
        for (k, kernel) in program.kernels.iter().enumerate() {
            for &i in &kernel.inputs {
                if !defined.get(i).copied().unwrap_or(false) {
                    return Err(bad(format!("kernel {k} reads value {i} before it is written")));
                }
                uses[i] += 1;
            }
            for &o in &kernel.outputs {
                *defined.get_mut(o).ok_or_else(|| {
                    bad(format!("kernel {k} writes value {o}, which does not exist"))
                })? = true;
            }
            let metas = |ids: &[usize]| {
                ids.iter().map(|&i| program.values[i].clone()).collect::<Vec<Meta>>()
            };
            let compiled = match &kernel.kind {
                KernelKind::Single { op } => {
                    if kernel.outputs.len() != 1 || matches!(op, Op::Parameter { .. }) {
                        return Err(bad(format!(
                            "kernel {k}: a single-op kernel writes one value"
                        )));
                    }
                    let ins = metas(&kernel.inputs);
                    let refs: Vec<&Meta> = ins.iter().collect();
                    let meta = trace_ir::infer(op, &refs)?;
                    if meta != program.values[kernel.outputs[0]] {
                        return Err(bad(format!(
                            "kernel {k}: {} does not produce its output's meta",
                            op.name()
                        )));
                    }
                    Compiled::Single(op.clone())
                }
                KernelKind::Loop(l) => Compiled::Loop(Arc::new(
                    fused::LoopExec::new(l, metas(&kernel.inputs), metas(&kernel.outputs), false)
                        .map_err(|e| bad(format!("{}: {e}", program.describe_kernel(k))))?,
                )),
                KernelKind::MatMul(mm) => Compiled::MatMul(Arc::new(
                    fused::MatMulExec::new(mm, metas(&kernel.inputs), metas(&kernel.outputs))
                        .map_err(|e| bad(format!("{}: {e}", program.describe_kernel(k))))?,
                )),
            };
            kernels.push(compiled);
        }
        for &o in &program.outputs {
            if !defined.get(o).copied().unwrap_or(false) {
                return Err(bad(format!("output value {o} is never written")));
            }
            uses[o] += 1;
        }
        Ok(CpuExecutable { program: program.clone(), kernels, uses, tracker, isa, clock })
    }

    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Wraps fresh data as an op's output.
    fn fresh(&self, meta: &Meta, data: HostData) -> Result<Buffer> {
        data.check_holds("cpu", "output", meta)?;
        Ok(Buffer::host(meta.clone(), data, &self.tracker))
    }

    /// Runs one op on the reference code; the output meta follows from the
    /// operands, so the op runs on any sizes its attributes allow.
    fn eval(&self, op: &Op, args: SmallVec<[Arc<Buffer>; 3]>) -> Result<Buffer> {
        let metas: SmallVec<[&Meta; 3]> = args.iter().map(|a| a.meta()).collect();
        let meta = &trace_ir::infer(op, &metas)?;
        drop(metas);
        let shape = meta.shape.as_slice();
        let n = meta.numel();
        let same = |m: &Meta| m.dtype == meta.dtype && m.numel() == n;
        if n == 0 && !matches!(op, Op::Parameter { .. }) {
            return self.fresh(meta, HostData::filled(meta.dtype, 0.0, 0));
        }
        check_alloc(meta)?;
        let data = match op {
            Op::Parameter { .. } => return Err(internal("parameters are not evaluated")),
            Op::Full { value, dtype, .. } => HostData::filled(*dtype, *value, n),
            Op::Arange { start, step, len, dtype } => random::arange(*start, *step, *len, *dtype),
            Op::Random { seed, dist, dtype, .. } => random::random(*seed, *dist, *dtype, n)?,
            Op::Unary { kind } => {
                let [x] = fixed::<1>(args)?;
                let ok = same(x.meta());
                return match take(x, ok)? {
                    Arg::Owned(d, lease) => {
                        reused(meta, elementwise::unary(*kind, Src::Owned(d))?, lease)
                    }
                    Arg::Shared(x) => {
                        self.fresh(meta, elementwise::unary(*kind, Src::Borrowed(host(&x)?))?)
                    }
                };
            }
            Op::Cast { to } => {
                let [x] = fixed::<1>(args)?;
                let ok =
                    x.meta().numel() == n && x.meta().dtype.size_in_bytes() == to.size_in_bytes();
                return match take(x, ok)? {
                    Arg::Owned(d, lease) => {
                        reused(meta, elementwise::cast(Src::Owned(d), *to)?, lease)
                    }
                    Arg::Shared(x) => {
                        self.fresh(meta, elementwise::cast(Src::Borrowed(host(&x)?), *to)?)
                    }
                };
            }
            Op::Binary { kind } => {
                let [a, b] = fixed::<2>(args)?;
                let (sa, sb) = (a.meta().shape.clone(), b.meta().shape.clone());
                let (oka, okb) = (same(a.meta()), same(b.meta()));
                return match take(a, oka)? {
                    Arg::Owned(d, lease) => reused(
                        meta,
                        elementwise::binary_in_place(*kind, d, true, host(&b)?, &sb, shape)?,
                        lease,
                    ),
                    Arg::Shared(a) => match take(b, okb)? {
                        Arg::Owned(d, lease) => reused(
                            meta,
                            elementwise::binary_in_place(*kind, d, false, host(&a)?, &sa, shape)?,
                            lease,
                        ),
                        Arg::Shared(b) => self.fresh(
                            meta,
                            elementwise::binary_new(*kind, host(&a)?, &sa, host(&b)?, &sb, shape)?,
                        ),
                    },
                };
            }
            Op::Where => {
                let [c, a, b] = fixed::<3>(args)?;
                elementwise::where_(
                    host(&c)?,
                    &c.meta().shape,
                    host(&a)?,
                    &a.meta().shape,
                    host(&b)?,
                    &b.meta().shape,
                    shape,
                )?
            }
            Op::Reduce { kind, axes, .. } => {
                let [x] = fixed::<1>(args)?;
                reduce::reduce(*kind, axes, host(&x)?, &x.meta().shape)?
            }
            Op::ArgReduce { kind, axis, .. } => {
                let [x] = fixed::<1>(args)?;
                reduce::arg_reduce(*kind, *axis, host(&x)?, &x.meta().shape)?
            }
            Op::Expand { .. } => {
                let [x] = fixed::<1>(args)?;
                layout::expand(host(&x)?, &x.meta().shape, shape)?
            }
            Op::Reshape { .. } => {
                let [x] = fixed::<1>(args)?;
                let ok = same(x.meta());
                return match take(x, ok)? {
                    Arg::Owned(d, lease) => reused(meta, d, lease),
                    Arg::Shared(x) => self.fresh(meta, layout::copy(host(&x)?)),
                };
            }
            Op::Permute { perm } => {
                let [x] = fixed::<1>(args)?;
                layout::permute(host(&x)?, &x.meta().shape, perm)?
            }
            Op::Slice { axis, start, stop, step } => {
                let [x] = fixed::<1>(args)?;
                layout::slice(host(&x)?, &x.meta().shape, *axis, *start, *stop, *step)?
            }
            Op::Concat { axis } => {
                let parts = args
                    .iter()
                    .map(|a| Ok((host(a)?, a.meta().shape.as_slice())))
                    .collect::<Result<Vec<_>>>()?;
                layout::concat(&parts, *axis)?
            }
            Op::GatherRows => {
                let [table, idx] = fixed::<2>(args)?;
                layout::gather_rows(host(&table)?, &table.meta().shape, host(&idx)?)?
            }
            Op::ScatterAddRows { rows } => {
                let [idx, updates] = fixed::<2>(args)?;
                layout::scatter_add_rows(
                    host(&idx)?,
                    host(&updates)?,
                    &updates.meta().shape,
                    *rows,
                )?
            }
            Op::MatMul => {
                let [a, b] = fixed::<2>(args)?;
                matmul::matmul(host(&a)?, &a.meta().shape, host(&b)?, &b.meta().shape, shape)?
            }
            Op::Softmax { .. } | Op::LogSoftmax { .. } => {
                let [x] = fixed::<1>(args)?;
                rows::row(op, host(&x)?, &x.meta().shape, None)?
            }
            Op::LayerNorm { .. } | Op::RmsNorm { .. } => {
                let [x, eps] = fixed::<2>(args)?;
                rows::row(op, host(&x)?, &x.meta().shape, Some(host(&eps)?))?
            }
        };
        self.fresh(meta, data)
    }
}

impl CpuExecutable {
    /// [`Executable::run`] on the calling thread (its kernels use the rayon
    /// pool [`pool::install`] picked).
    fn run_here(&self, inputs: Vec<Arc<Buffer>>) -> Result<Vec<Arc<Buffer>>> {
        elem::with_pool(&self.tracker, || self.run_kernels(inputs))
    }

    fn run_kernels(&self, inputs: Vec<Arc<Buffer>>) -> Result<Vec<Arc<Buffer>>> {
        let p = &self.program;
        if inputs.len() != p.params.len() {
            return Err(internal(format!(
                "the program takes {} inputs, got {}",
                p.params.len(),
                inputs.len()
            )));
        }
        let mut vals: Vec<Option<Arc<Buffer>>> = vec![None; p.values.len()];
        for (k, (buf, &id)) in inputs.into_iter().zip(&p.params).enumerate() {
            let want = &p.values[id];
            // Sizes may change (kernels read them from their inputs); rank and dtype may not.
            if buf.meta().dtype != want.dtype || buf.meta().shape.len() != want.shape.len() {
                return Err(internal(format!(
                    "input {k} is {:?} {} but the program expects {:?} {}",
                    buf.meta().shape.as_slice(),
                    buf.meta().dtype,
                    want.shape.as_slice(),
                    want.dtype
                )));
            }
            // Lazy: the message is formatted only when the check fails (this runs per op in Strict).
            host(&buf)?.check_holds("cpu", format_args!("input {k}"), buf.meta())?;
            if self.uses[id] > 0 {
                vals[id] = Some(buf);
            }
        }
        let mut left = self.uses.clone();
        let mut lap = std::time::Instant::now();
        for (k, (kernel, compiled)) in p.kernels.iter().zip(&self.kernels).enumerate() {
            let mut args: SmallVec<[Arc<Buffer>; 3]> = SmallVec::new();
            for &i in &kernel.inputs {
                left[i] = left[i].saturating_sub(1);
                // The last reader takes the value, so it is freed (or reused)
                // as soon as this kernel is done with it.
                let v = if left[i] == 0 { vals[i].take() } else { vals[i].clone() };
                args.push(v.ok_or_else(|| {
                    internal(format!("kernel {k} reads value {i}, which has no value"))
                })?);
            }
            let (kind, outs) = match compiled {
                Compiled::Single(op) => (Kind::Single, vec![self.eval(op, args)?]),
                Compiled::Loop(l) => {
                    let planned = match &kernel.kind {
                        KernelKind::Loop(lk) => lk.shape.as_slice(),
                        _ => return Err(internal(format!("kernel {k} is not a loop"))),
                    };
                    let outs = l
                        .run(args.into_vec(), None, planned, &self.tracker, self.isa)
                        .map_err(|e| annotate(p, k, e))?;
                    (Kind::Loop, outs)
                }
                Compiled::MatMul(m) => {
                    let outs = m
                        .run(args.into_vec(), &self.tracker, self.isa, &self.clock)
                        .map_err(|e| annotate(p, k, e))?;
                    (Kind::MatMul, outs)
                }
            };
            lap = self.clock.lap(kind, lap);
            for (&o, out) in kernel.outputs.iter().zip(outs) {
                if self.uses[o] > 0 {
                    vals[o] = Some(Arc::new(out));
                }
            }
        }
        p.outputs
            .iter()
            .map(|&o| {
                vals[o].clone().ok_or_else(|| internal(format!("output value {o} has no value")))
            })
            .collect()
    }
}

impl Executable for CpuExecutable {
    fn run(&self, inputs: Vec<Arc<Buffer>>) -> Result<Vec<Arc<Buffer>>> {
        pool::install(|| self.run_here(inputs))
    }

    /// Loop and matmul kernels read their sizes from their inputs, so only
    /// the single ops, whose attributes may hold sizes, are taken anew.
    fn resized(&self, program: &Program) -> Option<Arc<dyn Executable>> {
        if program.kernels.len() != self.kernels.len() {
            return None;
        }
        let metas =
            |ids: &[usize]| ids.iter().map(|&i| program.values[i].clone()).collect::<Vec<Meta>>();
        // Fused kernels are shared across sizes, except those that read a
        // strided view: its strides and offset are fixed in the kernel, so
        // it is built again (no code is generated; this is cheap).
        let kernels = program
            .kernels
            .iter()
            .zip(&self.kernels)
            .map(|(kernel, compiled)| match (&kernel.kind, compiled) {
                (KernelKind::Single { op }, Compiled::Single(_)) => {
                    Some(Compiled::Single(op.clone()))
                }
                (KernelKind::Loop(l), Compiled::Loop(_)) if strided(l) => {
                    let exec = fused::LoopExec::new(
                        l,
                        metas(&kernel.inputs),
                        metas(&kernel.outputs),
                        false,
                    )
                    .ok()?;
                    Some(Compiled::Loop(Arc::new(exec)))
                }
                (KernelKind::Loop(_), Compiled::Loop(l)) => Some(Compiled::Loop(l.clone())),
                (KernelKind::MatMul(mm), Compiled::MatMul(_))
                    if [&mm.lhs, &mm.rhs].iter().any(|v| matches!(v, View::Strided { .. }))
                        || mm.epilogue.as_ref().is_some_and(strided) =>
                {
                    let exec =
                        fused::MatMulExec::new(mm, metas(&kernel.inputs), metas(&kernel.outputs))
                            .ok()?;
                    Some(Compiled::MatMul(Arc::new(exec)))
                }
                (KernelKind::MatMul(_), Compiled::MatMul(m)) => Some(Compiled::MatMul(m.clone())),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        let (uses, tracker, isa, clock) =
            (self.uses.clone(), self.tracker.clone(), self.isa, self.clock.clone());
        Some(Arc::new(CpuExecutable {
            program: program.clone(),
            kernels,
            uses,
            tracker,
            isa,
            clock,
        }))
    }
}

/// Whether a loop reads a strided view.
fn strided(l: &LoopKernel) -> bool {
    l.instrs.iter().any(|i| matches!(i, Instr::Load { view: View::Strided { .. }, .. }))
}

/// Names the kernel and the ops fused into it in a runtime failure.
fn annotate(p: &Program, k: usize, e: Error) -> Error {
    match e {
        Error::Backend { backend, msg } => {
            Error::Backend { backend, msg: format!("{}: {msg}", p.describe_kernel(k)) }
        }
        other => other,
    }
}

/// An operand, taken for reuse or shared.
enum Arg {
    Owned(HostData, Lease),
    Shared(Arc<Buffer>),
}

/// Takes `buf`'s storage when `reusable` and this is its only reference.
fn take(buf: Arc<Buffer>, reusable: bool) -> Result<Arg> {
    if !reusable || buf.host_data().is_none() {
        return Ok(Arg::Shared(buf));
    }
    match Arc::try_unwrap(buf) {
        Ok(b) => {
            let (d, lease) =
                b.into_host_data().ok_or_else(|| internal("buffer does not live on the host"))?;
            Ok(Arg::Owned(d, lease))
        }
        Err(b) => Ok(Arg::Shared(b)),
    }
}

/// Rebuilds a buffer around reused storage; the lease has its byte size.
fn reused(meta: &Meta, data: HostData, lease: Lease) -> Result<Buffer> {
    data.check_holds("cpu", "output", meta)?;
    Ok(Buffer::from_reused(meta.clone(), data, lease))
}

/// Outputs above this size are first reserved fallibly, so that one too
/// large for the machine is an error rather than an abort.
const PROBE_BYTES: usize = 1 << 30;

pub(crate) fn check_alloc(meta: &Meta) -> Result<()> {
    let bytes = meta.numel().checked_mul(meta.dtype.size_in_bytes());
    match bytes {
        Some(b) if b <= PROBE_BYTES => Ok(()),
        Some(b) if Vec::<u8>::new().try_reserve_exact(b).is_ok() => Ok(()),
        _ => Err(internal(format!(
            "cannot allocate {:?} {} ({} elements)",
            meta.shape.as_slice(),
            meta.dtype,
            meta.numel()
        ))),
    }
}

pub(crate) fn host(b: &Buffer) -> Result<&HostData> {
    b.host_data().ok_or_else(|| internal("buffer does not live on the host"))
}

/// Exactly `N` operands.
fn fixed<const N: usize>(args: SmallVec<[Arc<Buffer>; 3]>) -> Result<[Arc<Buffer>; N]> {
    let n = args.len();
    args.into_iter()
        .collect::<Vec<_>>()
        .try_into()
        .map_err(|_| internal(format!("expected {N} operands, got {n}")))
}
