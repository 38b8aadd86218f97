"""References for the MoE backends beyond FlashInfer (issue 24): plain torch, written from the engines'
and kernel libraries' public source, one function per shipped spec, with the signature ``layoutc
equiv`` calls: ``fn(tensors, params=None) -> dict``.

Each function restates what the engine does to a layer's checkpoint tensors, step by step as the
source does it (our own code: the facts carry over, the code does not). Sources, by repository,
path and the commit read:

* triton_kernels (OpenAI, in triton-lang/triton), python/triton_kernels/triton_kernels/:
  tensor_details/layout_details/hopper_value.py @ 000df03e481fdd68099e4807feac102b9d7dd0de
  (HopperMXValueLayoutTransformation.swizzle_data, _pack_bits), hopper_scale.py @
  14dd7a191e72a5003a67311f7b3cabbf09f74ba5, blackwell_scale.py @ 00a287a7530fdc5fe89a2a01ac1de19f66aca85a
  (BlackwellMXScaleLayoutTransformation.swizzle_data, its torch path), tensor_details/layout.py @
  545699290b851e70231ee3017481851170f1583d (make_default_matmul_mxfp4_w_layout: Hopper value and
  scale layouts on SM90, strided values and the Blackwell scale layout on SM100).
  The caller: vllm-project/vllm vllm/model_executor/layers/quantization/utils/mxfp4_utils.py
  @ 01b817dbbd2ea53707c68d39b470e65990d1e6ee (_swizzle_mxfp4) and
  vllm/model_executor/layers/fused_moe/oracle/mxfp4.py @ 045335ce635d2cb8968d4a8362b0473f49b36dd3
  (TRITON_BACKENDS and AITER branches of convert_gpt_oss_weight_to_mxfp4_moe_kernel_format).
* AITER: ROCm/aiter aiter/ops/shuffle.py @ e4048607a535ace3a2b51ded31b1c8c2d45c0879
  (shuffle_weight, shuffle_scale and their a16w4 forms).
* DeepGEMM: deepseek-ai/DeepGEMM @ 54e22612409371d6364144b69086735beb54e98b (see its functions below).
* vLLM CUTLASS NVFP4: vllm-project/vllm (swizzle_blockscale; see its function below).

Nothing here uses layoutc's compiler: the oracle must not share code with what it checks.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

Tensors = Mapping[str, torch.Tensor]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _zero_pad(x: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    """Zeros after the end of ``dim`` up to a multiple of ``multiple`` (torch.nn.functional.pad's default)."""
    dim = dim % x.dim()
    extra = _round_up(x.shape[dim], multiple) - x.shape[dim]
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, torch.zeros(shape, dtype=x.dtype, device=x.device)], dim=dim)


def _gpt_oss_tp(t: Tensors, params: Mapping[str, Any]) -> dict:
    """vLLM's gpt-oss MXFP4 loader under tensor parallelism (even splits): rank r of n keeps one
    block of w13's interleaved rows (weight, scale, bias: its gate and up rows, still interleaved)
    and K block r of w2 and its scales; w2_bias whole."""
    rank, ranks = params.get("tp_rank", 0), params.get("tp_size", 1)
    out = dict(t)
    for k in ("w13_weight", "w13_weight_scale", "w13_bias"):
        if out.get(k) is not None:
            out[k] = torch.chunk(out[k], ranks, dim=1)[rank]
    for k in ("w2_weight", "w2_weight_scale"):
        out[k] = torch.chunk(out[k], ranks, dim=2)[rank]
    return out


def _u8(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8)


# ---------------------------------------------------------------------------
# triton_kernels, Hopper (SM90): HOPPER_VALUE and HOPPER_MX_SCALE


