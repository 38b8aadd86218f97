"""The issue-7 backends, bit for bit against the conversions engines ship today.

Each spec is compared with its vLLM-style recipe (layoutc/reference/recipes.py), which calls
FlashInfer's own helpers: the pure-torch ones directly (shuffle_matrix_a and
shuffle_matrix_sf_a row indices, reorder_rows_for_gated_act_gemm indices,
convert_to_block_layout), the CUDA-only block_scale_interleave through its CPU port, itself
checked against the kernel's recorded goldens (tests/reference/test_reference_ports.py). Then each
spec's verifier findings for the mistakes these recipes invite.
"""

from __future__ import annotations


import pytest

import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.reference import kernels_cpu, recipes
from tests.helpers import SPECS, assert_same_bits, spec

BSI = kernels_cpu.block_scale_interleave

#: (spec, params, recipe, shapes): shapes with padding and with several tiles where the layout has them
CASES = [
    ("flashinfer_trtllm_mxfp4", {}, lambda t, p: recipes.trtllm_mxfp4_gpt_oss(t, BSI),
     [{"E": 2, "I": 128, "H": 256}, {"E": 1, "I": 384, "H": 128}]),
    ("flashinfer_cutlass_mxfp4_padded", {"checkpoint": "gpt_oss"},
     lambda t, p: recipes.cutlass_sm90_mxfp4_bf16_padded(t, kernels_cpu.sm90_interleave_fp4, gpt_oss=True),
     [{"E": 2, "I": 96, "H": 160}, {"E": 1, "I": 288, "H": 288}, {"E": 1, "I": 128, "H": 256}]),
    ("flashinfer_cutlass_mxfp4_padded", {"checkpoint": "contiguous"},
     lambda t, p: recipes.cutlass_sm90_mxfp4_bf16_padded(t, kernels_cpu.sm90_interleave_fp4, gpt_oss=False),
     [{"E": 2, "I": 96, "H": 160}, {"E": 1, "I": 288, "H": 288}]),
    ("flashinfer_trtllm_nvfp4", {"activation": "silu"}, lambda t, p: recipes.trtllm_nvfp4(t, BSI, gated=True),
     [{"E": 2, "I": 128, "H": 128}, {"E": 1, "I": 192, "H": 256}]),
    ("flashinfer_trtllm_nvfp4", {"activation": "relu2"}, lambda t, p: recipes.trtllm_nvfp4(t, BSI, gated=False),
     [{"E": 2, "I": 128, "H": 128}, {"E": 1, "I": 384, "H": 256}]),
    ("flashinfer_cutlass_nvfp4", {"activation": "silu"}, lambda t, p: recipes.cutlass_nvfp4_padded(t, BSI, True),
     [{"E": 2, "I": 96, "H": 80}, {"E": 1, "I": 256, "H": 256}]),
    ("flashinfer_cutlass_nvfp4", {"activation": "relu2"}, lambda t, p: recipes.cutlass_nvfp4_padded(t, BSI, False),
     [{"E": 2, "I": 96, "H": 80}, {"E": 1, "I": 208, "H": 64}]),
    ("flashinfer_cutlass_nvfp4", {"activation": "silu", "pad_to": 64},
     lambda t, p: recipes.cutlass_nvfp4_padded(t, BSI, True, 64), [{"E": 2, "I": 96, "H": 80}]),
    ("flashinfer_trtllm_fp8_block", {}, lambda t, p: recipes.trtllm_fp8_block_scale(t),
     [{"E": 2, "I": 128, "H": 256}, {"E": 1, "I": 384, "H": 128}]),
    ("flashinfer_trtllm_bf16", {"activation": "silu"}, lambda t, p: recipes.trtllm_bf16(t, gated=True),
     [{"E": 2, "I": 128, "H": 128}, {"E": 1, "I": 192, "H": 320}]),
    ("flashinfer_trtllm_bf16", {"activation": "relu2"}, lambda t, p: recipes.trtllm_bf16(t, gated=False),
     [{"E": 2, "I": 128, "H": 128}, {"E": 1, "I": 192, "H": 320}]),
]
IDS = [f"{n}-{'-'.join(map(str, p.values()))}" for n, p, _, _ in CASES]




@pytest.mark.flashinfer  # the recipes call FlashInfer's own helpers
@pytest.mark.parametrize("name,params,recipe,shapes", CASES, ids=IDS)
def test_spec_equals_the_engines_recipe(name, params, recipe, shapes):
    s = spec(name, **params)
    for dims in shapes:
        x = synthetic_inputs(s, dims, seed=sum(dims.values()))
        before = {k: v.clone() for k, v in x.items()}
        assert_same_bits(s.convert(x), recipe(x, params), f"{name} {params} {dims}")
        assert_same_bits(x, before, "inputs untouched")


