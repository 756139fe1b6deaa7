//! Copies between engine host data and memory that PyTorch owns. PyTorch
//! hands us the address of a contiguous CPU tensor and its byte length; the
//! engine owns its buffers as `Vec`s, so each direction is exactly one copy.

use deferfuse::{bf16, f16, DType, HostData};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::{PyErr, PyResult};

/// Reads `numel` elements of `dtype` at `addr`; `None` when the host has no
/// memory for the copy (an error to raise, not an abort).
///
/// # Safety
/// `addr` must point to `numel` initialized, aligned elements of `dtype` that
/// stay alive and unchanged during the call.
pub unsafe fn read(addr: usize, numel: usize, dtype: DType) -> Option<HostData> {
    unsafe fn copy<T: Copy>(addr: usize, numel: usize) -> Option<Vec<T>> {
        let mut v = Vec::new();
        v.try_reserve_exact(numel).ok()?;
        if numel > 0 {
            v.extend_from_slice(std::slice::from_raw_parts(addr as *const T, numel));
        }
        Some(v)
    }
    Some(match dtype {
        DType::F32 => HostData::F32(copy::<f32>(addr, numel)?),
        DType::BF16 => HostData::BF16(copy::<bf16>(addr, numel)?),
        DType::F16 => HostData::F16(copy::<f16>(addr, numel)?),
        DType::I32 => HostData::I32(copy::<i32>(addr, numel)?),
        DType::I64 => HostData::I64(copy::<i64>(addr, numel)?),
        // PyTorch bools are bytes holding 0 or 1; read them as bytes so any
        // other value cannot make an invalid Rust `bool`.
        DType::Bool => {
            let bytes = copy::<u8>(addr, numel)?;
            let mut flags = Vec::new();
            flags.try_reserve_exact(numel).ok()?;
            flags.extend(bytes.into_iter().map(|b| b != 0));
            HostData::Bool(flags)
        }
    })
}

/// The error of a copy the host has no memory for, worded as the C++
/// allocator's.
pub fn out_of_memory(numel: usize, dtype: DType) -> PyErr {
    PyRuntimeError::new_err(format!(
        "tpu: out of host memory allocating {} bytes",
        numel.saturating_mul(dtype.size_in_bytes())
    ))
}

/// Writes `data` to `addr`, which holds `nbytes` bytes.
///
/// # Safety
/// `addr` must point to `nbytes` writable bytes, aligned for the dtype of
/// `data`, that nothing else touches during the call.
pub unsafe fn write(data: &HostData, addr: usize, nbytes: usize) -> PyResult<()> {
    let (src, need) = data.bytes();
    if need != nbytes {
        return Err(PyValueError::new_err(format!(
            "copy to host: destination holds {nbytes} bytes, the value needs {need}"
        )));
    }
    if need > 0 {
        std::ptr::copy_nonoverlapping(src, addr as *mut u8, need);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_then_write_round_trips_every_dtype() {
        let cases = [
            HostData::F32(vec![1.5, -2.0, 3.25]),
            HostData::BF16(vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)]),
            HostData::F16(vec![f16::from_f32(0.25)]),
            HostData::I32(vec![7, -8]),
            HostData::I64(vec![1 << 40, -3]),
            HostData::Bool(vec![true, false, true]),
        ];
        for data in cases {
            let dtype = data.dtype();
            let mut memory = vec![0u64; 8];
            let nbytes = data.len() * dtype.size_in_bytes();
            let addr = memory.as_mut_ptr() as usize;
            unsafe { write(&data, addr, nbytes).unwrap() };
            let back = unsafe { read(addr, data.len(), dtype) };
            assert_eq!(back, Some(data), "{dtype:?}");
        }
    }

    #[test]
    fn write_rejects_a_wrong_byte_length() {
        let mut memory = [0u8; 16];
        let err = unsafe { write(&HostData::F32(vec![1.0; 3]), memory.as_mut_ptr() as usize, 16) };
        assert!(err.is_err());
    }

    #[test]
    fn bytes_other_than_zero_and_one_read_as_true() {
        let memory = [0u8, 1, 2, 255];
        assert_eq!(
            unsafe { read(memory.as_ptr() as usize, 4, DType::Bool) },
            Some(HostData::Bool(vec![false, true, true, true]))
        );
    }

    #[test]
    fn a_copy_the_host_cannot_hold_is_none_not_an_abort() {
        // The reservation fails before anything is read.
        let memory = [0f32; 1];
        assert_eq!(unsafe { read(memory.as_ptr() as usize, usize::MAX / 2, DType::F32) }, None);
    }
}
