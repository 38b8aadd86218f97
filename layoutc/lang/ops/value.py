"""``view`` relabels bits, ``cast`` converts values: two different operations.

Both have the identity index map; what differs is what happens to each element:

=========  =====================================  =======================================
op         element                                 when to use
=========  =====================================  =======================================
view(t)    same bits, new type (same width)        E8M0 scale bytes handed over as e4m3
cast(t)    nearest value in the new type           fp32 biases a kernel wants in bf16
=========  =====================================  =======================================

A ``cast`` from a type torch has no value conversion for (packed fp4, E8M0 bytes) is a type
error. A ``view`` between types of different width relabels the bytes of the last axis
(``u8[.., 4k] -> i32[.., k]``, little-endian, and back): an index map at bit level.

Bit fields: ``extract_bits(t, shift=23, width=8, to=e8m0)`` keeps bits ``[shift, shift+width)`` of
each element as an unsigned integer (an fp32 power of two's exponent is its E8M0 scale byte);
``insert_bits`` places the low ``width`` bits at ``shift`` of a zero element (E8M0 -> fp32).
Each undoes the other on the first's image (where the other bits were zero).
"""

from __future__ import annotations

from typing import Callable, ClassVar

import attrs

from ...algebra import expr as ex
from ...algebra.dtypes import ElemType
from ...algebra.indexmap import IndexMap, identity, out_vars
from . import conversion as cv
from . import torch_impl
from .conversion import exact_cast  # noqa: F401  (re-exported: the verifier's exactness fact)
from .base import Category, Facts, Inferred, Op, OpTypeError, Requirement, TensorType


@attrs.frozen
class View(Op):
    to: ElemType = attrs.field(metadata={"kind": "dtype"})

    name: ClassVar[str] = "view"
    eager: ClassVar[Callable] = staticmethod(torch_impl.view_as)
    facts: ClassVar[Facts] = Facts(Category.VALUE)
    summary: ClassVar[str] = "relabel bits: each element as another type (of another width: along the last axis)"
    notes: ClassVar[str] = "4 x `u8` <-> `i32` along the last axis"
    needs: ClassVar[str] = "across widths: the last axis divides"

    @classmethod
    def specialize(cls, values: dict, t: TensorType) -> Op:
        return Reinterpret(**values) if values["to"].bits != t.elem.bits else cls(**values)

    def infer(self, t: TensorType) -> Inferred:
        if t.elem.bits != self.to.bits:
            raise OpTypeError(f"view({t.elem.name} -> {self.to.name}) changes the element width: that is a "
                              f"reinterpretation of the last axis")
        return Inferred(attrs.evolve(t, elem=self.to))

    def index_map(self, t: TensorType) -> IndexMap:
        return identity(t.shape)

    def impl(self, t: TensorType):
        return self.eager, (self.to.torch_dtype,)

    def conversion(self) -> cv.Conversion:
        return cv.View(self.to)

    def inverse(self, t):
        return View(t.elem)


