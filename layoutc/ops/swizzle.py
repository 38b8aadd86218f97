"""The 128x4 block-scale swizzle of NVFP4/MXFP8 scale factors.

FlashInfer ``block_scale_interleave`` (CUDA, module ``fp4_quantization``; also vLLM's
``swizzle_blockscale``) works per leading index on a ``[R, C]`` scale matrix:

1. pad rows to ``R' = round_up(R, 128)`` and columns to ``C' = round_up(C, 4)`` with zeros;
2. view as ``(R'/128, 4, 32, C'/4, 4)`` = (m, r4, r32, kc, c4), row ``128m + 32r4 + r32``,
   column ``4kc + c4``;
3. store in the order ``(m, kc, r32, r4, c4)``.

So one 128x4 tile is 512 contiguous bytes, rows interleaved in four groups of 32.
This op keeps the result as ``[..., R', C']`` (FlashInfer returns it flat; vLLM
reshapes it to the scale's own shape, which is the same thing when nothing is padded).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from .. import expr as ex
from ..indexmap import IndexMap, compose_all, crop_map, pad_map, permute_map, reshape_map
from . import torch_impl
from ..instances import small_instances
from .base import Category, Inferred, Op, OpTypeError, Requirement, TensorType

FAMILY = "sf_128x4"


def _padded(t: TensorType) -> tuple[ex.Expr, ex.Expr]:
    return ex.round_up(t.shape[-2], 128), ex.round_up(t.shape[-1], 4)


def _tile_maps(lead: tuple, prow: ex.Expr, pcol: ex.Expr, forward: bool) -> IndexMap:
    k = len(lead)
    natural = lead + (ex.div(prow, 128), 4, 32, ex.div(pcol, 4), 4)  # m r4 r32 kc c4
    perm = tuple(range(k)) + tuple(k + d for d in (0, 3, 2, 1, 4))  # m kc r32 r4 c4 (self-inverse)
    swizzled = tuple(natural[i] for i in perm)
    src, dst = (natural, swizzled) if forward else (swizzled, natural)
    return compose_all(
        [reshape_map(lead + (prow, pcol), src), permute_map(src, perm), reshape_map(dst, lead + (prow, pcol))]
    )


@attrs.frozen
class Swizzle128x4(Op):
    name: ClassVar[str] = "swizzle_128x4"
    category: ClassVar[Category] = Category.PACKING
    family: ClassVar[str] = FAMILY
    summary: ClassVar[str] = "128x4 block-scale swizzle with zero padding (FlashInfer block_scale_interleave)"

    def infer(self, t: TensorType) -> Inferred:
        if t.rank < 2:
            raise OpTypeError(f"{self.name} swizzles [..., rows, scale columns] matrices; got {t}")
        if t.elem.bits not in (8, 16):
            raise OpTypeError(f"{self.name} handles 1-byte scales (and bf16); got {t.elem.name}")
        prow, pcol = _padded(t)
        return Inferred(attrs.evolve(t, shape=t.shape[:-2] + (prow, pcol)))

    def index_map(self, t: TensorType) -> IndexMap:
        prow, pcol = _padded(t)
        lead = t.shape[:-2]
        pad_rows = pad_map(t.shape, t.rank - 2, prow)
        pad_cols = pad_map(pad_rows.out_shape, t.rank - 1, pcol)
        return compose_all([pad_rows, pad_cols, _tile_maps(lead, prow, pcol, forward=True)])

    def impl(self):
        return torch_impl.swizzle_128x4, ()

    def inverse(self, t):
        return Unswizzle128x4(rows=t.shape[-2], cols=t.shape[-1])


@attrs.frozen
class Unswizzle128x4(Op):
    rows: ex.Expr = attrs.field(metadata={"kind": "expr"})
    cols: ex.Expr = attrs.field(metadata={"kind": "expr"})

    name: ClassVar[str] = "unswizzle_128x4"
    category: ClassVar[Category] = Category.PACKING
    family: ClassVar[str] = FAMILY
    summary: ClassVar[str] = "inverse of swizzle_128x4, cropping the padding back to rows x cols"

    def infer(self, t: TensorType) -> Inferred:
        if t.rank < 2:
            raise OpTypeError(f"{self.name} needs [..., rows, scale columns]; got {t}")
        prow, pcol = t.shape[-2], t.shape[-1]
        for dims in small_instances((prow, pcol, self.rows, self.cols), [(prow, 128), (pcol, 4)]):
            if (ex.evaluate(ex.round_up(self.rows, 128), dims), ex.evaluate(ex.round_up(self.cols, 4), dims)) != (
                    ex.evaluate(prow, dims), ex.evaluate(pcol, dims)):
                at = ", ".join(f"{k}={v}" for k, v in dims.items())
                raise OpTypeError(
                    f"{self.name}(rows={ex.to_str(self.rows)}, cols={ex.to_str(self.cols)}) does not match a swizzled "
                    f"[{ex.to_str(prow)}, {ex.to_str(pcol)}] (its padded size would differ, e.g. with {at})")
        return Inferred(attrs.evolve(t, shape=t.shape[:-2] + (self.rows, self.cols)),
                        (Requirement(prow, 128, "swizzled rows"), Requirement(pcol, 4, "swizzled columns")))

    def index_map(self, t: TensorType) -> IndexMap:
        lead = t.shape[:-2]
        prow, pcol = t.shape[-2], t.shape[-1]
        tiles = _tile_maps(lead, prow, pcol, forward=False)
        crop_rows = crop_map(t.shape, t.rank - 2, self.rows)
        crop_cols = crop_map(crop_rows.out_shape, t.rank - 1, self.cols)
        return compose_all([tiles, crop_rows, crop_cols])

    def impl(self):
        return torch_impl.unswizzle_128x4, (self.rows, self.cols)

    def inverse(self, t):
        return Swizzle128x4()


OPS = (Swizzle128x4, Unswizzle128x4)
