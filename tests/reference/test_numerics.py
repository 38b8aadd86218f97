"""Numerics end to end (examples/moe_numerics.py) and the quantizer against FlashInfer's decoder."""

from __future__ import annotations

import sys

import pytest
import torch

import layoutc
from layoutc.reference.quant import dequantize_mxfp4, dequantize_nvfp4, fp4_values, pack_fp4, quantize_mxfp4, quantize_nvfp4, unpack_fp4
from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "examples"))
import moe_numerics  # noqa: E402


@pytest.fixture(scope="module")
def results():
    return moe_numerics.run_all({"E": 4, "I": 128, "H": 256})


def test_every_layout_computes_the_same_moe_layer(results):
    assert len(results) == 4
    for r in results:
        assert r["reference"].abs().max() > 0.1  # not a vacuous all-zero layer
        assert torch.equal(r["decoded"], r["reference"]), r["spec"]
        assert torch.equal(r["kernel_view"], r["reference"]), (r["spec"], r["params"])


def test_the_kernel_view_check_catches_a_wrong_row_order():
    # The desync example leaves the scales unswapped: read as the kernel reads it, the layer differs.
    text = (ROOT / "examples" / "desync_scale.lyt").read_text()
    broken = layoutc.compile_source(text, "desync.lyt", verify_spec=False)
    dims = {"E": 2, "I": 128, "H": 256}
    layer = moe_numerics.mxfp4_layer(dims["E"], dims["I"], dims["H"], seed=5)
    out = broken.convert(layer)
    logical = moe_numerics.undo_packings(broken, out, dims)
    kernel = {k: moe_numerics.kernel_view_gate_up(broken, k, v) if k.startswith("w13") else v for k, v in logical.items()}
    w13_ref, _ = moe_numerics.dequantize(layer, "mxfp4")
    w13_k, _ = moe_numerics.dequantize(kernel, "mxfp4")
    assert not torch.equal(w13_ref, w13_k)


def test_fp4_packing_convention():
    codes = torch.tensor([[1, 9, 7, 15]], dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.tolist() == [[1 | 9 << 4, 7 | 15 << 4]]  # element 2j in the low nibble
    assert torch.equal(unpack_fp4(packed), codes)
    assert fp4_values(codes).tolist() == [[0.5, -0.5, 6.0, -6.0]]


def test_quantizers_round_trip_representable_values():
    vals = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    w = torch.cat([vals * 2, -vals * 2, vals * 2, -vals * 2]).reshape(1, 1, 32)  # one scale (2) fits all
    q, s = quantize_mxfp4(w)
    assert torch.equal(dequantize_mxfp4(q, s), w)
    err = []
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, 128, generator=g)
    q, s, gs = quantize_nvfp4(x)
    err.append((dequantize_nvfp4(q, s, gs) - x).norm() / x.norm())
    q, s = quantize_mxfp4(x)
    err.append((dequantize_mxfp4(q, s) - x).norm() / x.norm())
    assert all(e < 0.2 for e in err), err  # 4-bit quantization error, not a layout error


@pytest.mark.flashinfer
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_dequantizers_match_flashinfers_decoder(fmt):
    from flashinfer.quantization.fp4_quantization import _e2m1_and_ufp8sf_scale_to_float_cpu as decode

    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 32, 128, generator=g)
    if fmt == "mxfp4":
        q, s = quantize_mxfp4(x)
        ours = dequantize_mxfp4(q, s)
        theirs = torch.stack([decode(q[e], s[e], None, 32, 0, False) for e in range(3)])
    else:
        q, s, gs = quantize_nvfp4(x)
        ours = dequantize_nvfp4(q, s, gs)
        theirs = torch.stack([decode(q[e], s[e].view(torch.uint8), gs[e:e + 1], 16, 1, False) for e in range(3)])
    assert torch.equal(ours, theirs)
