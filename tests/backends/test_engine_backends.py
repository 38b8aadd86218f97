"""The MoE backends beyond FlashInfer (issue 24), bit for bit against references written from the
engines' public source (layoutc/reference/engines.py, which cites repository, path and commit):

* triton_kernels (triton-lang/triton python/triton_kernels/triton_kernels/tensor_details/
  layout_details/hopper_value.py @ 000df03e481fdd68099e4807feac102b9d7dd0de, hopper_scale.py @
  14dd7a191e72a5003a67311f7b3cabbf09f74ba5, blackwell_scale.py @ 00a287a7530fdc5fe89a2a01ac1de19f66aca85a;
  caller vllm-project/vllm vllm/model_executor/layers/quantization/utils/mxfp4_utils.py @
  01b817dbbd2ea53707c68d39b470e65990d1e6ee and fused_moe/oracle/mxfp4.py @ 045335ce635d2cb8968d4a8362b0473f49b36dd3);
* AITER (ROCm/aiter aiter/ops/shuffle.py @ e4048607a535ace3a2b51ded31b1c8c2d45c0879; caller vLLM
  oracle/mxfp4.py above, AITER branch);
* DeepGEMM (deepseek-ai/DeepGEMM csrc/apis/layout.hpp and, for SM100, csrc/jit_kernels/impls/smxx_layout.hpp
  get_mn_major_tma_aligned_packed_ue8m0_tensor(_torch) @ 54e22612409371d6364144b69086735beb54e98b; caller
  vLLM quantization/utils/fp8_utils.py @ 364d01925de309b50c726941ad93a2c0a2487df8 and
  007d50058a06dec0f82472d63c819244d460c40d (deepgemm_post_process_fp8_weight_block), SGLang
  python/sglang/srt/layers/quantization/fp8_utils.py @ 6082c49139ac8f1c99a835840de73971faa15e8e
  (transform_scale_ue8m0: the same broadcast and packing));
* vLLM CUTLASS NVFP4 (vLLM quantization/utils/flashinfer_fp4_moe.py @ 296ce48d53e21b80311c8bea381b9dc1b09317ae).

None of these libraries installs on the CPU machine (triton_kernels is not on PyPI as OpenAI's,
AITER needs ROCm, DeepGEMM and vLLM need CUDA), so the references restate their functions.
Real models' sizes, as the engines pad them: gpt-oss (H = I = 2880), DeepSeek-V3 (H 7168, I 2048),
Qwen3-30B-A3B (H 2048, I 768), Mixtral-8x7B (H 4096, I 14336); the fast suite takes one real size
at a time with a small other one and one or two experts, the slow suite the whole layer shapes.
"""

from __future__ import annotations

import pytest
import torch

import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.equiv.compare import equivalent
from layoutc.reference import engines
from layoutc.registry import DEFAULT, VLLM_BACKENDS
from tests.helpers import SPECS, bits

GPT_OSS = {"I": 2880, "H": 2880}
DEEPSEEK_V3 = {"I": 2048, "H": 7168}
QWEN3_MOE = {"I": 768, "H": 2048}
MIXTRAL = {"I": 14336, "H": 4096}

