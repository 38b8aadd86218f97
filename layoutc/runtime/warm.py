"""The warm call of a generated converter: one key per call, one lookup, one check (issue 25).

Copied whole into every generated converter (after :mod:`layoutc.runtime.checks`). A ``convert`` call
computes :func:`_warm_key` once: a hashable key of what is cheap to read (the lowering asked for, the
given dims with their types, the names of the inputs and out= tensors, which inputs are None, and each
tensor's address: with out= the address itself, without it the address modulo 16, the alignment the
prepared launch needs) and the tensors themselves. When a call with the same key passed every check, the
entry's tensor check (:func:`_warm_hit`) compares, in one call, every tensor's metadata with that call's:
Python type, dispatch keys (device type, inference tensors, ...), dtype, device index, shape, strides and
requires_grad. torch's own C++ check does that where the installed torch has it and tells those apart
(``torch._C._dynamo.guards.TensorGuards``, the check ``torch.compile``'s guards use, probed once per process
by :func:`_warm_guards`); elsewhere a tuple of the same attributes read in Python is compared. A hit takes
the dims, variant, lowering and out= key that call found and, where that call's whole conversion was one
prepared layer launch (:func:`layoutc.runtime.checks._prepare`), calls it directly (:func:`_warm_run`):
no input checks, out= check, dtype widening, lowering choice, layer dispatch or prepared-launch key.

What a match proves, and what it does not. Everything the input checks, the out= check (dtypes, shapes,
devices, contiguity, alignment, autograd and inference flags, and no byte shared between an output and an
input or another output: byte extents are functions of address, shape, strides and dtype), the lowering
choice and the prepared-launch key (dtypes, contiguity, 16-byte alignment, device) read is in the key or
the tensor check, so a hit gives the same verdicts as checking the call in full: an out= tensor that
overlaps an input has the extents of a refused call, which never reaches the table. The current CUDA
device, which the prepared launch is bound to, is compared on every hit that launches. A match does NOT
prove that a tensor is the one that was checked: a storage freed and another allocated at the same address
gives the same key. Nothing taken from a hit depends on which storage it is: the conversion reads the
tensors handed to it, the stamp records the storage it is given (and writes its records in full when the
storage differs: ``_stamp``'s ``static``), and the version counters are read on every call. Entries hold
no tensor, so nothing of a freed tensor is kept or read. Without out=, no address is in the key (no check
reads one), so layers of one shape share an entry (up to four shapes per key).

A CUDA graph per out= entry (:func:`_warm_graph_slot`, :func:`_warm_replayed`): where the key holds every
input's and output's address (out=) and the prepared launch is one kernel launch bound to the current CUDA
device, the first hit captures that launch into a graph (on a side stream; capture runs nothing) and every hit
replays it on the caller's current stream, the stream the direct launch takes: ~5 us of host time instead of
Triton's launcher (~15 us, benchmarks/host_time.py). The replay reads the addresses captured, which are those
of the key and so of the hit's tensors, whose dtypes, shapes and strides the tensor check compared: the same
kernel with the same arguments. Not taken while the caller captures a graph itself (the direct launch goes
into theirs), while a Triton launch hook is set, where the capture failed (remembered per entry) or with
LAYOUTC_CUDA_GRAPHS=0; the graph is freed with its entry. The stamp is the same either way.

Per-call work a hit keeps: the key (one address per tensor), the tensor check, the autograd mode, the
launch, and the stamp (call number, storages, versions). The outputs' shape check is not repeated: the
shapes the conversion gives are a function of the dims, variant and lowering, which the hit's call had and
passed. Widening of inputs declared ``accepts`` runs on every call that needs it (such calls are never
remembered).
"""

import os

import torch

from .checks import _CHOSEN, _PREPARED, _hooked, _plain, _prepared_key  # copied into converters before this module

#: Keys of calls that passed every check -> [(tensor check, dims, variant, lowering, out= key, fast run)]
#: (bounded below; newest first).
_WARM = {}
_WARM_KEYS = 256
_WARM_PER_KEY = 4

#: torch's C++ tensor check (TensorGuards) once probed, or None: the Python tuple instead.
_WARM_GUARDS = []

#: A CUDA graph of the prepared launch per out= entry (_warm_graph_slot); LAYOUTC_CUDA_GRAPHS=0 (read at import)
#: or False here: every hit launches directly.
_WARM_GRAPHS = os.environ.get("LAYOUTC_CUDA_GRAPHS", "1") != "0"


