"""Provenance of converted tensors, and the guard an engine calls before the fused MoE.

Copied verbatim into generated converters (torch and the standard library only).
Every ``convert`` records, for each output, which spec produced it (name, sha256,
parameters, library versions, the call's dims) in one registry per process, shared by all
layoutc converters. Records are keyed by the tensor's storage and hold a weak reference to
it, so wrapping an output in ``nn.Parameter`` keeps its record and freeing it drops
the record. Each output's bytes are also fingerprinted (:mod:`layoutc.runtime.fingerprint`,
queued on the device at conversion, read back only when needed), and an index from
fingerprint to provenance outlives the output: a copy (``clone``, ``.to(device)``,
``copy_`` into another tensor, a state-dict round trip) has no record of its own, so the
guard fingerprints it where it lies, once, and adopts it when its bytes, dtype, shape and
strides are those of a converted tensor of that name. The guard then checks, for every
tensor of a layer, that a record exists, that all records name the same spec, parameters
and library versions, and that the tensor was not modified in place since (torch's version
counter).

What the guard sees, and what it cannot: in-place torch ops on the tensor or its views
(``add_``, ``copy_``, indexing assignment) bump the version counter and are caught; so are a
storage swapped with ``set_()``, a storage resized, a reshape or dtype relabel, and a tensor of
the converted layer replaced by ``None``; a copy whose bytes differ from those converted is
rejected. Writes that bypass torch's version counter after a tensor was stamped or adopted are
not seen by the plain check: ``.data`` edits, writes through ``.numpy()``,
``untyped_storage()``, DLPack, raw pointers or another tensor aliasing the same storage.
``rehash=True`` sees those too, by fingerprinting every tensor again (a pass over its bytes).
"""

import importlib.metadata
import itertools
import sys
import types

import torch

from .fingerprint import _fingerprint_finish, _fingerprint_start
from .checks import LayoutError  # generated converters define their own copy

#: Fingerprints kept in the index (provenance of converted bytes that may have been freed since).
_INDEX_LIMIT = 1 << 14
#: Conversions whose fingerprints are still on the device before the stamp reads back finished ones.
_PENDING_LIMIT = 64


def _provenance_registry():
    mod = sys.modules.get("_layoutc_provenance")
    if mod is None:
        mod = types.ModuleType("_layoutc_provenance")
        mod.records = {}
        mod.calls = itertools.count(1)
        sys.modules["_layoutc_provenance"] = mod
    if not hasattr(mod, "index"):  # a registry made by an older copy of this module lacks these
        mod.index = {}  # fingerprint -> [origin, ...] (latest last)
        mod.pending = []  # (fingerprint handle, [origin, ...]) not read back yet
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


_WEAKREF = []  # torch's StorageWeakRef class, imported once (an import statement costs ~1 us per call)


def _weakref_class():
    if not _WEAKREF:
        from torch.multiprocessing.reductions import StorageWeakRef

        _WEAKREF.append(StorageWeakRef)
    return _WEAKREF[0]


def _record(t, origin, records=None, stride=None):
    # The storage-keyed record of tensor t holding the converted bytes of `origin`. A live record of
    # the same storage (an output converted into again: convert(..., out=)) lends its weak reference,
    # which takes ~2 us to make.
    storage = t.untyped_storage()
    key = (storage.data_ptr(), t.storage_offset())
    nbytes = storage.nbytes()
    old = records.get(key) if records is not None else None
    ref = old["storage"] if old is not None and old["nbytes"] == nbytes else None
    if ref is None or ref.expired():
        ref = _weakref_class()(storage)
    r = dict(origin)  # without the fingerprint, which only r["origin"] holds (filled in later)
    r.pop("fingerprint", None)
    r.pop("pending", None)
    r.update(origin=origin, stride=tuple(t.stride()) if stride is None else stride, nbytes=nbytes,
             # Inference tensors (in-place conversion under torch.inference_mode) have no version counter.
             version=None if t.is_inference() else t._version, storage=ref)
    return key, r


def _sweep(reg):
    # Drop records of freed storages when the registry has doubled since the last sweep, not on
    # every call: a sweep visits every record, and a model's converted layers stay alive, so a
    # sweep per call made converting n layers cost O(n^2) (75 us per call at 36 layers, 350 us at
    # 200, on the 2-core CPU). Stale records are harmless meanwhile: lookups check expiry.
    if len(reg.records) >= getattr(reg, "sweep_at", 0):
        for key in [k for k, r in reg.records.items() if r["storage"].expired()]:
            del reg.records[key]
        reg.sweep_at = max(64, 2 * len(reg.records))


#: Per (caller's token, spec, parameters): the parts of each output's origin and record that do not change
#: from one call to the next (convert(..., out=) into the same tensors, or a warm call's new outputs of the
#: same shapes; see _stamp's `static`).
_TEMPLATES = {}


