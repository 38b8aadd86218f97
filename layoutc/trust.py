"""Converted checkpoints trusted by content: the manifest's fingerprints, checked after loading.

``layoutc convert`` writes, in ``layoutc_manifest.json``, the fingerprint
(:mod:`layoutc.runtime.fingerprint`) of every tensor it converted, with the layer it belongs to,
its name in the spec, dtype, shape and the dims of the conversion. An engine that loads such a
folder calls, once the tensors are where they will stay (or before moving them: the guard
follows the bytes)::

    layoutc.guard.trust_checkpoint(folder, loaded)     # loaded: checkpoint name -> tensor

which fingerprints the loaded tensors where they lie (on the GPU for GPU tensors), compares them
with the manifest and stamps them as a converter would: the guard then accepts them, and copies
of them. A shard changed after conversion is rejected, naming the tensor. The manifest sits beside
the shards, so this proves the bytes are those ``convert`` wrote, not who wrote the folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch

from .runtime.fingerprint import _fingerprints
from .runtime.guard_rt import _origin_fingerprint, _provenance, _provenance_registry, _trust
from .runtime.checks import LayoutError

#: The manifest's file name (``layoutc convert`` writes it into the output folder).
MANIFEST = "layoutc_manifest.json"
#: The manifest's key for the converted tensors' fingerprints.
TENSORS = "tensors"

__all__ = ["trust_checkpoint", "layer_entries", "manifest_entries", "MANIFEST", "TENSORS"]


def layer_entries(layer: str, out: Mapping[str, torch.Tensor], names: Mapping[str, str]) -> list[tuple]:
    """(``layoutc convert``.) For a converted layer, the pending manifest entries of the outputs
    ``names`` maps (spec output name -> checkpoint tensor name): no wait for the device."""
    pending = []
    for n, tensor_name in names.items():
        r = _provenance(out[n])
        if r is None:
            raise LayoutError(f"{tensor_name}: the converter left no provenance record")
        pending.append((tensor_name, layer, n, r["origin"]))
    return pending


def manifest_entries(pending: list[tuple]) -> dict[str, dict[str, Any]]:
    """(``layoutc convert``.) The manifest entries of :func:`layer_entries`' results, as JSON
    values (waits for their fingerprints)."""
    out = {}
    for tensor_name, layer, n, origin in pending:
        out[tensor_name] = {
            "layer": layer, "output": n, "fingerprint": _origin_fingerprint(origin),
            "dtype": str(origin["dtype"]).removeprefix("torch."), "shape": list(origin["shape"]),
            "dims": origin["dims"],
        }
    return out


def _manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LayoutError(f"{path} does not exist: {folder} is not the output of layoutc convert") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LayoutError(f"{path}: cannot read the manifest ({err})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get(TENSORS), dict):
        raise LayoutError(f"{path} holds no fingerprints of the converted tensors (written by an older "
                          f"layoutc?): run layoutc convert again to trust this checkpoint")
    for key in ("layoutc_spec", "layoutc_sha256", "layoutc_params", "layoutc_libraries"):
        if not isinstance(manifest.get(key), str):
            raise LayoutError(f"{path}: the manifest has no {key}")
    return manifest


def _entry(manifest: Mapping[str, Any], name: str, path: Path) -> dict[str, Any]:
    e = manifest[TENSORS][name]
    ok = (isinstance(e, dict) and isinstance(e.get("layer"), str) and isinstance(e.get("output"), str)
          and isinstance(e.get("fingerprint"), str) and isinstance(e.get("dtype"), str)
          and isinstance(e.get("shape"), list) and all(isinstance(s, int) for s in e["shape"])
          and (e.get("dims") is None or (isinstance(e["dims"], dict)
                                         and all(isinstance(v, int) for v in e["dims"].values()))))
    if not ok:
        raise LayoutError(f"{path}: the manifest entry of {name} is malformed")
    return e


def trust_checkpoint(folder: str | Path, tensors: Mapping[str, torch.Tensor], spec=None) -> dict[str, str]:
    """Check tensors loaded from a ``layoutc convert`` output ``folder`` against its manifest and
    stamp them, so that :func:`layoutc.guard.check` accepts them (and copies of them).

    ``tensors`` maps checkpoint names to loaded tensors (any device; names the manifest does not
    list as converted, such as attention weights, are left alone). Each converted one must have
    the dtype and shape the manifest gives and the bytes it fingerprinted: a :class:`LayoutError`
    names the first that does not, and nothing is stamped then. ``spec`` (a compiled spec or a
    generated module), when given, must be the one the folder was converted with. Returns the
    checkpoint names trusted, mapped to their names in the spec."""
    folder = Path(folder)
    path = folder / MANIFEST
    manifest = _manifest(folder)
    try:
        params = json.loads(manifest["layoutc_params"])
        library = tuple(json.loads(manifest["layoutc_libraries"]).items())
    except (json.JSONDecodeError, AttributeError):
        raise LayoutError(f"{path}: the manifest's parameters or library versions are malformed") from None
    if spec is not None:
        sha = getattr(spec, "sha256", None) or getattr(spec, "SPEC_SHA256")
        want = getattr(spec, "params", None)
        want = want if want is not None else getattr(spec, "PARAMS")
        # parameters first: they are part of the spec's identity (sha256), and the more precise reason
        if params != want:
            raise LayoutError(f"{folder} was converted with parameters {params}, expected {want}")
        if manifest["layoutc_sha256"] != sha:
            raise LayoutError(f"{folder} was converted with spec {manifest['layoutc_spec']} (sha256 "
                              f"{manifest['layoutc_sha256'][:12]}), not the expected one (sha256 {sha[:12]})")
    mine = {name: t for name, t in tensors.items() if name in manifest[TENSORS]}
    if not mine:
        raise LayoutError(f"none of the {len(tensors)} tensors given is a converted tensor of {folder} "
                          f"(the manifest lists {len(manifest[TENSORS])}, e.g. {next(iter(manifest[TENSORS]), '-')})")
    entries = {name: _entry(manifest, name, path) for name in mine}
    for name, t in mine.items():
        e = entries[name]
        if not isinstance(t, torch.Tensor):
            raise LayoutError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if str(t.dtype).removeprefix("torch.") != e["dtype"] or list(t.shape) != e["shape"]:
            raise LayoutError(f"{name}: loaded as {t.dtype}{list(t.shape)}, but layoutc convert wrote "
                              f"{e['dtype']}{e['shape']}")
        if not t.is_contiguous():
            raise LayoutError(f"{name}: not contiguous; the kernel layout is the row-major one convert wrote")
    names = list(mine)
    for name, fp in zip(names, _fingerprints([mine[n] for n in names])):
        if fp != entries[name]["fingerprint"]:
            e = entries[name]
            raise LayoutError(f"{name} ({e['output']} of layer {e['layer']}): its bytes are not those layoutc "
                              f"convert wrote (the shard was changed after conversion, or read wrongly)")
    reg = _provenance_registry()
    calls: dict[str, int] = {}
    converted: dict[str, set[str]] = {}
    for e in manifest[TENSORS].values():
        if isinstance(e, dict) and isinstance(e.get("layer"), str):
            converted.setdefault(e["layer"], set()).add(e.get("output"))
    origins = {}
    for name in names:
        e = entries[name]
        if e["layer"] not in calls:
            calls[e["layer"]] = next(reg.calls)  # one "call" per layer: same_call=True tells layers apart
        origins[name] = {
            "tensor": e["output"], "spec": manifest["layoutc_spec"], "sha256": manifest["layoutc_sha256"],
            "params": params, "library": library, "call": calls[e["layer"]], "shape": tuple(e["shape"]),
            "dtype": mine[name].dtype, "converted": frozenset(converted[e["layer"]]),
            "origin_stride": tuple(mine[name].stride()), "dims": e["dims"], "fingerprint": e["fingerprint"],
            "checkpoint": str(folder), "checkpoint_name": name,
        }
    _trust(mine, origins)
    return {name: entries[name]["output"] for name in names}
