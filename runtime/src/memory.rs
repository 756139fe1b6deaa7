//! Buffer accounting: live and peak bytes per context, so memory claims can be
//! measured through the API rather than guessed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts the bytes of every buffer a backend allocates for one context.
#[derive(Debug, Default)]
pub struct MemoryTracker {
    live: AtomicUsize,
    peak: AtomicUsize,
}

/// A snapshot of a tracker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    pub live_bytes: usize,
    pub peak_bytes: usize,
}

impl MemoryTracker {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn stats(&self) -> MemoryStats {
        MemoryStats { live_bytes: self.live.load(Ordering::Relaxed), peak_bytes: self.peak.load(Ordering::Relaxed) }
    }

    /// Starts a new measurement window: the peak becomes what is live now.
    pub fn reset_peak(&self) {
        self.peak.store(self.live.load(Ordering::Relaxed), Ordering::Relaxed);
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
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.tracker.sub(self.bytes);
    }
}
