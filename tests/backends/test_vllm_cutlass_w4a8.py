"""vLLM's CUTLASS W4A8 MoE layout (specs/vllm_cutlass_w4a8.lyt, family cutlass_w4a8 in the prelude), bit for bit
against a reference written from vLLM's and CUTLASS's public source (layoutc/reference/w4a8.py;
github.com/vllm-project/vllm vllm/model_executor/layers/fused_moe/oracle/w4a8.py and csrc/quantization/
cutlass_w4a8/w4a8_grouped_mm_entry.cu @ 63f99b0d02338b5964e5a8bd30b7a713fede0b3d, w4a8_utils.cu @
1ff8af1469016f3f36a7fc2f2835e480c9ec1b2e, w4a8_mm_entry.cu @ 5d1ee758d8febcd3990415ba712111e9229b7e8a).

The reorder is a CuTe layout computed by CUTLASS (compute_memory_reordering_atom); no GPU is needed to
evaluate it, so tools/goldens/w4a8_reorder.cu printed it with CUTLASS's own headers on the host, with
packed_scale_t's bytes (tests/goldens/w4a8_reorder.txt; regenerate with tools/goldens/w4a8_reorder.sh).
The reference is checked against that record, the spec against the reference. vLLM does not pad this
path (it asserts H and I per rank % 256); real sizes: Qwen3-30B-A3B (H 2048, I 768), DeepSeek-V3 (H 7168,
I 2048), Llama-4 Scout/Maverick (H 5120, I 8192).
"""

from __future__ import annotations

import functools

import pytest
import torch

import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.equiv.compare import equivalent
from layoutc.reference import w4a8
from layoutc.registry import DEFAULT, VLLM_BACKENDS
from tests.helpers import GOLDENS, SPECS, assert_same_bits, bits

SPEC = SPECS / "vllm_cutlass_w4a8.lyt"
QWEN3_MOE = {"I": 768, "H": 2048}
DEEPSEEK_V3 = {"I": 2048, "H": 7168}
LLAMA4 = {"I": 8192, "H": 5120}


def _golden() -> tuple[dict, torch.Tensor]:
    """CUTLASS's record: {(N, K): int64 [N, K] offsets} and the [256, 9] packed_scale_t rows (byte, 8 bytes)."""
    lines = (GOLDENS / "w4a8_reorder.txt").read_text().splitlines()
    reorders, i, packed = {}, 0, None
    while i < len(lines):
        head = lines[i].split()
        if head and head[0] == "reorder":
            n, k = int(head[1]), int(head[2])
            reorders[(n, k)] = torch.tensor([[int(v) for v in row.split()] for row in lines[i + 1:i + 1 + n]])
            i += n + 1
        elif head == ["packed_scale"]:
            packed = torch.tensor([[int(v) for v in row.split()] for row in lines[i + 1:i + 257]])
            i += 257
        else:
            i += 1
    return reorders, packed


@functools.cache
def _spec(params: tuple = ()):
    return layoutc.compile_file(SPEC, dict(params))


def _compare(dims: dict, seed: int = 0, **tp) -> None:
    spec = _spec(tuple(sorted(tp.items())))
    x = synthetic_inputs(spec, dims, seed=seed)
    before = {k: v.clone() for k, v in x.items()}
    ours = spec.convert(x)
    theirs = w4a8.vllm_cutlass_w4a8(x, tp)
    assert set(ours) == set(theirs)
    for k in ours:
        assert_same_bits(ours[k].contiguous(), theirs[k], f"{dims} {tp} {k}")
    assert all(torch.equal(bits(x[k]), bits(before[k])) for k in x)  # inputs untouched (NaN scales too)


def test_the_reference_reorder_is_cutlass_s_layout():
    reorders, _ = _golden()
    assert set(reorders) == {(16, 32), (16, 256), (32, 64), (48, 512)}
    for (n, k), offsets in reorders.items():
        assert torch.equal(w4a8.reorder_offsets(n, k), offsets), (n, k)


