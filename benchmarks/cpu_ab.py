"""Two trees' converters of each spec in ONE process, timed in alternation on the CPU (issue 25).

    python benchmarks/cpu_ab.py --old DIR [--specs a,b] [--shape E=8,I=1024,H=2048] [--reps 7] [--threads N]

``--old DIR``: another checkout's root (e.g. ``git archive 07682de layoutc | tar -x -C DIR``). Each tree
writes the spec's converter module (a subprocess with that tree's ``layoutc``); both modules are loaded
here under their own names, so their numba kernels are compiled apart, and called on the same inputs.
Per round: a clone of every input, the old module's ``convert(x, fingerprint=False)`` (``--fingerprint``: the
default call, the outputs fingerprinted) and the new one's, the two in turn first; the
medians of ``--reps`` rounds (one untimed round first) and their ratios. ``same``: every output of the two
modules has the same bytes. ``first``: each module's first call in this process (numba's compile of the
kernels it is the first to use is in it; numba itself is already imported). ``kernels``: the native kernels
the new tree's modules have run so far in this process (cumulative: modules of one tree share their compiled
kernels; ``cpu_speed.py``'s ``path`` gives each spec's own, in a fresh process). Not a test: timings depend on the machine and on what else runs on it (say which, with
the load average printed per row).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's layoutc (the new tree) for the inputs

WRITE = "import sys; sys.path.insert(0, sys.argv[1]); import layoutc; layoutc.compile_file(sys.argv[2]).write(sys.argv[3])"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--specs", default="flashinfer_cutlass_bf16,flashinfer_cutlass_mxfp4_padded,marlin_gptq_int4,"
                    "marlin_mxfp4,marlin_nvfp4,triton_kernels_mxfp4_hopper,vllm_cutlass_w4a8")
    ap.add_argument("--shape", default="E=8,I=1024,H=2048")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--fingerprint", action="store_true", help="default calls (the outputs' fingerprint on)")
    args = ap.parse_args()
    import torch

    from layoutc.convert.synthckpt import synthetic_inputs

    if args.threads:
        torch.set_num_threads(args.threads)
    shape = {k: int(v) for k, v in (kv.split("=") for kv in args.shape.split(","))}
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; machine: {platform.machine()}, "
          f"{os.cpu_count()} cpus; threads {torch.get_num_threads()}; load average {os.getloadavg()}; shape {shape}; "
          f"fingerprint {args.fingerprint}")
    # each writer imports its own tree's layoutc: PYTHONPATH keeps its other entries (a device's wheels), not a tree
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not (Path(p) / "layoutc").is_dir()))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.specs.split(","):
            spec_path = ROOT / "specs" / f"{name}.lyt"
            mods = {}
            for label, tree in (("old", Path(args.old).resolve()), ("new", ROOT)):
                out = Path(tmp) / f"ab_{label}_{name}.py"
                subprocess.run([sys.executable, "-c", WRITE, str(tree), str(spec_path), str(out)], check=True, env=env)
                mods[label] = _load(out, f"ab_{label}_{name}")
            import layoutc

            x = synthetic_inputs(layoutc.compile_file(spec_path), shape, seed=0)
            first = {}
            for label, m in mods.items():
                t0 = time.perf_counter()
                m.convert(x, fingerprint=args.fingerprint)
                first[label] = time.perf_counter() - t0
            a, b = (mods[k].convert(x, fingerprint=args.fingerprint) for k in ("old", "new"))
            same = a.keys() == b.keys() and all(
                torch.equal(a[k].contiguous().view(torch.uint8), b[k].contiguous().view(torch.uint8)) for k in a)
            fns = [lambda x=x: {k: v.clone() for k, v in x.items()},
                   lambda x=x, m=mods["old"]: m.convert(x, fingerprint=args.fingerprint),
                   lambda x=x, m=mods["new"]: m.convert(x, fingerprint=args.fingerprint)]
            times = [[] for _ in fns]
            for fn in fns:
                fn()
            for rep in range(args.reps):
                # the trees take turns going first after the clone: timed always second, a tree ran a few % slower
                # in same-code runs on the 2-core VM
                for i in (0, 1, 2) if rep % 2 == 0 else (0, 2, 1):
                    t0 = time.perf_counter()
                    fns[i]()
                    times[i].append(time.perf_counter() - t0)
            c, o, n = (statistics.median(ts) * 1e3 for ts in times)
            state = getattr(mods["new"], "_NB_STATE", {}).get("kernels") or {}  # specs without native kernels: none
            used = [k for k, v in state.items() if getattr(v, "signatures", None)]
            print(f"{name:32} clone {c:6.2f} ms  old {o:7.2f} ({o / c:5.1f}x)  new {n:7.2f} ({n / c:5.1f}x)  "
                  f"new/old {n / o:4.2f}  same {same}  first old {first['old']:.2f} s new {first['new']:.2f} s  "
                  f"kernels {','.join(used) or '-'}  load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
