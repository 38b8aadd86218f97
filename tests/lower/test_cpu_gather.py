"""The CPU gather's whole-word paths equal the eager reference bit for bit.

``quads``: SM90 FP4 weights read as whole source words (per row as strided runs where the plan
found one stride), the 4x4 byte transpose as one copy, the bit interleave as two half-word
tables. ``coarse``: gathers that move runs of 2-8 elements, one wider word per run. Property:
over small dims each spec accepts, ``gather`` == ``eager``; the paths are in the generated code
(so the property is about them, not about the per-element fallback).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.lower import torch_emit
from tests.helpers import assert_same_bits
from tests.helpers import spec as _spec

CASES = {  # spec: the fast parts its converter must contain
    "flashinfer_cutlass_bf16": ("_quads(", "runs = src_words.as_strided", "_coarse(", "_quad_rows("),
    "flashinfer_cutlass_mxfp4_padded": ("_quads(", "index = torch.stack", "_coarse("),
    "flashinfer_cutlass_nvfp4": ("_coarse(",),
    "flashinfer_trtllm_fp8_block": ("_coarse(",),
    "flashinfer_cutedsl_nvfp4": ("_coarse(",),
}



@pytest.mark.parametrize("name", sorted(CASES))
def test_the_fast_parts_are_generated(name):
    source = _spec(name).source
    for part in CASES[name]:
        assert part in source, (name, part)


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(e=st.integers(1, 3), i=st.integers(1, 12), h=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_gather_equals_eager(name, e, i, h, seed):
    spec = _spec(name)
    dims = {"E": e, "I": 32 * i, "H": 32 * h}
    try:
        x = synthetic_inputs(spec, dims, seed=seed)
        want = spec.convert(x, lowering="eager")
    except layoutc.LayoutError:
        assume(False)  # dims this spec refuses (its size conditions)
    got = spec.convert(x, lowering="gather")
    for k in want:
        assert_same_bits(got[k], want[k], f"{name} {dims} {k}")


@pytest.mark.parametrize("numba", ["1", "0"])
def test_the_quads_row_table_is_made_once_per_shape(numba, monkeypatch):
    # The strided quads part's row table (the first quad's source words of each row) depends on the dims and the
    # experts asked for alone: evaluated on a shape's first call (a third of a warm CPU call when it was not).
    monkeypatch.setenv("LAYOUTC_NUMBA", numba)
    spec = _spec("flashinfer_cutlass_bf16")
    m = spec.module
    made = []
    for name in [n for n in vars(m) if n.endswith("_quad_rows")]:
        fn = getattr(m, name)
        monkeypatch.setattr(m, name, lambda *a, _fn=fn, _name=name: made.append(_name) or _fn(*a))
    m._RUN_PLANS.clear()
    small, other = {"E": 2, "I": 128, "H": 256}, {"E": 1, "I": 256, "H": 128}
    for dims in (small, small, other, other, small):
        x = synthetic_inputs(spec, dims, seed=sum(dims.values()))
        got = spec.convert(x, lowering="gather", fingerprint=False)
        want = spec.convert(x, lowering="eager", fingerprint=False)
        for k in want:
            assert_same_bits(got[k], want[k], f"{dims} {k}")
    assert made and len(made) == 2 * len(set(made)), made  # once per shape for each tensor's table


def test_unaligned_inputs_take_the_word_paths_too():
    spec = _spec("flashinfer_cutlass_bf16")
    x = synthetic_inputs(spec, {"E": 2, "I": 128, "H": 256}, seed=3)
    # views one byte into a larger buffer: not 4-byte aligned, so the parts copy before the word view
    shifted = {k: (torch.cat([v.new_zeros(1).view(-1), v.reshape(-1)])[1:].view(v.shape) if v.dtype == torch.uint8 else v)
               for k, v in x.items()}
    assert shifted["w13_weight"].data_ptr() % 4 != 0
    want = spec.convert(x, lowering="eager")
    got = spec.convert(shifted, lowering="gather")
    for k in want:
        assert_same_bits(got[k], want[k], k)


@given(table=st.permutations(range(32)))
@settings(max_examples=25, deadline=None)
def test_bit_tables_permute_bits(table):
    namespace = {"torch": torch}
    exec(torch_emit.bit_tables_source(), namespace)
    low, high = namespace["_bit_tables"](tuple(table))
    words = torch.randint(-2**31, 2**31, (512,), dtype=torch.int64).to(torch.int32)
    halves = words.view(torch.int16).to(torch.int32).view(-1, 2) & 0xFFFF
    got = low.index_select(0, halves[:, 0]) | high.index_select(0, halves[:, 1])
    w = words.to(torch.int64) & 0xFFFFFFFF
    want = sum(((w >> s) & 1) << i for i, s in enumerate(table))
    assert torch.equal(got.to(torch.int64) & 0xFFFFFFFF, want)


def _per_bit(words: torch.Tensor, table) -> torch.Tensor:
    """The bit permutation of int32 ``words`` one bit at a time (output bit i = input bit table[i]), as int64."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    return sum(((w >> s) & 1) << i for i, s in enumerate(table))


