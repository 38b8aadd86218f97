"""Host time of one ``convert`` call on the GPU (issue 15, small layers: target under 30 us warm).

    python benchmarks/host_time.py [--device cuda] [--reps 200] [--out host_time.json]

For every shipped spec (the variants gpu_bench.py uses) on a tiny layer (E=2, I=H=256: the device
work is a few microseconds, so the call is host-bound) and on a gpt-oss-20b layer: the median
time a warm ``convert`` takes to *return* (kernels launched, not finished: the host's share), the
median time until its results are ready (synchronized), and ``guard.check``'s host time on the
converted layer. Each line also gives a device copy of the same bytes in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import layoutc  # noqa: E402
import layoutc.guard as guard  # noqa: E402
from layoutc.cli.bench import timeit  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402

from benchmarks.gpu_bench import MODELS, NEW_VARIANTS, VARIANTS  # noqa: E402

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
    steps = {
        "argument checks": lambda: m._check_call(x, None, "convert", m.INPUTS, m._INPUT_SHAPES, m._INPUT_AXES,
                                                 m.DIMS, m._CONDITIONS, m._CONVERT_CHECKS),
        "accepted dtypes": lambda: m._widened(x, m.INPUTS),
        "lowering choice": lambda: m._choose_lowering("auto", x, m._LOWERINGS),
        "layer launch (allocations + compiled kernel launch)": (lambda: layer(x, d)) if layer else (lambda: None),
        "layer launch, Triton's own launch every call": (lambda: _triton_launch(m, layer, x, d)) if layer else (lambda: None),
        "whole _convert": lambda: m._convert(x, d, present, "fused"),
        "output shape checks": lambda: m._check_outputs(out, m._OUTPUT_SHAPES, d, "convert"),
        "provenance stamp": lambda: m._stamp(out, m.SPEC_NAME, m.SPEC_SHA256, m.PARAMS, m.REQUIRES, d),
        "six torch.empty": lambda: [torch.empty(16, device=args.device) for _ in range(6)],
    }
    for what, fn in steps.items():
        print(f"  host {what:48s} {_host_median(fn, args.reps) * 1e6:7.1f} us", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, layoutc {layoutc.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    rows = []
    for name, params in VARIANTS + NEW_VARIANTS:
        spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt", params)
        for shape, dims in SHAPES.items():
            x = synthetic_inputs(spec, dims, 1, args.device)
            out = spec.convert(x)
            flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in x.values()])
            buf = torch.empty_like(flat)
            reps = args.reps if shape == "tiny" else max(20, args.reps // 10)
            host = _host_median(lambda: spec.convert(x), reps)
            total = timeit(lambda: spec.convert(x), args.device, reps=reps)
            copy = timeit(lambda: buf.copy_(flat), args.device, reps=reps)
            g = _host_median(lambda: guard.check(out, spec), reps)
            row = {"spec": name, "params": params, "shape": shape, "dims": dims, "host_us": host * 1e6,
                   "convert_us": total * 1e6, "copy_us": copy * 1e6, "guard_host_us": g * 1e6}
            rows.append(row)
            print(f"{name:34s} {str(params or ''):22s} {shape:12s} host {host * 1e6:7.1f} us | convert "
                  f"{total * 1e6:8.1f} us | device copy {copy * 1e6:7.1f} us | guard {g * 1e6:6.1f} us", flush=True)
            x = out = flat = buf = None  # free before the next layer
            torch.cuda.empty_cache()
    breakdown(args)
    worst = max(r["host_us"] for r in rows if r["shape"] == "tiny")
    print(f"worst warm host time on a tiny layer: {worst:.1f} us (target under {TARGET_HOST_US:.0f} us: "
          f"{'reached' if worst < TARGET_HOST_US else 'NOT reached'})")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
