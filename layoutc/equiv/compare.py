"""``layoutc equiv``: prove that a spec does what an existing conversion function does.

Engines adopt layoutc by replacing hand-written conversion code (vLLM's
``process_weights_after_loading`` branches, FlashInfer's preparation helpers, in-house
scripts) with specs. This module compares the two element by element, and says where they
differ in terms of the spec: which output element, what the spec reads there (tensor, index,
the statement and line that moved it) and what the function read.

How (docs/design.md §5 has the same idea for the spec's own converter, ``probe.py``):

1. *Encode.* The function is called on self-describing inputs. Every input element carries its
   own global address, one digit per call: tensors whose chain only moves data (including bit
   permutations such as the SM90 FP4 interleave, and relabelling ``view``\\ s) are encoded bit by
   bit -- in call ``d`` each input bit is bit ``d`` of its own bit address plus one -- so
   movements of single bits (FP4 nibbles, bit tables) are traced exactly; tensors whose chain
   converts values (``cast``) carry base-``B`` digits of their element address plus one, with
   ``B`` small enough that the digits survive the casts (256 for bf16). Addresses are global
   over all inputs, so an output read from the wrong tensor is seen as such. An output digit
   pattern of all zeros (all ones, for bits) is a constant, i.e. padding.
2. *Decode.* The function's outputs spell, for every output bit (or element), the input bit
   (element) it holds, or a constant.
3. *Compare.* The spec's composed index map for each tensor says the same thing; the two are
   compared per bit. One more call with random inputs compares values (casts, padding values)
   with the spec's converter, and checks that the function really copies what it was seen to
   copy (a function whose result depends on values is not a movement).
4. *Explain.* Each differing tensor is explained: the spec's path of every differing element
   (the statements that moved it), and hypotheses tried against the function's sources --
   the spec with one statement left out, or with one argument or family parameter changed.
   A hypothesis that explains every differing element is one finding ("as if line 31 were
   not applied to w13_weight_scale"); otherwise differing elements are grouped by the
   statement that moved them and by how far the function's source is from the spec's.

This is repeated at several shapes sampled around the given dims (ones that need padding,
smaller and larger ones), and for every combination of optional inputs.

Why not :class:`layoutc.equiv.probe.ProbeRun` itself: it runs the spec's own converter and decodes its
outputs through the spec's inverses. Here the outputs come from a black box, so nothing about
them may be decoded with the spec being checked; the addresses are global (across tensors) and
bit-level for every width. The encoding helpers (:func:`layoutc.algebra.indexmap.bits_to_bytes`,
``bytes_to_bits``) are shared.

Importing the function's module runs its code: ``equiv --against`` is meant for one's own
conversion code, like ``pytest`` importing a test module.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs
import torch

from ..algebra import expr as ex
from . import usercode
from ..lang.compiler import Chain, Step, Variant
from ..algebra.dtypes import ElemType, bit_view, torch_dtype_name
from ..algebra.indexmap import IndexMap, bytes_to_bits, compose_all, concrete_shape, drop_bit_axis, identity, lift_to_bits
from ..lang.ops import conversion as cv
from ..lang.ops.base import Category

#: A code is a global input address (>= 0) or one of these.
UNEXPLAINED = -(1 << 40)  # not a copy of any input bit/element


def const_code(v: int) -> int:
    """The code of a constant output bit or element of value ``v``."""
    return -(int(v) + 1)


def is_const(code: int) -> bool:
    return UNEXPLAINED < code < 0


class EquivError(Exception):
    """A problem the user causes (bad MODULE:FUNCTION, a function that raises or returns the wrong
    thing, dims missing or invalid): reported as a message, never a traceback (CLI exit 2)."""


# ---------------------------------------------------------------------------
# the function under test


@attrs.frozen
class Target:
    """A conversion function and how to call it: ``fn(tensors)`` with a dict by default, positional
    tensors with ``args``; results as a dict, or a tuple named by ``returns``. A function that
    returns None is taken to have converted its dict in place (the dict is the result). A function
    with a parameter named ``params`` also gets the spec's parameters (``{"activation": "silu"}``)."""

    fn: Callable[..., Any]
    name: str
    args: tuple[str, ...] | None = None
    returns: tuple[str, ...] | None = None
    timeout: float | None = usercode.CALL_TIMEOUT  # seconds per call (:mod:`layoutc.equiv.usercode`)
    hard_exit: bool = False  # end the process when a call cannot be interrupted (the CLI)

    def wants_params(self) -> bool:
        try:
            return "params" in inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            return False

    def call(self, tensors: dict[str, torch.Tensor], params: Mapping[str, Any], where: str) -> dict[str, torch.Tensor]:
        kwargs = {"params": dict(params)} if self.wants_params() else {}
        in_bytes = sum(t.numel() * t.element_size() for t in tensors.values() if isinstance(t, torch.Tensor))

        def run():
            try:
                if self.args is not None:  # an optional input that is absent is passed as None
                    result = self.fn(*[tensors.get(a) for a in self.args], **kwargs)
                else:
                    result = self.fn(tensors, **kwargs)
            except EquivError:
                raise
            except Exception as err:  # noqa: BLE001 - the user's function: report, do not crash
                raise FunctionFailed(f"{self.name} raised {type(err).__name__}: {_short(str(err))} ({where})") from err
            try:  # reading the result runs the user's code too (a Mapping's items, a tensor subclass)
                return self._outputs(result, tensors, where, in_bytes)
            except EquivError:
                raise
            except Exception as err:  # noqa: BLE001
                raise EquivError(f"{self.name} returned something equiv cannot read ({where}): "
                                 f"{type(err).__name__}: {_short(str(err))}") from None

        try:
            return usercode.run(run, f"{self.name} ({where})", self.timeout, self.hard_exit)
        except usercode.Aborted as err:
            raise FunctionAborted(str(err)) from None

    def _outputs(self, result, tensors, where, in_bytes: int = 0) -> dict[str, torch.Tensor]:
        if result is None:
            if self.args is not None:
                raise EquivError(f"{self.name} returned None ({where}); with --args it must return its tensors")
            result = tensors  # converted in place
        if isinstance(result, (tuple, list)):
            if self.returns is None:
                raise EquivError(f"{self.name} returned a {type(result).__name__} of {len(result)} items ({where}); "
                                 f"name them with --returns NAME,NAME,... (returns=... in Python)")
            if len(result) != len(self.returns):
                raise EquivError(f"{self.name} returned {len(result)} items but --returns names {len(self.returns)}")
            result = dict(zip(self.returns, result))
        elif isinstance(result, torch.Tensor) and self.returns is not None and len(self.returns) == 1:
            result = {self.returns[0]: result}
        if not isinstance(result, Mapping):
            raise EquivError(f"{self.name} returned {type(result).__name__} ({where}); it must return a dict of "
                             f"tensors named as the spec's outputs (or a tuple named with --returns)")
        out = {}
        for k, v in result.items():
            if v is None:
                continue
            if not isinstance(k, str) or not isinstance(v, torch.Tensor):
                raise EquivError(f"{self.name} returned {{{_short(repr(k), 60)}: {type(v).__name__}}} ({where}); "
                                 f"expected tensor values under names")
            _check_usable(self.name, k, v, where, in_bytes)
            out[k] = v.detach().to("cpu").contiguous()
        return out


