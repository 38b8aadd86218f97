"""The ``layoutc`` command line: exit status 0 when all is well, 2 for spec errors (printed as
``file:line:col: error:`` with the line and a caret), and never a Python traceback.

The subprocess tests run the installed console script, as a user would; the in-process ones
(click's CliRunner) cover more cases cheaply.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from layoutc.cli.main import main
from tests.helpers import FLASHINFER, flashinfer_case

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted(f"specs/{p.name}" for p in (Path(__file__).resolve().parents[2] / "specs").glob("*.lyt"))

PARAMS_SPEC = """\
param gated = true
param n = 2
param act = silu choices [silu, relu2]
dims E
input w : f32[E, 8]
if gated { swap_halves(w) }
if n == 3 { swap_pairs(w) }
if act == relu2 { cast(w, bf16) }
if act == relu2 { output w : bf16[E, 8] } else { output w : f32[E, 8] }
"""

BAD_SPECS = {
    # name: (text, line, column, message fragment)
    "syntax.lyt": ("dims E, I, H\ninput w : f32[E, I, H\noutput w : f32[E, I, H]\n", 3, 1, "unexpected 'output'"),
    "stray.lyt": ("dims E\ninput w : f32[E] $\n", 2, 18, "unexpected character '$'"),
    "eof.lyt": ("dims E\ninput w : f32[E,", 2, 16, "unexpected end of file"),
    "unknown_op.lyt": ("dims E\ninput w : f32[E, 4]\nswap_halfs(w)\noutput w : f32[E, 4]\n", 3, 1,
                       "unknown operation 'swap_halfs'"),
    "unknown_tensor.lyt": ("dims E\ninput w : f32[E, 4]\nswap_halves(v)\noutput w : f32[E, 4]\n", 3, 13,
                           "unknown tensor 'v'"),
    "type.lyt": ("dims E\ninput w : f32[E, 4]\ncast(w, fp4x2)\noutput w : fp4x2[E, 4]\n", 3, 1,
                 "w: cast(f32 -> fp4x2): fp4x2 values have no torch conversion"),
    "missing_cast.lyt": ("dims E\ninput b : f32[E, 4]\noutput b : bf16[E, 4]\n", 3, 1,
                         "b: the transforms produce f32 but the output declares bf16"),
    "version.lyt": ("requires flashinfer < 0.6.16\ndims E\ninput w : f32[E]\noutput w : f32[E]\n", 1, 1,
                    "this layout belongs to flashinfer < 0.6.16"),
}


def _assert_clean(proc_or_result) -> None:
    for stream in (proc_or_result.stdout, proc_or_result.stderr):
        assert "Traceback" not in stream
        assert "internal error" not in stream


def _write_bad_specs(directory: Path) -> list[Path]:
    paths = []
    for name, (text, *_rest) in BAD_SPECS.items():
        path = directory / name
        path.write_text(text)
        paths.append(path)
    return paths


def _assert_caret(stderr: str, filename: str, line: int, column: int, text: str) -> None:
    lines = stderr.splitlines()
    header = f"{filename}:{line}:{column}: error: "
    idx = next((i for i, s in enumerate(lines) if s.startswith(header)), None)
    assert idx is not None, f"no {header!r} in:\n{stderr}"
    assert lines[idx + 1].endswith(f"| {text.splitlines()[line - 1]}")
    caret = lines[idx + 2].split("| ", 1)[1]
    assert caret.startswith(" " * (column - 1) + "^"), lines[idx + 2]


# -- subprocess ---------------------------------------------------------------------------------


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_check_shipped_specs(run_cli):
    proc = run_cli("check", *SPECS)
    assert proc.returncode == 0, proc.stderr
    _assert_clean(proc)
    out = proc.stdout
    assert "specs/flashinfer_cutedsl_nvfp4.lyt: ok (activation=silu): flashinfer_cutedsl_nvfp4" in out
    assert "specs/flashinfer_cutedsl_nvfp4.lyt: ok (activation=relu2): flashinfer_cutedsl_nvfp4" in out
    assert "specs/flashinfer_cutlass_bf16.lyt: ok: flashinfer_cutlass_bf16" in out
    assert "specs/flashinfer_cutlass_mxfp8.lyt: ok: flashinfer_cutlass_mxfp8" in out


def test_check_bad_specs_reports_each_with_a_caret(run_cli, tmp_path):
    paths = _write_bad_specs(tmp_path)
    good = ROOT / "specs" / "flashinfer_cutedsl_nvfp4.lyt"
    proc = run_cli("check", *paths, good, cwd=tmp_path)
    assert proc.returncode == 2
    _assert_clean(proc)
    # `requires flashinfer < X` is an error only where FlashInfer is installed (it says so otherwise)
    bad = {n: v for n, v in BAD_SPECS.items() if FLASHINFER or n != "version.lyt"}
    for name, (text, line, column, fragment) in bad.items():
        path = str(tmp_path / name)
        _assert_caret(proc.stderr, path, line, column, text)
        assert f"{path}:{line}:{column}: error: {fragment}" in proc.stderr
    assert f"{len(bad)} specs failed" in proc.stderr
    assert f"{good}: ok (activation=silu)" in proc.stdout  # the good spec is still checked


def test_bad_defines(run_cli, tmp_path):
    (tmp_path / "params.lyt").write_text(PARAMS_SPEC)
    nvfp4 = ROOT / "specs" / "flashinfer_cutedsl_nvfp4.lyt"
    proc = run_cli("check", "-D", "activation=gelu", nvfp4, "params.lyt", cwd=tmp_path)
    assert proc.returncode == 2
    _assert_clean(proc)
    # a value outside the choices points at the declaration
    assert "parameter 'activation' must be one of ['silu', 'relu2'], got 'gelu'" in proc.stderr
    source = nvfp4.read_text()
    line = next(i for i, s in enumerate(source.splitlines(), 1) if s.startswith("param activation"))
    _assert_caret(proc.stderr, str(nvfp4), line, 1, source)
    # a parameter the spec does not have
    assert "params.lyt: error: unknown parameter 'activation' (set with -D or params=)" in proc.stderr
    assert "2 specs failed" in proc.stderr


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_compile_writes_a_torch_only_module(run_cli, tmp_path):
    out = tmp_path / "X.py"
    proc = run_cli("compile", "specs/flashinfer_cutlass_bf16.lyt", "-o", out)
    assert proc.returncode == 0, proc.stderr
    _assert_clean(proc)
    assert f"wrote {out}" in proc.stderr
    tree = ast.parse(out.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            assert "layoutc" not in ast.unparse(node)
    names = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    names |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"convert", "inverse", "SPEC_NAME", "SPEC_SHA256", "INPUTS", "OUTPUTS", "INVERTIBLE"} <= names


def test_compile_with_typed_defines(run_cli, tmp_path):
    (tmp_path / "params.lyt").write_text(PARAMS_SPEC)
    proc = run_cli("compile", "params.lyt", "-D", "gated=false", "-D", "n=3", "-D", "act=relu2", "-o", "p.py",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _assert_clean(proc)
    spec = importlib.util.spec_from_file_location("params_converter", tmp_path / "p.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.PARAMS == {"act": "relu2", "gated": False, "n": 3}
    assert type(module.PARAMS["gated"]) is bool and type(module.PARAMS["n"]) is int
    w = torch.arange(16.0).reshape(2, 8)
    out = module.convert({"w": w})["w"]
    assert out.dtype == torch.bfloat16  # act == relu2
    assert out[0].tolist() == [1, 0, 3, 2, 5, 4, 7, 6]  # swap_pairs (n == 3), no swap_halves (gated false)


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_demo(run_cli):
    proc = run_cli("demo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_clean(proc)
    assert "result: OK" in proc.stdout
    assert "inverse(convert(x)) == x bit for bit: yes" in proc.stdout
    assert "inputs left unmodified: yes" in proc.stdout


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_demo_with_a_shape_the_spec_rejects(run_cli):
    proc = run_cli("demo", "specs/flashinfer_cutlass_mxfp8.lyt", "--shape", "E=2,I=64,H=256")
    assert proc.returncode not in (0, 3)
    _assert_clean(proc)
    assert "I % 128 == 0" in proc.stdout + proc.stderr


# -- in process (click's runner) -------------------------------------------------------------------


@pytest.fixture
def runner():
    return CliRunner()


@pytest.mark.parametrize("name", [flashinfer_case(n, n == "version.lyt") for n in sorted(BAD_SPECS)])
@pytest.mark.parametrize("command", ["check", "compile"])
def test_every_bad_spec_exits_2_in_process(runner, tmp_path, name, command):
    text, line, column, fragment = BAD_SPECS[name]
    path = tmp_path / name
    path.write_text(text)
    args = [command, str(path)] + (["-o", str(tmp_path / "out.py")] if command == "compile" else [])
    result = runner.invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    _assert_clean(result)
    _assert_caret(result.stderr, str(path), line, column, text)
    assert fragment in result.stderr
    assert not (tmp_path / "out.py").exists()


def test_check_missing_file(runner, tmp_path):
    result = runner.invoke(main, ["check", str(tmp_path / "nope.lyt")])
    assert result.exit_code == 2
    assert "nope.lyt: error: no such file" in result.stderr


def test_compile_to_stdout(runner):
    result = runner.invoke(main, ["compile", str(ROOT / "specs" / "flashinfer_cutedsl_nvfp4.lyt"),
                                  "-D", "activation=relu2"])
    assert result.exit_code == 0, result.stderr
    assert "SPEC_NAME = 'flashinfer_cutedsl_nvfp4'" in result.stdout
    assert "PARAMS = {'activation': 'relu2', 'tp_rank': 0, 'tp_size': 1}" in result.stdout
    compile(result.stdout, "stdout.py", "exec")


def test_demo_other_spec_and_parameters(runner):
    result = runner.invoke(main, ["demo", str(ROOT / "specs" / "flashinfer_cutedsl_nvfp4.lyt"),
                                  "-D", "activation=relu2", "--shape", "E=2,I=128,H=256"])
    assert result.exit_code == 0, result.output
    assert "result: OK" in result.stdout
    assert "params {'activation': 'relu2', 'tp_rank': 0, 'tp_size': 1}" in result.stdout


def test_demo_bad_shape_option(runner):
    result = runner.invoke(main, ["demo", "--shape", "E=2,I=x"])
    assert result.exit_code == 2
    assert "expected NAME=INT" in result.stderr
    _assert_clean(result)


def test_ops(runner):
    result = runner.invoke(main, ["ops"])
    assert result.exit_code == 0
    for op in ("swap_halves(tensor, dim=1)", "interleave_rows(tensor, dim=1, group=1)", "cast(tensor, to, exp=0)",
               "view(tensor, to)", "interleave(tensor, family", "permute_bits(tensor, table=none, word=none, src=none)",
               "sm90_mixed  ", "packs weight, scale", "trtllm(epilogue_tile=128)", "packs weight, scale, bias"):
        assert op in result.stdout, op


def test_check_with_a_fixed_parameter(runner):
    result = runner.invoke(main, ["check", "-D", "activation=relu2", str(ROOT / "specs/flashinfer_cutedsl_nvfp4.lyt")])
    assert result.exit_code == 0, result.stderr
    _assert_clean(result)
    assert "ok (activation=relu2)" in result.stdout
    assert "activation=silu" not in result.stdout


def test_compile_bad_spec_exits_2_and_writes_nothing(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("bad.lyt").write_text(BAD_SPECS["unknown_op.lyt"][0])
    result = runner.invoke(main, ["compile", "bad.lyt", "-o", "out.py"])
    assert result.exit_code == 2
    _assert_clean(result)
    assert "bad.lyt:3:1: error: unknown operation 'swap_halfs'" in result.stderr
    assert "hint: did you mean 'swap_halves'?" in result.stderr
    assert result.stderr.rstrip().endswith("1 error")
    assert not (tmp_path / "out.py").exists()


def test_malformed_define_is_a_usage_error(runner):
    result = runner.invoke(main, ["check", "-D", "activation", str(ROOT / "specs/flashinfer_cutedsl_nvfp4.lyt")])
    assert result.exit_code == 2
    _assert_clean(result)
    assert "expected NAME=VALUE" in result.stderr
