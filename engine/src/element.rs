//! Rust element types that convert to and from host data.

use half::{bf16, f16};
use runtime::HostData;
use trace_ir::DType;

/// A Rust type that can fill a tensor and be read back from one.
pub trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn into_host(v: Vec<Self>) -> HostData;
    /// Reads host data of any dtype, converting as a cast would.
    fn from_host(d: HostData) -> Vec<Self>;
}

macro_rules! element {
    ($t:ty, $variant:ident, $from_f64:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn into_host(v: Vec<Self>) -> HostData {
                HostData::$variant(v)
            }
            fn from_host(d: HostData) -> Vec<Self> {
                match d {
                    HostData::$variant(v) => v,
                    other => other.to_f64_vec().into_iter().map($from_f64).collect(),
                }
            }
        }
    };
}

element!(f32, F32, |x| x as f32);
element!(bf16, BF16, bf16::from_f64);
element!(f16, F16, f16::from_f64);
element!(i32, I32, |x| x as i32);
element!(i64, I64, |x| x as i64);
element!(bool, Bool, |x| x != 0.0);
