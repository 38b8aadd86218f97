"""Fused conversion time of every shipped spec before and after a change, in one process, the two
converters timed in alternation (issues 11 and 12: no shipped spec slower after the change).

    python benchmarks/before_after.py --old .old --new . --out ba.jsonl [--rounds 5] [--variants all]
        [--dims E=32,I=2944,H=2944]

``--old`` and ``--new`` are checkouts (or ``git archive`` copies) holding layoutc/ and specs/. Each
one's layoutc compiles its own specs into standalone converter modules (a subprocess per checkout,
so the two packages never meet); this process imports the modules of both and, per spec, times
old, new, new, old, ... for ``--rounds`` rounds (each the median of 20 ``convert`` calls,
``layoutc.cli.bench.timeit``, CUDA events), on the same inputs, at the gpt-oss-120b layer (E=128,
I=H=2944), with a device copy of the same bytes timed in each round. Run-to-run drift of the
machine then falls on both sides alike. Where a spec's defaults changed its layout (AS_OLD), the
new spec is also timed with the parameters that give the old layout. No anchors: FlashInfer's JIT
builds would dominate a short run.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS = [("flashinfer_cutlass_bf16", {}), ("flashinfer_cutlass_mxfp8", {}),
            ("flashinfer_cutedsl_nvfp4", {"activation": "silu"}), ("flashinfer_cutedsl_nvfp4", {"activation": "relu2"}),
            ("flashinfer_trtllm_mxfp4", {}), ("flashinfer_cutlass_mxfp4_padded", {"checkpoint": "gpt_oss"}),
            ("flashinfer_trtllm_nvfp4", {"activation": "silu"}), ("flashinfer_cutlass_nvfp4", {"activation": "silu"}),
            ("flashinfer_trtllm_fp8_block", {}), ("flashinfer_trtllm_bf16", {"activation": "silu"})]
#: The shipped specs of engines other than FlashInfer (issue 24); --variants other / all.
OTHER_VARIANTS = [("triton_kernels_mxfp4_hopper", {}), ("triton_kernels_mxfp4_blackwell", {}), ("aiter_mxfp4", {}),
                  ("aiter_fp8_block", {}), ("deepgemm_fp8_block", {}), ("vllm_cutlass_nvfp4", {"activation": "silu"}),
                  ("marlin_mxfp4", {}), ("marlin_nvfp4", {}), ("marlin_gptq_int4", {}), ("vllm_cutlass_w4a8", {})]
#: CUTLASS W4A8 on one rank of tensor parallelism (--variants w4a8tp): the w13 weights' tiled walk at tp_size > 1.
W4A8_TP_VARIANTS = [("vllm_cutlass_w4a8", {"tp_size": t, "tp_rank": t - 1}) for t in (2, 3, 4, 8)]
DIMS = {"E": 128, "I": 2944, "H": 2944}
#: Specs timed at their own dims instead (the common dims are not shapes they accept): vLLM's CUTLASS
#: W4A8 needs H and I multiples of 256; the Qwen3-30B-A3B layer (E=128, I=768, H=2048) and the
#: DeepSeek-V3 layer (E=256, I=2048, H=7168) stand for the 20b- and 120b-like layers.
SPEC_DIMS = {"vllm_cutlass_w4a8": [{"E": 128, "I": 768, "H": 2048}, {"E": 256, "I": 2048, "H": 7168}]}
#: More layers for a spec's tensor-parallel variants (tp_size > 1), each timed where the spec's assumes accept it
#: (W4A8: I % (256*tp_size)): Qwen3-235B-A22B (E=128, I=1536, H=4096) at tp_size 2; Qwen3-30B-A3B only at 3.
TP_DIMS = {"vllm_cutlass_w4a8": [{"E": 128, "I": 1536, "H": 4096}]}
# Parameters that give a newer spec the layout of the older one, where its defaults changed it (the
# trtllm specs pad H, and I, to 256 since vLLM 0.33; at I = H = 2944, a multiple of 128, padding to
# 128 is none, as before).
AS_OLD = {"flashinfer_trtllm_mxfp4": {"pad_to": 128, "pad_hidden": 128}, "flashinfer_trtllm_nvfp4": {"pad_hidden": 128}}


def _variants(which: str) -> list:
    """``which``: flashinfer, other, all, or spec names joined by commas (their entries in either list)."""
    groups = {"flashinfer": VARIANTS, "other": OTHER_VARIANTS, "all": VARIANTS + OTHER_VARIANTS,
              "w4a8tp": W4A8_TP_VARIANTS}
    if which in groups:
        return groups[which]
    names = which.split(",")
    return [v for v in VARIANTS + OTHER_VARIANTS if v[0] in names]


def emit(root: Path, folder: Path, tag: str, which: str = "flashinfer") -> None:
    """In a subprocess: compile every variant with ``root``'s layoutc into ``folder``; a manifest."""
    sys.path.insert(0, str(root))
    import layoutc

    assert Path(layoutc.__file__).resolve().is_relative_to(root), layoutc.__file__
    manifest = []
    for i, (name, params) in enumerate(_variants(which)):
        runs = [(params, False)]
        extra = AS_OLD.get(name, {})
        if not (root / "specs" / f"{name}.lyt").is_file():  # a spec newer than the old tree: new timed alone
            manifest.append({"variant": i, "spec": name, "params": params, "as_old": False, "absent": True})
            continue
        text = (root / "specs" / f"{name}.lyt").read_text()
        if tag == "new" and extra and all(re.search(rf"^param {k}\b", text, re.MULTILINE) for k in extra):
            runs.append(({**params, **extra}, True))
        for j, (p, as_old) in enumerate(runs):
            path = folder / f"{tag}_{i}_{j}.py"
            try:
                path.write_text(layoutc.compile_file(root / "specs" / f"{name}.lyt", p).source)
                manifest.append({"variant": i, "spec": name, "params": p, "as_old": as_old, "module": str(path)})
            except Exception as err:  # noqa: BLE001 -- recorded; the other specs still run
                manifest.append({"variant": i, "spec": name, "params": p, "as_old": as_old, "error": repr(err)[:300]})
    (folder / f"{tag}.json").write_text(json.dumps(manifest))


