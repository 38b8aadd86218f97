"""Run tables: a gather plan's map, evaluated once per shape, cut into runs of consecutive elements.

The ``gather`` lowering's element path evaluates the map's index expressions on every call (tens
of int64 passes over the output) and then gathers one element per index. Most maps of the shipped
specs move whole runs: rows (row swaps and shuffles, padding), 128-byte blocks (FP8 block
transposes), 4-byte groups (the 128x4 scale swizzle). Here, per shape and device, once:

* the map's source address of every output element is computed (``index``: the plan's own
  expressions, -1 where the output is the fill) and the longest run length ``g`` is found that
  divides the last axis such that every aligned run of ``g`` output elements reads ``g``
  consecutive input elements (or is fill throughout): the facts come from the map's values,
  checked on every element, not from op names;
* if the runs' start addresses are a mixed-radix affine function of the run number (a strided
  view: transposes, tile permutations, swaps of whole halves), the plan is that view and a call is
  one strided ``copy_``, no table; unless the runs are short (under ``_RUN_VIEW_BYTES``) and the
  view has more than two axes, where the table below is faster;
* else, if a table of run starts (int32 where the addresses fit) is at most ``_RUN_TABLE_RATIO``
  times the output's bytes (an int32 per byte of a byte shuffle: the 128x4 scale swizzles of
  unaligned widths, whose element gather re-evaluated some forty int64 passes of index arithmetic
  per call, 5-10x the rest of the layer), a call is one ``index_select`` of runs (as words of 2,
  4 or 8 bytes where a run is one aligned word) and an ``index_fill_`` of the fill runs;
* on the CPU, where such a table's runs join into long spans of consecutive elements (``_RUN_SPAN_BYTES`` on
  average: a swap of whole halves, its runs a row each), a ``("spans", ...)`` plan instead: one contiguous
  ``copy_`` a span;
* else ``None``: the caller runs the element gather, as before.

On the CPU, where :mod:`layoutc.lower.native_simd`'s kernel runs, a table of short runs (at most
``_RUN_SIMD_BYTES``) with no fill, whose bytes are blocks of one block's table moved by whole words (or one block
of at most 64 KiB), takes a ``("simd", ...)`` plan instead: the kernel gathers each 64-byte chunk's words (16, 32
or 64) at once and puts their bytes in order (the table read per call: the block's, not an int32 per run).

A words plan's source bytes (``words=True``) take a ``("native", ...)`` plan instead of a table where numba
runs (:mod:`layoutc.lower.native`: expert 0's source byte of each output byte, in blocks, read by the kernel
that also permutes the words' bits; a view too, so no byte is written and read back).

A map whose fill varies over the output (AITER's padded scales: 0 or 127 by where the padding is)
gives, for byte moves, a fill byte ``b`` as ``-1 - b`` in its index: fill runs join only over one
byte, and a table plan carries each fill run's byte (a constant fill, and fill byte 0, read ``-1``).

Tables are remembered per process up to ``_RUN_BYTES_MAX`` bytes in all (a shape past it uses its
plan once, then the element gather): converting a checkpoint of many large layers does not grow
memory by a table per shape without bound.

The functions here are copied whole into generated converters (torch and builtins only);
``tests/lower/test_runs.py`` holds every path to the element gather bit for bit.
"""

from .native import _nb, _nb_blocks, _nb_gomp, _nb_on, _nb_word_quads  # copied beside this module into converters
from .native_simd import _nx_chunks, _nx_on, _nx_run
import torch

