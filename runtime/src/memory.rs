//! Buffer accounting: live and peak bytes per context, so memory claims can be
//! measured through the API rather than guessed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::host_data::HostData;

/// Counts the bytes of every buffer a backend allocates for one context.
///
/// It also keeps a small cache of the host allocations of freed buffers
/// (like PyTorch's caching allocator), so that a program run again and again
/// writes into memory it already touched instead of fresh pages from the OS.
/// Cached bytes are not live: they are neither in `live_bytes` nor in
/// `peak_bytes` (see [`MemoryTracker::cached_bytes`]).
#[derive(Debug, Default)]
pub struct MemoryTracker {
    live: AtomicUsize,
    peak: AtomicUsize,
    pool: Mutex<Pool>,
    /// Set by the first [`MemoryTracker::reuse`]: a tracker nobody reuses
    /// from (op-by-op execution) caches nothing.
    reusing: std::sync::atomic::AtomicBool,
}

/// Freed host allocations, oldest first.
#[derive(Debug, Default)]
struct Pool {
    entries: VecDeque<HostData>,
    bytes: usize,
}

/// Allocations smaller than this are left to the system allocator.
const POOL_MIN_BYTES: usize = 64 * 1024;
/// The most bytes the cache holds; the oldest entries go first.
const POOL_MAX_BYTES: usize = 256 << 20;

fn data_bytes(d: &HostData) -> usize {
    d.len() * d.dtype().size_in_bytes()
}

/// A snapshot of a tracker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct MemoryStats {
    pub live_bytes: usize,
    pub peak_bytes: usize,
}

impl MemoryTracker {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            live_bytes: self.live.load(Ordering::Relaxed),
            peak_bytes: self.peak.load(Ordering::Relaxed),
        }
    }

    /// Starts a new measurement window: the peak becomes what is live now.
    pub fn reset_peak(&self) {
        self.peak.store(self.live.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Raises the peak to at least `bytes`: restores an outer measurement
    /// window after a nested one (a fusion dump's per-flush peak) reset it.
    pub fn restore_peak(&self, bytes: usize) {
        self.peak.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Bytes held in the cache of freed allocations.
    pub fn cached_bytes(&self) -> usize {
        self.pool.lock().map(|p| p.bytes).unwrap_or(0)
    }

    /// Drops every cached allocation.
    pub fn release_cached(&self) {
        if let Ok(mut p) = self.pool.lock() {
            p.entries.clear();
            p.bytes = 0;
        }
    }

    /// A cached allocation of exactly `len` elements of `dtype`, if any. Its
    /// contents are stale (but valid values): the caller overwrites them.
    pub fn reuse(&self, dtype: trace_ir::DType, len: usize) -> Option<HostData> {
        if len * dtype.size_in_bytes() < POOL_MIN_BYTES {
            return None;
        }
        self.reusing.store(true, Ordering::Relaxed);
        let mut p = self.pool.lock().ok()?;
        let i = p.entries.iter().position(|d| d.dtype() == dtype && d.len() == len)?;
        let d = p.entries.remove(i)?;
        p.bytes -= data_bytes(&d);
        Some(d)
    }

    /// Keeps a freed allocation for [`MemoryTracker::reuse`].
    pub fn recycle(&self, data: HostData) {
        let bytes = data_bytes(&data);
        if !(POOL_MIN_BYTES..=POOL_MAX_BYTES).contains(&bytes)
            || !self.reusing.load(Ordering::Relaxed)
        {
            return;
        }
        let Ok(mut p) = self.pool.lock() else { return };
        while p.bytes + bytes > POOL_MAX_BYTES {
            match p.entries.pop_front() {
                Some(old) => p.bytes -= data_bytes(&old),
                None => break,
            }
        }
        p.bytes += bytes;
        p.entries.push_back(data);
    }

    fn add(&self, bytes: usize) {
        let now = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn sub(&self, bytes: usize) {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Holds `bytes` against a tracker until dropped.
#[derive(Debug)]
pub struct Lease {
    tracker: Arc<MemoryTracker>,
    bytes: usize,
}

impl Lease {
    pub fn new(tracker: &Arc<MemoryTracker>, bytes: usize) -> Self {
        tracker.add(bytes);
        Lease { tracker: tracker.clone(), bytes }
    }

    /// The tracker the bytes count against.
    pub fn tracker(&self) -> &Arc<MemoryTracker> {
        &self.tracker
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.tracker.sub(self.bytes);
    }
}
