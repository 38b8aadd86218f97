"""Every shipped spec on the CPU: a warm call and the first call of a fresh process against a clone (issue 25).

    python benchmarks/cpu_speed.py [--old DIR] [--specs a,b] [--shape E=8,I=1024,H=2048] [--reps 15] [--json F]
                                   [--kept-heap] [--rounds N]

For each spec (``specs/*.lyt``, the flashinfer_* first) and each tree (``--old DIR``: another
checkout's root, e.g. ``git archive 0d8fa64 layoutc | tar -x -C DIR``; then this checkout), in
alternation so both see the same load:

* ``clone ms``: median of a ``clone()`` of every input (the floor: each byte read and written once),
  timed in alternation with the two conversions below in the same rounds (``--reps`` of them);
* ``warm ms``: median of ``convert(x)`` (``lowering='auto'``, the default; everything a call does,
  the output fingerprint included) after one untimed call;
* ``ratio``: warm / clone;
* ``no-fp ms`` / ``ratio``: the same with ``fingerprint=False`` (no pass hashing the outputs for the guard);
* ``first s``: a fresh Python process that has imported torch and loaded the inputs imports the
  generated converter module (written by that tree's ``layoutc``) and calls ``convert`` once: the
  time from the import to the result (module import, plans, tables, the call);
* ``sha``: sha256 of the outputs' bytes (old and new must agree);
* ``path``: which CPU path ran: ``ir:...`` (the IR kernels of ``layoutc/lower/native_ir.py``),
  ``native:words,wquads,wpairs,quads`` (the numba kernels of ``layoutc/lower/native.py``
  this process compiled and called) or ``torch`` (numba not installed, ``LAYOUTC_NUMBA=0``, a tree without
  them, or a spec none of whose plans takes them). ``LAYOUTC_NUMBA=0 LAYOUTC_NATIVE_IR=0 python
  benchmarks/cpu_speed.py`` times the torch forms of this tree (``LAYOUTC_NATIVE_IR=0`` alone: numba's kernels).

The first call's process loads the module from its file without an entry in ``sys.modules``, so numba
cannot use its disk cache there (it reloads a kernel by importing its module by name): the figure includes
importing numba and compiling the kernels the spec uses, every time (the cold case).

``--kept-heap``: each timing process first sets glibc's malloc to keep freed memory (``M_MMAP_MAX`` 0,
``M_TRIM_THRESHOLD`` at its largest, set here with ctypes, as ``layoutc convert`` sets it for its own process):
without it, a clone or an output of 27 MB sometimes comes from new pages and sometimes from the heap (malloc's
adaptive threshold and heap trimming), and on this VM, whose free memory goes back to its host, a new page costs
about as much again as its copy: a clone of the same bytes moved 1.2 -> 5.5 ms between rows of one run. With it,
clone and conversions both reuse their previous call's pages: the warm case the ratio is meant to compare.

``--rounds N``: every (tree, spec) in N processes, every spec once a round (so a slow minute falls on one round
of each, not on N rounds of one spec); the last table's figures are each the median of its N rounds, and the
targets are counted on those. On the 2-core VM a row's ratio moved 1.0-6.1 between single runs (BENCHMARKS.md).

Each (tree, spec) runs in its own process. Not a test: timings depend on the machine and on what
else runs on it (say which, with the load average).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FIRST_CALL = r"""
import sys, time, importlib.util, torch
x = torch.load(sys.argv[2])
t0 = time.perf_counter()
spec = importlib.util.spec_from_file_location("converter_under_test", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
out = mod.convert(x)
print(time.perf_counter() - t0)
"""


def _path(module) -> str:
    """The CPU path the module's calls took: the SIMD kernel's forms, the numba kernels and the IR kernels
    (layoutc/lower/native_ir.py) it called (compiled in this process), or torch."""
    state = getattr(module, "_NB_STATE", {}).get("kernels") or {}
    used = [k for k, v in state.items() if getattr(v, "signatures", None)]  # the kernels compiled (each a dispatcher)
    simd = sorted(f"{'luts' if k[1] else 'bytes'}x{k[3]}" for k in getattr(module, "_NX_STATE", {})
                  if isinstance(k, tuple) and k[0] == "nx")  # (luts, ahead, gathers, group) of each form compiled
    ir = sorted({k[0] for k in getattr(module, "_NI_STATE", {}) if isinstance(k, tuple)})  # (name, types) compiled
    parts = (["simd:" + ",".join(simd)] if simd else []) + (["native:" + ",".join(used)] if used else [])
    return " ".join(parts + (["ir:" + ",".join(ir)] if ir else [])) or "torch"


def _alternating_ms(fns, reps: int) -> list[float]:
    """Median ms of each of ``fns``, called in turn in every round (one untimed round first): on a
    shared machine each sees the same load, so their ratios hold even when absolute times move."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) * 1e3 for ts in times]


def _digest(out: dict) -> str:
    import torch

    h = hashlib.sha256()
    for k in sorted(out):
        t = out[k].contiguous()
        h.update(k.encode())
        h.update(t.view(torch.uint8).reshape(-1).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def _keep_heap() -> None:
    """glibc's malloc keeps freed memory in this process (``--kept-heap``); raises where it cannot."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if libc.mallopt(-4, 0) != 1 or libc.mallopt(-1, 2**31 - 1) != 1:  # M_MMAP_MAX, M_TRIM_THRESHOLD
        raise RuntimeError("mallopt refused")


def worker(tree: str, spec_path: str, shape: dict, reps: int, kept_heap: bool = False) -> dict:
    """One spec under one tree's layoutc, in this (fresh) process."""
    if kept_heap:
        _keep_heap()
    sys.path.insert(0, tree)
    import torch
    import layoutc
    from layoutc.convert.synthckpt import synthetic_inputs

    assert Path(layoutc.__file__).resolve().is_relative_to(Path(tree).resolve()), layoutc.__file__
    spec = layoutc.compile_file(spec_path)
    x = synthetic_inputs(spec, shape, seed=0)
    nbytes = sum(t.numel() * t.element_size() for t in x.values())
    with tempfile.TemporaryDirectory() as tmp:
        module = Path(tmp) / "converter.py"
        spec.write(module)
        inputs = Path(tmp) / "inputs.pt"
        torch.save(x, inputs)
        run = subprocess.run([sys.executable, "-c", FIRST_CALL, str(module), str(inputs)], capture_output=True,
                             text=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        if run.returncode:
            raise RuntimeError(run.stderr)
        first_s = float(run.stdout.split()[-1])
    clone, warm, bare = _alternating_ms([lambda: {k: v.clone() for k, v in x.items()}, lambda: spec.convert(x),
                                         lambda: spec.convert(x, fingerprint=False)], reps)
    return {"spec": spec.name, "mb": nbytes / 1e6, "clone_ms": clone, "warm_ms": warm, "ratio": warm / clone,
            "nofp_ms": bare, "nofp_ratio": bare / clone,
            "first_s": first_s, "sha": _digest(spec.convert(x)), "threads": torch.get_num_threads(),
            "path": _path(spec.module)}


def _print_row(r: dict) -> None:
    print(f"{r['spec']:34} {r['tree']:4} {r['mb']:6.1f} {r['clone_ms']:9.2f} {r['warm_ms']:9.2f} {r['ratio']:7.1f} "
          f"{r['nofp_ms']:9.2f} {r['nofp_ratio']:7.1f} {r['first_s']:8.2f}  {r['sha']}  {r['path']}", flush=True)


def specs(names: str | None) -> list[Path]:
    found = sorted((ROOT / "specs").glob("*.lyt"), key=lambda p: (not p.stem.startswith("flashinfer_"), p.stem))
    if names:
        want = set(names.split(","))
        found = [p for p in found if p.stem in want]
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="root of another checkout, timed in alternation with this one")
    ap.add_argument("--specs", help="comma-separated spec names (default: every shipped spec)")
    ap.add_argument("--shape", default="E=8,I=1024,H=2048")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--kept-heap", action="store_true", help="malloc keeps freed memory in the timing processes")
    ap.add_argument("--rounds", type=int, default=1,
                    help="processes per (spec, tree), every spec once a round: each row the median of its rounds")
    ap.add_argument("--worker", nargs=2, metavar=("TREE", "SPEC"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    shape = {k: int(v) for k, v in (kv.split("=") for kv in args.shape.split(","))}
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], shape, args.reps, args.kept_heap)))
        return
    trees = ([("old", str(Path(args.old).resolve()))] if args.old else []) + [("new", str(ROOT))]
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; "
          f"machine: {platform.machine()}, {os.cpu_count()} cpus; load average at start: {os.getloadavg()}")
    print(f"shape: {shape}; trees: {trees}; kept heap: {args.kept_heap}")
    rows, runs = [], {}
    header = (f"{'spec':34} {'tree':4} {'MB':>6} {'clone ms':>9} {'warm ms':>9} {'ratio':>7} {'no-fp ms':>9} "
              f"{'ratio':>7} {'first s':>8}  sha               path")
    for rnd in range(args.rounds):
        print(f"round {rnd + 1} of {args.rounds}" if args.rounds > 1 else "", header, sep="\n" if args.rounds > 1 else "")
        for path in specs(args.specs):
            for label, tree in trees:
                run = subprocess.run([sys.executable, __file__, "--worker", tree, str(path), "--shape", args.shape,
                                      "--reps", str(args.reps)] + (["--kept-heap"] if args.kept_heap else []),
                                     capture_output=True, text=True,
                                     env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
                if run.returncode:
                    print(f"{path.stem:34} {label:4} FAILED: {run.stderr.strip().splitlines()[-1:]}")
                    continue
                r = json.loads(run.stdout.strip().splitlines()[-1]) | {"tree": label, "load": os.getloadavg()[0],
                                                                       "round": rnd}
                runs.setdefault((r["spec"], label), []).append(r)
                _print_row(r)
    for (spec, label), got in runs.items():  # a row per (spec, tree): each figure the median of its rounds
        rows.append(dict(got[0], **{k: statistics.median(g[k] for g in got)
                                    for k in ("clone_ms", "warm_ms", "ratio", "nofp_ms", "nofp_ratio", "first_s")},
                         rounds=len(got), sha=",".join(sorted({g["sha"] for g in got}))))
    if args.rounds > 1:
        print(f"medians of {args.rounds} rounds (each figure apart, a ratio the median of the rounds' ratios)", header,
              sep="\n")
        for r in rows:
            _print_row(r)
    print(f"load average at end: {os.getloadavg()}")
    new = [r for r in rows if r["tree"] == "new"]
    print(f"targets (issue 25, idle machine): warm <= 3x a clone: {sum(r['ratio'] <= 3 for r in new)}/{len(new)}; "
          f"first call < 2 s: {sum(r['first_s'] < 2 for r in new)}/{len(new)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
