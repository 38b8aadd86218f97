"""The shipped specs, bit for bit against what the vLLM branch plus FlashInfer produces.

Two sources of truth:
* goldens recorded on an H200 from the whole recipes with FlashInfer's real CUDA kernels;
* the same recipes run here on CPU at other shapes, with FlashInfer's pure-torch helpers
  called directly and the CUDA-only ones replaced by ports checked against the goldens.
"""

from __future__ import annotations


import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import layoutc
from tests.helpers import SPECS, assert_same_bits, load_golden, spec
from layoutc.reference import kernels_cpu, recipes

GOLDEN_FILES = ["flashinfer_cutlass_bf16.pt", "flashinfer_cutlass_mxfp8.pt", "flashinfer_cutedsl_nvfp4.pt"]


def golden_cases():
    for name in GOLDEN_FILES:
        g = load_golden(name)
        for i, case in enumerate(g["cases"]):
            yield pytest.param(g["spec"], case, id=f"{g['spec']}-{i}-{case['dims']}-{case['params']}")



@pytest.mark.parametrize("spec_name,case", list(golden_cases()))
def test_converter_matches_real_kernels(spec_name, case):
    s = spec(spec_name, **case["params"])
    out = s.convert(case["inputs"])
    assert set(out) == set(case["outputs"])
    for k, expected in case["outputs"].items():
        assert_same_bits(out[k], expected, k)


@pytest.mark.parametrize("spec_name,case", list(golden_cases()))
def test_inverse_restores_the_checkpoint(spec_name, case):
    s = spec(spec_name, **case["params"])
    back = s.inverse(case["outputs"])
    for k, x in case["inputs"].items():
        if k.endswith("bias"):  # fp32 -> bf16 is lossy; the inverse is exact on bf16 values
            x = x.to(torch.bfloat16).to(torch.float32)
        assert_same_bits(back[k], x, k)


