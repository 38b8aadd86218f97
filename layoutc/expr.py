"""Integer index expressions: the arithmetic that index maps are written in.

An index map says, for every output coordinate, which input coordinate it reads.
Those coordinates are integer expressions over two kinds of variables:

* coordinate variables (``o0, o1, ...``), one per output axis, and
* dimension symbols (``E, I, H``) that are bound when a converter sees real tensors.

The node set is deliberately small, the same one tinygrad's index rewrite and
Triton's integer arithmetic use::

    Const(7)  Var("I")  a + b  a * b  a // b  a % b  a < b  a & b  where(c, a, b)  table(T, i)

plus ``a / b``, the *exact* division sizes are written with (``H/32``): it evaluates
like ``//`` but, its divisibility being checked separately, reads as a rational.

Constructors (``add``, ``mul``, ``floordiv``, ...) fold constants and apply only
rules that hold for every integer value, e.g. ``(64*x + y) // 64 == x + y // 64``.
Rules that need to know a variable's range (``r // 2I == 0`` when ``r < 2I``) live
in :func:`simplify`, which takes the ranges explicitly.

Expressions evaluate on Python ints or, element-wise, on integer torch tensors
(:func:`evaluate`), print readably (:func:`to_str`) or as Python source
(:func:`to_python`), and reduce to rational linear forms when they are linear
(:func:`linear_form`), which is how shapes are compared and divisibility proved.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Iterable, Mapping, Union

import attrs

ExprLike = Union["Expr", int]


class Expr:
    """Base of all expression nodes. Nodes are frozen and compare structurally."""

    __slots__ = ()

    # Operator sugar; every operator goes through a simplifying constructor.
    def __add__(self, other: ExprLike) -> Expr:
        return add(self, other)

    def __radd__(self, other: ExprLike) -> Expr:
        return add(other, self)

    def __sub__(self, other: ExprLike) -> Expr:
        return add(self, mul(-1, other))

    def __rsub__(self, other: ExprLike) -> Expr:
        return add(other, mul(-1, self))

    def __mul__(self, other: ExprLike) -> Expr:
        return mul(self, other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return mul(other, self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        return floordiv(self, other)

    def __rfloordiv__(self, other: ExprLike) -> Expr:
        return floordiv(other, self)

    def __mod__(self, other: ExprLike) -> Expr:
        return mod(self, other)

    def __rmod__(self, other: ExprLike) -> Expr:
        return mod(other, self)

    def __neg__(self) -> Expr:
        return mul(-1, self)

    def __str__(self) -> str:
        return to_str(self)


@attrs.frozen(repr=False)
class Const(Expr):
    value: int

    def __repr__(self) -> str:
        return f"Const({self.value})"


@attrs.frozen(repr=False)
class Var(Expr):
    name: str

    def __repr__(self) -> str:
        return f"Var({self.name!r})"


@attrs.frozen(repr=False)
class Add(Expr):
    args: tuple[Expr, ...]

    def __repr__(self) -> str:
        return f"Add{self.args!r}"


@attrs.frozen(repr=False)
class Mul(Expr):
    args: tuple[Expr, ...]

    def __repr__(self) -> str:
        return f"Mul{self.args!r}"


@attrs.frozen(repr=False)
class FloorDiv(Expr):
    num: Expr
    den: Expr

    def __repr__(self) -> str:
        return f"FloorDiv({self.num!r}, {self.den!r})"


@attrs.frozen(repr=False)
class Div(Expr):
    """Exact division ``num / den`` of sizes (``H/32``): its divisibility is a separate,
    checked constraint, so it is a rational in linear forms and ``//`` when evaluated."""

    num: Expr
    den: Expr

    def __repr__(self) -> str:
        return f"Div({self.num!r}, {self.den!r})"


@attrs.frozen(repr=False)
class Mod(Expr):
    num: Expr
    den: Expr

    def __repr__(self) -> str:
        return f"Mod({self.num!r}, {self.den!r})"


