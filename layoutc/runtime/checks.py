"""Run-time checks of generated converters: the contract at the module boundary.

Copied whole into every generated converter (after :mod:`layoutc.runtime.dimsolve`), which must depend on
torch alone (plus the standard library). The functions check what a kernel never checks: names,
dtypes, devices and shapes of the tensors handed over, the sizes the transforms need, and the
library version the layout belongs to; they choose a lowering from the table the code generator
writes (:mod:`layoutc.lower.registry`) and load the generated Triton kernels on first use.
"""

import difflib
import importlib.metadata
import importlib.util
import linecache
import os

import torch

from .dimsolve import _solve_dims  # copied into converters before this module


class LayoutError(ValueError):
    """Tensors handed to a converter do not match its spec's contract."""


def _fmt_dims(d):
    return ", ".join(f"{k}={v}" for k, v in d.items())


def _fmt_shape(shape):
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _check_tensors(tensors, contract, shapes, axes, dims, all_dims, what):
    # Names, types, dtypes and devices first; then dims from the shapes; then every shape.
    if not hasattr(tensors, "keys") or not hasattr(tensors, "__getitem__"):
        raise LayoutError(f"{what}() takes a mapping from tensor names to tensors, got {type(tensors).__name__}")
    for name in tensors:
        if name not in contract:
            known = ", ".join(contract)
            close = difflib.get_close_matches(str(name), list(contract), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise LayoutError(f"{what}: unexpected tensor {name!r}{hint}; this spec takes {known}")
    given = {k: tensors[k] for k in tensors if tensors[k] is not None}
    for name, c in contract.items():
        if name not in given and not c["optional"]:
            raise LayoutError(f"{what}: missing tensor {name!r} ({c['dtype']}{_fmt_shape(c['shape'])})")
    first = None
    for name, t in given.items():
        c = contract[name]
        if not isinstance(t, torch.Tensor):
            raise LayoutError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if str(t.dtype).removeprefix("torch.") not in c["torch_dtypes"] + c.get("widens", ()):
            allowed = " or ".join("torch." + n for n in c["torch_dtypes"] + c.get("widens", ()))
            raise LayoutError(f"{name}: expected {c['dtype']} ({allowed}), got {t.dtype}")
        if first is None:
            first = (name, t.device)
        elif t.device != first[1]:
            raise LayoutError(f"{name} is on {t.device} but {first[0]} is on {first[1]}; "
                              "pass all tensors on one device")
        if t.dim() != len(c["shape"]):
            raise LayoutError(
                f"{name}: expected {len(c['shape'])} axes {_fmt_shape(c['shape'])}, got shape {_fmt_shape(t.shape)}"
            )
    d, origin = _solve_dims(given, axes, dims, all_dims, what, LayoutError)
    for name, t in given.items():
        expected = tuple(shapes[name](**d))
        if tuple(t.shape) != expected:
            # The dims came from the first tensors; blame the one that disagrees with all the others.
            name, d, origin = _odd_one_out(given, shapes, axes, dims, all_dims, what) or (name, d, origin)
            t, expected = given[name], tuple(shapes[name](**d))
            sym = _fmt_shape(contract[name]["shape"])
            read = "; ".join(f"{k}={v} from {origin[k]}" for k, v in d.items())
            raise LayoutError(
                f"{name}: expected shape {sym} = {_fmt_shape(expected)}, got {_fmt_shape(t.shape)} ({read})"
            )
    present = frozenset(k for k in given if contract[k]["optional"])
    return d, present


def _odd_one_out(given, shapes, axes, dims, all_dims, what):
    # The one tensor whose shape the dims read off every other tensor do not give (a transposed
    # w13_weight, not w13_weight_scale that its misread dims then contradict); None when not one.
    found = []
    for name in given:
        others = {k: t for k, t in given.items() if k != name}
        try:
            d, origin = _solve_dims(others, axes, dims, all_dims, what, LayoutError)
            if all(tuple(t.shape) == tuple(shapes[k](**d)) for k, t in others.items()):
                found.append((name, d, origin))
        except LayoutError:  # the others do not determine the dims, or contradict each other
            continue
    return found[0] if len(found) == 1 else None


def _widened(tensors, contract):
    # An input declared `f32[...] accepts bf16` may arrive as bf16: converted exactly (the compiler
    # allows only widenings that lose nothing) before the transforms, which see the declared type.
    out = dict(tensors)
    for name, (widens, to) in _widening(contract).items():
        t = out.get(name)
        if t is not None and t.dtype in widens:
            out[name] = t.to(to)
    return out


_WIDENING = {}


def _widening(contract):
    # Per input that accepts narrower dtypes: those dtypes and the declared one; worked out once per
    # contract (a warm call then reads no dtype names).
    hit = _WIDENING.get(id(contract))
    if hit is None or hit[0] is not contract:
        table = {name: (frozenset(getattr(torch, n) for n in c["widens"] if hasattr(torch, n)),
                        getattr(torch, c["torch_dtypes"][0])) for name, c in contract.items() if c.get("widens")}
        hit = _WIDENING[id(contract)] = (contract, table)
    return hit[1]


#: Call signatures that passed every check, with their dims and variant key (bounded below).
_CHECKED = {}


def _signature(tensors, dims, what):
    # What the checks depend on, and nothing else: tensor names, types, dtypes, shapes and devices,
    # and the given dims. None when the call is not a plain mapping of tensors (checked in full).
    try:
        parts = tuple((k, None) if t is None else (k, type(t), t.dtype, t.shape, t.device) for k, t in tensors.items())
        # the value's type too: 3.0, True and numpy ints compare and hash equal to 3, and must not
        # ride on the entry a plain int passed (the dims check refuses them)
        given = None if dims is None else tuple(sorted((k, type(v), v) for k, v in dims.items()))
        key = (what, parts, given)
        hash(key)
    except Exception:  # noqa: BLE001 -- not a mapping of tensors: _check_tensors says what is wrong
        return None
    return key


def _check_call(tensors, dims, what, contract, shapes, axes, all_dims, conditions, checks):
    # Every check a call needs before any work: the contract (names, types, dtypes, devices,
    # shapes), the dims, the size conditions that choose branches, and the divisibility the
    # transforms need. Returns (dims, variant key). A warm call with the signature of one that
    # passed costs a dict lookup (the checks are functions of the signature alone).
    key = _signature(tensors, dims, what)
    hit = _CHECKED.get(key) if key is not None else None
    if hit is not None:
        return hit
    d, present = _check_tensors(tensors, contract, shapes, axes, dims, all_dims, what)
    present = present | _holding(conditions, d)  # size conditions ('if I > 128') choose branches too
    _check_divisibility(checks, d, {k for k in tensors if tensors[k] is not None}, present)
    if key is not None:
        if len(_CHECKED) >= 256:
            _CHECKED.clear()
        _CHECKED[key] = (d, present)
    return d, present


_EXPECTED = {}


def _check_outputs(out, shapes, d, what):
    # The converter's post-condition: every output has the shape its declaration gives for these
    # dims. A mismatch is a spec whose transforms disagree with its contract on sizes the verifier
    # did not try: name it instead of handing the kernel a tensor of the wrong size.
    # Keyed by id(shapes) with `shapes` kept in the entry and compared: an id is reused once its
    # object is freed, and another converter's table at that id must not read this one's shapes.
    key = (id(shapes), tuple(d.items()))
    hit = _EXPECTED.get(key)
    if hit is None or hit[0] is not shapes:
        if len(_EXPECTED) >= 256:
            _EXPECTED.clear()
        hit = _EXPECTED[key] = (shapes, {name: tuple(f(**d)) for name, f in shapes.items()})
    expected = hit[1]
    for name, t in out.items():
        if t.shape != expected[name]:
            raise LayoutError(
                f"{what}: the transforms produced {name} with shape {_fmt_shape(t.shape)} but the output "
                f"declaration gives {_fmt_shape(expected[name])} here ({_fmt_dims(d)}); "
                "the spec is wrong for these sizes"
            )


#: out= mappings that passed _check_out, by what the checks read (bounded below).
_OUT_CHECKED = {}


def _out_key(out, tensors, d, present, shapes):
    # What _check_out reads: each output's name, type, dtype, shape, device, address, contiguity and modes,
    # the inputs' extents (aliasing), the dims and variant. None when it cannot be read (checked in full).
    try:
        key = [id(shapes), tuple(d.values()), present]
        for k, t in out.items():  # strides, not contiguity: the stamp's records (static) keep them
            key += (k, type(t), t.dtype, t.shape, t.device, t.data_ptr(), t.stride(), t.is_contiguous(),
                    t.requires_grad, t.is_inference())
        for t in tensors.values():
            if t is not None:
                key += (t.data_ptr(), t.nbytes) if t.is_contiguous() else (t.data_ptr(), t.shape, t.stride(), t.dtype)
        key = tuple(key)
        hash(key)
    except Exception:  # noqa: BLE001 -- not a mapping of tensors: _check_out says what is wrong
        return None
    return key


def _span(t):
    # The bytes [start, end) a tensor's elements occupy (none for an empty tensor).
    if t.numel() == 0:
        return None
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 1)
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _check_out(out, tensors, d, present, contract, shapes, what="convert"):
    # convert(..., out=): the caller's tensors the outputs are written into. Each must be the output's
    # declared dtype (or a torch alias of it), shape and device, contiguous and 16-byte aligned (as
    # torch.empty makes them: the fused kernels store whole words at their addresses), writable
    # without autograd and with a version counter (the guard reads it), and share no byte with an
    # input (converters never modify inputs) or another output. Checked once per key (_out_key); returned is
    # a token of that key (None: not remembered): the stamp copies the records of outputs under that token
    # (a small object: hashed on every call, where the key is a hundred values).
    key = _out_key(out, tensors, d, present, shapes)
    hit = _OUT_CHECKED.get(key) if key is not None else None
    if hit is not None and hit[0] is shapes:  # the key holds id(shapes): the entry keeps it
        return hit[1]
    if not hasattr(out, "items") or not hasattr(out, "__getitem__"):
        raise LayoutError(f"{what}: out= takes a mapping from output names to tensors, got {type(out).__name__}")
    wanted = [n for n, c in contract.items() if not c["optional"] or n in present]
    for name in out:
        if name not in wanted:
            close = difflib.get_close_matches(str(name), wanted, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise LayoutError(f"{what}: out= has {name!r}{hint}, which this call does not produce; it writes "
                              f"{', '.join(wanted)}")
    device = next((t.device for t in tensors.values() if t is not None), None)
    spans = []
    for name in wanted:
        c, t = contract[name], out.get(name) if hasattr(out, "get") else out[name]
        expected = tuple(shapes[name](**d))
        declared = f"{c['dtype']}{_fmt_shape(c['shape'])} = {_fmt_shape(expected)}"
        if t is None:
            raise LayoutError(f"{what}: out= lacks {name!r} ({declared}); pass every output this call writes")
        if not isinstance(t, torch.Tensor):
            raise LayoutError(f"out[{name!r}]: expected a torch.Tensor, got {type(t).__name__}")
        if str(t.dtype).removeprefix("torch.") not in c["torch_dtypes"]:
            allowed = " or ".join("torch." + n for n in c["torch_dtypes"])
            raise LayoutError(f"out[{name!r}]: expected {c['dtype']} ({allowed}), got {t.dtype}")
        if tuple(t.shape) != expected:
            raise LayoutError(f"out[{name!r}]: expected shape {_fmt_shape(c['shape'])} = {_fmt_shape(expected)} "
                              f"({_fmt_dims(d)}), got {_fmt_shape(t.shape)}")
        if t.device != device:
            raise LayoutError(f"out[{name!r}] is on {t.device} but the inputs are on {device}")
        if not t.is_contiguous() or (t.numel() and t.data_ptr() % 16):
            raise LayoutError(f"out[{name!r}] must be contiguous and start at a 16-byte aligned address (as "
                              "torch.empty makes it): the kernels write whole words")
        if t.requires_grad:
            raise LayoutError(f"out[{name!r}] requires grad; the converter writes it outside autograd: pass a "
                              "tensor made under torch.no_grad() or .detach()")
        if t.is_inference():
            raise LayoutError(f"out[{name!r}] is an inference tensor (made under torch.inference_mode): it has no "
                              "version counter for the guard to read; allocate the outputs outside inference_mode")
        spans.append((f"out[{name!r}]", _span(t)))
    inputs = [(f"the input {k!r}", _span(t)) for k, t in tensors.items() if t is not None]
    for i, (a, sa) in enumerate(spans):
        for b, sb in spans[i + 1:] + inputs:
            if sa is not None and sb is not None and sa[0] < sb[1] and sb[0] < sa[1]:
                raise LayoutError(f"{a} shares memory with {b}: converters never write into their inputs, and "
                                  "each output needs its own memory")
    if key is None:
        return None
    if len(_OUT_CHECKED) >= 256:
        _OUT_CHECKED.clear()
    _OUT_CHECKED[key] = (shapes, object())  # a new token per entry: one cleared and made again is another
    return _OUT_CHECKED[key][1]


def _into(res, out):
    # The results of a convert(..., out=) call as the caller's tensors: those the kernels wrote in place
    # are returned as given; others (a lowering that allocates its results) are copied in.
    given = {}
    for name, y in res.items():
        t = out[name]
        if y is not t and (y.data_ptr() != t.data_ptr() or y.shape != t.shape):  # a prepared launch returns t
            t.view(y.dtype).copy_(y)
        given[name] = t
    return given


def _plain(fn, *args):
    # fn(*args) with autograd off and outside inference mode (plain tensors out, with the version counters
    # the guard reads), entering only the modes that are on: `with torch.inference_mode(False),
    # torch.no_grad()` took ~5 us per call (benchmarks/host_time.py); setting the grad mode ~0.3 us.
    if torch.is_inference_mode_enabled():
        with torch.inference_mode(False), torch.no_grad():
            return fn(*args)
    if not torch.is_grad_enabled():
        return fn(*args)
    torch._C._set_grad_enabled(False)
    try:
        return fn(*args)
    finally:
        torch._C._set_grad_enabled(True)


def _holding(conditions, d):
    # The labels of the size conditions ('I > 128') that hold for these dims.
    return frozenset(label for label, test in conditions if test(**d))


def _check_divisibility(checks, d, given, present):
    # (tensor, value, multiple, message, variants): value(dims) % multiple must be 0; a multiple of 0
    # marks a predicate that must hold (a lower bound: assume I >= 128).
    for tensor, value, multiple, message, variants in checks:
        if tensor is not None and (tensor not in given or (variants is not None and present not in variants)):
            continue
        v = value(**d)
        if multiple == 0:
            if not v:
                raise LayoutError(f"{message}; here {_fmt_dims(d)}")
        elif v % multiple:
            raise LayoutError(f"{message}; here it is {v} ({_fmt_dims(d)})")


def _owned(x, inputs):
    # Outputs never share memory with inputs: a later in-place edit of one must not change the other.
    x = x.contiguous()
    ptr = x.untyped_storage().data_ptr()
    for t in inputs.values():
        if t is not None and t.untyped_storage().data_ptr() == ptr:
            return x.clone()
    return x


def _version_ok(installed, op, wanted):
    try:
        from packaging.version import Version
    except ImportError:  # torch vendors packaging
        from torch._vendor.packaging.version import Version
    a, b = Version(installed), Version(wanted)
    return {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "==": a == b, "!=": a != b,
            "~=": a >= b and a.release[: max(1, len(b.release) - 1)] == b.release[: max(1, len(b.release) - 1)]}[op]


_REQUIRES_CHECKED = []


def _check_requires(requires, spec_name):
    # The layout belongs to a library version; a different installed version may expect another layout.
    if _REQUIRES_CHECKED:
        return
    for lib, dist, op, version in requires:
        try:
            installed = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        if not _version_ok(installed, op, version):
            raise LayoutError(
                f"{spec_name} produces the layout of {lib} {op} {version}, but {lib} {installed} is installed; "
                f"its kernels may expect another layout"
            )
    _REQUIRES_CHECKED.append(True)


_KERNELS = {}


def _triton_kernels(source, filename):
    # The generated Triton kernels, compiled on first use (Triton is only needed for CUDA lowering).
    if "kernels" not in _KERNELS:
        try:
            import triton
            import triton.language as tl
        except ImportError:
            raise LayoutError("lowering='fused' needs triton (pip install triton); use 'auto' or 'eager'") from None

        namespace = {"triton": triton, "tl": tl, "__name__": filename}
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), namespace)
        _KERNELS["kernels"] = namespace
    return _KERNELS["kernels"]


