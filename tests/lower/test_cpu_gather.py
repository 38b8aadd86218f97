"""The CPU gather's whole-word paths equal the eager reference bit for bit.

``quads``: SM90 FP4 weights read as whole source words (per row as strided runs where the plan
found one stride), the 4x4 byte transpose as one copy, the bit interleave as two half-word
tables. ``coarse``: gathers that move runs of 2-8 elements, one wider word per run. Property:
over small dims each spec accepts, ``gather`` == ``eager``; the paths are in the generated code
(so the property is about them, not about the per-element fallback).
"""

from __future__ import annotations


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
    "flashinfer_cutlass_bf16": ("_quads(", "runs = src_words.as_strided", "_coarse("),
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
