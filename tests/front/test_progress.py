"""Progress on long work (layoutc/front/progress.py): shown on a terminal, never in a pipe or with --quiet;
a probe's ticks add up to its announced total; bench reports its stages; the compiled lowering's first
call for a shape is announced while it runs (and only the first)."""

from __future__ import annotations

import contextlib
import io
import sys

import pytest
import torch
from click.testing import CliRunner

import layoutc
from layoutc.cli import bench as bench_mod
from layoutc.front import progress
from layoutc.api import CompiledSpec
from layoutc.cli.main import main
from layoutc.equiv.probe import probe, probe_steps
from tests.helpers import spec


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    """Patches sys.stderr when called, in the test's body (pytest's capture resumes after fixtures)."""
    def patch() -> Terminal:
        stream = Terminal()
        monkeypatch.setattr(sys, "stderr", stream)
        return stream

    progress.set_quiet(False)
    yield patch
    progress.set_quiet(False)


def test_off_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not progress.enabled()
    with progress.bar(total=3, desc="work") as b:
        b.update(3)
    assert sys.stderr.getvalue() == ""


def test_on_a_terminal_and_off_with_quiet(terminal):
    stream = terminal()
    with progress.bar(total=3, desc="work") as b:
        b.update(3)
    assert "work" in stream.getvalue()
    stream = terminal()
    progress.set_quiet(True)
    with progress.bar(total=3, desc="work") as b:
        b.update(3)
    with progress.working("compiling"):
        pass
    assert stream.getvalue() == ""


def test_working_shows_the_time_taken(terminal):
    stream = terminal()
    with progress.working("torch.compile", every=0.01):
        pass
    assert "torch.compile: 00:00" in stream.getvalue()


TINY = """\
spec tiny
dims E, N
input w : u8[E, N, 4]
swap_halves(w, dim=1)
output w : u8[E, N, 4]
"""


def test_a_probe_ticks_as_often_as_it_announces():
    compiled = layoutc.compile_source(TINY, "tiny.lyt")
    ticks = []
    assert probe(compiled, tick=lambda: ticks.append(1)) == []
    assert len(ticks) == probe_steps(compiled) > 2


def test_check_probe_in_a_pipe_prints_no_bar_and_quiet_prints_only_problems(tmp_path):
    path = tmp_path / "tiny.lyt"
    path.write_text(TINY)
    result = CliRunner().invoke(main, ["check", "--probe", str(path)])
    assert result.exit_code == 0, result.output
    assert "probed in" in result.stderr and "\r" not in result.output and "%|" not in result.output
    quiet = CliRunner().invoke(main, ["check", "--probe", "-q", str(path)])
    assert quiet.exit_code == 0 and "probing" not in quiet.output and "probed" not in quiet.output, quiet.output


def test_bench_shows_its_stages_on_a_terminal(terminal):
    stream = terminal()
    bench_mod.bench(spec("flashinfer_trtllm_bf16"), {"E": 1, "I": 128, "H": 64}, "cpu", reps=1, anchor=False)
    shown = stream.getvalue()
    assert "bench flashinfer_trtllm_bf16" in shown and "clone" in shown


def test_the_compiled_lowering_announces_its_first_call_per_shape(monkeypatch):
    fresh = CompiledSpec(spec("flashinfer_trtllm_bf16").compiled, ())
    announced = []

    @contextlib.contextmanager
    def working(desc, every=0.5):
        announced.append(desc)
        yield None

    monkeypatch.setattr(progress, "working", working)
    monkeypatch.setattr(fresh.module, "convert", lambda *a: {})  # the call itself is not under test
    x = {"w13_weight": torch.zeros(1, 4, 64), "w2_weight": torch.zeros(1, 64, 2)}
    fresh.convert(x, lowering="compiled")
    fresh.convert(x, lowering="compiled")
    fresh.convert(x, lowering="gather")
    fresh.convert({k: v[:, :, :32] for k, v in x.items()}, lowering="compiled")
    assert len(announced) == 2 and "torch.compile" in announced[0]