def _hopper_word(b: torch.Tensor) -> torch.Tensor:
    """hopper_value.py _pack_bits: four bytes (eight FP4 values, two per byte) -> one 32-bit word.
    Of each FP4 nibble (sign s, exponent/mantissa bits e0..e2) the first three bytes keep the
    bf16-like shape s at bit 15, e at 6..8 (low nibble; +16 for the high nibble), shifted right by
    0, 3 and 6 bits for bytes 0, 1, 2; the fourth byte fills the holes: s at 14, e0 at 13, e1 e2
    at 10 11. Returns the words' little-endian bytes in b's shape."""
    b = b.to(torch.int64)
    word = torch.zeros(b.shape[:-1], dtype=torch.int64, device=b.device)
    for nib in (0, 1):
        hi = 16 * nib
        for j, shift in ((0, 0), (1, 3), (2, 6)):
            v = (b[..., j] >> (4 * nib)) & 0xF
            word |= (((v >> 3) & 1) << (15 + hi - shift)) | ((v & 7) << (6 + hi - shift))
        v = (b[..., 3] >> (4 * nib)) & 0xF
        word |= (((v >> 3) & 1) << (14 + hi)) | ((v & 1) << (13 + hi)) | (((v >> 1) & 3) << (10 + hi))
    out = torch.stack([(word >> (8 * i)) & 0xFF for i in range(4)], dim=-1)
    return out.to(torch.uint8).reshape(*b.shape[:-2], b.shape[-2] * 4)