#: the most bytes an output may have, as a multiple of the inputs' bytes (a dequantizing conversion
#: widens fp4 to float32, 8x; padding to a block of a small test shape adds more), and at least
OUTPUT_FACTOR = 64
OUTPUT_FLOOR = 256 << 20


def _check_usable(fn: str, name: str, v: torch.Tensor, where: str, in_bytes: int) -> None:
    """A returned tensor equiv can read, bit for bit, without exhausting memory: a plain strided tensor
    with values (not meta, sparse, nested or quantized; not a subclass), of a size a conversion of the
    inputs can have (an expanded view of 1 TiB would be materialized by ``.contiguous()``)."""
    what = f"{fn} returned {_short(repr(name), 60)}"
    if type(v) not in (torch.Tensor, torch.nn.Parameter):
        raise EquivError(f"{what} as a {type(v).__name__} (a tensor subclass) ({where}); return plain tensors")
    if v.is_meta:
        raise EquivError(f"{what} as a meta tensor ({where}): it has a shape but no values to compare")
    if v.layout != torch.strided or v.is_nested or v.is_quantized:
        raise EquivError(f"{what} with layout {v.layout}{', nested' if v.is_nested else ''}"
                         f"{', quantized' if v.is_quantized else ''} ({where}); return dense (strided) tensors")
    nbytes = v.numel() * v.element_size()
    limit = max(OUTPUT_FLOOR, OUTPUT_FACTOR * in_bytes)
    if nbytes > limit:
        raise EquivError(f"{what} as {v.dtype}{list(v.shape)}, {nbytes / 2**30:.3g} GiB once materialized, from "
                         f"{in_bytes} bytes of inputs ({where}); a layout conversion returns about its inputs' size "
                         f"(at most {limit >> 20} MiB here)")


class FunctionFailed(EquivError):
    """The function raised."""


