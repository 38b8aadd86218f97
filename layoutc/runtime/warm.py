"""The warm call of a generated converter: one key per call, one lookup (issue 25).

Copied whole into every generated converter (after :mod:`layoutc.runtime.checks`). A ``convert`` call
computes :func:`_warm_key` once from what every check before the conversion reads; when a call with the
same key passed every check, the call takes the dims, variant, lowering and out= key that call found
and goes straight to the conversion (whose prepared launches and the stamp's copied records then
apply), instead of reading the same tensors again for the input checks, the out= check, the dtype
widening and the lowering choice.

What a key match proves, and what it does not. The key holds, per input and per out= tensor, its
name, Python type, dtype, shape and device, and with out= its address and (out=) its contiguity or
(inputs) its strides unless contiguous, and per out= tensor whether it requires grad and is an inference
tensor; the given dims with their types; the lowering asked for. Those are everything the input checks,
the out= check (dtypes, shapes, devices, contiguity, alignment, autograd and inference flags, and no byte shared between an output and an
input or another output: byte extents are functions of address, shape, strides and dtype) and the
lowering choice read, so a hit gives the same verdicts as checking the call in full: an out= tensor
that overlaps an input has the extents of a refused call, which never reaches the table. A match
does NOT prove that a tensor is the one that was checked: a storage freed and another allocated at
the same address gives the same key. Nothing taken from a hit depends on which storage it is: the
conversion reads the tensors handed to it, the stamp records the storage it is given (and writes its
records in full when the storage differs: ``_stamp``'s ``static``), and the version counters are read
on every call. Without out=, no address is in the key (no check reads one), so layers of one shape share
an entry.

Per-call work a hit keeps: the key itself (a few attribute reads per tensor), the autograd mode, the
conversion (the layer functions' prepared-launch key, the launch), the out= results' addresses (_into) and
the stamp (call number, storages, versions). The outputs' shape check is not repeated: the shapes the
conversion gives are a function of the dims, variant and lowering, which the hit's call had and passed.
Widening of inputs declared ``accepts`` runs on every call that needs it.
"""

import torch

from .checks import _CHOSEN  # copied into converters before this module

#: Keys of calls that passed every check -> (dims, variant, lowering, out= key, widened) (bounded below).
_WARM = {}


def _warm_key(tensors, dims, lowering, out):
    # The call's key, or None where the call is not plain (another mapping, a non-tensor value, unhashable
    # dims): such a call is checked in full every time.
    if type(tensors) is not dict or (out is not None and type(out) is not dict):
        return None
    try:
        key = [lowering, None if dims is None else tuple(sorted((k, type(v), v) for k, v in dims.items()))]
        addresses = out is not None
        for k, t in tensors.items():
            if t is None:
                key.append(k)
            elif addresses:  # an input's extent: its address, shape, dtype, and strides unless contiguous
                key += (k, type(t), t.dtype, t.shape, t.device, t.data_ptr(), t.is_contiguous() or t.stride())
            else:
                key += (k, type(t), t.dtype, t.shape, t.device)
        if addresses:
            key.append(None)  # inputs end here
            for k, t in out.items():
                key += (k, type(t), t.dtype, t.shape, t.device, t.data_ptr(), t.is_contiguous(), t.requires_grad,
                        t.is_inference())
        key = tuple(key)
        hash(key)
    except Exception:  # noqa: BLE001 -- not tensors: the full checks say what is wrong
        return None
    return key


def _warm_store(key, d, present, how, static, widened, remembered):
    # After a call passed every check: remember what it found, unless the lowering choice was not
    # remembered (an environment variable allowed it, which may change) or an input was widened.
    if key is None or not remembered or widened:
        return
    if len(_WARM) >= 256:
        _WARM.clear()
    _WARM[key] = (d, present, how, static)


def _warm_widened(before, after):
    # Whether _widened converted an input (a new tensor per call: such calls are not remembered).
    return any(after[k] is not v for k, v in before.items())


def _warm_remembered(lowering, tensors, lowerings):
    # Whether _choose_lowering remembered its choice for this call (not when an environment variable allowed it).
    device = next((t.device for t in tensors.values() if t is not None), torch.device("cpu"))
    hit = _CHOSEN.get((id(lowerings), lowering, device))
    return hit is not None and hit[0] is lowerings
