"""``view`` relabels bits, ``cast`` converts values: two different operations.

Both have the identity index map; what differs is what happens to each element:

=========  =====================================  =======================================
op         element                                 when to use
=========  =====================================  =======================================
view(t)    same bits, new type (same width)        E8M0 scale bytes handed over as e4m3
cast(t)    nearest value in the new type           fp32 biases a kernel wants in bf16
=========  =====================================  =======================================

A ``view`` between types of different width, or a ``cast`` from a type torch has
no value conversion for (packed fp4, E8M0 bytes), is a type error.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..dtypes import ElemType
from ..indexmap import IndexMap, identity
from . import torch_impl
from .base import Category, Inferred, Op, OpTypeError, TensorType


@attrs.frozen
class View(Op):
    to: ElemType = attrs.field(metadata={"kind": "dtype"})

    name: ClassVar[str] = "view"
    category: ClassVar[Category] = Category.VALUE
    summary: ClassVar[str] = "relabel the bits of each element as another type of the same width"

    def infer(self, t: TensorType) -> Inferred:
        if t.elem.bits != self.to.bits:
            raise OpTypeError(
                f"view({t.elem.name} -> {self.to.name}) would change the element width "
                f"from {t.elem.bits} to {self.to.bits} bits; view only relabels bits",
                hint=f"to convert values use cast(..., {self.to.name})",
            )
        return Inferred(attrs.evolve(t, elem=self.to))

    def index_map(self, t: TensorType) -> IndexMap:
        return identity(t.shape)

    def impl(self):
        return torch_impl.view_as, (self.to.torch_dtype,)

    def inverse(self, t):
        return View(t.elem)


@attrs.frozen
class Cast(Op):
    to: ElemType = attrs.field(metadata={"kind": "dtype"})

    name: ClassVar[str] = "cast"
    category: ClassVar[Category] = Category.VALUE
    summary: ClassVar[str] = "convert each element's value to another type"

    def infer(self, t: TensorType) -> Inferred:
        for side in (t.elem, self.to):
            if not side.numeric:
                raise OpTypeError(
                    f"cast({t.elem.name} -> {self.to.name}): {side.name} values have no torch conversion "
                    f"({side.doc})",
                    hint=f"to relabel the bytes use view(..., {self.to.name})",
                )
        return Inferred(attrs.evolve(t, elem=self.to))

    def index_map(self, t: TensorType) -> IndexMap:
        return identity(t.shape)

    def impl(self):
        return torch_impl.cast, (self.to.torch_dtype,)

    def inverse(self, t):
        # Exact on the image of the forward cast when it widens or when the values
        # were representable in the narrower type (e.g. bf16 biases stored as fp32).
        return Cast(t.elem)

    def is_exact(self, t: TensorType) -> bool:
        return self.to.bits >= t.elem.bits and self.to.name not in ("e4m3", "e5m2")


OPS = (View, Cast)