_LAUNCHES = {}
#: Launch a layer kernel's compiled kernel directly once Triton has launched it for the key (False:
#: Triton's own launch on every call; benchmarks/host_time.py times both).
_DIRECT_LAUNCH = True


def _launch(kernel, programs, args, consts, num_warps):
    # Launch a generated layer kernel on `programs` programs. Triton's own launch binds and
    # specialises every argument on each call: about 90 us of host time for a layer kernel with ~30
    # constexpr arguments on the H200 (benchmarks/host_time.py), more than converting a small layer
    # takes. The compiled kernel that launch returns is kept per key (current device, the
    # arguments' dtypes and 16-byte alignment, the constexpr values: what Triton specialises on
    # here, as there are no integer arguments), and
    # later calls with the same key launch it directly. Where Triton's objects do not look as
    # expected (another version, the interpreter) every call takes Triton's own launch.
    key = (id(kernel), torch.cuda.current_device() if args[0].is_cuda else -1,
           tuple(a.dtype for a in args), tuple(a.data_ptr() % 16 == 0 for a in args), tuple(consts.values()))
    # Returns the compiled kernel when it can be launched directly (else None): _prepare keeps it.
    hit = _LAUNCHES.get(key) if _DIRECT_LAUNCH else None  # (kernel, compiled): the id is compared with it
    compiled = hit[1] if hit is not None and hit[0] is kernel else None
    if compiled is not None:
        compiled[(programs, 1, 1)](*args, *consts.values())
        return compiled
    compiled = kernel[(programs,)](*args, **consts, num_warps=num_warps)
    names = list(getattr(kernel, "arg_names", ()))
    direct = (args[0].is_cuda and hasattr(compiled, "__getitem__") and hasattr(compiled, "function")
              and names[len(args):] == list(consts) and len(names) == len(args) + len(consts))
    _LAUNCHES[key] = (kernel, compiled if direct else None)
    return _LAUNCHES[key][1]