@pytest.mark.parametrize("name,params,recipe,shapes", CASES, ids=IDS)
def test_inverse_gives_the_checkpoint_back(name, params, recipe, shapes):
    s = spec(name, **params)
    assert s.invertible
    x = synthetic_inputs(s, shapes[0], seed=5)
    # padded layouts: I and H appear only rounded up in the outputs, so the caller names them
    assert_same_bits(s.inverse(s.convert(x), dims=shapes[0]), x, f"{name}: inverse(convert(x))")


#: The engines' padding on the TRT-LLM paths (see each spec's header for the vLLM functions), with
#: sizes that get padded: (spec, params, recipe, dims, padded output shapes).
PADDED = [
    # NVFP4: H to 256 (384 -> 512, 640 -> 768), I per half to 64 gated / 128 non-gated
    ("flashinfer_trtllm_nvfp4", {"activation": "silu"}, lambda t: recipes.trtllm_nvfp4(t, BSI, True),
     {"E": 2, "I": 96, "H": 384}, {"w13_weight": (2, 256, 256), "w2_weight_scale": (2, 512, 8)}),
    ("flashinfer_trtllm_nvfp4", {"activation": "silu"}, lambda t: recipes.trtllm_nvfp4(t, BSI, True),
     {"E": 1, "I": 128, "H": 640}, {"w13_weight": (1, 256, 384), "w2_weight": (1, 768, 64)}),
    ("flashinfer_trtllm_nvfp4", {"activation": "relu2"}, lambda t: recipes.trtllm_nvfp4(t, BSI, False),
     {"E": 1, "I": 192, "H": 384}, {"w13_weight": (1, 256, 256), "w2_weight": (1, 512, 128)}),
    # ... an engine that rounds H to 512 instead
    ("flashinfer_trtllm_nvfp4", {"activation": "silu", "pad_hidden": 512},
     lambda t: recipes.trtllm_nvfp4(t, BSI, True, hidden_alignment=512),
     {"E": 1, "I": 128, "H": 640}, {"w13_weight": (1, 256, 512), "w2_weight": (1, 1024, 64)}),
    # BF16: I per half to 128 (192 -> 256, 320 -> 384), or to 256 with pad_to=256
    ("flashinfer_trtllm_bf16", {"activation": "silu"}, lambda t: recipes.trtllm_bf16(t, True),
     {"E": 2, "I": 192, "H": 128}, {"w13_weight": (2, 2, 512, 64), "w2_weight": (2, 4, 128, 64)}),
    ("flashinfer_trtllm_bf16", {"activation": "relu2"}, lambda t: recipes.trtllm_bf16(t, False),
     {"E": 1, "I": 320, "H": 64}, {"w13_weight": (1, 1, 384, 64), "w2_weight": (1, 6, 64, 64)}),
    ("flashinfer_trtllm_bf16", {"activation": "silu", "pad_to": 256}, lambda t: recipes.trtllm_bf16(t, True, 256),
     {"E": 1, "I": 320, "H": 64}, {"w13_weight": (1, 1, 1024, 64), "w2_weight": (1, 8, 64, 64)}),
    # MXFP4 (gpt-oss): I and H to 256 (384 -> 512), zero gate/up pairs after the interleaved rows
    ("flashinfer_trtllm_mxfp4", {}, lambda t: recipes.trtllm_mxfp4_gpt_oss(t, BSI),
     {"E": 1, "I": 384, "H": 384}, {"w13_weight": (1, 1024, 256), "w13_bias": (1, 1024), "w2_bias": (1, 512)}),
    ("flashinfer_trtllm_mxfp4", {"pad_to": 128}, lambda t: recipes.trtllm_mxfp4_gpt_oss(t, BSI, pad_to=128),
     {"E": 1, "I": 384, "H": 384}, {"w13_weight": (1, 768, 256), "w2_weight_scale": (1, 512, 12)}),
]


@pytest.mark.flashinfer  # the recipes call FlashInfer's own helpers
@pytest.mark.parametrize("name,params,recipe,dims,shapes", PADDED,
                         ids=[f"{n}-{'-'.join(map(str, p.values()))}-{d}" for n, p, _, d, _ in PADDED])
