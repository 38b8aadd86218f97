"""Index maps as text, in one notation: what ``layoutc explain`` prints and what every generated
kernel carries above it (``out[e, r] = in[e, (I + r) mod (2*I)]``).

The expressions are the planner's (:func:`layoutc.lower.plan.tidy`): the arithmetic a reader sees
is the arithmetic the kernel evaluates.
"""

from __future__ import annotations

from .. import expr as ex
from ..compiler import Chain
from ..indexmap import IndexMap
from .plan import Plan, plan, tidy_map

ROLE_NAMES = {3: ["e", "r", "k"], 2: ["e", "r"], 1: ["r"]}


def coordinate_names(rank: int, shape_text: tuple[str, ...] = ()) -> list[str]:
    if shape_text and len(shape_text) == 5 and shape_text[-2:] == ("16", "16"):
        return ["e", "rb", "kb", "f", "c"]  # the SM90 fold's [E, R/64, K/128, 16, 16]
    return list(ROLE_NAMES.get(rank, ["e"] + [f"i{k}" for k in range(1, rank)]))


def render_map(m: IndexMap, names: list[str]) -> str:
    ranges = ex.coordinate_ranges(m.out_shape)
    tidy = lambda e: ex.rename(ex.simplify_symbolic(e, ranges), {f"o{k}": n for k, n in enumerate(names)})  # noqa: E731
    src = ", ".join(ex.to_str(tidy(s)) for s in m.src)
    text = f"out[{', '.join(names)}] = in[{src}]"
    if not m.is_total():
        text += f" where {ex.to_str(tidy(m.valid))}, else {ex.to_str(tidy(m.fill))}"
    return text


def render_words(p: Plan) -> str | None:
    if p.pattern != "words":
        return None
    names = coordinate_names(len(p.word_shape))[:-1] + ["w"]
    ren = {f"o{k}": n for k, n in enumerate(names)}
    parts = []
    for t, coords in enumerate(p.word_sources):
        c = ", ".join(ex.to_str(ex.rename(x, ren)) for x in coords)
        parts.append(f"in[{c}]" + (f" << {8 * t}" if t else ""))
    return (f"word[{', '.join(names)}] (output bytes 4w..4w+3) = bits permuted by T of ("
            + " | ".join(parts) + f"), T = {list(p.table)}")


def map_text(chain: Chain, shape_text: tuple[str, ...] = ()) -> str:
    """The whole chain as one map, as ``explain`` shows it."""
    m = chain.composed_map()
    if m.bit_level:
        return render_words(plan(chain)) or "bit-level map (see the statements)"
    return render_map(tidy_map(m), coordinate_names(len(m.out_shape), shape_text))
