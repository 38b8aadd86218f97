"""Writing one safetensors shard, byte for byte the same every time.

``safetensors.torch.save_file`` keeps the header's metadata in a hash map, so two conversions of
one checkpoint write different bytes (the metadata keys come out in another order), which defeats
comparing converted checkpoints by hash. The format is small enough to write directly: an 8-byte
little-endian header length, a JSON header (``__metadata__`` first, then each tensor's dtype, shape
and byte range, sorted by name, padded with spaces to a multiple of 8), then the tensors' bytes in
header order. Files written here are read by safetensors itself in the tests.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
from pathlib import Path
from typing import Mapping

import torch

#: torch dtype -> safetensors dtype name
DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}
for _name, _code in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"), ("float8_e8m0fnu", "F8_E8M0")):
    if hasattr(torch, _name):
        DTYPES[getattr(torch, _name)] = _code


def header(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> bytes:
    entries: dict = {"__metadata__": dict(sorted(metadata.items()))} if metadata else {}
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} cannot be stored in safetensors")
        size = t.numel() * t.element_size()
        entries[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _raw(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (and without numpy)."""
    n = t.numel() * t.element_size()
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def create(path: str | Path, mode: str = "wb"):
    """A new, empty file at ``path`` (a temporary file that is then renamed into place): whatever the
    name held is removed first and the file is created exclusively, never opened through a symlink
    someone left there (``open(path, "w")`` would follow it and overwrite its target)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise IsADirectoryError(21, "a folder is in the way of a temporary file", str(path)) from None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def write(path: str | Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> None:
    """Write ``tensors`` (CPU) to ``path`` and fsync it; the caller renames it into place."""
    with create(path) as f:
        f.write(header(tensors, metadata))
        for name in sorted(tensors):
            t = tensors[name].detach().cpu().contiguous()
            if t.numel():
                f.write(_raw(t))
        f.flush()
        os.fsync(f.fileno())
