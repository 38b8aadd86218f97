"""Tests of the index-map algebra (:mod:`layoutc.algebra.indexmap`) over whole small domains.

The building blocks are checked against torch's own reshape / permute / indexing /
padding; composition, bit lifting and gather are checked as laws on random chains
of building blocks (hypothesis).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from layoutc.algebra import expr as ex
from layoutc.algebra import indexmap as im
from layoutc.algebra.expr import Const, Var
from layoutc.lower.eager import run as run_op
from layoutc.algebra.indexmap import IndexMap

SETTINGS = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def C(*xs):
    return tuple(Const(v) for v in xs)


def rand_u8(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, tuple(shape), dtype=torch.uint8, generator=g)


def ints(shape):
    return tuple(int(ex.evaluate(s, {})) for s in shape)


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


# ---------------------------------------------------------------------------
# random building blocks on concrete shapes

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)


def _factorize(draw, n):
    out = []
    for _ in range(draw(st.integers(0, 2))):
        d = draw(st.sampled_from(divisors(n)))
        out.append(d)
        n //= d
    out.append(n)
    return tuple(draw(st.permutations(out)))


def _byte_map(draw, shape):
    """A random byte-level building block whose input shape is ``shape`` (ints)."""
    rank = len(shape)
    kind = draw(st.sampled_from(["identity", "reshape", "permute", "table", "pad", "crop"]))
    in_shape = C(*shape)
    if kind == "identity":
        return im.identity(in_shape)
    if kind == "reshape":
        return im.reshape_map(in_shape, C(*_factorize(draw, math.prod(shape))))
    if kind == "permute":
        return im.permute_map(in_shape, draw(st.permutations(range(rank))))
    d = draw(st.integers(0, rank - 1))
    n = shape[d]
    if kind == "table":
        values = draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n))
        return im.table_map(in_shape, d, values)
    parts = draw(st.sampled_from(divisors(n)))
    part = n // parts
    if kind == "pad":
        size = part + draw(st.integers(0, 3))
        return im.pad_map(in_shape, d, Const(size), parts, draw(st.integers(0, 255)))
    return im.crop_map(in_shape, d, Const(draw(st.integers(1, part))), parts)


def _bit_shuffle(draw, shape):
    """A bit-level map that moves bits across the bytes of the last axis (perm of n*8 bits)."""
    n = shape[-1]
    perm = draw(st.permutations(range(8 * n)))
    rank = len(shape)
    o = im.out_vars(rank + 1)
    lin = ex.table(perm, 8 * o[rank - 1] + o[rank])
    src = o[: rank - 1] + (ex.floordiv(lin, 8), ex.mod(lin, 8))
    full = C(*shape, 8)
    return IndexMap(full, full, src, bit_level=True)


def _bits_within_byte(draw, shape):
    perm = draw(st.permutations(range(8)))
    full = C(*shape, 8)
    return IndexMap(full, full, im.out_vars(len(shape)) + (ex.table(perm, im.out_var(len(shape))),), bit_level=True)


def _any_map(draw, shape, allow_bits=True):
    kind = draw(st.sampled_from(["byte"] * 4 + (["lifted", "bitshuffle", "bitperm"] if allow_bits else [])))
    if kind == "byte":
        return _byte_map(draw, shape)
    if kind == "lifted":
        return im.lift_to_bits(_byte_map(draw, shape))
    if kind == "bitshuffle":
        return _bit_shuffle(draw, shape)
    return _bits_within_byte(draw, shape)


def _byte_out_shape(m):
    s = ints(m.out_shape)
    return s[:-1] if m.bit_level else s


@st.composite
def chains(draw, length=2, allow_bits=True):
    shape = draw(shapes)
    maps = []
    cur = shape
    for _ in range(length):
        m = _any_map(draw, cur, allow_bits)
        maps.append(m)
        cur = _byte_out_shape(m)
        if 0 in cur:
            break
    return shape, maps


def sequential(maps, x):
    for m in maps:
        x = im.gather(m, x)
    return x


# ---------------------------------------------------------------------------
# composition law


@settings(max_examples=250, **SETTINGS)
@given(chains(length=2), st.integers(0, 2**16))
def test_compose_is_apply_first_then_second(chain, seed):
    shape, maps = chain
    x = rand_u8(shape, seed)
    composed = im.compose_all(maps)
    assert torch.equal(im.gather(composed, x), sequential(maps, x))


@settings(max_examples=60, **SETTINGS)
@given(chains(length=2, allow_bits=False), st.integers(0, 2**16))
def test_compose_byte_maps_on_float_tensors(chain, seed):
    shape, maps = chain
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    composed = im.compose_all(maps)
    assert torch.equal(im.gather(composed, x), sequential(maps, x))


@settings(max_examples=150, **SETTINGS)
@given(chains(length=3), st.integers(0, 2**16))
def test_compose_is_associative(chain, seed):
    shape, maps = chain
    assume(len(maps) == 3)
    a, b, c = maps
    x = rand_u8(shape, seed)
    left = im.compose(im.compose(a, b), c)
    right = im.compose(a, im.compose(b, c))
    expected = sequential(maps, x)
    assert torch.equal(im.gather(left, x), expected)
    assert torch.equal(im.gather(right, x), expected)


# Regression: a table on an axis composed with a padding of the same axis reads the
# table at the padded (out-of-range) positions; gather raised IndexError there.
def test_compose_table_then_pad_same_axis():
    table = im.table_map(C(3, 2), 0, (2, 0, 1))
    pad = im.pad_map(C(3, 2), 0, Const(4))
    x = rand_u8((3, 2), 1)
    expected = sequential([table, pad], x)
    assert torch.equal(im.gather(im.compose(table, pad), x), expected)


def test_compose_rank_mismatch_raises():
    with pytest.raises(ValueError):
        im.compose(im.identity(C(2, 3)), im.identity(C(6)))


def test_compose_total_flags():
    pad = im.pad_map(C(3), 0, Const(4))
    assert not pad.is_total()
    assert im.identity(C(3)).is_total()
    assert not im.compose(im.identity(C(3)), pad).is_total()
    crop = im.crop_map(C(4), 0, Const(3))
    back = im.compose(pad, crop)
    x = rand_u8((3,), 3)
    assert torch.equal(im.gather(back, x), x)


# ---------------------------------------------------------------------------
# bit granularity


@st.composite
def byte_maps(draw):
    shape = draw(shapes)
    return shape, _byte_map(draw, shape)


@settings(max_examples=100, **SETTINGS)
@given(byte_maps(), st.integers(0, 2**16))
def test_lift_to_bits_equals_the_byte_map(sm, seed):
    shape, m = sm
    x = rand_u8(shape, seed)
    lifted = im.lift_to_bits(m)
    assert lifted.bit_level and ints(lifted.out_shape)[-1] == 8
    assert torch.equal(im.gather(lifted, x), im.gather(m, x))
    # also for another one-byte dtype
    x8 = x.view(torch.int8)
    assert torch.equal(im.gather(lifted, x8), im.gather(m, x8))
    assert im.lift_to_bits(lifted) is lifted


@settings(max_examples=100, **SETTINGS)
@given(byte_maps())
def test_drop_bit_axis_undoes_lift(sm):
    shape, m = sm
    back = im.drop_bit_axis(im.lift_to_bits(m))
    assert back == m
    assert im.drop_bit_axis(m) is m


# Regression: drop_bit_axis looked only at bit 0 of the fill, so an even non-zero fill
# came back as a byte map padding with 0.
def test_drop_bit_axis_keeps_an_even_fill():
    pad = im.pad_map(C(2), 0, Const(4), fill=2)
    back = im.drop_bit_axis(im.lift_to_bits(pad))
    x = torch.tensor([1, 3], dtype=torch.uint8)
    assert im.gather(im.lift_to_bits(pad), x).tolist() == [1, 3, 2, 2]
    # the byte map it returns (if any) must be the same map
    assert back is None or im.gather(back, x).tolist() == [1, 3, 2, 2]


def test_drop_bit_axis_of_a_bit_shuffle_is_none():
    full = C(2, 8)
    o0, o1 = im.out_vars(2)
    cross = IndexMap(full, full, (1 - o0, o1), bit_level=True)  # moves whole bytes: droppable
    assert im.drop_bit_axis(cross) is not None
    mixing = IndexMap(full, full, (ex.mod(o1, 2), ex.floordiv(o1, 2) + 4 * o0), bit_level=True)
    assert im.drop_bit_axis(mixing) is None
    within = IndexMap(full, full, (o0, 7 - o1), bit_level=True)
    assert im.drop_bit_axis(within) is None


def test_bytes_bits_round_trip_and_order():
    x = torch.arange(256, dtype=torch.uint8)
    bits = im.bytes_to_bits(x)
    assert bits.shape == (256, 8)
    for v in (0, 1, 2, 128, 0xA5, 255):
        assert [int(b) for b in bits[v]] == [(v >> i) & 1 for i in range(8)]
    assert torch.equal(im.bits_to_bytes(bits), x)


def test_bit_level_gather_on_a_known_permutation():
    # reverse the bits of every byte: a naive per-element reference
    full = C(4, 8)
    o0, o1 = im.out_vars(2)
    rev = IndexMap(full, full, (o0, 7 - o1), bit_level=True)
    x = torch.tensor([0b00000001, 0b10110000, 0xFF, 0x0F], dtype=torch.uint8)
    want = [int(f"{v:08b}"[::-1], 2) for v in x.tolist()]
    assert im.gather(rev, x).tolist() == want


def test_bit_level_gather_needs_one_byte_elements():
    m = im.lift_to_bits(im.identity(C(3)))
    with pytest.raises(ValueError):
        im.gather(m, torch.zeros(3, dtype=torch.float32))


def test_lift_keeps_a_nonzero_fill_bit_by_bit():
    pad = im.pad_map(C(2), 0, Const(4), fill=0xA5)
    x = torch.tensor([1, 2], dtype=torch.uint8)
    assert im.gather(im.lift_to_bits(pad), x).tolist() == [1, 2, 0xA5, 0xA5]
    assert im.gather(pad, x).tolist() == [1, 2, 0xA5, 0xA5]


# ---------------------------------------------------------------------------
# building blocks against torch, whole domains


def arange_t(shape):
    return torch.arange(math.prod(shape), dtype=torch.int64).reshape(shape)


@settings(max_examples=60, **SETTINGS)
@given(st.data())
def test_reshape_map_is_torch_reshape(data):
    shape = data.draw(shapes)
    new = _factorize(data.draw, math.prod(shape))
    x = arange_t(shape)
    assert torch.equal(im.gather(im.reshape_map(C(*shape), C(*new)), x), x.reshape(new))


@settings(max_examples=60, **SETTINGS)
@given(st.data())
def test_permute_map_is_torch_permute(data):
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple))
    perm = data.draw(st.permutations(range(len(shape))))
    x = arange_t(shape)
    m = im.permute_map(C(*shape), perm)
    assert ints(m.out_shape) == tuple(x.permute(*perm).shape)
    assert torch.equal(im.gather(m, x), x.permute(*perm))


def test_permute_map_rejects_non_permutations():
    with pytest.raises(ValueError):
        im.permute_map(C(2, 3), (0, 0))
    with pytest.raises(ValueError):
        im.permute_map(C(2, 3), (0,))


@settings(max_examples=60, **SETTINGS)
@given(st.data())
def test_table_map_is_index_select(data):
    shape = data.draw(shapes)
    d = data.draw(st.integers(0, len(shape) - 1))
    values = data.draw(st.lists(st.integers(0, shape[d] - 1), min_size=shape[d], max_size=shape[d]))
    x = arange_t(shape)
    m = im.table_map(C(*shape), d, values)
    assert torch.equal(im.gather(m, x), x.index_select(d, torch.tensor(values, dtype=torch.long)))


@settings(max_examples=80, **SETTINGS)
@given(st.data())
def test_pad_map_is_per_part_torch_padding(data):
    shape = data.draw(shapes)
    d = data.draw(st.integers(0, len(shape) - 1))
    n = shape[d]
    parts = data.draw(st.sampled_from(divisors(n)))
    extra = data.draw(st.integers(0, 3))
    fill = data.draw(st.integers(0, 99))
    part = n // parts
    x = arange_t(shape) + 100
    m = im.pad_map(C(*shape), d, Const(part + extra), parts, fill)
    # torch: split dim into parts, pad the end of each part, merge back
    chunks = x.unflatten(d, (parts, part))
    pad_spec = [0, 0] * (chunks.dim() - (d + 1) - 1) + [0, extra]
    want = F.pad(chunks, pad_spec, value=fill).flatten(d, d + 1)
    assert ints(m.out_shape) == tuple(want.shape)
    assert torch.equal(im.gather(m, x), want)


@settings(max_examples=60, **SETTINGS)
@given(st.data())
def test_crop_map_is_per_part_narrow(data):
    shape = data.draw(shapes)
    d = data.draw(st.integers(0, len(shape) - 1))
    n = shape[d]
    parts = data.draw(st.sampled_from(divisors(n)))
    part = n // parts
    size = data.draw(st.integers(1, part))
    x = arange_t(shape)
    m = im.crop_map(C(*shape), d, Const(size), parts)
    want = x.unflatten(d, (parts, part)).narrow(d + 1, 0, size).flatten(d, d + 1)
    assert torch.equal(im.gather(m, x), want)


def test_pad_map_docstring_example():
    # rows I = 3, multiple 4, parts 2: out rows 0..7 read 0 1 2 - 3 4 5 -
    m = im.pad_map(C(6), 0, Const(4), parts=2, fill=9)
    x = torch.tensor([10, 11, 12, 13, 14, 15])
    assert im.gather(m, x).tolist() == [10, 11, 12, 9, 13, 14, 15, 9]


# ---------------------------------------------------------------------------
# symbolic shapes and gather details


def test_gather_with_symbolic_shapes_and_dims():
    E, I = Var("E"), Var("I")
    shape = (E, 2 * I, Const(3))
    o0, o1, o2 = im.out_vars(3)
    swap = IndexMap(shape, shape, (o0, ex.mod(o1 + I, 2 * I), o2))
    dims = {"E": 2, "I": 3}
    x = arange_t((2, 6, 3))
    want = torch.cat([x[:, 3:], x[:, :3]], dim=1)
    assert torch.equal(im.gather(swap, x, dims), want)
    assert im.concrete_shape(shape, dims) == (2, 6, 3)
    with pytest.raises(ValueError):
        im.gather(swap, x, {"E": 2, "I": 2})


def test_gather_rejects_wrong_input_shape():
    with pytest.raises(ValueError):
        im.gather(im.identity(C(2, 3)), torch.zeros(3, 2))


def test_index_map_needs_one_source_per_input_axis():
    with pytest.raises(ValueError):
        IndexMap(C(2, 3), C(6), (im.out_var(0),))


def test_gather_on_empty_input():
    m = im.pad_map(C(0), 0, Const(2), fill=7)
    assert im.gather(m, torch.zeros(0, dtype=torch.uint8)).tolist() == [7, 7]


def test_coordinate_grids_broadcast():
    g = im.coordinate_grids((2, 3, 4))
    assert g["o0"].shape == (2, 1, 1) and g["o1"].shape == (1, 3, 1) and g["o2"].shape == (1, 1, 4)
    assert g["o2"].flatten().tolist() == [0, 1, 2, 3]


def test_source_indices_linear_order():
    m = im.permute_map(C(2, 3), (1, 0))
    linear, valid, _ = im.source_indices(m, {})
    assert linear.tolist() == [[0, 3], [1, 4], [2, 5]]
    assert bool(valid.all())


def test_describe_mentions_sources_and_padding():
    m = im.pad_map(C(3, 2), 0, Const(4), fill=0)
    text = m.describe()
    assert text.startswith("out[o0, o1] = in[o0, o1]") and " if " in text


# ---------------------------------------------------------------------------
# composition law on the maps of real primitives (layoutc.lang.ops), symbolic shapes


def _op_candidates():
    from layoutc.lang.ops import permute, rearrange, rows, shape

    r = Var("r")
    return [
        lambda: rows.SwapHalves(1),
        lambda: rows.InterleaveRows(1, group=2),
        lambda: rows.Deinterleave(1, group=4),
        lambda: rows.SwapPairs(2),
        lambda: permute.Permute(1, src=16 * (r // 16) + 2 * (r % 8) + (r % 16) // 8, block=16),
        lambda: permute.Permute(1, table=(3, 1, 0, 2)),
        lambda: permute.PermuteBits((16, 17, 18, 8, 9, 10, 0, 1, 2, 19, 25, 26, 11, 24, 27, 3,
                                     20, 21, 22, 12, 13, 14, 4, 5, 6, 23, 29, 30, 15, 28, 31, 7)),
        lambda: rearrange.Rearrange("... (a b) c -> ... b (c a)", (("a", Const(2)),)),
        lambda: shape.Pad(1, multiple=32, parts=2, value=3),
        lambda: shape.Pad(2, multiple=64, value=0),
        lambda: shape.Transpose(0, 1),
        lambda: shape.Crop(1, size=Const(16)),
    ]


def _applies(op, t, dims):
    from layoutc.lang.ops import OpTypeError

    try:
        inferred = op.infer(t)
    except OpTypeError:
        return None
    if not all(req.holds(dims) for req in inferred.requires):  # a crop's size bound is one of them
        return None
    return inferred.type


@settings(max_examples=120, **SETTINGS)
@given(st.data())
def test_compose_maps_of_primitives(data):
    from layoutc.algebra.dtypes import ELEMENT_TYPES
    from layoutc.lang.ops import TensorType

    cands = _op_candidates()
    dims = {"E": data.draw(st.integers(1, 2)), "N": 32 * data.draw(st.integers(1, 2)), "K": 64}
    t = TensorType(ELEMENT_TYPES["fp4x2"], (Var("E"), Var("N"), Var("K")))
    ops, types = [], [t]
    for _ in range(2):
        op = data.draw(st.sampled_from(cands))()
        out = _applies(op, types[-1], dims)
        assume(out is not None)
        ops.append(op)
        types.append(out)
    maps = [op.index_map(tt) for op, tt in zip(ops, types)]
    x = rand_u8(im.concrete_shape(t.shape, dims), data.draw(st.integers(0, 999)))
    seq = x
    for m in maps:
        seq = im.gather(m, seq, dims)
    assert torch.equal(im.gather(im.compose(*maps), x, dims), seq)
    # and the eager chain agrees
    y = x
    for op, tt in zip(ops, types):
        y = run_op(op, tt, y, dims)
    assert torch.equal(y, seq)


# Regression (found by Hypothesis): pad(parts=2) then crop(size=16). Crop's requirements include a
# condition (multiple 0: its size is at most a part's), and the helper divided by that 0.
def test_compose_pad_in_parts_then_crop():
    from layoutc.algebra.dtypes import ELEMENT_TYPES
    from layoutc.lang.ops import TensorType, shape

    dims = {"E": 1, "N": 32, "K": 64}
    t = TensorType(ELEMENT_TYPES["fp4x2"], (Var("E"), Var("N"), Var("K")))
    pad, crop = shape.Pad(1, multiple=32, parts=2, value=3), shape.Crop(1, size=Const(16))
    mid = _applies(pad, t, dims)
    out = _applies(crop, mid, dims)
    assert out is not None and tuple(im.concrete_shape(out.shape, dims)) == (1, 16, 64)
    maps = [pad.index_map(t), crop.index_map(mid)]
    x = rand_u8(im.concrete_shape(t.shape, dims), 5)
    seq = x
    for m in maps:
        seq = im.gather(m, seq, dims)
    assert torch.equal(im.gather(im.compose(*maps), x, dims), seq)
    assert torch.equal(run_op(crop, mid, run_op(pad, t, x, dims), dims), seq)


def test_requirement_condition_holds_without_dividing():
    from layoutc.algebra.dtypes import ELEMENT_TYPES
    from layoutc.lang.ops import TensorType, shape

    t = TensorType(ELEMENT_TYPES["u8"], (Var("N"),))
    # a size in another dim than the part's: not decidable statically, so checked on every call
    conds = [r for r in shape.Crop(0, size=Var("S")).infer(t).requires if r.is_condition]
    assert len(conds) == 1
    assert conds[0].holds({"N": 16, "S": 16}) and conds[0].holds({"N": 40, "S": 16})
    assert not conds[0].holds({"N": 15, "S": 16})
