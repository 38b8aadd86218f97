"""Transposing element maps take the tiles walk (lower/strides.py, triton_emit._tiles).

Marlin's scales (``out[e, k, n] = in[e, perm(n), k]``) were gathered one element per lane: the output's
contiguous axis reads the source a row apart, so every lane of a warp read another row (marlin_mxfp4 at
54.5%, marlin_nvfp4 at 30.8% of a device copy on the H200). The planner now finds, from the map's
strides alone, the output axis that reads the source in order, and the kernel walks 2-D tiles of
(that axis, the last axis). The fused kernels (run here in Triton's interpreter, with partial tiles on
both axes) equal the eager lowering bit for bit.
"""

from __future__ import annotations

import itertools
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: run Triton on CPU tensors

import pytest  # noqa: E402
import torch  # noqa: E402

import layoutc  # noqa: E402
from layoutc.algebra import expr as ex  # noqa: E402
from layoutc.algebra.indexmap import IndexMap  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.lower import triton_emit  # noqa: E402
from layoutc.lower.plan import Access, Gather, plan  # noqa: E402
from layoutc.lower.strides import transpose_axis  # noqa: E402
from tests.helpers import SPECS, assert_same_bits  # noqa: E402

E, A, B = ex.Var("E"), ex.Var("A"), ex.Var("B")
o0, o1, o2 = ex.Var("o0"), ex.Var("o1"), ex.Var("o2")
INSTANCES = [{"E": 2, "A": 3, "B": 5}, {"E": 1, "A": 4, "B": 7}]


def _map(src, valid=ex.TRUE, out=(E, B, A)) -> IndexMap:
    return IndexMap((E, A, B), out, src, valid)


def test_the_axis_that_reads_the_source_in_order_is_found_from_the_strides():
    assert transpose_axis(_map((o0, o2, o1)), (E, A, B), (E, B, A), INSTANCES) == 1  # out[e, b, a] = in[e, a, b]
    # the last axis reads stride 1: no transpose (a copy, a gather along rows)
    assert transpose_axis(_map((o0, o1, o2), out=(E, A, B)), (E, A, B), (E, A, B), INSTANCES) is None
    # no axis reads stride 1 (a reversed axis along the source's rows): nothing to load in order
    rev = _map((o0, o2, ex.add(ex.mul(-1, o1), ex.add(B, -1))))
    assert transpose_axis(rev, (E, A, B), (E, B, A), INSTANCES) is None
    # a permuted last axis (Marlin's scales): still a transpose; reading past the source where the map
    # says so is not a stride (a padded axis: out[e, b, a] = in[e, a, b] for a < A - 1)
    perm = ex.add(ex.mul(2, ex.floordiv(o2, 2)), ex.add(1, ex.mul(-1, ex.mod(o2, 2))))
    padded = _map((o0, perm, o1), ex.lt(perm, A))
    assert transpose_axis(padded, (E, A, B), (E, B, ex.mul(2, ex.ceil_div(A, 2))), INSTANCES) == 1


def test_too_few_instances_decide_nothing():
    assert transpose_axis(_map((o0, o2, o1)), (E, A, B), (E, B, A), INSTANCES[:1]) is None


def test_an_instance_whose_last_axis_reads_one_element_per_row_decides_nothing():
    # out[e, h] = in[e, perm(h)] padded (trtllm's w2_bias): o0 reads stride H, 1 where H = 1, and there
    # the last axis never steps between two elements read; such instances are no evidence of a transpose
    perm = ex.add(ex.floordiv(ex.mod(o1, 8), 4), ex.mul(2, ex.mod(o1, 4)))
    m = IndexMap((E, A), (E, ex.mul(8, ex.ceil_div(A, 8))), (o0, perm), ex.lt(perm, A))
    tiny = [{"E": 2, "A": 1}, {"E": 3, "A": 1}]
    assert transpose_axis(m, (E, A), m.out_shape, tiny) is None
    assert transpose_axis(m, (E, A), m.out_shape, tiny + [{"E": 2, "A": 8}]) is None


def _scales(spec):
    return [c for v in spec.compiled.variants for c in v.chains if c.tensor.endswith("_scale")]


