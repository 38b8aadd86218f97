"""Native CPU kernels of the words plans, compiled by numba where it is installed.

The torch forms of a bit permutation of 32-bit words (``_permute_words`` and the quads part of
:mod:`layoutc.lower.torch_emit`) pay per-word torch passes: two lookups a word in 65536-entry tables, each an
``index_select`` (serial, about 1.2 ns a lookup on the 2-core CPU machine), after the words' bytes were
gathered into memory by a run table and read back. Here they run as generic kernels, driven by the
plans' data (no code per spec):

* ``_nb_words_k``: a words plan's source bytes by its run table (expert 0's starts alone, moved by
  ``e * shift`` for expert ``e``; a negative entry: padding, byte 0), fused with the bit permutation:
  each word is four lookups in 256-entry tables (``luts[b, v]``: the image of byte value ``v`` at byte
  ``b``, the plan's bytewise value conversions folded in), so the gathered bytes are never written out
  and read back (runs longer than a byte: the table lists each of their bytes);
* ``_nb_wquads_k``: a words plan whose block table is quads (:func:`_nb_word_quads`, found in the table's
  data: four output words whose byte b is byte j of one source word b, a 4x4 byte transpose; Marlin's
  weights, triton_kernels hopper): four source word loads and sixteen lookups a quad, where ``_nb_words_k``
  reads a table entry and a byte for each byte (2-3x less time on Marlin's and hopper's weights, one thread);
* ``_nb_wpairs_k``: the same for pairs (two output words whose half-word c is half-word j of source word c,
  a 2x2 transpose of half-words: CUTLASS W4A8's weights), two lookups a word in tables of whole half-words;
* ``_nb_quads_k``: the SM90 quads (4 source words a quad at a step along a row, or per quad from a cached
  index with unread words; the 4x4 byte transpose; the permutation): the same four tables, indexed by
  byte ``j`` of each source word.

Where the host is x86-64 with AVX-512 VBMI and llvmlite imports, the words plans and the quads plans without unread
words run first through :mod:`layoutc.lower.native_simd`'s kernel where their tables fit it (``LAYOUTC_SIMD=0``:
never); the kernels here run the rest.

A call runs its kernel in parts on ``torch.get_num_threads()`` threads, each taking parts of the output from a
shared counter rather than one fixed share. Where torch runs its ops on OpenMP (``GOMP_parallel`` in the
process: torch's own runtime), the threads are torch's: one OpenMP parallel region (``_nb_omp_run``) whose
body, a numba ``cfunc`` per kernel and argument types, takes parts by an atomic counter. After a parallel
torch op (a clone, a fingerprint's GEMM, the previous tensor's lookups), torch's OpenMP threads spin for a
few milliseconds before they sleep; Python threads of our own then shared the two cores with a spinning
thread, and the kernels took 1.5-2x their time in a quiet process (BENCHMARKS.md), where torch's threads take
the work at once. Elsewhere (no OpenMP, ``LAYOUTC_NUMBA_OMP=0``) the calling thread and worker Python threads
take the parts (each kernel releases the GIL, ``nogil``; a parallel numba loop took longer to compile). Every
address a kernel reads is checked against its source's length: a table or index that would read outside
it makes the call raise (never a read outside the tensor). Plain run tables (no bit permutation) stay
torch's ``index_select``: a numba loop of one-byte lookups was no faster than it on the CPU machine
(BENCHMARKS.md).

Used where ``import numba`` succeeds and ``LAYOUTC_NUMBA`` is not ``0``, on CPU tensors only, unless the IR
kernels of :mod:`layoutc.lower.native_ir` run (x86-64 with llvmlite; ``LAYOUTC_NATIVE_IR=0`` turns them off);
where neither runs the torch forms run, unchanged. ``_nb_values`` (used on every CPU path with or without
numba) makes value conversions of one-byte elements after a run table one lookup in a table of the conversions
of all 256 values, where a conversion changes bits (a relabelling alone stays a view): the SIMD byte lookup
(``native_simd._nx_lut8``, 64 bytes a step) where it runs and the images are one byte each, else ``_nb_lut8_k``
where numba runs, else torch's ``index_select`` by an int32 copy of the bytes.
The kernels compile on their first call in a process (once per process for every
converter that carries them), cached on disk by numba (``cache=True``) where the converter is a module
imported from a ``.py`` file under its own name (in ``__pycache__`` beside it, or numba's user cache
folder); a module loaded from a string (``layoutc.compile_file``) compiles them once per process.

The functions here are copied whole into generated converters (torch and builtins; numba imported on
first use only); ``tests/lower/test_native.py`` holds each kernel to the torch forms bit for bit.
"""

# not copied into converters (torch_emit.native_source copies what follows `import torch`): they carry
# layoutc.runtime.cpu_kernels whole
from ..runtime.cpu_kernels import _fp_gomp, _fp_on_threads
from .native_ir import _ni_block_order, _ni_on, _ni_run
from .native_simd import _nx_chunks, _nx_lut8, _nx_memo, _nx_on, _nx_quads_table, _nx_run, _nx_tables
import torch

