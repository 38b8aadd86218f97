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


# ---------------------------------------------------------------------------
# More backends (issue 7). Row gathers use FlashInfer's own index helpers (pure torch);
# block_scale_interleave is passed in (a CUDA kernel; its CPU port on CPU).


def swap_every_two_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """vLLM's gpt-oss helper: flip each adjacent pair of rows, [g0, u0, g1, u1..] -> [u0, g0, u1, g1..]."""
    dim = dim % x.dim()
    pairs = x.unflatten(dim, (x.shape[dim] // 2, 2))
    return pairs.flip(dim + 1).flatten(dim, dim + 1)


def deinterleave_w13(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """gpt-oss [g0, u0, g1, u1..] -> [g; u] (vLLM: cat(x[0::2], x[1::2]))."""
    idx = torch.arange(x.shape[dim], device=x.device)
    return torch.cat([x.index_select(dim, idx[0::2]), x.index_select(dim, idx[1::2])], dim=dim)


def _per_expert(x: torch.Tensor, fn) -> torch.Tensor:
    return torch.stack([fn(x[e]) for e in range(x.shape[0])])


def _gather_rows(x2d: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return x2d[idx.to(x2d.device)].contiguous()


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _into_zeros(x: torch.Tensor, shape) -> torch.Tensor:
    """vLLM's padded parameters: allocated zero-filled at the padded shape, the (rank's) checkpoint
    tensor copied into the top-left corner (mxf4_merged_weight_loader: ``param[:, :d1, :d2].copy_``)."""
    z = torch.zeros(tuple(shape), dtype=x.dtype, device=x.device)
    z[tuple(slice(0, n) for n in x.shape)] = x
    return z


def trtllm_mxfp4_gpt_oss(t: Tensors, block_scale_interleave, pad_to: int = 256, pad_hidden: int = 256) -> dict:
    """gpt-oss MXFP4 -> FlashInfer TRT-LLM-gen MoE (vLLM's gpt-oss converter, TRT-LLM branch):
    the parameters are allocated with I rounded up to ``pad_to`` and H to ``pad_hidden``
    (mxfp4_round_up_hidden_size_and_intermediate_size: 256 and 256 for TRTLLM_BACKENDS) and the
    checkpoint copied into their top-left corner; then swap each gate/up pair of w13 rows (weight,
    scale, bias), per expert the epilogue-tile row shuffle (tile 128) of every weight and bias, the
    shuffle_matrix_sf_a rows plus 128x4 interleave of every scale; scales viewed as e4m3 in their
    own shape, biases fp32."""
    from flashinfer.fused_moe.core import get_w2_permute_indices_with_cache

    cache: dict = {}
    tile = 128
    e, rows, hb = t["w13_weight"].shape
    ip, hp = _round_up(rows // 2, pad_to), _round_up(hb * 2, pad_hidden)
    t = dict(t)
    t["w13_weight"] = _into_zeros(t["w13_weight"].view(torch.uint8), (e, 2 * ip, hp // 2))
    t["w13_weight_scale"] = _into_zeros(t["w13_weight_scale"].view(torch.uint8), (e, 2 * ip, hp // 32))
    t["w2_weight"] = _into_zeros(t["w2_weight"].view(torch.uint8), (e, hp, ip // 2))
    t["w2_weight_scale"] = _into_zeros(t["w2_weight_scale"].view(torch.uint8), (e, hp, ip // 32))
    if t.get("w13_bias") is not None:
        t["w13_bias"] = _into_zeros(t["w13_bias"], (e, 2 * ip))
    if t.get("w2_bias") is not None:
        t["w2_bias"] = _into_zeros(t["w2_bias"], (e, hp))

    def weight(w):
        return _per_expert(w.view(torch.uint8), lambda x: _gather_rows(x, get_w2_permute_indices_with_cache(cache, x, tile)))

    def scale(s):
        def one(x):
            idx = get_w2_permute_indices_with_cache(cache, x, tile, num_elts_per_sf=16)
            return block_scale_interleave(_gather_rows(x, idx)).reshape(x.shape)
        return _per_expert(s.view(torch.uint8), one).view(torch.float8_e4m3fn)

    def bias(b):
        return _per_expert(b.to(torch.float32), lambda x: _gather_rows(
            x.reshape(-1, 1), get_w2_permute_indices_with_cache(cache, x.reshape(-1, 1), tile)).reshape(-1))

    out = {
        "w13_weight": weight(swap_every_two_rows(t["w13_weight"], -2)),
        "w13_weight_scale": scale(swap_every_two_rows(t["w13_weight_scale"], -2)),
        "w2_weight": weight(t["w2_weight"]),
        "w2_weight_scale": scale(t["w2_weight_scale"]),
    }
    if t.get("w13_bias") is not None:
        out["w13_bias"] = bias(swap_every_two_rows(t["w13_bias"], -1))
    if t.get("w2_bias") is not None:
        out["w2_bias"] = bias(t["w2_bias"])
    return out


def _pad_to(x: torch.Tensor, dim: int, multiple: int, halves: bool = False) -> torch.Tensor:
    """Zero padding the way vLLM allocates padded parameters and copies the checkpoint into the
    top-left corner (of each half when ``halves``)."""
    parts = torch.chunk(x, 2, dim=dim) if halves else (x,)
    padded = []
    for p in parts:
        n = p.shape[dim]
        shape = list(p.shape)
        shape[dim] = -(-n // multiple) * multiple
        z = torch.zeros(shape, dtype=p.dtype, device=p.device)
        z.narrow(dim, 0, n).copy_(p)
        padded.append(z)
    return torch.cat(padded, dim=dim)


def cutlass_sm90_mxfp4_bf16_padded(t: Tensors, interleave_weights, gpt_oss: bool) -> dict:
    """MXFP4 -> FlashInfer CUTLASS SM90 (BF16 activations) with vLLM's padding of I and H to 128
    (per half of w13): gpt-oss checkpoints are deinterleaved first, contiguous ones are not."""
    t = dict(t)
    if gpt_oss:
        for k in ("w13_weight", "w13_weight_scale", "w13_bias"):
            if t.get(k) is not None:
                t[k] = deinterleave_w13(t[k], 1)
    p = {
        "w13_weight": _pad_to(_pad_to(t["w13_weight"], 1, 128, halves=True), 2, 64),
        "w13_weight_scale": _pad_to(_pad_to(t["w13_weight_scale"], 1, 128, halves=True), 2, 4),
        "w2_weight": _pad_to(_pad_to(t["w2_weight"], 1, 128), 2, 64),
        "w2_weight_scale": _pad_to(_pad_to(t["w2_weight_scale"], 1, 128), 2, 4),
    }
    if t.get("w13_bias") is not None:
        p["w13_bias"] = _pad_to(t["w13_bias"], 1, 128, halves=True)
    if t.get("w2_bias") is not None:
        p["w2_bias"] = _pad_to(t["w2_bias"], 1, 128)
    return cutlass_sm90_mxfp4_bf16(p, interleave_weights)


def align_trtllm_fp4_hidden(w13, s13, w2, s2, min_alignment: int = 256):
    """vLLM align_trtllm_fp4_moe_hidden_dim_for_fi: H rounded up to ``min_alignment``; zero K
    columns after w13 (bytes) and its scales, zero rows after w2 and its scales."""
    e, rows, hb = w13.shape
    hp = _round_up(hb * 2, min_alignment)
    if hp == hb * 2:
        return w13, s13, w2, s2
    return (_into_zeros(w13, (e, rows, hp // 2)), _into_zeros(s13, (e, rows, hp // 16)),
            _into_zeros(w2, (e, hp, w2.shape[2])), _into_zeros(s2, (e, hp, s2.shape[2])))


def align_fp4_intermediate(w13, s13, w2, s2, gated: bool, min_alignment: int):
    """vLLM align_fp4_moe_weights_for_fi: I (from w2's K) rounded up to ``min_alignment``; each
    projection of a gated w13 keeps its own half (zero rows at the end of each half), a non-gated
    w13 is padded at its end; w2 and its scales get zero K columns."""
    e, h, ib = w2.shape
    i = ib * 2
    ip = _round_up(i, min_alignment)
    if ip == i:
        return w13, s13, w2, s2

    def rows(x, k):
        if not gated:
            return _into_zeros(x, (e, ip, k))
        z = torch.zeros((e, 2 * ip, k), dtype=x.dtype, device=x.device)
        z[:, :i] = x[:, :i]
        z[:, ip:ip + i] = x[:, i:]
        return z

    return (rows(w13, w13.shape[2]), rows(s13, s13.shape[2]),
            _into_zeros(w2, (e, h, ip // 2)), _into_zeros(s2, (e, h, ip // 16)))


def trtllm_nvfp4(t: Tensors, block_scale_interleave, gated: bool, hidden_alignment: int = 256) -> dict:
    """NVFP4 -> FlashInfer TRT-LLM-gen MoE (vLLM prepare_nvfp4_moe_layer_for_fi_or_cutlass,
    FLASHINFER_TRTLLM branch): gated: [w1; w3] -> [w3; w1]; H padded to ``hidden_alignment``
    (align_trtllm_fp4_moe_hidden_dim_for_fi, 256), I to 64 gated / 128 non-gated per half
    (align_fp4_moe_weights_for_fi); then prepare_static_weights_for_trtllm_fp4_moe: per expert w13
    rows reordered for the gated GEMM then epilogue-shuffled (tile 128), scales likewise with the
    shuffle_matrix_sf_a rows and a 128x4 interleave; w2 shuffled only. Scales stay e4m3 in their
    own shape."""
    from flashinfer.fused_moe.core import _maybe_get_cached_w3_w1_permute_indices, get_w2_permute_indices_with_cache

    cache: dict = {}
    tile = 128
    w13, s13 = t["w13_weight"], t["w13_weight_scale"].view(torch.uint8)
    if gated:
        w13, s13 = swap_w13(w13), swap_w13(s13)
    w2, s2 = t["w2_weight"], t["w2_weight_scale"].view(torch.uint8)
    w13, s13, w2, s2 = align_trtllm_fp4_hidden(w13, s13, w2, s2, hidden_alignment)
    w13, s13, w2, s2 = align_fp4_intermediate(w13, s13, w2, s2, gated, 64 if gated else 128)

    def w13_rows(x):
        return _gather_rows(x, _maybe_get_cached_w3_w1_permute_indices(cache, x, tile, is_gated_act_gemm=gated))

    def s13_rows(x):
        idx = _maybe_get_cached_w3_w1_permute_indices(cache, x, tile, num_elts_per_sf=16, is_gated_act_gemm=gated)
        return block_scale_interleave(_gather_rows(x, idx)).reshape(x.shape)

    def w2_rows(x):
        return _gather_rows(x, get_w2_permute_indices_with_cache(cache, x, tile))

    def s2_rows(x):
        return block_scale_interleave(_gather_rows(x, get_w2_permute_indices_with_cache(cache, x, tile, num_elts_per_sf=16))).reshape(x.shape)

    return {
        "w13_weight": _per_expert(w13.view(torch.uint8), w13_rows),
        "w13_weight_scale": _per_expert(s13, s13_rows).view(torch.float8_e4m3fn),
        "w2_weight": _per_expert(w2.view(torch.uint8), w2_rows),
        "w2_weight_scale": _per_expert(s2, s2_rows).view(torch.float8_e4m3fn),
    }


def cutlass_nvfp4_padded(t: Tensors, block_scale_interleave, gated: bool, multiple: int = 128) -> dict:
    """NVFP4 -> FlashInfer CUTLASS MoE with I padded to ``multiple``: gated w13 swapped to
    [w3; w1], then each half padded (weight rows and scale rows), w2's K padded to match; scales
    128x4-swizzled (vLLM swizzle_blockscale shape: padded)."""
    w13, s13 = t["w13_weight"], t["w13_weight_scale"]
    if gated:
        w13, s13 = swap_w13(w13), swap_w13(s13)
    w13 = _pad_to(w13, 1, multiple, halves=gated)
    s13 = _pad_to(s13.view(torch.uint8), 1, multiple, halves=gated).view(s13.dtype)
    w2 = _pad_to(t["w2_weight"], 2, multiple // 2)
    s2 = _pad_to(t["w2_weight_scale"].view(torch.uint8), 2, multiple // 16).view(t["w2_weight_scale"].dtype)
    return {
        "w13_weight": w13,
        "w13_weight_scale": swizzle_to_padded(block_scale_interleave, s13),
        "w2_weight": w2,
        "w2_weight_scale": swizzle_to_padded(block_scale_interleave, s2),
    }


def trtllm_bf16(t: Tensors, gated: bool, pad_to: int = 128) -> dict:
    """BF16 -> FlashInfer TRT-LLM-gen MoE (vLLM oracle/unquantized.py, FLASHINFER_TRTLLM): I rounded up
    to ``pad_to`` (UnquantizedFusedMoEMethod.maybe_roundup_sizes / align_moe_weights_for_fi, 128),
    zero rows at the end of each half of a gated w13 and zero K columns in w2; then
    convert_moe_weights_to_flashinfer_trtllm_block_layout: per expert, on the uint8 view, w13 rows
    gathered with the gated-reorder + shuffle indices (shifted by half the rows when gated: the
    [w1; w3] -> [w3; w1] swap folded in), w2 rows shuffled; then FlashInfer's block layout with
    128-byte K blocks, viewed back as bf16."""
    from flashinfer.fused_moe.core import (_maybe_get_cached_w3_w1_permute_indices, convert_to_block_layout,
                                           get_w2_permute_indices_with_cache)

    t = {"w13_weight": _pad_to(t["w13_weight"], 1, pad_to, halves=gated), "w2_weight": _pad_to(t["w2_weight"], 2, pad_to)}

    cache: dict = {}
    tile, block_k = 128, 128

    def w13_one(x):
        idx = _maybe_get_cached_w3_w1_permute_indices(cache, x, tile, is_gated_act_gemm=gated)
        if gated:
            idx = (idx + x.shape[0] // 2) % x.shape[0]
        return convert_to_block_layout(_gather_rows(x, idx), block_k)

    def w2_one(x):
        return convert_to_block_layout(_gather_rows(x, get_w2_permute_indices_with_cache(cache, x, tile)), block_k)

    def run(w, fn):
        e, rows, k = w.shape
        return _per_expert(w.contiguous().view(torch.uint8), fn).view(torch.bfloat16).reshape(e, k // 64, rows, 64)

    return {"w13_weight": run(t["w13_weight"], w13_one), "w2_weight": run(t["w2_weight"], w2_one)}


def trtllm_fp8_block_scale(t: Tensors) -> dict:
    """DeepSeek FP8 (128x128 block scales) -> FlashInfer TRT-LLM-gen MoE (vLLM prepare_fp8_moe_layer_for_fi,
    _shuffle_deepseek_fp8_moe_weights): w13 weight and block scales swapped to [w3; w1]; weights
    row-shuffled with epilogue tile 64 and put in the 128-wide block-major K layout; scales kept."""
    from flashinfer.fused_moe.core import convert_to_block_layout, get_w2_permute_indices_with_cache

    cache: dict = {}
    tile, block_k = 64, 128

    def one(x):
        return convert_to_block_layout(_gather_rows(x, get_w2_permute_indices_with_cache(cache, x, tile)), block_k)

    def run(w):
        return _per_expert(w.contiguous().view(torch.uint8), one).view(torch.float8_e4m3fn)

    return {
        "w13_weight": run(swap_w13(t["w13_weight"])),
        "w13_weight_scale": swap_w13(t["w13_weight_scale"]).contiguous(),
        "w2_weight": run(t["w2_weight"]),
        "w2_weight_scale": t["w2_weight_scale"].clone(),
    }
