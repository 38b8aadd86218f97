"""FlashInfer's SM90 CUTLASS fused MoE computed with layoutc's bytes: golden from the H200.

tools/gpu/moe_kernel.py ran ``flashinfer.fused_moe.cutlass_fused_moe`` (MXFP4 weights x BF16
activations, biases, gpt-oss SwiGLU) on a small layer converted by specs/flashinfer_cutlass_bf16.lyt
and recorded the checkpoint tensors, the converted bytes it fed the kernel, the kernel's output
and a float32 reference. Here, on CPU: the reference recomputes from the checkpoint tensors, the
kernel's output is within the bf16 tolerance of it, and the spec still produces exactly the bytes
the kernel read. The golden-free tests check the pieces the GPU script relies on.
"""

from __future__ import annotations

import pytest
import torch

import layoutc
from tests.helpers import GOLDENS, SPECS, assert_same_bits
from tools.gpu import moe_kernel
from tools.gpu.moe_sm90.reference import compare, moe_forward_gptoss, swiglu_bias

GOLDEN_PATH = GOLDENS / moe_kernel.GOLDEN


@pytest.fixture(scope="module")
def golden():
    if not GOLDEN_PATH.exists():
        pytest.skip(f"{GOLDEN_PATH.relative_to(GOLDENS.parent.parent)} is not recorded yet: run "
                    "tools/gpu/moe_sm90/run.sh on an H200 and copy $OUT/flashinfer_cutlass_moe_sm90.pt there")
    return torch.load(GOLDEN_PATH)


@pytest.fixture(scope="module")
def recomputed(golden):
    return moe_forward_gptoss(golden["x"], golden["checkpoint"], golden["topk_ids"], golden["topk_weights"],
                              **golden["swiglu"])


def test_reference_recomputes_from_the_checkpoint(golden, recomputed):
    # float32 on another machine's CPU (another BLAS, thread count): equal to rounding
    scale = golden["reference"].abs().max().item()
    torch.testing.assert_close(recomputed, golden["reference"], rtol=1e-5, atol=1e-5 * scale)


def test_kernel_output_within_bf16_tolerance(golden, recomputed):
    out = golden["kernel_out"]
    assert out.dtype == torch.bfloat16 and out.shape == recomputed.shape
    m = compare(out, recomputed)
    assert m["finite"]
    assert m["frac_outside_tol"] == 0.0, m
    assert m["mean_rel_err"] < 1e-2, m


def test_kernel_output_is_not_the_reference_of_a_wrong_layer(golden, recomputed):
    # the tolerance tells a gate/up mix-up apart: the reference with w1 and w3 exchanged
    ck = dict(golden["checkpoint"])
    for k in ("w13_weight", "w13_weight_scale", "w13_bias"):
        ck[k] = moe_kernel.swap_w13(ck[k])
    wrong = moe_forward_gptoss(golden["x"], ck, golden["topk_ids"], golden["topk_weights"], **golden["swiglu"])
    assert compare(golden["kernel_out"], wrong)["frac_outside_tol"] > 0.5


def test_spec_gives_the_bytes_the_kernel_read(golden):
    spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
    assert golden["meta"]["spec_sha256"] == spec.program.text_sha256, "the spec changed since the golden was recorded"
    out = spec.convert(golden["checkpoint"])
    assert set(out) == set(golden["converted"])
    for k, v in golden["converted"].items():
        assert_same_bits(out[k], v, f"{k}: the bytes cutlass_fused_moe read")


# --- no golden needed ----------------------------------------------------------------------------

def test_swiglu_bias_is_gpt_oss():
    gate = torch.tensor([-9.0, -1.0, 0.0, 0.5, 3.0, 8.0])
    up = torch.tensor([-8.0, -2.0, 1.0, 0.25, 7.5, -0.5])
    # gpt-oss: x_glu.clamp(max=limit), x_linear.clamp(-limit, limit), x_glu*sigmoid(1.702*x_glu)*(x_linear+1)
    g, u = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
    want = g * torch.sigmoid(1.702 * g) * (u + 1)
    assert torch.equal(swiglu_bias(gate, up, 1.702, 1.0, 7.0), want)


