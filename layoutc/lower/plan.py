"""The planner: each tensor's chain of steps becomes one pass, described by a :class:`Plan`.

A chain of any length collapses into one index map (docs/design.md section 2). What that map is
decides the plan's type (each a frozen record with only its own fields, on a shared base):

``Copy``    no index transform: one copy (with the value conversions)
``Affine``  the composed map is affine in the output coordinates: one strided view and one copy
``Gather``  any other element map: each source address computed with integer arithmetic from the
            composed map (no index tensor in memory)
``Rows``    a gather whose map copies the last axis as is
``Words``   one permutation of the bits within 32-bit words (the SM90 FP4 interleave): per output
            word, its four source bytes through the composed map of the steps before the
            permutation, the bits permuted, the word stored where the steps after it put it
``NoPass``  not one pass (the reason says why): the eager lowering runs the chain op by op

How a kernel walks the output (``Plan.access``), chosen here from the map and checked on small
instances of the dims:

``elements``  one element per lane; ``Gather.coarse`` > 1 moves runs of that many elements as one word
``rows``      2-D tiles of rows whose last axis is copied as is (``Rows``)
``words``     one output word per lane, its four source bytes loaded one by one
``quads``     four consecutive output words per lane from four whole source words (a 4x4 byte
              transpose, as in the SM90 interleave); the bit permutation is done on the source
              words before the transpose (``triton_emit.swar_terms``), two 8-byte loads when source words
              pair up. Checked for dims that are multiples of ``Quads.multiple``; the launcher
              takes it when the call's dims are, and the ``words`` walk otherwise.
``tiles``     2-D tiles of (the output axis reading the source in order, the last axis) of a
              transposing map (``Gather.tile_axis``, :mod:`layoutc.lower.strides`): loads along
              the source's rows, stores along the output's

The planner owns the arithmetic: every expression a lowering emits is simplified here with the
simplifier ``explain`` uses, also under the map's validity condition (inside the padding test
``r < I`` the row ``(I*h + r) // I`` is ``h``). The emitters (``triton_emit``, ``torch_emit``)
only print plans.
"""

from __future__ import annotations

import enum
from fractions import Fraction
from typing import ClassVar, Sequence

import attrs

from ..algebra import expr as ex
from ..lang.compiler import Chain
from ..algebra.dtypes import ELEMENT_TYPES, ElemType
from ..algebra.indexmap import IndexMap, compose_all, identity
from ..lang.ops.base import Category
from ..lang.ops.conversion import BitPermutation, Conversion, MapBits, UnknownKind, known
from .bytemaps import byte_maps, byte_shape
from .grids import evaluate as _evaluate, grid_env
from .stepped import Steps, coarsen, find_steps, relabels_only
from .units import Units, find_units
from .strides import affine_strides, contiguous_strides, linear, transpose_axis  # noqa: F401  (re-exported)


class Access(enum.StrEnum):
    """How a kernel walks the output of a plan (each plan type says which it takes)."""

    ELEMENTS = "elements"
    ROWS = "rows"
    WORDS = "words"
    QUADS = "quads"
    TILES = "tiles"


def unknown(what: str, value) -> UnknownKind:
    """The error of an emitter's dispatch that met a kind it has no branch for."""
    if isinstance(value, Plan):
        value = type(value).__name__
    return UnknownKind(f"the {what} lowering has no rule for {value!r}")


def _conversions(items) -> tuple[Conversion, ...]:
    return tuple(known(c) for c in items)


@attrs.frozen
class Quads:
    """The ``quads`` access of a words plan: per source word ``b`` (output byte position b of
    every word of the quad), the byte address of the source word over the quad grid (the word
    grid with its last axis divided by 4) and whether it is read (else 0)."""

    bases: tuple[ex.Expr, ...]
    valid: tuple[ex.Expr, ...]
    pairs: bool  # source words 0|2 and 1|3 are the halves of one aligned 8-byte word
    multiple: int  # checked for dims (other than the leading one) that are multiples of this
    guard_dims: tuple[str, ...]
    # bytes between the source words of neighbouring quads along the last axis, the same for every
    # source word and row (checked like the rest): a row of quads reads runs at one stride
    row_stride: ex.Expr | None = None
    # output words `spread` apart form a quad: quad q of a row is its words 4*spread*(q // spread) +
    # q % spread + spread*j, j = 0..3 (1: four consecutive words); only Plan.spread_quads has spread > 1
    spread: int = 1
    # rows of quads (along the word grid's second-to-last axis) a program takes at once, ROW_TILE or 1:
    # where a quad's row neighbours read source words next to its own and its column neighbours far
    # apart (Marlin's N-major FP4 weights), lanes walk down the rows so that a warp reads whole sectors
    row_tile: int = 1