def test_the_reference_moves_each_value_where_cutlass_s_layout_says():
    """reorder() on a tensor whose values are their own (row, col) codes, read back through the golden."""
    reorders, _ = _golden()
    n, k = 48, 512
    codes = torch.arange(n * k, dtype=torch.int64).reshape(n, k) % 16
    out = w4a8.nibbles(w4a8.reorder(w4a8.pack(codes).unsqueeze(0)))[0].reshape(-1)
    assert torch.equal(out[reorders[(n, k)].reshape(-1)], codes.reshape(-1))


def test_cutlass_pack_scale_fp8_is_eight_scaled_values_not_copies():
    """packed_scale_t(s) = E4M3(s * -8), .., E4M3(s * -1): a value computation, so the spec stops before it."""
    _, packed = _golden()
    s = packed[:, 0].to(torch.uint8).view(torch.float8_e4m3fn)
    ours = w4a8.packed_scale(s).view(torch.uint8).reshape(256, 8).long()
    assert torch.equal(ours, packed[:, 1:])
    one = packed[56]  # E4M3 1.0 is byte 0x38
    # -8 .. -1, exact in E4M3: sign 1, exponent field 7 + e, 3 mantissa bits
    assert one[0] == 0x38 and one[1:].tolist() == [0xD0, 0xCE, 0xCC, 0xCA, 0xC8, 0xC4, 0xC0, 0xB8]
    assert len(set(one[1:].tolist())) == 8


def test_the_nibble_tables_are_vllms_two_steps():
    u = torch.arange(16, dtype=torch.int64)
    signed = (u - 8) & 0xF  # convert_packed_uint4b8_to_signed_int4_inplace
    enc = torch.tensor(w4a8.UNIFIED)[signed]
    assert enc.tolist() == [8, 9, 10, 11, 12, 13, 14, 15, 0, 7, 6, 5, 4, 3, 2, 1]
    assert sorted(enc.tolist()) == list(range(16))  # a permutation: the spec is invertible


@pytest.mark.slow  # compiles the spec and runs its converter: seconds on the shared two cores
@pytest.mark.parametrize("dims", [{"E": 2, "I": 256, "H": 256}, {"E": 1, "I": 512, "H": 768}])
def test_spec_matches_vllm(dims):
    _compare(dims, seed=dims["E"])


@pytest.mark.slow  # compiles the tensor-parallel variants: seconds
@pytest.mark.parametrize("ranks, rank", [(2, 0), (2, 1), (4, 3)])
def test_tensor_parallel_rank_matches_vllms_rank(ranks, rank):
    _compare({"E": 2, "I": 256 * ranks, "H": 256}, seed=rank, tp_size=ranks, tp_rank=rank)


@pytest.mark.slow  # compiles the spec and runs its converter: seconds on the shared two cores
@pytest.mark.parametrize("dims", [{"E": 1, "I": QWEN3_MOE["I"], "H": 256}, {"E": 1, "I": 256, "H": QWEN3_MOE["H"]}],
                         ids=["qwen3-30b-a3b-intermediate", "qwen3-30b-a3b-hidden"])
def test_spec_matches_vllm_at_real_sizes(dims):
    _compare(dims)


@pytest.mark.slow  # whole real layers, one expert: seconds each on two cores
@pytest.mark.parametrize("dims, tp", [({"E": 1, **QWEN3_MOE}, {}), ({"E": 1, **DEEPSEEK_V3}, {}),
                                      ({"E": 1, **DEEPSEEK_V3}, {"tp_size": 8, "tp_rank": 5}),
                                      ({"E": 1, "I": LLAMA4["I"], "H": 256}, {}),
                                      ({"E": 1, "I": 256, "H": LLAMA4["H"]}, {})],
                         ids=["qwen3-30b-a3b", "deepseek-v3", "deepseek-v3-tp8", "llama-4-intermediate",
                              "llama-4-hidden"])
def test_spec_matches_vllm_at_whole_real_layers(dims, tp):
    _compare(dims, **tp)