def test_gptoss_forward_matches_layoutc_moe_forward_without_the_gpt_oss_parts():
    # alpha = 1, beta = 0, no limit and zero biases is plain SiLU: layoutc.reference.quant.moe_forward
    from layoutc.reference.quant import dequantize_mxfp4, moe_forward

    layer = moe_kernel.make_layer({"E": 3, "H": 64, "I": 64, "T": 5, "topk": 2, "seed": 3})
    ck = dict(layer["ckpt"], w13_bias=torch.zeros(3, 128), w2_bias=torch.zeros(3, 64))
    ours = moe_forward_gptoss(layer["x"], ck, layer["topk_ids"], layer["topk_weights"], 1.0, 0.0, float("inf"))
    theirs = moe_forward(layer["x"], dequantize_mxfp4(ck["w13_weight"], ck["w13_weight_scale"]),
                         dequantize_mxfp4(ck["w2_weight"], ck["w2_weight_scale"]), layer["topk_ids"],
                         layer["topk_weights"])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_fold_scales_groups_4_is_the_converters_fold_and_groups_2_is_not():
    spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
    layer = moe_kernel.make_layer(moe_kernel.LAYERS["small"])
    ck = layer["ckpt"]
    out = spec.convert(ck)
    assert torch.equal(moe_kernel.fold_scales(moe_kernel.swap_w13(ck["w13_weight_scale"]), 4), out["w13_weight_scale"])
    assert torch.equal(moe_kernel.fold_scales(ck["w2_weight_scale"], 4), out["w2_weight_scale"])
    assert not torch.equal(moe_kernel.fold_scales(ck["w2_weight_scale"], 2), out["w2_weight_scale"])


@pytest.mark.parametrize("mistake", moe_kernel.MISTAKES)
def test_each_mistake_edits_what_it_says_and_the_guard_rejects_it(mistake):
    spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
    ck = moe_kernel.make_layer(moe_kernel.LAYERS["small"])["ckpt"]
    good, bad = spec.convert(ck), spec.convert(ck)
    layoutc.guard.check(good, spec)
    moe_kernel.mistake(mistake, bad, ck)
    changed = {k for k in good if not torch.equal(good[k], bad[k])}
    assert changed == {"a_scales_not_swapped": {"w13_weight_scale"},
                       "b_weights_not_interleaved": {"w13_weight", "w2_weight"},
                       "c_scale_fold_k_block_2": {"w13_weight_scale", "w2_weight_scale"}}[mistake]
    with pytest.raises(layoutc.LayoutError, match="modified in place"):
        layoutc.guard.check(bad, spec)


@pytest.mark.parametrize("mistake", moe_kernel.MISTAKES)
def test_the_verifier_rejects_each_mistake_as_spec_text(mistake):
    path = moe_kernel.MUTANTS / moe_kernel.MUTANT_FILES[mistake]
    with pytest.raises(layoutc.SpecError):
        layoutc.compile_source(path.read_text(), str(path))


MOVES = moe_kernel.MUTANTS / "scale_moves_before_fold.lyt"


def test_scale_moves_before_the_fold_give_mistake_c_bytes_and_the_guard_rejects_them():
    shipped = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
    moves = layoutc.compile_source(MOVES.read_text(), str(MOVES), verify_spec=False)
    ck = moe_kernel.make_layer(moe_kernel.LAYERS["small"])["ckpt"]
    want = shipped.convert(ck)
    moe_kernel.mistake("c_scale_fold_k_block_2", want, ck)
    got = moves.convert(ck)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    with pytest.raises(layoutc.LayoutError, match="not the expected one"):
        layoutc.guard.check(got, shipped)


def test_the_verifier_rejects_mistake_c_written_as_moves_then_fold():
    with pytest.raises(layoutc.SpecError, match="moves data physically before the sm90_mixed packing"):
        layoutc.compile_source(MOVES.read_text(), str(MOVES))
