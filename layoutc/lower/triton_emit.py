"""Triton source for plans: one body per tensor, one kernel per layer.

Each tensor's plan (:mod:`layoutc.lower.plan`) becomes a ``@triton.jit`` *body* that converts a
range of the output given its program index; a layer's bodies are called from one kernel, so a
call of the converter launches once for all tensors of the layer (the host cost of a launch is
paid once, not per tensor). Above each body: the tensor, the spec statements it fuses (file:line
and text, as escaped one-line comments) and the composed map in ``explain``'s notation; the terms
that map names (``p = k + 4*A*r``) the body computes once under the same names (``_p``, ``_A``).

Dims are ``tl.constexpr``: one specialisation per shape, the arithmetic on them folds. Index
arithmetic is 32-bit unsigned where the planner found no negative constant (divisions by
constants then need no sign fix-ups), 64-bit when a tensor has 2^30 elements or more.
"""

from __future__ import annotations

import textwrap
from typing import Sequence

from ..algebra import expr as ex
from ..lang.compiler import Chain
from ..front.text import comment
from . import maptext
from .maptext import map_text
from ..lang.ops.conversion import CANONICAL_NAN, TRITON_DTYPES, UINT, known, words_kernel  # noqa: F401  (re-exported)
from .plan import Affine, Copy, Gather, Plan, Quads, Rows, Words, linear, tables, unknown
from .bytetable import NUM_WARPS, conversions as _conversions, layer_warps, looked_up, looks_up
from .stepped import coarse_body, steps_body
from .units import units_body, units_walk
from .terms import collect_and_name, is_size, replace
from .torch_emit import BIT_VIEWS

# Work per program (lanes x elements per lane), with NUM_WARPS warps per program.
BLOCK_ELEMENTS = 2048  # elements: one element (or coarse word) per lane
# A plain copy moves this many bytes per program: 64 per lane, four 16-byte loads in flight per
# lane before any store, so the copy keeps the memory busy even when the layer kernel's other
# bodies hold enough registers to lower occupancy. Large copies do not come here at all
# (runtime._COPY_APART_BYTES); for the rest, 2, 8 and 32 KB per program were within 2% of each
# other on the H200 (benchmarks/copy_sweep.py, 2026-11-30).
COPY_BYTES = 8192
BLOCK_WORDS = 512  # words: one 32-bit output word per lane
BLOCK_QUADS = 1024  # quads: 16 output bytes per lane
ROW_TILE_COLS = 1024  # rows: tiles of up to this many columns ...
ROW_TILE_ELEMENTS = 4096  # ... and this many elements
# tiles (a transposing map): TILE_IN output elements along the axis that reads the source in order
# (one run of TILE_IN source elements per tile column) by TILE_OUT along the output's last axis
TILE_IN, TILE_OUT = 64, 64
TILE_ELEMENTS = TILE_IN * TILE_OUT


def t(e: ex.Expr) -> str:
    return ex.to_triton(e)


#: The name of a body's lookup table k (a kernel argument: a pointer to int32 entries).
def table_arg(k: int) -> str:
    return f"_tab{k}"


def table_printer(found: Sequence[tuple[int, ...]]):
    """:func:`t` where the expressions hold lookup tables: each read as ``_lookup(_tabK, index, n)``
    (``found``: the tables of the body, in :func:`layoutc.lower.plan.tables` order, each its argument)."""
    names = {values: table_arg(k) for k, values in enumerate(found)}

    def printer(e: ex.Expr) -> str:
        holes: dict[str, str] = {}
        stack = [e]
        while stack:  # the outermost tables: each a placeholder name, its index printed the same way
            x = stack.pop()
            if isinstance(x, ex.Table):
                hole = f"_hole{len(holes)}_"
                holes[hole] = f"_lookup({names[x.values]}, {printer(x.index)}, {len(x.values)})"
                e = replace(e, x, ex.Var(hole))
            else:
                stack.extend(ex.children(x))
        text = ex.to_triton(e)
        for hole, call in holes.items():
            text = text.replace(hole, call)
        return text

    return printer


LOOKUP = '''
@triton.jit
def _lookup(table, i, n: tl.constexpr):
    # Entry i of a lookup table of an index map (a kernel argument of n int32 entries); 0 where i is
    # out of range, as for lanes past the output or in its padding, whose values are never stored.
    return tl.load(table + i, mask=(i >= 0) & (i < n), other=0)
'''


#: The line a walk puts after binding the output coordinates: where their named terms go.
TERMS = "#<terms>"
#: Names a body binds itself (a named term takes none of them).
#: None is ``_`` and one letter: those are the header's terms (maptext.TERM_PREFIX).
_LOCALS = {"v", "w", "r", "x", "y", "src", "ok", "offs", "_lane", "_out", "_KW", "mask", "pid", "rows", "cols", "live",
           "inside", "_TILE", "_ALT", "_ASM", "_bits", "_half", "_field", "_nan", "_nct", "_read", "_nit", "_plane",
           "_idx"}


# ---------------------------------------------------------------------------
# the header: statements and map


