"""Reading and checking a safetensors shard's header, before any shard is converted.

``layoutc convert`` reads every input shard's header first (a few KiB each) and refuses a malformed
one with a message naming the file and the tensor: nesting too deep for the JSON parser, a dim past
what torch can index, a name that is not valid UTF-8 (a lone surrogate), a ``__metadata__`` that is
not an object of strings, offsets that do not tile the data, two entries with one name. The rules are
the safetensors format's (what ``safetensors.safe_open`` accepts), a little stricter where safetensors
is lenient in ways that would make a converted shard ambiguous (duplicate names: it keeps the last).
Without this check such a file surfaced halfway through a run, as an internal error of the
pipelined reader (exit 3) after other shards were written.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import attrs

from ..runtime.checks import LayoutError
from ..front.text import display

MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header
#: the largest dim torch can hold (an int64); safetensors reads dims as usize
MAX_DIM = (1 << 63) - 1
#: safetensors dtype name -> bits per element (the format's dtypes, not only the ones torch reads)
BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "I64": 64, "U64": 64, "F64": 64,
}


@attrs.frozen
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@attrs.frozen
class Header:
    path: Path
    tensors: tuple[TensorInfo, ...]  # in the header's order
    metadata: dict[str, str] | None
    size: int  # the file's size

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]


def utf8_name(name: str) -> bool:
    """Whether ``name`` can be written as UTF-8 (JSON's ``\\ud800`` decodes to a lone surrogate, which cannot)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def load_json(text: str | bytes, where: str, what: str) -> Any:
    """JSON from a file a user gave: every way it can be malformed (syntax, encoding, nesting deeper
    than the parser recurses, a number with too many digits) is a LayoutError naming the file."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _Duplicate as dup:
        raise LayoutError(f"{where}: not {what} (the key {display(repr(dup.key))} appears twice)") from None
    except RecursionError:
        raise LayoutError(f"{where}: not {what} (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError, so is a 5000-digit int
        raise LayoutError(f"{where}: not {what} ({display(str(err))[:200]})") from None


class _Duplicate(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def read_header(path: Path) -> Header:
    """``path``'s header, checked as the safetensors format requires; a LayoutError naming the file
    (and the tensor) otherwise. Reads only the header."""
    where = display(str(path))
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise LayoutError(f"{where}: not a safetensors file ({size} bytes, shorter than its 8-byte "
                                  f"header size)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER:
                raise LayoutError(f"{where}: not a safetensors file (a {n}-byte header; the format allows "
                                  f"{MAX_HEADER})")
            if 8 + n > size:
                raise LayoutError(f"{where}: not a safetensors file (its header says {n} bytes, the file has "
                                  f"{size - 8} after the size)")
            raw = f.read(n)
    except OSError as err:
        raise LayoutError(f"{where}: cannot read ({err.strerror or err})") from None
    if len(raw) != n:
        raise LayoutError(f"{where}: cannot read (the file ended early: it changed while being read?)")
    header = load_json(raw, where, "a safetensors file: its header is not valid JSON")
    if not isinstance(header, dict):
        raise LayoutError(f"{where}: not a safetensors file (its header is a JSON {type(header).__name__}, "
                          f"not an object)")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) and utf8_name(v) and utf8_name(k)
                                             for k, v in metadata.items())):
        raise LayoutError(f"{where}: __metadata__ must be an object of strings (safetensors refuses the file)")
    tensors = [_tensor(where, name, info) for name, info in header.items()]
    data = size - 8 - n
    pos = 0
    for t in sorted(tensors, key=lambda t: (t.start, t.end)):  # the data must be tiled exactly
        if t.start != pos:
            what = "overlaps the tensor before it" if t.start < pos else f"leaves bytes {pos}..{t.start} unused"
            raise LayoutError(f"{where}: tensor {display(repr(t.name))}: its data_offsets {what}")
        pos = t.end
    if pos != data:
        how = "the file is truncated" if data < pos else "bytes after the last tensor"
        raise LayoutError(f"{where}: not a valid safetensors file: the tensors cover {pos} bytes of data, the "
                          f"file holds {data} ({how})")
    return Header(path, tuple(tensors), metadata, size)


def _tensor(where: str, name: str, info: Any) -> TensorInfo:
    shown = display(repr(name))
    if not utf8_name(name):
        raise LayoutError(f"{where}: the tensor name {shown} is not valid UTF-8 (a lone surrogate)")
    if not isinstance(info, dict):
        raise LayoutError(f"{where}: tensor {shown}: expected an object with dtype, shape and data_offsets")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in BITS:
        raise LayoutError(f"{where}: tensor {shown}: unknown dtype {display(repr(dtype))[:60]}")
    if not isinstance(shape, list) or not all(type(s) is int and 0 <= s <= MAX_DIM for s in shape):
        raise LayoutError(f"{where}: tensor {shown}: the shape must be a list of integers from 0 to 2**63-1, "
                          f"got {display(repr(shape))[:120]}")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int and o >= 0 for o in offsets)
            or offsets[1] < offsets[0]):
        raise LayoutError(f"{where}: tensor {shown}: data_offsets must be [start, end] with 0 <= start <= end, "
                          f"got {display(repr(offsets))[:120]}")
    numel = math.prod(shape)
    if numel > MAX_DIM:
        raise LayoutError(f"{where}: tensor {shown}: shape {shape} has more elements than torch can hold")
    bits = numel * BITS[dtype]
    if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
        raise LayoutError(f"{where}: tensor {shown}: {dtype}{shape} is {bits / 8:g} bytes, its data_offsets "
                          f"span {offsets[1] - offsets[0]}")
    return TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])
