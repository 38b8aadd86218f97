"""Time each tensor's block of a fused layer kernel on its own (CUDA), against a device copy of its bytes.

    python benchmarks/kernel_split.py [--specs trtllm_mxfp4,...] [--dims "E=128,I=2944,H=2944;..."]
        [--tree .] [--out split.jsonl]

A fused layer kernel runs every tensor's block in one launch (program ids split by the _G<i>
constexprs). Here the kernel is launched again with every _G<j> but one set to 0, so one tensor's
block runs alone: its time per launch (median of 30 single launches, and of 10 back to back) and the
bytes it reads and writes (its input and output tensors) over a device copy's rate. The layer kernel
and the whole convert call are timed too. Profile before changing (issue 24/25: which block of which
spec holds the layer back).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

DIMS = "E=32,I=2944,H=2944;E=128,I=2944,H=2944"
SPECS = "flashinfer_trtllm_mxfp4,aiter_mxfp4,marlin_nvfp4,marlin_mxfp4,flashinfer_cutlass_mxfp4_padded"
PARAMS = {"flashinfer_cutlass_mxfp4_padded": {"checkpoint": "gpt_oss"}}


def _events(fn, reps=30, calls=1):
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specs", default=SPECS)
    ap.add_argument("--dims", default=DIMS)
    ap.add_argument("--tree", type=Path, default=Path("."))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--warps", default="", help="also the layer kernel at these num_warps (comma-separated)")
    args = ap.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    import torch

    import layoutc
    from layoutc.convert.synthckpt import synthetic_inputs

    folder = Path(tempfile.mkdtemp(prefix="split_"))
    for dims_text in args.dims.split(";"):
        dims = {k: int(v) for k, v in (p.split("=") for p in dims_text.split(","))}
        for name in args.specs.split(","):
            params = PARAMS.get(name, {})
            compiled = layoutc.compile_file(args.tree / "specs" / f"{name}.lyt", params)
            path = folder / f"{name}.py"
            path.write_text(compiled.source)
            spec = importlib.util.spec_from_file_location(f"split_{name}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            x = synthetic_inputs(compiled, dims, 1, "cuda")
            launches = []
            real = module._launch

            def spy(kernel, programs, largs, consts, num_warps, real=real):
                launches.append((kernel, programs, list(largs), dict(consts), num_warps))
                return real(kernel, programs, largs, consts, num_warps)

            module._launch = spy
            module._PREPARED.clear()
            module.convert(x, lowering="fused", fingerprint=False)
            module._launch = real
            inputs = sum(t.numel() * t.element_size() for t in x.values())
            flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in x.values()])
            buf = torch.empty_like(flat)
            copy = _events(lambda: buf.copy_(flat))
            copy_b2b = _events(lambda: buf.copy_(flat), calls=10)
            rate, rate_b2b = 2 * inputs / copy, 2 * inputs / copy_b2b  # bytes per ms
            whole = _events(lambda: module.convert(x, lowering="fused", fingerprint=False))
            whole_b2b = _events(lambda: module.convert(x, lowering="fused", fingerprint=False), calls=10)
            outs = module.convert(x, lowering="fused", fingerprint=False)
            moved = inputs + sum(t.numel() * t.element_size() for t in outs.values())
            row = {"spec": name, "dims": dims, "copy_ms": copy, "copy_b2b_ms": copy_b2b, "bytes": moved,
                   "convert_ms": whole, "convert_b2b_ms": whole_b2b, "convert_pct": 100 * moved / whole / rate,
                   "convert_b2b_pct": 100 * moved / whole_b2b / rate_b2b, "blocks": []}
            print(f"== {name} {dims_text}: convert {whole:.3f} ms ({row['convert_pct']:.1f}%), b2b {whole_b2b:.3f} "
                  f"({row['convert_b2b_pct']:.1f}%), copy {copy:.3f}/{copy_b2b:.3f} ms", flush=True)
            for kernel, programs, largs, consts, nw in launches:
                order = re.findall(r"(_b_\w+)\(_x(\d+)", kernel.src)
                kern = lambda c=consts, p=programs: kernel[(p,)](*largs, **c, num_warps=nw)  # noqa: E731
                t = _events(kern)
                t_b2b = _events(kern, calls=10)
                row["layer_kernel_ms"], row["layer_kernel_b2b_ms"] = t, t_b2b
                ck = kernel[(programs,)](*largs, **consts, num_warps=nw)
                res = {k: getattr(ck, k, None) for k in ("n_regs", "n_spills")}
                res["shared"] = getattr(getattr(ck, "metadata", None), "shared", None)
                row["layer_kernel_resources"] = res
                print(f"   layer kernel {getattr(kernel, '__name__', '?')}: {programs} programs, {t:.3f} ms, "
                      f"b2b {t_b2b:.3f} ms, {res}")
                for w in [int(v) for v in args.warps.split(",") if v]:
                    kw = lambda c=consts, p=programs, w=w: kernel[(p,)](*largs, **c, num_warps=w)  # noqa: E731
                    tw, tw2 = _events(kw), _events(kw, calls=10)
                    row[f"layer_kernel_warps{w}_ms"], row[f"layer_kernel_warps{w}_b2b_ms"] = tw, tw2
                    print(f"   layer kernel at num_warps={w}: {tw:.3f} ms, b2b {tw2:.3f} ms")
                for blk, i in order:
                    i = int(i)
                    g = consts[f"_G{i}"]
                    c = {k: (0 if re.fullmatch(r"_G\d+", k) and k != f"_G{i}" else v) for k, v in consts.items()}
                    xi, yi = largs[2 * i], largs[2 * i + 1]
                    nbytes = xi.numel() * xi.element_size() + yi.numel() * yi.element_size()
                    if g == 0:
                        continue
                    one = lambda c=c, g=g: kernel[(g,)](*largs, **c, num_warps=nw)  # noqa: E731
                    tb, tb2 = _events(one), _events(one, calls=10)
                    ck = kernel[(g,)](*largs, **c, num_warps=nw)
                    res = (getattr(ck, "n_regs", None), getattr(getattr(ck, "metadata", None), "shared", None))
                    info = {"block": blk, "programs": g, "bytes": nbytes, "ms": tb, "b2b_ms": tb2,
                            "pct": 100 * nbytes / tb / rate, "b2b_pct": 100 * nbytes / tb2 / rate_b2b,
                            "consts": {k: v for k, v in c.items() if k.endswith(str(i)) and k[1] in "GWAT"}}
                    row["blocks"].append(info)
                    print(f"   {blk:32s} {g:8d} programs {nbytes / 1e6:9.1f} MB  {tb:.3f} ms ({info['pct']:.1f}%)"
                          f"  b2b {tb2:.3f} ms ({info['b2b_pct']:.1f}%)  {info['consts']} regs/smem {res}", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
            x = flat = buf = outs = None
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
