"""equiv and infer against functions that do not return usable tensors (issue 20, items 16-17):
``sys.exit(0)`` in the function or at its module's import, a hang, meta tensors, a 1 TiB expanded view,
a tensor subclass, a Mapping that raises. Each is a clear failure (EquivError; exit 2 on the command
line), never "equivalent" and never an internal error."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from layoutc.equiv.compare import EquivError, equivalent
from layoutc.equiv.infer import infer
from tests.helpers import ROOT

TINY = Path(__file__).parent / "tiny.lyt"
DIMS = {"E": 2, "I": 32, "H": 64}
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}


def swap(t):
    """The tiny spec's conversion, for what the hostile functions return around it."""
    out = {}
    for k, v in t.items():
        if v is None:
            continue
        a, b = v.chunk(2, dim=1)
        out[k] = torch.cat([b, a], dim=1)
    if "w13_bias" in out:
        out["w13_bias"] = out["w13_bias"].to(torch.bfloat16)
    return out


def exits_0(t):
    sys.exit(0)


def raises_system_exit_3(t):
    raise SystemExit(3)


def sleeps(t):
    while True:
        try:
            time.sleep(60)
        except Exception:  # noqa: BLE001 - a function that swallows errors still stops at the limit
            pass


def meta_tensors(t):
    return {k: v.to("meta") for k, v in swap(t).items()}


def huge_view(t):
    out = swap(t)
    out["w13_weight"] = torch.zeros(1, dtype=torch.uint8).expand(1 << 40)  # 1 TiB once made contiguous
    return out


class Sub(torch.Tensor):
    pass


def subclass(t):
    return {k: v.as_subclass(Sub) for k, v in swap(t).items()}


def sparse(t):
    out = swap(t)
    out["w13_bias"] = out["w13_bias"].to_sparse()
    return out


class Exploding(dict):
    def items(self):
        raise RuntimeError("boom")


def exploding_mapping(t):
    return Exploding(swap(t))


def test_the_honest_function_is_equivalent():
    assert equivalent(TINY, swap, DIMS, shapes=1).ok


@pytest.mark.parametrize("fn, message", [
    (exits_0, "called sys.exit(0) instead of returning"),
    (raises_system_exit_3, "called sys.exit(3) instead of returning"),
    (meta_tensors, "as a meta tensor"),
    (huge_view, "1.02e+03 GiB once materialized"),
    (subclass, "as a Sub (a tensor subclass)"),
    (sparse, "return dense (strided) tensors"),
    (exploding_mapping, "returned something equiv cannot read"),
])
def test_unusable_functions_are_errors_never_a_verdict(fn, message):
    with pytest.raises(EquivError) as info:
        equivalent(TINY, fn, DIMS, shapes=1)
    assert message in str(info.value), str(info.value)


def test_a_hang_is_stopped_at_the_time_limit():
    t0 = time.perf_counter()
    with pytest.raises(EquivError, match=r"did not finish within 0.5 s"):
        equivalent(TINY, sleeps, DIMS, shapes=1, timeout=0.5)
    assert time.perf_counter() - t0 < 30


@pytest.mark.parametrize("fn, message", [(exits_0, r"called sys\.exit\(0\)"), (meta_tensors, "as a meta tensor")])
def test_infer_fails_instead_of_exiting(fn, message):
    with pytest.raises(EquivError, match=message):
        infer(fn, DIMS, inputs=_contract(), check=False)


def _contract() -> str:
    return "\n".join(line for line in TINY.read_text().splitlines()
                     if line.startswith(("dims", "input")))


def test_the_command_line_exits_2_on_an_exit_at_import_or_in_the_function(tmp_path):
    (tmp_path / "at_import.py").write_text("import sys\nsys.exit(0)\ndef f(t):\n    return t\n")
    (tmp_path / "in_call.py").write_text(textwrap.dedent("""
        import sys
        def f(t):
            sys.exit(0)
    """))
    for module, message in (("at_import.py", "importing"), ("in_call.py", "in_call.py:f (at E=2")):
        proc = subprocess.run([sys.executable, "-m", "layoutc", "equiv", str(TINY), "--against",
                               f"{tmp_path / module}:f", "--dims", "E=2,I=32,H=64", "--shapes", "1", "-q"],
                              capture_output=True, text=True, env=ENV, timeout=300)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert message in proc.stderr and "sys.exit(0)" in proc.stderr and "equivalent" not in proc.stdout


@pytest.mark.slow  # the watchdog's grace period: over 10 s
def test_a_hang_the_signal_cannot_stop_ends_the_command_with_exit_2(tmp_path):
    (tmp_path / "stubborn.py").write_text(textwrap.dedent("""
        import time
        def f(t):
            while True:
                try:
                    time.sleep(60)
                except BaseException:
                    pass
    """))
    proc = subprocess.run([sys.executable, "-m", "layoutc", "equiv", str(TINY), "--against",
                           f"{tmp_path / 'stubborn.py'}:f", "--dims", "E=2,I=32,H=64", "--shapes", "1", "-q",
                           "--timeout", "1"], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "could not be interrupted" in proc.stderr
