"""What a value op or a bit permutation does to each element, as typed data the lowerings print.

A value op (``cast``, ``view``, ``extract_bits``, ``insert_bits``) declares its :class:`Conversion`;
a bit-level op that permutes the bits within words declares its :class:`BitPermutation`. Each class
carries its facts (which bits survive, whether values can be lost), its eager form (torch source,
through the eager ops' own functions: one semantics for NaNs and bit fields) and its kernel form
(Triton source). Lowerings and analyses only call these methods, or match on these classes and
raise :class:`UnknownKind` on any other: a new value op without a lowering fails when a spec using
it is compiled, never by a silent fallback to another kind's code.
"""

from __future__ import annotations

from typing import ClassVar, Sequence

import attrs

from ...algebra.dtypes import ELEMENT_TYPES, ElemType, widens_exactly

TRITON_DTYPES = {
    "uint8": "tl.uint8", "int8": "tl.int8", "int16": "tl.int16", "int32": "tl.int32", "float16": "tl.float16",
    "bfloat16": "tl.bfloat16", "float32": "tl.float32", "float8_e4m3fn": "tl.float8e4nv", "float8_e5m2": "tl.float8e5",
}
UINT = {8: "tl.uint8", 16: "tl.uint16", 32: "tl.uint32", 64: "tl.uint64"}

#: Canonical quiet NaN of each float type, as bits (what torch.tensor(nan, dtype) holds).
CANONICAL_NAN = {"bfloat16": ("tl.uint16", 0x7FC0), "float16": ("tl.uint16", 0x7E00),
                 "float32": ("tl.uint32", 0x7FC00000), "float8_e4m3fn": ("tl.uint8", 0x7F),
                 "float8_e5m2": ("tl.uint8", 0x7E)}


class UnknownKind(TypeError):
    """Code met a conversion, permutation or plan kind it has no rule for (a lowering or an
    analysis that was not taught a new kind): raised when the spec is compiled."""


def exact_cast(src: ElemType, to: ElemType) -> bool:
    """Whether casting ``src`` values to ``to`` keeps every value: the same type, or a widening the
    type table lists as exact. Bit widths alone would call bf16 <-> f16 (8 vs 5 exponent bits) and
    i32 -> f32 (24-bit mantissa) exact; neither is."""
    return src == to or widens_exactly(src, to)


@attrs.frozen
class Conversion:
    """Base of the value conversions: each element of type ``src`` becomes one of type ``to``."""

    to: ElemType
    kind: ClassVar[str] = ""
    #: every bit of the element is kept as is (a relabelling): address-encoding probes survive it
    keeps_bits: ClassVar[bool] = False
    #: whether a value the probe encodes an element's position in keeps it readable after this conversion
    #: (casts and relabels keep the small integers the probe writes; a table over bit fields scrambles them)
    keeps_positions: ClassVar[bool] = True

    def lossy(self, src: ElemType) -> bool:
        """Whether some elements of ``src`` lose bits or value on the way."""
        raise UnknownKind(f"{type(self).__name__} declares no loss fact")

    def out_elem(self, src: ElemType) -> ElemType:
        """The element type an element of ``src`` becomes."""
        return self.to

    def bytewise(self) -> bool:
        """Whether each byte of the element is converted on its own (the same function on every byte,
        whatever its neighbours): such a conversion commutes with moves of whole bytes, so a lowering
        may apply it to bytes or to words of any width."""
        return False

    def field(self) -> tuple[int, int] | None:
        """(shift, width) of the bit field of the source element the result keeps, if it is one."""
        return None

    def eager(self, var: str) -> str:
        """Torch source of the converted ``var`` (the converter's runtime functions in scope)."""
        raise UnknownKind(f"{type(self).__name__} has no eager (torch) form")

    def kernel(self, value: str, src: ElemType) -> list[str]:
        """Triton lines that convert ``value`` (of element type ``src``) in place."""
        raise UnknownKind(f"{type(self).__name__} has no kernel (Triton) form")


@attrs.frozen
class View(Conversion):
    """Same bits, another type of the same width."""

    kind: ClassVar[str] = "view"
    keeps_bits: ClassVar[bool] = True

    def lossy(self, src: ElemType) -> bool:
        return False

    def eager(self, var: str) -> str:
        return f"{var}.view(torch.{self.to.canonical})"

    def kernel(self, value: str, src: ElemType) -> list[str]:
        return [f"{value} = {value}.to({TRITON_DTYPES[self.to.canonical]}, bitcast=True)"]


