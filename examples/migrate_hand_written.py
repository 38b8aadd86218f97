"""Migrating an engine's hand-written MoE weight conversion to a layoutc spec.

    python examples/migrate_hand_written.py

An engine has code like ``convert_for_cutlass_mxfp8`` below (written in the style of an engine's
``process_weights_after_loading``). Before replacing it with ``specs/flashinfer_cutlass_mxfp8.lyt``,
pin the spec to it: ``layoutc.testing.assert_equivalent`` feeds both self-describing inputs and
compares, for every output element, which input element (bit, for FP4) each one reads. The same
check from the shell:

    layoutc equiv specs/flashinfer_cutlass_mxfp8.lyt \\
        --against examples/migrate_hand_written.py:convert_for_cutlass_mxfp8 --dims E=2,I=128,H=128

``--against`` imports the module you name and runs the function: it executes your code, as pytest
does with a test file. For code with no spec yet, ``layoutc infer`` writes one (last step below).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "flashinfer_cutlass_mxfp8.lyt"


def _swap_gate_up(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=1)  # checkpoint [w1; w3], the kernel wants [w3; w1]
    return torch.cat([up, gate], dim=1)


def _swizzle_128x4(s: torch.Tensor) -> torch.Tensor:
    """The 128x4 scale swizzle as a reshape: rows (128-row block, 32-row quarter, row) and columns
    (4-column block, column) reordered to (row block, column block, row, quarter, column)."""
    e, m, k = s.shape
    x = s.view(torch.uint8).reshape(e, m // 128, 4, 32, k // 4, 4)
    return x.permute(0, 1, 4, 3, 2, 5).reshape(e, m, k).view(s.dtype)


def convert_for_cutlass_mxfp8(layer: dict) -> dict:
    """The engine's converter: MXFP4 experts for FlashInfer's CUTLASS MoE with MXFP8 activations."""
    out = {
        "w13_weight": _swap_gate_up(layer["w13_weight"]),
        "w13_weight_scale": _swizzle_128x4(_swap_gate_up(layer["w13_weight_scale"])),
        "w2_weight": layer["w2_weight"].clone(),
        "w2_weight_scale": _swizzle_128x4(layer["w2_weight_scale"]),
    }
    if layer.get("w13_bias") is not None:
        out["w13_bias"] = _swap_gate_up(layer["w13_bias"]).to(torch.bfloat16)
    if layer.get("w2_bias") is not None:
        out["w2_bias"] = layer["w2_bias"].to(torch.bfloat16)
    return out


def convert_with_a_bug(layer: dict) -> dict:
    """The same, with a bug engines have shipped: the weight's halves swapped, its scales' not."""
    out = convert_for_cutlass_mxfp8(layer)
    out["w13_weight_scale"] = _swizzle_128x4(layer["w13_weight_scale"])
    return out


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from layoutc.equiv.compare import equivalent
    from layoutc.equiv.infer import infer
    from layoutc.testing import assert_equivalent

    dims = {"E": 2, "I": 128, "H": 128}
    # 1. In the engine's test suite: three lines pin the spec to the old code.
    result = assert_equivalent(SPEC, convert_for_cutlass_mxfp8, dims=dims)
    print(f"hand-written converter: {result.verdict()}")

    # 2. What a difference looks like: the elements, the spec line, and what the function read.
    print(equivalent(SPEC, convert_with_a_bug, dims).report())

    # 3. No spec yet: recover one from the code (checkpoint names and types from vLLM's conventions).
    inferred = infer(convert_for_cutlass_mxfp8, dims, names="vllm", quant="mxfp4", bias=True,
                     spec_name="engine_cutlass_mxfp8")
    print(inferred.text)
    print(f"inferred spec against the code: {inferred.verdict.verdict() if inferred.verdict else 'not checked'}")
    return 0 if inferred.verdict is not None and inferred.verdict.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
