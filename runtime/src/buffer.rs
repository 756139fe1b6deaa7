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

/// Where a buffer's bytes live. The native CPU backend keeps them on the
/// host; a device backend (PJRT) adds its own variant.
#[derive(Debug)]
pub enum Storage {
    Host(HostData),
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

impl Drop for Buffer {
    /// Hands large host allocations to the tracker's cache for reuse.
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            let Storage::Host(d) = std::mem::replace(&mut self.storage, Storage::Host(HostData::Bool(Vec::new())));
            let tracker = lease.tracker().clone();
            drop(lease);
            tracker.recycle(d);
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
        }
    }

    /// Takes the data out for reuse in place; the lease moves with it to the new buffer.
    /// The host data, to write in place; the caller holds the only reference.
    pub fn host_data_mut(&mut self) -> Option<&mut HostData> {
        match &mut self.storage {
            Storage::Host(d) => Some(d),
        }
    }

    pub fn into_host_data(mut self) -> Option<(HostData, Lease)> {
        let lease = self.lease.take()?;
        let Storage::Host(d) = std::mem::replace(&mut self.storage, Storage::Host(HostData::Bool(Vec::new())));
        Some((d, lease))
    }

    /// Rebuilds a buffer from reused data and its lease (same byte size).
    pub fn from_reused(meta: Meta, data: HostData, lease: Lease) -> Buffer {
        Buffer { meta, storage: Storage::Host(data), lease: Some(lease) }
    }
}
