//! Shared plumbing of the CPU kernels: the element trait that maps each
//! storage type to the domain it computes in, broadcasting views, the strided
//! odometer, and the chunked parallel loop.

use half::{bf16, f16};
use rayon::prelude::*;
use smallvec::SmallVec;
use trace_ir::shape::numel;

use crate::host_data::HostData;
use crate::memory::MemoryTracker;
use std::cell::RefCell;
use std::sync::Arc;

/// Element strides of a view.
pub(crate) type Strides = SmallVec<[usize; 6]>;

/// Outputs are split into chunks of this many elements for rayon...
pub(crate) const CHUNK: usize = 32 * 1024;
/// ...once they have more elements than this.
pub(crate) const PAR_THRESHOLD: usize = 128 * 1024;

/// Row-major strides that saturate instead of overflowing: a shape with a
/// zero dimension may have a huge product of the others, and its strides are
/// never used to read.
pub(crate) fn row_major(shape: &[usize]) -> Strides {
    let mut s: Strides = SmallVec::from_elem(1, shape.len());
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

/// Strides for reading `from` broadcast to `to` (right-aligned; size-1 and
/// missing dimensions get stride 0).
pub(crate) fn broadcast(from: &[usize], to: &[usize]) -> Strides {
    let own = row_major(from);
    let offset = to.len().saturating_sub(from.len());
    (0..to.len())
        .map(|i| if i < offset || from[i - offset] == 1 { 0 } else { own[i - offset] })
        .collect()
}

/// A storage element type and the domain it computes in: f32 for the float
/// types, i64 for the integer types, bool for bool. `store` rounds (floats)
/// or wraps (`as`, integers) once.
pub(crate) trait Elem: Copy + Send + Sync + Default + 'static {
    type D: Copy + Send + Sync + PartialOrd;
    fn load(self) -> Self::D;
    fn store(d: Self::D) -> Self;
    fn wrap(v: Vec<Self>) -> HostData;
    fn unwrap_ref(d: &HostData) -> Option<&[Self]>;
    fn unwrap_vec(d: HostData) -> Option<Vec<Self>>;
    /// Whether a domain value is NaN (never, outside the float types).
    fn is_nan(_d: Self::D) -> bool {
        false
    }
}

