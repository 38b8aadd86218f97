"""Chains that move whole bytes across views of other widths and convert each byte on its own
(``map_bits`` of nibbles: CUTLASS W4A8's int4 weights) are one pass: the words plan with the identity
permutation, the conversions on each word of source bytes (they commute with byte moves).

Before, such a chain was ``NoPass`` ("bit-level steps other than one permutation of 32-bit words") and
ran op by op. A conversion that is not bytewise (a cast: each value from all its bytes together) keeps
the chain op by op: no silent change of meaning.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: run Triton on CPU tensors

import pytest  # noqa: E402

import layoutc  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.lower.plan import NoPass, Words, plan  # noqa: E402
from tests.helpers import assert_same_bits  # noqa: E402

SPEC = """spec nibbles
dims E, N, K
assume N % 2 == 0
assume K % 2 == 0
input w : i32[E, N, K]
map_bits(w, width={width}, table=[{table}])
view(w, i16)
rearrange(w, "... (n2 h) k -> ... n2 (k h)", h=2)
view(w, i32)
output w : i32[E, N/2, 2*K]
"""


def _spec(width: int):
    table = ", ".join(str((5 * i + 3) % (1 << width)) for i in range(1 << width))
    return layoutc.compile_source(SPEC.format(width=width, table=table), "nibbles.lyt")


def test_bytewise_conversions_around_byte_moves_are_one_words_pass():
    p = plan(_spec(4).compiled.variant(()).chain("w"))
    assert isinstance(p, Words) and p.permutation.table == tuple(range(32))
    assert [c.width for c in p.conversions] == [4]


def test_a_conversion_that_is_not_bytewise_keeps_the_chain_op_by_op():
    assert isinstance(plan(_spec(8).compiled.variant(()).chain("w")), Words)  # 8-bit fields are bytes
    wide = SPEC.replace("map_bits(w, width={width}, table=[{table}])", "cast(w, f32)\nview(w, i32)")
    p = plan(layoutc.compile_source(wide, "nibbles.lyt").compiled.variant(()).chain("w"))
    assert isinstance(p, NoPass)


@pytest.mark.slow  # runs the kernels in Triton's interpreter
@pytest.mark.parametrize("width", [2, 4, 8])
def test_every_lowering_equals_eager(width):
    spec = _spec(width)
    x = synthetic_inputs(spec, {"E": 2, "N": 6, "K": 10}, seed=width)
    eager = spec.convert(x, lowering="eager")
    for lowering in ("fused", "gather"):
        assert_same_bits(spec.convert(x, lowering=lowering), eager, f"{lowering}, width {width}")


def test_consecutive_tables_of_one_width_are_one_lookup():
    two = SPEC.replace("map_bits(w, width={width}, table=[{table}])",
                       "map_bits(w, width=4, table=[{table}])\nmap_bits(w, width=4, table=[{other}])")
    first, second = [(5 * i + 3) % 16 for i in range(16)], [(7 * i + 1) % 16 for i in range(16)]
    spec = layoutc.compile_source(two.format(table=", ".join(map(str, first)), other=", ".join(map(str, second))),
                                  "nibbles.lyt")
    p = plan(spec.compiled.variant(()).chain("w"))
    assert [c.table for c in p.conversions] == [tuple(second[v] for v in first)]