@attrs.frozen
class Cast(Conversion):
    """The nearest value of the new type (round to nearest even, NaN to the canonical NaN)."""

    #: then times 2**exp (exp >= 0, in the new type): exact unless it overflows to inf
    exp: int = attrs.field(default=0, kw_only=True)
    kind: ClassVar[str] = "cast"

    def lossy(self, src: ElemType) -> bool:
        return not exact_cast(src, self.to) or self.exp != 0  # a scaled value can overflow

    def eager(self, var: str) -> str:
        if self.exp:
            return f"cast({var}, torch.{self.to.canonical}, {self.exp})"
        return f"cast({var}, torch.{self.to.canonical})"

    def kernel(self, value: str, src: ElemType) -> list[str]:
        lines = self._round(value, src)
        if self.exp:
            # A value of the new type times 2**exp is exact in fp32 (inf past its range), so converting
            # back rounds nothing, whatever the backend's rounding (Triton's CPU interpreter truncates).
            lines.append(f"{value} = {value}.to(tl.float32) * {float(2 ** self.exp)!r}")
            lines += self._round(value, ELEMENT_TYPES["f32"])  # NaN back to the canonical NaN
        return lines

    def _round(self, value: str, src: ElemType) -> list[str]:
        to = self.to.canonical
        dtype = TRITON_DTYPES[to]
        if src.canonical == "float32" and to == "bfloat16":
            # Round to nearest even on the bits, exactly as torch does, whatever the backend's
            # conversion (Triton's CPU interpreter truncates); NaN -> the canonical 0x7FC0.
            return [
                f"_bits = {value}.to(tl.uint32, bitcast=True)",
                "_half = (_bits + 0x7FFF + ((_bits >> 16) & 1)) >> 16",
                "_half = tl.where((_bits & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, _half)",
                f"{value} = _half.to(tl.uint16).to(tl.bfloat16, bitcast=True)",
            ]
        if src.numeric and src.canonical.startswith(("float", "bfloat")) and to in CANONICAL_NAN \
                and to != src.canonical:
            bits, nan = CANONICAL_NAN[to]
            # An FP8 NaN is told by its bits: Triton's CPU interpreter reads E4M3's 0x7F as 480.
            fp8_nan = {"float8_e4m3fn": "== 0x7F", "float8_e5m2": "> 0x7C"}.get(src.canonical)
            is_nan = (f"({value}.to(tl.uint8, bitcast=True) & 0x7F) {fp8_nan}" if fp8_nan else f"{value} != {value}")
            return [
                f"_nan = {is_nan}",
                f"{value} = {value}.to({dtype})",
                f"{value} = tl.where(_nan, tl.full({value}.shape, {nan:#x}, {bits}).to({dtype}, bitcast=True), "
                f"{value})",
            ]
        return [f"{value} = {value}.to({dtype})"]


@attrs.frozen
class ExtractBits(Conversion):
    """Bits ``[shift, shift + width)`` of the element as an unsigned integer."""

    shift: int = attrs.field(kw_only=True)
    width: int = attrs.field(kw_only=True)
    kind: ClassVar[str] = "extract"

    def lossy(self, src: ElemType) -> bool:
        return True

    def field(self) -> tuple[int, int]:
        return self.shift, self.width

    def eager(self, var: str) -> str:
        return f"extract_bits({var}, {self.shift}, {self.width}, torch.{self.to.canonical})"

    def kernel(self, value: str, src: ElemType) -> list[str]:
        dtype = TRITON_DTYPES[self.to.canonical]
        mask = (1 << self.width) - 1
        return [f"_field = ({value}.to({UINT[src.bits]}, bitcast=True) >> {self.shift}) & {mask:#x}",
                f"{value} = _field.to({UINT[self.to.bits]}).to({dtype}, bitcast=True)"]


@attrs.frozen
class InsertBits(Conversion):
    """The element's low ``width`` bits at ``[shift, shift + width)`` of a zero element."""

    shift: int = attrs.field(kw_only=True)
    width: int = attrs.field(kw_only=True)
    kind: ClassVar[str] = "insert"

    def lossy(self, src: ElemType) -> bool:
        return src.bits > self.width  # the bits above the field are dropped

    def eager(self, var: str) -> str:
        return f"insert_bits({var}, {self.shift}, {self.width}, torch.{self.to.canonical})"

    def kernel(self, value: str, src: ElemType) -> list[str]:
        dtype = TRITON_DTYPES[self.to.canonical]
        field = f"({value}.to({UINT[src.bits]}, bitcast=True) & {(1 << self.width) - 1:#x})"
        return [f"_field = {field}.to({UINT[self.to.bits]})",
                f"{value} = (_field << {self.shift}).to({dtype}, bitcast=True)"]


