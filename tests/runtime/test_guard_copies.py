"""The guard follows converted bytes: copies, converted checkpoints, every shipped spec, TP slices.

Each copy path an engine takes is accepted when its bytes are those converted and rejected after
one changed byte; the fingerprint is checked against an independent computation of its definition.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import io
import json

import pytest
import torch

import layoutc
import layoutc.guard as guard
from layoutc.convert.checkpoint import convert_checkpoint, finish
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.runtime import fingerprint as fp
from layoutc import shipped
from tests.helpers import SPECS
from tests.convert.test_checkpoint import PREFIX, make_checkpoint

DIMS = {"E": 2, "I": 128, "H": 128}


def flip(t: torch.Tensor, at: int = -1) -> None:
    """Change one byte of t in place (through a byte view: t's version counter moves)."""
    b = t.view(-1).view(torch.uint8)
    b[at] ^= 0x10


def reference(t: torch.Tensor) -> str:
    # The definition in layoutc.runtime.fingerprint, computed in int64 with plain matmuls.
    b = t.contiguous().reshape(-1).view(torch.uint8).view(torch.int8).to(torch.int64)
    row, seg_rows = fp._FP_ROW, fp._FP_SEGMENT_ROWS
    r = torch.frombuffer(bytearray(hashlib.shake_256(fp._FP_SEED + b"R").digest(row * 16)), dtype=torch.int8)
    r2 = torch.frombuffer(bytearray(hashlib.shake_256(fp._FP_SEED + b"R2").digest(seg_rows * 16)), dtype=torch.int8)
    r, r2 = r.reshape(row, 16).to(torch.int64), r2.reshape(seg_rows, 16).to(torch.int64)
    h = hashlib.sha256(f"layoutc-fp1\0{b.numel()}\0".encode())
    for s in range(0, b.numel(), row * seg_rows):
        part = b[s: s + row * seg_rows]
        rows = -(-part.numel() // row)
        x = torch.zeros(rows * row, dtype=torch.int64)
        x[: part.numel()] = part
        y = (x.view(rows, row) @ r).to(torch.int32)
        z = (y.view(torch.int8).to(torch.int64).t() @ r2[:rows]).to(torch.int32)
        h.update(bytes(z.contiguous().view(torch.uint8).reshape(-1).tolist()))
    return f"layoutc-fp1:{h.hexdigest()}"


SIZES = [1, 7, 4096, 32768 * 17, 32768 * 17 + 5, 32768 * 20 + 32767, 100003]


# (fewest rows of a GEMM, fewest rows of a segment's own GEMM): (17, 17) the staging CUDA needs (cuBLAS takes
# > 16 rows), run here; (1, 64) the CPU's (small segments staged together); (1, 1) nothing staged but rests
ROWS = [(1, 1), (17, 17), (1, 64)]


def _without_native(monkeypatch, native):
    # native=False: the CPU's first products by int8 GEMMs (staging by _FP_OWN_ROWS, as where the native kernel does
    # not run); True: as this host has it (the native kernel takes every whole row in place where it runs)
    if not native:
        monkeypatch.setattr(fp, "_FP_NATIVE", False)


# (split, native): 1 << 20 splits K into the parts of the GEMMs CUDA takes, run here; native False: the CPU's int8
# GEMMs. Those two together run torch's int8 GEMM on 8x the columns, 8-9 s each on a CPU without VNNI (its slow
# path): the slow tier
SPLITS = [pytest.param(None, True, id="None-native"), pytest.param(None, False, id="None-gemm"),
          pytest.param(1 << 20, True, id="1048576-native"),
          pytest.param(1 << 20, False, id="1048576-gemm", marks=pytest.mark.slow)]


@pytest.mark.parametrize("min_rows, own_rows", ROWS)
@pytest.mark.parametrize("split, native", SPLITS)
def test_the_fingerprint_is_its_definition(monkeypatch, min_rows, own_rows, split, native):
    _without_native(monkeypatch, native)
    monkeypatch.setitem(fp._FP_MIN_ROWS, "cpu", min_rows)
    monkeypatch.setitem(fp._FP_OWN_ROWS, "cpu", own_rows)
    if split is not None:
        monkeypatch.setitem(fp._FP_SPLIT_ROWS, "cpu", split)
        monkeypatch.setitem(fp._FP_ROWS_MULTIPLE, "cpu", 256)
        assert fp._fp_split(17, fp._FP_ROW, torch.device("cpu")) == fp._FP_SPLIT_MOST
    g = torch.Generator().manual_seed(0)
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in SIZES]
    ts += [torch.randn(3, 5, generator=g).to(torch.bfloat16), torch.empty(0), torch.randn(64, 48, generator=g).t()]
    batch = fp._fingerprints(ts)
    assert batch == [reference(t) for t in ts]
    assert batch == [fp._fingerprints([t])[0] for t in ts]  # a batch gives each tensor's own
    assert len(set(batch)) == len(batch)


@pytest.mark.parametrize("native", [True, False], ids=["native", "gemm"])
@pytest.mark.parametrize("min_rows, own_rows", ROWS)
@pytest.mark.parametrize("split", [None, 1 << 20])
def test_segments_and_staged_rows_with_small_constants(monkeypatch, min_rows, own_rows, split, native):
    # 2 GiB segments cannot be tried here: the same code with 64-byte rows and 24-row segments
    monkeypatch.setitem(fp._FP_MIN_ROWS, "cpu", min_rows)
    monkeypatch.setitem(fp._FP_OWN_ROWS, "cpu", min(own_rows, 20))  # 20: some segments of 24 rows go alone
    if split is not None:  # 64-byte rows: K cut in 2 (each part a multiple of 32 bytes), the second product in 8
        monkeypatch.setitem(fp._FP_SPLIT_ROWS, "cpu", split)
        monkeypatch.setitem(fp._FP_ROWS_MULTIPLE, "cpu", 256)
    monkeypatch.setattr(fp, "_FP_ROW", 64)
    monkeypatch.setattr(fp, "_FP_SEGMENT_ROWS", 24)
    _without_native(monkeypatch, native)  # the kernel of 64-byte rows, or none
    g = torch.Generator().manual_seed(1)
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in (5, 64 * 17, 64 * 24, 64 * 24 + 1,
                                                                                 64 * 60 + 9, 64 * 100)]
    assert fp._fingerprints(ts) == [reference(t) for t in ts]


