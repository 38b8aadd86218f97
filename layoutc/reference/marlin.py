"""References for vLLM's Marlin MoE layouts (issue 24): plain torch, written from vLLM's public source,
one function per shipped spec, with the signature ``layoutc equiv`` calls: ``fn(tensors, params=None)``.

Sources (github.com/vllm-project/vllm; our own code, the facts carry over):

* vllm/model_executor/layers/quantization/utils/marlin_utils_test.py @ 04aa528e4876f866d0548e3de8e36454c640deb2:
  ``get_weight_perm`` (the 1024-entry table of one 16x64 block, 4-bit, 16-bit activations),
  ``marlin_permute_weights`` (16x16 tiles, four side by side per table) and ``marlin_weights``
  (eight 4-bit values per int32, value i in bits 4i..4i+3). vLLM's kernel tests compare the CUDA
  repack ``gptq_marlin_repack`` / ``gptq_marlin_moe_repack`` with exactly this.
* vllm/model_executor/layers/quantization/utils/marlin_utils.py @ 6eb287065174504cb862f792c2150c603e225edb:
  ``get_scale_perms``, ``marlin_permute_scales`` (scale_perm when group_size < size_k, else
  scale_perm_single) and ``marlin_moe_permute_scales`` (per expert).
* vllm/model_executor/layers/quantization/gptq_marlin.py (GPTQMarlinMoEMethod.process_weights_after_loading,
  the version stored as file id 27911977169 in this project's source index): the repack of w13_qweight and
  w2_qweight with size_k = rows * 8, size_n = columns; the scales with marlin_moe_permute_scales,
  size_k = intermediate_size_per_partition for w13 (sic) and w2_scales.shape[1] * group_size for w2.

* vllm/model_executor/layers/quantization/awq_marlin.py @ 2ab31a815160135b1215193371de249d66faba47:
  AWQMarlinMoEMethod.process_weights_after_loading (awq_marlin_moe_repack of w13/w2_qweight with size_k =
  rows, size_n = columns * 8; marlin_moe_permute_scales with size_k = intermediate_size_per_partition for
  both; moe_awq_to_marlin_zero_points; marlin_permute_bias of optional biases). marlin_utils.py @
  6eb287065174504cb862f792c2150c603e225edb: ``awq_to_marlin_zero_points`` / ``marlin_zero_points``;
  quant_utils.py ``awq_pack`` (AWQ's column interleave [0, 2, 4, 6, 1, 3, 5, 7]); vLLM's kernel test
  test_awq_marlin_repack compares awq_marlin_repack with marlin_weights of the unpacked values.
* vllm/model_executor/layers/quantization/utils/marlin_utils_fp4.py @ de5f26d5923e2b31dbb3d80efc45d5fd41f09946:
  ``prepare_nvfp4_moe_layer_for_marlin`` (the NVFP4 MoE path of fused_moe/oracle/nvfp4.py),
  ``nvfp4_marlin_process_scales``, ``nvfp4_marlin_process_global_scale``.

Nothing here uses layoutc's compiler: the oracle must not share code with what it checks.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

Tensors = Mapping[str, torch.Tensor]


def weight_perm_4bit() -> torch.Tensor:
    """The 1024-entry table of get_weight_perm(4) (16-bit activations): for each of 32 threads, four
    16x16 tiles, two column halves and four K rows per thread; then each run of 8 entries reordered
    [0, 2, 4, 6, 1, 3, 5, 7] (the order the kernel's dequantisation takes the nibbles of a word)."""
    table: list[int] = []
    for thread in range(32):
        col = thread // 4
        rows = [2 * (thread % 4), 2 * (thread % 4) + 1, 2 * (thread % 4 + 4), 2 * (thread % 4 + 4) + 1]
        one_tile = [16 * row + col + 8 * half for half in (0, 1) for row in rows]
        for tile in range(4):
            table.extend(256 * tile + p for p in one_tile)
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    runs = [table[i:i + 8] for i in range(0, len(table), 8)]
    return torch.tensor([run[o] for run in runs for o in order], dtype=torch.long)


def scale_perms() -> tuple[torch.Tensor, torch.Tensor]:
    """get_scale_perms: the grouped table (64 columns, a transpose of 8x8) and the single-group one (32)."""
    grouped = [i + 8 * j for i in range(8) for j in range(8)]
    single = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]
    return torch.tensor(grouped), torch.tensor(single)


