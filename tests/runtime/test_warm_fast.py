"""The one-lookup warm call with a prepared launch (layoutc.runtime.warm): a hit with the key and the tensor
check of a call that passed every check calls that call's prepared launch directly and stamps its outputs; a
call whose tensors differ in anything a check reads (storage address, shape, strides, dtype, requires_grad,
inference, a subclass) is checked in full, whatever the check in use (torch's TensorGuards or the Python
tuple); entries keep no tensor alive; the records follow the storage given.

The CPU has no compiled kernels: the layer function here prepares a launch (runtime._prepare) of a stand-in
kernel that converts with the eager lowering into the tensors it is handed, as a fused layer function does
on CUDA (its first call launches and prepares; later calls take the prepared run).
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import layoutc.guard as guard
from layoutc import LayoutError
from layoutc.convert.synthckpt import synthetic_inputs
from tests.helpers import bits

DIMS = {"E": 2, "I": 128, "H": 256}


def _layer(m, ref, present, log):
    names, convert = list(ref), m._convert  # the kernel's work, kept: a test takes m._convert away

    def layer(tensors, d, outs=None):
        xs = tuple(tensors[n] for n in names)
        key = m._prepared_key(layer, xs, d)
        run = m._PREPARED.get(key)
        if run is not None:
            return run(xs, outs)
        log["full"] += 1

        class Kernel:  # the compiled kernel: converts (eager lowering) into the outputs it is handed
            function = object()

            def __getitem__(self, grid):
                def launch(*args):
                    log["launch"] += 1
                    got = convert(dict(zip(names, args[0::2])), d, present, "eager")
                    for n, y in zip(names, args[1::2]):
                        bits(y).copy_(bits(got[n]))
                return launch

        out = {n: outs[n] if outs is not None else torch.empty_like(ref[n]) for n in names}
        args = [t for n, x in zip(names, xs) for t in (x, out[n])]
        Kernel()[(1, 1, 1)](*args)
        m._prepare(key, Kernel(), 1, {}, out, args, [])
        return out
    return layer


@pytest.fixture(params=["TensorGuards", "Python tuple"])
def case(bf16, monkeypatch, request):
    m = bf16.module
    if request.param == "Python tuple":
        monkeypatch.setattr(m, "_WARM_GUARDS", [None])
    elif m._warm_guards() is None:
        pytest.skip("this torch has no usable TensorGuards")
    x = synthetic_inputs(bf16, DIMS, 3)
    ref = bf16.convert(x, lowering="eager")
    present = m._check_call(x, None, "convert", m.INPUTS, m._INPUT_SHAPES, m._INPUT_AXES, m.DIMS, m._CONDITIONS,
                            m._CONVERT_CHECKS)[1]
    how = m._choose_lowering("auto", x, m._LOWERINGS)
    log = {"full": 0, "launch": 0, "_check_call": 0}
    monkeypatch.setattr(m, "_LAYERS", {(how, present): _layer(m, ref, present, log)})
    monkeypatch.setattr(m, "_WARM", {})
    monkeypatch.setattr(m, "_PREPARED", {})
    real = m._check_call

    def counted(*args, **kw):
        log["_check_call"] += 1
        return real(*args, **kw)
    monkeypatch.setattr(m, "_check_call", counted)
    return bf16, x, ref, log


def _out(ref):
    return {k: torch.empty_like(v) for k, v in ref.items()}


@pytest.mark.parametrize("with_out", [True, False])
def test_a_hit_calls_the_prepared_launch_and_stamps_what_it_wrote(case, with_out, monkeypatch):
    spec, x, ref, log = case
    m = spec.module
    before = {k: bits(v).clone() for k, v in x.items()}
    out = _out(ref) if with_out else None
    spec.convert(x, out=out, fingerprint=False)
    entry = m._warm_hit(m._warm_key(x, None, "auto", out))
    assert entry is not None and entry[5] is not None and log["full"] == 1  # remembered with its prepared launch
    monkeypatch.setattr(m, "_convert", None)  # a hit must not go through the layer dispatch
    for _ in range(2):
        if with_out:
            for t in out.values():
                bits(t).fill_(0x5A)
        got = spec.convert(x, out=out, fingerprint=False)
    assert log["_check_call"] == 1 and log["launch"] == 3 and log["full"] == 1
    assert all(torch.equal(bits(got[k]), bits(ref[k])) for k in ref)
    assert not with_out or all(got[k] is out[k] for k in ref)
    assert all(torch.equal(bits(x[k]), before[k]) for k in x)  # inputs untouched
    records = [guard.provenance(t) for t in got.values()]
    assert len({r["call"] for r in records}) == 1 and records[0]["dims"] == DIMS
    assert all(r["storage"].cdata == t.untyped_storage()._cdata for r, t in zip(records, got.values()))
    assert guard.check(got, spec, same_call=True)
    got["w13_bias"].add_(1)
    with pytest.raises(LayoutError, match="w13_bias was modified in place"):
        guard.check(got, spec)


def _changed(x, out, change):
    # The same addresses as the checked call where the change allows: only the change tells them apart.
    if change == "out shape":
        t = out["w2_weight"]
        return x, dict(out, w2_weight=t.view(t.shape[0], -1))
    if change == "out dtype":
        return x, dict(out, w2_bias=out["w2_bias"].view(torch.float16))
    if change == "out strides":
        t = out["w13_bias"]
        return x, dict(out, w13_bias=t.as_strided(t.shape, (1, t.shape[0])))
    if change == "out requires_grad":
        out["w13_bias"].requires_grad_(True)
        return x, out
    if change == "input dtype":
        return dict(x, w2_weight=x["w2_weight"].view(torch.int8)), out
    if change == "input strides":
        t = x["w2_weight"]
        return dict(x, w2_weight=t.as_strided(t.shape, (t.stride(0), 1, t.shape[1]))), out  # same bytes, read across
    if change == "input shape":
        t = x["w2_bias"]
        return dict(x, w2_bias=t.view(1, -1)), out
    if change == "out aliasing an input":  # an output at an input's address: another key, refused in full
        return x, dict(out, w2_bias=x["w2_bias"].view(torch.bfloat16)[:, : out["w2_bias"].shape[1]])
    if change == "subclass":
        class Sub(torch.Tensor):
            pass
        return x, dict(out, w2_bias=out["w2_bias"].as_subclass(Sub))
    raise AssertionError(change)


@pytest.mark.parametrize("change", ["out shape", "out dtype", "out strides", "out requires_grad", "input dtype",
                                    "input strides", "input shape", "out aliasing an input", "subclass"])
def test_a_tensor_changed_at_the_same_address_is_checked_in_full(case, change):
    spec, x, ref, log = case
    m = spec.module
    out = _out(ref)
    spec.convert(x, out=out, fingerprint=False)
    y, o = _changed(x, out, change)
    assert m._warm_hit(m._warm_key(y, None, "auto", o)) is None
    calls = log["_check_call"]
    try:
        spec.convert(y, out=o, fingerprint=False)
    except LayoutError:
        pass  # refused in full (what the change makes wrong)
    assert log["_check_call"] == calls + 1


def test_a_storage_swapped_under_the_same_tensor_is_checked_and_recorded_anew(case):
    spec, x, ref, log = case
    out = _out(ref)
    spec.convert(x, out=out, fingerprint=False)
    t = out["w2_weight"]
    t.set_(torch.empty_like(t).untyped_storage(), 0, t.shape, t.stride())  # the same object, another storage
    got = spec.convert(x, out=out, fingerprint=False)
    assert log["_check_call"] == 2
    assert guard.provenance(got["w2_weight"])["storage"].cdata == t.untyped_storage()._cdata
    assert torch.equal(bits(got["w2_weight"]), bits(ref["w2_weight"]))
    assert guard.check(got, spec, same_call=True)


def test_warm_entries_keep_no_tensor_alive(case):
    spec, x, ref, log = case
    m = spec.module
    x = {k: v.clone() for k, v in x.items()}
    out = _out(ref)
    got = spec.convert(x, out=out, fingerprint=False)
    spec.convert(x, out=out, fingerprint=False)
    assert m._WARM
    refs = [weakref.ref(t) for t in [*x.values(), *out.values()]]
    x = out = got = None
    gc.collect()
    assert all(r() is None for r in refs)


def test_a_hit_records_a_new_storage_at_a_remembered_address(case):
    # The stamp's copied records: another storage (freed and reallocated at the same address, or new outputs)
    # gets its own weak reference, so its record expires with it and not with the first.
    spec, x, ref, log = case
    m = spec.module
    spec.convert(x, fingerprint=False)
    first = spec.convert(x, fingerprint=False)  # a hit: new outputs, the entry's stamp token
    second = spec.convert(x, fingerprint=False)
    for a, b in zip(first.values(), second.values()):
        assert guard.provenance(b)["storage"].cdata == b.untyped_storage()._cdata != a.untyped_storage()._cdata
    assert guard.check(second, spec, same_call=True) and guard.check(first, spec, same_call=True)
    assert log["full"] == 1 and log["_check_call"] == 1
    names = list(first)
    first = None
    gc.collect()
    assert all(guard.provenance(second[n]) is not None for n in names)


def test_the_prepared_launch_is_not_taken_on_another_current_cuda_device(monkeypatch, bf16):
    m = bf16.module
    ran = []
    run = lambda xs, out: ran.append(xs) or {}  # noqa: E731
    fast = (run, ("a",), 0, False, None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert m._warm_run(fast, {"a": torch.zeros(1)}, None) is None and not ran
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert m._warm_run(fast, {"a": torch.zeros(1)}, None) == {} and len(ran) == 1


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad", "enable_grad"])
def test_a_hit_under_any_mode_gives_plain_tensors_with_version_counters(case, mode):
    spec, x, ref, log = case
    spec.convert(x, fingerprint=False)
    ctx = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad, "enable_grad": torch.enable_grad}[mode]
    with ctx():
        got = spec.convert(x, fingerprint=False)
        assert torch.is_grad_enabled() == (mode == "enable_grad")
    assert not any(t.is_inference() or t.requires_grad for t in got.values())
    assert all(torch.equal(bits(got[k]), bits(ref[k])) for k in ref)
    assert guard.check(got, spec)


def test_the_tensor_check_probe_refuses_what_the_warm_path_relies_on(bf16):
    m = bf16.module
    cls = m._warm_guards()
    if cls is None:
        pytest.skip("this torch has no usable TensorGuards")
    a = torch.zeros(3, 5)
    g = m._warm_guard_of(cls, [a])
    assert g.check(torch.ones(3, 5)) and not g.check(torch.zeros(5, 3).t())
    assert not g.check(torch.zeros(15).view(5, 3)) and not g.check(torch.zeros(3, 5, dtype=torch.int32))
    with torch.no_grad():
        assert not g.check(torch.zeros(3, 5, requires_grad=True))


def test_out_tensors_of_other_strides_on_a_size_one_axis_get_records_of_their_strides(bf16):
    # E = 1: an output is contiguous whatever its first stride. The stamp copied the records of the last
    # call into the same addresses under the out= check's key, which held contiguity, not strides: the
    # records kept the first call's strides and the guard refused the second call's outputs as reshaped.
    x = synthetic_inputs(bf16, dict(DIMS, E=1), 3)
    ref = bf16.convert(x, lowering="eager")
    out = _out(ref)
    bf16.convert(x, out=out, fingerprint=False)
    again = {k: v.as_strided(v.shape, (v.stride(0) * 3, *v.stride()[1:])) for k, v in out.items()}
    got = bf16.convert(x, out=again, fingerprint=False)
    assert all(guard.provenance(t)["stride"] == t.stride() for t in got.values())
    assert guard.check(got, bf16, same_call=True)


# One spec of each kind of layer function (six, four and two tensors; padding; another checkpoint's names).
FLASHINFER = [("flashinfer_cutlass_bf16", {}), ("flashinfer_cutedsl_nvfp4", {"activation": "relu2"}),
              ("flashinfer_trtllm_mxfp4", {"pad_to": 128}),
              ("flashinfer_cutlass_mxfp4_padded", {"checkpoint": "gpt_oss"}),
              ("flashinfer_trtllm_bf16", {"activation": "silu"})]


@pytest.mark.slow
@pytest.mark.parametrize("name,params", FLASHINFER)
def test_every_flashinfer_spec_s_warm_call_takes_its_layer_s_prepared_launch(monkeypatch, name, params):
    # The generated layer functions themselves (not a stand-in): Triton's launch replaced by a compiled kernel
    # that launches nothing, the fused lowering chosen on the CPU. A second call, with out= and without, must
    # be a hit that calls the prepared launch of the whole call (runtime.warm._warm_fast found it).
    from tests.helpers import spec as compile_spec

    m = compile_spec(name, **params).module

    class Compiled:
        function = object()

        def __getitem__(self, grid):
            return lambda *args: None
    monkeypatch.setattr(m, "_launch", lambda kernel, programs, args, consts, warps: Compiled())
    monkeypatch.setattr(m, "_triton_kernels", lambda source, filename: {f"_k_layer_{i}": None for i in range(16)})
    monkeypatch.setattr(m, "_choose_lowering", lambda lowering, tensors, lowerings: "fused")
    monkeypatch.setattr(m, "_warm_remembered", lambda *args: True)
    monkeypatch.setattr(m, "_WARM", {})
    monkeypatch.setattr(m, "_PREPARED", {})
    x = synthetic_inputs(compile_spec(name, **params), {"E": 2, "I": 256, "H": 256}, 1)
    out = _out(m.convert(x, lowering="eager", fingerprint=False))
    for o in (out, None):
        m.convert(x, fingerprint=False, out=o)
        hit = m._warm_hit(m._warm_key(x, None, "auto", o))
        assert hit is not None and hit[5] is not None