@attrs.frozen(kw_only=True)
class Plan:
    """What every plan has: the tensor, its element types and shapes, the value conversions. A
    plan is one of the types below (each with only its own fields); emitters dispatch on the type
    and raise on one they do not know (no plan type is lowered as another)."""

    #: What the composed map is (the module's docstring says what each lowers to): for texts only
    pattern: ClassVar[str] = ""
    tensor: str
    in_elem: ElemType
    out_elem: ElemType
    in_shape: tuple[ex.Expr, ...]
    out_shape: tuple[ex.Expr, ...]
    # each value step's conversion() in chain order; a kind no lowering knows is refused here
    conversions: tuple[Conversion, ...] = attrs.field(default=(), converter=_conversions)
    unsigned: bool = False  # no index expression has a negative constant: 32-bit unsigned arithmetic is exact

    @property
    def one_pass(self) -> bool:
        return True

    @property
    def access(self) -> Access:
        """How a kernel walks the output."""
        return Access.ELEMENTS

    @property
    def coarse(self) -> int:
        """Elements a kernel moves as one word (the header says it of every walk)."""
        return 1

    def shared(self) -> dict:
        """The fields of the base, to build another plan type of the same tensor."""
        return {a.name: getattr(self, a.name) for a in attrs.fields(Plan)}


@attrs.frozen(kw_only=True)
class Copy(Plan):
    """No index transform: one copy (with the value conversions)."""

    pattern: ClassVar[str] = "copy"


@attrs.frozen(kw_only=True)
class Affine(Plan):
    """A composed map affine in the output coordinates: one strided view and one copy."""

    pattern: ClassVar[str] = "affine"
    map: IndexMap  # out element -> input element
    tile_axis: int | None = None  # the tiles walk's source-contiguous output axis (lower.transposes)

    access = property(lambda self: Access.TILES if self.tile_axis is not None else Access.ELEMENTS)


@attrs.frozen(kw_only=True)
class Gather(Plan):
    """Any other element map, walked one element per lane (``coarse`` > 1: runs of that many
    elements as one word)."""

    pattern: ClassVar[str] = "gather"
    map: IndexMap  # out element -> input element
    coarse: int = 1  # the map moves runs of this many elements; the kernel moves them as one word
    coarse_src: ex.Expr | None = None  # ... source word index over the coarse output grid
    coarse_valid: ex.Expr = ex.TRUE
    tile_axis: int | None = None  # the tiles walk's source-contiguous output axis (lower.transposes)
    steps: Steps | None = None  # runs of sub-word elements read fixed steps apart (lower.stepped)

    access = property(lambda self: Access.TILES if self.tile_axis is not None else Access.ELEMENTS)


@attrs.frozen(kw_only=True)
class Rows(Plan):
    """A gather whose map copies the last axis as is: 2-D tiles of rows."""

    pattern: ClassVar[str] = "gather"
    map: IndexMap  # out element -> input element
    row_valid: ex.Expr = ex.TRUE  # the map's validity without its bound on the last axis ...
    col_bound: ex.Expr | None = None  # ... which is o_last < col_bound (a padded last axis), if any

    @property
    def access(self) -> Access:
        return Access.ROWS


@attrs.frozen(kw_only=True)
class Words(Plan):
    """One permutation of the bits within 32-bit words."""

    pattern: ClassVar[str] = "words"
    word_shape: tuple[ex.Expr, ...]  # the output seen as 32-bit words
    word_sources: tuple[tuple[ex.Expr, ...], ...]  # input coordinates of bytes 0..3
    word_valid: tuple[ex.Expr, ...]  # whether each byte reads the input (else 0)
    permutation: BitPermutation  # the bit permutation within each word
    quads: Quads | None = None  # the quads walk, where it holds
    # the quads walk over output words `spread` > 1 apart (Quads.spread), when four consecutive words
    # do not form a quad; a kernel that regroups the words before its store takes it
    spread_quads: Quads | None = None
    # the source's element bits where it is wider than a byte: its bytes are read (in_shape is the bytes)
    source_bits: int = 8
    units: Units | None = None  # each word from aligned 16/32-bit source units at fixed offsets (lower.units)

    @property
    def access(self) -> Access:
        return Access.QUADS if self.quads is not None else Access.WORDS

    @property
    def table(self) -> tuple[int, ...]:
        """Output bit i of a word is input bit table[i]."""
        return self.permutation.table


