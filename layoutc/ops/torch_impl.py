"""Eager torch implementations of the primitives: the reference lowering.

Every function here is self-contained (it uses only ``torch`` and module-level
constants defined next to it) because code generation copies the source of the
functions a spec uses into the standalone converter module. Each function takes
a tensor and plain Python values and returns a new tensor or a view; it never
writes to its input. The index map of the same primitive lives in the op's
module; tests check the two agree element for element.

``dim`` arguments are non-negative axis numbers; leading axes (experts) are batch.
"""

import torch


def swap_halves(x, dim):
    # [A; B] -> [B; A] along dim.
    dim = dim % x.dim()
    h = x.shape[dim] // 2
    return torch.cat([x.narrow(dim, h, h), x.narrow(dim, 0, h)], dim=dim)


def interleave_rows(x, dim, group):
    # [A; B] -> [A[0:g], B[0:g], A[g:2g], B[g:2g], ...] along dim.
    dim = dim % x.dim()
    n = x.shape[dim]
    y = x.unflatten(dim, (2, n // (2 * group), group)).transpose(dim, dim + 1)
    return y.flatten(dim, dim + 2)


def deinterleave_rows(x, dim, group):
    # [A[0:g], B[0:g], A[g:2g], ...] -> [A; B] along dim (inverse of interleave_rows).
    dim = dim % x.dim()
    n = x.shape[dim]
    y = x.unflatten(dim, (n // (2 * group), 2, group)).transpose(dim, dim + 1)
    return y.flatten(dim, dim + 2)


def swap_pairs(x, dim):
    # rows (2i, 2i+1) -> (2i+1, 2i).
    dim = dim % x.dim()
    n = x.shape[dim]
    return x.unflatten(dim, (n // 2, 2)).flip(dim + 1).flatten(dim, dim + 1)


def shuffle_rows(x, dim, block):
    # Within each block of B rows: out[8a + b] = in[(B/8)*b + a]   (B = 16 or 32).
    dim = dim % x.dim()
    n = x.shape[dim]
    y = x.unflatten(dim, (n // block, 8, block // 8)).transpose(dim + 1, dim + 2)
    return y.flatten(dim, dim + 2)


def unshuffle_rows(x, dim, block):
    dim = dim % x.dim()
    n = x.shape[dim]
    y = x.unflatten(dim, (n // block, block // 8, 8)).transpose(dim + 1, dim + 2)
    return y.flatten(dim, dim + 2)


def pad(x, dim, multiple, parts, value):
    # Split dim into `parts` equal parts and extend each with `value` to a multiple of `multiple`.
    dim = dim % x.dim()
    n = x.shape[dim] // parts
    size = -(-n // multiple) * multiple
    chunks = x.unflatten(dim, (parts, n))
    shape = list(chunks.shape)
    shape[dim + 1] = size
    out = torch.full(shape, value, dtype=x.dtype, device=x.device)
    out.narrow(dim + 1, 0, n).copy_(chunks)
    return out.flatten(dim, dim + 1)


def crop(x, dim, size, parts):
    # Keep the first `size` entries of each of `parts` equal parts of dim.
    dim = dim % x.dim()
    n = x.shape[dim] // parts
    if size > n:
        raise ValueError(f"crop keeps {size} of each part along dim {dim}, but a part has only {n}")
    return x.unflatten(dim, (parts, n)).narrow(dim + 1, 0, size).flatten(dim, dim + 1)


def shard(x, dim, rank, ranks, parts):
    # Keep slice `rank` of `ranks` of each of `parts` equal parts of dim (tensor parallelism).
    dim = dim % x.dim()
    part = x.shape[dim] // parts
    size = part // ranks
    return x.unflatten(dim, (parts, part)).narrow(dim + 1, rank * size, size).flatten(dim, dim + 1)


def block_major_k(x, block):
    # [.., R, K] -> [.., K/block, R, block] (FlashInfer convert_to_block_layout, per leading index)
    return x.unflatten(-1, (x.shape[-1] // block, block)).transpose(-3, -2)


def unblock_major_k(x):
    return x.transpose(-3, -2).flatten(-2)


def swizzle_128x4(x):
    # FlashInfer block_scale_interleave per leading index: pad rows to 128 and
    # columns to 4 with zeros, then (R/128, 4, 32, C/4, 4) -> (R/128, C/4, 32, 4, 4).
    *lead, rows, cols = x.shape
    prow, pcol = -(-rows // 128) * 128, -(-cols // 4) * 4
    if (prow, pcol) != (rows, cols):
        padded = torch.zeros(*lead, prow, pcol, dtype=x.dtype, device=x.device)
        padded[..., :rows, :cols] = x
        x = padded
    k = len(lead)
    y = x.reshape(*lead, prow // 128, 4, 32, pcol // 4, 4)
    y = y.permute(*range(k), k, k + 3, k + 2, k + 1, k + 4)
    return y.reshape(*lead, prow, pcol)


def unswizzle_128x4(x, rows, cols):
    *lead, prow, pcol = x.shape
    k = len(lead)
    y = x.reshape(*lead, prow // 128, pcol // 4, 32, 4, 4)
    y = y.permute(*range(k), k, k + 3, k + 2, k + 1, k + 4).reshape(*lead, prow, pcol)
    return y[..., :rows, :cols]


def sm90_fold_scales(x):
    # FlashInfer interleave_moe_scales_for_sm90_mixed_gemm (1-byte scales, group 32):
    # [.., R, K/32] -> [.., R/64, K/128, 16, 16], out[rb, kb, f, 4*ms + g] = in[64*rb + 16*ms + f, 4*kb + g].
    *lead, rows, groups = x.shape
    k = len(lead)
    y = x.reshape(*lead, rows // 64, 4, 16, groups // 4, 4)
    y = y.permute(*range(k), k, k + 3, k + 2, k + 1, k + 4)
    return y.reshape(*lead, rows // 64, groups // 4, 16, 16)


def sm90_unfold_scales(x):
    *lead, rb, kb, _, _ = x.shape
    k = len(lead)
    y = x.reshape(*lead, rb, kb, 16, 4, 4)
    y = y.permute(*range(k), k, k + 3, k + 2, k + 1, k + 4)
    return y.reshape(*lead, rb * 64, kb * 4)


# Bit permutation of the SM90 mixed-GEMM FP4 interleave: bit i of the output
# 32-bit word is bit SM90_FP4_BITS[i] of the input word (see ops/sm90.py).
SM90_FP4_BITS = (16, 17, 18, 8, 9, 10, 0, 1, 2, 19, 25, 26, 11, 24, 27, 3,
                 20, 21, 22, 12, 13, 14, 4, 5, 6, 23, 29, 30, 15, 28, 31, 7)


def _permute_word_bits(words, table):
    # words: uint8 [..., 4] (little-endian 32-bit words); out bit i = in bit table[i].
    # Bits that move by the same shift between the same byte pair go in one masked shift.
    groups = {}
    for i, s in enumerate(table):
        key = (i // 8, s // 8, i % 8 - s % 8)
        groups[key] = groups.get(key, 0) | (1 << (s % 8))
    out = torch.zeros_like(words)
    for (dst, src, shift), mask in sorted(groups.items()):
        picked = words[..., src] & mask
        out[..., dst] |= (picked << shift) if shift >= 0 else (picked >> -shift)
    return out


def sm90_interleave_fp4(w):
    # FlashInfer interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4"), per leading index,
    # for w = uint8 [N, K/2]: the 4 bytes (r, c), (r+8, c), (r, c+4), (r+8, c+4) with
    # r = 16g + r8 and c = 32p + 16a + 8h + j form one word; its bits are permuted and the
    # word is stored at row r + 8h, bytes 32p + 16a + 4j .. +4.
    *lead, n, kb = w.shape
    k = len(lead)
    src = w.reshape(*lead, n // 16, 2, 8, kb // 32, 2, 2, 2, 4)  # g tr r8 p a h tc j
    words = src.permute(*range(k), *(k + d for d in (0, 2, 3, 4, 5, 7, 6, 1)))  # g r8 p a h j tc tr
    words = words.reshape(*words.shape[:-2], 4)
    out = _permute_word_bits(words, SM90_FP4_BITS)  # g r8 p a h j t
    out = out.permute(*range(k), *(k + d for d in (0, 4, 1, 2, 3, 5, 6)))  # g h r8 p a j t
    return out.reshape(*lead, n, kb)


def sm90_deinterleave_fp4(w):
    *lead, n, kb = w.shape
    k = len(lead)
    words = w.reshape(*lead, n // 16, 2, 8, kb // 32, 2, 4, 4)  # g h r8 p a j t
    words = words.permute(*range(k), *(k + d for d in (0, 2, 3, 4, 1, 5, 6)))  # g r8 p a h j t
    inverse_bits = [0] * 32
    for i, s in enumerate(SM90_FP4_BITS):
        inverse_bits[s] = i
    raw = _permute_word_bits(words, inverse_bits)  # g r8 p a h j t' with t' = tr + 2*tc
    raw = raw.reshape(*raw.shape[:-1], 2, 2)  # ... j tc tr
    out = raw.permute(*range(k), *(k + d for d in (0, 7, 1, 2, 3, 4, 6, 5)))  # g tr r8 p a h tc j
    return out.reshape(*lead, n, kb)


def reshape(x, shape):
    return x.reshape(shape)


def transpose(x, dim0, dim1):
    return x.transpose(dim0, dim1)


def view_as(x, dtype):
    # Relabel the bits (same element size); no value changes.
    return x.view(dtype)


def cast(x, dtype):
    # Convert values: round to nearest even; every NaN becomes the target type's canonical quiet NaN
    # (torch's own conversion is device-dependent there: f32 -> bf16 gives 0xFFFF on the CPU).
    y = x.to(dtype)
    if x.is_floating_point() and y.is_floating_point() and x.dtype != dtype:
        y = torch.where(torch.isnan(x), torch.tensor(float("nan"), dtype=dtype, device=x.device), y)
    return y
