"""The shard pipeline's verification sample: where every map keeps experts apart, the round trip
checks the first and the last expert of the layer (not all of them), and still catches a wrong one."""

from __future__ import annotations

import pytest
import torch

from layoutc.convert.shardpipeline import _verify_sample, experts_apart
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.runtime.checks import LayoutError
from tests.helpers import spec as _spec


def test_experts_apart_from_the_composed_maps():
    s = _spec("flashinfer_cutedsl_nvfp4")
    assert experts_apart(s, s.input_names, s.output_names)
    a = _spec("triton_kernels_mxfp4_blackwell")  # its scale swizzle mixes experts: the whole layer is checked
    assert not experts_apart(a, a.input_names, a.output_names)


@pytest.mark.parametrize("apart", [True, False])
def test_the_sample_is_the_first_and_last_expert_and_catches_a_wrong_one(monkeypatch, apart):
    s = _spec("flashinfer_cutedsl_nvfp4")
    x = synthetic_inputs(s, {"E": 5, "I": 64, "H": 32}, seed=1)
    out = s.convert(x)
    seen = []
    convert = type(s).convert

    def spy(self, tensors, *args, **kw):
        seen.append({k: v.shape[0] for k, v in tensors.items() if v is not None})
        return convert(self, tensors, *args, **kw)

    monkeypatch.setattr(type(s), "convert", spy)
    _verify_sample(s, x, out, "layer0", apart)
    assert set(seen[-1].values()) == ({2} if apart else {5})
    bad = dict(out)
    # the round trip catches bytes the inverse drops: nonzero bytes in the padding columns of the
    # scales (H/16 = 2 columns padded to 4), in the last expert, which the sample holds
    bad["w13_weight_scale"] = out["w13_weight_scale"].clone()
    assert bad["w13_weight_scale"].shape[2] == 4
    bad["w13_weight_scale"][-1, :, 3].view(torch.uint8).fill_(0x38)
    with pytest.raises(LayoutError, match="w13_weight_scale differs"):
        _verify_sample(s, x, bad, "layer0", apart)