@attrs.frozen(repr=False)
class Lt(Expr):
    """Boolean ``a < b`` (evaluates to a bool or a bool tensor)."""

    lhs: Expr
    rhs: Expr

    def __repr__(self) -> str:
        return f"Lt({self.lhs!r}, {self.rhs!r})"


@attrs.frozen(repr=False)
class And(Expr):
    args: tuple[Expr, ...]

    def __repr__(self) -> str:
        return f"And{self.args!r}"


@attrs.frozen(repr=False)
class Where(Expr):
    cond: Expr
    then: Expr
    other: Expr

    def __repr__(self) -> str:
        return f"Where({self.cond!r}, {self.then!r}, {self.other!r})"


@attrs.frozen(repr=False)
class Table(Expr):
    """``values[index]``: a constant lookup table (e.g. a bit permutation)."""

    values: tuple[int, ...]
    index: Expr

    def __repr__(self) -> str:
        return f"Table({self.values!r}, {self.index!r})"


TRUE = Const(1)


# ---------------------------------------------------------------------------
# constructors


def as_expr(x: ExprLike) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(int(x))
    if isinstance(x, int):
        return Const(x)
    raise TypeError(f"cannot make an index expression from {x!r}")


_RANK = {"Var": 0, "Mul": 1, "Div": 2, "FloorDiv": 2, "Mod": 3}


def _sort_key(e: Expr) -> tuple:
    # Plain variables first, so sums print as ``r + I // 2`` rather than ``I // 2 + r``.
    return (_RANK.get(type(e).__name__, 4), repr(e))


def _split_coef(e: Expr) -> tuple[int, Expr]:
    """``e == coef * rest`` with the constant factor pulled out."""
    if isinstance(e, Const):
        return e.value, TRUE
    if isinstance(e, Mul) and isinstance(e.args[0], Const):
        rest = e.args[1:]
        return e.args[0].value, rest[0] if len(rest) == 1 else Mul(rest)
    return 1, e


def _scaled(coef: int, rest: Expr) -> Expr:
    if rest == TRUE:
        return Const(coef)
    if coef == 1:
        return rest
    if coef == 0:
        return Const(0)
    if isinstance(rest, Mul):
        return Mul((Const(coef),) + rest.args)
    return Mul((Const(coef), rest))


def add(*xs: ExprLike) -> Expr:
    terms: dict[Expr, int] = {}
    const = 0
    stack = [as_expr(x) for x in xs]
    flat: list[Expr] = []
    while stack:
        e = stack.pop()
        if isinstance(e, Add):
            stack.extend(e.args)
        else:
            flat.append(e)
    for e in flat:
        if isinstance(e, Const):
            const += e.value
            continue
        coef, rest = _split_coef(e)
        terms[rest] = terms.get(rest, 0) + coef
    out = [_scaled(c, r) for r, c in sorted(terms.items(), key=lambda kv: _sort_key(kv[0])) if c]
    if const:
        out.append(Const(const))
    if not out:
        return Const(0)
    return out[0] if len(out) == 1 else Add(tuple(out))


