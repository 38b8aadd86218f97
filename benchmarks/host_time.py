"""Host time of one ``convert`` call on the GPU (issue 15, small layers: target under 30 us warm).

    python benchmarks/host_time.py [--device cuda] [--reps 200] [--out host_time.json]
    python benchmarks/host_time.py --fake-launch [--reps 2000] [--baseline-module OLD.py]
        (CPU: the Python path of a warm call, conversion faked; OLD.py: the converter another checkout wrote)

For every shipped spec (the variants gpu_bench.py uses, and those of the other engines) on a tiny
layer (E=2, I=H=256: the device work is a few microseconds, so the call is host-bound) and on a
gpt-oss-20b layer: the median time a warm ``convert`` takes to *return* (kernels launched, not
finished: the host's share), with the default fingerprint of the outputs (queued on the device) and
with ``fingerprint=False``; the median time until its results are ready (synchronized), and
``guard.check``'s host time on the converted layer. Each line also gives a device copy of the same
bytes in the same run. The target (under 30 us) is read on ``fingerprint=False``: the fingerprint is
a pass of its own over the outputs (int8 GEMMs), which a caller that does not move the outputs
elsewhere before the guard can leave out.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

# HOST_TIME_ROOT: another checkout whose layoutc and specs are timed (the same script before and after a change)
ROOT = Path(os.environ.get("HOST_TIME_ROOT", Path(__file__).resolve().parent.parent)).resolve()
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # benchmarks.gpu_bench, when ROOT has none

import layoutc  # noqa: E402
import layoutc.guard as guard  # noqa: E402
from layoutc.cli.bench import timeit  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402

from benchmarks.gpu_bench import MODELS, NEW_VARIANTS, VARIANTS  # noqa: E402

#: The shipped specs of engines other than FlashInfer (issue 24), with the parameters they are timed with.
OTHER_VARIANTS = [("triton_kernels_mxfp4_hopper", {}), ("triton_kernels_mxfp4_blackwell", {}), ("aiter_mxfp4", {}),
                  ("aiter_fp8_block", {}), ("deepgemm_fp8_block", {}), ("vllm_cutlass_nvfp4", {"activation": "silu"}),
                  ("marlin_mxfp4", {}), ("marlin_gptq_int4", {})]

SHAPES = {"tiny": {"E": 2, "I": 256, "H": 256}, "gpt-oss-20b": MODELS["gpt-oss-20b"]}
TARGET_HOST_US = 30.0


def _host_median(fn, reps: int) -> float:
    """Median seconds until ``fn`` returns, the device idle at each start: the host's share (what is
    launched is not waited for). Device time is layoutc.cli.bench.timeit's."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times)


def _triton_launch(m, layer, x, d):
    m._DIRECT_LAUNCH = False  # runtime._launch: through Triton's launcher, as before 2026-11-30
    try:
        return layer(x, d)
    finally:
        m._DIRECT_LAUNCH = True


