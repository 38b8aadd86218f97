"""Naive references for the layout primitives, written from the documented formulas.

Everything here loops over elements in plain Python (no torch reshapes, no layoutc
code), so it is an independent third implementation next to each primitive's index
map and its eager torch function. The tests import these helpers with
``from .conftest import ...``.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import struct
from pathlib import Path

import torch

from tests.helpers import assert_same_bits

INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: The bit table of family sm90_mixed in layoutc/lang/prelude.lyt (out_bit[i] = in_bit[T[i]]).
DESIGN_T = (16, 17, 18, 8, 9, 10, 0, 1, 2, 19, 25, 26, 11, 24, 27, 3,
            20, 21, 22, 12, 13, 14, 4, 5, 6, 23, 29, 30, 15, 28, 31, 7)


def bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns as same-width integers (NaN-safe exact comparison)."""
    return t.contiguous().view(INT_OF_WIDTH[t.element_size()])


def assert_bits_equal(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Bit for bit, dtypes of one width alike (the shared helper, as the op tests compare views)."""
    assert_same_bits(actual, expected, what, same_dtype=False)


def random_tensor(shape, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Random bit patterns of ``dtype`` (NaNs included for floats: compare bits)."""
    g = torch.Generator().manual_seed(seed)
    size = torch.empty((), dtype=dtype).element_size()
    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(tuple(shape))


# ---------------------------------------------------------------------------
# generic naive gather


def naive_gather(x: torch.Tensor, out_shape, src_of):
    """out[o] = x[src_of(o)], or the fill value ``src_of`` returns as ('fill', v). Plain loops."""
    xb = bits(x)
    xs = xb.reshape(-1).tolist()
    in_shape = tuple(x.shape)
    strides = []
    acc = 1
    for s in reversed(in_shape):
        strides.append(acc)
        acc *= s
    strides = tuple(reversed(strides))
    out = []
    for o in itertools.product(*(range(n) for n in out_shape)):
        src = src_of(o)
        if isinstance(src, tuple) and src and src[0] == "fill":
            out.append(src[1])
            continue
        assert len(src) == len(in_shape)
        for c, n in zip(src, in_shape):
            assert 0 <= c < n, (o, src, in_shape)
        out.append(xs[sum(c * s for c, s in zip(src, strides))])
    return torch.tensor(out, dtype=xb.dtype).reshape(tuple(out_shape))


def along_axis(x: torch.Tensor, dim: int, order):
    """Rows of axis ``dim`` gathered by an explicit list (None = fill 0... see ``fill``)."""
    return along_axis_fill(x, dim, order, 0)


def along_axis_fill(x: torch.Tensor, dim: int, order, fill):
    out_shape = list(x.shape)
    out_shape[dim] = len(order)

    def src(o):
        r = order[o[dim]]
        if r is None:
            return ("fill", fill)
        return o[:dim] + (r,) + o[dim + 1:]

    return naive_gather(x, out_shape, src)


# ---------------------------------------------------------------------------
# row orders, each built as a list the way a person would describe it


def order_swap_halves(n):
    return list(range(n // 2, n)) + list(range(n // 2))


def order_interleave(n, g):
    a, b = list(range(n // 2)), list(range(n // 2, n))
    out = []
    for s in range(0, n // 2, g):
        out += a[s:s + g] + b[s:s + g]
    return out


def order_deinterleave(n, g):
    chunks = [list(range(k, k + g)) for k in range(0, n, g)]
    firsts = [r for c in chunks[0::2] for r in c]
    seconds = [r for c in chunks[1::2] for r in c]
    return firsts + seconds


def order_swap_pairs(n):
    out = []
    for i in range(n // 2):
        out += [2 * i + 1, 2 * i]
    return out


def order_reorder_gated(n):
    out = []
    for i in range(n // 2):
        out += [i, n // 2 + i]
    return out


def shuffle_block_of(epilogue_tile):
    # prelude.lyt family trtllm: B = 32 when the tile is a multiple of 128, else 16
    return 32 if epilogue_tile % 128 == 0 else 16


def order_shuffle(n, epilogue_tile):
    b = shuffle_block_of(epilogue_tile)
    out = [None] * n
    for q in range(n // b):
        for a in range(b // 8):
            for c in range(8):
                out[b * q + 8 * a + c] = b * q + (b // 8) * c + a
    return out


def invert(order):
    inv = [None] * len(order)
    for i, s in enumerate(order):
        inv[s] = i
    return inv


def order_pad(n, parts, multiple):
    part = n // parts
    padded = -(-part // multiple) * multiple
    out = []
    for p in range(parts):
        out += [p * part + i for i in range(part)] + [None] * (padded - part)
    return out


def order_shard(n, parts, rank, ranks):
    part = n // parts
    size = part // ranks
    return [p * part + rank * size + i for p in range(parts) for i in range(size)]


def order_crop(n, parts, size):
    part = n // parts
    return [p * part + i for p in range(parts) for i in range(size)]


# ---------------------------------------------------------------------------
# 128x4 scale swizzle (TRT-LLM's 128x4 SF offset, per leading index)


def swizzle_offset(r, c, pcol):
    return (r // 128) * (pcol // 4) * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)


def naive_swizzle(x: torch.Tensor) -> torch.Tensor:
    *lead, rows, cols = x.shape
    prow, pcol = -(-rows // 128) * 128, -(-cols // 4) * 4
    xb = bits(x).reshape(-1, rows, cols).tolist()
    outs = []
    for mat in xb:
        flat = [0] * (prow * pcol)
        for r in range(rows):
            for c in range(cols):
                flat[swizzle_offset(r, c, pcol)] = mat[r][c]
        outs.append(flat)
    return torch.tensor(outs, dtype=bits(x).dtype).reshape(*lead, prow, pcol)


def naive_unswizzle(y: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    *lead, prow, pcol = y.shape
    yb = bits(y).reshape(-1, prow * pcol).tolist()
    outs = []
    for flat in yb:
        outs.append([[flat[swizzle_offset(r, c, pcol)] for c in range(cols)] for r in range(rows)])
    return torch.tensor(outs, dtype=bits(y).dtype).reshape(*lead, rows, cols)


# ---------------------------------------------------------------------------
# SM90 scale fold: out[e, rb, kb, f, 4*ms + g] = in[e, 64*rb + 16*ms + f, 4*kb + g]


def naive_fold(x: torch.Tensor) -> torch.Tensor:
    *lead, rows, cols = x.shape

    def src(o):
        *e, rb, kb, f, col = o
        ms, g = col // 4, col % 4
        return tuple(e) + (64 * rb + 16 * ms + f, 4 * kb + g)

    return naive_gather(x, (*lead, rows // 64, cols // 4, 16, 16), src)


def naive_unfold(y: torch.Tensor) -> torch.Tensor:
    *lead, rb_n, kb_n, _, _ = y.shape

    def src(o):
        *e, r, c = o
        rb, rest = r // 64, r % 64
        ms, f = rest // 16, rest % 16
        kb, g = c // 4, c % 4
        return tuple(e) + (rb, kb, f, 4 * ms + g)

    return naive_gather(y, (*lead, 64 * rb_n, 4 * kb_n), src)


# ---------------------------------------------------------------------------
# SM90 FP4 weight interleave


def _word_positions(n, kb):
    """For every (r, c) word of the documented formula: its 4 source bytes and 4 destination bytes."""
    for g in range(n // 16):
        for r8 in range(8):
            r = 16 * g + r8
            for p in range(kb // 32):
                for a in range(2):
                    for h in range(2):
                        for j in range(4):
                            c = 32 * p + 16 * a + 8 * h + j
                            src = [(r, c), (r + 8, c), (r, c + 4), (r + 8, c + 4)]
                            dst = [(r + 8 * h, 32 * p + 16 * a + 4 * j + k) for k in range(4)]
                            yield src, dst


def naive_sm90_interleave(w: torch.Tensor, table=DESIGN_T) -> torch.Tensor:
    """The sm90_mixed weight formula of layoutc/lang/prelude.lyt, per expert, bit by bit."""
    *lead, n, kb = w.shape
    mats = w.contiguous().view(torch.uint8).reshape(-1, n, kb).tolist()
    outs = []
    for m in mats:
        out = [[None] * kb for _ in range(n)]
        for src, dst in _word_positions(n, kb):
            word = 0
            for k, (rr, cc) in enumerate(src):
                word |= m[rr][cc] << (8 * k)
            new = 0
            for i in range(32):
                new |= ((word >> table[i]) & 1) << i
            for k, (rr, cc) in enumerate(dst):
                assert out[rr][cc] is None, "two words stored to one byte"
                out[rr][cc] = (new >> (8 * k)) & 0xFF
        assert all(v is not None for row in out for v in row), "a byte was never written"
        outs.append(out)
    return torch.tensor(outs, dtype=torch.uint8).reshape(*lead, n, kb)


def naive_sm90_deinterleave(w: torch.Tensor, table=DESIGN_T) -> torch.Tensor:
    *lead, n, kb = w.shape
    mats = w.contiguous().view(torch.uint8).reshape(-1, n, kb).tolist()
    outs = []
    for m in mats:
        out = [[None] * kb for _ in range(n)]
        for src, dst in _word_positions(n, kb):
            new = 0
            for k, (rr, cc) in enumerate(dst):
                new |= m[rr][cc] << (8 * k)
            word = 0
            for i in range(32):
                word |= ((new >> i) & 1) << table[i]
            for k, (rr, cc) in enumerate(src):
                out[rr][cc] = (word >> (8 * k)) & 0xFF
        outs.append(out)
    return torch.tensor(outs, dtype=torch.uint8).reshape(*lead, n, kb)


# ---------------------------------------------------------------------------
# FlashInfer's CUDA source, parsed


def flashinfer_root() -> Path | None:
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


MIXED_UTILS_CU = "data/csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu"


def kernel_source() -> str | None:
    root = flashinfer_root()
    if root is None or not (root / MIXED_UTILS_CU).exists():
        return None
    return (root / MIXED_UTILS_CU).read_text()


def kernel_body(src: str, name: str) -> str:
    start = src.index(f"__global__ void {name}(")
    end = src.index("__global__", start + 10)
    return src[start:end]


_MASK_RE = re.compile(
    r"mask\s*=\s*0b([01]+)\s*;"  # mask = 0b...;
    r"\s*fp4x8_interleaved\s*\|=\s*\(fp4x8_raw\s*&\s*mask\)\s*(<<|>>)\s*(\d+)\s*;"  # |= (raw & mask) << N;
)


def parse_mask_shifts(src: str):
    """[(mask, '<<' or '>>', shift), ...] of interleave_fp4_weights_for_sm90_mixed_gemm_kernel."""
    body = kernel_body(src, "interleave_fp4_weights_for_sm90_mixed_gemm_kernel")
    return [(int(m, 2), d, int(s)) for m, d, s in _MASK_RE.findall(body)]


def table_from_mask_shifts(ops):
    """out_bit[i] = in_bit[T[i]] from the kernel's masked shifts."""
    t = [None] * 32
    for mask, direction, shift in ops:
        for s in range(32):
            if mask >> s & 1:
                i = s + shift if direction == "<<" else s - shift
                assert 0 <= i < 32 and t[i] is None
                t[i] = s
    return t


def kernel_sm90_fp4(w: torch.Tensor, ops, lanes: int = 16) -> torch.Tensor:
    """Line-by-line transcription of interleave_fp4_weights_for_sm90_mixed_gemm_kernel
    (grid-stride loops flattened; ``cols`` is K, the number of FP4 values per row)."""
    *lead, rows, kb = w.shape
    cols = 2 * kb
    mats = w.contiguous().view(torch.uint8).reshape(-1, rows * kb).tolist()
    outs = []
    for fp4_weight in mats:
        out = [None] * (rows * kb)
        for block_id in range(rows // 2):
            for partition_id in range(cols // 64):
                for lane_id in range(lanes):
                    row_id = block_id // 8 * 16 + block_id % 8
                    mma_id = lane_id // 4
                    dst_row_id = row_id + (mma_id % 2) * 8
                    interleaved_lane_id = lane_id // 8 * 16 + (lane_id % 4) * 4
                    col_id = partition_id * 32 + mma_id * 8 + lane_id % 4
                    dst_col_id = partition_id * 32 + interleaved_lane_id
                    first = row_id * cols // 2 + col_id
                    second = (row_id + 8) * cols // 2 + col_id
                    third, fourth = first + 4, second + 4
                    raw = (fp4_weight[first] | fp4_weight[second] << 8 | fp4_weight[third] << 16
                           | fp4_weight[fourth] << 24)
                    inter = 0
                    for mask, direction, shift in ops:
                        v = (raw & mask) << shift if direction == "<<" else (raw & mask) >> shift
                        inter |= v & 0xFFFFFFFF
                    dst = dst_row_id * cols // 2 + dst_col_id
                    for k in range(4):
                        out[dst + k] = (inter >> (8 * k)) & 0xFF
        assert None not in out
        outs.append(out)
    return torch.tensor(outs, dtype=torch.uint8).reshape(*lead, rows, kb)


# ---------------------------------------------------------------------------
# naive value conversions


def f32_bits_to_float(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def naive_f32_to_bf16_bits(b: int) -> int:
    """Round to nearest even on the top 16 bits (finite inputs)."""
    b &= 0xFFFFFFFF
    lsb = (b >> 16) & 1
    return ((b + 0x7FFF + lsb) >> 16) & 0xFFFF


def naive_f32_to_f16_bits(b: int) -> int:
    return struct.unpack("<H", struct.pack("<e", f32_bits_to_float(b)))[0]


def naive_bf16_to_f32_bits(h: int) -> int:
    return (h & 0xFFFF) << 16


def naive_f16_to_f32_bits(h: int) -> int:
    v = struct.unpack("<e", struct.pack("<H", h & 0xFFFF))[0]
    return struct.unpack("<I", struct.pack("<f", v))[0]
