"""``layoutc equiv`` from the command line: the three deliberately wrong recipes (tests/equiv/wrong_recipes.py)
are found, with coordinates and the spec line, exit status 1; the shipped recipe is equivalent; the errors a
user causes are messages with exit status 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from layoutc.cli.main import main
from tests.helpers import SPECS

pytestmark = pytest.mark.flashinfer  # FlashInfer's own functions: the slow tier (make test-slow)
pytest.importorskip("flashinfer")


def run(*args: str):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.output


def line_of(spec: Path, text: str) -> int:
    lines = spec.read_text().splitlines()
    hits = [i for i, line in enumerate(lines, 1) if text in line]
    assert len(hits) == 1, f"{spec.name}: {text!r} on lines {hits}: update this test"
    return hits[0]


BF16 = SPECS / "flashinfer_cutlass_bf16.lyt"
NVFP4 = SPECS / "flashinfer_cutlass_nvfp4.lyt"


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_the_reference_recipe_is_equivalent():
    code, out = run("equiv", BF16, "--against", "layoutc.reference.cpu:flashinfer_cutlass_bf16",
                    "--dims", "E=2,I=128,H=256", "--variants", "full")
    assert code == 0, out
    assert "equivalent at 4 shapes" in out


def test_scales_not_swapped():
    swap = line_of(BF16, "swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)")
    code, out = run("equiv", BF16, "--against", "tests.equiv.wrong_recipes:scales_not_swapped",
                    "--dims", "E=2,I=128,H=256")
    assert code == 1, out
    assert "w13_weight_scale: 4096 of 4096 elements differ" in out
    assert f"finding 1: as if line {swap} were not applied to w13_weight_scale" in out
    assert f"[{BF16}:{swap}]" in out, out
    # the first differing element: the spec reads the up half (row I + 0), the function the gate half
    assert "w13_weight_scale[0, 0, 0, 0, 0]: spec reads w13_weight_scale[0, 128, 0] (moved by line " \
           f"{swap} swap_halves, line " in out
    assert "function read w13_weight_scale[0, 0, 0]" in out
    assert "[0, -128, 0] at 2048, [0, +128, 0] at 2048" in out  # the two halves, one finding
    assert out.count("finding ") == 1
    assert "NOT equivalent" in out


def test_padding_at_the_end_instead_of_per_half():
    pad = line_of(NVFP4, "pad([w13_weight, w13_weight_scale], dim=1, multiple=pad_to, parts=2)")
    code, out = run("equiv", NVFP4, "--against", "tests.equiv.wrong_recipes:padded_at_the_end",
                    "--dims", "E=2,I=96,H=128")
    assert code == 1, out
    for tensor in ("w13_weight", "w13_weight_scale"):
        assert f"finding 1: as if line {pad} were `pad([w13_weight, w13_weight_scale], dim=1, multiple=pad_to, " \
               f"parts=2)` with parts=1 instead of parts=2 for {tensor}" in out
    # row 96 of the output is the first padding row of the first half; the function put the gate there
    assert f"w13_weight[0, 96, 0]: spec reads constant 0 (padding) (made padding by line {pad} pad)" in out
    assert "function read w13_weight[0, 0, 0]" in out


def test_sm90_fold_with_the_wrong_k_block():
    fold = line_of(BF16, "interleave(w13_weight, sm90_mixed); interleave(w13_weight_scale, sm90_mixed)")
    code, out = run("equiv", BF16, "--against", "tests.equiv.wrong_recipes:sm90_fold_wrong_k_block",
                    "--dims", "E=2,I=128,H=256")
    assert code == 1, out
    assert "w13_weight_scale: 3072 of 4096 elements differ" in out
    assert f"spec statement: line {fold} `interleave(w13_weight_scale, sm90_mixed)`" in out
    assert "w13_weight_scale[0, 0, 0, 0, 1]: spec reads w13_weight_scale[0, 128, 1]" in out
    assert "function read w13_weight_scale[0, 128, 2]" in out


def test_draw_writes_a_picture(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "diff.png"
    code, text = run("equiv", BF16, "--against", "tests.equiv.wrong_recipes:scales_not_swapped",
                     "--dims", "E=1,I=128,H=128", "--draw", out)
    assert code == 1 and out.stat().st_size > 1000


@pytest.mark.parametrize("args,message", [
    (("--against", "no_such_module_xyz:convert"), "cannot import no_such_module_xyz"),
    (("--against", "tests.equiv.fns:nope"), "tests.equiv.fns has no 'nope'"),
    (("--against", "convert"), "expected MODULE:FUNCTION"),
    (("--against", "tests.equiv.fns:raises"), "raised ValueError: unsupported layout"),
    (("--against", "tests.equiv.fns:returns_text"), "it must return a dict of tensors"),
    (("--against", "tests.equiv.fns:good", "--dims", "E=2"), "--dims must give I, H"),
    (("--against", "tests.equiv.fns:good", "--dims", "E=2,I=32,H=48"), "do not fit the spec"),
    (("--against", "tests.equiv.fns:good", "--args", "w13_weight,bogus"), "--args names bogus"),
])
def test_user_errors_exit_2_with_a_message(args, message):
    code, out = run("equiv", Path(__file__).parent / "tiny.lyt", *args)
    assert code == 2, out
    assert message in out and "Traceback" not in out


@pytest.mark.slow  # over 5 s on the 2-core machine: `make test-slow`
def test_the_installed_command_exits_1_on_a_wrong_recipe(run_cli):
    proc = run_cli("equiv", "tests/equiv/tiny.lyt", "--against", "tests.equiv.fns:shifted_block",
                   "--dims", "E=2,I=32,H=64", "-q")
    assert proc.returncode == 1, proc.stderr
    assert "function read w13_weight_scale[0, 40, 0]" in proc.stdout
    proc = run_cli("equiv", "tests/equiv/tiny.lyt", "--against", "tests/equiv/fns.py:raises")
    assert proc.returncode == 2 and "raised ValueError" in proc.stderr and "Traceback" not in proc.stderr


def test_parameters_reach_the_spec_and_the_function():
    """-D activation=relu2: the spec's non-gated branch, and the recipe's (it reads params)."""
    nvfp4 = SPECS / "flashinfer_trtllm_nvfp4.lyt"
    code, out = run("equiv", nvfp4, "--against", "layoutc.reference.cpu:flashinfer_trtllm_nvfp4",
                    "--dims", "E=2,I=128,H=128", "-D", "activation=relu2")
    assert code == 0 and "equivalent at 4 shapes" in out, out
    # a recipe that is not the spec's (the tiny swap, which ignores params) against the non-gated branch: a
    # valid -D value, so the difference is found by comparing (exit 1, a shape), not by the spec's choices
    code, out = run("equiv", nvfp4, "--against", "tests.equiv.fns:good", "--dims", "E=2,I=128,H=128",
                    "-D", "activation=relu2")
    assert code == 1, out
    assert "w13_weight: the function returns shape [2, 128, 64], the spec [2, 128, 128]" in out, out


def test_a_function_error_in_the_report_is_escaped():
    """The function's exception text reaches the report (a later shape failed); its control characters
    are shown escaped, not sent to the terminal."""
    code, out = run("equiv", Path(__file__).parent / "tiny.lyt", "--against", "tests.equiv.fns:raises_when_large",
                    "--dims", "E=2,I=32,H=64")
    assert code == 1, out
    assert "raised ValueError: too large\\x07\\x08" in out, out
    # (not an ANSI escape: click itself strips those from output that is not a terminal)
    assert "\x07" not in out and "\x08" not in out