def _stamp(outputs, spec_name, sha256, params, requires, dims=None, fingerprint=True, static=None):
    # Record which spec produced each output, and queue the fingerprints of their bytes (fingerprint=False:
    # none; the outputs are then known by their storage alone, and a copy of them is not followed).
    # `static`: a token (hashable, small) under which the caller vouches that the outputs have the names,
    # shapes, dtypes and strides they had the last time it was given (the out= check's token, whose key holds
    # the strides; a warm call's token for the prepared launch's new contiguous outputs): their records are
    # then copied from the last ones and only the call, dims, version, and the storage where it is another
    # (a new weak reference, its address and size) change.
    reg = _provenance_registry()
    _sweep(reg)
    call = next(reg.calls)
    libraries = reg.__dict__.setdefault("libraries", {})  # the installed versions, looked up once
    requires = tuple(requires)
    library = libraries.get(requires)
    if library is None:
        library = libraries[requires] = tuple((lib, _installed(dist)) for lib, dist, _, _ in requires)
    dims = dict(dims) if dims is not None else None
    records = reg.records
    tkey = (static, sha256, id(params), library) if static is not None else None
    templates = _TEMPLATES.get(tkey) if tkey is not None else None
    if templates is not None and templates[0] is params and templates[1] == tuple(outputs):
        origins = []
        for t, (origin_t, record_t, key_t, nbytes_t, cdata_t) in zip(outputs.values(), templates[2]):
            storage = t.untyped_storage()
            key = (storage.data_ptr(), t.storage_offset())
            origin = dict(origin_t, call=call, dims=dims)
            # The same storage: the template's weak reference (which keeps the storage's C++ object from
            # being reused, so an equal address of that object is the same storage, alive: t holds it).
            if storage._cdata == cdata_t and key == key_t and storage.nbytes() == nbytes_t:
                records[key] = dict(record_t, call=call, dims=dims, origin=origin, version=t._version)
            else:  # another storage (new outputs, out= tensors elsewhere): its own weak reference and size
                records[key] = dict(record_t, call=call, dims=dims, origin=origin, version=t._version,
                                    nbytes=storage.nbytes(), storage=_weakref_class()(storage))
            origins.append(origin)
    else:
        # What every output of the call shares, copied into each origin (the dims of the call: a padded
        # output does not tell I or H back, so the guard uses these; one copy per call, never changed).
        shared = {"spec": spec_name, "sha256": sha256, "params": params, "library": library, "call": call,
                  "converted": frozenset(outputs), "dims": dims, "fingerprint": None}
        origins, made = [], []
        for name, t in outputs.items():
            stride = tuple(t.stride())
            origin = dict(shared, tensor=name, shape=tuple(t.shape), dtype=t.dtype, origin_stride=stride)
            key, records[key] = _record(t, origin, records, stride)
            origins.append(origin)
            made.append((origin, records[key], key))
        if tkey is not None and all(r["version"] is not None and hasattr(r["storage"], "cdata") for _, r, _ in made):
            if len(_TEMPLATES) >= 64:
                _TEMPLATES.clear()
            _TEMPLATES[tkey] = (params, tuple(outputs), [(dict(o), dict(r), k, r["nbytes"], r["storage"].cdata)
                                                         for o, r, k in made])
    if not fingerprint:
        return
    handle = _fingerprint_start(list(outputs.values()))
    for i, origin in enumerate(origins):
        origin["pending"] = (handle, i, len(origins))
    reg.pending.append((handle, origins))
    if len(reg.pending) > _PENDING_LIMIT:
        _resolve(reg, done_only=True)


def _resolve(reg, done_only=False):
    # Read back queued fingerprints into the index (all, or those the device has finished).
    keep = []
    for handle, origins in reg.pending:
        events = [part[1][1] for part in handle if isinstance(part[1], tuple) and part[1][1] is not None]
        if done_only and not all(e.query() for e in events):
            keep.append((handle, origins))
            continue
        for origin, fp in zip(origins, _fingerprint_finish(handle, len(origins))):
            origin["fingerprint"] = fp
            origin.pop("pending", None)  # frees the device copy of the small products
            _index(reg, origin)
    reg.pending = keep


def _index(reg, origin):
    fp = origin["fingerprint"]
    if fp is None:
        return
    entries = reg.index.pop(fp, [])  # re-inserted last: the oldest fingerprints go first
    entries = [e for e in entries if e is not origin][-7:] + [origin]
    reg.index[fp] = entries
    while len(reg.index) > _INDEX_LIMIT:
        del reg.index[next(iter(reg.index))]


def _origin_fingerprint(origin):
    """The fingerprint of the bytes an origin was converted with, read back if still queued. Touches
    only this origin (safe from another thread, e.g. a checkpoint writer's)."""
    pending = origin.get("pending")
    if origin["fingerprint"] is None and pending is not None:
        handle, i, count = pending
        origin["fingerprint"] = _fingerprint_finish(handle, count)[i]
    return origin["fingerprint"]


