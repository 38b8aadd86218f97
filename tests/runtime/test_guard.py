"""The runtime guard: provenance recorded by every converter, checked before the kernel."""

from __future__ import annotations

import gc
import importlib.util

import pytest
import torch

import layoutc
import layoutc.guard as guard
from layoutc.convert.synthckpt import synthetic_inputs
from tests.helpers import FLASHINFER, SPECS

DIMS = {"E": 2, "I": 128, "H": 128}


def test_outputs_carry_their_provenance_through_nn_parameter(bf16):
    out = bf16.convert(synthetic_inputs(bf16, DIMS, 0))
    params = {k: torch.nn.Parameter(v, requires_grad=False) for k, v in out.items()}
    record = guard.check(params, bf16)
    assert record["spec"] == "flashinfer_cutlass_bf16"
    assert record["sha256"] == bf16.sha256
    installed = dict(record["library"])["flashinfer"]  # the version the conversion ran with, None without it
    assert installed.startswith("0.7") if FLASHINFER else installed is None
    assert guard.provenance(params["w2_weight"])["tensor"] == "w2_weight"


def test_mixing_specs_is_caught(bf16, mxfp8):
    x = synthetic_inputs(bf16, DIMS, 1)
    a, b = bf16.convert(x), mxfp8.convert(x)
    with pytest.raises(layoutc.LayoutError, match="w2_weight_scale and w13_weight come from different spec"):
        guard.check({**a, "w2_weight_scale": b["w2_weight_scale"]})
    with pytest.raises(layoutc.LayoutError, match="converted by spec flashinfer_cutlass_mxfp8"):
        guard.check({**a, "w13_weight": b["w13_weight"]}, bf16)


def test_mixing_parameters_is_caught():
    silu = layoutc.compile_file(SPECS / "flashinfer_cutedsl_nvfp4.lyt", {"activation": "silu"})
    relu = layoutc.compile_file(SPECS / "flashinfer_cutedsl_nvfp4.lyt", {"activation": "relu2"})
    dims = {"E": 1, "I": 64, "H": 64}
    a = silu.convert(synthetic_inputs(silu, dims, 0))
    b = relu.convert(synthetic_inputs(relu, dims, 0))
    with pytest.raises(layoutc.LayoutError, match="different parameters"):
        guard.check({**a, "w2_weight": b["w2_weight"]})


def test_edits_after_conversion_are_caught(bf16):
    out = bf16.convert(synthetic_inputs(bf16, DIMS, 2))
    out["w2_bias"].mul_(2)
    with pytest.raises(layoutc.LayoutError, match="w2_bias was modified in place"):
        guard.check(out, bf16)
    out = bf16.convert(synthetic_inputs(bf16, DIMS, 2))
    with pytest.raises(layoutc.LayoutError, match="reshaped or reinterpreted"):
        guard.check({**out, "w13_weight": out["w13_weight"].view(torch.int8)}, bf16)


def test_foreign_and_misplaced_tensors_are_caught(bf16):
    x = synthetic_inputs(bf16, DIMS, 3)
    out = bf16.convert(x)
    with pytest.raises(layoutc.LayoutError, match="w2_bias was not produced by a layoutc converter"):
        guard.check({**out, "w2_bias": x["w2_bias"].to(torch.bfloat16) + 1}, bf16)
    # the guard follows bytes: the same bytes made another way (this spec copies the bias) are the converted ones
    guard.check({**out, "w2_bias": x["w2_bias"].to(torch.bfloat16)}, bf16)
    with pytest.raises(layoutc.LayoutError, match="w13_bias holds the converted w2_bias"):
        guard.check({**out, "w13_bias": out["w2_bias"]}, bf16)


def test_layers_converted_separately_can_be_told_apart(bf16):
    a = bf16.convert(synthetic_inputs(bf16, DIMS, 4))
    b = bf16.convert(synthetic_inputs(bf16, DIMS, 5))
    mixed = {**a, "w2_weight": b["w2_weight"]}
    guard.check(mixed, bf16)  # same spec: fine by default
    with pytest.raises(layoutc.LayoutError, match="different calls"):
        guard.check(mixed, bf16, same_call=True)


def test_contract_shapes_are_checked(bf16):
    small = bf16.convert(synthetic_inputs(bf16, DIMS, 6))
    big = bf16.convert(synthetic_inputs(bf16, {"E": 2, "I": 256, "H": 128}, 6))
    with pytest.raises(layoutc.LayoutError):
        guard.check({**small, "w13_weight": big["w13_weight"]}, bf16)


def test_records_of_freed_tensors_do_not_vouch_for_new_ones(bf16):
    out = bf16.convert(synthetic_inputs(bf16, DIMS, 7))
    key = out["w2_bias"]
    ptr = key.untyped_storage().data_ptr()
    del out, key
    gc.collect()
    reused = torch.empty(0)
    assert guard.provenance(reused) is None
    from layoutc.runtime.guard_rt import _provenance_registry
    stale = [r for k, r in _provenance_registry().records.items() if k[0] == ptr]
    assert all(r["storage"].expired() for r in stale)


def test_the_registry_sweeps_freed_records_when_it_doubles_not_on_every_call(bf16):
    # A model's converted layers stay alive: a sweep over every record per call made converting
    # n layers O(n^2). Below the threshold a stamp visits no record (Counting below); at it, the
    # records of freed storages go, live ones stay, and the next threshold is twice what is left.
    from layoutc.runtime.guard_rt import _provenance_registry

    gc.collect()
    reg = _provenance_registry()
    x = synthetic_inputs(bf16, DIMS, 8)
    kept = [bf16.convert(x) for _ in range(20)]  # 20 layers x 6 outputs, all alive
    discarded = [bf16.convert(x) for _ in range(10)]
    del discarded
    gc.collect()
    assert any(r["storage"].expired() for r in reg.records.values())
    reg.sweep_at = len(reg.records)  # the next stamp sweeps
    last = bf16.convert(x)
    assert not any(r["storage"].expired() for r in reg.records.values())
    assert len(reg.records) >= 21 * 6 and reg.sweep_at == max(64, 2 * (len(reg.records) - len(last)))
    assert all(guard.provenance(t)["call"] == guard.provenance(o["w2_weight"])["call"]
               for o in kept for t in o.values())

    class Counting:  # stands in for every record's weak reference: counts expiry checks
        calls = 0

        def expired(self):
            Counting.calls += 1
            return False

    saved = {k: r["storage"] for k, r in reg.records.items()}
    reg.sweep_at = len(reg.records) + 100  # below the threshold: no sweep
    try:
        for r in reg.records.values():
            r["storage"] = Counting()
        bf16.convert(x)
        assert Counting.calls == 0
    finally:
        for k, ref in saved.items():
            if k in reg.records and isinstance(reg.records[k]["storage"], Counting):
                reg.records[k]["storage"] = ref


def test_standalone_module_has_the_same_guard(bf16, tmp_path):
    path = bf16.write(tmp_path / "conv.py")
    spec = importlib.util.spec_from_file_location("conv_guard_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.convert(synthetic_inputs(bf16, DIMS, 8))
    assert mod.guard(out)["sha256"] == mod.SPEC_SHA256
    # Registry is process-wide: the library sees the module's records and vice versa.
    assert guard.provenance(out["w13_weight"])["spec"] == "flashinfer_cutlass_bf16"
    other = bf16.convert(synthetic_inputs(bf16, DIMS, 8))
    mod.guard(other)
    out["w2_weight"].add_(1)
    with pytest.raises(mod.LayoutError, match="modified in place"):
        mod.guard(out)
