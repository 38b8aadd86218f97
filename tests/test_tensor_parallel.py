"""Tensor parallelism: ``shard`` then convert equals what an engine builds for each rank.

The engine side is written here independently of layoutc: each rank loads its slice of the
gate (w1) and of the up (w3) projection separately (vLLM's FusedMoE weight loader narrows each
half of w13 by rank, and w2 along its input dim K), then runs its hand-written conversion
(the vLLM-style recipes of ``layoutc.reference`` with FlashInfer's helpers). ``w2_bias`` is
not sharded: it is added once, after the reduction.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

import layoutc
from layoutc.demo import synthetic_inputs
from layoutc.reference import anchor, kernels_for
from tests.helpers import SPECS
from tests.helpers import assert_same_bits as assert_tensor_bits

os.environ.setdefault("TRITON_INTERPRET", "1")  # the fused case below runs Triton on CPU tensors

KERNELS, _ = kernels_for("cpu")


def assert_same_bits(got: dict, want: dict, what: str = "") -> None:
    assert set(got) == set(want), f"{what}: tensors {sorted(got)} != {sorted(want)}"
    for k in want:
        assert_tensor_bits(got[k], want[k], f"{what}: {k}")


@functools.cache
def spec(name: str, **params) -> layoutc.CompiledSpec:
    return layoutc.compile_file(SPECS / f"{name}.lyt", params)


def engine_shard(t: dict, rank: int, size: int, gated: bool) -> dict:
    """What rank ``rank`` of ``size`` holds after loading: its slice of each half of w13 (rows,
    dim 1) and of w2's K (dim 2); the scales and biases alike."""
    out = {}
    for k, v in t.items():
        if k.startswith("w13"):
            halves = v.chunk(2, dim=1) if gated else (v,)
            out[k] = torch.cat([h.chunk(size, dim=1)[rank] for h in halves], dim=1)
        elif k in ("w2_weight", "w2_weight_scale"):
            out[k] = v.chunk(size, dim=2)[rank]
        else:
            out[k] = v  # w2_bias: whole on every rank
    return out


CASES = [
    ("flashinfer_cutlass_bf16", {}, {"E": 2, "I": 512, "H": 256}),
    ("flashinfer_cutlass_mxfp8", {}, {"E": 2, "I": 512, "H": 256}),
    ("flashinfer_cutedsl_nvfp4", {"activation": "silu"}, {"E": 2, "I": 256, "H": 160}),
    ("flashinfer_cutedsl_nvfp4", {"activation": "relu2"}, {"E": 2, "I": 256, "H": 160}),
]


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("name,params,dims", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_shard_then_convert_is_the_engines_rank(name, params, dims, size):
    full = synthetic_inputs(spec(name, **params), dims, seed=3)
    gated = params.get("activation", "silu") != "relu2"
    outputs = []
    for rank in range(size):
        s = spec(name, **params, tp_size=size, tp_rank=rank)
        got = s.convert(full)
        local = engine_shard(full, rank, size, gated)
        assert_same_bits(got, anchor(name, local, params, KERNELS), f"rank {rank} of {size} vs the engine's recipe")
        # ... and what the unsharded spec makes of the engine's slice
        assert_same_bits(got, spec(name, **params).convert(local), f"rank {rank} of {size} vs convert(slice)")
        outputs.append(got)
    # the ranks hold different data: a shard that ignored tp_rank would pass the checks above only by luck
    assert not torch.equal(outputs[0]["w13_weight"], outputs[1]["w13_weight"])


def test_inputs_are_not_modified_and_outputs_do_not_alias_them():
    name, params, dims = CASES[0]
    full = synthetic_inputs(spec(name), dims, seed=4)
    before = {k: v.clone() for k, v in full.items()}
    out = spec(name, tp_size=2, tp_rank=1).convert(full)
    assert_same_bits(full, before)
    for k, v in out.items():
        assert v.untyped_storage().data_ptr() != full[k].untyped_storage().data_ptr(), k


@pytest.mark.parametrize("lowering", ["fused", "compiled", "gather"])
def test_every_lowering_shards_alike(lowering):
    name, params, dims = CASES[0]
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
