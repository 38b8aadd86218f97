"""Small helpers shared by tests (bit-exact comparison, golden loading)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from layoutc.dtypes import bit_view

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
GOLDENS = ROOT / "tests" / "goldens"


bits = bit_view  # the tensor's bit patterns as same-width integers (NaN-safe exact comparison)


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, b = bits(actual), bits(expected)
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
