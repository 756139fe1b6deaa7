//! The rayon pool the CPU backend's kernels run on.
//!
//! `fork()` copies rayon's global pool into the child without its worker
//! threads, so a parallel kernel in a forked child (a `multiprocessing` or
//! DataLoader worker started with `fork`) would wait forever for workers
//! that do not exist. The process that first runs a program keeps the global
//! pool; any other process (a forked child) runs on a pool of its own, built
//! the first time it is needed there.

use std::sync::{Mutex, OnceLock};

use trace_ir::Result;

/// The fork generation ([`crate::fork`]) that first ran a program on this
/// backend: it owns the global pool.
static FIRST: OnceLock<u64> = OnceLock::new();

/// The pool of a forked child, with the generation it was built in (a child
/// of a child builds its own again). Leaked: dropping a pool copied by
/// `fork` would signal threads that are not there.
static CHILD_POOL: Mutex<Option<(u64, &'static rayon::ThreadPool)>> = Mutex::new(None);

/// Runs `f` where its parallel loops have live worker threads.
pub(crate) fn install<R: Send>(f: impl FnOnce() -> Result<R> + Send) -> Result<R> {
    let generation = crate::fork::generation();
    if *FIRST.get_or_init(|| generation) == generation {
        return f();
    }
    let mut slot = CHILD_POOL.lock().unwrap_or_else(|e| e.into_inner());
    let pool = match *slot {
        Some((owner, pool)) if owner == generation => pool,
        _ => {
            let pool = rayon::ThreadPoolBuilder::new()
                .thread_name(|i| format!("deferfuse-cpu-{i}"))
                .build()
                .map_err(|e| {
                    super::internal(format!("cannot start the kernel threads of this process: {e}"))
                })?;
            let pool: &'static rayon::ThreadPool = Box::leak(Box::new(pool));
            *slot = Some((generation, pool));
            pool
        }
    };
    drop(slot);
    pool.install(f)
}
