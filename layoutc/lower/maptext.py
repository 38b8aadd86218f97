"""Index maps as text, in one notation: what ``layoutc explain`` prints and what every generated
kernel carries above it (``out[e, r] = in[e, (I + r) mod (2*I)]``).

The expressions are the planner's (:func:`layoutc.lower.plan.tidy`): the arithmetic a reader sees
is the arithmetic the kernel evaluates.
"""

from __future__ import annotations

from ..algebra import expr as ex
from ..lang.compiler import Chain
from ..algebra.indexmap import IndexMap
from .plan import Plan, Words, plan, tidy_map

ROLE_NAMES = {3: ["e", "r", "k"], 2: ["e", "r"], 1: ["r"]}


def coordinate_names(rank: int, shape_text: tuple[str, ...] = ()) -> list[str]:
    if shape_text and len(shape_text) == 5 and shape_text[-2:] == ("16", "16"):
        return ["e", "rb", "kb", "f", "c"]  # the SM90 fold's [E, R/64, K/128, 16, 16]
    return list(ROLE_NAMES.get(rank, ["e"] + [f"i{k}" for k in range(1, rank)]))


#: A composed map longer than this is printed with named subexpressions (``with p = ...``).
MAP_WIDTH = 110


def render_map(m: IndexMap, names: list[str], width: int = MAP_WIDTH) -> str:
    """``out[e, r, k] = in[...]``; a long map (a swizzled scale's runs to a kilobyte) on several lines,
    with repeated subexpressions named once (:func:`name_repeats`)."""
    return name_repeats(*_map_parts(m, names), width)


def _map_parts(m: IndexMap, names: list[str]):
    """(expressions, line, coordinates) of ``render_map``: what its names are chosen from."""
    ranges = ex.coordinate_ranges(m.out_shape)
    tidy = lambda e: ex.rename(ex.simplify_symbolic(e, ranges), {f"o{k}": n for k, n in enumerate(names)})  # noqa: E731
    exprs = [tidy(s) for s in m.src] + ([] if m.is_total() else [tidy(m.valid), tidy(m.fill)])

    def line(es: list[ex.Expr]) -> str:
        text = f"out[{', '.join(names)}] = in[{', '.join(ex.to_str(s) for s in es[:len(m.src)])}]"
        if not m.is_total():
            text += f" where {ex.to_str(es[-2])}, else {ex.to_str(es[-1])}"
        return text

    return exprs, line, set(names)


def name_repeats(exprs: list[ex.Expr], line, coords: set[str], width: int = MAP_WIDTH) -> str:
    """``line(exprs)``, with the definitions of :func:`factor` below it (``with A = round_up(I, 128)``)."""
    exprs, order = factor(exprs, line, coords, width)
    out = [line(exprs)]
    for i, (name, value) in enumerate(order):
        out.append(f"{'with' if i == 0 else '    '} {name} = {ex.to_str(value)}")
    return "\n".join(out)


def factor(exprs: list[ex.Expr], line, coords: set[str], width: int = MAP_WIDTH) -> tuple[list[ex.Expr], list]:
    """While a line is longer than ``width``, the subexpression whose repeats are longest in all is
    replaced by a name: sizes get capitals, expressions of the coordinates lower case. Returns the
    expressions with the names in and [(name, definition)], each definition using only names before it."""
    taken = set(coords) | {v for e in exprs for v in ex.free_vars(e)}
    upper = iter([c for c in "ABCDFGJLMNPQRSTUVWXYZ" if c not in taken])
    lower = iter([c for c in "pqstuvwxyzabdghjlmn" if c not in taken])
    local = set(coords)  # names that depend on the coordinates
    chosen: list[tuple[str, ex.Expr]] = []

    def render() -> list[str]:
        return [line(exprs)] + [f"{name} = {ex.to_str(value)}" for name, value in chosen]

    while max(len(x) for x in render()) > width:
        counts: dict[ex.Expr, int] = {}

        def walk(e: ex.Expr) -> None:
            if isinstance(e, (ex.Var, ex.Const)):
                return
            counts[e] = counts.get(e, 0) + 1
            for k in ex.children(e):
                walk(k)

        for e in exprs + [d for _, d in chosen]:
            walk(e)
        scored = [(len(ex.to_str(e)) * (n - 1), e) for e, n in counts.items() if n > 1 and len(ex.to_str(e)) >= 9]
        if not scored:
            break
        e = max(scored, key=lambda x: x[0])[1]
        name = next(lower if ex.free_vars(e) & local else upper, None)
        if name is None:
            break
        if ex.free_vars(e) & local:
            local.add(name)
        var = ex.Var(name)
        exprs = [ex.replace_subexpr(x, e, var) for x in exprs]
        chosen = [(n, ex.replace_subexpr(d, e, var)) for n, d in chosen] + [(name, e)]
    # Definitions in dependency order: sizes first, then each after the names it uses.
    order: list[tuple[str, ex.Expr]] = []
    pending = sorted(chosen, key=lambda nd: (nd[0] in local, nd[0]))
    while pending:
        ready = next(i for i, (_, d) in enumerate(pending)
                     if not (ex.free_vars(d) & {n for n, _ in pending}) or i == len(pending) - 1)
        order.append(pending.pop(ready))
    return exprs, order


