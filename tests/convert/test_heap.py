"""``layoutc convert``'s process keeps freed memory for the next layer (layoutc.convert.heap)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = r"""
import sys, torch
from layoutc.convert import heap
if sys.argv[1] == "keep":
    assert heap.keep_freed_memory()
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
t = torch.ones(256 << 20, dtype=torch.uint8)
before = resident()
del t
print(before - resident())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_stay_in_the_process_only_when_asked():
    def released(mode):
        run = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
        return int(run.stdout.split()[-1])

    try:
        import ctypes

        ctypes.CDLL(None).gnu_get_libc_version  # noqa: B018
    except AttributeError:
        pytest.skip("not glibc")
    assert released("default") > 200 << 20  # its own memory map, unmapped when freed
    assert released("keep") < 16 << 20  # kept in the heap for the next block