@attrs.frozen
class Reinterpret(Op):
    """``view`` to a type of another width: the last axis's bytes read as wider or narrower
    elements, little-endian (``u8[.., 4k] <-> i32[.., k]``), as torch's ``Tensor.view(dtype)``."""

    to: ElemType = attrs.field(metadata={"kind": "dtype"})

    name: ClassVar[str] = "reinterpret"
    eager: ClassVar[Callable] = staticmethod(torch_impl.view_width)
    public: ClassVar[bool] = False
    facts: ClassVar[Facts] = Facts(Category.SHAPE, bits=True)
    summary: ClassVar[str] = "view(t, TYPE) across widths: the last axis's bytes as other elements"

    def _sizes(self, t: TensorType) -> tuple[int, int]:
        if t.rank < 1:
            raise OpTypeError(f"view({t.elem.name} -> {self.to.name}) needs a last axis to regroup; got {t}")
        for e in (t.elem, self.to):
            if e.bits % 8:
                raise OpTypeError(f"view across widths moves whole bytes; {e.name} is {e.bits} bits")
        return t.elem.bits, self.to.bits

    def infer(self, t: TensorType) -> Inferred:
        a, b = self._sizes(t)
        last = t.shape[-1]
        if b > a:
            reqs = (Requirement(last, b // a, f"{t.elem.name} elements in the last axis"),)
            return Inferred(TensorType(self.to, t.shape[:-1] + (ex.div(last, b // a),)), reqs)
        return Inferred(TensorType(self.to, t.shape[:-1] + (ex.mul(last, a // b),)))

    def index_map(self, t: TensorType) -> IndexMap:
        a, b = self._sizes(t)
        out = self.infer(t).type.shape
        o = out_vars(len(out) + 1)
        bit = ex.add(ex.mul(o[-2], b), o[-1])  # the output bit's position in the last axis, in bits
        src = tuple(o[:-2]) + (ex.floordiv(bit, a), ex.mod(bit, a))
        return IndexMap(t.shape + (ex.Const(a),), out + (ex.Const(b),), src, bit_level=True)

    def impl(self, t: TensorType):
        return self.eager, (self.to.torch_dtype,)

    def keeps_bytes(self) -> bool:
        return True

    def inverse(self, t):
        return Reinterpret(t.elem)


@attrs.frozen
class ExtractBits(Op):
    shift: int = attrs.field(kw_only=True, metadata={"kind": "int", "min": 0})
    width: int = attrs.field(kw_only=True, metadata={"kind": "int", "min": 1})
    to: ElemType = attrs.field(kw_only=True, metadata={"kind": "dtype"})

    name: ClassVar[str] = "extract_bits"
    eager: ClassVar[Callable] = staticmethod(torch_impl.extract_bits)
    facts: ClassVar[Facts] = Facts(Category.VALUE)
    summary: ClassVar[str] = "bits [shift, shift+width) of each element as an unsigned integer (fp32 exponent -> e8m0)"
    needs: ClassVar[str] = "shift + width within the element"

    def infer(self, t: TensorType) -> Inferred:
        if self.shift + self.width > t.elem.bits:
            raise OpTypeError(f"extract_bits(shift={self.shift}, width={self.width}) reads past the {t.elem.bits} "
                              f"bits of {t.elem.name}")
        if self.width > self.to.bits:
            raise OpTypeError(f"a {self.width}-bit field does not fit {self.to.name} ({self.to.bits} bits)")
        return Inferred(TensorType(self.to, t.shape))

    def index_map(self, t: TensorType) -> IndexMap:
        return identity(t.shape)

    def impl(self, t: TensorType):
        return self.eager, (self.shift, self.width, self.to.torch_dtype)

    def conversion(self) -> cv.Conversion:
        return cv.ExtractBits(self.to, shift=self.shift, width=self.width)

    def inverse(self, t):
        return InsertBits(shift=self.shift, width=self.width, to=t.elem)


@attrs.frozen
class InsertBits(Op):
    shift: int = attrs.field(kw_only=True, metadata={"kind": "int", "min": 0})
    width: int = attrs.field(kw_only=True, metadata={"kind": "int", "min": 1})
    to: ElemType = attrs.field(kw_only=True, metadata={"kind": "dtype"})

    name: ClassVar[str] = "insert_bits"
    eager: ClassVar[Callable] = staticmethod(torch_impl.insert_bits)
    facts: ClassVar[Facts] = Facts(Category.VALUE)
    summary: ClassVar[str] = "each element's low `width` bits at [shift, shift+width) of a zero element (e8m0 -> fp32)"
    notes: ClassVar[str] = "the inverse of extract_bits"
    needs: ClassVar[str] = "shift + width within the element"

    def infer(self, t: TensorType) -> Inferred:
        if self.shift + self.width > self.to.bits:
            raise OpTypeError(f"insert_bits(shift={self.shift}, width={self.width}) writes past the {self.to.bits} "
                              f"bits of {self.to.name}")
        if self.width > t.elem.bits:
            raise OpTypeError(f"a {self.width}-bit field is wider than {t.elem.name} ({t.elem.bits} bits)")
        return Inferred(TensorType(self.to, t.shape))

    def index_map(self, t: TensorType) -> IndexMap:
        return identity(t.shape)

    def impl(self, t: TensorType):
        return self.eager, (self.shift, self.width, self.to.torch_dtype)

    def conversion(self) -> cv.Conversion:
        return cv.InsertBits(self.to, shift=self.shift, width=self.width)

    def inverse(self, t):
        return ExtractBits(shift=self.shift, width=self.width, to=t.elem)


#: Types ``cast(..., exp=k)`` may scale into: the product of one of their values and 2**k (k >= 0) is
#: exact in fp32, so every lowering computes it there and gets the same bits (or inf on overflow).
SCALABLE = ("bf16", "f16", "f32")


@attrs.frozen
class Cast(Op):
    """``cast(t, T)``: each value rounded to T. ``cast(t, T, exp=k)``: then multiplied by 2**k in T
    (vLLM's Marlin NVFP4 scales: ``x.to(half) * 2**7``), exact unless it overflows to inf."""

    to: ElemType = attrs.field(metadata={"kind": "dtype"})
    exp: int = attrs.field(default=0, kw_only=True, metadata={"kind": "int", "min": 0})

    name: ClassVar[str] = "cast"
    eager: ClassVar[Callable] = staticmethod(torch_impl.cast)
    facts: ClassVar[Facts] = Facts(Category.VALUE)
    summary: ClassVar[str] = "convert each element's value to another type (exp=k: then times 2**k)"
    needs: ClassVar[str] = "numeric types"

    def infer(self, t: TensorType) -> Inferred:
        for side in (t.elem, self.to):
            if not side.numeric:
                raise OpTypeError(
                    f"cast({t.elem.name} -> {self.to.name}): {side.name} values have no torch conversion "
                    f"({side.doc})",
                    hint=f"to relabel the bytes use view(..., {self.to.name})",
                )
        if self.exp and self.to.name not in SCALABLE:
            raise OpTypeError(f"cast(..., {self.to.name}, exp={self.exp}): scaling by a power of two is offered into "
                              f"{', '.join(SCALABLE)} only")
        if self.exp > 127:
            raise OpTypeError(f"cast(..., exp={self.exp}): 2**{self.exp} is not a finite fp32 value")
        return Inferred(attrs.evolve(t, elem=self.to))

    def index_map(self, t: TensorType) -> IndexMap:
        return identity(t.shape)

    def impl(self, t: TensorType):
        return self.eager, (self.to.torch_dtype, self.exp) if self.exp else (self.to.torch_dtype,)

    def conversion(self) -> cv.Conversion:
        return cv.Cast(self.to, exp=self.exp)

    def inverse(self, t):
        # Exact on the image of the forward cast when it widens or when the values
        # were representable in the narrower type (e.g. bf16 biases stored as fp32).
        # A scaled cast rounds before it scales: no single cast undoes it.
        return Cast(t.elem) if not self.exp else None

    def is_exact(self, t: TensorType) -> bool:
        return exact_cast(t.elem, self.to) and not self.exp

    def args_str(self) -> str:
        # exp=0 is the plain cast: said only when set (messages and listings of every other spec unchanged)
        return f"to={self.to.name}" + (f", exp={self.exp}" if self.exp else "")


OPS = (View, Reinterpret, Cast, ExtractBits, InsertBits)
