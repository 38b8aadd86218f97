"""Marlin int4 from an AWQ checkpoint: the packing families marlin_awq and marlin_awq_zeros
(layoutc/lang/prelude.lyt), bit for bit against a reference written from vLLM's public source
(layoutc/reference/marlin.py: github.com/vllm-project/vllm, vllm/model_executor/layers/quantization/awq_marlin.py
@ 2ab31a815160135b1215193371de249d66faba47, AWQMarlinMoEMethod.process_weights_after_loading;
quantization/utils/marlin_utils.py @ 6eb287065174504cb862f792c2150c603e225edb, awq_to_marlin_zero_points and
marlin_zero_points; quant_utils.awq_pack for AWQ's column interleave).

No shipped spec yet: a spec ties scales and biases to their weight by rows, and an AWQ weight's rows (N)
are packed eight to an int32 word while the checkpoint is K-major ([E, K, N/8]). The verifier's tie model
counts rows in elements and refuses packed types K-major, so the ties cannot be declared; a spec without
them would lose the scale/weight sync checks. The families below are checked on untied tensors.
"""

from __future__ import annotations

import pytest
import torch

import layoutc
from layoutc.reference import marlin

TEXT = """
spec awq_untied
param group = 128
dims E, I, H
assume H % 128 == 0
assume I % 128 == 0
input w2_qweight : i32[E, I, H/8]
input w2_qzeros  : i32[E, I/group, H/8]
interleave(w2_qweight, marlin_awq, size_k=I, group=group)
interleave(w2_qzeros, marlin_awq_zeros)
output w2_qweight : i32[E, I/16, 2*H] packing marlin_awq(size_k=I, group=group)
output w2_qzeros  : i32[E, I/group, H/8] packing marlin_awq_zeros
"""


@pytest.fixture(scope="module")
def spec():
    return layoutc.compile_source(TEXT, "awq_untied.lyt")


def _words(shape, seed):
    return torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, generator=torch.Generator().manual_seed(seed))


@pytest.mark.slow  # the spec compiles in seconds on the 2-core machine
@pytest.mark.parametrize("dims", [{"E": 2, "I": 128, "H": 128}, {"E": 1, "I": 256, "H": 384},
                                  {"E": 1, "I": 768, "H": 128}], ids=["small", "two-tiles", "qwen3-30b-a3b-intermediate"])
def test_awq_repack_and_zero_points_match_vllm(spec, dims):
    e, i, h = dims["E"], dims["I"], dims["H"]
    x = {"w2_qweight": _words((e, i, h // 8), i + h), "w2_qzeros": _words((e, i // 128, h // 8), i - h)}
    before = {k: v.clone() for k, v in x.items()}
    out = spec.convert(x)
    want_w = torch.stack([marlin.marlin_weights_of(marlin.unpack_awq(x["w2_qweight"][n])) for n in range(e)])
    want_z = torch.stack([marlin.awq_to_marlin_zero_points(x["w2_qzeros"][n]) for n in range(e)])
    assert torch.equal(out["w2_qweight"], want_w)
    assert torch.equal(out["w2_qzeros"], want_z)
    assert all(torch.equal(x[k], before[k]) for k in x)


def test_awq_repack_is_the_gptq_repack_of_the_same_values():
    """vLLM's test_awq_marlin_repack: awq_marlin_repack(awq_pack(q)) == marlin_weights(q); here the
    reference's AWQ path against its GPTQ path on the same values."""
    q = _words((128, 64 // 8), 3)
    vals = marlin.unpack_awq(q)
    gptq = marlin.pack_int4_rows(vals.t().contiguous()).t().contiguous()
    assert torch.equal(marlin.gptq_marlin_repack_expert(gptq), marlin.marlin_weights_of(vals))


def test_reference_unpack_undoes_awqs_interleave():
    """Nibble i of an AWQ word holds column 8w + [0, 2, 4, 6, 1, 3, 5, 7][i]."""
    word = sum(v << (4 * i) for i, v in enumerate([0, 2, 4, 6, 1, 3, 5, 7]))
    assert marlin.unpack_awq(torch.tensor([[word]], dtype=torch.int32)).tolist() == [list(range(8))]
