"""Provenance of converted tensors, and the guard an engine calls before the fused MoE.

Copied verbatim into generated converters (torch and the standard library only).
Every ``convert`` records, for each output, which spec produced it (name, sha256,
parameters, library versions) in one registry per process, shared by all layoutc
converters. Records are keyed by the tensor's storage and hold a weak reference to
it, so wrapping an output in ``nn.Parameter`` keeps its record and freeing it drops
the record. The guard then checks, for every tensor of a layer, that a record exists,
that all records name the same spec, parameters and library versions, and that the
tensor was not modified in place since (torch's version counter).

What the guard sees, and what it cannot: in-place torch ops on the tensor or its views
(``add_``, ``copy_``, indexing assignment) bump the version counter and are caught; so are a
storage swapped with ``set_()``, a storage resized, a reshape or dtype relabel, and a tensor of
the converted layer replaced by ``None``. Writes that bypass torch's version counter are not:
``.data`` edits, writes through ``.numpy()``, ``untyped_storage()``, DLPack or another tensor
aliasing the same storage. Seeing those would need the bytes re-read (a device pass per call),
which the guard, meant to cost microseconds before every MoE call, does not do.
"""

import importlib.metadata
import itertools
import sys
import types

import torch

from .runtime import LayoutError  # generated converters define their own copy


def _provenance_registry():
    mod = sys.modules.get("_layoutc_provenance")
    if mod is None:
        mod = types.ModuleType("_layoutc_provenance")
        mod.records = {}
        mod.calls = itertools.count(1)
        sys.modules["_layoutc_provenance"] = mod
    return mod


def _installed(dist):
    # Looked up once per process: importlib.metadata scans site-packages (a fraction of a millisecond).
    reg = _provenance_registry()
    cache = reg.__dict__.setdefault("versions", {})
    if dist not in cache:
        try:
            cache[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            cache[dist] = None
    return cache[dist]


def _stamp(outputs, spec_name, sha256, params, requires, dims=None):
    # Record which spec produced each output; drop records of freed storages.
    from torch.multiprocessing.reductions import StorageWeakRef

    reg = _provenance_registry()
    # Drop records of freed storages when the registry has doubled since the last sweep, not on
    # every call: a sweep visits every record, and a model's converted layers stay alive, so a
    # sweep per call made converting n layers cost O(n^2) (75 us per call at 36 layers, 350 us at
    # 200, on the 2-core CPU). Stale records are harmless meanwhile: lookups check expiry.
    if len(reg.records) >= getattr(reg, "sweep_at", 0):
        for key in [k for k, r in reg.records.items() if r["storage"].expired()]:
            del reg.records[key]
        reg.sweep_at = max(64, 2 * len(reg.records))
    call = next(reg.calls)
    library = tuple((lib, _installed(dist)) for lib, dist, _, _ in requires)
    converted = frozenset(outputs)
    for name, t in outputs.items():
        storage = t.untyped_storage()
        reg.records[(storage.data_ptr(), t.storage_offset())] = {
            "tensor": name, "spec": spec_name, "sha256": sha256, "params": params, "library": library,
            "call": call, "shape": tuple(t.shape), "stride": tuple(t.stride()), "dtype": t.dtype,
            "nbytes": storage.nbytes(), "converted": converted,
            # The dims of the call: a padded output does not tell I or H back, so the guard uses these.
            "dims": dict(dims) if dims is not None else None,
            # Inference tensors (in-place conversion under torch.inference_mode) have no version counter.
            "version": None if t.is_inference() else t._version, "storage": StorageWeakRef(storage),
        }


def _provenance(t):
    if not isinstance(t, torch.Tensor):
        return None
    r = _provenance_registry().records.get((t.untyped_storage().data_ptr(), t.storage_offset()))
    if r is None or r["storage"].expired():
        return None
    return r


def _guard_layer(tensors, expect_sha256=None, expect_params=None, same_call=False, what="guard"):
    # Before the kernel: every tensor converted by layoutc, all by one spec run, none edited since.
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        r = _provenance(t)
        if r is None:
            raise LayoutError(f"{what}: {name} was not produced by a layoutc converter (or was copied since)")
        if r["tensor"] != name:
            raise LayoutError(f"{what}: {name} holds the converted {r['tensor']} of spec {r['spec']}")
        if tuple(t.shape) != r["shape"] or tuple(t.stride()) != r["stride"] or t.dtype != r["dtype"]:
            raise LayoutError(
                f"{what}: {name} was reshaped or reinterpreted after conversion "
                f"({r['dtype']}{list(r['shape'])} -> {t.dtype}{list(t.shape)})"
            )
        if t.untyped_storage().nbytes() != r["nbytes"]:
            raise LayoutError(f"{what}: the storage of {name} was resized after {r['spec']} converted it")
        if r["version"] is not None and t._version != r["version"]:
            raise LayoutError(f"{what}: {name} was modified in place after {r['spec']} converted it")
        dropped = sorted(n for n in r["converted"] if n in tensors and tensors[n] is None)
        if dropped:
            raise LayoutError(f"{what}: {', '.join(dropped)} {'was' if len(dropped) == 1 else 'were'} converted with "
                              f"{name} but {'is' if len(dropped) == 1 else 'are'} None now; the kernel would run "
                              f"without {'it' if len(dropped) == 1 else 'them'}")
        # parameters first: they are part of the spec's identity (sha256), and the more precise reason
        if expect_params is not None and r["params"] != expect_params:
            raise LayoutError(f"{what}: {name} was converted with parameters {r['params']}, expected {expect_params}")
        if expect_sha256 is not None and r["sha256"] != expect_sha256:
            raise LayoutError(
                f"{what}: {name} was converted by spec {r['spec']} (sha256 {r['sha256'][:12]}), "
                f"not the expected one (sha256 {expect_sha256[:12]})"
            )
        if first is None:
            first = (name, r)
            continue
        fname, f = first
        for key, label in (("params", "parameters"), ("sha256", "spec"), ("library", "library versions")):
            if r[key] != f[key]:
                shown = lambda x: x[:12] if key == "sha256" else x  # noqa: E731
                raise LayoutError(
                    f"{what}: {name} and {fname} come from different {label}: "
                    f"{r['spec']} {shown(r[key])} vs {f['spec']} {shown(f[key])}"
                )
        if same_call and r["call"] != f["call"]:
            raise LayoutError(f"{what}: {name} and {fname} were converted in different calls (different layers?)")
    if first is None:
        raise LayoutError(f"{what}: no tensors given")
    return first[1]
