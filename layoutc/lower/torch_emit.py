"""Torch source for plans: the one-pass lowerings on any device torch runs on (the CPU path).

``gather``: each tensor's plan as vectorised torch code, a pure function of a range of the first
axis (``name_part``): the index expressions evaluated on ``arange`` grids and one gather, driven
over chunks of experts. Where the plan moves whole words, the eager-mode driver takes a part that
moves them as words (``name_quads``: SM90 FP4 weights, ``name_coarse``: runs of elements), which
is several times faster on the CPU; ``tests/lower/test_cpu_gather.py`` holds them to the eager
reference bit for bit. Gather and rows plans first try a run plan per shape (``name_index``,
:mod:`layoutc.lower.runs`); so do words plans without a quads part, over their source bytes, the
words then permuted by two half-word lookups (``_permute_words``). ``compiled``: the same part under
``torch.compile`` once over the whole tensor (one loop, no index tensor in memory; compiling costs
seconds per shape).
"""

from __future__ import annotations

import ast
import inspect
from typing import Sequence

from ..algebra import expr as ex
from ..lang.ops.conversion import known
from .plan import Affine, Copy, Gather, Plan, Rows, Words, affine_strides, linear, unknown
from .terms import collect_and_name, is_size
from . import native as native_module, native_ir as native_ir_module, native_simd as native_simd_module
from . import runs as runs_module
from . import simd_forms as simd_forms_module

#: The line after the coordinates are bound: where the named terms of the coordinates go.
TERMS = "#<terms>"
#: Names the parts bind themselves (a named term takes none of them).
_LOCALS = {"x", "d", "y", "w", "r", "v", "s", "ok", "src", "flat", "zero", "byte", "step", "start", "stop", "per",
           "index", "rows", "runs", "words", "halves", "low", "high", "out", "store", "_dev", "unread"}


def _named(emit, dims, given=()) -> list[str]:
    """``emit(t)``'s lines with its index terms named once (:mod:`layoutc.lower.terms`), the ``given``
    ones (the header's) under their names wherever the lines hold them."""
    return collect_and_name(emit, set(dims) | _LOCALS | {n for n, _ in given}, ex.to_torch, TERMS, indent="    ",
                            given=given)

BIT_VIEWS = {8: "uint8", 16: "int16", 32: "int32", 64: "int64"}


def conversions(p: Plan, var: str, indent: str) -> list[str]:
    """Value conversions through the eager ops' own functions: one semantics (NaNs, bit fields)."""
    return [f"{indent}{var} = {known(conv).eager(var)}" for conv in p.conversions]


