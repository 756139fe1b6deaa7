//! The one error type of deferfuse. Every message names what failed (the op,
//! the variable, the file) and the values involved, so a user can act on it.

use crate::{DType, Shape};

/// Result alias used across deferfuse.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error deferfuse can return. It is `Clone` because an error produced
/// on the Strict stream is stored in each tensor it poisons.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Shapes that the op cannot accept.
    #[error("{op}: {msg} (shapes {})", fmt_shapes(shapes))]
    Shape { op: String, msg: String, shapes: Vec<Shape> },

    /// Dtypes that the op cannot accept.
    #[error("{op}: {msg} (dtypes {})", fmt_dtypes(dtypes))]
    DType { op: String, msg: String, dtypes: Vec<DType> },

    /// A bad attribute: an axis out of range, a negative step, a bad permutation.
    #[error("{op}: {msg}")]
    Attribute { op: String, msg: String },

    /// Host data whose length does not match the shape it was given.
    #[error("{op}: {len} values cannot fill shape {shape:?} ({numel} elements)")]
    DataLength { op: String, len: usize, shape: Vec<usize>, numel: usize },

    /// An environment variable or configuration value that is not valid.
    #[error("{var}={value:?} is not valid; valid values: {valid}")]
    Config { var: String, value: String, valid: String },

    /// A trace (from JSON, a dump or a fuzz corpus) that is malformed or inconsistent.
    #[error("invalid trace: {0}")]
    InvalidTrace(String),

    /// Debug mode found a NaN or an infinity in an op's output.
    #[error("{0}")]
    NonFinite(Box<NonFinite>),

    /// A backend failed while compiling or running a program.
    #[error("backend {backend}: {msg}")]
    Backend { backend: String, msg: String },

    /// An invariant of deferfuse itself did not hold: a bug, not a problem
    /// with the caller's input or the backend.
    #[error("internal error in {component}: {msg}; this is a bug in deferfuse, please report it")]
    Internal { component: &'static str, msg: String },

    /// An indexing op was given an index outside the indexed dimension. In
    /// Strict and DeferAndFuse this is found after the op ran, at the next
    /// read of a value or `sync()`, so it names the op and where it was called.
    #[error("{0}")]
    IndexOutOfBounds(Box<IndexOutOfBounds>),

    /// A value was read whose computation never ran, because `op`, which it
    /// depends on, failed earlier with `cause`. A chain of dependent values
    /// all name the first failure once ([`Error::poisoned_by`]).
    #[error("not computed: it depends on {op}, which failed earlier: {cause}")]
    Poisoned { op: String, cause: Box<Error> },

    /// An I/O failure (cache files, dumps).
    #[error("{context}: {msg}")]
    Io { context: String, msg: String },
}

/// Where Debug mode found a NaN or an infinity ([`Error::NonFinite`]).
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{op}: output has {kind} at flat index {index} (input shapes {}, output shape {out_shape:?})",
    fmt_shapes(in_shapes)
)]
pub struct NonFinite {
    pub op: String,
    pub kind: &'static str,
    pub index: usize,
    pub in_shapes: Vec<Shape>,
    pub out_shape: Vec<usize>,
}

/// Which exception PyTorch raises for an out-of-range index: some kernels
/// throw c10's `IndexError` (Python's `IndexError`), others a plain
/// `c10::Error` (Python's `RuntimeError`). Callers that map errors to
/// exceptions read it from [`IndexOutOfBounds::class`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexErrorClass {
    IndexError,
    RuntimeError,
}

/// An out-of-range index ([`Error::IndexOutOfBounds`]).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message} ({op}{})", fmt_site(site))]
pub struct IndexOutOfBounds {
    /// The op that was given the index, as the caller named it.
    pub op: String,
    /// PyTorch's own words for this error.
    pub message: String,
    pub class: IndexErrorClass,
    /// Where the op was called (`file:line`), empty when unknown.
    pub site: String,
}

fn fmt_site(site: &str) -> String {
    if site.is_empty() {
        String::new()
    } else {
        format!(" at {site}")
    }
}

impl Error {
    pub fn shape(op: &str, msg: impl Into<String>, shapes: &[&Shape]) -> Self {
        Error::Shape {
            op: op.into(),
            msg: msg.into(),
            shapes: shapes.iter().map(|s| (*s).clone()).collect(),
        }
    }
    pub fn dtype(op: &str, msg: impl Into<String>, dtypes: &[DType]) -> Self {
        Error::DType { op: op.into(), msg: msg.into(), dtypes: dtypes.to_vec() }
    }
    pub fn attr(op: &str, msg: impl Into<String>) -> Self {
        Error::Attribute { op: op.into(), msg: msg.into() }
    }
    pub fn backend(backend: &str, msg: impl Into<String>) -> Self {
        Error::Backend { backend: backend.into(), msg: msg.into() }
    }
    /// A broken invariant of `component` ([`Error::Internal`]).
    pub fn internal(component: &'static str, msg: impl Into<String>) -> Self {
        Error::Internal { component, msg: msg.into() }
    }
    pub fn io(context: impl Into<String>, err: impl std::fmt::Display) -> Self {
        Error::Io { context: context.into(), msg: err.to_string() }
    }
    /// The error of a value that needed the output of `op`, which failed with
    /// `cause`. When `cause` is itself such an error it is returned as it
    /// is, so a long chain of ops after one failure says which op failed
    /// once, instead of repeating "failed earlier" once per op.
    pub fn poisoned_by(op: impl Into<String>, cause: Error) -> Self {
        match cause {
            Error::Poisoned { .. } => cause,
            cause => Error::Poisoned { op: op.into(), cause: Box::new(cause) },
        }
    }
}

fn fmt_shapes(shapes: &[Shape]) -> String {
    let parts: Vec<String> = shapes.iter().map(|s| format!("{:?}", s.as_slice())).collect();
    parts.join(", ")
}

fn fmt_dtypes(dtypes: &[DType]) -> String {
    let parts: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
    parts.join(", ")
}