#: spec -> every parameter set (every branch of the engine's code) and small, odd shapes.
CASES = {
    "triton_kernels_mxfp4_hopper": ([{}, {"pad_to": 128, "tp_size": 2, "tp_rank": 1}],
                                    [{"E": 2, "I": 64, "H": 64}, {"E": 1, "I": 192, "H": 160}]),
    "triton_kernels_mxfp4_blackwell": ([{}, {"pad_to": 128, "tp_size": 2, "tp_rank": 1}],
                                       [{"E": 2, "I": 64, "H": 64}, {"E": 1, "I": 192, "H": 160},
                                        {"E": 3, "I": 256, "H": 288}]),
    "aiter_mxfp4": ([{}, {"pad_to": 128, "pad_hidden": 128, "tp_size": 2, "tp_rank": 1}],
                    [{"E": 2, "I": 64, "H": 64}, {"E": 1, "I": 192, "H": 160}, {"E": 2, "I": 256, "H": 512}]),
    "aiter_fp8_block": ([{}, {"tp_size": 2, "tp_rank": 1}],
                        [{"E": 2, "I": 256, "H": 256}, {"E": 1, "I": 512, "H": 128}]),
    # SM100: K groups a multiple of 4 or not (H/128 = 2, 1, 3; I/128 per rank 4, 8, 12, 6, 3)
    "deepgemm_fp8_block": ([{}, {"tp_size": 2, "tp_rank": 1}, {"tp_size": 4, "tp_rank": 2},
                            {"arch": "sm100"}, {"arch": "sm100", "tp_size": 2, "tp_rank": 1}],
                           [{"E": 2, "I": 512, "H": 256}, {"E": 1, "I": 1024, "H": 128}, {"E": 2, "I": 1536, "H": 384}]),
    "vllm_cutlass_nvfp4": ([{"activation": a, "tp_size": n, "tp_rank": n - 1}
                            for a in ("silu", "relu2") for n in (1, 2)],
                           [{"E": 2, "I": 128, "H": 64}, {"E": 1, "I": 256, "H": 80}, {"E": 2, "I": 384, "H": 160}]),
}

#: spec -> (parameters, real sizes) for the fast suite: one real axis at a time, E of 1 or 2.
REAL_FAST = {
    "triton_kernels_mxfp4_hopper": [({}, {"E": 1, "I": 2880, "H": 64})],
    "triton_kernels_mxfp4_blackwell": [({}, {"E": 1, "I": 64, "H": 2880})],
    "aiter_mxfp4": [({}, {"E": 1, "I": 64, "H": 2880})],
    "aiter_fp8_block": [({}, {"E": 1, "I": 768, "H": 256})],
    "deepgemm_fp8_block": [({"tp_size": 8, "tp_rank": 3}, {"E": 1, "I": 2048, "H": 256}),
                           ({"arch": "sm100"}, {"E": 1, "I": 768, "H": 256}),  # Qwen3-MoE's I: 6 K groups
                           ({"arch": "sm100"}, {"E": 1, "I": 128, "H": 7168})],  # DeepSeek-V3's H: 56 K groups
    "vllm_cutlass_nvfp4": [({"activation": "silu"}, {"E": 1, "I": 768, "H": 256})],
}

#: spec -> (parameters, whole real layer shapes, few experts) for the slow suite.
REAL_SLOW = {
    "triton_kernels_mxfp4_hopper": [({}, {"E": 1, **GPT_OSS}), ({}, {"E": 1, "I": 64, "H": 2880}),
                                    ({"tp_size": 2, "tp_rank": 1}, {"E": 1, **GPT_OSS})],
    "triton_kernels_mxfp4_blackwell": [({}, {"E": 2, **GPT_OSS})],
    "aiter_mxfp4": [({}, {"E": 1, **GPT_OSS}), ({}, {"E": 1, "I": 2880, "H": 64}),
                    ({"tp_size": 2, "tp_rank": 1}, {"E": 1, **GPT_OSS})],  # 2880 splits in whole 32-blocks in 2
    "aiter_fp8_block": [({}, {"E": 1, **DEEPSEEK_V3}), ({}, {"E": 1, **QWEN3_MOE})],
    "deepgemm_fp8_block": [({}, {"E": 1, **DEEPSEEK_V3}), ({"tp_size": 8, "tp_rank": 7}, {"E": 2, **DEEPSEEK_V3}),
                           ({}, {"E": 1, **QWEN3_MOE}), ({"arch": "sm100"}, {"E": 2, **DEEPSEEK_V3}),
                           ({"arch": "sm100"}, {"E": 2, **QWEN3_MOE}),
                           ({"arch": "sm100", "tp_size": 2, "tp_rank": 1}, {"E": 1, **QWEN3_MOE}),
                           ({"arch": "sm100", "tp_size": 8, "tp_rank": 5}, {"E": 2, **DEEPSEEK_V3})],
    "vllm_cutlass_nvfp4": [({"activation": "silu"}, {"E": 1, **DEEPSEEK_V3}),
                           ({"activation": "silu"}, {"E": 1, **MIXTRAL}),
                           ({"activation": "silu"}, {"E": 1, **QWEN3_MOE}),
                           ({"activation": "relu2"}, {"E": 1, **QWEN3_MOE}),
                           ({"activation": "relu2", "tp_size": 4, "tp_rank": 1}, {"E": 1, **MIXTRAL})],
}


