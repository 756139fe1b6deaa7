//! Loads (any dtype to f32 registers) and stores (f32 registers to the
//! output dtype, rounding once), over contiguous runs, broadcasts and strided
//! gathers. Everything here is `#[inline(always)]` so it is compiled with the
//! target features of the tile loop that calls it.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::cpu::elem::{walk, Strides};
use crate::host_data::HostData;

/// Typed input data.
#[derive(Clone, Copy)]
pub(crate) enum Data<'a> {
    F32(&'a [f32]),
    /// f32 data that the run also writes (a donated input, see
    /// `LoopExec::run`): read through a raw pointer, never borrowed for
    /// longer than one read, so the writes alias no live reference.
    F32Donated(Donated),
    BF16(&'a [bf16]),
    F16(&'a [f16]),
    Bool(&'a [bool]),
    I32(&'a [i32]),
    I64(&'a [i64]),
}

/// A donated f32 buffer: `len` elements at `ptr`.
#[derive(Clone, Copy)]
pub(crate) struct Donated {
    pub ptr: *mut f32,
    pub len: usize,
}

// SAFETY: tiles read and write disjoint ranges of a donated buffer (a tile
// reads the elements it then overwrites, before it writes them), and the
// buffer outlives the parallel loop.
unsafe impl Send for Donated {}
unsafe impl Sync for Donated {}

impl<'a> Data<'a> {
    pub(crate) fn of(d: &'a HostData) -> Data<'a> {
        match d {
            HostData::F32(v) => Data::F32(v),
            HostData::BF16(v) => Data::BF16(v),
            HostData::F16(v) => Data::F16(v),
            HostData::Bool(v) => Data::Bool(v),
            HostData::I32(v) => Data::I32(v),
            HostData::I64(v) => Data::I64(v),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F32Donated(d) => d.len,
            Data::BF16(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::Bool(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::I64(v) => v.len(),
        }
    }

    /// One element as f32.
    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> f32 {
        match self {
            Data::F32(v) => v[i],
            Data::F32Donated(d) => {
                assert!(i < d.len);
                // SAFETY: in bounds; see `Donated`.
                unsafe { d.ptr.add(i).read() }
            }
            Data::BF16(v) => bf16_to_f32(v[i]),
            Data::F16(v) => v[i].to_f32(),
            Data::Bool(v) => v[i] as u8 as f32,
            Data::I32(v) => v[i] as f32,
            Data::I64(v) => v[i] as f32,
        }
    }

    /// `out[t] = self[offset + t]`.
    #[inline(always)]
    pub(crate) fn read_run(&self, offset: usize, out: &mut [f32]) {
        let n = out.len();
        if n == 0 {
            return; // a view of an empty buffer may start past its end
        }
        match self {
            Data::F32(v) => out.copy_from_slice(&v[offset..offset + n]),
            Data::F32Donated(d) => {
                assert!(offset + n <= d.len);
                // SAFETY: in bounds; `out` is scratch, never the donated buffer.
                unsafe { std::ptr::copy_nonoverlapping(d.ptr.add(offset), out.as_mut_ptr(), n) }
            }
            Data::BF16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[offset..offset + n]) {
                    *o = bf16_to_f32(b);
                }
            }
            Data::F16(v) => v[offset..offset + n].convert_to_f32_slice(out),
            Data::Bool(v) => {
                for (o, &b) in out.iter_mut().zip(&v[offset..offset + n]) {
                    *o = b as u8 as f32;
                }
            }
            Data::I32(v) => {
                for (o, &b) in out.iter_mut().zip(&v[offset..offset + n]) {
                    *o = b as f32;
                }
            }
            Data::I64(v) => {
                for (o, &b) in out.iter_mut().zip(&v[offset..offset + n]) {
                    *o = b as f32;
                }
            }
        }
    }

    /// `out[t] = self[offset + t * stride]`.
    #[inline(always)]
    pub(crate) fn gather(&self, offset: usize, stride: usize, out: &mut [f32]) {
        if out.is_empty() {
            return; // as in `read_run`
        }
        match (stride, self) {
            (0, _) => out.fill(self.get(offset)),
            (1, _) => self.read_run(offset, out),
            // One match per run, not per element, and no bounds check inside
            // (a transposed or sliced view reads whole rows like this).
            (_, Data::F32(v)) => strided(v, offset, stride, out, |x| x),
            (_, Data::BF16(v)) => strided(v, offset, stride, out, bf16_to_f32),
            (_, Data::F16(v)) => strided(v, offset, stride, out, f16::to_f32),
            _ => {
                for (t, o) in out.iter_mut().enumerate() {
                    *o = self.get(offset + t * stride);
                }
            }
        }
    }
}

/// `out[t] = widen(v[offset + t * stride])`; `out` is not empty.
#[inline(always)]
fn strided<T: Copy>(
    v: &[T],
    offset: usize,
    stride: usize,
    out: &mut [f32],
    widen: impl Fn(T) -> f32,
) {
    let last = offset + (out.len() - 1) * stride;
    for (o, &x) in out.iter_mut().zip(v[offset..=last].iter().step_by(stride)) {
        *o = widen(x);
    }
}

#[inline(always)]
pub(crate) fn bf16_to_f32(b: bf16) -> f32 {
    f32::from_bits((b.to_bits() as u32) << 16)
}

/// Round to nearest even, NaN kept quiet: what `bf16::from_f32` does.
#[inline(always)]
pub(crate) fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    if nan {
        ((b >> 16) | 0x0040) as u16
    } else {
        (rounded >> 16) as u16
    }
}

/// `x` rounded to bf16 and widened back.
#[inline(always)]
pub(crate) fn round_bf16(x: f32) -> f32 {
    f32::from_bits((f32_to_bf16_bits(x) as u32) << 16)
}

/// How a load reads a kernel input over the iteration space.
#[derive(Clone)]
pub(crate) enum Access {
    /// Element `i` of the space is element `offset + i` of the data.
    Contig { offset: usize },
    /// Broadcast/strided: element strides over the walked shape.
    Strided { strides: Strides, offset: usize },
}

impl Access {
    /// Fills `out` with the elements `start..start + out.len()` of `shape`.
    #[inline(always)]
    pub(crate) fn read(&self, data: &Data<'_>, shape: &[usize], start: usize, out: &mut [f32]) {
        match self {
            Access::Contig { offset } => data.read_run(offset + start, out),
            Access::Strided { strides, offset } => {
                let inner = strides.last().copied().unwrap_or(0);
                walk(shape, [strides], start, out.len(), |k, [o], run| {
                    data.gather(offset + o, inner, &mut out[k..k + run]);
                });
            }
        }
    }
}

/// An output buffer being written by the tiles of one kernel run. Tiles
/// write disjoint ranges, so the raw pointer is shared across threads.
#[derive(Clone, Copy)]
pub(crate) enum Dst {
    F32(*mut f32),
    BF16(*mut u16),
    F16(*mut f16),
    Bool(*mut bool),
}

// SAFETY: every tile writes a disjoint range of the buffer, and the buffer
// outlives the parallel loop.
unsafe impl Send for Dst {}
unsafe impl Sync for Dst {}

impl Dst {
    /// Writes `src` (rounded to the dtype) at `pos..pos + src.len()`.
    ///
    /// # Safety
    /// The range must be in bounds and written by no one else concurrently.
    #[inline(always)]
    pub(crate) unsafe fn write(&self, pos: usize, src: &[f32]) {
        let n = src.len();
        match *self {
            Dst::F32(p) => std::slice::from_raw_parts_mut(p.add(pos), n).copy_from_slice(src),
            Dst::BF16(p) => {
                for (o, &x) in std::slice::from_raw_parts_mut(p.add(pos), n).iter_mut().zip(src) {
                    *o = f32_to_bf16_bits(x);
                }
            }
            Dst::F16(p) => {
                std::slice::from_raw_parts_mut(p.add(pos), n).convert_from_f32_slice(src)
            }
            Dst::Bool(p) => {
                for (o, &x) in std::slice::from_raw_parts_mut(p.add(pos), n).iter_mut().zip(src) {
                    *o = x != 0.0;
                }
            }
        }
    }

    /// Elements `pos..pos + n` of an f32 output, to compute into directly.
    ///
    /// # Safety
    /// As [`Dst::write`]; and the output must be f32.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)] // tiles own disjoint ranges
    pub(crate) unsafe fn f32_run(&self, pos: usize, n: usize) -> &mut [f32] {
        match *self {
            Dst::F32(p) => std::slice::from_raw_parts_mut(p.add(pos), n),
            _ => unreachable!("only f32 outputs are computed into directly"),
        }
    }

    /// Writes `n` copies of `v` at `pos`.
    ///
    /// # Safety
    /// As [`Dst::write`].
    #[inline(always)]
    pub(crate) unsafe fn fill(&self, pos: usize, n: usize, v: f32) {
        match *self {
            Dst::F32(p) => std::slice::from_raw_parts_mut(p.add(pos), n).fill(v),
            Dst::BF16(p) => std::slice::from_raw_parts_mut(p.add(pos), n).fill(f32_to_bf16_bits(v)),
            Dst::F16(p) => std::slice::from_raw_parts_mut(p.add(pos), n).fill(f16::from_f32(v)),
            Dst::Bool(p) => std::slice::from_raw_parts_mut(p.add(pos), n).fill(v != 0.0),
        }
    }
}

/// An output of `n` elements of `dtype` (float or bool) whose every element
/// the caller overwrites, and a writer into it. A cached allocation of the
/// tracker is reused when there is one; otherwise a zeroed one is made
/// (zeroed allocations come from the OS lazily, without a pass over memory).
pub(crate) fn alloc_output(
    dtype: trace_ir::DType,
    n: usize,
    tracker: &crate::memory::MemoryTracker,
) -> Option<(HostData, Dst)> {
    use trace_ir::DType;
    let data = match tracker.reuse(dtype, n) {
        Some(d) => d,
        None => match dtype {
            DType::F32 => HostData::F32(vec![0.0f32; n]),
            DType::BF16 => HostData::BF16(zeroed_u16::<bf16>(n)),
            DType::F16 => HostData::F16(zeroed_u16::<f16>(n)),
            DType::Bool => HostData::Bool(vec![false; n]),
            DType::I32 | DType::I64 => return None,
        },
    };
    let mut data = data;
    let dst = match &mut data {
        HostData::F32(v) => Dst::F32(v.as_mut_ptr()),
        HostData::BF16(v) => Dst::BF16(v.as_mut_ptr() as *mut u16),
        HostData::F16(v) => Dst::F16(v.as_mut_ptr()),
        HostData::Bool(v) => Dst::Bool(v.as_mut_ptr()),
        _ => return None,
    };
    Some((data, dst))
}

/// A vector of a 16-bit float type, zeroed through `alloc_zeroed`.
fn zeroed_u16<T: Copy>(n: usize) -> Vec<T> {
    const { assert!(size_of::<T>() == 2 && align_of::<T>() == 2) };
    let v = std::mem::ManuallyDrop::new(vec![0u16; n]);
    let (ptr, len, cap) = (v.as_ptr() as *mut u16, v.len(), v.capacity());
    // SAFETY: bf16 and f16 are `repr(transparent)` over u16, so the layout
    // matches and the all-zero pattern is +0.0.
    unsafe { Vec::from_raw_parts(ptr as *mut T, len, cap) }
}