#: What Triton's per-call runner (CompiledKernel.__getitem__) must say for _direct to call its launcher
#: itself: the launch convention, checked in the source of the Triton that is installed.
_RUNNER_LINES = ("launch_metadata = self.launch_metadata(grid, stream, *args)",
                 "self.run(grid[0], grid[1], grid[2], stream, self.function, self.packed_metadata, launch_metadata,",
                 "knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)")
_RUNNER_CHECKED = {}


def _direct(compiled, programs, pointers=0):
    # The launch of a prepared call. compiled[grid] makes a runner on every call that looks up the device,
    # the stream and Triton's launch hooks through its driver proxy (~11 us per launch of a layer kernel on
    # the H200 host, benchmarks/host_time.py). Where the installed Triton's runner is the one read above,
    # its launcher, kernel function and metadata are bound once; a call reads the current stream and
    # takes Triton's own runner whenever a launch hook is set (a profiler's). The first `pointers`
    # arguments are tensors on the device the launch is bound to (the prepared run's inputs, which the call's
    # checks put on one device, and its outputs, allocated there or checked to be there): they go to the
    # launcher as their addresses, which it takes as they are, where for a tensor it calls data_ptr and asks
    # the driver (cuPointerGetAttribute) whether the address is a device's, one driver call per tensor before
    # the launch (benchmarks/prelaunch.py).
    runner = compiled[(programs, 1, 1)]
    try:
        import inspect

        import triton
    except ImportError:  # no Triton (a fake kernel in tests): its runner
        return runner
    try:
        cls = type(compiled)
        if cls not in _RUNNER_CHECKED:
            text = " ".join(inspect.getsource(cls.__getitem__).split())
            _RUNNER_CHECKED[cls] = all(" ".join(line.split()) in text for line in _RUNNER_LINES)
        knobs = triton.knobs.runtime
        if not _RUNNER_CHECKED[cls] or not compiled.function:
            return runner
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
        stream, device = torch._C._cuda_getCurrentRawStream, torch.cuda.current_device()
    except Exception:  # noqa: BLE001 -- another Triton: its own runner, every call
        return runner

    def launch(*args):
        if _hooked(knobs.launch_enter_hook) or _hooked(knobs.launch_exit_hook):
            return runner(*args)
        return run(programs, 1, 1, stream(device), function, packed, None, None, None,
                   *[t.data_ptr() for t in args[:pointers]], *args[pointers:])

    return launch