def header(chain: Chain, p: Plan, filename: str, walk: bool = True, mapped: str | None = None) -> list[str]:
    """Comment lines above a body (or a CPU gather: ``walk=False`` leaves out the kernel's walk): what
    it converts, the statements it fuses (file:line), the composed map (``mapped``: its text, where the
    caller has it: :func:`layoutc.lower.maptext.map_text` of the chain)."""
    src, out = chain.source, chain.target
    how = {Copy: "copied", Affine: "one strided copy", Gather: "gathered", Rows: "gathered",
           Words: "bits permuted within 32-bit words"}.get(type(p))
    if how is None:
        raise unknown("Triton header", p)
    lane = f"{COPY_BYTES // (32 * NUM_WARPS)} bytes per lane" if _plain_copy(p) else "one element per lane"
    runs = isinstance(p, Gather) and p.steps is not None
    walks = {"elements": f"{p.coarse} elements per word" if p.coarse > 1 else
             f"runs of {p.steps.run} elements read apart per word" if runs else lane,
             "rows": "2-D tiles of rows", "words": "one word per lane", "quads": "four words per lane",
             "tiles": f"{TILE_IN}x{TILE_OUT} tiles loaded along source rows"}
    lines = [f"{chain.tensor}: {src.elem.name}{src.shape_str()} -> "
             f"{out.elem.name + out.shape_str() if out is not None else chain.out_type}; {how}"
             + (f", {walks[p.access]}" if walk else "")]
    seen: dict[tuple, list[str]] = {}
    for s in chain.steps:
        key = (s.statement.pos.line, s.statement.text) if s.statement else (None, str(s.op))
        seen.setdefault(key, [])
        if s.tag is not None:
            seen[key].append(s.op.name)
    for (line, text), ops in seen.items():
        where = f"{filename}:{line}: " if line is not None else ""
        lines.append(f"  {where}{text}" + (f"  [{', '.join(ops)}]" if ops else ""))
    if not chain.steps:
        lines.append("  (no statements: copied as is)")
    if mapped is None:
        mapped = map_text(chain, out.shape_text if out is not None else (), planned=p)
    text = mapped.split("\n")
    lines.append("map: " + text[0])
    return [x for line in lines for x in wrap_comment(comment(line))] + \
        [x for line in text[1:] for x in wrap_comment(comment(line), "#      ")]


def header_terms(chain: Chain, p: Plan) -> tuple[tuple[str, ex.Expr], ...]:
    """The terms the header's map names, for :func:`body` to bind under the same names."""
    out = chain.target
    return maptext.header_terms(chain, out.shape_text if out is not None else (), planned=p)


def wrap_comment(text: str, first: str = "# ", width: int = 120) -> list[str]:
    """A comment in lines of at most ``width`` characters (continuations indented)."""
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent="#" + " " * (len(first) + 3),
                         break_long_words=True, break_on_hyphens=False) or [first.rstrip()]


# ---------------------------------------------------------------------------
# bodies


def _index_type(p: Plan) -> str:
    return "tl.uint32" if p.unsigned else "tl.int32"


def _lanes(p: Plan, block: int, var: str = "offs") -> list[str]:
    """This program's lanes: 64-bit when WIDE, else 32-bit (unsigned when the plan allows)."""
    return [
        f"{var} = tl.arange(0, {block})",
        "if WIDE:",
        f"    {var} = {var}.to(tl.int64) + pid.to(tl.int64) * {block}",
        "else:",
        f"    {var} = ({var} + pid * {block}).to({_index_type(p)})",
    ]


def unravel(var: str, shape: Sequence[ex.Expr], t=t) -> list[str]:
    """Lines binding o0.. from a flat index ``var`` over ``shape`` (row-major); then the marker
    where the named terms of the coordinates are bound (:mod:`layoutc.lower.terms`)."""
    rank = len(shape)
    lines = []
    rest = var
    for k in reversed(range(rank)):
        if k == 0:
            lines.append(f"o0 = {rest}")
        else:
            lines.append(f"o{k} = {rest} % ({t(shape[k])})")
            lines.append(f"_r{k} = {rest} // ({t(shape[k])})")
            rest = f"_r{k}"
    return lines + [TERMS]


def _plain_copy(p: Plan) -> bool:
    """A copy without value conversions (the device's own copy may move it)."""
    return isinstance(p, Copy) and not p.conversions