@attrs.frozen(kw_only=True)
class NoPass(Plan):
    """Not one pass: the eager lowering runs the chain op by op."""

    pattern: ClassVar[str] = "none"
    reason: str  # why

    @property
    def one_pass(self) -> bool:
        return False


#: Every plan type a planner makes; an emitter handles each or raises.
PLANS = (Copy, Affine, Gather, Rows, Words, NoPass)


# ---------------------------------------------------------------------------
# arithmetic


def _ranges(shape: Sequence[ex.Expr]) -> dict:
    """Bounds of the output coordinates where sizes are constants (enough to fold most reshape arithmetic)."""
    return {f"o{k}": (0, s.value - 1) if isinstance(s, ex.Const) else (0, None) for k, s in enumerate(shape)}


def tidy(e: ex.Expr, shape: Sequence[ex.Expr], dims: Sequence[str], valid: ex.Expr = ex.TRUE) -> ex.Expr:
    """``e`` over the coordinates of ``shape``, simplified: constant ranges, then the symbolic rules
    ``(a*X + b) // X -> a`` when ``0 <= b < X``, also for ``b`` bounded by a conjunct ``b < X`` of
    ``valid`` (where the expression is only read when ``valid`` holds)."""
    ranges = _ranges(shape)
    ranges.update({d: (1, None) for d in dims})
    e = ex.simplify(e, ranges)
    sym = ex.coordinate_ranges(shape)
    e = ex.simplify_symbolic(e, sym)
    if valid == ex.TRUE:
        return e
    # A conjunct `a < X` bounds the subexpression a: name it, simplify, put it back.
    names: dict[str, ex.Expr] = {}
    bounded = dict(sym)
    for c in (valid.args if isinstance(valid, ex.And) else (valid,)):
        if not isinstance(c, ex.Lt) or isinstance(c.lhs, ex.Var):
            continue
        hi = ex.linear_form(c.rhs)
        lo = ex.sym_bounds(c.lhs, sym)[0]
        if hi is None or lo is None or not (all(v >= 0 for v in lo[0].values()) and lo[1] >= 0):
            continue
        name = f"_v{len(names)}"
        names[name] = c.lhs
        bounded[name] = (lo, ({k: v for k, v in hi[0].items()}, hi[1] - Fraction(1)))
    if not names:
        return e
    abstract = e
    for name, sub in names.items():
        abstract = ex.replace_subexpr(abstract, sub, ex.Var(name))
    if abstract == e:
        return e
    return ex.simplify_symbolic(ex.substitute(ex.simplify_symbolic(abstract, bounded), names), sym)


def nonnegative(*es: ex.Expr) -> bool:
    """Every subexpression is >= 0 for coordinates and dims >= 0: no negative constant or table
    value anywhere (then wrap-around-free unsigned arithmetic computes the same values)."""
    for e in es:
        stack = [e]
        while stack:
            x = stack.pop()
            if isinstance(x, ex.Const) and x.value < 0:
                return False
            if isinstance(x, ex.Table) and min(x.values) < 0:
                return False
            stack.extend(ex.children(x))
    return True


# ---------------------------------------------------------------------------
# planning