def _hooked(hook):
    # A launch hook is set: a function (older Triton), or a chain of hooks that is not empty (newer).
    return hook is not None and (not hasattr(hook, "calls") or bool(hook.calls))


#: Prepared launches of layer functions: (layer, dims, dtypes, device) -> a function of the inputs.
_PREPARED = {}


def _prepared_key(layer, xs, d):
    # What a layer function's work depends on besides the bytes: the dims (which give every shape,
    # grid and constexpr), the inputs' dtypes and device; None when an input is not contiguous and
    # 16-byte aligned (the layer function then copies it first, every call) or direct launches are off.
    if not _DIRECT_LAUNCH:
        return None
    key = [layer, *d.values()]
    for x in xs:
        if not x.is_contiguous() or x.data_ptr() % 16:
            return None
        key.append(x.dtype)
    x = xs[0]
    key.append(x.device)
    if x.is_cuda:
        key.append(torch.cuda.current_device())
    return tuple(key)


def _prepare(key, compiled, programs, consts, out, args, apart):
    # After a full call of a layer function: what a later call with the same key needs, the outputs'
    # shapes and dtypes, the copies done apart (their views) and the compiled kernel with its grid
    # and constexpr values bound, so that call allocates and launches and nothing else (the host
    # time of a warm call; benchmarks/host_time.py). The kernel reads only the tensors' addresses, so
    # the inputs are passed as they come (the views the full call made are bit views of the same
    # memory: _prepared_key admits only contiguous, aligned inputs, which the full call passed as is).
    if key is None or (programs and compiled is None):
        return
    names, ys = list(out), list(out.values())
    shapes = tuple((tuple(y.shape), y.dtype) for y in ys)
    device = ys[0].device if ys else None
    protos = [None]  # made by the first run that allocates (a run into out= never needs them)
    copies = tuple((i, args[2 * i].dtype, args[2 * i + 1].dtype) for i in apart)
    launch = _direct(compiled, programs, 2 * len(names)) if programs else None
    constants = tuple(consts.values())

    def run(xs, outs=None):
        # New contiguous plain tensors, as the full call's torch.empty (x.new_empty would keep a tensor subclass):
        # torch.empty_like of a prototype (_empty_proto), ~40% less host time than torch.empty of a shape on the
        # H200 host, before the launch (six outputs: 10-20 us against 17-31, benchmarks/results/2026-12-03-fprun);
        # or the caller's out= tensors (checked by _check_out: shapes, aliases, contiguous and aligned).
        if outs is not None:
            ys = [outs[name] for name in names]
        else:
            made = protos[0]
            if made is None:  # two threads may both make them: the same prototypes
                made = protos[0] = [_empty_proto(shape, dtype, device) for shape, dtype in shapes]
            ys = [torch.empty_like(p) if isinstance(p, torch.Tensor) else torch.empty(p[0], dtype=p[1], device=device)
                  for p in made]
        for i, vx, vy in copies:
            ys[i].view(vy).copy_(xs[i].view(vx))
        if launch is not None:
            launch(*[t for pair in zip(xs, ys) for t in pair], *constants)
        return dict(zip(names, ys))

    run.names = tuple(names)  # the outputs it writes, in order, from the inputs of the same names (runtime.warm)
    run.copies = bool(copies)  # torch copies besides the launch (autograd must be off for them: runtime.warm)
    run.launches = launch is not None  # one kernel launch (a CUDA graph of it may replace it: runtime.warm)
    if len(_PREPARED) >= 256:
        _PREPARED.clear()
    _PREPARED[key] = run


