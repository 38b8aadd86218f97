"""Size regions: the partition of all sizes a spec accepts, and small representatives of each part.

Every condition a spec states on its sizes (``if I == 2944``, ``if H > 4096``, an ``assume``, the
divisibility its ops need) and every modulus its shapes use (``round_up(N, 128)``, ``ceil_div``, a
padding multiple) splits the sizes into *regions*: which size conditions hold, and the residue of
each dim modulo the moduli. The verifier checks every region that holds any size, on
*representatives*: the smallest sizes with the region's truth values and residues, plus the sizes on
both sides of every comparison's boundary (``I == 2944`` is a region of its own, verified at
``I = 2944`` exactly). docs/design.md ("Every size") states why that covers every size and where it
does not.

* :func:`region_of` -- the region of one variant (the truth value of each size condition);
* :func:`representatives` -- small sizes in a region: boundaries, residues, and the usual small ones;
  an empty region is reported as such (no size satisfies it); a region whose smallest size is too
  large to evaluate is a :class:`TooLarge` error raised before anything is allocated.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Iterable, Mapping, Sequence

import attrs

from . import expr as ex
from .periods import nested, periods
from ..limits import MAX_REPRESENTATIVE, MAX_VERIFY_ELEMENTS

#: Residue classes of one dim verified one by one (modulo a constant it is divided by, or modulo the period
#: that makes every floor of it affine); above this, four are (0, 1, the middle and the last).
MAX_RESIDUE_CLASSES = 16
#: Residue classes of several dims verified together (every combination) when their product is at most this.
MAX_JOINT_CLASSES = 32

_NEGATE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


class TooLarge(Exception):
    """A region's smallest sizes are too large to evaluate maps on (the resource model's refusal)."""

    def __init__(self, message: str, pos=None):
        super().__init__(message)
        self.message = message
        self.pos = pos


@attrs.frozen
class Region:
    """The truth value of each size condition in one variant, in words and by label."""

    holds: tuple[tuple[str, bool], ...]

    def describe(self) -> str:
        return " and ".join(_words(label, value) for label, value in self.holds) or "all sizes"

    @property
    def conditional(self) -> bool:
        return bool(self.holds)


def _words(label: str, value: bool) -> str:
    if value:
        return label
    for op in ("==", "!=", "<=", ">=", "<", ">"):
        parts = label.split(f" {op} ")
        if len(parts) == 2:
            return f"{parts[0]} {_NEGATE[op]} {parts[1]}"
    return f"not ({label})"


def region_of(program, present: Iterable[str]) -> Region:
    present = frozenset(present)
    return Region(tuple((c.label, c.label in present) for c in program.conditions))


def _linear_one(cond) -> tuple[str, Fraction, Fraction] | None:
    """``(dim, coef, const)`` with ``cond`` meaning ``coef*dim + const OP 0``, for a condition on one dim."""
    form = ex.linear_form(ex.add(cond.lhs, ex.mul(-1, cond.rhs)))
    if form is None or len(form[0]) != 1:
        return None
    (dim, coef), const = next(iter(form[0].items())), form[1]
    return dim, coef, const


def _interval(cond, holds: bool) -> tuple[str, int | None, int | None, int | None, int | None] | None:
    """``(dim, lowest, highest, equal, excluded)`` a one-dim linear condition implies when it ``holds``."""
    lin = _linear_one(cond)
    if lin is None:
        return None
    dim, coef, const = lin
    op = cond.op if holds else _NEGATE[cond.op]
    if coef < 0:
        coef, const, op = -coef, -const, _FLIP[op]
    edge = -const / coef  # dim OP edge
    if op == ">":
        return dim, math.floor(edge) + 1, None, None, None
    if op == ">=":
        return dim, math.ceil(edge), None, None, None
    if op == "<":
        return dim, None, math.ceil(edge) - 1, None, None
    if op == "<=":
        return dim, None, math.floor(edge), None, None
    if edge.denominator != 1:  # dim == 7/2 never holds; dim != 7/2 always does
        return (dim, 1, 0, None, None) if op == "==" else (dim, None, None, None, None)
    if op == "==":
        return dim, None, None, int(edge), None
    return dim, None, None, None, int(edge)


def _edges(conditions) -> dict[str, set[int]]:
    """Per dim, the integer boundaries of its one-dim comparisons (both sides are representatives)."""
    out: dict[str, set[int]] = {}
    for cond in conditions:
        lin = _linear_one(cond)
        if lin is None:
            continue
        dim, coef, const = lin
        edge = -const / coef
        out.setdefault(dim, set()).update({math.floor(edge), math.ceil(edge)})
    return out


def moduli(exprs: Iterable[ex.Expr]) -> dict[str, set[int]]:
    """Per dim, the constants it is divided or reduced by (floor-div, mod, exact division, round_up):
    the residues modulo them shape the index maps."""
    out: dict[str, set[int]] = {}
    stack = list(exprs)
    seen = 0
    while stack and seen < 100_000:
        seen += 1
        e = stack.pop()
        if isinstance(e, (ex.FloorDiv, ex.Div, ex.Mod)) and isinstance(e.den, ex.Const) and e.den.value > 1:
            for d in ex.free_vars(e.num):
                out.setdefault(d, set()).add(int(e.den.value))
        stack.extend(ex.children(e))
    return out


def residue_moduli(exprs: Sequence[ex.Expr], dims: Sequence[str]) -> dict[str, set[int]]:
    """Per dim, the moduli its residues are verified modulo: every constant it is divided by, and the period
    that makes every (nested) floor of it affine (:mod:`layoutc.algebra.periods`)."""
    out = moduli(exprs)
    found, _ = periods(exprs, dims)
    for d, p in found.items():
        if p > 1:
            out.setdefault(d, set()).add(p)
    return out


def _classes(period: int, m: int) -> tuple[int, int, list[int]]:
    """``(step, g, picks)``: residues modulo ``step = lcm(period, m)`` among multiples of ``period`` are
    ``r*g``; ``picks`` the ``r`` verified (all of them up to :data:`MAX_RESIDUE_CLASSES`)."""
    step, g = math.lcm(period, m), math.gcd(period, m)
    classes = m // g
    picks = list(range(classes)) if classes <= MAX_RESIDUE_CLASSES else sorted({0, 1, classes // 2, classes - 1})
    return step, g, picks


def residue_gaps(dims: Sequence[str], constraints: Sequence[tuple[ex.Expr, int]],
                 exprs: Sequence[ex.Expr]) -> list[str]:
    """The sizes the representatives do not decide, in words: per dim with a nested floor whose residue classes
    (modulo the period making it affine) are too many to verify one by one, the residues that were verified;
    per dim some size expression is not quasi-affine in, that fact. Empty: every residue class is verified."""
    exprs = list(exprs)
    found, inexact = periods(exprs, dims)
    out = []
    for d in dims:
        deep = nested(exprs, d)
        if d in inexact:
            out.append(f"{d}: a size expression is not quasi-affine in {d} (a floor of a comparison, a table, "
                       "a product of two factors in it)")
            continue
        if deep is None or found.get(d, 1) <= 1:
            continue
        p = _period(list(constraints), d)
        step, g, picks = _classes(p, found[d])
        if len(picks) < found[d] // g:
            residues = ", ".join(str(r * g % step) for r in picks)
            out.append(f"{d} = {residues} (mod {step}) only, {len(picks)} of its {found[d] // g} residue classes "
                       f"({ex.to_str(deep, slash=True)} is affine within each class modulo {step}, not across them)")
    return out


def _period(constraints: Sequence[tuple[ex.Expr, int]], dim: str) -> int:
    from .instances import _period as period_of

    p = 1
    for value, multiple in constraints:
        if multiple > 1 and ex.free_vars(value) == {dim}:
            step = period_of(value, multiple, dim)
            if step is not None:
                p = math.lcm(p, step)
    return p


@attrs.frozen
class Bounds:
    lo: int
    hi: int | None
    equal: int | None
    excluded: frozenset[int]


def _bounds(program, region: Region, dims: Sequence[str]) -> tuple[dict[str, Bounds], bool]:
    """Per dim the region's interval (from assumes and its one-dim conditions); and whether every
    condition was one-dim linear (then emptiness is decided exactly)."""
    lo = {d: 1 for d in dims}
    for a in program.assumptions:
        if a.dim in lo:
            lo[a.dim] = max(lo[a.dim], a.minimum)
    hi: dict[str, int] = {}
    eq: dict[str, set[int]] = {}
    excl: dict[str, set[int]] = {}
    exact = True
    holds = dict(region.holds)
    for cond in program.conditions:
        b = _interval(cond, holds.get(cond.label, False))
        if b is None:
            exact = False
            continue
        d, low, high, equal, excluded = b
        if d not in lo:
            continue
        if low is not None:
            lo[d] = max(lo[d], low)
        if high is not None:
            hi[d] = min(hi.get(d, high), high)
        if equal is not None:
            eq.setdefault(d, set()).add(equal)
        if excluded is not None:
            excl.setdefault(d, set()).add(excluded)
    out = {}
    for d in dims:
        equal = eq.get(d, set())
        if len(equal) > 1:
            out[d] = Bounds(lo[d], 0, None, frozenset())  # two different equalities: empty
        else:
            out[d] = Bounds(lo[d], hi.get(d), next(iter(equal), None), frozenset(excl.get(d, ())))
    return out, exact


def _dim_candidates(b: Bounds, period: int, edges: set[int], mods: set[int], per_dim: int) -> list[int]:
    """Values of one dim to try: the region's smallest multiples of its period, both sides of each
    boundary, and one value per residue class modulo each modulus (a few where there are many)."""
    if b.equal is not None:
        ok = b.equal >= b.lo and (b.hi is None or b.equal <= b.hi) and b.equal % period == 0
        return [b.equal] if ok else []
    first = -(-b.lo // period) * period

    def allowed(v: int) -> bool:
        return v >= b.lo and (b.hi is None or v <= b.hi) and v not in b.excluded

    values: list[int] = []

    def add(v: int) -> None:
        if allowed(v) and v not in values:
            values.append(v)

    k = 0
    while len(values) < per_dim and k < per_dim + len(b.excluded) + 1:
        add(first + k * period)
        k += 1
    for e in sorted(edges):
        base = (e // period) * period
        for v in (base - period, base, base + period, base + 2 * period):
            add(v)
    for m in sorted(mods):
        step, g, picks = _classes(period, m)
        start = -(-first // step) * step
        for r in picks:
            add(start + r * g if r else start)
            add(start + step + r * g)
    return values


def representatives(program, region: Region, dims: Sequence[str], constraints: Sequence[tuple[ex.Expr, int]],
                    exprs: Iterable[ex.Expr] = (), per_dim: int = 3, budget: int = 48,
                    size_of=None) -> tuple[list[dict], str]:
    """Small sizes in ``region`` satisfying every divisibility rule: ``(sizes, status)``, status
    'covered', 'empty' (no size is in the region: decided exactly for one-dim linear conditions) or
    'unfound' (no candidate lies in it; the region is then reported, never silently skipped).
    ``size_of(env)`` is the number of elements evaluated on ``env``: a representative over
    :data:`~layoutc.limits.MAX_VERIFY_ELEMENTS` raises :class:`TooLarge` (checked before any allocation)."""
    dims = tuple(dims)
    if not dims:
        return [{}], "covered"
    constraints = list(dict.fromkeys(constraints))
    bounds, exact = _bounds(program, region, dims)
    edges = _edges(program.conditions)
    mods = residue_moduli(list(exprs), dims)
    multi = [(v, m) for v, m in constraints if m > 1 and len(ex.free_vars(v)) > 1
             or (m > 1 and len(ex.free_vars(v)) == 1 and next(iter(ex.free_vars(v))) in bounds)]
    candidates: list[list[int]] = []
    class_reps: list[list[int]] = []
    for d in dims:
        b = bounds[d]
        p = _period(constraints, d)
        if b.equal is None and b.hi is not None and b.hi < -(-b.lo // p) * p:
            return [], "empty"
        if b.lo > MAX_REPRESENTATIVE:
            raise TooLarge(f"the sizes of {region.describe() if region.conditional else 'this spec'} start at "
                           f"{d} = {b.lo}; layoutc evaluates index maps on sizes up to {MAX_REPRESENTATIVE} "
                           f"(layoutc.limits.MAX_REPRESENTATIVE)")
        values = _dim_candidates(b, p, edges.get(d, set()), mods.get(d, set()), per_dim)
        if not values:
            return [], "empty" if (exact or b.equal is not None) else "unfound"
        candidates.append(values)
        # one value per residue class modulo the dim's largest modulus (its period when floors nest)
        step = math.lcm(p, max(mods.get(d, {1})))
        by_class: dict[int, int] = {}
        for v in sorted(values):
            by_class.setdefault(v % step, v)
        class_reps.append(list(by_class.values()))

    def ok(env: dict) -> bool:
        try:
            return (all(ex.evaluate(v, env) % m == 0 for v, m in multi)
                    and all(c.holds(env) == dict(region.holds).get(c.label, False) for c in program.conditions))
        except ZeroDivisionError:
            return False

    out: list[dict] = []
    candidates = [sorted(c) for c in candidates]
    small = [c[0] for c in candidates]
    base = [c[min(1, len(c) - 1)] for c in candidates]
    # Every dim at its second smallest value first (findings are described there: the smallest can make
    # a transform the identity, a 32-row group interleave of 64 rows), then the smallest, one dim at a
    # time, the diagonals.
    # Every combination of the dims' residue classes when there are few (a claim may fail only where two
    # dims are both in some class), then the rest.
    joint = (itertools.product(*class_reps) if 1 < math.prod(len(c) for c in class_reps) <= MAX_JOINT_CLASSES
             and sum(len(c) > 1 for c in class_reps) > 1 else ())
    combos = itertools.chain(
        [tuple(base), tuple(small)],
        joint,
        (tuple(v if a == axis else start[a] for a in range(len(dims))) for start in (base, small)
         for axis, vals in enumerate(candidates) for v in vals),
        (tuple(c[min(k, len(c) - 1)] for c in candidates) for k in range(max(len(c) for c in candidates))),
        itertools.islice(itertools.product(*candidates), 4096),
    )
    too_large = None
    for combo in combos:
        env = dict(zip(dims, combo))
        if env in out or not ok(env):
            continue
        if size_of is not None:
            n = size_of(env)
            if n > MAX_VERIFY_ELEMENTS:
                too_large = too_large or (env, n)
                continue
        out.append(env)
        if len(out) >= budget:
            break
    if not out and too_large is not None:
        env, n = too_large
        at = ", ".join(f"{k}={v}" for k, v in env.items())
        raise TooLarge(f"the smallest sizes of {region.describe() if region.conditional else 'this spec'} "
                       f"({at}) need {n} elements evaluated; layoutc evaluates index maps on at most "
                       f"{MAX_VERIFY_ELEMENTS} (layoutc.limits.MAX_VERIFY_ELEMENTS)")
    if not out:
        return [], "empty" if exact and not multi else "unfound"
    return out, "covered"


def in_region(program, region: Region, env: Mapping[str, int]) -> bool:
    holds = dict(region.holds)
    return all(c.holds(env) == holds.get(c.label, False) for c in program.conditions)
