"""Input shards hashed while ``layoutc convert`` compiles (layoutc.convert.shardio.EarlyDigests).

The digests found early are the files' digests; the pipeline takes one only for a file whose identity is still
the one hashed (an edited file is hashed again, so its stamp describes what was converted); a conversion given
them writes the same files and stamps as one that hashed everything itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from layoutc.convert import shardio
from layoutc.convert.checkpoint import convert_checkpoint, finish
from tests.convert.test_checkpoint import folder_digest, make_checkpoint
from tests.helpers import ROOT, SPECS


def _files(folder, n, size):
    folder.mkdir()
    paths = []
    for i in range(n):
        p = folder / f"model-{i}.safetensors"
        p.write_bytes(os.urandom(size))
        paths.append(p)
    return paths


def test_early_digests_are_the_files_digests_and_symlinks_are_skipped(tmp_path):
    paths = _files(tmp_path / "in", 3, (1 << 20) + 5)
    link = tmp_path / "in" / "model-9.safetensors"
    link.symlink_to(paths[0])
    early = shardio.EarlyDigests(sorted((tmp_path / "in").glob("*.safetensors")))
    import time

    for _ in range(200):  # small files: done in well under a second
        if len(early._found) == 3:
            break
        time.sleep(0.01)
    found = early.stop()
    pool = shardio.hash_pool(1)
    want = {str(p.resolve()): shardio.file_digest(p, pool) for p in paths}
    pool.shutdown()
    assert {k: v[1] for k, v in found.items()} == want  # the link is not followed (its target is there anyway)
    assert all(v[0] == shardio.file_identity(k) for k, v in found.items())


def test_a_file_changed_after_hashing_is_hashed_again(tmp_path):
    paths = _files(tmp_path / "in", 1, 4096)
    pool = shardio.hash_pool(1)
    real = shardio.file_digest(paths[0], pool)
    stale = {str(paths[0].resolve()): (shardio.file_identity(paths[0]), "sha256-tree-16MiB:stale")}
    io = shardio.ShardIO("cpu", shardio.Profile(), known=stale, hash_threads=1)
    assert io.digest(paths[0]) == "sha256-tree-16MiB:stale"  # the same file: the early digest is taken
    paths[0].write_bytes(os.urandom(4100))  # edited in place: its identity (size, times) is not the hashed one
    assert io.digest(paths[0]) != "sha256-tree-16MiB:stale"
    assert io.digest(paths[0]) == shardio.file_digest(paths[0], pool) != real
    io.close()
    pool.shutdown()


def test_stop_drops_the_shard_under_way(tmp_path):
    import threading

    paths = _files(tmp_path / "in", 2, (3 << 24) + 7)  # three leaves and a bit
    pool = shardio.hash_pool(1)
    whole = shardio.file_digest(paths[0], pool)
    assert shardio.file_digest(paths[0], pool, stop=threading.Event()) == whole  # not stopped: the digest
    stopped = threading.Event()
    stopped.set()
    assert shardio.file_digest(paths[0], pool, stop=stopped) is None  # stopped: no digest of part of a file
    early = shardio.EarlyDigests(paths)
    found = early.stop()  # at once: whatever it returns is whole files' digests
    for k, (_, digest) in found.items():
        assert digest == shardio.file_digest(k, pool)
    pool.shutdown()


def test_a_conversion_given_early_digests_writes_the_same_files(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    plain = tmp_path / "plain"
    convert_checkpoint(bf16, tmp_path / "in", plain)
    finish(bf16, tmp_path / "in", plain, "vllm")
    early = shardio.EarlyDigests(sorted((tmp_path / "in").resolve().glob("*.safetensors")))
    import time

    time.sleep(0.5)
    digests = early.stop()
    assert digests
    prof = shardio.Profile()
    given = tmp_path / "given"
    convert_checkpoint(bf16, tmp_path / "in", given, profile=prof, digests=digests)
    finish(bf16, tmp_path / "in", given, "vllm")
    assert prof.bytes.get("hash_early", 0) > 0
    strip = lambda d: {k: v for k, v in d.items() if ".layoutc-lock" not in k}  # noqa: E731
    assert strip(folder_digest(plain)) == strip(folder_digest(given))


def test_the_cli_hashes_while_it_compiles(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    run = subprocess.run([sys.executable, "-m", "layoutc", "convert", "--spec", str(SPECS / "flashinfer_cutlass_bf16.lyt"),
                          "--in", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "-q",
                          "--profile", str(tmp_path / "p.json")], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "p.json").read_text())
    # both shards are tiny: hashed before the compile ends
    assert report["bytes"].get("hash_early") == sum(p.stat().st_size for p in (tmp_path / "in").glob("*.safetensors"))
