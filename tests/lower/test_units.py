"""The units walk of words plans (layoutc/lower/units.py): each output word from aligned 16- or
32-bit source units at fixed offsets, one base address per word.

Before, CUTLASS W4A8's int4 weights (16-bit units: runs of 4 nibbles, the second unit of each output
word 8 rows after the first) took the words walk: four single-byte loads per output word, each with
its own address arithmetic.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: run Triton on CPU tensors

import pytest  # noqa: E402
import torch  # noqa: E402

import layoutc  # noqa: E402
from layoutc.algebra import expr as ex  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.lower.plan import Words, plan  # noqa: E402
from tests.helpers import SPECS, assert_same_bits  # noqa: E402

# Pairs of rows interleaved by 16-bit units (the shape of the W4A8 reorder's h axis), nibbles mapped.
SPEC = """spec units
dims E, N, K
assume N % 2 == 0
input w : i32[E, N, K]
map_bits(w, width=4, table=[8, 9, 10, 11, 12, 13, 14, 15, 0, 7, 6, 5, 4, 3, 2, 1])
view(w, {unit})
rearrange(w, "... (n2 h) k -> ... n2 (k h)", h=2)
view(w, i32)
output w : i32[E, N/2, 2*K]
"""


def _spec(unit: str = "i16"):
    return layoutc.compile_source(SPEC.format(unit=unit), "units.lyt")


def test_words_of_two_16_bit_units_take_the_units_walk():
    p = plan(_spec().compiled.variant(()).chain("w"))
    assert isinstance(p, Words) and p.units is not None and p.units.unit == 2
    # byte 0 of a word and, one source row (K words = 4K bytes) later, its other unit
    assert p.units.offsets == (ex.Const(0), ex.mul(4, ex.Var("K")))


def test_words_of_scattered_bytes_keep_the_byte_loads():
    # byte moves: an output word's bytes 0 and 1 come from two rows, no 16-bit unit holds them
    p = plan(_spec("u8").compiled.variant(()).chain("w"))
    assert isinstance(p, Words) and p.units is None


@pytest.mark.slow  # runs the kernels in Triton's interpreter
@pytest.mark.parametrize("unit", ["i16", "u8"])
def test_the_units_walk_equals_eager(unit):
    spec = _spec(unit)
    loads = spec.source.count(".to(tl.uint16, bitcast=True).to(tl.uint32)")  # 16-bit loads
    assert loads == (2 if unit == "i16" else 0)
    assert ("x.shape[-1] * x.element_size() % 2 == 0  # whole units" in spec.source) == (unit == "i16")
    x = synthetic_inputs(spec, {"E": 2, "N": 6, "K": 5}, seed=7)
    assert_same_bits(spec.convert(x, lowering="fused"), spec.convert(x, lowering="eager"))


def test_the_grouped_form_needs_whole_aligned_runs():
    # 8 output words of the toy spec read rows 2n2 and 2n2 + 1, 4K bytes apart, from byte 16*(k // 4) on:
    # whole 16-byte runs only where K is a multiple of 4, which its instances do not promise
    p = plan(_spec().compiled.variant(()).chain("w"))
    assert p.units.words == 1


@pytest.mark.slow  # compiles the W4A8 spec (seconds) and runs its kernels in Triton's interpreter
def test_w4a8_weights_take_eight_words_from_two_16_byte_runs_and_equal_eager():
    spec = layoutc.compile_file(SPECS / "vllm_cutlass_w4a8.lyt")
    for tensor, row in (("w13_weight_packed", "H"), ("w2_weight_packed", "I")):
        p = plan(spec.compiled.variant(()).chain(tensor))
        assert isinstance(p, Words) and p.units is not None and (p.units.unit, p.units.words) == (16, 8), tensor
        # an atom row's 8 words: rows r and r + 8 of the source (8 rows of row/2 bytes later)
        assert p.units.offsets == (ex.Const(0), ex.mul(4, ex.Var(row))), tensor
        assert p.units.picks[:4] == ((0, 0), (0, 1), (1, 0), (1, 1)), tensor  # word 0: 16 bits of each run
    x = synthetic_inputs(spec, {"E": 2, "I": 256, "H": 256}, seed=5)
    assert_same_bits(spec.convert(x, lowering="fused"), spec.convert(x, lowering="eager"))


@pytest.mark.slow  # compiles the W4A8 spec (seconds) and runs its kernels in Triton's interpreter
def test_w4a8_weight_lanes_take_tiles_of_adjacent_runs_and_equal_eager():
    # Before, a program's 128 lanes took 128 consecutive groups: 16-byte loads from 32 rows per warp, half
    # of each 32-byte sector (~72% of a copy on the H200). Group g + D reads the 16 bytes after group g's
    # (the atoms' column-major order: D = N/2 groups), so lanes now take tiles, 8 such groups side by side.
    spec = layoutc.compile_file(SPECS / "vllm_cutlass_w4a8.lyt")
    for tensor, stride in (("w13_weight_packed", ex.Var("I")), ("w2_weight_packed", ex.div(ex.Var("H"), 2))):
        p = plan(spec.compiled.variant(()).chain(tensor))
        assert p.units.stride == stride, tensor
    assert "_stride, _groups = I, (2*E*I*(H // 8)) // 8" in spec.source
    assert "_tile = 8 if _stride % 16 == 0 and _groups % _stride == 0 else 1" in spec.source
    assert spec.source.count("if _TILE > 1:") == 2
    for dims in ({"E": 3, "I": 256, "H": 256}, {"E": 1, "I": 512, "H": 768}):
        x = synthetic_inputs(spec, dims, seed=11)
        assert_same_bits(spec.convert(x, lowering="fused"), spec.convert(x, lowering="eager"))
    # the lanes' tile order takes every group once, also where the rows of groups are not whole tiles
    text = spec.source.split("if _TILE > 1:\n", 1)[1].splitlines()[:4]
    for e, i, h in ((1, 16, 96), (2, 32, 64), (3, 48, 256)):
        groups, programs = e * i * h // 32, -(-(e * h // 32) // 8) * (i // 16)
        env = {"offs": torch.arange(programs * 128), "I": i, "H": h, "E": e, "_TILE": 8}
        for line in text:
            name, value = line.strip().split(" = ", 1)
            env[name] = eval(value, {}, env)
        taken = env["offs"][env["offs"] < groups]
        assert sorted(taken.tolist()) == list(range(groups)), (e, i, h)


def test_a_grouped_walk_with_no_column_of_runs_keeps_consecutive_lanes():
    # the toy spec's words (one 16-bit unit per word, no grouped form) have no stride and no tile
    p = plan(_spec().compiled.variant(()).chain("w"))
    assert p.units.stride is None and "if _TILE > 1:" not in _spec().source


def test_the_grouped_form_is_decided_on_sizes_the_assumes_allow():
    # With ``assume K % 4 == 0`` every size the spec accepts has whole aligned 16-byte runs: the grouped form
    # holds. Before, the planner's samples ignored the assume lines (K = 1, 2, ...) and kept one word per lane;
    # the plan cache keys on the assumes too (the toy without the line is planned first, the same chain else).
    assert plan(_spec().compiled.variant(()).chain("w")).units.words == 1
    assumed = layoutc.compile_source(SPEC.format(unit="i16").replace("assume N % 2 == 0",
                                                                     "assume N % 2 == 0\nassume K % 4 == 0"),
                                     "units.lyt")
    p = plan(assumed.compiled.variant(()).chain("w"))
    assert (p.units.unit, p.units.words) == (16, 8)
    assert p.units.offsets == (ex.Const(0), ex.mul(4, ex.Var("K")))


@pytest.mark.slow  # compiles the W4A8 spec at two tp_size (seconds each) and runs its kernels in Triton's interpreter
@pytest.mark.parametrize("tp_size", [2, 4])
def test_w4a8_w13_weights_take_the_tiled_walk_at_tensor_parallelism_and_equal_eager(tp_size):
    # Before, at tp_size > 1 the w13 weights took the words walk (byte loads): the planner checked the grouped
    # form on sizes the spec's ``assume I % (256*tp_size) == 0`` refuses (I = 16 at tp_size 2: a 16-row atom
    # straddles the w1 and w3 halves of the shard). Now it is decided on sizes the assumes allow.
    spec = layoutc.compile_file(SPECS / "vllm_cutlass_w4a8.lyt", {"tp_size": tp_size, "tp_rank": tp_size - 1})
    for tensor, stride in (("w13_weight_packed", ex.div(ex.Var("I"), tp_size)), ("w2_weight_packed",
                                                                                  ex.div(ex.Var("H"), 2))):
        p = plan(spec.compiled.variant(()).chain(tensor))
        assert isinstance(p, Words) and (p.units.unit, p.units.words) == (16, 8), tensor
        assert p.units.stride == stride, tensor
    assert f"_stride, _groups = I // {tp_size}, " in spec.source  # the launcher's tile for w13 (and w2)
    assert spec.source.count("if _TILE > 1:") == 2
    x = synthetic_inputs(spec, {"E": 2, "I": 256 * tp_size, "H": 256}, seed=tp_size)
    assert_same_bits(spec.convert(x, lowering="fused"), spec.convert(x, lowering="eager"))