def hopper_mx_value(w: torch.Tensor) -> torch.Tensor:
    """HopperMXValueLayoutTransformation.swizzle_data for mx_axis = -2, mma_version 3, as vLLM
    uses it: the transformation takes the bytes transposed (.mT), i.e. the checkpoint's own
    [.., N, K/2] rows; pads N to 256 and K/2 to 64 bytes with zeros; splits N into
    (rest, warp_tile 2, threads 4, scott_trick 2) and K/2 into (rest, k_tile 4, warp_tile 2,
    threads 4) -- contig 1 both ways for mma v3 -- and stores them in the order
    [rest_n, threads_n] x [rest_k, scott_n, threads_k, k_tile_k, warp_k, warp_n]; then each run
    of four bytes becomes one bit-twiddled word. Returns the storage [.., N'/4, 4*K'/2] (the
    kernel reads its .mT view)."""
    x = _zero_pad(_zero_pad(_u8(w), -2, 256), -1, 64)
    *lead, n, kb = x.shape
    nl = len(lead)
    x = x.reshape(*lead, n // 16, 2, 4, 2, kb // 32, 4, 2, 4)
    #            nl+0   1  2  3   4      5  6  7
    order = [nl + 0, nl + 2, nl + 4, nl + 3, nl + 7, nl + 5, nl + 6, nl + 1]
    x = x.permute(*range(nl), *order).reshape(*lead, n // 4, kb * 4)
    return _hopper_word(x.reshape(*lead, n // 4, kb, 4))


def hopper_mx_scale(s: torch.Tensor, num_warps: int = 8) -> torch.Tensor:
    """HopperMXScaleLayoutTransformation.swizzle_data, mx_axis = -2: on the transposed-back scales
    [.., rows, cols] (the checkpoint's), rows padded to 2*num_warps*2*8, cols to 2 (zeros); rows
    split (m, 2, num_warps, 2, 8), cols (k, 2), stored in the order [m, warps] x [k, 2, 8, 2(col),
    2]. Returns the storage [.., rows'/32, 32*cols'] (the kernel reads its .mT view)."""
    align = 2 * num_warps * 2 * 8
    x = _zero_pad(_zero_pad(_u8(s), -2, align), -1, 2)
    *lead, r, c = x.shape
    nl = len(lead)
    x = x.reshape(*lead, r // align, 2, num_warps, 2, 8, c // 2, 2)
    order = [nl + 0, nl + 2, nl + 5, nl + 1, nl + 4, nl + 6, nl + 3]
    return x.permute(*range(nl), *order).reshape(*lead, r // 32, c * 32)


def triton_kernels_mxfp4_hopper(tensors: Tensors, params: Mapping[str, Any] | None = None) -> dict:
    """vLLM TRITON MXFP4 MoE backend on SM90, gpt-oss checkpoint: I rounded up to ``pad_to`` (64;
    the parameters are allocated zero-filled and the checkpoint copied into their top-left corner),
    w13 rows kept interleaved, biases fp32, each weight through HOPPER_VALUE and each scale
    through HOPPER_MX_SCALE (num_warps 8)."""
    p = dict(params or {})
    pad_to = p.get("pad_to", 64)
    t = _gpt_oss_tp(tensors, p)
    out = {
        "w13_weight": hopper_mx_value(_zero_pad(t["w13_weight"], 1, 2 * pad_to)),
        "w13_weight_scale": hopper_mx_scale(_zero_pad(t["w13_weight_scale"], 1, 2 * pad_to)),
        "w2_weight": hopper_mx_value(_zero_pad(t["w2_weight"], 2, pad_to // 2)),
        "w2_weight_scale": hopper_mx_scale(_zero_pad(t["w2_weight_scale"], 2, pad_to // 32)),
    }
    if t.get("w13_bias") is not None:
        out["w13_bias"] = _zero_pad(t["w13_bias"].to(torch.float32), 1, 2 * pad_to)
    if t.get("w2_bias") is not None:
        out["w2_bias"] = t["w2_bias"].to(torch.float32)
    return out


def _gpt_oss_mxfp4_padded(t: Tensors, pad_i: int, pad_h: int = 1) -> dict:
    """vLLM's padded MXFP4 parameters for a gpt-oss checkpoint: I rounded up to ``pad_i`` and H to
    ``pad_h``, allocated zero-filled, the checkpoint copied into the top-left corner (w13 rows stay
    interleaved, so the padding is whole zero gate/up pairs at the end)."""
    out = {
        "w13_weight": _zero_pad(_zero_pad(t["w13_weight"], 1, 2 * pad_i), 2, max(pad_h // 2, 1)),
        "w13_weight_scale": _zero_pad(_zero_pad(t["w13_weight_scale"], 1, 2 * pad_i), 2, max(pad_h // 32, 1)),
        "w2_weight": _zero_pad(_zero_pad(t["w2_weight"], 2, pad_i // 2), 1, pad_h),
        "w2_weight_scale": _zero_pad(_zero_pad(t["w2_weight_scale"], 2, pad_i // 32), 1, pad_h),
    }
    if t.get("w13_bias") is not None:
        out["w13_bias"] = _zero_pad(t["w13_bias"].to(torch.float32), 1, 2 * pad_i)
    if t.get("w2_bias") is not None:
        out["w2_bias"] = _zero_pad(t["w2_bias"].to(torch.float32), 1, pad_h)
    return out


def blackwell_mx_scale(s: torch.Tensor) -> torch.Tensor:
    """BlackwellMXScaleLayoutTransformation.swizzle_data (torch path) on the scales transposed back
    to the checkpoint's [E, N, K/32]: N padded to 128, K/32 to 8 (zeros); rows (N/128, 4, 32),
    columns (K/128, 4), stored (N/128, K/128, 32, 4, 4); the experts' row tiles in one axis:
    [1, E*N'/128, K'/4, 2, 256]."""
    x = _zero_pad(_zero_pad(_u8(s), -2, 128), -1, 8)
    e, n, k = x.shape
    x = x.reshape(e, n // 128, 4, 32, k // 4, 4).transpose(2, 4).contiguous()
    return x.reshape(1, e * n // 128, k // 4, 2, 256)


def triton_kernels_mxfp4_blackwell(tensors: Tensors, params: Mapping[str, Any] | None = None) -> dict:
    """vLLM TRITON MXFP4 MoE backend on SM100, gpt-oss checkpoint: I rounded up to ``pad_to`` (64),
    values as they are (a strided view), each scale through BLACKWELL_SCALE, biases fp32."""
    p = dict(params or {})
    t = _gpt_oss_mxfp4_padded(_gpt_oss_tp(tensors, p), p.get("pad_to", 64))
    t["w13_weight_scale"] = blackwell_mx_scale(t["w13_weight_scale"])
    t["w2_weight_scale"] = blackwell_mx_scale(t["w2_weight_scale"])
    return t


# ---------------------------------------------------------------------------
# AITER (ROCm): shuffle_weight / shuffle_scale, a16w4 forms (is_guinterleave=True)


def aiter_shuffle_weight_a16w4(w: torch.Tensor, gate_up: bool, n_lane: int = 16) -> torch.Tensor:
    """shuffle_weight(w, layout=(n_lane, 16), is_guinterleave=True, gate_up): [E, N, K/2] bytes,
    N = ([2 halves when gate_up,] N0, n_lane), K/2 = (K0, 64/n_lane lanes, 16 bytes); stored
    (N0, [half,] K0, k lanes, n lanes, 16). Same shape as the input."""
    x = _u8(w)
    e, n, kb = x.shape
    k_lane = 64 // n_lane
    if gate_up:
        y = x.reshape(e, 2, n // 2 // n_lane, n_lane, kb // (16 * k_lane), k_lane, 16)
        y = y.permute(0, 2, 1, 4, 5, 3, 6)
    else:
        y = x.reshape(e, n // n_lane, n_lane, kb // (16 * k_lane), k_lane, 16).permute(0, 1, 3, 4, 2, 5)
    return y.contiguous().reshape(e, n, kb)


def aiter_shuffle_scale_a16w4(s2d: torch.Tensor, experts: int, gate_up: bool) -> torch.Tensor:
    """shuffle_scale(s, experts_cnt, is_guinterleave=True, gate_up): E8M0 [E*N, K/32], K/32 padded to
    a multiple of 8 with 0x7F (1.0); per expert N = ([halves 2 | packs 2], N/32, 16) for gate_up
    (halves outermost) or (N/32, packs 2, 16), K/32 = (K/256, 2, 4); stored (N/32, K/256, 4, 16,
    2(K), 2(N)); returned [E*N, K'/32]."""
    x = _u8(s2d)
    rows, k = x.shape
    kp = _round_up(k, 8)
    if kp != k:
        x = torch.cat([x, torch.full((rows, kp - k), 0x7F, dtype=torch.uint8, device=x.device)], dim=1)
    n = rows // experts
    if gate_up:
        y = x.reshape(experts, 2, n // 32, 16, kp // 8, 2, 4).permute(0, 2, 4, 6, 3, 5, 1)
    else:
        y = x.reshape(experts, n // 32, 2, 16, kp // 8, 2, 4).permute(0, 1, 4, 6, 3, 5, 2)
    return y.contiguous().reshape(rows, kp)


def aiter_mxfp4(tensors: Tensors, params: Mapping[str, Any] | None = None) -> dict:
    """vLLM AITER MXFP4 MoE backend (ROCm), gpt-oss checkpoint: I and H rounded up to ``pad_to`` and
    ``pad_hidden`` (256 on ROCm); w13 weight, scale and bias rows deinterleaved to [gate; up]
    (view (E, N/2, 2, ..) -> permute to (E, 2, N/2, ..)); weights through shuffle_weight_a16w4
    (16, gate_up for w13), scales through shuffle_scale_a16w4 on the [E*N, K/32] view; biases fp32."""
    p = dict(params or {})
    t = _gpt_oss_mxfp4_padded(_gpt_oss_tp(tensors, p), p.get("pad_to", 256), p.get("pad_hidden", 256))

    def deinterleave(x):
        e, n = x.shape[:2]
        return x.reshape(e, n // 2, 2, *x.shape[2:]).transpose(1, 2).reshape(x.shape)

    e = t["w13_weight"].shape[0]
    s13, s2 = deinterleave(t["w13_weight_scale"]), t["w2_weight_scale"]
    out = {
        "w13_weight": aiter_shuffle_weight_a16w4(deinterleave(t["w13_weight"]), True),
        "w13_weight_scale": aiter_shuffle_scale_a16w4(s13.reshape(-1, s13.shape[-1]), e, True),
        "w2_weight": aiter_shuffle_weight_a16w4(t["w2_weight"], False),
        "w2_weight_scale": aiter_shuffle_scale_a16w4(s2.reshape(-1, s2.shape[-1]), e, False),
    }
    if t.get("w13_bias") is not None:
        out["w13_bias"] = deinterleave(t["w13_bias"])
    if t.get("w2_bias") is not None:
        out["w2_bias"] = t["w2_bias"]
    return out


def aiter_shuffle_weight_16x16(w: torch.Tensor) -> torch.Tensor:
    """shuffle_weight(w, layout=(16, 16)) for one-byte elements: [E, N, K] viewed as
    (E, N/16, 16, K/32, 2, 16) and stored (E, N/16, K/32, 2, 16 rows, 16 bytes), same shape back."""
    x = _u8(w)
    e, n, k = x.shape
    y = x.reshape(e, n // 16, 16, k // 32, 2, 16).permute(0, 1, 3, 4, 2, 5)
    return y.contiguous().reshape(e, n, k).view(w.dtype)


def aiter_fp8_block(tensors: Tensors, params: Mapping[str, Any] | None = None) -> dict:
    """vLLM's ROCm AITER fused MoE, FP8 128x128 block weights: the rank's slice, then
    shuffle_weight(layout=(16, 16)) on both weights; block scales as they are."""
    t = deepgemm_fp8_block(tensors, params)  # the rank's slice (each half of w13), otherwise as loaded
    t["w13_weight"] = aiter_shuffle_weight_16x16(t["w13_weight"])
    t["w2_weight"] = aiter_shuffle_weight_16x16(t["w2_weight"])
    return t


# ---------------------------------------------------------------------------
# DeepGEMM (SM90) and vLLM's CUTLASS NVFP4 MoE
#
# vLLM: vllm/model_executor/layers/quantization/utils/fp8_utils.py @ 364d01925de309b50c726941ad93a2c0a2487df8
# (prepare_fp8_moe_layer_for_deepgemm, deepgemm_post_process_fp8_weight_block);
# vllm/model_executor/layers/quantization/utils/flashinfer_fp4_moe.py @ 296ce48d53e21b80311c8bea381b9dc1b09317ae
# (prepare_nvfp4_moe_layer_for_fi_or_cutlass); DeepGEMM csrc/apis/layout.hpp
# (transform_sf_into_required_layout) at the DeepGEMM commit above.


def _tp_rows(x: torch.Tensor, dim: int, rank: int, ranks: int, halves: bool) -> torch.Tensor:
    """The engine's tensor-parallel slice: rank ``rank`` of ``ranks`` contiguous blocks, of each
    half separately when ``halves`` (a merged [w1; w3] loaded shard by shard)."""
    parts = torch.chunk(x, 2, dim=dim) if halves else (x,)
    return torch.cat([torch.chunk(p, ranks, dim=dim)[rank] for p in parts], dim=dim)


def deepgemm_sm100_packed_ue8m0(sf: torch.Tensor, mn: int, gran_mn: int) -> torch.Tensor:
    """DeepGEMM transform_sf_into_required_layout, SM100 branch for fp32 scales (csrc/apis/layout.hpp),
    and get_mn_major_tma_aligned_packed_ue8m0_tensor_torch (csrc/jit_kernels/impls/smxx_layout.hpp):
    [B, mn/gran_mn, kg] fp32 -> rows broadcast (index_select(-2, arange(mn) // gran_mn)), the exponent
    byte of each (view as int32, >> 23, to uint8), zero-padded to [B, align(mn, 4), align(kg, 4)],
    four bytes per int32, transposed. Returns the storage [B, align(kg, 4)/4, align(mn, 4)]; DeepGEMM
    hands the kernel its strided view [B, mn, align(kg, 4)/4] (:func:`deepgemm_sm100_kernel_view`)."""
    if gran_mn > 1:
        sf = sf.index_select(-2, torch.arange(mn, device=sf.device) // gran_mn)
    ue8m0 = (sf.contiguous().view(torch.int32) >> 23).to(torch.uint8)
    b, rows, kg = ue8m0.shape
    padded = torch.zeros(b, _round_up(rows, 4), _round_up(kg, 4), dtype=torch.uint8, device=sf.device)
    padded[:, :rows, :kg] = ue8m0
    words = padded.view(torch.int32)  # [B, mn4, k4/4]: four K groups per little-endian word
    return words.transpose(1, 2).contiguous()


def deepgemm_sm100_kernel_view(storage: torch.Tensor, mn: int) -> torch.Tensor:
    """What DeepGEMM returns: the [B, mn, k4/4] view (strides (k4/4 * mn4, 1, mn4)) of the storage."""
    return storage.transpose(1, 2)[:, :mn]


def deepgemm_fp8_block(tensors: Tensors, params: Mapping[str, Any] | None = None) -> dict:
    """vLLM DEEPGEMM MoE: the rank's slice of each tensor, then DeepGEMM's
    transform_sf_into_required_layout(ws, mn, k, recipe=(1, 128, 128), is_sfa=False) on each scale
    (vLLM deepgemm_post_process_fp8_weight_block). On SM90 (``arch=sm90``) it returns fp32 (128, 128)
    weight scales untransformed; on SM100 (``arch=sm100``) it broadcasts them to every row and packs
    them as UE8M0 (:func:`deepgemm_sm100_packed_ue8m0`, gran_mn 128). vLLM's E8M0 re-quantisation before
    it (requant_weight_ue8m0_inplace, a value change) is taken as done: the inputs are its output."""
    p = dict(params or {})
    rank, ranks = p.get("tp_rank", 0), p.get("tp_size", 1)
    t = dict(tensors)
    out = {
        "w13_weight": _tp_rows(t["w13_weight"], 1, rank, ranks, True).contiguous(),
        "w13_weight_scale": _tp_rows(t["w13_weight_scale"], 1, rank, ranks, True).contiguous(),
        "w2_weight": _tp_rows(t["w2_weight"], 2, rank, ranks, False).contiguous(),
        "w2_weight_scale": _tp_rows(t["w2_weight_scale"], 2, rank, ranks, False).contiguous(),
    }
    if p.get("arch", "sm90") == "sm100":
        for w, s in (("w13_weight", "w13_weight_scale"), ("w2_weight", "w2_weight_scale")):
            out[s] = deepgemm_sm100_packed_ue8m0(out[s], out[w].shape[1], 128)
    return out


def swizzle_blockscale(s: torch.Tensor) -> torch.Tensor:
    """vLLM swizzle_blockscale: [E, R, C] scales zero-padded to R % 128 and C % 4, each 128x4 tile
    (4 x 32 rows by 4 columns) stored as (32 rows, 4 row groups, 4 columns); shape [E, R', C']."""
    x = _zero_pad(_zero_pad(_u8(s), -2, 128), -1, 4)
    e, r, c = x.shape
    y = x.reshape(e, r // 128, 4, 32, c // 4, 4).permute(0, 1, 4, 3, 2, 5)
    return y.contiguous().reshape(e, r, c).view(s.dtype)


def vllm_cutlass_nvfp4(tensors: Tensors, params: Mapping[str, Any] | None = None) -> dict:
    """vLLM VLLM_CUTLASS NVFP4 MoE: the rank's slice; no w1/w3 swap; w13 scales swizzled; when the
    swizzled w13 scales have more rows than w13 (non-gated only: vLLM raises for gated), w13 gets
    zero rows to match, w2 zero K columns (pad/2 bytes) and its scales pad/16 zero columns; then
    w2's scales are swizzled."""
    p = dict(params or {})
    gated = p.get("activation", "silu") != "relu2"
    rank, ranks = p.get("tp_rank", 0), p.get("tp_size", 1)
    t = dict(tensors)
    w13 = _tp_rows(t["w13_weight"], 1, rank, ranks, gated)
    s13 = swizzle_blockscale(_tp_rows(t["w13_weight_scale"], 1, rank, ranks, gated))
    w2 = _tp_rows(t["w2_weight"], 2, rank, ranks, False)
    s2 = _tp_rows(t["w2_weight_scale"], 2, rank, ranks, False)
    extra = s13.shape[1] - w13.shape[1]
    if extra > 0:
        if gated:
            raise NotImplementedError("vLLM cannot pad a gated w13 for the VLLM_CUTLASS NVFP4 backend")
        w13 = _zero_pad(_u8(w13), 1, s13.shape[1]).view(w13.dtype)
        w2 = torch.cat([_u8(w2), torch.zeros(*w2.shape[:2], extra // 2, dtype=torch.uint8)], dim=2).view(w2.dtype)
        s2 = torch.cat([_u8(s2), torch.zeros(*s2.shape[:2], extra // 16, dtype=torch.uint8)], dim=2).view(s2.dtype)
    return {"w13_weight": w13.contiguous(), "w13_weight_scale": s13,
            "w2_weight": w2.contiguous(), "w2_weight_scale": swizzle_blockscale(s2)}
