"""The reference recipes as plain conversion functions, one per shipped spec, on CPU.

Each takes the checkpoint tensors (a dict named as the spec's inputs) and the spec's parameters, and
returns the converted tensors -- the signature ``layoutc equiv`` and ``layoutc infer`` call::

    layoutc equiv specs/flashinfer_trtllm_nvfp4.lyt -D activation=relu2 \\
        --against layoutc.reference.cpu:flashinfer_trtllm_nvfp4

The CUDA-only FlashInfer kernels the recipes call are their CPU ports (kernels_cpu.py, checked
against goldens recorded from the real kernels); FlashInfer's pure-torch helpers are FlashInfer's
own. Nothing here uses layoutc's compiler.
"""

from __future__ import annotations

from typing import Any, Mapping

from . import ANCHORS, kernels_cpu

KERNELS = {"sm90_interleave_fp4": kernels_cpu.sm90_interleave_fp4,
           "block_scale_interleave": kernels_cpu.block_scale_interleave}


def _run(name: str, tensors: Mapping, params: Mapping[str, Any] | None) -> dict:
    return ANCHORS[name](dict(tensors), dict(params or {}), KERNELS)


def flashinfer_cutlass_bf16(tensors, params=None):
    """MXFP4 -> CUTLASS SM90 mixed GEMM (vLLM's standard MXFP4 converter)."""
    return _run("flashinfer_cutlass_bf16", tensors, params)


def flashinfer_cutlass_mxfp8(tensors, params=None):
    """MXFP4 weights, MXFP8 activations -> CUTLASS (SM100)."""
    return _run("flashinfer_cutlass_mxfp8", tensors, params)


def flashinfer_cutedsl_nvfp4(tensors, params=None):
    """NVFP4 -> CuTeDSL MoE (``activation``: silu gated, relu2 not)."""
    return _run("flashinfer_cutedsl_nvfp4", tensors, params)


def flashinfer_trtllm_mxfp4(tensors, params=None):
    """gpt-oss MXFP4 -> TRT-LLM-gen MoE (``pad_to``, ``pad_hidden``)."""
    return _run("flashinfer_trtllm_mxfp4", tensors, params)


def flashinfer_cutlass_mxfp4_padded(tensors, params=None):
    """MXFP4 -> CUTLASS SM90 with I and H padded to 128 (``checkpoint``: contiguous or gpt_oss)."""
    return _run("flashinfer_cutlass_mxfp4_padded", tensors, params)


def flashinfer_trtllm_nvfp4(tensors, params=None):
    """NVFP4 -> TRT-LLM-gen MoE (``activation``, ``pad_hidden``)."""
    return _run("flashinfer_trtllm_nvfp4", tensors, params)


def flashinfer_cutlass_nvfp4(tensors, params=None):
    """NVFP4 -> CUTLASS MoE with I padded per half (``activation``, ``pad_to``)."""
    return _run("flashinfer_cutlass_nvfp4", tensors, params)


def flashinfer_trtllm_fp8_block(tensors, params=None):
    """DeepSeek FP8 with 128x128 block scales -> TRT-LLM-gen MoE."""
    return _run("flashinfer_trtllm_fp8_block", tensors, params)


def flashinfer_trtllm_bf16(tensors, params=None):
    """BF16 -> TRT-LLM-gen MoE, block-major K (``activation``, ``pad_to``)."""
    return _run("flashinfer_trtllm_bf16", tensors, params)


# The backends beyond FlashInfer (issue 24): references written from the engines' source (engines.py).
from .engines import aiter_fp8_block, aiter_mxfp4, deepgemm_fp8_block, triton_kernels_mxfp4_blackwell, triton_kernels_mxfp4_hopper, vllm_cutlass_nvfp4
# Marlin (issue 24): references written from vLLM's source (marlin.py), already pure torch.
from .marlin import marlin_gptq_int4, marlin_mxfp4, marlin_nvfp4  # noqa: E402,F401
# vLLM's CUTLASS W4A8 (issue 24): written from vLLM's and CUTLASS's source (w4a8.py).
from .w4a8 import vllm_cutlass_w4a8  # noqa: E402,F401

#: spec name -> function
RECIPES = {name: globals()[name] for name in ANCHORS}
