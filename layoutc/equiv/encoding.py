"""Self-describing inputs and their decoding: what the spec says each output holds, and what the function does.

Step 1 and 2 of :mod:`layoutc.equiv.compare` (its docstring has the idea): a :class:`Plan` gives every input bit or
element a global address, spelled one digit per call; :func:`observe` calls the function on those inputs (and once
on random ones) and decodes its outputs into codes (an input address, a constant, or ``UNEXPLAINED``);
:func:`spec_codes` and :func:`map_codes` give the same codes from the spec's index maps. Shared by ``equiv``
(comparing the two) and ``infer`` (reading the function's maps back), so kept apart from both.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import attrs
import torch

from ..algebra import expr as ex
from ..lang.compiler import Chain, Variant
from ..algebra.dtypes import ElemType, bit_view
from ..algebra.indexmap import (IndexMap, bytes_to_bits, compose_all, concrete_shape, drop_bit_axis, identity,
                                lift_to_bits)
from ..lang.ops import conversion as cv
from ..lang.ops.base import Category
from .function_runner import EquivError, Target


#: A code is a global input address (>= 0) or one of these.
UNEXPLAINED = -(1 << 40)  # not a copy of any input bit/element


def const_code(v: int) -> int:
    """The code of a constant output bit or element of value ``v``."""
    return -(int(v) + 1)


def is_const(code: int) -> bool:
    return UNEXPLAINED < code < 0


# ---------------------------------------------------------------------------
# encoding


def chain_mode(chain: Chain) -> str:
    """How a tensor is probed: ``elements`` when its chain moves whole elements (each element's bits
    carry digits of its address), ``bits`` when the chain moves single bits (each bit carries one
    binary digit of its own bit address), ``values`` when it casts (small digits that survive the
    casts), ``opaque`` when it computes bit fields or maps them through a table (no digit survives: values
    are compared on random inputs only)."""
    mode = None
    for s in chain.steps:
        if s.op.category is not Category.VALUE:
            continue
        conv = s.op.conversion()
        if isinstance(conv, cv.View):
            continue
        if isinstance(conv, cv.Cast) and conv.exp:
            return "opaque"  # a digit times 2**exp is another value: no digit survives
        if isinstance(conv, cv.Cast):
            mode = "values"
            continue
        if isinstance(conv, (cv.ExtractBits, cv.InsertBits, cv.MapBits)):
            return "opaque"  # a field's value through a table: no digit of an address survives
        raise cv.UnknownKind(f"equiv has no probe encoding for the value conversion {conv!r} of {s.op.name}")
    m = chain.composed_map()
    if mode == "values":
        return "opaque" if m.bit_level or not chain.source.elem.numeric else "values"
    if m.bit_level and drop_bit_axis(m) is None:
        return "bits"
    if chain.out_type.elem.bits != chain.source.elem.bits:
        return "bits"  # a view across widths: elements do not map to elements
    return "elements"


def _exact_base(elem: ElemType) -> int:
    """The largest digit base whose digits 0..B-1 a value of ``elem`` holds exactly (<= 256)."""
    return {"e4m3": 16, "e5m2": 8, "i8": 128}.get(elem.name, 256)


@attrs.frozen
class Encoded:
    name: str
    shape: tuple[int, ...]
    elem: ElemType
    mode: str
    offset: int  # first global address in its mode's space (bits: bit address, else element address)

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    @property
    def width(self) -> int:
        return self.elem.bits

    @property
    def size(self) -> int:
        """Addresses taken: bits for bit-encoded tensors, elements otherwise."""
        return self.numel * (self.width if self.mode == "bits" else 1)


#: Address spaces: a code is an address in the space of the output's mode.
_SPACES = ("bits", "elements", "values", "opaque")


class Plan:
    """The self-describing inputs of one variant at one set of dims. ``force_bits``: tensors probed bit
    by bit even where the spec moves whole elements (a function that does not).

    Address spaces: bit addresses (tensors probed bit by bit) are ``offset + width*j + b`` for bit ``b``
    of element ``j``, every offset a multiple of 64 and at least 64, so in call ``r`` the low bits
    (``r < log2(width)``) form one constant pattern per element and the high ones set whole elements;
    codes below 64 are never addresses (0 is a constant 0). Element addresses (whole elements, and
    cast values) are ``offset + j + 1``, 0 staying free for constant 0."""

    def __init__(self, dims: Mapping[str, int], entries: Sequence[tuple[str, tuple[int, ...], ElemType, str,
                                                                         tuple[ElemType, ...]]]):
        """``entries``: (name, shape, element type, mode, types its values pass through) per input."""
        self.dims = dict(dims)
        self.inputs: dict[str, Encoded] = {}
        offsets = dict.fromkeys(_SPACES, 0)
        offsets["bits"] = _BIT_ALIGN
        base = 256
        for name, shape, elem, mode, through in entries:
            enc = Encoded(name, tuple(shape), elem, mode, offsets[mode])
            offsets[mode] += enc.size
            if mode == "bits":
                offsets[mode] = -(-offsets[mode] // _BIT_ALIGN) * _BIT_ALIGN
            self.inputs[name] = enc
            if mode == "values":
                base = min([base, _exact_base(elem)] + [_exact_base(t) for t in through])
        self.totals = offsets
        self.base = base
        # all-one bits stay free for a constant 1: 2**digits - 1 is above every address
        self.digits = {
            "bits": offsets["bits"].bit_length() + 1 if any(e.mode == "bits" for e in self.inputs.values()) else 0,
            "values": _digits(offsets["values"] + 1, base) if offsets["values"] else 0,
        }
        for e in self.inputs.values():
            if e.mode == "elements":
                self.digits[e.name] = _digits(offsets["elements"] + 1, 1 << e.width)
        self.runs = max(list(self.digits.values()) + [1])
        self._addr: dict[str, torch.Tensor] = {}

    @classmethod
    def for_variant(cls, variant: Variant, dims: Mapping[str, int], force_bits: Iterable[str] = ()) -> "Plan":
        force = set(force_bits)
        entries = []
        for c in variant.chains:
            mode = chain_mode(c)
            if c.tensor in force and mode == "elements":
                mode = "bits"
            entries.append((c.tensor, concrete_shape(c.source.shape, dims), c.source.elem, mode,
                            tuple(s.out_type.elem for s in c.steps)))
        return cls(dims, entries)

    def _addresses(self, e: Encoded) -> torch.Tensor:
        """Element addresses + 1 (elements, values); element slots ``offset/width + j`` (bits)."""
        if e.name not in self._addr:
            if e.mode == "bits":
                first = e.offset // e.width
                self._addr[e.name] = torch.arange(first, first + e.numel, dtype=torch.int64)
            else:
                self._addr[e.name] = torch.arange(e.offset + 1, e.offset + e.size + 1, dtype=torch.int64)
        return self._addr[e.name]

    def inputs_for(self, run: int) -> dict[str, torch.Tensor]:
        out = {}
        for e in self.inputs.values():
            if e.numel == 0:
                out[e.name] = torch.zeros(e.shape, dtype=e.elem.torch_dtype)
            elif e.mode == "bits":
                low = e.width.bit_length() - 1  # log2(width)
                if run < low:  # bit `run` of the bit index b: the same pattern in every element
                    pattern = sum(((b >> run) & 1) << b for b in range(e.width))
                    word = torch.full((e.numel,), pattern, dtype=torch.int64)
                else:  # bit `run` of offset + width*j: all of element j's bits alike
                    word = ((self._addresses(e) >> (run - low)) & 1) * ((1 << e.width) - 1)
                out[e.name] = _from_words(word, e)
            elif e.mode == "elements":
                mask = (1 << e.width) - 1
                word = (self._addresses(e) >> (e.width * run)) & mask if run < self.digits[e.name] else \
                    torch.zeros(e.numel, dtype=torch.int64)
                out[e.name] = _from_words(word, e)
            elif e.mode == "values":
                addr = self._addresses(e)
                digit = (addr // (self.base ** run)) % self.base if run < self.digits["values"] else addr * 0
                out[e.name] = digit.to(e.elem.torch_dtype).reshape(e.shape)
            else:
                out[e.name] = torch.zeros(e.shape, dtype=e.elem.torch_dtype)
        return out

    def random_inputs(self, seed: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        out = {}
        for e in self.inputs.values():
            if e.mode in ("values", "opaque") and e.elem.torch_dtype.is_floating_point and e.elem.numeric:
                out[e.name] = (torch.randn(e.shape, generator=g, dtype=torch.float32) * 3).to(e.elem.torch_dtype)
            else:
                raw = torch.randint(0, 256, (e.numel, e.width // 8), dtype=torch.uint8, generator=g)
                out[e.name] = _from_bytes(raw, e)
        return out

    def locate(self, code: int, mode: str) -> tuple[str, tuple[int, ...], int | None] | None:
        """(tensor, element index, bit or None) of an address in ``mode``'s space."""
        if code < 0:
            return None
        for e in self.inputs.values():
            if e.mode == mode and e.offset <= code < e.offset + e.size:
                local = code - e.offset
                bit = None
                if mode == "bits":
                    local, bit = divmod(local, e.width)
                return e.name, tuple(int(i) for i in torch.unravel_index(torch.tensor(local), tuple(e.shape))), bit
        return None

    def real(self, codes: torch.Tensor, mode: str) -> torch.Tensor:
        """Which codes are addresses of some input of ``mode`` (bit addresses have gaps between tensors)."""
        ok = torch.zeros(codes.shape, dtype=torch.bool)
        for e in self.inputs.values():
            if e.mode == mode:
                ok |= (codes >= e.offset) & (codes < e.offset + e.size)
        return ok