_RUN_PLANS = {}  # (converter function, dims, device) -> a plan ("view", "table", "simd", "spans", "native") or None
_RUN_PLANS_MAX = 64  # shapes remembered per process (each table at most _RUN_TABLE_RATIO times its output) ...
_RUN_BYTES_MAX = 256 << 20  # ... and the bytes of their tables: past this, tables are made per call
_RUN_BYTES = [0]
_RUN_TABLE_RATIO = 4  # a table's bytes per output byte, at most: an int32 per byte
# A view whose runs are shorter than this many bytes and that has more than two strided axes is
# gathered through a table instead: a strided copy walks such a view element by element through
# every axis (the SM90 triton_kernels interleave: 9 axes of 1-byte runs, 3x slower than the table;
# the 128x4 scale swizzles: 4-byte runs, 10-50x slower)
_RUN_VIEW_BYTES = 16
_RUN_WORDS = {2: torch.int16, 4: torch.int32, 8: torch.int64}
# Runs of at most this many bytes, on the CPU, take the SIMD kernel where a table's blocks fit it (a "simd" plan,
# layoutc.lower.native_simd): index_select moved 2 MB of one-byte runs in 1.7 ms on the CPU machine, one lookup a
# byte (BENCHMARKS.md); longer runs stay index_select's (a run a lookup)
_RUN_SIMD_BYTES = 8
# Bytes a span of consecutive runs at least holds on average for a table of runs to be copied span by span on the
# CPU (a "spans" plan: a contiguous copy_ each, a few microseconds of call apiece): the swap of a layer's halves,
# 16 spans of 1 MiB, 1.43 ms by index_select of 1 KiB rows, ~1.1 ms as spans (a clone of its bytes ~1.0 ms; 2-core
# Zen 4 machine, BENCHMARKS.md)
_RUN_SPAN_BYTES = 1 << 18
# A strided view copy also moves 16-byte runs as one element: complex128, the one 16-byte type (a copy_ between
# tensors of one dtype moves their bits, no arithmetic: NaN payloads included, checked on random bytes). AITER's
# 16x16 weight shuffle: 8.8 -> 2.9 ms on one thread for 16.8 MB (int64 pairs: an inner loop of 2 per run)
_RUN_VIEW_WORDS = {16: torch.complex128, **_RUN_WORDS}


def _run_gcd(a, b):
    while b:
        a, b = b, a % b
    return a


def _run_refine(starts, have, want):
    # Starts of runs of ``have`` elements (contiguous, or -1: fill) as starts of runs of ``want``
    # (a divisor of ``have``): run k*have + j*want starts j*want after run k.
    if have == want:
        return starts
    ahead = torch.arange(0, have, want, dtype=starts.dtype, device=starts.device)
    fine = starts.unsqueeze(-1) + ahead
    return torch.where(starts.unsqueeze(-1) < 0, starts.unsqueeze(-1), fine).reshape(starts.shape[0], -1)