def _trust(tensors, origins):
    # Stamp tensors whose bytes were checked against a fingerprint (a loaded converted checkpoint).
    reg = _provenance_registry()
    _sweep(reg)
    for name, t in tensors.items():
        origin = origins[name]
        key, reg.records[key] = _record(t, origin)
        _index(reg, origin)


def _provenance(t):
    if not isinstance(t, torch.Tensor):
        return None
    r = _provenance_registry().records.get((t.untyped_storage().data_ptr(), t.storage_offset()))
    if r is None or r["storage"].expired():
        return None
    return r


def _adopt(misses, found, what):
    # Tensors without a record: fingerprint them where they lie (one batch, one wait) and take the
    # provenance of converted bytes of the same name, dtype, shape and strides. Among equal bytes
    # (zero biases of several layers) prefer the conversion call of the layer's other tensors.
    reg = _provenance_registry()
    names = list(misses)
    fps = _fingerprint_finish(_fingerprint_start([misses[n] for n in names]), len(names))
    _resolve(reg)
    calls = {r["call"] for r in found.values()}
    for name, fp in zip(names, fps):
        t = misses[name]
        entries = reg.index.get(fp, []) if fp is not None else []
        same = [e for e in entries if e["tensor"] == name]
        if not entries:
            raise LayoutError(
                f"{what}: {name} was not produced by a layoutc converter: its bytes match no tensor converted "
                f"(or loaded with trust_checkpoint) in this process; a copy changed since, never converted, or a "
                f"copy of a conversion made with fingerprint=False")
        if not same:
            e = entries[-1]
            raise LayoutError(f"{what}: {name} holds the converted {e['tensor']} of spec {e['spec']}")
        fits = [e for e in same if e["dtype"] == t.dtype and e["shape"] == tuple(t.shape)
                and e["origin_stride"] == tuple(t.stride())]
        if not fits:
            e = same[-1]
            raise LayoutError(
                f"{what}: {name} holds the converted bytes of {e['spec']} reshaped or reinterpreted "
                f"({e['dtype']}{list(e['shape'])} stride {list(e['origin_stride'])} -> "
                f"{t.dtype}{list(t.shape)} stride {list(t.stride())})"
            )
        origin = ([e for e in fits if e["call"] in calls] or fits)[-1]
        calls.add(origin["call"])
        key, reg.records[key] = _record(t, origin)
        found[name] = reg.records[key]


def _rehash(found, tensors, what):
    # Every tensor's bytes against the fingerprint of its conversion: sees writes that bypass the
    # version counter (.data, raw pointers), at the price of a pass over the bytes.
    names = list(found)
    fps = _fingerprint_finish(_fingerprint_start([tensors[n] for n in names]), len(names))
    for name, fp in zip(names, fps):
        want = _origin_fingerprint(found[name]["origin"])
        if want is None:
            raise LayoutError(f"{what}: {name} was converted with fingerprint=False, so its bytes cannot be "
                              f"checked again (rehash=True needs the conversion's fingerprint)")
        if fp != want:
            raise LayoutError(f"{what}: the bytes of {name} changed since {found[name]['spec']} converted them "
                              f"(a write the version counter does not see: .data, a raw pointer)")


def _params_text(params):
    rank = params.get("tp_rank") if isinstance(params, dict) else None
    size = params.get("tp_size") if isinstance(params, dict) else None
    shown = f"{params}"
    return shown if rank is None or size is None else f"{shown} (tensor-parallel rank {rank} of {size})"


def _guard_layer(tensors, expect_sha256=None, expect_params=None, same_call=False, what="guard", rehash=False):
    # Before the kernel: every tensor converted by layoutc, all by one spec run, none edited since.
    found, misses = {}, {}
    for name, t in tensors.items():
        if t is None:
            continue
        r = _provenance(t)
        if r is not None:
            found[name] = r
        elif isinstance(t, torch.Tensor) and not t.is_meta:
            misses[name] = t
        else:
            raise LayoutError(f"{what}: {name} was not produced by a layoutc converter")
    if misses:
        _adopt(misses, found, what)
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        r = found[name]
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
            raise LayoutError(f"{what}: {name} was converted with parameters {_params_text(r['params'])}, "
                              f"expected {_params_text(expect_params)}")
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
                shown = (lambda x: x[:12]) if key == "sha256" else _params_text if key == "params" else str
                raise LayoutError(
                    f"{what}: {name} and {fname} come from different {label}: "
                    f"{r['spec']} {shown(r[key])} vs {f['spec']} {shown(f[key])}"
                )
        if same_call and r["call"] != f["call"]:
            raise LayoutError(f"{what}: {name} and {fname} were converted in different calls (different layers?)")
    if first is None:
        raise LayoutError(f"{what}: no tensors given")
    if rehash:
        _rehash(found, tensors, what)
    return first[1]
