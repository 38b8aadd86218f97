"""Fused lowering: each output tensor in one pass, from its composed index map.

A chain of any length collapses into one gather (docs/design.md section 2). The plan for a
tensor is one of:

``copy``    no index transform: one copy (with the value conversion)
``affine``  the composed map is affine in the output coordinates: one strided view of the
            input and one copy
``gather``  any other byte/element map: one kernel that computes each source address with
            integer arithmetic from the composed map (no index tensor in memory)
``words``   a bit-level packing at the end of the chain (the SM90 FP4 interleave): one kernel
            that, per 32-bit output word, loads its four source bytes through the composed
            map of the steps before it, permutes the bits with masked shifts and stores the word

Casts and views are value conversions applied between load and store. On CUDA the
kernels are generated Triton; on CPU the same plan runs as torch code (one gather per
expert chunk, indices computed from the same expressions).
"""

from __future__ import annotations

from typing import Sequence

import attrs

from .. import expr as ex
from ..compiler import Chain
from ..dtypes import ElemType
from ..indexmap import IndexMap, compose_all, identity
from ..ops.base import Category

TRITON_DTYPES = {
    "uint8": "tl.uint8", "int8": "tl.int8", "int16": "tl.int16", "int32": "tl.int32", "float16": "tl.float16",
    "bfloat16": "tl.bfloat16", "float32": "tl.float32", "float8_e4m3fn": "tl.float8e4nv", "float8_e5m2": "tl.float8e5",
}


@attrs.frozen
class FusedPlan:
    tensor: str
    kind: str  # "copy" | "affine" | "gather" | "words" | "eager"
    in_elem: ElemType
    out_elem: ElemType
    in_shape: tuple[ex.Expr, ...]
    out_shape: tuple[ex.Expr, ...]
    map: IndexMap | None = None  # gather / affine: out element -> input element
    word_shape: tuple[ex.Expr, ...] = ()  # words: the output seen as 32-bit words
    word_sources: tuple[tuple[ex.Expr, ...], ...] = ()  # words: input coordinates of bytes 0..3
    word_valid: tuple[ex.Expr, ...] = ()  # words: whether each byte reads the input (else 0)
    table: tuple[int, ...] = ()
    conversions: tuple[tuple, ...] = ()  # each value step's conversion() in chain order: ("cast", type), ...
    reason: str = ""  # why a plan fell back to eager
    # How the CUDA kernel moves data (see triton_kernel): "elements" (one per lane), "rows" (2-D tiles
    # whose last axis is copied contiguously), "words4" (four output words from whole source words).
    form: str = "elements"
    word4_bases: tuple[ex.Expr, ...] = ()  # words4: byte address of source word t' (over the q grid)
    word4_pairs: bool = False  # words4: words 0|2 and 1|3 are adjacent, 8-aligned: two 8-byte loads
    coarse: int = 1  # elements: the map moves runs of this many elements; the kernel moves them as one word
    coarse_src: ex.Expr | None = None  # ... source word index over the coarse output grid
    coarse_valid: ex.Expr = ex.TRUE

    @property
    def is_fused(self) -> bool:
        return self.kind != "eager"


def _ranges(shape: Sequence[ex.Expr]) -> dict:
    """Bounds of the output coordinates where sizes are constants (enough to fold most reshape arithmetic)."""
    return {f"o{k}": (0, s.value - 1) if isinstance(s, ex.Const) else (0, None) for k, s in enumerate(shape)}


def _tidy(e: ex.Expr, shape: Sequence[ex.Expr], dims: Sequence[str]) -> ex.Expr:
    ranges = _ranges(shape)
    ranges.update({d: (1, None) for d in dims})
    return ex.simplify_symbolic(ex.simplify(e, ranges), ex.coordinate_ranges(shape))


def _has_table(e: ex.Expr) -> bool:
    return isinstance(e, ex.Table) or any(_has_table(c) for c in ex.children(e))


def plan(chain: Chain) -> FusedPlan:
    raw = _tidy_plan(chain)
    # A lookup table in the index arithmetic (permute(table=...), as layoutc infer writes for a row
    # order no op gives) has no Triton form: such a tensor is converted by the eager lowering.
    exprs = [x for w in raw.word_sources for x in w] + list(raw.word_valid)
    if raw.map is not None:
        exprs += [*raw.map.src, raw.map.valid]
    if raw.is_fused and any(_has_table(x) for x in exprs):
        return attrs.evolve(raw, kind="eager", reason="a lookup table in the index map (not lowered to Triton)")
    samples = _samples(chain)
    if raw.kind == "words":
        bases = _words4_bases(raw, samples)
        if bases is not None:
            raw = attrs.evolve(raw, form="words4", word4_bases=bases, word4_pairs=_pairs(raw, bases, samples))
    elif raw.kind == "gather" and _rows_form(raw.map):
        raw = attrs.evolve(raw, form="rows")
    elif raw.kind == "gather" and not raw.conversions:
        raw = _coarsen(raw, chain)
    return raw


