"""A real FlashInfer kernel reads layoutc's output: golden from the H200 (tools/gpu/kernel_dequant.py).

FlashInfer's ``e2m1_and_ufp8sf_scale_to_float`` (compiled from its sources for SM90) dequantized
the tensors the CuTeDSL NVFP4 and CUTLASS MXFP8 specs produced, reading the block scales in the
128x4 swizzled layout. Here, on CPU: the converter still produces exactly those bytes, and what
FlashInfer read equals the checkpoint's values (our dequantizer, itself checked against
FlashInfer's decoder in test_numerics.py) in the row order the kernel expects, written out
below with plain torch, not with layoutc.
"""

from __future__ import annotations

import pytest
import torch

import layoutc
from layoutc.reference.quant import dequantize_mxfp4, fp4_values, unpack_fp4
from tests.helpers import SPECS, assert_same_bits, load_golden

GOLDEN = load_golden("flashinfer_dequant.pt")


def nvfp4_as_the_kernel_computes(packed, scales, global_scale):
    """value * (block scale * global scale): FlashInfer's kernel combines the two scales first, so
    (value * block scale) * global scale (layoutc.reference.quant, FlashInfer's CPU fallback) can differ in
    the last bit. Float association, not layout."""
    e, rows, kb = packed.shape
    v = fp4_values(unpack_fp4(packed)).float().reshape(e, rows, kb * 2 // 16, 16)
    scale = scales.float() * global_scale.float().view(e, 1, 1)
    return (v * scale.unsqueeze(-1)).reshape(e, rows, kb * 2)


def kernel_rows(w13: torch.Tensor, spec: str, params: dict) -> torch.Tensor:
    """[w1; w3] rows in the order each kernel reads them."""
    if params.get("activation") == "relu2":
        return w13  # one shard, as is
    gate, up = w13.chunk(2, dim=1)
    if spec == "flashinfer_cutlass_mxfp8":
        return torch.cat([up, gate], dim=1)  # [w3; w1]
    e, i, k = up.shape  # CuTeDSL: [w3; w1], then groups of 64 rows alternate w3, w1
    return torch.stack([up.reshape(e, i // 64, 64, k), gate.reshape(e, i // 64, 64, k)], dim=2).reshape(e, 2 * i, k)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"{c['spec']}-{c['params']}-{c['dims']}")
def test_flashinfer_reads_the_checkpoint_values_in_kernel_order(case):
    spec = layoutc.compile_file(SPECS / f"{case['spec']}.lyt", case["params"])
    out = spec.convert(case["inputs"])
    for k, v in case["converted"].items():
        assert_same_bits(out[k], v, f"{k}: the bytes FlashInfer read")
    x = case["inputs"]
    if "nvfp4" in case["spec"]:
        gs = case["global_scales"]
        w13 = nvfp4_as_the_kernel_computes(x["w13_weight"], x["w13_weight_scale"], gs["w13"])
        w2 = nvfp4_as_the_kernel_computes(x["w2_weight"], x["w2_weight_scale"], gs["w2"])
    else:
        w13 = dequantize_mxfp4(x["w13_weight"], x["w13_weight_scale"])
        w2 = dequantize_mxfp4(x["w2_weight"], x["w2_weight_scale"])
    read = case["flashinfer_dequant"]
    assert torch.equal(read["w13"], kernel_rows(w13.float(), case["spec"], case["params"]))
    assert torch.equal(read["w2"], w2.float())


def test_the_golden_covers_padding_and_both_scale_formats():
    assert GOLDEN["meta"]["gpu"].startswith("NVIDIA H200")
    specs = {(c["spec"], c["params"].get("activation")) for c in GOLDEN["cases"]}
    assert specs == {("flashinfer_cutedsl_nvfp4", "silu"), ("flashinfer_cutedsl_nvfp4", "relu2"),
                     ("flashinfer_cutlass_mxfp8", None)}
    padded = [c for c in GOLDEN["cases"] if c["converted"]["w13_weight_scale"].shape[1] > c["inputs"]["w13_weight_scale"].shape[1]]
    assert padded, "one case must pad the swizzled scales"
