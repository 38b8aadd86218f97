"""The pre-kernel guard: assert a layer's tensors come from one spec run, unmodified.

    out = spec.convert(tensors)                   # or: loaded from a `layoutc convert` folder and
    layoutc.guard.trust_checkpoint(folder, loaded)  #     checked against its manifest
    ... engine wraps them in nn.Parameter, moves them to the GPU, copies them into its buffers ...
    layoutc.guard.check(layer_tensors, spec)      # once after loading, and right before the fused MoE

Every converter (generated module or ``compile_file``) records each output's provenance (spec
name, sha256, parameters, library versions, dims) in a process-wide registry keyed by storage,
and queues a fingerprint of its bytes (:mod:`layoutc.runtime.fingerprint`) on the device.
``nn.Parameter`` wrapping keeps the storage; a copy (``clone``, ``.to(device)``, ``copy_``) is
fingerprinted on its device the first time the guard meets it and accepted when its bytes are
those converted; in-place edits are seen through torch's version counter. After that first
meeting the check does no device work: a few dict lookups per tensor. Standalone converters
carry the same code as ``module.guard(tensors)``.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .runtime.fingerprint import _fingerprints
from .runtime.guard_rt import _guard_layer, _origin_fingerprint, _provenance
from .runtime.checks import LayoutError
from .trust import trust_checkpoint

__all__ = ["check", "provenance", "fingerprint", "trust_checkpoint", "LayoutError"]


def provenance(tensor: torch.Tensor) -> dict[str, Any] | None:
    """Which converter run (or trusted checkpoint) produced ``tensor``, or None. A copy has a
    record once the guard has accepted it."""
    return _provenance(tensor)


def fingerprint(tensor: torch.Tensor, converted: bool = False) -> str:
    """The fingerprint of ``tensor``'s bytes (``layoutc-fp1:<hex>``), computed where they lie. With
    ``converted=True``, the fingerprint recorded when the tensor was converted or trusted (no pass
    over the bytes; a :class:`LayoutError` when it has no record)."""
    if converted:
        r = _provenance(tensor)
        if r is None:
            raise LayoutError("fingerprint: this tensor has no provenance record (not converted, or a copy "
                              "the guard has not accepted yet)")
        return _origin_fingerprint(r["origin"])
    return _fingerprints([tensor])[0]


def check(tensors: Mapping[str, torch.Tensor | None], spec=None, same_call: bool = False,
          dims: Mapping[str, int] | None = None, rehash: bool = False) -> dict[str, Any]:
    """Raise :class:`LayoutError` unless every tensor was produced by one spec (``spec``, a
    :class:`layoutc.CompiledSpec` or a generated module, when given), with one set of
    parameters and library versions, and none was modified since. A tensor the guard has not
    met (a copy) is fingerprinted on its device, once, and accepted when its bytes, dtype, shape
    and strides are those of a converted tensor of that name. With a spec, names, dtypes and
    shapes are also checked against its output contract, for the dims of the conversion (kept
    in the record; a padded output does not tell I back) or ``dims`` when given.
    ``rehash=True`` fingerprints every tensor again: it sees writes that bypass torch's version
    counter (``.data``, raw pointers), at the price of a pass over the bytes."""
    sha = params = None
    if spec is not None:
        sha = getattr(spec, "sha256", None) or getattr(spec, "SPEC_SHA256")
        params = getattr(spec, "params", None)
        params = params if params is not None else getattr(spec, "PARAMS")
    record = _guard_layer(dict(tensors), sha, params, same_call, "guard", rehash)
    if spec is not None:
        module = getattr(spec, "module", spec)
        try:
            module._check_tensors(tensors, module.OUTPUTS, module._OUTPUT_SHAPES, module._OUTPUT_AXES,
                                  dict(dims) if dims is not None else record.get("dims"), module.DIMS, "guard")
        except module.LayoutError as err:
            raise LayoutError(str(err)) from None
    return record
