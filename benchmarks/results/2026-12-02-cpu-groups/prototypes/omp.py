import sys, os, subprocess, json, statistics
CHILD = r'''
import sys, time, statistics, torch
sys.path.insert(0, "/work/wt/vec")
import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
spec = layoutc.compile_file(f"/work/wt/vec/specs/{sys.argv[1]}.lyt")
x = synthetic_inputs(spec, dict(E=8, I=1024, H=2048), seed=0)
fns = [lambda: {k: v.clone() for k, v in x.items()}, lambda: spec.convert(x, fingerprint=False)]
for f in fns: f()
ts = [[], []]
for _ in range(9):
    for f, tl in zip(fns, ts):
        t0 = time.perf_counter(); f(); tl.append(time.perf_counter() - t0)
print(statistics.median(ts[0]) * 1e3, statistics.median(ts[1]) * 1e3)
'''
env0 = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_WAIT_POLICY")}
print("load", os.getloadavg())
for name in sys.argv[1].split(","):
    res = {"default": [], "PASSIVE": []}
    for _ in range(2):
        for label in res:
            env = dict(env0, **({"OMP_WAIT_POLICY": "PASSIVE"} if label == "PASSIVE" else {}))
            out = subprocess.run([sys.executable, "-c", CHILD, name], capture_output=True, text=True, env=env, check=True).stdout.split()
            res[label].append((float(out[0]), float(out[1])))
    line = "  ".join(f"{l}: clone {statistics.median(c for c, _ in r):6.2f} convert {statistics.median(v for _, v in r):7.2f} ({[round(v, 1) for _, v in r]})" for l, r in res.items())
    print(f"{name:32} {line}  load {os.getloadavg()[0]:.2f}", flush=True)
