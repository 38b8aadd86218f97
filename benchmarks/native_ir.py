"""The native CPU kernels as our own LLVM IR against numba's, in ONE process, and their first calls (issue 25).

    python benchmarks/native_ir.py [--specs a,b] [--shape E=8,I=1024,H=2048] [--reps 15] [--firsts 3]

For each shipped spec whose CPU conversion takes the native kernels (words, quads, pairs, SM90 quads, byte
lookups): ``convert(x, fingerprint=False)`` with ``LAYOUTC_NATIVE_IR=1`` (the IR kernels of
``layoutc/lower/native_ir.py``) and ``=0`` (numba's kernels of ``layoutc/lower/native.py``), alternating in the same
rounds of one process (the switch is read per call; both compiled before timing), with a clone of the inputs as the
floor, the SIMD kernel off (``LAYOUTC_SIMD=0``: it takes these plans first where the CPU has AVX-512 VBMI). The
outputs of both must be the same bits. Then ``--firsts`` fresh processes each way that import the generated
converter from its file and call it once (the first call: module import, plans, compiling the kernels, the call;
numba without its disk cache, as ``cpu_speed.py`` measures it). Medians. Not a test: timings depend on the machine
and on what else runs on it (the load average is printed).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FIRST_CALL = r"""
import sys, time, importlib.util, torch
x = torch.load(sys.argv[2])
t0 = time.perf_counter()
spec = importlib.util.spec_from_file_location("converter_under_test", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
mod.convert(x, fingerprint=False)
print(time.perf_counter() - t0, "numba" in sys.modules)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", default="flashinfer_cutlass_bf16,flashinfer_cutlass_mxfp4_padded,marlin_gptq_int4,"
                    "marlin_mxfp4,marlin_nvfp4,triton_kernels_mxfp4_hopper,vllm_cutlass_w4a8")
    ap.add_argument("--shape", default="E=8,I=1024,H=2048")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--firsts", type=int, default=3, help="fresh processes per way for the first call")
    args = ap.parse_args()
    os.environ["LAYOUTC_SIMD"] = "0"
    import torch

    import layoutc
    from layoutc.convert.synthckpt import synthetic_inputs

    shape = {k: int(v) for k, v in (p.split("=") for p in args.shape.split(","))}
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; machine: {platform.machine()}, "
          f"{os.cpu_count()} cpus, threads {torch.get_num_threads()}; torch {torch.__version__}; shape {shape}; "
          f"load average {os.getloadavg()}")
    print(f"{'spec':32} {'MB':>6} {'clone ms':>9} {'numba ms':>9} {'IR ms':>8} {'IR/numba':>8}  {'first numba s':>13} "
          f"{'first IR s':>10}  kernels")
    for name in args.specs.split(","):
        spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt")
        x = synthetic_inputs(spec, shape, seed=0)
        mb = sum(t.numel() * t.element_size() for t in x.values()) / 1e6
        outs = {}
        for way in ("0", "1"):
            os.environ["LAYOUTC_NATIVE_IR"] = way
            outs[way] = spec.convert(x, fingerprint=False)
        for k in outs["0"]:
            a, b = outs["0"][k].contiguous(), outs["1"][k].contiguous()
            if not torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
                sys.exit(f"{name}: {k} differs between the IR and numba kernels")
        kernels = sorted({k[0] for k in spec.module._NI_STATE if isinstance(k, tuple)})
        times = {"clone": [], "0": [], "1": []}
        for _ in range(args.reps):
            t0 = time.perf_counter()
            {k: v.clone() for k, v in x.items()}
            times["clone"].append(time.perf_counter() - t0)
            for way in ("0", "1"):
                os.environ["LAYOUTC_NATIVE_IR"] = way
                t0 = time.perf_counter()
                spec.convert(x, fingerprint=False)
                times[way].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        firsts = {"0": [], "1": []}
        with tempfile.TemporaryDirectory() as tmp:
            module, inputs = Path(tmp) / "converter.py", Path(tmp) / "inputs.pt"
            spec.write(module)
            torch.save(x, inputs)
            for _ in range(args.firsts):
                for way in ("0", "1"):
                    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                    env.update(LAYOUTC_NATIVE_IR=way, LAYOUTC_SIMD="0")
                    run = subprocess.run([sys.executable, "-c", FIRST_CALL, str(module), str(inputs)], env=env,
                                         capture_output=True, text=True)
                    if run.returncode:
                        sys.exit(run.stderr)
                    seconds, numba = run.stdout.split()
                    if (numba == "True") != (way == "0"):
                        sys.exit(f"{name}: LAYOUTC_NATIVE_IR={way} and numba imported: {numba}")
                    firsts[way].append(float(seconds))
        print(f"{name:32} {mb:6.1f} {med['clone']:9.2f} {med['0']:9.2f} {med['1']:8.2f} {med['1'] / med['0']:8.2f}  "
              f"{statistics.median(firsts['0']):13.2f} {statistics.median(firsts['1']):10.2f}  {','.join(kernels)}",
              flush=True)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