def _helpers(tile_words: int | None = None) -> dict:
    namespace = {"torch": torch}
    exec(torch_emit.bit_tables_source(), namespace)
    if tile_words is not None:  # small tiles: a few words exercise the tiling (the last tile partial)
        namespace["_TILE_WORDS"] = tile_words
    return namespace


@given(table=st.permutations(range(32)), tile=st.integers(1, 40), n=st.integers(0, 150), seed=st.integers(0, 2**16))
@settings(max_examples=12, deadline=None)
def test_tiled_word_lookups_permute_bits(table, tile, n, seed):
    # the CPU path of _permute_words (tiles of reused int32 buffers, lookups into the output) == per bit
    ns = _helpers(tile)
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-2**31, 2**31, (n,), dtype=torch.int64, generator=g).to(torch.int32)
    got = ns["_permute_words"](words.view(1, -1) if n else words, tuple(table))
    assert got.dtype == torch.int32
    assert torch.equal(got.reshape(-1).to(torch.int64) & 0xFFFFFFFF, _per_bit(words, table))


MARLIN_DIMS = {"marlin_gptq_int4": {"E": 2, "I": 256, "H": 512}, "marlin_mxfp4": {"E": 2, "I": 256, "H": 512},
               "marlin_nvfp4": {"E": 2, "I": 256, "H": 512}}


@pytest.mark.slow  # compiles a Marlin spec and runs the eager lowering: seconds each
@pytest.mark.parametrize("name", sorted(MARLIN_DIMS))
def test_marlin_weights_take_the_cpu_gather_and_equal_eager(name, monkeypatch):
    # their words plans read the input's bytes (GPTQ's int32 words, FP4 pairs) and return int32 words: the
    # gather lowering took them (it declined them before, and the eager lowering ran)
    spec = _spec(name)
    weights = [c.tensor for c in spec.compiled.variants[0].chains if any(s.op.word_permutation() for s in c.steps)]
    assert weights
    for tensor in weights:
        assert f"def _gather_{tensor}_" in spec.source, tensor
    x = synthetic_inputs(spec, MARLIN_DIMS[name], seed=7)
    before = {k: v.clone() for k, v in x.items()}
    want = spec.convert(x, lowering="eager", fingerprint=False)
    got = spec.convert(x, lowering="gather", fingerprint=False)
    assert_same_bits(got, want, name)
    # the per-byte part (no run plan: a table past the budget) gives the same words
    monkeypatch.setattr(spec.module, "_run_plan", lambda *a, **k: None)
    assert_same_bits(spec.convert(x, lowering="gather", fingerprint=False), want, f"{name} per-byte part")
    for k in x:
        assert torch.equal(x[k].view(torch.uint8), before[k].view(torch.uint8)), k  # inputs untouched


def test_byte_value_lookups_only_where_a_conversion_changes_bits():
    # marlin_nvfp4's FP8 scales (a cast and a bit field): the 256 values converted once, then a lookup a byte;
    # trtllm_mxfp4's scale bytes handed over as e4m3 (a relabelling): a view, no lookup (it would be a pass)
    assert "y = _nb_values(y, " in _spec("marlin_nvfp4").source
    assert "y = _nb_values(y, " not in _spec("flashinfer_trtllm_mxfp4").source
    spec = _spec("marlin_nvfp4")
    x = synthetic_inputs(spec, {"E": 2, "I": 256, "H": 256}, seed=5)
    want = spec.convert(x, lowering="eager")
    assert_same_bits(spec.convert(x, lowering="gather"), want, "marlin_nvfp4 gather with the lookup")


SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "specs").glob("*.lyt"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the torch gather on a CUDA device")
@pytest.mark.parametrize("name", SHIPPED)
def test_gather_equals_eager_on_cuda(name):
    # The gather lowering's torch forms on the GPU (the quads parts' cached row tables and indices keyed by
    # device), at two shapes each spec accepts, every shape twice (the second call reads the cached tables).
    spec = _spec(name)
    for dims in ({"E": 2, "I": 256, "H": 512}, {"E": 3, "I": 512, "H": 256}) * 2:
        try:
            x = {k: v.cuda() for k, v in synthetic_inputs(spec, dims, seed=3).items()}
            want = spec.convert(x, lowering="eager", fingerprint=False)
        except layoutc.LayoutError:
            continue  # dims this spec refuses
        got = spec.convert(x, lowering="gather", fingerprint=False)
        for k in want:
            assert got[k].is_cuda
            assert_same_bits(got[k], want[k], f"{name} {dims} {k}")