#: Bit addresses start at, and tensors' bit offsets are multiples of, this (>= the widest element).
_BIT_ALIGN = 64


def _digits(n: int, base: int) -> int:
    d = 0
    while n > 0:
        n //= base
        d += 1
    return d


def _from_bytes(raw: torch.Tensor, e: Encoded) -> torch.Tensor:
    """[numel, width/8] little-endian bytes -> the tensor of e's type and shape."""
    return raw.contiguous().view(torch.uint8).reshape(-1).view(e.elem.torch_dtype).reshape(e.shape)


def _from_words(word: torch.Tensor, e: Encoded) -> torch.Tensor:
    nbytes = e.width // 8
    raw = torch.stack([((word >> (8 * k)) & 255).to(torch.uint8) for k in range(nbytes)], dim=-1)
    return _from_bytes(raw, e)


def _transpose_runs(stack: torch.Tensor) -> torch.Tensor:
    """[runs, n] bytes (byte j as call r returned it) -> [n, 8] int64: for bit b of byte j, the number whose
    bit r is that bit in call r. Eight calls at a time, as the 8x8 bit-matrix transpose of one int64 per
    byte (Hacker's Delight 7-3; the arithmetic shifts' sign bits fall outside the masks)."""
    runs, n = stack.shape
    out = torch.zeros(n, 8, dtype=torch.int64)
    for c in range(0, runs, 8):
        chunk = stack[c:c + 8]
        if chunk.shape[0] < 8:
            chunk = torch.cat([chunk, torch.zeros(8 - chunk.shape[0], n, dtype=torch.uint8)])
        x = chunk.t().contiguous().view(torch.int64).reshape(n)
        t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AA
        x = x ^ t ^ (t << 7)
        t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCC
        x = x ^ t ^ (t << 14)
        t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0
        x = x ^ t ^ (t << 28)
        out |= x.view(torch.uint8).reshape(n, 8).to(torch.int64) << c
    return out


