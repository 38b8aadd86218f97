"""Every primitive of ``layoutc.lang.ops.REGISTRY``, three ways, over whole small domains.

For each case the output of

(a) ``indexmap.gather(op.index_map(t), x, dims)`` -- the op's definition,
(b) the eager torch function ``fn, args = op.impl(t); fn(x, *args)``, and
(c) a naive per-element reference written in ``conftest.py`` from the documented
    formula (plain Python loops, no layoutc code)

must agree bit for bit. Then: inverse laws (hypothesis), shape/dtype inference and
requirements, and type errors.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layoutc.algebra import expr as ex
from layoutc.algebra import indexmap as im
from layoutc.algebra.dtypes import ELEMENT_TYPES as ET
from layoutc.algebra.expr import Const, Var
from layoutc.front.args import ArgValue
from layoutc.lang.expand import family_chain
from layoutc.lang.ops import REGISTRY, OpTypeError, TensorType
from layoutc.lang.ops import lookup, permute, rearrange, rows, shape, value
from layoutc.lang.ops.base import Category
from layoutc.lang.ops.binder import BindError, bind

from .conftest import (
    DESIGN_T,
    along_axis_fill,
    assert_bits_equal,
    bits,
    invert,
    kernel_body,
    kernel_sm90_fp4,
    kernel_source,
    naive_bf16_to_f32_bits,
    naive_f16_to_f32_bits,
    naive_f32_to_bf16_bits,
    naive_f32_to_f16_bits,
    naive_gather,
    naive_sm90_interleave,
    order_crop,
    order_shard,
    order_deinterleave,
    order_interleave,
    order_pad,
    order_reorder_gated,
    order_swap_halves,
    order_swap_pairs,
    parse_mask_shifts,
    random_tensor,
    table_from_mask_shifts,
)

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

E_, I_, H_, N_, K_, R_, C_ = (Var(n) for n in ("E", "I", "H", "N", "K", "R", "C"))


def TT(elem: str, *shape) -> TensorType:
    return TensorType(ET[elem], tuple(ex.as_expr(s) for s in shape))


def concrete(t: TensorType, dims) -> tuple[int, ...]:
    return im.concrete_shape(t.shape, dims)


def eval_arg(a, dims):
    if isinstance(a, ex.Expr):
        return int(ex.evaluate(a, dims))
    if isinstance(a, tuple):
        return tuple(eval_arg(v, dims) for v in a)
    if isinstance(a, permute.IndexFormula):
        return eval(a.source(), {"torch": torch, **dims})
    return a


_ELEM_OF = {torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.float16: "f16",
            torch.bfloat16: "bf16", torch.float32: "f32", torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}


def run_eager(op, x, dims, t=None):
    """The op's eager function on ``x`` (``t``: the input type it is bound for, else read off ``x``)."""
    t = t or TensorType(ET[_ELEM_OF[x.dtype]], tuple(Const(n) for n in x.shape))
    fn, args = op.impl(t)
    assert fn is type(op).eager, "impl calls the eager function the op declares (converters reserve its name)"
    return fn(x, *(eval_arg(a, dims) for a in args))


def run_map(op, t, x, dims):
    return im.gather(op.index_map(t), x, dims)


# ---------------------------------------------------------------------------
# naive references per op (x -> expected bits), from the documented formulas


def naive_rows(order_fn):
    def ref(op, t, x, dims):
        d = op.dim % x.dim()
        return along_axis_fill(x, d, order_fn(op, x.shape[d]), 0)

    return ref


def naive_crop(op, t, x, dims):
    d = op.dim % x.dim()
    return along_axis_fill(x, d, order_crop(x.shape[d], op.parts, eval_arg(op.size, dims)), 0)


def naive_reshape(op, t, x, dims):
    new = eval_arg(op.shape, dims)
    old = tuple(x.shape)

    def src(o):
        lin = 0
        for c, n in zip(o, new):
            lin = lin * n + c
        coords = []
        for n in reversed(old):
            coords.append(lin % n)
            lin //= n
        return tuple(reversed(coords))

    return naive_gather(x, new, src)


def naive_transpose(op, t, x, dims):
    a, b = op.dim0 % x.dim(), op.dim1 % x.dim()
    out_shape = list(x.shape)
    out_shape[a], out_shape[b] = out_shape[b], out_shape[a]

    def src(o):
        o = list(o)
        o[a], o[b] = o[b], o[a]
        return tuple(o)

    return naive_gather(x, out_shape, src)