def gather_function(p: Plan, name: str, dims: Sequence[str], terms: Sequence[tuple[str, ex.Expr]] = ()) -> str:
    """Source of ``def name(x, d, compiled=False) -> Tensor`` computing ``p`` with torch ops; ``terms``:
    the header's named terms (:func:`layoutc.lower.triton_emit.header_terms`), bound under the header's
    names in the part that walks the map's own coordinates (the quads and coarse parts walk other
    grids: only the sizes are theirs too)."""
    if not isinstance(p, (Copy, Affine, Gather, Rows, Words)):
        raise unknown("torch gather", p)
    bind = [f"    {d} = d[{d!r}]" for d in dims]
    if isinstance(p, (Copy, Affine)):
        lines = [f"def {name}(x, d, compiled=False):", *bind]
        if isinstance(p, Copy):
            lines.append("    y = x.clone()" if not p.conversions else "    y = x")
        else:
            strides, offset = affine_strides(p.map)
            shape = ", ".join(ex.to_python(s) for s in p.out_shape)
            st = ", ".join(ex.to_python(s) for s in strides)
            lines.append("    x = x.contiguous()  # as_strided offsets count from the storage's start, not the tensor's")
            lines.append(f"    y = x.as_strided(({shape},), ({st},), x.storage_offset() + {ex.to_python(offset)})")
        lines += conversions(p, "y", "    ")
        lines.append("    return y.contiguous()")
        return "\n".join(lines) + "\n"
    args = ", ".join(["x"] + list(dims))
    shape = p.word_shape if isinstance(p, Words) else p.out_shape
    rank = len(shape)
    sizes = [ex.to_python(s) for s in shape]
    bitwise = isinstance(p, (Gather, Rows)) and not p.conversions
    part = [f"def {name}_part({args}, start, stop):"] + _named(lambda t: _part_body(p, sizes, bitwise, t), dims, terms)
    if isinstance(p, Words):
        store = "torch.int32"
    else:
        store = f"torch.{BIT_VIEWS[p.in_elem.bits]}" if bitwise else f"torch.{p.in_elem.canonical}"
    per = " * ".join(f"({s})" for s in sizes[1:]) or "1"
    eager_part, choose, pre, native = f"{name}_part", [], [], []
    own = tuple((n, d) for n, d in terms if is_size(d))  # what the other grids share with the header
    if isinstance(p, Words) and p.quads is not None and rank >= 2:  # rank 1: chunks split quads
        # torch.compile keeps the plain part (it fuses that one itself); the quads part holds for
        # the dims the plan checked it on, the plain part for any
        cond = " and ".join(f"{d} % {p.quads.multiple} == 0" for d in p.quads.guard_dims) or "True"
        choose = [f"    whole = {cond}  # the dims the quads part was checked for",
                  f"    part = {name}_quads if whole else {name}_part"]
        eager_part = "part"
        part += ["", "", f"def {name}_quads({args}, start, stop):",
                 *_named(lambda t: quads_part(p, dims, name), dims, own)]
        if p.quads.row_stride is None:  # the per-quad index: evaluated once per shape (layoutc.lower.runs)
            part += ["", "", f"def {name}_quad_index({args}, start, stop):",
                     *_named(lambda t: quad_index_body(p, t), dims, own)]
        else:  # the per-row table, the same way
            part += ["", "", f"def {name}_quad_rows({args}, start, stop):",
                     *_named(lambda t: quad_rows_body(p, t), dims, own)]
    elif isinstance(p, Gather) and bitwise and p.coarse > 1 and rank >= 2:
        r = p.coarse
        choose = [f"    whole = x.shape[-1] % {r} == 0 and ({sizes[-1]}) % {r} == 0  # the shapes _coarsen checked",
                  f"    part = {name}_coarse if whole else {name}_part"]
        eager_part = "part"
        part += ["", "", f"def {name}_coarse({args}, start, stop):",
                 *_named(lambda t: coarse_part(p, dims, t), dims, own)]
    # a fill that varies (AITER's padded scales: 0 or 127 by where the padding is) rides in the run table as
    # -1 - its byte, for byte moves (one value per byte pattern, as the part's cast to uint8 gives it)
    varied = (isinstance(p, (Gather, Rows)) and not isinstance(p.map.fill, ex.Const) and bitwise
              and p.in_elem.bits == 8)
    runs = isinstance(p, (Gather, Rows)) and (isinstance(p.map.fill, ex.Const) or varied)
    if runs:  # the map evaluated once per shape, cut into runs (layoutc.lower.runs); the parts stay the fallback
        m = p.map  # expert e of the output reads expert e of the input alone, alike for all: evaluate expert 0
        alike = (rank >= 2 and m.src[0] == ex.Var("o0") and p.in_shape[0] == p.out_shape[0]
                 and not any("o0" in ex.free_vars(e) for e in (*m.src[1:], m.valid, m.fill)))
        stride = f", x.numel() // max(1, {sizes[0]})" if alike else ""
        part += ["", "", f"def {name}_index({args}, start, stop):",
                 *_named(lambda t: _index_body(p, sizes, t), dims, terms)]
        choose += [
            "    # CPU path, chosen per shape from the map's values (layoutc.lower.runs): a strided view, a table of",
            "    # runs, or (None) the element gather below",
            f"    runs = None if compiled else _run_plan(({name!r}, {', '.join(dims)}, str(x.device)), {name}_index, "
            f"({args},), ({', '.join(sizes)},), x.element_size(){stride})",
        ]
        flat = (f"x.contiguous().view(torch.{BIT_VIEWS[p.in_elem.bits]}).reshape(-1)" if bitwise
                else "x.contiguous().reshape(-1)")
        fill = "None" if varied else repr(p.map.fill.value)  # None: the plan holds each fill run's byte
        gathered = f"_run_gather({flat}, runs, ({', '.join(sizes)},), {fill})"
    elif isinstance(p, Words) and not choose:  # no quads part: the bytes by a run plan, then the bit tables
        runs = True
        src = p.word_sources
        alike = (rank >= 2 and p.in_shape[0] == p.word_shape[0] and all(c[0] == ex.Var("o0") for c in src)
                 and not any("o0" in ex.free_vars(e) for e in (*(e for c in src for e in c[1:]), *p.word_valid)))
        stride = f", x.numel() * x.element_size() // max(1, {sizes[0]})" if alike else ""
        byte_sizes = ", ".join(sizes[:-1] + [f"4 * ({sizes[-1]})"])
        part += ["", "", f"def {name}_index({args}, start, stop):",
                 *_named(lambda t: _words_index_body(p, sizes, t), dims, terms)]
        choose += [
            "    # CPU path: the source byte of every output byte (layoutc.lower.runs: a view, a table, or None:",
            "    # the per-byte part below), then each word's bits permuted by two half-word table lookups",
            f"    runs = None if compiled else _run_plan(({name!r}, {', '.join(dims)}, str(x.device)), {name}_index, "
            f"({args},), ({byte_sizes},), 1{stride}, words=True)",
        ]
        words = f"_run_gather(x.contiguous().view(torch.uint8).reshape(-1), runs, ({byte_sizes},), 0).view(torch.int32)"
        conv = "None"
        if p.conversions:  # each byte on its own (plan.bytewise), on the gathered words, before the bit tables
            pre = [f"        w = {words}", *conversions(p, "w", "        ")]
            words = "w"
            conv = f"{name}_bytes"
            part += ["", "", f"def {conv}(w):  # the value conversions, each byte on its own",
                     *conversions(p, "w", "    "), "    return w"]
        native = [  # numba (layoutc.lower.native): the bytes gathered, converted and permuted in one kernel
            '    if runs is not None and runs[0] == "native":',
            f"        y = _nb_words(x, runs, ({', '.join(sizes)},), {tuple(p.table)!r}, {conv})",
        ]
        # an identity permutation (byte moves with bytewise tables): the gathered words are the output
        gathered = words if tuple(p.table) == tuple(range(32)) else f"_permute_words({words}, {tuple(p.table)!r})"
    drive = [
        f"def {name}(x, d, compiled=False):",
        *bind,
        *choose,
        *([*native, f"    {'el' if native else ''}if runs is not None:",
           *pre,
           f"        y = {gathered}",
           "    elif compiled:"] if runs else ["    if compiled:"]),
        f"        y = _compiled({name}_part)({args}, 0, {sizes[0]})",
        f"    elif {per} * {sizes[0]} <= 1 << 24:  # one part: its result is the output, no copy",
        f"        y = {eager_part}({args}, 0, {sizes[0]})",
        "    else:  # parts of about 4M elements bound the index temporaries",
        f"        y = torch.empty(({', '.join(sizes)},), dtype={store}, device=x.device)",
        f"        step = max(1, (1 << 22) // max(1, {per}))",
        f"        for start in range(0, {sizes[0]}, step):",
        f"            stop = min(start + step, {sizes[0]})",
        f"            y[start:stop] = {eager_part}({args}, start, stop)",
    ]
    if isinstance(p, Words):
        out = ", ".join(ex.to_python(s) for s in p.out_shape)
        # the words' bytes as the output's elements (Marlin's int32 words: a view across widths moves no byte)
        wide = f".view(torch.{p.out_elem.canonical})" if p.out_elem.bits != 8 else ""
        drive.append(f"    return y.view(torch.uint8){wide}.reshape({out})")
    else:
        if p.conversions and runs and p.in_elem.bits == 8 and not all(known(c).keeps_bits for c in p.conversions):
            # the conversions of the 256 values once, then one lookup a byte on the CPU path (a cast and a bit
            # field: marlin_nvfp4's scales, 2x faster); relabellings alone (``view``) stay free views
            part += ["", "", f"def {name}_values(y):  # the value conversions, element by element",
                     *conversions(p, "y", "    "), "    return y"]
            drive += ["    if runs is not None and y.device.type == \"cpu\":  # each of the 256 values converted once",
                      f"        y = _nb_values(y, {name}_values)", "    else:", f"        y = {name}_values(y)"]
        elif p.conversions:
            drive += conversions(p, "y", "    ")
        else:
            drive.append(f"    y = y.view(torch.{p.out_elem.canonical})")
        drive.append("    return y")
    return "\n".join(part) + "\n\n\n" + "\n".join(drive) + "\n"


