"""Shared fixtures for the layoutc test suite.

* ``spec_text``       -- dedent an inline spec (so tests can indent it like code)
* ``compile_text``    -- compile inline spec text
* ``spec_error``      -- compile inline spec text that must fail; returns the SpecError
* ``synthetic_inputs`` -- a deterministic synthetic layer for a compiled spec
* ``run_cli``         -- run the ``layoutc`` command line in a subprocess
* ``check_points_at`` -- assert a rendered diagnostic shows ``file:line:col``, the line and a caret
* ``bf16``, ``mxfp8``  -- the two shipped CUTLASS MXFP4 specs, compiled once per module
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Mapping

import pytest
from hypothesis import settings

import layoutc
from layoutc.convert.synthckpt import synthetic_inputs as _demo_synthetic_inputs

# Hypothesis profiles. The fast suite (`make test`, and any plain pytest run) is deterministic: each
# property test draws the same examples on every machine and every run, whatever seed a user exported
# (derandomize wins over --hypothesis-seed); no example database replays an old failure found elsewhere,
# and no deadline fails a test because the 2-core machine is busy. `make test-slow` runs the property
# tests again with fresh seeds to keep exploring; what it finds is printed with its @reproduce_failure
# blob, and becomes a plain regression test.
settings.register_profile("layoutc-fast", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("layoutc-explore", derandomize=False, database=None, deadline=5000, print_blob=True)
settings.load_profile("layoutc-fast")  # --hypothesis-profile=layoutc-explore overrides it (pytest_configure)

ROOT = Path(__file__).resolve().parent.parent
SPECS_DIR = ROOT / "specs"

#: Small dims every shipped spec accepts (mxfp8 assumes I, H multiples of 128).
SMALL_DIMS = {"E": 2, "I": 128, "H": 256}


def dedent_spec(text: str) -> str:
    """Inline spec text as written in a test: dedented, leading blank line removed."""
    return textwrap.dedent(text).lstrip("\n")


def layoutc_command() -> list[str]:
    exe = ROOT / ".venv" / "bin" / "layoutc"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "layoutc"]  # pragma: no cover


def points_at(rendered: str, filename: str, line: int, column: int, source_line: str | None = None) -> None:
    """Assert ``rendered`` has ``filename:line:col: error:`` followed by the source line and a caret under ``column``."""
    lines = rendered.splitlines()
    header = f"{filename}:{line}:{column}: "
    idx = next((i for i, text in enumerate(lines) if text.startswith(header)), None)
    assert idx is not None, f"no diagnostic at {header!r} in:\n{rendered}"
    assert idx + 2 < len(lines), f"diagnostic at {header!r} has no source excerpt:\n{rendered}"
    code, caret = lines[idx + 1], lines[idx + 2]
    gutter, sep, text = code.partition(" | ")
    assert sep and gutter.strip() == str(line), f"excerpt line {code!r} is not line {line}:\n{rendered}"
    if source_line is not None:
        assert text == source_line.expandtabs(1), f"excerpt {text!r} != {source_line!r}"
    cgutter, csep, marks = caret.partition(" | ")
    assert csep and cgutter.strip() == "", f"no caret line after {code!r}:\n{rendered}"
    assert marks.startswith(" " * (column - 1) + "^"), f"caret {marks!r} is not under column {column}:\n{rendered}"
    assert set(marks.strip()) == {"^"}, f"caret line {marks!r}"


@pytest.fixture
def spec_text():
    return dedent_spec


@pytest.fixture
def compile_text():
    def _compile(text: str, params: Mapping[str, Any] | None = None, filename: str = "test.lyt", **kw):
        return layoutc.compile_source(dedent_spec(text), filename, params, **kw)

    return _compile


@pytest.fixture
def spec_error():
    def _error(text: str, params: Mapping[str, Any] | None = None, filename: str = "bad.lyt", **kw) -> layoutc.SpecError:
        with pytest.raises(layoutc.SpecError) as info:
            layoutc.compile_source(dedent_spec(text), filename, params, **kw)
        return info.value

    return _error


@pytest.fixture
def check_points_at():
    return points_at


@pytest.fixture
def synthetic_inputs():
    """``make(spec, dims=SMALL_DIMS, seed=0, drop=())``: deterministic input tensors for a compiled spec."""

    def _make(spec, dims: Mapping[str, int] | None = None, seed: int = 0, drop=()):
        dims = dict(SMALL_DIMS if dims is None else dims)
        dims = {k: v for k, v in dims.items() if k in spec.program.dims}
        out = _demo_synthetic_inputs(spec, dims, seed)
        for name in drop:
            out.pop(name, None)
        return out

    return _make


@pytest.fixture
def run_cli():
    def _run(*args: str, cwd: Path | str = ROOT, timeout: float = 120) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT)  # this checkout's layoutc, whatever else the interpreter has installed
        return subprocess.run(
            layoutc_command() + [str(a) for a in args],
            cwd=str(cwd), capture_output=True, text=True, timeout=timeout, env=env,
        )

    return _run


@pytest.fixture(scope="module")
def bf16() -> layoutc.CompiledSpec:
    return layoutc.compile_file(SPECS_DIR / "flashinfer_cutlass_bf16.lyt")


@pytest.fixture(scope="module")
def mxfp8() -> layoutc.CompiledSpec:
    return layoutc.compile_file(SPECS_DIR / "flashinfer_cutlass_mxfp8.lyt")


# Tests measured over the fast suite's per-test budget on the 2-core machine are listed in
# tests/slow_tests.txt (written by `python tools/slow_tests.py` from a timed run) and marked `slow`
# here, so `make test` stays under five minutes and `make test-slow` (CI too) still runs them. A line
# is a test's node id (one parametrized case) or its function (every case); tests/test_makefile.py
# checks that each line names a test that exists.
SLOW_LIST = Path(__file__).resolve().parent / "slow_tests.txt"


def _slow_list() -> set[str]:
    if not SLOW_LIST.exists():
        return set()
    lines = (line.split("#", 1)[0].strip() for line in SLOW_LIST.read_text().splitlines())
    return {line for line in lines if line}


def pytest_collection_modifyitems(config, items):
    listed = _slow_list()
    if not listed:
        return
    for item in items:
        if item.nodeid in listed or item.nodeid.split("[", 1)[0] in listed:
            item.add_marker(pytest.mark.slow)
