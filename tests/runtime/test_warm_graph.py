"""A CUDA graph of the prepared launch per out= warm entry (layoutc.runtime.warm, issue 25).

The decision logic runs on the CPU with stand-ins for the graph: a slot only for an entry whose key holds
every address (out=), bound to a CUDA device, one launch and no torch copy, graphs on; the first hit
captures, later hits replay; a failed capture is remembered and never retried; no capture or replay while
the caller captures or a launch hook is set; LAYOUTC_CUDA_GRAPHS=0 turns it off. The CUDA tests (skipped
without a GPU) run a real spec: same bytes and same stamp as the direct launch, replay on the caller's stream
reads the tensors' current bytes, the caller's own capture is not nested into, the graph dies with the entry.
"""

from __future__ import annotations

import gc
import importlib.util
import sys

import pytest
import torch

import layoutc.guard as guard
import layoutc.runtime.warm as warm
from layoutc.convert.synthckpt import synthetic_inputs
from tests.helpers import bits


def _run(launches=True, copies=False):
    def run(xs, outs=None):
        run.calls += 1
        return dict(zip(run.names, outs.values()))
    run.calls, run.names, run.copies, run.launches = 0, ("a",), copies, launches
    return run


@pytest.mark.parametrize("case", ["eligible", "no out=", "cpu", "copies", "no launch", "off"])
def test_a_graph_slot_only_for_an_addressed_cuda_entry_of_one_launch(case, monkeypatch):
    monkeypatch.setattr(warm, "_WARM_GRAPHS", case != "off")
    run = _run(launches=case != "no launch", copies=case == "copies")
    slot = warm._warm_graph_slot(run, None if case == "cpu" else 0, run.copies, case != "no out=")
    assert (slot == [None]) if case == "eligible" else slot is None


@pytest.mark.parametrize("with_out", [True, False])
def test_only_an_out_call_s_entry_is_addressed(bf16, monkeypatch, with_out):
    m = bf16.module
    seen = []
    monkeypatch.setattr(m, "_WARM", {})
    monkeypatch.setattr(m, "_warm_remembered", lambda *args: True)
    monkeypatch.setattr(m, "_warm_fast", lambda how, present, d, tensors, res, layers, addressed=False:
                        seen.append(addressed))
    x = synthetic_inputs(bf16, {"E": 2, "I": 128, "H": 256}, 1)
    out = {k: torch.empty_like(v) for k, v in bf16.convert(x, lowering="eager").items()} if with_out else None
    seen.clear()
    bf16.convert(x, fingerprint=False, out=out)
    assert seen == [with_out]


class _Graph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


class _Knobs:
    launch_enter_hook = None
    launch_exit_hook = None


@pytest.fixture
def fake(monkeypatch):
    # Capture and "is the caller capturing" replaced: what the decision logic does with their answers.
    state = {"capturing": False, "captures": 0, "result": "graph"}

    def capture(run, xs, out):
        state["captures"] += 1
        return {"graph": lambda: (_Graph(), _Knobs()), "fail": lambda: False, "hook": lambda: None}[state["result"]]()
    monkeypatch.setattr(warm, "_warm_capture", capture)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(warm, "_WARM_GRAPHS", True)
    return state


def _fast(run):
    return run, run.names, 0, False, [None]


def test_the_first_hit_captures_and_later_hits_replay_without_launching(fake):
    run, out = _run(), {"a": torch.zeros(2)}
    fast = _fast(run)
    for _ in range(3):
        got = warm._warm_run(fast, {"a": torch.ones(2)}, out)
        assert got == {"a": out["a"]} and got is not out
    assert fake["captures"] == 1 and run.calls == 0 and fast[4][0][0].replays == 3


def test_a_failed_capture_launches_directly_and_is_not_retried(fake):
    fake["result"] = "fail"
    run, out = _run(), {"a": torch.zeros(2)}
    fast = _fast(run)
    for _ in range(3):
        assert warm._warm_run(fast, {"a": torch.ones(2)}, out) == {"a": out["a"]}
    assert fake["captures"] == 1 and run.calls == 3 and fast[4] == [False]


def test_no_capture_and_no_replay_while_the_caller_captures(fake):
    fake["capturing"] = True
    run, out = _run(), {"a": torch.zeros(2)}
    fast = _fast(run)
    warm._warm_run(fast, {"a": torch.ones(2)}, out)
    assert fake["captures"] == 0 and run.calls == 1 and fast[4] == [None]  # launched into the caller's graph
    fake["capturing"] = False
    warm._warm_run(fast, {"a": torch.ones(2)}, out)
    graph = fast[4][0][0]
    fake["capturing"] = True
    warm._warm_run(fast, {"a": torch.ones(2)}, out)
    assert graph.replays == 1 and run.calls == 2


def test_a_launch_hook_takes_the_direct_launch(fake, monkeypatch):
    run, out = _run(), {"a": torch.zeros(2)}
    fast = _fast(run)
    fake["result"] = "hook"  # set at the first hit: not captured, tried again later
    warm._warm_run(fast, {"a": torch.ones(2)}, out)
    assert fast[4] == [None] and run.calls == 1
    fake["result"] = "graph"
    warm._warm_run(fast, {"a": torch.ones(2)}, out)
    graph, knobs = fast[4][0]
    monkeypatch.setattr(knobs, "launch_enter_hook", lambda *a: None)  # a profiler's, set after the capture
    warm._warm_run(fast, {"a": torch.ones(2)}, out)
    assert graph.replays == 1 and run.calls == 2 and fake["captures"] == 2