def naive_block_major_k(op, t, x, dims):
    *lead, r, k = x.shape
    b = op.block
    out_shape = (*lead, k // b, r, b)

    def src(o):  # out[.., kb, r, j] = in[.., r, kb*b + j]
        *head, kb, row, j = o
        return (*head, row, kb * b + j)

    return naive_gather(x, out_shape, src)


def naive_unblock_major_k(op, t, x, dims):
    *lead, kb, r, b = x.shape

    def src(o):
        *head, row, k = o
        return (*head, k // b, row, k % b)

    return naive_gather(x, (*lead, r, kb * b), src)


def _signed(v, width):
    return v - (1 << width) if v >= 1 << (width - 1) else v


def naive_view(op, t, x, dims):
    return bits(x).clone()  # same bits, new label


NAIVE_CASTS = {
    ("f32", "bf16"): (naive_f32_to_bf16_bits, 16),
    ("f32", "f16"): (naive_f32_to_f16_bits, 16),
    ("bf16", "f32"): (naive_bf16_to_f32_bits, 32),
    ("f16", "f32"): (naive_f16_to_f32_bits, 32),
}


#: (exponent bits, mantissa bits) of the types a scaled cast writes
FLOAT_FIELDS = {"bf16": (8, 7), "f16": (5, 10), "f32": (8, 23)}


def naive_scale_bits(v: int, to: str, exp: int) -> int:
    """Bits of the value with bits ``v`` (type ``to``) times 2**exp: its exponent field plus exp, all ones
    (inf) past the largest; zeros and NaN unchanged. Normal values only (the cases' inputs)."""
    e_bits, m_bits = FLOAT_FIELDS[to]
    field = (v >> m_bits) & ((1 << e_bits) - 1)
    if field == 0 or field == (1 << e_bits) - 1:
        assert v & ((1 << (e_bits + m_bits)) - 1) == 0 or field, "subnormal input: not covered here"
        return v
    field += exp
    sign = v & (1 << (e_bits + m_bits))
    if field >= (1 << e_bits) - 1:
        return sign | (((1 << e_bits) - 1) << m_bits)
    return sign | (field << m_bits) | (v & ((1 << m_bits) - 1))


def naive_cast(op, t, x, dims):
    conv = NAIVE_CASTS.get((t.elem.name, op.to.name))
    if conv is None:
        return None
    fn, width = conv
    mask = (1 << (8 * x.element_size())) - 1
    vals = [fn(v & mask) for v in bits(x).reshape(-1).tolist()]
    if op.exp:
        vals = [naive_scale_bits(v, op.to.name, op.exp) for v in vals]
    return torch.tensor([_signed(v, width) for v in vals], dtype={16: torch.int16, 32: torch.int32}[width]).reshape(x.shape)


def _pattern_sides(pattern):
    """The test's own reading of a rearrange pattern: per side, groups of names ('...' dropped)."""
    out = []
    for side in pattern.split("->"):
        groups, current = [], None
        for tok in side.replace("(", " ( ").replace(")", " ) ").split():
            if tok == "...":
                continue
            if tok == "(":
                current = []
            elif tok == ")":
                groups.append(tuple(current))
                current = None
            elif current is not None:
                current.append(tok)
            else:
                groups.append((tok,))
        out.append(groups)
    return out


def naive_rearrange(op, t, x, dims):
    left, right = _pattern_sides(op.pattern)
    given = {k: eval_arg(v, dims) for k, v in op.sizes}
    lead = x.dim() - len(left)
    sizes = dict(given)
    for group, n in zip(left, x.shape[lead:]):
        known = math.prod(sizes[g] for g in group if g in sizes)
        for g in group:
            sizes.setdefault(g, n // known)
    out_shape = tuple(x.shape[:lead]) + tuple(math.prod(sizes[g] for g in group) for group in right)

    def src(o):
        named = {}
        for group, v in zip(right, o[lead:]):  # each output axis: its names, row-major
            for g in reversed(group):
                named[g], v = v % sizes[g], v // sizes[g]
        coords = []
        for group in left:
            v = 0
            for g in group:
                v = v * sizes[g] + named[g]
            coords.append(v)
        return tuple(o[:lead]) + tuple(coords)

    return naive_gather(x, out_shape, src)


def naive_permute(op, t, x, dims):
    d = op.dim % x.dim()
    n = x.shape[d]
    formula = op.formula() if isinstance(op, permute.Permute) else op.src
    order = [int(ex.evaluate(formula, {**dims, "r": r, "n": n})) for r in range(n)]
    if isinstance(op, permute.InversePermute):
        order = invert(order)
    return along_axis_fill(x, d, order, 0)


def naive_permute_bits(op, t, x, dims):
    w = len(op.table) // 8
    raw = bits(x).reshape(-1).tolist()
    out = []
    for k in range(0, len(raw), w):
        word = sum((raw[k + i] & 0xFF) << (8 * i) for i in range(w))
        res = sum(((word >> op.table[i]) & 1) << i for i in range(len(op.table)))
        out += [(res >> (8 * i)) & 0xFF for i in range(w)]
    return torch.tensor(out, dtype=torch.uint8).reshape(x.shape)


def naive_bit_field(op, t, x, dims):
    width_in, width_out = 8 * x.element_size(), op.to.bits
    mask_in = (1 << width_in) - 1
    vals = []
    for v in bits(x).reshape(-1).tolist():
        v &= mask_in
        if isinstance(op, value.ExtractBits):
            r = (v >> op.shift) & ((1 << op.width) - 1)
        else:
            r = ((v & ((1 << op.width) - 1)) << op.shift) & ((1 << width_out) - 1)
        vals.append(_signed(r, width_out) if width_out > 8 else r)
    return torch.tensor(vals, dtype={8: torch.uint8, 16: torch.int16, 32: torch.int32}[width_out]).reshape(x.shape)


def naive_map_bits(op, t, x, dims):
    width_in = 8 * x.element_size()
    vals = []
    for v in bits(x).reshape(-1).tolist():
        v &= (1 << width_in) - 1
        fields = [(v >> (f * op.width)) & ((1 << op.width) - 1) for f in range(width_in // op.width)]
        r = sum(op.table[u] << (f * op.width) for f, u in enumerate(fields))
        vals.append(_signed(r, width_in) if width_in > 8 else r)
    return torch.tensor(vals, dtype={8: torch.uint8, 16: torch.int16, 32: torch.int32}[width_in]).reshape(x.shape)


def naive_reinterpret(op, t, x, dims):
    raw = bytes(bits(x).contiguous().view(torch.uint8).reshape(-1).tolist())
    w = op.to.bits // 8
    vals = [int.from_bytes(raw[k:k + w], "little", signed=w > 1) for k in range(0, len(raw), w)]
    shape_ = tuple(x.shape[:-1]) + (x.shape[-1] * x.element_size() // w,)
    return torch.tensor(vals, dtype={1: torch.uint8, 2: torch.int16, 4: torch.int32}[w]).reshape(shape_)


NAIVE = {
    "swap_halves": naive_rows(lambda op, n: order_swap_halves(n)),
    "interleave_rows": naive_rows(lambda op, n: order_interleave(n, op.group)),
    "reorder_gated_rows": naive_rows(lambda op, n: order_reorder_gated(n)),
    "deinterleave": naive_rows(lambda op, n: order_deinterleave(n, op.group)),
    "swap_pairs": naive_rows(lambda op, n: order_swap_pairs(n)),
    "rearrange": naive_rearrange,
    "permute": naive_permute,
    "inverse_permute": naive_permute,
    "permute_bits": naive_permute_bits,
    "extract_bits": naive_bit_field,
    "insert_bits": naive_bit_field,
    "reinterpret": naive_reinterpret,
    "map_bits": naive_map_bits,
    "pad": lambda op, t, x, dims: along_axis_fill(
        x, op.dim % x.dim(), order_pad(x.shape[op.dim % x.dim()], op.parts, op.multiple), _fill_bits(op.value, x)
    ),
    "crop": naive_crop,
    "repeat_rows": lambda op, t, x, dims: along_axis_fill(
        x, op.dim % x.dim(), [r // op.times for r in range(x.shape[op.dim % x.dim()] * op.times)], 0
    ),
    "block_major_k": naive_block_major_k,
    "unblock_major_k": naive_unblock_major_k,
    "shard": lambda op, t, x, dims: along_axis_fill(
        x, op.dim % x.dim(), order_shard(x.shape[op.dim % x.dim()], op.parts, op.rank, op.ranks), 0
    ),
    "reshape": naive_reshape,
    "transpose": naive_transpose,
    "view": naive_view,
    "cast": naive_cast,
}


def _fill_bits(v, x):
    # the pad value is the fill's bit pattern, whatever x's dtype (as same-width signed bits)
    width = 8 * x.element_size()
    return v - (1 << width) if width > 8 and v >= 1 << (width - 1) else v


# ---------------------------------------------------------------------------
# the cases: (op, input type, dims)

D_EIH = {"E": 2, "I": 4, "H": 16}
r_, n_ = Var("r"), Var("n")
SHUFFLE32 = 32 * (r_ // 32) + 4 * (r_ % 8) + (r_ % 32) // 8  # TRT-LLM's epilogue shuffle, 32-row blocks
UNSHUFFLE32 = 32 * (r_ // 32) + 8 * (r_ % 4) + (r_ % 32) // 4
REVERSE = n_ - 1 - r_


def SIZES(**kw):
    return tuple((k, Const(v)) for k, v in kw.items())


CASES = [
    # row permutations, several dtypes and axes, symbolic and constant shapes
    (rows.SwapHalves(), TT("fp4x2", E_, 2 * I_, ex.div(H_, 2)), D_EIH),
    (rows.SwapHalves(0), TT("f32", 6), {}),
    (rows.SwapHalves(2), TT("bf16", 3, 2, 10), {}),
    (rows.InterleaveRows(group=1), TT("u8", 2, 8, 3), {}),
    (rows.InterleaveRows(group=2), TT("e8m0", E_, 2 * I_, ex.div(H_, 32)), {"E": 2, "I": 4, "H": 64}),
    (rows.InterleaveRows(group=3), TT("bf16", 1, 12, 2), {}),
    (rows.InterleaveRows(0, group=4), TT("f32", 16, 2), {}),
    (rows.ReorderGatedRows(), TT("fp4x2", 2, 10, 4), {}),
    (rows.ReorderGatedRows(0), TT("f32", 8), {}),
    (rows.Deinterleave(group=1), TT("fp4x2", 2, 8, 4), {}),
    (rows.Deinterleave(group=2), TT("bf16", E_, 2 * I_), {"E": 3, "I": 4}),
    (rows.Deinterleave(group=3), TT("u8", 1, 12, 3), {}),
    (rows.Deinterleave(2, group=2), TT("f16", 2, 3, 8), {}),
    (rows.SwapPairs(), TT("fp4x2", 2, 6, 4), {}),
    (rows.SwapPairs(0), TT("f32", 4, 3), {}),
    # permutations given as data
    (permute.Permute(src=SHUFFLE32, inverse_src=UNSHUFFLE32, block=32), TT("fp4x2", 2, 64, 2), {}),
    (permute.Permute(0, src=SHUFFLE32, block=32), TT("bf16", 32, 2), {}),
    (permute.Permute(-1, src=REVERSE), TT("u8", 2, 3, 7), {}),
    (permute.Permute(table=(2, 0, 3, 1)), TT("e4m3", E_, N_, 3), {"E": 2, "N": 8}),
    (permute.Permute(2, table=(1, 0)), TT("f32", 2, 3, 6), {}),
    (permute.InversePermute(src=SHUFFLE32), TT("u8", 1, 64, 2), {}),
    (permute.PermuteBits((16, 17, 18, 8, 9, 10, 0, 1, 2, 19, 25, 26, 11, 24, 27, 3, 20, 21, 22, 12, 13, 14, 4, 5, 6, 23, 29, 30, 15, 28, 31, 7)), TT("fp4x2", 2, 3, 8), {}),
    (permute.PermuteBits(tuple(range(15, -1, -1))), TT("u8", 4, 6), {}),
    (permute.PermuteBits((1, 0, 3, 2, 5, 4, 7, 6)), TT("e8m0", E_, N_), {"E": 2, "N": 5}),
    # rearrange
    (rearrange.Rearrange("... (rb ms f) (kb g) -> ... rb kb f (ms g)", SIZES(ms=4, f=16, g=4)), TT("e8m0", 2, 128, 8), {}),
    (rearrange.Rearrange("... (rb ms f) (kb g) -> ... rb kb f (ms g)", SIZES(ms=4, f=16, g=4)),
     TT("u8", E_, 2 * I_, ex.div(H_, 32)), {"E": 2, "I": 64, "H": 256}),
    (rearrange.Rearrange("a (b c) -> c a b", SIZES(c=2)), TT("bf16", 3, 4), {}),
    (rearrange.Rearrange("... r (kb j) -> ... kb r j", SIZES(j=4)), TT("f32", E_, N_, K_), {"E": 2, "N": 3, "K": 8}),
    (rearrange.Rearrange("... g r8 p a h j t -> ... (g h r8) (p a j t)"), TT("fp4x2", 1, 2, 8, 1, 2, 2, 4, 4), {}),
    # bit fields and width views
    (value.ExtractBits(shift=23, width=8, to=ET["e8m0"]), TT("f32", 3, 5), {}),
    (value.ExtractBits(shift=4, width=4, to=ET["u8"]), TT("fp4x2", 2, 6), {}),
    (value.ExtractBits(shift=3, width=9, to=ET["i16"]), TT("i32", 4), {}),
    (value.InsertBits(shift=23, width=8, to=ET["f32"]), TT("e8m0", 3, 5), {}),
    (value.InsertBits(shift=0, width=4, to=ET["u8"]), TT("u8", 2, 6), {}),
    # fields through a table: CUTLASS W4A8's int4 encoding on packed words, a lossy table, bytes, 2-bit fields
    (lookup.MapBits(width=4, table=(8, 9, 10, 11, 12, 13, 14, 15, 0, 7, 6, 5, 4, 3, 2, 1)), TT("i32", 2, 5), {}),
    (lookup.MapBits(width=4, table=(0,) * 8 + (1,) * 8), TT("u8", 3, 4), {}),
    (lookup.MapBits(width=8, table=tuple((7 * i + 3) % 256 for i in range(256))), TT("fp4x2", 2, 6), {}),
    (lookup.MapBits(width=2, table=(3, 1, 0, 2)), TT("i16", 4), {}),
    (value.Reinterpret(ET["i32"]), TT("u8", 2, 8), {}),
    (value.Reinterpret(ET["u8"]), TT("i32", E_, N_), {"E": 2, "N": 3}),
    (value.Reinterpret(ET["i16"]), TT("e8m0", 3, 4), {}),
    (value.Reinterpret(ET["f32"]), TT("bf16", 2, 6), {}),
    # shape ops
    (shape.Pad(1, multiple=4, parts=2), TT("fp4x2", 2, 6, 3), {}),
    (shape.Pad(1, multiple=4, parts=2, value=7), TT("u8", E_, 2 * I_, 2), {"E": 1, "I": 3}),
    (shape.Pad(2, multiple=8), TT("bf16", 2, 3, 5), {}),
    (shape.Pad(0, multiple=1), TT("f32", 5, 2), {}),
    (shape.Pad(1, multiple=64, parts=1, value=255), TT("fp4x2", 1, 3, 40), {}),
    (shape.Pad(1, multiple=3, parts=3, value=1), TT("f32", 2, 12, 2), {}),
    (shape.Crop(1, size=Const(3), parts=2), TT("fp4x2", 2, 8, 3), {}),
    (shape.Crop(1, size=I_, parts=2), TT("bf16", E_, 2 * ex.round_up(I_, 4), 2), {"E": 2, "I": 3}),
    (shape.Crop(2, size=Const(2)), TT("u8", 2, 3, 5), {}),
    (shape.RepeatRows(1, times=4), TT("f32", 2, 3, 5), {}),
    (shape.RepeatRows(-2, times=128), TT("u8", E_, I_, 2), {"E": 1, "I": 3}),
    (shape.BlockMajorK(block=4), TT("bf16", E_, 2 * I_, 4 * H_), D_EIH),
    (shape.BlockMajorK(block=2), TT("fp4x2", 3, 6), {}),
    (shape.BlockMajorK(block=128), TT("e4m3", 1, 5, 256), {}),
    (shape.UnblockMajorK(), TT("u8", 2, 3, 5, 4), {}),
    (shape.UnblockMajorK(), TT("f32", E_, 2, I_, 8), {"E": 2, "I": 3}),
    (shape.Shard(1, parts=2, rank=1, ranks=2), TT("fp4x2", E_, 2 * I_, ex.div(H_, 2)), D_EIH),
    (shape.Shard(1, parts=2, rank=2, ranks=3), TT("f32", 2, 12), {}),
    (shape.Shard(2, rank=0, ranks=4), TT("e8m0", 2, 3, 8), {}),
    (shape.Shard(1, parts=1, rank=0, ranks=1), TT("bf16", 2, 6), {}),
    (shape.Reshape((Const(12), Const(4))), TT("f32", 2, 6, 4), {}),
    (shape.Reshape((E_ * 2 * I_, ex.div(H_, 2))), TT("fp4x2", E_, 2 * I_, ex.div(H_, 2)), D_EIH),
    (shape.Reshape((Const(2), Const(3), Const(2), Const(2))), TT("bf16", 4, 6), {}),
    (shape.Transpose(1, 2), TT("f32", 2, 3, 5), {}),
    (shape.Transpose(0, 1), TT("u8", E_, 2 * I_), {"E": 3, "I": 2}),
    (shape.Transpose(0, 2), TT("bf16", 2, 3, 4), {}),
    # value ops
    (value.View(ET["e4m3"]), TT("e8m0", 4, 6), {}),
    (value.View(ET["u8"]), TT("fp4x2", 3, 4), {}),
    (value.View(ET["f16"]), TT("bf16", 5, 3), {}),
    (value.View(ET["i32"]), TT("f32", 2, 7), {}),
    (value.Cast(ET["bf16"]), TT("f32", 4, 9), {}),
    (value.Cast(ET["f16"]), TT("f32", 3, 8), {}),
    (value.Cast(ET["f32"]), TT("bf16", 6, 5), {}),
    (value.Cast(ET["f32"]), TT("f16", 6, 5), {}),
    (value.Cast(ET["e4m3"]), TT("f32", 2, 8), {}),
    # scaled casts (vLLM's Marlin NVFP4 scales and global scales): rounded, then times 2**exp
    (value.Cast(ET["f16"], exp=7), TT("e4m3", 4, 9), {}),
    (value.Cast(ET["bf16"], exp=119), TT("f32", 3, 8), {}),
    (value.Cast(ET["f16"], exp=7), TT("f32", 3, 8), {}),
]


def _case_id(case):
    op, t, dims = case
    return f"{op}-{t}-{dims}".replace(" ", "")


def make_input(op, t, dims, seed=0):
    shape_ = concrete(t, dims)
    dtype = t.elem.torch_dtype
    if isinstance(op, value.Cast):
        # finite values in range of every target (no overflow to inf in f16 / e4m3)
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(shape_, generator=g) * 50).to(dtype)
    return random_tensor(shape_, dtype, seed)


def test_every_registered_primitive_has_cases():
    covered = {op.name for op, _, _ in CASES}
    assert covered == set(REGISTRY), set(REGISTRY) ^ covered


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_map_eager_and_naive_agree(case):
    op, t, dims = case
    seed = zlib.crc32(_case_id(case).encode()) % 1000
    x = make_input(op, t, dims, seed)
    out_t = op.infer(t).type
    eager = run_eager(op, x, dims, t)
    naive = NAIVE[op.name](op, t, x, dims)
    if isinstance(op, permute.InversePermute):  # eager only: it has no index map (see its docstring)
        with pytest.raises(OpTypeError):
            op.index_map(t)
        assert_bits_equal(bits(eager), naive, "eager vs naive")
        return
    gathered = run_map(op, t, x, dims)

    # shapes and dtype agree with inference
    want_shape = concrete(out_t, dims)
    assert tuple(eager.shape) == want_shape
    assert tuple(gathered.shape) == want_shape
    assert eager.dtype == out_t.elem.torch_dtype
    # the eager function never writes to its input
    assert_bits_equal(x, make_input(op, t, dims, seed), "input untouched")

    if op.category is Category.VALUE:
        # the index map is the identity; the element changes by view / cast / bit field
        assert_bits_equal(gathered, x, "identity map")
        if isinstance(op, (value.View, value.Cast)):
            relabel = gathered.view(op.to.torch_dtype) if isinstance(op, value.View) else gathered.to(op.to.torch_dtype)
            if isinstance(op, value.Cast) and op.exp:
                relabel = relabel * 2.0**op.exp  # rounded first, then scaled (exact below the largest value)
            assert_bits_equal(relabel, eager, "map vs eager")
    elif op.bit_level and eager.element_size() != x.element_size():  # a view across widths
        assert_bits_equal(gathered.view(eager.dtype), eager, "index map vs eager")
    else:
        assert gathered.dtype == x.dtype
        assert_bits_equal(gathered, eager, "index map vs eager")
    if naive is not None:
        assert_bits_equal(bits(eager), naive, "eager vs naive")


# ---------------------------------------------------------------------------
# the SM90 bit table and kernel, from FlashInfer's CUDA source

SRC = kernel_source()
needs_src = pytest.mark.skipif(SRC is None, reason="FlashInfer's CUDA sources are not installed")


@needs_src
def test_sm90_bit_table_matches_the_kernel_source():
    ops = parse_mask_shifts(SRC)
    assert len(ops) == 18, ops  # the kernel's 18 masked shifts
    masks = 0
    for mask, _, _ in ops:
        assert masks & mask == 0, "masks overlap"
        masks |= mask
    assert masks == 0xFFFFFFFF
    table = table_from_mask_shifts(ops)
    assert sorted(table) == list(range(32))
    assert tuple(table) == DESIGN_T
    prelude_table = next(st.op.table for st in family_chain("sm90_mixed", "weight", TT("fp4x2", 16, 32))
                         if isinstance(st.op, permute.PermuteBits))
    assert tuple(table) == prelude_table  # the prelude's sm90_mixed family carries the kernel's table


@needs_src
def test_kernel_launch_shape_is_what_the_transcription_assumes():
    # the transcription runs lanes 0..15: blockDim.x of the fp4 launcher
    start = SRC.index("void interleave_fp4_weights_for_sm90_mixed_gemm(")
    launcher = SRC[start:SRC.index("}", start)]
    assert "dim3 block(16, 32)" in launcher
    body = kernel_body(SRC, "interleave_fp4_weights_for_sm90_mixed_gemm_kernel")
    assert "int lane_id = threadIdx.x;" in body
    assert "block_id < rows / 2" in body and "partition_id < cols / 64" in body


@needs_src
@pytest.mark.parametrize("shape_", [(16, 32), (2, 32, 64), (1, 48, 96), (2, 16, 64)])
def test_sm90_interleave_matches_a_transcription_of_the_kernel(shape_):
    ops = parse_mask_shifts(SRC)
    w = random_tensor(shape_, torch.uint8, seed=sum(shape_))
    want = kernel_sm90_fp4(w, ops)
    assert_bits_equal(naive_sm90_interleave(w), want, "design formula vs kernel transcription")
    eager, mapped = run_family("sm90_mixed", "weight", TT("fp4x2", *shape_), w)
    assert_bits_equal(eager, want, "eager chain vs kernel transcription")
    assert_bits_equal(mapped, want, "composed map vs kernel transcription")


def run_family(family, role, t, x, dims=None, params=None):
    """(eager chain output, composed-map output) of a prelude family's chain for ``role``."""
    dims = dims or {}
    steps = family_chain(family, role, t, params, set(dims))
    y = x
    for step in steps:
        y = run_eager(step.op, y, dims, step.in_type)
    m = im.compose_all([step.op.index_map(step.in_type) for step in steps])
    return y, im.gather(m, x, dims)


def test_sm90_interleave_moves_sign_bits_only_within_words():
    # one set bit at a time: each lands on exactly one output bit, per the table
    w = torch.zeros(16, 32, dtype=torch.uint8)
    t = TT("fp4x2", 16, 32)
    for r, c, b in [(0, 0, 3), (8, 4, 7), (3, 13, 0), (15, 31, 5)]:
        x = w.clone()
        x[r, c] = 1 << b
        eager, mapped = run_family("sm90_mixed", "weight", t, x)
        assert int((bits(mapped) != 0).sum()) == 1
        assert torch.equal(mapped, eager)
        assert torch.equal(mapped, naive_sm90_interleave(x))


def test_sm90_interleave_is_not_a_byte_map():
    steps = family_chain("sm90_mixed", "weight", TT("fp4x2", 16, 32))
    m = im.compose_all([step.op.index_map(step.in_type) for step in steps])
    assert m.bit_level
    assert im.drop_bit_axis(m) is None


# ---------------------------------------------------------------------------
# inverse laws (hypothesis over shapes satisfying each op's divisibility)


def _maybe_symbolic(draw, shape_, keep=0):
    """The shape as constants, or as dims d0, d1, ... bound in ``dims`` (the last
    ``keep`` sizes stay constants)."""
    n = len(shape_) - keep
    if draw(st.booleans()):
        return tuple(Const(s) for s in shape_), {}
    names = [f"d{i}" for i in range(n)]
    return tuple(Var(v) for v in names) + tuple(Const(s) for s in shape_[n:]), dict(zip(names, shape_[:n]))


ROW_OPS = {
    "swap_halves": lambda g: rows.SwapHalves(),
    "interleave_rows": lambda g: rows.InterleaveRows(group=g),
    "reorder_gated_rows": lambda g: rows.ReorderGatedRows(),
    "deinterleave": lambda g: rows.Deinterleave(group=g),
    "swap_pairs": lambda g: rows.SwapPairs(),
}
#: Permutations by formula, with the inverse given, and the block they permute.
FORMULAS = [(SHUFFLE32, UNSHUFFLE32, 32), (REVERSE, REVERSE, 1), ((r_ + 3) % n_, (r_ + n_ - 3) % n_, 1)]


@st.composite
def op_and_input(draw, name):
    dtype_elem = draw(st.sampled_from(["u8", "fp4x2", "bf16", "f32", "e8m0"]))
    if name in ROW_OPS:
        g = draw(st.integers(1, 3))
        op = ROW_OPS[name](g)
        rank = draw(st.integers(1, 3))
        d = draw(st.integers(0, rank - 1))
        op = type(op)(d, **{k: getattr(op, k) for k in ("group", "epilogue_tile") if hasattr(op, k)})
        mult = op.infer(TT("u8", *([64] * rank))).requires[0].multiple
        shp = [draw(st.integers(1, 3)) for _ in range(rank)]
        shp[d] = mult * draw(st.integers(1, 3))
    elif name in ("permute", "inverse_permute"):
        rank = draw(st.integers(1, 3))
        d = draw(st.integers(0, rank - 1))
        shp = [draw(st.integers(1, 3)) for _ in range(rank)]
        if draw(st.booleans()) and name == "permute":
            table = tuple(draw(st.permutations(range(draw(st.integers(1, 5))))))
            op = permute.Permute(d, table=table)
            shp[d] = len(table) * draw(st.integers(1, 3))
        else:
            src, inv, block = draw(st.sampled_from(FORMULAS))
            op = (permute.Permute(d, src=src, inverse_src=inv, block=block) if name == "permute"
                  else permute.InversePermute(d, src=src, block=block))
            shp[d] = block * draw(st.integers(1, 3)) + (0 if block > 1 else draw(st.integers(3, 6)))
    elif name == "permute_bits":
        dtype_elem = draw(st.sampled_from(["u8", "fp4x2", "e8m0"]))
        word = draw(st.sampled_from([8, 16, 32]))
        op = permute.PermuteBits(tuple(draw(st.permutations(range(word)))))
        shp = [draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 2)))] + [word // 8 * draw(st.integers(1, 4))]
    elif name == "rearrange":
        a, b, c = (draw(st.integers(1, 3)) for _ in range(3))
        pattern = draw(st.sampled_from(["... (a b) c -> ... c (b a)", "(a b) c -> b c a", "... a (b c) -> ... (c a) b"]))
        op = rearrange.Rearrange(pattern, SIZES(a=a, b=b) if "(a b)" in pattern else SIZES(b=b, c=c))
        lead = [draw(st.integers(1, 2))] if pattern.startswith("...") and draw(st.booleans()) else []
        shp = lead + ([a * b, c] if "(a b)" in pattern else [a, b * c])
    elif name in ("extract_bits", "insert_bits"):
        dtype_elem, to, shift, width = draw(st.sampled_from(
            [("f32", "e8m0", 23, 8), ("u8", "u8", 4, 4), ("i16", "u8", 3, 8), ("i32", "u8", 9, 8), ("f32", "i16", 20, 11)]))
        if name == "insert_bits":
            dtype_elem, to = to, dtype_elem
        op = (value.ExtractBits if name == "extract_bits" else value.InsertBits)(shift=shift, width=width, to=ET[to])
        shp = [draw(st.integers(1, 5)) for _ in range(draw(st.integers(1, 3)))]
    elif name == "map_bits":
        dtype_elem = draw(st.sampled_from(["u8", "fp4x2", "i16", "i32"]))
        width = draw(st.sampled_from([1, 2, 4, 8]))
        op = lookup.MapBits(width=width, table=tuple(draw(st.permutations(range(1 << width)))))
        shp = [draw(st.integers(1, 5)) for _ in range(draw(st.integers(1, 3)))]
    elif name == "reinterpret":
        dtype_elem, to = draw(st.sampled_from([("u8", "i32"), ("i32", "u8"), ("e8m0", "i16"), ("bf16", "f32"),
                                                ("f32", "bf16"), ("fp4x2", "i32")]))
        op = value.Reinterpret(ET[to])
        ratio = max(1, ET[to].bits // ET[dtype_elem].bits)
        shp = [draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 2)))] + [ratio * draw(st.integers(1, 3))]
    elif name == "pad":
        rank = draw(st.integers(1, 3))
        d = draw(st.integers(0, rank - 1))
        parts = draw(st.integers(1, 3))
        shp = [draw(st.integers(1, 4)) for _ in range(rank)]
        shp[d] = parts * draw(st.integers(1, 5))
        op = shape.Pad(d, multiple=draw(st.integers(1, 6)), parts=parts, value=draw(st.integers(0, 255)))
    elif name == "reshape":
        shp = [draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 3)))]
        n = math.prod(shp)
        new = []
        for _ in range(draw(st.integers(0, 2))):
            f = draw(st.sampled_from([k for k in range(1, n + 1) if n % k == 0]))
            new.append(f)
            n //= f
        new.append(n)
        op = shape.Reshape(tuple(Const(v) for v in new))
    elif name in ("block_major_k", "unblock_major_k"):
        b = draw(st.integers(1, 5))
        lead = [draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 2)))]
        if name == "block_major_k":
            op, shp = shape.BlockMajorK(block=b), lead + [draw(st.integers(1, 4)), b * draw(st.integers(1, 4))]
        else:
            op, shp = shape.UnblockMajorK(), lead + [draw(st.integers(1, 4)), draw(st.integers(1, 4)), b]
    elif name == "transpose":
        rank = draw(st.integers(1, 4))
        shp = [draw(st.integers(1, 4)) for _ in range(rank)]
        op = shape.Transpose(draw(st.integers(0, rank - 1)), draw(st.integers(0, rank - 1)))
    elif name == "view":
        pairs = [("u8", "e8m0"), ("e8m0", "e4m3"), ("fp4x2", "u8"), ("bf16", "f16"), ("f32", "i32"), ("i8", "u8")]
        dtype_elem, to = draw(st.sampled_from(pairs))
        op = value.View(ET[to])
        shp = [draw(st.integers(1, 5)) for _ in range(draw(st.integers(1, 3)))]
    elif name == "cast":
        dtype_elem, to = draw(st.sampled_from([("bf16", "f32"), ("f16", "f32"), ("i8", "i32"), ("i16", "f32")]))
        op = value.Cast(ET[to])
        shp = [draw(st.integers(1, 5)) for _ in range(draw(st.integers(1, 3)))]
    else:  # pragma: no cover
        raise AssertionError(name)
    if name in ("reshape", "unblock_major_k", "rearrange", "reinterpret", "permute_bits"):
        shp_exprs, dims = tuple(Const(s) for s in shp), {}
    else:
        shp_exprs, dims = _maybe_symbolic(draw, shp)
    t = TensorType(ET[dtype_elem], shp_exprs)
    seed = draw(st.integers(0, 2**16))
    x = random_tensor(shp, ET[dtype_elem].torch_dtype, seed)
    if name == "cast":
        x = random_tensor(shp, torch.uint8, seed).to(ET[dtype_elem].torch_dtype)  # small finite values
    if name == "extract_bits":  # extract undoes insert on insert's image: other bits zero
        inner = random_tensor(shp, ET[op.to.name].torch_dtype, seed)
        x = run_eager(value.InsertBits(shift=op.shift, width=op.width, to=ET[dtype_elem]), inner, {})
    if name == "insert_bits":  # insert keeps a field: inputs that fit in it
        x = run_eager(value.ExtractBits(shift=0, width=op.width, to=ET[dtype_elem]), x, {})
    return op, t, dims, x


