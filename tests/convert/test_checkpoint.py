"""``layoutc convert``: a generated sharded safetensors checkpoint, converted, verified, resumed."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import layoutc
from layoutc.convert.checkpoint import MANIFEST, convert_checkpoint, finish
from layoutc.convert.inputscan import INDEX
from layoutc.convert.runfolder import DONE
from layoutc.convert.synthckpt import synthetic_inputs
from tests.helpers import ROOT, SPECS, bits

DIMS = {"E": 2, "I": 256, "H": 256}  # I % 256: a 2-way TP slice still meets the SM90 fold
PREFIX = "model.layers.{}.mlp.experts"


def make_checkpoint(folder: Path, spec, layers: int = 4, shards: int = 2, names=None, index: bool = True) -> dict:
    """A small vLLM-named checkpoint: ``layers`` MoE layers spread over ``shards`` files, plus
    non-MoE tensors (which must be copied as they are). Returns {tensor name: tensor}."""
    folder.mkdir(parents=True, exist_ok=True)
    names = names or (lambda layer, n: f"{PREFIX.format(layer)}.{n}")
    everything, weight_map = {}, {}
    per = layers // shards
    for s in range(shards):
        tensors = {}
        for layer in range(s * per, (s + 1) * per):
            for n, v in synthetic_inputs(spec, DIMS, seed=layer).items():
                tensors[names(layer, n)] = v
            tensors[f"model.layers.{layer}.self_attn.q_proj.weight"] = torch.randn(8, 8, generator=torch.Generator().manual_seed(layer))
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(folder / file))
        weight_map.update({k: file for k in tensors})
        everything.update(tensors)
    if index:
        (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return everything


def layer_inputs(tensors: dict, layer: int) -> dict:
    head = PREFIX.format(layer) + "."
    return {k[len(head):]: v for k, v in tensors.items() if k.startswith(head)}


def folder_digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def reference_digest(data: bytes, leaf: int = 16 << 20) -> str:
    """The stamp's digest, written out plainly, one leaf after the other (layoutc hashes the leaves
    on several threads as the bytes arrive): sha256 over a tag, the leaf size, the file size and
    each 16 MiB leaf's sha256."""
    root = hashlib.sha256(b"layoutc sha256-tree\0" + struct.pack("<QQ", leaf, len(data)))
    for i in range(0, len(data), leaf):
        root.update(hashlib.sha256(data[i:i + leaf]).digest())
    return "sha256-tree-16MiB:" + root.hexdigest()


def load_all(folder: Path) -> dict:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_converts_every_layer_copies_the_rest_and_records_provenance(tmp_path, bf16):
    source = make_checkpoint(tmp_path / "in", bf16)
    before = folder_digest(tmp_path / "in")
    summary = convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    finish(bf16, tmp_path / "in", tmp_path / "out", "vllm")
    assert summary == {"converted_layers": 4, "skipped_shards": 0, "written_shards": 2, "verified_layers": 2,
                       "unindexed": [], "names": "vllm"}
    assert folder_digest(tmp_path / "in") == before  # the input is never touched
    out = load_all(tmp_path / "out")
    assert set(out) == set(source)
    for layer in range(4):
        want = bf16.convert(layer_inputs(source, layer))
        for n, v in want.items():
            got = out[f"{PREFIX.format(layer)}.{n}"]
            assert got.dtype == v.dtype and got.shape == v.shape and torch.equal(bits(got), bits(v)), (layer, n)
        q = f"model.layers.{layer}.self_attn.q_proj.weight"
        assert torch.equal(out[q], source[q])
    # provenance: in every shard's header, the index and the manifest
    with safe_open(str(tmp_path / "out" / "model-00001-of-00002.safetensors"), "pt") as h:
        meta = h.metadata()
    assert meta["layoutc_spec"] == "flashinfer_cutlass_bf16" and meta["layoutc_sha256"] == bf16.sha256
    assert json.loads(meta["layoutc_params"]) == bf16.params
    index = json.loads((tmp_path / "out" / INDEX).read_text())
    assert index["weight_map"] == json.loads((tmp_path / "in" / INDEX).read_text())["weight_map"]
    assert index["metadata"]["layoutc_sha256"] == bf16.sha256
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["shards"] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_round_trip_through_the_inverse_gives_the_checkpoint_back(tmp_path, bf16):
    source = make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    out = load_all(tmp_path / "out")
    for layer in range(2):
        head = PREFIX.format(layer) + "."
        back = bf16.inverse({k[len(head):]: v for k, v in out.items() if k.startswith(head)})
        for n, v in layer_inputs(source, layer).items():
            assert torch.equal(bits(back[n]), bits(v)), (layer, n)


