"""A small, exact MXFP4 / NVFP4 quantizer and dequantizer, and a reference MoE forward.

Used to build deterministic checkpoints and to check numerics end to end: quantize bf16
weights into the checkpoint format, run the MoE layer from the checkpoint layout, convert
with a spec, decode the kernel layout back through the generated inverse and run it again.

Formats:

* E2M1 (FP4): magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign; two per byte, element
  ``2j`` in the low nibble.
* MXFP4: blocks of 32 along K, an E8M0 scale byte ``e`` per block with value ``2^(e - 127)``;
  the shared exponent is ``floor(log2(amax)) - 2`` (OCP MX: E2M1's largest exponent is 2).
* NVFP4: blocks of 16, an E4M3 scale per block times one fp32 global scale per tensor:
  ``global = amax / (6 * 448)``, ``block = e4m3(amax_block / 6 / global)``.
"""

from __future__ import annotations

import torch

E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _to_e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 code (ties to the even code) of each element, sign in bit 3."""
    mag = x.abs().clamp(max=6.0)
    # distances to the 8 magnitudes; ties resolved towards the even code (like round-to-nearest-even)
    d = (mag.unsqueeze(-1) - E2M1_VALUES.to(x.device)).abs()
    d = d + torch.arange(8, device=x.device) % 2 * 1e-6
    code = d.argmin(-1).to(torch.uint8)
    return code | ((x < 0) & (code != 0)).to(torch.uint8) << 3


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[.., K] codes -> [.., K/2] bytes, element 2j in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    low, high = packed & 0xF, packed >> 4
    return torch.stack([low, high], dim=-1).flatten(-2)


def fp4_values(codes: torch.Tensor) -> torch.Tensor:
    mag = E2M1_VALUES.to(codes.device)[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[.., R, K] float -> (fp4x2 uint8 [.., R, K/2], E8M0 uint8 [.., R, K/32])."""
    *lead, rows, k = w.shape
    blocks = w.float().reshape(*lead, rows, k // 32, 32)
    amax = blocks.abs().amax(-1).clamp(min=2.0 ** -126)
    exp = torch.floor(torch.log2(amax)) - 2
    exp = exp.clamp(-127, 127)
    scale = torch.pow(2.0, exp)
    codes = _to_e2m1_codes(blocks / scale.unsqueeze(-1)).reshape(*lead, rows, k)
    return pack_fp4(codes), (exp + 127).to(torch.uint8)


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    values = fp4_values(unpack_fp4(packed))
    *lead, rows, k = values.shape
    scale = torch.pow(2.0, scales.float() - 127)
    return (values.reshape(*lead, rows, k // 32, 32) * scale.unsqueeze(-1)).reshape(*lead, rows, k)


def quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[E, R, K] float -> (fp4x2 [E, R, K/2], e4m3 [E, R, K/16], fp32 global scale [E])."""
    e, rows, k = w.shape
    blocks = w.float().reshape(e, rows, k // 16, 16)
    global_scale = (w.float().abs().amax(dim=(1, 2)) / (6.0 * 448.0)).clamp(min=1e-12)
    block_scale = (blocks.abs().amax(-1) / 6.0 / global_scale.view(e, 1, 1)).to(torch.float8_e4m3fn)
    denom = block_scale.float() * global_scale.view(e, 1, 1)
    codes = _to_e2m1_codes(blocks / torch.where(denom > 0, denom, 1.0).unsqueeze(-1)).reshape(e, rows, k)
    return pack_fp4(codes), block_scale, global_scale


def dequantize_nvfp4(packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    values = fp4_values(unpack_fp4(packed))
    e, rows, k = values.shape
    blocks = values.reshape(e, rows, k // 16, 16) * scales.float().unsqueeze(-1)
    return blocks.reshape(e, rows, k) * global_scale.view(e, 1, 1)


def moe_forward(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor, activation: str = "silu", b13: torch.Tensor | None = None,
                b2: torch.Tensor | None = None) -> torch.Tensor:
    """Reference MoE layer in float32 from dequantized weights in the checkpoint layout.

    ``w13`` is ``[E, 2I, H]`` = ``[w1; w3]`` = ``[gate; up]`` for gated activations (SwiGLU:
    ``silu(gate) * up``) or ``[E, I, H]`` for ReLU2 (``relu(x w1^T)^2``); ``w2`` is ``[E, H, I]``."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32)
    xf = x.float()
    for slot in range(topk_ids.shape[1]):
        for e in topk_ids[:, slot].unique().tolist():
            rows = (topk_ids[:, slot] == e).nonzero().flatten()
            h = xf[rows] @ w13[e].float().T
            if b13 is not None:
                h = h + b13[e].float()
            if activation == "relu2":
                a = torch.relu(h) ** 2
            else:
                gate, up = h.chunk(2, dim=-1)
                a = torch.nn.functional.silu(gate) * up
            y = a @ w2[e].float().T
            if b2 is not None:
                y = y + b2[e].float()
            out[rows] += topk_weights[rows, slot].unsqueeze(-1) * y
    return out


def routing(tokens: int, experts: int, topk: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=g)
    weights, ids = torch.softmax(logits, -1).topk(topk, dim=-1)
    return ids, weights / weights.sum(-1, keepdim=True)
