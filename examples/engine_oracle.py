"""How an engine's MoE oracle uses layoutc instead of one conversion branch per backend.

    python examples/engine_oracle.py
"""

from __future__ import annotations

import enum

import torch

from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.guard import check as guard
from layoutc.registry import DEFAULT, RegistryError


class MoEBackend(enum.Enum):  # what the engine lets users select
    FLASHINFER_CUTLASS_MXFP4_BF16 = "flashinfer_cutlass_mxfp4_bf16"
    FLASHINFER_CUTLASS_MXFP4_MXFP8 = "flashinfer_cutlass_mxfp4_mxfp8"
    FLASHINFER_CUTEDSL_NVFP4 = "flashinfer_cutedsl_nvfp4"


def startup() -> None:
    # Fails at start-up, before any weight is loaded, if a selectable backend has no spec.
    DEFAULT.check(b.value for b in MoEBackend)


def process_weights_after_loading(layer: dict, backend: MoEBackend) -> dict:
    out = DEFAULT.convert(backend.value, layer)
    return {k: torch.nn.Parameter(v, requires_grad=False) for k, v in out.items()}


def forward(layer: dict, backend: MoEBackend) -> None:
    guard(layer, DEFAULT.spec(backend.value))  # right before the fused MoE kernel


if __name__ == "__main__":
    startup()
    spec = DEFAULT.spec(MoEBackend.FLASHINFER_CUTLASS_MXFP4_BF16.value)
    layer = synthetic_inputs(spec, {"E": 2, "I": 128, "H": 256}, seed=0)
    params = process_weights_after_loading(layer, MoEBackend.FLASHINFER_CUTLASS_MXFP4_BF16)
    forward(params, MoEBackend.FLASHINFER_CUTLASS_MXFP4_BF16)
    print("converted and guarded:", {k: tuple(v.shape) for k, v in params.items()})
    try:
        DEFAULT.check(["cutlass_w4a8"])  # a backend an engine can select that has no spec yet
    except RegistryError as err:
        print("start-up check:", err)