def _part_body(p: Gather | Rows | Words, sizes: Sequence[str], bitwise: bool, t) -> list[str]:
    """The lines of ``name_part``: the output coordinates over [start, stop), each source address
    from the plan's map, one gather (``t`` prints an index expression)."""
    part = ["    _dev = x.device"]
    if isinstance(p, Words) and p.source_bits != 8:  # the map's addresses are of the input's bytes
        part.append("    flat = x.contiguous().view(torch.uint8).reshape(-1)  # each element's bytes, little-endian")
    elif bitwise:
        part.append(f"    flat = x.contiguous().view(torch.{BIT_VIEWS[p.in_elem.bits]}).reshape(-1)"
                    "  # move bits, whatever the type")
    else:
        part.append("    flat = x.contiguous().reshape(-1)")
    part += _coordinates(sizes)
    if isinstance(p, Words):
        for b, (coords, valid) in enumerate(zip(p.word_sources, p.word_valid)):
            addr = f"({t(linear(coords, p.in_shape))}) + zero"
            if valid == ex.TRUE:
                part.append(f"    byte = flat[{addr}].to(torch.int64)")
            else:  # padding: read nothing there (its address may be past the input)
                part.append(f"    ok = ({t(valid)}) & (zero == 0)")
                part.append(f"    byte = torch.where(ok, flat[torch.where(ok, {addr}, 0)].to(torch.int64), 0)")
            part.append("    w = byte" if b == 0 else f"    w = w | (byte << {8 * b})")
        if p.conversions:  # each byte on its own (plan.bytewise): on the word as an int32, then back
            part.append("    w = torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)")
            part += conversions(p, "w", "    ")
            part.append("    w = w.to(torch.int64) & 0xFFFFFFFF")
        part += p.permutation.eager("w", "r", "    ")
        part.append("    return torch.where(r >= 2**31, r - 2**32, r).to(torch.int32)")
    else:
        m = p.map
        part.append(f"    src = ({t(linear(m.src, p.in_shape))}) + zero")
        if m.is_total():
            part.append("    return flat[src]")
        else:
            part.append(f"    ok = ({t(m.valid)}) & (zero == 0)")
            part.append("    v = flat[torch.where(ok, src, 0)]")
            fill = t(m.fill)
            width = p.in_elem.bits
            if bitwise and isinstance(m.fill, ex.Const) and width in (16, 32, 64):  # a bit pattern moved as a
                # signed integer of its width: 0xBF80 (bf16 -1.0) is int16 -16512 (as_tensor(49024) overflows)
                bits = int(m.fill.value) % (1 << width)
                fill = repr(bits - (1 << width) if bits >= 1 << (width - 1) else bits)
            part.append(f"    return torch.where(ok, v, torch.as_tensor({fill}, dtype=v.dtype))")
    return part


