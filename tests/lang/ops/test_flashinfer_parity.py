"""Primitives and the prelude's packing families against FlashInfer itself: its pure-torch helpers
run here on CPU, and golden tensors recorded from its CUDA kernels on an H200 (``tests/goldens``).

Each comparison checks both the eager functions and the index maps (one op, or a family's whole
chain composed into one map), and that the inverse chain gives the input back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from layoutc.algebra import expr as ex
from layoutc.algebra import indexmap as im
from layoutc.algebra.dtypes import ELEMENT_TYPES as ET
from layoutc.algebra.expr import Const, Var
from layoutc.lang.expand import family_chain
from layoutc.lang.ops import TensorType, rows

from .conftest import assert_bits_equal, naive_sm90_interleave, naive_swizzle, random_tensor

pytestmark = pytest.mark.flashinfer  # FlashInfer's own functions: the slow tier (make test-slow)
flashinfer = pytest.importorskip("flashinfer")
fi_core = pytest.importorskip("flashinfer.fused_moe.core")
fi_moe = pytest.importorskip("flashinfer.fused_moe")

GOLDENS = Path(__file__).resolve().parents[2] / "goldens"


def TT(elem, *shape):
    return TensorType(ET[elem], tuple(ex.as_expr(s) for s in shape))


def _run(op, t, x, dims):
    fn, args = op.impl(t)
    args = tuple(_arg(a, dims) for a in args)
    return fn(x, *args)


def _arg(a, dims):
    if isinstance(a, ex.Expr):
        return int(ex.evaluate(a, dims))
    if isinstance(a, tuple):
        return tuple(_arg(v, dims) for v in a)
    if hasattr(a, "source"):
        return eval(a.source(), {"torch": torch, **dims})  # an index formula's lambda
    return a


def both(op, t, x, dims=None):
    """(eager output, index-map output) of ``op`` on ``x``; they must agree with each other."""
    dims = dims or {}
    return _run(op, t, x, dims), im.gather(op.index_map(t), x, dims)


def check(op, t, x, want, dims=None, what=""):
    eager, mapped = both(op, t, x, dims)
    assert_bits_equal(eager, want, f"{what} eager")
    assert_bits_equal(mapped, want, f"{what} index map")


def check_family(family, role, t, x, want, dims=None, what="", params=None):
    """A prelude family's chain for ``role``: eager op by op, as one composed index map, and back."""
    dims = dims or {}
    steps = family_chain(family, role, t, params, set(dims))
    y = x
    for s in steps:
        y = _run(s.op, s.in_type, y, dims)
    assert_bits_equal(y, want, f"{what} eager chain")
    composed = im.compose_all([s.op.index_map(s.in_type) for s in steps])
    assert_bits_equal(im.gather(composed, x, dims), want, f"{what} composed map")
    back = y
    for s in reversed(steps):
        inv = s.op.inverse(s.in_type)
        if inv is None:
            return y
        back = _run(inv, s.out_type, back, dims)
    assert_bits_equal(back, x, f"{what} inverse chain")
    return y


def test_flashinfer_version_is_pinned_range():
    assert flashinfer.__version__.startswith("0.7."), flashinfer.__version__


# ---------------------------------------------------------------------------
# gated row reorder (TRT-LLM): reorder_rows_for_gated_act_gemm, deinterleave_gated_rows


@pytest.mark.parametrize("shape", [(2, 3), (8, 4), (64, 7), (10, 1)])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32])
def test_reorder_rows_for_gated_act_gemm(shape, dtype):
    x = random_tensor(shape, dtype, seed=shape[0])
    want = fi_core.reorder_rows_for_gated_act_gemm(x)
    t = TT({torch.uint8: "u8", torch.bfloat16: "bf16", torch.float32: "f32"}[dtype], *shape)
    check(rows.ReorderGatedRows(0), t, x, want, what="reorder_gated_rows")
    check(rows.InterleaveRows(0, group=1), t, x, want, what="interleave_rows(group=1)")


@pytest.mark.parametrize("shape", [(3, 16, 8), (2, 64, 4)])
def test_reorder_rows_for_gated_act_gemm_per_expert(shape):
    x = random_tensor(shape, torch.uint8, seed=1)
    want = torch.stack([fi_core.reorder_rows_for_gated_act_gemm(x[e]) for e in range(shape[0])])
    E, n, k = Var("E"), Var("N"), Var("K")
    dims = {"E": shape[0], "N": shape[1], "K": shape[2]}
    check(rows.ReorderGatedRows(), TT("fp4x2", E, n, k), x, want, dims, "reorder_gated_rows 3-D")


