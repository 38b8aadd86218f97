"""The warm call (layoutc.runtime.warm): a call with the key of one that passed every check skips the checks;
every other call is checked in full, and nothing a check refuses is ever remembered.

The checks are counted by wrapping the converter module's own functions (the generated ``convert`` reads
them from its globals), so a test sees which path a call took without timing it.
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
def case(bf16, monkeypatch):
    m = bf16.module
    monkeypatch.setattr(m, "_WARM", {})
    calls = {"_check_call": 0, "_check_out": 0, "_choose_lowering": 0}
    for name in calls:
        real = getattr(m, name)

        def counted(*args, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(*args, **kw)
        monkeypatch.setattr(m, name, counted)
    x = synthetic_inputs(bf16, DIMS, 3)
    ref = bf16.convert(x)
    for name in calls:
        calls[name] = 0
    return bf16, x, ref, {k: torch.empty_like(v) for k, v in ref.items()}, calls


def test_a_second_call_with_the_same_key_skips_the_checks_and_is_converted_and_stamped(case):
    spec, x, ref, out, calls = case
    before = {k: bits(v).clone() for k, v in x.items()}
    first = spec.convert(x, out=out, fingerprint=False)
    assert calls == {"_check_call": 1, "_check_out": 1, "_choose_lowering": 1}
    call = guard.provenance(first["w13_weight"])["call"]
    for t in out.values():
        t.view(torch.uint8).fill_(0x5A)
    got = spec.convert(x, out=out, fingerprint=False)
    assert calls == {"_check_call": 1, "_check_out": 1, "_choose_lowering": 1}  # the hit: no check ran
    assert all(got[k] is out[k] and torch.equal(bits(got[k]), bits(ref[k])) for k in ref)
    assert all(torch.equal(bits(x[k]), before[k]) for k in x)  # inputs untouched
    records = [guard.provenance(t) for t in got.values()]
    assert len({r["call"] for r in records}) == 1 and records[0]["call"] > call and records[0]["dims"] == DIMS
    assert guard.check(got, spec)
    got["w2_weight"].view(torch.uint8).add_(1)
    with pytest.raises(LayoutError, match="w2_weight was modified in place"):
        guard.check(got, spec)


def test_without_out_the_key_holds_no_address_and_other_inputs_of_the_shape_hit(case):
    spec, x, ref, _, calls = case
    y = synthetic_inputs(spec, DIMS, 4)
    spec.convert(x)  # the fixture's call remembered this key already
    got = spec.convert(y)
    assert calls["_check_call"] == 0
    fresh = {k: v.clone() for k, v in y.items()}
    spec.module._WARM.clear()
    want = spec.convert(fresh)
    assert all(torch.equal(bits(got[k]), bits(want[k])) for k in want)
    assert not torch.equal(bits(got["w13_weight"]), bits(ref["w13_weight"]))
    assert guard.check(got, spec)


@pytest.mark.parametrize("change", ["out address", "input address", "shape", "dims", "lowering", "strides"])
def test_a_changed_key_is_checked_in_full(case, change):
    spec, x, ref, out, calls = case
    spec.convert(x, out=out)
    kw = {}
    if change == "out address":
        out = dict(out, w2_bias=torch.empty_like(out["w2_bias"]))
    elif change == "input address":
        x = dict(x, w2_bias=x["w2_bias"].clone())
    elif change == "shape":
        x = synthetic_inputs(spec, dict(DIMS, E=3), 3)
        out = {k: torch.empty((3, *v.shape[1:]), dtype=v.dtype) for k, v in ref.items()}
    elif change == "dims":
        kw = {"dims": {"E": 2}}
    elif change == "lowering":
        kw = {"lowering": "eager"}
    else:  # the same bytes, another layout in memory: a transposed copy seen through a transposed view
        x = dict(x, w2_weight=x["w2_weight"].transpose(1, 2).contiguous().transpose(1, 2))
    spec.convert(x, out=out, **kw)
    assert calls["_check_call"] == 2


def test_a_refused_call_is_never_remembered_and_a_remembered_key_refuses_what_it_must(case):
    spec, x, _, out, calls = case
    y = dict(x, w2_weight=out["w2_weight"].view(x["w2_weight"].dtype).view(x["w2_weight"].shape))
    known = set(spec.module._WARM)  # the fixture's call without out=
    for _ in range(2):  # overlapping an input: refused on the first call and on the same key again
        with pytest.raises(LayoutError, match=r"out\['w2_weight'\] shares memory with the input 'w2_weight'"):
            spec.convert(y, out=out)
    assert calls["_check_out"] == 2 and set(spec.module._WARM) == known
    spec.convert(x, out=out)  # passes: its key is remembered
    out["w13_bias"].requires_grad_(True)
    with pytest.raises(LayoutError, match="requires grad"):
        spec.convert(x, out=out)
    out["w13_bias"].requires_grad_(False)
    spec.convert(x, out=out)  # the remembered key again
    assert calls["_check_out"] == 4
    with torch.inference_mode():
        inf = torch.empty_like(out["w13_bias"])
    with pytest.raises(LayoutError, match="inference tensor"):
        spec.convert(x, out=dict(out, w13_bias=inf))
    with pytest.raises(LayoutError, match="out= cannot be combined"):
        spec.convert(x, out=out, chunk=1)


def test_storage_freed_and_reused_at_a_remembered_address_is_recorded_anew(case):
    # A hit proves the addresses, shapes and strides a checked call had, not the storage: the stamp
    # records the storage it is given, so the guard follows the new tensor.
    spec, x, ref, _, calls = case
    out = {k: torch.empty_like(v) for k, v in ref.items()}
    spec.convert(x, out=out, fingerprint=False)
    ptrs = {k: v.data_ptr() for k, v in out.items()}
    out = None
    again = {k: torch.empty_like(v) for k, v in ref.items()}  # the allocator hands the freed blocks back
    got = spec.convert(x, out=again, fingerprint=False)
    if {k: v.data_ptr() for k, v in again.items()} == ptrs:
        assert calls["_check_out"] == 1  # a hit on the freed tensors' key
    assert all(guard.provenance(t)["call"] == guard.provenance(got["w2_bias"])["call"] for t in got.values())
    assert guard.check(got, spec)
    got["w13_weight"].view(torch.uint8).add_(1)
    with pytest.raises(LayoutError, match="modified in place"):
        guard.check(got, spec)


def test_calls_that_are_not_plain_dicts_are_checked_every_time(case):
    spec, x, _, _, calls = case

    class Mapping(dict):
        pass

    spec.convert(Mapping(x))
    spec.convert(Mapping(x))
    assert calls["_check_call"] == 2
    with pytest.raises(LayoutError, match="expected a torch.Tensor"):
        spec.convert(dict(x, w2_bias=[1, 2]))


def test_widened_inputs_are_not_remembered(case, monkeypatch):
    spec, x, _, _, _ = case
    m = spec.module
    monkeypatch.setattr(m, "_widened", lambda t, c: {k: (v.clone() if k == "w2_bias" else v) for k, v in t.items()})
    m._WARM.clear()
    spec.convert(x)
    assert not m._WARM