def mxfp4_layer(seed, e, i, h, bias):
    g = torch.Generator().manual_seed(seed)
    rb = lambda *s: torch.randint(0, 256, s, dtype=torch.uint8, generator=g)  # noqa: E731
    t = {"w13_weight": rb(e, 2 * i, h // 2), "w13_weight_scale": rb(e, 2 * i, h // 32),
         "w2_weight": rb(e, h, i // 2), "w2_weight_scale": rb(e, h, i // 32)}
    if bias:
        t["w13_bias"] = torch.randn(e, 2 * i, generator=g)
        t["w2_bias"] = torch.randn(e, h, generator=g)
    return t


def nvfp4_layer(seed, e, i, h, gated):
    g = torch.Generator().manual_seed(seed)
    rb = lambda *s: torch.randint(0, 256, s, dtype=torch.uint8, generator=g)  # noqa: E731
    rows = 2 * i if gated else i
    return {"w13_weight": rb(e, rows, h // 2), "w13_weight_scale": rb(e, rows, h // 16).view(torch.float8_e4m3fn),
            "w2_weight": rb(e, h, i // 2), "w2_weight_scale": rb(e, h, i // 16).view(torch.float8_e4m3fn)}




fast = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
multiple_of_128 = st.integers(1, 3).map(lambda k: 128 * k)


@pytest.mark.flashinfer  # the vLLM branch calls FlashInfer's helpers
@fast
@given(e=st.integers(1, 3), i=multiple_of_128, h=multiple_of_128, bias=st.booleans(), seed=st.integers(0, 2**16))
def test_cutlass_bf16_matches_vllm_recipe(e, i, h, bias, seed):
    t = mxfp4_layer(seed, e, i, h, bias)
    expected = recipes.cutlass_sm90_mxfp4_bf16(t, kernels_cpu.sm90_interleave_fp4)
    assert_same_bits(spec("flashinfer_cutlass_bf16").convert(t), expected)


@fast
@given(e=st.integers(1, 3), i=multiple_of_128, h=multiple_of_128, bias=st.booleans(), seed=st.integers(0, 2**16))
def test_cutlass_mxfp8_matches_vllm_recipe(e, i, h, bias, seed):
    t = mxfp4_layer(seed, e, i, h, bias)
    expected = recipes.cutlass_mxfp4_mxfp8(t, kernels_cpu.block_scale_interleave)
    assert_same_bits(spec("flashinfer_cutlass_mxfp8").convert(t), expected)


@pytest.mark.flashinfer  # the vLLM branch calls FlashInfer's helpers
@fast
@given(e=st.integers(1, 3), i=st.integers(1, 4).map(lambda k: 64 * k), h=st.integers(1, 12).map(lambda k: 16 * k),
       gated=st.booleans(), seed=st.integers(0, 2**16))
def test_cutedsl_nvfp4_matches_vllm_recipe(e, i, h, gated, seed):
    t = nvfp4_layer(seed, e, i, h, gated)
    expected = recipes.cutedsl_nvfp4(t, kernels_cpu.block_scale_interleave, gated)
    out = spec("flashinfer_cutedsl_nvfp4", activation="silu" if gated else "relu2").convert(t)
    assert_same_bits(out, expected)


def test_cutedsl_activations_differ_where_they_should():
    # Same bytes, two activations: gated swaps+interleaves w13 rows, ReLU2 leaves them alone.
    t = nvfp4_layer(5, 1, 64, 64, gated=True)
    gated = spec("flashinfer_cutedsl_nvfp4", activation="silu").convert(t)
    t1 = {**t, "w13_weight": t["w13_weight"][:, :64], "w13_weight_scale": t["w13_weight_scale"][:, :64]}
    plain = spec("flashinfer_cutedsl_nvfp4", activation="relu2").convert(t1)
    assert torch.equal(plain["w13_weight"], t1["w13_weight"])
    assert not torch.equal(gated["w13_weight"][:, :64], t["w13_weight"][:, :64])
    # gated rows 0..63 are the up projection (w3 = second half) rows 0..63
    assert torch.equal(gated["w13_weight"][:, :64], t["w13_weight"][:, 64:128])


@settings(max_examples=10, deadline=None)
@given(name=st.sampled_from(["flashinfer_cutlass_bf16", "flashinfer_cutlass_mxfp8"]),
       e=st.integers(1, 2), i=multiple_of_128, h=multiple_of_128, bias=st.booleans(), seed=st.integers(0, 2**16))
def test_inverse_after_convert_is_identity(name, e, i, h, bias, seed):
    t = mxfp4_layer(seed, e, i, h, bias)
    for k in ("w13_bias", "w2_bias"):
        if k in t:
            t[k] = t[k].to(torch.bfloat16).to(torch.float32)  # exactly representable after the bf16 cast
    s = spec(name)
    assert_same_bits(s.inverse(s.convert(t)), t)


def test_cutedsl_inverse_crops_the_padding():
    for gated in (True, False):
        t = nvfp4_layer(9, 2, 64, 80, gated)  # 80/16 = 5 scale columns, padded to 8; relu2 rows 64 -> 128
        s = spec("flashinfer_cutedsl_nvfp4", activation="silu" if gated else "relu2")
        out = s.convert(t)
        assert out["w2_weight_scale"].shape == (2, 128, 4)  # H=80 rows -> 128, I/16=4 columns
        assert_same_bits(s.inverse(out), t)


#: Shipped layouts that drop information, so no inverse exists: why, per spec.
NOT_INVERTIBLE = {
    # nvfp4_marlin_process_scales keeps bits 7..14 of each scale as a half: the sign is dropped (vLLM
    # assumes scales >= 0), and the global scales are rounded to the activation dtype before scaling.
    "marlin_nvfp4": "the scales' sign bit is dropped",
}


def test_every_shipped_spec_compiles_and_is_invertible():
    for path in sorted(SPECS.glob("*.lyt")):
        s = layoutc.compile_file(path)
        assert s.invertible == (path.stem not in NOT_INVERTIBLE), path
