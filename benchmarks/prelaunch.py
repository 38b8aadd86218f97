"""What delays the kernel of a single warm call on CUDA (issue 25): the host time before the launch, step by step.

    python benchmarks/prelaunch.py [--specs aiter_mxfp4,...] [--dims E=32,I=2944,H=2944] [--reps 200]

A single call (the device idle at its start) takes the host's time until the layer kernel is launched, the
launch latency and the kernel; back to back the first is hidden behind the previous kernel. For each spec
(this tree's converter, ``fingerprint=False``, no ``out=``), warm, this prints medians of:

* the host time from the call to the launch of the layer kernel (the prepared launch's launcher wrapped to
  read the clock as it is entered) and until the call returns;
* on the device (CUDA events, one recorded just before the launch): start -> launch and launch -> end of a
  single call, against the single and back-to-back times of the call and of a copy of the same bytes;
* the steps before the launch timed alone: the warm key with its tensor check, the outputs' allocations,
  and the launcher given the tensors (Triton reads each one's data_ptr and asks the driver about it) or
  their addresses as integers (what ``layoutc.runtime.checks._direct`` passes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import layoutc  # noqa: E402
from layoutc.cli.bench import host_time, timeit  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402

SPECS = [("marlin_nvfp4", {}), ("marlin_mxfp4", {}), ("aiter_mxfp4", {}),
         ("flashinfer_trtllm_mxfp4", {"pad_to": 128, "pad_hidden": 128}), ("flashinfer_cutlass_bf16", {})]


def _us(ns: list) -> float:
    return statistics.median(ns) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specs", default=None, help="spec names joined by commas (default: five of the 20b rows)")
    ap.add_argument("--dims", default="E=32,I=2944,H=2944")
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    dims = {k: int(v) for k, v in (p.split("=") for p in args.dims.split(","))}
    specs = SPECS if args.specs is None else [(n, dict(SPECS).get(n, {})) for n in args.specs.split(",")]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}, {dims}")
    for name, params in specs:
        spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt", params)
        m = spec.module
        entered, launches, marks = [], [], []
        direct = m._direct

        def timed(compiled, programs, *rest, direct=direct):  # the prepared launch, its entry clocked (and marked)
            launch = direct(compiled, programs, *rest)

            def clocked(*a):
                entered.append(time.perf_counter_ns())
                if marks:
                    marks[-1].record()
                launches[:] = [(launch, a)]  # the last call's arguments only (they hold its outputs)
                return launch(*a)

            return clocked

        m._direct = timed  # read by _prepare when the first call prepares its launch
        x = synthetic_inputs(spec, dims, 1, "cuda")
        for _ in range(5):
            out = m.convert(x, fingerprint=False)
        if not launches:
            print(f"{name}: no prepared launch", flush=True)
            continue
        # host: to the launch, and to the return
        to_launch, to_return = [], []
        for _ in range(args.reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            m.convert(x, fingerprint=False)
            t1 = time.perf_counter_ns()
            to_launch.append(entered[-1] - t0)
            to_return.append(t1 - t0)
        # device: start -> mark (just before the launch) -> end, single calls
        pre, post = [], []
        for _ in range(50):
            start, mark, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            marks.append(mark)
            torch.cuda.synchronize()
            start.record()
            m.convert(x, fingerprint=False)
            end.record()
            torch.cuda.synchronize()
            pre.append(start.elapsed_time(mark) * 1e3)
            post.append(start.elapsed_time(end) * 1e3 - pre[-1])
            marks.clear()
        call = lambda: m.convert(x, fingerprint=False)  # noqa: E731
        nbytes = sum(t.numel() * t.element_size() for t in (*x.values(), *out.values())) // 2
        flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        buf = torch.empty_like(flat)
        copy = lambda: buf.copy_(flat)  # noqa: E731
        single, b2b = timeit(call, "cuda") * 1e6, timeit(call, "cuda", reps=5, calls=10) * 1e6
        csingle, cb2b = timeit(copy, "cuda") * 1e6, timeit(copy, "cuda", reps=5, calls=10) * 1e6
        print(f"{name} {params or ''}: {len(out)} outputs, {len(launches[-1][1])} launch arguments", flush=True)
        print(f"  host to launch {_us(to_launch):6.1f} us, to return {_us(to_return):6.1f} us", flush=True)
        print(f"  device single: start->launch {statistics.median(pre):6.1f} us, launch->end "
              f"{statistics.median(post):6.1f} us; call single {single:6.1f} b2b {b2b:6.1f} us "
              f"({csingle / single:.3f} / {cb2b / b2b:.3f} of a copy's time: {csingle:.1f} / {cb2b:.1f} us)",
              flush=True)
        # the steps before the launch, alone
        launch, largs = launches[-1]
        tensors = [a for a in largs if isinstance(a, torch.Tensor)]
        shapes = [(tuple(t.shape), t.dtype) for t in out.values()]
        protos = [torch.empty(1, dtype=dt, device="cuda").expand(s) for s, dt in shapes]
        cells = dict(zip(launch.__code__.co_freevars, [c.cell_contents for c in launch.__closure__ or ()]))
        steps = {
            "warm key + tensor check": lambda: m._warm_hit(m._warm_key(x, None, "auto", None)),
            "empty_like of the outputs' prototypes": lambda: [torch.empty_like(p) for p in protos],
            "torch.cuda.current_device()": torch.cuda.current_device,
            "the launch as prepared": lambda: launch(*largs),
            "data_ptr of the launch's tensors": lambda: [t.data_ptr() for t in tensors],
        }
        if {"run", "function", "packed", "programs", "device"} <= cells.keys():  # _direct's own launcher
            c = cells
            ints = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in largs]
            stream = torch._C._cuda_getCurrentRawStream
            steps["Triton launcher, tensors"] = lambda: c["run"](c["programs"], 1, 1, stream(c["device"]),
                                                                 c["function"], c["packed"], None, None, None, *largs)
            steps["Triton launcher, integer addresses"] = lambda: c["run"](
                c["programs"], 1, 1, stream(c["device"]), c["function"], c["packed"], None, None, None, *ints)
        for what, fn in steps.items():
            print(f"  host {what:44s} {host_time(fn) * 1e6:7.2f} us", flush=True)
        x = out = flat = buf = protos = None
        launches.clear()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
