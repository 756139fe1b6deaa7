//! Whether this process is a fork of the one that started some threads,
//! without a system call on the hot path.
//!
//! `fork()` copies a process's memory into the child but none of its
//! threads except the caller. Whatever owns threads (the Strict stream, the
//! kernels' rayon pool) records the generation it started them in; a
//! different generation later means they are not running here. A
//! `pthread_atfork` handler counts forks in the child, so a check is one
//! atomic load where `getpid()` would be a system call on every op.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

static GENERATION: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();

extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// How many forks lie between the process that first called this and the
/// caller: 0 there, 1 in its children, and so on. A process that never
/// called it before forking had nothing to record, so it needs no count.
pub fn generation() -> u64 {
    REGISTER.call_once(|| {
        // SAFETY: registers a handler that only increments an atomic, which
        // is async-signal-safe, as handlers run in the child right after fork.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        // Without the handler a fork goes unseen; only ENOMEM is possible.
        debug_assert_eq!(rc, 0, "pthread_atfork failed");
    });
    GENERATION.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_forked_child_sees_a_new_generation() {
        let before = super::generation();
        // SAFETY: the child only reads an atomic and exits with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = if super::generation() == before + 1 { 0 } else { 1 };
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status}");
        assert_eq!(super::generation(), before, "the parent's generation changed");
    }
}
