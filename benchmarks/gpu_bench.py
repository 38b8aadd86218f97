"""GPU session for the fused lowering: parity with FlashInfer's kernels, a block-size sweep, benchmarks.

    python benchmarks/gpu_bench.py OUT_DIR [parity] [bench] [--quick] [--new]

parity  fused (Triton) == eager (torch on CUDA) == the vLLM-style recipe with FlashInfer's real
        CUDA kernels, bit for bit, for every shipped spec at several shapes including the
        gpt-oss-120b layer; and the recorded goldens
bench   `layoutc bench` for every shipped spec at model shapes; JSON lines to OUT_DIR/bench.jsonl
        and a Markdown table to OUT_DIR/bench.md; guard overhead on CUDA
--new   the issue-7 backends (TRT-LLM and padded CUTLASS layouts) instead of the seed specs
--all   the seed specs and the issue-7 backends: every shipped spec
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import layoutc  # noqa: E402
import layoutc.guard as guard  # noqa: E402
from layoutc import reference  # noqa: E402
from layoutc.cli.bench import bench, report, timeit  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.algebra.dtypes import bit_view  # noqa: E402

SPECS = ROOT / "specs"
VARIANTS = [("flashinfer_cutlass_bf16", {}), ("flashinfer_cutlass_mxfp8", {}),
            ("flashinfer_cutedsl_nvfp4", {"activation": "silu"}), ("flashinfer_cutedsl_nvfp4", {"activation": "relu2"})]
NEW_VARIANTS = [("flashinfer_trtllm_mxfp4", {}), ("flashinfer_cutlass_mxfp4_padded", {"checkpoint": "gpt_oss"}),
                ("flashinfer_trtllm_nvfp4", {"activation": "silu"}), ("flashinfer_cutlass_nvfp4", {"activation": "silu"}),
                ("flashinfer_trtllm_fp8_block", {}), ("flashinfer_trtllm_bf16", {"activation": "silu"})]
MODELS = {  # (E, I, H); gpt-oss sizes padded to multiples of 128 as vLLM does for these backends
    "gpt-oss-20b": {"E": 32, "I": 2944, "H": 2944},
    "gpt-oss-120b": {"E": 128, "I": 2944, "H": 2944},
    "deepseek-v3": {"E": 256, "I": 2048, "H": 7168},
}


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype
                                    and torch.equal(bit_view(a[k]), bit_view(b[k])) for k in a)


def parity(log, variants=VARIANTS) -> int:
    failures = 0
    kernels, note = reference.kernels_for("cuda")
    shapes = [{"E": 2, "I": 128, "H": 128}, {"E": 3, "I": 384, "H": 256}, {"E": 8, "I": 1024, "H": 512},
              MODELS["gpt-oss-120b"]]
    for name, params in variants:
        spec = layoutc.compile_file(SPECS / f"{name}.lyt", params)
        for dims in shapes:
            x = synthetic_inputs(spec, dims, 1, "cuda")
            fused = spec.convert(x, lowering="fused")
            eager = spec.convert(x, lowering="eager")
            anchor = reference.anchor(name, x, params, kernels)
            # A second call of the same shapes launches the compiled kernel directly (runtime._launch):
            # other values, checked against the eager lowering too.
            x2 = synthetic_inputs(spec, dims, 2, "cuda")
            warm = same(spec.convert(x2, lowering="fused"), spec.convert(x2, lowering="eager"))
            ok = same(fused, eager) and same(fused, anchor) and warm
            failures += not ok
            log(f"parity {name} {params} {dims}: fused==eager {same(fused, eager)}, fused==FlashInfer recipe "
                f"{same(fused, anchor)}, warm call==eager {warm}")
            del x, x2, fused, eager, anchor
            torch.cuda.empty_cache()
    for path in sorted((ROOT / "tests" / "goldens").glob("flashinfer_*.pt")):
        data = torch.load(path)
        if "spec" not in data:
            continue  # not a recipe golden (flashinfer_dequant.pt: FlashInfer's reading, checked on CPU)
        for case in data["cases"]:
            spec = layoutc.compile_file(SPECS / f"{data['spec']}.lyt", case["params"])
            out = spec.convert({k: v.cuda() for k, v in case["inputs"].items()}, lowering="fused")
            ok = same({k: v.cpu() for k, v in out.items()}, case["outputs"])
            failures += not ok
            log(f"golden {data['spec']} {case['dims']} {case['params']}: fused==recorded kernel output {ok}")
    return failures


def sweep(log) -> None:
    """SM90 words kernel: lanes per program and warps, whole bf16 converter on the gpt-oss-120b layer."""
    from layoutc.lower import triton_emit

    dims = MODELS["gpt-oss-120b"]
    text = (SPECS / "flashinfer_cutlass_bf16.lyt").read_text()
    defaults = triton_emit.BLOCK_QUADS, triton_emit.NUM_WARPS
    for quads, warps in [(256, 4), (512, 4), (1024, 4), (1024, 8), (2048, 8), (4096, 16)]:
        triton_emit.BLOCK_QUADS, triton_emit.NUM_WARPS = quads, warps
        spec = layoutc.compile_source(text + f"\n# sweep {quads} {warps}\n", f"sweep_{quads}_{warps}.lyt")
        x = synthetic_inputs(spec, dims, 2, "cuda")
        moved = sum(v.numel() * v.element_size() for v in x.values()) * 2
        t = timeit(lambda: spec.convert(x, lowering="fused"), "cuda", reps=20)
        log(f"sweep BLOCK_QUADS={quads} num_warps={warps}: {t * 1e3:.3f} ms ({moved / t / 1e9:.0f} GB/s approx)")
        x = None  # free before the next size
        torch.cuda.empty_cache()
    triton_emit.BLOCK_QUADS, triton_emit.NUM_WARPS = defaults


def benches(out_dir: Path, log, quick: bool, only: str | None = None, variants=VARIANTS) -> None:
    rows = []
    models = {"gpt-oss-120b": MODELS["gpt-oss-120b"]} if quick else MODELS
    for name, params in variants:
        if only and name != only:
            continue
        spec = layoutc.compile_file(SPECS / f"{name}.lyt", params)
        for model, dims in models.items():
            t0 = time.time()
            r = bench(spec, dims, "cuda", "auto", reps=20, eager=(model == "gpt-oss-120b"))
            r["model"] = model
            log(report(r) + f"\n  ({time.time() - t0:.0f} s)")
            with open(out_dir / "bench.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")
            rows.append(r)
            torch.cuda.empty_cache()
    with open(out_dir / "bench.md", "w") as f:
        f.write("| spec | params | model | GB moved | copy GB/s | layoutc ms | GB/s | % of copy | 10 back to back: ms, % "
                "of copy | anchor ms | speed-up | peak extra (default / chunk=1 / inplace) | anchor peak extra |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            moved = (r["bytes_read"] + r["bytes_written"]) / 1e9
            f.write(f"| {r['spec']} | {r['params'] or ''} | {r['model']} | {moved:.2f} | {r['copy_GBps']:.0f} | "
                    f"{r['convert_s'] * 1e3:.3f} | {r['convert_GBps']:.0f} | {r['fraction_of_copy']:.0%} | "
                    f"{r['convert_b2b_s'] * 1e3:.3f}, {r['fraction_of_copy_b2b']:.0%} | "
                    f"{r.get('anchor_s', float('nan')) * 1e3:.3f} | {r.get('speedup', float('nan')):.1f}x | "
                    f"{r['peak_extra_vs_outputs']:.2f} / {r['peak_extra_vs_outputs_chunk1']:.2f} / "
                    f"{r['peak_extra_vs_outputs_inplace']:.2f} | {r.get('anchor_peak_extra_vs_outputs', float('nan')):.2f} |\n")
    spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
    x = synthetic_inputs(spec, MODELS["gpt-oss-120b"], 3, "cuda")
    out = spec.convert(x)
    t_conv = timeit(lambda: spec.convert(x), "cuda", reps=10)
    t_guard = timeit(lambda: guard.check(out, spec), "cuda", reps=200)
    log(f"guard on cuda (gpt-oss-120b layer): guard.check {t_guard * 1e6:.1f} us vs convert {t_conv * 1e3:.3f} ms "
        f"({t_guard / t_conv:.1e} of a conversion)")


def main() -> int:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    what = set(sys.argv[2:]) or {"parity", "bench"}
    logf = open(out_dir / "gpu_bench.log", "a")

    def log(msg: str) -> None:
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, layoutc {layoutc.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}")
    failures = 0
    variants = VARIANTS + NEW_VARIANTS if "--all" in what else NEW_VARIANTS if "--new" in what else VARIANTS
    if "parity" in what:
        failures += parity(log, variants)
    if "sweep" in what:
        sweep(log)
    if "bench" in what:
        benches(out_dir, log, "--quick" in what, variants=variants)
    if "bench-bf16" in what:
        benches(out_dir, log, False, "flashinfer_cutlass_bf16")
    log(f"FAILURES {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
