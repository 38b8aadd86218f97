"""Marlin int4 MoE from a GPTQ checkpoint (specs/marlin_gptq_int4.lyt), bit for bit against a reference
written from vLLM's public source (layoutc/reference/marlin.py; github.com/vllm-project/vllm,
vllm/model_executor/layers/quantization/utils/marlin_utils_test.py @ 04aa528e4876f866d0548e3de8e36454c640deb2
for get_weight_perm / marlin_permute_weights / marlin_weights, utils/marlin_utils.py @
6eb287065174504cb862f792c2150c603e225edb for get_scale_perms / marlin_permute_scales /
marlin_moe_permute_scales, quantization/gptq_marlin.py GPTQMarlinMoEMethod for the sizes vLLM passes).

vLLM is not installable on the CPU machine (its repack is a CUDA op), so the reference restates it.
Every branch of the engine's code: group sizes 32, 64 and 128 (the Marlin kernel's grouped sizes), and
both scale tables (grouped when group_size < I, the single-group table otherwise, the w13 scales
included: vLLM passes size_k = I for them). Real models' sizes (vLLM does not pad GPTQ Marlin MoE):
Mixtral-8x7B (H 4096, I 14336), Qwen3-30B-A3B (H 2048, I 768), DeepSeek-V3 (H 7168, I 2048).
"""

from __future__ import annotations

import pytest
import torch

import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.equiv.compare import equivalent
from layoutc.reference import marlin
from layoutc.registry import DEFAULT, MARLIN_ENGINE_BACKENDS
from tests.helpers import SPECS, assert_same_bits

SPEC = SPECS / "marlin_gptq_int4.lyt"
GROUPS = (32, 64, 128)
SMALL = [{"E": 2, "I": 128, "H": 128}, {"E": 1, "I": 256, "H": 128}, {"E": 1, "I": 384, "H": 640}]

MIXTRAL = {"I": 14336, "H": 4096}
QWEN3_MOE = {"I": 768, "H": 2048}
DEEPSEEK_V3 = {"I": 2048, "H": 7168}


def _compare(group: int, dims: dict, seed: int = 0, **tp) -> None:
    params = {"group_size": group, **tp}
    spec = layoutc.compile_file(SPEC, params)
    x = synthetic_inputs(spec, dims, seed=seed)
    before = {k: v.clone() for k, v in x.items()}
    ours = spec.convert(x)
    theirs = marlin.marlin_gptq_int4(x, params)
    assert set(ours) == set(theirs)
    for k in ours:
        assert_same_bits(ours[k].contiguous(), theirs[k], f"group {group} {dims} {k}")
    assert all(torch.equal(x[k], before[k]) for k in x)   # inputs untouched


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("i", range(len(SMALL)))
def test_spec_matches_vllm_on_every_group_size_and_table(group, i):
    _compare(group, SMALL[i], seed=i)


def test_the_small_i_branch_takes_vllms_single_table_for_w13_scales():
    """I = 128 = group_size: vLLM's size_k for the w13 scales is I, so they take scale_perm_single although
    H = 640 has five groups. The spec says the same; a table chosen by the w13 scales' own group count
    would not."""
    spec = layoutc.compile_file(SPEC, {"group_size": 128})
    x = synthetic_inputs(spec, {"E": 1, "I": 128, "H": 640}, seed=3)
    s = x["w13_scales"][0]
    _, single = marlin.scale_perms()
    want = s.reshape(-1, 32)[:, single].reshape(s.shape)
    assert_same_bits(spec.convert(x)["w13_scales"][0], want, "w13 scales, single table")
    grouped = marlin.marlin_permute_scales(s, 640, s.shape[1], 128)
    assert not torch.equal(grouped, want)


@pytest.mark.parametrize("dims", [{"E": 1, "I": QWEN3_MOE["I"], "H": 128},
                                  {"E": 1, "I": 128, "H": QWEN3_MOE["H"]},
                                  pytest.param({"E": 1, "I": MIXTRAL["I"], "H": 128}, marks=pytest.mark.slow)],
                         ids=["qwen3-30b-a3b-intermediate", "qwen3-30b-a3b-hidden", "mixtral-intermediate"])
def test_spec_matches_vllm_at_real_sizes(dims):
    _compare(128, dims)


@pytest.mark.slow  # whole real layers, one expert: seconds each on two cores
@pytest.mark.parametrize("group, dims", [(128, {"E": 1, **DEEPSEEK_V3}), (128, {"E": 1, **MIXTRAL}),
                                         (128, {"E": 1, "I": 128, "H": DEEPSEEK_V3["H"]}),
                                         (64, {"E": 1, **MIXTRAL}),
                                         (64, {"E": 2, **QWEN3_MOE}), (32, {"E": 1, **QWEN3_MOE})],
                         ids=["deepseek-v3", "mixtral-8x7b", "deepseek-v3-hidden", "mixtral-8x7b-g64",
                              "qwen3-30b-a3b-g64", "qwen3-30b-a3b-g32"])
def test_spec_matches_vllm_at_whole_real_layers(group, dims):
    _compare(group, dims)


def test_tensor_parallel_rank_matches_vllms_rank():
    """Rank 1 of 2 (its I = 128 = group size: the single scale table on that rank, as vLLM picks it)."""
    _compare(128, {"E": 1, "I": 256, "H": 256}, tp_size=2, tp_rank=1)


@pytest.mark.slow  # `layoutc equiv`: four or more sampled shapes per parameter set
@pytest.mark.parametrize("params", [{"group_size": 32}, {"group_size": 64}, {"group_size": 128},
                                    {"group_size": 64, "tp_size": 2, "tp_rank": 1}],
                         ids=["g32", "g64", "g128", "g64-tp2"])
def test_spec_is_equivalent_to_the_vllm_reference(params):
    result = equivalent(SPEC, marlin.marlin_gptq_int4, params=params)
    assert result.ok, result.report()
    assert result.verdict().startswith("equivalent at")


def test_reference_weight_table_is_vllms_shape_of_permutation():
    """get_weight_perm(4): a permutation of 0..1023; within each 16x16 tile group, thread t's first
    entries are K rows 0, 8 (nibble order 0, 2, 4, 6 then 1, 3, 5, 7) of columns 0 and 8 of tile 0."""
    perm = marlin.weight_perm_4bit()
    assert sorted(perm.tolist()) == list(range(1024))
    assert perm[:8].tolist() == [0, 128, 8, 136, 16, 144, 24, 152]


def test_reference_unpack_and_pack_are_inverse():
    q = torch.randint(-2**31, 2**31 - 1, (4, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    vals = marlin.unpack_gptq_int4(q)
    assert torch.equal(marlin.pack_int4_rows(vals.t().contiguous()).t(), q)


def test_registry_names_the_engines_backends():
    assert MARLIN_ENGINE_BACKENDS["vllm:GPTQMarlinMoEMethod@group_size=128"] == "marlin_gptq_int4"
    for engine_name, backend in MARLIN_ENGINE_BACKENDS.items():
        assert backend in DEFAULT.backends, engine_name
    spec = DEFAULT.spec("marlin_gptq_int4_g64")
    assert spec.params["group_size"] == 64