def _index_body(p: Plan, sizes: Sequence[str], t) -> list[str]:
    """The lines of ``name_index``: the source address of each output element over [start, stop), as
    in ``name_part``, and -1 where the map gives the fill (:mod:`layoutc.lower.runs` cuts them into runs)."""
    m = p.map
    part = ["    _dev = x.device"] + _coordinates(sizes)
    part.append(f"    src = ({t(linear(m.src, p.in_shape))}) + zero")
    if not m.is_total():
        part.append(f"    ok = ({t(m.valid)}) & (zero == 0)")
        if isinstance(m.fill, ex.Const):
            part.append("    src = torch.where(ok, src, -1)")
        else:  # the fill's byte b as -1 - b (a byte move: the part casts the fill to uint8, i.e. mod 256)
            part.append(f"    src = torch.where(ok, src, -1 - (({t(m.fill)}) + zero) % 256)")
    return part + ["    return src"]


def _words_index_body(p: Words, sizes: Sequence[str], t) -> list[str]:
    """The lines of ``name_index`` for a words plan: over the word grid [start, stop), the source byte
    address of each of a word's four bytes (-1 where the byte is padding, which reads 0), as the
    output's bytes: the last axis 4 bytes a word, little-endian as the part builds the word."""
    part = ["    _dev = x.device"] + _coordinates(sizes)
    index = []
    for b, (coords, valid) in enumerate(zip(p.word_sources, p.word_valid)):
        addr = f"({t(linear(coords, p.in_shape))}) + zero"
        if valid == ex.TRUE:
            index.append(addr)
        else:
            part.append(f"    ok{b} = ({t(valid)}) & (zero == 0)")
            index.append(f"torch.where(ok{b}, {addr}, -1)")
    part.append("    src = torch.stack([" + ", ".join(index) + "], dim=-1)  # word, byte b")
    return part + ["    return src.reshape(src.shape[:-2] + (-1,))"]


