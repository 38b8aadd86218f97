"""Reference for vLLM's CUTLASS W4A8 MoE layout (specs/vllm_cutlass_w4a8.lyt): plain torch, written from
vLLM's and CUTLASS's public source, with the signature ``layoutc equiv`` calls: ``fn(tensors, params=None)``.

Sources (our own code; the facts carry over):

* github.com/vllm-project/vllm vllm/model_executor/layers/fused_moe/oracle/w4a8.py
  ``convert_to_w4a8_moe_kernel_format`` and quantization/compressed_tensors/schemes/
  compressed_tensors_w4a8_fp8_moe.py ``process_weights_after_loading``, csrc/quantization/cutlass_w4a8/
  w4a8_grouped_mm_entry.cu ``encode_and_reorder_int4b`` @ 63f99b0d02338b5964e5a8bd30b7a713fede0b3d,
  w4a8_utils.cu ``unified_encode_int4b`` @ 1ff8af1469016f3f36a7fc2f2835e480c9ec1b2e, w4a8_mm_entry.cu
  ``pack_scale_fp8`` @ 5d1ee758d8febcd3990415ba712111e9229b7e8a, quantization/utils/quant_utils.py
  ``convert_packed_uint4b8_to_signed_int4_inplace`` and ``convert_bf16_scales_to_fp8``.
* CUTLASS tools/util/include/cutlass/util/mixed_dtype_utils.hpp: ``compute_memory_reordering_atom``,
  ``reorder_tensor``, ``packed_scale_t``. The reorder's offsets and packed_scale_t's bytes, printed by
  CUTLASS itself on the host, are tests/goldens/w4a8_reorder.txt (tools/goldens/w4a8_reorder.sh); the
  tests compare the functions here with them.

The reorder is restated the way ``reorder_tensor`` does it: every int4 value (n, k) of an expert is copied,
on its own, to the offset the reordered layout gives (:func:`reorder_offsets`), not by moving groups of
values; the spec moves 16-bit runs, so the two are different routes to the same layout.

Nothing here uses layoutc's compiler: the oracle must not share code with what it checks.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

Tensors = Mapping[str, torch.Tensor]

#: unified_encode_int4b: nibbles 1..7 -> 8 - v; 0 and 8..15 kept (w4a8_utils.cu, map_nib).
UNIFIED = tuple(v if v == 0 or v & 8 else 8 - v for v in range(16))


def nibbles(w: torch.Tensor) -> torch.Tensor:
    """i32[..., K/8] -> the int4 values as int64 [..., K] (value 8w+q in bits 4q of word w)."""
    shifts = torch.arange(0, 32, 4, device=w.device)
    return ((w.to(torch.int64).unsqueeze(-1) >> shifts) & 0xF).flatten(-2)


def pack(v: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`nibbles`: int64 [..., K] in 0..15 -> i32[..., K/8]."""
    shifts = torch.arange(0, 32, 4, device=v.device)
    words = (v.unflatten(-1, (-1, 8)) << shifts).sum(-1)
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def uint4b8_to_signed(w: torch.Tensor) -> torch.Tensor:
    """convert_packed_uint4b8_to_signed_int4_inplace, out of place: each nibble u -> (u - 8) & 15."""
    return pack((nibbles(w) - 8) & 0xF)


def unified_encode(w: torch.Tensor) -> torch.Tensor:
    """unified_encode_int4b on packed words."""
    return pack(torch.tensor(UNIFIED, dtype=torch.int64, device=w.device)[nibbles(w)])


