"""Converter outputs are a pure function of the spec and the inputs: the sha256 of every output
of every shipped spec, for fixed inputs, through each CPU lowering, equals the digest recorded
from the code before a refactor (tests/goldens/output_digests.json). A change to how kernels are
written (names for index terms, one body per walk) must not change a byte they produce.

Record (only when a change of output is intended and reviewed):
``TRITON_INTERPRET=1 python -m tests.lower.test_output_digests --record``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: run Triton on CPU tensors

import pytest  # noqa: E402

import layoutc  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from tests.helpers import GOLDENS, SPECS, bits  # noqa: E402

DIGESTS = GOLDENS / "output_digests.json"
# The nine FlashInfer specs as the fused-lowering tests size them (dims that take the fast paths: quads,
# coarse, row words); their digests were recorded from 085a3f9, before the kernel refactor.
from tests.lower.test_fused import CASES  # noqa: E402
# Specs added after the refactor, each recorded from the commit that shipped it.
LATER = [("vllm_cutlass_w4a8", {}, {"E": 2, "I": 256, "H": 512})]
LOWERINGS = ("eager", "gather", "fused")


def _key(name: str, params: dict, dims: dict, inputs: str, lowering: str) -> str:
    p = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
    d = ",".join(f"{k}={v}" for k, v in sorted(dims.items()))
    return f"{name}[{p}]({d}) {inputs} {lowering}"


@functools.cache
def _spec(name: str, params: tuple):
    return layoutc.compile_file(SPECS / f"{name}.lyt", dict(params))


def _inputs(spec, dims: dict, which: str) -> dict:
    x = synthetic_inputs(spec, dims, seed=7)
    if which == "required":  # the variant without the optional tensors: other plans
        for name in spec.compiled.program.optional_inputs:
            x.pop(name, None)
    return x


def _digest(out: dict) -> dict:
    return {k: f"{v.dtype} {tuple(v.shape)} " + hashlib.sha256(bits(v).contiguous().numpy().tobytes()).hexdigest()
            for k, v in sorted(out.items())}


def _run(name, params, dims, which, lowering) -> dict:
    spec = _spec(name, tuple(sorted(params.items())))
    return _digest(spec.convert(_inputs(spec, dims, which), lowering=lowering))


def _all_cases():
    for name, params, dims in CASES + LATER:
        for which in ("all", "required"):
            for lowering in LOWERINGS:
                yield name, params, dims, which, lowering


def record() -> None:
    out = {_key(*c): _run(*c) for c in _all_cases()}
    DIGESTS.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("name,params,dims,which,lowering",
                         [pytest.param(*c, marks=[pytest.mark.slow] if c[-1] == "fused" else [], id=_key(*c))
                          for c in _all_cases()])
def test_outputs_equal_the_recorded_digests(name, params, dims, which, lowering):
    want = json.loads(DIGESTS.read_text())[_key(name, params, dims, which, lowering)]
    assert _run(name, params, dims, which, lowering) == want


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    record()