def _warm_key(tensors, dims, lowering, out):
    # (key, tensors in order: inputs given, then out=) or None where the call is not plain (another mapping,
    # a non-tensor value, unhashable dims or lowering): such a call is checked in full every time.
    if type(tensors) is not dict or (out is not None and type(out) is not dict):
        return None
    try:
        given = None if dims is None else tuple(sorted((k, type(v), v) for k, v in dims.items()))
        values = [t for t in tensors.values() if t is not None]
        if out is None:  # no check reads an address; the prepared launch needs 16-byte aligned inputs
            spots = tuple([None if t is None else t.data_ptr() % 16 for t in tensors.values()])
            key = (lowering, given, tuple(tensors), spots)
        else:
            outs = list(out.values())
            spots = tuple([None if t is None else t.data_ptr() for t in tensors.values()])
            key = (lowering, given, tuple(tensors), spots, tuple(out), tuple([t.data_ptr() for t in outs]))
            values += outs
        hash(key)
    except Exception:  # noqa: BLE001 -- not tensors: the full checks say what is wrong
        return None
    return key, values


def _warm_meta(values):
    # In Python, what the C++ check compares (where torch has none that tells these apart).
    return tuple((type(t), t.dtype, t.shape, t.stride(), t.device, t.requires_grad, t.is_inference()) for t in values)


def _warm_guards():
    # torch's TensorGuards where it is there and refuses, in a probe, every difference the warm path relies on
    # it for (dtype, shape, strides, requires_grad with autograd on and off, inference tensors, a subclass);
    # None otherwise (another torch: the Python tuple, slower, same verdicts).
    if not _WARM_GUARDS:
        found = None
        try:
            cls = torch._C._dynamo.guards.TensorGuards
            base = torch.zeros(4, 4)
            guard = _warm_guard_of(cls, [base])
            with torch.inference_mode():
                inference = torch.zeros(4, 4)
            probe = type("_WarmProbe", (torch.Tensor,), {})
            others = [torch.zeros(4, 4, dtype=torch.float64), torch.zeros(2, 8), torch.zeros(4, 4).t(),
                      torch.zeros(4, 4, requires_grad=True), inference, torch.zeros(4, 4).as_subclass(probe)]
            ok = guard.check(base) and guard.check(torch.ones(4, 4)) and not any(guard.check(t) for t in others)
            with torch.no_grad():
                ok = ok and guard.check(base) and not any(guard.check(t) for t in others)
            found = cls if ok else None
        except Exception:  # noqa: BLE001 -- no such check in this torch: the Python tuple
            found = None
        _WARM_GUARDS.append(found)
    return _WARM_GUARDS[0]


def _warm_guard_of(cls, values):
    # Every size and stride static: a tensor of another shape or layout fails the check.
    return cls(*values, dynamic_dims_sizes=[list(t.shape) for t in values],
               dynamic_dims_strides=[list(t.stride()) for t in values])


def _warm_hit(warm):
    # The entry of a call that passed every check with this key and these tensors' metadata, or None.
    entries = _WARM.get(warm[0])
    if entries is None:
        return None
    values = warm[1]
    try:
        for entry in entries:
            guard = entry[0]
            if guard.check(*values) if type(guard) is not tuple else guard == _warm_meta(values):
                return entry
    except Exception:  # noqa: BLE001 -- a value the check cannot read: checked in full
        return None
    return None


def _warm_store(warm, d, present, how, static, widened, remembered, tensors, res, layers):
    # After a call passed every check: remember what it found, unless the lowering choice was not
    # remembered (an environment variable allowed it, which may change) or an input was widened.
    if warm is None or not remembered or widened:
        return
    key, values = warm
    cls = _warm_guards()
    try:
        guard = _warm_guard_of(cls, values) if cls is not None else _warm_meta(values)
    except Exception:  # noqa: BLE001 -- not checkable in one call: never remembered
        return
    fast = _warm_fast(how, present, d, tensors, res, layers, static is not None)
    # The stamp's token: the out= check's, or for the prepared launch's own new outputs (contiguous, of the
    # shapes of this key) one of this entry's: their records are copied from the last call's (_stamp's static).
    token = static if static is not None or fast is None else object()
    entry = (guard, d, present, how, token, fast)
    if key not in _WARM and len(_WARM) >= _WARM_KEYS:
        _WARM.clear()
    _WARM[key] = [entry, *_WARM.get(key, ())][:_WARM_PER_KEY]