def plan(chain: Chain) -> Plan:
    """The one-pass plan of ``chain`` (a :class:`NoPass` when there is none)."""
    raw = _tidy_plan(_plan(chain))
    if isinstance(raw, Words):
        raw = attrs.evolve(raw, quads=_quads(raw, chain))
        if raw.quads is None:
            q = next((q for s in QUAD_SPREADS[1:] if (q := _quads(raw, chain, s)) is not None), None)
            raw = attrs.evolve(raw, spread_quads=q and attrs.evolve(q, row_tile=_row_tile(raw, q, chain)))
        if raw.quads is None and raw.spread_quads is None:
            raw = attrs.evolve(raw, units=_units(raw, chain))
    elif isinstance(raw, Gather) and (split := _rows_form(raw.map)) is not None:
        raw = Rows(map=raw.map, row_valid=split[0], col_bound=split[1], **raw.shared())
    elif isinstance(raw, Gather) and relabels_only(raw):
        raw = _coarsen(raw, chain)
    if isinstance(raw, (Affine, Gather)) and raw.coarse == 1:  # a transposing map: the tiles walk
        raw = attrs.evolve(raw, tile_axis=transpose_axis(raw.map, raw.in_shape, raw.out_shape, samples(chain)))
    if isinstance(raw, Gather) and raw.coarse == 1 and raw.tile_axis is None and not raw.conversions:
        raw = attrs.evolve(raw, steps=_steps(raw, chain))
    return attrs.evolve(raw, unsigned=nonnegative(*index_exprs(raw)))


def _units(p: Words, chain: Chain) -> Units | None:
    """The units walk, decided on small instances; where those give no grouped form, on the smallest sizes the
    spec's assumes allow (every call's sizes obey them: the converter checks the assume lines). W4A8 at tp_size 2
    needs the latter: its small instances cut a 16-row CUTLASS atom across the w1 and w3 halves of a shard."""
    found = find_units(p, samples(chain), tidy)
    dims = set(_dims_of(chain))
    if (found is None or found.words == 1) and any(ex.free_vars(v) <= dims for v, _ in chain.assumed):
        grouped = find_units(p, samples(chain, assumed=True), tidy)
        if grouped is not None and grouped.words > 1:
            return grouped
    return found


def tables(p: Plan) -> tuple[tuple[int, ...], ...]:
    """The lookup tables the plan's index expressions read (``permute(table=...)``), each once, first met first."""
    found: dict[tuple[int, ...], None] = {}
    stack = list(reversed(index_exprs(p)))
    while stack:
        e = stack.pop()
        if isinstance(e, ex.Table):
            found.setdefault(e.values)
        stack.extend(reversed(ex.children(e)))
    return tuple(found)


def index_exprs(p: Plan) -> list[ex.Expr]:
    """Every index expression a kernel of ``p`` evaluates (unsigned-safety, printing)."""
    out: list[ex.Expr] = list(p.out_shape) + list(p.in_shape)
    if isinstance(p, Words):
        out += list(p.word_shape)
        for coords in p.word_sources:
            out += list(coords)
        out += list(p.word_valid)
        for q in (p.quads, p.spread_quads):
            if q is not None:
                out += [*q.bases, *q.valid]
        if p.units is not None:
            out += [*p.units.src, *p.units.offsets]
    elif isinstance(p, (Affine, Gather, Rows)):
        out += [*p.map.src, p.map.valid]
    elif not isinstance(p, (Copy, NoPass)):
        raise unknown("index expressions", p)
    if isinstance(p, Gather) and p.coarse_src is not None:
        out += [p.coarse_src, p.coarse_valid]
    if isinstance(p, Gather) and p.steps is not None:
        out += [*p.steps.src, *p.steps.offsets]
    if isinstance(p, Rows) and p.col_bound is not None:
        out += [p.row_valid, p.col_bound]
    return out


def _dims_of(chain: Chain) -> list[str]:
    return sorted(set().union(*(ex.free_vars(s) for s in chain.source.shape)))


def tidy_map(m: IndexMap) -> IndexMap:
    """``m`` with every expression simplified by :func:`tidy` (sources under the validity condition)."""
    dims = sorted(set().union(*(ex.free_vars(s) for s in m.in_shape)))
    valid = tidy(m.valid, m.out_shape, dims)
    src = tuple(tidy(s, m.out_shape, dims, valid) for s in m.src)
    return attrs.evolve(m, src=src, valid=valid, fill=tidy(m.fill, m.out_shape, dims))


def _tidy_plan(raw: Plan) -> Plan:
    dims = sorted(set().union(*(ex.free_vars(s) for s in raw.in_shape)))
    if isinstance(raw, (Affine, Gather)):
        raw = attrs.evolve(raw, map=tidy_map(raw.map))
    if isinstance(raw, Words):
        valids = tuple(tidy(v, raw.word_shape, dims) for v in raw.word_valid)
        sources = tuple(tuple(tidy(c, raw.word_shape, dims, v) for c in cs) for cs, v in zip(raw.word_sources, valids))
        raw = attrs.evolve(raw, word_sources=sources, word_valid=valids)
    return raw


