"""The pipelined ``layoutc convert`` (reader threads, writer threads, an in-order finisher): the same
bytes as the sequential loop, every guarantee kept (resume after a kill, stamps, no leftovers),
and failures in any thread surface as clear errors naming the shard, never as a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import layoutc
from layoutc.convert import checkpoint
from layoutc.convert import shardfile, shardio
from layoutc.convert.checkpoint import assign_shards, convert_checkpoint, finish
from layoutc.convert.inputscan import INDEX
from layoutc.convert.runfolder import DONE
from layoutc.convert.synthckpt import write_checkpoint
from tests.helpers import ROOT, SPECS
from tests.convert.test_checkpoint import folder_digest, make_checkpoint, reference_digest

DIMS = {"E": 2, "I": 256, "H": 256}
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}


def outputs(folder: Path) -> dict:
    """Every file a conversion leaves (locks aside), by content."""
    return {k: v for k, v in folder_digest(folder).items() if ".layoutc-lock" not in k}


@pytest.fixture(scope="module")
def split_ckpt(tmp_path_factory, bf16):
    """Six layers over shards of ~120 kB, tensor by tensor: layers straddle shards."""
    folder = tmp_path_factory.mktemp("split") / "in"
    write_checkpoint(folder, bf16, DIMS, layers=6, shard_bytes=120_000, vocab=64, split_layers=True)
    return folder


@pytest.fixture(scope="module")
def sequential(tmp_path_factory, bf16, split_ckpt):
    out = tmp_path_factory.mktemp("seq") / "out"
    summary = convert_checkpoint(bf16, split_ckpt, out, prefetch=0)
    finish(bf16, split_ckpt, out, "vllm")
    return out, summary


def run_pipelined(bf16, src, out, **kw):
    summary = convert_checkpoint(bf16, src, out, **kw)
    finish(bf16, src, out, "vllm")
    return summary


def test_the_synthetic_checkpoint_straddles_shards(split_ckpt, bf16):
    index = json.loads((split_ckpt / INDEX).read_text())["weight_map"]
    files = {f for k, f in index.items() if k.startswith("model.layers.1.mlp.experts.")}
    assert len(set(index.values())) >= 4
    assert any(len({f for k, f in index.items() if k.startswith(f"model.layers.{i}.mlp.experts.")}) > 1 for i in range(6)), files


@pytest.mark.parametrize("prefetch, writers, io_options", [
    (1, 1, {}), (2, 2, {}), (4, 3, {}),
    (2, 2, {"staged": True, "chunk": 4099}),  # the CUDA code path's chunk ring, on the CPU, chunks cut tensors
    (1, 1, {"staged": True, "chunk": 1 << 20, "slots": 2}),
])
def test_pipelined_output_is_byte_identical_to_the_sequential_loop(tmp_path, bf16, split_ckpt, sequential,
                                                                   prefetch, writers, io_options):
    seq_out, seq_summary = sequential
    summary = run_pipelined(bf16, split_ckpt, tmp_path / "out", prefetch=prefetch, writers=writers, io_options=io_options)
    assert summary == seq_summary
    assert outputs(tmp_path / "out") == outputs(seq_out)


@pytest.mark.parametrize("hash_threads, io_options", [(1, {}), (7, {"staged": True, "chunk": 4099, "slots": 3})])
def test_the_number_of_hashing_threads_changes_no_byte_and_no_stamp(tmp_path, bf16, split_ckpt, sequential,
                                                                   hash_threads, io_options):
    seq_out, seq_summary = sequential
    summary = run_pipelined(bf16, split_ckpt, tmp_path / "out", prefetch=2, writers=2, hash_threads=hash_threads,
                            io_options=io_options)
    assert summary == seq_summary
    assert outputs(tmp_path / "out") == outputs(seq_out)  # the stamps' digests included


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_staged_reads_and_writes_match_safetensors_and_shardfile(tmp_path, split_ckpt):
    prof = shardio.Profile()
    for chunk in (7, 4096, 1 << 22):
        io = shardio.ShardIO("cpu", prof, chunk=chunk, slots=3, staged=True)
        for f in sorted(split_ckpt.glob("*.safetensors"))[:3]:
            tensors, sha, size = io.read(f)
            assert sha == reference_digest(f.read_bytes()) and size == f.stat().st_size
            want = load_file(str(f))
            assert tensors.keys() == want.keys()
            for k, v in want.items():
                assert tensors[k].dtype == v.dtype and torch.equal(tensors[k].view(torch.uint8) if v.dtype == torch.uint8 else tensors[k], v), k
            io.write(tmp_path / "a", tensors, {"x": "1"})
            shardfile.write(tmp_path / "b", want, {"x": "1"})
            assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    assert prof.bytes["read_bytes"] > 0


def test_unaligned_and_empty_tensors_round_trip(tmp_path):
    """shardfile writes tensors in name order, so an f32 can start at an odd offset."""
    tensors = {"a": torch.arange(3, dtype=torch.uint8), "b": torch.randn(5, 3), "c": torch.empty(0, 4),
               "d": torch.tensor(7, dtype=torch.int64), "e": torch.randn(2, 2).to(torch.bfloat16)}
    shardfile.write(tmp_path / "x.safetensors", tensors, {})
    for staged in (False, True):
        got, _, _ = shardio.ShardIO("cpu", chunk=5, staged=staged).read(tmp_path / "x.safetensors")
        for k, v in tensors.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k


def test_a_file_the_reader_does_not_handle_goes_through_safetensors(tmp_path, bf16, split_ckpt, sequential, monkeypatch):
    real = shardio.parse_header
    seen = []

    def some_fall_back(raw, size, path):
        seen.append(path.name)
        if len(seen) % 2:
            raise shardio.Fallback("test")
        return real(raw, size, path)

    monkeypatch.setattr(shardio, "parse_header", some_fall_back)
    run_pipelined(bf16, split_ckpt, tmp_path / "out", prefetch=2, io_options={"staged": True, "chunk": 1000})
    assert outputs(tmp_path / "out") == outputs(sequential[0])


def test_every_tp_slice_from_one_read_equals_separate_runs(tmp_path, split_ckpt):
    path = SPECS / "flashinfer_cutlass_bf16.lyt"
    specs = [layoutc.compile_file(path, {"tp_size": 2, "tp_rank": r}) for r in range(2)]
    outs = [tmp_path / "all" / f"tp{r}" for r in range(2)]
    reads = shardio.Profile()
    summary = convert_checkpoint(specs, split_ckpt, outs, prefetch=2, profile=reads)
    shards = len(list(split_ckpt.glob("*.safetensors")))
    assert summary["written_shards"] == 2 * shards
    assert reads.bytes["read_bytes"] == sum(f.stat().st_size for f in split_ckpt.glob("*.safetensors"))  # read once
    for r in range(2):
        finish(specs[r], split_ckpt, outs[r], "vllm")
        alone = tmp_path / f"alone{r}"
        convert_checkpoint(specs[r], split_ckpt, alone, prefetch=0)
        finish(specs[r], split_ckpt, alone, "vllm")
        assert outputs(outs[r]) == outputs(alone), r
    # a rerun finds every slice done
    again = convert_checkpoint(specs, split_ckpt, outs)
    assert again["skipped_shards"] == shards and again["written_shards"] == 0


def test_shards_are_balanced_by_bytes():
    sizes = {"a": 10, "b": 1, "c": 1, "d": 1, "e": 9, "f": 1}
    parts = assign_shards(sizes, 2)
    assert sorted(s for p in parts for s in p) == sorted(sizes)
    loads = [sum(sizes[s] for s in p) for p in parts]
    assert max(loads) - min(loads) <= 1, parts
    assert assign_shards(sizes, 1) == [sorted(sizes)]
    assert all(p == sorted(p) for p in parts)
    assert assign_shards({"x": 5}, 3) == [["x"], [], []]


def _watchdog(fn, seconds=120):
    """Run ``fn`` in a thread; a hang fails the test instead of the suite."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as err:  # noqa: BLE001
            result["error"] = err

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the conversion hung"
    return result


