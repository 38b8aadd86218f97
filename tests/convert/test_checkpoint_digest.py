"""The resume stamp's input digest (a sha256 tree over 16 MiB leaves, hashed on several threads):
the same value as a plain one-leaf-after-the-other computation whatever the threads and chunks,
a changed byte anywhere in a shard (size and mtime kept) makes resume convert it again, a stamp of
the older format (plain sha256) is redone, never trusted and never a crash; and the writer-side
fsyncs keep their order (file fsync, rename, folder fsync, stamp)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from layoutc.convert import shardio, shardpipeline
from layoutc.convert.checkpoint import convert_checkpoint
from layoutc.convert.inputscan import INDEX
from layoutc.convert.runfolder import DONE
from tests.convert.test_checkpoint import folder_digest, make_checkpoint, reference_digest

LEAF = 16 << 20
FILLER = "model.embed_tokens.weight"


def test_the_leaf_size_and_name_are_what_the_reference_assumes():
    assert shardio.TREE_LEAF == LEAF and shardio.DIGEST == "sha256-tree-16MiB"


@pytest.fixture(scope="module")
def big_shard(tmp_path_factory) -> Path:
    """A safetensors file of three leaves and a bit (the last one partial)."""
    path = tmp_path_factory.mktemp("digest") / "big.safetensors"
    g = torch.Generator().manual_seed(0)
    save_file({"a": torch.randint(0, 256, (2 * LEAF + 12345,), dtype=torch.uint8, generator=g),
               "b": torch.randn(1000, generator=g)}, str(path))
    return path


@pytest.mark.parametrize("size", [0, 1, LEAF - 1, LEAF, LEAF + 1])
def test_the_tree_of_a_file_equals_the_reference(tmp_path, size):
    data = random.Random(size).randbytes(size)
    (tmp_path / "f").write_bytes(data)
    want = reference_digest(data)
    assert want.startswith("sha256-tree-16MiB:") and want.split(":")[1] != hashlib.sha256(data).hexdigest()
    for threads in (1, 4):
        with shardio.hash_pool(threads) as pool:
            assert shardio.file_digest(tmp_path / "f", pool) == want


def test_threads_chunks_and_code_paths_give_the_reference_digest(big_shard):
    data = big_shard.read_bytes()
    want = reference_digest(data)
    with shardio.hash_pool(3) as pool:
        assert shardio.file_digest(big_shard, pool) == want
        # pieces of any size, cut anywhere (across leaf boundaries too), hashed as they come
        th = shardio.TreeHash(pool)
        rng, pos = random.Random(1), 0
        while pos < len(data):
            n = rng.choice([1, 7, 4099, LEAF // 3, LEAF + 5])
            th.update(data[pos:pos + n])
            pos += n
        assert th.hexdigest() == want
    for options in ({"staged": False}, {"staged": True, "chunk": (1 << 20) + 7, "slots": 3},
                    {"staged": True, "chunk": LEAF, "hash_threads": 1}):
        io = shardio.ShardIO("cpu", **options)
        try:
            _, digest, size = io.read(big_shard)
            assert digest == want and size == len(data), options
            assert io.digest(big_shard) == want
        finally:
            io.close()


def test_one_changed_byte_in_any_leaf_changes_the_digest(big_shard, tmp_path):
    data = bytearray(big_shard.read_bytes())
    base = reference_digest(bytes(data))
    with shardio.hash_pool(4) as pool:
        for pos in (0, LEAF - 1, LEAF, len(data) // 2, len(data) - 1):
            changed = bytearray(data)
            changed[pos] ^= 1
            (tmp_path / "f").write_bytes(changed)
            assert shardio.file_digest(tmp_path / "f", pool) != base, pos
    # the root covers the size: the same leaf digest for two sizes gives two roots
    leaf = hashlib.sha256(b"x").digest()
    assert shardio.tree_root([leaf], 1) != shardio.tree_root([leaf], 2)


def test_the_root_refuses_a_leaf_count_that_does_not_match_the_size():
    with pytest.raises(ValueError):
        shardio.tree_root([], 1)
    with pytest.raises(ValueError):
        shardio.tree_root([b"x" * 32] * 2, LEAF)


def _with_filler(folder: Path, bf16) -> Path:
    """A small checkpoint whose first shard also holds a 40 MiB non-MoE tensor (copied as it is):
    that shard spans three leaves."""
    make_checkpoint(folder, bf16, layers=2, shards=2)
    shard = folder / "model-00001-of-00002.safetensors"
    tensors = load_file(str(shard))
    tensors[FILLER] = torch.randint(0, 256, (40 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    save_file(tensors, str(shard))
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"][FILLER] = shard.name
    (folder / INDEX).write_text(json.dumps(index))
    return shard


def _filler_span(path: Path) -> tuple[int, int]:
    """File offsets of the filler's bytes."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        start, end = json.loads(f.read(n))[FILLER]["data_offsets"]
    return 8 + n + start, 8 + n + end


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_byte_changed_in_the_first_middle_or_last_leaf_is_converted_again(tmp_path, bf16, prefetch):
    shard = _with_filler(tmp_path / "in", bf16)
    size = shard.stat().st_size
    assert size > 2 * LEAF
    first, last = _filler_span(shard)
    out = tmp_path / "out"
    assert convert_checkpoint(bf16, tmp_path / "in", out, prefetch=prefetch)["written_shards"] == 2
    stamp = json.loads((out / DONE / f"{shard.name}.json").read_text())
    assert stamp["input_digest"] == reference_digest(shard.read_bytes()) and "input_sha256" not in stamp
    last_leaf = (size - 1) // LEAF * LEAF
    positions = (first + 10, LEAF + 10, max(first, last_leaf) + 10)
    assert [p // LEAF for p in positions] == [0, 1, 2] and (size - 1) // LEAF == 2  # first, middle, last leaf
    for pos in positions:
        assert first <= pos < last
        stat = shard.stat()
        with open(shard, "r+b") as f:  # in place: size kept
            f.seek(pos)
            byte = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([byte ^ 0x5A]))
        os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime kept
        assert shard.stat().st_size == stat.st_size and shard.stat().st_mtime_ns == stat.st_mtime_ns
        summary = convert_checkpoint(bf16, tmp_path / "in", out, prefetch=prefetch)
        assert summary["written_shards"] == 1 and summary["skipped_shards"] == 1, pos
        # the new output holds the changed byte: the shard was really converted again
        got = load_file(str(out / shard.name))[FILLER]
        assert int(got[pos - first]) == byte ^ 0x5A, pos
    assert convert_checkpoint(bf16, tmp_path / "in", out, prefetch=prefetch)["written_shards"] == 0


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("old", ["sha256", "bare_hex", "other_leaf", "not_a_string"])
def test_a_stamp_of_another_digest_format_is_redone_not_trusted(tmp_path, bf16, prefetch, old):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    out = tmp_path / "out"
    convert_checkpoint(bf16, tmp_path / "in", out)
    before = folder_digest(out)
    for p in (out / DONE).glob("*.json"):
        stamp = json.loads(p.read_text())
        source = (tmp_path / "in" / p.name[:-len(".json")]).read_bytes()
        digest = stamp.pop("input_digest")
        if old == "sha256":  # what layoutc wrote before the tree digest
            stamp["input_sha256"] = hashlib.sha256(source).hexdigest()
        elif old == "bare_hex":
            stamp["input_digest"] = digest.split(":", 1)[1]
        elif old == "other_leaf":
            stamp["input_digest"] = "sha256-tree-64MiB:" + digest.split(":", 1)[1]
        else:
            stamp["input_digest"] = [digest]
        p.write_text(json.dumps(stamp))
    summary = convert_checkpoint(bf16, tmp_path / "in", out, prefetch=prefetch)
    assert summary["written_shards"] == 2 and summary["skipped_shards"] == 0
    assert folder_digest(out) == before  # the same bytes, and stamps of the current format again