@pytest.mark.slow  # compiles the spec
def test_vllm_refuses_the_sizes_the_spec_refuses():
    spec = _spec()
    with pytest.raises(layoutc.LayoutError, match=r"H % 256 == 0"):
        spec.convert(synthetic_inputs(spec, {"E": 1, "I": 256, "H": 256}, seed=0) | {
            "w13_weight_packed": torch.zeros(1, 512, 16, dtype=torch.int32),
            "w13_weight_scale": torch.zeros(1, 512, 1, dtype=torch.float8_e4m3fn),
            "w2_weight_packed": torch.zeros(1, 128, 32, dtype=torch.int32),
            "w2_weight_scale": torch.zeros(1, 128, 2, dtype=torch.float8_e4m3fn)})
    with pytest.raises(ValueError, match="multiple of 256"):
        w4a8.encode_and_reorder_int4b_grouped(torch.zeros(1, 16, 16, dtype=torch.int32))


@pytest.mark.slow  # `layoutc equiv`: four sampled shapes per parameter set
@pytest.mark.parametrize("params", [{}, {"tp_size": 2, "tp_rank": 1}], ids=["tp1", "tp2"])
def test_spec_is_equivalent_to_the_reference(params):
    result = equivalent(SPEC, w4a8.vllm_cutlass_w4a8, {"E": 2, "I": 512, "H": 256}, params=params)
    assert result.ok, result.report()
    assert result.verdict().startswith("equivalent at")


@pytest.mark.slow  # runs the fused kernels in Triton's interpreter
def test_fused_and_gather_lowerings_equal_eager():
    import os
    os.environ.setdefault("TRITON_INTERPRET", "1")
    spec = _spec()
    x = synthetic_inputs(spec, {"E": 2, "I": 256, "H": 512}, seed=5)
    eager = spec.convert(x, lowering="eager")
    for lowering in ("fused", "gather"):
        assert_same_bits(spec.convert(x, lowering=lowering), eager, lowering)


@pytest.mark.parametrize("mistake, text, message", [
    ("group size 256 for 128-value scale groups",
     ("scales w13_weight_packed block 16", "scales w13_weight_packed block 32"), "in blocks of 32 is H/256"),
    ("scales left N-major while the weight is reordered",
     ("interleave(w13_weight_packed, cutlass_w4a8); interleave(w13_weight_scale, cutlass_w4a8)",
      "interleave(w13_weight_packed, cutlass_w4a8)"), "its tied w13_weight_scale is not"),
    ("weight not encoded nor reordered", ("interleave(w2_weight_packed, cutlass_w4a8);", ""),
     "no cutlass_w4a8 packing is applied"),
])
def test_check_catches_realistic_mistakes(mistake, text, message):
    source = SPEC.read_text()
    assert text[0] in source
    bad = source.replace(text[0], text[1])
    if "N-major" in mistake:
        bad = bad.replace("output w13_weight_scale  : e4m3[E, H/128, 2*I/tp_size]  rows [w1; w3] packing cutlass_w4a8",
                          "output w13_weight_scale  : e4m3[E, 2*I/tp_size, H/128]  rows [w1; w3]")
    with pytest.raises(layoutc.SpecError, match=message):
        layoutc.compile_source(bad, "vllm_cutlass_w4a8.lyt")


@pytest.mark.slow  # compiles the tensor-parallel variant
def test_check_catches_w13_sharded_as_one_part():
    bad = SPEC.read_text().replace("dim=1, parts=2, rank", "dim=1, rank")
    with pytest.raises(layoutc.SpecError, match=r"rows are \[w1; w3\] \(2 shards\)"):
        layoutc.compile_source(bad, "vllm_cutlass_w4a8.lyt", {"tp_size": 2, "tp_rank": 1})


def test_registered_for_vllms_backend_name():
    assert VLLM_BACKENDS["W4A8MoeBackend.CUTLASS"] == "vllm_cutlass_w4a8"
    assert "vllm_cutlass_w4a8" in DEFAULT.backends  # compiled and verified by test_backends (slow suite)
