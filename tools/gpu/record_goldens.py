"""Run FlashInfer's real CUDA layout helpers on the H200 and record small goldens.

Usage on the GPU machine (see tools/gpu/run.sh):  python tools/gpu/record_goldens.py OUT_DIR

Writes, into OUT_DIR, one torch.save file per golden set:
  sm90_fp4_interleave.pt     raw kernel input/output pairs, several shapes
  block_scale_interleave.pt  raw kernel input/output pairs, with and without padding
  <spec>.pt                  whole vLLM-style recipes (layoutc/reference/recipes.py) per shipped spec
Each file carries the FlashInfer and torch versions, the GPU name and the date. Inputs are
generated on the CPU from fixed seeds and stored with the outputs, so CPU tests need no RNG.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from layoutc.reference import flashinfer_kernels as kernels, recipes  # noqa: E402


def meta() -> dict:
    import flashinfer

    return {
        "flashinfer": flashinfer.__version__,
        "torch": str(torch.__version__),
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "recorded_by": "tools/gpu/record_goldens.py",
    }


def rand_bytes(g, *shape):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)


def mxfp4_layer(seed: int, e: int, i: int, h: int, bias: bool) -> dict:
    g = torch.Generator().manual_seed(seed)
    t = {
        "w13_weight": rand_bytes(g, e, 2 * i, h // 2),
        "w13_weight_scale": rand_bytes(g, e, 2 * i, h // 32),
        "w2_weight": rand_bytes(g, e, h, i // 2),
        "w2_weight_scale": rand_bytes(g, e, h, i // 32),
    }
    if bias:
        t["w13_bias"] = torch.randn(e, 2 * i, generator=g)
        t["w2_bias"] = torch.randn(e, h, generator=g)
    return t


def nvfp4_layer(seed: int, e: int, i: int, h: int, gated: bool) -> dict:
    g = torch.Generator().manual_seed(seed)
    rows = 2 * i if gated else i
    return {
        "w13_weight": rand_bytes(g, e, rows, h // 2),
        "w13_weight_scale": rand_bytes(g, e, rows, h // 16).view(torch.float8_e4m3fn),
        "w2_weight": rand_bytes(g, e, h, i // 2),
        "w2_weight_scale": rand_bytes(g, e, h, i // 16).view(torch.float8_e4m3fn),
    }


def on(device, t):
    return {k: v.to(device) for k, v in t.items()}


def off(t):
    return {k: v.cpu() for k, v in t.items()}


def main(out_dir: str, dry_run: bool = False) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if dry_run:
        # Plumbing check on a CPU machine: CPU stand-ins instead of the CUDA kernels. Never commit these files.
        from layoutc.lang.ops import torch_impl

        dev = torch.device("cpu")
        m = {"dry_run": True}
        interleave = torch_impl.sm90_interleave_fp4
        bsi = lambda s: torch_impl.swizzle_128x4(s).reshape(-1)  # noqa: E731
    else:
        dev = torch.device("cuda")
        m = meta()
        interleave = kernels.sm90_interleave_fp4()
        bsi = kernels.block_scale_interleave()
    print("recording with", m, flush=True)

    # Raw kernels over shapes that exercise every tile boundary.
    cases = []
    for n, kb in [(16, 32), (32, 64), (48, 96), (128, 64), (64, 160)]:
        for e in (1, 3):
            x = rand_bytes(torch.Generator().manual_seed(n * 1000 + kb + e), e, n, kb)
            cases.append({"input": x, "output": interleave(x.to(dev)).cpu()})
    torch.save({"meta": m, "cases": cases}, out / "sm90_fp4_interleave.pt")
    print("sm90_fp4_interleave:", len(cases), "cases", flush=True)

    cases = []
    for shape in [(128, 4), (1, 256, 8), (2, 128, 4), (1, 100, 5), (3, 200, 3), (2, 64, 7), (1, 129, 9), (2, 256, 12)]:
        x = rand_bytes(torch.Generator().manual_seed(sum(shape)), *shape)
        cases.append({"input": x, "output": bsi(x.to(dev)).cpu()})
    x = torch.randn(2, 100, 6, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    cases.append({"input": x, "output": bsi(x.to(dev)).cpu()})
    torch.save({"meta": m, "cases": cases}, out / "block_scale_interleave.pt")
    print("block_scale_interleave:", len(cases), "cases", flush=True)

    # Whole recipes per shipped spec.
    # (E, I, H, with biases): every shape needs I % 128 == H % 128 == 0 for the SM90 scale fold.
    shapes = [(2, 128, 128, True), (2, 128, 128, False), (1, 128, 384, True), (1, 384, 128, True)]
    cases = []
    for seed, (e, i, h, bias) in enumerate(shapes):
        t = mxfp4_layer(100 + seed, e, i, h, bias)
        cases.append({"dims": {"E": e, "I": i, "H": h}, "params": {}, "inputs": t,
                      "outputs": off(recipes.cutlass_sm90_mxfp4_bf16(on(dev, t), interleave))})
    torch.save({"meta": m, "spec": "flashinfer_cutlass_bf16", "cases": cases}, out / "flashinfer_cutlass_bf16.pt")

    cases = []
    for seed, (e, i, h, bias) in enumerate(shapes):
        t = mxfp4_layer(200 + seed, e, i, h, bias)
        cases.append({"dims": {"E": e, "I": i, "H": h}, "params": {}, "inputs": t,
                      "outputs": off(recipes.cutlass_mxfp4_mxfp8(on(dev, t), bsi))})
    torch.save({"meta": m, "spec": "flashinfer_cutlass_mxfp8", "cases": cases}, out / "flashinfer_cutlass_mxfp8.pt")

    cases = []
    for seed, (e, i, h) in enumerate([(2, 64, 128), (1, 192, 80), (3, 128, 48)]):
        for activation, gated in (("silu", True), ("relu2", False)):
            t = nvfp4_layer(300 + seed, e, i, h, gated)
            cases.append({"dims": {"E": e, "I": i, "H": h}, "params": {"activation": activation}, "inputs": t,
                          "outputs": off(recipes.cutedsl_nvfp4(on(dev, t), bsi, gated))})
    torch.save({"meta": m, "spec": "flashinfer_cutedsl_nvfp4", "cases": cases}, out / "flashinfer_cutedsl_nvfp4.pt")
    print("recipes recorded", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], dry_run="--dry-run" in sys.argv)
