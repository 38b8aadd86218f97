"""Converter edge cases behave the same under every lowering, or raise a LayoutError that says
what to do; the guard catches what it can see cheaply (see layoutc/runtime/guard_rt.py for what it
cannot)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import layoutc
from layoutc.guard import check as guard
from tests.helpers import ROOT, assert_same_bits, bits

os.environ.setdefault("TRITON_INTERPRET", "1")  # the fused lowering runs in Triton's interpreter here

LOWERINGS = ["eager", "gather", "fused"]
DIMS = {"E": 2, "I": 128, "H": 256}


@pytest.fixture(scope="module")
def layer(bf16):
    from layoutc.convert.synthckpt import synthetic_inputs

    return synthetic_inputs(bf16, DIMS, seed=5)


def test_inference_mode_and_requires_grad(bf16, layer):
    want = bf16.convert(layer, lowering="eager")
    with torch.inference_mode():
        inputs = {k: v.clone() for k, v in layer.items()}
        for lowering in LOWERINGS:
            out = bf16.convert(inputs, lowering=lowering)
            for k in want:
                assert_same_bits(out[k], want[k], f"{lowering} {k}")
                assert not out[k].is_inference()  # a plain tensor: the guard can track it
            guard(out, bf16)
    grad = dict(layer)
    grad["w13_bias"] = layer["w13_bias"].clone().requires_grad_()
    for lowering in LOWERINGS:
        out = bf16.convert(grad, lowering=lowering)
        assert all(t.grad_fn is None and not t.requires_grad for t in out.values()), lowering


def test_nan_biases_are_the_same_bits_under_every_lowering(bf16, layer):
    odd = dict(layer)
    b = layer["w13_bias"].clone()
    raw = b.view(torch.int32)
    raw[0, :4] = torch.tensor([0x7FC00000, -1, 0x7F800001, -0x400000], dtype=torch.int32)  # four NaN patterns
    odd["w13_bias"] = b
    outs = {lowering: bf16.convert(odd, lowering=lowering)["w13_bias"] for lowering in LOWERINGS}
    for lowering, out in outs.items():
        assert_same_bits(out, outs["eager"], lowering)
    row = DIMS["I"]  # swap_halves moved input row 0 to row I
    assert [int(v) & 0xFFFF for v in bits(outs["eager"])[0, row:row + 4]] == [0x7FC0] * 4


def test_inputs_at_odd_storage_offsets(bf16, layer):
    odd = {}
    for k, v in layer.items():
        flat = v.reshape(-1)
        buf = torch.empty(flat.numel() + 3, dtype=v.dtype)
        buf[3:] = flat
        odd[k] = buf[3:].view(v.shape)
        assert odd[k].storage_offset() == 3
    want = bf16.convert(layer, lowering="eager")
    for lowering in LOWERINGS:
        got = bf16.convert(odd, lowering=lowering)
        for k in want:
            assert_same_bits(got[k], want[k], f"{lowering} {k}")


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_fused_on_cpu_without_the_interpreter_says_what_to_do(tmp_path):
    code = (
        "import layoutc, torch\n"
        "from layoutc.convert.synthckpt import synthetic_inputs\n"
        "s = layoutc.compile_file('specs/flashinfer_cutlass_bf16.lyt')\n"
        "x = synthetic_inputs(s, {'E': 1, 'I': 128, 'H': 128}, seed=0)\n"
        "try:\n"
        "    s.convert(x, lowering='fused')\n"
        "except layoutc.LayoutError as err:\n"
        "    print('LayoutError:', err)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert "LayoutError: lowering='fused' runs Triton kernels, which need CUDA tensors" in proc.stdout, proc.stderr


def test_guard_sees_a_dropped_bias_a_swapped_storage_and_a_resize(bf16, layer):
    out = bf16.convert(layer)
    guard(out, bf16)
    with pytest.raises(layoutc.LayoutError, match="w13_bias was converted with .* but is None now"):
        guard({**out, "w13_bias": None}, bf16)
    swapped = bf16.convert(layer)
    # other bytes (the guard follows bytes: a swapped storage holding the converted bytes is accepted)
    swapped["w2_bias"].set_(swapped["w2_bias"] + 1)
    with pytest.raises(layoutc.LayoutError, match="w2_bias was not produced by a layoutc converter"):
        guard(swapped, bf16)
    grown = bf16.convert(layer)
    grown["w2_bias"].untyped_storage().resize_(grown["w2_bias"].untyped_storage().nbytes() + 64)
    # resizing moves the bytes into new memory: the guard follows them there (the same bytes: accepted),
    # and a later edit of the new memory is seen
    guard(grown, bf16)
    grown["w2_bias"].add_(1)
    with pytest.raises(layoutc.LayoutError, match="w2_bias was modified in place"):
        guard(grown, bf16)
    edited = bf16.convert(layer)
    edited["w13_weight"][0, 0, 0] += 1
    with pytest.raises(layoutc.LayoutError, match="modified in place"):
        guard(edited, bf16)