def _warm_fast(how, present, d, tensors, res, layers, addressed=False):
    # Where the call's whole conversion was one layer function's prepared launch (its outputs are all the
    # call's, in its order, from the inputs of the same names): (that launch, the names, the CUDA device it is
    # bound to or None, whether it does torch copies, its graph slot: _warm_graph_slot). A hit then calls it
    # directly; None: a hit goes through _convert. addressed: the key holds every input's and output's address
    # (an out= call).
    layer = layers.get((how, present))
    names = tuple(res)
    if layer is None or any(n not in tensors or tensors[n] is None for n in names):
        return None
    xs = tuple(tensors[n] for n in names)
    key = _prepared_key(layer, xs, d)
    run = _PREPARED.get(key) if key is not None else None
    if run is None or getattr(run, "names", None) != names:
        return None
    device, copies = key[-1] if xs[0].is_cuda else None, getattr(run, "copies", True)
    return run, names, device, copies, _warm_graph_slot(run, device, copies, addressed)


def _warm_graph_slot(run, device, copies, addressed):
    # A CUDA graph of the prepared launch can replace it on a hit only where the replay reads exactly the
    # tensors of the hit: the key holds every input's and output's address (out=; without it the outputs are
    # new each call), the launch is bound to a CUDA device (a hit on another current device takes no fast
    # run at all) and it is one kernel launch and nothing else (torch copies would bump version counters
    # that a replay does not; the stamp reads them). Then a list [None] that the first hit fills with the
    # graph (or False: its capture failed, never tried again); the slot lives and dies with the entry.
    if not _WARM_GRAPHS or not addressed or device is None or copies or not getattr(run, "launches", False):
        return None
    return [None]


def _warm_run(fast, tensors, out):
    # The prepared launch of a hit (None: the CUDA device it was bound to is not the current one). Autograd
    # and inference mode are switched off (_plain) where they matter: for the launch alone (a kernel writing
    # memory, torch.empty) only inference mode does (it would make inference tensors, with no version counter).
    # An entry with a graph slot replays its graph instead where _warm_replayed allows (nothing is allocated).
    run, names, device, copies, graph = fast
    if device is not None and torch.cuda.current_device() != device:
        return None
    if graph is not None and _WARM_GRAPHS and _warm_replayed(graph, run, [tensors[n] for n in names], out):
        return {n: out[n] for n in names}
    if copies or torch.is_inference_mode_enabled():
        return _plain(run, [tensors[n] for n in names], out)
    return run([tensors[n] for n in names], out)


def _warm_replayed(graph, run, xs, out):
    # Replays the entry's graph of `run(xs, out)` on the current stream (the stream a direct launch takes, so
    # the order with the caller's other work is the same); False: launch directly instead. Not while the
    # caller captures a graph on this stream (the direct launch is then captured into theirs: no nesting) or
    # a Triton launch hook is set (a profiler's: the direct launch calls it). The first hit captures.
    state = graph[0]
    if state is False or torch.cuda.is_current_stream_capturing():
        return False
    if state is None:
        state = graph[0] = _warm_capture(run, xs, out)
        if not state:  # None: a launch hook was set, captured on a later hit
            return False
    if _hooked(state[1].launch_enter_hook) or _hooked(state[1].launch_exit_hook):
        return False
    state[0].replay()
    return True


def _warm_capture(run, xs, out):
    # (graph, Triton's launch hooks) of the prepared launch into `out`, captured on a side stream of the
    # current device (capture runs nothing; the replay after it does this call's work); None while a launch
    # hook is set; False where anything fails: the hit then launches directly, and so does every later hit of
    # the entry. The capture allocates nothing (out= given, no copies), so the graph's memory pool stays
    # empty; the graph is freed with the entry. thread_local: other threads' CUDA calls are not affected.
    try:
        import triton
    except ImportError:  # no Triton: no compiled kernel either
        return False
    try:
        knobs = triton.knobs.runtime
        if _hooked(knobs.launch_enter_hook) or _hooked(knobs.launch_exit_hook):
            return None
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                run(xs, out)
            finally:
                graph.capture_end()
    except Exception:  # noqa: BLE001 -- not capturable here (another Triton, a launch the driver refuses): direct
        return False
    return graph, knobs


def _warm_widened(before, after):
    # Whether _widened converted an input (a new tensor per call: such calls are not remembered).
    return any(after[k] is not v for k, v in before.items())


def _warm_remembered(lowering, tensors, lowerings):
    # Whether _choose_lowering remembered its choice for this call (not when an environment variable allowed it).
    device = next((t.device for t in tensors.values() if t is not None), torch.device("cpu"))
    hit = _CHOSEN.get((id(lowerings), lowering, device))
    return hit is not None and hit[0] is lowerings
