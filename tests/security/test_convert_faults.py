"""``layoutc convert`` under hostile checkpoints and faults: paths stay inside their folders, runs
with other parameters never mix into one folder, a kill at any point resumes to the same bytes, a
full or read-only disk is a clear error, and nothing of the input is ever touched."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import layoutc
from layoutc.convert.checkpoint import convert_checkpoint
from layoutc.convert.inputscan import INDEX
from layoutc.convert.runfolder import DONE, LOCK, RUN, claim_folder, run_identity
from tests.helpers import ROOT, SPECS
from tests.convert.test_checkpoint import folder_digest, load_all, make_checkpoint

ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}


def cli(*args, cwd=ROOT, timeout=600):
    return subprocess.run([sys.executable, "-m", "layoutc", *args], capture_output=True, text=True, cwd=cwd,
                          env=ENV, timeout=timeout)


def test_index_paths_cannot_leave_the_input_folder(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    victim = tmp_path / "victim.safetensors"
    save_file({"secret": torch.ones(3)}, str(victim))
    before = victim.read_bytes()
    for target in ("./../victim.safetensors", "../victim.safetensors", str(victim), "sub/../x.safetensors", ".."):
        index = json.loads((tmp_path / "in" / INDEX).read_text())
        index["weight_map"] = {k: target for k in index["weight_map"]}
        (tmp_path / "in" / INDEX).write_text(json.dumps(index))
        with pytest.raises(layoutc.LayoutError, match="not a plain file name"):
            convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert victim.read_bytes() == before
    assert not (tmp_path / "out").exists()  # refused before anything was written


@pytest.mark.parametrize("target", [".layoutc-run.json", ".layoutc-lock-rank0-of-1", "layoutc_manifest.json",
                                    ".x.safetensors.tmp", ".hidden.safetensors", INDEX, "notes.txt"])
def test_index_cannot_name_layoutc_bookkeeping_as_a_shard(tmp_path, bf16, target):
    # The file exists in --in (a copy of the shard), so only the name check can refuse it: a
    # converted shard renamed to it in --out would overwrite layoutc's own run file, lock or manifest.
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    index = json.loads((tmp_path / "in" / INDEX).read_text())
    shard = next(iter(index["weight_map"].values()))
    if target != INDEX:
        (tmp_path / "in" / target).write_bytes((tmp_path / "in" / shard).read_bytes())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = target
    (tmp_path / "in" / INDEX).write_text(json.dumps(index))
    with pytest.raises(layoutc.LayoutError, match=rf"the entry for '{first}': '{target}' is not a shard name"):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("index, message", [
    ("{", "not a valid index"),
    ("[]", "non-empty \"weight_map\""),
    ('{"weight_map": {}}', "non-empty \"weight_map\""),
    ('{"weight_map": {"a": "missing.safetensors"}}', "which is not a file"),
    ('{"weight_map": {"a": 3}}', "not a plain file name"),
])
def test_malformed_indexes_are_errors(tmp_path, bf16, index, message):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / INDEX).write_text(index)
    with pytest.raises(layoutc.LayoutError, match=message):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_bad_dtype_in_a_name_mapping(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=1, shards=1)
    names = {n: {"name": "{layer}." + n, "dtype": "float99"} for n in bf16.input_names}
    (tmp_path / "names.json").write_text(json.dumps(names))
    proc = cli("convert", "--spec", str(SPECS / "flashinfer_cutlass_bf16.lyt"), "--in", str(tmp_path / "in"),
               "--out", str(tmp_path / "out"), "--names", str(tmp_path / "names.json"))
    assert proc.returncode == 2 and "dtype must be one of" in proc.stderr and "internal error" not in proc.stderr


def test_a_name_mapping_that_finds_no_layer_fails(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    padded = layoutc.compile_file(SPECS / "flashinfer_cutlass_mxfp4_padded.lyt", {"checkpoint": "gpt_oss"})
    with pytest.raises(layoutc.LayoutError, match="no MoE layer matches the name mapping"):
        convert_checkpoint(padded, tmp_path / "in", tmp_path / "out", names="gpt-oss")
    assert not (tmp_path / "out").exists()


def test_other_parameters_and_concurrent_runs_are_refused(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    out = tmp_path / "out"
    out.mkdir()
    lock, _ = claim_folder(out, run_identity(bf16, "vllm"), 0, 1)  # a run in progress
    try:
        with pytest.raises(layoutc.LayoutError, match="another layoutc convert .* is writing"):
            convert_checkpoint(bf16, tmp_path / "in", out)
        tp = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt", {"tp_size": 2, "tp_rank": 0})
        with pytest.raises(layoutc.LayoutError, match="another sha256, params"):
            convert_checkpoint(tp, tmp_path / "in", out)
    finally:
        lock.close()
    assert convert_checkpoint(bf16, tmp_path / "in", out)["written_shards"] == 2


def test_a_refused_run_never_removes_the_running_ones_files(tmp_path, bf16):
    # The holder has its rank lock but has not written its run file yet (or is an older layoutc):
    # the refused run must not take the folder for its own and clean up the holder's files.
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    out = tmp_path / "out"
    out.mkdir()
    holder = open(out / f"{LOCK}-rank0-of-1", "a+")
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        tmp = out / ".model-00001-of-00002.safetensors.tmp"
        tmp.write_bytes(b"being written")
        with pytest.raises(layoutc.LayoutError, match="another layoutc convert .* is writing"):
            convert_checkpoint(bf16, tmp_path / "in", out)
        assert (out / f"{LOCK}-rank0-of-1").exists() and tmp.read_bytes() == b"being written"
    finally:
        holder.close()


@pytest.mark.parametrize("first, second", [(2, 1), (1, 2), (2, 4)])
def test_runs_with_different_world_sizes_exclude_each_other(tmp_path, bf16, first, second):
    # Rank 0 of any world size writes the same ``.{shard}.tmp``: a torchrun job and a lone run (or
    # two jobs of different sizes) into one --out must not both write.
    out = tmp_path / "out"
    out.mkdir()
    identity = run_identity(bf16, "vllm")
    lock, _ = claim_folder(out, identity, 0, first)
    try:
        with pytest.raises(layoutc.LayoutError, match=rf"\(rank 0 of {first}\) is writing .* this run has {second}"):
            claim_folder(out, identity, 0, second)
        other, _ = claim_folder(out, identity, first - 1, first) if first > 1 else (None, None)  # its own ranks join
        if other is not None:
            other.close()
    finally:
        lock.close()
    again, _ = claim_folder(out, identity, 0, second)  # once the other job is gone, the folder is free
    again.close()


def test_a_folder_from_an_older_layoutc_is_converted_again(tmp_path, bf16):
    # An older layoutc left shards and stamps but no run file: not "files no layoutc wrote", but a
    # conversion whose stamps (without this identity) no longer match, so every shard is redone.
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    out = tmp_path / "out"
    assert convert_checkpoint(bf16, tmp_path / "in", out)["written_shards"] == 2
    (out / RUN).unlink()
    for p in (out / DONE).glob("*.json"):
        stamp = json.loads(p.read_text())
        stamp["run"].pop("layoutc_version")
        p.write_text(json.dumps(stamp))
    summary = convert_checkpoint(bf16, tmp_path / "in", out)
    assert summary["written_shards"] == 2 and summary["skipped_shards"] == 0
    assert json.loads((out / RUN).read_text()) == run_identity(bf16, "vllm")


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_two_processes_with_different_parameters_never_mix(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=4, shards=4)
    spec = str(SPECS / "flashinfer_cutlass_bf16.lyt")
    args = ["convert", "--spec", spec, "--in", str(tmp_path / "in"), "--out", str(tmp_path / "out")]
    procs = [subprocess.Popen([sys.executable, "-m", "layoutc", *args, *extra], cwd=ROOT, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for extra in ([], ["-D", "tp_size=2", "-D", "tp_rank=1"])]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    winner = next(i for i, (code, _) in enumerate(results) if code == 0)
    loser_err = results[1 - winner][1]
    assert "would mix two layouts" in loser_err or "is writing into" in loser_err, loser_err
    held = json.loads((tmp_path / "out" / RUN).read_text())
    stamps = [json.loads(p.read_text())["run"] for p in (tmp_path / "out" / DONE).glob("*.json")]
    assert len(stamps) == 4 and all(s == held for s in stamps)  # every shard from the one run the folder names
    manifest = json.loads((tmp_path / "out" / "layoutc_manifest.json").read_text())
    assert json.loads(manifest["layoutc_params"]) == held["params"]


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_an_empty_or_corrupt_marker_is_redone_not_a_crash(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    clean = folder_digest(tmp_path / "out")
    markers = sorted((tmp_path / "out" / DONE).glob("*.json"))
    markers[0].write_text("")  # a kill (or full disk) between opening and writing, before atomic markers
    markers[1].write_text("{not json")
    proc = cli("convert", "--spec", str(SPECS / "flashinfer_cutlass_bf16.lyt"), "--in", str(tmp_path / "in"),
               "--out", str(tmp_path / "out"))
    assert proc.returncode == 0 and "2 shard(s) written" in proc.stderr, proc.stderr
    again = folder_digest(tmp_path / "out")
    assert {k: again[k] for k in clean} == clean  # byte for byte the same shards and stamps


KILL_AT = textwrap.dedent("""
    import os, sys
    import layoutc
    from layoutc.convert import checkpoint as ck, shardpipeline
    point, count = sys.argv[1], int(sys.argv[2])
    seen = [0]
    real_replace, real_write = os.replace, shardpipeline._write_atomically
    def replace(a, b):
        real_replace(a, b)
        if point == "after_shard" and str(b).endswith(".safetensors"):
            seen[0] += 1
            if seen[0] == count:
                os._exit(9)
    def write(path, text):
        if point == "in_marker" and path.name.endswith(".safetensors.json"):
            seen[0] += 1
            if seen[0] == count:
                tmp = path.with_name("." + path.name + ".tmp")
                tmp.write_text(text[: len(text) // 2])  # half a marker, never renamed
                os._exit(9)
        real_write(path, text)
    shardpipeline.os.replace = replace
    shardpipeline._write_atomically = write
    spec = layoutc.compile_file(sys.argv[3])
    ck.convert_checkpoint(spec, sys.argv[4], sys.argv[5])
""")


@pytest.mark.parametrize("point", ["after_shard", "in_marker"])
@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_a_kill_at_any_point_resumes_to_the_same_bytes(tmp_path, bf16, point):
    make_checkpoint(tmp_path / "in", bf16, layers=3, shards=3)
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "clean")
    spec = str(SPECS / "flashinfer_cutlass_bf16.lyt")
    proc = subprocess.run([sys.executable, "-c", KILL_AT, point, "2", spec, str(tmp_path / "in"), str(tmp_path / "out")],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 9, proc.stderr[-2000:]
    summary = convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert summary["skipped_shards"] == 1 and summary["written_shards"] == 2
    assert not list((tmp_path / "out").rglob("*.tmp"))
    a, b = load_all(tmp_path / "clean"), load_all(tmp_path / "out")
    assert set(a) == set(b) and all(torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8))
                                    for k in a)


def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
@pytest.mark.parametrize("options, message", [("size=300k", "No space left on device"), ("ro,size=1m", "Read-only")])
@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_full_and_read_only_disks_are_clear_errors(tmp_path, bf16, options, message):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    before = folder_digest(tmp_path / "in")
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, options):
        pytest.skip("tmpfs cannot be mounted here")
    try:
        proc = cli("convert", "--spec", str(SPECS / "flashinfer_cutlass_bf16.lyt"), "--in", str(tmp_path / "in"),
                   "--out", str(disk / "out"))
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and "internal error" not in proc.stderr and "Traceback" not in proc.stderr
        leftovers = [p.name for p in disk.rglob("*")] if disk.exists() else []
        assert not [n for n in leftovers if n.endswith(".tmp")], leftovers
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    assert folder_digest(tmp_path / "in") == before


def test_a_failed_first_run_leaves_no_bookkeeping_folder(tmp_path, bf16):
    source = make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1, index=False)
    source["model.layers.1.mlp.experts.w2_weight_scale"] = torch.zeros(2, 256, 3, dtype=torch.uint8)
    save_file(source, str(tmp_path / "in" / "model-00001-of-00001.safetensors"))
    with pytest.raises(layoutc.LayoutError, match=r"layer 'model.layers.1.mlp.experts' \(shard model-00001"):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(f"**/{LOCK}*"))