def breakdown(args) -> None:
    """Where a warm call's host time goes, for the seed spec on the tiny layer: the generated
    module's own steps timed one by one (host only; the launch is not synchronized)."""
    spec = layoutc.compile_file(ROOT / "specs" / "flashinfer_cutlass_bf16.lyt")
    m = spec.module
    x = synthetic_inputs(spec, SHAPES["tiny"], 1, args.device)
    out = spec.convert(x)
    d, present = m._check_call(x, None, "convert", m.INPUTS, m._INPUT_SHAPES, m._INPUT_AXES, m.DIMS,
                               m._CONDITIONS, m._CONVERT_CHECKS)
    layer = m._LAYERS.get(("fused", present))
    dev, xt = torch.device(args.device), next(iter(x.values()))

    def _contexts():
        with torch.inference_mode(False), torch.no_grad():
            pass

    def full_layer():  # the layer function's first-call path (what a warm call did before the prepared launch)
        getattr(m, "_PREPARED", {}).clear()
        return layer(x, d)

    steps = {
        "convert, fingerprint=False (module)": lambda: m.convert(x, fingerprint=False),
        "convert, default fingerprint (module)": lambda: m.convert(x),
        "convert, fingerprint=False (layoutc.Spec)": lambda: spec.convert(x, fingerprint=False),
        "argument checks": lambda: m._check_call(x, None, "convert", m.INPUTS, m._INPUT_SHAPES, m._INPUT_AXES,
                                                 m.DIMS, m._CONDITIONS, m._CONVERT_CHECKS),
        "layer, prepared launch (warm)": (lambda: layer(x, d)) if layer else (lambda: None),
        "layer, full path (no prepared launch)": full_layer if layer else (lambda: None),
        "inference_mode(False) + no_grad": lambda: _contexts(),
        "provenance stamp, fingerprint=False": lambda: m._stamp(out, m.SPEC_NAME, m.SPEC_SHA256, m.PARAMS,
                                                                m.REQUIRES, d, False),
        "torch.empty x6 (device=)": lambda: [torch.empty((2, 256, 128), dtype=torch.uint8, device=dev)
                                             for _ in range(6)],
        "x.new_empty x6": lambda: [xt.new_empty((2, 256, 128)) for _ in range(6)],
        "accepted dtypes": lambda: m._widened(x, m.INPUTS),
        "lowering choice": lambda: m._choose_lowering("auto", x, m._LOWERINGS),
        "layer launch, Triton's own launch every call": (lambda: _triton_launch(m, layer, x, d)) if layer else (lambda: None),
        "whole _convert": lambda: m._convert(x, d, present, "fused"),
        "output shape checks": lambda: m._check_outputs(out, m._OUTPUT_SHAPES, d, "convert"),
        "provenance stamp, default fingerprint": lambda: m._stamp(out, m.SPEC_NAME, m.SPEC_SHA256, m.PARAMS,
                                                                  m.REQUIRES, d),
    }
    if "out" in inspect.signature(m.convert).parameters:
        steps.update(_out_steps(m, x, d, layer, out))
    for what, fn in steps.items():
        print(f"  host {what:52s} {_host_median(fn, args.reps) * 1e6:7.1f} us", flush=True)
    if "out" in inspect.signature(m.convert).parameters:
        _graph_check(m, x, out)


def _out_steps(m, x, d, layer, out):
    """The steps of a warm convert(..., out=) call (issue 25): the caller's tensors, no allocation."""
    o = {k: torch.empty_like(v) for k, v in out.items()}
    m.convert(x, fingerprint=False, out=o)
    present = m._check_call(x, None, "convert", m.INPUTS, m._INPUT_SHAPES, m._INPUT_AXES, m.DIMS, m._CONDITIONS,
                            m._CONVERT_CHECKS)[1]
    steps = {
        "convert, fingerprint=False, out= (module)": lambda: m.convert(x, fingerprint=False, out=o),
        "convert, default fingerprint, out= (module)": lambda: m.convert(x, out=o),
        "out= check (cached)": lambda: m._check_out(o, x, d, present, m.OUTPUTS, m._OUTPUT_SHAPES),
        "out= key": lambda: m._out_key(o, x, d, present, m._OUTPUT_SHAPES),
        "layer, prepared launch into out=": (lambda: layer(x, d, o)) if layer else (lambda: None),
        "prepared key": (lambda: m._prepared_key(layer, tuple(x.values()), d)) if layer else (lambda: None),
        "provenance stamp of out=, fingerprint=False": lambda: m._stamp(o, m.SPEC_NAME, m.SPEC_SHA256, m.PARAMS,
                                                                      m.REQUIRES, d, False),
    }
    static = m._check_out(o, x, d, present, m.OUTPUTS, m._OUTPUT_SHAPES)
    if "static" in inspect.signature(m._stamp).parameters:  # the records copied from the last call's
        steps["provenance stamp of out=, records copied"] = lambda: m._stamp(o, m.SPEC_NAME, m.SPEC_SHA256, m.PARAMS,
                                                                           m.REQUIRES, d, False, static)
    run = m._PREPARED.get(m._prepared_key(layer, tuple(x.values()), d)) if layer else None
    if run is not None:  # the launch alone: the compiled kernel with its grid and constants bound
        cells = dict(zip(run.__code__.co_freevars, (c.cell_contents for c in run.__closure__)))
        launch, constants = cells["launch"], cells["constants"]
        targs = [t for name in cells["names"] for t in (x[name], o[name])]  # the layer's order
        steps["launch alone (compiled kernel, grid bound)"] = lambda: launch(*targs, *constants)
        direct = getattr(m, "_RUNNER_CHECKED", {})
        print(f"  Triton's runner checked for a direct launch: {direct} (the prepared launch is "
              f"{'bound to the launcher' if getattr(launch, '__name__', '') == 'launch' else 'Triton runner'})")
    if hasattr(m, "_warm_hit"):  # the one-lookup warm call (layoutc.runtime.warm)
        hit = m._warm_hit(m._warm_key(x, None, "auto", o))
        steps["warm key with out= (_warm_key)"] = lambda: m._warm_key(x, None, "auto", o)
        steps["warm key + tensor check with out= (_warm_hit)"] = lambda: m._warm_hit(m._warm_key(x, None, "auto", o))
        if hit is not None and hit[5] is not None:
            steps["prepared launch of the hit (_warm_run)"] = lambda: m._warm_run(hit[5], x, o)
            steps["stamp of the hit's out= (token)"] = lambda: m._stamp(o, m.SPEC_NAME, m.SPEC_SHA256, m.PARAMS,
                                                                         m.REQUIRES, d, False, hit[4])
        print(f"  warm call: tensor check {'TensorGuards' if m._warm_guards() else 'Python tuple'}, hit "
              f"{hit is not None}, direct prepared launch {hit is not None and hit[5] is not None}", flush=True)
    return steps


