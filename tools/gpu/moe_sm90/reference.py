"""The gpt-oss MoE layer in float32 from vLLM checkpoint tensors, and the error measures.

The reference decodes the *checkpoint* tensors (not the converted ones) with layoutc.reference.quant, so a
wrong conversion cannot leak into it. The activation is FlashInfer's SwigluBias
(``SwigluBiasAdaptor`` in data/csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh),
which is what ``cutlass_fused_moe(swiglu_alpha=, swiglu_beta=, swiglu_limit=)`` selects::

    gate = min(gate, limit);  up = clamp(up, -limit, limit)
    out  = gate * sigmoid(alpha * gate) * (up + beta)

gpt-oss (and vLLM's gemm1_alpha/beta/clamp_limit) use alpha = 1.702, beta = 1.0, limit = 7.0: beta
is the ``+ 1`` of gpt-oss's ``(x_linear + 1)``. layoutc.reference.quant.moe_forward has plain SiLU only, so
this variant lives here instead of changing it.
"""

from __future__ import annotations

import torch

from layoutc.reference.quant import dequantize_mxfp4

GPT_OSS = {"alpha": 1.702, "beta": 1.0, "limit": 7.0}

#: bf16 tolerance: torch.testing's bf16 rtol, plus the same fraction of the output's RMS as an
#: absolute term (outputs near zero are sums of larger terms, each rounded to bf16 by the kernel:
#: GEMM1 output, activation output, GEMM2 output).
RTOL = 1.6e-2
ATOL_RMS = 1.6e-2


def swiglu_bias(gate: torch.Tensor, up: torch.Tensor, alpha: float, beta: float, limit: float) -> torch.Tensor:
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(alpha * gate) * (up + beta)


def moe_forward_gptoss(x: torch.Tensor, ckpt: dict, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                       alpha: float = GPT_OSS["alpha"], beta: float = GPT_OSS["beta"],
                       limit: float = GPT_OSS["limit"]) -> torch.Tensor:
    """float32 [T, H] on the CPU. ``ckpt`` holds vLLM's tensors: ``w13_weight`` fp4x2 u8[E, 2I, H/2]
    with rows [w1; w3] = [gate; up], ``w13_weight_scale`` u8[E, 2I, H/32], ``w13_bias`` f32[E, 2I],
    ``w2_weight`` u8[E, H, I/2], ``w2_weight_scale`` u8[E, H, I/32], ``w2_bias`` f32[E, H].
    Experts are decoded one at a time (a 32-expert 2944-wide layer is 2 GiB in float32)."""
    c = {k: v.cpu() for k, v in ckpt.items()}
    xf = x.float().cpu()
    ids, weights = topk_ids.cpu(), topk_weights.float().cpu()
    out = torch.zeros(xf.shape[0], c["w2_weight"].shape[1], dtype=torch.float32)
    for e in ids.unique().tolist():
        rows, slots = (ids == e).nonzero(as_tuple=True)  # a token picks an expert at most once
        w13 = dequantize_mxfp4(c["w13_weight"][e], c["w13_weight_scale"][e])
        w2 = dequantize_mxfp4(c["w2_weight"][e], c["w2_weight_scale"][e])
        h = xf[rows] @ w13.T + c["w13_bias"][e].float()
        gate, up = h.chunk(2, dim=-1)
        y = swiglu_bias(gate, up, alpha, beta, limit) @ w2.T + c["w2_bias"][e].float()
        out.index_add_(0, rows, weights[rows, slots].unsqueeze(-1) * y)
    return out


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Error of a kernel output against the float32 reference. ``frac_outside_tol``: elements with
    |out - ref| > RTOL * |ref| + ATOL_RMS * rms(ref)."""
    o, r = out.float().cpu(), ref.float().cpu()
    d = (o - r).abs()
    rms = r.pow(2).mean().sqrt()
    tol = RTOL * r.abs() + ATOL_RMS * rms
    return {
        "max_abs_err": d.max().item(),
        "max_rel_err": (d.max() / r.abs().max()).item(),  # relative to the largest output
        "mean_rel_err": (d.mean() / r.abs().mean()).item(),  # mean |error| / mean |output|
        "median_elementwise_rel_err": (d / r.abs().clamp(min=1e-30)).median().item(),
        "frac_outside_tol": (d > tol).float().mean().item(),
        "ref_rms": rms.item(),
        "finite": bool(torch.isfinite(o).all()),
    }
