"""Every primitive of ``layoutc.ops.REGISTRY``, three ways, over whole small domains.

For each case the output of

(a) ``indexmap.gather(op.index_map(t), x, dims)`` -- the op's definition,
(b) the eager torch function ``fn, args = op.impl(); fn(x, *args)``, and
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

from layoutc import expr as ex
from layoutc import indexmap as im
from layoutc.dtypes import ELEMENT_TYPES as ET
from layoutc.expr import Const, Var
from layoutc.ops import REGISTRY, BindError, OpTypeError, TensorType, bind
from layoutc.ops import rows, shape, sm90, swizzle, value
from layoutc.ops import ArgValue
from layoutc.ops.base import Category

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
    naive_fold,
    naive_gather,
    naive_sm90_deinterleave,
    naive_sm90_interleave,
    naive_swizzle,
    naive_unfold,
    naive_unswizzle,
    order_crop,
    order_shard,
    order_deinterleave,
    order_interleave,
    order_pad,
    order_reorder_gated,
    order_shuffle,
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
    return a


def run_eager(op, x, dims):
    fn, args = op.impl()
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


def naive_cast(op, t, x, dims):
    conv = NAIVE_CASTS.get((t.elem.name, op.to.name))
    if conv is None:
        return None
    fn, width = conv
    mask = (1 << (8 * x.element_size())) - 1
    vals = [_signed(fn(v & mask), width) for v in bits(x).reshape(-1).tolist()]
    return torch.tensor(vals, dtype={16: torch.int16, 32: torch.int32}[width]).reshape(x.shape)


def naive_shuffle(op, t, x, dims):
    d = op.dim % x.dim()
    order = order_shuffle(x.shape[d], op.epilogue_tile)
    if isinstance(op, rows.UnshuffleRows):
        order = invert(order)
    return along_axis_fill(x, d, order, 0)


NAIVE = {
    "swap_halves": naive_rows(lambda op, n: order_swap_halves(n)),
    "interleave_rows": naive_rows(lambda op, n: order_interleave(n, op.group)),
    "reorder_gated_rows": naive_rows(lambda op, n: order_reorder_gated(n)),
    "deinterleave": naive_rows(lambda op, n: order_deinterleave(n, op.group)),
    "swap_pairs": naive_rows(lambda op, n: order_swap_pairs(n)),
    "shuffle_rows": naive_shuffle,
    "unshuffle_rows": naive_shuffle,
    "sm90_interleave_weights": lambda op, t, x, dims: naive_sm90_interleave(x),
    "sm90_deinterleave_weights": lambda op, t, x, dims: naive_sm90_deinterleave(x),
    "sm90_fold_scales": lambda op, t, x, dims: naive_fold(x),
    "sm90_unfold_scales": lambda op, t, x, dims: naive_unfold(x),
    "swizzle_128x4": lambda op, t, x, dims: naive_swizzle(x),
    "unswizzle_128x4": lambda op, t, x, dims: naive_unswizzle(x, eval_arg(op.rows, dims), eval_arg(op.cols, dims)),
    "pad": lambda op, t, x, dims: along_axis_fill(
        x, op.dim % x.dim(), order_pad(x.shape[op.dim % x.dim()], op.parts, op.multiple), _fill_bits(op.value, x)
    ),
    "crop": naive_crop,
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
    # the pad value as an element of x's dtype, as same-width bits
    return int(bits(torch.tensor([v]).to(x.dtype))[0])


# ---------------------------------------------------------------------------
# the cases: (op, input type, dims)

D_EIH = {"E": 2, "I": 4, "H": 16}

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
    (rows.ShuffleRows(epilogue_tile=128), TT("fp4x2", 2, 64, 2), {}),
    (rows.ShuffleRows(epilogue_tile=64), TT("e4m3", 1, 32, 3), {}),
    (rows.ShuffleRows(0, epilogue_tile=256), TT("bf16", 32, 2), {}),
    (rows.ShuffleRows(epilogue_tile=192), TT("u8", 2, 16, 1), {}),
    (rows.UnshuffleRows(epilogue_tile=128), TT("fp4x2", 1, 64, 2), {}),
    (rows.UnshuffleRows(epilogue_tile=64), TT("u8", E_, N_, 2), {"E": 2, "N": 48}),
    # SM90 packings
    (sm90.Sm90InterleaveWeights(), TT("fp4x2", 16, 32), {}),
    (sm90.Sm90InterleaveWeights(), TT("fp4x2", 2, 32, 64), {}),
    (sm90.Sm90InterleaveWeights(), TT("u8", 1, 16, 96), {}),
    (sm90.Sm90InterleaveWeights(), TT("fp4x2", E_, N_, ex.div(K_, 2)), {"E": 1, "N": 16, "K": 64}),
    (sm90.Sm90DeinterleaveWeights(), TT("fp4x2", 16, 32), {}),
    (sm90.Sm90DeinterleaveWeights(), TT("fp4x2", 2, 32, 64), {}),
    (sm90.Sm90DeinterleaveWeights(), TT("u8", E_, N_, ex.div(K_, 2)), {"E": 1, "N": 32, "K": 64}),
    (sm90.Sm90FoldScales(), TT("e8m0", 64, 4), {}),
    (sm90.Sm90FoldScales(), TT("e8m0", 2, 128, 8), {}),
    (sm90.Sm90FoldScales(), TT("u8", E_, 2 * I_, ex.div(H_, 32)), {"E": 2, "I": 64, "H": 384}),
    (sm90.Sm90UnfoldScales(), TT("e8m0", 2, 2, 3, 16, 16), {}),
    (sm90.Sm90UnfoldScales(), TT("e8m0", 1, 1, 16, 16), {}),
    # 128x4 swizzle
    (swizzle.Swizzle128x4(), TT("e4m3", 100, 5), {}),
    (swizzle.Swizzle128x4(), TT("u8", 2, 128, 4), {}),
    (swizzle.Swizzle128x4(), TT("bf16", 1, 130, 6), {}),
    (swizzle.Swizzle128x4(), TT("e8m0", 2, 2, 20, 3), {}),
    (swizzle.Swizzle128x4(), TT("e4m3", E_, R_, C_), {"E": 2, "R": 70, "C": 9}),
    (swizzle.Unswizzle128x4(rows=Const(100), cols=Const(5)), TT("e4m3", 128, 8), {}),
    (swizzle.Unswizzle128x4(rows=Const(256), cols=Const(8)), TT("u8", 2, 256, 8), {}),
    (
        swizzle.Unswizzle128x4(rows=R_, cols=C_),
        TT("e4m3", E_, ex.round_up(R_, 128), ex.round_up(C_, 4)),
        {"E": 2, "R": 131, "C": 6},
    ),
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
    eager = run_eager(op, x, dims)
    gathered = run_map(op, t, x, dims)
    naive = NAIVE[op.name](op, t, x, dims)

    # shapes and dtype agree with inference
    want_shape = concrete(out_t, dims)
    assert tuple(eager.shape) == want_shape
    assert tuple(gathered.shape) == want_shape
    assert eager.dtype == out_t.elem.torch_dtype
    # the eager function never writes to its input
    assert_bits_equal(x, make_input(op, t, dims, seed), "input untouched")

    if op.category is Category.VALUE:
        # the index map is the identity; the element changes by view / cast
        assert_bits_equal(gathered, x, "identity map")
        relabel = gathered.view(op.to.torch_dtype) if isinstance(op, value.View) else gathered.to(op.to.torch_dtype)
        assert_bits_equal(relabel, eager, "map vs eager")
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
    assert tuple(table) == tuple(sm90.SM90_FP4_BITS)
    assert tuple(table) == DESIGN_T


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
    assert_bits_equal(sm90.torch_impl.sm90_interleave_fp4(w), want, "eager vs kernel transcription")
    t = TT("fp4x2", *shape_)
    assert_bits_equal(run_map(sm90.Sm90InterleaveWeights(), t, w, {}), want, "index map vs kernel transcription")


def test_sm90_interleave_moves_sign_bits_only_within_words():
    # one set bit at a time: each lands on exactly one output bit, per the table
    w = torch.zeros(16, 32, dtype=torch.uint8)
    op = sm90.Sm90InterleaveWeights()
    t = TT("fp4x2", 16, 32)
    m = op.index_map(t)
    for r, c, b in [(0, 0, 3), (8, 4, 7), (3, 13, 0), (15, 31, 5)]:
        x = w.clone()
        x[r, c] = 1 << b
        y = im.gather(m, x)
        assert int((bits(y) != 0).sum()) == 1
        assert torch.equal(y, sm90.torch_impl.sm90_interleave_fp4(x))
        assert torch.equal(y, naive_sm90_interleave(x))


def test_sm90_interleave_is_not_a_byte_map():
    m = sm90.Sm90InterleaveWeights().index_map(TT("fp4x2", 16, 32))
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
    "shuffle_rows": lambda g: rows.ShuffleRows(epilogue_tile=[64, 128, 256][g % 3]),
    "unshuffle_rows": lambda g: rows.UnshuffleRows(epilogue_tile=[64, 128, 256][g % 3]),
}


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
    elif name in ("sm90_interleave_weights", "sm90_deinterleave_weights"):
        dtype_elem = draw(st.sampled_from(["u8", "fp4x2"]))
        op = REGISTRY[name]()
        lead = [draw(st.integers(1, 2))] if draw(st.booleans()) else []
        shp = lead + [16 * draw(st.integers(1, 2)), 32 * draw(st.integers(1, 2))]
    elif name == "sm90_fold_scales":
        dtype_elem = draw(st.sampled_from(["u8", "e8m0", "e4m3"]))
        op = sm90.Sm90FoldScales()
        lead = [draw(st.integers(1, 2))] if draw(st.booleans()) else []
        shp = lead + [64 * draw(st.integers(1, 2)), 4 * draw(st.integers(1, 3))]
    elif name == "sm90_unfold_scales":
        dtype_elem = draw(st.sampled_from(["u8", "e8m0"]))
        op = sm90.Sm90UnfoldScales()
        shp = [draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2)), 16, 16]
    elif name == "swizzle_128x4":
        dtype_elem = draw(st.sampled_from(["u8", "e8m0", "e4m3", "bf16"]))
        op = swizzle.Swizzle128x4()
        lead = [draw(st.integers(1, 2))] if draw(st.booleans()) else []
        shp = lead + [draw(st.integers(1, 260)), draw(st.integers(1, 9))]
    elif name == "unswizzle_128x4":
        dtype_elem = draw(st.sampled_from(["u8", "e4m3"]))
        r, c = draw(st.integers(1, 200)), draw(st.integers(1, 9))
        op = swizzle.Unswizzle128x4(rows=Const(r), cols=Const(c))
        shp = [draw(st.integers(1, 2)), -(-r // 128) * 128, -(-c // 4) * 4]
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
    if name in ("unswizzle_128x4", "reshape", "unblock_major_k"):
        shp_exprs, dims = tuple(Const(s) for s in shp), {}
    else:
        shp_exprs, dims = _maybe_symbolic(draw, shp, keep=2 if name == "sm90_unfold_scales" else 0)
    t = TensorType(ET[dtype_elem], shp_exprs)
    seed = draw(st.integers(0, 2**16))
    x = random_tensor(shp, ET[dtype_elem].torch_dtype, seed)
    if name == "cast":
        x = random_tensor(shp, torch.uint8, seed).to(ET[dtype_elem].torch_dtype)  # small finite values
    if name == "unswizzle_128x4":
        # unswizzle inverts swizzle on its image: swizzled data with zero padding
        x = sm90.torch_impl.swizzle_128x4(random_tensor((shp[0], r, c), ET[dtype_elem].torch_dtype, seed))
    return op, t, dims, x


INVERTIBLE = [n for n in REGISTRY if n not in ("crop", "shard")]
LEFT_ONLY = {"pad", "swizzle_128x4"}  # padding: inverse(op(x)) == x, not the other way round


@pytest.mark.parametrize("name", INVERTIBLE)
@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_inverse_undoes_the_op(name, data):
    op, t, dims, x = data.draw(op_and_input(name))
    inv = op.inverse(t)
    assert inv is not None
    out_t = op.infer(t).type
    y = run_eager(op, x, dims)
    back = run_eager(inv, y, dims)
    assert_bits_equal(back, x, f"eager {inv} after {op}")
    assert back.dtype == x.dtype
    # the index maps undo each other too, one after the other and composed into one map
    fwd, bwd = op.index_map(t), inv.index_map(out_t)
    assert_bits_equal(im.gather(bwd, im.gather(fwd, x, dims), dims), x, "inverse map after map")
    assert_bits_equal(im.gather(im.compose(fwd, bwd), x, dims), x, "composed index map")
    # the inverse's type is the input type again
    assert inv.infer(out_t).type.elem == t.elem
    assert im.concrete_shape(inv.infer(out_t).type.shape, dims) == tuple(x.shape)
    if name not in LEFT_ONLY and op.category is not Category.VALUE:
        # a bijection: the op also undoes its inverse
        z = random_tensor(tuple(y.shape), y.dtype, 7)
        assert_bits_equal(run_eager(op, run_eager(inv, z, dims), dims), z, "op after inverse")


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
        (swizzle.Swizzle128x4(), TT("e4m3", 2, 100, 5)),
    ],
)
def test_padding_ops_are_only_left_invertible(op, t):
    x = random_tensor(concrete(t, {}), t.elem.torch_dtype, 3)
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
    (rows.ShuffleRows(-1, epilogue_tile=64), TT("u8", 2, 16)),
    (rows.UnshuffleRows(-2, epilogue_tile=128), TT("u8", 32, 3)),
    (shape.Pad(-1, multiple=4, parts=2), TT("u8", 2, 3, 6)),
    (shape.Crop(-1, size=Const(2), parts=2), TT("u8", 2, 3, 6)),
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
        (rows.ShuffleRows(epilogue_tile=128), TT("u8", E_, N_, K_), [("N", 32)]),
        (rows.ShuffleRows(epilogue_tile=64), TT("u8", E_, N_, K_), [("N", 16)]),
        (rows.UnshuffleRows(epilogue_tile=256), TT("u8", E_, N_, K_), [("N", 32)]),
        (sm90.Sm90InterleaveWeights(), TT("fp4x2", E_, N_, K_), [("K", 32), ("N", 16)]),
        (sm90.Sm90DeinterleaveWeights(), TT("fp4x2", E_, N_, K_), [("K", 32), ("N", 16)]),
        (sm90.Sm90FoldScales(), TT("e8m0", E_, R_, C_), [("C", 4), ("R", 64)]),
        (sm90.Sm90UnfoldScales(), TT("e8m0", E_, R_, C_, 16, 16), []),
        (swizzle.Swizzle128x4(), TT("e4m3", E_, R_, C_), []),
        (shape.Pad(1, multiple=8, parts=2), TT("u8", E_, N_, K_), [("N", 2)]),
        (shape.Pad(1, multiple=8), TT("u8", E_, N_, K_), []),
        (shape.Crop(1, size=I_, parts=2), TT("u8", E_, N_, K_), [("N", 2)]),
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
    bad = [
        (sm90.Sm90FoldScales(), (1, 32, 4)),
        (sm90.Sm90FoldScales(), (1, 64, 6)),
        (sm90.Sm90InterleaveWeights(), (1, 8, 32)),
        (sm90.Sm90InterleaveWeights(), (1, 16, 16)),
        (rows.InterleaveRows(group=2), (1, 6, 2)),
        (rows.Deinterleave(group=2), (1, 6, 2)),
        (rows.ShuffleRows(epilogue_tile=128), (1, 16, 2)),
        (rows.SwapPairs(), (1, 5, 2)),
    ]
    for op, shp in bad:
        x = torch.zeros(shp, dtype=torch.uint8)
        t = TT("u8", *shp)
        reqs = op.infer(t).requires
        assert any(ex.evaluate(r.value, {}) % r.multiple for r in reqs), (op, shp)
        with pytest.raises((RuntimeError, ValueError)):
            run_eager(op, x, {})


def test_fold_output_shape_is_symbolic():
    t = TT("e8m0", E_, 2 * I_, ex.div(H_, 32))
    out = sm90.Sm90FoldScales().infer(t).type
    assert out.elem.name == "e8m0"
    assert ex.same_value(out.shape[1], ex.div(I_, 32)) is True
    assert ex.same_value(out.shape[2], ex.div(H_, 128)) is True
    assert out.shape[3:] == (Const(16), Const(16))


def test_swizzle_output_shape_rounds_up():
    out = swizzle.Swizzle128x4().infer(TT("e4m3", E_, R_, C_)).type
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
        (value.View(ET["u8"]), TT("bf16", 4)),
        (value.View(ET["i32"]), TT("fp4x2", 4)),
        (value.Cast(ET["bf16"]), TT("fp4x2", 4)),
        (value.Cast(ET["f32"]), TT("e8m0", 4)),
        (value.Cast(ET["e8m0"]), TT("f32", 4)),
        (value.Cast(ET["fp4x2"]), TT("u8", 4)),
        (sm90.Sm90InterleaveWeights(), TT("f32", 16, 32)),
        (sm90.Sm90InterleaveWeights(), TT("bf16", 16, 32)),
        (sm90.Sm90InterleaveWeights(), TT("fp4x2", 32)),
        (sm90.Sm90FoldScales(), TT("bf16", 64, 4)),
        (sm90.Sm90FoldScales(), TT("u8", 64)),
        (sm90.Sm90UnfoldScales(), TT("u8", 1, 2, 16, 8)),
        (swizzle.Swizzle128x4(), TT("f32", 128, 4)),
        (swizzle.Swizzle128x4(), TT("u8", 128)),
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


def test_view_error_hints_at_cast():
    with pytest.raises(OpTypeError) as err:
        value.View(ET["bf16"]).infer(TT("f32", 4))
    assert "cast" in (err.value.hint or "")


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
    assert bind("interleave", [A("sm90_mixed")], {}, t, "weight", set()) == sm90.Sm90InterleaveWeights()
    assert bind("interleave", [A("sm90_mixed")], {}, t, "scale", set()) == sm90.Sm90FoldScales()
    assert bind("interleave", [A("sf_128x4")], {}, t, "scale", set()) == swizzle.Swizzle128x4()


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
        ("interleave", [A("sf_128x4")], {}, set()),  # packs scales, this is a weight
        ("interleave", [A("nope")], {}, set()),
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
    return any(int(ex.evaluate(r.value, dims)) % r.multiple for r in inferred.requires)


def _works(op, t, dims) -> bool:
    x = torch.zeros(concrete(t, dims), dtype=t.elem.torch_dtype)
    try:
        out = run_eager(op, x, dims)
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
            sm90.Sm90FoldScales(),
            TT("e8m0", E_, R_, C_),
            [{"E": 1, "R": r, "C": c} for r in (32, 64, 100, 128) for c in (3, 4, 8)],
        ),
        (rows.InterleaveRows(group=2), TT("u8", E_, N_, 2), [{"E": 1, "N": n} for n in range(1, 13)]),
        (rows.ShuffleRows(epilogue_tile=128), TT("u8", E_, N_, 2), [{"E": 1, "N": n} for n in (16, 32, 48, 64)]),
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


def test_unswizzle_is_guarded():
    op = swizzle.Unswizzle128x4(rows=R_, cols=C_)
    t = TT("e4m3", E_, Var("P"), Var("Q"))
    bindings = [{"E": 1, "R": r, "C": c, "P": p, "Q": q} for r, c, p, q in [(100, 5, 100, 5), (200, 4, 128, 4)]]
    assert _unguarded_failures(op, t, bindings) == []


def test_crop_larger_than_the_part_is_a_type_error():
    with pytest.raises(OpTypeError):
        shape.Crop(1, size=Const(5)).infer(TT("u8", 2, 4))