def test_resume_skips_finished_shards_and_redoes_changed_ones(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16)
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    again = convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert again["skipped_shards"] == 2 and again["written_shards"] == 0 and again["converted_layers"] == 0
    # an interrupted run: one shard missing (written atomically, so never half there)
    (tmp_path / "out" / "model-00002-of-00002.safetensors").unlink()
    resumed = convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert resumed["skipped_shards"] == 1 and resumed["written_shards"] == 1
    # a touched input (same bytes) is not a change ...
    src = tmp_path / "in" / "model-00001-of-00002.safetensors"
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))
    assert convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")["written_shards"] == 0
    # ... but a shard changed in place, size and mtime kept, is redone: the stamp holds its sha256
    stat = src.stat()
    data = bytearray(src.read_bytes())
    data[-1] ^= 0xFF
    src.write_bytes(bytes(data))
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert src.stat().st_size == stat.st_size and src.stat().st_mtime_ns == stat.st_mtime_ns
    assert convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")["written_shards"] == 1
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_a_folder_converted_with_other_parameters_is_not_resumed(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    tp = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt", {"tp_size": 2, "tp_rank": 1})
    assert tp.sha256 != bf16.sha256  # the same file: the parameters are part of the spec's identity
    before = folder_digest(tmp_path / "out")
    with pytest.raises(layoutc.LayoutError, match="another sha256, params .* would mix two layouts"):
        convert_checkpoint(tp, tmp_path / "in", tmp_path / "out")
    assert folder_digest(tmp_path / "out") == before  # nothing of the refused run was written
    summary = convert_checkpoint(tp, tmp_path / "in", tmp_path / "out-rank1")
    assert summary["written_shards"] == 1
    out = load_all(tmp_path / "out-rank1")
    assert out[f"{PREFIX.format(0)}.w13_weight"].shape[1] == DIMS["I"]  # 2*I / 2


def test_single_file_checkpoint_without_index(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1, index=False)
    summary = convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    finish(bf16, tmp_path / "in", tmp_path / "out", "vllm")
    assert summary["converted_layers"] == 2
    assert not (tmp_path / "out" / INDEX).exists() and (tmp_path / "out" / MANIFEST).exists()


def test_tensor_parallel_slice_is_verified_without_an_inverse(tmp_path, bf16):
    source = make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    tp = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt", {"tp_size": 2, "tp_rank": 1})
    assert not tp.invertible
    summary = convert_checkpoint(tp, tmp_path / "in", tmp_path / "out")
    assert summary["verified_layers"] == 1
    out = load_all(tmp_path / "out")
    want = tp.convert(layer_inputs(source, 1))
    assert torch.equal(bits(out[f"{PREFIX.format(1)}.w2_weight"]), bits(want["w2_weight"]))


GPT_OSS_NAMES = {
    "w13_weight": "gate_up_proj_blocks", "w13_weight_scale": "gate_up_proj_scales", "w13_bias": "gate_up_proj_bias",
    "w2_weight": "down_proj_blocks", "w2_weight_scale": "down_proj_scales", "w2_bias": "down_proj_bias",
}


def gpt_oss_spec(tmp_path):
    """The SM90 CUTLASS layout from a gpt-oss checkpoint (rows stored interleaved; padded to 128)."""
    return layoutc.compile_file(SPECS / "flashinfer_cutlass_mxfp4_padded.lyt", {"checkpoint": "gpt_oss"})


def test_gpt_oss_names_blocks_and_bf16_biases(tmp_path):
    spec = gpt_oss_spec(tmp_path)
    layer = synthetic_inputs(spec, {"E": 2, "I": 96, "H": 160}, seed=0)  # padded to 128: verified with dims
    stored = {}
    for n, v in layer.items():
        if n.endswith("_weight"):
            v = v.reshape(*v.shape[:-1], v.shape[-1] // 16, 16)  # gpt-oss stores 16-byte blocks
        if n.endswith("bias"):
            v = v.to(torch.bfloat16)
        stored[f"model.layers.0.mlp.experts.{GPT_OSS_NAMES[n]}"] = v
    (tmp_path / "in").mkdir()
    save_file(stored, str(tmp_path / "in" / "model.safetensors"))
    convert_checkpoint(spec, tmp_path / "in", tmp_path / "out", names="gpt-oss")
    out = load_all(tmp_path / "out")
    layer = dict(layer, w13_bias=layer["w13_bias"].to(torch.bfloat16).float(), w2_bias=layer["w2_bias"].to(torch.bfloat16).float())
    want = spec.convert(layer)
    for n, v in want.items():
        assert torch.equal(bits(out[f"model.layers.0.mlp.experts.{GPT_OSS_NAMES[n]}"]), bits(v)), n


def test_gpt_oss_names_with_a_spec_that_reads_rows_as_w1_w3_is_refused(tmp_path, bf16):
    with pytest.raises(layoutc.LayoutError, match="stores w13_weight rows interleaved.*declares its input rows \\[w1; w3\\]"):
        convert_checkpoint(bf16, tmp_path, tmp_path / "out", names="gpt-oss")


def test_json_name_mapping(tmp_path, bf16):
    source = make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1,
                             names=lambda layer, n: f"blocks.{layer}.moe.{n.replace('_weight', '.w')}")
    mapping = {n: {"name": "{layer}.moe." + n.replace("_weight", ".w")} for n in bf16.input_names}
    mapping["w2_bias"] = "{layer}.moe.w2_bias"  # the short form
    (tmp_path / "names.json").write_text(json.dumps(mapping))
    summary = convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", names=tmp_path / "names.json")
    assert summary["converted_layers"] == 2
    out = load_all(tmp_path / "out")
    layer = {n: source[f"blocks.1.moe.{n.replace('_weight', '.w')}"] for n in bf16.input_names}
    assert torch.equal(bits(out["blocks.1.moe.w13.w"]), bits(bf16.convert(layer)["w13_weight"]))


@pytest.mark.parametrize(
    "content, message",
    [
        ("{", "not valid JSON"),
        ("[1]", "expected an object"),
        (json.dumps({"w13_weight": "{layer}.a"}), "no name for spec input 'w13_weight_scale'"),
        (json.dumps({n: "x.{layer}" for n in ["w13_weight", "w13_weight_scale", "w13_bias", "w2_weight",
                                              "w2_weight_scale", "w2_bias"]} | {"w13_weight": "fixed"}), "must contain {layer}"),
        (json.dumps({n: {"name": "{layer}." + n, "colour": 1} for n in ["w13_weight", "w13_weight_scale", "w13_bias",
                                                                      "w2_weight", "w2_weight_scale", "w2_bias"]}), "fields are"),
        (json.dumps({n: "{layer}." + n for n in ["w13_weight", "w13_weight_scale", "w13_bias", "w2_weight",
                                                 "w2_weight_scale", "w2_bias", "w4"]}), "w4 are not inputs"),
    ],
)
def test_bad_name_mappings_are_clear_errors(tmp_path, bf16, content, message):
    (tmp_path / "names.json").write_text(content)
    with pytest.raises(layoutc.LayoutError, match=message):
        convert_checkpoint(bf16, tmp_path, tmp_path / "out", names=tmp_path / "names.json")


def test_incomplete_layer_and_wrong_tensors_are_named(tmp_path, bf16):
    source = make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1, index=False)
    del source[f"{PREFIX.format(1)}.w2_weight_scale"]
    save_file(source, str(tmp_path / "in" / "model-00001-of-00001.safetensors"))
    with pytest.raises(layoutc.LayoutError, match=r"layer 'model.layers.1.mlp.experts' has some MoE tensors but not w2_weight_scale"):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    source[f"{PREFIX.format(1)}.w2_weight_scale"] = torch.zeros(2, 256, 3, dtype=torch.uint8)
    save_file(source, str(tmp_path / "in" / "model-00001-of-00001.safetensors"))
    with pytest.raises(layoutc.LayoutError, match="w2_weight_scale"):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")