INVERTIBLE = [n for n in REGISTRY if n not in ("crop", "shard", "repeat_rows")]
LEFT_ONLY = {"pad", "extract_bits", "insert_bits"}  # inverse(op(x)) == x on their domains only


@pytest.mark.parametrize("name", INVERTIBLE)
@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_inverse_undoes_the_op(name, data):
    op, t, dims, x = data.draw(op_and_input(name))
    inv = op.inverse(t)
    assert inv is not None
    out_t = op.infer(t).type
    y = run_eager(op, x, dims, t)
    back = run_eager(inv, y, dims, out_t)
    assert_bits_equal(back, x, f"eager {inv} after {op}")
    assert back.dtype == x.dtype
    # the index maps undo each other too, one after the other and composed into one map
    # (an eager-only inverse, inverse_permute of a formula given without inverse=, has no map)
    if not isinstance(inv, permute.InversePermute) and not isinstance(op, permute.InversePermute):
        fwd, bwd = op.index_map(t), inv.index_map(out_t)
        mid = im.gather(fwd, x, dims, out_t.elem.torch_dtype if fwd.bit_level else None)
        assert_bits_equal(im.gather(bwd, mid, dims, x.dtype if bwd.bit_level else None), x, "inverse map after map")
        assert_bits_equal(im.gather(im.compose(fwd, bwd), x, dims, x.dtype if fwd.bit_level else None), x,
                          "composed index map")
    # the inverse's type is the input type again
    assert inv.infer(out_t).type.elem == t.elem
    assert im.concrete_shape(inv.infer(out_t).type.shape, dims) == tuple(x.shape)
    if name not in LEFT_ONLY and op.category is not Category.VALUE:
        # a bijection: the op also undoes its inverse
        z = random_tensor(tuple(y.shape), y.dtype, 7)
        assert_bits_equal(run_eager(op, run_eager(inv, z, dims, out_t), dims, t), z, "op after inverse")


