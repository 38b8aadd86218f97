"""How a layer kernel should copy the tensors a spec leaves as they are (issues 11 and 15).

    python benchmarks/copy_sweep.py --old .old --out sweep.jsonl

For the specs with a tensor copied as is, at the gpt-oss-20b and -120b layers: the converter
compiled with several bytes per program of the copy body (triton_emit.COPY_BYTES), and with large
copies taken out of the layer kernel and done by torch (runtime._COPY_APART_BYTES), each timed in
alternation with the old checkout's converter (``--old``, via before_after.py's emit) in one
process: median of 20 calls per round (single calls, host time included) and of 10 calls back to
back, five rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import layoutc  # noqa: E402
from layoutc.cli.bench import timeit  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.lower import triton_emit  # noqa: E402

from benchmarks.before_after import VARIANTS, _load  # noqa: E402

SPECS = [("flashinfer_cutedsl_nvfp4", {"activation": "relu2"}), ("flashinfer_cutedsl_nvfp4", {"activation": "silu"}),
         ("flashinfer_cutlass_mxfp8", {})]
SHAPES = {"gpt-oss-20b": {"E": 32, "I": 2944, "H": 2944}, "gpt-oss-120b": {"E": 128, "I": 2944, "H": 2944}}
CONFIGS = [(2048, None), (8192, None), (32768, None), (8192, 1 << 20)]  # (COPY_BYTES, copy apart from bytes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="copy_sweep_"))
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "before_after.py"), "--emit", str(args.old.resolve()),
                    str(folder), "old"], check=True)
    old = {m["variant"]: m for m in json.loads((folder / "old.json").read_text())}
    default = triton_emit.COPY_BYTES
    for name, params in SPECS:
        text = (ROOT / "specs" / f"{name}.lyt").read_text()
        converters = {"old": _load(old[VARIANTS.index((name, params))]["module"])}
        for copy_bytes, apart in CONFIGS:
            triton_emit.COPY_BYTES = copy_bytes
            spec = layoutc.compile_source(text + f"\n# sweep {copy_bytes} {apart}\n", f"{name}_{copy_bytes}.lyt", params)
            spec.module._COPY_APART_BYTES = apart if apart is not None else 1 << 62
            converters[f"copy {copy_bytes} B/program" + (", large copies by torch" if apart else "")] = spec.module
        triton_emit.COPY_BYTES = default
        for shape, dims in SHAPES.items():
            spec = layoutc.compile_file(ROOT / "specs" / f"{name}.lyt", params)
            x = synthetic_inputs(spec, dims, 1, "cuda")
            ref = converters["old"].convert(x)
            same = {tag: all(m.convert(x)[k].view(torch.uint8).equal(ref[k].view(torch.uint8)) for k in ref)
                    for tag, m in converters.items()}
            ref = None
            times = {tag: [] for tag in converters}
            b2b = {tag: [] for tag in converters}
            for r in range(args.rounds):
                order = list(converters) if r % 2 == 0 else list(reversed(converters))
                for tag in order:
                    fn = lambda m=converters[tag]: m.convert(x)  # noqa: E731
                    times[tag].append(timeit(fn, "cuda") * 1e3)
                    b2b[tag].append(timeit(fn, "cuda", reps=5, calls=10) * 1e3)
            for tag in converters:
                row = {"spec": name, "params": params, "shape": shape, "config": tag, "same_as_old": same[tag],
                       "ms": statistics.median(times[tag]), "b2b_ms": statistics.median(b2b[tag]),
                       "rounds_ms": times[tag]}
                print(f"{name[11:]:18s} {str(params):24s} {shape:13s} {tag:42s} {row['ms']:7.3f} ms  "
                      f"b2b {row['b2b_ms']:7.3f} ms  same {same[tag]}", flush=True)
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
            x = None
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