class FunctionAborted(EquivError):
    """The function (or the import of its module) exited or ran out of time: the run stops here."""


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_function(ref: str, timeout: float | None = usercode.CALL_TIMEOUT,
                  hard_exit: bool = False) -> tuple[Callable[..., Any], str]:
    """``package.module:function`` or ``path/to/file.py:function`` (``obj.attr`` paths allowed after the
    colon). The current directory is searched first, as ``python -m`` does. Runs the module's code."""
    module_name, sep, attr = ref.rpartition(":")
    if not sep or not module_name or not attr:
        raise EquivError(f"{ref!r}: expected MODULE:FUNCTION (e.g. mypkg.convert:process_weights, "
                         f"or path/to/file.py:convert)")
    try:
        if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
            path = Path(module_name)
            if not path.is_file():
                raise EquivError(f"{module_name}: no such file")
            spec = importlib.util.spec_from_file_location(f"_layoutc_against_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise EquivError(f"{module_name}: cannot be imported as a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            usercode.run(lambda: spec.loader.exec_module(module), f"importing {module_name}", timeout, hard_exit)
        else:
            cwd = str(Path.cwd())
            if cwd not in sys.path:
                sys.path.insert(0, cwd)
            module = usercode.run(lambda: importlib.import_module(module_name), f"importing {module_name}",
                                  timeout, hard_exit)
    except EquivError:
        raise
    except usercode.Aborted as err:
        raise FunctionAborted(str(err)) from None
    except ModuleNotFoundError as err:
        raise EquivError(f"cannot import {module_name}: {err}") from None
    except Exception as err:  # noqa: BLE001 - the user's module code ran and failed
        raise EquivError(f"importing {module_name} failed: {type(err).__name__}: {_short(str(err))}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
            from ..front.errors import suggest

            hint = suggest(part, names)
            raise EquivError(f"{module_name} has no {attr!r}" + (f" ({hint})" if hint else ""))
        obj = getattr(obj, part)
    if not callable(obj):
        raise EquivError(f"{ref} is a {type(obj).__name__}, not a function")
    return obj, ref


def as_target(fn: Callable[..., Any] | str | Target, args=None, returns=None,
              timeout: float | None = usercode.CALL_TIMEOUT, hard_exit: bool = False) -> Target:
    """``timeout``: seconds per call of the function and for the import of its module (None: no
    limit); ``hard_exit``: end the process when the code cannot be interrupted (:mod:`layoutc.equiv.usercode`)."""
    if isinstance(fn, Target):
        return fn
    if isinstance(fn, str):
        fn, name = load_function(fn, timeout, hard_exit)
    else:
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
        module = getattr(fn, "__module__", None)
        if module and module != "__main__" and "<lambda>" not in name:
            name = f"{module}:{name}"
    return Target(fn, name, tuple(args) if args else None, tuple(returns) if returns else None, timeout, hard_exit)


# ---------------------------------------------------------------------------
# encoding


def chain_mode(chain: Chain) -> str:
    """How a tensor is probed: ``elements`` when its chain moves whole elements (each element's bits
    carry digits of its address), ``bits`` when the chain moves single bits (each bit carries one
    binary digit of its own bit address), ``values`` when it casts (small digits that survive the
    casts), ``opaque`` when it computes bit fields (no digit survives: values are compared on random
    inputs only)."""
    mode = None
    for s in chain.steps:
        if s.op.category is not Category.VALUE:
            continue
        conv = s.op.conversion()
        if isinstance(conv, cv.View):
            continue
        if isinstance(conv, cv.Cast):
            mode = "values"
            continue
        if isinstance(conv, (cv.ExtractBits, cv.InsertBits)):
            return "opaque"
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


def map_codes(m: IndexMap, dims: Mapping[str, int], enc: Encoded, at: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
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


# ---------------------------------------------------------------------------
# comparison and findings


@attrs.frozen
class Element:
    """One output element that differs: where the spec and the function take it from."""

    index: tuple[int, ...]
    spec: str
    function: str
    path: str  # the statements that moved the spec's source here
    delta: tuple[int, ...] | None  # function source - spec source, same tensor


@attrs.frozen
class Finding:
    tensor: str
    summary: str
    statement: str  # "line 31: swap_halves(...)" or ""
    line: int | None
    count: int
    examples: tuple[Element, ...]
    detail: tuple[str, ...] = ()


@attrs.frozen
class TensorDiff:
    tensor: str
    differing: int
    total: int
    findings: tuple[Finding, ...]
    problem: str = ""  # missing output, shape or dtype mismatch: no element comparison


@attrs.frozen
class ShapeResult:
    dims: dict
    present: tuple[str, ...]
    diffs: tuple[TensorDiff, ...]
    note: str = ""
    seconds: float = 0.0
    mismatch: dict = attrs.field(factory=dict, eq=False, repr=False)  # tensor -> element mask (for --draw)

    @property
    def ok(self) -> bool:
        return not self.diffs


def _fmt_index(idx: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def _fmt_dims(dims: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in dims.items())


def _stmt_label(step: Step | None, filename: str) -> str:
    if step is None or step.statement is None:
        return "no statement"
    st = step.statement
    return f"line {st.pos.line} `{st.text}`"


class _Compare:
    """Compare one tensor's codes and explain the differences."""

    def __init__(self, spec, chain: Chain, plan: Plan, observed: Observed, spec_random: Mapping,
                 max_examples: int = 3):
        self.spec = spec
        self.spec_random = spec_random
        self.chain = chain
        self.plan = plan
        self.obs = observed
        self.enc = plan.inputs[chain.tensor]
        self.max_examples = max_examples
        self.filename = spec.program.filename

    def run(self) -> tuple[TensorDiff | None, torch.Tensor | None]:
        name = self.chain.tensor
        target = self.chain.target
        out_shape = concrete_shape(self.chain.out_type.shape, self.plan.dims)
        out_elem = self.chain.out_type.elem
        if name not in self.obs.shapes:
            return TensorDiff(name, 0, 0, (), f"the function returned no {name} (the spec has output {name}"
                                                f"{'?' if target is not None and target.optional else ''} : "
                                                f"{out_elem.name}{list(out_shape)})"), None
        got_shape, got_dtype = self.obs.shapes[name], self.obs.dtypes[name]
        if got_shape != out_shape:
            return TensorDiff(name, 0, 0, (), f"{name}: the function returns shape {list(got_shape)}, the spec "
                                                f"{list(out_shape)} ({out_elem.name}{self.chain.out_type.shape_str()})"), None
        accepted = out_elem.accepted_torch_dtypes()
        if got_dtype not in accepted:
            names = ", ".join(torch_dtype_name(d) for d in accepted)
            return TensorDiff(name, 0, 0, (), f"{name}: the function returns {torch_dtype_name(got_dtype)}, "
                                                f"the spec {out_elem.name} (torch {names})"), None
        numel = math.prod(out_shape) if out_shape else 1
        if self.enc.mode == "opaque":
            return self.values_only(out_shape, numel)
        want = spec_codes(self.chain, self.plan)
        got = self.obs.codes[name]
        if want.shape != got.shape:  # element width differs from the input's (a view across widths)
            return TensorDiff(name, 0, numel, (), f"{name}: cannot compare bit by bit (output bits "
                                                  f"{list(got.shape)} vs map {list(want.shape)})"), None
        bad = want != got
        elem_bad = bad.reshape(*out_shape, -1).any(-1) if self.enc.mode == "bits" else bad
        if not bool(elem_bad.any()):
            return self.values_only(out_shape, numel)
        findings = self.explain(want, got, bad, elem_bad)
        picture = (elem_bad, self.rows_of(want), self.rows_of(got))
        return TensorDiff(name, int(elem_bad.sum()), numel, tuple(findings)), picture

    def rows_of(self, codes: torch.Tensor) -> torch.Tensor:
        """The input row each output element reads (its first bit's, in bits mode); -1 for constants and
        other tensors' elements."""
        enc = self.enc
        c = codes[..., 0] if enc.mode == "bits" else codes
        local = c - enc.offset
        if enc.mode == "bits":
            local = torch.div(local, enc.width, rounding_mode="floor")
        mine = (c >= 0) & (local >= 0) & (local < enc.numel)
        from ..verify.rowmap import row_axis

        ra = row_axis(self.chain.source, len(enc.shape))
        inner = math.prod(enc.shape[ra + 1:]) if ra + 1 < len(enc.shape) else 1
        rows = torch.div(local, inner, rounding_mode="floor") % max(1, enc.shape[ra])
        return torch.where(mine, rows, -1)

    def values_only(self, out_shape, numel) -> tuple[TensorDiff | None, torch.Tensor | None]:
        """Positions agree (or cannot be probed): compare values on the random run."""
        name = self.chain.tensor
        mine = self.spec_random[name]
        theirs = self.obs.random_out.get(name)
        if theirs is None or tuple(theirs.shape) != tuple(mine.shape) or theirs.element_size() != mine.element_size():
            return None, None
        a, b = bit_view(mine), bit_view(theirs)
        bad = a != b
        if not bool(bad.any()):
            return None, None
        idx = [tuple(int(i) for i in row) for row in bad.nonzero()[: self.max_examples]]
        ex_ = []
        for i in idx:
            src = self.spec_source_text(i)
            ex_.append(Element(i, f"{_value_text(mine[i])} (from {src})", _value_text(theirs[i]), "", None))
        value_steps = [s for s in self.chain.steps if s.op.category is Category.VALUE]
        step = value_steps[-1] if value_steps else (self.chain.steps[-1] if self.chain.steps else None)
        kind = "values differ where both read the same elements" if self.enc.mode != "opaque" else \
            "values differ (the spec computes bit fields here, so only values on random inputs are compared)"
        f = Finding(name, kind, _stmt_label(step, self.filename), step.statement.pos.line if step and step.statement
                    else None, int(bad.sum()), tuple(ex_))
        return TensorDiff(name, int(bad.sum()), numel, (f,)), bad

    # -- sources in words --
    def code_text(self, code: int, mode: str | None = None) -> str:
        mode = mode or self.enc.mode
        if code == UNEXPLAINED:
            return "no input element (not a copy)"
        if code < 0:
            return f"constant {-code - 1}" + (" (padding)" if code == -1 else "")
        loc = self.plan.locate(code, mode)
        if loc is None:
            return f"address {code}"
        name, idx, bit = loc
        return f"{name}{_fmt_index(idx)}" + (f" bit {bit}" if bit is not None else "")

    def element_text(self, codes: torch.Tensor) -> str:
        """An element's source in words: one input element (bit for bit), or its bits' sources."""
        codes = [int(c) for c in codes.reshape(-1)]
        if self.enc.mode != "bits":
            return self.code_text(codes[0])
        width = len(codes)
        locs = [self.plan.locate(c, "bits") if c >= 0 else None for c in codes]
        if all(lc is not None for lc in locs) and len({(lc[0], lc[1]) for lc in locs}) == 1 \
                and all(lc[2] == b for b, lc in enumerate(locs)):
            return f"{locs[0][0]}{_fmt_index(locs[0][1])}"
        if all(c == codes[0] for c in codes) and codes[0] < 0:
            return self.code_text(codes[0]) if codes[0] != const_code(0) else "constant 0 (padding)"
        if all(c < 0 and c != UNEXPLAINED for c in codes):
            value = sum((-c - 1) << b for b, c in enumerate(codes))
            return f"constant {value:#x}"
        # runs of bits from one element with consecutive bits
        parts, b = [], 0
        while b < width:
            c = codes[b]
            lc = locs[b]
            e = b + 1
            while e < width and lc is not None and locs[e] is not None and locs[e][:2] == lc[:2] \
                    and locs[e][2] == lc[2] + (e - b):
                e += 1
            if lc is None:
                while e < width and codes[e] == c:
                    e += 1
                parts.append(f"bits {b}-{e - 1}: {self.code_text(c)}" if e - 1 > b else f"bit {b}: {self.code_text(c)}")
            else:
                src = f"{lc[0]}{_fmt_index(lc[1])} bit{'s' if e - 1 > b else ''} {lc[2]}" + (
                    f"-{lc[2] + e - 1 - b}" if e - 1 > b else "")
                parts.append(f"bit{'s' if e - 1 > b else ''} {b}{f'-{e - 1}' if e - 1 > b else ''} from {src}")
            b = e
        return "; ".join(parts)

    def first_real(self, codes: torch.Tensor) -> tuple[str, tuple[int, ...], int | None] | None:
        for c in codes.reshape(-1).tolist():
            if c >= 0:
                return self.plan.locate(int(c), self.enc.mode)
        return None

    def spec_source_text(self, idx) -> str:
        want = spec_codes(self.chain, self.plan)
        return self.element_text(want[idx])

    # -- the spec's path --
    def path(self, idx: tuple[int, ...], bit: int | None) -> list[tuple[Step, tuple, tuple, bool]]:
        """(step, coordinates before, after, valid) for the spec's source of output element ``idx``,
        from the input side."""
        coords, b = list(idx), bit
        out = []
        for step in reversed(self.chain.steps):
            m = step.op.index_map(step.in_type)
            env = dict(self.plan.dims)
            full = coords + [b if b is not None else 0] if m.bit_level else coords
            env.update({f"o{k}": int(v) for k, v in enumerate(full)})
            valid = bool(ex.evaluate(m.valid, env))
            src = [int(ex.evaluate(e, env)) for e in m.src]
            if m.bit_level:
                before, nb = src[:-1], src[-1]
                after_full, before_full = tuple(full), tuple(src)
            else:
                before, nb = src, b
                after_full, before_full = tuple(coords), tuple(src)
            out.append((step, before_full, after_full, valid))
            if not valid:
                break
            coords, b = before, nb
        out.reverse()
        return out

    def path_text(self, path) -> str:
        moved, seen = [], set()
        for step, before, after, valid in path:
            st = step.statement
            if st is None:
                continue
            what = f"line {st.pos.line} {_op_words(step)}"
            if not valid:
                moved.append(f"made padding by {what}")
                continue
            if before != after and st.pos.line not in seen:
                seen.add(st.pos.line)
                moved.append(what)
        if not moved:
            return "copied as is"
        return moved[0] if moved[0].startswith("made") else "moved by " + ", ".join(moved)

    def attribute(self, path, spec_src, fn_src) -> Step | None:
        """The statement responsible for where the spec takes this element from."""
        if path and not path[-1][3]:
            return path[-1][0]  # the step that made it padding (path stops there)
        differ = None
        if spec_src is not None and fn_src is not None and spec_src[0] == fn_src[0]:
            differ = {a for a, (x, y) in enumerate(zip(spec_src[1], fn_src[1])) if x != y}
        first_moving = None
        for step, before, after, valid in path:
            if before == after:
                continue
            if first_moving is None:
                first_moving = step
            if len(before) != len(after):
                return step
            if differ is None or any(before[a] != after[a] for a in differ if a < len(before)):
                return step
        return first_moving

    # -- explanation --
    def explain(self, want, got, bad, elem_bad) -> list[Finding]:
        bits = self.enc.mode == "bits"
        bad_idx = elem_bad.nonzero()
        count = int(bad_idx.shape[0])
        hyp = self.hypothesis(want, got, bad)
        # the first differing elements, then a spread of the others: each is traced through the spec
        if count > 384:
            spread = torch.linspace(128, count - 1, 256).long().unique()
            rows = torch.cat([bad_idx[:128], bad_idx[spread]])
        else:
            rows = bad_idx
        groups: dict[tuple, list] = {}
        for row in rows.tolist():
            idx = tuple(row)
            w, g = want[idx], got[idx]
            spec_src, fn_src = self.first_real(w), self.first_real(g)
            first_bit = None
            if bits:
                wbits = w.reshape(-1)
                diff_bits = (wbits != g.reshape(-1)).nonzero()
                first_bit = int(diff_bits[0]) if diff_bits.numel() else 0
            path = self.path(idx, first_bit if bits else None)
            step = self.attribute(path, spec_src, fn_src)
            if spec_src is None and fn_src is not None:
                kind = "the spec pads where the function reads an input element"
            elif spec_src is not None and fn_src is None:
                kind = "the function writes a constant where the spec reads an input element"
            elif spec_src is None:
                kind = "the spec and the function write different constants"
            elif int(g.reshape(-1).min()) == UNEXPLAINED:
                kind = "the function's element is not a copy of an input element"
            elif bits and spec_src[:2] == fn_src[:2] and self._same_elements(w, g):
                kind = ("the function reads the same input element with its bits in other places"
                        + (" (the two FP4 values of a byte: element 2j is bits 0-3, 2j+1 bits 4-7)"
                           if self.chain.source.elem.name == "fp4x2" else ""))
                step = self.bit_step()
            else:
                kind = "the function reads other input elements than the spec"
            delta = None
            if spec_src is not None and fn_src is not None and spec_src[0] == fn_src[0]:
                delta = tuple(b - a for a, b in zip(spec_src[1], fn_src[1]))
            elif spec_src is not None and fn_src is not None:
                delta = ("tensor", fn_src[0])
            key = (kind, id(step) if step is not None else None)
            el = Element(idx, self.element_text(w), self.element_text(g), self.path_text(path),
                         delta if delta is None or delta[0] != "tensor" else None)
            groups.setdefault(key, []).append((el, step, delta))
        findings = []
        if hyp is not None:
            text, step = hyp
            examples = [el for grp in groups.values() for el, _, _ in grp]
            examples.sort(key=lambda e: e.index)
            findings.append(Finding(self.chain.tensor, text, _stmt_label(step, self.filename),
                                    step.statement.pos.line if step is not None and step.statement else None,
                                    count, tuple(examples[: self.max_examples]),
                                    self.delta_lines(self.all_deltas(want, got, elem_bad), count, count)))
            return findings
        ordered = sorted(groups.items(), key=lambda kv: kv[1][0][0].index)
        scale = count / max(1, len(rows))
        for (kind, _), grp in ordered:
            step = grp[0][1]
            n = round(len(grp) * scale)
            findings.append(Finding(self.chain.tensor, kind, _stmt_label(step, self.filename),
                                    step.statement.pos.line if step is not None and step.statement else None,
                                    n, tuple(el for el, _, _ in grp[: self.max_examples]),
                                    self.delta_lines(_count([d for _, _, d in grp]), len(grp), n)))
        return findings

    def _same_elements(self, w: torch.Tensor, g: torch.Tensor) -> bool:
        def elems(c):
            return {self.plan.locate(int(x), "bits")[:2] for x in c.reshape(-1).tolist() if x >= 0}

        return elems(w) == elems(g)

    def bit_step(self) -> Step | None:
        """The last step of the chain that moves bits within elements (None: the spec moves none)."""
        return next((s for s in reversed(self.chain.steps) if s.op.facts.bits), None)

    def all_deltas(self, want: torch.Tensor, got: torch.Tensor, elem_bad: torch.Tensor) -> dict[tuple, int]:
        """How many differing elements read at each offset (the function's input index minus the spec's),
        over all of them: the traced elements are a sample (for the examples), but a swapped half should
        read as two equal counts, not as two sampled ones."""
        mode = self.enc.mode
        mine = [e for e in self.plan.inputs.values() if e.mode == mode]

        def first(codes):  # the first code of each differing element that is an input address
            c = codes.reshape(*elem_bad.shape, -1)[elem_bad]
            real = self.plan.real(c, mode)
            pos = real.to(torch.int8).argmax(-1, keepdim=True)
            return torch.where(real.any(-1), c.gather(1, pos)[:, 0], -1)

        def decode(code):
            tid, local = torch.full_like(code, -1), torch.zeros_like(code)
            for i, e in enumerate(mine):
                m = (code >= e.offset) & (code < e.offset + e.size)
                here = code - e.offset
                if mode == "bits":
                    here = torch.div(here, e.width, rounding_mode="floor")
                tid[m], local[m] = i, here[m]
            return tid, local

        (tw, lw), (tg, lg) = decode(first(want)), decode(first(got))
        counts: dict[tuple, int] = {}
        for i, e in enumerate(mine):
            both = (tw == i) & (tg == i)
            if not bool(both.any()):
                continue
            a, b = lw[both], lg[both]
            axes = []
            for n in reversed(e.shape):  # unravel both indices, axis by axis from the last
                axes.append(b % n - a % n if n else torch.zeros_like(a))
                a, b = (a // n, b // n) if n else (a, b)
            rows, n = torch.unique(torch.stack(list(reversed(axes)), 1), dim=0, return_counts=True)
            for row, k in zip(rows.tolist(), n.tolist()):
                counts[tuple(row)] = counts.get(tuple(row), 0) + k
        return counts

    def delta_lines(self, counts: dict, sampled: int, total: int) -> tuple[str, ...]:
        offsets = sorted(((d, n) for d, n in counts.items() if d is not None and d[0] != "tensor" and any(d)),
                         key=lambda kv: -kv[1])
        if not offsets:
            return ()
        of = f" (of {sampled} sampled)" if sampled < total else ""
        words = [f"{_fmt_delta(d)} at {n}" for d, n in offsets[:4]]
        more = f" and {len(offsets) - 4} more offsets" if len(offsets) > 4 else ""
        return (f"input index read by the function minus the spec's: {', '.join(words)}{more}{of}",)

    def hypothesis(self, want, got, bad) -> tuple[str, Step | None] | None:
        """A change of one statement of the spec that gives exactly the function's sources."""
        flat_bad = bad.reshape(-1).nonzero().reshape(-1)
        flat_ok = (~bad).reshape(-1).nonzero().reshape(-1)
        g = torch.Generator().manual_seed(0)
        pick_bad = flat_bad[torch.randperm(flat_bad.numel(), generator=g)[:2048]]
        pick_ok = flat_ok[torch.randperm(flat_ok.numel(), generator=g)[:1024]]
        pick = torch.cat([pick_bad, pick_ok])
        coords = list(torch.unravel_index(pick, tuple(want.shape)))
        target = got.reshape(-1)[pick]
        out_shape = concrete_shape(self.chain.out_type.shape, self.plan.dims)
        for text, step, maps in self.alternatives():
            try:
                m = _mode_map(self.chain, self.enc.mode, maps)
                if concrete_shape(m.out_shape, self.plan.dims)[: len(out_shape)] != out_shape:
                    continue
                codes = map_codes(m, self.plan.dims, self.enc, coords)
            except Exception:  # noqa: BLE001 - an alternative that does not apply here is just not it
                continue
            if torch.equal(codes, target):
                return text, step
        return None

    def alternatives(self) -> Iterable[tuple[str, Step, list[IndexMap]]]:
        """The spec with one statement changed, as lists of maps: a statement left out, an argument of
        a primitive changed, a family parameter changed."""
        steps = list(self.chain.steps)
        maps = [s.op.index_map(s.in_type) for s in steps]
        dims = self.plan.dims
        name = self.chain.tensor
        # a whole statement left out (all its steps), when the shapes allow it
        by_statement: dict[int, list[int]] = {}
        for i, s in enumerate(steps):
            if s.statement is not None:
                by_statement.setdefault(id(s.statement), []).append(i)
        for ids in by_statement.values():
            first, last = steps[ids[0]], steps[ids[-1]]
            if concrete_shape(first.in_type.shape, dims) != concrete_shape(last.out_type.shape, dims):
                continue
            if all(steps[i].op.category is Category.VALUE for i in ids):
                continue
            keep = [m for i, m in enumerate(maps) if i not in ids]
            yield (f"as if line {first.statement.pos.line} were not applied to {name}: the function's elements are "
                   f"the spec's without `{first.statement.text}`", first, keep)
        # one argument of a primitive changed
        for i, s in enumerate(steps):
            if s.tag is not None or s.statement is None:
                continue
            for field in attrs.fields(type(s.op)):
                value = getattr(s.op, field.name)
                if field.metadata.get("kind") not in ("int",) or not isinstance(value, int) or isinstance(value, bool):
                    continue
                for v in _nearby(value):
                    try:
                        op = attrs.evolve(s.op, **{field.name: v})
                        inferred = op.infer(s.in_type)
                        if concrete_shape(inferred.type.shape, dims) != concrete_shape(s.out_type.shape, dims):
                            continue
                        alt = maps[:i] + [op.index_map(s.in_type)] + maps[i + 1:]
                    except Exception:  # noqa: BLE001
                        continue
                    arg = field.metadata.get("arg", field.name)
                    yield (f"as if line {s.statement.pos.line} were `{s.statement.text}` with {arg}={v} instead of "
                           f"{arg}={value} for {name}", s, alt)
        # a family parameter changed
        from ..lang.expand import family_chain

        apps: dict[tuple, list[int]] = {}
        for i, s in enumerate(steps):
            if s.tag is not None:
                apps.setdefault(s.tag.instance, []).append(i)
        for ids in apps.values():
            tag = steps[ids[0]].tag
            for key, value in tag.args:
                for v in _nearby(value):
                    params = dict(tag.args)
                    params[key] = v
                    try:
                        chain = family_chain(tag.family, tag.role, steps[ids[0]].in_type, params, set(dims),
                                             self.spec.program.families)
                        fam_maps = [a.op.index_map(a.in_type) for a in chain]
                    except Exception:  # noqa: BLE001
                        continue
                    alt = maps[: ids[0]] + fam_maps + maps[ids[-1] + 1:]
                    st = steps[ids[0]].statement
                    yield (f"as if line {st.pos.line} packed {name} with {tag.family}({key}={v}) instead of "
                           f"{key}={value}", steps[ids[0]], alt)


def _op_words(step: Step) -> str:
    if step.tag is not None:
        return f"{step.statement.op} {step.tag.family}" if step.statement is not None else step.tag.family
    return step.statement.op if step.statement is not None else step.op.name


def _nearby(value: int) -> list[int]:
    cands = {value * 2, value // 2 if value > 1 else None, 1, 2, 4, 16, 32, 64, 128, 256}
    return sorted(v for v in cands if v is not None and v != value and v >= 1)


def _count(items) -> dict:
    counts: dict = {}
    for d in items:
        counts[d] = counts.get(d, 0) + 1
    return counts


def _fmt_delta(d: tuple[int, ...]) -> str:
    return "[" + ", ".join(f"{v:+d}" if v else "0" for v in d) + "]"


def _value_text(t: torch.Tensor) -> str:
    bits = int(bit_view(t.reshape(1))[0]) & ((1 << (8 * t.element_size())) - 1)
    if t.dtype.is_floating_point:
        return f"{float(t.to(torch.float64)):g} ({bits:#0{2 + 2 * t.element_size()}x})"
    return f"{bits:#0{2 + 2 * t.element_size()}x}"


# ---------------------------------------------------------------------------
# shapes


def _constraints(spec, variant: Variant) -> list[tuple[ex.Expr, int]]:
    known = [(k.value, k.multiple) for c in variant.chains for k in c.constraints]
    known += spec.program.assumed
    return known


def _valid(spec, variant: Variant, env: Mapping[str, int]) -> str | None:
    """None when the dims satisfy every rule of the variant, else the first rule that fails."""
    program = spec.program
    for a in program.assumptions:
        v = env.get(a.dim, 0)
        if v < max(1, a.minimum) or v % a.multiple:
            return f"the spec assumes {a.dim} % {a.multiple} == 0" + (f" and {a.dim} >= {a.minimum}" if a.minimum > 1 else "")
    for a in program.size_assumptions:
        if not a.holds(env):
            return f"the spec assumes {a.text}"
    for c in program.conditions:
        if c.holds(env) != (c.label in variant.present):
            return f"size condition {c.label}"
    for c in variant.chains:
        for k in c.constraints:
            try:
                value = ex.evaluate(k.value, env)
            except (KeyError, ZeroDivisionError):
                return k.message()
            if k.multiple == 0:
                if not value:
                    return k.message()
            elif value % k.multiple:
                return k.message()
        for s in c.source.shape:
            if ex.evaluate(s, env) <= 0:
                return f"{c.tensor} would be empty"
    return None


def _padding(variant: Variant, env: Mapping[str, int]) -> int:
    """How many steps of the variant really pad at these dims (a map that is not total changing sizes)."""
    n = 0
    for c in variant.chains:
        for s in c.steps:
            if not s.op.index_map(s.in_type).is_total():
                if concrete_shape(s.in_type.shape, env) != concrete_shape(s.out_type.shape, env):
                    n += 1
    return n


def sample_shapes(spec, variant: Variant, given: Mapping[str, int] | None, count: int = 4) -> list[dict]:
    """``count`` dims to compare at: the given ones, one near them that needs padding (where the spec
    pads), larger ones (each dim at its next valid value) and the smallest valid ones; then others near
    the given ones. Each satisfies every rule of the variant."""
    dims = list(spec.program.dims)
    if given is None:
        given = default_dims(spec, variant)
    given = {d: int(given[d]) for d in dims}
    why = _valid(spec, variant, given)
    if why is not None:
        raise EquivError(f"the dims {_fmt_dims(given)} do not fit the spec: {why}")
    shapes = [given]
    if count <= 1:
        return shapes
    import itertools

    # Per dim, only the valid values used below, each dim moved alone: the smallest, the one below the
    # given value, and the two above it (up to max(4*given, 512)); searched lazily, as checking a value
    # compiles the spec's rules at it.
    smallest, below, above = {}, {}, {}
    for d in dims:
        def ok(v, d=d):
            return _valid(spec, variant, {**given, d: v}) is None

        smallest[d] = next(v for v in range(1, given[d] + 1) if ok(v))  # the given value itself is valid
        below[d] = next((v for v in range(given[d] - 1, 0, -1) if ok(v)), given[d])
        top = max(4 * given[d], 512)
        above[d] = list(itertools.islice((v for v in range(given[d] + 1, top + 1) if ok(v)), 2))

    def neighbours(d):
        return sorted({below[d], given[d], *above[d]})

    near = [dict(zip(dims, combo)) for combo in itertools.product(*(neighbours(d) for d in dims))]
    near = [e for e in near if _valid(spec, variant, e) is None]

    def distance(e):
        return sum(abs(math.log(e[d] / given[d])) for d in dims)

    padded = sorted(near, key=lambda e: (-_padding(variant, e), distance(e)))
    if padded and _padding(variant, padded[0]) > _padding(variant, given):
        shapes.append(padded[0])
    small = dict(smallest)
    # larger: every dim at its next valid value; the experts (E) as given (a second expert is there already)
    larger = {d: given[d] if d == "E" else (above[d][0] if above[d] else given[d]) for d in dims}
    for e in (larger, small):
        if _valid(spec, variant, e) is None and e not in shapes:
            shapes.append(e)
    for e in sorted(near, key=distance):
        if len(shapes) >= count:
            break
        if e not in shapes:
            shapes.append(e)
    return shapes[:count]


def default_dims(spec, variant: Variant) -> dict[str, int]:
    """Small dims where every layout rule of the spec holds and tiles repeat: each dim at its second
    smallest valid value (two experts)."""
    from ..algebra.instances import variant_instances

    inst = variant_instances(spec.program, variant.present, _constraints(spec, variant))
    if not inst:
        raise EquivError("no small dims satisfy the spec's rules; give --dims")
    values = {d: sorted({i[d] for i in inst}) for d in spec.program.dims}
    env = {d: v[min(1, len(v) - 1)] for d, v in values.items()}
    if _valid(spec, variant, env) is not None:
        env = inst[0]
    if "E" in env and _valid(spec, variant, {**env, "E": 2}) is None:
        env["E"] = 2
    return env


# ---------------------------------------------------------------------------
# the whole comparison


@attrs.frozen
class Result:
    spec_name: str
    spec_file: str
    function: str
    params: dict
    shapes: tuple[ShapeResult, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.shapes)

    @property
    def first_failure(self) -> ShapeResult | None:
        return next((s for s in self.shapes if not s.ok), None)

    def verdict(self) -> str:
        n = len({tuple(sorted(s.dims.items())) for s in self.shapes})
        variants = len({s.present for s in self.shapes})
        if self.ok:
            extra = f" ({variants} combinations of optional inputs)" if variants > 1 else ""
            return f"equivalent at {n} shape{'s' if n != 1 else ''}{extra}"
        return "NOT equivalent"

    def report(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in self.params.items())
        lines = [f"layoutc equiv: {self.spec_file} ({self.spec_name}{', ' + params if params else ''}) "
                 f"against {self.function}"]
        for s in self.shapes:
            opt = f"; optional inputs: {', '.join(s.present) or 'none'}" if s.present is not None else ""
            status = "same" if s.ok else f"{len(s.diffs)} tensor{'s' if len(s.diffs) != 1 else ''} differ"
            lines.append(f"  {_fmt_dims(s.dims)}{opt}: {status}" + (f" ({s.note})" if s.note else ""))
        fail = self.first_failure
        if fail is not None:
            lines.append("")
            lines.append(f"first differences, at {_fmt_dims(fail.dims)}"
                         + (f" (optional inputs: {', '.join(fail.present) or 'none'})" if fail.present is not None else "")
                         + ":")
            for d in fail.diffs:
                lines += _render_diff(d, self.spec_file)
        lines.append("")
        lines.append(self.verdict() + f" ({self.seconds:.1f} s)")
        return "\n".join(lines) + "\n"


def _render_diff(d: TensorDiff, spec_file: str) -> list[str]:
    if d.problem:
        return [f"{d.tensor}: {d.problem}" if not d.problem.startswith(d.tensor) else d.problem]
    out = [f"{d.tensor}: {d.differing} of {d.total} elements differ"]
    for i, f in enumerate(d.findings, 1):
        where = f" [{spec_file}:{f.line}]" if f.line else ""
        out.append(f"  finding {i}: {f.summary} ({f.count} element{'s' if f.count != 1 else ''}){where}")
        if f.statement and f.statement != "no statement" and not f.summary.startswith("as if"):
            out.append(f"    spec statement: {f.statement}")
        elif f.statement == "no statement" and "bits in other places" in f.summary:
            out.append("    the spec moves no bits within elements of this tensor")
        for el in f.examples:
            out.append(f"    {d.tensor}{_fmt_index(el.index)}: spec reads {el.spec}" + (f" ({el.path})" if el.path else ""))
            out.append(f"    {' ' * len(d.tensor + _fmt_index(el.index))}  function read {el.function}")
        for line in f.detail:
            out.append(f"    {line}")
    return out


@contextlib.contextmanager
def _threads(n: int | None):
    """Small tensors, many calls: one intra-op thread avoids fork/join costs (restored afterwards)."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def equivalent(spec, fn, dims: Mapping[str, int] | None = None, params: Mapping[str, Any] | None = None,
               shapes: int = 4, args: Sequence[str] | None = None, returns: Sequence[str] | None = None,
               variants: str = "all", stop_at_first: bool = True, threads: int | None = 1,
               progress: Callable[[str], None] | None = None, timeout: float | None = usercode.CALL_TIMEOUT,
               hard_exit: bool = False) -> Result:
    """Compare ``spec`` (a CompiledSpec, a path to a .lyt file, or spec text) with the conversion
    function ``fn`` (a callable, ``"module:function"`` or a :class:`Target`) at ``shapes`` shapes
    sampled around ``dims``, for every combination of optional inputs (``variants="all"``; ``"full"``:
    only with every optional input present). ``timeout``: seconds per call of the function (exiting or
    running out of time is an :class:`EquivError`, never a verdict)."""
    start = time.perf_counter()
    compiled = load_spec(spec, params)
    target = as_target(fn, args, returns, timeout, hard_exit)
    for what, names, known in (("--args", target.args, compiled.input_names),
                               ("--returns", target.returns, compiled.output_names)):
        unknown = [n for n in names or () if n not in known]
        if unknown:
            raise EquivError(f"{what} names {', '.join(unknown)}, not {'an input' if what == '--args' else 'an output'} "
                             f"of {compiled.name} ({', '.join(known)})")
    results: list[ShapeResult] = []
    plan_list = _plans(compiled, dims, shapes, variants)
    with _threads(threads):
        for variant, env in plan_list:
            t0 = time.perf_counter()
            if progress is not None:
                progress(f"comparing at {_fmt_dims(env)}")
            try:
                r = compare_at(compiled, target, variant, env)
            except FunctionFailed as err:
                if not results:  # at the dims the user gave (or the first ones sampled): a usage problem
                    raise EquivError(f"{err}; give dims the function accepts (--dims)") from None
                r = ShapeResult(dict(env), (), (TensorDiff("*", 0, 0, (), f"{err}, where the spec converts (restrict "
                                                                          f"the spec with assume lines, or compare at "
                                                                          f"fewer shapes)"),))
            results.append(attrs.evolve(r, seconds=time.perf_counter() - t0))
            if stop_at_first and not r.ok:
                break
    has_optional = bool(compiled.program.optional_inputs)
    if not has_optional:
        results = [attrs.evolve(r, present=None) for r in results]
    return Result(compiled.name, compiled.program.filename, target.name, dict(compiled.params), tuple(results),
                  time.perf_counter() - start)


def _plans(compiled, dims, shapes: int, variants: str) -> list[tuple[Variant, dict]]:
    program = compiled.program
    optional = set(program.optional_inputs)
    all_variants = list(compiled.compiled.variants)
    full = [v for v in all_variants if optional <= v.present] or all_variants
    if dims is not None:
        missing = [d for d in program.dims if d not in dims]
        if missing:
            raise EquivError(f"--dims must give {', '.join(missing)} (the spec's dims are {', '.join(program.dims)})")
        unknown = [d for d in dims if d not in program.dims]
        if unknown:
            raise EquivError(f"{', '.join(unknown)} {'is not a dim' if len(unknown) == 1 else 'are not dims'} of "
                             f"{program.name} (its dims: {', '.join(program.dims)})")
    out: list[tuple[Variant, dict]] = []
    # every optional input present, at all shapes (variants with other size conditions: their own dims)
    main = None
    for v in full:
        try:
            envs = sample_shapes(compiled, v, dims, shapes)
        except EquivError:
            if dims is not None and len(full) == 1:
                raise
            continue
        if main is None:
            main = envs[0]
        out += [(v, e) for e in envs]
    if not out:
        if dims is not None:
            sample_shapes(compiled, full[0], dims, shapes)  # raises with the reason
        raise EquivError("no dims satisfy the spec's rules")
    if variants == "all":
        for v in all_variants:
            if v in full:
                continue
            if main is not None and _valid(compiled, v, main) is None:
                out.append((v, main))
            else:
                try:
                    out.append((v, sample_shapes(compiled, v, None, 1)[0]))
                except EquivError:
                    continue
    return out


def load_spec(spec, params: Mapping[str, Any] | None = None):
    from ..api import CompiledSpec, compile_file, compile_source

    if isinstance(spec, CompiledSpec):
        if params and dict(params) != {k: v for k, v in spec.params.items() if k in params}:
            raise EquivError("params given for an already compiled spec; compile it with them")
        return spec
    from ..shipped import find, locate

    text = str(spec)
    if isinstance(spec, Path) or (("\n" not in text) and (text.endswith(".lyt") or find(text) is not None)):
        path = locate(spec)  # a file, or a shipped spec's name
        if not path.is_file():
            raise EquivError(f"{path}: no such spec file")
        return compile_file(path, params)
    return compile_source(text, "<spec>", params)


def compare_at(compiled, target: Target, variant: Variant, dims: Mapping[str, int]) -> ShapeResult:
    plan = Plan.for_variant(variant, dims)
    optional = compiled.program.optional_inputs
    present = tuple(sorted(n for n in variant.present if n in optional))
    where = f"at {_fmt_dims(dims)}"
    if optional:
        where += f", optional inputs {', '.join(present) or 'absent'}"
    observed = observe(target, plan, compiled.params, where)
    # a function that does not move whole elements where the spec does: look at its bits
    loose = [n for n, e in plan.inputs.items() if e.mode == "elements" and n in observed.codes
             and bool((observed.codes[n] == UNEXPLAINED).any())]
    if loose:
        plan = Plan.for_variant(variant, dims, force_bits=loose)
        observed = observe(target, plan, compiled.params, where)
    spec_random = compiled.convert({k: v.clone() for k, v in observed.random_in.items()}, plan.dims, "eager")
    diffs, masks = [], {}
    for chain in variant.chains:
        d, mask = _Compare(compiled, chain, plan, observed, spec_random).run()
        if d is not None:
            diffs.append(d)
            if mask is not None:
                masks[chain.tensor] = mask
    expected = {c.tensor for c in variant.chains}
    extra = sorted(set(observed.shapes) - expected - set(plan.inputs))
    note = f"the function also returns {', '.join(extra)}, which the spec does not have" if extra else ""
    return ShapeResult(dict(dims), present, tuple(diffs), note, mismatch=masks)


# ---------------------------------------------------------------------------
# a picture of the differences


def draw(result: Result, path: str | Path) -> Path | None:
    """A picture of the differing tensors at the first failing shape. For each: the input row every output
    element reads, per the spec and per the function (each output seen as a matrix: the last axis across,
    the others flattened down; grey: padding), and the elements that differ. A swapped half shows as two
    bands trading places, a shifted block as a band out of step. Needs matplotlib. None when nothing differs."""
    fail = result.first_failure
    if fail is None or not fail.mismatch:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = list(fail.mismatch.items())[:3]
    fig, axes = plt.subplots(len(items), 3, figsize=(12, 3.2 * len(items)), squeeze=False)
    for row, (name, (mask, spec_rows, fn_rows)) in zip(axes, items):
        def flat(t):
            return (t.reshape(-1, t.shape[-1]) if t.dim() > 1 else t.reshape(1, -1)).to(torch.float32)

        top = float(max(int(spec_rows.max()), int(fn_rows.max()), 1))
        cmap = plt.get_cmap("viridis").with_extremes(under="0.8")
        for ax, data, title in ((row[0], spec_rows, "input row read (spec)"), (row[1], fn_rows, "input row read (function)")):
            im = ax.imshow(flat(data).numpy(), aspect="auto", cmap=cmap, vmin=0, vmax=top, interpolation="nearest")
            ax.set_title(f"{name}: {title}", fontsize=8)
        fig.colorbar(im, ax=row[1], fraction=0.04)
        row[2].imshow(flat(mask).numpy(), aspect="auto", cmap="Reds", vmin=0, vmax=1, interpolation="nearest")
        row[2].set_title(f"{int(mask.sum())} of {mask.numel()} elements differ (red)", fontsize=8)
        for ax in row:
            ax.tick_params(labelsize=7)
    fig.suptitle(f"{result.spec_name} vs {result.function} at {_fmt_dims(fail.dims)}: output elements "
                 f"(last axis across, others flattened down)", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
