"""The outputs' fingerprint alone, old and new fingerprint module in one process, alternating (issue 25).

    git show b1dccb7:layoutc/runtime/fingerprint.py > /tmp/fp_old.py
    python benchmarks/results/2026-12-03-fprun/fp_alone_ab.py /tmp/fp_old.py SPEC[,SPEC...]

Run from the repository root. Each spec's outputs at E=8, I=1024, H=2048 (fingerprint=False), then 40 rounds of
_fingerprints of them by each module in turn; asserts both give the same strings. A record of the run, not a tool.
"""
import importlib.util
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
import layoutc  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.runtime import fingerprint as NEW  # noqa: E402

s = importlib.util.spec_from_file_location("fp_old", sys.argv[1])
OLD = importlib.util.module_from_spec(s)
s.loader.exec_module(OLD)
for spec in sys.argv[2].split(","):
    c = layoutc.compile_file(f"specs/{spec}.lyt")
    x = synthetic_inputs(c, dict(E=8, I=1024, H=2048), seed=0)
    outs = list(c.convert(x, fingerprint=False).values())
    assert OLD._fingerprints(outs) == NEW._fingerprints(outs)
    res = {"old": [], "new": []}
    for r in range(40):
        for k, M in (("old", OLD), ("new", NEW)) if r % 2 else (("new", NEW), ("old", OLD)):
            t0 = time.perf_counter()
            M._fingerprints(outs)
            res[k].append(time.perf_counter() - t0)
    o, n = (statistics.median(res[k]) * 1e3 for k in ("old", "new"))
    print(f"{spec:32s} old {o:.3f} new {n:.3f} ms  {n / o:.2f}  tensors {len(outs)}")