def elements_block(p: Plan) -> int:
    """Elements per program of the elements walk: COPY_BYTES of a plain copy, else BLOCK_ELEMENTS."""
    if _plain_copy(p):
        return max(1, COPY_BYTES // max(1, p.in_elem.bits // 8))
    return BLOCK_ELEMENTS


def _load(target: str, addr: str, valid: str | None, other: str, suffix: str = "") -> list[str]:
    """``target = tl.load(x_ptr + addr, ...)`` with the address (and the condition) bound first when
    they are expressions, so the load reads as one short line."""
    lines = []
    if not addr.isidentifier():
        lines.append(f"src = {addr}")
        addr = "src"
    if valid is None:
        mask = "mask"
    else:
        lines.append(f"ok = mask & {valid}")
        mask = "ok"
    return lines + [f"{target} = tl.load(x_ptr + {addr}, mask={mask}{other}){suffix}"]


def _elements(p: Copy | Affine | Gather, t=t) -> list[str]:
    """One output element per lane (a plain copy: a run of them), its source address from the composed map."""
    m = None if isinstance(p, Copy) else p.map
    total = ex.mul(*p.out_shape) if p.out_shape else ex.Const(1)
    body = _lanes(p, elements_block(p)) + [f"mask = offs < ({t(total)})"] + unravel("offs", p.out_shape, t)
    if m is None:  # a copy
        body.append("v = tl.load(x_ptr + offs, mask=mask)")
    elif m.is_total():
        body += _load("v", f"({t(linear(m.src, p.in_shape))})", None, "")
    else:
        body += _load("v", f"({t(linear(m.src, p.in_shape))})", t(m.valid), f", other={t(m.fill)}")
    body += _conversions(p, "v")
    body.append("tl.store(y_ptr + offs, v, mask=mask)")
    return body


def _tiles(p: Affine | Gather, t=t) -> list[str]:
    """A transposing map (``tile_axis``): 2-D tiles of (o_a, the last axis), o_a the axis that reads
    the source in order. The loads of a tile column are one run of source elements, the stores of a
    tile row one run of output elements; the compiler regroups the tile between them."""
    m, a, rank = p.map, p.tile_axis, len(p.out_shape)
    last = rank - 1
    planes = [k for k in range(rank) if k not in (a, last)]
    size_a, size_b = t(p.out_shape[a]), t(p.out_shape[last])
    moved = (["_plane"] if planes else []) + ["rows", "cols"]  # computed from pid, then widened or made unsigned
    names = ", ".join(moved)
    lines = [
        f"_nct = ({size_b} + {TILE_OUT - 1}) // {TILE_OUT}  # column tiles",
        f"_nit = ({size_a} + {TILE_IN - 1}) // {TILE_IN}  # tiles along o{a}",
        *([f"_plane = pid // (_nct * _nit)  # this program: its index over o{', o'.join(map(str, planes))}"]
          if planes else []),
        f"rows = (pid // _nct) % _nit * {TILE_IN} + tl.arange(0, {TILE_IN})",
        f"cols = pid % _nct * {TILE_OUT} + tl.arange(0, {TILE_OUT})",
        "if WIDE:",
        f"    {names} = {', '.join(f'{v}.to(tl.int64)' for v in moved)}",
        "else:",
        f"    {names} = {', '.join(f'{v}.to({_index_type(p)})' for v in moved)}",
        *unravel("_plane", [p.out_shape[k] for k in planes], t)[:-1],
    ]
    for j, k in reversed(list(enumerate(planes))):  # unravel named them o0.. in order: rename to the axes'
        if j != k:
            lines = [x.replace(f"o{j} = ", f"o{k} = ") for x in lines]
    lines += [f"o{a} = rows[:, None]", f"o{last} = cols[None, :]", TERMS,
              f"mask = (o{a} < ({size_a})) & (o{last} < ({size_b}))"]
    if m.is_total():
        lines += _load("v", f"({t(linear(m.src, p.in_shape))})", None, "")
    else:
        lines += _load("v", f"({t(linear(m.src, p.in_shape))})", t(m.valid), f", other={t(m.fill)}")
    out = linear([ex.Var(f"o{k}") for k in range(rank)], p.out_shape)
    convert = looked_up(p, "v", TILE_IN, TILE_OUT) if looks_up(p) else _conversions(p, "v")
    return lines + convert + [f"tl.store(y_ptr + ({t(out)}), v, mask=mask)"]


def rows_word(p: Plan) -> int:
    """Elements per 32-bit word the rows walk may move at once (1: element by element): rows of
    narrow elements with no value conversion and a zero fill move as whole words when the call's
    row lengths (and the padding bound) are multiples of it; the launcher checks."""
    if not isinstance(p, Rows) or p.conversions or p.in_elem.bits >= 32 or p.map.fill != ex.Const(0):
        return 1
    return 32 // p.in_elem.bits


#: The rows walk's elements per word, a constexpr of the body: rows_word(p) when _ALT, else 1.
ROW_WORD = "_KW"


def _per_word(e: ex.Expr, w: int | str) -> ex.Expr:
    return ex.div(e, w) if isinstance(w, int) else ex.floordiv(e, ex.Var(w))


def _rows(p: Rows, w: int | str = 1, t=t) -> list[str]:
    """2-D tiles: rows found through the composed map, each copied along its contiguous last axis
    (``w`` elements per word: the last axis counted in words; ROW_WORD: the body's constexpr)."""
    m = p.map
    lead = p.out_shape[:-1]
    kout, kin = _per_word(p.out_shape[-1], w), _per_word(p.in_shape[-1], w)
    n_rows = t(ex.mul(*lead)) if lead else "1"
    return [
        f"_nct = ({t(kout)} + _TILE - 1) // _TILE",
        f"rows = tl.arange(0, {ROW_TILE_ELEMENTS} // _TILE)",
        "cols = (pid % _nct) * _TILE + tl.arange(0, _TILE)",
        "if WIDE:",
        f"    rows = rows.to(tl.int64) + (pid // _nct).to(tl.int64) * ({ROW_TILE_ELEMENTS} // _TILE)",
        "else:",
        f"    rows = (rows + (pid // _nct) * ({ROW_TILE_ELEMENTS} // _TILE)).to({_index_type(p)})",
        f"    cols = cols.to({_index_type(p)})",
        f"live = rows < ({n_rows})",
        *unravel("rows", lead, t),
        f"src = {t(linear(m.src[:-1], p.in_shape[:-1]))}",
        f"ok = live & {t(p.row_valid)}" if p.row_valid != ex.TRUE else "ok = live",
        f"inside = cols < ({t(kout)})",
        *([f"_read = inside & (cols < ({t(_per_word(p.col_bound, w))}))  # the padded columns are the fill"]
          if p.col_bound is not None else ["_read = inside"]),
        f"v = tl.load(x_ptr + src[:, None] * ({t(kin)}) + cols[None, :],",
        f"            mask=ok[:, None] & _read[None, :], other={t(m.fill)})",
        *_conversions(p, "v"),
        f"tl.store(y_ptr + rows[:, None] * ({t(kout)}) + cols[None, :], v,",
        "         mask=live[:, None] & inside[None, :])",
    ]


def _words(p: Words, t=t) -> list[str]:
    """One output word per lane: its four source bytes, the bits permuted."""
    body = _lanes(p, BLOCK_WORDS) + [f"mask = offs < ({t(ex.mul(*p.word_shape))})"] + unravel("offs", p.word_shape, t)
    body.append("w = tl.zeros([" + str(BLOCK_WORDS) + "], dtype=tl.uint32)")
    for b, (coords, valid) in enumerate(zip(p.word_sources, p.word_valid)):
        body += _load(f"b{b}", f"({t(linear(coords, p.in_shape))})", None if valid == ex.TRUE else t(valid),
                      ", other=0", ".to(tl.uint32)")
        body.append(f"w = w | (b{b} << {8 * b})" if b else "w = w | b0")
    body += words_kernel(p.conversions, "w")
    body += p.permutation.kernel("w", "r")
    body.append("tl.store(y_ptr + offs, r.to(tl.int32, bitcast=True), mask=mask)")
    return body


def swar_terms(table: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """The bit permutation of a quad done on its four *source* words, before the byte transpose.

    Output word j of a quad is byte j of source words 0..3 (its bytes 0..3), then permuted. A bit
    of source byte position b, bit k, goes to output byte b2, bit k2 whatever j is, so one masked
    shift of the whole source word moves that bit of all four output words at once:
    ``V[b2] |= (S[b] & mask) << (k2 - k)`` with ``mask`` the bit in every byte; afterwards output
    word j is byte j of V[0..3]. Returns (b, b2, shift, mask) terms: about five per output word
    instead of the seventeen masked shifts of a word permuted alone."""
    groups: dict[tuple[int, int, int], int] = {}
    for o, i in enumerate(table):
        b, k = divmod(i, 8)
        b2, k2 = divmod(o, 8)
        key = (b, b2, k2 - k)
        groups[key] = groups.get(key, 0) | (1 << k)
    return [(b, b2, d, m * 0x01010101) for (b, b2, d), m in sorted(groups.items())]


def _quads(p: Words, t=t, q: Quads | None = None) -> list[str]:
    """Four output words per lane: four whole source words (two 8-byte loads when they pair up), the
    bits permuted on the source words (swar_terms), a 4x4 byte transpose, one 16-byte store. Quads of
    words ``spread`` > 1 apart (Plan.spread_quads) are regrouped in the program before the store, so
    that it still writes whole runs of consecutive words (one lane's four words are 4*spread bytes
    apart: stored as they are, a warp would write 4-byte pieces scattered over four times the span)."""
    q = q or p.quads
    shape = p.word_shape[:-1] + (ex.div(p.word_shape[-1], 4),)
    if q.row_tile > 1:
        body = _tile_lanes(p, q, shape, t)
    else:
        body = _lanes(p, BLOCK_QUADS) + [f"mask = offs < ({t(ex.mul(*shape))})"] + unravel("offs", shape, t)
    if q.pairs:  # x is viewed as 64-bit words: source words b and b + 2 are one load
        for b in (0, 1):
            body += _load(f"p{b}", f"({t(q.bases[b])}) // 8", None if q.valid[b] == ex.TRUE else t(q.valid[b]),
                          ", other=0", ".to(tl.uint64, bitcast=True)")
        body += ["_s0 = p0.to(tl.uint32)", "_s1 = p1.to(tl.uint32)", "_s2 = (p0 >> 32).to(tl.uint32)",
                 "_s3 = (p1 >> 32).to(tl.uint32)"]
    else:
        for b in range(4):
            body += _load(f"_s{b}", f"({t(q.bases[b])}) // 4", None if q.valid[b] == ex.TRUE else t(q.valid[b]),
                          ", other=0", ".to(tl.uint32, bitcast=True)")
    for b in range(4):
        body += words_kernel(p.conversions, f"_s{b}")
    body.append("# the bit permutation on the source words: _v[b2] |= (_s[b] & mask) << shift")
    started = set()
    for b, b2, d, mask in swar_terms(p.table):
        term = f"(_s{b} & {mask:#x})" + (f" << {d}" if d > 0 else f" >> {-d}" if d < 0 else "")
        body.append(f"_v{b2} = _v{b2} | ({term})" if b2 in started else f"_v{b2} = {term}")
        started.add(b2)
    for b2 in range(4):
        if b2 not in started:
            body.append(f"_v{b2} = tl.zeros_like(_s0)")
    body += [
        "# output word j is byte j of _v0.._v3",
        "_w0, _w1, _w2, _w3 = _transpose4x4(_v0, _v1, _v2, _v3, _ASM)",
        f"w = tl.reshape(tl.join(tl.join(_w0, _w2), tl.join(_w1, _w3)), ({BLOCK_QUADS}, 4))",
    ]
    if q.spread == 1:
        return body + [
            "tl.store(y_ptr + (4 * offs)[:, None] + tl.arange(0, 4)[None, :], w.to(tl.int32, bitcast=True),",
            "         mask=mask[:, None])",
        ]
    if q.row_tile > 1:
        return body + _tile_store(p, q, shape, t)
    s, n = q.spread, 4 * BLOCK_QUADS
    # This program's quads are whole groups of `spread` (BLOCK_QUADS is a multiple of it, and so is a
    # row): their words are the n consecutive words from 4 * BLOCK_QUADS * pid, in the order
    # (quad // spread, word j, quad % spread).
    return body + [
        f"# word j of quad q is output word 4*{s}*(q // {s}) + q % {s} + {s}*j: regrouped, {n} consecutive words",
        f"w = tl.reshape(tl.permute(tl.reshape(w, ({BLOCK_QUADS // s}, {s}, 4)), (0, 2, 1)), ({n},))",
        *_lanes(p, n, "_out"),
        f"tl.store(y_ptr + _out, w.to(tl.int32, bitcast=True), mask=_out < 4 * ({t(ex.mul(*shape))}))",
    ]


def _tile_lanes(p: Words, q: Quads, shape: Sequence[ex.Expr], t=t) -> list[str]:
    """The quads of a tile of ``row_tile`` rows by BLOCK_QUADS // row_tile columns, the lanes going
    down the rows first (Quads.row_tile: there the source words of neighbouring lanes lie side by
    side); the rows are the quad grid's axes but the last, flattened."""
    r, c = q.row_tile, BLOCK_QUADS // q.row_tile
    rows = t(ex.mul(*shape[:-1])) if shape[:-1] else "1"
    return [
        f"_nct = ({t(shape[-1])} + {c - 1}) // {c}  # column tiles per row tile",
        f"_lane = tl.arange(0, {BLOCK_QUADS})",
        "if WIDE:",
        f"    offs = (pid // _nct).to(tl.int64) * {r} + _lane % {r}",
        f"    cols = (pid % _nct).to(tl.int64) * {c} + _lane // {r}",
        "else:",
        f"    offs = ((pid // _nct) * {r} + _lane % {r}).to({_index_type(p)})",
        f"    cols = ((pid % _nct) * {c} + _lane // {r}).to({_index_type(p)})",
        f"mask = (offs < ({rows})) & (cols < ({t(shape[-1])}))",
        *unravel("offs", shape[:-1], t)[:-1],
        f"o{len(shape) - 1} = cols",
        TERMS,
    ]


def _tile_store(p: Words, q: Quads, shape: Sequence[ex.Expr], t=t) -> list[str]:
    """The tile's words regrouped into its rows' runs of consecutive output words, one 2-D store."""
    s, r, c = q.spread, q.row_tile, BLOCK_QUADS // q.row_tile
    rows, width = (t(ex.mul(*shape[:-1])) if shape[:-1] else "1"), t(p.word_shape[-1])
    return [
        f"# lane (column q, row) holds words 4*{s}*(q // {s}) + q % {s} + {s}*j of its row: {r} runs of {4 * c} words",
        f"w = tl.reshape(tl.permute(tl.reshape(w, ({c // s}, {s}, {r}, 4)), (2, 0, 3, 1)), ({r}, {4 * c}))",
        f"rows = (pid // _nct) * {r} + tl.arange(0, {r})",
        f"cols = (pid % _nct) * {4 * c} + tl.arange(0, {4 * c})",
        "if WIDE:",
        "    rows = rows.to(tl.int64)",
        f"tl.store(y_ptr + rows[:, None] * ({width}) + cols[None, :], w.to(tl.int32, bitcast=True),",
        f"         mask=(rows < ({rows}))[:, None] & (cols < ({width}))[None, :])",
    ]


TABLE_ON = '''_TABLES_ON_DEVICES = {}


def _table_on(values, device):
    # A lookup table of an index map as int32 entries on the kernel's device, built once per table and device.
    # The entry keeps `values`, whose id is in the key, and is read only for that very object.
    key = (id(values), device)
    hit = _TABLES_ON_DEVICES.get(key)
    if hit is None or hit[0] is not values:
        hit = _TABLES_ON_DEVICES[key] = (values, torch.tensor(values, dtype=torch.int32, device=device))
    return hit[1]
'''


TRANSPOSE = '''
@triton.jit
def _transpose4x4(v0, v1, v2, v3, _ASM: tl.constexpr):
    # Words w0..w3 with byte b of w_j = byte j of v_b. On CUDA eight byte permutes (prmt); in the
    # interpreter, or with ASM off, the same with shifts and masks.
    if _ASM:
        a = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x6240;", "=r,r,r", [v0, v1], dtype=tl.uint32, is_pure=True, pack=1)
        b = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7351;", "=r,r,r", [v0, v1], dtype=tl.uint32, is_pure=True, pack=1)
        c = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x6240;", "=r,r,r", [v2, v3], dtype=tl.uint32, is_pure=True, pack=1)
        e = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7351;", "=r,r,r", [v2, v3], dtype=tl.uint32, is_pure=True, pack=1)
        w0 = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r", [a, c], dtype=tl.uint32, is_pure=True, pack=1)
        w1 = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r", [b, e], dtype=tl.uint32, is_pure=True, pack=1)
        w2 = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7632;", "=r,r,r", [a, c], dtype=tl.uint32, is_pure=True, pack=1)
        w3 = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7632;", "=r,r,r", [b, e], dtype=tl.uint32, is_pure=True, pack=1)
    else:
        a = (v0 & 0x00FF00FF) | ((v1 & 0x00FF00FF) << 8)
        b = ((v0 >> 8) & 0x00FF00FF) | (v1 & 0xFF00FF00)
        c = (v2 & 0x00FF00FF) | ((v3 & 0x00FF00FF) << 8)
        e = ((v2 >> 8) & 0x00FF00FF) | (v3 & 0xFF00FF00)
        w0 = (a & 0xFFFF) | (c << 16)
        w1 = (b & 0xFFFF) | (e << 16)
        w2 = (a >> 16) | (c & 0xFFFF0000)
        w3 = (b >> 16) | (e & 0xFFFF0000)
    return w0, w1, w2, w3
'''


def uses_transpose(p: Plan) -> bool:
    """Whether the body of ``p`` calls ``_transpose4x4`` (TRANSPOSE is then part of the kernels)."""
    return isinstance(p, Words) and (p.quads is not None or p.spread_quads is not None)


def body(p: Plan, name: str, dims: Sequence[str], terms: Sequence[tuple[str, ex.Expr]] = ()) -> str:
    """``@triton.jit def name(x_ptr, y_ptr, pid, <dims>, WIDE, _ALT, _TILE, _ASM)``: the part of the
    output that program ``pid`` of this tensor converts. _ALT selects the plan's alternative walk (coarse
    words, quads) when the call's shapes allow it; _TILE is the column tile of the rows walk; _ASM
    allows inline PTX. ``terms``: the header's named terms (:func:`header_terms`), bound under the
    header's names where a walk over the map's own coordinates holds them (the coarse and quads walks
    run over other grids: their terms get other names, never the header's)."""
    found = tables(p)
    args = [table_arg(k) for k in range(len(found))]
    params = ", ".join(["x_ptr", "y_ptr", *args, "pid"] + [f"{d}: tl.constexpr" for d in dims])
    flags = "WIDE: tl.constexpr, _ALT: tl.constexpr, _TILE: tl.constexpr, _ASM: tl.constexpr"
    taken = set(dims) | _LOCALS | {n for n, _ in terms} | set(args)
    printer = table_printer(found) if found else ex.to_triton

    def named(walk, given=terms) -> list[str]:  # the walk's index terms named once (layoutc.lower.terms)
        return collect_and_name(walk, taken, printer, TERMS, size_annotation=": tl.constexpr", given=given)

    sizes = tuple((n, d) for n, d in terms if is_size(d))  # the same on every grid

    def alternative(first, second) -> list[str]:  # the first walk is over another grid
        return ["if _ALT:", *("    " + x for x in named(first, sizes)), "else:", *("    " + x for x in named(second))]

    if isinstance(p, Words) and (p.quads or p.spread_quads) is not None:
        lines = alternative(lambda t: _quads(p, t, p.spread_quads), lambda t: _words(p, t))
    elif isinstance(p, Words) and p.units is not None:
        lines = alternative(lambda t: units_body(p, lambda n=BLOCK_WORDS: _lanes(p, n), unravel, t),
                            lambda t: _words(p, t))
    elif isinstance(p, Words):
        lines = named(lambda t: _words(p, t))
    elif isinstance(p, Rows) and rows_word(p) > 1:  # one body: the word width is a constexpr
        lines = [f"{ROW_WORD}: tl.constexpr = {rows_word(p)} if _ALT else 1  # elements per word",
                 *named(lambda t: _rows(p, ROW_WORD, t))]
    elif isinstance(p, Rows):
        lines = named(lambda t: _rows(p, 1, t))
    elif isinstance(p, Gather) and p.coarse > 1:
        lines = alternative(lambda t: coarse_body(p, _lanes(p, BLOCK_ELEMENTS), unravel, _load, t),
                            lambda t: _elements(p, t))
    elif isinstance(p, (Affine, Gather)) and p.tile_axis is not None:
        lines = named(lambda t: _tiles(p, t))
    elif isinstance(p, Gather) and p.steps is not None:
        lines = alternative(lambda t: steps_body(p, _lanes(p, BLOCK_ELEMENTS), unravel, t, UINT),
                            lambda t: _elements(p, t))
    elif isinstance(p, (Copy, Affine, Gather)):
        lines = named(lambda t: _elements(p, t))
    else:
        raise unknown("Triton", p)
    return ("@triton.jit\n" + f"def {name}({params},\n{' ' * (len(name) + 5)}{flags}):\n"
            + "\n".join("    " + x for x in lines) + "\n")


def layer_kernel(name: str, bodies: Sequence[str], dims: Sequence[str], lookups: Sequence[int] = ()) -> str:
    """One kernel for a layer: programs [0, G0) run body 0, [G0, G0 + G1) body 1, and so on.
    ``lookups``: the lookup tables each body takes (kernel arguments after its input and output)."""
    lookups = list(lookups) or [0] * len(bodies)
    tabs = [[f"_tab{i}_{k}" for k in range(lookups[i])] for i in range(len(bodies))]
    args = [a for i in range(len(bodies)) for a in (f"_x{i}", f"_y{i}", *tabs[i])]
    flags = [f"_{k}{i}: tl.constexpr" for i in range(len(bodies)) for k in ("G", "W", "A", "T")]
    sig = ", ".join(args + [f"{d}: tl.constexpr" for d in dims] + flags + ["_ASM: tl.constexpr"])
    lines = ["@triton.jit", f"def {name}({sig}):", "    pid = tl.program_id(0)"]
    start = ""
    for i, b in enumerate(bodies):
        end = f"{start}_G{i}"
        lines.append(f"    {'if' if i == 0 else 'elif'} pid < {end}:")
        local = "pid" if i == 0 else f"pid - ({start[:-3]})"
        lines.append(f"        {b}(_x{i}, _y{i}, {''.join(a + ', ' for a in tabs[i])}{local}, "
                     f"{''.join(d + ', ' for d in dims)}_W{i}, _A{i}, _T{i}, _ASM)")
        start = end + " + "
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# the launcher: Python that allocates the outputs and launches the layer kernel once


def launcher(name: str, kernel: str, entries: Sequence[tuple[str, Plan]], dims: Sequence[str],
             lookups: dict[str, Sequence[str]] | None = None) -> str:
    """Source of ``def name(tensors, d, outs=None) -> dict``: allocate every output of ``entries`` (tensor
    name, plan) or take it from ``outs`` (convert's out=, checked), choose each walk for the call's shapes,
    launch ``kernel`` once. ``lookups``: per tensor, the module-level names of its lookup tables (passed to
    the kernel after its input and output)."""
    lookups = lookups or {}
    xs = ", ".join(f"tensors[{tensor!r}]" for tensor, _ in entries)
    key = (f"_prepared_key({name}, _xs, d)" if not any(lookups.values()) else
           "None  # lookup tables are kernel arguments: no prepared launch (it passes inputs and outputs only)")
    lines = [f"def {name}(tensors, d, outs=None):",
             f"    # One launch converts {', '.join(n for n, _ in entries)}.",
             f"    _xs = ({xs},)",
             f"    _key = {key}",
             "    _run = _PREPARED.get(_key)",
             "    if _run is not None:  # a warm call of these shapes: allocate (or take outs) and launch",
             "        return _run(_xs, outs)",
             *(f"    {d} = d[{d!r}]" for d in dims),
             "    out, _args, _flags, total, _apart = {}, [], {}, 0, []"]
    for i, (tensor, p) in enumerate(entries):
        shape = ", ".join(ex.to_python(s) for s in p.out_shape)
        lines += [
            "",
            f"    x = _aligned(tensors[{tensor!r}])  # the kernels load whole words",
            f"    y = _output(outs, {tensor!r}, ({shape},), torch.{p.out_elem.canonical}, x.device)",
        ]
        walks = _walks(p)
        if len(walks) == 1:
            lines += [f"    {line}" for line in walks[0][1]]
            alt = "False"
        else:
            (cond, first), (_, second) = walks
            lines += [f"    _alt = {cond}", "    if _alt:", *(f"        {x}" for x in first), "    else:",
                      *(f"        {x}" for x in second)]
            alt = "_alt"
        if _plain_copy(p):  # a plain copy: large ones by the device's own copy
            lines += ["    if _copy_apart(x):", "        ys.copy_(xs)", "        n = 0", f"        _apart.append({i})"]
        lines += [
            "    _args += [xs, ys" + "".join(f", _table_on({n}, x.device)" for n in lookups.get(tensor, ())) + "]",
            f"    _flags.update(_G{i}=n, _W{i}=max(x.numel() * x.element_size(), y.numel() * y.element_size()) >= 2**31, "
            f"_A{i}={alt}, _T{i}=_t)",
            "    total += n",
            f"    out[{tensor!r}] = y",
        ]
    lines += [
        "",
        f"    _consts = dict({''.join(f'{d}={d}, ' for d in dims)}**_flags, _ASM=_inline_asm(x))",
        "    _compiled = None",
        "    if total:",
        "        kernels = _triton_kernels(_TRITON_SOURCE, _TRITON_FILE)",
        f"        _compiled = _launch(kernels[{kernel!r}], total, _args, _consts, "
        f"{layer_warps([p for _, p in entries])})",
        "    _prepare(_key, _compiled, total, _consts, out, _args, _apart)",
        "    return out",
    ]
    return "\n".join(lines) + "\n"


def _view(what: str, var: str) -> str:
    return var if what == "same" else f"{var}.view(torch.{what})"


def _walks(p: Plan) -> list[tuple[str | None, list[str]]]:
    """(condition, launcher lines binding xs, ys, n, _t) per walk: the alternative first."""
    def walk(xv: str, yv: str, count: str, tile: str = "1") -> list[str]:
        return [f"xs, ys, _t = {_view(xv, 'x')}, {_view(yv, 'y')}, {tile}", f"n = {count}"]

    if isinstance(p, Words):
        return _word_walks(p, walk)
    same = "same" if p.conversions else BIT_VIEWS[p.in_elem.bits]
    if isinstance(p, Rows):
        return _row_walks(p, same)
    if not isinstance(p, (Copy, Affine, Gather)):
        raise unknown("Triton launcher", p)
    total = ex.to_python(ex.mul(*p.out_shape)) if p.out_shape else "1"
    if not isinstance(p, Copy) and p.tile_axis is not None:  # tiles of TILE_IN x TILE_OUT
        a, last = p.tile_axis, len(p.out_shape) - 1
        planes = [ex.to_python(s) for k, s in enumerate(p.out_shape) if k not in (a, last)]
        count = (f"{'*'.join(f'({x})' for x in planes) or '1'} * -(-({ex.to_python(p.out_shape[a])}) // {TILE_IN})"
                 f" * -(-({ex.to_python(p.out_shape[last])}) // {TILE_OUT})")
        return [(None, walk(same, same, count))]
    plain = walk(same, same, f"-(-({total}) // {elements_block(p)})")
    if p.coarse > 1:
        wide = BIT_VIEWS[p.in_elem.bits * p.coarse]
        coarse = walk(wide, wide, f"-(-({total}) // {p.coarse * BLOCK_ELEMENTS})")
        return [(f"x.shape[-1] % {p.coarse} == 0 and y.shape[-1] % {p.coarse} == 0  # whole words", coarse),
                (None, plain)]
    if isinstance(p, Gather) and p.steps is not None:
        runs = walk(BIT_VIEWS[p.in_elem.bits], "int32", f"-(-({total}) // {p.steps.run * BLOCK_ELEMENTS})")
        return [(f"y.shape[-1] % {p.steps.run} == 0  # whole runs", runs), (None, plain)]
    return [(None, plain)]


def _word_walks(p: Words, walk) -> list[tuple[str | None, list[str]]]:
    """The quads walk (where the plan has one) and the words walk."""
    words = walk("uint8", "int32", f"-(-({ex.to_python(ex.mul(*p.word_shape))}) // {BLOCK_WORDS})")
    q = p.quads if p.quads is not None else p.spread_quads
    if q is not None:
        shape = p.word_shape[:-1] + (ex.div(p.word_shape[-1], 4),)
        cond = " and ".join(f"{d} % {q.multiple} == 0" for d in q.guard_dims) or "True"
        rest = ex.simplify(ex.mod(p.word_shape[-1], 4 * q.spread),
                           {d: (1, None) for d in ex.free_vars(p.word_shape[-1])})
        if q.spread > 1 and rest != ex.Const(0):  # rows of whole groups of spread quads (unless always)
            cond += f" and ({ex.to_python(p.word_shape[-1])}) % {4 * q.spread} == 0"
        count = f"-(-({ex.to_python(ex.mul(*shape))}) // {BLOCK_QUADS})"
        if q.row_tile > 1:  # tiles of row_tile rows by BLOCK_QUADS // row_tile columns
            rows = ex.to_python(ex.mul(*shape[:-1])) if shape[:-1] else "1"
            count = (f"-(-({rows}) // {q.row_tile}) * -(-({ex.to_python(shape[-1])}) // "
                     f"{BLOCK_QUADS // q.row_tile})")
        quads = walk("int64" if q.pairs else "int32", "int32", count)
        return [(cond + "  # the dims the quads walk was checked for", quads), (None, words)]
    if p.units is not None:
        return [units_walk(p, walk, BLOCK_WORDS), (None, words)]
    return [(None, words)]


def _row_walks(p: Rows, same: str) -> list[tuple[str | None, list[str]]]:
    """The rows walk by whole words (where the call's shapes allow) and element by element."""
    lead = ex.to_python(ex.mul(*p.out_shape[:-1])) if p.out_shape[:-1] else "1"

    def rows(view: str, w: int) -> list[str]:
        cols = f"({ex.to_python(p.out_shape[-1])}) // {w}" if w > 1 else ex.to_python(p.out_shape[-1])
        tile = f"_row_tile({cols}, {ROW_TILE_COLS})"
        return [f"_t = {tile}", f"xs, ys = {_view(view, 'x')}, {_view(view, 'y')}",
                f"n = -(-({lead}) // ({ROW_TILE_ELEMENTS} // _t)) * -(-({cols}) // _t)"]
    w = rows_word(p)
    if w == 1:
        return [(None, rows(same, 1))]
    bound = f" and ({ex.to_python(p.col_bound)}) % {w} == 0" if p.col_bound is not None else ""
    return [(f"x.shape[-1] % {w} == 0 and y.shape[-1] % {w} == 0{bound}  # whole words", rows("int32", w)),
            (None, rows(same, 1))]