def _plan(chain: Chain) -> Plan:
    spec = chain.source
    out_type = chain.out_type
    base = dict(tensor=chain.tensor, in_elem=spec.elem, out_elem=out_type.elem, in_shape=spec.shape,
                out_shape=out_type.shape)
    index_steps = [s for s in chain.steps if s.op.category is not Category.VALUE]
    conversions = tuple(_conversion(s.op) for s in chain.steps if s.op.category is Category.VALUE)
    bit_steps = [i for i, s in enumerate(chain.steps) if s.op.bit_level]
    if bit_steps:
        return _words_plan(chain, bit_steps, base)
    if not index_steps:
        return Copy(conversions=conversions, **base)
    m = compose_all([s.op.index_map(s.in_type) for s in index_steps])
    kind = Affine if affine_strides(m) is not None else Gather
    return kind(map=m, conversions=conversions, **base)


def _conversion(op) -> Conversion:
    conv = op.conversion()
    if conv is None:
        raise UnknownKind(f"the value op {op.name} declares no conversion(): no lowering can print it")
    return known(conv)


def _words_plan(chain: Chain, bit_steps: list[int], base: dict) -> Plan:
    """A chain with one permutation of the bits within 32-bit words: byte gathers before it (``P``), the
    permutation, byte moves after it that keep each word's 4 bytes together (``Q``). Output word ``w``
    is then the permuted word whose bytes ``P`` reads at the word position ``Q`` gives ``w``. Views
    across element widths around it (Marlin's ``view(t, u8)`` ... ``view(t, i32)``) move no byte: the
    maps are then over the tensors seen as bytes (:mod:`layoutc.lower.bytemaps`), and so is the
    plan's input (``u8``, its last axis times the source element's bytes)."""
    perms = [i for i in bit_steps if chain.steps[i].op.word_permutation() is not None]
    values = tuple(_conversion(s.op) for s in chain.steps if s.op.category is Category.VALUE)
    if not perms and all(chain.steps[i].op.keeps_bytes() for i in bit_steps) and values \
            and all(c.bytewise() for c in values) and chain.out_type.elem.bits == 32:
        # Views across widths around byte moves, with conversions of each byte on its own (map_bits
        # of nibbles): the words plan with no bit permutation, the conversions applied to each word
        # of source bytes (they commute with the byte moves).
        return _byte_words_plan(chain, values, base)
    if len(perms) != 1 or any(not chain.steps[i].op.keeps_bytes() for i in bit_steps if i != perms[0]):
        return NoPass(reason="bit-level steps other than one permutation of 32-bit words", **base)
    i = perms[0]
    step = chain.steps[i]
    perm = step.op.word_permutation()
    if perm.word_bytes != 4:
        return NoPass(reason="bit-level steps other than one permutation of 32-bit words", **base)
    if values:
        return NoPass(reason="value conversions around a bit permutation", **base)
    return _words_around(chain, chain.steps[:i], chain.steps[i + 1:], step.out_type, perm, base)


def _byte_words_plan(chain: Chain, values: tuple[Conversion, ...], base: dict) -> Plan:
    """A chain that moves whole bytes and converts each byte on its own, as a words plan whose
    permutation is the identity: the byte moves are its gather, the conversions run on each word."""
    folded: list[Conversion] = []
    for c in values:  # consecutive tables of one width: one table (the kernel looks each field up once)
        if folded and isinstance(c, MapBits) and isinstance(folded[-1], MapBits) and c.width == folded[-1].width:
            folded[-1] = folded[-1].then(c)
        else:
            folded.append(c)
    p = _words_around(chain, chain.steps, (), chain.out_type, BitPermutation(4, tuple(range(32))), base)
    return attrs.evolve(p, conversions=tuple(folded)) if isinstance(p, Words) else p


