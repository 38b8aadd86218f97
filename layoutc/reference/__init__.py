"""The hand-written conversions layoutc replaces: vLLM-style sequences calling FlashInfer's helpers.

They are the oracle of the tests (tests/backends/test_specs.py) and the anchor of the benchmarks
(``layoutc bench``). Nothing here uses layoutc's compiler: the oracle must not share code
with what it checks. See README.md beside this file for the sources.

``ANCHORS`` maps a shipped spec name to ``(recipe, kernels it needs)``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from . import engines, marlin, recipes, w4a8

ANCHORS: dict[str, Callable[..., dict]] = {
    "flashinfer_cutlass_bf16": lambda t, params, k: recipes.cutlass_sm90_mxfp4_bf16(t, k["sm90_interleave_fp4"]),
    "flashinfer_cutlass_mxfp8": lambda t, params, k: recipes.cutlass_mxfp4_mxfp8(t, k["block_scale_interleave"]),
    "flashinfer_cutedsl_nvfp4": lambda t, params, k: recipes.cutedsl_nvfp4(
        t, k["block_scale_interleave"], params.get("activation", "silu") != "relu2"),
    "flashinfer_trtllm_mxfp4": lambda t, params, k: recipes.trtllm_mxfp4_gpt_oss(
        t, k["block_scale_interleave"], params.get("pad_to", 256), params.get("pad_hidden", 256)),
    "flashinfer_cutlass_mxfp4_padded": lambda t, params, k: recipes.cutlass_sm90_mxfp4_bf16_padded(
        t, k["sm90_interleave_fp4"], params.get("checkpoint", "contiguous") == "gpt_oss"),
    "flashinfer_trtllm_nvfp4": lambda t, params, k: recipes.trtllm_nvfp4(
        t, k["block_scale_interleave"], params.get("activation", "silu") != "relu2", params.get("pad_hidden", 256)),
    "flashinfer_cutlass_nvfp4": lambda t, params, k: recipes.cutlass_nvfp4_padded(
        t, k["block_scale_interleave"], params.get("activation", "silu") != "relu2", params.get("pad_to", 128)),
    "flashinfer_trtllm_fp8_block": lambda t, params, k: recipes.trtllm_fp8_block_scale(t),
    "flashinfer_trtllm_bf16": lambda t, params, k: recipes.trtllm_bf16(
        t, params.get("activation", "silu") != "relu2", params.get("pad_to", 128)),
    # beyond FlashInfer (issue 24): pure torch, no kernels needed
    "triton_kernels_mxfp4_hopper": lambda t, params, k: engines.triton_kernels_mxfp4_hopper(t, params),
    "triton_kernels_mxfp4_blackwell": lambda t, params, k: engines.triton_kernels_mxfp4_blackwell(t, params),
    "aiter_mxfp4": lambda t, params, k: engines.aiter_mxfp4(t, params),
    "aiter_fp8_block": lambda t, params, k: engines.aiter_fp8_block(t, params),
    "deepgemm_fp8_block": lambda t, params, k: engines.deepgemm_fp8_block(t, params),
    "vllm_cutlass_nvfp4": lambda t, params, k: engines.vllm_cutlass_nvfp4(t, params),
    # Marlin (issue 24): pure torch from vLLM's source, no kernels needed
    "marlin_gptq_int4": lambda t, params, k: marlin.marlin_gptq_int4(t, params),
    "marlin_mxfp4": lambda t, params, k: marlin.marlin_mxfp4(t, params),
    "marlin_nvfp4": lambda t, params, k: marlin.marlin_nvfp4(t, params),
    # vLLM's CUTLASS W4A8 (issue 24): pure torch from vLLM's and CUTLASS's source, checked against CUTLASS's record
    "vllm_cutlass_w4a8": lambda t, params, k: w4a8.vllm_cutlass_w4a8(t, params),
}


def kernels_for(device: str) -> tuple[dict[str, Callable[..., Any]], str]:
    """The CUDA-only FlashInfer kernels the recipes call: the real ones on CUDA (built or JIT-compiled on
    first use), the CPU ports elsewhere. Returns them and a note on where they come from."""
    if device.startswith("cuda"):
        from . import flashinfer_kernels

        return {"sm90_interleave_fp4": flashinfer_kernels.sm90_interleave_fp4(),
                "block_scale_interleave": flashinfer_kernels.block_scale_interleave()}, "FlashInfer CUDA kernels"
    from . import kernels_cpu

    return {"sm90_interleave_fp4": kernels_cpu.sm90_interleave_fp4,
            "block_scale_interleave": kernels_cpu.block_scale_interleave}, "CPU ports of FlashInfer's kernels"


def anchor(spec_name: str, tensors: Mapping, params: Mapping, kernels: Mapping) -> dict:
    return ANCHORS[spec_name](tensors, params, kernels)