def _empty_proto(shape, dtype, device):
    # What a prepared run allocates an output of `shape` from: one element of `dtype` on `device` expanded to the
    # shape (torch.empty_like of it is a new contiguous tensor of the shape: sizes read from the tensor, not parsed
    # from a tuple), where that gives torch.empty's strides (checked once here); else (shape, dtype) for
    # torch.empty (no elements: empty_like of an expanded tensor gives zero strides).
    if not shape or 0 in shape:
        return shape, dtype
    proto = torch.empty(1, dtype=dtype, device=device).expand(shape)
    probe = torch.empty_like(proto)
    want = torch.empty(shape, dtype=dtype, device="meta")
    same = probe.is_contiguous() and probe.stride() == want.stride() and type(probe) is torch.Tensor
    return proto if same else (shape, dtype)


#: A tensor the layer copies as is, of at least this many bytes, is copied by torch (the device's
#: own copy, the speed every conversion is measured against) rather than by the layer kernel: on
#: the H200 (benchmarks/copy_sweep.py, 2026-11-30) the cutedsl relu2 spec at the gpt-oss-120b layer
#: took 0.676 ms against 0.702 ms with the copy in the layer kernel, and single calls of the three
#: specs with such a tensor were 2-15% faster (the copy starts while the host still prepares the
#: layer kernel). Below it, the extra launch's host time would cost more than it saves.
_COPY_APART_BYTES = 1 << 20


