"""A real FlashInfer kernel reading layoutc's output: ``e2m1_and_ufp8sf_scale_to_float``.

FlashInfer's FP4 dequantizer reads packed E2M1 weights with their block scales in the 128x4
swizzled layout (``is_sf_swizzled_layout=True``), the layout the CuTeDSL NVFP4 and the CUTLASS
MXFP8 specs produce. On SM90 it is compiled from FlashInfer's sources (the fp4_quantization JIT
module, a minute or so; not the fused MoE, whose SM90 JIT takes over an hour). This script
quantizes deterministic bf16 layers with layoutc's own quantizer, converts them with the shipped
specs, lets FlashInfer dequantize the converted tensors and records inputs, converted bytes and
FlashInfer's floats in OUT_DIR/flashinfer_dequant.pt. tests/reference/test_kernel_dequant.py checks on CPU
that FlashInfer's reading equals the checkpoint's values in the kernel's row order.

    python tools/gpu/kernel_dequant.py OUT_DIR
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import layoutc  # noqa: E402
from layoutc.reference.quant import quantize_mxfp4, quantize_nvfp4  # noqa: E402
from tools.gpu.record_goldens import meta  # noqa: E402

#: (spec, params, dims): padding on both axes in the relu2 case (96 rows -> 128, 5 scale columns -> 8)
CASES = [
    ("flashinfer_cutedsl_nvfp4", {"activation": "silu"}, {"E": 2, "I": 128, "H": 256}),
    ("flashinfer_cutedsl_nvfp4", {"activation": "relu2"}, {"E": 2, "I": 96, "H": 80}),
    ("flashinfer_cutlass_mxfp8", {}, {"E": 2, "I": 128, "H": 256}),
]


def layer(name: str, params: dict, dims: dict, seed: int) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    e, i, h = dims["E"], dims["I"], dims["H"]
    rows = i if params.get("activation") == "relu2" else 2 * i
    w13 = (torch.randn(e, rows, h, generator=g) * 0.05).bfloat16()
    w2 = (torch.randn(e, h, i, generator=g) * 0.05).bfloat16()
    if "nvfp4" in name:
        (q13, s13, g13), (q2, s2, g2) = quantize_nvfp4(w13), quantize_nvfp4(w2)
        return {"w13_weight": q13, "w13_weight_scale": s13, "w2_weight": q2, "w2_weight_scale": s2}, {"w13": g13, "w2": g2}
    (q13, s13), (q2, s2) = quantize_mxfp4(w13), quantize_mxfp4(w2)
    return {"w13_weight": q13, "w13_weight_scale": s13, "w2_weight": q2, "w2_weight_scale": s2}, {}


def main(out_dir: str) -> None:
    from flashinfer.quantization.fp4_quantization import e2m1_and_ufp8sf_scale_to_float as dequant

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for seed, (name, params, dims) in enumerate(CASES):
        spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt", params)
        inputs, global_scales = layer(name, params, dims, seed)
        converted = {k: v.cpu() for k, v in spec.convert({k: v.cuda() for k, v in inputs.items()}).items()}
        nv = "nvfp4" in name
        read = {}
        for w in ("w13", "w2"):
            per_expert = []
            for e in range(dims["E"]):
                gs = global_scales[w][e:e + 1].float() if nv else torch.ones(1)
                t0 = time.time()
                per_expert.append(dequant(converted[f"{w}_weight"][e].contiguous(),
                                          converted[f"{w}_weight_scale"][e].contiguous().view(torch.uint8).reshape(-1),
                                          gs, 16 if nv else 32, 1 if nv else 0, True))
                print(f"{name} {params} {w}[{e}]: {tuple(per_expert[-1].shape)} in {time.time() - t0:.1f} s", flush=True)
            read[w] = torch.stack(per_expert).float().cpu()
        cases.append({"spec": name, "params": params, "dims": dims, "inputs": inputs, "global_scales": global_scales,
                      "converted": converted, "flashinfer_dequant": read})
    torch.save({"meta": meta() | {"recorded_by": "tools/gpu/kernel_dequant.py"}, "cases": cases},
               out / "flashinfer_dequant.pt")
    print("flashinfer_dequant:", len(cases), "cases", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
