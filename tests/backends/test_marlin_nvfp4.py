"""Marlin NVFP4 MoE (specs/marlin_nvfp4.lyt), bit for bit against a reference written from vLLM's public
source (layoutc/reference/marlin.py: github.com/vllm-project/vllm,
vllm/model_executor/layers/quantization/utils/marlin_utils_fp4.py @ de5f26d5923e2b31dbb3d80efc45d5fd41f09946,
prepare_nvfp4_moe_layer_for_marlin, nvfp4_marlin_process_scales, nvfp4_marlin_process_global_scale; the
weight table and scale permutations of marlin_utils_test.py / marlin_utils.py as in
test_marlin_gptq_int4.py). The caller is vLLM's fused_moe/oracle/nvfp4.py (NvFp4MoeBackend.MARLIN,
convert_to_nvfp4_moe_kernel_format). vLLM is not installable here (its repack is a CUDA op).

Branches of the engine's code: gated and non-gated (is_act_and_mul), bf16 and fp16 params_dtype (the
global scales' type and factor: nvfp4_marlin_process_global_scale's two branches), tensor parallelism.
marlin_permute_scales always takes its grouped table here (K/16 >= 2 under the repack's sizes).
Real sizes: DeepSeek-V3/R1 NVFP4 (H 7168, I 2048), Qwen3-30B-A3B NVFP4 (H 2048, I 768), Mixtral-8x7B
(H 4096, I 14336), and, non-gated (relu2), Nemotron-3-Nano-30B-A3B (H 2688, I 1856). vLLM pads none of
them on this path.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: the fused lowering on CPU tensors

import pytest  # noqa: E402
import torch  # noqa: E402

import layoutc  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.equiv.compare import equivalent  # noqa: E402
from layoutc.reference import marlin  # noqa: E402
from layoutc.registry import DEFAULT, MARLIN_ENGINE_BACKENDS  # noqa: E402
from tests.helpers import SPECS, assert_same_bits, bits  # noqa: E402

SPEC = SPECS / "marlin_nvfp4.lyt"
DEEPSEEK_V3 = {"I": 2048, "H": 7168}
QWEN3_MOE = {"I": 768, "H": 2048}
MIXTRAL = {"I": 14336, "H": 4096}
NEMOTRON_NANO = {"I": 1856, "H": 2688}   # relu2 (non-gated) experts


def _compare(params: dict, dims: dict, seed: int = 0) -> None:
    spec = layoutc.compile_file(SPEC, params)
    x = synthetic_inputs(spec, dims, seed=seed)   # random bytes: every E4M3 scale, NaN and negative included
    before = {k: v.clone() for k, v in x.items()}
    ours = spec.convert(x)
    theirs = marlin.marlin_nvfp4(x, params)
    assert set(ours) == set(theirs)
    for k in ours:
        assert ours[k].dtype == theirs[k].dtype, k
        assert_same_bits(bits(ours[k].contiguous()), bits(theirs[k]), f"{params} {dims} {k}")
    assert all(torch.equal(bits(x[k]), bits(before[k])) for k in x)   # inputs untouched


#: each parameter set compiles in 1.5 to 4 s on the 2-core machine: the fast suite takes the default one
BRANCHES = [pytest.param({"activation": a, "act_dtype": d}, dims, id=f"{a}-{d}",
                         marks=() if (a, d) == ("silu", "bf16") else pytest.mark.slow)
            for a, dims in (("silu", {"E": 2, "I": 64, "H": 128}), ("relu2", {"E": 2, "I": 128, "H": 64}))
            for d in ("bf16", "f16")]


@pytest.mark.parametrize("params, dims", BRANCHES)
def test_spec_matches_vllm_on_every_branch(params, dims):
    _compare(params, dims)


def test_spec_matches_vllm_at_the_smallest_sizes():
    """I = 32 (w13's N = 64, w2's K = 32: two scale groups), H = 64."""
    _compare({"activation": "silu", "act_dtype": "bf16"}, {"E": 1, "I": 32, "H": 64}, seed=5)


@pytest.mark.parametrize("params, dims", [({}, {"E": 1, "I": QWEN3_MOE["I"], "H": 64}),
                                          ({}, {"E": 1, "I": 32, "H": QWEN3_MOE["H"]}),
                                          pytest.param({"activation": "relu2"}, {"E": 1, "I": NEMOTRON_NANO["I"], "H": 64},
                                                       marks=pytest.mark.slow)],
                         ids=["qwen3-30b-a3b-intermediate", "qwen3-30b-a3b-hidden", "nemotron-nano-intermediate"])
def test_spec_matches_vllm_at_real_sizes(params, dims):
    _compare(params, dims)


@pytest.mark.slow  # whole real layers, one expert: seconds each on two cores
@pytest.mark.parametrize("params, dims", [({}, {"E": 1, **DEEPSEEK_V3}), ({"act_dtype": "f16"}, {"E": 2, **QWEN3_MOE}),
                                          ({}, {"E": 1, **MIXTRAL}), ({"activation": "relu2"}, {"E": 1, **NEMOTRON_NANO})],
                         ids=["deepseek-v3", "qwen3-30b-a3b-f16", "mixtral-8x7b", "nemotron-3-nano-relu2"])
def test_spec_matches_vllm_at_whole_real_layers(params, dims):
    _compare(params, dims)


@pytest.mark.slow  # one compile per rank's parameters
@pytest.mark.parametrize("activation", ["silu", "relu2"])
def test_tensor_parallel_rank_matches_vllms_rank(activation):
    _compare({"activation": activation, "tp_size": 2, "tp_rank": 1}, {"E": 1, "I": 256, "H": 64})


def test_scale_bytes_are_vllms_reencoding_of_every_e4m3_value():
    """All 256 E4M3 bytes as the w2 scales of one expert: the spec's bytes are vLLM's (x.to(half) * 2**7,
    bits 7..14). Positive normal scales become byte + 120 (an unsigned E5M3 with bias 22); the sign is
    dropped (vLLM assumes scales >= 0 and warns otherwise)."""
    spec = layoutc.compile_file(SPEC)
    x = synthetic_inputs(spec, {"E": 1, "I": 32, "H": 128}, seed=0)
    every = torch.arange(256, dtype=torch.uint8).reshape(1, 128, 2).view(torch.float8_e4m3fn)
    x["w2_weight_scale"] = every
    ours = spec.convert(x)["w2_weight_scale"].view(torch.uint8)
    assert torch.equal(ours, marlin.marlin_nvfp4(x)["w2_weight_scale"].view(torch.uint8))
    one = torch.tensor([0x38], dtype=torch.uint8).view(torch.float8_e4m3fn)   # 1.0
    assert marlin.nvfp4_marlin_process_scales(one.to(torch.half).repeat(1, 4)).view(torch.uint8)[0, 0] == 0x38 + 120
    # every byte's value, wherever the permutation put it: the multiset of bytes is the re-encoding's
    recoded = sorted(marlin.nvfp4_marlin_process_scales(every.to(torch.bfloat16).reshape(-1, 4)).view(torch.uint8)
                     .reshape(-1).tolist())
    assert sorted(ours.reshape(-1).tolist()) == recoded


def test_nan_scales_decode_as_nan_either_way():
    """A NaN scale: the spec writes 0xFC (the canonical half NaN 0x7E00, bits 7..14), as does the reference
    (it takes the canonical NaN, layoutc/reference/marlin.py). vLLM's own bytes depend on the device's E4M3
    NaN conversion: torch on the CPU gives 0xFC through bf16 and 0xFF through fp16. The kernel reads a
    byte b as the half b << 7: both are NaN (exponent 31)."""
    spec = layoutc.compile_file(SPEC)
    x = synthetic_inputs(spec, {"E": 1, "I": 32, "H": 64}, seed=1)
    x["w2_weight_scale"] = torch.full((1, 64, 2), 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert bool((spec.convert(x)["w2_weight_scale"].view(torch.uint8) == 0xFC).all())
    assert bool((marlin.marlin_nvfp4(x)["w2_weight_scale"].view(torch.uint8) == 0xFC).all())
    nan = x["w2_weight_scale"][0, :4, :1].t()
    assert marlin.nvfp4_marlin_process_scales(nan.to(torch.bfloat16)).view(torch.uint8).tolist() == [[0xFC] * 4]
    assert marlin.nvfp4_marlin_process_scales(nan.to(torch.half)).view(torch.uint8).tolist() == [[0xFF] * 4]
    for byte in (0xFC, 0xFF):
        assert torch.tensor([byte << 7], dtype=torch.int16).view(torch.half).isnan().all()


@pytest.mark.parametrize("dtype, factor", [("bf16", 2.0**119), pytest.param("f16", 2.0**7, marks=pytest.mark.slow)])
def test_global_scales_are_vllms_factor_for_each_activation_dtype(dtype, factor):
    g = torch.tensor([0.5, 2.0**-11, 3.0e-4], dtype=torch.float32)
    spec = layoutc.compile_file(SPEC, {"act_dtype": dtype})
    x = synthetic_inputs(spec, {"E": 3, "I": 32, "H": 64}, seed=2)
    x["w13_weight_scale_2"] = g
    got = spec.convert(x)["w13_weight_scale_2"]
    want = g.to(got.dtype) * factor
    assert torch.equal(got, want) and torch.equal(got, marlin.marlin_nvfp4(x, {"act_dtype": dtype})["w13_weight_scale_2"])


@pytest.mark.slow  # the Triton kernels run by the interpreter: seconds
@pytest.mark.parametrize("params", [{}, {"activation": "relu2", "act_dtype": "f16"}], ids=["silu-bf16", "relu2-f16"])
@pytest.mark.parametrize("lowering", ["fused", "gather"])
def test_every_lowering_equals_eager(params, lowering):
    """The scaled cast and the bit field in the fused kernels (their Triton forms) and in the gather
    lowering give the eager bytes, NaN and negative scales included."""
    spec = layoutc.compile_file(SPEC, params)
    x = synthetic_inputs(spec, {"E": 2, "I": 128, "H": 64}, seed=3)
    assert_same_bits(spec.convert(x, lowering=lowering), spec.convert(x, lowering="eager"), lowering)


@pytest.mark.slow  # `layoutc equiv`: sampled shapes per parameter set
@pytest.mark.parametrize("params", [{}, {"act_dtype": "f16"}, {"activation": "relu2"},
                                    {"activation": "relu2", "act_dtype": "f16", "tp_size": 2, "tp_rank": 1},
                                    {"tp_size": 2, "tp_rank": 1}],
                         ids=["silu-bf16", "silu-f16", "relu2-bf16", "relu2-f16-tp2", "silu-tp2"])
def test_spec_is_equivalent_to_the_vllm_reference(params):
    result = equivalent(SPEC, marlin.marlin_nvfp4, params=params)
    assert result.ok, result.report()
    assert result.verdict().startswith("equivalent at")


def test_registry_names_vllms_marlin_nvfp4_backend():
    assert MARLIN_ENGINE_BACKENDS["vllm:NvFp4MoeBackend.MARLIN@bf16"] == "marlin_nvfp4"
    assert MARLIN_ENGINE_BACKENDS["vllm:NvFp4MoeBackend.MARLIN@relu2@f16"] == "marlin_nvfp4_relu2_f16"
    for engine_name, backend in MARLIN_ENGINE_BACKENDS.items():
        assert backend in DEFAULT.backends, engine_name
    path, params = DEFAULT._entries["marlin_nvfp4_relu2_f16"]
    assert path == SPEC.resolve() and params == {"activation": "relu2", "act_dtype": "f16"}
