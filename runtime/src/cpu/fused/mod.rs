//! Fused kernels of the native CPU backend: [`loops`] runs a
//! [`rewrite_rules::program::LoopKernel`] tile by tile ([`tile`]) with
//! vectorizable approximations of the transcendentals ([`math`]) and
//! converting loads and rounding stores ([`io`]); [`gemm`] runs matrix
//! products over strided operand views with an epilogue loop.

pub(crate) mod bf16_gemm;
pub(crate) mod gemm;
pub(crate) mod io;
pub(crate) mod loops;
pub mod math;
pub(crate) mod norm;
pub(crate) mod softmax;
pub(crate) mod tile;

pub(crate) use gemm::MatMulExec;
pub(crate) use loops::LoopExec;
pub(crate) use tile::Isa;
