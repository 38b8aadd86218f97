"""The allocating warm call's host time before the launch, and ways to allocate a layer's outputs (issue 25).

    python benchmarks/alloc_split.py [--specs aiter_mxfp4,...] [--dims E=32,I=2944,H=2944]

A single warm call without ``out=`` is device idle time until its launch: the warm key and tensor check, one
``torch.empty`` per output, Triton's launcher. For each spec (this tree's converter, CUDA), warm: the median host
time of the call, of its prepared launch with and without its allocations, and of the outputs allocated four
ways (one ``torch.empty`` each; one byte buffer cut by slices and views; one byte buffer per dtype with
``as_strided``; ``split_with_sizes``), then the single-call device latency (CUDA events, the device idle at each
start) of the call, of the call with ``out=`` and of a device copy of the same bytes. Not a test: timings depend
on the machine.
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

SPECS = "aiter_mxfp4,triton_kernels_mxfp4_blackwell,marlin_nvfp4,marlin_mxfp4,flashinfer_trtllm_mxfp4:pad,"\
    "flashinfer_cutedsl_nvfp4:relu2,flashinfer_cutlass_mxfp4_padded:gpt_oss,vllm_cutlass_nvfp4:silu,"\
    "flashinfer_cutlass_bf16,marlin_gptq_int4"
PARAMS = {"pad": {"pad_to": 128, "pad_hidden": 128}, "relu2": {"activation": "relu2"},
          "gpt_oss": {"checkpoint": "gpt_oss"}, "silu": {"activation": "silu"}}



def _cut_views(shapes, device):
    # one byte buffer, each output a 256-byte aligned slice viewed as its dtype and shape
    offs, total = [], 0
    for s, dt in shapes:
        offs.append(total)
        total += -(-torch.Size(s).numel() * dt.itemsize // 256) * 256
    buf = torch.empty(total, dtype=torch.uint8, device=device)
    return [buf[o:o + torch.Size(s).numel() * dt.itemsize].view(dt).view(s) for o, (s, dt) in zip(offs, shapes)]


def _strided_plan(shapes):
    offs, total = [], 0
    for s, dt in shapes:
        offs.append(total)
        total += -(-torch.Size(s).numel() * dt.itemsize // 256) * 256
    strides = [torch.empty(s, device="meta").stride() for s, _ in shapes]
    return total, [(s, st, o // dt.itemsize, dt) for (s, dt), st, o in zip(shapes, strides, offs)]


def _strided(total, plan, device):
    buf = torch.empty(total, dtype=torch.uint8, device=device)
    typed = {}
    out = []
    for s, st, o, dt in plan:
        b = typed.get(dt)
        if b is None:
            b = typed[dt] = buf.view(dt)
        out.append(b.as_strided(s, st, o))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specs", default=SPECS)
    ap.add_argument("--dims", default="E=32,I=2944,H=2944")
    args = ap.parse_args()
    dims = {k: int(v) for k, v in (p.split("=") for p in args.dims.split(","))}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}, {dims}")
    for item in args.specs.split(","):
        name, _, p = item.partition(":")
        params = PARAMS.get(p, {})
        spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt", params)
        m = spec.module
        x = synthetic_inputs(spec, dims, 1, "cuda")
        out = m.convert(x, fingerprint=False)
        m.convert(x, fingerprint=False)
        hit = m._warm_hit(m._warm_key(x, None, "auto", None))
        fast = hit[5] if hit is not None else None
        shapes = [(tuple(t.shape), t.dtype) for t in out.values()]
        outs = {k: torch.empty_like(v) for k, v in out.items()}
        m.convert(x, fingerprint=False, out=outs)
        run = fast[0] if fast else None
        xs = [x[n] for n in run.names] if run else None
        total, plan = _strided_plan(shapes)
        print(f"{name} {params or ''}: {len(shapes)} outputs, prepared launch {fast is not None}, copies "
              f"{getattr(run, 'copies', None)}, launches {getattr(run, 'launches', None)}", flush=True)
        steps = {
            "convert, fingerprint=False": lambda: m.convert(x, fingerprint=False),
            "convert, fingerprint=False, out=": lambda: m.convert(x, fingerprint=False, out=outs),
            "  warm key + tensor check": lambda: m._warm_hit(m._warm_key(x, None, "auto", None)),
            "  prepared launch with its allocations": (lambda: run(xs)) if run else (lambda: None),
            "  prepared launch into outs (no graph)": (lambda: run(xs, outs)) if run else (lambda: None),
            "  alloc: torch.empty each": lambda: [torch.empty(s, dtype=dt, device="cuda") for s, dt in shapes],
            "  alloc: one buffer, slices and views": lambda: _cut_views(shapes, "cuda"),
            "  alloc: one buffer, as_strided per dtype": lambda: _strided(total, plan, "cuda"),
        }
        for what, fn in steps.items():
            print(f"  host {what:52s} {host_time(fn) * 1e6:8.1f} us", flush=True)
        nbytes = sum(t.numel() * t.element_size() for t in out.values())
        flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        buf = torch.empty_like(flat)
        dev = {"copy of the outputs' bytes": lambda: buf.copy_(flat),
               "convert, fingerprint=False": lambda: m.convert(x, fingerprint=False),
               "convert, fingerprint=False, out=": lambda: m.convert(x, fingerprint=False, out=outs)}
        res = {}
        for what, fn in dev.items():
            res[what] = timeit(fn, "cuda") * 1e3
        c = res["copy of the outputs' bytes"]
        print("  device single: " + ", ".join(f"{k} {v * 1e3:.1f} us ({c / v:.1%})" for k, v in res.items()),
              flush=True)
        x = out = outs = flat = buf = xs = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
