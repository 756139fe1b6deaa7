//! Host data and backend buffers.

use half::{bf16, f16};
use std::sync::Arc;
use trace_ir::{DType, Meta};

use crate::memory::{Lease, MemoryTracker};

/// Typed element storage on the host.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    Bool(Vec<bool>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    F32(Vec<f32>),
}

impl HostData {
    pub fn dtype(&self) -> DType {
        match self {
            HostData::Bool(_) => DType::Bool,
            HostData::I32(_) => DType::I32,
            HostData::I64(_) => DType::I64,
            HostData::BF16(_) => DType::BF16,
            HostData::F16(_) => DType::F16,
            HostData::F32(_) => DType::F32,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            HostData::Bool(v) => v.len(),
            HostData::I32(v) => v.len(),
            HostData::I64(v) => v.len(),
            HostData::BF16(v) => v.len(),
            HostData::F16(v) => v.len(),
            HostData::F32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element widened to f64 (exact for all our dtypes but large i64).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            HostData::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
            HostData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::I64(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::BF16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            HostData::F16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            HostData::F32(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }

    /// `len` copies of `value` converted to `dtype` (as a cast would).
    pub fn filled(dtype: DType, value: f64, len: usize) -> HostData {
        match dtype {
            DType::Bool => HostData::Bool(vec![value != 0.0; len]),
            DType::I32 => HostData::I32(vec![value as i32; len]),
            DType::I64 => HostData::I64(vec![value as i64; len]),
            DType::BF16 => HostData::BF16(vec![bf16::from_f64(value); len]),
            DType::F16 => HostData::F16(vec![f16::from_f64(value); len]),
            DType::F32 => HostData::F32(vec![value as f32; len]),
        }
    }
}

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
