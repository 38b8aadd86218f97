"""Runs of elements move as one word through a relabelling conversion (``plan.relabels_only``).

FlashInfer's TRT-LLM MXFP4 scales are e8m0 in the 128x4 swizzle, then relabelled as e4m3
(``view(t, e4m3)``): every output run of 4 bytes reads 4 aligned source bytes, but a plan with any
value conversion took one element per lane, one byte loaded and stored by each lane (18-24% of a copy
on the H200 at the gpt-oss-120b layer, benchmarks/kernel_split.py, against 48-73% for the same
swizzle without the view). A conversion that keeps every bit (``Conversion.keeps_bits``) changes no
byte, so the plan coarsens as without it; a conversion that changes bits still does not.
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: run Triton on CPU tensors

import pytest  # noqa: E402

import layoutc  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.lower import triton_emit  # noqa: E402
from layoutc.lower.plan import plan, relabels_only  # noqa: E402
from layoutc.lang.ops.conversion import UnknownKind  # noqa: E402
from tests.helpers import assert_same_bits  # noqa: E402

pytestmark = pytest.mark.slow  # compiles two specs: about 1 s each on the loaded 2-core machine

SWIZZLE = ("dims E, N, K\ninput w : fp4x2[E, N, 16*K]\ninput s : e8m0[E, N, K] scales w block 32\n"
           "interleave(s, sf_128x4){view}\noutput w : fp4x2[E, N, 16*K]\n"
           "output s : {out}[E, round_up(N, 128), round_up(K, 4)] packing sf_128x4\n")
RELABELLED = SWIZZLE.format(view="; view(s, e4m3)", out="e4m3")


@functools.cache
def _plan(text: str):
    spec = layoutc.compile_source(text, "swizzle.lyt")
    return spec, plan(spec.compiled.variant(()).chain("s"))


def test_a_relabelled_swizzle_moves_runs_of_four_bytes_as_words():
    _, p = _plan(RELABELLED)
    assert p.conversions and relabels_only(p)
    assert p.coarse == 4  # was 1 (one byte per lane) before relabelling conversions were allowed
    assert "if _ALT:" in triton_emit.body(p, "_b", ("E", "N", "K"))  # the coarse walk, the element walk beside it


def test_the_view_changes_nothing_the_walk_reads():
    _, p = _plan(RELABELLED)
    _, plain = _plan(SWIZZLE.format(view="", out="e8m0"))
    assert plain.coarse == 4 and plain.map == p.map  # the view moves no byte: the same walk


@pytest.mark.parametrize("dims", [{"E": 2, "N": 130, "K": 8}, {"E": 1, "N": 64, "K": 6}])
def test_the_coarse_walk_of_a_relabelled_swizzle_equals_the_eager_lowering(dims):
    # K = 8: whole words (the coarse walk); K = 6: the launcher's element walk with the view applied.
    spec, _ = _plan(RELABELLED)
    x = synthetic_inputs(spec, dims, seed=5)
    assert_same_bits(spec.convert(x, lowering="fused"), spec.convert(x, lowering="eager"))


def test_a_conversion_that_changes_bits_keeps_one_element_per_lane():
    import attrs

    from layoutc.lang.ops.conversion import Cast
    from layoutc.algebra.dtypes import ELEMENT_TYPES

    _, p = _plan(RELABELLED)
    cast = attrs.evolve(p, conversions=(Cast(to=ELEMENT_TYPES["e4m3"]),), coarse=4)
    assert not relabels_only(cast)
    with pytest.raises(UnknownKind, match="coarse walk"):  # the emitter refuses to drop a real conversion
        triton_emit.body(cast, "_b", ("E", "N", "K"))
