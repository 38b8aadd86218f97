"""Tensor parallelism: ``shard`` then convert equals what an engine builds for each rank.

The engine side is written here independently of layoutc (``engine_shard``): each rank loads its
slice the way vLLM's loaders cut it -- each half of a contiguous w13 narrowed by rank (FusedMoE
``_load_w13``), one block of rows of a gpt-oss interleaved w13 (``_load_weights_mxfp4``), FP8 block
scales in whole blocks, w2 along its input dim K (``_load_w2``) -- then runs its hand-written
conversion (the vLLM-style recipes of ``layoutc.reference`` with FlashInfer's helpers), padding
included where the layout pads. ``w2_bias`` is not sharded: it is added once, after the reduction
(vLLM's gpt-oss loader zeroes it on ranks other than 0, a value change left to the engine).
"""

from __future__ import annotations

import os
import re

import pytest
import torch

import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.reference import anchor, kernels_for
from tests.helpers import SPECS, assert_same_bits, spec

os.environ.setdefault("TRITON_INTERPRET", "1")  # the fused case below runs Triton on CPU tensors

KERNELS, _ = kernels_for("cpu")




def engine_shard(t: dict, dims: dict, rank: int, size: int, kind: str) -> dict:
    """What rank ``rank`` of ``size`` holds after loading, sliced the way vLLM's loaders do.

    Rank r owns intermediate columns [start, end) = [r*I/n, (r+1)*I/n). A tensor element along
    w13's rows or w2's K covers ``unit`` of those columns (2 for packed FP4 bytes, 16 or 32 for
    NVFP4/MXFP4 scale blocks, 128 for FP8 block scales), and the slice is taken in those units:

    * ``contiguous`` ([w1; w3], FusedMoE ``_load_w13``): each half of w13 narrowed by rank;
    * ``single`` (non-gated, one w13 shard): w13 narrowed by rank;
    * ``interleaved`` (gpt-oss ``_load_weights_mxfp4``): rows [2*start, 2*end) of the interleaved
      w13, i.e. one block holding the rank's gate and up rows, still interleaved;
    * block scales (FP8 128x128): the same narrowing in block rows / block columns (whole blocks);
    * ``k_major`` (GPTQ, [E, K/8, N] words and [E, K/group, N] scales): as ``contiguous`` with w13's
      rows on its last axis and w2's K on axis 1.

    w2 and its scales are narrowed along K (``_load_w2``); ``w2_bias`` and per-expert global scales
    ([E]: NVFP4's weight_scale_2) are kept whole."""
    i = dims["I"]
    start, end = rank * i // size, (rank + 1) * i // size
    n_w13 = i if kind == "single" else 2 * i

    def cut(x: torch.Tensor, dim: int, lo: int, hi: int, unit: int) -> torch.Tensor:
        assert lo % unit == 0 and hi % unit == 0, f"rank {rank} of {size} splits a {unit}-wide block"
        return x.narrow(dim, lo // unit, (hi - lo) // unit)

    out = {}
    if kind == "k_major":
        for k, v in t.items():
            if k.startswith("w13"):
                unit = 2 * i // v.shape[2]
                out[k] = torch.cat([cut(h, 2, start, end, unit) for h in v.chunk(2, dim=2)], dim=2)
            else:
                out[k] = cut(v, 1, start, end, i // v.shape[1])
        return out
    for k, v in t.items():
        if v.dim() == 1:
            out[k] = v  # one value per expert: whole on every rank
        elif k.startswith("w13"):
            unit = n_w13 // v.shape[1]
            if kind == "interleaved":
                out[k] = cut(v, 1, 2 * start, 2 * end, unit)
            elif kind == "single":
                out[k] = cut(v, 1, start, end, unit)
            else:
                out[k] = torch.cat([cut(h, 1, start, end, unit) for h in v.chunk(2, dim=1)], dim=1)
        elif k in ("w2_weight", "w2_weight_scale", "w2_weight_packed"):
            out[k] = cut(v, 2, start, end, i // v.shape[2])
        else:
            out[k] = v  # w2_bias: whole on every rank
    return out


#: (spec, params, checkpoint kind, dims): every shipped spec and each activation/checkpoint variant,
#: with sizes whose local (per-rank) sizes at 2 and 4 ranks meet each kernel's divisibility rules,
#: and, for the padded specs, local sizes that get padded.
CASES = [
    ("flashinfer_cutlass_bf16", {}, "contiguous", {"E": 2, "I": 512, "H": 256}),
    ("flashinfer_cutlass_mxfp8", {}, "contiguous", {"E": 2, "I": 512, "H": 256}),
    ("flashinfer_cutedsl_nvfp4", {"activation": "silu"}, "contiguous", {"E": 2, "I": 256, "H": 160}),
    ("flashinfer_cutedsl_nvfp4", {"activation": "relu2"}, "single", {"E": 2, "I": 256, "H": 160}),
    ("flashinfer_cutlass_mxfp4_padded", {"checkpoint": "contiguous"}, "contiguous", {"E": 2, "I": 384, "H": 160}),
    ("flashinfer_cutlass_mxfp4_padded", {"checkpoint": "gpt_oss"}, "interleaved", {"E": 2, "I": 384, "H": 160}),
    ("flashinfer_cutlass_nvfp4", {"activation": "silu"}, "contiguous", {"E": 2, "I": 192, "H": 80}),
    ("flashinfer_cutlass_nvfp4", {"activation": "relu2"}, "single", {"E": 2, "I": 192, "H": 80}),
    ("flashinfer_trtllm_mxfp4", {}, "interleaved", {"E": 2, "I": 384, "H": 384}),
    ("flashinfer_trtllm_nvfp4", {"activation": "silu"}, "contiguous", {"E": 2, "I": 192, "H": 384}),
    ("flashinfer_trtllm_nvfp4", {"activation": "relu2"}, "single", {"E": 2, "I": 192, "H": 384}),
    ("flashinfer_trtllm_fp8_block", {}, "contiguous", {"E": 2, "I": 512, "H": 256}),
    ("flashinfer_trtllm_bf16", {"activation": "silu"}, "contiguous", {"E": 2, "I": 192, "H": 128}),
    ("flashinfer_trtllm_bf16", {"activation": "relu2"}, "single", {"E": 2, "I": 192, "H": 128}),
    ("triton_kernels_mxfp4_hopper", {}, "interleaved", {"E": 2, "I": 256, "H": 64}),
    ("triton_kernels_mxfp4_blackwell", {}, "interleaved", {"E": 2, "I": 256, "H": 64}),
    ("aiter_mxfp4", {}, "interleaved", {"E": 1, "I": 256, "H": 64}),
    ("aiter_fp8_block", {}, "contiguous", {"E": 2, "I": 512, "H": 128}),
    ("deepgemm_fp8_block", {"arch": "sm90"}, "contiguous", {"E": 2, "I": 512, "H": 128}),
    ("deepgemm_fp8_block", {"arch": "sm100"}, "contiguous", {"E": 2, "I": 512, "H": 384}),
    ("vllm_cutlass_nvfp4", {"activation": "silu"}, "contiguous", {"E": 2, "I": 256, "H": 80}),
    ("vllm_cutlass_nvfp4", {"activation": "relu2"}, "single", {"E": 2, "I": 192, "H": 80}),
    ("marlin_mxfp4", {}, "contiguous", {"E": 2, "I": 256, "H": 64}),
    ("marlin_nvfp4", {"activation": "silu", "act_dtype": "bf16"}, "contiguous", {"E": 2, "I": 256, "H": 64}),
    ("marlin_nvfp4", {"activation": "relu2", "act_dtype": "f16"}, "single", {"E": 2, "I": 512, "H": 64}),
    ("marlin_gptq_int4", {"group_size": 128}, "k_major", {"E": 1, "I": 512, "H": 128}),
    ("marlin_gptq_int4", {"group_size": 64}, "k_major", {"E": 1, "I": 256, "H": 128}),
    ("marlin_gptq_int4", {"group_size": 32}, "k_major", {"E": 1, "I": 256, "H": 128}),
    ("vllm_cutlass_w4a8", {}, "contiguous", {"E": 1, "I": 1024, "H": 256}),
]


def test_every_shipped_spec_and_variant_is_covered():
    assert {c[0] for c in CASES} == {p.stem for p in SPECS.glob("*.lyt")}
    for path in SPECS.glob("*.lyt"):
        text = path.read_text()
        assert "param tp_size = 1" in text and "param tp_rank = 0" in text, path.name
        for name, values in re.findall(r"^param (\w+) = \w+ choices \[([^\]]*)\]", text, re.M):
            choices = {v.strip() for v in values.split(",")}
            got = {str(c[1].get(name)) for c in CASES if c[0] == path.stem}  # integer choices too
            assert got == choices, f"{path.stem}: {name} covers {sorted(map(str, got))} of {sorted(choices)}"


#: cases over ~3 s on the CPU machine (each rank compiles and verifies its own spec)
SLOW = {("flashinfer_cutlass_mxfp4_padded", 2), ("flashinfer_cutlass_mxfp4_padded", 4), ("flashinfer_trtllm_mxfp4", 4),
        ("flashinfer_trtllm_nvfp4", 2), ("flashinfer_trtllm_nvfp4", 4), ("aiter_mxfp4", 2), ("aiter_mxfp4", 4),
        ("triton_kernels_mxfp4_hopper", 4),
        ("marlin_mxfp4", 2), ("marlin_mxfp4", 4), ("marlin_nvfp4", 2), ("marlin_nvfp4", 4),
        ("vllm_cutlass_w4a8", 2), ("vllm_cutlass_w4a8", 4)}


def _tp_cases():
    for c in CASES:
        for size in (2, 4):
            slow = (c[0], size) in SLOW and c[1].get("activation") != "relu2"
            # the engine side of FlashInfer's specs calls FlashInfer's own helpers
            marks = ([pytest.mark.slow] if slow else []) + (
                [pytest.mark.flashinfer] if c[0].startswith("flashinfer_") else [])
            yield pytest.param(*c, size, id=f"{c[0]}-{c[2]}-{'-'.join(map(str, c[1].values()))}-{size}", marks=marks)


@pytest.mark.parametrize("name,params,kind,dims,size", list(_tp_cases()))
def test_shard_then_convert_is_the_engines_rank(name, params, kind, dims, size):
    full = synthetic_inputs(spec(name, **params), dims, seed=3)
    outputs = []
    for rank in range(size):
        s = spec(name, **params, tp_size=size, tp_rank=rank)
        got = s.convert(full)
        local = engine_shard(full, dims, rank, size, kind)
        assert_same_bits(got, anchor(name, local, params, KERNELS), f"rank {rank} of {size} vs the engine's recipe")
        # ... and what the unsharded spec makes of the engine's slice
        assert_same_bits(got, spec(name, **params).convert(local), f"rank {rank} of {size} vs convert(slice)")
        outputs.append(got)
    # the ranks hold different data: a shard that ignored tp_rank would pass the checks above only by luck
    for k in outputs[0]:
        if k != "w2_bias" and outputs[0][k].dim() > 1:  # biases of w2 and per-expert global scales: whole
            assert not torch.equal(outputs[0][k].view(torch.uint8), outputs[1][k].view(torch.uint8)), k


def test_inputs_are_not_modified_and_outputs_do_not_alias_them():
    name, params, _, dims = CASES[0]
    full = synthetic_inputs(spec(name), dims, seed=4)
    before = {k: v.clone() for k, v in full.items()}
    out = spec(name, tp_size=2, tp_rank=1).convert(full)
    assert_same_bits(full, before)
    for k, v in out.items():
        assert v.untyped_storage().data_ptr() != full[k].untyped_storage().data_ptr(), k


@pytest.mark.parametrize("lowering", ["fused", "compiled", "gather"])
def test_every_lowering_shards_alike(lowering):
    name, params, _, dims = CASES[0]
    full = synthetic_inputs(spec(name), {"E": 1, "I": 256, "H": 128}, seed=5)
    s = spec(name, tp_size=2, tp_rank=1)
    assert_same_bits(s.convert(full, lowering=lowering), s.convert(full, lowering="eager"), lowering)


def test_output_shapes_and_contract_are_per_rank():
    s = spec("flashinfer_cutlass_bf16", tp_size=4, tp_rank=3)
    shapes = {o.name: o.shape_text for o in s.program.outputs}
    assert shapes["w13_weight"] == ("E", "I/2", "H/2")
    assert shapes["w2_weight_scale"] == ("E", "H/64", "I/512", "16", "16")
    assert s.params == {"tp_size": 4, "tp_rank": 3}
    out = s.convert(synthetic_inputs(s, {"E": 1, "I": 512, "H": 128}, seed=0))
    assert tuple(out["w13_weight"].shape) == (1, 256, 64) and tuple(out["w2_bias"].shape) == (1, 128)


def test_one_rank_of_one_is_no_step_and_keeps_the_inverse():
    s = spec("flashinfer_cutlass_bf16")
    assert s.invertible
    assert not any(st.op.name == "shard" for v in s.compiled.variants for c in v.chains for st in c.steps)
    assert not spec("flashinfer_cutlass_bf16", tp_size=2, tp_rank=0).invertible  # a slice drops data


def test_guard_tells_ranks_apart():
    from layoutc.guard import LayoutError, check

    dims = {"E": 1, "I": 256, "H": 128}
    r0, r1 = spec("flashinfer_cutlass_bf16", tp_size=2, tp_rank=0), spec("flashinfer_cutlass_bf16", tp_size=2, tp_rank=1)
    full = synthetic_inputs(r0, dims, seed=1)
    out0, out1 = r0.convert(full), r1.convert(full)
    check(out0, r0)
    mixed = dict(out0, w2_weight=out1["w2_weight"])
    with pytest.raises(LayoutError, match="tp_rank"):
        check(mixed, r0)


# -- the verifier on tensor-parallel specs --

BF16 = (SPECS / "flashinfer_cutlass_bf16.lyt").read_text()
W13_SHARD = "shard([w13_weight, w13_weight_scale, w13_bias], dim=1, parts=2, rank=tp_rank, ranks=tp_size)"


def _mutant(old: str, new: str) -> str:
    assert old in BF16, f"the bf16 spec no longer contains {old!r}: update this test"
    return BF16.replace(old, new)


def _errors(text: str, **params) -> list[str]:
    try:
        layoutc.compile_source(text, "tp.lyt", params)
    except layoutc.SpecError as err:
        return [d.message for d in err.errors]
    return []


def test_gated_w13_sharded_as_one_block_is_rejected():
    text = _mutant(W13_SHARD, W13_SHARD.replace("parts=2, ", ""))
    errors = _errors(text, tp_size=2, tp_rank=0)
    assert any("w13_weight rows are [w1; w3] (2 shards)" in e and "slices them as 1 part" in e for e in errors)
    assert any("the kernel expects rows [w3; w1]" in e for e in errors)


def test_weight_sharded_but_not_its_scales_is_rejected():
    text = _mutant(W13_SHARD, W13_SHARD.replace("w13_weight_scale, ", ""))
    errors = _errors(text, tp_size=2, tp_rank=1)
    assert errors and any("w13_weight_scale" in e for e in errors)


def test_scale_sharded_for_another_rank_is_rejected():
    text = _mutant(W13_SHARD, W13_SHARD.replace("w13_weight_scale, ", "") + "\n"
                   "shard(w13_weight_scale, dim=1, parts=2, rank=0, ranks=tp_size)")
    errors = _errors(text, tp_size=2, tp_rank=1)
    assert any("w13_weight_scale" in e and "must follow its weight's rows" in e for e in errors), errors
    assert _errors(text, tp_size=2, tp_rank=0) == []  # on rank 0 the two happen to agree


def test_non_gated_w13_with_two_parts_is_rejected():
    text = (SPECS / "flashinfer_cutedsl_nvfp4.lyt").read_text()
    old = "shard([w13_weight, w13_weight_scale], dim=1, rank=tp_rank, ranks=tp_size)"
    assert old in text
    errors = _errors(text.replace(old, old.replace("dim=1, ", "dim=1, parts=2, ")),
                     activation="relu2", tp_size=2, tp_rank=1)
    assert any("rows are [w1] (1 shard)" in e for e in errors), errors


def test_rank_out_of_range_and_bad_sizes_are_spec_errors():
    errors = _errors(BF16, tp_size=2, tp_rank=2)
    assert errors and all("rank=2 must be below ranks=2" in e for e in errors)
    assert any("not a valid size" in e for e in _errors(BF16, tp_size=0))
    with pytest.raises(layoutc.SpecError, match="takes a int"):
        layoutc.compile_source(BF16, "tp.lyt", {"tp_size": "two"})


def test_a_size_that_does_not_divide_is_reported_at_convert_time():
    s = spec("flashinfer_cutlass_bf16", tp_size=4, tp_rank=0)
    x = synthetic_inputs(spec("flashinfer_cutlass_bf16"), {"E": 1, "I": 256, "H": 128}, seed=0)
    with pytest.raises(layoutc.LayoutError, match="I=256"):
        s.convert(x)


# Two gaps an earlier layoutc had, now closed. (1) Output shapes with round_up were compared
# with the declared ones only on small sizes, where round_up(I/tp_size, 128) == round_up(I, 128):
# a padded layout that forgets the w2 shard passed. The compiler now also compares shapes on large
# sizes, and a converter checks its outputs against the declared shapes. (2) guard.check could not
# tell I from a padded output; the provenance record now keeps the dims of the call.

BF16_TRTLLM = (SPECS / "flashinfer_trtllm_bf16.lyt").read_text()
W2_SHARD = "shard(w2_weight, dim=2, rank=tp_rank, ranks=tp_size)\n"


@pytest.mark.parametrize("size", [2, 4])
def test_a_padded_layout_that_forgets_the_w2_shard_is_rejected(size):
    assert W2_SHARD in BF16_TRTLLM
    bad = BF16_TRTLLM.replace(W2_SHARD, "")
    errors = _errors(bad, activation="silu", tp_size=size, tp_rank=0)
    assert any("w2_weight: the transforms produce shape" in e for e in errors), errors


# The three shard deletions README ("Mutation score") lists as once surviving in this layout: each is
# rejected by check, naming the tensor whose shape the transforms no longer give.
SHARD_DELETIONS = [("shard(w13_weight, dim=1, rank=tp_rank, ranks=tp_size)\n", "relu2", "w13_weight"),
                   ("shard(w13_weight, dim=1, parts=2, rank=tp_rank, ranks=tp_size)\n", "silu", "w13_weight"),
                   (W2_SHARD, "silu", "w2_weight")]


@pytest.mark.parametrize("statement, activation, tensor", SHARD_DELETIONS, ids=["w13_relu2", "w13_gated", "w2"])
def test_each_shard_deletion_of_the_padded_bf16_trtllm_layout_is_rejected(statement, activation, tensor):
    assert BF16_TRTLLM.count(statement) == 1
    bad = BF16_TRTLLM.replace(statement, "")
    errors = _errors(bad, activation=activation, tp_size=2, tp_rank=0)
    assert any(f"{tensor}: the transforms produce shape" in e for e in errors), errors


def test_a_converter_checks_its_outputs_against_the_declared_shapes(monkeypatch):
    # the post-condition behind the compiler's shape comparison: a declaration that disagrees with
    # the transforms on the sizes of a call is named at convert time, not handed to the kernel
    s = spec("flashinfer_trtllm_bf16", activation="silu", tp_size=2, tp_rank=0)
    shapes = dict(s.module._OUTPUT_SHAPES)
    monkeypatch.setitem(s.module._OUTPUT_SHAPES, "w2_weight", lambda **d: [d["E"], 1, d["H"], 64])
    x = synthetic_inputs(spec("flashinfer_trtllm_bf16"), {"E": 1, "I": 1024, "H": 64}, seed=0)
    with pytest.raises(layoutc.LayoutError, match="the transforms produced w2_weight with shape"):
        s.convert(x)
    assert tuple(shapes["w2_weight"](E=1, I=1024, H=64)) == (1, 8, 64, 64)


def test_the_guard_checks_a_padded_layout():
    from layoutc.guard import check

    s = spec("flashinfer_trtllm_bf16", activation="silu", tp_size=2, tp_rank=1)
    check(s.convert(synthetic_inputs(spec("flashinfer_trtllm_bf16"), {"E": 1, "I": 192, "H": 64}, seed=0)), s)
