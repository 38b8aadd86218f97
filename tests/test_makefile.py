"""`make run` installs only what the demo needs, `make test` what the fast tests need (no FlashInfer),
`make test-slow` adds FlashInfer; the three stamps keep each install set up to date without redoing the
others (checked with `make -n` in a scratch folder)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _plan(folder, target: str) -> str:
    out = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=folder, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _age(path, seconds_ago: int) -> None:
    t = os.path.getmtime(path) - seconds_ago if path.exists() else 0
    os.utime(path, (t, t))


def test_run_and_test_install_sets(tmp_path):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    _age(tmp_path / "pyproject.toml", 100)

    fresh = _plan(tmp_path, "run")
    assert "-m venv" in fresh and "torch==2.13.0" in fresh and "pip install -q -e ." in fresh
    assert ".[" not in fresh and "flashinfer-python" not in fresh and "pytest" not in fresh  # no extras

    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".layoutc-run").touch()
    after_run = _plan(tmp_path, "run")
    assert "pip" not in after_run and "layoutc demo" in after_run
    test_after_run = _plan(tmp_path, "test")
    assert '-e ".[dev]"' in test_after_run and "flashinfer" not in test_after_run.split("pytest")[0]
    assert "torch" not in test_after_run and "-m venv" not in test_after_run
    assert '-n auto -m "not slow and not flashinfer"' in test_after_run  # every core, FlashInfer's tier left out

    (venv / ".layoutc-test").touch()
    assert "pip" not in _plan(tmp_path, "test") and "pip" not in _plan(tmp_path, "run")
    slow = _plan(tmp_path, "test-slow")
    assert '-e ".[dev,flashinfer]"' in slow and '.[dev]"' not in slow and "torch" not in slow
    assert '-m "slow or hypothesis or flashinfer"' in slow
    (venv / ".layoutc-slow").touch()
    assert "pip" not in _plan(tmp_path, "test-slow") and "pip" not in _plan(tmp_path, "test")

    (tmp_path / "pyproject.toml").touch()  # a changed dependency list reinstalls both sets
    _age(venv / ".layoutc-run", 50)
    _age(venv / ".layoutc-test", 50)
    _age(venv / ".layoutc-slow", 50)
    changed = _plan(tmp_path, "test-slow")
    assert "pip install -q -e ." in changed and '-e ".[dev]"' in changed and '-e ".[dev,flashinfer]"' in changed


def test_the_slow_list_names_tests_that_exist():
    """Every line of tests/slow_tests.txt (marked slow by tests/conftest.py) names a test function that
    exists: a renamed or deleted test would otherwise leave a line that silently matches nothing."""
    from tests.conftest import _slow_list

    for line in sorted(_slow_list()):
        path, *names = line.split("[", 1)[0].split("::")
        assert (ROOT / path).is_file(), f"tests/slow_tests.txt: no file {path}"
        source = (ROOT / path).read_text()
        assert names and f"def {names[-1]}(" in source, f"tests/slow_tests.txt: no test {line}"