def test_repeat_rows_has_no_inverse():
    assert shape.RepeatRows(1, times=2).inverse(TT("u8", 2, 4)) is None


def test_crop_has_no_inverse():
    assert shape.Crop(1, size=Const(2)).inverse(TT("u8", 2, 4)) is None


def test_a_real_shard_has_no_inverse_and_one_rank_of_one_is_its_own():
    assert shape.Shard(1, rank=0, ranks=2).inverse(TT("u8", 2, 4)) is None
    one = shape.Shard(1, parts=2)
    assert one.inverse(TT("u8", 2, 4)) == one
    x = random_tensor((2, 4), torch.uint8, 1)
    assert_bits_equal(run_eager(one, x, {}), x)


def test_shard_rank_must_be_below_ranks():
    with pytest.raises(OpTypeError, match="rank=2 must be below ranks=2"):
        shape.Shard(1, rank=2, ranks=2)


@pytest.mark.parametrize(
    "op,t",
    [
        (shape.Pad(1, multiple=4, parts=2, value=3), TT("u8", 2, 6, 3)),
        (value.ExtractBits(shift=4, width=4, to=ET["u8"]), TT("u8", 2, 6)),
    ],
)
def test_padding_ops_are_only_left_invertible(op, t):
    x = random_tensor(concrete(t, {}), t.elem.torch_dtype, 3)
    if isinstance(op, value.ExtractBits):  # on its image: the other bits zero
        x = x & 0xF0
    inv = op.inverse(t)
    y = run_eager(op, x, {})
    assert_bits_equal(run_eager(inv, y, {}), x)
    # the other way round loses whatever was in the padding
    z = random_tensor(tuple(y.shape), y.dtype, 4)
    assert not torch.equal(bits(run_eager(op, run_eager(inv, z, {}), {})), bits(z))


