"""The conversions engines write by hand today, as the oracle for layoutc's specs.

Each function is the op sequence of one vLLM branch (see README.md beside this file
for the sources), calling FlashInfer's own helpers. Helpers that exist only as
CUDA kernels are passed in, so the same recipe runs on the GPU with the real
kernels (tools/gpu/record_goldens.py records the results) and on the CPU with
whatever CPU-capable helpers a test has (FlashInfer's pure-torch ones).

Nothing here uses layoutc's compiler: the oracle must not share code with what it checks.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

Tensors = Mapping[str, torch.Tensor]


def swap_w13(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """vLLM's w1/w3 reorder: [w1; w3] -> [w3; w1] along the row axis."""
    w1, w3 = torch.chunk(x, 2, dim=dim)
    return torch.cat([w3, w1], dim=dim)


def _biases_to_bf16(t: Tensors, out: dict, swap: bool) -> None:
    if t.get("w13_bias") is not None:
        b = t["w13_bias"].to(torch.float32)
        out["w13_bias"] = (swap_w13(b) if swap else b).to(torch.bfloat16)
    if t.get("w2_bias") is not None:
        out["w2_bias"] = t["w2_bias"].to(torch.bfloat16)


def cutlass_sm90_mxfp4_bf16(t: Tensors, interleave_weights: Callable[[torch.Tensor], torch.Tensor]) -> dict:
    """MXFP4 -> FlashInfer CUTLASS SM90 mixed GEMM (BF16 activations), contiguous [w1; w3] checkpoint.

    interleave_weights: FlashInfer's interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4") kernel.
    """
    from flashinfer.fused_moe import interleave_moe_scales_for_sm90_mixed_gemm

    out = {
        "w13_weight": interleave_weights(swap_w13(t["w13_weight"]).contiguous()),
        "w2_weight": interleave_weights(t["w2_weight"].contiguous()),
        "w13_weight_scale": interleave_moe_scales_for_sm90_mixed_gemm(swap_w13(t["w13_weight_scale"]).to(torch.uint8)),
        "w2_weight_scale": interleave_moe_scales_for_sm90_mixed_gemm(t["w2_weight_scale"].to(torch.uint8)),
    }
    _biases_to_bf16(t, out, swap=True)
    return out


def cutlass_mxfp4_mxfp8(t: Tensors, block_scale_interleave: Callable[[torch.Tensor], torch.Tensor]) -> dict:
    """MXFP4 weights, MXFP8 activations -> FlashInfer CUTLASS: swap, scales 128x4-interleaved,
    reshaped back to their own shape (valid when no padding is needed)."""
    s13 = swap_w13(t["w13_weight_scale"])
    s2 = t["w2_weight_scale"]
    out = {
        "w13_weight": swap_w13(t["w13_weight"]),
        "w2_weight": t["w2_weight"].clone(),
        "w13_weight_scale": block_scale_interleave(s13.view(torch.uint8)).reshape(s13.shape),
        "w2_weight_scale": block_scale_interleave(s2.view(torch.uint8)).reshape(s2.shape),
    }
    _biases_to_bf16(t, out, swap=True)
    return out


def swizzle_to_padded(block_scale_interleave, s: torch.Tensor) -> torch.Tensor:
    """FlashInfer's flat 128x4-swizzled scales as [E, round_up(R, 128), round_up(C, 4)] (vLLM's shape)."""
    e, r, c = s.shape
    flat = block_scale_interleave(s.contiguous().view(torch.uint8))
    return flat.reshape(e, -(-r // 128) * 128, -(-c // 4) * 4).view(s.dtype)


def cutedsl_nvfp4(t: Tensors, block_scale_interleave, gated: bool) -> dict:
    """NVFP4 -> FlashInfer CuTeDSL MoE. Gated: [w1; w3] -> [w3; w1], then the 64-row up/gate
    interleave of weight and scale (FlashInfer interleave_cute_dsl_moe_weights). Non-gated (ReLU2):
    neither. Both: 128x4 swizzle of the w13 and w2 scales."""
    from flashinfer.fused_moe import interleave_cute_dsl_moe_weights

    w13, s13 = t["w13_weight"], t["w13_weight_scale"]
    if gated:
        w13, s13 = interleave_cute_dsl_moe_weights(swap_w13(w13), swap_w13(s13))
    return {
        "w13_weight": w13.contiguous(),
        "w2_weight": t["w2_weight"].clone(),
        "w13_weight_scale": swizzle_to_padded(block_scale_interleave, s13),
        "w2_weight_scale": swizzle_to_padded(block_scale_interleave, t["w2_weight_scale"]),
    }


def swizzle_blockscale_cpu(s: torch.Tensor) -> torch.Tensor:
    """vLLM's pure-torch swizzle_blockscale (nvfp4_utils): pad rows to 128 and columns to 4 with
    zeros, tile (R/128, 4, 32, C/4, 4) and store (R/128, C/4, 32, 4, 4). An independent CPU
    restatement used to cross-check the recorded block_scale_interleave goldens."""
    e, r, c = s.shape
    rp, cp = -(-r // 128) * 128, -(-c // 4) * 4
    padded = torch.zeros(e, rp, cp, dtype=s.dtype)
    padded[:, :r, :c] = s
    tiles = padded.reshape(e, rp // 128, 4, 32, cp // 4, 4).permute(0, 1, 4, 3, 2, 5)
    return tiles.reshape(e, rp, cp)
