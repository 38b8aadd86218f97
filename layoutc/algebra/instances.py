"""Small instances of a spec's dims, and divisibility.

Shapes and index maps are symbolic in the dims (``E, I, H``). What cannot be decided from
linear forms alone (a ``round_up`` in a shape, whether a composed map keeps rows whole) is
checked on *instances*: concrete values of the dims that satisfy every divisibility rule the
spec states or its ops need. This module makes those instances and classifies divisibility:

* :func:`classify` -- ``value % multiple == 0`` is proven from ``assume`` lines, impossible, or
  left to a run-time check;
* :func:`sample_dims` -- a bounded set of small instances satisfying a list of rules: per dim a
  few multiples of its period, combined under a budget (every dim at its k-th value, then one dim
  varied at a time), so the work grows with the number of dims, not exponentially in it;
* :func:`small_instances` -- instances under which every exact division in some expressions holds.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterable, Mapping, Sequence

from . import expr as ex

#: Instances returned at most (verification evaluates maps on each one it uses).
BUDGET = 64


def classify(value: ex.Expr, multiple: int, assumptions: Mapping[str, int]) -> str:
    """'proven' when ``value % multiple == 0`` follows from ``dim % m == 0`` assumptions,
    'impossible' when it is a constant that fails, 'runtime' otherwise."""
    if multiple == 1:
        return "proven"
    if multiple == 0:  # a condition: decided when constant, else checked on the real sizes
        if isinstance(value, ex.Const):
            return "proven" if value.value else "impossible"
        if isinstance(value, ex.Lt) and (ex.always_at_most(ex.add(value.lhs, 1), value.rhs)
                                         or ex.always_at_most(value.lhs, ex.add(value.rhs, -1))):
            return "proven"  # I < round_up(I, 128) + 1: no run-time check that always holds
        return "runtime"
    if isinstance(value, ex.Mul) and isinstance(value.args[0], ex.Const) and value.args[0].value % multiple == 0:
        return "proven"  # 256*ceil_div(I, 128) % 128: a multiple of the coefficient (the rest is an integer)
    form = ex.linear_form(value)
    if form is None:
        return "runtime"
    coefs, const = form
    if not coefs:
        return "proven" if const.denominator == 1 and const.numerator % multiple == 0 else "impossible"
    for name, coef in coefs.items():
        eff = coef * assumptions.get(name, 1)
        if eff.denominator != 1 or eff.numerator % multiple:
            return "runtime"
    return "proven" if const.denominator == 1 and const.numerator % multiple == 0 else "runtime"


def _period(value: ex.Expr, multiple: int, dim: str) -> int | None:
    """The period m' with ``value % multiple == 0  <=>  dim % m' == 0``, for ``value = (p/q) * dim``."""
    form = ex.linear_form(value)
    if form is None or form[1] != 0 or set(form[0]) != {dim}:
        return None
    coef = form[0][dim]
    p, q = coef.numerator, coef.denominator
    return multiple * q // math.gcd(abs(p), multiple * q)


def _combinations(candidates: Sequence[Sequence[int]], budget: int) -> Iterable[tuple[int, ...]]:
    """Combinations of per-dim candidate values, the full product when it is small, else the
    diagonals (every dim at its k-th value) and then one dim at a time away from the second."""
    total = math.prod(len(c) for c in candidates)
    if total <= budget:
        yield from itertools.product(*candidates)
        return
    depth = max(len(c) for c in candidates)
    for k in range(depth):
        yield tuple(c[min(k, len(c) - 1)] for c in candidates)
    base = [c[min(1, len(c) - 1)] for c in candidates]
    for axis, values in enumerate(candidates):
        for v in values:
            combo = list(base)
            combo[axis] = v
            yield tuple(combo)


def sample_dims(dims: Sequence[str], constraints: Iterable[tuple[ex.Expr, int]], per_dim: int = 4,
                budget: int = BUDGET, minimum: Mapping[str, int] | None = None,
                maximum: Mapping[str, int] | None = None, accept=None) -> list[dict]:
    """Small dims values that satisfy every divisibility constraint: the instances on which
    claims that are not linear (round_up, padding, composed maps) are checked. At most
    ``budget`` instances, in a deterministic order (the smallest per dim first). ``minimum`` /
    ``maximum`` bound single dims; ``accept(env)`` filters whole instances."""
    dims = tuple(dims)
    single: dict[str, list] = {d: [] for d in dims}
    period = {d: 1 for d in dims}
    multi = []
    conditions = []
    for value, multiple in set(constraints):
        names = ex.free_vars(value)
        if multiple == 0:
            conditions.append(value)
        elif len(names) == 1 and next(iter(names)) in single:
            d = next(iter(names))
            step = _period(value, multiple, d)
            if step is None:
                single[d].append((value, multiple))
            else:
                period[d] = math.lcm(period[d], step)
        elif names:
            multi.append((value, multiple))
    candidates = []
    minimum, maximum = minimum or {}, maximum or {}
    for d in dims:
        ok = []
        first = max(1, -(-minimum.get(d, 1) // period[d]))
        for k in range(first, first + 4096):
            v = k * period[d]
            if v > maximum.get(d, v):
                break
            if all(ex.evaluate(val, {d: v}) % m == 0 for val, m in single[d]):
                ok.append(v)
                if len(ok) == per_dim:
                    break
        if not ok:
            return []
        candidates.append(ok)
    out: list[dict] = []
    for combo in _combinations(candidates, budget):
        env = dict(zip(dims, combo))
        if env not in out and all(ex.evaluate(val, env) % m == 0 for val, m in multi) \
                and all(ex.evaluate(c, env) for c in conditions) and (accept is None or accept(env)):
            out.append(env)
            if len(out) >= budget:
                break
    return out


def divisions(exprs: Iterable[ex.Expr]) -> list[tuple[ex.Expr, int]]:
    """``(numerator, denominator)`` of every exact division in ``exprs`` (each must divide)."""
    out = []
    stack = list(exprs)
    while stack:
        e = stack.pop()
        if isinstance(e, ex.Div) and isinstance(e.den, ex.Const):
            out.append((e.num, e.den.value))
        stack.extend(ex.children(e))
    return out


def small_instances(exprs: Sequence[ex.Expr], constraints: Iterable[tuple[ex.Expr, int]] = ()) -> list[dict]:
    """Small dims values under which every exact division in ``exprs`` (and ``constraints``) holds."""
    names = tuple(sorted(set().union(set(), *(ex.free_vars(e) for e in exprs))))
    return sample_dims(names, list(divisions(exprs)) + list(constraints), per_dim=4) if names else [{}]


def unaligned_instances(exprs: Sequence[ex.Expr], constraints: Iterable[tuple[ex.Expr, int]] = ()) -> list[dict]:
    """Larger dims values, each dim a different one and none a multiple of a power of two beyond what the
    exact divisions need: where ``round_up`` and padding do not vanish (``round_up(N, 128)`` is not N)."""
    names = tuple(sorted(set().union(set(), *(ex.free_vars(e) for e in exprs))))
    if not names:
        return []
    rules = list(divisions(exprs)) + list(constraints)
    out: list[dict] = []
    for base in (100, 1000, 5000):
        minimum = {d: base + 37 * i for i, d in enumerate(names)}
        out += [env for env in sample_dims(names, rules, per_dim=2, minimum=minimum) if env not in out]
    return out


def _bound(cond, holds: bool) -> tuple[str, int | None, int | None] | None:
    """``(dim, lowest, highest)`` a size condition on one dim implies when it ``holds`` (or not)."""
    form = ex.linear_form(ex.add(cond.lhs, ex.mul(-1, cond.rhs)))
    if form is None or len(form[0]) != 1:
        return None
    (dim, coef), const = next(iter(form[0].items())), form[1]
    op = cond.op if holds else {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}[cond.op]
    if coef < 0:  # -d + c > 0  <=>  d - c < 0
        coef, const = -coef, -const
        op = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}[op]
    edge = -const / coef  # d OP edge
    if op in (">", ">="):
        lo = math.floor(edge) + 1 if op == ">" else math.ceil(edge)
        return dim, lo, None
    if op in ("<", "<="):
        hi = math.ceil(edge) - 1 if op == "<" else math.floor(edge)
        return dim, None, hi
    return None


def variant_instances(program, present, constraints: Iterable[tuple[ex.Expr, int]], per_dim: int = 4) -> list[dict]:
    """Instances for one variant of a program: its divisibility rules, its ``assume`` lower bounds, and
    its size conditions holding (or not) as the variant says."""
    minimum: dict[str, int] = {}
    for a in program.assumptions:
        if a.minimum > 1:
            minimum[a.dim] = max(minimum.get(a.dim, 1), a.minimum)
    maximum: dict[str, int] = {}
    conditions = [(c, c.label in present) for c in program.conditions]
    for cond, holds in conditions:
        b = _bound(cond, holds)
        if b is not None:
            dim, lo, hi = b
            if lo is not None:
                minimum[dim] = max(minimum.get(dim, 1), lo)
            if hi is not None:
                maximum[dim] = min(maximum.get(dim, hi), hi)

    def accept(env):
        return all(c.holds(env) == holds for c, holds in conditions)

    return sample_dims(program.dims, constraints, per_dim, minimum=minimum, maximum=maximum,
                       accept=accept if conditions else None)