def reorder_offsets(n: int, k: int) -> torch.Tensor:
    """int64 [n, k]: the int4 offset cutlass::reorder_tensor writes value (row, col) of one expert to, for
    tile_to_shape(compute_memory_reordering_atom<float_e4m3_t>(), (n, k)). The atom is 16 rows x 32 values
    (the SM90 GMMA A fragment of one warp, 16 x 32 bytes of E4M3, read back in thread-value order: each
    thread's 4 consecutive K values of rows r and r + 8 side by side); atoms are laid out column-major
    (all atoms along N before the next 32 K values)."""
    if n % 16 or k % 32:
        raise ValueError(f"the reorder atom tiles 16 x 32 int4 values; got N={n}, K={k}")
    row = torch.arange(n).view(n, 1)
    col = torch.arange(k).view(1, k)
    tn, h, r = row // 16, (row % 16) // 8, row % 8
    tk, a, b, c = col // 32, (col % 32) // 16, (col % 16) // 4, col % 4
    atom = 64 * r + 16 * b + 8 * a + 4 * h + c
    return 512 * (tn + (n // 16) * tk) + atom


def reorder(w: torch.Tensor) -> torch.Tensor:
    """cutlass::reorder_tensor on i32[E, N, K/8] per expert, value by value."""
    e, n, kw = w.shape
    v = nibbles(w).reshape(e, n * kw * 8)
    dst = reorder_offsets(n, 8 * kw).reshape(-1).to(w.device)
    out = torch.empty_like(v)
    out[:, dst] = v
    return pack(out.reshape(e, n, 8 * kw))


def encode_and_reorder_int4b_grouped(w: torch.Tensor) -> torch.Tensor:
    """cutlass_encode_and_reorder_int4b_grouped's weight result (its second result, the CuTe layout
    object, is metadata of the shape). vLLM checks K % 256 and N % 16."""
    _, n, kw = w.shape
    if (8 * kw) % 256 or n % 16:
        raise ValueError(f"logical K must be a multiple of 256 and N of 16; got N={n}, K={8 * kw}")
    return reorder(unified_encode(w))


def packed_scale(s: torch.Tensor) -> torch.Tensor:
    """cutlass_pack_scale_fp8 / CUTLASS packed_scale_t<float_e4m3_t, int4b_t>: for each E4M3 scale the 8 E4M3
    values s * -8, s * -7, .., s * -1 (float products rounded to E4M3, saturating at +-448; a NaN scale gives
    CUTLASS's NaN byte 0x7F eight times), flattened as vLLM returns them ([numel * 8])."""
    mult = torch.arange(-8, 0, dtype=torch.float32, device=s.device)
    prod = s.float().reshape(-1, 1) * mult
    q = prod.to(torch.float8_e4m3fn).view(torch.uint8)
    q = torch.where(prod.isnan(), torch.full_like(q, 0x7F), q)
    return q.view(torch.float8_e4m3fn).reshape(-1)


def convert_bf16_scales_to_fp8(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's convert_bf16_scales_to_fp8 with QuantFP8(static=False, group_shape=PER_TOKEN): each row's
    scales quantised to E4M3 with a per-row scale (amax / 448, as QuantFP8's native path computes it), the
    E4M3 values divided by 8, the row scale times 8. A value computation outside the spec (the spec takes
    its first result)."""
    flat = scales.reshape(-1, scales.shape[-1]).float()
    fmax = torch.finfo(torch.float8_e4m3fn).max
    amax = flat.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    chan = amax / fmax
    q = (flat / chan).clamp(-fmax, fmax).to(torch.float8_e4m3fn)
    q = (q.float() / 8.0).to(torch.float8_e4m3fn)
    return q.reshape(scales.shape), (chan * 8.0).reshape(*scales.shape[:-1], 1)


def _shard_halves(t: torch.Tensor, dim: int, rank: int, ranks: int) -> torch.Tensor:
    """FusedMoE's w13 loading: rank's slice of each of the two halves (w1, w3) along dim."""
    if ranks == 1:
        return t
    half = t.shape[dim] // 2
    per = half // ranks
    return torch.cat([t.narrow(dim, rank * per, per), t.narrow(dim, half + rank * per, per)], dim=dim)


def _shard(t: torch.Tensor, dim: int, rank: int, ranks: int) -> torch.Tensor:
    per = t.shape[dim] // ranks
    return t.narrow(dim, rank * per, per)


def vllm_cutlass_w4a8(tensors: Tensors, params: Optional[Mapping[str, Any]] = None) -> dict[str, torch.Tensor]:
    """vLLM's convert_to_w4a8_moe_kernel_format for the CUTLASS backend, the layout part: the weights
    through convert_packed_uint4b8_to_signed_int4_inplace and cutlass_encode_and_reorder_int4b_grouped,
    the FP8 group scales (convert_bf16_scales_to_fp8's first result) transposed to [E, K/128, N] as
    cutlass_pack_scale_fp8 takes them. Inputs are left as they are."""
    p = dict(params or {})
    ranks, rank = int(p.get("tp_size", 1)), int(p.get("tp_rank", 0))
    w13 = _shard_halves(tensors["w13_weight_packed"], 1, rank, ranks)
    s13 = _shard_halves(tensors["w13_weight_scale"], 1, rank, ranks)
    w2 = _shard(tensors["w2_weight_packed"], 2, rank, ranks)
    s2 = _shard(tensors["w2_weight_scale"], 2, rank, ranks)
    return {
        "w13_weight_packed": encode_and_reorder_int4b_grouped(uint4b8_to_signed(w13)),
        "w2_weight_packed": encode_and_reorder_int4b_grouped(uint4b8_to_signed(w2)),
        "w13_weight_scale": s13.permute(0, 2, 1).contiguous(),
        "w2_weight_scale": s2.permute(0, 2, 1).contiguous(),
    }
