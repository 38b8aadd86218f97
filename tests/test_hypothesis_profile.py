"""The fast suite is deterministic: the Hypothesis profile tests/conftest.py loads draws the same examples
whatever seed a user exports, and keeps no example database (which replayed a failure found once on every
later run of that clone)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import core, given, settings
from hypothesis import strategies as st

from tests.helpers import ROOT

fast_only = pytest.mark.skipif(settings.get_current_profile_name() == "layoutc-explore",
                               reason="checks the fast profile; `make test-slow` explores with fresh seeds")


def _draws(seed: int | None) -> list[int]:
    seen: list[int] = []

    @settings(max_examples=20)
    @given(st.integers(0, 10**9))
    def record(x):
        seen.append(x)

    old = core.global_force_seed
    core.global_force_seed = seed  # what --hypothesis-seed sets
    try:
        record()
    finally:
        core.global_force_seed = old
    return seen


@fast_only
def test_fast_profile_draws_the_same_examples_whatever_the_seed():
    assert _draws(None) == _draws(1) == _draws(987654321)
    assert settings.default.database is None and settings.default.deadline is None


def test_make_test_slow_explores_with_another_profile():
    makefile = (ROOT / "Makefile").read_text()
    slow = next(line for line in makefile.splitlines() if "-m \"slow" in line or "-m 'slow" in line)
    assert "--hypothesis-profile=layoutc-explore" in slow


@pytest.mark.slow
def test_explore_profile_draws_fresh_examples():
    # in a subprocess: loading a profile here would change the settings of the rest of the run
    code = ("import tests.conftest; from hypothesis import settings; settings.load_profile('layoutc-explore');"
            "import tests.test_hypothesis_profile as t; print(t._draws(None) != t._draws(None))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "True", out.stderr