def mul(*xs: ExprLike) -> Expr:
    const = 1
    factors: list[Expr] = []
    stack = [as_expr(x) for x in xs]
    while stack:
        e = stack.pop()
        if isinstance(e, Mul):
            stack.extend(e.args)
        elif isinstance(e, Const):
            const *= e.value
        else:
            factors.append(e)
    if const == 0:
        return Const(0)
    # Distribute a constant over a single sum so linear forms stay flat: 2*(r + I) -> 2*r + 2*I.
    if len(factors) == 1 and isinstance(factors[0], Add) and const != 1:
        return add(*(mul(const, t) for t in factors[0].args))
    # Cancel against an exact division: 64*(I/32) -> 2*I.
    if len(factors) == 1 and isinstance(factors[0], Div) and isinstance(factors[0].den, Const) and const != 1:
        g = math.gcd(const, factors[0].den.value)
        if g > 1:
            return mul(const // g, div(factors[0].num, factors[0].den.value // g))
    factors.sort(key=_sort_key)
    if not factors:
        return Const(const)
    if const == 1 and len(factors) == 1:
        return factors[0]
    return Mul(((Const(const),) if const != 1 else ()) + tuple(factors))


def _terms(e: Expr) -> tuple[Expr, ...]:
    return e.args if isinstance(e, Add) else (e,)


def floordiv(a: ExprLike, b: ExprLike) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if isinstance(b, Const):
        if b.value <= 0:
            raise ValueError(f"floor division by non-positive {b.value}")
        if b.value == 1:
            return a
        if isinstance(a, Const):
            return Const(a.value // b.value)
        # (c*x + y) // c == x + y // c for integers, whatever y is.
        whole, rest = [], []
        for t in _terms(a):
            coef, r = _split_coef(t)
            if coef % b.value == 0:
                whole.append(_scaled(coef // b.value, r))
            else:
                rest.append(t)
        if whole:
            return add(*whole, floordiv(add(*rest), b))
        # (g*u) // (g*v) == u // v for g > 0: divide out what every term shares with the divisor.
        g = math.gcd(b.value, *(_split_coef(t)[0] for t in _terms(a)))
        if g > 1:
            return floordiv(add(*(_scaled(_split_coef(t)[0] // g, _split_coef(t)[1]) for t in _terms(a))), b.value // g)
        # (x // c1) // c2 == x // (c1*c2) for positive c1, c2.
        if isinstance(a, FloorDiv) and isinstance(a.den, Const):
            return floordiv(a.num, a.den.value * b.value)
    elif a == b:
        return Const(1)
    return FloorDiv(a, b)


def div(a: ExprLike, b: ExprLike) -> Expr:
    """Exact division (sizes): ``(2*I)/2 -> I``, ``(H/2)/16 -> H/32``."""
    a, b = as_expr(a), as_expr(b)
    if isinstance(b, Const):
        if b.value <= 0:
            raise ValueError(f"division by non-positive {b.value}")
        if b.value == 1:
            return a
        if isinstance(a, Const) and a.value % b.value == 0:
            return Const(a.value // b.value)
        g = math.gcd(b.value, *(_split_coef(t)[0] for t in _terms(a)))
        if g > 1:  # (2*I)/64 -> I/32
            return div(add(*(_scaled(_split_coef(t)[0] // g, _split_coef(t)[1]) for t in _terms(a))), b.value // g)
        if isinstance(a, Div) and isinstance(a.den, Const):
            return div(a.num, a.den.value * b.value)
    elif a == b:
        return Const(1)
    return Div(a, b)


def mod(a: ExprLike, b: ExprLike) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if isinstance(b, Const):
        if b.value <= 0:
            raise ValueError(f"modulo by non-positive {b.value}")
        if b.value == 1:
            return Const(0)
        if isinstance(a, Const):
            return Const(a.value % b.value)
        kept = [t for t in _terms(a) if _split_coef(t)[0] % b.value != 0]
        if len(kept) != len(_terms(a)):
            return mod(add(*kept), b)
        # (x % (k*c)) % c == x % c
        if isinstance(a, Mod) and isinstance(a.den, Const) and a.den.value % b.value == 0:
            return mod(a.num, b)
    elif a == b:
        return Const(0)
    return Mod(a, b)


def lt(a: ExprLike, b: ExprLike) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(int(a.value < b.value))
    return Lt(a, b)


def and_(*xs: ExprLike) -> Expr:
    out: list[Expr] = []
    for x in xs:
        e = as_expr(x)
        for t in e.args if isinstance(e, And) else (e,):
            if isinstance(t, Const):
                if t.value == 0:
                    return Const(0)
                continue
            if t not in out:
                out.append(t)
    if not out:
        return TRUE
    return out[0] if len(out) == 1 else And(tuple(out))


def where(cond: ExprLike, then: ExprLike, other: ExprLike) -> Expr:
    cond, then, other = as_expr(cond), as_expr(then), as_expr(other)
    if isinstance(cond, Const):
        return then if cond.value else other
    if then == other:
        return then
    return Where(cond, then, other)


def table(values: Iterable[int], index: ExprLike) -> Expr:
    values = tuple(int(v) for v in values)
    index = as_expr(index)
    if isinstance(index, Const):
        return Const(values[index.value])
    if values == tuple(range(len(values))):
        return index
    return Table(values, index)


def ceil_div(a: ExprLike, b: ExprLike) -> Expr:
    return floordiv(add(a, b, -1), b)


def round_up(a: ExprLike, multiple: ExprLike) -> Expr:
    return mul(ceil_div(a, multiple), multiple)


# ---------------------------------------------------------------------------
# traversal


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, (Add, Mul, And)):
        return e.args
    if isinstance(e, (FloorDiv, Div, Mod)):
        return (e.num, e.den)
    if isinstance(e, Lt):
        return (e.lhs, e.rhs)
    if isinstance(e, Where):
        return (e.cond, e.then, e.other)
    if isinstance(e, Table):
        return (e.index,)
    return ()


def rebuild(e: Expr, kids: tuple[Expr, ...]) -> Expr:
    """The same node kind over new children, through the simplifying constructors."""
    if isinstance(e, Add):
        return add(*kids)
    if isinstance(e, Mul):
        return mul(*kids)
    if isinstance(e, And):
        return and_(*kids)
    if isinstance(e, FloorDiv):
        return floordiv(*kids)
    if isinstance(e, Div):
        return div(*kids)
    if isinstance(e, Mod):
        return mod(*kids)
    if isinstance(e, Lt):
        return lt(*kids)
    if isinstance(e, Where):
        return where(*kids)
    if isinstance(e, Table):
        return table(e.values, kids[0])
    return e


def replace_subexpr(e: Expr, old: Expr, new: Expr) -> Expr:
    """``e`` with every occurrence of the subexpression ``old`` replaced by ``new`` (nodes above a
    replacement rebuilt through the simplifying constructors; untouched subtrees kept as they are)."""
    if e == old:
        return new
    kids = children(e)
    if not kids:
        return e
    rebuilt = tuple(replace_subexpr(k, old, new) for k in kids)
    return e if rebuilt == kids else rebuild(e, rebuilt)


def free_vars(e: Expr) -> set[str]:
    if isinstance(e, Var):
        return {e.name}
    out: set[str] = set()
    for c in children(e):
        out |= free_vars(c)
    return out


def substitute(e: Expr, mapping: Mapping[str, ExprLike]) -> Expr:
    """Replace variables by expressions (simultaneously) and re-simplify."""
    if not mapping:
        return e
    memo: dict[Expr, Expr] = {}

    def go(x: Expr) -> Expr:
        if x in memo:
            return memo[x]
        if isinstance(x, Var):
            r = as_expr(mapping[x.name]) if x.name in mapping else x
        else:
            kids = children(x)
            r = rebuild(x, tuple(go(k) for k in kids)) if kids else x
        memo[x] = r
        return r

    return go(e)


# ---------------------------------------------------------------------------
# evaluation


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "dtype") and hasattr(x, "shape")


def evaluate(e: Expr, env: Mapping[str, Any]) -> Any:
    """Value of ``e`` with variables from ``env`` (ints or integer torch tensors).

    Tensors broadcast against each other, so passing ``arange`` grids evaluates a
    whole index map in one pass. Booleans come back as bool (tensors).
    """
    memo: dict[int, Any] = {}

    def go(x: Expr) -> Any:
        key = id(x)
        if key in memo:
            return memo[key]
        if isinstance(x, Const):
            r = x.value
        elif isinstance(x, Var):
            if x.name not in env:
                raise KeyError(f"no value for variable {x.name!r}")
            r = env[x.name]
        elif isinstance(x, Add):
            r = go(x.args[0])
            for a in x.args[1:]:
                r = r + go(a)
        elif isinstance(x, Mul):
            r = go(x.args[0])
            for a in x.args[1:]:
                r = r * go(a)
        elif isinstance(x, (FloorDiv, Div)):
            r = go(x.num) // go(x.den)
        elif isinstance(x, Mod):
            r = go(x.num) % go(x.den)
        elif isinstance(x, Lt):
            r = go(x.lhs) < go(x.rhs)
        elif isinstance(x, And):
            r = go(x.args[0])
            for a in x.args[1:]:
                v = go(a)
                r = (r & v) if (_is_tensor(r) or _is_tensor(v)) else (r and v)
        elif isinstance(x, Where):
            c, t, o = go(x.cond), go(x.then), go(x.other)
            if _is_tensor(c):
                import torch

                r = torch.where(c, t, o)
            else:
                r = t if c else o
        elif isinstance(x, Table):
            i = go(x.index)
            if _is_tensor(i):
                import torch

                # Clamped: a gather also evaluates its sources where the output is padding (masked later).
                r = torch.tensor(x.values, dtype=torch.int64, device=i.device)[i.clamp(0, len(x.values) - 1)]
            else:
                r = x.values[i]
        else:  # pragma: no cover - exhaustive over node kinds
            raise TypeError(f"unknown expression node {x!r}")
        memo[key] = r
        return r

    return go(e)


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
# printing

_PREC = {Add: 1, Mul: 2, FloorDiv: 2, Div: 2, Mod: 2}


def _fmt(e: Expr, py: bool, parent_prec: int = 0, slash: bool = False, dialect: str = "python") -> str:
    def _f(x: Expr, prec: int) -> str:
        return _fmt(x, py, prec, slash, dialect)

    if dialect in ("torch", "triton"):
        mod = "torch" if dialect == "torch" else "tl"
        if isinstance(e, Where):
            return f"{mod}.where({_f(e.cond, 0)}, {_f(e.then, 0)}, {_f(e.other, 0)})"
        if isinstance(e, Lt):
            return f"({_f(e.lhs, 1)} < {_f(e.rhs, 1)})"
        if isinstance(e, And):
            return "(" + " & ".join(_f(a, 4) for a in e.args) + ")"
        if isinstance(e, Table):
            if dialect == "triton":
                raise ValueError("lookup tables are not lowered to Triton index code")
            return f"torch.tensor({list(e.values)}, device=_dev)[{_f(e.index, 0)}]"

    def wrap(s: str, prec: int) -> str:
        return f"({s})" if prec < parent_prec else s

    if isinstance(e, Const):
        return str(e.value) if e.value >= 0 or parent_prec == 0 else f"({e.value})"
    if isinstance(e, Var):
        return e.name
    if not py:  # sizes as specs write them: round_up(2*I, 128), ceil_div(H/16, 4)
        rounded = _as_rounding(e)
        if rounded is not None:
            coef, fn, x, m = rounded
            call = f"round_up({_f(x, 0)}, {m})" if fn == "round_up/" else f"{fn}({_f(x, 0)}, {m})"
            if fn == "round_up/":  # 64*ceil_div(H, 128) is round_up(H, 128)/2
                return wrap(f"{call}/{coef}", 2)
            return call if coef == 1 else wrap(f"{coef}*{call}", 2)
    if isinstance(e, Add):
        parts: list[str] = []
        for i, t in enumerate(e.args):
            coef, rest = _split_coef(t)
            if i and coef < 0:
                parts.append(" - " + _f(_scaled(-coef, rest), 2))
            else:
                parts.append((" + " if i else "") + _f(t, 1 if i == 0 else 2))
        return wrap("".join(parts), 1)
    if isinstance(e, Mul):
        coef, rest = _split_coef(e)
        if coef == -1:
            return wrap("-" + _f(rest, 3), 2)
        return wrap("*".join(_f(a, 3) for a in e.args), 2)
    if isinstance(e, FloorDiv):
        return wrap(f"{_f(e.num, 2)}{'/' if slash else ' // '}{_f(e.den, 3)}", 2)
    if isinstance(e, Div):
        return wrap(f"{_f(e.num, 2)}{' // ' if py else '/'}{_f(e.den, 3)}", 2)
    if isinstance(e, Mod):
        op = " % " if py else " mod "
        return wrap(f"{_f(e.num, 2)}{op}{_f(e.den, 3)}", 2)
    if isinstance(e, Lt):
        return wrap(f"{_f(e.lhs, 1)} < {_f(e.rhs, 1)}", 0) if parent_prec == 0 else f"({_f(e.lhs, 1)} < {_f(e.rhs, 1)})"
    if isinstance(e, And):
        s = " and ".join(_f(a, 4) for a in e.args)
        return f"({s})" if parent_prec else s
    if isinstance(e, Where):
        s = f"{_f(e.then, 1)} if {_f(e.cond, 1)} else {_f(e.other, 1)}"
        return f"({s})"
    if isinstance(e, Table):
        return f"{list(e.values)}[{_f(e.index, 0)}]" if py else f"T[{_f(e.index, 0)}]"
    raise TypeError(f"unknown expression node {e!r}")


def _ceil_div_of(e: Expr) -> tuple[Expr, int] | None:
    """``(x + m - 1) // m`` -> (x, m): how ``ceil_div(x, m)`` is stored after simplification."""
    if not (isinstance(e, FloorDiv) and isinstance(e.den, Const) and isinstance(e.num, Add)):
        return None
    m, last = e.den.value, e.num.args[-1]
    if m < 2 or not isinstance(last, Const) or last.value != m - 1:
        return None
    return add(*e.num.args[:-1]), m


def _as_rounding(e: Expr) -> tuple[int, str, Expr, int] | None:
    """(k, "round_up" | "round_up/" | "ceil_div", x, m) when ``e`` is ``k*round_up(x, m)``,
    ``round_up(x, m)/k`` or ``k*ceil_div(x, m)``: the readable form prints these as written, not as the
    floor divisions they are stored as."""
    coef, rest = _split_coef(e) if isinstance(e, Mul) else (1, e)
    found = _ceil_div_of(rest)
    if found is None:
        return None
    x, m = found
    if coef % m == 0:
        return coef // m, "round_up", x, m
    if coef > 1 and m % coef == 0:
        return m // coef, "round_up/", x, m
    return coef, "ceil_div", x, m


def to_str(e: Expr, slash: bool = False) -> str:
    """Readable infix form: ``(r + I) mod 2*I``. With ``slash``, floor divisions print as
    exact ones (``H/32``), the way shapes are written in specs."""
    return _fmt(e, py=False, slash=slash)


def to_python(e: Expr) -> str:
    """Python source for scalar evaluation (``%`` and ``//``)."""
    return _fmt(e, py=True)


def to_torch(e: Expr) -> str:
    """Python source that evaluates element-wise on integer torch tensors (``torch.where``, ``&``)."""
    return _fmt(e, py=True, dialect="torch")


def to_triton(e: Expr) -> str:
    """Source for a Triton kernel body (``tl.where``, ``&``); variables are kernel names."""
    return _fmt(e, py=True, dialect="triton")


def rename(e: Expr, names: Mapping[str, str]) -> Expr:
    return substitute(e, {k: Var(v) for k, v in names.items()})


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
    return lo is not None and _lf_nonneg(lo)


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
