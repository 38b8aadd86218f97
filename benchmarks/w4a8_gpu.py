"""vllm_cutlass_w4a8's fused converter on a GPU at real layer sizes: time of 10 calls back to back (and
single calls) against a device copy of the same bytes, parity with the eager lowering and with the
reference (layoutc/reference/w4a8.py, written from vLLM's code) on the device.

    python benchmarks/w4a8_gpu.py --out w4a8.jsonl [--rounds 3]

Layers: Qwen3-30B-A3B (E=128, I=768, H=2048) and DeepSeek-V3 (E=256, I=2048, H=7168), as vLLM loads
them for this backend (no padding). The reference runs at the Qwen3 layer only (its per-value scatter
needs int64 copies of every value: tens of GB at DeepSeek-V3's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LAYERS = [("qwen3-30b-a3b", {"E": 128, "I": 768, "H": 2048}, True),
          ("deepseek-v3", {"E": 256, "I": 2048, "H": 7168}, False)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dry", action="store_true", help="tiny layers (a check of the script on the CPU)")
    args = ap.parse_args()
    layers = [(n, {"E": 2, "I": 256, "H": 256}, r) for n, _, r in LAYERS] if args.dry else LAYERS
    dev = args.device

    import torch

    import layoutc
    from layoutc.cli.bench import timeit
    from layoutc.convert.synthckpt import synthetic_inputs
    from layoutc.lower.plan import plan
    from layoutc.reference import w4a8

    spec = layoutc.compile_file(ROOT / "specs" / "vllm_cutlass_w4a8.lyt", {})
    plans = {c.tensor: type(plan(c)).__name__ for c in spec.compiled.variant(()).chains}
    rows = []
    for name, dims, with_reference in layers:
        row = {"spec": "vllm_cutlass_w4a8", "layer": name, "dims": dims, "plans": plans,
               "device": torch.cuda.get_device_name() if dev == "cuda" else dev}
        x = synthetic_inputs(spec, dims, 1, dev)
        fused = spec.convert(x, fingerprint=False)
        eager = spec.convert(x, lowering="eager", fingerprint=False)
        row["fused_equals_eager"] = all(fused[k].view(torch.uint8).equal(eager[k].contiguous().view(torch.uint8))
                                        for k in eager)
        eager = None
        if with_reference:
            ref = w4a8.vllm_cutlass_w4a8(x)
            row["fused_equals_reference"] = all(fused[k].view(torch.uint8).equal(ref[k].view(torch.uint8))
                                                for k in ref)
            ref = None
        row["bytes"] = sum(t.numel() * t.element_size() for t in list(x.values()) + list(fused.values()))
        fused = None
        flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in x.values()])
        buf = torch.empty_like(flat)
        times = {"convert": [], "copy": [], "convert_b2b": [], "copy_b2b": []}
        call = lambda: spec.convert(x, fingerprint=False)  # noqa: E731
        copy = lambda: buf.copy_(flat)  # noqa: E731
        for _ in range(args.rounds):
            times["convert"].append(timeit(call, dev) * 1e3)
            times["copy"].append(timeit(copy, dev) * 1e3)
            times["convert_b2b"].append(timeit(call, dev, reps=5, calls=10) * 1e3)
            times["copy_b2b"].append(timeit(copy, dev, reps=5, calls=10) * 1e3)
        for k, v in times.items():
            row[f"{k}_ms"] = statistics.median(v)
        row["fraction_of_copy"] = row["copy_ms"] / row["convert_ms"]
        row["b2b_fraction_of_copy"] = row["copy_b2b_ms"] / row["convert_b2b_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        x = flat = buf = None
        if dev == "cuda":
            torch.cuda.empty_cache()
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
