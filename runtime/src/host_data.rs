//! Typed element storage on the host: what uploads take and downloads give.

use half::{bf16, f16};
use trace_ir::{DType, Error, Meta, Result};

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

    /// The address and byte length of the elements, to read them as raw
    /// values of the dtype (a bool is one byte holding 0 or 1).
    pub fn bytes(&self) -> (*const u8, usize) {
        fn raw<T>(v: &[T]) -> (*const u8, usize) {
            (v.as_ptr().cast(), std::mem::size_of_val(v))
        }
        match self {
            HostData::Bool(v) => raw(v),
            HostData::I32(v) => raw(v),
            HostData::I64(v) => raw(v),
            HostData::BF16(v) => raw(v),
            HostData::F16(v) => raw(v),
            HostData::F32(v) => raw(v),
        }
    }

    /// The address and byte length of the elements, for a caller that
    /// writes raw values of the dtype in place. `None` for bools: a Rust
    /// `bool` must hold 0 or 1, which a writer of raw bytes cannot promise.
    pub fn bytes_mut(&mut self) -> Option<(*mut u8, usize)> {
        fn raw<T>(v: &mut [T]) -> Option<(*mut u8, usize)> {
            Some((v.as_mut_ptr().cast(), std::mem::size_of_val(v)))
        }
        match self {
            HostData::Bool(_) => None,
            HostData::I32(v) => raw(v),
            HostData::I64(v) => raw(v),
            HostData::BF16(v) => raw(v),
            HostData::F16(v) => raw(v),
            HostData::F32(v) => raw(v),
        }
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

    /// Checks that this data fills a buffer of `meta` exactly: the same
    /// dtype and one value per element. `op` names the caller in the error.
    pub fn check_fits(&self, op: &str, meta: &Meta) -> Result<()> {
        if self.dtype() != meta.dtype {
            return Err(Error::dtype(
                op,
                "data dtype differs from the buffer's",
                &[meta.dtype, self.dtype()],
            ));
        }
        if self.len() != meta.numel() {
            return Err(Error::DataLength {
                op: op.into(),
                len: self.len(),
                shape: meta.shape.to_vec(),
                numel: meta.numel(),
            });
        }
        Ok(())
    }

    /// Checks that data a backend made, holds or read back fills `meta`
    /// exactly. Input was checked at upload ([`HostData::check_fits`]), so a
    /// mismatch here is a bug of `component`: [`Error::Internal`].
    pub fn check_holds(
        &self,
        component: &'static str,
        what: impl std::fmt::Display,
        meta: &Meta,
    ) -> Result<()> {
        if self.dtype() != meta.dtype || self.len() != meta.numel() {
            return Err(Error::internal(
                component,
                format!(
                    "{what}: {} data of {} elements does not fit {:?} {}",
                    self.dtype(),
                    self.len(),
                    meta.shape.as_slice(),
                    meta.dtype
                ),
            ));
        }
        Ok(())
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