def _words(t: torch.Tensor) -> torch.Tensor:
    """Each element's bit pattern as a non-negative int64."""
    w = bit_view(t).to(torch.int64)
    return w & ((1 << (8 * t.element_size())) - 1)


# ---------------------------------------------------------------------------
# what the spec says


def spec_codes(chain: Chain, plan: Plan) -> torch.Tensor:
    """The spec's source code of every output bit (bits mode: shape + [width]) or element."""
    enc = plan.inputs[chain.tensor]
    return map_codes(_mode_map(chain, enc.mode), plan.dims, enc)


def _mode_map(chain: Chain, mode: str, maps: Sequence[IndexMap] | None = None) -> IndexMap:
    maps = list(chain.maps() if maps is None else maps)
    m = compose_all(maps) if maps else identity(chain.in_type.shape)
    if mode == "bits":
        return m if m.bit_level else lift_to_bits(m, chain.source.elem.bits)
    if m.bit_level:
        byte = drop_bit_axis(m)
        if byte is None:
            raise ValueError("the map moves bits")
        return byte
    return m


def map_codes(m: IndexMap, dims: Mapping[str, int], enc: Encoded,
              at: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
    """Codes of a map's outputs: over the whole output, or at the coordinates ``at`` (one 1-D tensor
    per output axis, the bit axis included for bit-level maps)."""
    env: dict[str, Any] = dict(dims)
    if at is None:
        from ..algebra.indexmap import coordinate_grids

        shape = concrete_shape(m.out_shape, dims)
        env.update(coordinate_grids(shape))
    else:
        shape = (int(at[0].numel()),) if len(at) else ()
        env.update({f"o{k}": c for k, c in enumerate(at)})
    in_shape = concrete_shape(m.in_shape, dims)
    linear = torch.zeros(shape, dtype=torch.int64)
    stride = 1
    for k in reversed(range(len(in_shape))):
        linear = linear + torch.as_tensor(ex.evaluate(m.src[k], env)) * stride
        stride *= in_shape[k]
    valid = torch.as_tensor(ex.evaluate(m.valid, env)).to(torch.bool).expand(shape)
    fill = torch.as_tensor(ex.evaluate(m.fill, env)).to(torch.int64).expand(shape)
    return torch.where(valid, linear + enc.offset, -(fill + 1))


# ---------------------------------------------------------------------------
# what the function does


@attrs.frozen
class Observed:
    """The function's outputs at one shape: codes per output, their shapes and dtypes, the random run."""

    codes: dict[str, torch.Tensor]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]
    random_in: dict[str, torch.Tensor]
    random_out: dict[str, torch.Tensor]
    calls: int = 0