@pytest.mark.parametrize("block", [1, 2, 4, 16, 64])
@pytest.mark.parametrize("pairs", [1, 3])
def test_deinterleave_gated_rows(block, pairs):
    n = 2 * block * pairs
    x = random_tensor((n, 5), torch.uint8, seed=block)
    want = fi_core.deinterleave_gated_rows(x, block)
    check(rows.Deinterleave(0, group=block), TT("u8", n, 5), x, want, what=f"deinterleave(group={block})")
    # and the interleave undoes it, as FlashInfer documents for block=1
    if block == 1:
        assert_bits_equal(fi_core.reorder_rows_for_gated_act_gemm(want), x)
    back, _ = both(rows.InterleaveRows(0, group=block), TT("u8", n, 5), want)
    assert_bits_equal(back, x)


def test_deinterleave_gated_rows_per_expert():
    x = random_tensor((2, 128, 6), torch.bfloat16, seed=3)
    want = torch.stack([fi_core.deinterleave_gated_rows(x[e], 64) for e in range(2)])
    check(rows.Deinterleave(1, group=64), TT("bf16", 2, 128, 6), x, want, what="deinterleave 3-D")


# ---------------------------------------------------------------------------
# TRT-LLM-gen epilogue shuffle: shuffle_matrix_a


def _shuffle_matrix_a():
    fn = getattr(flashinfer, "shuffle_matrix_a", None)
    if fn is None:
        from flashinfer.fp4_quantization import shuffle_matrix_a as fn
    return fn


@pytest.mark.parametrize("tile", [64, 128, 256, 192])
@pytest.mark.parametrize("m", [32, 64, 96, 256])
def test_shuffle_matrix_a(tile, m):
    x = random_tensor((m, 6), torch.uint8, seed=m + tile)
    want = _shuffle_matrix_a()(x, tile)
    check_family("trtllm", "weight", TT("u8", m, 6), x, want, what=f"trtllm({tile})", params={"epilogue_tile": tile})


def test_both_shuffle_matrix_a_entry_points_agree():
    from flashinfer.fp4_quantization import shuffle_matrix_a as fp4_entry

    x = random_tensor((64, 3), torch.uint8, seed=9)
    for tile in (64, 128):
        assert torch.equal(_shuffle_matrix_a()(x, tile), fp4_entry(x, tile))


@pytest.mark.parametrize("tile", [64, 128])
def test_shuffle_matrix_a_per_expert(tile):
    x = random_tensor((3, 64, 4), torch.bfloat16, seed=tile)
    want = torch.stack([_shuffle_matrix_a()(x[e], tile) for e in range(3)])
    dims = {"E": 3, "I": 32, "H": 8}
    t = TT("bf16", Var("E"), 2 * Var("I"), ex.div(Var("H"), 2))
    check_family("trtllm", "weight", t, x, want, dims, f"trtllm 3-D ({tile})", {"epilogue_tile": tile})
    bias = random_tensor((3, 64), torch.float32, seed=tile + 1)
    want_b = torch.stack([_shuffle_matrix_a()(bias[e].unsqueeze(-1), tile).squeeze(-1) for e in range(3)])
    check_family("trtllm", "bias", TT("f32", Var("E"), 2 * Var("I")), bias, want_b, dims, "trtllm bias",
                 {"epilogue_tile": tile})


def test_shuffle_matrix_sf_a_rows_are_the_trtllm_rows():
    # shuffle_matrix_sf_a = the same rows as shuffle_matrix_a, then the 128x4 interleave
    from flashinfer.utils import get_shuffle_matrix_sf_a_row_indices

    x = random_tensor((256, 8), torch.uint8, seed=3)
    rows_ = get_shuffle_matrix_sf_a_row_indices(x, 128)
    check_family("trtllm", "scale", TT("e4m3", 256, 8), x.view(torch.float8_e4m3fn),
                 x[rows_].view(torch.float8_e4m3fn), what="trtllm scale rows")


# ---------------------------------------------------------------------------
# SM90 mixed-GEMM scale fold (pure torch in FlashInfer)


