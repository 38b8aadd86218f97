"""``layoutc convert`` makes OpenMP's idle workers sleep (cli.main.passive_openmp), unless the user
chose a policy or torch was already imported (then libgomp has read its environment)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from layoutc.cli.main import passive_openmp
from tests.helpers import ROOT


def test_passive_unless_chosen_or_too_late():
    env: dict = {}
    assert passive_openmp(env, {}) and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert not passive_openmp(env, {}) and env == {"OMP_WAIT_POLICY": "ACTIVE"}
    env = {}
    assert not passive_openmp(env, {"torch": object()}) and env == {}


PROBE = """
import os, sys
from layoutc.cli.main import main
sys.argv = ["layoutc", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print(os.environ.get("OMP_WAIT_POLICY"))
"""


@pytest.mark.slow
def test_the_convert_command_sets_it_before_torch_is_imported():
    def policy(*args: str, **env: str) -> str:
        proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **env}, timeout=300)
        return proc.stdout.strip().splitlines()[-1]

    assert policy("convert", "--help") == "PASSIVE"
    assert policy("convert", "--help", OMP_WAIT_POLICY="active") == "active"
    assert policy("ops") == "None"
