"""Deliberately wrong conversion functions, each one mistake engines have shipped, for ``layoutc equiv``.

Each is the reference recipe (layoutc/reference/recipes.py, FlashInfer's helpers on CPU) with one
change. ``layoutc equiv SPEC --against tests.equiv.wrong_recipes:NAME`` must find it, name the
differing elements and the spec line, and exit 1.
"""

from __future__ import annotations

import torch

from layoutc.reference import kernels_cpu, recipes


def _sm90_fold(s: torch.Tensor) -> torch.Tensor:
    from flashinfer.fused_moe import interleave_moe_scales_for_sm90_mixed_gemm

    return interleave_moe_scales_for_sm90_mixed_gemm(s.to(torch.uint8))


def scales_not_swapped(t: dict) -> dict:
    """flashinfer_cutlass_bf16: [w1; w3] -> [w3; w1] on the weight and bias, but not on the weight's
    scales (SGLang PR 32430, vLLM PR 40082): every w13 scale belongs to the other projection."""
    out = recipes.cutlass_sm90_mxfp4_bf16(t, kernels_cpu.sm90_interleave_fp4)
    out["w13_weight_scale"] = _sm90_fold(t["w13_weight_scale"])
    return out


def padded_at_the_end(t: dict) -> dict:
    """flashinfer_cutlass_nvfp4 (gated): w13 and its scales padded at the end of the whole tensor
    instead of at the end of each half (vLLM issue 55649): the up rows move into the gate's padding."""
    w13, s13 = recipes.swap_w13(t["w13_weight"]), recipes.swap_w13(t["w13_weight_scale"])
    w13 = recipes._pad_to(w13, 1, 128, halves=False)
    s13 = recipes._pad_to(s13.view(torch.uint8), 1, 128, halves=False).view(s13.dtype)
    w2 = recipes._pad_to(t["w2_weight"], 2, 64)
    s2 = recipes._pad_to(t["w2_weight_scale"].view(torch.uint8), 2, 8).view(t["w2_weight_scale"].dtype)
    bsi = kernels_cpu.block_scale_interleave
    return {"w13_weight": w13, "w13_weight_scale": recipes.swizzle_to_padded(bsi, s13),
            "w2_weight": w2, "w2_weight_scale": recipes.swizzle_to_padded(bsi, s2)}


def fold_with_wrong_k_block(s: torch.Tensor) -> torch.Tensor:
    """The SM90 scale fold [E, R, K/32] -> [E, R/64, K/128, 16, 16] written by hand with the K blocks
    taken the wrong way round: the 4 scale columns of a 128-element block are strided by K/128
    instead of adjacent (out[e, rb, kb, f, 4*ms + g] = in[e, 64*rb + 16*ms + f, g*(K/128) + kb])."""
    e, r, c = s.shape
    x = s.to(torch.uint8).reshape(e, r // 64, 4, 16, 4, c // 4)  # (rb, ms, f, g, kb)
    return x.permute(0, 1, 5, 3, 2, 4).reshape(e, r // 64, c // 4, 16, 16).contiguous()


def sm90_fold_wrong_k_block(t: dict) -> dict:
    """flashinfer_cutlass_bf16 with the hand-written fold above on both scales."""
    out = recipes.cutlass_sm90_mxfp4_bf16(t, kernels_cpu.sm90_interleave_fp4)
    out["w13_weight_scale"] = fold_with_wrong_k_block(recipes.swap_w13(t["w13_weight_scale"]))
    out["w2_weight_scale"] = fold_with_wrong_k_block(t["w2_weight_scale"])
    return out
