"""Numerics end to end: a quantized MoE layer computes the same thing in every kernel layout.

    python examples/moe_numerics.py

For MXFP4 (the two CUTLASS specs) and NVFP4 (the CuTeDSL spec, SiLU and ReLU2), it

1. builds a layer from random bf16 weights, quantized to the checkpoint format with
   ``layoutc.reference.quant`` (vLLM names, ``w13 = [w1; w3]``);
2. runs a float32 reference MoE forward from the checkpoint layout;
3. converts with the spec, and
   a. decodes the kernel layout back through the generated ``inverse`` and runs the same
      forward: the outputs must be identical;
   b. undoes only the kernel packings (swizzles, interleaves) and runs the forward the way the
      kernel reads it -- gate and up rows where the output's declared row order puts them
      (``[w3; w1]``, ``interleave(w3, w1, group=64)``): identical again.

(b) is the stronger check: it does not use the inverse of the logical transforms, so a
wrong row order in the spec would change the result. The real fused kernels
(FlashInfer ``cutlass_fused_moe`` on SM90) cannot be built within this project's GPU budget
(its JIT takes over an hour); see README.md.
"""

from __future__ import annotations

from pathlib import Path

import torch

import layoutc
from layoutc.lower.eager import run
from layoutc.reference.quant import dequantize_mxfp4, dequantize_nvfp4, moe_forward, quantize_mxfp4, quantize_nvfp4, routing
from layoutc.verify.rowmap import declared_rows, prefix_length, row_labels

SPECS = Path(__file__).resolve().parent.parent / "specs"


def mxfp4_layer(e: int, i: int, h: int, seed: int, bias: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(e, 2 * i, h, generator=g) * 0.05).bfloat16()
    w2 = (torch.randn(e, h, i, generator=g) * 0.05).bfloat16()
    q13, s13 = quantize_mxfp4(w13)
    q2, s2 = quantize_mxfp4(w2)
    layer = {"w13_weight": q13, "w13_weight_scale": s13, "w2_weight": q2, "w2_weight_scale": s2}
    if bias:
        layer["w13_bias"] = (torch.randn(e, 2 * i, generator=g) * 0.1).bfloat16().float()
        layer["w2_bias"] = (torch.randn(e, h, generator=g) * 0.1).bfloat16().float()
    return layer


def nvfp4_layer(e: int, i: int, h: int, seed: int, gated: bool) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(e, (2 if gated else 1) * i, h, generator=g) * 0.05).bfloat16()
    w2 = (torch.randn(e, h, i, generator=g) * 0.05).bfloat16()
    q13, s13, g13 = quantize_nvfp4(w13)
    q2, s2, g2 = quantize_nvfp4(w2)
    return ({"w13_weight": q13, "w13_weight_scale": s13, "w2_weight": q2, "w2_weight_scale": s2},
            {"w13": g13, "w2": g2})


def dequantize(layer: dict, fmt: str, global_scales: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if fmt == "mxfp4":
        return (dequantize_mxfp4(layer["w13_weight"], layer["w13_weight_scale"]),
                dequantize_mxfp4(layer["w2_weight"], layer["w2_weight_scale"]))
    return (dequantize_nvfp4(layer["w13_weight"], layer["w13_weight_scale"], global_scales["w13"]),
            dequantize_nvfp4(layer["w2_weight"], layer["w2_weight_scale"], global_scales["w2"]))


def undo_packings(spec: layoutc.CompiledSpec, out: dict, dims: dict) -> dict:
    """The kernel tensors with only their physical packings undone (eager inverses): the kernel's
    logical view, rows in the order the output declares."""
    variant = spec.compiled.variant(tuple(k for k in out if k in spec.program.optional_inputs))
    logical = {}
    for chain in variant.chains:
        x = out[chain.tensor]
        for step in reversed(chain.steps[prefix_length(chain):]):
            x = run(step.op.inverse(step.in_type), step.out_type, x, dims)
        logical[chain.tensor] = x
    return logical


def kernel_view_gate_up(spec: layoutc.CompiledSpec, tensor: str, x: torch.Tensor) -> torch.Tensor:
    """Rows of a logical w13 tensor reordered into [w1; w3] = [gate; up] from the output's declared
    row order (the kernel's contract), without using the spec's transforms."""
    target = next(t for t in spec.program.outputs if t.name == tensor)
    layout = declared_rows(spec.program, target, "output")
    if layout is None or len(layout.shards) == 1:
        return x
    labels = row_labels(layout, x.shape[1])
    order = sorted(range(len(labels)), key=lambda r: (labels[r][0] != "w1", labels[r][1]))
    return x[:, order]


def check(name: str, params: dict, layer: dict, fmt: str, dims: dict, global_scales=None, activation="silu",
          tokens: int = 16, topk: int = 2) -> dict:
    spec = layoutc.compile_file(SPECS / f"{name}.lyt", params)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, dims["H"], generator=g).bfloat16()
    ids, weights = routing(tokens, dims["E"], topk, seed=2)
    b13, b2 = layer.get("w13_bias"), layer.get("w2_bias")
    w13, w2 = dequantize(layer, fmt, global_scales)
    reference = moe_forward(x, w13, w2, ids, weights, activation, b13, b2)

    out = spec.convert(layer)
    back = spec.inverse(out)
    w13b, w2b = dequantize(back, fmt, global_scales)
    decoded = moe_forward(x, w13b, w2b, ids, weights, activation, back.get("w13_bias"), back.get("w2_bias"))

    logical = undo_packings(spec, out, dims)
    kernel_layer = {k: kernel_view_gate_up(spec, k, v) if k.startswith("w13") else v for k, v in logical.items()}
    w13k, w2k = dequantize(kernel_layer, fmt, global_scales)
    bias13 = kernel_layer.get("w13_bias")
    as_kernel = moe_forward(x, w13k, w2k, ids, weights, activation,
                            bias13.float() if bias13 is not None else None,
                            kernel_layer["w2_bias"].float() if "w2_bias" in kernel_layer else None)
    return {"spec": name, "params": params, "reference": reference, "decoded": decoded, "kernel_view": as_kernel}


def run_all(dims=None) -> list[dict]:
    dims = dims or {"E": 4, "I": 128, "H": 256}
    results = []
    layer = mxfp4_layer(dims["E"], dims["I"], dims["H"], seed=0)
    for name in ("flashinfer_cutlass_bf16", "flashinfer_cutlass_mxfp8"):
        results.append(check(name, {}, layer, "mxfp4", dims))
    for activation, gated in (("silu", True), ("relu2", False)):
        nv, gs = nvfp4_layer(dims["E"], dims["I"], dims["H"], seed=3, gated=gated)
        results.append(check("flashinfer_cutedsl_nvfp4", {"activation": activation}, nv, "nvfp4", dims, gs, activation))
    return results


if __name__ == "__main__":
    for r in run_all():
        same = torch.equal(r["decoded"], r["reference"]) and torch.equal(r["kernel_view"], r["reference"])
        scale = r["reference"].abs().max().item()
        print(f"{r['spec']:<28} {str(r['params']):<26} identical outputs: {same}  (|y| up to {scale:.3f})")