def test_small_tensors_share_one_gemm_on_the_cpu(monkeypatch):
    # Without the native kernel, a layer's scales and biases (segments under _FP_OWN_ROWS rows) go through one staged
    # first product (an int8 GEMM), the large weight through its own, then the second product (on the CPU a float64
    # GEMM: exact, faster than the int8 one without VNNI): three products where each tensor once took its own. (The
    # native kernel takes every whole row where it lies, in one run: tests/runtime/test_fingerprint_native.py.)
    monkeypatch.setattr(fp, "_FP_NATIVE", False)
    firsts, gemms, mms = [], [], []
    first, int_mm, mm = fp._fp_first, torch._int_mm, torch.mm
    monkeypatch.setattr(fp, "_fp_first", lambda a, y: firsts.append(a.shape[0]) or first(a, y))
    monkeypatch.setattr(torch, "_int_mm", lambda a, b, **k: gemms.append(a.shape[0]) or int_mm(a, b, **k))
    monkeypatch.setattr(torch, "mm", lambda a, b, **k: mms.append((a.shape, a.dtype, b.dtype)) or mm(a, b, **k))
    g = torch.Generator().manual_seed(2)
    row = fp._FP_ROW
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in (row * 70, row * 30, row * 2 + 9, 100)]
    assert fp._fingerprints(ts) == [reference(t) for t in ts]
    assert firsts == [70, 34], firsts  # 30 + 3 + 1 staged rows (104 rows of Y in all: a multiple of 8)
    assert len(gemms) == 2, gemms
    assert mms == [((4 * fp._FP_COLS, 104), torch.float64, torch.float64)], mms


