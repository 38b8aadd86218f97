"""The shapes ``equiv`` compares at: dims sampled around the given ones, and defaults when none are given.

:func:`sample_shapes` picks valid dims near the given ones (ones that need padding, smaller and larger ones)
under the variant's rules and the spec's ``assume`` lines; :func:`default_dims` the smallest valid ones. Kept
apart from the comparison: it reads only the spec, never the function.
"""

from __future__ import annotations

import math
from typing import Mapping


from ..algebra import expr as ex
from ..lang.compiler import Variant
from ..algebra.indexmap import concrete_shape
from .findings import _fmt_dims
from .function_runner import EquivError


# ---------------------------------------------------------------------------
# shapes


def _constraints(spec, variant: Variant) -> list[tuple[ex.Expr, int]]:
    known = [(k.value, k.multiple) for c in variant.chains for k in c.constraints]
    known += spec.program.assumed
    return known


def _valid(spec, variant: Variant, env: Mapping[str, int]) -> str | None:
    """None when the dims satisfy every rule of the variant, else the first rule that fails."""
    program = spec.program
    for a in program.assumptions:
        v = env.get(a.dim, 0)
        if v < max(1, a.minimum) or v % a.multiple:
            return (f"the spec assumes {a.dim} % {a.multiple} == 0"
                    + (f" and {a.dim} >= {a.minimum}" if a.minimum > 1 else ""))
    for a in program.size_assumptions:
        if not a.holds(env):
            return f"the spec assumes {a.text}"
    for c in program.conditions:
        if c.holds(env) != (c.label in variant.present):
            return f"size condition {c.label}"
    for c in variant.chains:
        for k in c.constraints:
            try:
                value = ex.evaluate(k.value, env)
            except (KeyError, ZeroDivisionError):
                return k.message()
            if k.multiple == 0:
                if not value:
                    return k.message()
            elif value % k.multiple:
                return k.message()
        for s in c.source.shape:
            if ex.evaluate(s, env) <= 0:
                return f"{c.tensor} would be empty"
    return None


def _padding(variant: Variant, env: Mapping[str, int]) -> int:
    """How many steps of the variant really pad at these dims (a map that is not total changing sizes)."""
    n = 0
    for c in variant.chains:
        for s in c.steps:
            if not s.op.index_map(s.in_type).is_total():
                if concrete_shape(s.in_type.shape, env) != concrete_shape(s.out_type.shape, env):
                    n += 1
    return n


def sample_shapes(spec, variant: Variant, given: Mapping[str, int] | None, count: int = 4) -> list[dict]:
    """``count`` dims to compare at: the given ones, one near them that needs padding (where the spec
    pads), larger ones (each dim at its next valid value) and the smallest valid ones; then others near
    the given ones. Each satisfies every rule of the variant."""
    dims = list(spec.program.dims)
    if given is None:
        given = default_dims(spec, variant)
    given = {d: int(given[d]) for d in dims}
    why = _valid(spec, variant, given)
    if why is not None:
        raise EquivError(f"the dims {_fmt_dims(given)} do not fit the spec: {why}")
    shapes = [given]
    if count <= 1:
        return shapes
    import itertools

    # Per dim, only the valid values used below, each dim moved alone: the smallest, the one below the
    # given value, and the two above it (up to max(4*given, 512)); searched lazily, as checking a value
    # compiles the spec's rules at it.
    smallest, below, above = {}, {}, {}
    for d in dims:
        def ok(v, d=d):
            return _valid(spec, variant, {**given, d: v}) is None

        smallest[d] = next(v for v in range(1, given[d] + 1) if ok(v))  # the given value itself is valid
        below[d] = next((v for v in range(given[d] - 1, 0, -1) if ok(v)), given[d])
        top = max(4 * given[d], 512)
        above[d] = list(itertools.islice((v for v in range(given[d] + 1, top + 1) if ok(v)), 2))

    def neighbours(d):
        return sorted({below[d], given[d], *above[d]})

    near = [dict(zip(dims, combo)) for combo in itertools.product(*(neighbours(d) for d in dims))]
    near = [e for e in near if _valid(spec, variant, e) is None]

    def distance(e):
        return sum(abs(math.log(e[d] / given[d])) for d in dims)

    padded = sorted(near, key=lambda e: (-_padding(variant, e), distance(e)))
    if padded and _padding(variant, padded[0]) > _padding(variant, given):
        shapes.append(padded[0])
    small = dict(smallest)
    # larger: every dim at its next valid value; the experts (E) as given (a second expert is there already)
    larger = {d: given[d] if d == "E" else (above[d][0] if above[d] else given[d]) for d in dims}
    for e in (larger, small):
        if _valid(spec, variant, e) is None and e not in shapes:
            shapes.append(e)
    for e in sorted(near, key=distance):
        if len(shapes) >= count:
            break
        if e not in shapes:
            shapes.append(e)
    return shapes[:count]


def default_dims(spec, variant: Variant) -> dict[str, int]:
    """Small dims where every layout rule of the spec holds and tiles repeat: each dim at its second
    smallest valid value (two experts)."""
    from ..algebra.instances import variant_instances

    inst = variant_instances(spec.program, variant.present, _constraints(spec, variant))
    if not inst:
        raise EquivError("no small dims satisfy the spec's rules; give --dims")
    values = {d: sorted({i[d] for i in inst}) for d in spec.program.dims}
    env = {d: v[min(1, len(v) - 1)] for d, v in values.items()}
    if _valid(spec, variant, env) is not None:
        env = inst[0]
    if "E" in env and _valid(spec, variant, {**env, "E": 2}) is None:
        env["E"] = 2
    return env