/// The `impl Elem` of each storage type, from one template so the six stay
/// alike: `T => D, Variant`, then how a value loads into the domain (`x`
/// is the stored value) and stores back (`d` the domain value); `nan` for
/// the float types, whose domain has NaN.
macro_rules! impl_elem {
    ($($T:ty => $D:ty, $variant:ident, load($l:ident) $load:expr, store($s:ident) $store:expr
        $(, $nan:ident)?;)*) => {$(
        impl Elem for $T {
            type D = $D;
            #[inline(always)]
            fn load(self) -> $D {
                let $l = self;
                $load
            }
            #[inline(always)]
            fn store($s: $D) -> Self {
                $store
            }
            fn wrap(v: Vec<Self>) -> HostData {
                HostData::$variant(v)
            }
            fn unwrap_ref(d: &HostData) -> Option<&[Self]> {
                match d {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn unwrap_vec(d: HostData) -> Option<Vec<Self>> {
                match d {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            $(impl_elem!(@$nan);)?
        }
    )*};
    (@nan) => {
        #[inline(always)]
        fn is_nan(d: f32) -> bool {
            d.is_nan()
        }
    };
}

impl_elem! {
    f32 => f32, F32, load(x) x, store(d) d, nan;
    bf16 => f32, BF16, load(x) x.to_f32(), store(d) bf16::from_f32(d), nan;
    f16 => f32, F16, load(x) x.to_f32(), store(d) f16::from_f32(d), nan;
    // Integers compute in i64 and wrap back with `as`.
    i32 => i64, I32, load(x) x as i64, store(d) d as i32;
    i64 => i64, I64, load(x) x, store(d) d;
    bool => bool, Bool, load(x) x, store(d) d;
}

/// Instantiates a generic body per dtype: `$T` names the element type
/// (`f32`/`bf16`/`f16` in the float arm, `i32`/`i64` in the int arm).
macro_rules! by_dtype {
    ($dt:expr; float $F:ident => $f:expr; int $I:ident => $i:expr; bool => $b:expr $(;)?) => {
        match $dt {
            trace_ir::DType::F32 => {
                #[allow(dead_code)]
                type $F = f32;
                $f
            }
            trace_ir::DType::BF16 => {
                #[allow(dead_code)]
                type $F = half::bf16;
                $f
            }
            trace_ir::DType::F16 => {
                #[allow(dead_code)]
                type $F = half::f16;
                $f
            }
            trace_ir::DType::I32 => {
                #[allow(dead_code)]
                type $I = i32;
                $i
            }
            trace_ir::DType::I64 => {
                #[allow(dead_code)]
                type $I = i64;
                $i
            }
            trace_ir::DType::Bool => $b,
        }
    };
}
pub(crate) use by_dtype;

/// Instantiates a generic body for every dtype, `$T` naming the element type.
macro_rules! by_any {
    ($dt:expr, $T:ident => $body:expr) => {
        $crate::cpu::elem::by_dtype!($dt;
            float $T => $body;
            int $T => $body;
            bool => {
                #[allow(dead_code)]
                type $T = bool;
                $body
            })
    };
}
pub(crate) use by_any;

/// Typed borrowed data, with a backend error if the variant is not `T`'s.
pub(crate) fn typed<T: Elem>(d: &HostData) -> trace_ir::Result<&[T]> {
    T::unwrap_ref(d).ok_or_else(|| super::internal(format!("unexpected {} data", d.dtype())))
}

/// An operand that is either borrowed or owned (at its last use, free to be
/// overwritten in place).
pub(crate) enum Src<'a> {
    Owned(HostData),
    Borrowed(&'a HostData),
}

impl Src<'_> {
    pub(crate) fn dtype(&self) -> trace_ir::DType {
        match self {
            Src::Owned(d) => d.dtype(),
            Src::Borrowed(d) => d.dtype(),
        }
    }
}

/// [`Src`] with its element type known.
pub(crate) enum Input<'a, T> {
    Owned(Vec<T>),
    Borrowed(&'a [T]),
}

impl<'a, T: Elem> Input<'a, T> {
    pub(crate) fn new(src: Src<'a>) -> trace_ir::Result<Self> {
        match src {
            Src::Owned(d) => {
                let dt = d.dtype();
                T::unwrap_vec(d)
                    .map(Input::Owned)
                    .ok_or_else(|| super::internal(format!("unexpected {dt} data")))
            }
            Src::Borrowed(d) => typed::<T>(d).map(Input::Borrowed),
        }
    }
}

/// `f` applied to every element, in place when the input is owned.
pub(crate) fn map_same<T: Elem>(x: Input<'_, T>, f: impl Fn(T::D) -> T::D + Sync + Send) -> Vec<T> {
    match x {
        Input::Owned(mut v) => {
            for_chunks(&mut v, |_, s| {
                for e in s.iter_mut() {
                    *e = T::store(f(e.load()));
                }
            });
            v
        }
        Input::Borrowed(s) => map_new(s, |e| T::store(f(e.load()))),
    }
}

/// `f` applied to every element of `src` into a new vector.
pub(crate) fn map_new<T: Copy + Sync, O: Default + Clone + Send + 'static>(
    src: &[T],
    f: impl Fn(T) -> O + Sync + Send,
) -> Vec<O> {
    build(src.len(), |start, out| {
        for (o, &e) in out.iter_mut().zip(&src[start..]) {
            *o = f(e);
        }
    })
}

/// How an operand is read at the output's flat indices.
pub(crate) enum View<'a, T> {
    /// Same element order as the output.
    Contig(&'a [T]),
    /// One element, read everywhere.
    Scalar(T),
    /// Broadcast strides over the output shape.
    Strided(&'a [T], Strides),
}

impl<'a, T: Copy> View<'a, T> {
    /// Views `data` (of shape `from`) broadcast to `to`. `from` must broadcast
    /// to `to` and `data` must hold `numel(from)` elements.
    pub(crate) fn new(data: &'a [T], from: &[usize], to: &[usize]) -> Self {
        let n = numel(from);
        if n == 1 && !data.is_empty() {
            View::Scalar(data[0])
        } else if n == numel(to) {
            // Equal counts under broadcasting mean only 1-dims differ, so flat
            // indices coincide.
            View::Contig(data)
        } else {
            View::Strided(data, broadcast(from, to))
        }
    }

    /// Strides over the output shape, whatever the kind.
    pub(crate) fn strides(&self, to: &[usize]) -> Strides {
        match self {
            View::Contig(_) => row_major(to),
            View::Scalar(_) => SmallVec::from_elem(0, to.len()),
            View::Strided(_, s) => s.clone(),
        }
    }

    /// The data the strides index.
    pub(crate) fn data(&self) -> &[T] {
        match self {
            View::Contig(d) | View::Strided(d, _) => d,
            View::Scalar(v) => std::slice::from_ref(v),
        }
    }
}

/// Calls `f(k, offsets, run)` for runs along the innermost dimension covering
/// the output flat indices `start..start + len` of `shape`: output index
/// `start + k + t` (for `t < run`) reads operand `j` at
/// `offsets[j] + t * strides[j][rank - 1]`.
pub(crate) fn walk<const K: usize>(
    shape: &[usize],
    strides: [&[usize]; K],
    start: usize,
    len: usize,
    mut f: impl FnMut(usize, [usize; K], usize),
) {
    if len == 0 {
        return;
    }
    let rank = shape.len();
    if rank == 0 {
        f(0, [0; K], 1);
        return;
    }
    let mut idx: SmallVec<[usize; 6]> = SmallVec::from_elem(0, rank);
    let mut rem = start;
    for d in (0..rank).rev() {
        // len > 0 means every dimension is non-zero.
        idx[d] = rem % shape[d];
        rem /= shape[d];
    }
    let mut offs = [0usize; K];
    for j in 0..K {
        offs[j] = (0..rank).map(|d| idx[d] * strides[j][d]).sum();
    }
    let last = rank - 1;
    let inner = shape[last];
    let mut k = 0;
    loop {
        let run = (inner - idx[last]).min(len - k);
        f(k, offs, run);
        k += run;
        if k >= len {
            return;
        }
        // Advance to the next run: carry through the odometer.
        idx[last] += run;
        for j in 0..K {
            offs[j] += run * strides[j][last];
        }
        let mut d = last;
        while idx[d] == shape[d] && d > 0 {
            for j in 0..K {
                offs[j] -= idx[d] * strides[j][d];
            }
            idx[d] = 0;
            d -= 1;
            idx[d] += 1;
            for j in 0..K {
                offs[j] += strides[j][d];
            }
        }
    }
}

/// Runs `body(start, chunk)` over `out`, in parallel chunks of [`CHUNK`]
/// elements when `out` is large. `start` is the chunk's first flat index.
pub(crate) fn for_chunks<O: Send>(out: &mut [O], body: impl Fn(usize, &mut [O]) + Sync + Send) {
    if out.len() > PAR_THRESHOLD {
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, s)| body(c * CHUNK, s));
    } else {
        body(0, out);
    }
}

thread_local! {
    /// The tracker whose cache of freed allocations the kernels running on
    /// this thread draw their outputs from ([`with_pool`]).
    static POOL: RefCell<Option<Arc<MemoryTracker>>> = const { RefCell::new(None) };
}

/// Runs `f` (a program's kernels) with the outputs of [`build`] and
/// [`with_room`] drawn from `tracker`'s cache of freed allocations: memory
/// the last run touched, where a fresh allocation of the same size would
/// fault its pages in again.
pub(crate) fn with_pool<R>(tracker: &Arc<MemoryTracker>, f: impl FnOnce() -> R) -> R {
    let outer = POOL.with(|p| p.replace(Some(tracker.clone())));
    let r = f();
    POOL.with(|p| *p.borrow_mut() = outer);
    r
}

/// A cached allocation of exactly `n` elements of `T`, with stale values.
fn cached<T: 'static>(n: usize) -> Option<Vec<T>> {
    use std::any::{Any, TypeId};
    use trace_ir::DType;
    let t = TypeId::of::<T>();
    let dtype = [
        (TypeId::of::<f32>(), DType::F32),
        (TypeId::of::<bf16>(), DType::BF16),
        (TypeId::of::<f16>(), DType::F16),
        (TypeId::of::<i32>(), DType::I32),
        (TypeId::of::<i64>(), DType::I64),
        (TypeId::of::<bool>(), DType::Bool),
    ]
    .into_iter()
    .find_map(|(id, d)| (id == t).then_some(d))?;
    let data = POOL.with(|p| p.borrow().as_ref().and_then(|tr| tr.reuse(dtype, n)))?;
    let any: Box<dyn Any> = match data {
        HostData::F32(v) => Box::new(v),
        HostData::BF16(v) => Box::new(v),
        HostData::F16(v) => Box::new(v),
        HostData::I32(v) => Box::new(v),
        HostData::I64(v) => Box::new(v),
        HostData::Bool(v) => Box::new(v),
    };
    any.downcast::<Vec<T>>().ok().map(|v| *v)
}

/// An empty vector with room for `n` elements, from the cache when it has
/// an allocation of that size (see [`with_pool`]).
pub(crate) fn with_room<T: 'static>(n: usize) -> Vec<T> {
    match cached::<T>(n) {
        Some(mut v) => {
            v.clear();
            v
        }
        None => Vec::with_capacity(n),
    }
}

/// A new vector of `n` elements filled by `body` as in [`for_chunks`]; the
/// body writes every element (the vector may come from the cache, see
/// [`with_pool`]).
pub(crate) fn build<O: Default + Clone + Send + 'static>(
    n: usize,
    body: impl Fn(usize, &mut [O]) + Sync + Send,
) -> Vec<O> {
    let mut out = cached::<O>(n).unwrap_or_else(|| vec![O::default(); n]);
    for_chunks(&mut out, body);
    out
}