def runs_source() -> str:
    """Module-level helpers of the run path: :mod:`layoutc.lower.runs` without its docstring and import."""
    text = inspect.getsource(runs_module)
    head = "\nimport torch\n"
    return "# run plans of gather maps, per shape: the code of layoutc.lower.runs\n" + \
        text[text.index(head) + len(head):].strip() + "\n"


def native_source() -> str:
    """Module-level helpers of the native CPU kernels: :mod:`layoutc.lower.simd_forms` (no imports: all after its
    docstring), :mod:`layoutc.lower.native_simd`, :mod:`layoutc.lower.native_ir` and :mod:`layoutc.lower.native`
    without their docstrings and imports."""
    head = "\nimport torch\n"
    forms, simd, scalar, numba = (inspect.getsource(m) for m in (simd_forms_module, native_simd_module,
                                                                  native_ir_module, native_module))
    docstring = ast.parse(forms).body[0]
    if not (isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant)):
        raise AssertionError("layoutc.lower.simd_forms begins with its docstring")
    return ("# the SIMD kernel's forms that load and transpose: the code of layoutc.lower.simd_forms\n"
            + "\n".join(forms.splitlines()[docstring.end_lineno:]).strip() + "\n\n\n"
            + "# a SIMD kernel of our own (LLVM IR, AVX-512 VBMI): the code of layoutc.lower.native_simd\n"
            + simd[simd.index(head) + len(head):].strip() + "\n\n\n"
            + "# the native kernels as scalar LLVM IR of our own: the code of layoutc.lower.native_ir\n"
            + scalar[scalar.index(head) + len(head):].strip() + "\n\n\n"
            + "# native CPU kernels through numba, where it is installed: the code of layoutc.lower.native\n"
            + numba[numba.index(head) + len(head):].strip() + "\n")


def _coordinates(sizes: Sequence) -> list[str]:
    """Lines binding the output coordinates of a part: ``o0`` over experts [start, stop), ``o1``..
    over their whole axes, each shaped to broadcast along its own axis, and ``zero`` of the full
    shape (added to an index so it covers every coordinate)."""
    rank = len(sizes)
    lines = [f"    o0 = torch.arange(start, stop, device=_dev).view({', '.join(['-1'] + ['1'] * (rank - 1))})"]
    for k in range(1, rank):
        view = ["1"] * rank
        view[k] = "-1"
        lines.append(f"    o{k} = torch.arange({sizes[k]}, device=_dev).view({', '.join(view)})")
    lines.append("    zero = " + " + ".join(f"o{k} * 0" for k in range(rank)) + "  # broadcasts to the full range")
    return lines + ["    " + TERMS]


