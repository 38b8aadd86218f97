"""The pre-kernel guard: assert a layer's tensors come from one spec run, unmodified.

    out = spec.convert(tensors)
    ... engine stores out as parameters, maybe wraps them in nn.Parameter ...
    layoutc.guard.check(layer_tensors, spec)      # right before the fused MoE

Every converter (generated module or ``compile_file``) records each output's
provenance (spec name, sha256, parameters, library versions) in a process-wide
registry keyed by storage; ``nn.Parameter`` wrapping keeps it, in-place edits are
seen through torch's version counter. Standalone converters carry the same code as
``module.guard(tensors)``. The check does no device work: a few dict lookups per tensor.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .lower.guard_rt import _guard_layer, _provenance
from .lower.runtime import LayoutError

__all__ = ["check", "provenance", "LayoutError"]


def provenance(tensor: torch.Tensor) -> dict[str, Any] | None:
    """Which converter run produced ``tensor``, or None."""
    return _provenance(tensor)


def check(tensors: Mapping[str, torch.Tensor | None], spec=None, same_call: bool = False) -> dict[str, Any]:
    """Raise :class:`LayoutError` unless every tensor was produced by one spec (``spec``, a
    :class:`layoutc.CompiledSpec` or a generated module, when given), with one set of
    parameters and library versions, and none was modified since. With a spec, names,
    dtypes and shapes are also checked against its output contract."""
    sha = params = None
    if spec is not None:
        sha = getattr(spec, "sha256", None) or getattr(spec, "SPEC_SHA256")
        params = getattr(spec, "params", None)
        params = params if params is not None else getattr(spec, "PARAMS")
    record = _guard_layer(dict(tensors), sha, params, same_call, "guard")
    if spec is not None:
        module = getattr(spec, "module", spec)
        try:
            module._check_tensors(tensors, module.OUTPUTS, module._OUTPUT_SHAPES, module._OUTPUT_AXES,
                                  record.get("dims"), module.DIMS, "guard")
        except module.LayoutError as err:
            raise LayoutError(str(err)) from None
    return record
