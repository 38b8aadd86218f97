"""The guard's fingerprint on CUDA: its first product by the Triton kernel against cuBLAS's int8 GEMMs (issue 25).

    python benchmarks/fp_triton.py [--specs a,b] [--dims "E=32,I=2944,H=2944;E=128,I=2944,H=2944"] [--rounds 2]

For each spec and layer (this tree's converter module, CUDA): the fingerprints of its outputs by both forms
(``_FP_TRITON_STATE["kernel"]`` set to None: the cuBLAS form; the same strings, checked), then in alternation,
``--rounds`` times: the fingerprint's device time (CUDA events, single and 10 back to back) and host time until
``_fingerprint_start`` returns, and the default call (``convert(x)``: the conversion, then the fingerprint queued
on the same stream) single and 10 back to back, as a fraction of a device copy of the outputs' bytes; the
conversion alone (``fingerprint=False``) for reference. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import layoutc  # noqa: E402
from layoutc.cli.bench import host_time, timeit  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402

SPECS = "flashinfer_cutlass_bf16,flashinfer_trtllm_mxfp4,flashinfer_cutedsl_nvfp4:relu2,marlin_mxfp4,aiter_mxfp4,"\
    "triton_kernels_mxfp4_blackwell,flashinfer_trtllm_bf16:silu,deepgemm_fp8_block"
PARAMS = {"relu2": {"activation": "relu2"}, "silu": {"activation": "silu"}}



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specs", default=SPECS)
    ap.add_argument("--dims", default="E=32,I=2944,H=2944;E=128,I=2944,H=2944")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None, help="a JSON line per spec and layer")
    ap.add_argument("--profile", action="store_true", help="cProfile of 200 fingerprint starts of each form instead")
    ap.add_argument("--sweep", action="store_true", help="the Triton form's block sizes and warps instead")
    args = ap.parse_args()
    if args.profile:
        return _profile(args)
    if args.sweep:
        return _sweep(args)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    sink = open(args.out, "a") if args.out else None
    for dims_text in args.dims.split(";"):
        dims = {k: int(v) for k, v in (p.split("=") for p in dims_text.split(","))}
        for item in args.specs.split(","):
            name, _, p = item.partition(":")
            params = PARAMS.get(p, {})
            spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt", params)
            m = spec.module
            x = synthetic_inputs(spec, dims, 1, "cuda")
            ys = list(m.convert(x, fingerprint=False).values())
            kernel = m._fp_triton()
            forms = {"cublas": None, "triton": kernel}
            prints = {}
            for form, k in forms.items():
                m._FP_TRITON_STATE["kernel"] = k
                prints[form] = m._fingerprints(ys)
            nbytes = sum(t.numel() * t.element_size() for t in ys)
            flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            buf = torch.empty_like(flat)
            res = {form: {} for form in forms}
            copy = []
            for _ in range(args.rounds):
                copy.append((timeit(lambda: buf.copy_(flat), "cuda"),
                             timeit(lambda: buf.copy_(flat), "cuda", reps=5, calls=10)))
                for form, k in forms.items():
                    m._FP_TRITON_STATE["kernel"] = k
                    r = res[form]
                    fp = lambda: m._fingerprint_start(ys)  # noqa: E731
                    call = lambda: m.convert(x)  # noqa: E731
                    alone = lambda: m.convert(x, fingerprint=False)  # noqa: E731
                    for what, fn in (("fp", fp), ("default", call), ("conversion", alone)):
                        r.setdefault(what, []).append(timeit(fn, "cuda"))
                        r.setdefault(what + "_b2b", []).append(timeit(fn, "cuda", reps=5, calls=10))
                    r.setdefault("fp_host_us", []).append(host_time(fp) * 1e6)
            m._FP_TRITON_STATE["kernel"] = kernel
            c1 = statistics.median(c for c, _ in copy)
            c10 = statistics.median(c for _, c in copy)
            row = {"spec": name, "params": params, "dims": dims, "bytes": nbytes, "same": prints["cublas"] ==
                   prints["triton"], "copy_ms": c1 * 1e3, "copy_b2b_ms": c10 * 1e3}
            line = [f"{name} {params or ''} {dims}: {nbytes / 1e9:.3f} GB, same fingerprints {row['same']}, copy "
                    f"{c1 * 1e3:.3f} ms"]
            for form, r in res.items():
                med = {k: statistics.median(v) for k, v in r.items()}
                row[form] = med
                line.append(
                    f"  {form:7s} fingerprint {med['fp'] * 1e3:.3f} ms (b2b {med['fp_b2b'] * 1e3:.3f}, host "
                    f"{med['fp_host_us']:.0f} us); default call {c1 / med['default']:.1%} of a copy (b2b "
                    f"{c10 / med['default_b2b']:.1%}); conversion alone {c1 / med['conversion']:.1%} (b2b "
                    f"{c10 / med['conversion_b2b']:.1%})")
            print("\n".join(line), flush=True)
            if sink:
                sink.write(json.dumps(row) + "\n")
                sink.flush()
            x = ys = flat = buf = None
            torch.cuda.empty_cache()
    return 0


def _sweep(args) -> int:
    # The fingerprint's device time (10 back to back) per (rows a program, bytes a step, warps, programs wanted)
    # of _fp_rows_kernel, for the first spec at each layer; the same fingerprints each time.
    for dims_text in args.dims.split(";"):
        dims = {k: int(v) for k, v in (p.split("=") for p in dims_text.split(","))}
        name, _, p = args.specs.split(",")[0].partition(":")
        spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt", PARAMS.get(p, {}))
        m = spec.module
        x = synthetic_inputs(spec, dims, 1, "cuda")
        ys = list(m.convert(x, fingerprint=False).values())
        want = m._fingerprints(ys)
        shipped = (m._FP_TRITON_BLOCK_M, m._FP_TRITON_BLOCK_K, m._FP_TRITON_WARPS, m._FP_TRITON_PROGRAMS)
        for bm, bk, warps, programs in [(64, 128, 4, 1024), (64, 256, 4, 1024), (128, 128, 4, 1024),
                                        (128, 128, 8, 1024), (64, 128, 4, 512), (64, 128, 4, 2048),
                                        (32, 256, 4, 1024), (128, 256, 8, 1024), (64, 512, 8, 1024)]:
            m._FP_TRITON_BLOCK_M, m._FP_TRITON_BLOCK_K, m._FP_TRITON_WARPS, m._FP_TRITON_PROGRAMS = (
                bm, bk, warps, programs)
            same = m._fingerprints(ys) == want
            t = timeit(lambda: m._fingerprint_start(ys), "cuda", reps=5, calls=10)
            print(f"{name} {dims}: BLOCK_M {bm} BLOCK_K {bk} warps {warps} programs {programs}: "
                  f"{t * 1e3:.3f} ms b2b, same {same}", flush=True)
        m._FP_TRITON_BLOCK_M, m._FP_TRITON_BLOCK_K, m._FP_TRITON_WARPS, m._FP_TRITON_PROGRAMS = shipped
        x = ys = None
        torch.cuda.empty_cache()
    return 0


def _profile(args) -> int:
    import cProfile
    import pstats

    dims = {k: int(v) for k, v in (p.split("=") for p in args.dims.split(";")[0].split(","))}
    name, _, p = args.specs.split(",")[0].partition(":")
    spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt", PARAMS.get(p, {}))
    m = spec.module
    x = synthetic_inputs(spec, dims, 1, "cuda")
    ys = list(m.convert(x, fingerprint=False).values())
    kernel = m._fp_triton()
    for form, k in (("cublas", None), ("triton", kernel)):
        m._FP_TRITON_STATE["kernel"] = k
        for _ in range(5):
            m._fingerprint_start(ys)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            m._fingerprint_start(ys)
            torch.cuda.synchronize()
        prof.disable()
        print(f"== {form}: {name} {dims}", flush=True)
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