def _graph_check(m, x, out):
    """convert(..., out=, fingerprint=False) captured in a CUDA graph by the caller: does it capture, does a
    replay equal the converter's output, and what does a replay cost on the host."""
    o = {k: torch.empty_like(v) for k, v in out.items()}
    m.convert(x, fingerprint=False, out=o)  # warm: compiled and prepared outside the capture
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            m.convert(x, fingerprint=False, out=o)
        for t in o.values():
            t.view(torch.uint8).fill_(0x5A)
        g.replay()
        torch.cuda.synchronize()
        same = all(o[k].view(torch.uint8).equal(out[k].view(torch.uint8)) for k in out)
        print(f"  CUDA graph of convert(out=, fingerprint=False): captured, replay equals convert: {same}; "
              f"replay host {_host_median(g.replay, 200) * 1e6:.1f} us", flush=True)
    except Exception as err:  # noqa: BLE001 -- reported: capture is the caller's option, not the converter's
        print(f"  CUDA graph of convert(out=, fingerprint=False): {type(err).__name__}: {str(err)[:200]}", flush=True)


def _cpu_median_us(fns: dict, reps: int) -> dict:
    """Median microseconds per call of each function, the functions taking turns call by call (one process,
    the same disturbances for all: the machine is shared)."""
    times = {k: [] for k in fns}
    for fn in fns.values():
        for _ in range(20):
            fn()
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter_ns()
            fn()
            times[k].append(time.perf_counter_ns() - t0)
    return {k: statistics.median(v) / 1e3 for k, v in times.items()}


class _NoKernel:
    """A compiled kernel that launches nothing: its runner returns at once (the host path around it is timed)."""
    function = object()

    def __getitem__(self, grid):
        return lambda *args: None


def fake_layer(m, ref, work=None):
    """A layer function for module ``m`` that converts every output of ``ref`` in one prepared launch, as the
    fused lowering's layer functions do on CUDA (runtime._prepare), with ``work(xs, ys)`` as the kernel (None:
    nothing is launched). Installed in ``m._LAYERS`` for the CPU lowering, it lets the CPU take the CUDA warm
    path: the prepared key, the prepared run and (layoutc.runtime.warm) the direct call of it."""
    names = list(ref)
    compiled = _NoKernel()
    if work is not None:
        # a subclass: an instance attribute does not override a dunder
        compiled = type("_Work", (_NoKernel,), {"__getitem__": lambda self, grid: lambda *a: work(a[0::2], a[1::2])})()

    def layer(tensors, d, outs=None):
        xs = tuple(tensors[n] for n in names)
        key = m._prepared_key(layer, xs, d)
        run = m._PREPARED.get(key)
        if run is not None:
            return run(xs, outs)
        out = {n: outs[n] if outs is not None else torch.empty_like(ref[n]) for n in names}
        args = [t for n, x in zip(names, xs) for t in (x, out[n])]
        compiled[(1, 1, 1)](*args)
        m._prepare(key, compiled, 1, {}, out, args, [])
        return out
    return layer


