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

The grouped form (``Units.words`` > 1) goes further where the map allows: a lane takes ``words``
consecutive output words whose bytes all come from a few aligned 16-byte source runs at fixed offsets
from the group's byte 0 (the W4A8 reorder: an atom row's 8 words are two 16-byte runs, rows r and
r + 8). One unravel and one base address per group instead of per word, 128-bit loads and stores
instead of 16-bit loads and 32-bit stores; the words are assembled from the runs' 16-bit (or byte)
pieces in registers.

Lanes in tiles (``Units.stride``): consecutive groups read runs of source rows 8 apart, so a warp's
16-byte loads touch 32 rows and use half of each 32-byte sector (~72% of a copy on the H200). Where
group ``g + D`` reads the run just after group ``g``'s (for most groups, ``D`` an expression of the
dims: the W4A8 atoms' column-major order, D = the atoms along N times 8), a program takes a tile of
TILE_RUNS x (BLOCK_GROUPS / TILE_RUNS) groups of the grid [groups / D, D], TILE_RUNS fastest across
its lanes: 8 lanes read one 128-byte line of a row and the stores stay whole 32-byte sectors
(benchmarks/w4a8_walks.py: 96-97% of a copy at real layers). Any order of the groups over the lanes
gives the same output; the tile is a launch-time choice (``_TILE``) where the call's dims allow it.
"""

from __future__ import annotations

from typing import Callable

import attrs

from ..algebra import expr as ex
from .grids import evaluate, grid_env
from .strides import linear

WORD_BYTES = 4
GROUP_WORDS = 8  # output words per lane in the grouped form (32 bytes: two 16-byte stores)
RUN_BYTES = 16  # the grouped form's source runs: one 128-bit load each
BLOCK_GROUPS = 128  # groups per program
TILE_RUNS = 8  # grouped form in tiles: groups D apart side by side in a warp (8 runs: one 128-byte line)


@attrs.frozen
class Units:
    """Per output word: byte 0's source coordinates ``src``; unit ``k`` (``unit`` bytes) is loaded
    ``offsets[k]`` bytes after byte 0's address (``offsets[0]`` is 0) and fills bytes
    ``unit*k .. unit*k + unit - 1`` of the word."""

    src: tuple[ex.Expr, ...]
    offsets: tuple[ex.Expr, ...]
    unit: int  # bytes per load: 2 or 4; the grouped form: bytes per run (RUN_BYTES)
    words: int = 1  # output words per lane; > 1: the grouped form, ``offsets`` those of its runs
    picks: tuple[tuple[int, int], ...] = ()  # grouped: per output byte (4*word + byte): (run, byte in run)
    stride: ex.Expr | None = None  # grouped: D, groups from one group to the group reading the next runs


def find_units(p, instances: list[dict], tidy: Callable) -> Units | None:
    """The units walk of words plan ``p`` (every byte read: no padding), or None where it does not hold.
    ``instances``: small instances of the dims; ``tidy(e, shape, dims)``: the planner's simplifier."""
    if any(v != ex.TRUE for v in p.word_valid) or len(instances) < 2:
        return None
    grouped = find_groups(p, instances, tidy)
    if grouped is not None:
        return grouped
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


