//! The trace IR of deferfuse.
//!
//! - [`DType`] and PyTorch's promotion ([`result_type`]);
//! - [`Shape`] and broadcasting ([`shape`] module);
//! - the primitive op set ([`Op`]) and its inference rules ([`infer()`]);
//! - the trace DAG ([`Trace`]), its structural [`Signature`], and its
//!   versioned JSON form ([`Trace::to_json`], [`Trace::from_json`]);
//! - numeric constants every crate must agree on ([`consts`]: GELU's).

pub mod canonical;
pub mod consts;
pub mod dtype;
pub mod error;
pub mod generate;
pub mod infer;
mod json;
pub mod literal;
pub mod op;
pub mod shape;
pub mod signature;
pub mod trace;

pub use dtype::{result_type, Category, DType, Operand};
pub use error::{Error, IndexErrorClass, IndexOutOfBounds, NonFinite, Result};
pub use infer::{infer, reduced_shape, Meta};
pub use json::TRACE_FORMAT_VERSION;
pub use op::{ArgReduceOp, Axes, BinaryOp, Distribution, Op, ReduceOp, UnaryOp};
pub use shape::Shape;
pub use signature::{ShapeClass, Signature};
pub use trace::{Node, NodeId, Trace};
