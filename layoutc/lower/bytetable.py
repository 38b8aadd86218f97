"""Value conversions in a kernel: in place, element by element, or through a table of the 256 byte values.

A transposing tile (``triton_emit._tiles``) of a one-byte source whose conversions change bits converts
each element with the whole chain: marlin_nvfp4's FP8 scales (e4m3 -> f16, times 2**7, bits 7..14 kept)
took ~13 SASS instructions per element on SM90, the tile ran at 39-41% of a device copy alone on the H200
(benchmarks/results/2026-12-02-kspeed/split_after.log). Such a chain is a function of the 256 byte values,
so the program converts each once and looks its elements up (``tl.gather``): ~3 instructions per element.
"""

from __future__ import annotations

from typing import Sequence

from ..lang.ops.conversion import TRITON_DTYPES, UINT, known
from .plan import Affine, Gather, Plan

#: Warps per program of a layer kernel (lanes x elements per lane: triton_emit's block sizes).
NUM_WARPS = 4


def conversions(p: Plan, value: str) -> list[str]:
    """Each value conversion's kernel form, in chain order, on the element type it receives."""
    lines = []
    elem = p.in_elem
    for conv in p.conversions:
        lines += known(conv).kernel(value, elem)
        elem = conv.out_elem(elem)
    return lines


def looks_up(p: Plan) -> bool:
    """Whether the tiles walk of ``p`` converts values through a table of the 256 byte values: the source
    element is one byte and the chain changes bits, so the chain is a function of those 256 values."""
    return (isinstance(p, (Affine, Gather)) and p.tile_axis is not None and p.in_elem.bits == 8
            and bool(p.conversions) and not all(known(c).keeps_bits for c in p.conversions))


def looked_up(p: Plan, value: str, rows: int, cols: int) -> list[str]:
    """The value conversions of a tile as a lookup (``looks_up``): the program converts each of the 256
    byte values once (2 per lane) and looks every element of its tile up in that table (``tl.gather``)
    instead of converting them one by one. marlin_nvfp4's scales (e4m3 -> f16, times 2**7, bits 7..14
    kept) took ~13 instructions per element that way, the lookup ~3 (SASS for SM90); on the H200 its
    w13 scale tiles went from 41 to 56% of a copy alone (benchmarks/results/2026-12-02-nvfp4)."""
    out = p.in_elem
    for conv in p.conversions:
        out = conv.out_elem(out)
    src_t, out_t, out_u = TRITON_DTYPES[p.in_elem.canonical], TRITON_DTYPES[out.canonical], UINT[out.bits]
    return [f"_idx = tl.reshape({value}.to(tl.uint8, bitcast=True), [{rows * cols}]).to(tl.int32)",
            f"{value} = tl.arange(0, 256).to(tl.uint8).to({src_t}, bitcast=True)  # every byte value",
            *conversions(p, value),
            f"{value} = tl.gather({value}.to({out_u}, bitcast=True), _idx, 0)",
            f"{value} = tl.reshape({value}, [{rows}, {cols}]).to({out_t}, bitcast=True)"]


def layer_warps(plans: Sequence[Plan]) -> int:
    """Warps per program of a layer kernel: 2 where a block looks its values up (``looks_up``), else
    NUM_WARPS. Measured, not derived: marlin_nvfp4's gpt-oss-120b layer kernel (the only shipped layer
    with such a block) took 0.970 ms 10 calls back to back at 2 warps against 1.259 at 4 (0.990 at 8),
    H200, benchmarks/kernel_split.py; before the lookup too (1.054 against 1.326 ms). Layers without
    such a block (marlin_mxfp4, trtllm_mxfp4, aiter_mxfp4) gain nothing from 2 or 8 warps and keep 4."""
    return 2 if any(looks_up(p) for p in plans) else NUM_WARPS