def test_cast_inverse_is_exact_only_when_widening():
    assert value.Cast(ET["f32"]).is_exact(TT("bf16", 3))
    assert not value.Cast(ET["bf16"]).is_exact(TT("f32", 3))
    assert not value.Cast(ET["e4m3"]).is_exact(TT("f32", 3))
    assert value.Cast(ET["f16"]).is_exact(TT("e4m3", 3)) and value.Cast(ET["bf16"]).is_exact(TT("bf16", 3))
    # same width but different exponent ranges, and more integer bits than f32's mantissa: not exact
    assert not value.Cast(ET["f16"]).is_exact(TT("bf16", 3))
    assert not value.Cast(ET["bf16"]).is_exact(TT("f16", 3))
    assert not value.Cast(ET["f32"]).is_exact(TT("i32", 3))
    x = torch.tensor([1.0 + 2**-10, 3.0], dtype=torch.float32)
    inv = value.Cast(ET["bf16"]).inverse(TT("f32", 2))
    assert not torch.equal(run_eager(inv, run_eager(value.Cast(ET["bf16"]), x, {}), {}), x)


# Regression: ops with a ``dim`` accept a negative one (check_dim normalizes it for infer
# and index_map), and op.impl() passed it to torch_impl unnormalized, whose functions
# index ``dim + 1`` (RuntimeError or the wrong axis).
NEG_DIM_CASES = [
    (rows.SwapHalves(-1), TT("u8", 2, 3, 8)),
    (rows.InterleaveRows(-1, group=2), TT("u8", 2, 3, 8)),
    (rows.ReorderGatedRows(-2), TT("u8", 2, 4, 3)),
    (rows.Deinterleave(-1, group=2), TT("u8", 2, 3, 8)),
    (rows.SwapPairs(-1), TT("u8", 2, 3, 8)),
    (permute.Permute(-1, src=SHUFFLE32, block=32), TT("u8", 2, 32)),
    (permute.Permute(-2, table=(1, 2, 0)), TT("u8", 6, 3)),
    (shape.Pad(-1, multiple=4, parts=2), TT("u8", 2, 3, 6)),
    (shape.Crop(-1, size=Const(2), parts=2), TT("u8", 2, 3, 6)),
    (shape.RepeatRows(-1, times=3), TT("u8", 2, 3, 6)),
    (shape.Shard(-1, parts=2, rank=1, ranks=3), TT("u8", 2, 3, 6)),
    (shape.Transpose(-1, 0), TT("u8", 2, 3, 4)),
]


