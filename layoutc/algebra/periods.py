"""Periods of quasi-affine expressions in a size: the residue classes that make every floor affine.

An expression built from sums, products by constants, floor division and remainder by constants is
*quasi-affine* in a dim ``d``: there is a period ``P`` with ``e(d + P) - e(d)`` independent of ``d`` (it may
depend on the other variables), so within one residue class of ``d`` modulo ``P`` the expression is affine in
``d``. The period composes through nesting, which is what a list of the constants a dim is divided by
misses: ``floor(floor(d/3)/5)`` has period 15, ``floor((d/32 + 3)/4)`` period 128, and ``floor(d/3)`` beside
``floor(d/5)`` period 15 together. The rule: if ``g`` has period ``P`` and its increment over one period is
always a multiple of ``c``, then ``floor(g/m)`` has period ``P*k`` with ``k`` the least positive integer making
``k*c/m`` an integer (the increment of ``g`` over ``k`` periods is then a multiple of ``m``), and increments
in multiples of ``k*c/m``; ``g mod m`` has the same period and increment 0.

Comparisons, ``where``, ``and`` and a division by a size (``(r + I) mod 2*I``) are *pieces*: within a residue
class they are cut by comparisons of affine forms, which docs/design.md ("Every size") covers by the
boundary representatives. A piece or a table lookup indexed by the dim *inside* a floor is not quasi-affine
in that dim: :func:`period` reports it (``None``), and the verifier's coverage statement says so.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterable

import attrs

from . import expr as ex


@attrs.frozen
class Period:
    """``e(d + period) - e(d)`` is a multiple of ``content`` and independent of ``d`` (unless ``piecewise``:
    then within one residue class the expression is affine piece by piece, cut by comparisons)."""

    period: int = 1
    content: Fraction = Fraction(0)
    piecewise: bool = False


CONSTANT = Period()


def _combine(parts: list[Period], scale: Fraction = Fraction(1)) -> Period:
    p = 1
    for x in parts:
        p = math.lcm(p, x.period)
    content = Fraction(0)
    for x in parts:  # increments over the common period: each part's, (p / its period) times
        step = x.content * (p // x.period)
        content = Fraction(math.gcd(content.numerator * step.denominator, step.numerator * content.denominator),
                           content.denominator * step.denominator) if content and step else (content or step)
    return Period(p, abs(content * scale), any(x.piecewise for x in parts))


def period(e: ex.Expr, dim: str, cache: dict | None = None) -> Period | None:
    """The :class:`Period` of ``e`` in ``dim``, or None where ``e`` is not quasi-affine in it (a floor of a
    piece, a table indexed by ``dim``, a product of two factors in ``dim``)."""
    cache = {} if cache is None else cache
    key = id(e)
    if key in cache:
        return cache[key][1]
    out = _period(e, dim, cache)
    cache[key] = (e, out)  # the expression is kept alive so that its id is not reused
    return out


def _period(e: ex.Expr, dim: str, cache: dict) -> Period | None:
    if dim not in ex.free_vars(e):
        return CONSTANT
    if isinstance(e, ex.Var):
        return Period(1, Fraction(1))
    kids = ex.children(e)
    parts = [period(k, dim, cache) for k in kids]
    if any(p is None for p in parts):
        return None
    if isinstance(e, ex.Add):
        return _combine(parts)
    if isinstance(e, ex.Mul):
        moving = [k for k in kids if dim in ex.free_vars(k)]
        if len(moving) > 1:
            return None  # d * d, d * floor(d/2): not quasi-affine
        scale = Fraction(1)
        for k in kids:
            if isinstance(k, ex.Const):
                scale *= Fraction(k.value)
        return _combine(parts, scale)
    if isinstance(e, (ex.FloorDiv, ex.Mod, ex.Div)):
        num, den = parts
        if not isinstance(e.den, ex.Const):
            return attrs.evolve(_combine(parts), content=Fraction(0), piecewise=True)  # a division by a size
        m = Fraction(e.den.value)
        if isinstance(e, ex.Div):  # exact division: a rational multiple (its divisibility is checked apart)
            return Period(num.period, abs(num.content / m), num.piecewise)
        if num.piecewise:
            return None  # a floor of pieces: its increment is not a multiple of anything known
        k = (num.content / m).denominator if num.content else 1
        if isinstance(e, ex.Mod):
            return Period(num.period * k, Fraction(0))
        return Period(num.period * k, num.content * k / m)
    if isinstance(e, ex.Table):
        return None  # values[d]: any function of d
    if isinstance(e, (ex.Lt, ex.And, ex.Where)):
        return attrs.evolve(_combine(parts), content=Fraction(0), piecewise=True)
    raise TypeError(f"period: unknown expression kind {type(e).__name__}")


def periods(exprs: Iterable[ex.Expr], dims: Iterable[str]) -> tuple[dict[str, int], set[str]]:
    """Per dim, the period of every expression together (the least common multiple), and the dims some
    expression is not quasi-affine in (their residue classes do not decide the maps)."""
    exprs = list(exprs)
    out: dict[str, int] = {}
    inexact: set[str] = set()
    for d in dims:
        cache: dict = {}
        p = 1
        for e in exprs:
            found = period(e, d, cache)
            if found is None:
                inexact.add(d)
                continue
            p = math.lcm(p, found.period)
        out[d] = p
    return out, inexact


def nested(exprs: Iterable[ex.Expr], dim: str) -> ex.Expr | None:
    """A floor division or remainder by a constant whose numerator is not affine in ``dim`` (a floor inside a
    floor: ``ceil_div(ceil_div(I, 32), 4)``), or None. One level of rounding (``round_up(I, 128)``,
    ``ceil_div(K/32, 4)``) is affine within each residue class of the divisor; a nested one is affine only
    within the residue classes of the period :func:`period` computes."""
    stack = list(exprs)
    seen = 0
    while stack and seen < 100_000:
        seen += 1
        e = stack.pop()
        if isinstance(e, (ex.FloorDiv, ex.Mod)) and dim in ex.free_vars(e.num) and ex.linear_form(e.num) is None:
            return e
        stack.extend(ex.children(e))
    return None


def scaled_floors(exprs: Iterable[ex.Expr], dims: Iterable[str]) -> list[ex.Expr]:
    """The floor divisions and remainders by a constant whose numerator multiplies a coordinate (a variable
    that is not a dim) by an expression of a dim: ``(o2 + 4*o1*ceil_div(I/16, 4)) // 512``, the flat index
    of a swizzled tile. Within a residue class of the shapes' period such a map is not affine in the dim
    (which multiple of 512 the product passes depends on ``I``); modulo :func:`period` of the floor itself it
    is (the coordinate is an integer multiplier of the dim's increment), so these floors are given to the
    residue analysis with the shapes (docs/design.md, "Every size")."""
    dims = set(dims)
    out: list[ex.Expr] = []
    stack, seen = list(exprs), 0
    while stack and seen < 100_000:
        seen += 1
        e = stack.pop()
        if isinstance(e, (ex.FloorDiv, ex.Mod)) and isinstance(e.den, ex.Const) and _scales_a_coordinate(e.num, dims):
            if e not in out:
                out.append(e)
        stack.extend(ex.children(e))
    return out


def _scales_a_coordinate(e: ex.Expr, dims: set[str]) -> bool:
    stack = [e]
    while stack:
        e = stack.pop()
        if isinstance(e, ex.Mul):
            kids = ex.children(e)
            sized = [k for k in kids if ex.free_vars(k) & dims]
            coords = [k for k in kids if ex.free_vars(k) - dims]
            if sized and coords and any(k is not s for k in coords for s in sized):
                return True
        stack.extend(ex.children(e))
    return False
