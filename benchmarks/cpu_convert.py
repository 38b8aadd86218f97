"""CPU conversion time of one layer against a clone of its inputs (issue 15).

    python benchmarks/cpu_convert.py [--spec specs/flashinfer_cutlass_bf16.lyt] [--shape E=8,I=1024,H=2048]

Prints the date and hardware, the clone time (the floor: every byte read and written once), the
first call of the default CPU lowering ('auto': compiling the spec is not counted, everything the
call does is), its steady time, the eager reference's, and each as a multiple of the clone. Not a
test: timings depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

# This checkout's layoutc, not one installed in the environment (run as a script, sys.path[0] is
# benchmarks/, and an editable install of another checkout would be timed instead).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import layoutc  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402


def _median_seconds(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="specs/flashinfer_cutlass_bf16.lyt")
    ap.add_argument("--shape", default="E=8,I=1024,H=2048")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--lowering", default="auto", help="the lowering timed against the clone")
    args = ap.parse_args()
    dims = {k: int(v) for k, v in (kv.split("=") for kv in args.shape.split(","))}

    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"layoutc: {Path(layoutc.__file__).parent}")
    spec = layoutc.compile_file(args.spec)
    x = synthetic_inputs(spec, dims, seed=0)
    nbytes = sum(t.numel() * t.element_size() for t in x.values() if t is not None)
    print(f"spec: {spec.name}  dims: {dims}  inputs: {nbytes / 1e6:.1f} MB")

    t0 = time.perf_counter()
    first = spec.convert(x, lowering=args.lowering)  # first call: plans, index tables, allocations
    first_s = time.perf_counter() - t0
    clone_s = _median_seconds(lambda: {k: v.clone() for k, v in x.items() if v is not None}, args.reps)
    steady_s = _median_seconds(lambda: spec.convert(x, lowering=args.lowering), args.reps)
    eager_s = _median_seconds(lambda: spec.convert(x, lowering="eager"), max(1, args.reps // 2))
    want = spec.convert(x, lowering="eager")
    same = all(torch.equal(first[k].view(torch.uint8), want[k].view(torch.uint8)) for k in want)

    print(f"clone:               {clone_s * 1e3:8.1f} ms")
    print(f"{args.lowering} first call:     {first_s * 1e3:8.1f} ms  ({first_s / clone_s:5.1f}x clone)")
    print(f"{args.lowering} steady:         {steady_s * 1e3:8.1f} ms  ({steady_s / clone_s:5.1f}x clone)")
    print(f"eager:               {eager_s * 1e3:8.1f} ms  ({eager_s / clone_s:5.1f}x clone)")
    print(f"{args.lowering} == eager bit for bit: {same}")


if __name__ == "__main__":
    main()