def _case_id(v) -> str:
    return v if isinstance(v, str) else "-".join(f"{k}{x}" for k, x in v.items()) or "default"


def _compare(name: str, params: dict, dims: dict, seed: int = 0) -> None:
    spec = layoutc.compile_file(SPECS / f"{name}.lyt", params)
    x = synthetic_inputs(spec, dims, seed=seed)
    ours = spec.convert(x)
    theirs = getattr(engines, name)(x, params)
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    for k in ours:
        a, b = ours[k], theirs[k]
        assert tuple(a.shape) == tuple(b.shape), f"{name} {params} {dims} {k}: {tuple(a.shape)} != {tuple(b.shape)}"
        assert a.element_size() == b.element_size(), f"{name} {k}: {a.dtype} vs {b.dtype}"
        assert torch.equal(bits(a.contiguous()), bits(b.contiguous())), f"{name} {params} {dims} {k} differs"


@pytest.mark.parametrize("name", sorted(CASES))
def test_spec_matches_the_engine_reference_on_every_branch(name):
    params_list, dims_list = CASES[name]
    for params in params_list:
        for i, dims in enumerate(dims_list):
            _compare(name, params, dims, seed=i)


@pytest.mark.parametrize("name, params, dims", [(n, p, d) for n, cases in sorted(REAL_FAST.items()) for p, d in cases],
                         ids=_case_id)
def test_spec_matches_the_engine_reference_at_real_sizes(name, params, dims):
    _compare(name, params, dims)


@pytest.mark.slow  # whole real layers: several seconds each on two cores
@pytest.mark.parametrize("name, params, dims", [(n, p, d) for n, cases in sorted(REAL_SLOW.items()) for p, d in cases],
                         ids=_case_id)
def test_spec_matches_the_engine_reference_at_whole_real_layers(name, params, dims):
    _compare(name, params, dims)


@pytest.mark.slow  # `layoutc equiv` samples four shapes per parameter set and every optional-input variant
@pytest.mark.parametrize("name, params", [(n, p) for n, (ps, _) in sorted(CASES.items()) for p in ps])
def test_spec_is_equivalent_to_the_engine_reference(name, params):
    result = equivalent(SPECS / f"{name}.lyt", getattr(engines, name), params=params)
    assert result.ok, result.report()
    assert result.verdict().startswith("equivalent at 4 shapes")