def _words_around(chain: Chain, first: Sequence, then: Sequence, mid, perm: BitPermutation, base: dict) -> Plan:
    """The words plan of ``chain``: the steps ``first`` (byte maps), ``perm`` on the words of their
    result (of type ``mid``), the steps ``then`` (byte moves that keep each word together)."""
    before, after = byte_maps(first), byte_maps(then)
    in_bytes, mid_bytes = byte_shape(chain.source), byte_shape(mid)
    if before is None or after is None or in_bytes is None or mid_bytes is None:
        return NoPass(reason="steps around a bit permutation that are not moves of whole bytes", **base)
    wide = {}
    if chain.source.elem.bits != 8:  # the kernels read the input as bytes
        base = dict(base, in_elem=ELEMENT_TYPES["u8"], in_shape=in_bytes)
        wide = {"source_bits": chain.source.elem.bits}
    p = compose_all(before) if before else identity(in_bytes)
    q = compose_all(after) if after else identity(mid_bytes)
    word = perm.word_bytes
    if not q.is_total() or not _moves_whole_words(q, word, chain):
        return NoPass(reason="the steps after a bit permutation split its words", **base)
    last = f"o{q.out_rank - 1}"
    start = tuple(ex.substitute(c, {last: ex.mul(word, ex.Var(last))}) for c in q.src)  # the word's byte 0
    sources, valids = [], []
    for t in range(word):
        at = start[:-1] + (ex.add(start[-1], t),)
        sub = {f"o{k}": c for k, c in enumerate(at)}
        sources.append(tuple(ex.substitute(s, sub) for s in p.src))
        valids.append(ex.substitute(p.valid, sub))
    word_shape = q.out_shape[:-1] + (ex.div(q.out_shape[-1], word),)
    return Words(word_shape=word_shape, word_sources=tuple(sources), word_valid=tuple(valids),
                 permutation=perm, **base, **wide)


# ---------------------------------------------------------------------------
# checks on small instances