def test_writers_fsync_their_shards_before_the_in_order_rename_folder_fsync_and_stamp(tmp_path, bf16, monkeypatch):
    make_checkpoint(tmp_path / "in", bf16, layers=4, shards=4)
    events: list[tuple[str, str, str]] = []
    lock = threading.Lock()

    def log(kind, path):
        with lock:
            events.append((kind, Path(path).name, threading.current_thread().name))

    real_fsync, real_dir, real_replace, real_atomic = (shardio.fsync_file, shardpipeline._fsync_dir, os.replace,
                                                       shardpipeline._write_atomically)
    monkeypatch.setattr(shardio, "fsync_file", lambda p: (log("fsync", p), real_fsync(p))[1])
    monkeypatch.setattr(shardpipeline, "_fsync_dir", lambda p: (log("fsync_dir", p), real_dir(p))[1])
    monkeypatch.setattr(shardpipeline.os, "replace", lambda a, b: (log("replace", b), real_replace(a, b))[1])
    monkeypatch.setattr(shardpipeline, "_write_atomically", lambda p, t: (log("stamp", p), real_atomic(p, t))[1])
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", prefetch=2, writers=3)
    shards = sorted(p.name for p in (tmp_path / "in").glob("*.safetensors"))
    order = []
    for s in shards:
        i_fsync = next(i for i, e in enumerate(events) if e[:2] == ("fsync", f".{s}.tmp"))
        i_replace = next(i for i, e in enumerate(events) if e[:2] == ("replace", s))
        i_dir = next(i for i, e in enumerate(events) if e[0] == "fsync_dir" and e[1] == "out" and i > i_replace)
        i_stamp = next(i for i, e in enumerate(events) if e[:2] == ("stamp", f"{s}.json"))
        assert i_fsync < i_replace < i_dir < i_stamp, s
        assert events[i_fsync][2].startswith("layoutc-write"), events[i_fsync]  # in the thread that wrote it
        order.append(i_stamp)
    assert order == sorted(order)  # stamps in shard order