def test_graphs_off_launches_directly(fake, monkeypatch):
    monkeypatch.setattr(warm, "_WARM_GRAPHS", False)
    run, out = _run(), {"a": torch.zeros(2)}
    fast = _fast(run)
    warm._warm_run(fast, {"a": torch.ones(2)}, out)
    assert fake["captures"] == 0 and run.calls == 1


@pytest.mark.parametrize("value,on", [("0", False), ("1", True), (None, True)])
def test_the_environment_variable_turns_graphs_off(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("LAYOUTC_CUDA_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("LAYOUTC_CUDA_GRAPHS", value)
    spec = importlib.util.spec_from_file_location("layoutc.runtime._warm_env_probe", warm.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module._WARM_GRAPHS is on
    assert (module._warm_graph_slot(_run(), 0, False, True) is not None) is on


# --- on a GPU: a real spec's fused lowering ---

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DIMS = {"E": 2, "I": 256, "H": 256}


def _setup(bf16, monkeypatch, graphs=True):
    m = bf16.module
    monkeypatch.setattr(m, "_WARM", {})
    monkeypatch.setattr(m, "_WARM_GRAPHS", graphs)
    x = {k: v.cuda() for k, v in synthetic_inputs(bf16, DIMS, 5).items()}
    ref = bf16.convert(x, lowering="eager", fingerprint=False)
    out = {k: torch.empty_like(v) for k, v in ref.items()}
    return m, x, ref, out


def _record(r):
    # A record but the call number and the storage's weak reference (the same fields, another call).
    return {k: _record(v) if k == "origin" else v for k, v in r.items() if k not in ("call", "storage")}


def _slot(m, x, out):
    hit = m._warm_hit(m._warm_key(x, None, "auto", out))
    return hit[5][4] if hit is not None and hit[5] is not None else None


@cuda
def test_cuda_a_replay_writes_the_bytes_and_stamps_as_the_direct_launch(bf16, monkeypatch):
    records = {}
    for graphs in (False, True):
        m, x, ref, out = _setup(bf16, monkeypatch, graphs)
        for _ in range(4):
            for t in out.values():
                bits(t).fill_(0x5A)
            got = bf16.convert(x, fingerprint=False, out=out)
        torch.cuda.synchronize()
        slot = _slot(m, x, out)
        assert (slot is not None and slot[0] not in (None, False)) if graphs else slot is None
        assert all(got[k] is out[k] and torch.equal(bits(got[k]), bits(ref[k])) for k in ref)
        assert guard.check(got, bf16, same_call=True)
        records[graphs] = [_record(guard.provenance(t)) for t in got.values()]
        got["w13_bias"].add_(1)
        with pytest.raises(Exception, match="modified in place"):
            guard.check(got, bf16)
    assert records[True] == records[False]


@cuda
def test_cuda_a_replay_on_the_caller_s_stream_reads_the_inputs_current_bytes(bf16, monkeypatch):
    m, x, ref, out = _setup(bf16, monkeypatch)
    for _ in range(3):
        bf16.convert(x, fingerprint=False, out=out)
    assert _slot(m, x, out)[0] not in (None, False)
    other = synthetic_inputs(bf16, DIMS, 6)
    want = bf16.convert({k: v.cuda() for k, v in other.items()}, lowering="eager", fingerprint=False)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # new bytes at the same addresses, then the call, on the caller's stream
        torch.cuda._sleep(50_000_000)
        for k, v in x.items():
            v.copy_(other[k].cuda(), non_blocking=True)
        got = bf16.convert(x, fingerprint=False, out=out)
    stream.synchronize()
    assert all(torch.equal(bits(got[k]), bits(want[k])) for k in want)


@cuda
def test_cuda_no_graph_inside_the_caller_s_capture(bf16, monkeypatch):
    m, x, ref, out = _setup(bf16, monkeypatch)
    bf16.convert(x, fingerprint=False, out=out)
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        g.capture_begin()
        bf16.convert(x, fingerprint=False, out=out)  # a hit under the caller's capture: the direct launch
        g.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    assert _slot(m, x, out) == [None]
    for t in out.values():
        bits(t).fill_(0)
    g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(bits(out[k]), bits(ref[k])) for k in ref)


@cuda
def test_cuda_the_graph_is_freed_with_its_entry(bf16, monkeypatch):
    m, x, ref, out = _setup(bf16, monkeypatch)
    for _ in range(3):
        bf16.convert(x, fingerprint=False, out=out)
    graph = _slot(m, x, out)[0][0]
    held = sys.getrefcount(graph)
    m._WARM.clear()
    gc.collect()
    assert sys.getrefcount(graph) == held - 1 == 2  # this name and getrefcount's argument: nothing else


@cuda
def test_cuda_graphs_off_keep_the_direct_launch(bf16, monkeypatch):
    m, x, ref, out = _setup(bf16, monkeypatch, graphs=False)
    for _ in range(3):
        got = bf16.convert(x, fingerprint=False, out=out)
    torch.cuda.synchronize()
    assert _slot(m, x, out) is None and all(torch.equal(bits(got[k]), bits(ref[k])) for k in ref)