def test_a_wrong_reference_is_found():
    """The comparison can fail: triton_kernels' Hopper value layout with the scott-trick axis in the
    wrong place (the shape is right, the bytes are not)."""
    x = synthetic_inputs(layoutc.compile_file(SPECS / "triton_kernels_mxfp4_hopper.lyt"), {"E": 1, "I": 64, "H": 64}, 0)
    right = engines.hopper_mx_value(x["w13_weight"])
    w = x["w13_weight"].contiguous().view(torch.uint8)
    e, n, kb = w.shape
    swapped = w.reshape(e, n // 2, 2, kb).transpose(1, 2).reshape(e, n, kb)  # rows permuted before the layout
    assert not torch.equal(engines.hopper_mx_value(swapped), right)


def test_hopper_bit_twiddle_is_the_documented_encoding():
    """hopper_value.py's comment: four FP4 values of a 16-bit half land at bits (15, 8..6),
    (12, 5..3), (9, 2..0) and (14, 13, 11, 10) for the fourth; one value at a time."""
    for j, (sign, ems) in enumerate([(15, (6, 7, 8)), (12, (3, 4, 5)), (9, (0, 1, 2)), (14, (13, 10, 11))]):
        for bit in range(4):
            b = torch.zeros(1, 4, dtype=torch.uint8)
            b[0, j] = 1 << bit
            word = int.from_bytes(bytes(engines._hopper_word(b.reshape(1, 1, 4)).flatten().tolist()), "little")
            assert word == 1 << (sign if bit == 3 else ems[bit]), (j, bit, hex(word))


def test_aiter_scale_padding_is_the_neutral_exponent():
    """shuffle_scale pads K/32 to a multiple of 8 with 0x7F (2^0), not zeros; vLLM's own padding of
    I (to pad_to) is zeros. I = 32 padded to 128: one real scale column, three zero ones (vLLM),
    four of 0x7F (AITER); H = 64 padded to 128 rows."""
    spec = layoutc.compile_file(SPECS / "aiter_mxfp4.lyt", {"pad_to": 128, "pad_hidden": 128})
    x = synthetic_inputs(spec, {"E": 1, "I": 32, "H": 64}, seed=0)
    s2 = x["w2_weight_scale"]
    x["w2_weight_scale"] = torch.full_like(s2.view(torch.uint8), 0x80).view(s2.dtype)
    s = spec.convert(x)["w2_weight_scale"].view(torch.uint8)
    assert s.shape == (128, 8)
    assert int((s == 0x7F).sum()) == 128 * 4 and int((s == 0x80).sum()) == 64 and int((s == 0).sum()) == 128 * 4 - 64


def test_vllm_cutlass_nvfp4_cannot_pad_a_gated_w13():
    """vLLM raises NotImplementedError when 2*I is not a multiple of 128; the spec refuses the size
    with its line instead of converting."""
    spec = layoutc.compile_file(SPECS / "vllm_cutlass_nvfp4.lyt", {"activation": "silu"})
    x = synthetic_inputs(spec, {"E": 1, "I": 96, "H": 64}, seed=0)
    with pytest.raises(layoutc.LayoutError, match=r"I % 64 == 0 .*vllm_cutlass_nvfp4.lyt"):
        spec.convert(x)
    with pytest.raises(NotImplementedError):
        engines.vllm_cutlass_nvfp4(x, {"activation": "silu"})


def test_vllm_backend_names_map_to_registered_specs():
    DEFAULT.check(set(VLLM_BACKENDS.values()))
    assert VLLM_BACKENDS["Mxfp4MoeBackend.TRITON@sm90"] == "triton_kernels_mxfp4_sm90"
    assert DEFAULT.spec(VLLM_BACKENDS["Fp8MoeBackend.DEEPGEMM@sm100"]).params["arch"] == "sm100"
    assert DEFAULT.spec(VLLM_BACKENDS["Fp8MoeBackend.DEEPGEMM@sm90"]).params["arch"] == "sm90"
    assert DEFAULT.spec("vllm_cutlass_nvfp4_relu2").params["activation"] == "relu2"
    names = {DEFAULT.spec(b).name for b in VLLM_BACKENDS.values()}
    # vllm_cutlass_w4a8 is tested in its own module (tests/backends/test_vllm_cutlass_w4a8.py: CUTLASS's record)
    assert names == set(CASES) | {"vllm_cutlass_w4a8"}


def test_deepgemm_sm100_reference_is_deepgemm_kernel_abi():
    """The SM100 reference against DeepGEMM's facts, element by element: word w of row n holds the
    exponent bytes of K groups 4w..4w+3 of n's 128-row block, little-endian, zero past the last group;
    the kernel's view [B, mn, k4/4] has strides (k4/4 * mn4, 1, mn4). mn = 6 (no multiple of 4, as
    for 1x128 activation scales) takes the MN padding branch, 5 K groups the K padding."""
    sf = torch.exp2(torch.randint(-20, 20, (2, 6, 5)).float()) * torch.where(torch.rand(2, 6, 5) < 0.3, -1.0, 1.0)
    store = engines.deepgemm_sm100_packed_ue8m0(sf, 6, 1)
    assert store.shape == (2, 2, 8) and store.dtype == torch.int32
    view = engines.deepgemm_sm100_kernel_view(store, 6)
    assert view.shape == (2, 6, 2) and view.stride() == (16, 1, 8)
    exp = ((sf.view(torch.int32) >> 23) & 0xFF).tolist()
    for b in range(2):
        for n in range(8):
            for w in range(2):
                word = int(store[b, w, n]) & 0xFFFFFFFF
                want = [exp[b][n][4 * w + j] if n < 6 and 4 * w + j < 5 else 0 for j in range(4)]
                assert word.to_bytes(4, "little") == bytes(want), (b, n, w)
    rows = engines.deepgemm_sm100_packed_ue8m0(sf, 6 * 128, 128)  # broadcast: row n reads block n // 128
    assert torch.equal(rows[:, :, ::128], store[:, :, :6])


def test_deepgemm_sm100_needs_the_broadcast():
    """The mistake the shipped corpus case stands for: packing 128x128 scales as if they were 1x128 gives a
    tensor the kernel indexes by weight row out of bounds (shape) -- the reference is not shape-blind."""
    spec = layoutc.compile_file(SPECS / "deepgemm_fp8_block.lyt", {"arch": "sm100"})
    x = synthetic_inputs(spec, {"E": 1, "I": 256, "H": 512}, seed=3)
    ours = spec.convert(x)["w13_weight_scale"]
    unbroadcast = engines.deepgemm_sm100_packed_ue8m0(x["w13_weight_scale"], 512, 1)
    assert ours.shape == (1, 1, 512) and unbroadcast.shape == (1, 1, 4)


def test_sglang_backend_names_map_to_registered_specs():
    from layoutc.registry import SGLANG_BACKENDS

    DEFAULT.check(set(SGLANG_BACKENDS.values()))
    assert DEFAULT.spec(SGLANG_BACKENDS["MoeRunnerBackend.DEEP_GEMM@sm100"]).params["arch"] == "sm100"


@pytest.mark.slow  # Triton's interpreter on CPU: over a minute on two cores
@pytest.mark.parametrize("lowering", ["fused", "gather", "compiled"])
def test_deepgemm_sm100_every_lowering_equals_eager(lowering, monkeypatch):
    """The broadcast (a gather reading each scale 128 times) through every lowering, under TP too."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for params in ({"arch": "sm100"}, {"arch": "sm100", "tp_size": 2, "tp_rank": 1}):
        spec = layoutc.compile_file(SPECS / "deepgemm_fp8_block.lyt", params)
        x = synthetic_inputs(spec, {"E": 2, "I": 768, "H": 640}, seed=3)
        want = spec.convert(x, lowering="eager")
        got = spec.convert(x, lowering=lowering)
        assert all(torch.equal(bits(got[k].contiguous()), bits(want[k].contiguous())) for k in want)


@pytest.mark.flashinfer  # FlashInfer 0.7.4 ships DeepGEMM's packing (flashinfer/deep_gemm.py), callable on the CPU
def test_deepgemm_sm100_scales_equal_the_library_packing():
    """The shipped SM100 scales (and the reference) against the library's own function on the broadcast
    scales: flashinfer.deep_gemm.get_col_major_tma_aligned_packed_tensor, DeepGEMM's packing as FlashInfer
    imports it, after DeepGEMM's index_select(-2, arange(mn) // 128). Its returned view is the kernel's."""
    from flashinfer.deep_gemm import get_col_major_tma_aligned_packed_tensor as pack

    for params, dims in [({"arch": "sm100"}, {"E": 2, "I": 768, "H": 384}),
                         ({"arch": "sm100", "tp_size": 2, "tp_rank": 1}, {"E": 1, "I": 512, "H": 7168})]:
        spec = layoutc.compile_file(SPECS / "deepgemm_fp8_block.lyt", params)
        x = synthetic_inputs(spec, dims, seed=5)
        ours = spec.convert(x)
        sliced = engines.deepgemm_fp8_block(x, {**params, "arch": "sm90"})  # the rank's slice, scales as loaded
        for w, s in (("w13_weight", "w13_weight_scale"), ("w2_weight", "w2_weight_scale")):
            mn = sliced[w].shape[1]
            view = pack(sliced[s].index_select(-2, torch.arange(mn) // 128))
            assert torch.equal(ours[s].transpose(1, 2)[:, :mn], view), (params, s)
    # the MN padding branch (mn not a multiple of 4, as for 1x128 scales) of the reference
    sf = torch.randn(2, 6, 5)
    assert torch.equal(engines.deepgemm_sm100_kernel_view(engines.deepgemm_sm100_packed_ue8m0(sf, 6, 1), 6), pack(sf))
