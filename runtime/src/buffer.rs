//! Backend buffers: host data or a device backend's bytes, with their lease
//! on the memory tracker.

use std::sync::Arc;
use trace_ir::Meta;

use crate::host_data::HostData;
use crate::memory::{Lease, MemoryTracker};

/// Bytes a device backend holds (a PJRT device buffer). Only the backend
/// that made them can read them; it downcasts through [`DeviceData::as_any`].
pub trait DeviceData: Send + Sync + std::fmt::Debug {
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Where a buffer's bytes live: on the host (the native CPU backend), or in
/// a device backend's memory, where results stay between runs until read.
#[derive(Debug)]
pub enum Storage {
    Host(HostData),
    Device(Box<dyn DeviceData>),
}

/// A materialized tensor value owned by a backend. Its bytes count against the
/// context's [`MemoryTracker`] until it is dropped.
#[derive(Debug)]
pub struct Buffer {
    meta: Meta,
    storage: Storage,
    /// `None` only once the storage has been taken out.
    lease: Option<Lease>,
}

fn take_host(storage: &mut Storage) -> Option<HostData> {
    match std::mem::replace(storage, Storage::Host(HostData::Bool(Vec::new()))) {
        Storage::Host(d) => Some(d),
        device => {
            *storage = device;
            None
        }
    }
}

impl Drop for Buffer {
    /// Hands large host allocations to the tracker's cache for reuse; device
    /// storage frees itself.
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            let tracker = lease.tracker().clone();
            drop(lease);
            if let Some(d) = take_host(&mut self.storage) {
                tracker.recycle(d);
            }
        }
    }
}

impl Buffer {
    /// Wraps host data; the caller has checked that it matches `meta`.
    pub fn host(meta: Meta, data: HostData, tracker: &Arc<MemoryTracker>) -> Buffer {
        debug_assert_eq!(meta.dtype, data.dtype());
        debug_assert_eq!(meta.numel(), data.len());
        let lease = Lease::new(tracker, meta.size_in_bytes());
        Buffer { meta, storage: Storage::Host(data), lease: Some(lease) }
    }

    /// Wraps a device backend's buffer holding a value of `meta`; its bytes
    /// count against `tracker` like host bytes do.
    pub fn device(meta: Meta, data: Box<dyn DeviceData>, tracker: &Arc<MemoryTracker>) -> Buffer {
        let lease = Lease::new(tracker, meta.size_in_bytes());
        Buffer { meta, storage: Storage::Device(data), lease: Some(lease) }
    }

    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The host data, for backends whose buffers live on the host.
    pub fn host_data(&self) -> Option<&HostData> {
        match &self.storage {
            Storage::Host(d) => Some(d),
            Storage::Device(_) => None,
        }
    }

    /// The host data, to write in place; the caller holds the only reference.
    pub fn host_data_mut(&mut self) -> Option<&mut HostData> {
        match &mut self.storage {
            Storage::Host(d) => Some(d),
            Storage::Device(_) => None,
        }
    }

    /// The device data, for the device backend that made it.
    pub fn device_data(&self) -> Option<&dyn DeviceData> {
        match &self.storage {
            Storage::Device(d) => Some(d.as_ref()),
            Storage::Host(_) => None,
        }
    }

    /// Takes host data out for reuse in place; the lease moves with it to the
    /// new buffer. `None` (and the buffer dropped) for device storage.
    pub fn into_host_data(mut self) -> Option<(HostData, Lease)> {
        let data = take_host(&mut self.storage)?;
        let lease = self.lease.take()?;
        Some((data, lease))
    }

    /// Rebuilds a buffer from reused data and its lease (same byte size).
    pub fn from_reused(meta: Meta, data: HostData, lease: Lease) -> Buffer {
        Buffer { meta, storage: Storage::Host(data), lease: Some(lease) }
    }
}
