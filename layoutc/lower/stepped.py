"""Word walks of gathers: runs of output elements moved as one word per lane.

``coarse``: runs that read runs of the source (``Gather.coarse``, found by :func:`coarsen`).
``steps``: aligned runs of output elements whose sources lie fixed steps apart (``Gather.steps``).

AITER's MXFP4 scale shuffle sends consecutive output bytes to source bytes 16 rows apart, then 4
columns apart, then 1 row apart: no run of output bytes reads a run of source bytes, so the gather
can not move words (:func:`coarsen`) and took one byte per lane, its ~40 integer operations of
index arithmetic per byte making the kernel bound by them (24-27% of a copy on the H200,
benchmarks/kernel_split.py). But within each aligned run of ``r`` output elements along the last
axis, element ``i`` reads the source ``offsets[i]`` elements after element 0's address, the same
for every run (an expression of the dims alone). A lane then computes one run's base address once,
loads its ``r`` elements at those fixed offsets and stores them as one ``r``-element word.

Decided from the map alone (the offsets found at coordinate 0 and checked on small instances of the
dims, wherever an element is read); taken by sub-word elements (8 and 16 bits) of plain gathers
(no value conversion) that neither move whole runs (coarse) nor transpose (tiles).
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs

from ..algebra import expr as ex
from ..lang.ops.conversion import UnknownKind
from .grids import evaluate, grid_env
from .strides import linear

#: Bits of the word a lane stores (the runs' length is WORD_BITS // element bits).
WORD_BITS = 32


@attrs.frozen
class Steps:
    """Per run of ``len(offsets)`` output elements (the output grid with its last axis divided by
    that): element 0's source coordinates ``src``; element ``i`` reads the source at ``src + steps[i]``
    (``offsets[i]`` elements after element 0), where those coordinates are inside the source (the
    map's validity, checked to be exactly that), else ``fill``."""

    src: tuple[ex.Expr, ...]
    steps: tuple[tuple[int, ...], ...]
    offsets: tuple[ex.Expr, ...]
    bounds: tuple[ex.Expr, ...]  # the source's shape
    fill: int

    @property
    def run(self) -> int:
        return len(self.offsets)


def find_steps(m, in_shape: Sequence[ex.Expr], out_shape: Sequence[ex.Expr], bits: int,
               instances: Callable[[int], list[dict]], tidy: Callable) -> Steps | None:
    """The stepped runs of map ``m`` (elements of ``bits`` bits), or None where they do not hold.
    ``instances(r)``: small instances of the dims where the output's last axis is a multiple of r;
    ``tidy(e, shape, dims)``: the planner's simplifier over the run grid."""
    import torch

    if bits not in (8, 16) or not out_shape:
        return None
    r = WORD_BITS // bits
    last = f"o{len(out_shape) - 1}"
    grid = tuple(out_shape[:-1]) + (ex.div(out_shape[-1], r),)

    def at(e: ex.Expr, i: int) -> ex.Expr:  # e at element i of the run
        return ex.substitute(e, {last: ex.add(ex.mul(r, ex.Var(last)), i)})

    fits = instances(r)
    if len(fits) < 2:
        return None
    steps: list[list[int | None]] = [[None] * len(in_shape) for _ in range(r)]
    fills: set[int] = set()
    for dims in fits:
        env = dict(dims)
        sizes = [int(ex.evaluate(s, dims)) for s in grid]
        for k, n in enumerate(sizes):
            env[f"o{k}"] = torch.arange(n).view([n if j == k else 1 for j in range(len(sizes))])
        bounds = [int(ex.evaluate(s, dims)) for s in in_shape]
        first = [torch.as_tensor(ex.evaluate(at(c, 0), env)) for c in m.src]
        for i in range(r):
            coords = [torch.as_tensor(ex.evaluate(at(c, i), env)) for c in m.src]
            for k, (c, c0) in enumerate(zip(coords, first)):
                d = torch.unique(c - c0)  # the same step everywhere, read or not, on every instance
                if d.numel() > 1 or steps[i][k] not in (None, int(d.reshape(-1)[0])) or bool((c < 0).any()):
                    return None
                steps[i][k] = int(d.reshape(-1)[0])
            inside = torch.ones((), dtype=torch.bool)
            for c, n in zip(coords, bounds):
                inside = inside & (c < n)
            valid = torch.as_tensor(ex.evaluate(at(m.valid, i), env)).to(bool)
            if not bool((valid == inside).all()):  # the map reads exactly what lies inside the source
                return None
            fill = torch.as_tensor(ex.evaluate(at(m.fill, i), env)).expand(inside.shape)[~inside]
            fills.update(int(v) for v in torch.unique(fill))
    if len(fills) > 1 or any(s is None for row in steps for s in row):
        return None
    names = sorted(set().union(*(ex.free_vars(s) for s in in_shape)))
    strides = [ex.mul(*in_shape[k + 1:]) if k + 1 < len(in_shape) else ex.Const(1) for k in range(len(in_shape))]
    offsets = tuple(ex.simplify(ex.add(*(ex.mul(d, st) for d, st in zip(row, strides) if d)) if any(row)
                                else ex.Const(0), {d: (1, None) for d in names}) for row in steps)
    src = tuple(tidy(at(c, 0), grid, names) for c in m.src)
    return Steps(src=src, steps=tuple(tuple(row) for row in steps), offsets=offsets, bounds=tuple(in_shape),
                 fill=fills.pop() if fills else 0)


def relabels_only(p) -> bool:
    """Whether plan ``p``'s value conversions keep every bit of each element (``Conversion.keeps_bits``, a
    relabelling such as ``view(t, e4m3)`` of e8m0 scales): runs of its elements can then move as one
    wider word, bits as they are, the conversions a no-op on the bytes."""
    return p.in_elem.bits == p.out_elem.bits and all(c.keeps_bits for c in p.conversions)


def coarse_body(p, lanes: list[str], unravel: Callable, load: Callable, t) -> list[str]:
    """The coarse walk (``Gather.coarse`` > 1): x and y viewed as wider integers, a word of ``coarse``
    elements per lane; the plan's conversions keep every bit (``plan.relabels_only``), so the words
    move as they are."""
    if not relabels_only(p):
        raise UnknownKind(f"the coarse walk has no rule for conversions that change bits: {p.conversions!r}")
    shape = p.out_shape[:-1] + (ex.div(p.out_shape[-1], p.coarse),)
    body = lanes + [f"mask = offs < ({t(ex.mul(*shape))})"] + unravel("offs", shape, t)
    if p.coarse_valid == ex.TRUE:
        body += load("v", f"({t(p.coarse_src)})", None, "")
    else:
        body += load("v", f"({t(p.coarse_src)})", t(p.coarse_valid), ", other=0")
    body.append("tl.store(y_ptr + offs, v, mask=mask)")
    return body


def steps_body(p, lanes: list[str], unravel: Callable, t, uint: dict) -> list[str]:
    """The stepped walk (``p.steps``): a word of ``run`` elements per lane, x viewed as the elements'
    integers, y as 32-bit words; element 0's source coordinates computed once, the elements loaded at
    the fixed steps from them (each masked by its own coordinates' bounds), packed little-endian."""
    s = p.steps
    shape = tuple(p.out_shape[:-1]) + (ex.div(p.out_shape[-1], s.run),)
    body = lanes + [f"mask = offs < ({t(ex.mul(*shape))})"] + unravel("offs", shape, t)
    body += [f"_s{k} = {t(c)}" for k, c in enumerate(s.src)]
    body.append(f"_base = {t(linear(tuple(ex.Var(f'_s{k}') for k in range(len(s.src))), s.bounds))}")
    bits = WORD_BITS // s.run
    parts = []
    for i in range(s.run):
        addr = "_base" if s.offsets[i] == ex.Const(0) else f"_base + ({t(s.offsets[i])})"
        inside = [f"(_s{k} {'+' if d > 0 else '-'} {abs(d)} < {t(n)})" if d else f"(_s{k} < {t(n)})"
                  for k, (d, n) in enumerate(zip(s.steps[i], s.bounds))]
        body.append(f"_ok = mask & {' & '.join(inside)}")
        body.append(f"_e{i} = tl.load(x_ptr + {addr}, mask=_ok, other={s.fill})")
        body.append(f"_e{i} = _e{i}.to({uint[bits]}, bitcast=True).to(tl.uint32)")
        parts.append(f"(_e{i} << {bits * i})" if i else f"_e{i}")
    body.append(f"w = {' | '.join(parts)}")
    body.append("tl.store(y_ptr + offs, w.to(tl.int32, bitcast=True), mask=mask)")
    return body


def coarsen(p, names: tuple[str, ...], known: list, tidy: Callable):
    """Runs of R consecutive output elements that read R consecutive, R-aligned input elements
    (the 4-byte groups of the SM90 scale fold and of the 128x4 swizzle) move as one R-element word.
    ``names``: the dims; ``known``: the chain's (value, multiple) constraints; ``tidy``: the planner's
    simplifier. Returns ``p`` itself where no run length holds."""
    from ..algebra.instances import sample_dims

    m = p.map
    if not m.fill == ex.Const(0):
        return p
    last = f"o{m.out_rank - 1}"
    lin = linear(m.src, p.in_shape)
    for r in (8, 4, 2):
        if r * p.in_elem.bits > 64:
            continue
        base = ex.substitute(lin, {last: ex.mul(r, ex.Var(last))})
        valid = ex.substitute(m.valid, {last: ex.mul(r, ex.Var(last))})
        # Checked on small instances where the launcher would take this path (both last axes % r).
        fits = sample_dims(names, known + [(p.out_shape[-1], r), (p.in_shape[-1], r)], per_dim=4)
        fits = fits[:: max(1, len(fits) // 6)][:6]
        ok = len(fits) >= 2
        for dims in fits if ok else []:
            out_shape = [int(ex.evaluate(s, dims)) for s in p.out_shape]
            env = grid_env(out_shape[:-1] + [out_shape[-1] // r], dims)
            b = evaluate(base, env)
            v = evaluate(valid, env).to(bool)
            if bool(((b % r != 0) & v).any()):
                ok = False
                break
            for j in range(1, r):
                shifted = dict(env)
                shifted[last] = env[last] * r + j
                same_addr = evaluate(lin, shifted) == b + j
                same_valid = evaluate(m.valid, shifted).to(bool) == v
                if not bool((same_valid & (same_addr | ~v)).all()):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            coarse_shape = p.out_shape[:-1] + (ex.div(p.out_shape[-1], r),)
            src = tidy(ex.floordiv(base, r), coarse_shape, names, valid)
            return attrs.evolve(p, coarse=r, coarse_src=src, coarse_valid=tidy(valid, coarse_shape, names))
    return p