@pytest.mark.slow  # compiles a spec: seconds
def test_marlin_scales_take_the_tiles_walk_and_the_kernel_shows_its_map():
    spec = layoutc.compile_file(SPECS / "marlin_nvfp4.lyt")
    chains = _scales(spec)
    assert chains
    for chain in chains:
        p = plan(chain)
        assert isinstance(p, Gather) and p.access is Access.TILES and p.tile_axis == 1, (chain.tensor, p)
    text = triton_emit.body(plan(chains[0]), "_b", ("E", "I", "H"))
    assert "o1 = rows[:, None]" in text and "o2 = cols[None, :]" in text and "_p = 4*(o2 // 4)" in text
    assert all(len(line) <= 120 for line in spec.source.splitlines())
    assert "64x64 tiles loaded along source rows" in spec.source


def _params(name: str) -> list[dict]:
    choices = {"marlin_mxfp4": {"tp_size": [1, 2]}, "aiter_mxfp4": {"tp_size": [1, 2]},
               "marlin_nvfp4": {"activation": ["silu", "relu2"], "act_dtype": ["bf16", "f16"], "tp_size": [1, 2]}}
    keys = list(choices[name])
    return [dict(zip(keys, vals), tp_rank=vals[-1] - 1) for vals in itertools.product(*choices[name].values())]


CASES = [(n, p) for n in ("marlin_mxfp4", "marlin_nvfp4", "aiter_mxfp4") for p in _params(n)]


@pytest.mark.slow  # compiles a spec and runs its kernels in the interpreter: seconds each
@pytest.mark.parametrize("name, params", CASES, ids=[f"{n}-{','.join(f'{k}={v}' for k, v in p.items())}"
                                                    for n, p in CASES])
def test_the_fused_kernels_equal_the_eager_lowering(name, params):
    spec = layoutc.compile_file(SPECS / f"{name}.lyt", params)
    tiles = {c.tensor for c in spec.compiled.variants[0].chains if plan(c).access is Access.TILES}
    assert tiles == ({"w13_weight_scale", "w2_weight_scale"} if name.startswith("marlin") else set())
    # I/32 = 6 rows of a 64-row tile, H = 320 (a partial column tile), three experts
    tp = params["tp_size"]
    dims = {"E": 3, "I": 192 * tp, "H": 320} if name != "aiter_mxfp4" else {"E": 2, "I": 64 * tp, "H": 96}
    x = synthetic_inputs(spec, dims, seed=7)
    before = {k: v.clone() for k, v in x.items()}
    fused, eager = spec.convert(x, lowering="fused"), spec.convert(x, lowering="eager")
    assert set(fused) == set(eager)
    for k in fused:
        assert_same_bits(fused[k], eager[k], f"{name} {params} {k}")
    assert all(torch.equal(x[k].view(torch.uint8), before[k].view(torch.uint8)) for k in x)


@pytest.mark.parametrize("shape", [(2, 5, 8), (1, 70, 3), (3, 66, 130)])
def test_a_transpose_with_a_value_conversion_and_padding_tiles_equal_eager(shape):
    # a synthetic spec: a strided transpose (an affine map), cast to f32, the last axis padded
    text = ("dims E, R, K\ninput w : bf16[E, R, K]\npad(w, dim=1, multiple=4)\ntranspose(w, 1, 2)\ncast(w, f32)\n"
            "output w : f32[E, K, round_up(R, 4)]\n")
    spec = layoutc.compile_source(text, "tiles.lyt")
    p = plan(spec.compiled.variant(()).chain("w"))
    assert p.access is Access.TILES and p.tile_axis == 1
    x = {"w": torch.randn(*shape).to(torch.bfloat16)}
    fused, eager = spec.convert(x, lowering="fused")["w"], spec.convert(x, lowering="eager")["w"]
    assert_same_bits(fused, eager)
    want = torch.zeros(shape[0], shape[2], -(-shape[1] // 4) * 4)
    want[:, :, :shape[1]] = x["w"].transpose(1, 2).float()
    assert_same_bits(fused, want)


def test_an_instance_where_the_transposed_axis_has_one_element_decides_nothing():
    # CUTLASS W4A8's w13 scales out[e, k, n] = in[e, n, k], k < H/128: at H = 128 (an instance of the
    # dims that the spec's assume H % 256 excludes but the chain's samples hold) the row has one
    # element, so the last axis reads stride 1 there; before, that instance ruled the transpose out
    # and the scales took one element per lane (7.3% of a copy on the H200 at E=256, I=2048, H=7168)
    one = [{"E": 2, "A": 5, "B": 1}]
    assert transpose_axis(_map((o0, o2, o1)), (E, A, B), (E, B, A), one + INSTANCES) == 1
    # a last axis that reads stride 1 where the candidate does step still decides: no transpose
    assert transpose_axis(_map((o0, o1, o2), out=(E, A, B)), (E, A, B), (E, A, B), INSTANCES) is None