def test_padded_trtllm_paths_equal_the_engines_recipe(name, params, recipe, dims, shapes):
    s = spec(name, **params)
    x = synthetic_inputs(s, dims, seed=7)
    out = s.convert(x)
    for k, shape in shapes.items():
        assert tuple(out[k].shape) == shape, f"{k}: {tuple(out[k].shape)} is not the padded {shape}"
    assert_same_bits(out, recipe(x), f"{name} {params} {dims}")
    # the padding is zeros the caller can crop: the inverse gives the checkpoint back
    assert_same_bits(s.inverse(out, dims=dims), x, f"{name}: inverse(convert(x))")


def test_every_shipped_spec_is_in_the_registry_and_verifies():
    from layoutc.registry import DEFAULT

    DEFAULT.check(DEFAULT.backends)
    assert {DEFAULT.spec(b).name for b in DEFAULT.backends} == {p.stem for p in SPECS.glob("*.lyt")}


# -- what the verifier says about the mistakes these recipes invite --


def _errors(name: str, old: str, new: str, **params) -> list[str]:
    text = (SPECS / f"{name}.lyt").read_text()
    assert old in text, f"{name} no longer contains {old!r}: update this test"
    try:
        layoutc.compile_source(text.replace(old, new), f"{name}-mutant.lyt", params)
    except layoutc.SpecError as err:
        return [d.message + " | " + (d.hint or "") for d in err.errors]
    return []


def test_gpt_oss_rows_swapped_as_halves_are_rejected():
    errors = _errors("flashinfer_trtllm_mxfp4", "swap_pairs([w13_weight", "swap_halves([w13_weight")
    assert any("interleave(w3, w1)" in e and "interleaved (gpt-oss)" in e for e in errors), errors


def test_trtllm_scales_not_shuffled_with_their_weight_are_rejected():
    errors = _errors("flashinfer_trtllm_nvfp4", "interleave([w13_weight, w13_weight_scale, ",
                     "interleave([w13_weight, ")
    assert any("w13_weight_scale: the output declares packing trtllm but no trtllm packing is applied" in e
               for e in errors), errors


def test_padding_gated_w13_at_the_end_is_rejected():
    # vLLM issue 55649's mistake: pad the whole w13 at its end instead of each half.
    errors = _errors("flashinfer_cutlass_nvfp4",
                     "pad([w13_weight, w13_weight_scale], dim=1, multiple=pad_to, parts=2)",
                     "pad([w13_weight, w13_weight_scale], dim=1, multiple=2*pad_to)")
    assert any("padded per half" in e for e in errors), errors


def test_fp8_block_scales_left_unswapped_are_rejected():
    errors = _errors("flashinfer_trtllm_fp8_block", "swap_halves([w13_weight, w13_weight_scale], dim=1)",
                     "swap_halves(w13_weight, dim=1)")
    assert any("w13_weight and w13_weight_scale rows are permuted differently" in e for e in errors), errors


def test_fp8_weight_rows_that_split_scale_blocks_are_rejected():
    # the gated-GEMM row reorder interleaves gate and up rows: no 128-row scale block survives it
    errors = _errors("flashinfer_trtllm_fp8_block", "interleave([w13_weight, w2_weight], trtllm",
                     "reorder_gated_rows(w13_weight, dim=1)\ninterleave([w13_weight, w2_weight], trtllm")
    assert any("each row of w13_weight_scale scales 128 rows of w13_weight" in e and "split those blocks" in e
               for e in errors), errors


def test_fp8_swap_needs_whole_blocks_and_says_why():
    s = spec("flashinfer_trtllm_fp8_block")
    x = synthetic_inputs(s, {"E": 1, "I": 192, "H": 128}, seed=0)  # I % 128 != 0: halves of 1.5 blocks
    # the first statement that splits the halves says it (the TP shard, even as one rank of one)
    with pytest.raises(layoutc.LayoutError, match="scales 128 rows of w13_weight, so (shard|swap_halves) keeps the "
                                                  "scale blocks whole only when this holds"):
        s.convert(x)


def test_block_scale_tie_must_match_the_weight_shape():
    text = (SPECS / "flashinfer_trtllm_fp8_block.lyt").read_text()
    for old, new in [("f32[E, 2*I/128, H/128]", "f32[E, 2*I/64, H/128]"),
                     ("f32[E, 2*I/tp_size/128, H/128]", "f32[E, 2*I/tp_size/64, H/128]")]:
        assert old in text, f"the fp8 spec no longer contains {old!r}: update this test"
        text = text.replace(old, new)
    try:
        layoutc.compile_source(text, "fp8-mutant.lyt", {})
        errors = []
    except layoutc.SpecError as err:
        errors = [d.message for d in err.errors]
    assert any("rows of 128-row scale blocks" in e for e in errors), errors