def fake_launch(args) -> int:
    """The Python path of a warm call on the CPU (no CUDA needed): the seed spec on the tiny layer, with the
    layer function replaced by one that prepares a launch of nothing (fake_layer), so what is timed is
    everything a warm CUDA call does but the launch itself. This tree's converter and (--baseline-module)
    another checkout's, call by call in one process; the steps one by one."""
    spec = layoutc.compile_file(ROOT / "specs" / "flashinfer_cutlass_bf16.lyt")
    m = spec.module
    x = synthetic_inputs(spec, SHAPES["tiny"], 1, "cpu")
    ref = spec.convert(x)
    present = m._check_call(x, None, "convert", m.INPUTS, m._INPUT_SHAPES, m._INPUT_AXES, m.DIMS,
                            m._CONDITIONS, m._CONVERT_CHECKS)[1]
    how = m._choose_lowering("auto", x, m._LOWERINGS)
    o = {k: torch.empty_like(v) for k, v in ref.items()}
    fns = {}
    mods = {"": m}
    if args.baseline_module:  # the same spec's converter written by another checkout, in this process
        import importlib.util

        loader = importlib.util.spec_from_file_location("host_time_baseline", args.baseline_module)
        base = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(base)
        mods["baseline: "] = base
    for label, mod in mods.items():
        mod._LAYERS = {(how, present): fake_layer(mod, ref)}
        getattr(mod, "_WARM", {}).clear()  # entries of the calls above, made without the layer function
        ob = {k: torch.empty_like(v) for k, v in ref.items()}
        mod.convert(x, fingerprint=False, out=ob)
        mod.convert(x, fingerprint=False)
        fns[f"{label}convert(x, fingerprint=False, out=o)"] = lambda mod=mod, ob=ob: mod.convert(x, fingerprint=False,
                                                                                                  out=ob)
        fns[f"{label}convert(x, fingerprint=False)"] = lambda mod=mod: mod.convert(x, fingerprint=False)
    m.convert(x, fingerprint=False, out=o)
    d = m.bind_dims(x)
    static = m._check_out(o, x, d, present, m.OUTPUTS, m._OUTPUT_SHAPES)
    layer = m._LAYERS[(how, present)]
    steps = {
        "  input checks (_check_call, cached)": lambda: m._check_call(x, None, "convert", m.INPUTS, m._INPUT_SHAPES,
                                                                      m._INPUT_AXES, m.DIMS, m._CONDITIONS,
                                                                      m._CONVERT_CHECKS),
        "  out= check (_check_out, cached)": lambda: m._check_out(o, x, d, present, m.OUTPUTS, m._OUTPUT_SHAPES),
        "  layer, prepared run into out=": lambda: layer(x, d, o),
        "  stamp of out=, records copied": lambda: m._stamp(o, m.SPEC_NAME, m.SPEC_SHA256, m.PARAMS, m.REQUIRES, d,
                                                            False, static),
        "  stamp without out=": lambda: m._stamp(ref, m.SPEC_NAME, m.SPEC_SHA256, m.PARAMS, m.REQUIRES, d, False),
        "  autograd mode (_plain of nothing)": lambda: m._plain(lambda: None),
    }
    if hasattr(m, "_warm_hit"):
        warm = m._warm_key(x, None, "auto", o)
        hit = m._warm_hit(warm)
        steps["  warm key with out= (_warm_key)"] = lambda: m._warm_key(x, None, "auto", o)
        steps["  warm key + tensor check with out="] = lambda: m._warm_hit(m._warm_key(x, None, "auto", o))
        steps["  tensor check alone with out="] = lambda: m._warm_hit(warm)
        steps["  warm key + tensor check without out="] = lambda: m._warm_hit(m._warm_key(x, None, "auto", None))
        if hit is not None and hit[5] is not None:
            steps["  prepared run of the hit (_warm_run)"] = lambda: m._warm_run(hit[5], x, o)
        print(f"  tensor check: {'torch TensorGuards' if m._warm_guards() else 'Python tuple'}; hit with out=: "
              f"{hit is not None}, direct prepared run: {hit is not None and hit[5] is not None}", flush=True)
    print(f"CPU Python path of a warm call (launch faked), torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, {args.reps} calls each (median)", flush=True)
    for what, us in {**_cpu_median_us(fns, args.reps), **_cpu_median_us(steps, args.reps)}.items():
        print(f"  {what:60s} {us:7.1f} us", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="which of " + ", ".join(SHAPES))
    ap.add_argument("--only", default=None, help="only the specs whose name contains one of these (comma-separated)")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the step-by-step breakdown")
    ap.add_argument("--fake-launch", action="store_true",
                    help="on the CPU: time a warm call's Python path with the conversion faked, step by step")
    ap.add_argument("--baseline-module", type=Path, default=None,
                    help="with --fake-launch: a flashinfer_cutlass_bf16 converter another checkout wrote "
                         "(python -m layoutc compile), timed in the same process")
    args = ap.parse_args()
    if args.fake_launch:
        return fake_launch(args)
    shapes = {k: SHAPES[k] for k in args.shapes.split(",")}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, layoutc {layoutc.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    rows = []
    for name, params in VARIANTS + NEW_VARIANTS + OTHER_VARIANTS:
        if args.only and not any(w in name for w in args.only.split(",")):
            continue
        spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt", params)
        for shape, dims in shapes.items():
            x = synthetic_inputs(spec, dims, 1, args.device)
            out = spec.convert(x)
            flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in x.values()])
            buf = torch.empty_like(flat)
            reps = args.reps if shape == "tiny" else max(20, args.reps // 10)
            host = _host_median(lambda: spec.convert(x, fingerprint=False), reps)
            host_out = float("nan")
            if "out" in inspect.signature(spec.module.convert).parameters:  # convert(..., out=) (issue 25)
                o = {k: torch.empty_like(v) for k, v in out.items()}
                host_out = _host_median(lambda: spec.convert(x, fingerprint=False, out=o), reps)
            host_fp = _host_median(lambda: spec.convert(x), reps)
            total = timeit(lambda: spec.convert(x, fingerprint=False), args.device, reps=reps)
            total_fp = timeit(lambda: spec.convert(x), args.device, reps=reps)
            copy = timeit(lambda: buf.copy_(flat), args.device, reps=reps)
            g = _host_median(lambda: guard.check(out, spec), reps)
            row = {"spec": name, "params": params, "shape": shape, "dims": dims, "host_us": host * 1e6,
                   "host_out_us": host_out * 1e6,
                   "host_fingerprint_us": host_fp * 1e6, "convert_us": total * 1e6,
                   "convert_fingerprint_us": total_fp * 1e6, "copy_us": copy * 1e6, "guard_host_us": g * 1e6}
            rows.append(row)
            print(f"{name:31s} {str(params or ''):22s} {shape:12s} host {host * 1e6:6.1f} us (out= "
                  f"{host_out * 1e6:6.1f}, fingerprint "
                  f"{host_fp * 1e6:6.1f}) | convert {total * 1e6:7.1f} us (fingerprint {total_fp * 1e6:7.1f}) | "
                  f"copy {copy * 1e6:7.1f} us | guard {g * 1e6:6.1f} us", flush=True)
            x = out = flat = buf = o = None  # free before the next layer
            torch.cuda.empty_cache()
    breakdown(args)
    if not rows:
        return 0
    outs = [r["host_out_us"] for r in rows if r["shape"] == "tiny" and r["host_out_us"] == r["host_out_us"]]
    if outs:
        print(f"worst warm host time on a tiny layer, fingerprint=False, out=: {max(outs):.1f} us (target under "
              f"{TARGET_HOST_US:.0f} us: {'reached' if max(outs) < TARGET_HOST_US else 'NOT reached'})")
    worst = max(r["host_us"] for r in rows if r["shape"] == "tiny")
    print(f"worst warm host time on a tiny layer, fingerprint=False: {worst:.1f} us (target under "
          f"{TARGET_HOST_US:.0f} us: {'reached' if worst < TARGET_HOST_US else 'NOT reached'}); with the default "
          f"fingerprint: {max(r['host_fingerprint_us'] for r in rows if r['shape'] == 'tiny'):.1f} us")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
