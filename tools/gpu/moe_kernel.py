"""FlashInfer's SM90 CUTLASS fused MoE computing with weights converted by layoutc (issue 14).

    python tools/gpu/moe_kernel.py OUT_DIR [--deadline EPOCH_SECONDS] [--jobs 16]

On an H200 (SM90): builds the trimmed W4A16 module (tools/gpu/moe_sm90/build.py), then for a small
layer and a gpt-oss-shaped one (MXFP4 weights, BF16 activations, biases, gpt-oss SwiGLU):
  1. quantizes deterministic bf16 weights with layoutc.reference.quant.quantize_mxfp4 into vLLM checkpoint
     tensors, converts them with specs/flashinfer_cutlass_bf16.lyt on CUDA, checks the bytes
     against FlashInfer's own helpers, and runs flashinfer.fused_moe.cutlass_fused_moe on them;
  2. compares with a float32 reference decoded from the checkpoint tensors
     (tools/gpu/moe_sm90/reference.py);
  3. feeds three wrong conversions to the kernel: (a) w13 scales not swapped with the weights,
     (b) weights not interleaved (scales still folded; vLLM PR 46915), (c) scales folded with a
     K block of 2 scale columns instead of 4 -- after checking that layoutc.guard.check rejects
     each of them, and that the verifier rejects the spec text of each mistake
     (tools/gpu/moe_sm90/mutants/*.lyt).
Writes OUT_DIR/moe_kernel.json (every number below, written again after each stage),
OUT_DIR/flashinfer_cutlass_moe_sm90.pt (the small layer's golden, for tests/reference/test_moe_kernel.py;
copy it to tests/goldens/) and OUT_DIR/trimmed_out_symbols.txt. Exit status 0 only when the
kernel ran and matched the reference; 3 when there was no module (the deadline stopped the build,
or it failed, and no --prebuilt module loaded; run again: ninja resumes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import layoutc
import layoutc.guard
from layoutc.reference.quant import quantize_mxfp4, routing
from tools.gpu.moe_sm90 import build as moe_build
from tools.gpu.moe_sm90.reference import ATOL_RMS, GPT_OSS, RTOL, compare, moe_forward_gptoss

SPEC = ROOT / "specs" / "flashinfer_cutlass_bf16.lyt"
MUTANTS = ROOT / "tools" / "gpu" / "moe_sm90" / "mutants"
GOLDEN = "flashinfer_cutlass_moe_sm90.pt"
# H = I = 2944 (gpt-oss's 2880 rounded up to 128, as vLLM pads it for this backend) meets every
# alignment this path has: the binding's hidden/inter % 16 (128-bit TMA rows of 4-bit weights),
# the mixed GEMM's K % 128 (FAST_BUILD tile K), the scale fold's rows % 64 and (K/32) % 4, the
# FP4 interleave's rows % 16 and K % 64.
LAYERS = {
    "small": {"E": 4, "H": 256, "I": 256, "T": 16, "topk": 2, "seed": 14},
    "gptoss": {"E": 32, "H": 2944, "I": 2944, "T": 128, "topk": 4, "seed": 15},
}
RUN_RESERVE_S = 150  # seconds the kernel stage needs after the build (measured below, see the log)
T0 = time.time()


def log(msg: str) -> None:
    print(f"[moe_kernel +{time.time() - T0:6.1f}s] {msg}", flush=True)


class Results:
    def __init__(self, out: Path):
        self.path = out / "moe_kernel.json"
        self.data: dict = {"stages": {}, "errors": []}

    def stage(self, name: str, value) -> None:
        self.data["stages"][name] = value
        self.save()

    def error(self, where: str, err: BaseException) -> None:
        self.data["errors"].append({"where": where, "error": f"{type(err).__name__}: {err}",
                                    "traceback": traceback.format_exc()[-3000:]})
        log(f"ERROR in {where}: {type(err).__name__}: {err}")
        self.save()

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.time() - T0, 1)
        self.path.write_text(json.dumps(self.data, indent=2, default=str))


def meta() -> dict:
    import flashinfer

    return {"flashinfer": flashinfer.__version__, "torch": str(torch.__version__),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "date": datetime.date.today().isoformat(), "recorded_by": "tools/gpu/moe_kernel.py",
            "spec_sha256": layoutc.compile_file(SPEC).sha256}


# --- the layer ---------------------------------------------------------------------------------

def make_layer(dims: dict, quantize_on: str = "cpu") -> dict:
    """Deterministic (CPU generator) bf16 weights quantized with layoutc's quantizer into vLLM's
    checkpoint tensors, bf16 activations and softmax-top-k routing. Experts are drawn and
    quantized one at a time (the quantizer's E2M1 search holds 8 floats per weight);
    ``quantize_on="cuda"`` runs the quantizer there (same code) for the large layer."""
    g = torch.Generator().manual_seed(dims["seed"])
    e, h, i, t = dims["E"], dims["H"], dims["I"], dims["T"]

    def experts(rows: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        # std 2/sqrt(K): GEMM outputs of a few units, so gpt-oss's clamp at 7 is reached but rare
        packed = [quantize_mxfp4((torch.randn(rows, k, generator=g) * (2 / k ** 0.5)).bfloat16().to(quantize_on))
                  for _ in range(e)]
        return torch.stack([q for q, _ in packed]).cpu(), torch.stack([s for _, s in packed]).cpu()

    q13, s13 = experts(2 * i, h)  # rows [w1; w3] = [gate; up]
    q2, s2 = experts(h, i)
    ckpt = {"w13_weight": q13, "w13_weight_scale": s13, "w13_bias": torch.randn(e, 2 * i, generator=g) * 0.1,
            "w2_weight": q2, "w2_weight_scale": s2, "w2_bias": torch.randn(e, h, generator=g) * 0.1}
    x = torch.randn(t, h, generator=g).bfloat16()
    ids, weights = routing(t, e, dims["topk"], dims["seed"])
    return {"ckpt": ckpt, "x": x, "topk_ids": ids, "topk_weights": weights}


def fold_scales(s: torch.Tensor, groups: int) -> torch.Tensor:
    """The SM90 scale fold [E, R, K/32] -> [E, R/64, K/128, 16, 16] with a K block of ``groups``
    scale columns: out[e, rb, :] holds rows (64rb + F*ms + f) and columns (groups*kb + g) in the
    order (kb, f, ms, g), F = 16*groups/4. groups = 4 is FlashInfer's
    interleave_moe_scales_for_sm90_mixed_gemm for E8M0 (asserted in check_bytes); groups = 2 is
    mistake (c)."""
    e, r, c = s.shape
    f = 16 * groups // 4
    return s.reshape(e, r // 64, 64 // f, f, c // groups, groups).permute(0, 1, 4, 3, 2, 5).reshape(
        e, r // 64, c // 4, 16, 16)


def swap_w13(t: torch.Tensor) -> torch.Tensor:
    """rows [w1; w3] -> [w3; w1] (the kernel's gated epilogue reads the up projection first)."""
    i = t.shape[1] // 2
    return torch.cat([t[:, i:], t[:, :i]], dim=1)


def check_bytes(conv: dict, ckpt_cuda: dict) -> dict:
    """layoutc's output against FlashInfer's own helpers (the W4A16 test's recipe): the weight
    interleave runs the module's interleave_fp4_weights_for_sm90_mixed_gemm kernel."""
    from flashinfer.fused_moe import interleave_moe_scales_for_sm90_mixed_gemm as fi_scales
    from flashinfer.fused_moe import interleave_moe_weights_for_sm90_mixed_gemm as fi_weights

    want = {
        "w13_weight": fi_weights(swap_w13(ckpt_cuda["w13_weight"]).contiguous(), "fp4"),
        "w13_weight_scale": fi_scales(swap_w13(ckpt_cuda["w13_weight_scale"]).contiguous()),
        "w13_bias": swap_w13(ckpt_cuda["w13_bias"]).bfloat16(),
        "w2_weight": fi_weights(ckpt_cuda["w2_weight"].contiguous(), "fp4"),
        "w2_weight_scale": fi_scales(ckpt_cuda["w2_weight_scale"].contiguous()),
        "w2_bias": ckpt_cuda["w2_bias"].bfloat16(),
    }
    res = {k: bool(torch.equal(conv[k], v)) for k, v in want.items()}
    res["fold_scales(groups=4) == FlashInfer fold"] = bool(
        torch.equal(fold_scales(swap_w13(ckpt_cuda["w13_weight_scale"]), 4), want["w13_weight_scale"])
        and torch.equal(fold_scales(ckpt_cuda["w2_weight_scale"], 4), want["w2_weight_scale"]))
    return res


def run_kernel(conv: dict, layer: dict) -> torch.Tensor:
    """The call vLLM's SM90_FI_MXFP4_BF16 backend makes (vllm/model_executor/layers/quantization/
    mxfp4.py, apply): bf16 input, int32 expert ids, f32 router weights, uint8 FP4 weights,
    quant_scales = [w13 scales, w2 scales] as E8M0 bytes viewed as int32 (FlashInfer's
    test_moe_bf16_mxfp4 does the same; the binding only reads data_ptr, QuantParams::GroupWise with
    group size 32), bf16 biases, per-expert f32 swiglu_alpha/beta/limit (gpt-oss 1.702, 1.0, 7.0:
    SwigluBias), use_w4_group_scaling=True (isWFP4A16Quant: bf16 activations x uint8 weights), no
    profile_ids (the runner's default tactic)."""
    from flashinfer.fused_moe import cutlass_fused_moe

    dev = conv["w13_weight"].device
    e = conv["w13_weight"].shape[0]
    x = layer["x"].to(dev)
    out = torch.empty(x.shape[0], conv["w2_weight"].shape[1], dtype=torch.bfloat16, device=dev)
    per_expert = lambda v: torch.full((e,), v, dtype=torch.float32, device=dev)
    cutlass_fused_moe(
        input=x,
        token_selected_experts=layer["topk_ids"].to(dev, torch.int32).contiguous(),
        token_final_scales=layer["topk_weights"].to(dev, torch.float32).contiguous(),
        fc1_expert_weights=conv["w13_weight"],
        fc2_expert_weights=conv["w2_weight"],
        output_dtype=torch.bfloat16,
        quant_scales=[conv["w13_weight_scale"].view(torch.int32), conv["w2_weight_scale"].view(torch.int32)],
        fc1_expert_biases=conv["w13_bias"],
        fc2_expert_biases=conv["w2_bias"],
        swiglu_alpha=per_expert(GPT_OSS["alpha"]),
        swiglu_beta=per_expert(GPT_OSS["beta"]),
        swiglu_limit=per_expert(GPT_OSS["limit"]),
        use_w4_group_scaling=True,
        output=out,
    )
    torch.cuda.synchronize()
    return out


# --- the three mistakes, as in-place edits of a fresh conversion --------------------------------

def mistake(name: str, conv: dict, ckpt_cuda: dict) -> str:
    """Edit the converter's output in place into mistake ``name``; returns how. In-place edits bump
    torch's version counter, which is what layoutc.guard.check looks at."""
    if name == "a_scales_not_swapped":
        # weights [w3; w1] as converted, scales folded from the checkpoint's unswapped [w1; w3] rows
        conv["w13_weight_scale"].copy_(fold_scales(ckpt_cuda["w13_weight_scale"], 4))
        return "w13_weight_scale <- fold(checkpoint scales, rows [w1; w3], groups=4); weights as converted ([w3; w1])"
    if name == "b_weights_not_interleaved":
        conv["w13_weight"].copy_(swap_w13(ckpt_cuda["w13_weight"]))
        conv["w2_weight"].copy_(ckpt_cuda["w2_weight"])
        return "w13_weight <- swapped checkpoint bytes, w2_weight <- checkpoint bytes (no FP4 interleave); scales as converted"
    if name == "c_scale_fold_k_block_2":
        conv["w13_weight_scale"].copy_(fold_scales(swap_w13(ckpt_cuda["w13_weight_scale"]), 2))
        conv["w2_weight_scale"].copy_(fold_scales(ckpt_cuda["w2_weight_scale"], 2))
        return "w13/w2 scales <- fold(swapped/plain checkpoint scales, groups=2); weights as converted"
    raise ValueError(name)


MISTAKES = ("a_scales_not_swapped", "b_weights_not_interleaved", "c_scale_fold_k_block_2")
MUTANT_FILES = {"a_scales_not_swapped": "scales_not_swapped.lyt",
                "b_weights_not_interleaved": "weights_not_interleaved.lyt",
                "c_scale_fold_k_block_2": "scale_fold_k_block_2.lyt"}




def verify_mutants() -> dict:
    """Each mistake as spec text must be rejected by layoutc.compile_source (the verifier),
    scale_moves_before_fold.lyt (mistake (c) written as moves before the packing) included."""
    res = {}
    for path in sorted(MUTANTS.glob("*.lyt")):
        entry = {"expected": "rejected"}
        try:
            layoutc.compile_source(path.read_text(), str(path.relative_to(ROOT)))
            entry["rejected"] = False
        except layoutc.SpecError as err:
            entry["rejected"] = True
            entry["first_error"] = str(err).strip().splitlines()[0]
        res[path.name] = entry
        log(f"verifier on {path.name}: {'REJECTED' if entry['rejected'] else 'ACCEPTED'} "
            f"(expected {entry['expected']}){': ' + entry['first_error'] if entry['rejected'] else ''}")
    return res


def run_layer(name: str, dims: dict, spec, results: Results, out_dir: Path) -> bool:
    log(f"layer {name}: {dims}")
    t = time.time()
    layer = make_layer(dims, "cpu" if name == "small" else "cuda")
    log(f"{name}: weights drawn and quantized in {time.time() - t:.1f} s")
    ckpt_cuda = {k: v.cuda() for k, v in layer["ckpt"].items()}
    t = time.time()
    conv = spec.convert(ckpt_cuda)
    torch.cuda.synchronize()
    r: dict = {"dims": dims, "convert_s": round(time.time() - t, 3),
               "converted": {k: f"{v.dtype} {list(v.shape)}" for k, v in conv.items()}}
    layoutc.guard.check(conv, spec)  # the correct conversion passes the guard
    r["guard_on_correct"] = "passed"
    try:
        r["bytes_equal_flashinfer_helpers"] = check_bytes(conv, ckpt_cuda)
    except Exception as err:  # noqa: BLE001 - a cross-check; the kernel run below still happens
        r["bytes_equal_flashinfer_helpers"] = f"check failed: {type(err).__name__}: {err}"
    log(f"{name}: converted in {r['convert_s']} s; bytes equal FlashInfer's helpers: {r['bytes_equal_flashinfer_helpers']}")

    t = time.time()
    ref = moe_forward_gptoss(layer["x"], layer["ckpt"], layer["topk_ids"], layer["topk_weights"])
    r["reference_s"] = round(time.time() - t, 1)
    t = time.time()
    out = run_kernel(conv, layer)
    r["kernel_first_call_s"] = round(time.time() - t, 2)
    out2 = run_kernel(conv, layer)
    r["kernel_repeat_bitwise_equal"] = bool(torch.equal(out, out2))
    r["correct"] = compare(out, ref)
    log(f"{name}: kernel vs reference: {r['correct']}")
    results.stage(f"layer_{name}", r)

    if name == "small":  # saved before the mistakes run, so a crash there cannot lose it
        golden = {
            "meta": meta(), "dims": dims, "swiglu": GPT_OSS, "tolerance": {"rtol": RTOL, "atol_rms": ATOL_RMS},
            "checkpoint": layer["ckpt"], "x": layer["x"], "topk_ids": layer["topk_ids"],
            "topk_weights": layer["topk_weights"],
            "converted": {k: v.cpu() for k, v in conv.items()},  # the exact bytes the kernel was fed
            "kernel_out": out.cpu(), "reference": ref, "metrics": r["correct"],
        }
        torch.save(golden, out_dir / GOLDEN)
        r["golden_bytes"] = (out_dir / GOLDEN).stat().st_size
        results.stage(f"layer_{name}", r)

    for m in MISTAKES:
        bad = spec.convert(ckpt_cuda)
        how = mistake(m, bad, ckpt_cuda)
        entry: dict = {"how": how}
        try:
            layoutc.guard.check(bad, spec)
            entry["guard"] = "NOT RAISED"
        except layoutc.LayoutError as err:
            entry["guard"] = f"raised: {err}"
        try:
            entry.update(compare(run_kernel(bad, layer), ref))
            entry["frac_wrong"] = entry.pop("frac_outside_tol")
        except Exception as err:  # noqa: BLE001 - report what the kernel did with the bad bytes
            entry["kernel_error"] = f"{type(err).__name__}: {err}"
        log(f"{name} mistake {m}: guard {entry['guard'][:90]}; frac_wrong {entry.get('frac_wrong')}")
        r.setdefault("mistakes", {})[m] = entry
        results.stage(f"layer_{name}", r)

    return r["correct"]["frac_outside_tol"] == 0.0 and r["correct"]["finite"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--deadline", type=float, default=None, help="time.time() by which to have stopped")
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--prebuilt", type=Path, default=None,
                    help="a prebuilt trimmed module (.so) to load when the build here fails or runs out of time")
    ap.add_argument("--prebuilt-only", action="store_true", help="skip the build, load --prebuilt")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results = Results(args.out_dir)
    try:
        results.stage("meta", meta())
    except Exception as err:  # noqa: BLE001
        results.error("meta", err)
    results.stage("verifier_on_mutants", verify_mutants())

    t = time.time()
    module, how = None, None
    if not args.prebuilt_only:
        build_deadline = None if args.deadline is None else args.deadline - RUN_RESERVE_S
        try:
            module = moe_build.build(args.jobs, build_deadline, report=args.out_dir / "trimmed_out_symbols.txt")
            how = "built here" if module is not None else None
            results.stage("build", {"complete": module is not None, "s": round(time.time() - t, 1)} | moe_build.STATUS)
        except Exception as err:  # noqa: BLE001
            results.stage("build", {"complete": False, "s": round(time.time() - t, 1)} | moe_build.STATUS)
            results.error("build", err)
    if module is None and args.prebuilt is not None and args.prebuilt.exists():
        # the same trimmed build, cross-compiled on the CPU machine (README: "Prebuilt module")
        log(f"loading the prebuilt module {args.prebuilt}")
        try:
            import tvm_ffi

            module = tvm_ffi.load_module(str(args.prebuilt))
            how = f"prebuilt {args.prebuilt.name} (cross-compiled on the CPU machine)"
        except Exception as err:  # noqa: BLE001
            results.error("load prebuilt", err)
    results.stage("module", how or "none")
    if module is None:
        log("no module: the build stopped at the deadline or failed; run the same command again (ninja resumes)")
        return 3
    log(f"module: {how}")
    moe_build.install(module)

    spec = layoutc.compile_file(SPEC)
    ok = True
    for name, dims in LAYERS.items():
        if args.deadline is not None and time.time() > args.deadline - 20:
            log(f"deadline: skipping layer {name}")
            results.stage(f"layer_{name}", {"skipped": "deadline"})
            ok = False
            continue
        try:
            ok = run_layer(name, dims, spec, results, args.out_dir) and ok
        except Exception as err:  # noqa: BLE001
            results.error(f"layer {name}", err)
            ok = False
    results.stage("all_correct_within_tolerance", ok)
    log(f"done: {'OK' if ok else 'NOT OK'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
