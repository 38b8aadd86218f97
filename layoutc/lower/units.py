"""The units walk of a words plan: each output word from a few aligned 16- or 32-bit source units.

The words walk loads an output word's four source bytes one by one, each address from its own index
expression. CUTLASS's W4A8 reorder moves 16-bit units (runs of 4 nibbles): an output word's bytes
0|1 are two consecutive source bytes, and so are bytes 2|3, the second pair a fixed step (8 rows)
from the first. Where, for every output word, byte ``b`` reads the source ``offsets[b]`` bytes after
byte 0 (the same offsets for every word: expressions of the dims alone), bytes ``2k, 2k+1`` (or all
four) are consecutive, and byte 0's address is a multiple of the unit, a lane computes one base
address, loads ``4 // unit`` units at the fixed offsets and assembles the word: the plan's bytewise
conversions and its bit permutation then apply to the word as in the words walk.

Decided from the words plan's byte sources alone, checked on small instances of the dims.
"""

from __future__ import annotations

from typing import Callable

import attrs

from ..algebra import expr as ex
from .grids import evaluate, grid_env
from .strides import linear

WORD_BYTES = 4


@attrs.frozen
class Units:
    """Per output word: byte 0's source coordinates ``src``; unit ``k`` (``unit`` bytes) is loaded
    ``offsets[k]`` bytes after byte 0's address (``offsets[0]`` is 0) and fills bytes
    ``unit*k .. unit*k + unit - 1`` of the word."""

    src: tuple[ex.Expr, ...]
    offsets: tuple[ex.Expr, ...]
    unit: int  # bytes per load: 2 or 4


def find_units(p, instances: list[dict], tidy: Callable) -> Units | None:
    """The units walk of words plan ``p`` (every byte read: no padding), or None where it does not hold.
    ``instances``: small instances of the dims; ``tidy(e, shape, dims)``: the planner's simplifier."""
    if any(v != ex.TRUE for v in p.word_valid) or len(instances) < 2:
        return None
    names = sorted(set().union(*(ex.free_vars(s) for s in p.in_shape)))
    lins = [linear(coords, p.in_shape) for coords in p.word_sources]
    offsets = [_offset(p, b, names, instances) for b in range(WORD_BYTES)]
    if any(o is None for o in offsets):
        return None
    fits = {4: True, 2: True}
    for dims in instances:
        env = grid_env([int(ex.evaluate(s, dims)) for s in p.word_shape], dims)
        base = evaluate(lins[0], env)
        steps = [int(ex.evaluate(o, dims)) for o in offsets]
        for b in range(1, WORD_BYTES):  # byte b the same offset from byte 0 in every word
            if not bool((evaluate(lins[b], env) - base == steps[b]).all()):
                return None
        for unit in fits:
            firsts = range(0, WORD_BYTES, unit)
            fits[unit] = fits[unit] and all(steps[f + j] == steps[f] + j for f in firsts for j in range(unit)) \
                and all(steps[f] % unit == 0 for f in firsts) and not bool((base % unit != 0).any())
    unit = next((u for u in (4, 2) if fits[u]), None)
    if unit is None:
        return None
    src = tuple(tidy(c, p.word_shape, names) for c in p.word_sources[0])
    return Units(src=src, offsets=tuple(offsets[f] for f in range(0, WORD_BYTES, unit)), unit=unit)


def _offset(p, byte: int, names: list[str], instances: list[dict]) -> ex.Expr | None:
    """Byte ``byte``'s source address minus byte 0's as an expression of the dims: each source
    coordinate's difference, the same constant over every word of every instance, times its stride
    (None where a difference is not one constant)."""
    diffs = []
    for k, (c, c0) in enumerate(zip(p.word_sources[byte], p.word_sources[0])):
        found = set()
        for dims in instances:
            env = grid_env([int(ex.evaluate(s, dims)) for s in p.word_shape], dims)
            found |= {int(v) for v in (evaluate(c, env) - evaluate(c0, env)).unique()}
        if len(found) != 1:
            return None
        diffs.append(found.pop())
    return ex.simplify(linear(tuple(ex.Const(d) for d in diffs), p.in_shape), {d: (1, None) for d in names})


def units_body(p, lanes: list[str], unravel: Callable, t) -> list[str]:
    """The units walk (``p.units``): one output word per lane, x viewed as integers of ``unit`` bytes,
    byte 0's source address computed once, the units loaded at the fixed offsets from it and put
    side by side (little-endian), then the plan's conversions and bit permutation as in the words
    walk (:func:`layoutc.lower.triton_emit._words`)."""
    from ..lang.ops.conversion import UINT, words_kernel

    u = p.units
    names = sorted(set().union(*(ex.free_vars(s) for s in p.in_shape)))
    body = lanes + [f"mask = offs < ({t(ex.mul(*p.word_shape))})"] + unravel("offs", p.word_shape, t)
    body += [f"_s{k} = {t(c)}" for k, c in enumerate(u.src)]
    base = linear(tuple(ex.Var(f"_s{k}") for k in range(len(u.src))), p.in_shape)
    body.append(f"_base = ({t(base)}) // {u.unit}")
    parts = []
    for k, off in enumerate(u.offsets):
        step = ex.simplify(ex.floordiv(off, u.unit), {d: (1, None) for d in names})
        addr = "_base" if step == ex.Const(0) else f"_base + ({t(step)})"
        body.append(f"_e{k} = tl.load(x_ptr + {addr}, mask=mask, other=0)"
                    f".to({UINT[8 * u.unit]}, bitcast=True).to(tl.uint32)")
        parts.append(f"(_e{k} << {8 * u.unit * k})" if k else f"_e{k}")
    body.append(f"w = {' | '.join(parts)}")
    body += words_kernel(p.conversions, "w")
    body += p.permutation.kernel("w", "r")
    body.append("tl.store(y_ptr + offs, r.to(tl.int32, bitcast=True), mask=mask)")
    return body


def units_walk(p, walk: Callable, block: int) -> tuple[str, list[str]]:
    """The launcher's (condition, lines) of the units walk: x seen as integers of ``unit`` bytes, which
    needs whole units in its rows (else the words walk)."""
    count = f"-(-({ex.to_python(ex.mul(*p.word_shape))}) // {block})"
    return (f"x.shape[-1] * x.element_size() % {p.units.unit} == 0  # whole units",
            walk(f"int{8 * p.units.unit}", "int32", count))