def quad_index_body(p: Words, t=ex.to_torch) -> list[str]:
    """The body of ``name_quad_index(x, dims..., start, stop)``: per quad, the index of each source word
    (0 where it is not read) and, per source word that may be padding, whether it is read."""
    q = p.quads
    qshape = [ex.to_python(s) for s in p.word_shape[:-1]] + [ex.to_python(ex.div(p.word_shape[-1], 4))]
    lines = ["    _dev = x.device"] + _coordinates(qshape)
    index, oks = [], []
    for b, (base, valid) in enumerate(zip(q.bases, q.valid)):
        if valid == ex.TRUE:
            index.append(f"(({t(base)}) + zero) // 4")
        else:  # padding: read word 0 there, zeroed by the caller (its address may be past the input)
            lines.append(f"    ok{b} = ({t(valid)}) & (zero == 0)")
            index.append(f"torch.where(ok{b}, ({t(base)}) + zero, 0) // 4")
            oks.append(f"ok{b}")
    lines.append("    index = torch.stack([" + ", ".join(index) + "], dim=-1)  # quad, source word b")
    lines.append("    index = index.to(torch.int32) if index.numel() and int(index.max()) < 2**31 else index")
    if not oks:
        return lines + ["    return index, None"]
    every = ", ".join(f"ok{b}" if valid != ex.TRUE else "zero == 0" for b, valid in enumerate(q.valid))
    lines.append(f"    unread = ~torch.stack([{every}], dim=-1)  # the words not read: zero")
    lines.append("    return index, (unread if bool(unread.any()) else None)")
    return lines


def quad_rows_body(p: Words, t=ex.to_torch) -> list[str]:
    """The body of ``name_quad_rows(x, dims..., start, stop)`` (a quads plan with a row stride): per row, the
    index of each source word of its first quad (int32 where it fits), as a 1-tuple."""
    q = p.quads
    qshape = [ex.to_python(s) for s in p.word_shape[:-1]] + [ex.to_python(ex.div(p.word_shape[-1], 4))]
    rank = len(qshape)
    lines = ["    _dev = x.device"] + _coordinates(qshape)
    lines[-3] = f"    o{rank - 1} = torch.zeros(1, dtype=torch.int64, device=_dev).view({', '.join(['1'] * rank)})"
    lines[-2] = "    zero = " + " + ".join(f"o{k} * 0" for k in range(rank - 1)) + f" + o{rank - 1}  # one quad per row"
    lines.append("    rows = torch.stack([" + ", ".join(f"(({t(base)}) + zero) // 4" for base in q.bases)
                 + "], dim=-1)")
    lines.append("    return (rows.to(torch.int32) if rows.numel() and int(rows.max()) < 2**31 else rows,)")
    return lines


