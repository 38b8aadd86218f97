"""The fingerprint's first product by its Triton kernel (CUDA's form) gives the definition's integers.

Run here by Triton's interpreter on CPU tensors, the same kernel the H200 compiles (checked there by
``test_cuda_fingerprints_are_read_back_from_pinned_host_memory`` against the same reference): every row of
every segment, the last one's padding by the kernel's mask, K cut into parts added atomically.
"""

from __future__ import annotations

import os

# before any kernel is built: run Triton on CPU tensors (the suite's way; on a GPU machine, run the CUDA test of
# test_guard_copies.py in a process of its own to check the compiled kernels)
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from layoutc.runtime import fingerprint as fp  # noqa: E402
from tests.runtime.test_guard_copies import reference  # noqa: E402

pytest.importorskip("triton")


@pytest.fixture
def on_cpu(monkeypatch):
    # the kernels' path for CPU tensors (their own state for this test), few programs (the interpreter runs them
    # one by one)
    monkeypatch.setattr(fp, "_FP_TRITON_STATE", {})
    assert fp._fp_triton() is not None
    monkeypatch.setattr(fp, "_FP_TRITON_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(fp, "_FP_TRITON_PROGRAMS", 4)
    monkeypatch.setattr(fp, "_FP_TRITON_LEAST_PART", 128)


@pytest.mark.parametrize("programs", [1, 4])
def test_the_kernels_fingerprint_is_its_definition(on_cpu, monkeypatch, programs):
    # the shipped 32 KiB rows, a few of them; programs 4: K cut in parts (added atomically)
    monkeypatch.setattr(fp, "_FP_TRITON_PROGRAMS", programs)
    g = torch.Generator().manual_seed(3)
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in (1, 7, 32768 * 2, 32768 * 2 + 5)]
    ts.append(torch.randn(3, 5, generator=g).to(torch.bfloat16))
    ts.append(torch.empty(0))
    assert fp._fp_products_triton([fp._fp_bytes_of(t) for t in ts[:4]], torch.device("cpu")) is not None
    assert fp._fingerprints(ts) == [reference(t) for t in ts]


def test_segments_and_rows_past_the_end_with_small_constants(on_cpu, monkeypatch):
    # 2 GiB segments cannot be tried here: 256-byte rows, 24-row segments, rows per program 64 > a segment's
    # rows (the mask keeps a program's rows past its segment out of the next one's)
    monkeypatch.setattr(fp, "_FP_ROW", 256)
    monkeypatch.setattr(fp, "_FP_SEGMENT_ROWS", 24)
    g = torch.Generator().manual_seed(4)
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in (5, 256 * 24, 256 * 24 + 1,
                                                                                256 * 60 + 9)]
    assert fp._fingerprints(ts) == [reference(t) for t in ts]


def test_without_triton_the_torch_form_runs(on_cpu, monkeypatch):
    monkeypatch.setitem(fp._FP_TRITON_STATE, "kernel", None)
    called = []
    first = fp._fp_products_torch
    monkeypatch.setattr(fp, "_fp_products_torch", lambda xs, d: called.append(1) or first(xs, d))
    t = torch.arange(100, dtype=torch.uint8)
    assert fp._fingerprints([t]) == [reference(t)] and called