def _grid_env(shape: Sequence[int], dims: dict) -> dict:
    import torch

    env = dict(dims)
    for axis, n in enumerate(shape):
        view = [1] * len(shape)
        view[axis] = n
        env[f"o{axis}"] = torch.arange(n).view(view)
    return env


def _coarsen(p: FusedPlan, chain: Chain) -> FusedPlan:
    """Runs of R consecutive output elements that read R consecutive, R-aligned input elements
    (the 4-byte groups of the SM90 scale fold and of the 128x4 swizzle) move as one R-element word."""
    import torch

    from ..instances import sample_dims

    m = p.map
    if not m.fill == ex.Const(0):
        return p
    names = tuple(sorted(set().union(*(ex.free_vars(x) for x in chain.source.shape))))
    known = [(c.value, c.multiple) for c in chain.constraints]
    rank = m.out_rank
    last = f"o{rank - 1}"
    linear = _linear(m.src, p.in_shape)
    for r in (8, 4, 2):
        if r * p.in_elem.bits > 64:
            continue
        base = ex.substitute(linear, {last: ex.mul(r, ex.Var(last))})
        valid = ex.substitute(m.valid, {last: ex.mul(r, ex.Var(last))})
        # Checked on small instances where the launcher would take this path (both last axes % r).
        fits = sample_dims(names, known + [(p.out_shape[-1], r), (p.in_shape[-1], r)], per_dim=4)
        fits = fits[:: max(1, len(fits) // 6)][:6]
        ok = len(fits) >= 2
        for dims in fits if ok else []:
            out_shape = [int(ex.evaluate(s, dims)) for s in p.out_shape]
            env = _grid_env(out_shape[:-1] + [out_shape[-1] // r], dims)
            b = torch.as_tensor(ex.evaluate(base, env))
            v = torch.as_tensor(ex.evaluate(valid, env)).to(torch.bool)
            if bool(((b % r != 0) & v).any()):
                ok = False
                break
            for j in range(1, r):
                shifted = dict(env)
                shifted[last] = env[last] * r + j
                same_addr = torch.as_tensor(ex.evaluate(linear, shifted)) == b + j
                same_valid = torch.as_tensor(ex.evaluate(m.valid, shifted)).to(torch.bool) == v
                if not bool((same_valid & (same_addr | ~v)).all()):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            return attrs.evolve(p, coarse=r, coarse_src=ex.floordiv(base, r), coarse_valid=valid)
    return p


def _samples(chain: Chain) -> list[dict]:
    from ..instances import sample_dims

    names = sorted(set().union(*(ex.free_vars(s) for s in chain.source.shape)))
    found = sample_dims(tuple(names), [(c.value, c.multiple) for c in chain.constraints], per_dim=6)
    return found[:: max(1, len(found) // 6)][:6]  # a spread of small instances


def _rows_form(m: IndexMap) -> bool:
    """The last axis is copied as is: src_last == o_last, and nothing else depends on o_last."""
    last = f"o{m.out_rank - 1}"
    return (m.src[-1] == ex.Var(last) and m.in_shape[-1] == m.out_shape[-1]
            and all(last not in ex.free_vars(e) for e in (*m.src[:-1], m.valid, m.fill)))


def _words4_bases(p: FusedPlan, samples: list[dict]) -> tuple[ex.Expr, ...] | None:
    """When four consecutive output words read four consecutive bytes of each source (a 4x4 byte
    transpose, as in the SM90 interleave), the byte address of each source *word* over the grid of
    word quads; checked exhaustively on small instances of the dims."""
    import torch

    if not samples:
        return None
    k = len(p.word_shape) - 1
    last = f"o{k}"
    addrs = [_linear(c, p.in_shape) for c in p.word_sources]
    if any(last in ex.free_vars(v) for v in p.word_valid):
        return None
    quad = {last: ex.mul(4, ex.Var(last))}
    bases = tuple(ex.substitute(a, quad) for a in addrs)
    for dims in samples:
        shape = [int(ex.evaluate(s, dims)) for s in p.word_shape]
        if shape[-1] % 4 or int(ex.evaluate(p.in_shape[-1], dims)) % 4:
            return None
        env = dict(dims)
        for axis, n in enumerate(shape[:-1] + [shape[-1] // 4]):
            view = [1] * len(shape)
            view[axis] = n
            env[f"o{axis}"] = torch.arange(n).view(view)
        for addr, base in zip(addrs, bases):
            b = torch.as_tensor(ex.evaluate(base, env))
            if bool((b % 4 != 0).any()):
                return None
            for j in range(1, 4):
                shifted = dict(env)
                shifted[last] = env[last] * 4 + j
                if not bool((torch.as_tensor(ex.evaluate(addr, shifted)) == b + j).all()):
                    return None
    return bases


def _pairs(p: FusedPlan, bases: tuple[ex.Expr, ...], samples: list[dict]) -> bool:
    """Source words 0 and 2 (and 1 and 3) are the two halves of one aligned 8-byte word."""
    import torch

    if len(bases) != 4 or p.word_valid[0] != p.word_valid[2] or p.word_valid[1] != p.word_valid[3]:
        return False
    for dims in samples:
        shape = [int(ex.evaluate(s, dims)) for s in p.word_shape]
        shape[-1] //= 4
        env = dict(dims)
        for axis, n in enumerate(shape):
            view = [1] * len(shape)
            view[axis] = n
            env[f"o{axis}"] = torch.arange(n).view(view)
        b = [torch.as_tensor(ex.evaluate(e, env)) for e in bases]
        for lo, hi in ((0, 2), (1, 3)):
            if not (bool((b[hi] == b[lo] + 4).all()) and bool((b[lo] % 8 == 0).all())):
                return False
    return True


def _tidy_plan(chain: Chain) -> FusedPlan:
    raw = _plan(chain)
    dims = sorted(set().union(*(ex.free_vars(s) for s in chain.source.shape)))
    if raw.map is not None:
        m = raw.map
        tidy = lambda e: _tidy(e, m.out_shape, dims)  # noqa: E731
        raw = attrs.evolve(raw, map=attrs.evolve(m, src=tuple(tidy(s) for s in m.src), valid=tidy(m.valid),
                                                 fill=tidy(m.fill)))
    if raw.kind == "words":
        tidy = lambda e: _tidy(e, raw.word_shape, dims)  # noqa: E731
        raw = attrs.evolve(raw, word_sources=tuple(tuple(tidy(c) for c in cs) for cs in raw.word_sources),
                           word_valid=tuple(tidy(v) for v in raw.word_valid))
    return raw


def _plan(chain: Chain) -> FusedPlan:
    spec = chain.source
    out_type = chain.out_type
    base = dict(tensor=chain.tensor, in_elem=spec.elem, out_elem=out_type.elem, in_shape=spec.shape,
                out_shape=out_type.shape)
    index_steps = [s for s in chain.steps if s.op.category is not Category.VALUE]
    conversions = tuple(s.op.conversion() for s in chain.steps if s.op.category is Category.VALUE)
    bit_steps = [i for i, s in enumerate(chain.steps) if s.op.bit_level]
    if bit_steps:
        return _words_plan(chain, bit_steps, base)
    if not index_steps:
        return FusedPlan(kind="copy", conversions=conversions, **base)
    m = compose_all([s.op.index_map(s.in_type) for s in index_steps])
    kind = "affine" if affine_strides(m) is not None else "gather"
    return FusedPlan(kind=kind, map=m, conversions=conversions, **base)


def _words_plan(chain: Chain, bit_steps: list[int], base: dict) -> FusedPlan:
    """A chain with one permutation of the bits within 32-bit words: byte gathers before it (``P``), the
    permutation, byte moves after it that keep each word's 4 bytes together (``Q``). Output word ``w``
    is then the permuted word whose bytes ``P`` reads at the word position ``Q`` gives ``w``."""
    i = bit_steps[0]
    step = chain.steps[i]
    perm = step.op.word_permutation()
    if len(bit_steps) > 1 or perm is None or perm[0] != 4:
        return FusedPlan(kind="eager", reason="bit-level steps other than one permutation of 32-bit words", **base)
    if any(s.op.category is Category.VALUE for s in chain.steps):
        return FusedPlan(kind="eager", reason="value conversions around a bit permutation", **base)
    before = [s.op.index_map(s.in_type) for s in chain.steps[:i]]
    after = [s.op.index_map(s.in_type) for s in chain.steps[i + 1:]]
    p = compose_all(before) if before else identity(chain.source.shape)
    q = compose_all(after) if after else identity(step.out_type.shape)
    word = perm[0]
    if not q.is_total() or not _moves_whole_words(q, word, chain):
        return FusedPlan(kind="eager", reason="the steps after a bit permutation split its words", **base)
    last = f"o{q.out_rank - 1}"
    start = tuple(ex.substitute(c, {last: ex.mul(word, ex.Var(last))}) for c in q.src)  # the word's byte 0
    sources, valids = [], []
    for t in range(word):
        at = start[:-1] + (ex.add(start[-1], t),)
        sub = {f"o{k}": c for k, c in enumerate(at)}
        sources.append(tuple(ex.substitute(s, sub) for s in p.src))
        valids.append(ex.substitute(p.valid, sub))
    word_shape = q.out_shape[:-1] + (ex.div(q.out_shape[-1], word),)
    return FusedPlan(kind="words", word_shape=word_shape, word_sources=tuple(sources), word_valid=tuple(valids),
                     table=perm[1], **base)


def _moves_whole_words(q: IndexMap, word: int, chain: Chain) -> bool:
    """Every aligned run of ``word`` output bytes reads one aligned run of ``word`` bytes in order
    (checked on small instances of the dims)."""
    import torch

    samples = _samples(chain)
    if not samples:
        return False
    last = f"o{q.out_rank - 1}"
    linear = _linear(q.src, q.in_shape)
    base = ex.substitute(linear, {last: ex.mul(word, ex.Var(last))})
    for dims in samples:
        out_shape = [int(ex.evaluate(s, dims)) for s in q.out_shape]
        if out_shape[-1] % word:
            return False
        env = _grid_env(out_shape[:-1] + [out_shape[-1] // word], dims)
        b = torch.as_tensor(ex.evaluate(base, env))
        if bool((b % word != 0).any()):
            return False
        for j in range(1, word):
            shifted = dict(env)
            shifted[last] = env[last] * word + j
            if not bool((torch.as_tensor(ex.evaluate(linear, shifted)) == b + j).all()):
                return False
    return True


def affine_strides(m: IndexMap) -> tuple[tuple[ex.Expr, ...], ex.Expr] | None:
    """(input-element stride of each output axis, offset) when ``m`` is a strided view, else None."""
    if not m.is_total() or m.bit_level:
        return None
    rank = m.out_rank
    zero = {f"o{k}": 0 for k in range(rank)}
    in_strides = _contiguous_strides(m.in_shape)
    for sample in (64 * 3, 64 * 5):  # linear in the coordinates for two bindings of the dims
        dims = {d: sample + 7 * i for i, d in enumerate(sorted(set().union(*(ex.free_vars(s) for s in m.in_shape))))}
        for s in m.src:
            form = ex.linear_form(ex.substitute(s, dims))
            if form is None or any(c.denominator != 1 for c in form[0].values()):
                return None
    linear = ex.add(*(ex.mul(s, st) for s, st in zip(m.src, in_strides)))
    offset = ex.substitute(linear, zero)
    strides = []
    for k in range(rank):
        unit = dict(zero)
        unit[f"o{k}"] = 1
        strides.append(ex.add(ex.substitute(linear, unit), ex.mul(-1, offset)))
    # torch views have no negative strides (a reversed axis): such a map is a gather
    for sample in (64 * 3, 64 * 5):
        dims = {d: sample + 7 * i for i, d in enumerate(sorted(set().union(*(ex.free_vars(s) for s in m.in_shape))))}
        if any(ex.evaluate(st, dims) < 0 for st in strides):
            return None
    return tuple(strides), offset


def _contiguous_strides(shape: Sequence[ex.Expr]) -> tuple[ex.Expr, ...]:
    strides: list[ex.Expr] = []
    acc: ex.Expr = ex.Const(1)
    for size in reversed(shape):
        strides.append(acc)
        acc = ex.mul(acc, size)
    return tuple(reversed(strides))


def _linear(coords: Sequence[ex.Expr], shape: Sequence[ex.Expr]) -> ex.Expr:
    return ex.add(*(ex.mul(c, s) for c, s in zip(coords, _contiguous_strides(shape))))


def _unravel_lines(var: str, shape: Sequence[ex.Expr], printer) -> list[str]:
    """Source lines binding o0.. from a flat index ``var`` over ``shape`` (row-major)."""
    rank = len(shape)
    lines = []
    rest = var
    for k in reversed(range(rank)):
        size = printer(shape[k])
        if k == 0:
            lines.append(f"o0 = {rest}")
        else:
            lines.append(f"o{k} = {rest} % ({size})")
            lines.append(f"_r{k} = {rest} // ({size})")
            rest = f"_r{k}"
    return lines


def _bit_permutation_terms(table: Sequence[int]) -> list[tuple[int, int]]:
    """(mask, shift) pairs with ``out = OR((w & mask) << shift)`` (negative shift: right)."""
    groups: dict[int, int] = {}
    for i, s in enumerate(table):
        groups[i - s] = groups.get(i - s, 0) | (1 << s)
    return sorted(((mask, shift) for shift, mask in groups.items()), key=lambda t: -t[1])


# ---------------------------------------------------------------------------
# Triton


#: The canonical quiet NaN of each float type, as bits (what torch.tensor(nan, dtype) holds).
CANONICAL_NAN = {"bfloat16": ("tl.uint16", 0x7FC0), "float16": ("tl.uint16", 0x7E00),
                 "float32": ("tl.uint32", 0x7FC00000), "float8_e4m3fn": ("tl.uint8", 0x7F),
                 "float8_e5m2": ("tl.uint8", 0x7E)}


def _conv_triton(plan: FusedPlan, value: str) -> list[str]:
    lines = []
    elem = plan.in_elem
    for conv in plan.conversions:
        kind, to = conv[0], conv[-1]
        dtype = TRITON_DTYPES[to.canonical]
        if kind == "cast" and elem.canonical == "float32" and to.canonical == "bfloat16":
            # Round to nearest even on the bits, exactly as torch does, whatever the backend's
            # conversion (Triton's CPU interpreter truncates); NaN -> the canonical 0x7FC0.
            lines += [
                f"_b = {value}.to(tl.uint32, bitcast=True)",
                "_r = (_b + 0x7FFF + ((_b >> 16) & 1)) >> 16",
                "_r = tl.where((_b & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, _r)",
                f"{value} = _r.to(tl.uint16).to(tl.bfloat16, bitcast=True)",
            ]
        elif kind == "cast" and elem.numeric and elem.canonical.startswith(("float", "bfloat")) \
                and to.canonical in CANONICAL_NAN and to.canonical != elem.canonical:
            bits, nan = CANONICAL_NAN[to.canonical]
            lines += [
                f"_nan = {value} != {value}",
                f"{value} = {value}.to({dtype})",
                f"{value} = tl.where(_nan, tl.full({value}.shape, {nan:#x}, {bits}).to({dtype}, bitcast=True), {value})",
            ]
        elif kind in ("extract", "insert"):
            shift, width = conv[1], conv[2]
            src_u, dst_u = UINT[elem.bits], UINT[to.bits]
            if kind == "extract":
                lines.append(f"_f = ({value}.to({src_u}, bitcast=True) >> {shift}) & {(1 << width) - 1:#x}")
                lines.append(f"{value} = _f.to({dst_u}).to({dtype}, bitcast=True)")
            else:
                lines.append(f"_f = ({value}.to({src_u}, bitcast=True) & {(1 << width) - 1:#x}).to({dst_u})")
                lines.append(f"{value} = (_f << {shift}).to({dtype}, bitcast=True)")
        else:
            lines.append(f"{value} = {value}.to({dtype}{', bitcast=True' if kind == 'view' else ''})")
        elem = to
    return lines


UINT = {8: "tl.uint8", 16: "tl.uint16", 32: "tl.uint32", 64: "tl.uint64"}


# Every 1-D kernel starts here: this program's lanes, in 64-bit arithmetic for tensors past 2^30 elements.
LANES = (
    "pid = tl.program_id(0)",
    "offs = tl.arange(0, BLOCK)",
    "if WIDE:",
    "    offs = offs.to(tl.int64) + pid.to(tl.int64) * BLOCK",
    "else:",
    "    offs = offs + pid * BLOCK",
)


def triton_kernel(plan: FusedPlan, name: str, dims: Sequence[str]) -> str:
    """Source of one ``@triton.jit`` kernel for ``plan`` (dims are constexpr: one specialisation per shape)."""
    params = ", ".join(["x_ptr", "y_ptr"] + [f"{d}: tl.constexpr" for d in dims] + ["WIDE: tl.constexpr", "BLOCK: tl.constexpr"])
    t = ex.to_triton
    body = list(LANES)
    if plan.form == "words4":
        return _words4_kernel(plan, name, params)
    if plan.form == "rows":
        return _rows_kernel(plan, name, dims)
    if plan.coarse > 1:
        coarse = _coarse_kernel(plan, name + "_coarse", params)
        return coarse + "\n\n" + triton_kernel(attrs.evolve(plan, coarse=1), name, dims)
    if plan.kind == "words":
        total = ex.mul(*plan.word_shape)
        body.append(f"mask = offs < ({t(total)})")
        body += _unravel_lines("offs", plan.word_shape, t)
        body.append("w = tl.zeros([BLOCK], dtype=tl.uint32)")
        for b, (coords, valid) in enumerate(zip(plan.word_sources, plan.word_valid)):
            addr = t(_linear(coords, plan.in_shape))
            load_mask = "mask" if valid == ex.TRUE else f"mask & {t(valid)}"
            body.append(f"b{b} = tl.load(x_ptr + ({addr}), mask={load_mask}, other=0).to(tl.uint32)")
            body.append(f"w = w | (b{b} << {8 * b})" if b else "w = w | b0")
        body.append("r = tl.zeros([BLOCK], dtype=tl.uint32)")
        for mask, shift in _bit_permutation_terms(plan.table):
            op = f"<< {shift}" if shift >= 0 else f">> {-shift}"
            body.append(f"r = r | ((w & {mask:#x}) {op})")
        body.append("tl.store(y_ptr + offs, r.to(tl.int32, bitcast=True), mask=mask)")
    else:
        m = plan.map if plan.map is not None else identity(plan.in_shape)
        total = ex.mul(*plan.out_shape) if plan.out_shape else ex.Const(1)
        body.append(f"mask = offs < ({t(total)})")
        body += _unravel_lines("offs", plan.out_shape, t)
        addr = t(_linear(m.src, plan.in_shape))
        if m.is_total():
            body.append(f"v = tl.load(x_ptr + ({addr}), mask=mask)")
        else:
            body.append(f"ok = mask & {t(m.valid)}")
            body.append(f"v = tl.load(x_ptr + ({addr}), mask=ok, other={t(m.fill)})")
        body += _conv_triton(plan, "v")
        body.append("tl.store(y_ptr + offs, v, mask=mask)")
    return "@triton.jit\n" + f"def {name}({params}):\n" + "\n".join("    " + line for line in body) + "\n"


def _coarse_shape(plan: FusedPlan) -> tuple[ex.Expr, ...]:
    return plan.out_shape[:-1] + (ex.div(plan.out_shape[-1], plan.coarse),)


def _coarse_kernel(plan: FusedPlan, name: str, params: str) -> str:
    """The elements kernel over words of ``coarse`` elements (x and y viewed as wider integers)."""
    t = ex.to_triton
    shape = _coarse_shape(plan)
    body = [
        *LANES,
        f"mask = offs < ({t(ex.mul(*shape))})",
        *_unravel_lines("offs", shape, t),
    ]
    if plan.coarse_valid == ex.TRUE:
        body.append(f"v = tl.load(x_ptr + ({t(plan.coarse_src)}), mask=mask)")
    else:
        body.append(f"v = tl.load(x_ptr + ({t(plan.coarse_src)}), mask=mask & {t(plan.coarse_valid)}, other=0)")
    body.append("tl.store(y_ptr + offs, v, mask=mask)")
    return "@triton.jit\n" + f"def {name}({params}):\n" + "\n".join("    " + line for line in body) + "\n"


def _quad_shape(plan: FusedPlan) -> tuple[ex.Expr, ...]:
    return plan.word_shape[:-1] + (ex.div(plan.word_shape[-1], 4),)


def _words4_kernel(plan: FusedPlan, name: str, params: str) -> str:
    """Per lane, four consecutive output words (16 bytes): four whole source words loaded, their bytes
    transposed (output word j takes byte j of each), the bits permuted, one 16-byte store."""
    t = ex.to_triton
    quads = _quad_shape(plan)
    body = [
        *LANES,
        f"mask = offs < ({t(ex.mul(*quads))})",
        *_unravel_lines("offs", quads, t),
        "j = tl.arange(0, 4)",
        "w = tl.zeros([BLOCK, 4], dtype=tl.uint32)",
    ]
    if plan.word4_pairs:  # x is viewed as int64: one 8-byte load gives source words t' and t'+2
        for b in (0, 1):
            valid = plan.word_valid[b]
            load_mask = "mask" if valid == ex.TRUE else f"mask & {t(valid)}"
            body.append(f"p{b} = tl.load(x_ptr + ({t(plan.word4_bases[b])}) // 8, mask={load_mask}, other=0)"
                        ".to(tl.uint64, bitcast=True)")
        words = ["(p0 & 0xFFFFFFFF).to(tl.uint32)", "(p1 & 0xFFFFFFFF).to(tl.uint32)",
                 "(p0 >> 32).to(tl.uint32)", "(p1 >> 32).to(tl.uint32)"]
        for b, word in enumerate(words):
            body.append(f"s = {word}")
            body.append(f"w = w | (((s[:, None] >> (8 * j[None, :])) & 0xFF) << {8 * b})")
    else:
        for b, (base, valid) in enumerate(zip(plan.word4_bases, plan.word_valid)):
            load_mask = "mask" if valid == ex.TRUE else f"mask & {t(valid)}"
            body.append(f"s = tl.load(x_ptr + ({t(base)}) // 4, mask={load_mask}, other=0).to(tl.uint32, bitcast=True)")
            body.append(f"w = w | (((s[:, None] >> (8 * j[None, :])) & 0xFF) << {8 * b})")
    body.append("r = tl.zeros([BLOCK, 4], dtype=tl.uint32)")
    for mask, shift in _bit_permutation_terms(plan.table):
        op = f"<< {shift}" if shift >= 0 else f">> {-shift}"
        body.append(f"r = r | ((w & {mask:#x}) {op})")
    body.append("tl.store(y_ptr + offs[:, None] * 4 + j[None, :], r.to(tl.int32, bitcast=True), mask=mask[:, None])")
    return "@triton.jit\n" + f"def {name}({params}):\n" + "\n".join("    " + line for line in body) + "\n"


def _rows_kernel(plan: FusedPlan, name: str, dims: Sequence[str]) -> str:
    """2-D tiles: rows found through the composed map, each copied along its contiguous last axis
    (wide coalesced loads and stores)."""
    t = ex.to_triton
    m = plan.map
    params = ", ".join(["x_ptr", "y_ptr"] + [f"{d}: tl.constexpr" for d in dims]
                       + ["WIDE: tl.constexpr", "BR: tl.constexpr", "BC: tl.constexpr"])
    lead, kout, kin = plan.out_shape[:-1], plan.out_shape[-1], plan.in_shape[-1]
    body = [
        "rows = tl.arange(0, BR)",
        "cols = tl.program_id(1) * BC + tl.arange(0, BC)",
        "if WIDE:",
        "    rows = rows.to(tl.int64) + tl.program_id(0).to(tl.int64) * BR",
        "else:",
        "    rows = rows + tl.program_id(0) * BR",
        f"live = rows < ({t(ex.mul(*lead)) if lead else '1'})",
        *_unravel_lines("rows", lead, t),
        f"src = {t(_linear(m.src[:-1], plan.in_shape[:-1]))}",
        f"ok = live & {t(m.valid)}" if not m.is_total() else "ok = live",
        f"inside = cols < ({t(kout)})",
        f"v = tl.load(x_ptr + src[:, None] * ({t(kin)}) + cols[None, :], mask=ok[:, None] & inside[None, :], "
        f"other={t(m.fill)})",
        *_conv_triton(plan, "v"),
        f"tl.store(y_ptr + rows[:, None] * ({t(kout)}) + cols[None, :], v, mask=live[:, None] & inside[None, :])",
    ]
    return "@triton.jit\n" + f"def {name}({params}):\n" + "\n".join("    " + line for line in body) + "\n"


# ---------------------------------------------------------------------------
# torch (CPU path): the same plan as vectorised torch code, chunked along the first axis


def torch_function(plan: FusedPlan, name: str, dims: Sequence[str]) -> str:
    """Source of ``def name(x, <dims>, compiled=False) -> Tensor`` computing ``plan`` with torch ops.

    The work is a pure function of a range of the first axis, ``name_part``: the index
    expressions evaluated on ``arange`` grids and one gather. Run eagerly, the driver calls it
    on chunks of experts (index tensors of ~4M elements at most); with ``compiled`` it calls
    ``torch.compile`` of it once over the whole tensor, which fuses the arithmetic and the
    gather into one loop with no index tensor in memory."""
    t = ex.to_torch
    args = ", ".join(["x"] + list(dims))
    if plan.kind in ("copy", "affine"):
        lines = [f"def {name}({args}, compiled=False):"]
        if plan.kind == "copy":
            lines.append("    y = x.clone()" if not plan.conversions else "    y = x")
        else:
            strides, offset = affine_strides(plan.map)
            shape = ", ".join(ex.to_python(s) for s in plan.out_shape)
            st = ", ".join(ex.to_python(s) for s in strides)
            lines.append("    x = x.contiguous()  # as_strided offsets count from the storage's start, not the tensor's")
            lines.append(f"    y = x.as_strided(({shape},), ({st},), x.storage_offset() + {ex.to_python(offset)})")
        lines += _conv_torch(plan, "y", "    ")
        lines.append("    return y.contiguous()")
        return "\n".join(lines) + "\n"
    shape = plan.word_shape if plan.kind == "words" else plan.out_shape
    rank = len(shape)
    sizes = [ex.to_python(s) for s in shape]
    part = [f"def {name}_part({args}, start, stop):", "    _dev = x.device"]
    bitwise = plan.kind == "gather" and not plan.conversions
    if bitwise:
        bits = BIT_VIEWS[plan.in_elem.bits]
        part.append(f"    flat = x.contiguous().view(torch.{bits}).reshape(-1)  # move bits, whatever the type")
    else:
        part.append("    flat = x.contiguous().reshape(-1)")
    view0 = ", ".join(["-1"] + ["1"] * (rank - 1))
    part.append(f"    o0 = torch.arange(start, stop, device=_dev).view({view0})")
    for k in range(1, rank):
        view = ["1"] * rank
        view[k] = "-1"
        part.append(f"    o{k} = torch.arange({sizes[k]}, device=_dev).view({', '.join(view)})")
    part.append("    zero = " + " + ".join(f"o{k} * 0" for k in range(rank)) + "  # broadcasts to the full range")
    if plan.kind == "words":
        for b, (coords, valid) in enumerate(zip(plan.word_sources, plan.word_valid)):
            addr = f"({t(_linear(coords, plan.in_shape))}) + zero"
            if valid == ex.TRUE:
                part.append(f"    byte = flat[{addr}].to(torch.int64)")
            else:  # padding: read nothing there (its address may be past the input)
                part.append(f"    ok = ({t(valid)}) & (zero == 0)")
                part.append(f"    byte = torch.where(ok, flat[torch.where(ok, {addr}, 0)].to(torch.int64), 0)")
            part.append("    w = byte" if b == 0 else f"    w = w | (byte << {8 * b})")
        part.append("    r = torch.zeros_like(w)")
        for mask, shift in _bit_permutation_terms(plan.table):
            op = f"<< {shift}" if shift >= 0 else f">> {-shift}"
            part.append(f"    r = r | ((w & {mask:#x}) {op})")
        part.append("    return torch.where(r >= 2**31, r - 2**32, r).to(torch.int32)")
        store = "torch.int32"
    else:
        m = plan.map
        part.append(f"    src = ({t(_linear(m.src, plan.in_shape))}) + zero")
        if m.is_total():
            part.append("    return flat[src]")
        else:
            part.append(f"    ok = ({t(m.valid)}) & (zero == 0)")
            part.append("    v = flat[torch.where(ok, src, 0)]")
            part.append(f"    return torch.where(ok, v, torch.as_tensor({t(m.fill)}, dtype=v.dtype))")
        store = f"torch.{BIT_VIEWS[plan.in_elem.bits]}" if bitwise else f"torch.{plan.in_elem.canonical}"
    per = " * ".join(f"({s})" for s in sizes[1:]) or "1"
    drive = [
        f"def {name}({args}, compiled=False):",
        "    if compiled:",
        f"        y = _compiled({name}_part)({args}, 0, {sizes[0]})",
        "    else:",
        f"        y = torch.empty(({', '.join(sizes)},), dtype={store}, device=x.device)",
        f"        step = max(1, (1 << 22) // max(1, {per}))",
        f"        for start in range(0, {sizes[0]}, step):",
        f"            stop = min(start + step, {sizes[0]})",
        f"            y[start:stop] = {name}_part({args}, start, stop)",
    ]
    if plan.kind == "words":
        out = ", ".join(ex.to_python(s) for s in plan.out_shape)
        drive.append(f"    return y.view(torch.uint8).reshape({out})")
    else:
        if plan.conversions:
            drive += _conv_torch(plan, "y", "    ")
        else:
            drive.append(f"    y = y.view(torch.{plan.out_elem.canonical})")
        drive.append("    return y")
    return "\n".join(part) + "\n\n\n" + "\n".join(drive) + "\n"


BIT_VIEWS = {8: "uint8", 16: "int16", 32: "int32", 64: "int64"}
BLOCK_WORDS = 512
BLOCK_ELEMENTS = 2048
BLOCK_QUADS = 2048  # words4: lanes (16 output bytes each) per program; best of a sweep on the H200
WORDS_WARPS = 8
ROW_TILE_COLS = 1024
ROW_TILE_ELEMENTS = 4096


def launcher(plan: FusedPlan, name: str, kernel: str, dims: Sequence[str]) -> str:
    """Source of ``def name(x, d, kernels) -> Tensor`` launching ``kernel`` over the whole tensor (all experts)."""
    out = ", ".join(ex.to_python(s) for s in plan.out_shape)
    lines = [f"def {name}(x, d, kernels):"]
    lines += [f"    {d} = d[{d!r}]" for d in dims]
    lines.append("    x = _aligned(x)  # the kernels load whole words")
    lines.append(f"    y = torch.empty(({out},), dtype=torch.{plan.out_elem.canonical}, device=x.device)")
    if plan.form == "words4":
        total = ex.to_python(ex.mul(*_quad_shape(plan)))
        view = "int64" if plan.word4_pairs else "int32"
        lines.append(f"    xs, ys = x.view(torch.{view}), y.view(torch.int32)")
        block = BLOCK_QUADS
    elif plan.kind == "words":
        total = ex.to_python(ex.mul(*plan.word_shape))
        lines.append("    xs, ys = x.view(torch.uint8), y.view(torch.int32)")
        block = BLOCK_WORDS
    else:
        total = ex.to_python(ex.mul(*plan.out_shape)) if plan.out_shape else "1"
        if plan.conversions:
            lines.append("    xs, ys = x, y")
        else:
            bits = BIT_VIEWS[plan.in_elem.bits]
            lines.append(f"    xs, ys = x.view(torch.{bits}), y.view(torch.{bits})")
        block = BLOCK_ELEMENTS
    lines.append(f"    total = {total}")
    lines.append("    if total == 0:")
    lines.append("        return y")
    lines.append("    wide = max(xs.numel(), ys.numel()) >= 2**30  # 32-bit index arithmetic below that")
    args = ", ".join(f"{d}={d}" for d in dims)
    if plan.form == "rows":
        lead = ex.to_python(ex.mul(*plan.out_shape[:-1])) if plan.out_shape[:-1] else "1"
        lines.append(f"    n_rows, n_cols = {lead}, {ex.to_python(plan.out_shape[-1])}")
        lines.append(f"    bc = min({ROW_TILE_COLS}, 1 << max(0, (n_cols - 1).bit_length()))")
        lines.append(f"    br = max(1, {ROW_TILE_ELEMENTS} // bc)")
        lines.append("    grid = ((n_rows + br - 1) // br, (n_cols + bc - 1) // bc)")
        lines.append(f"    kernels[{kernel!r}][grid](xs, ys, {args}, WIDE=wide, BR=br, BC=bc)")
    elif plan.coarse > 1:
        wide_bits = BIT_VIEWS[plan.in_elem.bits * plan.coarse]
        lines.append(f"    if x.shape[-1] % {plan.coarse} == 0 and y.shape[-1] % {plan.coarse} == 0:  # move whole words")
        lines.append(f"        n = total // {plan.coarse}")
        lines.append(f"        grid = ((n + {block - 1}) // {block},)")
        lines.append(f"        kernels[{kernel + '_coarse'!r}][grid](x.view(torch.{wide_bits}), "
                     f"y.view(torch.{wide_bits}), {args}, WIDE=wide, BLOCK={block})")
        lines.append("    else:")
        lines.append(f"        grid = ((total + {block - 1}) // {block},)")
        lines.append(f"        kernels[{kernel!r}][grid](xs, ys, {args}, WIDE=wide, BLOCK={block})")
    else:
        warps = f", num_warps={WORDS_WARPS}" if plan.form == "words4" else ""
        lines.append(f"    grid = ((total + {block - 1}) // {block},)")
        lines.append(f"    kernels[{kernel!r}][grid](xs, ys, {args}, WIDE=wide, BLOCK={block}{warps})")
    lines.append("    return y")
    return "\n".join(lines) + "\n"


def _conv_torch(plan: FusedPlan, var: str, indent: str) -> list[str]:
    """Value conversions through the eager ops' own functions: one semantics (NaNs, bit fields)."""
    out = []
    for conv in plan.conversions:
        kind, to = conv[0], conv[-1]
        if kind == "view":
            call = f"{var}.view(torch.{to.canonical})"
        elif kind == "cast":
            call = f"cast({var}, torch.{to.canonical})"
        else:
            fn = "extract_bits" if kind == "extract" else "insert_bits"
            call = f"{fn}({var}, {conv[1]}, {conv[2]}, torch.{to.canonical})"
        out.append(f"{indent}{var} = {call}")
    return out
