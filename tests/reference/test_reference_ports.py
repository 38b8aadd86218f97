"""The CPU ports of FlashInfer's CUDA-only kernels equal the real kernels' recorded outputs.

This is what lets CPU tests run the reference recipes at any shape."""

import pytest
import torch

from tests.helpers import assert_same_bits, load_golden
from layoutc.reference import kernels_cpu, recipes

SM90 = load_golden("sm90_fp4_interleave.pt")
BSI = load_golden("block_scale_interleave.pt")


def test_goldens_come_from_flashinfer_0_7_on_a_gpu():
    for g in (SM90, BSI):
        assert g["meta"]["flashinfer"].startswith("0.7."), g["meta"]
        assert "H200" in g["meta"]["gpu"]


@pytest.mark.parametrize("case", SM90["cases"], ids=lambda c: str(tuple(c["input"].shape)))
def test_sm90_interleave_port_matches_kernel(case):
    assert_same_bits(kernels_cpu.sm90_interleave_fp4(case["input"]), case["output"])


@pytest.mark.parametrize("case", BSI["cases"], ids=lambda c: f"{tuple(c['input'].shape)}-{c['input'].dtype}")
def test_block_scale_interleave_port_matches_kernel(case):
    assert_same_bits(kernels_cpu.block_scale_interleave(case["input"]), case["output"])


@pytest.mark.parametrize("case", [c for c in BSI["cases"] if c["input"].dim() == 3], ids=lambda c: str(tuple(c["input"].shape)))
def test_vllm_swizzle_blockscale_restatement_matches_kernel(case):
    x = case["input"]
    e, r, c = x.shape
    expected = case["output"].reshape(e, -(-r // 128) * 128, -(-c // 4) * 4)
    assert_same_bits(recipes.swizzle_blockscale_cpu(x), expected)


def test_ports_reject_nothing_silently():
    # A corrupted port must not pass: flipping one output bit of the kernel golden is detected.
    case = SM90["cases"][0]
    bad = case["output"].clone()
    bad.view(-1)[5] ^= 1
    with pytest.raises(AssertionError):
        assert_same_bits(kernels_cpu.sm90_interleave_fp4(case["input"]), bad)
    assert not torch.equal(bad, case["output"])