def render_words(p: Plan) -> str | None:
    if not isinstance(p, Words):
        return None
    text = name_repeats(*_word_parts(p), 160) + f"\n     T = {list(p.table)}"
    if p.source_bits != 8:  # the input's elements are wider than a byte: the map reads its bytes
        shape = ", ".join(ex.to_str(s, slash=True) for s in p.in_shape)
        text += f"\n     in = the input as bytes, u8[{shape}] (each {p.source_bits}-bit element little-endian)"
    return text


def _word_parts(p: Words):
    """(expressions, line, coordinates) of ``render_words``."""
    names = coordinate_names(len(p.word_shape))[:-1] + ["w"]
    ren = {f"o{k}": n for k, n in enumerate(names)}
    coords = [ex.rename(x, ren) for c in p.word_sources for x in c]
    sizes = [len(c) for c in p.word_sources]

    def line(es: list[ex.Expr]) -> str:
        parts, at = [], 0
        for t, n in enumerate(sizes):
            c = ", ".join(ex.to_str(x) for x in es[at:at + n])
            at += n
            parts.append(f"in[{c}]" + (f" << {8 * t}" if t else ""))
        return (f"word[{', '.join(names)}] (output bytes 4w..4w+3) = bits permuted by T of ("
                + " | ".join(parts) + ")")

    return coords, line, set(names)


#: The prefix of a header term's name in a generated body (``p`` of the header binds ``_p``): no dim
#: starts with it (a dim starts with a letter) and no local of a generated function is ``_`` and one
#: letter (tests/lower/test_readable_converters.py), so the header's names are free in every body.
TERM_PREFIX = "_"


def header_terms(chain: Chain, shape_text: tuple[str, ...] = (), planned: Plan | None = None
                 ) -> tuple[tuple[str, ex.Expr], ...]:
    """The terms :func:`map_text` names (``with p = ...``) over the output coordinates ``o0, o1, ...``
    of the map (the words plan's: over its words), each named ``TERM_PREFIX`` + the header's name, in
    dependency order: what a generated body binds where its expressions hold them."""
    m = chain.composed_map()
    if m.bit_level:
        p = planned if planned is not None else plan(chain)
        if not isinstance(p, Words):
            return ()
        exprs, line, coords = _word_parts(p)
        names = coordinate_names(len(p.word_shape))[:-1] + ["w"]
        width = 160
    else:
        m = tidy_map(m)
        names = coordinate_names(len(m.out_shape), shape_text)
        exprs, line, coords = _map_parts(m, names)
        width = MAP_WIDTH
    _, order = factor(exprs, line, coords, width)
    # Each definition written out whole over o0, o1, ... (the body's coordinates), as the planner's
    # constructors build it: the tree a body's expression holds where it computes the term.
    whole: dict[str, ex.Expr] = {n: ex.Var(f"o{k}") for k, n in enumerate(names)}
    out = []
    for n, d in order:
        whole[n] = ex.substitute(d, whole)
        out.append((TERM_PREFIX + n, whole[n]))
    return tuple(out)


def map_text(chain: Chain, shape_text: tuple[str, ...] = (), planned: Plan | None = None) -> str:
    """The whole chain as one map, as ``explain`` shows it (``planned``: the chain's plan where the
    caller has it, so a bit-level chain is not planned again)."""
    m = chain.composed_map()
    if m.bit_level:
        return render_words(planned if planned is not None else plan(chain)) or "bit-level map (see the statements)"
    return render_map(tidy_map(m), coordinate_names(len(m.out_shape), shape_text))