def _run_affine(starts):
    # (sizes, strides, offset) when starts[f] = offset + sum(digit_k * stride_k) over the digits of
    # f in the mixed radix ``sizes`` (row-major), every value checked; else None.
    flat = starts.reshape(-1)
    n = flat.numel()
    if n == 0 or bool((flat < 0).any()):
        return None
    sizes, strides = [], []
    while flat.numel() > 1 and len(sizes) < 12:
        n = flat.numel()
        step = int(flat[1] - flat[0])
        if step < 0:
            return None  # torch views have no negative strides
        diff = flat[1:] - flat[:-1] != step
        bad = diff.nonzero()
        r = n if bad.numel() == 0 else int(bad[0]) + 1  # the first run of equal steps
        if n % r:
            return None
        rows = flat.view(n // r, r)
        if not bool((rows == rows[:, :1] + step * torch.arange(r, dtype=flat.dtype, device=flat.device)).all()):
            return None
        sizes.insert(0, r)
        strides.insert(0, step)
        flat = rows[:, 0].contiguous()
    if flat.numel() > 1:
        return None
    return sizes, strides, int(flat[0])


def _run_plan(key, index, args, shape, itemsize, expert_stride=None, words=False):
    """The gather plan of one shape (cached by ``key``): see the module's docstring. ``expert_stride``:
    the map reads output expert e from input expert e alone, the same way for every e (the planner
    checked it on the map's expressions); then the addresses of expert 0 are evaluated and the
    others are theirs plus e * expert_stride. ``words``: the source bytes of a words plan, whose
    table the native kernel reads where numba runs (``("native", ...)``; layoutc.lower.native)."""
    native = words and _nb_on("cpu")  # native plans (IR or numba kernels), kept apart from the torch forms'
    simd = not words and _nx_on()  # "simd" plans, kept apart too (LAYOUTC_SIMD=0: none)

    key = tuple(key) + (native, simd)
    got = _RUN_PLANS.get(key, False)  # never False: a plan or None (get: another thread may clear)
    if got is not False:
        return got
    experts = shape[0]
    if expert_stride is not None:
        shape = (min(1, experts),) + tuple(shape[1:])
    n0, last = shape[0], shape[-1]
    per = 1
    for s in shape[1:]:
        per *= s
    plan = None
    if n0 * per and last:
        step = max(1, (1 << 22) // per)  # parts of about 4M elements bound the temporaries
        g, parts = last, []
        for start in range(0, n0, step):
            a = index(*args, start, min(n0, start + step)).reshape(-1, last)
            head, tail = a[:, :-1], a[:, 1:]
            joined = ((tail == head + 1) & (head >= 0)) | ((tail < 0) & (tail == head))  # fill: one byte a run
            for c in (~joined.all(0)).nonzero().flatten().tolist():  # a run ends after column c
                g = _run_gcd(g, c + 1)
            parts.append((a[:, ::g].contiguous(), g))
        starts = torch.cat([_run_refine(s, have, g) for s, have in parts]).reshape(-1)
        affine = _run_affine(starts)
        copies, shift = 1, 0
        if expert_stride is not None:  # every expert's runs: expert 0's, moved (made last, in int32 where they fit)
            copies, shift = experts, expert_stride
            if affine is not None:
                affine = ([experts] + list(affine[0]), [expert_stride] + list(affine[1]), affine[2])
        runs = starts.numel() * copies
        bad0 = starts < 0
        read = bool((~bad0).any())
        wide = read and int(starts.max()) + (copies - 1) * shift >= 2**31 - g
        small = runs * (8 if wide else 4) <= _RUN_TABLE_RATIO * runs * g * itemsize  # bounded by the output
        native = native and small and starts.device.type == "cpu"
        if affine is not None and not native and (g * itemsize >= _RUN_VIEW_BYTES or len(affine[0]) <= 2
                                                  or not small):
            plan = ("view", tuple(affine[0]) + (g,), tuple(affine[1]) + (1,), affine[2])
        elif native:  # the native words kernel: expert 0's source byte of each output byte (padding: -1), moved
            # per expert in the loop that permutes the words' bits (a view too: no bytes written and read back)
            starts = _run_refine(starts, g, 1).reshape(-1)
            wide = read and int(starts.max()) >= 2**31  # (the kernel adds each expert's shift in int64)
            inner, outer, ps = _nb_blocks(starts.to(torch.int64 if wide else torch.int32))  # block-periodic maps
            plan = ("native", inner, outer, ps, copies, shift, _nb_word_quads(inner))
        elif (simd and small and not bool(bad0.any()) and g * itemsize <= _RUN_SIMD_BYTES
              and starts.device.type == "cpu" and (found := _run_simd(starts, g, itemsize, copies, shift))):
            plan = found
        elif small:
            fill = bad0.nonzero().flatten()
            safe = torch.where(bad0, 0, starts)
            aligned = bool((safe % g == 0).all()) and (copies == 1 or shift % g == 0 or not read)
            dtype = torch.int64 if wide else torch.int32
            table = (safe // g if aligned else safe).to(dtype)
            # -1 - b: a fill run of byte b (maps whose fill varies); all -1: the caller's one fill value
            varied = -1 - starts[fill] if bool((starts[fill] != -1).any()) else None
            if copies > 1:  # expert e: expert 0's table plus e strides (fill runs read 0), its fill runs moved
                # (on the tables' device: a CUDA gather's tables are CUDA tensors)
                on = starts.device
                moved = (shift // g if aligned else shift) if read else 0  # table entries an expert moves
                ahead = torch.arange(copies, dtype=dtype, device=on) * moved
                table = (table.unsqueeze(0) + ahead.unsqueeze(1)).masked_fill_(bad0, 0).reshape(-1)
                fill = (fill.unsqueeze(0) + torch.arange(copies, device=on).unsqueeze(1) * starts.numel()).reshape(-1)
                varied = None if varied is None else varied.repeat(copies)
            plan = ("table", g, table, fill if fill.numel() else None, aligned, varied)
            if not fill.numel() and table.device.type == "cpu":
                plan = _run_spans(table * g if aligned else table, g, itemsize) or plan
    kept = ([] if plan is None or plan[0] == "view" else [*plan[1:3], *(plan[6] or ())[:2]] if plan[0] == "native"
            else [*plan[1][:3], plan[2]] if plan[0] == "simd" else [*plan[1]] if plan[0] == "spans"
            else [plan[2], plan[3], plan[5]])
    if not _run_keep(key, plan, kept):
        _RUN_PLANS[key] = None  # no room for its table: this call uses it, later ones the element gather
    return plan


def _run_spans(starts, g, itemsize):
    # A ("spans", (sources, outputs, lengths), end) plan where the runs of g elements at `starts` (every one read,
    # the whole output's in order) join into spans of consecutive elements of _RUN_SPAN_BYTES or more on average:
    # a call is one contiguous copy a span (a swap of whole halves: one an expert half, where index_select took
    # its runs row by row); else None. int64 element offsets; `end` the least source length the spans fit in.
    n = starts.numel()
    if not n:
        return None
    starts = starts.to(torch.int64)
    breaks = torch.ones(n, dtype=torch.bool)
    breaks[1:] = starts[1:] != starts[:-1] + g  # a span starts where a run does not follow the one before
    first = breaks.nonzero().flatten()
    if n * g * itemsize < _RUN_SPAN_BYTES * first.numel():
        return None
    lengths = torch.diff(first, append=torch.tensor([n])) * g
    sources = starts[first]
    return "spans", (sources, first * g, lengths), int((sources + lengths).max())


def _run_simd(starts, g, itemsize, copies, shift):
    # A ("simd", chunks, outer, shift, copies) plan of runs of g elements of itemsize bytes at `starts` (expert 0's,
    # every one read), expert e's moved by e * shift elements, where its byte table is blocks of one block's table
    # moved by whole words (:func:`_nb_blocks`) whose chunks the SIMD kernel takes (:func:`_nx_chunks`); else None.
    # outer and shift in words.
    width = g * itemsize
    table = (starts.to(torch.int64).unsqueeze(1) * itemsize + torch.arange(width)).reshape(-1)
    if (shift * itemsize) % 4 or int(table.max()) + (copies - 1) * shift * itemsize >= 2**33:
        return None  # experts moved by whole words; every word read an int32 index (the kernel's gathers)
    inner, outer, ps = _nb_blocks(table)
    if inner.numel() % 64:  # blocks shorter than a chunk (runs alike only one by one): the whole table one block
        inner, outer = table, torch.zeros(1, dtype=torch.int64)
    if bool((outer % 4).any()):
        return None
    chunks = _nx_chunks(inner)
    return None if chunks is None else ("simd", chunks, (outer // 4).to(torch.int64), shift * itemsize // 4, copies)


def _run_keep(key, value, tensors):
    # Remember ``value`` unless its tensors would take the cache past its bytes; False: not kept.
    size = sum(t.numel() * t.element_size() for t in tensors if t is not None)
    if len(_RUN_PLANS) >= _RUN_PLANS_MAX:
        _RUN_PLANS.clear()
        _RUN_BYTES[0] = 0
    if _RUN_BYTES[0] + size > _RUN_BYTES_MAX:
        return False
    _RUN_BYTES[0] += size
    _RUN_PLANS[key] = value
    return True


def _run_simd_gather(flat, plan, shape):
    # A "simd" plan's output: the SIMD kernel reads `flat`'s bytes as int32 words (a copy padded to whole aligned
    # words where they are not; the kernel checks every block's reads against them)
    _, chunks, outer, shift, copies = plan
    out = torch.empty(shape, dtype=flat.dtype)
    src = flat.contiguous().view(-1).view(torch.uint8)
    if src.numel() % 4 or src.data_ptr() % 4:
        padded = torch.zeros(-(-src.numel() // 4) * 4, dtype=torch.uint8)
        padded[: src.numel()] = src
        src = padded
    words = out.view(-1).view(torch.uint8).view(torch.int32)  # whole chunks of 64 bytes (the plan's blocks are)
    if not _nx_run(src.view(torch.int32), chunks, outer, shift, copies, "identity", words, _nb_gomp()):
        raise RuntimeError("a run plan made for the SIMD kernel met a process where it does not run "
                           "(LAYOUTC_SIMD=0 set while converting?)")
    return out


#: An integer type per element width, to fill any element type by its bits.
_FILL_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _run_gather(flat, plan, shape, fill):
    """The output of ``shape`` from ``flat`` (the input's elements, contiguous) by a plan of
    :func:`_run_plan` (not None)."""
    if plan[0] == "view":
        _, sizes, strides, offset = plan
        out = torch.empty(shape, dtype=flat.dtype, device=flat.device)
        src, base = flat, flat.storage_offset() + offset
        for word, dtype in sorted(_RUN_VIEW_WORDS.items(), reverse=True):  # the copy over the widest words that fit
            k = word // flat.element_size()
            if (k > 1 and word % flat.element_size() == 0 and sizes[-1] % k == 0 and base % k == 0
                    and flat.storage_offset() % k == 0 and all(st % k == 0 for st in strides[:-1])):
                n = flat.numel()
                src, out_w = flat[: n - n % k].view(dtype), out.view(-1).view(dtype)
                sizes_w = tuple(sizes[:-1]) + (sizes[-1] // k,)
                strides_w = tuple(st // k for st in strides[:-1]) + (1,)
                out_w.view(sizes_w).copy_(src.as_strided(sizes_w, strides_w, base // k))
                return out
        out.view(sizes).copy_(src.as_strided(sizes, strides, base))
        return out
    if plan[0] == "simd":
        return _run_simd_gather(flat, plan, shape)
    if plan[0] == "spans":
        (sources, outputs, lengths), end = plan[1], plan[2]
        if end > flat.numel():  # a slice would be cut short where index_select raises
            raise IndexError(f"a run plan reads {end} elements of an input of {flat.numel()}")
        out = torch.empty(shape, dtype=flat.dtype, device=flat.device)
        o = out.view(-1)
        if not len(outputs) or int(outputs[-1] + lengths[-1]) != o.numel():  # spans cover their output in order
            raise ValueError(f"a spans plan of {int(outputs[-1] + lengths[-1]) if len(outputs) else 0} elements "
                             f"for an output of {o.numel()}")
        for source, at, length in zip(sources.tolist(), outputs.tolist(), lengths.tolist()):
            o[at: at + length].copy_(flat[source: source + length])
        return out
    if plan[0] != "table":  # a plan _run_plan never makes: a caller's mistake, not a table to unpack
        raise ValueError(f"a run plan of an unknown kind: {plan[0]!r} (view, simd, spans or table)")
    _, g, table, bad, aligned, varied = plan
    out = torch.empty((table.numel(), g), dtype=flat.dtype, device=flat.device)
    word = _RUN_WORDS.get(g * flat.element_size())
    n = flat.numel()
    if g == 1:  # runs of one element: a 1-D gather (a 2-D one of one-element rows is ~3.5x slower)
        torch.index_select(flat, 0, table, out=out.view(-1))
    elif aligned and word is not None and (flat.storage_offset() * flat.element_size()) % (
            g * flat.element_size()) == 0:
        # a run is one aligned word: a 1-D gather of words
        torch.index_select(flat[: n - n % g].view(word), 0, table, out=out.view(word).view(-1))
    elif aligned:
        torch.index_select(flat[: n - n % g].view(-1, g), 0, table, out=out)
    else:  # runs start anywhere: rows of an overlapping view, one per element
        torch.index_select(flat.as_strided((n - g + 1, g), (1, 1), flat.storage_offset()), 0, table, out=out)
    if varied is not None:  # each fill run's byte (one-byte elements: the planner sends only those)
        out.view(torch.uint8).index_copy_(0, bad, varied.to(torch.uint8).unsqueeze(1).expand(-1, g).contiguous())
    elif bad is not None:  # the fill's bits, through an integer view (index_fill_ has no float8 kernels)
        fill = 0 if fill is None else fill  # a varied fill whose runs all hold byte 0 (-1 - 0: as a constant)
        ibits = _FILL_BITS[flat.element_size()]
        if flat.dtype.is_floating_point:
            value = torch.tensor(fill, dtype=torch.float64).to(flat.dtype).view(ibits).item()
        else:  # a bit pattern (0xBF80: bf16 -1.0 moved as int16) as the signed value of its width
            width = 8 * flat.element_size()
            value = int(fill) % (1 << width)
            value -= (1 << width) if ibits.is_signed and value >= 1 << (width - 1) else 0
        out.view(ibits).index_fill_(0, bad, value)
    return out.view(shape)


def _run_cached(key, fn, args):
    """``fn(*args)``, computed once per ``key`` (a shape's index tables, at most the output's size)."""
    got = _RUN_PLANS.get(key)
    if got is None:
        got = fn(*args)
        _run_keep(key, got, [t for t in got if isinstance(t, torch.Tensor)])
    return got
