//! A context's stream: a worker thread that runs work in the order it was
//! issued while the caller goes on. The caller waits only when it reads.
//! Strict issues its ops and op groups here; DeferAndFuse issues the
//! programs of the flushes nobody waits for (a repeat or the pending cap
//! cut the trace), so recording the next ops overlaps running them.

use std::borrow::Cow;
use std::sync::mpsc::{channel, Sender, SyncSender};
use std::sync::Arc;

use runtime::{Backend, Buffer, Executable, HostData};
use trace_ir::{Error, Result};

use crate::pipeline::{Pipeline, Preparation};
use crate::value::{forked_error, resolve_all, Value, FLUSH};
use trace_ir::{Op, Trace};

pub(crate) enum Job {
    /// One primitive op, of the user-level op `name`.
    Run {
        name: Cow<'static, str>,
        op: Op,
        inputs: Vec<Arc<Value>>,
        output: Arc<Value>,
    },
    /// The primitives of one user-level op (an op group), as one program:
    /// `trace`'s parameters read `inputs`, its outputs fill `outputs`.
    Program {
        name: String,
        trace: Trace,
        inputs: Vec<Arc<Value>>,
        outputs: Vec<Arc<Value>>,
    },
    /// A DeferAndFuse flush's program, compiled by the caller: reads
    /// `inputs` once they are computed, fills `outputs`.
    Execute {
        exe: Arc<dyn Executable>,
        inputs: Vec<Arc<Value>>,
        outputs: Vec<Arc<Value>>,
    },
    /// Host data for `output`, produced by `read` when the stream gets
    /// here: a non-blocking upload ([`crate::Context::from_host_async`]).
    Upload {
        read: Box<dyn FnOnce() -> Result<HostData> + Send>,
        output: Arc<Value>,
    },
    Barrier(SyncSender<()>),
}

pub(crate) struct Stream {
    sender: Sender<Job>,
    /// The fork generation that started the worker thread
    /// ([`runtime::fork`]). `fork()` copies the stream into the child but
    /// not its thread, so a child must never wait on it.
    generation: u64,
}

impl Stream {
    /// Starts the worker; each op runs as a one-op program prepared `how`.
    pub fn start(
        backend: Arc<dyn Backend>,
        pipeline: Arc<Pipeline>,
        how: Preparation,
    ) -> Result<Stream> {
        let generation = runtime::fork::generation();
        let (sender, receiver) = channel::<Job>();
        std::thread::Builder::new()
            .name("deferfuse-stream".into())
            .spawn(move || {
                // Ends when the context (the only sender) is dropped.
                for job in receiver {
                    match job {
                        Job::Run { name, op, inputs, output } => {
                            let result = run_job(&*backend, &pipeline, how, &op, &inputs);
                            drop(inputs);
                            output.resolve(result, &format_args!("the {name} op"));
                        }
                        Job::Program { name, trace, inputs, outputs } => {
                            let result = run_program(&pipeline, how, &trace, &inputs);
                            drop(inputs);
                            // Its error reaches whoever reads the outputs.
                            let _ = resolve_all(&outputs, result, &format_args!("the {name} op"));
                        }
                        Job::Execute { exe, inputs, outputs } => {
                            let result = computed(inputs).and_then(|b| exe.run(b));
                            let _ = resolve_all(&outputs, result, &FLUSH);
                        }
                        Job::Upload { read, output } => {
                            let result =
                                read().and_then(|d| backend.upload(output.meta.clone(), d));
                            output.resolve(result, &"a host upload");
                        }
                        Job::Barrier(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .map_err(|e| {
                Error::backend("stream", format!("cannot start the stream thread: {e}"))
            })?;
        Ok(Stream { sender, generation })
    }

    /// True in a child forked after this stream started: its worker thread
    /// is not running here, and nothing queued on it will ever finish.
    pub fn forked(&self) -> bool {
        runtime::fork::generation() != self.generation
    }

    pub fn submit(&self, job: Job) -> Result<()> {
        if self.forked() {
            return Err(forked_error());
        }
        self.sender.send(job).map_err(|_| Error::backend("stream", "the stream thread has stopped"))
    }

    /// Waits until every job submitted so far has run.
    pub fn synchronize(&self) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.submit(Job::Barrier(tx))?;
        rx.recv().map_err(|_| Error::backend("stream", "the stream thread has stopped"))
    }
}

/// One op as a one-op program.
fn run_job(
    backend: &dyn Backend,
    pipeline: &Pipeline,
    how: Preparation,
    op: &Op,
    inputs: &[Arc<Value>],
) -> Result<Arc<runtime::Buffer>> {
    let metas: Vec<_> = inputs.iter().map(|t| t.meta.clone()).collect();
    let trace = Trace::single_op(op, &metas)?;
    let mut out = run_program(pipeline, how, &trace, inputs)?;
    out.pop().ok_or_else(|| Error::backend(backend.name(), "program returned no output"))
}

/// `trace` on the buffers of `inputs`, once they are computed.
fn run_program(
    pipeline: &Pipeline,
    how: Preparation,
    trace: &Trace,
    inputs: &[Arc<Value>],
) -> Result<Vec<Arc<runtime::Buffer>>> {
    let buffers = inputs.iter().map(|t| t.wait_input()).collect::<Result<Vec<_>>>()?;
    let (exe, _) = pipeline.executable(trace, how)?;
    exe.run(buffers)
}

/// The buffers of `inputs`, waiting for those still queued. Each value is
/// let go once read, so a buffer that nothing else holds reaches the
/// program as its only owner, which may then reuse its memory.
pub(crate) fn computed(inputs: Vec<Arc<Value>>) -> Result<Vec<Arc<Buffer>>> {
    inputs.into_iter().map(|v| v.wait_input()).collect()
}
