"""The triton_kernels Hopper MXFP4 spec against bytes that OpenAI's triton_kernels itself produced on an H200.

tests/goldens/triton_kernels_hopper_mxfp4.pt was written by tools/gpu/triton_kernels_moe.py (goldens()) on
2026-12-01: a deterministic gpt-oss-layout checkpoint (E=2, I=96, H=160: every axis needs padding) and what
triton_kernels at Triton's v3.6.0 tag (triton-lang/triton commit 7c56a5e40f7fd928dfd5c72902d5def0097db73a,
python/triton_kernels) made of it with convert_layout and the default Hopper value and scale layouts, called as
vLLM's _swizzle_mxfp4 calls them (the storage behind the .mT views matmul_ogs reads). On that GPU, matmul_ogs
computed bit-identical outputs from layoutc's conversion and from its own (benchmarks/results/
2026-12-01-h200-triton-kernels). Here, on the CPU, layoutc's converter must reproduce those bytes.

triton_kernels v3.6.0 pads N to 64 before its value swizzle; the spec pads N to 256 (as the reference in
layoutc/reference/engines.py does). The kernel reads only the first N rows, so the extra rows must be zero.
"""

from __future__ import annotations

import pytest
import torch

import layoutc
from tests.helpers import GOLDENS, SPECS

SPEC = SPECS / "triton_kernels_mxfp4_hopper.lyt"
GOLDEN = GOLDENS / "triton_kernels_hopper_mxfp4.pt"

pytestmark = pytest.mark.skipif(not SPEC.exists(), reason="the spec lands with the backends branch (issue 24)")


@pytest.fixture(scope="module")
def golden():
    return torch.load(GOLDEN)


@pytest.fixture(scope="module")
def converted(golden):
    spec = layoutc.compile_file(SPEC)
    x = {k: golden[k] for k in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")}
    snapshot = {k: v.clone() for k, v in x.items()}
    out = spec.convert(x)
    assert all(torch.equal(snapshot[k], x[k]) for k in x), "the converter modified its inputs"
    return out


def test_golden_is_the_small_padded_case(golden):
    assert golden["dims"].tolist() == [2, 96, 160]
    assert tuple(golden["w13_weight"].shape) == (2, 192, 80)
    assert tuple(golden["tk_w13_weight"].shape) == (2, 48, 512)  # N=192 -> 192/4 rows; K/2=80 -> 128 -> 512


@pytest.mark.parametrize("name", ["w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"])
def test_layoutc_matches_triton_kernels_bytes(golden, converted, name):
    ours = converted[name].contiguous().view(torch.uint8)
    theirs = golden[f"tk_{name}"]
    rows, cols = theirs.shape[-2:]
    assert ours.shape[0] == theirs.shape[0] and ours.shape[-1] == cols, (tuple(ours.shape), tuple(theirs.shape))
    assert ours.shape[-2] >= rows
    assert torch.equal(ours[:, :rows], theirs), f"{name}: bytes differ from triton_kernels' own conversion"
    assert not ours[:, rows:].any(), f"{name}: the rows past triton_kernels' padding are not zero"


def test_a_one_byte_change_is_seen(golden, converted):
    # The comparison above is not vacuous: the same check on a golden with one byte flipped fails.
    theirs = golden["tk_w2_weight_scale"].clone()
    theirs.view(-1)[37] ^= 1
    ours = converted["w2_weight_scale"].contiguous().view(torch.uint8)[:, : theirs.shape[-2]]
    assert not torch.equal(ours, theirs)