def unpack_gptq_int4(q: torch.Tensor) -> torch.Tensor:
    """[K/8, N] int32 words of eight 4-bit values along K (value 8w+i in bits 4i..) -> [K, N] values 0..15
    (uint8; an arithmetic shift of the int32 word, then the low four bits)."""
    vals = torch.stack([((q >> (4 * i)) & 0xF).to(torch.uint8) for i in range(8)], dim=1)   # [K/8, 8, N]
    return vals.reshape(q.shape[0] * 8, q.shape[1])


def pack_int4_rows(vals: torch.Tensor) -> torch.Tensor:
    """[R, C] values 0..15 -> [R, C/8] int32, value 8w+i of a row in bits 4i.. of word w (marlin_weights)."""
    r, c = vals.shape
    v = vals.to(torch.int64).reshape(r, c // 8, 8)
    word = torch.zeros(r, c // 8, dtype=torch.int64)
    for i in range(8):
        word |= v[:, :, i] << (4 * i)
    # two's-complement int32 of the unsigned word
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def gptq_marlin_repack_expert(q: torch.Tensor, perm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One expert's GPTQ qweight [K/8, N] -> Marlin [K/16, 2N]: unpack, then marlin_weights_of."""
    return marlin_weights_of(unpack_gptq_int4(q), perm)


def marlin_weights_of(vals: torch.Tensor, perm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """marlin_weights: [K, N] values 0..15 -> Marlin [K/16, 2N]: 16x16 tiles row-major by tile,
    get_weight_perm within every 1024 values, pack eight values a word."""
    k, n = vals.shape
    if k % 16 or n % 64:
        raise ValueError(f"Marlin repack needs K % 16 and N % 64, got K={k} N={n}")
    tiles = vals.reshape(k // 16, 16, n // 16, 16).permute(0, 2, 1, 3).reshape(k // 16, n * 16)
    table = weight_perm_4bit() if perm is None else perm
    permuted = tiles.reshape(-1, table.numel())[:, table].reshape(k // 16, n * 16)
    return pack_int4_rows(permuted)


def marlin_permute_scales(s: torch.Tensor, size_k: int, size_n: int, group_size: int) -> torch.Tensor:
    """One expert's [groups, N] scales: the grouped table when group_size < size_k (and not -1), else single."""
    grouped, single = scale_perms()
    table = grouped if (group_size != -1 and group_size < size_k) else single
    return s.reshape(-1, table.numel())[:, table].reshape(-1, size_n).contiguous()


def _rank_slice(t: Tensors, params: Optional[Mapping[str, Any]], w13_axis: int, w2_axis: int) -> dict:
    """What rank tp_rank of tp_size loads (vLLM FusedMoE _load_w13 / _load_w2, even splits): each half of
    every w13 tensor narrowed along ``w13_axis`` (N), every w2 tensor but the bias along ``w2_axis`` (K)."""
    rank, ranks = int((params or {}).get("tp_rank", 0)), int((params or {}).get("tp_size", 1))
    out = {k: v for k, v in t.items() if v is not None}
    if ranks == 1:
        return out
    for k, v in list(out.items()):
        if k.startswith("w13"):
            axis = w13_axis if v.dim() == 3 else 1
            out[k] = torch.cat([h.chunk(ranks, dim=axis)[rank] for h in v.chunk(2, dim=axis)], dim=axis)
        elif k != "w2_bias":
            out[k] = v.chunk(ranks, dim=w2_axis)[rank]
    return out


def marlin_gptq_int4(t: Tensors, params: Optional[Mapping[str, Any]] = None) -> dict:
    """vLLM GPTQMarlinMoEMethod.process_weights_after_loading, no act-order (empty sort indices), 4-bit,
    16-bit activations: gptq_marlin_moe_repack of w13_qweight and w2_qweight, marlin_moe_permute_scales of
    their scales with the size_k vLLM passes (I for both: intermediate_size_per_partition for w13,
    w2_scales.shape[1] * group_size for w2)."""
    group = int((params or {}).get("group_size", 128))
    t = _rank_slice(t, params, w13_axis=2, w2_axis=1)      # GPTQ tensors are K-major
    w13, w2 = t["w13_qweight"], t["w2_qweight"]
    inter = w2.shape[1] * 8                       # intermediate_size_per_partition
    out = {
        "w13_qweight": torch.stack([gptq_marlin_repack_expert(w13[e]) for e in range(w13.shape[0])]),
        "w2_qweight": torch.stack([gptq_marlin_repack_expert(w2[e]) for e in range(w2.shape[0])]),
    }
    s13, s2 = t["w13_scales"], t["w2_scales"]
    out["w13_scales"] = torch.stack([marlin_permute_scales(s13[e], inter, s13.shape[2], group)
                                     for e in range(s13.shape[0])])
    w2_k = s2.shape[1] * (group if group != -1 else 8)
    out["w2_scales"] = torch.stack([marlin_permute_scales(s2[e], w2_k, s2.shape[2], group)
                                    for e in range(s2.shape[0])])
    return out


def marlin_permute_bias(b: torch.Tensor) -> torch.Tensor:
    """marlin_permute_bias: scale_perm_single along the (last) N axis."""
    _, single = scale_perms()
    return b.reshape(-1, single.numel())[:, single].reshape(b.shape).contiguous()


def mxfp4_marlin_process_scales(s: torch.Tensor) -> torch.Tensor:
    """mxfp4_marlin_process_scales with 16-bit activations: each run of 4 reordered [0, 2, 1, 3], then E8M0."""
    s = s.reshape(-1, 4)[:, [0, 2, 1, 3]].reshape(s.shape[0], -1)
    return s.to(torch.float8_e8m0fnu)


def marlin_mxfp4(t: Tensors, params: Optional[Mapping[str, Any]] = None) -> dict:
    """vLLM marlin_utils_fp4.py prepare_moe_mxfp4_layer_for_marlin (00d52e93333741b205e70acb9217a2849f173696),
    16-bit activations (bf16 params): per expert, the FP4 bytes viewed as int32 and transposed to [K/8, N],
    gptq_marlin_repack; the E8M0 scales through bf16, transposed, marlin_permute_scales(size_k=K, 32) and
    mxfp4_marlin_process_scales; biases in bf16 through marlin_permute_bias. Scales are returned as bytes
    (uint8: E8M0 has no arithmetic on the CPU)."""
    t = _rank_slice(t, params, w13_axis=1, w2_axis=2)
    out: dict = {}
    for name in ("w13", "w2"):
        w = t[f"{name}_weight"]
        e, n, kb = w.shape
        k = kb * 2
        words = w.contiguous().view(torch.uint8).view(torch.int32)               # [E, N, K/8]
        out[f"{name}_weight"] = torch.stack([gptq_marlin_repack_expert(words[i].t().contiguous()) for i in range(e)])
        s = t[f"{name}_weight_scale"].contiguous().view(torch.uint8).view(torch.float8_e8m0fnu).to(torch.bfloat16)
        per_expert = []
        for i in range(e):
            permuted = marlin_permute_scales(s[i].t().contiguous(), k, n, 32)
            per_expert.append(mxfp4_marlin_process_scales(permuted).view(torch.uint8))
        out[f"{name}_weight_scale"] = torch.stack(per_expert)
        if t.get(f"{name}_bias") is not None:
            b = t[f"{name}_bias"].to(torch.bfloat16)
            out[f"{name}_bias"] = torch.stack([marlin_permute_bias(b[i]) for i in range(e)])
    return out


def nvfp4_marlin_process_scales(s: torch.Tensor) -> torch.Tensor:
    """nvfp4_marlin_process_scales: to half, each run of 4 reordered [0, 2, 1, 3], times 2**7, the int16
    bits shifted left by one and the high byte of each kept (bytes 1::2, little-endian), viewed as E4M3."""
    h = s.to(torch.half)
    h = h.reshape(-1, 4)[:, [0, 2, 1, 3]].reshape(h.shape)
    words = (h * 2**7).view(torch.int16) << 1
    return words.view(torch.float8_e4m3fn).reshape(h.shape[0], -1)[:, 1::2].contiguous()


def nvfp4_marlin_process_global_scale(g: torch.Tensor) -> torch.Tensor:
    """nvfp4_marlin_process_global_scale: times 2**(exponent bias - 7), the bias 2**(e-1) - 2 for the
    activation dtype's e exponent bits (bf16: 126, fp16: 14)."""
    target = {torch.half: 5, torch.bfloat16: 8}[g.dtype]
    return g * (2.0 ** (2 ** (target - 1) - 2 ** (2 - 1) - 7))


def marlin_nvfp4(t: Tensors, params: Optional[Mapping[str, Any]] = None) -> dict:
    """vLLM marlin_utils_fp4.py prepare_nvfp4_moe_layer_for_marlin (de5f26d5923e2b31dbb3d80efc45d5fd41f09946),
    16-bit activations: per expert the FP4 bytes as int32, transposed, gptq_marlin_repack; the E4M3 scales
    in the activation dtype, transposed, marlin_permute_scales(size_k=K, group_size=16),
    nvfp4_marlin_process_scales; the per-expert global scales in the activation dtype through
    nvfp4_marlin_process_global_scale. ``activation = relu2`` is the non-gated branch (w13 = w1 only)."""
    params = params or {}
    gated = params.get("activation", "silu") != "relu2"
    dtype = {"bf16": torch.bfloat16, "f16": torch.half}[params.get("act_dtype", "bf16")]
    rank, ranks = int(params.get("tp_rank", 0)), int(params.get("tp_size", 1))
    t = {k: v for k, v in t.items() if v is not None}
    if ranks > 1:   # FusedMoE _load_w13 / _load_w2: each half of w13 (w1 alone when non-gated), w2 along K
        for k in ("w13_weight", "w13_weight_scale"):
            halves = t[k].chunk(2, dim=1) if gated else (t[k],)
            t[k] = torch.cat([h.chunk(ranks, dim=1)[rank] for h in halves], dim=1)
        for k in ("w2_weight", "w2_weight_scale"):
            t[k] = t[k].chunk(ranks, dim=2)[rank]
    out: dict = {}
    for name in ("w13", "w2"):
        w = t[f"{name}_weight"]
        e, n, kb = w.shape
        k = kb * 2
        words = w.contiguous().view(torch.uint8).view(torch.int32)               # [E, N, K/8]
        out[f"{name}_weight"] = torch.stack([gptq_marlin_repack_expert(words[i].t().contiguous()) for i in range(e)])
        s = t[f"{name}_weight_scale"].contiguous().view(torch.float8_e4m3fn).to(dtype)
        # An E4M3 NaN's bits in the 16-bit type depend on the device's conversion (torch on the CPU:
        # 0x7FC0 in bf16, 0x7F80 in fp16; vLLM runs this on the GPU): the reference takes the type's
        # canonical NaN, so a NaN scale becomes the byte 0xFC (tests/backends/test_marlin_nvfp4.py).
        s = torch.where(torch.isnan(s), torch.tensor(float("nan"), dtype=dtype), s)
        out[f"{name}_weight_scale"] = torch.stack(
            [nvfp4_marlin_process_scales(marlin_permute_scales(s[i].t(), k, n, 16)) for i in range(e)])
        out[f"{name}_weight_scale_2"] = nvfp4_marlin_process_global_scale(t[f"{name}_weight_scale_2"].to(dtype))
    return out


#: AWQ's column interleave within each int32 word (quant_utils.awq_pack, 4-bit): nibble i holds column 8w + AWQ[i]
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_awq(q: torch.Tensor) -> torch.Tensor:
    """[R, C/8] AWQ words -> [R, C] values: nibble i of word w is column 8w + AWQ_ORDER[i] (unpack_cols,
    then the interleave undone)."""
    r, w = q.shape
    nib = torch.stack([((q >> (4 * i)) & 0xF).to(torch.uint8) for i in range(8)], dim=2)   # [R, W, 8] by nibble
    out = torch.empty_like(nib)
    out[:, :, list(AWQ_ORDER)] = nib
    return out.reshape(r, w * 8)


def awq_to_marlin_zero_points(qz: torch.Tensor) -> torch.Tensor:
    """awq_to_marlin_zero_points (4-bit): unpack and undo AWQ's interleave, marlin_zero_points: the grouped
    scale table always (zero points are applied on every MMA), AWQ's interleave again, eight a word."""
    zp = unpack_awq(qz)
    grouped, _ = scale_perms()
    g, n = zp.shape
    zp = zp.reshape(-1, 64)[:, grouped].reshape(-1, 8)[:, list(AWQ_ORDER)].reshape(g, n)
    return pack_int4_rows(zp)


def marlin_awq_int4(t: Tensors, params: Optional[Mapping[str, Any]] = None) -> dict:
    """vLLM AWQMarlinMoEMethod.process_weights_after_loading, 4-bit, 16-bit activations: per expert the AWQ
    words unpacked (interleave undone) and repacked for Marlin (what awq_marlin_moe_repack computes), the
    scales permuted with size_k = intermediate_size_per_partition (w13 too), the zero points through
    awq_to_marlin_zero_points, biases through marlin_permute_bias."""
    params = params or {}
    group = int(params.get("group_size", 128))
    rank, ranks = int(params.get("tp_rank", 0)), int(params.get("tp_size", 1))
    t = {k: v for k, v in t.items() if v is not None}
    if ranks > 1:   # AWQ tensors are K-major [E, K, N/8]: w13's N (gate and up apart) is the last axis
        for k, v in list(t.items()):
            if k.startswith("w13"):
                t[k] = torch.cat([h.chunk(ranks, dim=-1)[rank] for h in v.chunk(2, dim=-1)], dim=-1)
            elif k != "w2_bias":
                t[k] = v.chunk(ranks, dim=1)[rank]
    inter = t["w2_qweight"].shape[1]           # intermediate_size_per_partition
    out: dict = {}
    for name in ("w13", "w2"):
        q = t[f"{name}_qweight"]
        out[f"{name}_qweight"] = torch.stack([marlin_weights_of(unpack_awq(q[e])) for e in range(q.shape[0])])
        s = t[f"{name}_scales"]
        out[f"{name}_scales"] = torch.stack([marlin_permute_scales(s[e], inter, s.shape[2], group)
                                             for e in range(s.shape[0])])
        z = t[f"{name}_qzeros"]
        out[f"{name}_qzeros"] = torch.stack([awq_to_marlin_zero_points(z[e]) for e in range(z.shape[0])])
        if t.get(f"{name}_bias") is not None:
            b = t[f"{name}_bias"]
            out[f"{name}_bias"] = torch.stack([marlin_permute_bias(b[e]) for e in range(b.shape[0])])
    return out
