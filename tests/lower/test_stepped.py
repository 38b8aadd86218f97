"""Stepped runs (``layoutc.lower.stepped``): a word of sub-word elements per lane, each read at fixed steps.

AITER's MXFP4 scale shuffle reads consecutive output bytes 1 row, 4 columns, then 1 row apart: the
gather took one byte per lane, bound by its index arithmetic (24-27% of a copy on the H200,
benchmarks/kernel_split.py). The planner now finds, from the map alone, each run's steps in source
coordinates, and that the map reads exactly what lies inside the source (its validity); the kernel
computes a run's source coordinates once. Checked here: the steps found, the walk equal to the eager
lowering under Triton's interpreter (where the launcher takes it, and the element walk where it does
not), and maps it must refuse.
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: run Triton on CPU tensors

import pytest  # noqa: E402

import layoutc  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.lower import triton_emit  # noqa: E402
from layoutc.lower.plan import plan  # noqa: E402
from tests.helpers import SPECS, assert_same_bits  # noqa: E402

pytestmark = pytest.mark.slow  # compiles specs: 1-15 s each on the loaded 2-core machine

AITER_W2 = (  # aiter_mxfp4's w2 and its scales, padded to 256
    "dims E, I, H\nassume I % 32 == 0\ninput w : fp4x2[E, H, I/2]\ninput s : e8m0[E, H, I/32] scales w block 32\n"
    "pad(w, dim=2, multiple=128); pad(s, dim=2, multiple=8); pad([w, s], dim=1, multiple=256)\n"
    "interleave(w, aiter_a16w4); interleave(s, aiter_a16w4)\n"
    "output w : fp4x2[E, round_up(H, 256), round_up(I, 256)/2] packing aiter_a16w4\n"
    "output s : e8m0[E*round_up(H, 256), round_up(round_up(I, 256)/32, 8)] packing aiter_a16w4\n"
)


@functools.cache
def _spec(name: str, params: tuple = ()):
    return layoutc.compile_file(SPECS / f"{name}.lyt", dict(params))


@functools.cache
def _inline():
    return layoutc.compile_source(AITER_W2, "aiter_w2.lyt")


def test_aiter_scales_take_runs_of_four_bytes_stepped_rows_and_columns_apart():
    p = plan(_inline().compiled.variant(()).chain("s"))
    assert p.steps is not None and p.steps.run == 4  # was None: one byte per lane
    assert p.steps.steps == ((0, 0, 0), (0, 16, 0), (0, 0, 4), (0, 16, 4))  # (expert, row, column) steps
    text = triton_emit.body(p, "_b", ("E", "I", "H"))
    assert "if _ALT:" in text and text.count("tl.load(") == 5  # 4 loads in the stepped walk, 1 in the other


@pytest.mark.parametrize("dims", [{"E": 2, "I": 256, "H": 256}, {"E": 1, "I": 64, "H": 32}])
def test_the_stepped_walk_equals_the_eager_lowering(dims):
    # I = 256: runs of whole words (the stepped walk); I = 64: a row of 8 scales padded from 2 (masks)
    spec = _inline()
    x = synthetic_inputs(spec, dims, seed=11)
    assert_same_bits(spec.convert(x, lowering="fused"), spec.convert(x, lowering="eager"))


@pytest.mark.parametrize("dims", [{"E": 2, "I": 256, "H": 256}, {"E": 1, "I": 64, "H": 32}])
def test_the_shipped_aiter_spec_equals_the_eager_lowering(dims):
    spec = _spec("aiter_mxfp4")
    x = synthetic_inputs(spec, dims, seed=11)
    assert_same_bits(spec.convert(x, lowering="fused"), spec.convert(x, lowering="eager"))


@pytest.mark.parametrize("name,dims", [("triton_kernels_mxfp4_hopper", {"E": 2, "I": 128, "H": 256}),
                                       ("marlin_gptq_int4", {"E": 2, "I": 256, "H": 256})])
def test_other_specs_taking_the_stepped_walk_equal_the_eager_lowering(name, dims):
    spec = _spec(name)
    x = synthetic_inputs(spec, dims, seed=12)
    assert_same_bits(spec.convert(x, lowering="fused"), spec.convert(x, lowering="eager"))
