"""Where a layer kernel's time goes: each tensor's body timed alone (issue 15).

    python benchmarks/layer_split.py [--spec flashinfer_trtllm_mxfp4] [-D k=v ...] [--out split.jsonl]

The generated layer kernel runs tensor i's body on programs [G0 + ... + G(i-1), ... + Gi). Here the
converter's launch (runtime._launch) is wrapped so that every body but one gets no programs: the
call then runs that body alone (allocations and any copy done apart included), timed like
``layoutc bench`` (median of 20, CUDA events) and back to back, against a device copy of the
tensor's own bytes (read + written) in the same process. The whole layer is timed the same way.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import layoutc  # noqa: E402
from layoutc.cli.bench import timeit  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default="flashinfer_trtllm_mxfp4")
    ap.add_argument("-D", dest="defines", action="append", default=[])
    ap.add_argument("--dims", default="E=128,I=2944,H=2944")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fingerprint", action="store_true", help="time convert() with its default fingerprint of "
                    "the outputs (a pass of its own over them); by default the conversion alone")
    args = ap.parse_args()
    params = dict(d.split("=", 1) for d in args.defines)
    dims = {k: int(v) for k, v in (p.split("=") for p in args.dims.split(","))}
    spec = layoutc.compile_file(ROOT / "specs" / f"{args.spec}.lyt", params)
    m = spec.module
    # Large plain copies are done by torch before the launch, outside any body: here they stay in
    # the kernel, so each is timed as its own body (the whole layer then differs from `bench`).
    m._COPY_APART_BYTES = 1 << 62
    x = synthetic_inputs(spec, dims, 1, "cuda")
    present = set(spec.convert(x))
    # The bodies' order: the launcher's comment of the variant that converts these tensors.
    names = next(line.split(", ") for line in re.findall(r"# One launch converts (.*)\.", spec.source)
                 if set(line.split(", ")) == present)
    launch = m._launch
    only = {"body": None}

    def one_body(kernel, programs, largs, consts, num_warps):
        if only["body"] is None:
            return launch(kernel, programs, largs, consts, num_warps)
        i = only["body"]
        c = {k: (0 if k.startswith("_G") and k != f"_G{i}" else v) for k, v in consts.items()}
        return launch(kernel, consts[f"_G{i}"], largs, c, num_warps) if consts[f"_G{i}"] else None

    m._launch = one_body
    # Warm calls would take the prepared launch (runtime._prepare), which replays the whole layer's
    # launch without coming here: keep every call on the path that launches through _launch.
    m._prepare = lambda *a: None
    getattr(m, "_PREPARED", {}).clear()  # the call above prepared one
    rows = []

    def measure(what, moved):
        flat = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
        buf = torch.empty_like(flat)
        conv = timeit(lambda: spec.convert(x, fingerprint=args.fingerprint), "cuda")
        copy = timeit(lambda: buf.copy_(flat), "cuda")
        conv10 = timeit(lambda: spec.convert(x, fingerprint=args.fingerprint), "cuda", reps=5, calls=10)
        copy10 = timeit(lambda: buf.copy_(flat), "cuda", reps=5, calls=10)
        row = {"spec": args.spec, "params": params, "dims": dims, "part": what, "bytes": moved, "ms": conv * 1e3,
               "copy_ms": copy * 1e3, "fraction_of_copy": copy / conv, "b2b_ms": conv10 * 1e3,
               "fraction_of_copy_b2b": copy10 / conv10}
        rows.append(row)
        print(f"{what:24s} {moved / 1e6:10.1f} MB  {conv * 1e3:7.3f} ms  {copy / conv:6.1%} of copy  "
              f"| back to back {conv10 * 1e3:7.3f} ms {copy10 / conv10:6.1%}", flush=True)

    out = spec.convert(x)
    total = sum(t.numel() * t.element_size() for t in list(x.values()) + list(out.values()) if t is not None)
    measure("whole layer", total)
    for i, name in enumerate(names):
        only["body"] = i
        moved = x[name].numel() * x[name].element_size() + out[name].numel() * out[name].element_size()
        measure(name, moved)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
