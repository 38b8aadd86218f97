"""Index maps over bytes, for chains that view their tensor at several element widths.

Marlin's weight repack reads GPTQ's int32 words as bytes, moves the bytes, permutes the bits of
each 32-bit word and views the result as int32 again (``view(t, u8) ... view(t, i32)``). Seen as
bytes (each tensor's last axis times its element's bytes, little-endian as torch's
``Tensor.view``), a view across widths moves nothing, and a map over elements of ``w`` bytes moves
runs of ``w`` bytes: so the whole chain around its one bit permutation is byte maps, which the
words plan (:mod:`layoutc.lower.plan`) takes as it takes a chain of byte tensors.
"""

from __future__ import annotations

from typing import Sequence

from ..algebra import expr as ex
from ..algebra.indexmap import IndexMap, out_vars


def byte_shape(t) -> tuple[ex.Expr, ...] | None:
    """The shape of tensor type ``t`` seen as bytes (the last axis times the element's bytes), or
    None where that is no shape (no last axis, elements not whole bytes)."""
    if not t.shape or t.elem.bits % 8:
        return None
    width = t.elem.bits // 8
    return tuple(t.shape[:-1]) + ((ex.mul(t.shape[-1], width) if width > 1 else t.shape[-1]),)


def byte_map(step) -> IndexMap | None:
    """The map of one chain step over bytes (output byte -> input byte), or None where it has none:
    a bit-level step other than a view across widths, a map of elements that are not whole bytes,
    or a fill other than zero on elements wider than a byte (its bytes would differ)."""
    t, out = step.in_type, step.out_type
    ins, outs = byte_shape(t), byte_shape(out)
    if ins is None or outs is None:
        return None
    if step.op.bit_level:
        if not step.op.keeps_bytes():
            return None
        return IndexMap(ins, outs, out_vars(len(outs)))  # the same bytes in the same order
    m = step.op.index_map(t)
    width = t.elem.bits // 8
    if out.elem.bits != t.elem.bits or m.bit_level:
        return None
    if width == 1:
        return m
    if m.fill != ex.Const(0):
        return None
    last = ex.Var(f"o{m.out_rank - 1}")
    element = {last.name: ex.floordiv(last, width)}  # the output byte's element ...
    src = tuple(ex.substitute(s, element) for s in m.src)
    src = src[:-1] + (ex.add(ex.mul(src[-1], width), ex.mod(last, width)),)  # ... and its byte within it
    return IndexMap(ins, outs, src, ex.substitute(m.valid, element), ex.Const(0))


def byte_maps(steps: Sequence) -> list[IndexMap] | None:
    """:func:`byte_map` of each step, or None if one has none."""
    maps = [byte_map(s) for s in steps]
    return None if any(m is None for m in maps) else maps
