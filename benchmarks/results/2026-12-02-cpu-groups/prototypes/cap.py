import sys, time, statistics, torch, numpy as np
sys.path.insert(0, "/work/wt/vec")
import layoutc
from layoutc.convert.synthckpt import synthetic_inputs

def capture(name):
    spec = layoutc.compile_file(f"/work/wt/vec/specs/{name}.lyt")
    x = synthetic_inputs(spec, dict(E=8, I=1024, H=2048), seed=0)
    m = spec.module
    got = []
    orig = m._nb_run
    def run(kname, args, total, weight):
        got.append((kname, tuple(a.copy() if isinstance(a, np.ndarray) and a.ndim and kname else a for a in args), total, weight))
        return orig(kname, args, total, weight)
    m._nb_run = run
    spec.convert(x, fingerprint=False)
    m._nb_run = orig
    return spec, x, got

def bench(fns, reps=9):
    for f in fns: f()
    ts = [[] for _ in fns]
    for _ in range(reps):
        for f, tl in zip(fns, ts):
            t0 = time.perf_counter(); f(); tl.append(time.perf_counter() - t0)
    return [round(statistics.median(t) * 1e3, 2) for t in ts]
