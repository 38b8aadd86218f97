"""The words plans' native kernels on the CPU: per-byte kernel against the quads or pairs kernel, same plan (issue 25).

    python benchmarks/native_kernels.py [--specs a,b] [--shape E=8,I=1024,H=2048] [--reps 11] [--threads 1]

For each spec with words plans that numba runs (``layoutc/lower/native.py``): one ``convert`` makes the
plans; then, per native words plan (one per weight tensor), in alternation in this process: a clone of the
source tensor, ``_nb_words`` on the plan without its groups (``_nb_words_k``: a table entry and a byte a
byte; what every words plan ran before the groups) and on the plan itself (``_nb_wquads_k`` or
``_nb_wpairs_k`` where the plan holds quads or pairs). Medians of ``--reps`` rounds (one untimed first) in
ms, their ratio, and whether the two give the same words. Not a test: timings depend on the machine and on
what else runs on it (say which, with the load average).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's layoutc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", default="marlin_gptq_int4,marlin_mxfp4,marlin_nvfp4,triton_kernels_mxfp4_hopper,"
                    "vllm_cutlass_w4a8")
    ap.add_argument("--shape", default="E=8,I=1024,H=2048")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    import layoutc
    from layoutc.convert.synthckpt import synthetic_inputs

    torch.set_num_threads(args.threads)
    shape = {k: int(v) for k, v in (kv.split("=") for kv in args.shape.split(","))}
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; machine: {platform.machine()}, "
          f"{os.cpu_count()} cpus; threads {torch.get_num_threads()}; load average {os.getloadavg()}; shape {shape}")
    for name in args.specs.split(","):
        spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt")
        m = spec.module
        x = synthetic_inputs(spec, shape, seed=0)
        calls = []
        real = m._nb_words

        def spy(src, plan, out_shape, table, conv=None, calls=calls, real=real):
            calls.append((src, plan, out_shape, table, conv))
            return real(src, plan, out_shape, table, conv)

        m._nb_words = spy
        spec.convert(x, fingerprint=False)
        m._nb_words = real
        for src, plan, out_shape, table, conv in calls:
            group = plan[6] if len(plan) > 6 and plan[6] is not None else None
            kind = "none" if group is None else ("quads" if group[0].shape[1] == 4 else "pairs")
            fns = [lambda src=src: src.clone(),
                   lambda src=src, plan=plan, s=out_shape, t=table, c=conv, f=real: f(src, plan[:6], s, t, c),
                   lambda src=src, plan=plan, s=out_shape, t=table, c=conv, f=real: f(src, plan, s, t, c)]
            same = torch.equal(fns[1](), fns[2]())
            times = [[] for _ in fns]
            for _ in range(args.reps):
                for fn, ts in zip(fns, times):
                    t0 = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t0)
            c, a, b = (statistics.median(ts) * 1e3 for ts in times)
            mb = src.numel() * src.element_size() / 1e6
            print(f"{name:30} {mb:5.1f} MB  groups {kind:5}  clone {c:6.2f} ms  per-byte {a:7.2f} ({a / c:5.1f}x)  "
                  f"groups {b:7.2f} ({b / c:5.1f}x)  groups/per-byte {b / a:4.2f}  same {same}  "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