def test_never_writes_into_its_input(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    with pytest.raises(layoutc.LayoutError, match="never overwrites its input"):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "in" / ".." / "in")
    with pytest.raises(layoutc.LayoutError, match="is not a folder"):
        convert_checkpoint(bf16, tmp_path / "missing", tmp_path / "out2")
    (tmp_path / "empty").mkdir()
    with pytest.raises(layoutc.LayoutError, match="no \\*.safetensors"):
        convert_checkpoint(bf16, tmp_path / "empty", tmp_path / "out2")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "layoutc", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_cli_convert_and_its_errors(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    spec = str(SPECS / "flashinfer_cutlass_bf16.lyt")
    proc = _cli("convert", "--spec", spec, "--in", str(tmp_path / "in"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "2 shard(s) written" in proc.stderr and "2 MoE layer(s) converted" in proc.stderr
    assert (tmp_path / "out" / MANIFEST).is_file() and (tmp_path / "out" / DONE).is_dir()
    proc = _cli("convert", "--spec", spec, "--in", str(tmp_path / "in"), "--out", str(tmp_path / "in"))
    assert proc.returncode == 2 and "never overwrites its input" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli("convert", "--spec", spec, "--in", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--names", "nope")
    assert proc.returncode == 2 and "--names must be" in proc.stderr and "Traceback" not in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_torchrun_ranks_convert_disjoint_shards(tmp_path, bf16):
    source = make_checkpoint(tmp_path / "in", bf16, layers=4, shards=4)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
         "-m", "layoutc", "convert", "--spec", str(SPECS / "flashinfer_cutlass_bf16.lyt"),
         "--in", str(tmp_path / "in"), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0: 2 shard(s) written" in proc.stderr and "rank 1: 2 shard(s) written" in proc.stderr
    out = load_all(tmp_path / "out")
    assert set(out) == set(source)
    want = bf16.convert(layer_inputs(source, 3))["w13_weight_scale"]
    assert torch.equal(bits(out[f"{PREFIX.format(3)}.w13_weight_scale"]), bits(want))
    assert (tmp_path / "out" / INDEX).is_file() and (tmp_path / "out" / MANIFEST).is_file()


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_torchrun_a_failing_rank_does_not_hang_the_others(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)

    def torchrun():
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
             "-m", "layoutc", "convert", "--spec", str(SPECS / "flashinfer_cutlass_bf16.lyt"),
             "--in", str(tmp_path / "in"), "--out", str(tmp_path / "out")],
            capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300,
        )

    # Only rank 1 fails, while writing its shard: a folder where its temporary file goes.
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ".model-00002-of-00002.safetensors.tmp").mkdir()
    proc = torchrun()
    assert proc.returncode != 0
    assert "1 other rank(s) failed" in proc.stderr  # rank 0 finished its shard, then learned of rank 1
    assert "model-00002-of-00002.safetensors" in proc.stderr and "internal error" not in proc.stderr
    assert not (tmp_path / "out" / MANIFEST).exists()  # no index or manifest for an incomplete conversion
    # A malformed shard is found by every rank from the headers, before any shard is converted.
    (tmp_path / "out" / ".model-00002-of-00002.safetensors.tmp").rmdir()
    (tmp_path / "in" / "model-00002-of-00002.safetensors").write_bytes(b"not a safetensors file")
    for p in (tmp_path / "out").glob("*.safetensors"):
        p.unlink()
    proc = torchrun()
    assert proc.returncode != 0 and "internal error" not in proc.stderr
    assert "model-00002-of-00002.safetensors: not a safetensors file" in proc.stderr
    assert not list((tmp_path / "out").glob("*.safetensors")) and not (tmp_path / "out" / MANIFEST).exists()
