//! Where a backend's time goes: kernels run and their wall time by kind,
//! summed over every executable the backend compiled ([`KernelStats`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::backend::{KernelStats, KernelTime};

/// The kinds of kernel the native backend runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Single = 0,
    Loop = 1,
    MatMul = 2,
}

/// Counters shared by a backend and its executables. Relaxed atomics: each
/// count is exact, a snapshot taken while kernels run may mix before and after.
#[derive(Debug, Default)]
pub(crate) struct KernelClock {
    runs: [AtomicU64; 3],
    ns: [AtomicU64; 3],
    matmul_flops: AtomicU64,
}

impl KernelClock {
    /// Counts one kernel of `kind` that ran from `since` to now; returns now,
    /// where the next kernel's time starts (one clock read per kernel).
    pub(crate) fn lap(&self, kind: Kind, since: Instant) -> Instant {
        let now = Instant::now();
        let ns = u64::try_from(now.duration_since(since).as_nanos()).unwrap_or(u64::MAX);
        self.runs[kind as usize].fetch_add(1, Ordering::Relaxed);
        self.ns[kind as usize].fetch_add(ns, Ordering::Relaxed);
        now
    }

    pub(crate) fn add_flops(&self, flops: u64) {
        self.matmul_flops.fetch_add(flops, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> KernelStats {
        let kind = |k: Kind| KernelTime {
            runs: self.runs[k as usize].load(Ordering::Relaxed),
            ns: self.ns[k as usize].load(Ordering::Relaxed),
        };
        KernelStats {
            single: kind(Kind::Single),
            loops: kind(Kind::Loop),
            matmul: kind(Kind::MatMul),
            matmul_flops: self.matmul_flops.load(Ordering::Relaxed),
        }
    }
}
