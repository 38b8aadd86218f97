"""The CPU pipeline reads a shard through a copy-on-write memory map (``shardio.ShardIO._read_mapped``):
the tensors are the file's bytes without a copy, no write of theirs reaches the file, and a shard
whose file changes while it is converted is refused rather than stamped with a digest of other bytes."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import layoutc
from layoutc.convert import shardfile, shardio, shardpipeline
from layoutc.convert.checkpoint import convert_checkpoint
from layoutc.convert.runfolder import DONE
from tests.convert.test_checkpoint import make_checkpoint, reference_digest


def test_mapped_tensors_are_the_files_bytes_and_writes_stay_private(tmp_path):
    # an odd-length uint8 first puts the f32 at an odd offset: copied out, aligned
    tensors = {"a": torch.arange(3, dtype=torch.uint8), "b": torch.randn(5, 3), "c": torch.empty(0, 4),
               "d": torch.tensor(7, dtype=torch.int64), "e": torch.randn(64, 64).to(torch.bfloat16)}
    path = tmp_path / "x.safetensors"
    shardfile.write(path, tensors, {"k": "v"})
    before = path.read_bytes()
    got, digest, size = shardio.ShardIO("cpu").read(path)
    assert digest == reference_digest(before) and size == len(before)
    want = load_file(str(path))
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
        assert got[k].numel() == 0 or got[k].data_ptr() % got[k].element_size() == 0, k
        assert torch.equal(got[k], want[k]), k
    got["e"].fill_(1)  # a private page: the file and a fresh read keep the bytes
    got["b"].zero_()
    assert path.read_bytes() == before
    again, _, _ = shardio.ShardIO("cpu").read(path)
    assert torch.equal(again["e"], tensors["e"]) and torch.equal(again["b"], tensors["b"])


@pytest.mark.slow
def test_a_shard_changed_while_converted_is_refused_and_not_stamped(tmp_path, bf16, monkeypatch):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    victim = tmp_path / "in" / "model-00002-of-00002.safetensors"
    real = shardio.ShardIO.write

    def write(self, path, tensors, metadata, ready=None):
        n = real(self, path, tensors, metadata, ready)
        if "00002" in path.name:  # after it was read and hashed: same size, new bytes, new mtime
            data = bytearray(victim.read_bytes())
            data[-1] ^= 0xFF
            victim.write_bytes(bytes(data))
        return n

    monkeypatch.setattr(shardio.ShardIO, "write", write)
    try:
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", prefetch=2, writers=1)
    except layoutc.LayoutError as err:
        assert "model-00002-of-00002.safetensors: the file changed while it was converted" in str(err)
    else:
        raise AssertionError("a shard changed under the conversion was stamped")
    assert not (tmp_path / "out" / "model-00002-of-00002.safetensors").exists()
    assert not list((tmp_path / "out").rglob("*.tmp"))
    assert [p.name for p in (tmp_path / "out" / DONE).glob("*.json")] == ["model-00001-of-00002.safetensors.json"]


def test_file_identity_changes_with_content_written_in_place(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"abcd")
    first = shardpipeline._identity(p)
    p.write_bytes(b"abce")
    assert shardpipeline._identity(p) != first
    p.unlink()
    assert shardpipeline._identity(p) is None