def quads_part(p: Words, dims: Sequence[str], name: str) -> list[str]:
    """The body of ``name(x, dims..., start, stop)``: the words of a quads plan (as int32) by whole-word moves.

    The per-byte part reads each byte through an int64 index and permutes bits with seventeen
    masked shifts of int64 words: some fifty passes over eight times the data. Here each source
    word of a quad is read whole: where the plan found one stride along the last axis
    (``Quads.row_stride``), each row's source words are a strided run and the index has one entry
    per row and source word; else one per quad and source word. The 4x4 byte transpose is one
    strided copy, and the bit permutation two lookups per word in 65536-entry tables (one per half
    word, built from the plan's table on the call). Words are read little-endian, as torch's CPU
    and CUDA devices store them. (Four lookups per word in 256-entry byte tables read straight from
    the source words, no transposed copy, were measured: slower on the shared 2-core machine, twice
    the serial lookups for one parallel copy less.)"""
    q = p.quads
    qshape = [ex.to_python(s) for s in p.word_shape[:-1]] + [ex.to_python(ex.div(p.word_shape[-1], 4))]
    lines = ["    _dev = x.device"]
    lines.append("    flat = x.contiguous().view(torch.uint8).reshape(-1)")
    lines.append("    if flat.numel() % 4 or flat.data_ptr() % 4:  # int32 words need whole, aligned words")
    lines.append("        flat = torch.cat([flat, flat.new_zeros(-flat.numel() % 4)])")
    lines.append("    src_words = flat.view(torch.int32)")
    # the tables of source words, once per shape (layoutc.lower.runs): their arithmetic was a third of a CPU call
    shape_key, args = f"{', '.join(dims)}, start, stop, str(_dev)", f"(x, {', '.join(dims)}, start, stop)"
    if q.row_stride is not None:  # runs: one index per row and source word, not per quad
        lines.append(f"    (rows,) = _run_cached(({name + '/rows'!r}, {shape_key}), {name}_quad_rows, {args})")
        lines.append(f"    step = ({ex.to_python(q.row_stride)}) // 4  # words between a row's neighbouring quads")
        lines.append("    if _nb_on(_dev):  # numba (layoutc.lower.native): gathered, transposed and permuted in one kernel")
        lines.append(f"        return _nb_quads(src_words, rows, {qshape[-1]}, step, None, {tuple(p.table)!r}, "
                     f"({_quads_out(qshape)},))")
        lines.append(f"    runs = src_words.as_strided((src_words.numel() - ({qshape[-1]} - 1) * step, {qshape[-1]}), (1, step))")
        lines.append(f"    s = runs[rows.reshape(-1)].view(rows.shape[:-2] + (4, {qshape[-1]}))  # row, b, quad")
        lines.append("    # byte j of source word b is byte b of output word j: the transpose, as one copy")
        lines.append("    w = s.view(torch.uint8).unflatten(-1, (-1, 4)).movedim(-3, -1).contiguous()")
    else:  # the index of every quad's source words: one gather of words per call
        lines.append(f"    index, unread = _run_cached(({name!r}, {shape_key}), {name}_quad_index, {args})")
        lines.append("    if _nb_on(_dev):  # numba (layoutc.lower.native): gathered, transposed and permuted in one kernel")
        lines.append(f"        return _nb_quads(src_words, index, 1, 0, unread, {tuple(p.table)!r}, ({_quads_out(qshape)},))")
        lines.append("    s = src_words.index_select(0, index.reshape(-1)).view(index.shape)")
        if any(valid != ex.TRUE for valid in q.valid):
            lines.append("    if unread is not None:")
            lines.append("        s.masked_fill_(unread, 0)")
        lines.append("    # byte j of source word b is byte b of output word j: the transpose, as one copy")
        lines.append("    w = s.view(torch.uint8).unflatten(-1, (4, 4)).transpose(-1, -2).contiguous()")
    lines.append(f"    low, high = _bit_tables({tuple(p.table)!r}, _dev)")
    lines.append("    if _dev.type == 'cpu':  # uint16 widens in one pass, no mask (not every device converts it)")
    lines.append("        halves = w.view(torch.uint16).view(-1, 2)  # little-endian: low half first")
    lines.append("        r = low.index_select(0, halves[:, 0].to(torch.int32))")
    lines.append("        r |= high.index_select(0, halves[:, 1].to(torch.int32))")
    lines.append("    else:")
    lines.append("        halves = w.view(torch.int16).to(torch.int32).view(-1, 2)  # little-endian: low half first")
    lines.append("        halves &= 0xFFFF  # int16, not uint16: every device converts it")
    lines.append("        r = low.index_select(0, halves[:, 0])")
    lines.append("        r |= high.index_select(0, halves[:, 1])")
    lines.append(f"    return r.view({_quads_out(qshape)})")
    return lines


def _quads_out(qshape: Sequence[str]) -> str:
    """The shape of a quads part's result: its rows of ``4 * quads`` words."""
    return ", ".join(["stop - start"] + list(qshape[1:-1]) + [f"4 * ({qshape[-1]})"])


def coarse_part(p: Gather, dims: Sequence[str], t=ex.to_torch) -> list[str]:
    """The body of ``name(x, dims..., start, stop)``: a gather plan whose map moves runs of ``p.coarse``
    elements, one index and one load per run (a wider integer), instead of one per element."""
    wide = BIT_VIEWS[p.in_elem.bits * p.coarse]
    nbytes = p.in_elem.bits * p.coarse // 8
    shape = [ex.to_python(s) for s in p.out_shape[:-1]] + [ex.to_python(ex.div(p.out_shape[-1], p.coarse))]
    lines = ["    _dev = x.device"]
    lines.append("    flat = x.contiguous().view(torch.uint8).reshape(-1)")
    lines.append(f"    if flat.numel() % {nbytes} or flat.data_ptr() % {nbytes}:  # whole, aligned words")
    lines.append(f"        flat = torch.cat([flat, flat.new_zeros(-flat.numel() % {nbytes})])")
    lines.append(f"    words = flat.view(torch.{wide})")
    lines += _coordinates(shape)
    lines.append(f"    src = ({t(p.coarse_src)}) + zero")
    if p.coarse_valid == ex.TRUE:
        lines.append("    v = words[src]")
    else:
        lines.append(f"    ok = ({t(p.coarse_valid)}) & (zero == 0)")
        lines.append("    v = torch.where(ok, words[torch.where(ok, src, 0)], 0)")
    lines.append(f"    return v.view(torch.{BIT_VIEWS[p.in_elem.bits]})  # the last axis, {p.coarse} elements a word")
    return lines


