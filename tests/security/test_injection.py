"""No file name, spec text or -D value can run code: at check, compile, import or convert.

Each case is compiled in a fresh folder (the payloads would create ``PWNED`` there); the written
converter modules are then imported and run in one clean interpreter, which must not create it
either. Rejected inputs must be errors with a location and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import layoutc
from layoutc.cli.main import main
from tests.helpers import ROOT
from tests.security.hostile import BODY, DEFINES, FILE_NAMES, MARKER, SPECS

RUN_CONVERTERS = """
import importlib.util, json, sys, torch
results = {}
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("conv", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    w = torch.arange(2 * 2 * 4, dtype=torch.float32).reshape(2, 4, 2).to(torch.bfloat16)
    x = {name: w for name in mod.INPUTS}
    out = mod.convert(x)
    results[path] = [mod.SPEC_NAME, mod.PARAMS, {k: v.float().tolist() for k, v in out.items()}]
print(json.dumps(results))
"""


def _invoke(args: list[str]) -> tuple[int, str]:
    """The CLI in-process (the payloads would run here too), output captured."""
    from click.testing import CliRunner

    result = CliRunner().invoke(main, args, catch_exceptions=True)
    code = result.exit_code
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    return code, result.output


def _run_converters(paths: list[Path], cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", RUN_CONVERTERS, *map(str, paths)], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_file_names_never_run_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    written = []
    for i, (case, name) in enumerate(FILE_NAMES.items()):
        folder = tmp_path / f"case{i}"
        folder.mkdir()
        path = folder / name
        path.write_text(BODY)
        code, output = _invoke(["check", "--quiet", str(path)])  # the pre-commit hook
        assert code == 0, (case, output)
        out = folder / "converter.py"
        code, output = _invoke(["compile", str(path), "-o", str(out)])
        assert code == 0, (case, output)
        compile(out.read_text(), str(out), "exec")  # it parses: the name could not break out of a literal
        written.append(out)
        name_of = layoutc.compile_file(path).name
        assert name_of.isidentifier(), (case, name_of)
    results = _run_converters(written, tmp_path)
    assert not list(tmp_path.rglob(MARKER)), "a file name ran code"
    for out in written:  # every converter swaps: the file name changed nothing but the name shown
        assert results[str(out)][2]["w"][0] == [[4.0, 5.0], [6.0, 7.0], [0.0, 1.0], [2.0, 3.0]], results[str(out)]


@pytest.mark.parametrize("case", sorted(SPECS))
def test_spec_texts_never_run_code(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text, expected = SPECS[case]
    path = tmp_path / "hostile.lyt"
    path.write_bytes(text.encode("utf-8"))
    code, output = _invoke(["check", str(path)])
    if expected == "ok":
        assert code == 0, output
        out = tmp_path / "conv.py"
        assert _invoke(["compile", str(path), "-o", str(out)])[0] == 0
        _run_converters([out], tmp_path)
    else:
        assert code == 2, output
        assert "Traceback" not in output and "internal error" not in output
        if expected != "error":
            line, column, fragment = expected
            assert f"hostile.lyt:{line}:{column}: error:" in output, output
            assert fragment in output, output
            assert "^" in output  # the caret under the character
            assert "\x1b" not in output and "\x00" not in output and "\u2028" not in output  # shown escaped
    assert not list(tmp_path.rglob(MARKER)), "a spec ran code"


def test_defines_never_run_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "param.lyt"
    path.write_text(BODY)
    written = []
    for i, (case, (define, expected)) in enumerate(DEFINES.items()):
        code, output = _invoke(["check", str(path), "-D", define])
        if expected == "ok":
            assert code == 0, (case, output)
            out = tmp_path / f"conv{i}.py"
            assert _invoke(["compile", str(path), "-D", define, "-o", str(out)])[0] == 0
            written.append((out, define.split("=", 1)[1]))
        else:
            assert code == 2 and expected in output, (case, output)
            assert "Traceback" not in output
    results = _run_converters([w for w, _ in written], tmp_path)
    assert not list(tmp_path.rglob(MARKER)), "a -D value ran code"
    for out, value in written:  # the value arrives as data, exactly
        assert results[str(out)][1] == {"tag": value}


@pytest.mark.slow  # over 5 s on the 2-core machine: `make test-slow`
def test_the_reported_commands_in_a_real_shell(tmp_path):
    # The exact reproductions of the issue, through the installed entry point.
    hostile = tmp_path / FILE_NAMES["triple_quotes"]
    hostile.write_text(BODY)
    exe = [sys.executable, "-m", "layoutc"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    for args in (["check", "--quiet", hostile.name], ["compile", hostile.name, "-o", "c.py"],
                 ["check", hostile.name, "-D", DEFINES["triple_quotes"][0]]):
        proc = subprocess.run(exe + args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
    subprocess.run([sys.executable, "-c", "import c"], cwd=tmp_path, env=env, check=True, timeout=300)
    assert not list(tmp_path.rglob(MARKER))


def test_a_spec_that_is_not_utf8_is_a_located_error(tmp_path):
    path = tmp_path / "latin1.lyt"
    path.write_bytes(BODY.encode() + "# caf\xe9\n".encode("latin-1"))
    for args in (["check", str(path)], ["compile", str(path)], ["explain", str(path)], ["draw", str(path), "--graph",
                                                                                         "-o", str(tmp_path / "g.png")]):
        code, output = _invoke(args)
        assert code == 2, (args, output)
        assert "latin1.lyt:6:6: error: the spec is not UTF-8 text" in output, output
        assert "internal error" not in output
