"""`input ... : f32[...] accepts bf16`: an engine hands over a narrower type, converted exactly first."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.algebra.dtypes import ELEMENT_TYPES, EXACT_WIDENINGS, bit_view

SPECS = Path(__file__).resolve().parents[2] / "specs"
DIMS = {"E": 2, "I": 128, "H": 128}


@pytest.mark.parametrize("name", ["flashinfer_cutlass_bf16", "flashinfer_trtllm_mxfp4"])
def test_a_bf16_bias_converts_like_the_same_values_in_f32(name):
    spec = layoutc.compile_file(SPECS / f"{name}.lyt")
    f32 = synthetic_inputs(spec, DIMS, seed=3)
    bf16 = dict(f32, w13_bias=f32["w13_bias"].to(torch.bfloat16), w2_bias=f32["w2_bias"].to(torch.bfloat16))
    f32 = dict(f32, w13_bias=bf16["w13_bias"].float(), w2_bias=bf16["w2_bias"].float())  # the same values
    kept = {k: v.clone() for k, v in bf16.items()}
    want, got = spec.convert(f32), spec.convert(bf16)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(bit_view(got[k]), bit_view(want[k])), k
    for k in kept:  # the bf16 inputs are read, not modified
        assert kept[k].dtype == bf16[k].dtype and torch.equal(bit_view(kept[k]), bit_view(bf16[k])), k


def test_the_contract_names_the_accepted_type_in_its_error():
    spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
    x = synthetic_inputs(spec, DIMS, seed=0)
    x["w2_bias"] = x["w2_bias"].half()
    with pytest.raises(layoutc.LayoutError, match=r"w2_bias: expected f32 \(torch.float32 or torch.bfloat16\), "
                                                  r"got torch.float16"):
        spec.convert(x)


def _errors(text: str) -> list[str]:
    with pytest.raises(layoutc.SpecError) as err:
        layoutc.compile_source(text, "accepts.lyt")
    return [f"{d.pos.line}:{d.pos.column}: {d.message} | {d.hint or ''}" for d in err.value.errors]


BASE = """spec accepts_test
dims E, H
input w : bf16[E, H]
input b : {decl}  bias of w
output w : bf16[E, H]
output b : f32[E, H]
"""


@pytest.mark.parametrize("decl, line_col, message", [
    ("f32[E, H] accepts f64", "4:29", "unknown element type 'f64'"),
    ("f32[E, H] accepts i32", "4:29", "b: i32 does not convert exactly to f32 | f32 accepts bf16, e4m3, e5m2, f16"),
    ("f32[E, H] accepts bf16, bf16", "4:35", "b accepts bf16 twice"),
    ("f32[E, H] accepts f32", "4:29", "b accepts f32 twice"),
])
def test_what_an_input_may_accept_is_checked_at_the_line(decl, line_col, message):
    errors = _errors(BASE.format(decl=decl))
    assert any(e.startswith(line_col) and message in e for e in errors), errors


def test_accepts_is_said_of_inputs_only():
    text = BASE.format(decl="f32[E, H]").replace("output b : f32[E, H]", "output b : f32[E, H] accepts bf16")
    assert any("'accepts' is said of inputs" in e for e in _errors(text))


def test_every_listed_widening_is_exact():
    # the table's claim, checked on every value of the narrow type (all bit patterns of 8 and 16 bits)
    for narrow, wide in sorted(EXACT_WIDENINGS):
        n, w = ELEMENT_TYPES[narrow], ELEMENT_TYPES[wide]
        raw = torch.arange(2 ** n.bits, dtype=torch.int32)
        if n.bits == 8:
            vals = raw.to(torch.uint8).view(n.torch_dtype)
        else:
            vals = raw.to(torch.int16).view(n.torch_dtype) if n.bits == 16 else raw
        back = vals.to(w.torch_dtype).to(n.torch_dtype)
        same = (back.view(torch.uint8 if n.bits == 8 else torch.int16) ==
                vals.view(torch.uint8 if n.bits == 8 else torch.int16))
        if vals.is_floating_point():
            same |= torch.isnan(vals.float())  # NaN payloads need not survive; NaN stays NaN
        assert bool(same.all()), (narrow, wide)