def _lookup(field: str, width: int, table: Sequence[int]) -> str:
    """A Triton expression for ``table[field]`` with the table as integer literals: the entries packed
    into 32-bit words (32 // width entries a word), the word picked by a chain of ``tl.where``."""
    per = 32 // width
    words = [sum(v << (width * j) for j, v in enumerate(table[i:i + per])) for i in range(0, len(table), per)]
    mask = (1 << width) - 1
    expr = f"((({words[-1]:#x} >> (({field} % {per}) * {width})) & {mask:#x}))"
    for w in reversed(range(len(words) - 1)):
        pick = f"(({words[w]:#x} >> (({field} % {per}) * {width})) & {mask:#x})"
        expr = f"tl.where({field} < {(w + 1) * per}, {pick}, {expr})"
    return expr


@attrs.frozen
class MapBits(Conversion):
    """Each ``width``-bit field of the element replaced by ``table[field]``; the type is kept (``to`` is
    None: the source's)."""

    width: int = attrs.field(kw_only=True)
    table: tuple[int, ...] = attrs.field(kw_only=True)
    kind: ClassVar[str] = "map_bits"
    keeps_positions: ClassVar[bool] = False  # each field through the table: the probe's position codes are lost

    def out_elem(self, src: ElemType) -> ElemType:
        return src

    def bytewise(self) -> bool:
        return 8 % self.width == 0  # the fields tile each byte: the same table on every byte

    def lossy(self, src: ElemType) -> bool:
        return sorted(self.table) != list(range(len(self.table)))  # two fields map to one value

    def eager(self, var: str) -> str:
        return f"map_bits({var}, {int(self.width)!r}, {tuple(int(v) for v in self.table)!r})"

    def then(self, other: "MapBits") -> "MapBits":
        """This conversion followed by ``other`` (the same width): one table, ``other.table[table[u]]``."""
        assert other.width == self.width
        return MapBits(None, width=self.width, table=tuple(other.table[v] for v in self.table))

    def kernel(self, value: str, src: ElemType) -> list[str]:
        uint = UINT[src.bits]
        if self.width <= 4 and src.bits <= 32:  # every field at once, bit-sliced (anf_terms)
            return _sliced(value, src, self.width, self.table)
        lines = [f"_raw = {value}.to({uint}, bitcast=True)", "_out = tl.zeros_like(_raw)"]
        mask = (1 << self.width) - 1
        packed = sum(v << (self.width * j) for j, v in enumerate(self.table))
        small = self.width << self.width <= 64  # the whole table is one 64-bit literal (width <= 4)
        if small:  # two 32-bit halves: a literal past 2**63 is no int64
            lines.append(f"_lut = (tl.full([], {packed >> 32:#x}, tl.uint64) << 32) | {packed & 0xFFFFFFFF:#x}")
        for f in range(src.bits // self.width):
            if small:
                lines.append(f"_field = ((_raw >> {f * self.width}) & {mask:#x}).to(tl.uint64)")
                pick = f"(_lut >> (_field * {self.width})) & {mask:#x}"
            else:
                lines.append(f"_field = ((_raw >> {f * self.width}) & {mask:#x}).to(tl.uint32)")
                pick = _lookup("_field", self.width, self.table)
            lines.append(f"_out = _out | ({pick}).to({uint}) << {f * self.width}")
        lines.append(f"{value} = _out.to({TRITON_DTYPES[src.canonical]}, bitcast=True)")
        return lines


def anf_terms(width: int, table: Sequence[int]) -> list[list[int]]:
    """Per output bit ``j`` of a ``width``-bit table, its algebraic normal form: the subsets ``S`` of
    input bits (as bit masks) with ``bit j of table[x] = XOR over S of AND of x's bits in S`` (the
    empty subset: the constant 1). Found by the Moebius transform of each output bit's truth table."""
    terms = []
    for j in range(width):
        a = [(table[x] >> j) & 1 for x in range(1 << width)]
        for i in range(width):
            for x in range(1 << width):
                if x >> i & 1:
                    a[x] ^= a[x ^ (1 << i)]
        terms.append([x for x in range(1 << width) if a[x]])
    return terms


def _sliced(value: str, src: ElemType, width: int, table: Sequence[int]) -> list[str]:
    """``table`` on every ``width``-bit field of ``value`` at once: the fields' bit ``i`` gathered into
    plane ``_x{i}`` (bit 0 of every field), each output bit the XOR of ANDs of planes its
    :func:`anf_terms` name, shifted back. CUTLASS W4A8's nibble table is about twenty word operations
    this way, against about ten per field (with 64-bit shifts) looked up field by field."""
    uint = UINT[src.bits]
    ones = sum(1 << (width * f) for f in range(src.bits // width))  # bit 0 of every field
    lines = [f"_raw = {value}.to({uint}, bitcast=True)"]
    terms = anf_terms(width, table)
    used = {i for t in terms for s in t for i in range(width) if s >> i & 1}
    for i in sorted(used):
        lines.append(f"_x{i} = (_raw >> {i}) & {ones:#x}" if i else f"_x0 = _raw & {ones:#x}")
    made: dict[int, str] = {}

    def monomial(s: int) -> str:  # AND of the planes in s, each product made once
        if s & (s - 1) == 0:
            return f"_x{s.bit_length() - 1}"
        if s not in made:
            top = 1 << (s.bit_length() - 1)
            rest = monomial(s ^ top)
            made[s] = f"_m{s}"
            lines.append(f"_m{s} = {rest} & _x{top.bit_length() - 1}")
        return made[s]

    parts = []
    for j, t in enumerate(terms):
        if not t:
            continue
        xs = [monomial(s) for s in t if s]
        expr = " ^ ".join(xs) if xs else ""
        if 0 in t:  # the constant 1
            expr = f"{expr} ^ {ones:#x}" if expr else f"tl.full(_raw.shape, {ones:#x}, {uint})"
        lines.append(f"_o{j} = {expr}")
        parts.append(f"(_o{j} << {j})" if j else "_o0")
    out = " | ".join(parts) if parts else "tl.zeros_like(_raw)"
    return lines + [f"{value} = ({out}).to({TRITON_DTYPES[src.canonical]}, bitcast=True)"]


KINDS: tuple[type[Conversion], ...] = (View, Cast, ExtractBits, InsertBits, MapBits)


def words_kernel(convs: Sequence[Conversion], word: str) -> list[str]:
    """Triton lines applying ``convs`` (each byte on its own: :meth:`Conversion.bytewise`) to ``word``, a
    block of uint32 words of source bytes, which stays uint32 (the words plan's conversions)."""
    lines = []
    for conv in convs:
        if not known(conv).bytewise():
            raise UnknownKind(f"{conv!r} converts more than one byte at a time: no words kernel applies it")
        lines += conv.kernel(word, ELEMENT_TYPES["i32"]) + [f"{word} = {word}.to(tl.uint32, bitcast=True)"]
    return lines


def known(conv: object) -> Conversion:
    """``conv`` when it is one of :data:`KINDS`, else :class:`UnknownKind` (emitters call this before
    printing a conversion, so a subclass that forgot a form is refused, not lowered as another)."""
    if type(conv) not in KINDS:
        raise UnknownKind(f"no lowering knows the value conversion {conv!r}")
    return conv


def bit_permutation_terms(table: Sequence[int]) -> list[tuple[int, int]]:
    """(mask, shift) pairs with ``out = OR((w & mask) << shift)`` (negative shift: right)."""
    groups: dict[int, int] = {}
    for i, s in enumerate(table):
        groups[i - s] = groups.get(i - s, 0) | (1 << s)
    return sorted(((mask, shift) for shift, mask in groups.items()), key=lambda t: -t[1])


@attrs.frozen
class BitPermutation:
    """The bits within words of ``word_bytes`` consecutive bytes along the last axis, permuted:
    ``out_bit[i] = in_bit[table[i]]``. The fused lowering turns such a step, with the byte gathers
    around it, into one word kernel."""

    word_bytes: int
    table: tuple[int, ...]

    def terms(self) -> list[tuple[int, int]]:
        return bit_permutation_terms(self.table)

    def eager(self, word: str, out: str, indent: str) -> list[str]:
        """Torch lines: ``out`` is ``word`` (an int64 tensor of words) with its bits permuted."""
        lines = [f"{indent}{out} = torch.zeros_like({word})"]
        for mask, shift in self.terms():
            op = f"<< {shift}" if shift >= 0 else f">> {-shift}"
            lines.append(f"{indent}{out} = {out} | (({word} & {mask:#x}) {op})")
        return lines

    def kernel(self, word: str, out: str) -> list[str]:
        """Triton lines: ``out`` is ``word`` (a block of uint32 words) with its bits permuted."""
        lines = [f"{out} = tl.zeros_like({word})"]
        for mask, shift in self.terms():
            op = f"<< {shift}" if shift >= 0 else f">> {-shift}"
            lines.append(f"{out} = {out} | (({word} & {mask:#x}) {op})")
        return lines
