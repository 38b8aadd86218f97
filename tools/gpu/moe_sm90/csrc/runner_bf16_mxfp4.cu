// layoutc's trimmed SM90 fused-MoE build: the one MoE runner the MXFP4-weight x BF16-activation
// path constructs. FlashInfer's fused_moe/cutlass_backend/cutlass_fused_moe_instantiation.cu
// instantiates about twenty runners (every activation/weight/output combination); the binding's
// FusedMoeRunner constructor picks CutlassMoeFCRunner<__nv_bfloat16, Fp4Type> when
// isWFP4A16Quant() (bf16 activations, uint8-packed FP4 weights, use_w4_group_scaling), so that is
// the only one compiled here. The others stay declared by the binding and are resolved to a trap
// at link time (see build.py, trap_unreachable).
#include "fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh"
#include "moe_kernels.h"

namespace tensorrt_llm::kernels::cutlass_kernels {
template class CutlassMoeFCRunner<__nv_bfloat16, Fp4Type>;
INSTANTIATE_FINALIZE_MOE_ROUTING(__nv_bfloat16, __nv_bfloat16, __nv_bfloat16);
}  // namespace tensorrt_llm::kernels::cutlass_kernels
