"""Cost of the pre-kernel guard next to a conversion.

    python benchmarks/guard_overhead.py [--device cuda] [--shape E=32,I=1024,H=1024]

Times (median of many) ``layoutc.guard.check(layer, spec)`` and the standalone module's
``guard(layer)`` against one ``convert`` of the same layer. The guard does no device work.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import layoutc
import layoutc.guard as guard
from layoutc.demo import synthetic_inputs

ROOT = Path(__file__).resolve().parent.parent


def median_s(fn, reps, sync) -> float:
    fn()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default=str(ROOT / "specs" / "flashinfer_cutlass_bf16.lyt"))
    ap.add_argument("--shape", default="E=32,I=1024,H=1024")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    dims = {k: int(v) for k, v in (kv.split("=") for kv in args.shape.split(","))}
    spec = layoutc.compile_file(args.spec)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    x = synthetic_inputs(spec, dims, 0, args.device)
    out = spec.convert(x)
    convert = median_s(lambda: spec.convert(x), 5, sync)
    check = median_s(lambda: guard.check(out, spec), 200, sync)
    module = median_s(lambda: spec.module.guard(out), 200, sync)
    print(f"{spec.name} {args.shape} on {args.device}: convert {convert * 1e3:.2f} ms | "
          f"guard.check {check * 1e6:.1f} us ({check / convert:.2e} of convert) | module.guard {module * 1e6:.1f} us")


if __name__ == "__main__":
    main()
