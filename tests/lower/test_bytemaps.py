"""Chains that view their tensor at other element widths around a bit permutation (lower/bytemaps.py).

Marlin's weight repack (``view(t, u8)``, byte moves, ``permute_bits``, ``view(t, i32)``) had no one-pass
plan: the views are bit-level steps, and the words plan took one bit-level step only, so every Marlin
weight ran the eager lowering (3% of a device copy on the H200). Seen as bytes, the views move nothing:
the words plan now takes them, and the fused kernels (run here in Triton's interpreter) equal the eager
lowering bit for bit on every Marlin spec and parameter combination, on the tiled quads walk
(Quads.row_tile, Marlin's N-major FP4 weights) and the plain one.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: run Triton on CPU tensors

import attrs  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import layoutc  # noqa: E402
from layoutc.algebra import expr as ex  # noqa: E402
from layoutc.algebra.dtypes import ELEMENT_TYPES  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.algebra.indexmap import IndexMap, gather  # noqa: E402
from layoutc.lang.ops.base import Inferred, TensorType  # noqa: E402
from layoutc.lang.ops.value import Reinterpret  # noqa: E402
from layoutc.lower import triton_emit  # noqa: E402
from layoutc.lower.bytemaps import byte_map, byte_shape  # noqa: E402
from layoutc.lower.plan import ROW_TILE, Words, plan  # noqa: E402
from tests.helpers import SPECS, assert_same_bits  # noqa: E402

MARLIN = [("marlin_gptq_int4", {"group_size": g}) for g in (32, 64, 128)] + [
    ("marlin_gptq_int4", {"group_size": 128, "tp_size": 2, "tp_rank": 1}),
    ("marlin_mxfp4", {}), ("marlin_nvfp4", {})]


class _Step:
    def __init__(self, op, t):
        self.op, self.in_type, self.out_type = op, t, op.infer(t).type


def _bytes_of(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8)


def test_a_view_across_widths_is_the_identity_on_bytes():
    t = TensorType(ELEMENT_TYPES["i32"], (ex.Var("E"), ex.Const(3)))
    m = byte_map(_Step(Reinterpret(ELEMENT_TYPES["u8"]), t))
    assert m is not None and m.in_shape == byte_shape(t) and m.src == (ex.Var("o0"), ex.Var("o1"))
    x = torch.arange(-6, 6, dtype=torch.int32).reshape(2, 6)
    assert torch.equal(x.view(torch.uint8).reshape(-1), _bytes_of(x).reshape(-1))  # torch's view: the same bytes


class _Transpose:  # an element map on i32 (out[e, a, b] = in[e, b, a]), with a padded last axis
    bit_level = False

    def index_map(self, t):
        e, a, b = ex.Var("o0"), ex.Var("o1"), ex.Var("o2")
        return IndexMap(t.shape, (t.shape[0], t.shape[2], ex.Const(4)), (e, b, a), ex.lt(b, t.shape[1]))

    def infer(self, t):
        return Inferred(TensorType(t.elem, (t.shape[0], t.shape[2], ex.Const(4))))


def test_an_element_map_on_wider_elements_moves_their_bytes_in_order():
    t = TensorType(ELEMENT_TYPES["i32"], (ex.Var("E"), ex.Const(3), ex.Const(5)))
    step = _Step(_Transpose(), t)
    m = byte_map(step)
    x = torch.randint(-2**31, 2**31 - 1, (2, 3, 5), dtype=torch.int32)
    want = torch.zeros(2, 5, 4, dtype=torch.int32)
    want[:, :, :3] = x.transpose(1, 2)  # padding: zero words, so zero bytes
    got = gather(m, _bytes_of(x), {"E": 2})
    assert torch.equal(got, _bytes_of(want))
    filled = _Step(_Transpose(), t)
    filled.op.index_map = lambda t, m=step.op.index_map(t): attrs.evolve(m, fill=ex.Const(7))
    assert byte_map(filled) is None  # a fill of a wider element has no one byte to repeat


@pytest.mark.slow  # compiles a spec and runs the kernels in the interpreter: seconds each
@pytest.mark.parametrize("name, params", MARLIN, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={x}" for k, x in v.items()) or "defaults")
def test_marlin_weights_are_one_pass_and_the_fused_kernels_equal_the_eager_lowering(name, params):
    spec = layoutc.compile_file(SPECS / f"{name}.lyt", params)
    weights = [c for c in spec.compiled.variants[0].chains if any(s.op.word_permutation() for s in c.steps)]
    assert weights
    for chain in weights:
        p = plan(chain)
        assert isinstance(p, Words) and p.spread_quads is not None, (chain.tensor, p)
        n_major = chain.source.elem.name == "fp4x2"  # Marlin FP4: N-major bytes, the tiled walk
        assert p.spread_quads.row_tile == (ROW_TILE if n_major else 1)
        assert p.in_shape == byte_shape(chain.source)  # the plan reads the input's bytes
    # the kernel's map says what it indexes where the input's elements are wider than a byte (GPTQ's int32)
    assert ("in = the input as bytes" in spec.source) == any(c.source.elem.bits > 8 for c in weights)
    # E = 3 (rows of quads from two experts share a row tile); FP4: a second, partial, column tile
    dims = {"E": 3, "I": (192 if name != "marlin_gptq_int4" else 384) * params.get("tp_size", 1), "H": 384}
    x = synthetic_inputs(spec, dims, seed=5)
    before = {k: v.clone() for k, v in x.items()}
    fused, eager = spec.convert(x, lowering="fused"), spec.convert(x, lowering="eager")
    assert set(fused) == set(eager)
    for k in fused:
        assert_same_bits(fused[k], eager[k], f"{name} {params} {k}")
    assert all(torch.equal(_bytes_of(x[k]), _bytes_of(before[k])) for k in x)  # inputs untouched (NaN scales too)


@pytest.mark.slow  # compiles a spec: seconds
def test_the_tiled_walk_regroups_its_rows_before_one_2d_store():
    spec = layoutc.compile_file(SPECS / "marlin_mxfp4.lyt")
    chain = next(c for c in spec.compiled.variants[0].chains if c.tensor == "w13_weight")
    p = plan(chain)
    text = triton_emit.body(p, "_b", ("E", "I", "H"))
    assert "_lane % 8" in text and "tl.permute(tl.reshape(w, (32, 4, 8, 4)), (2, 0, 3, 1))" in text
    assert "rows[:, None]" in text and "if _ALT:" in text  # the words walk stays for other dims
