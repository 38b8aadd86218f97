"""Usage errors on the command line (issue 20, item 20): an output never replaces an input (the spec,
a family file it imports, the compared function's module), and bad numbers (a negative dim, zero
repetitions, a torchrun environment that is not numbers) are exit 2 with the reason, not internal errors."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from layoutc.cli.main import main
from tests.helpers import SPECS

BF16 = SPECS / "flashinfer_cutlass_bf16.lyt"


def run(*args, env=None):
    result = CliRunner().invoke(main, [str(a) for a in args], env=env)
    return result.exit_code, result.output


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "a.lyt"
    shutil.copy(BF16, path)
    return path


def test_compile_never_writes_over_its_spec(spec, tmp_path):
    before = spec.read_bytes()
    (tmp_path / "link.lyt").symlink_to(spec)
    for target in (spec, tmp_path / "link.lyt", tmp_path / "sub" / ".." / "a.lyt"):
        code, out = run("compile", spec, "-o", target)
        assert code == 2 and "is an input of this command" in out, out
    assert spec.read_bytes() == before
    code, out = run("compile", spec, "-o", tmp_path / "conv.py")
    assert code == 0 and (tmp_path / "conv.py").read_text().startswith(("#", '"""'))


def test_compile_never_writes_over_an_imported_family(tmp_path):
    (tmp_path / "fam.lyt").write_text("family swap_it {\n  role weight: swap_halves(dim=1)\n}\n")
    spec = tmp_path / "s.lyt"
    spec.write_text('import "fam.lyt"\n' + BF16.read_text())
    before = (tmp_path / "fam.lyt").read_bytes()
    code, out = run("compile", spec, "-o", tmp_path / "fam.lyt")
    assert code == 2 and "fam.lyt is an input of this command" in out, out
    assert (tmp_path / "fam.lyt").read_bytes() == before


def test_draw_never_writes_over_its_spec(tmp_path):
    svg = tmp_path / "a.svg"
    svg.write_text(BF16.read_text())
    code, out = run("draw", svg, "--graph", "-o", svg)
    assert code == 2 and "is an input of this command" in out, out


@pytest.mark.parametrize("shape", ["E=-1", "E=0,I=256,H=512", "E=2,I=-256,H=512", "=3"])
def test_demo_rejects_dims_that_are_not_positive(shape):
    code, out = run("demo", "--shape", shape)
    assert code == 2 and "--shape" in out and "internal error" not in out, out


def test_bench_rejects_zero_repetitions():
    code, out = run("bench", BF16, "--reps", "0")
    assert code == 2 and "--reps" in out and "internal error" not in out, out


@pytest.mark.parametrize("env, message", [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not an integer >= 1"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not an integer >= 1"),
    ({"RANK": "x"}, "RANK='x' is not an integer"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK='-1' is not an integer >= 0"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
])
def test_a_torchrun_environment_that_is_not_numbers_is_a_usage_error(tmp_path, env, message):
    code, out = run("convert", "--spec", BF16, "--in", tmp_path, "--out", tmp_path / "out", env=env)
    assert code == 2 and message in out and "internal error" not in out, out


def test_convert_profile_never_writes_into_the_input(tmp_path):
    (tmp_path / "in").mkdir()
    code, out = run("convert", "--spec", BF16, "--in", tmp_path / "in", "--out", tmp_path / "out",
                    "--profile", tmp_path / "in" / "model.safetensors.index.json")
    assert code == 2 and "inside --in" in out, out


def test_infer_and_equiv_never_write_over_the_functions_module(tmp_path):
    module = tmp_path / "conv.py"
    module.write_text("def f(t):\n    return t\n")
    code, out = run("infer", f"{module}:f", "--dims", "E=2,I=128,H=256", "-o", module)
    assert code == 2 and "is an input of this command" in out, out
    png = tmp_path / "conv.png"
    png.write_text("x")
    code, out = run("equiv", BF16, "--against", f"{png}:f", "--draw", png)
    assert code == 2 and "is an input of this command" in out, out
    assert module.read_text() == "def f(t):\n    return t\n"