def _host_median(fn, reps: int) -> float:
    """Median seconds until ``fn`` returns, the device idle at each start (what it launches is not
    waited for): the host's share of a call."""
    import time

    import torch

    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times)


def _load(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path)
    ap.add_argument("--new", type=Path, default=Path("."))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="flashinfer",
                    help="FlashInfer's specs (default), 'other' (the other engines', issue 24), 'all', or spec "
                    "names joined by commas; 'w4a8tp': CUTLASS W4A8 at tp_size 2, 3, 4, 8")
    ap.add_argument("--dims", default=None, help="E=..,I=..,H=.. (default: the gpt-oss-120b layer); several "
                    "separated by ';' are timed in turn")
    ap.add_argument("--host", action="store_true", help="also the host time of a warm call (the median time "
                    "until convert() returns, the device idle at each start), old and new in alternation")
    ap.add_argument("--out-arg", action="store_true", help="also the new converter writing into preallocated "
                    "outputs (convert(..., out=), issue 25), single calls and back to back")
    ap.add_argument("--emit", nargs=4, metavar=("ROOT", "FOLDER", "TAG", "WHICH"), help=argparse.SUPPRESS)
    ap.add_argument("--emitted", type=Path, default=None, help="a folder of converters emitted before (old.json, "
                    "new.json and their modules, e.g. on a CPU machine with --emit-only): no compile here")
    ap.add_argument("--emit-only", type=Path, default=None, help="emit the old and new converters into this "
                    "folder and stop (generated converters are the same bytes on every machine)")
    args = ap.parse_args()
    if args.emit:
        emit(Path(args.emit[0]).resolve(), Path(args.emit[1]), args.emit[2], args.emit[3])
        return 0
    all_dims = [dict(DIMS)] if args.dims is None else [{k: int(v) for k, v in (p.split("=") for p in one.split(","))}
                                                       for one in args.dims.split(";")]
    if args.emitted is None and args.old is None or args.out is None and args.emit_only is None:
        ap.error("--old (or --emitted) and --out are required")
    folder = args.emitted or args.emit_only or Path(tempfile.mkdtemp(prefix="before_after_"))
    if args.emitted is None:
        folder.mkdir(parents=True, exist_ok=True)
        for tag, root in (("old", args.old), ("new", args.new)):
            subprocess.run([sys.executable, __file__, "--emit", str(root.resolve()), str(folder), tag, args.variants],
                           check=True)
    if args.emit_only is not None:
        return 0
    old = {m["variant"]: m for m in json.loads((folder / "old.json").read_text())}
    new = json.loads((folder / "new.json").read_text())

    sys.path.insert(0, str(args.new.resolve()))
    import torch

    import layoutc
    from layoutc.cli.bench import timeit
    from layoutc.convert.synthckpt import synthetic_inputs

    extra_dims = []
    for ds in (*SPEC_DIMS.values(), *TP_DIMS.values()):
        extra_dims += [d for d in ds if d not in all_dims + extra_dims]
    for dims in all_dims + extra_dims:  # one process, the modules emitted once
        for entry in new:
            tp = entry["params"].get("tp_size", 1)
            own = SPEC_DIMS.get(entry["spec"], all_dims) + (TP_DIMS.get(entry["spec"], []) if tp > 1 else [])
            if dims not in own:  # SPEC_DIMS: a spec's own dims
                continue
            alone = old[entry["variant"]].get("absent", False)  # no old converter: the new one and a copy
            row = {"spec": entry["spec"], "params": entry["params"], "as_old": entry["as_old"], "dims": dims,
                   "old_params": old[entry["variant"]]["params"]}
            try:
                for side in (entry,) + (() if alone else (old[entry["variant"]],)):
                    if "error" in side:
                        raise RuntimeError(side["error"])
                spec = layoutc.compile_file(args.new / "specs" / f"{entry['spec']}.lyt", entry["params"])
                refused = [f"{a.dim} % {a.multiple}" for a in spec.program.assumptions
                           if a.multiple > 1 and dims[a.dim] % a.multiple]
                if refused:  # sizes the spec (and its engine) refuses at these parameters: no row
                    continue
                x = synthetic_inputs(spec, dims, 1, "cuda")
                converters = {"new": _load(folder / Path(entry["module"]).name)}
                if not alone:
                    converters["old"] = _load(folder / Path(old[entry["variant"]]["module"]).name)
                sides = ("new",) if alone else ("old", "new")
                outs = {tag: m.convert(x) for tag, m in converters.items()}
                # parity of the new fused converter with the eager lowering (the reference), on other values too
                x2 = synthetic_inputs(spec, dims, 2, "cuda")
                fused2, eager2 = converters["new"].convert(x2), converters["new"].convert(x2, lowering="eager")
                row["new_fused_equals_eager"] = fused2.keys() == eager2.keys() and all(
                    fused2[k].shape == eager2[k].shape
                    and fused2[k].view(torch.uint8).equal(eager2[k].view(torch.uint8))
                    for k in fused2)
                x2 = fused2 = eager2 = None
                # One rank's shard reads 1/tp_size of every input (each input is sharded evenly): those bytes, and a
                # copy of as many bytes.
                inputs = sum(t.numel() * t.element_size() for t in x.values()) // tp
                for tag, out in outs.items():
                    row[f"{tag}_bytes"] = inputs + sum(t.numel() * t.element_size() for t in out.values())
                row["same_output"] = alone or outs["old"].keys() == outs["new"].keys() and all(
                    outs["old"][k].view(torch.uint8).equal(outs["new"][k].view(torch.uint8))
                    if outs["old"][k].shape == outs["new"][k].shape else False for k in outs["old"])
                outs = None
                flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in x.values()])[:inputs]
                buf = torch.empty_like(flat)
                times = {"old": [], "new": [], "copy": [], "new_fingerprinted": []}
                # The new converters fingerprint their outputs by default (the guard follows copies: one more
                # read of the outputs); the conversion is compared with fingerprint=False, the default timed apart.
                takes_fp = {tag: "fingerprint" in inspect.signature(m.convert).parameters
                            for tag, m in converters.items()}
                calls = {tag: (lambda m=m: m.convert(x, fingerprint=False)) if takes_fp[tag]
                         else (lambda m=m: m.convert(x))
                         for tag, m in converters.items()}
                calls["new_fingerprinted"] = lambda: converters["new"].convert(x)
                # The default call (what an engine calls) of both sides where both fingerprint: single and b2b.
                fped = [t for t in ("old", "new") if t in sides and takes_fp[t]]
                for tag in fped:
                    calls[f"{tag}_fingerprinted"] = lambda m=converters[tag]: m.convert(x)
                    times.update({f"{tag}_fingerprinted": [], f"{tag}_fingerprinted_b2b": []})
                times.update(old_b2b=[], new_b2b=[], copy_b2b=[])
                outs_of = []  # the tags timed with out= too: new, and old where its convert takes out=
                if args.out_arg:  # the outputs preallocated by the caller: no allocation in the call
                    o = {k: torch.empty_like(v) for k, v in converters["new"].convert(x, fingerprint=False).items()}
                    calls["new_out"] = lambda: converters["new"].convert(x, fingerprint=False, out=o)
                    times.update(new_out=[], new_out_b2b=[])
                    outs_of.append("new_out")
                    if not alone and "out" in inspect.signature(converters["old"].convert).parameters:
                        # the old converter's own output shapes (an AS_OLD row's old layout is another one)
                        o_old = {k: torch.empty_like(v)
                                 for k, v in converters["old"].convert(x, fingerprint=False).items()}
                        calls["old_out"] = lambda: converters["old"].convert(x, fingerprint=False, out=o_old)
                        times.update(old_out=[], old_out_b2b=[])
                        outs_of.append("old_out")
                for r in range(args.rounds):
                    for tag in (sides if r % 2 == 0 else sides[::-1]):
                        times[tag].append(timeit(calls[tag], "cuda") * 1e3)
                        times[f"{tag}_b2b"].append(timeit(calls[tag], "cuda", reps=5, calls=10) * 1e3)
                    for tag in (fped if r % 2 == 0 else fped[::-1]):
                        times[f"{tag}_fingerprinted"].append(timeit(calls[f"{tag}_fingerprinted"], "cuda") * 1e3)
                        times[f"{tag}_fingerprinted_b2b"].append(
                            timeit(calls[f"{tag}_fingerprinted"], "cuda", reps=5, calls=10) * 1e3)
                    for tag in (outs_of if r % 2 == 0 else outs_of[::-1]):
                        times[tag].append(timeit(calls[tag], "cuda") * 1e3)
                        times[f"{tag}_b2b"].append(timeit(calls[tag], "cuda", reps=5, calls=10) * 1e3)
                    times["copy"].append(timeit(lambda: buf.copy_(flat), "cuda") * 1e3)
                    times["copy_b2b"].append(timeit(lambda: buf.copy_(flat), "cuda", reps=5, calls=10) * 1e3)
                if args.host and not alone:  # issue 25: the host's share of a warm call, before and after, fingerprint
                    # on and off
                    host = {"old": [], "new": [], "old_fingerprinted": [], "new_fingerprinted": []}
                    calls["old_fingerprinted"] = lambda: converters["old"].convert(x)
                    host.update({k: [] for k in outs_of})
                    for r in range(args.rounds):
                        for tag in (("old", "new") if r % 2 == 0 else ("new", "old")):
                            for k in (tag, f"{tag}_fingerprinted") + ((f"{tag}_out",) if f"{tag}_out" in outs_of
                                                                      else ()):
                                host[k].append(_host_median(calls[k], 100) * 1e6)
                    for k, v in host.items():
                        row[f"host_{k}_us"] = statistics.median(v)
                for tag in fped:  # the default call, fingerprint included, as a fraction of the copy too
                    for kind, copy in (("", "copy"), ("_b2b", "copy_b2b")):
                        ms = row[f"{tag}_fingerprinted{kind}_median_ms"] = statistics.median(
                            times[f"{tag}_fingerprinted{kind}"])
                        row[f"{tag}_fingerprinted{kind}_fraction_of_copy"] = (row[f"{tag}_bytes"] / ms) / (
                            2 * flat.numel() / statistics.median(times[copy]))
                row.update({f"{k}_ms": v for k, v in times.items()})
                if args.out_arg:
                    outs = converters["new"].convert(x, fingerprint=False, out=o)
                    row["new_out_same_output"] = all(outs[k].view(torch.uint8).equal(converters["new"].convert(
                        x, fingerprint=False)[k].view(torch.uint8)) for k in outs)
                    if "old_out" in outs_of:
                        got = converters["old"].convert(x, fingerprint=False, out=o_old)
                        row["old_out_same_output"] = all(got[k].view(torch.uint8).equal(o[k].view(torch.uint8))
                                                         if got[k].shape == o[k].shape else False for k in got)
                    o = o_old = outs = got = None
                for tag in (*sides, *outs_of):
                    row.setdefault(f"{tag}_bytes", row["new_bytes"])
                    row[f"{tag}_median_ms"] = statistics.median(times[tag])
                    row[f"{tag}_fraction_of_copy"] = (row[f"{tag}_bytes"] / row[f"{tag}_median_ms"]) / (
                        2 * flat.numel() / statistics.median(times["copy"]))
                    row[f"{tag}_b2b_median_ms"] = statistics.median(times[f"{tag}_b2b"])
                    row[f"{tag}_b2b_fraction_of_copy"] = (row[f"{tag}_bytes"] / row[f"{tag}_b2b_median_ms"]) / (
                        2 * flat.numel() / statistics.median(times["copy_b2b"]))
                if not alone:
                    row["new_over_old"] = row["new_median_ms"] / row["old_median_ms"]
            except Exception as err:  # noqa: BLE001 -- recorded; the other specs still run
                row["error"] = repr(err)[:300]
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            x = flat = buf = converters = None
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
