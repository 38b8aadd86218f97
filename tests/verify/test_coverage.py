"""What `check` says it did not check: coverage warnings, `--strict`, and `explain`'s account."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import layoutc
from layoutc.cli.main import main

SPECS = Path(__file__).resolve().parents[2] / "specs"

GOOD = """spec cov
dims E, I, H
input w13_weight       : fp4x2[E, 2*I, H/2]  rows [w1; w3]
input w13_weight_scale : e8m0[E, 2*I, H/32]  scales w13_weight block 32
input w13_bias         : f32[E, 2*I]         bias of w13_weight
swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)
interleave([w13_weight, w13_weight_scale], sm90_mixed)
output w13_weight       : fp4x2[E, 2*I, H/2]                  rows [w3; w1] packing sm90_mixed
output w13_weight_scale : e8m0[E, 2*I/64, H/128, 16, 16]      rows [w3; w1] packing sm90_mixed
output w13_bias         : f32[E, 2*I]                         rows [w3; w1]
"""


def _warnings(text: str) -> list[str]:
    _, diags = layoutc.compile_source(text, "cov.lyt").coverage
    return [f"{d.pos.line}: {d.message}" for d in diags]


def test_a_spec_that_states_everything_has_no_coverage_warning():
    assert _warnings(GOOD) == []


SIMPLE = """spec cov
dims E, I, H
input w13_weight       : bf16[E, 2*I, H]    rows [w1; w3]
input w13_weight_scale : e8m0[E, 2*I, H/32] scales w13_weight block 32
input w13_bias         : f32[E, 2*I]        bias of w13_weight
swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)
output w13_weight       : bf16[E, 2*I, H]    rows [w3; w1]
output w13_weight_scale : e8m0[E, 2*I, H/32] rows [w3; w1]
output w13_bias         : f32[E, 2*I]        rows [w3; w1]
"""


@pytest.mark.parametrize("edits, line, says", [
    # scales with no tie: their sync with the weight is not checked
    ([(" scales w13_weight block 32", " rows [w1; w3]")], 4,
     "w13_weight_scale is shaped like the scales of w13_weight (one per 32 values) but declares no tie"),
    # a bias with no tie
    ([("        bias of w13_weight", ""), ("f32[E, 2*I]        rows [w3; w1]", "f32[E, 2*I]")], 5,
     "is shaped like a bias of w13_weight"),
    # a gate/up op with no row order declared
    ([("    rows [w1; w3]", ""), ("    rows [w3; w1]\noutput w13_weight_scale", "\noutput w13_weight_scale"),
      (" rows [w3; w1]\noutput w13_bias", "\noutput w13_bias"), ("f32[E, 2*I]        rows [w3; w1]", "f32[E, 2*I]")],
     6, "treats its rows as gate and up, but the input declares no row order"),
])
def test_each_unchecked_guarantee_is_a_warning_at_its_line(edits, line, says):
    assert _warnings(SIMPLE) == []
    text = SIMPLE
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    warnings = _warnings(text)
    assert any(w.startswith(f"{line}: ") and says in w for w in warnings), warnings


def test_a_physical_step_outside_a_family_is_a_warning():
    text = SIMPLE.replace("swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)",
                          "swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)\n"
                          "reshape(w13_weight, [E, I, 2*H])").replace(
        "output w13_weight       : bf16[E, 2*I, H]    rows [w3; w1]", "output w13_weight : bf16[E, I, 2*H]")
    assert any(w.startswith("7: ") and "moves data physically outside any packing family" in w
               for w in _warnings(text)), _warnings(text)


def test_an_output_that_declares_nothing_of_a_moved_tensor_is_a_warning():
    text = """spec cov2
dims E, N, K
input w : bf16[E, N, K]
transpose(w, 1, 2)
output w : bf16[E, K, N]
"""
    assert any("declares neither a row order nor a packing" in w for w in _warnings(text))


NVFP4 = """spec cov_nvfp4
dims E, I, H
input w13_weight : fp4x2[E, 2*I, H/2] rows [w1; w3]
input w13_sf     : e4m3[E, 2*I, H/16] rows [w1; w3]
swap_halves([w13_weight, w13_sf], dim=1)
output w13_weight : fp4x2[E, 2*I, H/2] rows [w3; w1]
output w13_sf     : e4m3[E, 2*I, H/16] rows [w3; w1]
"""


def test_untied_e4m3_scales_are_warned_like_e8m0_ones(tmp_path):
    # Scales are recognised by their shape, not their element type: NVFP4's E4M3 scales with no tie
    # are as unchecked as MXFP4's E8M0 ones, so the warning (and --strict's error) names them too.
    assert any(w.startswith("4: ") and "w13_sf is shaped like the scales of w13_weight (one per 16 values)" in w
               for w in _warnings(NVFP4)), _warnings(NVFP4)
    path = tmp_path / "nvfp4.lyt"
    path.write_text(NVFP4)
    strict = CliRunner().invoke(main, ["check", "--strict", str(path)])
    assert strict.exit_code == 2 and "w13_sf is shaped like the scales" in strict.output, strict.output
    # tied, the same scales are checked and nothing is left to warn about
    tied = NVFP4.replace("e4m3[E, 2*I, H/16] rows [w1; w3]", "e4m3[E, 2*I, H/16] scales w13_weight block 16")
    assert _warnings(tied) == []


def test_check_warns_and_strict_fails_with_exit_2(tmp_path):
    path = tmp_path / "untied.lyt"
    path.write_text(SIMPLE.replace(" scales w13_weight block 32", " rows [w1; w3]"))
    runner = CliRunner()
    loose = runner.invoke(main, ["check", str(path)])
    assert loose.exit_code == 0 and "warning" in loose.output and "declares no tie" in loose.output
    strict = runner.invoke(main, ["check", "--strict", str(path)])
    assert strict.exit_code == 2 and "error" in strict.output and "declares no tie" in strict.output
    assert f"{path}:4:" in strict.output and "^" in strict.output


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_every_shipped_spec_passes_strict():
    out = CliRunner().invoke(main, ["check", "--strict", *map(str, sorted(SPECS.glob("*.lyt")))])
    assert out.exit_code == 0, out.output


def test_explain_gives_the_same_account():
    path_text = SIMPLE.replace(" scales w13_weight block 32", " rows [w1; w3]")
    spec = layoutc.compile_source(path_text, "cov.lyt")
    from layoutc.cli.explain import as_text, explain

    r = explain(spec)
    scale = next(t for t in r["tensors"] if t["name"] == "w13_weight_scale")
    assert scale["unchecked"] == ["sync with a weight"]
    weight = next(t for t in r["tensors"] if t["name"] == "w13_weight")
    assert any(p.startswith("row order: the kernel gets [w3; w1]") for p in weight["proved"])
    assert "1 claim not checked" in r["verdict"]
    assert "not checked sync with a weight" in " ".join(as_text(r).split())


def test_an_untied_bias_with_rows_gets_a_hint_to_declare_the_tie():
    text = SIMPLE.replace("        bias of w13_weight", "        rows [w1; w3]")
    with pytest.raises(layoutc.SpecError) as err:
        layoutc.compile_source(text, "cov.lyt")
    hints = [d.hint or "" for d in err.value.errors]
    assert any("w13_bias declares no tie, so its rows are taken to be axis 0" in h and "bias of WEIGHT" in h
               for h in hints), hints