def observe(target: Target, plan: Plan, params: Mapping[str, Any], where: str, seed: int = 1234) -> Observed:
    """Run the function on the plan's inputs and decode its outputs (each as the input of the same name
    is encoded; an output with no input of its name, bit by bit)."""
    modes = {n: e.mode for n, e in plan.inputs.items()}
    acc: dict[str, torch.Tensor] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, torch.dtype] = {}
    ok_digits: dict[str, torch.Tensor] = {}
    first_digit: dict[str, torch.Tensor] = {}
    same_digits: dict[str, torch.Tensor] = {}
    planes: dict[str, list[torch.Tensor]] = {}
    for run in range(plan.runs):
        out = target.call(plan.inputs_for(run), params, where)
        for name, t in out.items():
            if run == 0:
                shapes[name], dtypes[name] = tuple(t.shape), t.dtype
            elif tuple(t.shape) != shapes.get(name) or t.dtype != dtypes.get(name):
                raise EquivError(f"{target.name} returned {name} as {t.dtype}{list(t.shape)} in one call and "
                                 f"{dtypes.get(name)}{list(shapes.get(name, ()))} in another ({where}): its result "
                                 f"depends on the values, which equiv cannot compare")
            mode = modes.get(name, "bits")
            if mode == "bits":
                if run < plan.digits["bits"]:
                    planes.setdefault(name, []).append(t.reshape(-1).view(torch.uint8) if t.numel() else
                                                       torch.zeros(0, dtype=torch.uint8))
            elif mode == "elements":
                if run < plan.digits[name]:
                    w = t.element_size() * 8
                    acc[name] = acc.get(name, torch.zeros(t.shape, dtype=torch.int64)) | (_words(t) << (w * run))
            elif mode == "values" and run < plan.digits["values"]:
                v = t.to(torch.float64)
                ok = (v == v.round()) & (v >= 0) & (v < plan.base)
                digit = torch.where(ok, v, 0).to(torch.int64)
                acc[name] = acc.get(name, torch.zeros_like(digit)) + digit * plan.base ** run
                ok_digits[name] = ok_digits.get(name, torch.ones_like(ok)) & ok
                if run == 0:
                    first_digit[name] = digit
                    same_digits[name] = torch.ones_like(ok)
                else:
                    same_digits[name] &= digit == first_digit[name]
    for name, runs in planes.items():  # bit b of every output byte: the calls' bits, as one number
        width = 8 * torch.empty((), dtype=dtypes[name]).element_size()
        acc[name] = _transpose_runs(torch.stack(runs)).reshape(*shapes[name], width)
    random_in = plan.random_inputs(seed)
    random_out = target.call({k: v.clone() for k, v in random_in.items()}, params, where + ", random values")
    pools = {m: _pool(plan, random_in, m) for m in ("bits", "elements")}
    codes: dict[str, torch.Tensor] = {}
    for name, raw in acc.items():
        mode = modes.get(name, "bits")
        rnd = random_out.get(name)
        comparable = rnd is not None and tuple(rnd.shape) == shapes[name] and rnd.dtype == dtypes[name]
        if mode in ("bits", "elements"):
            total = plan.totals[mode]
            if mode == "bits":
                full = (1 << plan.digits["bits"]) - 1
                code = torch.where(raw == 0, const_code(0), torch.where(raw == full, const_code(1), raw))
                code = torch.where((code >= 0) & ~plan.real(code, "bits"), UNEXPLAINED, code)
            else:
                code = torch.where(raw == 0, const_code(0), raw - 1)
                code = torch.where(code >= total, UNEXPLAINED, code)
            pool = pools[mode]
            if comparable and pool is not None:
                got = bytes_to_bits(rnd).to(torch.int64) if mode == "bits" else _words(rnd)
                real = code >= 0
                want = pool[torch.where(real, code, 0)]
                # a constant must be that constant in the random run too
                fixed = (code < 0) & (code != UNEXPLAINED)
                bad = (real & (got != want)) | (fixed & (got != -(code + 1)))
                code = torch.where(bad, UNEXPLAINED, code)
            codes[name] = code
        else:
            code = torch.where(raw == 0, const_code(0), raw - 1)
            code = torch.where(ok_digits[name], code, UNEXPLAINED)
            code = torch.where(code >= plan.totals["values"], UNEXPLAINED, code)
            if comparable:
                v0 = first_digit[name]
                constant = same_digits[name] & (v0 > 0) & (rnd.to(torch.float64) == v0.to(torch.float64))
                code = torch.where(constant, -(v0 + 1), code)
            codes[name] = code
    return Observed(codes, shapes, dtypes, random_in, random_out, plan.runs + 1)


def _pool(plan: Plan, random_in: Mapping[str, torch.Tensor], mode: str) -> torch.Tensor | None:
    """The random run's inputs by address: every bit (bits), or every element's bit pattern (elements)."""
    inputs = [e for e in plan.inputs.values() if e.mode == mode]
    if not inputs:
        return None
    pool = torch.zeros(plan.totals[mode] + 1, dtype=torch.int64)
    for e in inputs:
        x = random_in[e.name]
        flat = bytes_to_bits(x).reshape(-1).to(torch.int64) if mode == "bits" else _words(x).reshape(-1)
        pool[e.offset:e.offset + e.size] = flat
    return pool