@pytest.mark.parametrize("op,t", NEG_DIM_CASES, ids=lambda v: str(v))
def test_negative_dim_eager_matches_index_map(op, t):
    x = random_tensor(concrete(t, {}), torch.uint8, 5)
    eager = run_eager(op, x, {})
    assert tuple(eager.shape) == concrete(op.infer(t).type, {})
    assert_bits_equal(eager, run_map(op, t, x, {}))


def test_negative_dim_index_map_is_the_last_axis():
    # the index map (the definition) treats dim=-1 as the last axis
    t = TT("u8", 2, 3, 8)
    x = random_tensor((2, 3, 8), torch.uint8, 5)
    assert_bits_equal(run_map(rows.SwapPairs(-1), t, x, {}), run_map(rows.SwapPairs(2), t, x, {}))


# ---------------------------------------------------------------------------
# inference: output shapes, requirements, type errors


def _reqs(op, t):
    return sorted((ex.to_str(r.value), r.multiple) for r in op.infer(t).requires)


@pytest.mark.parametrize(
    "op,t,want",
    [
        (rows.SwapHalves(), TT("u8", E_, N_, K_), [("N", 2)]),
        (rows.InterleaveRows(group=64), TT("u8", E_, N_, K_), [("N", 128)]),
        (rows.InterleaveRows(0, group=3), TT("u8", N_, K_), [("N", 6)]),
        (rows.ReorderGatedRows(), TT("u8", E_, N_, K_), [("N", 2)]),
        (rows.Deinterleave(group=4), TT("u8", E_, N_, K_), [("N", 8)]),
        (rows.SwapPairs(2), TT("u8", E_, N_, K_), [("K", 2)]),
        (permute.Permute(src=SHUFFLE32, block=32), TT("u8", E_, N_, K_), [("N", 32)]),
        (permute.Permute(table=(1, 0, 2)), TT("u8", E_, N_, K_), [("N", 3)]),
        (permute.Permute(src=REVERSE), TT("u8", E_, N_, K_), []),
        (permute.PermuteBits(tuple(range(32))), TT("fp4x2", E_, N_, K_), [("K", 4)]),
        (rearrange.Rearrange("... (rb ms f) (kb g) -> ... rb kb f (ms g)", SIZES(ms=4, f=16, g=4)),
         TT("e8m0", E_, R_, C_), [("C", 4), ("R", 64)]),
        (value.Reinterpret(ET["i32"]), TT("u8", E_, N_, K_), [("K", 4)]),
        (value.Reinterpret(ET["u8"]), TT("i32", E_, N_, K_), []),
        (shape.Pad(1, multiple=8, parts=2), TT("u8", E_, N_, K_), [("N", 2)]),
        (shape.Pad(1, multiple=8), TT("u8", E_, N_, K_), []),
        (shape.Crop(1, size=I_, parts=2), TT("u8", E_, N_, K_), [("I < N/2 + 1", 0), ("N", 2)]),
        (shape.Shard(1, parts=2, rank=1, ranks=4), TT("u8", E_, N_, K_), [("N", 8)]),
        (shape.BlockMajorK(block=64), TT("bf16", E_, N_, K_), [("K", 64)]),
        (shape.UnblockMajorK(), TT("bf16", E_, K_, N_, Const(64)), []),
        (shape.Transpose(1, 2), TT("u8", E_, N_, K_), []),
        (value.View(ET["e4m3"]), TT("e8m0", E_, N_), []),
        (value.Cast(ET["bf16"]), TT("f32", E_, N_), []),
    ],
    ids=lambda v: str(v),
)
def test_requirements(op, t, want):
    assert _reqs(op, t) == sorted(want)


