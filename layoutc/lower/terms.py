"""Names for the index terms of a generated function, so no line of a kernel is a kilobyte long.

The planner's index expressions inline every size and every shared term (a swizzled scale's
address repeats ``(H // 16 + 3) // 4`` a dozen times). Here the terms are named once: first those
the kernel's header names (``with A = ...``, ``p = ...``: :func:`layoutc.lower.maptext.header_terms`)
under the header's names, wherever the walk's expressions hold them, then, while a line is still
long, others under letters the header does not use. Sizes (of the dims only) get capitals and are
bound first, terms of the output coordinates lower case, bound once the coordinates are; each with
a leading underscore (``_A``, ``_p``), which no dim can have and no local of a generated function
is. A name stands for exactly the expression it replaces (the same tree, evaluated in the same
order; a run of a sum's terms at most grouped), so a kernel computes the same values with the same
arithmetic: only the text is shorter.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Sequence

import attrs

from ..algebra import expr as ex

#: The longest expression text a generated line prints inline (the rest of the line fits in 120).
WIDTH = 72

_COORD = re.compile(r"o\d+$")


def is_size(e: ex.Expr) -> bool:
    """An expression of the dims alone (no output coordinate): the same on every grid a walk takes."""
    return not any(_COORD.match(v) for v in ex.free_vars(e))


@attrs.frozen
class Terms:
    """Named terms in dependency order: each definition uses only names before it."""

    defs: tuple[tuple[str, ex.Expr], ...] = ()

    def apply(self, e: ex.Expr) -> ex.Expr:
        for name, sub in self.defs:
            e = replace(e, sub, ex.Var(name))
        return e

    def sizes(self) -> tuple[tuple[str, ex.Expr], ...]:
        """Definitions of the dims only (bound before any coordinate)."""
        return tuple((n, d) for n, d in self.defs if not self._local(n))

    def locals(self) -> tuple[tuple[str, ex.Expr], ...]:
        """Definitions that use the output coordinates (bound after them)."""
        return tuple((n, d) for n, d in self.defs if self._local(n))

    def _local(self, name: str) -> bool:
        return name.lstrip("_")[0].islower()


def replace(e: ex.Expr, old: ex.Expr, new: ex.Expr) -> ex.Expr:
    """``e`` with every node equal to ``old`` replaced by ``new`` and nothing else changed: no
    simplification, no reordering of terms (the kernel evaluates the same tree, in the same order).
    A sum ``old`` also stands for a run of consecutive terms of a longer sum, in its order (the sum
    of a coordinate's term and the rest of an address: ``x + a + b`` becomes ``x + t`` for
    ``t = a + b``): integer sums wrap, so the value is the same bits, only grouped."""
    if e == old:
        return new
    kids = ex.children(e)
    if not kids:
        return e
    rebuilt = tuple(replace(k, old, new) for k in kids)
    if isinstance(e, ex.Add) and isinstance(old, ex.Add) and len(old.args) < len(rebuilt):
        k, i, args = len(old.args), 0, list(rebuilt)
        while i + k <= len(args):
            if tuple(args[i:i + k]) == old.args:
                args[i:i + k] = [new]
            i += 1
        if len(args) < len(rebuilt):
            return ex.Add(tuple(args))
    if rebuilt == kids:
        return e
    if isinstance(e, (ex.Add, ex.Mul, ex.And)):
        return type(e)(rebuilt)
    if isinstance(e, ex.Table):
        return ex.Table(e.values, rebuilt[0])
    return type(e)(*rebuilt)


def _subterms(e: ex.Expr) -> Iterable[ex.Expr]:
    if isinstance(e, (ex.Var, ex.Const)):
        return
    if not (isinstance(e, ex.Mul) and isinstance(e.args[0], ex.Const) and e.args[0].value < 0):
        yield e  # a negated term stays inline: ``a - b`` is not ``a + (-b)`` for the instructions
    for k in ex.children(e):
        yield from _subterms(k)


def name_terms(exprs: Sequence[ex.Expr], taken: Iterable[str], printer: Callable[[ex.Expr], str],
               width: int = WIDTH, given: Sequence[tuple[str, ex.Expr]] = ()) -> Terms:
    """Name subexpressions of ``exprs`` until each expression and each definition prints in at most
    ``width`` characters: first the ``given`` terms (the kernel header's, written out whole, in
    dependency order) wherever the expressions hold them, then the term whose repeats are longest in
    all (a name read many times), then, where no term repeats, the longest term of the longest line.
    ``taken``: names in use; a given name is never used for another term, held or not."""
    taken = set(taken) | {v for e in exprs for v in ex.free_vars(e)} | {n for n, _ in given}
    # A leading underscore: no dim (a letter first, layoutc.front.names) can ever shadow a term's name.
    upper = iter([f"_{c}" for c in "ABCDFGJLMNPQRSTUVWXYZ" if f"_{c}" not in taken])
    lower = iter([f"_{c}" for c in "pqstuabcdfghjklmnz" if f"_{c}" not in taken])
    local: set[str] = {v for e in exprs for v in ex.free_vars(e) if _COORD.match(v)}
    exprs = list(exprs)
    chosen: list[tuple[str, ex.Expr]] = []
    pending = [d for _, d in given]
    for i, (name, _) in enumerate(given):  # each written with the names before it, as the body is
        var, d = ex.Var(name), pending[i]
        if ex.free_vars(d) & local:
            local.add(name)
        exprs = [replace(x, d, var) for x in exprs]
        chosen = [(n, replace(c, d, var)) for n, c in chosen] + [(name, d)]
        pending = [replace(x, d, var) for x in pending]
    while True:
        texts = [(len(printer(e)), e) for e in exprs + [d for _, d in chosen]]
        longest = max(texts, key=lambda x: x[0], default=(0, None))
        if longest[0] <= width:
            break
        counts: dict[ex.Expr, int] = {}
        for e in exprs + [d for _, d in chosen]:
            for s in _subterms(e):
                counts[s] = counts.get(s, 0) + 1
        scored = [(len(printer(e)) * (n - 1), e) for e, n in counts.items() if n > 1 and len(printer(e)) >= 9]
        if scored:
            e = max(scored, key=lambda x: x[0])[1]
        else:  # nothing repeats: the longest proper term of the longest line
            inner = [s for s in _subterms(longest[1]) if s != longest[1] and len(printer(s)) >= 9]
            if not inner:
                break
            e = max(inner, key=lambda s: len(printer(s)))
        is_local = bool(ex.free_vars(e) & local)
        name = next(lower if is_local else upper, None)
        if name is None:
            break
        if is_local:
            local.add(name)
        var = ex.Var(name)
        exprs = [replace(x, e, var) for x in exprs]
        chosen = [(n, replace(d, e, var)) for n, d in chosen] + [(name, e)]
    chosen = _used(exprs, chosen)
    order: list[tuple[str, ex.Expr]] = []
    pending = sorted(chosen, key=lambda nd: (nd[0] in local, nd[0]))
    while pending:
        ready = next(i for i, (_, d) in enumerate(pending)
                     if not (ex.free_vars(d) & {n for n, _ in pending}) or i == len(pending) - 1)
        order.append(pending.pop(ready))
    return Terms(tuple(order))


def _used(exprs: Sequence[ex.Expr], chosen: list[tuple[str, ex.Expr]]) -> list[tuple[str, ex.Expr]]:
    """The definitions the expressions read, directly or through other definitions (a given term
    the body does not hold is not bound)."""
    defs = dict(chosen)
    seen: set[str] = set()
    stack = [v for e in exprs for v in ex.free_vars(e) if v in defs]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack += [v for v in ex.free_vars(defs[n]) if v in defs]
    return [(n, d) for n, d in chosen if n in seen]


def collect_and_name(emit: Callable[[Callable[[ex.Expr], str]], list[str]], taken: Iterable[str],
                     printer: Callable[[ex.Expr], str], marker: str, indent: str = "",
                     width: int = WIDTH, size_annotation: str = "",
                     given: Sequence[tuple[str, ex.Expr]] = ()) -> list[str]:
    """``emit(t)`` (lines printing each index expression with ``t``) twice: once to collect the
    expressions, once with the named terms; the sizes' definitions first, the coordinate terms'
    where ``emit`` put the line ``marker`` (after the coordinates are bound). ``size_annotation``
    (``": tl.constexpr"``) keeps a size a compile-time constant where a plain assignment would
    make it a run-time scalar (Triton)."""
    seen: list[ex.Expr] = []

    def collect(e: ex.Expr) -> str:
        seen.append(e)
        return printer(e)

    emit(collect)
    terms = name_terms(seen, taken, printer, width, given)
    lines = emit(lambda e: printer(terms.apply(e)))
    sizes = [f"{indent}{n}{size_annotation} = {printer(d)}" for n, d in terms.sizes()]
    out = sizes[:]
    for line in lines:
        if line.strip() == marker:
            pad = line[:len(line) - len(line.lstrip())]
            out += [f"{pad}{n} = {printer(d)}" for n, d in terms.locals()]
        else:
            out.append(line)
    return out
