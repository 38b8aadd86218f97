"""convert(..., out=): the outputs written into the caller's tensors (issue 25).

The caller's tensors are checked once per key (names, dtypes, shapes, device, contiguous and aligned,
no memory shared with an input or another output), written (in place by the fused kernels, copied in
by a lowering that allocates), returned as given, and stamped for the guard like any output. A warm
call reuses the stamp's records; the guard's checks still apply to what the caller gets.
"""

from __future__ import annotations

import pytest
import torch

import layoutc.guard as guard
from layoutc import LayoutError
from layoutc.convert.synthckpt import synthetic_inputs
from tests.helpers import bits

DIMS = {"E": 2, "I": 128, "H": 256}


@pytest.fixture()
def case(bf16):
    x = synthetic_inputs(bf16, DIMS, 3)
    ref = bf16.convert(x)
    return bf16, x, ref, {k: torch.empty_like(v) for k, v in ref.items()}


def _error(spec, x, out, **kw) -> str:
    with pytest.raises(LayoutError) as info:
        spec.convert(x, out=out, **kw)
    return str(info.value)


@pytest.mark.parametrize("lowering", ["eager", "gather"])
def test_out_tensors_are_written_returned_and_stamped(case, lowering):
    spec, x, ref, out = case
    before = {k: bits(v).clone() for k, v in x.items()}
    got = spec.convert(x, lowering=lowering, out=out)
    assert list(got) == list(ref) and all(got[k] is out[k] for k in ref)
    for k in ref:
        assert torch.equal(bits(got[k]), bits(ref[k])), k
    assert all(torch.equal(bits(x[k]), before[k]) for k in x)  # inputs untouched
    assert guard.check(got, spec)["spec"] == "flashinfer_cutlass_bf16"


def test_a_second_call_into_the_same_tensors_is_stamped_anew_and_edits_are_still_caught(case):
    spec, x, _, out = case
    first = spec.convert(x, out=out, fingerprint=False)
    call = guard.provenance(first["w13_weight"])["call"]
    y = synthetic_inputs(spec, DIMS, 4)  # other values, other addresses: the same out= tensors
    second = spec.convert(y, out=out, fingerprint=False)
    call2 = guard.provenance(second["w2_bias"])["call"]
    third = spec.convert(y, out=out, fingerprint=False)  # the stamp's copied records
    assert torch.equal(bits(third["w2_weight"]), bits(spec.convert(y)["w2_weight"]))
    records = [guard.provenance(t) for t in third.values()]
    assert len({r["call"] for r in records}) == 1 and records[0]["call"] > call2 > call
    assert records[0]["dims"] == DIMS and records[0]["origin"]["call"] == records[0]["call"]
    assert [r["tensor"] for r in records] == list(third)
    assert guard.check(third, spec)
    third["w2_bias"].add_(1)
    with pytest.raises(LayoutError, match="w2_bias was modified in place"):
        guard.check(third, spec)
    fourth = spec.convert(y, out=out, fingerprint=False)  # converting again re-stamps the version
    assert guard.check(fourth, spec)


def test_records_follow_another_storage_at_a_checked_key(case):
    # The stamp copies the last records under the out= key only while each output's storage is the one
    # recorded: a tensor freed and another allocated at its address is recorded in full.
    spec, x, ref, _ = case
    out = {k: torch.empty_like(v) for k, v in ref.items()}
    spec.convert(x, out=out, fingerprint=False)
    spec.convert(x, out=out, fingerprint=False)
    fresh = {k: torch.empty_like(v) for k, v in ref.items()}
    got = spec.convert(x, out=fresh, fingerprint=False)
    for k, t in got.items():
        r = guard.provenance(t)
        assert r is not None and not r["storage"].expired() and r["tensor"] == k
    assert guard.check(got, spec)


def test_the_default_call_into_out_fingerprints_so_copies_are_followed(case):
    spec, x, _, out = case
    got = spec.convert(x, out=out)
    copies = {k: v.clone() for k, v in got.items()}
    assert guard.check(copies, spec)["spec"] == "flashinfer_cutlass_bf16"


