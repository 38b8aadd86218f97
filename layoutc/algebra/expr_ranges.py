"""Ranges of integer expressions: range-aware simplification, linear forms (shapes and
divisibility), and symbolic bounds that are linear forms in the dims. Part of :mod:`layoutc.algebra.expr`.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterable, Mapping, Union

from .expr_core import TRUE, Add, And, Const, Div, Expr, FloorDiv, Lt, Mod, Mul, Table, Var, Where, _split_coef, _terms, add, children, div, mul, rebuild

# ---------------------------------------------------------------------------
# ranges and range-aware simplification

Bounds = tuple[Union[int, None], Union[int, None]]


def bounds(e: Expr, ranges: Mapping[str, Bounds]) -> Bounds:
    """Inclusive integer bounds of ``e`` (None = unknown) given variable bounds."""
    if isinstance(e, Const):
        return e.value, e.value
    if isinstance(e, Var):
        return ranges.get(e.name, (None, None))
    if isinstance(e, Add):
        lo, hi = 0, 0
        for a in e.args:
            alo, ahi = bounds(a, ranges)
            lo = None if lo is None or alo is None else lo + alo
            hi = None if hi is None or ahi is None else hi + ahi
        return lo, hi
    if isinstance(e, Mul):
        lo, hi = bounds(e.args[0], ranges)
        for a in e.args[1:]:
            alo, ahi = bounds(a, ranges)
            if None in (lo, hi, alo, ahi):
                both_nonneg = lo is not None and lo >= 0 and alo is not None and alo >= 0
                lo, hi = (lo * alo if both_nonneg else None), None
                continue
            prods = [lo * alo, lo * ahi, hi * alo, hi * ahi]
            lo, hi = min(prods), max(prods)
        return lo, hi
    if isinstance(e, (FloorDiv, Div)):
        nlo, nhi = bounds(e.num, ranges)
        dlo, dhi = bounds(e.den, ranges)
        if dlo is not None and dlo > 0 and dlo == dhi:
            return (None if nlo is None else nlo // dlo, None if nhi is None else nhi // dlo)
        if nlo is not None and nlo >= 0 and dlo is not None and dlo > 0:
            return 0, (None if nhi is None else nhi // dlo)
        return None, None
    if isinstance(e, Mod):
        nlo, nhi = bounds(e.num, ranges)
        dlo, dhi = bounds(e.den, ranges)
        if nlo is not None and nlo >= 0 and dlo is not None and dlo > 0:
            if dhi is not None and nhi is not None and nhi < dlo:
                return nlo, nhi
            cap = [v for v in (nhi, None if dhi is None else dhi - 1) if v is not None]
            return 0, (min(cap) if cap else None)
        if dlo is not None and dlo > 0 and dhi is not None:
            return 0, dhi - 1
        return None, None
    if isinstance(e, (Lt, And)):
        return 0, 1
    if isinstance(e, Where):
        tlo, thi = bounds(e.then, ranges)
        olo, ohi = bounds(e.other, ranges)
        lo = None if tlo is None or olo is None else min(tlo, olo)
        hi = None if thi is None or ohi is None else max(thi, ohi)
        return lo, hi
    if isinstance(e, Table):
        return min(e.values), max(e.values)
    return None, None


def simplify(e: Expr, ranges: Mapping[str, Bounds]) -> Expr:
    """Apply the rules that need ranges: ``x // c -> 0`` and ``x % c -> x`` when
    ``0 <= x < c``, comparisons decided by bounds. Bottom-up, to a fixed point."""

    def go(x: Expr) -> Expr:
        kids = children(x)
        if kids:
            x = rebuild(x, tuple(go(k) for k in kids))
        if isinstance(x, (FloorDiv, Mod)):
            nlo, nhi = bounds(x.num, ranges)
            dlo, _ = bounds(x.den, ranges)
            if nlo is not None and nlo >= 0 and nhi is not None and dlo is not None and nhi < dlo:
                return Const(0) if isinstance(x, FloorDiv) else x.num
        if isinstance(x, Lt):
            llo, lhi = bounds(x.lhs, ranges)
            rlo, rhi = bounds(x.rhs, ranges)
            if lhi is not None and rlo is not None and lhi < rlo:
                return TRUE
            if llo is not None and rhi is not None and llo >= rhi:
                return Const(0)
        if isinstance(x, Where):
            clo, chi = bounds(x.cond, ranges)
            if clo == chi and clo is not None:
                return x.then if clo else x.other
        return x

    prev = None
    while prev != e:
        prev, e = e, go(e)
    return e


# ---------------------------------------------------------------------------
# linear forms (shapes, divisibility)

LinearForm = tuple[dict[str, Fraction], Fraction]


def linear_form(e: Expr) -> LinearForm | None:
    """``e`` as ``sum(coef[v] * v) + const`` with rational coefficients, or None.

    Exact divisions by constants (``H/32``) are rational; floor divisions and
    modulos are not linear.
    """
    if isinstance(e, Const):
        return {}, Fraction(e.value)
    if isinstance(e, Var):
        return {e.name: Fraction(1)}, Fraction(0)
    if isinstance(e, Add):
        coefs: dict[str, Fraction] = {}
        const = Fraction(0)
        for a in e.args:
            f = linear_form(a)
            if f is None:
                return None
            for k, v in f[0].items():
                coefs[k] = coefs.get(k, Fraction(0)) + v
            const += f[1]
        return {k: v for k, v in coefs.items() if v}, const
    if isinstance(e, Mul):
        scale = Fraction(1)
        lin: LinearForm | None = None
        for a in e.args:
            f = linear_form(a)
            if f is None:
                return None
            if not f[0]:
                scale *= f[1]
            elif lin is None:
                lin = f
            else:
                return None  # product of two non-constant factors
        if lin is None:
            return {}, scale
        return {k: v * scale for k, v in lin[0].items()}, lin[1] * scale
    if isinstance(e, Div) and isinstance(e.den, Const):
        f = linear_form(e.num)
        if f is None:
            return None
        return {k: v / e.den.value for k, v in f[0].items()}, f[1] / e.den.value
    return None


def from_linear_form(form: LinearForm) -> Expr:
    """Rebuild an expression (exact divisions as ``//``) from a linear form."""
    coefs, const = form
    den = math.lcm(*(c.denominator for c in list(coefs.values()) + [const]))
    num = add(*(mul(int(c * den), Var(k)) for k, c in sorted(coefs.items())), int(const * den))
    return div(num, den) if den != 1 else num


def same_value(a: Expr, b: Expr) -> bool | None:
    """True/False when decidable from linear forms or structure, None otherwise."""
    if a == b:
        return True
    fa, fb = linear_form(a), linear_form(b)
    if fa is None or fb is None:
        return None
    return fa == fb


# ---------------------------------------------------------------------------
# symbolic ranges: bounds that are linear forms in the dims

SymBounds = tuple[Union[LinearForm, None], Union[LinearForm, None]]


def _lf_add(a: LinearForm, b: LinearForm, sign: int = 1) -> LinearForm:
    coefs = dict(a[0])
    for k, v in b[0].items():
        coefs[k] = coefs.get(k, Fraction(0)) + sign * v
    return {k: v for k, v in coefs.items() if v}, a[1] + sign * b[1]


def _lf_scale(a: LinearForm, c: Fraction) -> LinearForm:
    return {k: v * c for k, v in a[0].items()}, a[1] * c


def _lf_nonneg(a: LinearForm) -> bool:
    """True when ``a >= 0`` for every binding of the dims to integers >= 1."""
    coefs, const = a
    return all(v >= 0 for v in coefs.values()) and const + sum(coefs.values()) >= 0


def sym_bounds(e: Expr, ranges: Mapping[str, SymBounds]) -> SymBounds:
    """Inclusive bounds of ``e`` as linear forms in the dims (None = unknown). Dims are >= 1."""
    if isinstance(e, Const):
        f = ({}, Fraction(e.value))
        return f, f
    if isinstance(e, Var):
        if e.name in ranges:
            return ranges[e.name]
        f = ({e.name: Fraction(1)}, Fraction(0))
        return f, f  # a dim is its own bound
    form = linear_form(e)
    if form is not None and not any(k in ranges for k in form[0]):
        return form, form
    if isinstance(e, Add):
        lo: LinearForm | None = ({}, Fraction(0))
        hi: LinearForm | None = ({}, Fraction(0))
        for a in e.args:
            alo, ahi = sym_bounds(a, ranges)
            lo = None if lo is None or alo is None else _lf_add(lo, alo)
            hi = None if hi is None or ahi is None else _lf_add(hi, ahi)
        return lo, hi
    if isinstance(e, Mul):
        coef, rest = _split_coef(e)
        if rest is not e and coef != 1 and not isinstance(rest, Mul):
            lo, hi = sym_bounds(rest, ranges)
            c = Fraction(coef)
            lo2 = None if lo is None else _lf_scale(lo, c)
            hi2 = None if hi is None else _lf_scale(hi, c)
            return (lo2, hi2) if c > 0 else (hi2, lo2)
        return None, None
    if isinstance(e, (FloorDiv, Div)) and isinstance(e.den, Const) and e.den.value > 0:
        lo, hi = sym_bounds(e.num, ranges)
        c = Fraction(e.den.value)
        if lo is not None and not lo[0]:  # a constant bound: its floor is exact
            lo2 = ({}, Fraction(math.floor(lo[1] / c)))
        else:
            lo2 = None if lo is None else _lf_scale(_lf_add(lo, ({}, c - 1), -1), 1 / c)
        if hi is not None and not hi[0]:
            return lo2, ({}, Fraction(math.floor(hi[1] / c)))
        return lo2, (None if hi is None else _lf_scale(hi, 1 / c))
    if isinstance(e, Mod):
        dlo, dhi = sym_bounds(e.den, ranges)
        nlo, nhi = sym_bounds(e.num, ranges)
        if nlo is not None and _lf_nonneg(nlo):
            upper = None if dhi is None else _lf_add(dhi, ({}, Fraction(1)), -1)
            if nhi is not None and upper is not None and _lf_nonneg(_lf_add(upper, nhi, -1)):
                return nlo, nhi
            return ({}, Fraction(0)), upper
        return None, None
    return None, None


def _factor(term: Expr, den: Expr) -> Expr | None:
    """``term / den`` when ``term`` is an integer multiple of ``den`` times other factors
    (``4*(H/128)*x`` over ``H/32`` is ``x``), else None."""
    if term == den:
        return Const(1)
    d = linear_form(den)
    if d is None or not d[0]:
        return None
    coef, rest = _split_coef(term)
    factors = list(rest.args) if isinstance(rest, Mul) else [rest]
    for i, f in enumerate(factors):
        lf = linear_form(f)
        if lf is None or not lf[0] or set(lf[0]) != set(d[0]):
            continue
        ratios = {coef * lf[0][k] / d[0][k] for k in d[0]}
        if len(ratios) != 1:
            continue
        ratio = ratios.pop()
        if ratio.denominator != 1 or coef * lf[1] != ratio * d[1]:
            continue
        return mul(int(ratio), *(factors[:i] + factors[i + 1:]))
    return None


def _expand(e: Expr) -> tuple[Expr, ...]:
    """Terms of ``e`` with products distributed over sums (one level)."""
    out: list[Expr] = []
    for t in _terms(e):
        if isinstance(t, Mul):
            sums = [a for a in t.args if isinstance(a, Add)]
            if len(sums) == 1:
                others = [a for a in t.args if a is not sums[0]]
                out += [mul(*others, u) for u in sums[0].args]
                continue
        out.append(t)
    return tuple(out)


def always_at_most(a: Expr, b: Expr) -> bool:
    """``a <= b`` for every binding of the dims to integers >= 1, shown from symbolic bounds (False:
    not shown, which may still hold). A run-time check of a fact shown here is never emitted."""
    lo = sym_bounds(add(b, mul(-1, a)), {})[0]
    if lo is not None and _lf_nonneg(lo):
        return True
    # b = round_up(x, m) = m * ((x + m - 1) // m) >= x for any x >= 0: a <= x is enough (nested round_ups,
    # whose floors the linear bounds above cannot see through)
    kids = children(b) if isinstance(b, Mul) else ()
    if len(kids) == 2 and isinstance(kids[0], Const) and isinstance(kids[1], FloorDiv) \
            and isinstance(kids[1].den, Const) and kids[1].den.value == kids[0].value and kids[0].value >= 1:
        x = add(kids[1].num, 1 - kids[0].value)
        return same_value(a, x) or always_at_most(a, x)
    return False


def simplify_symbolic(e: Expr, ranges: Mapping[str, SymBounds]) -> Expr:
    """``(a*X + b) // X -> a`` and ``(a*X + b) mod X -> b`` for a symbolic size ``X`` when
    ``0 <= b < X`` follows from the coordinate ranges (linear in the dims). This is what
    turns a composed reshape/permute/reshape back into readable per-axis arithmetic."""

    def go(x: Expr) -> Expr:
        kids = children(x)
        if kids:
            x = rebuild(x, tuple(go(k) for k in kids))
        if isinstance(x, (FloorDiv, Mod)) and not isinstance(x.den, Const):
            whole, rest = [], []
            for t in _expand(x.num):
                q = _factor(t, x.den)
                (whole if q is not None else rest).append(q if q is not None else t)
            if whole:
                b = add(*rest)
                lo, hi = sym_bounds(b, ranges)
                dlo, dhi = sym_bounds(x.den, ranges)
                if lo is not None and hi is not None and dlo is not None and _lf_nonneg(lo) \
                        and _lf_nonneg(_lf_add(_lf_add(dlo, ({}, Fraction(1)), -1), hi, -1)):
                    return add(*whole) if isinstance(x, FloorDiv) else b
        return x

    prev = None
    while prev != e:
        prev, e = e, go(e)
    return e


def coordinate_ranges(shape: Iterable[Expr], prefix: str = "o") -> dict[str, SymBounds]:
    """``o_k`` in ``[0, shape[k] - 1]`` as symbolic bounds (None where a size is not linear)."""
    out: dict[str, SymBounds] = {}
    for k, size in enumerate(shape):
        form = linear_form(size)
        out[f"{prefix}{k}"] = (({}, Fraction(0)), None if form is None else _lf_add(form, ({}, Fraction(1)), -1))
    return out
