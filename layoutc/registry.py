"""A backend registry: backend names to compiled specs, instead of an ``if/elif`` per backend.

    registry = layoutc.registry.Registry({
        "flashinfer_cutlass_mxfp4_bf16": "specs/flashinfer_cutlass_bf16.lyt",
        "flashinfer_cutedsl_nvfp4_relu2": ("specs/flashinfer_cutedsl_nvfp4.lyt", {"activation": "relu2"}),
    })
    registry.check(engine_backends)                 # at start-up: every selectable backend has a spec
    out = registry.convert("flashinfer_cutlass_mxfp4_bf16", layer_tensors)

``check`` fails loudly, listing every selectable backend without a spec: the missing-branch bug
(vLLM PR 51038: a backend could be selected, the converter had no branch, and the error came
only after the model had loaded). Specs compile once; compiled converters are cached on
(spec sha256, parameters), and their per-shape kernels on the shapes they see.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Union

import torch

from .api import CompiledSpec, compile_file
from .shipped import SPECS

Entry = Union[str, Path, tuple[Union[str, Path], Mapping[str, Any]]]


class RegistryError(LookupError):
    """A selectable backend has no spec, or a backend name is unknown."""


class Registry:
    def __init__(self, backends: Mapping[str, Entry]):
        self._entries: dict[str, tuple[Path, dict[str, Any]]] = {}
        for name, entry in backends.items():
            path, params = (entry, {}) if isinstance(entry, (str, Path)) else entry
            self._entries[name] = (Path(path), dict(params))
        self._compiled: dict[tuple[str, tuple], CompiledSpec] = {}
        self._seen: dict[tuple, int] = {}

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def check(self, selectable: Iterable[str]) -> None:
        """Raise :class:`RegistryError` naming every selectable backend without a spec, and
        compile (and so verify) the specs of the others."""
        selectable = list(selectable)
        missing = [b for b in selectable if b not in self._entries]
        if missing:
            raise RegistryError(
                f"backend(s) {', '.join(missing)} can be selected but have no layout spec; "
                f"registered: {', '.join(self._entries) or 'none'}"
            )
        for b in selectable:
            self.spec(b)

    def spec(self, backend: str) -> CompiledSpec:
        if backend not in self._entries:
            raise RegistryError(f"no layout spec for backend {backend!r}; registered: {', '.join(self._entries)}")
        path, params = self._entries[backend]
        key = (str(path), tuple(sorted(params.items())))
        if key not in self._compiled:
            self._compiled[key] = compile_file(path, params)
        return self._compiled[key]

    def convert(self, backend: str, tensors: Mapping[str, torch.Tensor | None], **kwargs) -> dict[str, torch.Tensor]:
        """Convert a layer's MoE tensors (other entries of ``tensors`` are ignored) with ``backend``'s spec."""
        spec = self.spec(backend)
        mine = {k: v for k, v in tensors.items() if k in spec.input_names}
        shapes = tuple((k, tuple(v.shape), str(v.dtype), str(v.device)) for k, v in sorted(mine.items()) if v is not None)
        key = (spec.sha256, tuple(sorted(spec.params.items())), shapes)
        self._seen[key] = self._seen.get(key, 0) + 1
        return spec.convert(mine, **kwargs)

    def cache_keys(self) -> list[tuple]:
        """(spec sha256, parameters, input shapes) of every conversion so far: what the compiled
        converters specialised on (their kernels are cached per shape)."""
        return list(self._seen)


#: The shipped specs under the backend names an engine's oracle would use.
DEFAULT = Registry({
    "flashinfer_cutlass_mxfp4_bf16": SPECS / "flashinfer_cutlass_bf16.lyt",
    "flashinfer_cutlass_mxfp4_mxfp8": SPECS / "flashinfer_cutlass_mxfp8.lyt",
    "flashinfer_cutedsl_nvfp4": (SPECS / "flashinfer_cutedsl_nvfp4.lyt", {"activation": "silu"}),
    "flashinfer_cutedsl_nvfp4_relu2": (SPECS / "flashinfer_cutedsl_nvfp4.lyt", {"activation": "relu2"}),
    "flashinfer_cutlass_mxfp4_bf16_padded": SPECS / "flashinfer_cutlass_mxfp4_padded.lyt",
    "flashinfer_cutlass_mxfp4_bf16_gpt_oss": (SPECS / "flashinfer_cutlass_mxfp4_padded.lyt", {"checkpoint": "gpt_oss"}),
    "flashinfer_trtllm_mxfp4_gpt_oss": SPECS / "flashinfer_trtllm_mxfp4.lyt",
    "flashinfer_trtllm_nvfp4": (SPECS / "flashinfer_trtllm_nvfp4.lyt", {"activation": "silu"}),
    "flashinfer_trtllm_nvfp4_relu2": (SPECS / "flashinfer_trtllm_nvfp4.lyt", {"activation": "relu2"}),
    "flashinfer_cutlass_nvfp4": (SPECS / "flashinfer_cutlass_nvfp4.lyt", {"activation": "silu"}),
    "flashinfer_cutlass_nvfp4_relu2": (SPECS / "flashinfer_cutlass_nvfp4.lyt", {"activation": "relu2"}),
    "flashinfer_trtllm_fp8_block": SPECS / "flashinfer_trtllm_fp8_block.lyt",
    "flashinfer_trtllm_bf16": (SPECS / "flashinfer_trtllm_bf16.lyt", {"activation": "silu"}),
    "flashinfer_trtllm_bf16_relu2": (SPECS / "flashinfer_trtllm_bf16.lyt", {"activation": "relu2"}),
    # Beyond FlashInfer (issue 24): OpenAI triton_kernels, AITER (ROCm), DeepGEMM, vLLM's own CUTLASS.
    "triton_kernels_mxfp4_sm90": SPECS / "triton_kernels_mxfp4_hopper.lyt",
    "triton_kernels_mxfp4_sm100": SPECS / "triton_kernels_mxfp4_blackwell.lyt",
    "aiter_mxfp4": SPECS / "aiter_mxfp4.lyt",
    "aiter_fp8_block": SPECS / "aiter_fp8_block.lyt",
    "deepgemm_fp8_block_sm90": (SPECS / "deepgemm_fp8_block.lyt", {"arch": "sm90"}),
    "deepgemm_fp8_block_sm100": (SPECS / "deepgemm_fp8_block.lyt", {"arch": "sm100"}),
    "vllm_cutlass_nvfp4": (SPECS / "vllm_cutlass_nvfp4.lyt", {"activation": "silu"}),
    "vllm_cutlass_nvfp4_relu2": (SPECS / "vllm_cutlass_nvfp4.lyt", {"activation": "relu2"}),
    # vLLM's CUTLASS W4A8 MoE (int4 weights, FP8 activations; group size 128 only): the layout steps of
    # convert_to_w4a8_moe_kernel_format, its scales' value computations left to the engine (see the spec).
    "vllm_cutlass_w4a8": SPECS / "vllm_cutlass_w4a8.lyt",
    # Marlin (issue 24): GPTQ int4 MoE, one backend per group size the kernel takes.
    "marlin_gptq_int4": (SPECS / "marlin_gptq_int4.lyt", {"group_size": 128}),
    "marlin_gptq_int4_g64": (SPECS / "marlin_gptq_int4.lyt", {"group_size": 64}),
    "marlin_gptq_int4_g32": (SPECS / "marlin_gptq_int4.lyt", {"group_size": 32}),
    "marlin_mxfp4": SPECS / "marlin_mxfp4.lyt",
    # Marlin NVFP4: one backend per activation (gated or relu2) and activation dtype (the global scales' type)
    "marlin_nvfp4": (SPECS / "marlin_nvfp4.lyt", {"activation": "silu", "act_dtype": "bf16"}),
    "marlin_nvfp4_f16": (SPECS / "marlin_nvfp4.lyt", {"activation": "silu", "act_dtype": "f16"}),
    "marlin_nvfp4_relu2": (SPECS / "marlin_nvfp4.lyt", {"activation": "relu2", "act_dtype": "bf16"}),
    "marlin_nvfp4_relu2_f16": (SPECS / "marlin_nvfp4.lyt", {"activation": "relu2", "act_dtype": "f16"}),
})

#: vLLM's MoE backend names (``<enum>.<member>``, ``@smXX`` where the layout depends on the GPU the
#: backend runs on) -> the DEFAULT backend holding their layout. Sources: vLLM fused_moe/oracle/
#: mxfp4.py (TRITON: Hopper layouts on SM90, strided values and Blackwell scales on SM100; AITER),
#: oracle/nvfp4.py (VLLM_CUTLASS; its relu2 models take the non-gated branch), fp8 oracle (DEEPGEMM,
#: AITER; DEEPGEMM on SM100 packs its scales as UE8M0 after vLLM's E8M0 re-quantisation, which the spec takes
#: as done: see specs/deepgemm_fp8_block.lyt).
VLLM_BACKENDS = {
    "Mxfp4MoeBackend.TRITON@sm90": "triton_kernels_mxfp4_sm90",
    "Mxfp4MoeBackend.TRITON@sm100": "triton_kernels_mxfp4_sm100",
    "Mxfp4MoeBackend.AITER": "aiter_mxfp4",
    "Fp8MoeBackend.AITER": "aiter_fp8_block",
    "Fp8MoeBackend.DEEPGEMM@sm90": "deepgemm_fp8_block_sm90",
    "Fp8MoeBackend.DEEPGEMM@sm100": "deepgemm_fp8_block_sm100",
    "NvFp4MoeBackend.VLLM_CUTLASS": "vllm_cutlass_nvfp4",
    "NvFp4MoeBackend.VLLM_CUTLASS@relu2": "vllm_cutlass_nvfp4_relu2",
    "W4A8MoeBackend.CUTLASS": "vllm_cutlass_w4a8",  # oracle/w4a8.py (compressed-tensors W4A8 MoE)
}


#: The engines' names for the Marlin MoE layouts -> the DEFAULT backend. vLLM and SGLang both call the
#: GPTQ Marlin MoE method GPTQMarlinMoEMethod (vLLM quantization/gptq_marlin.py, SGLang
#: srt/layers/quantization/gptq.py); the layout depends on its group size.
MARLIN_ENGINE_BACKENDS = {
    f"{engine}:GPTQMarlinMoEMethod@group_size={g}": backend
    for engine in ("vllm", "sglang")
    for g, backend in ((128, "marlin_gptq_int4"), (64, "marlin_gptq_int4_g64"), (32, "marlin_gptq_int4_g32"))
}
# vLLM fused_moe/oracle/mxfp4.py: both Marlin members call prepare_moe_mxfp4_layer_for_marlin.
MARLIN_ENGINE_BACKENDS.update({f"vllm:Mxfp4MoeBackend.{m}": "marlin_mxfp4" for m in ("MARLIN", "BATCHED_MARLIN")})
# vLLM fused_moe/oracle/nvfp4.py: NvFp4MoeBackend.MARLIN calls prepare_nvfp4_moe_layer_for_marlin; the layout
# depends on the activation (gated or not) and on params_dtype (the global scales' type and factor). SGLang's
# copy of the function permutes the scales once more (an older kernel's order): not registered.
MARLIN_ENGINE_BACKENDS.update({
    f"vllm:NvFp4MoeBackend.MARLIN{act}@{dtype}": f"marlin_nvfp4{act.replace('@', '_')}{'' if dtype == 'bf16' else '_f16'}"
    for act in ("", "@relu2") for dtype in ("bf16", "f16")
})

#: SGLang's MoE runner backends (srt/layers/moe/utils.py MoeRunnerBackend) -> the DEFAULT backend. DEEP_GEMM
#: prepares FP8 block weights as vLLM does: as loaded on SM90; on SM100 (DeepGEMM's UE8M0 mode) the weights
#: re-quantised, then the scales through transform_scale_ue8m0 (srt/layers/quantization/fp8_utils.py: the
#: 128-row broadcast and DeepGEMM's packed UE8M0 layout, the spec's arch=sm100).
SGLANG_BACKENDS = {
    "MoeRunnerBackend.DEEP_GEMM@sm90": "deepgemm_fp8_block_sm90",
    "MoeRunnerBackend.DEEP_GEMM@sm100": "deepgemm_fp8_block_sm100",
}