def _output(outs, name, shape, dtype, device):
    # A layer function's output: a new tensor, or the caller's (convert(..., out=), checked by _check_out) as
    # the dtype the kernel writes (a torch alias of the same width).
    if outs is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return outs[name].view(dtype)


def _copy_apart(x):
    return x.numel() * x.element_size() >= _COPY_APART_BYTES


def _row_tile(cols, most):
    # Columns per tile of the rows walk, a power of two (Triton's ranges are): of 64 up to `most`,
    # the one whose tiles waste the fewest lanes past the row's end, the larger on a tie; a row of
    # 64 or fewer takes one tile. (A 1472-byte row in 1024-column tiles left 28% of the lanes idle.)
    if cols <= 64:
        return 1 << max(0, (cols - 1).bit_length())
    waste, tile = min((-(-cols // t) * t - cols, -t) for t in (1024, 512, 256, 128, 64) if t <= most)
    return -tile


def _choose_lowering(lowering, tensors, lowerings):
    # `lowerings` is the code generator's table (layoutc.lower.registry): per lowering its name, the
    # device types it runs on (None: any), those 'auto' picks it for, the module it needs, the
    # environment variable that lets it run on the CPU (Triton's interpreter), and what to say
    # when it is asked for on the wrong device. 'auto' takes the first that fits, else the last: the
    # inline lowering (eager), which runs anywhere.
    device = torch.device("cpu")
    for t in tensors.values():
        if t is not None:
            device = t.device
            break
    key = (id(lowerings), lowering, device)
    hit = _CHOSEN.get(key)
    if hit is not None and hit[0] is lowerings:
        return hit[1]
    names = [entry[0] for entry in lowerings]
    if lowering != "auto" and lowering not in names:
        choices = ", ".join(repr(n) for n in ["auto"] + names)
        raise LayoutError(f"lowering must be one of {choices}, got {lowering!r}")
    for name, devices, auto_on, needs, cpu_env, wrong_device in lowerings:
        if lowering == name:
            if devices is not None and device.type not in devices:
                if not (cpu_env and os.environ.get(cpu_env) == "1"):
                    raise LayoutError(f"lowering={name!r} {wrong_device} (these are on {device}); use "
                                      f"{' or '.join(repr(n) for n in names if n != name)} here"
                                      + (f", or set {cpu_env}=1" if cpu_env else ""))
                key = None  # allowed by an environment variable, which may change: not remembered
            if not _importable(needs):
                raise LayoutError(f"lowering={name!r} needs the module {needs!r}, which is not installed; "
                                  f"use {' or '.join(repr(n) for n in names if n != name)}")
            return _chosen(key, lowerings, name)
        if lowering == "auto" and device.type in auto_on and _importable(needs):
            return _chosen(key, lowerings, name)
    return _chosen(key, lowerings, names[-1])


#: The lowering chosen per (table, lowering asked for, device): a warm call looks it up.
_CHOSEN = {}


def _chosen(key, lowerings, name):
    if key is not None:
        if len(_CHOSEN) >= 256:
            _CHOSEN.clear()
        _CHOSEN[key] = (lowerings, name)
    return name


_IMPORTABLE = {}


def _importable(module):
    if module is None:
        return True
    if module not in _IMPORTABLE:  # found, not imported: importing triton costs a second
        _IMPORTABLE[module] = importlib.util.find_spec(module) is not None
    return _IMPORTABLE[module]


#: Inline PTX in the generated kernels (byte permutes); False runs their shift-and-mask fallback.
_INLINE_ASM = True


def _inline_asm(t):
    # Only for kernels compiled for CUDA: Triton's interpreter runs the kernels as Python.
    return _INLINE_ASM and t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"


def _aligned(x, align=16):
    # Fused kernels load whole words of up to 16 bytes: an input that starts at an odd address
    # (a slice of a larger buffer) is copied first instead of failing in the kernel's view.
    x = x.contiguous()
    if (x.storage_offset() * x.element_size()) % align or x.data_ptr() % align:
        x = x.clone()
    return x


def _compiled(fn):
    # torch.compile of a gather part, once per function (inductor specialises per shape).
    if fn not in _KERNELS:
        _KERNELS[fn] = torch.compile(fn, dynamic=False)
    return _KERNELS[fn]


def _convert_in_chunks(convert_part, tensors, d, present, how, chunk, inplace, out_shapes, chunk_dim):
    # Convert `chunk` experts at a time into preallocated outputs (or into the inputs' own memory).
    if chunk_dim is None:
        raise LayoutError("chunk/inplace need an expert axis shared by every tensor, which this spec does not have")
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise LayoutError(f"chunk must be a positive number of experts, got {chunk!r}")
    n = d[chunk_dim]
    out = {}
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        part = {k: (v[start:stop] if v is not None else None) for k, v in tensors.items()}
        part_dims = dict(d)
        part_dims[chunk_dim] = stop - start
        for name, y in convert_part(part, part_dims, present, how).items():
            if name not in out:
                full = tuple(out_shapes[name](**d))
                x = tensors[name]
                same_bytes = x.numel() * x.element_size() == y.element_size() * (y.numel() // max(1, y.shape[0])) * n
                if inplace and x.is_contiguous() and same_bytes:
                    out[name] = x.view(torch.uint8).reshape(-1).view(y.dtype).reshape(full)
                else:
                    out[name] = torch.empty(full, dtype=y.dtype, device=y.device)
            out[name][start:stop].copy_(y)
    return out
