"""Value conversions of a one-byte source in a transposing tile go through a table of the 256 byte values
(lower/bytetable.py), and a layer kernel holding such a block launches with 2 warps.

marlin_nvfp4's FP8 scale tiles converted every element with the whole chain (e4m3 -> f16, times 2**7,
bits 7..14 kept: ~13 SASS instructions per element on SM90) and ran at 39-41% of a device copy alone on
the H200; the table (converted once per program, each element looked up with ``tl.gather``) takes ~3.
The fused kernels run here in Triton's interpreter on every byte value (NaNs, subnormals, both signs)
and equal the eager lowering bit for bit.
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: run Triton on CPU tensors

import pytest  # noqa: E402
import torch  # noqa: E402

import layoutc  # noqa: E402
from layoutc.lower import bytetable, triton_emit  # noqa: E402
from layoutc.lower.plan import plan  # noqa: E402
from tests.helpers import assert_same_bits  # noqa: E402

TRANSPOSED = ("dims E, R, K\ninput w : {src}[E, R, K]\ntranspose(w, 1, 2)\n{conv}"
              "output w : {out}[E, K, R]\n")
# marlin_nvfp4's scale chain on a plain transpose: to f16, times 2**7, bits 7..14 (unsigned E5M3)
SCALES = TRANSPOSED.format(src="e4m3", out="e4m3", conv="cast(w, f16, exp=7)\n"
                            "extract_bits(w, shift=7, width=8, to=e4m3)\n")


@functools.cache
def _spec(text: str):
    spec = layoutc.compile_source(text, "bytes.lyt")
    return spec, plan(spec.compiled.variant(()).chain("w"))


def _every_byte(shape) -> torch.Tensor:
    n = torch.Size(shape).numel()
    b = torch.arange(n) % 256
    return b[torch.randperm(n, generator=torch.Generator().manual_seed(3))].to(torch.uint8).view(shape)


@pytest.mark.parametrize("text", [SCALES, TRANSPOSED.format(src="e4m3", out="f16", conv="cast(w, f16)\n")],
                         ids=["marlin_scales", "widening"])
def test_a_byte_source_with_a_bit_changing_chain_looks_its_values_up(text):
    _, p = _spec(text)
    assert bytetable.looks_up(p) and bytetable.layer_warps([p]) == 2
    body = triton_emit.body(p, "_b", ("E", "R", "K"))
    assert "tl.gather(" in body and "tl.arange(0, 256)" in body
    launch = triton_emit.launcher("_f", "_k", [("w", p)], ("E", "R", "K"))
    assert "_consts, 2)" in launch  # the layer kernel's warps


@pytest.mark.parametrize("text", [SCALES, TRANSPOSED.format(src="e4m3", out="f16", conv="cast(w, f16)\n")],
                         ids=["marlin_scales", "widening"])
@pytest.mark.slow  # the interpreter runs 64x64 tiles with a gather: over a second each
@pytest.mark.parametrize("shape", [(1, 70, 20), (2, 64, 64)])
def test_the_looked_up_tiles_equal_the_eager_lowering_on_every_byte(text, shape):
    spec, _ = _spec(text)
    x = {"w": _every_byte(shape).view(torch.float8_e4m3fn)}
    before = x["w"].clone()
    fused, eager = spec.convert(x, lowering="fused")["w"], spec.convert(x, lowering="eager")["w"]
    assert_same_bits(fused, eager)
    assert torch.equal(x["w"].view(torch.uint8), before.view(torch.uint8))


@pytest.mark.parametrize("text", [
    TRANSPOSED.format(src="e4m3", out="e4m3", conv=""),  # no conversion: bytes moved as they are
    TRANSPOSED.format(src="e8m0", out="e4m3", conv="view(w, e4m3)\n"),  # a relabel keeps every bit
    TRANSPOSED.format(src="bf16", out="f32", conv="cast(w, f32)\n"),  # 65536 source values: no table
], ids=["plain", "relabel", "two_bytes"])
def test_other_tiles_convert_in_place_and_keep_four_warps(text):
    _, p = _spec(text)
    assert p.tile_axis is not None and not bytetable.looks_up(p)
    assert bytetable.layer_warps([p]) == bytetable.NUM_WARPS == 4
    assert "tl.gather(" not in triton_emit.body(p, "_b", ("E", "R", "K"))
    assert "_consts, 4)" in triton_emit.launcher("_f", "_k", [("w", p)], ("E", "R", "K"))
