"""The SIMD kernel's forms switched off one at a time, in one process (what ran for toggles_*.txt, 2026-12-03).

    python benchmarks/results/2026-12-03-pairs/toggles.py SPEC[,SPEC...]   (from the repository root)

Per spec: the default call and the conversion alone with every form, then without streamed stores, the tile form,
the columns form, shared gathers, 8-byte gathers (and what needs them) or groups of 8, rounds in a shuffled order;
printed as the time without the form over the time with all. It patches the converter's private functions: a record
of a measurement on this tree, not a tool kept working.
"""
import os, sys, time, statistics, torch
sys.path.insert(0, os.getcwd())
import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
print("threads", torch.get_num_threads(), flush=True)
VARIANTS = ["base", "nostream", "notile", "nocols", "noshare", "nopairs", "g4"]
for name in sys.argv[1].split(","):
    spec = layoutc.compile_file(f"specs/{name}.lyt")
    m = spec.module
    x = synthetic_inputs(spec, {"E": 8, "I": 1024, "H": 2048}, seed=0)
    orig_form = m._nx_form
    orig = {k: getattr(m, k) for k in ("_nx_tiled", "_nx_columns", "_nx_shared", "_nx_form", "_NX_STREAM_BYTES", "_NX_SHARED_GROUP")}
    def setv(v):
        for k, val in orig.items(): setattr(m, k, val)
        m._NX_STATE.pop("nx forms", None)
        if v == "nostream": m._NX_STREAM_BYTES = 1 << 62
        if v == "notile": m._nx_tiled = lambda *a: 0
        if v == "nocols": m._nx_columns = lambda *a: False
        if v == "noshare": m._nx_shared = lambda *a: None
        if v == "nopairs": m._nx_form = lambda g, o: (lambda f: (f[0], False, 0, 0) + f[4:])(orig_form(g, o))
        if v == "g4": m._NX_SHARED_GROUP = 4
    res = {}
    import random
    rng = random.Random(0)
    for r in range(13):
        order = VARIANTS[:]
        rng.shuffle(order)  # no variant always first after the previous round
        for v in order:
            setv(v)
            for fp in (True, False):
                t0 = time.perf_counter(); spec.convert(x, fingerprint=fp); res.setdefault((v, fp), []).append((time.perf_counter() - t0) * 1e3)
    setv("base")
    base = {fp: statistics.median(res[("base", fp)][3:]) for fp in (True, False)}
    print(f"{name:32s} base fp {base[True]:.2f} nofp {base[False]:.2f} |", "  ".join(
        f"{v} {statistics.median(res[(v, True)][3:]) / base[True]:.2f}/{statistics.median(res[(v, False)][3:]) / base[False]:.2f}" for v in VARIANTS[1:]), flush=True)
