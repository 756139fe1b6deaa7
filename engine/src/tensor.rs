//! `Tensor`: a cheap, `Send + Sync` handle to a value that is ready, queued on
//! the Strict stream, or deferred in the pending trace.

use std::sync::Arc;

use runtime::{Buffer, HostData};
use trace_ir::{DType, Error, Meta, Result};

use crate::element::Element;
use crate::shared::Shared;
use crate::value::{Cell, Value};

/// A tensor of deferfuse. Cloning it is cheap (a reference count); it can be
/// sent to and shared between threads.
#[derive(Clone)]
pub struct Tensor {
    /// The engine state of the context that made it.
    pub(crate) ctx: Arc<Shared>,
    pub(crate) value: Arc<Value>,
}

impl Tensor {
    pub(crate) fn new(ctx: Arc<Shared>, value: Arc<Value>) -> Tensor {
        Tensor { ctx, value }
    }

    pub fn shape(&self) -> &[usize] {
        &self.value.meta.shape
    }

    pub fn dtype(&self) -> DType {
        self.value.meta.dtype
    }

    pub fn rank(&self) -> usize {
        self.value.meta.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.value.meta.numel()
    }

    pub fn meta(&self) -> &Meta {
        &self.value.meta
    }

    /// Materializes the value (flushing or waiting as the mode requires) and
    /// copies it to the host. Fails instead when an indexing op of this
    /// context found an index out of range since the last read (see
    /// [`Tensor::check_index`]), whether or not this value depends on it.
    pub fn host_data(&self) -> Result<HostData> {
        let buffer = self.ctx.materialize(&self.value)?;
        let data = self.ctx.backend.download(&buffer)?;
        self.ctx.raise_failed_checks()?;
        Ok(data)
    }

    /// Runs `read` on the elements in row-major order: on the buffer itself
    /// where it lives on the host (no copy), else on a downloaded copy. For
    /// readers that copy the elements out anyway (into a PyTorch tensor).
    pub fn with_host_data<R>(&self, read: impl FnOnce(&HostData) -> R) -> Result<R> {
        let buffer = self.ctx.materialize(&self.value)?;
        self.ctx.raise_failed_checks()?;
        match buffer.host_data() {
            Some(data) => Ok(read(data)),
            None => Ok(read(&self.ctx.backend.download(&buffer)?)),
        }
    }

    /// The address and byte length of the value's host elements, for a
    /// caller that only reads them (a collective's transport): no copy.
    /// Valid while this handle keeps its value. Materializes the value
    /// first; `None` where it lives in a device backend's memory.
    pub fn host_address(&self) -> Result<Option<(*const u8, usize)>> {
        let buffer = self.ctx.materialize(&self.value)?;
        self.ctx.raise_failed_checks()?;
        Ok(buffer.host_data().map(HostData::bytes))
    }

    /// The value's host elements, for a caller that writes them in place
    /// (a collective's transport): their address and byte length, valid
    /// while this handle keeps its value and nothing else replaces it.
    /// Materializes the value first. When another tensor shares the value
    /// or its buffer, this handle first takes a private copy, so that the
    /// writes reach no one else; otherwise nothing is copied. `None` where
    /// the value lives in a device backend's memory, and for bools (see
    /// [`HostData::bytes_mut`]).
    pub fn exclusive_host(&mut self) -> Result<Option<(*mut u8, usize)>> {
        if self.dtype() == DType::Bool {
            return Ok(None);
        }
        let buffer = self.ctx.materialize(&self.value)?;
        self.ctx.raise_failed_checks()?;
        let Some(data) = buffer.host_data() else { return Ok(None) };
        let shared = Arc::strong_count(&self.value) > 1 || Arc::strong_count(&buffer) > 2;
        if shared {
            let copy = self.ctx.backend.upload(self.value.meta.clone(), data.clone())?;
            self.value = Value::new(self.value.meta.clone(), Cell::Ready(copy));
        }
        drop(buffer);
        let mut cell = self.value.cell.lock().unwrap();
        let Cell::Ready(buffer) = &mut *cell else {
            return Err(Error::internal("exclusive_host", "a materialized value is not ready"));
        };
        // Only this value holds the buffer now: a stream job that resolved
        // it may still have held it above, in which case it was copied.
        let data = Arc::get_mut(buffer)
            .and_then(Buffer::host_data_mut)
            .ok_or_else(|| Error::internal("exclusive_host", "the private buffer is shared"))?;
        Ok(data.bytes_mut())
    }

    /// The elements in row-major order, converted to `T` as a cast would.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        Ok(T::from_host(self.host_data()?))
    }

    /// The single element of a one-element tensor.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::shape(
                "item",
                "needs a tensor with exactly one element",
                &[&self.value.meta.shape],
            ));
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// True when both handles refer to the same value.
    pub fn same_as(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.value, &other.value)
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor(shape={:?}, dtype={})", self.shape(), self.dtype())
    }
}
