// A few-line binding over FlashInfer's own SM90 FP4 weight-interleave kernel
// (moe_gemm_mixed_utils.cu from the installed flashinfer package), so the real kernel can
// run without JIT-compiling FlashInfer's whole fused_moe_90 module. It walks the experts
// exactly as FlashInfer's interleave_moe_weights_for_sm90_mixed_gemm binding does.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include "moe_gemm_mixed_utils.h"

torch::Tensor interleave_fp4(torch::Tensor weight) {
  TORCH_CHECK(weight.is_cuda(), "weight must be on CUDA");
  TORCH_CHECK(weight.scalar_type() == torch::kUInt8, "weight must be uint8");
  TORCH_CHECK(weight.dim() == 3 && weight.is_contiguous(), "weight must be contiguous [E, N, K/2]");
  const int64_t experts = weight.size(0), n = weight.size(1), k = weight.size(2) * 2;
  TORCH_CHECK(n % 16 == 0 && k % 64 == 0, "need N % 16 == 0 and K % 64 == 0");
  auto out = torch::empty_like(weight);
  auto stream = at::cuda::getCurrentCUDAStream();
  const int64_t per_expert = n * (k / 2);
  for (int64_t e = 0; e < experts; ++e) {
    tensorrt_llm::kernels::cutlass_kernels::interleave_fp4_weights_for_sm90_mixed_gemm(
        weight.data_ptr<uint8_t>() + e * per_expert, out.data_ptr<uint8_t>() + e * per_expert,
        static_cast<int>(n), static_cast<int>(k), stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("interleave_fp4", &interleave_fp4); }
