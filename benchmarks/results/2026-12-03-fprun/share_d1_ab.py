"""Shared gathers for consecutive chunks (D = 1) on and off, whole calls in one process, alternating (issue 25).

    python benchmarks/results/2026-12-03-fprun/share_d1_ab.py SPEC[,SPEC...]

Run from the repository root. "d>1" is the converter as it is (_NX_SHARE_LEAST_D = 2), "any" the same converter
with _NX_SHARE_LEAST_D = 1 (what the reverted commit 1f0056d did); the plan's form is found again (memo cleared)
before each timed pair. A record of the run, not a tool. (The runs in share_d1_ab.txt were made with an earlier
copy of this script that carried its own D = 1 variant of _nx_shared; the same two forms.)
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
import layoutc  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402

for spec in sys.argv[1].split(","):
    c = layoutc.compile_file(f"specs/{spec}.lyt")
    m = c.module
    x = synthetic_inputs(c, dict(E=8, I=1024, H=2048), seed=0)
    res, outs = {}, {}
    for r in range(31):
        for name, least in (("d>1", 2), ("any", 1)) if r % 2 else (("any", 1), ("d>1", 2)):
            m._NX_SHARE_LEAST_D = least
            m._NX_STATE.setdefault("nx forms", {}).clear()
            c.convert(x, fingerprint=False)  # the form found (memo) outside the timing
            for fpk in (False, True):
                t0 = time.perf_counter()
                o = c.convert(x, fingerprint=fpk)
                dt = time.perf_counter() - t0
                if r:
                    res.setdefault((name, fpk), []).append(dt)
                outs[name] = o
    same = all(torch.equal(outs["any"][k].view(torch.uint8), outs["d>1"][k].view(torch.uint8)) for k in outs["any"])
    med = {k: statistics.median(v) * 1e3 for k, v in res.items()}
    print(f"{spec:32s} conv d>1 {med[('d>1', False)]:.2f} any {med[('any', False)]:.2f} "
          f"({med[('any', False)] / med[('d>1', False)]:.2f})  default d>1 {med[('d>1', True)]:.2f} "
          f"any {med[('any', True)]:.2f} ({med[('any', True)] / med[('d>1', True)]:.2f}) same {same}")
