"""Small helpers shared by tests (compiled specs, bit-exact comparison, golden loading)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Mapping

import importlib.util

import pytest
import torch

import layoutc
from layoutc.algebra.dtypes import bit_view

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
GOLDENS = ROOT / "tests" / "goldens"


bits = bit_view  # the tensor's bit patterns as same-width integers (NaN-safe exact comparison)


@functools.cache
def compiled(path: Path, **params) -> layoutc.CompiledSpec:
    """A spec file compiled once per test run for these parameters."""
    return layoutc.compile_file(path, params)


def spec(name: str, **params) -> layoutc.CompiledSpec:
    """A shipped spec by name (``spec("flashinfer_trtllm_bf16", tp_size=2)``), compiled once per run."""
    return compiled(SPECS / f"{name}.lyt", **params)


def assert_same_bits(actual, expected, what: str = "", same_dtype: bool = True) -> None:
    """Bit for bit (NaN-safe): two tensors, or two mappings of names to tensors with the same names.
    ``same_dtype=False`` accepts dtypes of one width (E4M3 scales handed over as uint8)."""
    if isinstance(expected, Mapping):
        assert set(actual) == set(expected), f"{what}: tensors {sorted(actual)} != {sorted(expected)}"
        for k in expected:
            assert_same_bits(actual[k], expected[k], f"{what}: {k}" if what else k, same_dtype)
        return
    if same_dtype:
        assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    else:
        assert actual.element_size() == expected.element_size(), f"{what}: {actual.dtype} vs {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, b = bits(actual.contiguous()), bits(expected.contiguous())
    if not torch.equal(a, b):
        diff = (a != b).nonzero()
        raise AssertionError(f"{what}: {diff.shape[0]} of {a.numel()} elements differ, first at {diff[0].tolist()}")


def load_golden(name: str) -> dict:
    return torch.load(GOLDENS / name)


def expectations(path: Path) -> tuple[list[str], int]:
    """A corpus spec's ``# expect: <fragment>`` lines and its ``# expect-line: <n>``."""
    text = path.read_text()
    expects = re.findall(r"^# expect: (.+)$", text, flags=re.M)
    line = int(re.search(r"^# expect-line: (\d+)$", text, flags=re.M).group(1))
    return expects, line


#: FlashInfer installed (the flashinfer extra: `make test-slow`). Tests that call its functions, or whose
#: outcome depends on its version, are marked ``flashinfer`` and left out of `make test`.
FLASHINFER = importlib.util.find_spec("flashinfer") is not None


def flashinfer_case(value, needs: bool):
    """A parametrize value, marked ``flashinfer`` when its outcome needs FlashInfer installed."""
    return pytest.param(value, marks=pytest.mark.flashinfer) if needs else value


def cpu_flags() -> set[str]:
    """The CPU's features as the Linux kernel lists them (``/proc/cpuinfo``; empty elsewhere): what the kernels of our
    own need, read independently of llvmlite, so a broken look-up there cannot pass as a skip."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line.split() for line in f if line.startswith("flags")), []))
    except OSError:
        return set()