def test_an_error_in_the_reader_thread_names_the_shard_and_does_not_hang(tmp_path, bf16, monkeypatch):
    make_checkpoint(tmp_path / "in", bf16, layers=4, shards=4)
    real = shardio.ShardIO.read

    def read(self, path):
        if path.name == "model-00003-of-00004.safetensors":
            raise OSError(5, "Input/output error")
        return real(self, path)

    monkeypatch.setattr(shardio.ShardIO, "read", read)
    result = _watchdog(lambda: convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", prefetch=3, writers=2))
    err = result.get("error")
    assert isinstance(err, layoutc.LayoutError), result
    assert "model-00003-of-00004.safetensors: cannot read" in str(err) and "Input/output error" in str(err)
    assert not list((tmp_path / "out").rglob("*.tmp"))
    done = sorted(p.name for p in (tmp_path / "out" / DONE).glob("*.json"))
    assert done == ["model-00001-of-00004.safetensors.json", "model-00002-of-00004.safetensors.json"]
    monkeypatch.setattr(shardio.ShardIO, "read", real)
    resumed = convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert resumed["skipped_shards"] == 2 and resumed["written_shards"] == 2


def test_a_failure_in_the_reader_that_is_not_io_keeps_its_type(tmp_path, bf16, monkeypatch):
    # Out of device memory (or a bug) in the reader thread is not "cannot read" the shard: passing it
    # off as an unreadable file would send the user after the wrong cause.
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)

    def read(self, path):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(shardio.ShardIO, "read", read)
    result = _watchdog(lambda: convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", prefetch=2))
    err = result.get("error")
    assert isinstance(err, torch.OutOfMemoryError) and "cannot read" not in str(err), result


def test_a_truncated_shard_is_a_clear_error(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    victim = tmp_path / "in" / "model-00002-of-00002.safetensors"
    victim.write_bytes(victim.read_bytes()[:-100])
    result = _watchdog(lambda: convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", prefetch=2))
    assert isinstance(result.get("error"), layoutc.LayoutError), result
    assert "model-00002-of-00002.safetensors: not a valid safetensors file" in str(result["error"])
    assert "the file is truncated" in str(result["error"])
    assert not (tmp_path / "out").exists()  # found before any shard was converted
    victim.write_bytes(b"not a safetensors file")
    result = _watchdog(lambda: convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", prefetch=2))
    assert "model-00002-of-00002.safetensors: not a safetensors file" in str(result["error"])


def test_a_conversion_error_names_layer_and_shard_and_keeps_finished_shards(tmp_path, bf16, monkeypatch):
    source = make_checkpoint(tmp_path / "in", bf16, layers=3, shards=3, index=True)
    bad = {k: v for k, v in source.items() if k.startswith("model.layers.2.")}
    bad["model.layers.2.mlp.experts.w2_weight_scale"] = torch.zeros(2, 256, 3, dtype=torch.uint8)
    save_file(bad, str(tmp_path / "in" / "model-00003-of-00003.safetensors"))
    # The shapes are checked from the headers first: nothing is converted.
    result = _watchdog(lambda: convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", prefetch=2, writers=2))
    err = result.get("error")
    assert isinstance(err, layoutc.LayoutError) and "layer 'model.layers.2.mlp.experts' (shard model-00003" in str(err)
    assert not (tmp_path / "out").exists()
    # An error only the conversion finds (here: the header check skipped) stops the pipeline mid-run.
    monkeypatch.setattr(checkpoint, "_check_layers", lambda *a: None)
    result = _watchdog(lambda: convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", prefetch=2, writers=2))
    err = result.get("error")
    assert isinstance(err, layoutc.LayoutError) and "layer 'model.layers.2.mlp.experts' (shard model-00003" in str(err)
    assert len(list((tmp_path / "out" / DONE).glob("*.json"))) == 2  # the shards before it were finished
    assert not list((tmp_path / "out").rglob("*.tmp"))


def test_a_write_error_surfaces_and_leaves_no_temporary_files(tmp_path, bf16, monkeypatch):
    make_checkpoint(tmp_path / "in", bf16, layers=4, shards=4)
    real = shardio.ShardIO.write

    def write(self, path, tensors, metadata, ready=None):
        if "00002" in path.name:
            with open(path, "wb") as f:
                f.write(b"half")
            raise OSError(28, "No space left on device", str(path))
        return real(self, path, tensors, metadata, ready)

    monkeypatch.setattr(shardio.ShardIO, "write", write)
    result = _watchdog(lambda: convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", prefetch=2, writers=2))
    err = result.get("error")
    assert isinstance(err, OSError) and "No space left" in str(err), result
    assert not list((tmp_path / "out").rglob("*.tmp"))
    assert [p.name for p in (tmp_path / "out" / DONE).glob("*.json")] == ["model-00001-of-00004.safetensors.json"]


KILL = textwrap.dedent("""
    import os, sys
    import layoutc
    from layoutc.convert import checkpoint as ck, shardpipeline
    count, seen = int(sys.argv[1]), [0]
    real_replace = os.replace
    def replace(a, b):
        real_replace(a, b)
        if str(b).endswith(".safetensors"):
            seen[0] += 1
            if seen[0] == count:
                os._exit(9)
    shardpipeline.os.replace = replace
    spec = layoutc.compile_file(sys.argv[2])
    ck.convert_checkpoint(spec, sys.argv[3], sys.argv[4], prefetch=3, writers=3)
""")


@pytest.mark.slow
@pytest.mark.parametrize("count", [1, 3])
def test_a_kill_mid_pipeline_resumes_to_the_same_bytes(tmp_path, bf16, count):
    make_checkpoint(tmp_path / "in", bf16, layers=4, shards=4)
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "clean", prefetch=0)
    proc = subprocess.run([sys.executable, "-c", KILL, str(count), str(SPECS / "flashinfer_cutlass_bf16.lyt"),
                           str(tmp_path / "in"), str(tmp_path / "out")],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 9, proc.stderr[-2000:]
    stamped = len(list((tmp_path / "out" / DONE).glob("*.json")))
    assert stamped == count - 1  # stamps come in order, after the shard is in place
    summary = convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert summary["skipped_shards"] == count - 1 and summary["written_shards"] == 5 - count
    assert not list((tmp_path / "out").rglob("*.tmp"))
    assert outputs(tmp_path / "out") == outputs(tmp_path / "clean")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "layoutc", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env or dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)


@pytest.mark.slow
def test_cli_prefetch_profile_and_tp_slices(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    spec = str(SPECS / "flashinfer_cutlass_bf16.lyt")
    base = ["convert", "--spec", spec, "--in", str(tmp_path / "in")]
    proc = _cli(*base, "--out", str(tmp_path / "seq"), "--prefetch", "0")
    assert proc.returncode == 0, proc.stderr
    proc = _cli(*base, "--out", str(tmp_path / "pipe"), "--prefetch", "2", "--writers", "2", "--hash-threads", "3",
                "--profile", str(tmp_path / "profile.json"))
    assert proc.returncode == 0, proc.stderr
    assert "GB/s read" in proc.stderr
    assert outputs(tmp_path / "seq") == outputs(tmp_path / "pipe")
    report = json.loads((tmp_path / "profile.json").read_text())
    # a CPU run maps its shards (copy-on-write) where a CUDA run reads them: "map" or "read"
    stages = set(report["stages"])
    assert report["summary"]["written_shards"] == 2 and {"convert", "write", "fsync"} <= stages
    assert stages & {"read", "map"}
    # hashed while the spec compiled (hash_early), or by the pipeline's readers (hash)
    assert stages & {"hash", "hash_early"}
    proc = _cli(*base, "--out", str(tmp_path / "tp"), "-D", "tp_size=2")
    assert proc.returncode == 0, proc.stderr
    assert "4 shard(s) written" in proc.stderr
    for r in range(2):
        one = _cli(*base, "--out", str(tmp_path / f"one{r}"), "-D", "tp_size=2", "-D", f"tp_rank={r}", "--prefetch", "0")
        assert one.returncode == 0, one.stderr
        assert outputs(tmp_path / "tp" / f"tp{r}") == outputs(tmp_path / f"one{r}")
        manifest = json.loads((tmp_path / "tp" / f"tp{r}" / "layoutc_manifest.json").read_text())
        assert json.loads(manifest["layoutc_params"]) == {"tp_rank": r, "tp_size": 2}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_torchrun_two_ranks_split_by_bytes_and_tp_slices_equal_one_rank(tmp_path, bf16):
    write_checkpoint(tmp_path / "in", bf16, DIMS, layers=5, shard_bytes=150_000, vocab=400, split_layers=False)
    spec = str(SPECS / "flashinfer_cutlass_bf16.lyt")
    base = ["convert", "--spec", spec, "--in", str(tmp_path / "in")]
    for extra, name in (([], "plain"), (["-D", "tp_size=2"], "tp")):
        one = _cli(*base, "--out", str(tmp_path / f"{name}1"), *extra)
        assert one.returncode == 0, one.stderr
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
             "-m", "layoutc", *base, "--out", str(tmp_path / f"{name}2"), *extra],
            capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "rank 0:" in proc.stderr and "rank 1:" in proc.stderr
        assert outputs(tmp_path / f"{name}1") == outputs(tmp_path / f"{name}2"), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("chunk", [shardio.CHUNK, 4099])
def test_cuda_pipeline_writes_the_cpu_bytes(tmp_path, bf16, split_ckpt, sequential, chunk):
    """Pinned chunks, reader and writer streams, events: the same files as the sequential loop on the CPU."""
    summary = run_pipelined(bf16, split_ckpt, tmp_path / "out", device="cuda", prefetch=2, writers=2,
                            io_options={"chunk": chunk})
    assert summary == sequential[1]
    assert outputs(tmp_path / "out") == outputs(sequential[0])
