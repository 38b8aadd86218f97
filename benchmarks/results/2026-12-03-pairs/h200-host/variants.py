import os, sys, time, statistics, torch
sys.path.insert(0, os.getcwd())
import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
print("threads", torch.get_num_threads(), flush=True)
for name in sys.argv[1].split(","):
    spec = layoutc.compile_file(f"specs/{name}.lyt")
    m = spec.module
    x = synthetic_inputs(spec, {"E": 8, "I": 1024, "H": 2048}, seed=0)
    res = {}
    for r in range(15):
        for st in (1 << 21, 1 << 62):
            for own in (1, 64):
                m._NX_STREAM_BYTES = st
                m._FP_OWN_ROWS_NATIVE = own
                key = ("stream" if st == 1 << 21 else "cached") + f"/own{own}"
                t0 = time.perf_counter(); spec.convert(x); res.setdefault(key, []).append((time.perf_counter() - t0) * 1e3)
            m._FP_OWN_ROWS_NATIVE = 1
            key = ("stream" if st == 1 << 21 else "cached") + "/nofp"
            t0 = time.perf_counter(); spec.convert(x, fingerprint=False); res.setdefault(key, []).append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter(); [t.clone() for t in x.values()]; res.setdefault("clone", []).append((time.perf_counter() - t0) * 1e3)
    print(f"{name:32s}", "  ".join(f"{k} {statistics.median(v[3:]):.2f}" for k, v in res.items()), flush=True)
