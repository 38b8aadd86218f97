"""``map_bits``: each field of an element through a table (layoutc/lang/ops/lookup.py).

The op's facts: a permutation table is a bijection undone by the inverse table; any other table loses
values, has no inverse and the spec using it is not invertible. Its lowerings: the eager torch function,
and the kernel form the fused lowering prints (the table as integer literals, run here by Triton's
interpreter on CPU tensors) equal each other and a per-element restatement, for random tables.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: run Triton on CPU tensors

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import layoutc  # noqa: E402
from layoutc.algebra.dtypes import ELEMENT_TYPES as ET  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.lang.ops import OpTypeError, TensorType  # noqa: E402
from layoutc.lang.ops import conversion as cv  # noqa: E402
from layoutc.lang.ops.lookup import MapBits, inverse_table, map_bits  # noqa: E402
from layoutc.lower.plan import plan  # noqa: E402
from tests.helpers import assert_same_bits  # noqa: E402

#: CUTLASS W4A8: uint4b8 -> two's complement (u -> u ^ 8), then unified_encode_int4b (1..7 -> 8 - v)
W4A8 = (8, 9, 10, 11, 12, 13, 14, 15, 0, 7, 6, 5, 4, 3, 2, 1)


def _per_field(x: torch.Tensor, width: int, table) -> torch.Tensor:
    """The definition, one Python int at a time."""
    n = 8 * x.element_size()
    carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
    out = []
    for v in x.contiguous().view(carrier).reshape(-1).tolist():
        v &= (1 << n) - 1
        r = sum(table[(v >> f) & ((1 << width) - 1)] << f for f in range(0, n, width))
        out.append(r - (1 << n) if n > 8 and r >= 1 << (n - 1) else r)
    return torch.tensor(out, dtype=carrier).reshape(x.shape).view(x.dtype)


def test_the_w4a8_table_on_one_word():
    # nibbles, low first: 9 6 7 3 7 b d 9 -> 7 e f b f 5 3 7
    x = torch.tensor([0x9DB73769 - (1 << 32)], dtype=torch.int32)
    assert map_bits(x, 4, W4A8).item() & 0xFFFFFFFF == 0x735FBFE7


def test_a_permutation_table_is_invertible_by_its_inverse_table():
    op = MapBits(width=4, table=W4A8)
    inv = op.inverse(TensorType(ET["i32"], (4,)))
    assert inv == MapBits(width=4, table=inverse_table(W4A8))
    assert not op.conversion().lossy(ET["i32"])
    x = torch.randint(-2**31, 2**31 - 1, (64,), dtype=torch.int32)
    assert torch.equal(map_bits(map_bits(x, 4, W4A8), 4, inv.table), x)


def test_a_table_that_merges_values_has_no_inverse_and_loses_values():
    op = MapBits(width=4, table=(0,) * 8 + tuple(range(8)))
    assert op.inverse(TensorType(ET["u8"], (4,))) is None
    assert op.conversion().lossy(ET["u8"])
    assert MapBits(width=2, table=(0, 1, 2, 3)).is_identity


SPEC = """spec fields
dims E, N, K
input w : i32[E, N, K]
map_bits(w, width=4, table=[{table}])
output w : i32[E, N, K]
"""


@pytest.mark.slow  # compiles two specs with their inverses: seconds on two cores
def test_a_spec_with_a_lossy_table_is_not_invertible_and_a_permutation_one_is():
    good = layoutc.compile_source(SPEC.format(table=", ".join(map(str, W4A8))), "fields.lyt")
    assert good.invertible
    x = synthetic_inputs(good, {"E": 1, "N": 2, "K": 8}, seed=1)
    back = good.inverse(good.convert(x))
    assert_same_bits(back["w"], x["w"], "inverse after forward")
    lossy = layoutc.compile_source(SPEC.format(table=", ".join(["0"] * 16)), "fields.lyt")
    assert not lossy.invertible


@pytest.mark.parametrize("table, message", [
    ("0, 1, 2", r"needs a table of 16 entries; this one has 3"),
    ("0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16", r"table entry 16 is not a 4-bit value"),
])
def test_a_bad_table_is_a_spec_error_at_its_line(table, message):
    with pytest.raises(layoutc.SpecError, match=message) as err:
        layoutc.compile_source(SPEC.format(table=table), "fields.lyt")
    assert err.value.errors[0].pos.line == 4


def test_fields_must_tile_the_element():
    with pytest.raises(OpTypeError, match="no whole number"):
        MapBits(width=3, table=tuple(range(8))).infer(TensorType(ET["u8"], (4,)))
    with pytest.raises(OpTypeError, match="fields of 1 to 8 bits"):
        MapBits(width=16, table=tuple(range(1 << 16)))


def test_the_table_reaches_the_converter_as_integer_literals():
    spec = layoutc.compile_source(SPEC.format(table=", ".join(map(str, W4A8))), "fields.lyt")
    assert "map_bits(x, 4, (8, 9, 10, 11, 12, 13, 14, 15, 0, 7, 6, 5, 4, 3, 2, 1))" in spec.source.replace("y = ", "")
    lines = cv.MapBits(None, width=4, table=W4A8).kernel("v", ET["i32"])  # bit-sliced: masks, no table text
    assert "0x11111111" in "\n".join(lines) and "table" not in "\n".join(lines), lines
    wide = cv.MapBits(None, width=8, table=tuple(reversed(range(256)))).kernel("v", ET["i32"])  # looked up
    assert hex(sum(v << (8 * j) for j, v in enumerate(range(255, 251, -1)))) in "\n".join(wide), wide


@pytest.mark.parametrize("width", [1, 2, 4])
def test_the_bit_sliced_form_of_a_table_computes_the_table(width):
    # Regression guard of the kernel's bit-sliced tables (conversion.anf_terms): every output bit the
    # XOR of ANDs of input bits; checked on every field value of random tables.
    import random

    rng = random.Random(width)
    for _ in range(20):
        table = [rng.randrange(1 << width) for _ in range(1 << width)]
        terms = cv.anf_terms(width, table)
        for x in range(1 << width):
            got = sum((sum(all(x >> i & 1 for i in range(width) if s >> i & 1) for s in t) & 1) << j
                      for j, t in enumerate(terms))
            assert got == table[x], (table, x)


@pytest.mark.slow  # compiles specs and runs their kernels in Triton's interpreter: seconds
@pytest.mark.parametrize("elem, width", [("i32", 4), ("u8", 8), ("i16", 2)])
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_fused_kernel_equals_eager_and_the_definition(elem, width, data):
    table = tuple(data.draw(st.lists(st.integers(0, (1 << width) - 1), min_size=1 << width, max_size=1 << width)))
    src = SPEC.replace("i32", elem).replace("width=4", f"width={width}").format(table=", ".join(map(str, table)))
    spec = layoutc.compile_source(src, "fields.lyt")
    assert plan(spec.compiled.variant(()).chain("w")).one_pass
    x = synthetic_inputs(spec, {"E": 1, "N": 3, "K": 8}, seed=data.draw(st.integers(0, 99)))
    eager = spec.convert(x, lowering="eager")["w"]
    assert_same_bits(spec.convert(x, lowering="fused")["w"], eager, "fused vs eager")
    assert_same_bits(eager, _per_field(x["w"], width, table), "eager vs the definition")
