"""CPU ports of FlashInfer's CUDA-only layout kernels, written from their CUDA source.

They let the reference recipes run on CPU for any shape. Each port is itself checked
against the goldens recorded from the real kernels (tests/reference/test_reference_ports.py),
and shares no code with layoutc.
"""

from __future__ import annotations

import torch

# interleave_fp4_weights_for_sm90_mixed_gemm_kernel (moe_gemm_mixed_utils.cu): the kernel's
# (mask, shift) list, shift > 0 meaning "<<" and < 0 meaning ">>", applied to the raw word.
SM90_FP4_MASK_SHIFTS = (
    (0x00000080, 24), (0x00000070, 18), (0x00000008, 12), (0x00000007, 6),
    (0x00008000, 13), (0x00007000, 7), (0x00000800, 1), (0x00000700, -5),
    (0x00800000, 2), (0x00700000, -4), (0x00080000, -10), (0x00070000, -16),
    (0x80000000, -1), (0x10000000, 1), (0x60000000, -3), (0x08000000, -13),
    (0x01000000, -11), (0x06000000, -15),
)


def sm90_interleave_fp4(weight: torch.Tensor) -> torch.Tensor:
    """Port of the kernel's thread loop, vectorised over (expert, block_id, partition_id, lane_id)."""
    e, rows, kbytes = weight.shape
    cols = kbytes * 2
    w = weight.reshape(e, -1).to(torch.int64)
    out = torch.zeros_like(w)
    block = torch.arange(rows // 2).view(-1, 1, 1)
    part = torch.arange(cols // 64).view(1, -1, 1)
    lane = torch.arange(16).view(1, 1, -1)
    row_id = block // 8 * 16 + block % 8
    mma_id = lane // 4
    dst_row_id = row_id + (mma_id % 2) * 8
    interleaved_lane_id = lane // 8 * 16 + (lane % 4) * 4
    col_id = part * 32 + mma_id * 8 + lane % 4
    dst_col_id = part * 32 + interleaved_lane_id
    first = (row_id * cols // 2 + col_id).reshape(-1)
    second = ((row_id + 8) * cols // 2 + col_id).reshape(-1)
    # index_select / index_copy_ rather than w[:, idx]: the same gather, much faster on CPU builds of torch
    pick = lambda idx: w.index_select(1, idx)  # noqa: E731
    raw = pick(first) | (pick(second) << 8) | (pick(first + 4) << 16) | (pick(second + 4) << 24)
    word = torch.zeros_like(raw)
    for mask, shift in SM90_FP4_MASK_SHIFTS:
        word |= ((raw & mask) << shift) if shift > 0 else ((raw & mask) >> -shift)
    dst = (dst_row_id * cols // 2 + dst_col_id).reshape(-1)
    for byte in range(4):
        out.index_copy_(1, dst + byte, (word >> (8 * byte)) & 0xFF)
    return out.to(torch.uint8).reshape(weight.shape)


def block_scale_interleave(sf: torch.Tensor) -> torch.Tensor:
    """block_scale_interleave: flat buffer of the 128x4-swizzled, zero-padded scales, per expert.

    Restated from the swizzled-layout offset of the scale-factor kernels: element (m, k) of an
    expert goes to ((m // 128) * (Kp // 4) + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4.
    """
    x = sf if sf.dim() == 3 else sf.unsqueeze(0)
    e, m, k = x.shape
    mp, kp = -(-m // 128) * 128, -(-k // 4) * 4
    flat = torch.zeros(e, mp * kp, dtype=x.dtype)
    rows = torch.arange(m).view(-1, 1)
    cols = torch.arange(k).view(1, -1)
    offset = ((rows // 128) * (kp // 4) + cols // 4) * 512 + (rows % 32) * 16 + ((rows % 128) // 32) * 4 + cols % 4
    flat[:, offset.reshape(-1)] = x.reshape(e, -1)
    return flat.reshape(-1)
