"""CPU shard writes through direct I/O (layoutc.convert.shardio: ``O_DIRECT`` through an aligned bounce buffer).

Whatever path writes a shard (direct, buffered by ``LAYOUTC_DIRECT_IO=0``, or buffered from the middle of the
file after the file system refused an aligned direct write), the file holds exactly the bytes of
:func:`layoutc.convert.shardfile.write`: the header, then each tensor's bytes, and nothing after them (the last
direct chunk's padding is cut off). Sizes are chosen so that the header, the tensors and the chunks all end
off the alignment.
"""

from __future__ import annotations

import errno
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layoutc.convert import shardfile, shardio


def _tensors(sizes, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, n in enumerate(sizes):
        dtype = (torch.uint8, torch.bfloat16, torch.int32)[i % 3]
        raw = torch.randint(0, 256, (n * torch.empty((), dtype=dtype).element_size(),), dtype=torch.uint8,
                            generator=g)
        out[f"model.layers.{i}.w"] = raw.view(dtype)
    return out


def _expected(tmp_path, tensors, meta):
    ref = tmp_path / "ref.safetensors"
    shardfile.write(ref, tensors, meta)
    return ref.read_bytes()


def _supports_direct(folder) -> bool:
    probe = folder / ".probe"
    with shardfile.create(probe) as f:
        ok = shardio._direct(f.fileno(), True)
    probe.unlink()
    return ok


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(0, 30000), min_size=1, max_size=5), chunk=st.sampled_from([4096, 5000, 65536]),
       seed=st.integers(0, 2**16))
def test_direct_writes_give_the_shard_files_bytes(tmp_path_factory, sizes, chunk, seed):
    tmp_path = tmp_path_factory.mktemp("direct")
    tensors, meta = _tensors(sizes, seed), {"format": "pt", "note": "x" * (seed % 37)}
    prof = shardio.Profile()
    io = shardio.ShardIO("cpu", prof, chunk=chunk, hash_threads=1)
    try:
        n = io.write(tmp_path / "out.safetensors", tensors, meta)
    finally:
        io.close()
    want = _expected(tmp_path, tensors, meta)
    assert (tmp_path / "out.safetensors").read_bytes() == want and n == len(want)
    if _supports_direct(tmp_path):
        assert prof.bytes.get("write_direct") == len(want) and "write_buffered" not in prof.bytes


def test_the_switch_and_a_refused_direct_write_stay_buffered_with_the_same_bytes(tmp_path, monkeypatch):
    tensors, meta = _tensors([70000, 5, 12345], 1), {"format": "pt"}
    want = _expected(tmp_path, tensors, meta)

    monkeypatch.setenv("LAYOUTC_DIRECT_IO", "0")
    prof = shardio.Profile()
    io = shardio.ShardIO("cpu", prof, chunk=16384, hash_threads=1)
    io.write(tmp_path / "off.safetensors", tensors, meta)
    assert (tmp_path / "off.safetensors").read_bytes() == want
    assert "write_direct" not in prof.bytes and prof.bytes["write_buffered"] == len(want)
    monkeypatch.delenv("LAYOUTC_DIRECT_IO")
    if not _supports_direct(tmp_path):
        pytest.skip("this file system has no direct I/O")

    # a file system that wants a stricter alignment: EINVAL on the first direct write, buffered from there
    real_write, calls = os.write, []

    def strict(fd, data):
        if not calls and os.O_DIRECT & __import__("fcntl").fcntl(fd, __import__("fcntl").F_GETFL):
            calls.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(shardio.os, "write", strict)
    prof = shardio.Profile()
    io.profile = prof
    io.write(tmp_path / "refused.safetensors", tensors, meta)
    io.close()
    assert calls and (tmp_path / "refused.safetensors").read_bytes() == want
    assert prof.bytes.get("write_buffered") == len(want) and "write_direct" not in prof.bytes


def test_other_write_errors_are_raised(tmp_path, monkeypatch):
    if not _supports_direct(tmp_path):
        pytest.skip("this file system has no direct I/O")

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shardio.os, "write", full)
    io = shardio.ShardIO("cpu", shardio.Profile(), chunk=8192, hash_threads=1)
    with pytest.raises(OSError, match="No space"):
        io.write(tmp_path / "full.safetensors", _tensors([100], 0), {})
    io.close()