def find_groups(p, instances: list[dict], tidy: Callable, words: int = GROUP_WORDS,
                run: int = RUN_BYTES) -> Units | None:
    """The grouped form: every group of ``words`` consecutive output words (row-major over the word
    grid) reads whole aligned ``run``-byte source runs, each byte of a run once, each run at a fixed
    offset (an expression of the dims) from the group's byte 0, the same pick of (run, byte) for each
    output byte in every group of every instance. None where any of it fails."""
    names = sorted(set().union(*(ex.free_vars(s) for s in p.in_shape)))
    nbytes = words * WORD_BYTES
    picks, offsets = None, None
    for dims in instances:
        env = grid_env([int(ex.evaluate(s, dims)) for s in p.word_shape], dims)
        total = int(ex.evaluate(ex.mul(*p.word_shape), dims))
        if total % words:
            return None
        full = [int(ex.evaluate(s, dims)) for s in p.word_shape]

        def grid(e, env=env, full=full):  # e over every word, flat (row-major), one row per group
            return evaluate(e, env).expand(full).reshape(-1, words)
        # per output byte (4j + b): its source coordinates minus byte 0's of the group, the same in every group
        # (one broadcast comparison: the sizes the spec's assumes allow give groups by the hundred thousand)
        import torch

        coords = torch.stack([torch.stack([grid(c) for c in cs]) for cs in p.word_sources])  # [byte, axis, g, j]
        delta = coords - coords[:1, :, :, :1]
        if not bool((delta == delta[:, :, :1, :]).all()):
            return None
        first = delta[:, :, 0, :].permute(2, 0, 1).reshape(nbytes, -1).tolist()  # [4j + b][axis]
        diffs = [tuple(int(v) for v in d) for d in first]
        base = grid(linear(p.word_sources[0], p.in_shape))[:, 0]
        if bool((base % run != 0).any()):
            return None
        exprs = [ex.simplify(linear(tuple(ex.Const(v) for v in d), p.in_shape), {n: (1, None) for n in names})
                 for d in diffs]
        steps = [int(ex.evaluate(e, dims)) for e in exprs]
        if len(set(steps)) != nbytes:
            return None
        order = list(dict.fromkeys(s // run for s in steps))  # runs, first read first
        got = tuple((order.index(s // run), s % run) for s in steps)
        if len(order) * run != nbytes or (picks is not None and got != picks):
            return None
        if offsets is not None and exprs != offsets:
            return None
        picks, offsets = got, exprs
    starts = tuple(offsets[picks.index((k, 0))] for k in range(nbytes // run))
    src = tuple(tidy(c, p.word_shape, names) for c in p.word_sources[0])
    return Units(src=src, offsets=starts, unit=run, words=words, picks=picks,
                 stride=group_stride(p, instances, words, run))


def group_stride(p, instances: list[dict], words: int = GROUP_WORDS, run: int = RUN_BYTES) -> ex.Expr | None:
    """D such that group ``g + D`` reads the ``run`` bytes after group ``g``'s (both of a group's
    runs move together: their offsets are fixed), for at least half of the groups on every instance,
    the most of them, then the smallest D; D from a word-grid axis times a power of 2 (the groups
    of one column of atoms). None where no candidate holds."""
    names = sorted(set().union(*(ex.free_vars(s) for s in p.word_shape)))
    cands, parts = [], {}  # parts: candidate -> (axis size, divisor) it is exact for
    for s in p.word_shape:
        for j in range(-8, 9):
            c = ex.mul(s, 2 ** j) if j >= 0 else ex.div(s, 2 ** -j)
            c = ex.simplify(c, {n: (1, None) for n in names})
            if c not in cands and not isinstance(c, ex.Const):
                cands.append(c)
                parts[c] = (s, 2 ** max(0, -j))
    scores, seen = {}, {}  # per candidate: its lowest fraction; instances that tell (-1: not a size)
    for dims in instances:
        env = grid_env([int(ex.evaluate(s, dims)) for s in p.word_shape], dims)
        full = [int(ex.evaluate(s, dims)) for s in p.word_shape]
        base = evaluate(linear(p.word_sources[0], p.in_shape), env).expand(full).reshape(-1, words)[:, 0]
        groups = base.numel()
        for c in cands:
            v, (s, q) = ex.evaluate(c, dims), parts[c]
            if int(ex.evaluate(s, dims)) % q or v <= 0 or groups % int(v):  # inexact (sizes divide by floor)
                seen[c] = -1
                continue
            d = int(v)
            if 2 * d > groups:  # one row of groups: this instance cannot tell
                continue
            got = float(((base[d:] - base[:-d]) == run).float().mean())
            scores[c] = min(scores.get(c, got), got)
            seen[c] = seen.get(c, 0) + (seen.get(c, 0) >= 0)
    best = [c for c in cands if seen.get(c, 0) >= 2 and scores[c] >= 0.5]
    if not best:
        return None
    top = max(scores[c] for c in best)
    return min((c for c in best if scores[c] == top), key=lambda c: ex.evaluate(c, instances[0]))


def units_body(p, lanes: Callable, unravel: Callable, t) -> list[str]:
    """The units walk (``p.units``): one output word per lane, x viewed as integers of ``unit`` bytes,
    byte 0's source address computed once, the units loaded at the fixed offsets from it and put
    side by side (little-endian), then the plan's conversions and bit permutation as in the words
    walk (:func:`layoutc.lower.triton_emit._words`)."""
    from ..lang.ops.conversion import UINT, words_kernel

    u = p.units
    if u.words > 1:
        return _groups_body(p, lanes(BLOCK_GROUPS), unravel, t)
    lanes = lanes()
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


def _pieces(picks: tuple[tuple[int, int], ...], j: int) -> list[tuple[int, int, int, int]]:
    """Output word ``j``'s bytes as (run, 32-bit column, first byte in the column, bytes) pieces, each
    a run of consecutive output bytes read from consecutive bytes of one column."""
    out: list[list[int]] = []
    for b in range(WORD_BYTES):
        k, q = picks[WORD_BYTES * j + b]
        last = out[-1] if out else None
        if last and last[0] == k and last[1] == q // 4 and last[2] + last[3] == q % 4:
            last[3] += 1
        else:
            out.append([k, q // 4, q % 4, 1])
    return [tuple(x) for x in out]


def _groups_body(p, lanes: list[str], unravel: Callable, t) -> list[str]:
    """The grouped form: a lane's ``words`` output words from its runs (x seen as int32: each run
    one [lanes, 4] load), split into columns, the words put together from their pieces, joined into
    [lanes, words], converted, permuted and stored as one block."""
    from ..lang.ops.conversion import words_kernel

    u = p.units
    names = sorted(set().union(*(ex.free_vars(s) for s in p.in_shape)))
    cols = u.unit // 4
    if cols != 4 or u.words & (u.words - 1):
        raise ValueError(f"the grouped units walk takes 16-byte runs and a power of 2 of words, not {u}")
    groups = ex.floordiv(ex.mul(*p.word_shape), u.words)
    if u.stride is not None:  # lanes in tiles (_TILE > 1): _TILE groups D apart fastest, then along D
        across = f"({BLOCK_GROUPS} // _TILE)"
        lanes = lanes + ["if _TILE > 1:",
                         f"    _gt = offs // {BLOCK_GROUPS}",
                         f"    _gc = _gt % (({t(u.stride)}) // {across})",
                         f"    _gk = (_gt // (({t(u.stride)}) // {across})) * _TILE + offs % _TILE",
                         f"    offs = _gk * ({t(u.stride)}) + _gc * {across} + offs // _TILE % {across}"]
    body = lanes + [f"mask = offs < ({t(groups)})", f"_w = offs * {u.words}"] + unravel("_w", p.word_shape, t)
    body += [f"_s{k} = {t(c)}" for k, c in enumerate(u.src)]
    base = linear(tuple(ex.Var(f"_s{k}") for k in range(len(u.src))), p.in_shape)
    body.append(f"_base = ({t(base)}) // {u.unit}")
    body.append(f"_q = tl.arange(0, {cols})[None, :]")
    for k, off in enumerate(u.offsets):
        step = ex.simplify(ex.floordiv(off, u.unit), {d: (1, None) for d in names})
        addr = "_base" if step == ex.Const(0) else f"(_base + ({t(step)}))"
        body.append(f"_l{k} = tl.load(x_ptr + {addr}[:, None] * {cols} + _q, mask=mask[:, None], other=0)"
                    f".to(tl.uint32, bitcast=True)")
        body.append(f"_a{k}, _b{k} = tl.split(tl.reshape(_l{k}, [{BLOCK_GROUPS}, 2, 2]))")
        body.append(f"_c{k}_0, _c{k}_2 = tl.split(_a{k})")
        body.append(f"_c{k}_1, _c{k}_3 = tl.split(_b{k})")
    for j in range(u.words):
        terms = []
        at = 0
        for k, c, q, n in _pieces(u.picks, j):
            v = f"_c{k}_{c}" + (f" >> {8 * q}" if q else "")
            v = f"(({v}) & {(1 << 8 * n) - 1:#x})" if n < WORD_BYTES - q else f"({v})"
            terms.append(f"({v} << {8 * at})" if at else v)
            at += n
        body.append(f"_w{j} = " + " | ".join(terms))
    parts, level = [f"_w{j}" for j in range(u.words)], 0
    while len(parts) > 1:  # join(a, b) adds a last axis: word j paired with j + half keeps the flat order
        half, level = len(parts) // 2, level + 1
        body += [f"_j{level}_{i} = tl.join({parts[i]}, {parts[i + half]})" for i in range(half)]
        parts = [f"_j{level}_{i}" for i in range(half)]
    body.append(f"w = tl.reshape({parts[0]}, [{BLOCK_GROUPS}, {u.words}])")
    body += words_kernel(p.conversions, "w")
    body += p.permutation.kernel("w", "r")
    body.append(f"tl.store(y_ptr + _w[:, None] + tl.arange(0, {u.words})[None, :], r.to(tl.int32, bitcast=True), "
                f"mask=mask[:, None])")
    return body


def units_walk(p, walk: Callable, block: int) -> tuple[str, list[str]]:
    """The launcher's (condition, lines) of the units walk: x seen as integers of ``unit`` bytes, which
    needs whole units in its rows (else the words walk); the grouped form: x seen as int32, rows of
    whole runs, whole groups of words."""
    u = p.units
    if u.words > 1:
        total = ex.to_python(ex.mul(*p.word_shape))
        plain = f"-(-({total}) // {u.words * BLOCK_GROUPS})"
        cond = f"x.shape[-1] * x.element_size() % {u.unit} == 0 and ({total}) % {u.words} == 0  # whole runs"
        if u.stride is None:
            return cond, walk("int32", "int32", plain)
        across = BLOCK_GROUPS // TILE_RUNS
        tiles = f"-(-(_groups // _stride) // {TILE_RUNS}) * (_stride // {across})"
        return cond, [f"_stride, _groups = {ex.to_python(u.stride)}, ({total}) // {u.words}  # g + D reads after g",
                      f"_tile = {TILE_RUNS} if _stride % {across} == 0 and _groups % _stride == 0 else 1",
                      *walk("int32", "int32", f"{tiles} if _t > 1 else {plain}", "_tile")]
    count = f"-(-({ex.to_python(ex.mul(*p.word_shape))}) // {block})"
    return (f"x.shape[-1] * x.element_size() % {p.units.unit} == 0  # whole units",
            walk(f"int{8 * p.units.unit}", "int32", count))
