"""Marlin MXFP4 MoE (specs/marlin_mxfp4.lyt), bit for bit against a reference written from vLLM's public
source (layoutc/reference/marlin.py: github.com/vllm-project/vllm,
vllm/model_executor/layers/quantization/utils/marlin_utils_fp4.py @ 00d52e93333741b205e70acb9217a2849f173696,
prepare_moe_mxfp4_layer_for_marlin and mxfp4_marlin_process_scales; the weight table and the scale
permutations of marlin_utils_test.py / marlin_utils.py as in test_marlin_gptq_int4.py). The caller is
vLLM's fused_moe/oracle/mxfp4.py (Mxfp4MoeBackend.MARLIN and BATCHED_MARLIN).

Branches: both scale tables (K of one 32-block takes scale_perm_single), with and without biases.
Real sizes: gpt-oss-20b/120b (H = I = 2880; vLLM passes the weights to this function unpadded),
Qwen3-30B-A3B and DeepSeek-V3 shapes for the MXFP4 quantisations of those models.
"""

from __future__ import annotations

import pytest
import torch

import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.equiv.compare import equivalent
from layoutc.reference import marlin
from layoutc.registry import DEFAULT, MARLIN_ENGINE_BACKENDS
from tests.helpers import SPECS, assert_same_bits, bits

SPEC = SPECS / "marlin_mxfp4.lyt"
GPT_OSS = {"I": 2880, "H": 2880}
QWEN3_MOE = {"I": 768, "H": 2048}
DEEPSEEK_V3 = {"I": 2048, "H": 7168}


@pytest.fixture(scope="module")
def spec():
    return layoutc.compile_file(SPEC)


def _compare(spec, dims: dict, seed: int = 0, bias: bool = True, params=None) -> None:
    x = synthetic_inputs(spec, dims, seed=seed)
    if not bias:
        x = {k: v for k, v in x.items() if not k.endswith("_bias")}
    before = {k: v.clone() for k, v in x.items()}
    ours = spec.convert(x)
    theirs = marlin.marlin_mxfp4(x, params)
    assert set(ours) == set(theirs)
    for k in ours:
        got = ours[k].contiguous()
        got = got.view(torch.uint8) if k.endswith("_scale") else got
        assert_same_bits(got, theirs[k], f"{dims} {k}")
    assert all(torch.equal(bits(x[k]), bits(before[k])) for k in x)   # inputs untouched


@pytest.mark.parametrize("dims, bias", [({"E": 2, "I": 32, "H": 64}, True), ({"E": 1, "I": 96, "H": 192}, False),
                                        ({"E": 2, "I": 64, "H": 128}, True)],
                         ids=["single-table-w2", "no-bias", "grouped"])
def test_spec_matches_vllm_on_every_branch(spec, dims, bias):
    _compare(spec, dims, bias=bias)


@pytest.mark.parametrize("dims", [{"E": 1, "I": GPT_OSS["I"], "H": 64}, {"E": 1, "I": 32, "H": GPT_OSS["H"]}],
                         ids=["gpt-oss-intermediate", "gpt-oss-hidden"])
def test_spec_matches_vllm_at_real_sizes(spec, dims):
    _compare(spec, dims)


@pytest.mark.slow  # whole real layers, one expert
@pytest.mark.parametrize("dims", [{"E": 1, **GPT_OSS}, {"E": 1, **QWEN3_MOE}, {"E": 1, **DEEPSEEK_V3}],
                         ids=["gpt-oss", "qwen3-30b-a3b", "deepseek-v3"])
def test_spec_matches_vllm_at_whole_real_layers(spec, dims):
    _compare(spec, dims)


def test_tensor_parallel_rank_matches_vllms_rank():
    params = {"tp_size": 2, "tp_rank": 1}
    _compare(layoutc.compile_file(SPEC, params), {"E": 1, "I": 128, "H": 64}, params=params)


@pytest.mark.slow  # `layoutc equiv`: sampled shapes, every optional-bias variant
@pytest.mark.parametrize("params", [{}, {"tp_size": 2, "tp_rank": 1}], ids=["tp1", "tp2"])
def test_spec_is_equivalent_to_the_vllm_reference(params):
    result = equivalent(SPEC, marlin.marlin_mxfp4, params=params)
    assert result.ok, result.report()
    assert result.verdict().startswith("equivalent at")


def test_registry_names_vllms_marlin_mxfp4_backends():
    for name in ("vllm:Mxfp4MoeBackend.MARLIN", "vllm:Mxfp4MoeBackend.BATCHED_MARLIN"):
        assert MARLIN_ENGINE_BACKENDS[name] == "marlin_mxfp4"
    assert DEFAULT.spec("marlin_mxfp4").name == "marlin_mxfp4"