def test_requirements_are_needed_by_the_eager_functions():
    # a shape violating a requirement cannot be converted (the eager function fails)
    fold = rearrange.Rearrange("... (rb ms f) (kb g) -> ... rb kb f (ms g)", SIZES(ms=4, f=16, g=4))
    bad = [
        (fold, (1, 32, 4)),
        (fold, (1, 64, 6)),
        (permute.PermuteBits(tuple(range(32))), (1, 8, 6)),
        (value.Reinterpret(ET["i32"]), (1, 2, 6)),
        (rows.InterleaveRows(group=2), (1, 6, 2)),
        (rows.Deinterleave(group=2), (1, 6, 2)),
        (permute.Permute(table=(1, 0, 2)), (1, 16, 2)),
        (rows.SwapPairs(), (1, 5, 2)),
    ]
    for op, shp in bad:
        x = torch.zeros(shp, dtype=torch.uint8)
        t = TT("u8", *shp)
        try:
            reqs = op.infer(t).requires
        except OpTypeError:  # the table's permutation does not fit at all: refused statically
            continue
        assert not all(r.holds({}) for r in reqs), (op, shp)
        with pytest.raises((RuntimeError, ValueError, IndexError)):
            run_eager(op, x, {}, t)


def test_fold_output_shape_is_symbolic():
    t = TT("e8m0", E_, 2 * I_, ex.div(H_, 32))
    out = family_chain("sm90_mixed", "scale", t, dims={"E", "I", "H"})[-1].out_type
    assert out.elem.name == "e8m0"
    assert ex.same_value(out.shape[1], ex.div(I_, 32)) is True
    assert ex.same_value(out.shape[2], ex.div(H_, 128)) is True
    assert out.shape[3:] == (Const(16), Const(16))


def test_swizzle_output_shape_rounds_up():
    out = family_chain("sf_128x4", "scale", TT("e4m3", E_, R_, C_), dims={"E", "R", "C"})[-1].out_type
    assert im.concrete_shape(out.shape, {"E": 2, "R": 129, "C": 5}) == (2, 256, 8)
    assert im.concrete_shape(out.shape, {"E": 2, "R": 128, "C": 4}) == (2, 128, 4)


