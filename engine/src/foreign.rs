//! Tensors crossing contexts. The PyTorch binding keeps one context per mode
//! and each thread picks its own, so a value made in one mode is read by ops
//! of another: ops with several tensor operands (binary ops, `where_cond`,
//! `cat`, `matmul`) import an operand of another context with
//! [`Tensor::to_context`] instead of refusing it.

use trace_ir::Result;

use crate::context::Context;
use crate::tensor::{Cell, Tensor, TensorInner};

impl Context {
    /// True when both handles are the same engine instance.
    pub fn same_as(&self, other: &Context) -> bool {
        std::sync::Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl Tensor {
    /// This value as a tensor of `ctx`. It is the same tensor when it already
    /// belongs there; otherwise it is materialized and, when both contexts run
    /// on the same kind of backend, its buffer is shared without a copy (host
    /// buffers are plain memory); other backends go through the host.
    pub fn to_context(&self, ctx: &Context) -> Result<Tensor> {
        if std::sync::Arc::ptr_eq(&self.0.ctx, &ctx.shared) {
            return Ok(self.clone());
        }
        let buffer = self.0.ctx.materialize(&self.0)?;
        if self.0.ctx.backend.name() == ctx.shared.backend.name() && ctx.backend_name() == "cpu" {
            let inner =
                TensorInner::new(ctx.shared.clone(), self.0.meta.clone(), Cell::Ready(buffer));
            return Ok(Tensor(inner));
        }
        let data = self.0.ctx.backend.download(&buffer)?;
        ctx.tensor_from_host(self.0.meta.clone(), data)
    }
}