_NB_STATE = {}  # "kernels": the compiled kernels (None: numba is missing), "gomp"
#: int64 slots of an OpenMP call's job before its arguments' (3 each): the parts' counter, failures, parts, total
_NB_JOB_HEAD = 4
_NB_MIN_SPLIT = 1 << 16  # words of output under which a call runs on the calling thread alone
_NB_PARTS_PER_THREAD = 8  # parts a thread takes in turn (a slowed thread takes fewer)
# numba.uint64 once numba is imported (_nb): the kernels' indices, each known to be >= 0 (checked against the
# source, or built so), as unsigned, which numba indexes without its test for a negative index (Python's
# wraparound): about 25-30% less time a call (BENCHMARKS.md)
_nb_u = None


def _nb_words_k(src, inner, outer, ps, shift, copies, luts, out, lo, hi):
    # Words [lo, hi) of every expert: output byte i of expert e is src[inner[i & (2**ps - 1)] + outer[i >> ps]
    # + e * shift] (blocks of 2**ps bytes, each its block-0 bytes moved; ps 62: one block), or 0 where the inner
    # entry is negative (padding); word w is OR_b luts[b, byte 4 * w + b]. Returns 1 where an address is outside
    # src (nothing past it is read), else 0. Experts outermost: one expert's reads stay near each other.
    n = src.shape[0]
    per = outer.shape[0] * inner.shape[0] // 4
    pm = (1 << ps) - 1
    for e in range(copies):
        es = e * shift
        base = e * per
        for w in range(lo, hi):
            i = 4 * w
            off = outer[i >> ps] + es
            j = i & pm
            r = 0
            for b in range(4):
                v = inner[_nb_u(j + b)]
                if v >= 0:
                    a = v + off
                    if a < 0 or a >= n:
                        return 1
                    r |= luts[b, src[_nb_u(a)]]
                else:
                    r |= luts[b, 0]
            out[_nb_u(base + w)] = r
    return 0


def _nb_wquads_k(src, qsrc, qdst, span, outer, order, group, shift, copies, luts, out, lo, hi):
    # Blocks order[lo:hi] of every expert, 4 * qsrc.shape[0] words each: quad q of block k of expert e reads the
    # source words qsrc[q, b] + outer[k] + e * shift (b = 0..3; span: the least and the largest qsrc), and
    # its output word j (at qdst[q, j] in the block) is OR_b luts[b, byte j of source word b]: four word loads
    # and one table row a quad, where the words kernel reads a table entry and a byte for each byte. `order`
    # (a permutation of the blocks) and `group` (how many of them in turn share a cache line) set only the order
    # of the IR kernel's reads (native_ir: `group` blocks quad by quad); here blocks go one at a time.
    n = src.shape[0]
    nq = qsrc.shape[0]
    blocks = outer.shape[0]
    for e in range(copies):
        for i in range(lo, hi):
            if i >= order.shape[0]:
                return 1
            k = order[i]
            if k < 0 or k >= blocks:
                return 1
            off = outer[k] + e * shift
            if span[0] + off < 0 or span[1] + off >= n:
                return 1
            base = (e * blocks + k) * 4 * nq
            for q in range(nq):
                s0 = src[_nb_u(qsrc[q, 0] + off)]
                s1 = src[_nb_u(qsrc[q, 1] + off)]
                s2 = src[_nb_u(qsrc[q, 2] + off)]
                s3 = src[_nb_u(qsrc[q, 3] + off)]
                for j in range(4):
                    sh = 8 * j
                    out[_nb_u(base + qdst[q, j])] = (luts[0, (s0 >> sh) & 255] | luts[1, (s1 >> sh) & 255]
                                                     | luts[2, (s2 >> sh) & 255] | luts[3, (s3 >> sh) & 255])
    return 0


def _nb_lut8_k(src, lut, out, lo, hi):
    # out[i] = lut[src[i]] for i in [lo, hi): a one-byte element's value conversions by the table of the 256 values'
    # images (lut has 256 entries, so every byte indexes inside it), where torch made an int32 index of every byte
    # and gathered by it (10 bytes moved a byte for 2)
    for i in range(lo, hi):
        out[i] = lut[src[i]]
    return 0


