"""Element types of the spec language and the torch dtypes that carry them.

A spec names *element types* (``fp4x2``, ``e8m0``, ``bf16``...). Several of them
have no torch dtype of their own on every torch version, or are stored by engines
as raw bytes (vLLM keeps MXFP4 weights and E8M0 scales in ``uint8``), so each type
has one canonical torch dtype that converters produce and a set of byte-identical
torch dtypes they accept.

``view`` relabels bits between types of the same width; ``cast`` converts values
and is only defined between types torch can convert (``numeric``).
"""

from __future__ import annotations

import attrs
import torch


@attrs.frozen
class ElemType:
    name: str
    bits: int
    canonical: str  # torch dtype attribute name produced by converters
    accepts: tuple[str, ...]  # torch dtype names accepted at convert time (same bits)
    numeric: bool  # ``cast`` to and from it converts values
    doc: str
    values: int = 1  # values packed in one element (fp4x2: two E2M1 values a byte); K counts values

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.canonical)

    def accepted_torch_dtypes(self) -> tuple[torch.dtype, ...]:
        return tuple(getattr(torch, n) for n in self.accepts if hasattr(torch, n))

    def __str__(self) -> str:
        return self.name


def _t(name, bits, canonical, accepts, numeric, doc, values=1) -> ElemType:
    return ElemType(name, bits, canonical, (canonical,) + tuple(accepts), numeric, doc, values)


ELEMENT_TYPES: dict[str, ElemType] = {
    t.name: t
    for t in (
        _t("u8", 8, "uint8", (), True, "unsigned byte"),
        _t("i8", 8, "int8", (), True, "signed byte"),
        _t("i16", 16, "int16", (), True, "16-bit integer"),
        _t("i32", 32, "int32", (), True, "32-bit integer"),
        _t("f16", 16, "float16", (), True, "IEEE half"),
        _t("bf16", 16, "bfloat16", (), True, "bfloat16"),
        _t("f32", 32, "float32", (), True, "IEEE single"),
        _t("e4m3", 8, "float8_e4m3fn", ("uint8",), True, "FP8 E4M3 (NVFP4 block scales, FP8 weights)"),
        _t("e5m2", 8, "float8_e5m2", ("uint8",), True, "FP8 E5M2"),
        _t(
            "e8m0",
            8,
            "uint8",
            ("float8_e8m0fnu",),
            False,
            "E8M0 power-of-two scale byte, value 2^(byte-127) (MXFP4/MXFP8 block scales)",
        ),
        _t(
            "fp4x2",
            8,
            "uint8",
            ("float4_e2m1fn_x2",),
            False,
            "two E2M1 values per byte, element 2j in the low nibble",
            values=2,
        ),
    )
}


#: (narrow, wide): every value of ``narrow`` is a value of ``wide``, so ``x.to(wide)`` loses nothing
#: (FP8 and bf16/f16 into wider floats, small integers into wider integers). An input declared
#: ``f32[...] accepts bf16`` is widened this way before its transforms.
EXACT_WIDENINGS: frozenset[tuple[str, str]] = frozenset({
    ("bf16", "f32"), ("f16", "f32"),
    ("e4m3", "f16"), ("e4m3", "bf16"), ("e4m3", "f32"),
    ("e5m2", "f16"), ("e5m2", "bf16"), ("e5m2", "f32"),
    ("u8", "i16"), ("u8", "i32"), ("i8", "i16"), ("i8", "i32"), ("i16", "i32"),
})


def widens_exactly(narrow: ElemType, wide: ElemType) -> bool:
    return (narrow.name, wide.name) in EXACT_WIDENINGS


def bit_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as same-width integers: exact (NaN-safe) comparison of any element type."""
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def torch_dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
