//! Tensors crossing contexts. The PyTorch binding keeps one context per mode
//! and each thread picks its own, so a value made in one mode is read by ops
//! of another: ops with several tensor operands (binary ops, `where_cond`,
//! `cat`, `matmul`) import an operand of another context with
//! [`Tensor::to_context`] instead of refusing it.

use trace_ir::Result;

use crate::context::Context;
use crate::tensor::Tensor;
use crate::value::{Cell, Value};

impl Context {
    /// True when both handles are the same engine instance.
    pub fn same_as(&self, other: &Context) -> bool {
        std::sync::Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl Tensor {
    /// True when this tensor is a value of `ctx` (no import needed).
    pub fn belongs_to(&self, ctx: &Context) -> bool {
        std::sync::Arc::ptr_eq(&self.ctx, &ctx.shared)
    }

    /// This value as a tensor of `ctx`. It is the same tensor when it already
    /// belongs there; otherwise it is materialized and, when both contexts run
    /// on the same kind of backend, its buffer is shared without a copy (host
    /// buffers are plain memory); other backends go through the host.
    pub fn to_context(&self, ctx: &Context) -> Result<Tensor> {
        if std::sync::Arc::ptr_eq(&self.ctx, &ctx.shared) {
            return Ok(self.clone());
        }
        let buffer = self.ctx.materialize(&self.value)?;
        if self.ctx.backend.name() == ctx.shared.backend.name() && ctx.backend_name() == "cpu" {
            let value = Value::new(self.value.meta.clone(), Cell::Ready(buffer));
            return Ok(Tensor::new(ctx.shared.clone(), value));
        }
        let data = self.ctx.backend.download(&buffer)?;
        ctx.tensor_from_host(self.value.meta.clone(), data)
    }
}
