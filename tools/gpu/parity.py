"""On the GPU: layoutc's converters (eager lowering, CUDA) against the real FlashInfer recipes.

    python tools/gpu/parity.py GOLDEN_DIR

1. Every recorded golden case: the compiled converter run on CUDA must equal the recipe's
   output (recorded with the real kernels) bit for bit, and inverse must restore the inputs.
2. The gpt-oss-120b layer shape (E=128, H=I=2944, biases) for flashinfer_cutlass_bf16:
   converter vs the recipe run live with the real kernels, bit for bit, and a first timing
   of both against a device copy of the same bytes (CUDA events, median of 20).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import layoutc  # noqa: E402
from layoutc.cli.bench import timeit  # noqa: E402
from layoutc.algebra.dtypes import bit_view  # noqa: E402
from layoutc.reference import flashinfer_kernels as kernels, recipes  # noqa: E402
from tools.gpu.record_goldens import mxfp4_layer  # noqa: E402


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bit_view(a), bit_view(b))


def time_ms(fn, reps=20) -> float:
    return timeit(fn, "cuda", reps=reps) * 1e3


def main(golden_dir: str) -> int:
    dev = torch.device("cuda")
    failures = 0
    for path in sorted(Path(golden_dir).glob("flashinfer_*.pt")):
        data = torch.load(path)
        if "spec" not in data:
            continue  # flashinfer_dequant.pt records FlashInfer's reading, not a recipe
        for i, case in enumerate(data["cases"]):
            spec = layoutc.compile_file(ROOT / "specs" / f"{data['spec']}.lyt", case["params"])
            inputs = {k: v.to(dev) for k, v in case["inputs"].items()}
            out = spec.convert(inputs)
            ok = set(out) == set(case["outputs"]) and all(same_bits(out[k].cpu(), case["outputs"][k]) for k in out)
            back = spec.inverse(out)
            exact_back = all(same_bits(back[k], inputs[k]) for k in inputs if not k.endswith("bias"))
            print(f"{data['spec']} case {i} {case['dims']} {case['params']}: convert==recipe {ok}, inverse {exact_back}")
            failures += (not ok) + (not exact_back)

    interleave = kernels.sm90_interleave_fp4()
    spec = layoutc.compile_file(ROOT / "specs" / "flashinfer_cutlass_bf16.lyt")
    t = {k: v.to(dev) for k, v in mxfp4_layer(7, 128, 2944, 2944, bias=True).items()}
    ours = spec.convert(t)
    ref = recipes.cutlass_sm90_mxfp4_bf16(t, interleave)
    ok = all(same_bits(ours[k], ref[k]) for k in ref)
    print(f"gpt-oss-120b layer (E=128, I=H=2944): convert==recipe {ok}")
    failures += not ok
    moved = sum(v.numel() * v.element_size() for v in t.values()) + sum(v.numel() * v.element_size() for v in ours.values())
    flat = torch.cat([v.reshape(-1).view(torch.uint8) for v in t.values()])
    copy = torch.empty_like(flat)
    ms_copy = time_ms(lambda: copy.copy_(flat))
    ms_ours = time_ms(lambda: spec.convert(t))
    ms_ref = time_ms(lambda: recipes.cutlass_sm90_mxfp4_bf16(t, interleave))
    gb = moved / 1e9
    print(f"bytes read+written {gb:.3f} GB | copy {ms_copy:.3f} ms ({2 * flat.numel() / ms_copy / 1e6:.0f} GB/s)"
          f" | layoutc eager {ms_ours:.3f} ms ({gb / ms_ours * 1e3:.0f} GB/s)"
          f" | vLLM-style recipe {ms_ref:.3f} ms ({gb / ms_ref * 1e3:.0f} GB/s)")
    print("FAILURES", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