def _nb_wpairs_k(src, qsrc, qdst, span, outer, order, group, shift, copies, halves, out, lo, hi):
    # As _nb_wquads_k for pairs: pair q of block k of expert e reads the source words qsrc[q, c] + outer[k]
    # + e * shift (c = 0, 1), and its output word j (at qdst[q, j] in the block) is half-word j of source word 0
    # then of source word 1 (a 2x2 transpose of half-words, CUTLASS W4A8's): two lookups a word in 65536-entry
    # tables of whole half-words (halves[c, v], _nb_half_luts), where four byte lookups took 1.5x the time.
    n = src.shape[0]
    nq = qsrc.shape[0]
    blocks = outer.shape[0]
    for e in range(copies):
        for i in range(lo, hi):
            if i >= order.shape[0]:
                return 1
            k = order[i]
            if k < 0 or k >= blocks:
                return 1
            off = outer[k] + e * shift
            if span[0] + off < 0 or span[1] + off >= n:
                return 1
            base = (e * blocks + k) * 2 * nq
            for q in range(nq):
                s0 = src[_nb_u(qsrc[q, 0] + off)]
                s1 = src[_nb_u(qsrc[q, 1] + off)]
                out[_nb_u(base + qdst[q, 0])] = halves[0, s0 & 65535] | halves[1, s1 & 65535]
                out[_nb_u(base + qdst[q, 1])] = halves[0, (s0 >> 16) & 65535] | halves[1, (s1 >> 16) & 65535]
    return 0


