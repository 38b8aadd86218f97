"""The words and quads plans' SIMD kernel against the numba kernels on the CPU, in ONE process (issue 25).

    python benchmarks/simd_cpu.py [--specs a,b] [--shape E=8,I=1024,H=2048] [--reps 21] [--threads N]

For every shipped spec whose CPU converter runs native kernels (``_nb_words``/``_nb_quads``), at ``--shape``:
  * each kernel call of a conversion, replayed with the arguments the converter gave it (a new output each
    time, as in a call), alternating ``LAYOUTC_SIMD=0`` (numba) and on (the SIMD kernel where the plan fits it;
    ``layoutc.lower.native_simd``), read per call, so both run in the same minutes of the same process;
  * the whole call with the guard's fingerprint off and on (the default call), alternating the same way, with a
    clone of the inputs' bytes in each round (the issue's yardstick: a warm call at most 3x a clone).
Medians of ``--reps`` rounds (the first two dropped); every output compared bit for bit between the two forms.
Not a test: timings depend on the machine and on what else runs on it (the load average is printed).
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
KERNEL_CALLS = ("_nb_words", "_nb_quads")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _median(xs: list[float]) -> float:
    return statistics.median(xs[2:] if len(xs) > 4 else xs)


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k].contiguous().view(torch.uint8).reshape(-1),
                                                    b[k].contiguous().view(torch.uint8).reshape(-1)) for k in a)


def bench_spec(path: Path, shape: dict, reps: int) -> list[str]:
    import torch

    import layoutc
    from layoutc.convert.synthckpt import synthetic_inputs

    spec = layoutc.compile_file(path)
    m = spec.module
    if not any(f"{k}(" in spec.source for k in KERNEL_CALLS):
        return []
    x = synthetic_inputs(spec, shape, seed=0)
    calls, originals = [], {k: getattr(m, k) for k in KERNEL_CALLS}
    for k, fn in originals.items():
        setattr(m, k, lambda *a, fn=fn, k=k: calls.append((k, fn, a)) or fn(*a))
    try:
        spec.convert(x, fingerprint=False)
    finally:
        for k, fn in originals.items():
            setattr(m, k, fn)
    lines = []
    nbytes = sum(t.numel() * t.element_size() for t in x.values() if t is not None)
    for i, (k, fn, a) in enumerate(calls):
        times = {"0": [], "1": []}
        outs = {}
        for _ in range(reps):
            for mode in ("0", "1"):
                os.environ["LAYOUTC_SIMD"] = mode
                times[mode].append(_timed(lambda: outs.__setitem__(mode, fn(*a))))
        same = torch.equal(outs["0"], outs["1"])
        numba, simd = _median(times["0"]), _median(times["1"])
        mb = outs["0"].numel() * outs["0"].element_size() / 1e6
        lines.append(f"{spec.name:32s} {k}#{i} {mb:6.1f} MB  numba {numba:6.2f} ms  simd {simd:6.2f} ms  "
                     f"simd/numba {simd / numba:.2f}  same {same}")
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in x.values() if t is not None])
    for fingerprint in (False, True):
        times = {"0": [], "1": [], "clone": []}
        outs = {}
        for _ in range(reps):
            times["clone"].append(_timed(lambda: flat.clone()))
            for mode in ("0", "1"):
                os.environ["LAYOUTC_SIMD"] = mode
                times[mode].append(_timed(lambda: outs.__setitem__(mode, spec.convert(x, fingerprint=fingerprint))))
        clone, numba, simd = (_median(times[k]) for k in ("clone", "0", "1"))
        lines.append(f"{spec.name:32s} {'default call' if fingerprint else 'no fingerprint'}  {nbytes / 1e6:5.1f} MB  "
                     f"clone {clone:5.2f} ms  numba {numba:6.2f} ms ({numba / clone:4.1f}x)  simd {simd:6.2f} ms "
                     f"({simd / clone:4.1f}x)  simd/numba {simd / numba:.2f}  same {_same(outs['0'], outs['1'])}")
    os.environ.pop("LAYOUTC_SIMD", None)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", default=None, help="comma-separated spec names (default: every shipped spec)")
    ap.add_argument("--shape", default="E=8,I=1024,H=2048")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = ap.parse_args()
    import torch

    from layoutc.lower import native_simd

    if args.threads:
        torch.set_num_threads(args.threads)
    shape = {k: int(v) for k, v in (p.split("=") for p in args.shape.split(","))}
    names = args.specs.split(",") if args.specs else sorted(p.stem for p in (ROOT / "specs").glob("*.lyt"))
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
          f"{os.cpu_count()} cpus; threads {torch.get_num_threads()}; load average {os.getloadavg()}; shape {shape}; "
          f"SIMD kernel built here: {native_simd._nx_kernel(True) is not None}", flush=True)
    for name in names:
        for line in bench_spec(ROOT / "specs" / f"{name}.lyt", shape, args.reps):
            print(line, flush=True)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