def samples(chain: Chain, extra: Sequence[tuple[ex.Expr, int]] = (), count: int = 6,
            assumed: bool = False) -> list[dict]:
    """A spread of small instances of the dims that satisfy the chain's constraints (and ``extra``). ``assumed``:
    the spec's ``assume`` multiples too, each dim at its two smallest values (sizes the converter accepts, which
    can be large: 256*tp_size for W4A8's I)."""
    from ..algebra.instances import sample_dims

    names = _dims_of(chain)
    rules = [(c.value, c.multiple) for c in chain.constraints] + list(extra)
    if assumed:
        rules += [(v, m) for v, m in chain.assumed if ex.free_vars(v) <= set(names)]
    found = sample_dims(tuple(names), rules, per_dim=2 if assumed else 6)
    return found[:: max(1, len(found) // count)][:count]


def _moves_whole_words(q: IndexMap, word: int, chain: Chain) -> bool:
    """Every aligned run of ``word`` output bytes reads one aligned run of ``word`` bytes in order
    (checked on small instances of the dims)."""
    found = samples(chain)
    if not found:
        return False
    last = f"o{q.out_rank - 1}"
    lin = linear(q.src, q.in_shape)
    base = ex.substitute(lin, {last: ex.mul(word, ex.Var(last))})
    for dims in found:
        out_shape = [int(ex.evaluate(s, dims)) for s in q.out_shape]
        if out_shape[-1] % word:
            return False
        env = grid_env(out_shape[:-1] + [out_shape[-1] // word], dims)
        b = _evaluate(base, env)
        if bool((b % word != 0).any()):
            return False
        for j in range(1, word):
            shifted = dict(env)
            shifted[last] = env[last] * word + j
            if not bool((_evaluate(lin, shifted) == b + j).all()):
                return False
    return True


def _rows_form(m: IndexMap) -> tuple[ex.Expr, ex.Expr | None] | None:
    """(row validity, column bound) when the last axis is copied as is: src_last == o_last, and
    nothing else depends on o_last except, at most, one conjunct ``o_last < X`` of the validity (a
    last axis padded, as per-half padding of H does): columns from X on are the fill. None otherwise."""
    last = f"o{m.out_rank - 1}"
    if m.src[-1] != ex.Var(last) or any(last in ex.free_vars(e) for e in (*m.src[:-1], m.fill)):
        return None
    terms = m.valid.args if isinstance(m.valid, ex.And) else (m.valid,)
    on_last = [c for c in terms if last in ex.free_vars(c)]
    if not on_last:  # the map reads within the source row (a crop's size is checked on each call)
        return m.valid, None
    bound = on_last[0]
    coords = {f"o{k}" for k in range(m.out_rank)}
    if len(on_last) > 1 or not (isinstance(bound, ex.Lt) and bound.lhs == ex.Var(last)
                                and not ex.free_vars(bound.rhs) & coords):  # a bound of dims alone
        return None
    return ex.and_(*(c for c in terms if c is not bound)), bound.rhs


#: Divisibility of the dims tried for the quads walk, smallest first.
QUAD_MULTIPLES = (4, 16, 64)
#: Distances (in output words) between the words of a quad, tried in this order: 1 is four
#: consecutive words; larger ones serve layouts that interleave source words at a distance (the
#: triton_kernels Hopper value layout puts byte k of a source word in output word 4k + m).
QUAD_SPREADS = (1, 2, 4, 8, 16)


def quad_word(q, spread: int, j=0):
    """The output word (along the last axis) of word ``j`` of quad ``q`` (an expression or an integer
    tensor): 4*spread*(q // spread) + q % spread + spread*j."""
    if isinstance(q, ex.Expr):
        if spread == 1:
            return ex.add(ex.mul(4, q), j) if j else ex.mul(4, q)
        return ex.add(ex.mul(4 * spread, ex.floordiv(q, spread)), ex.mod(q, spread), spread * j)
    return (q // spread) * (4 * spread) + q % spread + spread * j


def _quads(p: Words, chain: Chain, spread: int = 1) -> Quads | None:
    """Four output words from four whole source words: for each output byte position b, the four
    bytes at b of the quad's words (quad_word: consecutive words when ``spread`` is 1) are four
    consecutive bytes of one aligned source word (a 4x4 byte transpose). Checked exhaustively on
    small instances of the dims that are multiples of some m in QUAD_MULTIPLES (smallest that
    works), with rows of whole spread quads; the launcher checks m on the call's dims."""
    k = len(p.word_shape) - 1
    last = f"o{k}"
    addrs = [linear(c, p.in_shape) for c in p.word_sources]
    quad = {last: quad_word(ex.Var(last), spread)}
    dims = _dims_of(chain)
    leading = ex.free_vars(p.in_shape[0]) if p.in_shape else set()
    rest = set().union(*(ex.free_vars(s) for s in (*p.in_shape[1:], *p.out_shape[1:])))
    guard = tuple(sorted(d for d in dims if d in rest or d not in leading))
    bases = tuple(tidy(ex.substitute(a, quad), _quad_shape(p.word_shape), dims,
                       ex.substitute(v, quad)) for a, v in zip(addrs, p.word_valid))
    valid = tuple(tidy(ex.substitute(v, quad), _quad_shape(p.word_shape), dims) for v in p.word_valid)
    for multiple in QUAD_MULTIPLES:
        found = samples(chain, [(ex.Var(d), multiple) for d in guard], count=8)
        if len(found) < 2 or not all(_quads_hold(p, addrs, bases, valid, dims_, last, spread) for dims_ in found):
            continue
        pairs = all(_pairs_hold(p, bases, valid, dims_) for dims_ in found)
        if spread > 1:
            return Quads(bases, valid, pairs, multiple, guard, None, spread)
        stride = _row_stride(p, bases, valid, last)
        if stride is not None and not (all(_row_stride_holds(p, bases, stride, dims_, last) for dims_ in found)
                                       and any(int(ex.evaluate(p.word_shape[-1], d_)) >= 8 for d_ in found)):
            stride = None  # wrong somewhere, or never seen with two quads in a row
        return Quads(bases, valid, pairs, multiple, guard, stride)
    return None


#: Rows of quads per program where the quads walk goes down rows (Quads.row_tile).
ROW_TILE = 8


def _row_tile(p: Words, q: Quads, chain: Chain) -> int:
    """ROW_TILE when, on an instance of the dims, every source word's address moves at most 16 bytes
    from a quad to its row neighbour and more than that to its column neighbour; else 1."""
    k = len(p.word_shape) - 1
    found = samples(chain, [(ex.Var(d), q.multiple) for d in q.guard_dims], count=2)
    if k < 1 or not found:
        return 1
    at = {**found[-1], **{f"o{i}": 0 for i in range(k + 1)}}
    step = [[abs(int(ex.evaluate(b, {**at, f"o{a}": 1}) - ex.evaluate(b, at))) for b in q.bases] for a in (k - 1, k)]
    return ROW_TILE if max(step[0]) <= 16 and min(step[1]) > max(step[0]) else 1


def _row_stride(p: Words, bases, valid, last: str) -> ex.Expr | None:
    """The candidate stride: source word 0's address at quad (0, ..., 0, 1) minus at the origin (an
    expression of the dims alone; _row_stride_holds checks it everywhere)."""
    if any(v != ex.TRUE for v in valid):
        return None
    origin = {f"o{k}": 0 for k in range(len(p.word_shape))}
    one = dict(origin)
    one[last] = 1
    stride = ex.add(ex.substitute(bases[0], one), ex.mul(-1, ex.substitute(bases[0], origin)))
    return None if ex.free_vars(stride) & set(origin) else stride


def _row_stride_holds(p: Words, bases, stride: ex.Expr, dims: dict, last: str) -> bool:
    """Every source word's address is its row's first plus ``stride`` times the quad's column."""
    shape = [int(ex.evaluate(s, dims)) for s in p.word_shape]
    env = grid_env(shape[:-1] + [shape[-1] // 4], dims)
    first = dict(env)
    first[last] = env[last] * 0
    st = int(ex.evaluate(stride, dims))
    return st % 4 == 0 and all(bool((_evaluate(b, env) == _evaluate(b, first) + st * env[last]).all()) for b in bases)


def _quad_shape(word_shape: Sequence[ex.Expr]) -> tuple[ex.Expr, ...]:
    return tuple(word_shape[:-1]) + (ex.div(word_shape[-1], 4),)


def _quads_hold(p: Words, addrs, bases, valid, dims: dict, last: str, spread: int = 1) -> bool:
    shape = [int(ex.evaluate(s, dims)) for s in p.word_shape]
    if shape[-1] % (4 * spread):
        return False
    env = grid_env(shape[:-1] + [shape[-1] // 4], dims)
    for addr, base, v_word, v_quad in zip(addrs, bases, p.word_valid, valid):
        b = _evaluate(base, env)
        ok = _evaluate(v_quad, env).to(bool)
        if bool(((b % 4 != 0) & ok).any()):
            return False
        for j in range(4):
            shifted = dict(env)
            shifted[last] = quad_word(env[last], spread, j)
            same_valid = _evaluate(v_word, shifted).to(bool) == ok
            same_addr = (_evaluate(addr, shifted) == b + j) | ~ok
            if not bool((same_valid & same_addr).all()):
                return False
    return True


def _pairs_hold(p: Words, bases, valid, dims: dict) -> bool:
    """Source words 0 and 2 (and 1 and 3) are the two halves of one aligned 8-byte word."""
    if len(bases) != 4:
        return False
    shape = [int(ex.evaluate(s, dims)) for s in p.word_shape]
    env = grid_env(shape[:-1] + [shape[-1] // 4], dims)
    b = [_evaluate(e, env) for e in bases]
    ok = [_evaluate(v, env).to(bool) for v in valid]
    for lo, hi in ((0, 2), (1, 3)):  # one load, masked by the lower word's validity
        if not bool(((ok[hi] == ok[lo]) & ((b[hi] == b[lo] + 4) & (b[lo] % 8 == 0) | ~ok[lo])).all()):
            return False
    return True


def _steps(p: Gather, chain: Chain) -> Steps | None:
    """The stepped runs of ``p``'s map (:mod:`layoutc.lower.stepped`), checked where the output's last
    axis is a multiple of the run (the launcher takes them there)."""
    from ..algebra.instances import sample_dims

    names, known = tuple(_dims_of(chain)), [(c.value, c.multiple) for c in chain.constraints]

    def instances(r: int) -> list[dict]:
        fits = sample_dims(names, known + [(p.out_shape[-1], r)], per_dim=4)
        return fits[:: max(1, len(fits) // 6)][:6]

    return find_steps(p.map, p.in_shape, p.out_shape, p.in_elem.bits, instances,
                      lambda e, shape, dims: tidy(e, shape, dims))


def _coarsen(p: Gather, chain: Chain) -> Gather:
    """Runs of R consecutive output elements that read R consecutive, R-aligned input elements move as one
    R-element word (:func:`layoutc.lower.stepped.coarsen`)."""
    known = [(c.value, c.multiple) for c in chain.constraints]
    return coarsen(p, tuple(_dims_of(chain)), known, tidy)