def _nb_quads_k(src, rows, quads, step, unread, luts, out, lo, hi):
    # Rows [lo, hi): row r's quad q reads source words rows[r, b] + q * step (b = 0..3; 0 where unread[r, b]),
    # and its output word j (at (r * quads + q) * 4 + j) is OR_b luts[b, byte j of source word b]. A row's reads
    # are checked once, at its first and last quad: the loop over its quads has no branch (25% less time).
    n = src.shape[0]
    masked = unread.shape[0] > 0
    # a row whose quads span n words or more reads outside whatever its start (checked before (quads - 1) * step
    # is formed, which could wrap): with it, a row's first and last quads bound all of its reads
    far = quads > 1 and step != 0 and (step > n or step < -n or quads - 1 > (n - 1) // abs(step))
    last = 0 if far else (quads - 1) * step
    for r in range(lo, hi):
        a0 = rows[r, 0]
        a1 = rows[r, 1]
        a2 = rows[r, 2]
        a3 = rows[r, 3]
        if masked and (unread[r, 0] or unread[r, 1] or unread[r, 2] or unread[r, 3]):
            for q in range(quads):  # padding: each quad's words one by one, an unread one 0
                s0 = s1 = s2 = s3 = 0
                o = q * step
                if unread[r, 0] == 0:
                    if far or a0 + o < 0 or a0 + o >= n:
                        return 1
                    s0 = src[_nb_u(a0 + o)]
                if unread[r, 1] == 0:
                    if far or a1 + o < 0 or a1 + o >= n:
                        return 1
                    s1 = src[_nb_u(a1 + o)]
                if unread[r, 2] == 0:
                    if far or a2 + o < 0 or a2 + o >= n:
                        return 1
                    s2 = src[_nb_u(a2 + o)]
                if unread[r, 3] == 0:
                    if far or a3 + o < 0 or a3 + o >= n:
                        return 1
                    s3 = src[_nb_u(a3 + o)]
                d = (r * quads + q) * 4
                for j in range(4):
                    sh = 8 * j
                    out[_nb_u(d + j)] = (luts[0, (s0 >> sh) & 255] | luts[1, (s1 >> sh) & 255]
                                         | luts[2, (s2 >> sh) & 255] | luts[3, (s3 >> sh) & 255])
            continue
        if quads == 0:
            continue
        lo_a, hi_a = min(a0, a1, a2, a3), max(a0, a1, a2, a3)  # both ends of each word's run (a step may be < 0)
        if far or lo_a < 0 or hi_a >= n or lo_a + last < 0 or hi_a + last >= n:
            return 1
        d0 = r * quads * 4
        for q in range(quads):
            o = q * step
            s0 = src[_nb_u(a0 + o)]
            s1 = src[_nb_u(a1 + o)]
            s2 = src[_nb_u(a2 + o)]
            s3 = src[_nb_u(a3 + o)]
            d = d0 + 4 * q
            for j in range(4):
                sh = 8 * j
                out[_nb_u(d + j)] = (luts[0, (s0 >> sh) & 255] | luts[1, (s1 >> sh) & 255]
                                     | luts[2, (s2 >> sh) & 255] | luts[3, (s3 >> sh) & 255])
    return 0


def _nb():
    """The compiled kernels, or None: numba is not installed, or ``LAYOUTC_NUMBA=0``."""
    import os

    if os.environ.get("LAYOUTC_NUMBA", "1").strip() == "0":
        return None
    got = _NB_STATE.get("kernels", False)
    if got is not False:
        return got
    try:
        import numba
    except ImportError:
        _NB_STATE["kernels"] = None
        return None
    globals()["_nb_u"] = numba.uint64  # read by the kernels when numba compiles them (after this)
    import sys

    cache = _nb_cacheable(globals(), sys.modules)
    fns = (("words", _nb_words_k), ("wquads", _nb_wquads_k), ("wpairs", _nb_wpairs_k), ("quads", _nb_quads_k),
           ("lut8", _nb_lut8_k))
    # one compile per process for every converter whose kernels are these (their code objects, compared whole):
    # a process that loads many converters (tests, a checkpoint of several specs) compiles them once
    shared = numba.__dict__.setdefault("_layoutc_native_kernels", {})
    key = tuple((c.co_code, c.co_consts, c.co_names, c.co_varnames) for c in (fn.__code__ for _, fn in fns))
    kernels = shared.get(key)
    if kernels is None:
        kernels = {"numba": numba, "cache": cache}
        for name, fn in fns:
            kernels[name] = _nb_jit(numba, fn, cache)
        shared[key] = kernels
    _NB_STATE["kernels"] = kernels
    return kernels


def _nb_cacheable(namespace, modules):
    """Whether numba may cache kernels defined in ``namespace`` on disk: its cache reloads a kernel by
    importing the module by name, so only a module imported from a ``.py`` file under its own name (in
    ``modules``, i.e. sys.modules) does; not ``layoutc.compile_file``'s module from a string, nor one
    run by ``spec_from_file_location`` without an entry in sys.modules."""
    here = modules.get(namespace.get("__name__", ""))
    return getattr(here, "__dict__", None) is namespace and str(namespace.get("__file__", "")).endswith(".py")


def _nb_jit(numba, fn, cache):
    # a lazily compiled kernel (on its first call, for the argument types it gets), cached on disk if it can be
    if cache:
        try:
            return numba.njit(nogil=True, cache=True)(fn)
        except Exception:  # numba: "cannot cache function ...: no locator available for file ..."
            pass
    return numba.njit(nogil=True)(fn)


def _nb_on(device):
    """Whether the native kernels run for tensors on ``device``: the IR ones (:mod:`layoutc.lower.native_ir`) or,
    where those do not run, numba's."""
    return torch.device(device).type == "cpu" and (_ni_on() or _nb() is not None)


def _nb_array(t, dtype):
    # a numpy view of a contiguous CPU tensor's bytes as ``dtype`` (no copy; bf16, fp8: by their bits)
    return t.detach().reshape(-1).view(dtype).numpy()


def _nb_run(name, args, total, weight):
    """The kernel ``name``'s ``kernel(*args, lo, hi)`` over [0, total) in parts on the calling thread and
    worker threads, one part per intra-op thread torch uses (``weight``: words a unit writes; small calls
    run on one thread); raises where a part read out of range. The IR kernel of the same name where it runs
    (:mod:`layoutc.lower.native_ir`: numba never loaded, nothing compiled by it), else numba's."""
    if _ni_on():
        threads = max(1, min(torch.get_num_threads(), total, total * weight // _NB_MIN_SPLIT))
        if _ni_run(name, args, total, threads):
            raise IndexError("a run table reads outside its input (the converter's plan does not fit this tensor)")
        return
    kernels = _nb()
    kernel = kernels[name]
    try:  # compiled (or loaded from numba's cache) here, for these types, before the threads call it
        kernel(*args, 0, 0)
    except Exception:
        if not kernels["cache"]:
            raise
        # a cache numba cannot load (written for a module of another name): compiled again, not cached
        kernel = kernels[name] = _nb_jit(kernels["numba"], kernel.py_func, False)
        kernel(*args, 0, 0)
    threads = max(1, min(torch.get_num_threads(), total, total * weight // _NB_MIN_SPLIT))
    gomp = _nb_gomp() if threads > 1 else None
    if threads == 1:
        bad = [kernel(*args, 0, total)]
    elif gomp is not None:
        bad = [_nb_omp_run(gomp, kernels, name, kernel, args, total, threads)]
    else:
        import itertools

        parts = min(total, threads * _NB_PARTS_PER_THREAD)
        cut = [total * k // parts for k in range(parts)] + [total]
        turns = itertools.count()  # next() of a count is atomic under the GIL: each part is taken once

        def take():
            failed = 0
            for k in iter(turns.__next__, None):
                if k >= parts:
                    return failed
                failed |= kernel(*args, cut[k], cut[k + 1])

        bad = _fp_on_threads(take, threads)  # layoutc.runtime.cpu_kernels: its worker threads
    if any(bad):
        raise IndexError("a run table reads outside its input (the converter's plan does not fit this tensor)")


def _nb_gomp():
    """``GOMP_parallel`` of the OpenMP runtime torch runs its CPU ops on (a ctypes function), or None: torch's
    parallel backend is not OpenMP, the process has no such symbol (not Linux or macOS), or
    ``LAYOUTC_NUMBA_OMP=0``. Looked up once per process; imports nothing (the SIMD and IR kernels' callers take it
    too, and numba need not be loaded for them)."""
    got = _NB_STATE.get("gomp", False)
    if got is not False:
        return got
    import os

    got = None
    if os.environ.get("LAYOUTC_NUMBA_OMP", "1").strip() != "0":
        got = _fp_gomp()  # torch's runtime's GOMP_parallel (layoutc.runtime.cpu_kernels: the fingerprint kernel's too)
    _NB_STATE["gomp"] = got
    return got


def _nb_omp_tools(numba, ir, intrinsic):
    # numba intrinsics of the OpenMP body: an address as an int64, an int64 as a pointer to one element type (by
    # numpy's dtype string), and an atomic add to the int64 at an address (returning its old value)
    types = numba.types

    @intrinsic
    def address(typingctx, p):
        def codegen(context, builder, signature, args):
            return builder.ptrtoint(args[0], ir.IntType(64))
        return types.int64(types.voidptr), codegen

    def pointer_to(element):
        @intrinsic
        def pointer(typingctx, at):
            def codegen(context, builder, signature, args):
                return builder.inttoptr(args[0], context.get_value_type(types.CPointer(element)))
            return types.CPointer(element)(types.int64), codegen
        return pointer

    @intrinsic
    def atomic_add(typingctx, at, value):
        def codegen(context, builder, signature, args):
            return builder.atomic_rmw("add", builder.inttoptr(args[0], ir.IntType(64).as_pointer()), args[1],
                                      "monotonic")
        return types.int64(types.int64, types.int64), codegen

    pointers = {"<i4": pointer_to(types.int32), "<i8": pointer_to(types.int64), "|u1": pointer_to(types.uint8)}
    return {"address": address, "pointers": pointers, "atomic_add": atomic_add, "carray": numba.carray}


def _nb_omp_body(kernels, name, kernel, args):
    """The ``cfunc`` (``void(void*)``) that runs ``kernel``'s parts in an OpenMP region: its argument is a job
    (int64 slots, :func:`_nb_omp_run`), from which it views each array argument by its address and shape (the
    element type and number of dimensions are the function's own: one per kernel and argument types), takes
    parts ``k`` from the job's counter until none is left, and counts parts whose kernel reported a read outside
    its source. Compiled once per process for each (its source is this text, with the arguments' places)."""
    shapes = tuple((a.dtype.str, a.ndim) if _nb_is_array(a) else None for a in args)
    key = ("omp", name, id(kernel), shapes)
    got = kernels.get(key)
    if got is not None:
        return got
    numba = kernels["numba"]
    tools = kernels.get("omp tools")
    if tools is None:  # the body's intrinsics are LLVM IR
        try:  # llvmlite: numba's own dependency, there wherever numba compiled the kernels
            from llvmlite import ir
            from numba.core.extending import intrinsic
        except ImportError as e:
            raise RuntimeError("numba's OpenMP body needs llvmlite and numba.core.extending") from e
        tools = kernels["omp tools"] = _nb_omp_tools(numba, ir, intrinsic)
    space = {"carray": tools["carray"], "address": tools["address"], "atomic_add": tools["atomic_add"],
             "kernel": kernel, "job_at": tools["pointers"]["<i8"]}
    lines = ["def body(data):", f"    job = carray(job_at(address(data)), {_NB_JOB_HEAD + 3 * len(args)})"]
    for i, shape in enumerate(shapes):
        at = _NB_JOB_HEAD + 3 * i  # value or address, then the two first dimensions
        if shape is None:
            lines.append(f"    a{i} = job[{at}]")
            continue
        if shape[0] not in tools["pointers"] or shape[1] not in (1, 2):
            raise TypeError(f"native kernel {name!r}: no OpenMP view of a {shape[1]}-d {shape[0]} array")
        space[f"p{i}"] = tools["pointers"][shape[0]]
        dims = f"job[{at + 1}]" if shape[1] == 1 else f"(job[{at + 1}], job[{at + 2}])"
        lines.append(f"    a{i} = carray(p{i}(job[{at}]), {dims})")
    names = "".join(f"a{i}, " for i in range(len(args)))
    lines += ["    parts = job[2]",
              "    total = job[3]",
              "    counter = address(data)",
              "    while True:",
              "        k = atomic_add(counter, 1)",
              "        if k >= parts:",
              "            return",
              f"        if kernel({names}total * k // parts, total * (k + 1) // parts):",
              "            atomic_add(counter + 8, 1)"]
    exec(compile("\n".join(lines) + "\n", f"<layoutc native OpenMP body {name}>", "exec"), space)
    got = kernels[key] = numba.cfunc(numba.types.void(numba.types.voidptr))(space["body"])
    return got


def _nb_is_array(a):
    # a numpy array argument of a kernel (else an integer)
    return hasattr(a, "__array_interface__")


def _nb_omp_run(gomp, kernels, name, kernel, args, total, threads):
    """``kernel(*args, lo, hi)`` over [0, total) in parts on ``threads`` OpenMP threads (torch's runtime, so the
    threads of its last parallel op, spinning, take the parts at once): one ``GOMP_parallel`` call of the
    kernel's body (:func:`_nb_omp_body`; ctypes releases the GIL for it). Returns 1 where a part read outside
    its source, else 0."""
    import operator

    body = _nb_omp_body(kernels, name, kernel, args)
    parts = min(total, threads * _NB_PARTS_PER_THREAD)
    slots = [0, 0, parts, total]
    for a in args:
        if not _nb_is_array(a):
            slots += [operator.index(a), 0, 0]  # an integer (the kernels take no other scalar)
        else:  # the kernels' arrays are contiguous numpy views (_nb_array, .numpy() of contiguous tensors)
            if not a.flags.c_contiguous:
                raise AssertionError("a native kernel's array argument is not contiguous")
            slots += [a.ctypes.data, a.shape[0], a.shape[1] if a.ndim > 1 else 0]
    job = torch.tensor(slots, dtype=torch.int64)  # alive, with every argument, until the region ends
    gomp(body.address, job.data_ptr(), threads, 0)
    return int(job[1] != 0)


def _nb_luts(table, conv=None):
    """The four 256-entry tables of a bit permutation (output bit i = input bit table[i]): luts[b, v] is
    the image of byte value v at byte b of a word, after ``conv`` (each byte converted on its own: a
    function of int32 words) where given. Built once per table and conversion."""
    key = ("luts", tuple(table), conv)
    got = _NB_STATE.get(key)
    if got is not None:
        return got
    v = torch.arange(256, dtype=torch.int64)
    words = v * 0x01010101  # byte value v in every byte
    if conv is not None:
        w = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
        words = conv(w).to(torch.int64) & 0xFFFFFFFF
    luts = torch.zeros(4, 256, dtype=torch.int64)
    for b in range(4):
        byte = (words >> (8 * b)) & 0xFF
        for i, s in enumerate(table):  # output bit i: input bit s, of byte s // 8
            if s // 8 == b:
                luts[b] |= ((byte >> (s % 8)) & 1) << i
    luts = torch.where(luts >= 2**31, luts - 2**32, luts).to(torch.int32).contiguous()
    _NB_STATE[key] = luts
    return luts


def _nb_half_luts(table, conv=None):
    """The two 65536-entry tables of a pairs kernel: halves[c, v] is the image of half-word value v at half-word
    c of a word (the OR of _nb_luts' two byte tables); 512 KiB, built once per table and conversion."""
    key = ("halves", tuple(table), conv)
    got = _NB_STATE.get(key)
    if got is None:
        luts = _nb_luts(table, conv)
        v = torch.arange(65536)
        got = _NB_STATE[key] = torch.stack([luts[2 * c][v & 255] | luts[2 * c + 1][v >> 8] for c in (0, 1)])
    return got


def _nb_blocks(starts):
    """A words plan's table of source bytes (expert 0's, -1: padding) as blocks: the largest power-of-two
    block (4 bytes to 16 KiB: its table stays in L2) of which every block reads block 0's bytes moved by one
    offset, as ``(inner, outer, ps)``: block k's byte j reads ``inner[j] + outer[k]``, blocks of ``2**ps``
    bytes. The kernel then reads a small table (in cache) and an offset per block, not 4 bytes of table per
    byte (Marlin's and W4A8's words: every word reads 4 bytes at the same offsets from its own start). Else
    the whole table as one block (``ps`` 62). Checked on every entry."""
    n = starts.numel()
    for ps in range(14, 1, -1):
        size = 1 << ps
        if size >= n or n % size:
            continue
        rows = starts.view(-1, size)
        holes = rows < 0
        if not bool((holes == holes[:1]).all()) or bool(holes[0].all()):
            continue
        col = int((~holes[0]).nonzero()[0])
        outer = rows[:, col] - rows[0, col]
        if bool(((rows - outer.unsqueeze(1) == rows[:1]) | holes).all()):
            return rows[0].contiguous(), outer.contiguous(), ps
    return starts, torch.zeros(1, dtype=starts.dtype), 62


def _nb_word_quads(inner):
    """A block table's output words in quads or pairs where it has them, as ``(qsrc, qdst, span)``, else None.
    Quads (``qsrc`` of 4 columns): four output words (block-local ``qdst[q, j]``, j = 0..3) whose byte b is
    byte j of one source word ``qsrc[q, b]`` (a 4x4 byte transpose, as Marlin's and triton_kernels' repacks
    do). Pairs (2 columns): two output words whose bytes 2c, 2c + 1 are bytes 2j, 2j + 1 of source word
    ``qsrc[q, c]`` (a 2x2 transpose of half-words, CUTLASS W4A8's). Every word of the block in one group, no
    padding; ``span``: the least and largest entry of ``qsrc``. The kernels then load a source word once for
    the words that share it instead of a table entry and a byte a byte. Groups sorted by source word (reads
    in order)."""
    n = inner.numel()
    if n % 16 or not n or bool((inner < 0).any()):
        return None
    words = (inner.view(-1, 4) // 4).to(torch.int64)
    byte = (inner.view(-1, 4) % 4).to(torch.int64)
    if bool((byte == byte[:, :1]).all()):  # quads: the four bytes of an output word at one byte place j
        slots, place = words, byte[:, 0]
    elif (bool((words[:, 1::2] == words[:, 0::2]).all()) and bool((byte[:, 0] % 2 == 0).all())
          and bool((byte == byte[:, :1] + torch.tensor([0, 1, 0, 1])).all())):  # pairs: half-word j of two words
        slots, place = words[:, 0::2], byte[:, 0] // 2
    else:
        return None
    size = slots.shape[1]
    qsrc, which, count = torch.unique(slots, dim=0, return_inverse=True, return_counts=True)
    if not bool((count == size).all()):
        return None
    qdst = torch.full((qsrc.shape[0], size), -1, dtype=torch.int64)
    qdst[which, place] = torch.arange(words.shape[0])
    if bool((qdst < 0).any()):  # two words of a group at the same place
        return None
    dtype = torch.int32 if int(qsrc.max()) < 2**31 else torch.int64
    span = torch.stack([qsrc.min(), qsrc.max()])
    return qsrc.to(dtype).contiguous(), qdst.to(torch.int32).contiguous(), span


def _nb_words(x, plan, shape, table, conv=None):
    """The int32 words of ``shape`` of a words plan: the source bytes of ``x`` by the native table plan
    ``plan`` (``("native", inner, outer, ps, experts, shift[, groups])``, :func:`_nb_blocks`; padding: byte 0),
    each byte through ``conv``, the bits permuted by ``table``. Where the plan holds quads or pairs
    (:func:`_nb_word_quads`, not None), ``x``'s bytes are whole aligned words and the blocks' and experts'
    moves whole words, their kernel runs; else the per-byte one (the same bits)."""
    _, inner, outer, ps, copies, shift, *groups = plan
    luts = _nb_luts(table, conv)
    out = torch.empty(shape, dtype=torch.int32)
    x = x.contiguous()
    per = outer.numel() * inner.numel() // 4
    if out.numel() != copies * per or inner.numel() % 4 or (ps < 62 and inner.numel() != 1 << ps):
        raise AssertionError("a words plan's table does not cover its output")
    nbytes = x.numel() * x.element_size()
    aligned = nbytes % 4 == 0 and x.data_ptr() % 4 == 0 and x.storage_offset() * x.element_size() % 4 == 0
    whole = aligned and shift % 4 == 0 and not bool((outer % 4).any())  # whole words: the source, every move
    if whole and _nx_on():  # the SIMD kernel where the plan's chunks and tables allow
        tabs = _nx_memo("nx tables", luts, None, lambda: _nx_tables(luts))
        chunks = _nx_memo("nx chunks", inner, None, lambda: _nx_chunks(inner)) if tabs is not None else None
        words = _nx_memo("nx outer words", outer, None, lambda: (outer // 4).to(torch.int64).contiguous()) if (
            chunks is not None) else None  # the plan's own tensor each call: the kernel's form is found once
        if chunks is not None and _nx_run(x.reshape(-1).view(torch.uint8).view(torch.int32), chunks, words,
                                           shift // 4, copies, tabs, out, _nb_gomp()):
            return out
    if groups and groups[0] is not None and whole:
        qsrc, qdst, span = groups[0]  # the source as whole, aligned int32 words; blocks and experts: whole words
        quads = qsrc.shape[1] == 4
        order, group = _nx_memo("nb order", outer, quads, lambda: _ni_block_order(outer, quads))
        _nb_run("wquads" if quads else "wpairs",
                (_nb_array(x, torch.int32), qsrc.numpy(), qdst.numpy(), span.numpy(), (outer // 4).numpy(),
                 order, group, shift // 4, copies, (luts if quads else _nb_half_luts(table, conv)).numpy(),
                 _nb_array(out, torch.int32)),
                outer.numel(), copies * inner.numel() // 4)  # a part: whole blocks, of every expert
        return out
    src = _nb_array(x, torch.uint8)
    _nb_run("words", (src, inner.numpy(), outer.numpy(), ps, shift, copies, luts.numpy(),
                      _nb_array(out, torch.int32)), per, copies)
    return out


def _nb_quads(src_words, rows, quads, step, unread, table, shape):
    """The int32 words of ``shape`` of a quads plan: row r's quad q reads source words
    ``rows[r, b] + q * step`` (b = 0..3; none where ``unread[r, b]``), output word j of the quad byte j of
    each, the bits permuted by ``table``. A per-quad index (``quads`` 1) whose data is rows of quads at one step
    runs as those rows (:func:`_nb_quad_rows`)."""
    luts = _nb_luts(table)
    if quads == 1 and step == 0 and len(shape) > 0 and shape[-1] % 4 == 0:
        found = _nb_quad_rows(rows, unread, shape[-1] // 4)
        if found is not None:
            rows, quads, step, unread = found
    given, rows = rows, rows.reshape(-1, 4)  # `given`: the plan's own tensor (a reshape is a new one each call)
    out = torch.empty(shape, dtype=torch.int32)
    if unread is None and out.numel() == rows.shape[0] * quads * 4 and _nx_on():
        found = _nx_memo("nx quads", given, (quads, step), lambda: _nx_quads_table(rows, quads, step))
        chunks = _nx_memo("nx chunks", found[0], None, lambda: _nx_chunks(found[0])) if found else None
        words = src_words.detach().contiguous().reshape(-1)
        tabs = _nx_memo("nx tables", luts, None, lambda: _nx_tables(luts))
        if (chunks is not None and tabs is not None and words.numel() * words.element_size() % 4 == 0
                and _nx_run(words.view(torch.uint8).view(torch.int32), chunks, found[1], 0, 1, tabs, out,
                            _nb_gomp())):
            return out
    rows = rows.to(torch.int32) if rows.dtype != torch.int32 and rows.numel() and int(rows.max()) < 2**31 else rows
    mask = (torch.empty((0, 4), dtype=torch.uint8) if unread is None
            else unread.reshape(-1, 4).contiguous().view(torch.uint8))
    if out.numel() != rows.shape[0] * quads * 4:
        raise AssertionError("the quads' rows do not cover the output")
    _nb_run("quads", (_nb_array(src_words, torch.int32), rows.contiguous().numpy(), quads, step,
                             mask.numpy(), luts.numpy(), _nb_array(out, torch.int32)), rows.shape[0], 4 * quads)
    return out


def _nb_quad_rows(index, unread, per_row):
    """A per-quad index of source words (``[..., 4]``, one row of 4 a quad; ``unread`` None or the words not read)
    as rows of ``per_row`` quads where its data has them: ``(rows, per_row, step, unread)``, row r's quad q
    reading words ``rows[r, b] + q * step`` and ``unread`` ``[rows, 4]``, where every source word b of every row
    is either read by all the row's quads at that one step or by none of them (padding rows); else None. The
    SM90 quads with padding in the spec take the per-quad index (its map has no row stride), whose 16 bytes a
    quad the kernel read besides the source; at sizes that need no padding the index is such rows
    (BENCHMARKS.md). Found once per index tensor (kept by a weak reference: a new table of the run cache is
    looked at again)."""
    import weakref

    seen = _NB_STATE.setdefault("quad rows", {})
    key = (id(index), id(unread), per_row)
    got = seen.get(key)
    if got is not None and got[0]() is index and (unread is None or got[1]() is unread):
        return got[2]
    found = None
    count = index.numel() // 4 if index.dim() and index.shape[-1] == 4 else 0
    if per_row > 1 and count and count % per_row == 0 and index.dtype in (torch.int32, torch.int64):
        # entries are word indices >= 0 (int32 where they fit), so differences fit the index's own type
        idx = index.reshape(-1, per_row, 4)
        gone = None if unread is None else unread.reshape(-1, per_row, 4)
        if gone is None or bool((gone == gone[:, :1]).all()):
            steps = idx[:, 1:] - idx[:, :-1]
            if gone is None:
                step = int(steps.view(-1)[0])
                regular = bool((steps == step).all())
            else:  # the step of the read words; the unread ones' entries (0) are not looked at
                live = ~gone[:, :1].expand(-1, per_row - 1, -1)
                read = steps[live]
                step = int(read[0]) if read.numel() else 0
                regular = bool((read == step).all())
            if regular:
                rows = idx[:, 0] if gone is None else torch.where(gone[:, 0], 0, idx[:, 0])
                found = (rows.contiguous(), per_row, step, None if gone is None else gone[:, 0].contiguous())
    if len(seen) >= 64:
        seen.clear()
    seen[key] = (weakref.ref(index), None if unread is None else weakref.ref(unread), found)
    return found


def _nb_values(y, convert):
    """``convert(y)`` (value conversions, element by element) of one-byte elements: ``convert`` of each of the
    256 values once per process, then one lookup per element. Where ``convert`` refuses one of the 256 (a
    checked cast), or gives other than one element per element, ``convert(y)`` itself."""
    key = ("values", convert, y.dtype)
    lut = _NB_STATE.get(key)
    if lut is None:
        try:
            lut = convert(torch.arange(256, dtype=torch.uint8).view(y.dtype))
            if not isinstance(lut, torch.Tensor) or lut.shape != (256,):
                lut = False
        except Exception:
            lut = False
        _NB_STATE[key] = lut
    if lut is False or y.element_size() != 1:
        return convert(y)
    if lut.element_size() == 1 and lut.is_contiguous() and y.device.type == "cpu" and _nx_on():
        x = y.contiguous()  # one byte in, one byte out: the SIMD lookup (four table registers, 64 bytes a step)
        out = torch.empty(y.shape, dtype=lut.dtype)
        if _nx_lut8(x, lut, out, _nb_gomp()):
            return out
    if lut.element_size() == 1 and lut.is_contiguous() and _nb_on(y.device):
        x = y.contiguous()  # one byte in, one byte out: the native lookup (_nb_lut8_k), on torch's threads
        out = torch.empty(y.shape, dtype=lut.dtype)
        _nb_run("lut8", (_nb_array(x, torch.uint8), _nb_array(lut, torch.uint8), _nb_array(out, torch.uint8)),
                x.numel(), 1)
        return out
    index = y.contiguous().reshape(-1).view(torch.uint8).to(torch.int32)  # a byte's value: its entry
    return lut.index_select(0, index).view(y.shape)
