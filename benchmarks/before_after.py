"""Fused conversion time of every shipped spec with one checkout's layoutc, for a before/after in one
run (issues 11 and 12: no shipped spec slower after the change).

    python benchmarks/before_after.py --root .old --tag old --out ba.jsonl
    python benchmarks/before_after.py --root .    --tag new --out ba.jsonl

``--root`` is a checkout (or `git archive` of one) holding layoutc/ and specs/; its layoutc is
imported, its specs are compiled. Each line: the spec, its bytes read + written, the median of 20
``convert`` calls (``layoutc.bench.timeit``, CUDA events) (default lowering on CUDA) and a device copy of the same bytes,
measured in the same process at the gpt-oss-120b layer (E=128, I=H=2944). No anchors: FlashInfer's
JIT builds would dominate a short run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VARIANTS = [("flashinfer_cutlass_bf16", {}), ("flashinfer_cutlass_mxfp8", {}),
            ("flashinfer_cutedsl_nvfp4", {"activation": "silu"}), ("flashinfer_cutedsl_nvfp4", {"activation": "relu2"}),
            ("flashinfer_trtllm_mxfp4", {}), ("flashinfer_cutlass_mxfp4_padded", {"checkpoint": "gpt_oss"}),
            ("flashinfer_trtllm_nvfp4", {"activation": "silu"}), ("flashinfer_cutlass_nvfp4", {"activation": "silu"}),
            ("flashinfer_trtllm_fp8_block", {}), ("flashinfer_trtllm_bf16", {"activation": "silu"})]
DIMS = {"E": 128, "I": 2944, "H": 2944}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    root = args.root.resolve()
    sys.path.insert(0, str(root))
    import torch

    import layoutc
    from layoutc.bench import timeit  # in the old checkout too: the same timing as gpu_bench
    from layoutc.demo import synthetic_inputs

    assert Path(layoutc.__file__).resolve().is_relative_to(root), layoutc.__file__
    for name, params in VARIANTS:
        try:
            spec = layoutc.compile_file(root / "specs" / f"{name}.lyt", params)
            x = synthetic_inputs(spec, DIMS, 1, "cuda")
            out = spec.convert(x)
            moved = sum(t.numel() * t.element_size() for t in list(x.values()) + list(out.values()))
            flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in x.values()])
            buf = torch.empty_like(flat)
            conv = timeit(lambda: spec.convert(x), "cuda") * 1e3
            copy = timeit(lambda: buf.copy_(flat), "cuda") * 1e3
            row = {"tag": args.tag, "spec": name, "params": params, "dims": DIMS, "bytes": moved, "convert_ms": conv,
                   "copy_ms": copy, "fraction_of_copy": (moved / conv) / (2 * flat.numel() / copy)}
        except Exception as err:  # noqa: BLE001 -- recorded; the other specs still run
            row = {"tag": args.tag, "spec": name, "params": params, "error": repr(err)[:300]}
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        x = out = flat = buf = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
