"""The nodes of index expressions, their folding constructors, evaluation and printing.

What the expressions are and which rules the constructors apply: :mod:`layoutc.algebra.expr`, the one
module importers use. Ranges, linear forms and symbolic simplification: :mod:`.expr_ranges`; evaluation
on ints and tensors: :mod:`.expr_eval`.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Union

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