@pytest.mark.parametrize("at", [0, 1, 32768 * 17 - 1, 32768 * 17, -1])
def test_one_changed_byte_changes_the_fingerprint(at):
    t = torch.randint(0, 256, (32768 * 17 + 100,), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    before = guard.fingerprint(t)
    flip(t, at)
    assert guard.fingerprint(t) != before
    flip(t, at)
    assert guard.fingerprint(t) == before


# -- every way an engine copies converted tensors --------------------------------------------


def _params_copy(out):
    params = {k: torch.nn.Parameter(torch.empty_like(v), requires_grad=False) for k, v in out.items()}
    for k, p in params.items():
        p.data.copy_(out[k])
    return params


def _state_dict_copy(out):
    layer = torch.nn.Module()
    for k, v in out.items():
        layer.register_parameter(k, torch.nn.Parameter(torch.zeros_like(v), requires_grad=False))
    layer.load_state_dict({k: v for k, v in out.items()})
    return dict(layer.named_parameters())


def _saved_and_loaded(out):
    buf = io.BytesIO()
    torch.save(dict(out), buf)
    buf.seek(0)
    return torch.load(buf)


COPIES = {
    "clone": lambda out: {k: v.clone() for k, v in out.items()},
    "to_device": lambda out: {k: v.to("cpu", copy=True) for k, v in out.items()},  # a copy; cuda in the benchmark
    "empty_like_copy_": lambda out: {k: torch.empty_like(v).copy_(v) for k, v in out.items()},
    "param_data_copy_": _params_copy,
    "load_state_dict": _state_dict_copy,
    "torch_save_load": _saved_and_loaded,
}


@pytest.mark.parametrize("how", sorted(COPIES))
def test_a_copy_is_accepted_when_equal_and_rejected_after_one_changed_byte(bf16, how):
    out = bf16.convert(synthetic_inputs(bf16, DIMS, 10))
    copy = COPIES[how](out)
    assert all(copy[k].untyped_storage().data_ptr() != out[k].untyped_storage().data_ptr() for k in out)
    record = guard.check(copy, bf16, same_call=True)
    assert record["spec"] == "flashinfer_cutlass_bf16"
    assert guard.provenance(copy["w13_weight"])["call"] == guard.provenance(out["w13_weight"])["call"]
    changed = COPIES[how](out)
    with torch.no_grad():
        flip(changed["w2_weight_scale"] if not isinstance(changed["w2_weight_scale"], torch.nn.Parameter)
             else changed["w2_weight_scale"].data)
    with pytest.raises(layoutc.LayoutError, match="w2_weight_scale was not produced by a layoutc converter: its bytes"):
        guard.check(changed, bf16)


def test_a_copy_outlives_its_original_and_later_edits_are_seen(bf16):
    out = bf16.convert(synthetic_inputs(bf16, DIMS, 11))
    moved = {k: v.clone() for k, v in out.items()}
    del out
    gc.collect()
    guard.check(moved, bf16)  # adopted by fingerprint: the original's record is gone
    assert guard.provenance(moved["w13_bias"]) is not None  # later calls: a dict lookup
    moved["w13_bias"].add_(1)
    with pytest.raises(layoutc.LayoutError, match="w13_bias was modified in place"):
        guard.check(moved, bf16)


def test_data_edits_are_seen_only_by_rehash(bf16):
    out = bf16.convert(synthetic_inputs(bf16, DIMS, 12))
    params = {k: torch.nn.Parameter(v, requires_grad=False) for k, v in out.items()}
    guard.check(params, bf16, rehash=True)
    flip(params["w2_weight"].data)  # .data: a tensor with its own version counter
    guard.check(params, bf16)  # what the plain check cannot see (README: the guard before the kernel)
    with pytest.raises(layoutc.LayoutError, match="the bytes of w2_weight changed since"):
        guard.check(params, bf16, rehash=True)


def test_without_fingerprints_the_outputs_pass_and_copies_and_rehash_are_refused(bf16):
    # fingerprint=False: no pass over the outputs' bytes; the guard knows them by storage alone
    out = bf16.convert(synthetic_inputs(bf16, DIMS, 13), fingerprint=False)
    assert guard.check(out, bf16)["spec"] == "flashinfer_cutlass_bf16"
    with pytest.raises(layoutc.LayoutError, match="copy of a conversion made with fingerprint=False"):
        guard.check({k: v.clone() for k, v in out.items()}, bf16)
    with pytest.raises(layoutc.LayoutError, match="converted with fingerprint=False"):
        guard.check(out, bf16, rehash=True)


def test_a_copy_with_the_bytes_of_another_tensor_or_another_layout_is_named(bf16):
    out = bf16.convert(synthetic_inputs(bf16, DIMS, 13))
    with pytest.raises(layoutc.LayoutError, match="w13_weight holds the converted w2_weight"):
        guard.check({**out, "w13_weight": out["w2_weight"].clone()})
    w = out["w13_weight"]
    # the logical bytes of w in column-major memory: a kernel reading memory would see another layout
    strided = w.transpose(1, 2).contiguous().transpose(1, 2)
    assert torch.equal(strided, w) and strided.stride() != w.stride()
    with pytest.raises(layoutc.LayoutError, match="reshaped or reinterpreted"):
        guard.check({**out, "w13_weight": strided}, bf16)
    with pytest.raises(layoutc.LayoutError, match="reshaped or reinterpreted"):
        guard.check({**out, "w13_weight": w.clone().view(torch.int8)})


def test_equal_bytes_in_several_layers_keep_their_layer(bf16):
    # zero biases: every layer's are equal; a copy takes the call of its siblings
    layers = []
    for seed in (14, 15):
        x = synthetic_inputs(bf16, DIMS, seed)
        x["w13_bias"], x["w2_bias"] = torch.zeros_like(x["w13_bias"]), torch.zeros_like(x["w2_bias"])
        layers.append(bf16.convert(x))
    for out in layers:
        guard.check({k: v.clone() for k, v in out.items()}, bf16, same_call=True)


# -- every shipped spec, with the spec given (padded layouts included), through a copy -----------

SPEC_DIMS = {"E": 2, "I": 192, "H": 256}  # I not a multiple of 128: the padded layouts pad


@pytest.mark.parametrize("stem", shipped.names())
def test_every_shipped_spec_is_guarded_through_a_copy(stem):
    spec = layoutc.compile_file(SPECS / f"{stem}.lyt")
    whole = ("flashinfer_cutlass_bf16", "flashinfer_cutlass_mxfp8", "flashinfer_trtllm_fp8_block",
             "marlin_gptq_int4", "aiter_fp8_block", "deepgemm_fp8_block",  # need I % 128
             "vllm_cutlass_w4a8")  # I % 256
    dims = {"E": 2, "I": 256, "H": 256} if stem in whole else SPEC_DIMS
    out = spec.convert(synthetic_inputs(spec, dims, 16))
    copy = {k: v.clone() for k, v in out.items()}
    del out
    record = guard.check(copy, spec)
    assert record["dims"]["I"] == dims["I"]
    guard.check(copy, spec, dims=dims)
    with pytest.raises(layoutc.LayoutError):
        guard.check(copy, spec, dims={**dims, "I": 2 * dims["I"]})  # other sizes than converted
    name = sorted(copy)[0]
    changed = dict(copy, **{name: copy[name].clone()})
    flip(changed[name], 3)
    with pytest.raises(layoutc.LayoutError, match=f"{name} was not produced"):
        guard.check(changed, spec)


def test_the_standalone_module_follows_copies_of_a_padded_layout(tmp_path):
    spec = layoutc.compile_file(SPECS / "flashinfer_trtllm_mxfp4.lyt")
    path = spec.write(tmp_path / "conv_padded.py")
    loader = importlib.util.spec_from_file_location("conv_padded_guard_test", path)
    mod = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(mod)
    out = mod.convert(synthetic_inputs(spec, SPEC_DIMS, 17))
    copy = {k: v.clone() for k, v in out.items()}
    assert mod.guard(copy)["dims"]["I"] == 192
    assert guard.fingerprint(copy["w13_weight"], converted=True) == guard.fingerprint(out["w13_weight"])
    changed = dict(copy, w2_bias=copy["w2_bias"].clone())
    flip(changed["w2_bias"])
    with pytest.raises(mod.LayoutError, match="w2_bias was not produced"):
        mod.guard(changed)


# -- tensor-parallel slices: each rank's stamp names its rank ---------------------------------


def test_tensor_parallel_copies_name_their_rank():
    r0, r1 = (layoutc.compile_file(SPECS / "flashinfer_trtllm_bf16.lyt", {"tp_size": 2, "tp_rank": r})
              for r in (0, 1))
    base = layoutc.compile_file(SPECS / "flashinfer_trtllm_bf16.lyt")
    full = synthetic_inputs(base, {"E": 1, "I": 384, "H": 128}, 18)
    c0 = {k: v.clone() for k, v in r0.convert(full).items()}
    c1 = {k: v.clone() for k, v in r1.convert(full).items()}
    assert guard.check(c0, r0)["params"]["tp_rank"] == 0
    assert guard.check(c1, r1)["params"]["tp_rank"] == 1
    with pytest.raises(layoutc.LayoutError, match=r"tensor-parallel rank 1 of 2\), expected .*rank 0 of 2"):
        guard.check(c1, r0)
    with pytest.raises(layoutc.LayoutError, match="rank 1 of 2.* vs .*rank 0 of 2"):
        guard.check({**c0, "w2_weight": c1["w2_weight"]})


# -- checkpoints converted ahead of time ----------------------------------------------------------


def _load(folder):
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def _layer(tensors, layer):
    head = PREFIX.format(layer) + "."
    return {k[len(head):]: v for k, v in tensors.items() if k.startswith(head)}


def test_a_converted_checkpoint_is_trusted_by_content(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16)
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    finish(bf16, tmp_path / "in", tmp_path / "out", "vllm")
    manifest = json.loads((tmp_path / "out" / "layoutc_manifest.json").read_text())
    assert len(manifest["tensors"]) == 4 * 6
    loaded = _load(tmp_path / "out")
    trusted = guard.trust_checkpoint(tmp_path / "out", loaded, bf16)
    assert trusted[f"{PREFIX.format(0)}.w13_weight"] == "w13_weight" and len(trusted) == 24
    for layer in range(4):
        # an engine's path: parameters, a copy onto the device (here: another CPU tensor)
        params = {k: torch.nn.Parameter(v.clone(), requires_grad=False) for k, v in _layer(loaded, layer).items()}
        assert guard.check(params, bf16, same_call=True)["dims"] == {"E": 2, "I": 256, "H": 256}
    with pytest.raises(layoutc.LayoutError, match="different calls"):
        guard.check({**_layer(loaded, 0), "w2_bias": _layer(loaded, 1)["w2_bias"]}, bf16, same_call=True)


def test_a_shard_changed_after_conversion_is_rejected_naming_the_tensor(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    finish(bf16, tmp_path / "in", tmp_path / "out", "vllm")
    loaded = _load(tmp_path / "out")
    name = f"{PREFIX.format(1)}.w13_weight_scale"
    flip(loaded[name], 5)
    with pytest.raises(layoutc.LayoutError, match=rf"{name} \(w13_weight_scale of layer .*1.*\): its bytes are not"):
        guard.trust_checkpoint(tmp_path / "out", loaded)
    assert guard.provenance(loaded[f"{PREFIX.format(0)}.w13_weight"]) is None  # nothing stamped
    with pytest.raises(layoutc.LayoutError, match="not produced by a layoutc converter"):
        guard.check(_layer(loaded, 1), bf16)
    other = layoutc.compile_file(SPECS / "flashinfer_cutlass_mxfp8.lyt")
    with pytest.raises(layoutc.LayoutError, match="converted with spec flashinfer_cutlass_bf16"):
        guard.trust_checkpoint(tmp_path / "out", loaded, other)
    with pytest.raises(layoutc.LayoutError, match="none of the 1 tensors"):
        guard.trust_checkpoint(tmp_path / "out", {"lm_head.weight": torch.zeros(1)})
    with pytest.raises(layoutc.LayoutError, match="is not the output of layoutc convert"):
        guard.trust_checkpoint(tmp_path / "in", loaded)


@pytest.mark.slow  # two folders converted and verified: ~10 s on the shared 2-core machine
def test_a_padded_tensor_parallel_checkpoint_is_trusted_with_its_dims(tmp_path):
    base = layoutc.compile_file(SPECS / "flashinfer_trtllm_mxfp4.lyt")
    ranks = [layoutc.compile_file(SPECS / "flashinfer_trtllm_mxfp4.lyt", {"tp_size": 2, "tp_rank": r}) for r in (0, 1)]
    make_checkpoint(tmp_path / "in", base, layers=2, shards=1)
    outs = [tmp_path / "tp0", tmp_path / "tp1"]
    convert_checkpoint(ranks, tmp_path / "in", outs)
    for s, o in zip(ranks, outs):
        finish(s, tmp_path / "in", o, "vllm")
    l0, l1 = _load(outs[0]), _load(outs[1])
    guard.trust_checkpoint(outs[0], l0, ranks[0])
    guard.trust_checkpoint(outs[1], l1, ranks[1])
    layer0 = _layer(l0, 0)
    record = guard.check({k: v.clone() for k, v in layer0.items()}, ranks[0])
    assert record["params"]["tp_rank"] == 0 and record["dims"]["I"] == 256
    with pytest.raises(layoutc.LayoutError, match="rank 1 of 2"):
        guard.check(_layer(l1, 0), ranks[0])
    with pytest.raises(layoutc.LayoutError, match="converted with parameters"):
        guard.trust_checkpoint(outs[1], l1, ranks[0])


def test_a_stamp_without_fingerprints_is_converted_again(tmp_path, bf16):
    make_checkpoint(tmp_path / "in", bf16, layers=2, shards=1)
    convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    done = next((tmp_path / "out" / ".layoutc-done").glob("*.json"))
    stamp = json.loads(done.read_text())
    del stamp["tensors"]  # as an older layoutc wrote it
    done.write_text(json.dumps(stamp))
    again = convert_checkpoint(bf16, tmp_path / "in", tmp_path / "out")
    assert again["written_shards"] == 1 and again["skipped_shards"] == 0
    assert "tensors" in json.loads(done.read_text())


@pytest.mark.slow  # nine folders converted and verified
@pytest.mark.parametrize("stem", shipped.names())
def test_every_shipped_spec_is_trusted_from_a_converted_checkpoint(tmp_path, stem, monkeypatch):
    import tests.convert.test_checkpoint as ckpt

    spec = layoutc.compile_file(SPECS / f"{stem}.lyt")
    monkeypatch.setattr(ckpt, "DIMS", {"E": 2, "I": 256, "H": 256})
    make_checkpoint(tmp_path / "in", spec, layers=2, shards=1)
    convert_checkpoint(spec, tmp_path / "in", tmp_path / "out")
    finish(spec, tmp_path / "in", tmp_path / "out", "vllm")
    loaded = _load(tmp_path / "out")
    assert len(guard.trust_checkpoint(tmp_path / "out", loaded, spec)) == 2 * len(spec.module.OUTPUTS)
    for layer in range(2):
        params = {k: torch.nn.Parameter(v.clone(), requires_grad=False) for k, v in _layer(loaded, layer).items()}
        assert guard.check(params, spec, same_call=True)["dims"]["I"] == 256


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fingerprints_are_read_back_from_pinned_host_memory():
    # The products Z go to pinned host memory in the stream's order (no device call, no wait on the caller's
    # stream when the stamp reads finished fingerprints back); the values are those of the CPU, on a misaligned
    # view too (cloned once).
    g = torch.Generator().manual_seed(2)
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in (5, 32768 * 17 + 3, 100003)]
    ts.append(torch.randn(64, 48, generator=g).to(torch.bfloat16))
    cuda = [t.cuda() for t in ts] + [ts[1].cuda()[1:]]
    handle = fp._fingerprint_start(cuda)
    for part in handle:
        z, event = part[1]
        assert z.device.type == "cpu" and z.is_pinned() and event is not None
    assert fp._fingerprint_finish(handle, len(cuda)) == [reference(t) for t in ts + [ts[1][1:]]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_triton_and_cublas_forms_agree_across_segments(monkeypatch):
    # The fingerprint's two CUDA forms (Triton kernels, cuBLAS GEMMs; the latter held to the definition above)
    # on a tensor of two 2 GiB segments and a partial row, and on a layer's mix of sizes: the same strings.
    import os

    if os.environ.get("TRITON_INTERPRET") == "1" or fp._fp_triton() is None:
        pytest.skip("the compiled Triton kernels are not what this process runs")
    g = torch.Generator(device="cuda").manual_seed(5)
    big = torch.randint(0, 256, ((1 << 31) + 32768 + 5,), dtype=torch.uint8, generator=g, device="cuda")
    small = [big[: n] for n in (1, 7, 32768 * 17 + 3)] + [big[3: 3 + 100003].clone()]
    triton_form = fp._fingerprints([big, *small])
    assert triton_form[1:] == [reference(t.cpu()) for t in small]
    monkeypatch.setitem(fp._FP_TRITON_STATE, "kernel", None)
    assert fp._fingerprints([big, *small]) == triton_form
