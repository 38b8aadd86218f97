"""Names for the index terms of a generated function, so no line of a kernel is a kilobyte long.

The planner's index expressions inline every size and every shared term (a swizzled scale's
address repeats ``(H // 16 + 3) // 4`` a dozen times). Here the terms are named once, as the map
in a kernel's header names them: sizes (of the dims only) get capitals and are bound first,
terms of the output coordinates lower case, bound once the coordinates are; each with a leading
underscore (``_A``, ``_p``), which no dim can have. A name stands for
exactly the expression it replaces (the same tree, evaluated in the same order), so a kernel
computes the same values with the same arithmetic: only the text is shorter.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Sequence

import attrs

from ..algebra import expr as ex

#: The longest expression text a generated line prints inline (the rest of the line fits in 120).
WIDTH = 72

_COORD = re.compile(r"o\d+$")


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
    simplification, no reordering of terms (the kernel evaluates the same tree, in the same order)."""
    if e == old:
        return new
    kids = ex.children(e)
    if not kids:
        return e
    rebuilt = tuple(replace(k, old, new) for k in kids)
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
               width: int = WIDTH) -> Terms:
    """Name subexpressions of ``exprs`` until each expression and each definition prints in at most
    ``width`` characters: first the term whose repeats are longest in all (a name read many times),
    then, where no term repeats, the longest term of the longest line. ``taken``: names in use."""
    taken = set(taken) | {v for e in exprs for v in ex.free_vars(e)}
    # A leading underscore: no dim (a letter first, layoutc.front.names) can ever shadow a term's name.
    upper = iter([f"_{c}" for c in "ABCDFGJLMNPQRSTUVWXYZ" if f"_{c}" not in taken])
    lower = iter([f"_{c}" for c in "pqstuabcdfghjklmnz" if f"_{c}" not in taken])
    local: set[str] = {v for e in exprs for v in ex.free_vars(e) if _COORD.match(v)}
    exprs = list(exprs)
    chosen: list[tuple[str, ex.Expr]] = []
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
    order: list[tuple[str, ex.Expr]] = []
    pending = sorted(chosen, key=lambda nd: (nd[0] in local, nd[0]))
    while pending:
        ready = next(i for i, (_, d) in enumerate(pending)
                     if not (ex.free_vars(d) & {n for n, _ in pending}) or i == len(pending) - 1)
        order.append(pending.pop(ready))
    return Terms(tuple(order))


def collect_and_name(emit: Callable[[Callable[[ex.Expr], str]], list[str]], taken: Iterable[str],
                     printer: Callable[[ex.Expr], str], marker: str, indent: str = "",
                     width: int = WIDTH, size_annotation: str = "") -> list[str]:
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
    terms = name_terms(seen, taken, printer, width)
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