def bit_tables_source() -> str:
    """Module-level helper of ``quads_part``: the two half-word tables of a bit permutation."""
    return (
        "_BIT_TABLES = {}  # (table, device) -> the two half-word tables: built once, not per call\n"
        "\n"
        "\n"
        "def _bit_tables(table, device=None):\n"
        "    # Output bit i of a word is input bit table[i]. For each half word h, the output bits of\n"
        "    # all its 65536 values, as int32: value v | 2**k sets v's bits and bit k's, so the table\n"
        "    # doubles sixteen times (no per-bit pass over the whole table).\n"
        "    key = (table, str(device))\n"
        "    if key in _BIT_TABLES:\n"
        "        return _BIT_TABLES[key]\n"
        "    out = []\n"
        "    for h in (0, 1):\n"
        "        r = torch.zeros(1, dtype=torch.int32)\n"
        "        for k in range(16):\n"
        "            image = sum(1 << i for i, s in enumerate(table) if s == 16 * h + k)\n"
        "            r = torch.cat([r, r | (image - (1 << 32) if image >= 1 << 31 else image)])  # bit 31: the sign\n"
        "        out.append(r if device is None else r.to(device))\n"
        "    _BIT_TABLES[key] = out\n"
        "    return out\n"
        "\n"
        "\n"
        "#: Words per tile of the CPU lookups: the temporaries (int32 tiles, reused from tile to tile) stay\n"
        "#: bounded for any layer; large tiles, as every op waits for its second OpenMP thread, which a busy\n"
        "#: machine schedules late (tiles of 64K words, in cache, were 2-7x slower there than tiles of 4M)\n"
        "_TILE_WORDS = 1 << 22\n"
        "\n"
        "\n"
        "def _permute_words(w, table):\n"
        "    # The bits of every int32 word of ``w`` permuted by ``table`` (output bit i = input bit table[i]):\n"
        "    # two lookups of the half words (little-endian: the low half first), as the quads part does.\n"
        "    low, high = _bit_tables(table, w.device)\n"
        "    halves = w.reshape(-1).view(torch.int16).view(-1, 2)\n"
        "    if w.device.type == 'cpu':  # per tile: uint16 widens in one pass, no mask; lookups into the output\n"
        "        halves = halves.view(torch.uint16)\n"
        "        n = halves.shape[0]\n"
        "        r = torch.empty(n, dtype=torch.int32)\n"
        "        lo, hi, tmp = (torch.empty(min(n, _TILE_WORDS), dtype=torch.int32) for _ in range(3))\n"
        "        for s in range(0, n, _TILE_WORDS):\n"
        "            e = min(n, s + _TILE_WORDS)\n"
        "            k = e - s\n"
        "            lo[:k].copy_(halves[s:e, 0])\n"
        "            hi[:k].copy_(halves[s:e, 1])\n"
        "            torch.index_select(low, 0, lo[:k], out=r[s:e])\n"
        "            torch.index_select(high, 0, hi[:k], out=tmp[:k])\n"
        "            r[s:e] |= tmp[:k]\n"
        "        return r.view(w.shape)\n"
        "    wide = halves.to(torch.int32) & 0xFFFF\n"
        "    r = low.index_select(0, wide[:, 0])\n"
        "    r |= high.index_select(0, wide[:, 1])\n"
        "    return r.view(w.shape)\n"
    )


def compiled_function(name: str, gather: str) -> str:
    return (f"def {name}(x, d):\n"
            f"    return {gather}(x, d, compiled=True)  # torch.compile of the gather: one loop, compiled once per shape\n")