@pytest.mark.parametrize("change, message", [
    ("missing", "out= lacks 'w2_bias'"),
    ("extra", r"out= has 'w2_biass' \(did you mean 'w2_bias'\?\), which this call does not produce; it writes"),
    ("dtype", r"out\['w2_bias'\]: expected bf16 \(torch.bfloat16\), got torch.float32"),
    ("alias_dtype", None),  # a torch alias of the declared dtype (fp4x2 as uint8) is accepted
    ("shape", (r"out\['w13_weight'\]: expected shape \[E, 2\*I, H/2\] = \[2, 256, 128\] \(E=2, I=128, H=256\), "
               r"got \[2, 128, 256\]")),
    ("device", r"out\['w13_bias'\] is on meta but the inputs are on cpu"),
    ("strided", r"out\['w2_weight'\] must be contiguous and start at a 16-byte aligned address"),
    ("misaligned", r"out\['w2_bias'\] must be contiguous and start at a 16-byte aligned address"),
    ("grad", r"out\['w2_bias'\] requires grad"),
    ("inference", r"out\['w2_bias'\] is an inference tensor"),
    ("input", r"out\['w2_weight'\] shares memory with the input 'w2_weight': converters never write into"),
    ("each_other", r"out\['w13_weight'\] shares memory with out\['w2_weight'\]"),
    ("not_tensor", r"out\['w2_bias'\]: expected a torch.Tensor, got list"),
])
def test_a_wrong_out_tensor_is_a_clear_layout_error(case, change, message):
    spec, x, ref, out = case
    before = {k: bits(v).clone() for k, v in x.items()}
    if change == "missing":
        del out["w2_bias"]
    elif change == "extra":
        out["w2_biass"] = out["w2_bias"]
    elif change == "dtype":
        out["w2_bias"] = out["w2_bias"].float()
    elif change == "alias_dtype":
        out["w13_weight"] = out["w13_weight"].view(torch.uint8)
    elif change == "shape":
        out["w13_weight"] = out["w13_weight"].reshape(2, 128, 256)
    elif change == "device":
        out["w13_bias"] = torch.empty_like(out["w13_bias"], device="meta")
    elif change == "strided":
        out["w2_weight"] = torch.empty_like(out["w2_weight"]).transpose(1, 2).contiguous().transpose(1, 2)
    elif change == "misaligned":
        flat = torch.empty(out["w2_bias"].numel() + 1, dtype=torch.bfloat16)
        out["w2_bias"] = flat[1:].view(out["w2_bias"].shape)
    elif change == "grad":
        out["w2_bias"] = out["w2_bias"].float().requires_grad_().bfloat16().detach().requires_grad_()
    elif change == "inference":
        with torch.inference_mode():
            out["w2_bias"] = torch.empty_like(ref["w2_bias"])
    elif change == "input":
        out["w2_weight"] = x["w2_weight"]  # same dtype and shape: the converter would overwrite its input
    elif change == "each_other":
        n13, n2 = out["w13_weight"].numel(), out["w2_weight"].numel()
        buf = torch.empty(n13 + n2, dtype=torch.uint8)  # one arena, the second output starting inside the first
        out["w13_weight"] = buf[:n13].view(out["w13_weight"].shape)
        out["w2_weight"] = buf[n13 - 1024: n13 - 1024 + n2].view(out["w2_weight"].shape)
    elif change == "not_tensor":
        out["w2_bias"] = [1]
    if message is None:
        got = spec.convert(x, out=out)
        assert torch.equal(bits(got["w13_weight"]), bits(ref["w13_weight"])) and got["w13_weight"].dtype == torch.uint8
        return
    assert pytest.raises(LayoutError, spec.convert, x, out=out).match(message)
    assert all(torch.equal(bits(x[k]), before[k]) for k in x)


def test_out_overlapping_an_input_is_caught_though_an_equal_key_passed_before(case):
    # The check's key holds the inputs' extents: the same out= tensors with inputs that now overlap one
    # of them are checked again, not waved through.
    spec, x, _, out = case
    spec.convert(x, out=out)
    y = dict(x, w2_weight=out["w2_weight"].view(x["w2_weight"].dtype).view(x["w2_weight"].shape))
    with pytest.raises(LayoutError, match=r"out\['w2_weight'\] shares memory with the input 'w2_weight'"):
        spec.convert(y, out=out)


def test_out_is_not_combined_with_chunk_or_inplace_and_must_be_a_mapping(case):
    spec, x, _, out = case
    for kw in ({"chunk": 1}, {"inplace": True}):
        with pytest.raises(LayoutError, match="out= cannot be combined with chunk or inplace"):
            spec.convert(x, out=out, **kw)
    with pytest.raises(LayoutError, match="out= takes a mapping from output names to tensors, got list"):
        spec.convert(x, out=list(out.values()))


def test_an_optional_output_is_wanted_only_when_its_input_is_given(bf16):
    x = synthetic_inputs(bf16, DIMS, 5)
    x.pop("w13_bias"), x.pop("w2_bias")
    ref = bf16.convert(x)
    out = {k: torch.empty_like(v) for k, v in ref.items()}
    got = bf16.convert(x, out=out)
    assert set(got) == set(ref) and all(torch.equal(bits(got[k]), bits(ref[k])) for k in ref)
    extra = dict(out, w2_bias=torch.empty(2, 256, dtype=torch.bfloat16))
    with pytest.raises(LayoutError, match="out= has 'w2_bias'.*which this call does not produce"):
        bf16.convert(x, out=extra)


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference"])
def test_the_caller_mode_is_restored_and_outputs_are_plain(bf16, mode):
    x = synthetic_inputs(bf16, DIMS, 6)
    x["w13_bias"].requires_grad_(mode == "grad")
    ctx = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference": torch.inference_mode}[mode]()
    with ctx:
        out = bf16.convert(x)
        assert torch.is_grad_enabled() == (mode == "grad")
        assert torch.is_inference_mode_enabled() == (mode == "inference")
    assert not any(t.requires_grad or t.is_inference() for t in out.values())
    assert guard.check(out, bf16)


def test_the_mode_is_restored_when_the_conversion_fails(bf16):
    m = bf16.module
    with torch.enable_grad():
        with pytest.raises(ZeroDivisionError):
            m._plain(lambda: 1 / 0)
        assert torch.is_grad_enabled()


def test_generated_standalone_module_takes_out(tmp_path, bf16):
    import importlib.util

    spec = bf16
    path = tmp_path / "conv.py"
    path.write_text(spec.source)
    s = importlib.util.spec_from_file_location("conv_out", path)
    m = importlib.util.module_from_spec(s)
    s.loader.exec_module(m)
    x = synthetic_inputs(spec, DIMS, 1)
    ref = m.convert(x)
    out = {k: torch.empty_like(v) for k, v in ref.items()}
    got = m.convert(x, out=out)
    assert all(got[k] is out[k] and torch.equal(bits(got[k]), bits(ref[k])) for k in ref)
    with pytest.raises(m.LayoutError, match=r"out\['w13_weight'\] shares memory with the input 'w13_weight'"):
        m.convert(x, out=dict(out, w13_weight=x["w13_weight"]))
