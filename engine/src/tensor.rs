//! `Tensor`: a cheap, `Send + Sync` handle to a value that is ready, queued on
//! the Strict stream, or deferred in the pending trace.

use std::sync::Arc;

use runtime::HostData;
use trace_ir::{DType, Error, Meta, Result};

use crate::element::Element;
use crate::shared::Shared;
use crate::value::Value;

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
