// Autocast for `tpu`: `torch.autocast("tpu", dtype=torch.bfloat16 | torch.float16)`.
//
// The policy is PyTorch's own, the one CUDA's autocast uses, from the op
// lists that ATen/autocast_mode.h shares with out-of-tree backends:
// - lower precision: the matmul family, convolutions, attention
//   (AT_FORALL_LOWER_PRECISION_FP), in the autocast dtype;
// - fp32: exp/log/pow and friends, norms, losses, softmax-like reductions
//   (AT_FORALL_FP32, and AT_FORALL_FP32_SET_OPT_DTYPE, which run in fp32
//   unless the caller gave a dtype);
// - promote: ops with several float inputs run in the widest of them
//   (AT_FORALL_PROMOTE).
// Every other op falls through to the device's kernels unchanged. Casts of
// weights (leaf tensors that require grad) are cached for the autocast
// region, as on CUDA. docs/amp.md writes the policy out.

#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

// The shared signature list (AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE) names these unqualified.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

#define TPU_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TPU_LOWER_PRECISION)
  AT_FORALL_FP32(TPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TPU_PROMOTE)
}

}  // namespace
