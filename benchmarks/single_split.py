"""Where a single warm call's time goes at a real layer (issue 25): the host steps of the default call
(fingerprint on) and of ``fingerprint=False`` without ``out=``, and the device time of the fingerprint pass.

    python benchmarks/single_split.py [--specs flashinfer_cutlass_bf16,...] [--dims E=32,I=2944,H=2944]

For each spec (this tree's converter), warm: the median host time (until the call returns, the device idle at
each start) of the whole call and of its steps (the warm key and tensor check, the prepared launch with its
allocations, the allocations alone, the stamp, the fingerprint's start and each int8 GEMM of it), and the
device time (CUDA events, single and 10 back to back) of the fingerprint of the outputs against a device copy
of the outputs' bytes. In a single call the host time before the launch is device idle time; what follows the
launch overlaps the kernel unless it is longer.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import layoutc  # noqa: E402
from layoutc.cli.bench import host_time, timeit  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402

SPECS = [("flashinfer_cutlass_bf16", {}), ("flashinfer_trtllm_mxfp4", {}),
         ("flashinfer_cutedsl_nvfp4", {"activation": "relu2"}), ("marlin_mxfp4", {})]



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specs", default=None, help="spec names joined by commas (default: four of the slowest)")
    ap.add_argument("--dims", default="E=32,I=2944,H=2944")
    args = ap.parse_args()
    dims = {k: int(v) for k, v in (p.split("=") for p in args.dims.split(","))}
    specs = SPECS if args.specs is None else [(n, dict(SPECS).get(n, {})) for n in args.specs.split(",")]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}, {dims}")
    for name, params in specs:
        spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt", params)
        m = spec.module
        x = synthetic_inputs(spec, dims, 1, "cuda")
        out = m.convert(x, fingerprint=False)
        m.convert(x)
        warm = m._warm_key(x, None, "auto", None)
        hit = m._warm_hit(warm)
        fast = hit[5] if hit is not None else None
        shapes = [(tuple(t.shape), t.dtype) for t in out.values()]
        ys = list(out.values())
        fp = m._fingerprint_start
        steps = {
            "convert, fingerprint=False": lambda: m.convert(x, fingerprint=False),
            "convert, default (fingerprint)": lambda: m.convert(x),
            "  warm key + tensor check": lambda: m._warm_hit(m._warm_key(x, None, "auto", None)),
            "  prepared launch with its allocations (_warm_run)": (lambda: m._warm_run(fast, x, None)) if fast
            else (lambda: None),
            "  torch.empty of the outputs": lambda: [torch.empty(s, dtype=dt, device="cuda") for s, dt in shapes],
            "  stamp, fingerprint=False (new records)": lambda: m._stamp(m._warm_run(fast, x, None), m.SPEC_NAME,
                                                                         m.SPEC_SHA256, m.PARAMS, m.REQUIRES, None,
                                                                         False, hit[4]) if fast else None,
            "  fingerprint start (outputs)": lambda: fp(ys),
        }
        xs = [m._fp_bytes_of(t) for t in ys]
        r = m._fp_matrix(b"R", m._FP_ROW, torch.device("cuda"))
        big = [v for v in xs if v.numel() >= 17 * m._FP_ROW]
        for i, v in enumerate(big):
            rows = v.numel() // m._FP_ROW
            a = v[: rows * m._FP_ROW].view(rows, m._FP_ROW)
            steps[f"  _int_mm of output {i} ({rows} rows)"] = lambda a=a: torch._int_mm(a, r)
        print(f"{name} {params or ''}: outputs {[tuple(t.shape) for t in ys]}, warm hit {hit is not None}, "
              f"prepared launch {fast is not None}", flush=True)
        for what, fn in steps.items():
            print(f"  host {what:56s} {host_time(fn) * 1e6:8.1f} us", flush=True)
        nbytes = sum(t.numel() * t.element_size() for t in ys)
        flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        buf = torch.empty_like(flat)
        dev = {"fingerprint of the outputs": lambda: fp(ys), "a copy of the outputs' bytes": lambda: buf.copy_(flat)}
        for i, v in enumerate(big):
            rows = v.numel() // m._FP_ROW
            a = v[: rows * m._FP_ROW].view(rows, m._FP_ROW)
            dev[f"_int_mm of output {i}"] = lambda a=a: torch._int_mm(a, r)
        for what, fn in dev.items():
            one, b2b = timeit(fn, "cuda") * 1e3, timeit(fn, "cuda", reps=5, calls=10) * 1e3
            print(f"  device {what:40s} single {one:7.3f} ms, b2b {b2b:7.3f} ms ({nbytes / 1e9:.3f} GB of outputs)",
                  flush=True)
        splits = getattr(m, "_FP_SPLIT_ROWS", None)
        if splits is not None:  # the fingerprint's GEMMs with K in parts (_fp_mm): the whole pass and each GEMM
            shipped = splits.get("cuda")
            for target in (None, 1 << 15, 1 << 17):
                splits["cuda"] = target
                cs = [m._fp_split(v.numel() // m._FP_ROW, m._FP_ROW, torch.device("cuda")) for v in big]
                whole = timeit(lambda: fp(ys), "cuda", reps=5, calls=10) * 1e3
                each = []
                for v in big:
                    a = v[: v.numel() // m._FP_ROW * m._FP_ROW].view(-1, m._FP_ROW)
                    each.append(timeit(lambda a=a: m._fp_mm(a, lambda c: m._fp_matrix(b"R", m._FP_ROW, a.device, c)),
                                       "cuda", reps=5, calls=10) * 1e3)
                print(f"  device split rows {target}: parts {cs}, fingerprint b2b {whole:.3f} ms, GEMMs b2b "
                      + ", ".join(f"{t:.3f}" for t in each) + " ms", flush=True)
            splits["cuda"] = shipped
        x = out = ys = xs = big = flat = buf = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
