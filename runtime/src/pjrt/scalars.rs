//! Device scalars shared by every upload of the same value: a Rust scalar
//! in an op (`x.mul(0.125)`) is a parameter of the trace, uploaded at each
//! call, and a training loop passes the same few values every step.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use trace_ir::{DType, Meta, Result};

use super::api::{Client, DeviceBuffer};
use super::compiler::{bump, Counters};
use crate::buffer::DeviceData;
use crate::host_data::HostData;

/// The most scalars a [`ScalarCache`] keeps (it starts over when full).
const MAX_SCALARS: usize = 1024;

/// A device scalar from a [`ScalarCache`]. Shared buffers are never
/// donated: other tensors may hold the same one.
#[derive(Debug)]
pub(super) struct SharedScalar(Arc<DeviceBuffer>);

impl DeviceData for SharedScalar {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The PJRT buffer behind device storage, and whether it is shared.
pub(super) fn device_buffer(d: &dyn DeviceData) -> Option<(&DeviceBuffer, bool)> {
    let any = d.as_any();
    any.downcast_ref::<DeviceBuffer>()
        .map(|b| (b, false))
        .or_else(|| any.downcast_ref::<SharedScalar>().map(|s| (&*s.0, true)))
}

/// The bits of a one-element value, as a cache key.
fn scalar_bits(data: &HostData) -> Option<u64> {
    Some(match data {
        HostData::Bool(v) => u64::from(*v.first()?),
        HostData::I32(v) => u64::from(*v.first()? as u32),
        HostData::I64(v) => *v.first()? as u64,
        HostData::BF16(v) => u64::from(v.first()?.to_bits()),
        HostData::F16(v) => u64::from(v.first()?.to_bits()),
        HostData::F32(v) => u64::from(v.first()?.to_bits()),
    })
}

/// Zero-dimensional uploads by dtype and bits.
#[derive(Debug, Default)]
pub(super) struct ScalarCache {
    scalars: Mutex<HashMap<(DType, u64), Arc<DeviceBuffer>>>,
}

impl ScalarCache {
    /// The shared device copy of `data` when it is a scalar (uploaded on
    /// the first request, counted in `counters`); `None` for other data.
    pub(super) fn get(
        &self,
        client: &Arc<Client>,
        meta: &Meta,
        data: &HostData,
        counters: &Counters,
    ) -> Result<Option<SharedScalar>> {
        let (true, Some(bits)) = (meta.shape.is_empty(), scalar_bits(data)) else {
            return Ok(None);
        };
        let key = (meta.dtype, bits);
        let cached = self.scalars.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
        let shared = match cached {
            Some(b) => b,
            None => {
                let b = Arc::new(client.upload(data, &meta.shape)?);
                bump(&counters.host_to_device);
                let mut scalars = self.scalars.lock().unwrap_or_else(|p| p.into_inner());
                if scalars.len() >= MAX_SCALARS {
                    scalars.clear();
                }
                scalars.entry(key).or_insert(b).clone()
            }
        };
        Ok(Some(SharedScalar(shared)))
    }
}
