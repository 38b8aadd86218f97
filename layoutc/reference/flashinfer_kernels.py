"""Load FlashInfer's CUDA-only layout helpers on the GPU machine, without the fused_moe_90 JIT."""

from __future__ import annotations

import os
from pathlib import Path


HERE = Path(__file__).resolve().parent


def mixed_utils_source() -> Path:
    import flashinfer

    root = Path(flashinfer.__file__).parent / "data" / "csrc" / "nv_internal" / "tensorrt_llm" / "kernels"
    return root / "cutlass_kernels" / "moe_gemm" / "moe_gemm_mixed_utils.cu"


def sm90_interleave_fp4():
    """FlashInfer's interleave_fp4_weights_for_sm90_mixed_gemm kernel, built alone (about a minute)."""
    from torch.utils.cpp_extension import load

    src = mixed_utils_source()
    module = load(
        name="layoutc_sm90_fp4_interleave",
        sources=[str(HERE / "sm90_interleave_binding.cu"), str(src)],
        extra_include_paths=[str(src.parent)],
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"],
        build_directory=os.environ.get("LAYOUTC_EXT_DIR") or None,
        verbose=False,
    )
    return module.interleave_fp4


def block_scale_interleave():
    """flashinfer.block_scale_interleave (JIT of the small fp4_quantization_90 module)."""
    from flashinfer import block_scale_interleave as fn

    return fn
