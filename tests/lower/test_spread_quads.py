"""The quads walk over output words a spread apart (plan.Plan.spread_quads, issue 24).

triton_kernels' Hopper value layout puts byte k of a source word in output word 4k + m: four
consecutive output words never form a quad, so the words walk loaded every byte alone (57% of a
copy on the H200). With a spread of 4 the kernel loads whole source words and regroups the words in
the program before one contiguous store (89% back to back, BENCHMARKS.md).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: run Triton on CPU tensors

import pytest  # noqa: E402
import torch  # noqa: E402

import layoutc  # noqa: E402
from layoutc.algebra import expr as ex  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.lower import triton_emit  # noqa: E402
from layoutc.lower.plan import quad_word, plan  # noqa: E402
from tests.helpers import assert_same_bits  # noqa: E402

HOPPER_VALUES = (
    "dims E, N, K\nassume K % 32 == 0\ninput w : fp4x2[E, N, K/2]\ninterleave(w, triton_hopper_mx)\n"
    "output w : fp4x2[E, round_up(N, 256)/4, 4*round_up(K/2, 64)] packing triton_hopper_mx\n"
)


@pytest.mark.parametrize("spread", [1, 2, 4, 8])
def test_the_words_of_a_rows_quads_are_each_word_once(spread):
    q = torch.arange(4 * spread * 3)
    words = torch.stack([quad_word(q, spread, j) for j in range(4)])
    assert sorted(words.reshape(-1).tolist()) == list(range(4 * q.numel()))
    assert (words[1] - words[0] == spread).all()  # a quad's words are `spread` apart
    env = {"o": q}
    assert all(torch.equal(torch.as_tensor(ex.evaluate(quad_word(ex.Var("o"), spread, j), env)), words[j])
               for j in range(4))  # the expression the planner substitutes says the same


@pytest.mark.slow  # compiles a spec: about 3 s on the 2-core machine
def test_hopper_values_take_quads_of_words_four_apart_and_equal_the_eager_lowering():
    spec = layoutc.compile_source(HOPPER_VALUES, "hopper_values.lyt")
    p = plan(spec.compiled.variant(()).chain("w"))
    assert p.access == "words" and p.quads is None  # four consecutive words are no quad here
    assert p.spread_quads is not None and p.spread_quads.spread == 4 and p.spread_quads.pairs
    text = triton_emit.body(p, "_b", ("E", "N", "K"))
    assert "tl.permute" in text and "if _ALT:" in text  # regrouped before the store; the words walk stays
    for dims in ({"E": 1, "N": 16, "K": 128}, {"E": 2, "N": 300, "K": 96}):
        x = synthetic_inputs(spec, dims, seed=3)
        assert_same_bits(spec.convert(x, lowering="fused"), spec.convert(x, lowering="eager"))
