//! The narrow interface every backend implements.

use std::sync::Arc;

use rewrite_rules::program::Program;
use trace_ir::{Meta, Result};

use crate::buffer::{Buffer, HostData};
use crate::memory::MemoryTracker;

/// A compiled program, ready to run many times on new inputs.
pub trait Executable: Send + Sync {
    /// Runs on `inputs` (one per program parameter, in parameter order) and
    /// returns one buffer per program output. Inputs are passed by value so
    /// the executable can free each one after its last use, or reuse its memory.
    fn run(&self, inputs: Vec<Arc<Buffer>>) -> Result<Vec<Arc<Buffer>>>;

    /// This executable for `program`, which is the program it was compiled
    /// from at other sizes ([`Program::resized`]), without compiling again.
    /// `None` where executables are specialized to their sizes (the
    /// default), and the program must be compiled anew.
    fn resized(&self, program: &Program) -> Option<Arc<dyn Executable>> {
        let _ = program;
        None
    }
}

/// A place where programs compile and buffers live.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;

    /// Compiles a program (from [`Program::unfused`] or the planner) into an
    /// executable.
    fn compile(&self, program: &Program) -> Result<Arc<dyn Executable>>;

    /// Moves host data into a new buffer of this backend.
    fn upload(&self, meta: Meta, data: HostData) -> Result<Arc<Buffer>>;

    /// Copies a buffer back to the host.
    fn download(&self, buffer: &Buffer) -> Result<HostData>;

    /// The tracker every buffer of this backend counts against.
    fn memory(&self) -> &Arc<MemoryTracker>;
}
