"""``layoutc convert`` under malformed and ambiguous inputs (issue 20, items 6-9; issue 21's lock
files and progress): every malformed header, index or name mapping is a clear error naming the file
(and tensor) before any shard is converted; a tensor the index leaves out is copied and indexed; two
spec inputs on one tensor and an edited --names file are refused, never mixed."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import layoutc
from layoutc.convert.checkpoint import MANIFEST, convert_checkpoint, finish
from layoutc.convert.inputscan import INDEX
from layoutc.convert.runfolder import LOCK
from layoutc.front.progress import ShardProgress
from tests.helpers import ROOT, SPECS
from tests.convert.test_checkpoint import PREFIX, load_all, make_checkpoint

ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
SPEC = str(SPECS / "flashinfer_cutlass_bf16.lyt")


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "layoutc", *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=timeout)


def raw_shard(path, header: bytes, data: bytes = b"") -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def add_shard(folder, name: str, header: bytes, data: bytes = b"", tensor: str = "extra.bias") -> None:
    """A shard with a hand-written header, named by the index for ``tensor``."""
    raw_shard(folder / name, header, data)
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"][tensor] = name
    (folder / INDEX).write_text(json.dumps(index))


def no_shard_written(out) -> bool:
    return not out.exists() or not any(out.glob("*.safetensors"))


# -- item 9: malformed headers are exit 2 naming the file and tensor, before any shard is converted

F32 = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
MALFORMED = {
    "deeply nested header": (b"[" * 100_000 + b"]" * 100_000, b"", "nested too deeply"),
    "zero-size tensor with a 2**70 dim": (
        b'{"extra.bias": {"dtype": "F32", "shape": [0, 1180591620717411303424], "data_offsets": [0, 0]}}', b"",
        "'extra.bias': the shape must be a list of integers from 0 to 2**63-1"),
    "lone surrogate in a tensor name": (b'{"extra.bias": ' + F32.encode() + b', "x\\ud800": ' + F32.encode() + b"}",
                                        b"\0" * 8, "'x\\ud800' is not valid UTF-8"),
    "__metadata__ that is a list": (b'{"__metadata__": [], "extra.bias": ' + F32.encode() + b"}", b"\0" * 4,
                                    "__metadata__ must be an object of strings"),
    "__metadata__ with a number": (b'{"__metadata__": {"a": 1}, "extra.bias": ' + F32.encode() + b"}", b"\0" * 4,
                                   "__metadata__ must be an object of strings"),
    "overlapping tensors": (b'{"extra.bias": ' + F32.encode() + b', "extra.b2": ' + F32.encode() + b"}", b"\0" * 8,
                            "overlaps the tensor before it"),
    "duplicate tensor name": (b'{"extra.bias": ' + F32.encode() + b', "extra.bias": ' + F32.encode() + b"}",
                              b"\0" * 4, "the key 'extra.bias' appears twice"),
    "negative dim": (b'{"extra.bias": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', b"\0" * 4,
                     "the shape must be a list of integers"),
    "unknown dtype": (b'{"extra.bias": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4,
                      "unknown dtype 'Q9'"),
    "header not an object": (b'[1, 2]', b"", "a JSON list, not an object"),
    "header size past the end": (None, b"", "its header says"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_shard_headers_are_errors_before_any_shard_is_converted(tmp_path, bf16, case):
    header, data, message = MALFORMED[case]
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    if header is None:  # a header size larger than the file
        (tmp_path / "in" / "z-bad.safetensors").write_bytes(struct.pack("<Q", 1000) + b"{}")
        index = json.loads((tmp_path / "in" / INDEX).read_text())
        index["weight_map"]["extra.bias"] = "z-bad.safetensors"
        (tmp_path / "in" / INDEX).write_text(json.dumps(index))
    else:
        # named last: the other shards come first in every order, yet none is converted
        add_shard(tmp_path / "in", "z-bad.safetensors", header, data)
    with pytest.raises(layoutc.LayoutError) as info:
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")  # the default pipelined reader
    assert "z-bad.safetensors" in str(info.value) and message in str(info.value), str(info.value)
    assert no_shard_written(tmp_path / "out")


def test_malformed_header_on_the_command_line_is_exit_2(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    add_shard(tmp_path / "in", "z-bad.safetensors", b"[" * 100_000 + b"]" * 100_000)
    proc = cli("convert", "--spec", SPEC, "--in", tmp_path / "in", "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stderr
    assert "z-bad.safetensors: not a safetensors file" in proc.stderr and "internal error" not in proc.stderr


def test_single_file_checkpoint_with_a_bad_header(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1, index=False)
    raw_shard(tmp_path / "in" / "z.safetensors", b'{"__metadata__": [], "a": ' + F32.encode() + b"}", b"\0" * 4)
    with pytest.raises(layoutc.LayoutError, match="z.safetensors: __metadata__ must be an object"):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")


@pytest.mark.parametrize("index, message", [
    ('{"metadata": null, "weight_map": WM}', '"metadata" must be an object'),
    ('{"metadata": [1], "weight_map": WM}', '"metadata" must be an object'),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"metadata": {"x": ' + "[" * 100_000 + "]" * 100_000 + '}, "weight_map": WM}', "nested too deeply"),
    ('{"weight_map": {"\\ud800": "model-00001-of-00001.safetensors"}}', "not valid UTF-8"),
    ('{"weight_map": WM, "weight_map": WM}', "the key 'weight_map' appears twice"),
    ('{"weight_map": {"not.there": "model-00001-of-00001.safetensors"}}', "which that file does not hold"),
])
def test_malformed_indexes_are_errors_before_any_shard_is_converted(tmp_path, bf16, index, message):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    wm = json.dumps(json.loads((tmp_path / "in" / INDEX).read_text())["weight_map"])
    (tmp_path / "in" / INDEX).write_text(index.replace("WM", wm))
    with pytest.raises(layoutc.LayoutError) as info:
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert INDEX in str(info.value) and message in str(info.value), str(info.value)
    assert no_shard_written(tmp_path / "out")


@pytest.mark.parametrize("content, message", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"w13_weight": "{layer}.w13_weight", "w13_weight": "{layer}.w13_weight"}', "appears twice"),
    ('{"w13_weight": ["x"]}', "expected a string or an object"),
    ('{"w13_weight": "{layer}.\\ud800"}', "not valid UTF-8"),
    ("1" * 5000, "not a valid name mapping"),
])
def test_malformed_name_mappings_are_errors(tmp_path, bf16, content, message):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    (tmp_path / "names.json").write_text(content)
    with pytest.raises(layoutc.LayoutError) as info:
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", names=tmp_path / "names.json")
    assert "names.json" in str(info.value) and message in str(info.value), str(info.value)


# -- item 8: a tensor the index leaves out is copied, said and indexed ---------------------------

def test_a_tensor_missing_from_the_index_is_copied_and_indexed(tmp_path, bf16):
    source = make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    index = json.loads((tmp_path / "in" / INDEX).read_text())
    dropped = "model.layers.1.self_attn.q_proj.weight"
    del index["weight_map"][dropped]
    (tmp_path / "in" / INDEX).write_text(json.dumps(index))
    warnings = []
    summary = convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", warn=warnings.append)
    finish(bf16, tmp_path / "in", tmp_path / "out", "vllm")
    assert summary["unindexed"] == [dropped]
    assert len(warnings) == 1 and dropped in warnings[0] and "not in model.safetensors.index.json" in warnings[0]
    out = load_all(tmp_path / "out")
    assert torch.equal(out[dropped], source[dropped])
    written = json.loads((tmp_path / "out" / INDEX).read_text())["weight_map"]
    assert written[dropped] == "model-00002-of-00002.safetensors" and set(written) == set(source)


def test_the_cli_warns_about_unindexed_tensors(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    index = json.loads((tmp_path / "in" / INDEX).read_text())
    del index["weight_map"]["model.layers.0.self_attn.q_proj.weight"]
    (tmp_path / "in" / INDEX).write_text(json.dumps(index))
    proc = cli("convert", "--spec", SPEC, "--in", tmp_path / "in", "--out", tmp_path / "out", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "warning: 1 tensor(s) in the shards are not in model.safetensors.index.json: " \
           "model.layers.0.self_attn.q_proj.weight" in proc.stderr
    assert "shard(s) written" not in proc.stderr  # --quiet: no summary line
    # issue 21: no lock file left behind after a successful run, no progress bar into a pipe
    assert not list((tmp_path / "out").glob(f"{LOCK}*"))
    assert "\r" not in proc.stderr


def test_a_tensor_in_two_shards_is_refused(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2, index=False)
    save_file({"model.layers.0.self_attn.q_proj.weight": torch.zeros(8, 8)}, str(tmp_path / "in" / "z.safetensors"))
    with pytest.raises(layoutc.LayoutError, match="'model.layers.0.self_attn.q_proj.weight' is in two shards, "
                                                  "model-00001-of-00002.safetensors and z.safetensors"):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")


# -- item 7: two spec inputs on one checkpoint tensor ------------------------------------------

def test_two_inputs_mapped_to_one_tensor_are_refused(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    names = {n: "{layer}." + n for n in bf16.input_names}
    names["w13_weight_scale"] = "{layer}.w13_weight"  # the scale read from the weight's tensor
    (tmp_path / "names.json").write_text(json.dumps(names))
    with pytest.raises(layoutc.LayoutError) as info:
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", names=tmp_path / "names.json")
    msg = str(info.value)
    assert "w13_weight and w13_weight_scale" in msg and f"'{PREFIX.format(0)}.w13_weight'" in msg, msg
    assert not (tmp_path / "out").exists()
    proc = cli("convert", "--spec", SPEC, "--in", tmp_path / "in", "--out", tmp_path / "out",
               "--names", tmp_path / "names.json")
    assert proc.returncode == 2 and "to one checkpoint tensor" in proc.stderr, proc.stderr


# -- item 6: the --names file is recorded by content -------------------------------------------

def test_an_edited_names_file_is_not_resumed_into(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    names = {n: "{layer}." + n for n in bf16.input_names}
    path = tmp_path / "names.json"
    path.write_text(json.dumps(names))
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", names=path)
    # Another mapping under the same file name (the scales read from other tensors): resuming would
    # keep the first mapping's shards and write the second's.
    first = json.dumps(names)
    for n in ("w13_weight_scale", "w2_weight_scale"):
        names[n] = {"name": "{layer}." + n, "dtype": "uint8"}
    path.write_text(json.dumps(names))
    with pytest.raises(layoutc.LayoutError, match="another names .* would mix two layouts"):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", names=path)
    # the same content under another name is the same mapping: a resume, nothing redone
    names = json.loads(first)
    other = tmp_path / "copy.json"
    other.write_text(json.dumps(names))
    summary = convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", names=other)
    assert summary["skipped_shards"] == 2 and summary["written_shards"] == 0
    finish(bf16, tmp_path / "in", tmp_path / "out", other, summary["names"])
    assert json.loads((tmp_path / "out" / MANIFEST).read_text())["names_id"].startswith("json sha256:")


# -- symlinks in --out are never written through -------------------------------------------------

def test_planted_symlinks_in_out_are_not_followed(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for name in (".model-00001-of-00001.safetensors.tmp", f".{INDEX}.tmp", ".layoutc-run.json.tmp"):
        os.symlink(victim, out / name)
    convert_checkpoint(bf16, tmp_path / "in", out, prefetch=0)
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out2")
    finish(bf16, tmp_path / "in", out, "vllm")
    assert victim.read_text() == "keep me"
    with safe_open(str(out / "model-00001-of-00001.safetensors"), "pt") as f:
        assert f.metadata()["layoutc_spec"] == bf16.name


def test_a_lock_symlink_is_refused_and_its_target_untouched(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(tmp_path / "created-elsewhere", out / LOCK)
    with pytest.raises(layoutc.LayoutError, match="is a symbolic link"):
        convert_checkpoint(bf16, tmp_path / "in", out)
    assert not (tmp_path / "created-elsewhere").exists()


def test_a_stamp_folder_symlink_is_refused(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "keep.json").write_text("{}")
    os.symlink(elsewhere, out / ".layoutc-done")
    with pytest.raises(layoutc.LayoutError, match="is a symbolic link"):
        convert_checkpoint(bf16, tmp_path / "in", out)
    assert [p.name for p in elsewhere.iterdir()] == ["keep.json"]


# -- issue 21: progress on a terminal -----------------------------------------------------------

class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_shards_tensors_and_bytes_on_a_terminal_only(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=4, shards=2)
    term = _Terminal()
    with ShardProgress("converting", stream=term) as bar:
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", progress=bar)
    shown = term.getvalue()
    assert "2/2 shards" in shown and "tensors" in shown and "B/s" in shown, shown
    pipe = io.StringIO()
    with ShardProgress("converting", stream=pipe) as bar:
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out2", progress=bar)
    assert pipe.getvalue() == ""
    quiet = _Terminal()
    with ShardProgress("converting", enabled=False, stream=quiet) as bar:
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out3", progress=bar)
    assert quiet.getvalue() == ""
    assert not list((tmp_path / "out").glob(f"{LOCK}*"))


# -- found in this round: errors only the conversion used to find, now found from the headers ----

def test_a_layer_with_a_wrong_shape_in_a_later_shard_fails_before_any_shard_is_converted(tmp_path, bf16):
    from safetensors.torch import load_file

    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=2)
    path = tmp_path / "in" / "model-00002-of-00002.safetensors"
    tensors = load_file(str(path))
    name = f"{PREFIX.format(1)}.w2_weight"
    tensors[name] = tensors[name][:, :, :-1].contiguous()
    save_file(tensors, str(path))
    with pytest.raises(layoutc.LayoutError, match=r"layer 'model.layers.1.mlp.experts' \(shard "
                                                  r"model-00002-of-00002.safetensors\): w2_weight: expected shape"):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_dtype_convert_cannot_copy_is_refused_before_any_shard_is_converted(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    add_shard(tmp_path / "in", "z.safetensors", b'{"extra.f4": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}',
              b"\0", tensor="extra.f4")
    with pytest.raises(layoutc.LayoutError, match="'extra.f4' has dtype F4, which layoutc convert cannot copy"):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_merge_last_on_a_tensor_with_one_axis_is_an_error(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    index = json.loads((tmp_path / "in" / INDEX).read_text())
    from safetensors.torch import load_file

    shard = tmp_path / "in" / "model-00001-of-00001.safetensors"
    tensors = load_file(str(shard))
    for layer in (0, 1):
        tensors[f"{PREFIX.format(layer)}.flat"] = torch.zeros(4, dtype=torch.float32)
        index["weight_map"][f"{PREFIX.format(layer)}.flat"] = shard.name
    save_file(tensors, str(shard))
    (tmp_path / "in" / INDEX).write_text(json.dumps(index))
    names = {n: "{layer}." + n for n in bf16.input_names}
    names["w13_bias"] = {"name": "{layer}.flat", "merge_last": True}
    (tmp_path / "names.json").write_text(json.dumps(names))
    with pytest.raises(layoutc.LayoutError, match="merge_last needs two axes"):
        convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out", names=tmp_path / "names.json")


@pytest.mark.parametrize("header, data", [
    (b'{"__metadata__": [], "a": ' + F32.encode() + b"}", 4),
    (b"[" * 100_000 + b"]" * 100_000, 0),
    (b'{"\\ud800": ' + F32.encode() + b"}", 4),
    (b'{"a": {"dtype": "F32", "shape": [0, 1180591620717411303424], "data_offsets": [0, 0]}}', 0),
])
def test_the_pipelined_reader_leaves_malformed_headers_to_safetensors(tmp_path, header, data):
    # A shard replaced after the up-front check: the reader's own parse never accepts what safetensors
    # refuses, nor crashes on it; it hands the file to safetensors, whose error names the shard.
    from layoutc.convert import shardio

    with pytest.raises(shardio.Fallback):
        shardio.parse_header(header, data, tmp_path / "x.safetensors")