def test_pad_output_shape_is_per_part():
    out = shape.Pad(1, multiple=4, parts=2).infer(TT("fp4x2", E_, 2 * I_, ex.div(H_, 2))).type
    for i in range(1, 13):
        assert im.concrete_shape(out.shape, {"E": 1, "I": i, "H": 2})[1] == 2 * (-(-i // 4) * 4)


@pytest.mark.parametrize(
    "op,t",
    [
        (value.View(ET["bf16"]), TT("f32", 4)),
        (value.Reinterpret(ET["i32"]), TT("u8")),
        (value.ExtractBits(shift=30, width=8, to=ET["u8"]), TT("f32", 4)),
        (value.ExtractBits(shift=0, width=12, to=ET["u8"]), TT("f32", 4)),
        (value.InsertBits(shift=4, width=8, to=ET["u8"]), TT("u8", 4)),
        (value.Cast(ET["bf16"]), TT("fp4x2", 4)),
        (value.Cast(ET["f32"]), TT("e8m0", 4)),
        (value.Cast(ET["e8m0"]), TT("f32", 4)),
        (value.Cast(ET["fp4x2"]), TT("u8", 4)),
        (permute.PermuteBits(tuple(range(32))), TT("f32", 16, 32)),
        (permute.PermuteBits(tuple(range(32))), TT("bf16", 16, 32)),
        (permute.Permute(src=2 * r_), TT("u8", 2, 8)),  # not a permutation
        (permute.Permute(src=r_ + 1), TT("u8", 2, 8)),  # out of range
        (permute.Permute(src=REVERSE, inverse_src=r_), TT("u8", 2, 8)),  # inverse= does not undo it
        (rearrange.Rearrange("a b c -> c b a"), TT("u8", 2, 4)),
        (rearrange.Rearrange("(a b) -> b a"), TT("u8", 8)),  # two unknown sizes in a group
        (rearrange.Rearrange("... (a b) -> ... b a", SIZES(a=3, b=3)), TT("u8", 2, 8)),
        (rows.SwapHalves(3), TT("u8", 2, 4, 4)),
        (rows.InterleaveRows(-4, group=1), TT("u8", 2, 4, 4)),
        (shape.Transpose(0, 3), TT("u8", 2, 4, 4)),
        (shape.Pad(1, value=256), TT("u8", 2, 4)),
        (shape.Crop(1), TT("u8", 2, 4)),
        (shape.BlockMajorK(block=4), TT("u8", 8)),
        (shape.UnblockMajorK(), TT("u8", 2, 4)),
        (shape.UnblockMajorK(), TT("u8", 2, 4, K_)),
        (shape.Reshape((Const(3), Const(3))), TT("u8", 2, 4)),
        (shape.Reshape((I_, Const(4))), TT("u8", H_, Const(4))),
    ],
    ids=lambda v: str(v),
)
def test_type_errors(op, t):
    with pytest.raises(OpTypeError) as err:
        op.infer(t)
    assert err.value.message


def test_view_across_widths_is_a_reinterpretation():
    op = bind("view", [A("i32")], {}, TT("u8", E_, N_, K_), "weight", set())
    assert isinstance(op, value.Reinterpret)
    assert op.infer(TT("u8", E_, N_, K_)).type.shape[-1] == ex.div(K_, 4)
    assert isinstance(bind("view", [A("e4m3")], {}, TT("e8m0", 2), "scale", set()), value.View)


@pytest.mark.parametrize("pattern, message", [
    ("a b", "left -> right"),
    ("... a -> a ...", "comes first"),
    ("(a b -> a b", "unclosed"),
    ("a b -> a c", "same axes"),
    ("a a -> a", "twice"),
    ("... a -> a", "both sides"),
])
def test_rearrange_pattern_errors(pattern, message):
    with pytest.raises(OpTypeError, match=message):
        rearrange.Rearrange(pattern)


# ---------------------------------------------------------------------------
# the binder


def A(v, text=None):
    if isinstance(v, bool):
        return ArgValue("bool", v, text or str(v).lower())
    if isinstance(v, int):
        return ArgValue("expr", Const(v), text or str(v))
    if isinstance(v, ex.Expr):
        return ArgValue("expr", v, text or ex.to_str(v))
    if isinstance(v, str):
        return ArgValue("expr", Var(v), text or v)
    raise TypeError(v)


def test_bind_builds_the_op_and_normalizes_dims():
    t = TT("u8", E_, N_, K_)
    assert bind("swap_halves", [], {}, t, "weight", set()) == rows.SwapHalves(1)
    assert bind("swap_halves", [A(-1)], {}, t, "weight", set()) == rows.SwapHalves(2)
    assert bind("interleave_rows", [A(1)], {"group": A(64)}, t, "weight", set()) == rows.InterleaveRows(1, group=64)
    assert bind("view", [A("e4m3")], {}, t, "scale", set()) == value.View(ET["e4m3"])
    assert bind("crop", [A(1)], {"size": A(I_)}, t, "weight", {"I"}) == shape.Crop(1, size=I_)
    assert bind("rearrange", [ArgValue("str", "... a (b c) -> ... b a c", "")], {"c": A(4)}, t, "weight", set()) \
        == rearrange.Rearrange("... a (b c) -> ... b a c", SIZES(c=4))
    assert bind("permute_bits", [], {"word": A(8), "src": A(7 - Var("i"))}, t, "weight", set()) \
        == permute.PermuteBits(tuple(range(7, -1, -1)))
    assert bind("permute", [], {"src": A(REVERSE), "inverse": A(REVERSE)}, t, "weight", set()) \
        == permute.Permute(1, src=REVERSE, inverse_src=REVERSE)


@pytest.mark.parametrize(
    "name,pos,kw,dims",
    [
        ("swap_halves", [A(3)], {}, set()),  # dim out of range for rank 3
        ("swap_halves", [A(-4)], {}, set()),
        ("transpose", [A(0), A(5)], {}, set()),
        ("interleave_rows", [], {"group": A(0)}, set()),  # group below its minimum
        ("interleave_rows", [], {"grup": A(2)}, set()),
        ("swap_halve", [], {}, set()),
        ("crop", [A(1)], {"size": A(Var("Q"))}, {"I"}),  # undeclared dim
        ("view", [A("float99")], {}, set()),
        ("interleave", [A("sf_128x4")], {}, set()),  # a family statement: the compiler expands it
        ("reinterpret", [A("i32")], {}, set()),  # reached through view, not named
        ("permute", [], {"src": A(Var("r") + Var("Q"))}, set()),  # Q is neither a dim nor r, n
        ("permute", [], {"src": A(Var("r")), "table": ArgValue("list", (A(0),), "[0]")}, set()),
        ("permute_bits", [], {"src": A(Var("i"))}, set()),  # needs word=
        ("rearrange", [ArgValue("str", "a b -> b a", "")], {"z": A(2)}, set()),
        ("swap_halves", [A(1), A(2)], {}, set()),
        ("swap_halves", [A(1)], {"dim": A(1)}, set()),
    ],
)
def test_bind_errors(name, pos, kw, dims):
    with pytest.raises(BindError):
        bind(name, pos, kw, TT("u8", E_, N_, K_), "weight", dims)


# ---------------------------------------------------------------------------
# inference must reject, or state as a requirement, every binding that cannot work:
# for each binding of the dims where the eager function fails or yields another shape
# than inferred, infer raises or one of its requirements is violated.


def _guarded(op, t, dims) -> bool:
    try:
        inferred = op.infer(t)
    except OpTypeError:
        return True
    return not all(r.holds(dims) for r in inferred.requires)


def _works(op, t, dims) -> bool:
    x = torch.zeros(concrete(t, dims), dtype=t.elem.torch_dtype)
    try:
        out = run_eager(op, x, dims, t)
    except (RuntimeError, ValueError, IndexError):
        return False
    try:
        return tuple(out.shape) == concrete(op.infer(t).type, dims)
    except OpTypeError:  # rejected statically for every size: guarded by definition
        return False


def _unguarded_failures(op, t, bindings):
    return [d for d in bindings if not _works(op, t, d) and not _guarded(op, t, d)]


def test_guards_hold_for_ops_that_state_requirements():
    # the property itself, on ops whose requirements are complete
    cases = [
        (
            rearrange.Rearrange("... (rb ms f) (kb g) -> ... rb kb f (ms g)", SIZES(ms=4, f=16, g=4)),
            TT("e8m0", E_, R_, C_),
            [{"E": 1, "R": r, "C": c} for r in (32, 64, 100, 128) for c in (3, 4, 8)],
        ),
        (rows.InterleaveRows(group=2), TT("u8", E_, N_, 2), [{"E": 1, "N": n} for n in range(1, 13)]),
        (permute.Permute(src=SHUFFLE32, block=32), TT("u8", E_, N_, 2), [{"E": 1, "N": n} for n in (16, 32, 48, 64)]),
        (permute.PermuteBits(tuple(range(32))), TT("u8", E_, N_), [{"E": 1, "N": n} for n in range(1, 9)]),
        (shape.Pad(1, multiple=4, parts=2), TT("u8", E_, N_, 2), [{"E": 1, "N": n} for n in range(1, 9)]),
    ]
    for op, t, bindings in cases:
        assert _unguarded_failures(op, t, bindings) == [], op


def test_reshape_with_floor_divisions_is_guarded():
    unpad = shape.Reshape((E_, R_, C_))
    t = TT("e4m3", E_, ex.round_up(R_, 128), ex.round_up(C_, 4))
    bad = _unguarded_failures(unpad, t, [{"E": 1, "R": r, "C": c} for r in (100, 128) for c in (4, 5)])
    halves = shape.Reshape((ex.floordiv(R_, 2), Const(2)))
    bad += _unguarded_failures(halves, TT("u8", R_), [{"R": r} for r in (4, 5)])
    assert bad == []


def test_crop_larger_than_the_part_is_a_type_error():
    with pytest.raises(OpTypeError):
        shape.Crop(1, size=Const(5)).infer(TT("u8", 2, 4))


# pad's value= is the fill's bit pattern in every lowering (E4M3 1.0 is 56 = 0x38: FlashInfer's
# pad_trtllm_moe_weights pads NVFP4 block scales with it). The eager lowering used to write the
# number 56.0 instead, so a spec gave other bytes on small layers (eager) than on large ones.
PAD_FILLS = [("e4m3", 0x38), ("f32", 0x3F800000), ("bf16", 0x3F80), ("i8", 200), ("e8m0", 127)]


@pytest.mark.parametrize("elem,fill", PAD_FILLS, ids=[c[0] for c in PAD_FILLS])
def test_pad_value_is_a_bit_pattern_in_every_lowering(elem, fill):
    import layoutc

    spec = layoutc.compile_source(f"dims E, N\ninput x : {elem}[E, N]\npad(x, dim=1, multiple=4, value={fill})\n"
                                  f"output x : {elem}[E, round_up(N, 4)]\n", "pad_fill.lyt")
    x = torch.zeros(2, 3, dtype=ET[elem].torch_dtype)
    want = fill
    for lowering in ("eager", "gather"):
        out = bits(spec.convert({"x": x}, lowering=lowering)["x"])
        width = 8 * out.element_size()
        assert int(out[0, 3]) % (1 << width) == want, lowering
        assert int(out[0, 2]) == 0, lowering
    op = shape.Pad(1, multiple=4, value=fill)
    t = TT(elem, 2, 3)
    assert int(bits(run_map(op, t, x, {}))[1, 3]) % (1 << 8 * x.element_size()) == want


def test_pad_fill_with_the_sign_bit_set_in_the_gather_lowering():
    import layoutc

    spec = layoutc.compile_source("dims E, N\ninput x : bf16[E, N]\npad(x, dim=1, multiple=4, value=49024)\n"
                                  "output x : bf16[E, round_up(N, 4)]\n", "pad_fill_sign.lyt")
    out = spec.convert({"x": torch.zeros(1, 3, dtype=torch.bfloat16)}, lowering="gather")["x"]
    assert out[0, 3].item() == -1.0  # 0xBF80