@pytest.mark.parametrize("shape", [(1, 64, 4), (2, 128, 8), (3, 64, 12), (2, 192, 4)])
def test_interleave_moe_scales_for_sm90_mixed_gemm(shape):
    x = random_tensor(shape, torch.uint8, seed=sum(shape))
    want = fi_moe.interleave_moe_scales_for_sm90_mixed_gemm(x)
    assert tuple(want.shape) == (shape[0], shape[1] // 64, shape[2] // 4, 16, 16)
    check_family("sm90_mixed", "scale", TT("e8m0", *shape), x, want, what="fold")
    E, I, H = Var("E"), Var("I"), Var("H")
    dims = {"E": shape[0], "I": shape[1] // 2, "H": shape[2] * 32}
    check_family("sm90_mixed", "scale", TT("e8m0", E, 2 * I, ex.div(H, 32)), x, want, dims, "fold symbolic")


def test_sm90_scale_fold_requirements_match_flashinfer():
    # what FlashInfer rejects is what the family's chain requires (rows % 64, scale columns % 4)
    for shape in [(1, 32, 4), (1, 64, 6)]:
        x = torch.zeros(shape, dtype=torch.uint8)
        with pytest.raises(ValueError):
            fi_moe.interleave_moe_scales_for_sm90_mixed_gemm(x)
        t = TT("e8m0", *shape)
        reqs = [r for s in family_chain("sm90_mixed", "scale", t) for r in s.op.infer(s.in_type).requires]
        assert not all(r.holds({}) for r in reqs)


# ---------------------------------------------------------------------------
# CuTeDSL gated interleave: interleave_cute_dsl_moe_weights


@pytest.mark.parametrize("swap_ab,group", [(False, 64), (True, 16)])
@pytest.mark.parametrize("e,rows_,k", [(1, 128, 8), (2, 256, 16), (3, 128, 4)])
def test_interleave_cute_dsl_moe_weights(swap_ab, group, e, rows_, k):
    w = random_tensor((e, rows_, k), torch.uint8, seed=rows_ + k)
    s = random_tensor((e, rows_, k // 4 if k >= 4 else 1), torch.uint8, seed=e)
    want_w, want_s = fi_moe.interleave_cute_dsl_moe_weights(w, s, swap_ab=swap_ab)
    op = rows.InterleaveRows(1, group=group)
    check(op, TT("fp4x2", *w.shape), w, want_w, what="weight")
    check(op, TT("e4m3", *s.shape), s.view(torch.float8_e4m3fn), want_s.view(torch.float8_e4m3fn), what="scale")
    # symbolic weight shape, as a spec declares it
    dims = {"E": e, "I": rows_ // 2, "H": 2 * k}
    t = TT("fp4x2", Var("E"), 2 * Var("I"), ex.div(Var("H"), 2))
    check(op, t, w, want_w, dims, "weight symbolic")


# ---------------------------------------------------------------------------
# goldens recorded from FlashInfer's CUDA kernels


def _golden(name):
    path = GOLDENS / name
    if not path.exists():
        pytest.skip(f"missing golden {name}")
    return torch.load(path)


def test_goldens_are_from_flashinfer_07():
    for name in ("sm90_fp4_interleave.pt", "block_scale_interleave.pt"):
        meta = _golden(name)["meta"]
        assert str(meta["flashinfer"]).startswith("0.7."), meta


def test_sm90_fp4_interleave_golden():
    g = _golden("sm90_fp4_interleave.pt")
    assert len(g["cases"]) >= 4
    for case in g["cases"]:
        w, want = case["input"], case["output"]
        assert w.dtype == torch.uint8 and want.shape == w.shape
        t = TT("fp4x2", *(Const(s) for s in w.shape))
        check_family("sm90_mixed", "weight", t, w, want, what=f"interleave {tuple(w.shape)}")
        # the naive transcription of the documented formula agrees with the kernel too
        if w.numel() <= 8192:
            assert_bits_equal(naive_sm90_interleave(w), want, f"naive {tuple(w.shape)}")


@pytest.mark.parametrize("index", range(10))
def test_sm90_fp4_interleave_golden_symbolic(index):
    g = _golden("sm90_fp4_interleave.pt")
    if index >= len(g["cases"]):
        pytest.skip("fewer golden cases")
    w, want = g["cases"][index]["input"], g["cases"][index]["output"]
    # the shape a spec declares, [E, N, K/2] and dims
    ts = TT("fp4x2", Var("E"), Var("N"), ex.div(Var("K"), 2))
    dims = {"E": w.shape[0], "N": w.shape[1], "K": 2 * w.shape[2]}
    check_family("sm90_mixed", "weight", ts, w, want, dims, "symbolic")


def test_block_scale_interleave_golden():
    g = _golden("block_scale_interleave.pt")
    assert len(g["cases"]) >= 4
    for case in g["cases"]:
        x, want = case["input"], case["output"]
        assert want.dim() == 1  # FlashInfer returns a flat buffer
        *lead, r, c = x.shape
        prow, pcol = -(-r // 128) * 128, -(-c // 4) * 4
        nlead = 1
        for v in lead:
            nlead *= v
        assert want.numel() == nlead * prow * pcol
        t = TT("e4m3" if x.dtype == torch.uint8 else "bf16", *x.shape)
        xv = x.view(torch.float8_e4m3fn) if x.dtype == torch.uint8 else x
        wv = want.view(torch.float8_e4m3fn) if x.dtype == torch.uint8 else want
        steps = family_chain("sf_128x4", "scale", t)
        y = xv
        for s in steps:
            y = _run(s.op, s.in_type, y, {})
        assert_bits_equal(y.reshape(-1), wv, f"eager {tuple(x.shape)}")
        mapped = im.gather(im.compose_all([s.op.index_map(s.in_type) for s in steps]), xv)
        assert_bits_equal(mapped.reshape(-1), wv, f"map {tuple(x.shape)}")
        assert_bits_equal(naive_swizzle(x).reshape(-1), want.view(torch.int16) if x.dtype == torch.bfloat16 else want,
                          f"naive {tuple(x.shape)}")
