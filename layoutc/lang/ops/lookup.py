"""``map_bits``: each ``width``-bit field of an element mapped through a table of 2**width entries.

    map_bits(t, width=4, table=[8, 9, 10, 11, 12, 13, 14, 15, 0, 7, 6, 5, 4, 3, 2, 1])

maps every nibble ``u`` of each element to ``table[u]`` (field ``f`` is bits ``[f*width, (f+1)*width)``;
the element's width is a multiple of ``width``). CUTLASS's W4A8 GEMM wants int4 weights re-encoded
this way (``unified_encode_int4b``), which is no bit permutation: the value of a field changes, not
where its bits go, so it is a value op with the identity index map.

Facts it declares: a table that is a permutation of ``0 .. 2**width - 1`` makes the op a bijection
of elements, undone by ``map_bits`` with the inverse table; any other table loses values (two fields
map to one) and has no inverse. The verifier reads these from :meth:`MapBits.inverse` and
:meth:`~layoutc.lang.ops.conversion.MapBits.lossy`, never from the name.
"""

from __future__ import annotations

from typing import Callable, ClassVar

import attrs
import torch

from ...algebra.indexmap import IndexMap, identity
from . import conversion as cv
from .base import Category, Facts, Inferred, Op, OpTypeError, TensorType

#: Widths a table may cover: a 256-entry byte table is the largest a lowering prints as literals.
MAX_WIDTH = 8


def map_bits(x, width, table):
    # Each width-bit field f (bits [f*width, (f+1)*width)) of every element replaced by table[field].
    carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    bits = 8 * x.element_size()
    raw = x.contiguous().view(carrier).to(torch.int64)
    if bits < 64:
        raw = raw & ((1 << bits) - 1)
    lut = torch.tensor(table, dtype=torch.int64, device=x.device)
    mask = (1 << width) - 1
    out = torch.zeros_like(raw)
    for f in range(bits // width):
        out = out | (lut[(raw >> (f * width)) & mask] << (f * width))
    if 8 < bits < 64:
        out = torch.where(out >= 1 << (bits - 1), out - (1 << bits), out)  # back to the signed carrier
    return out.to(carrier).view(x.dtype)


def inverse_table(table: tuple[int, ...]) -> tuple[int, ...] | None:
    """The table that undoes ``table``, or None when ``table`` is no permutation of its indices."""
    if sorted(table) != list(range(len(table))):
        return None
    inv = [0] * len(table)
    for i, v in enumerate(table):
        inv[v] = i
    return tuple(inv)


@attrs.frozen
class MapBits(Op):
    width: int = attrs.field(kw_only=True, metadata={"kind": "int", "min": 1})
    table: tuple[int, ...] = attrs.field(kw_only=True, metadata={"kind": "table"})

    name: ClassVar[str] = "map_bits"
    eager: ClassVar[Callable] = staticmethod(map_bits)
    facts: ClassVar[Facts] = Facts(Category.VALUE)
    summary: ClassVar[str] = "each `width`-bit field of every element through a table: field u -> table[u]"
    notes: ClassVar[str] = ("CUTLASS W4A8's int4 re-encoding (`width=4`, 16 entries); a permutation table "
                            "is undone by its inverse, any other loses values")
    needs: ClassVar[str] = "`width` divides the element's bits; 2**width entries, each < 2**width"

    def __attrs_post_init__(self):
        if not 1 <= self.width <= MAX_WIDTH:
            raise OpTypeError(f"map_bits(width={self.width}): fields of 1 to {MAX_WIDTH} bits")
        if len(self.table) != 1 << self.width:
            raise OpTypeError(f"map_bits(width={self.width}) needs a table of {1 << self.width} entries; this "
                              f"one has {len(self.table)}")
        bad = [v for v in self.table if not 0 <= v < 1 << self.width]
        if bad:
            raise OpTypeError(f"map_bits(width={self.width}): table entry {bad[0]} is not a {self.width}-bit value "
                              f"(0..{(1 << self.width) - 1})")

    def infer(self, t: TensorType) -> Inferred:
        if t.elem.bits % self.width:
            raise OpTypeError(f"map_bits(width={self.width}) splits each element into fields: {t.elem.name} "
                              f"({t.elem.bits} bits) is no whole number of them")
        return Inferred(t)

    def index_map(self, t: TensorType) -> IndexMap:
        return identity(t.shape)

    def impl(self, t: TensorType):
        return self.eager, (self.width, self.table)

    def conversion(self) -> cv.Conversion:
        return cv.MapBits(None, width=self.width, table=self.table)

    @property
    def is_identity(self) -> bool:
        return self.table == tuple(range(1 << self.width))

    def inverse(self, t: TensorType) -> Op | None:
        inv = inverse_table(self.table)
        return None if inv is None else MapBits(width=self.width, table=inv)


OPS = (MapBits,)
