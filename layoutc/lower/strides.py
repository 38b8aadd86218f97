"""The strides an index map reads: a strided view (``affine_strides``), a transpose (``transpose_axis``).

A transposing map: the output's contiguous axis reads the source far apart, another axis reads it in
order. One element per lane then has every lane of a warp read another source row: 32 sectors per warp for
32 bytes (Marlin's scales, ``out[e, k, n] = in[e, perm(n), k]``). The tiles walk
(``triton_emit._tiles``) takes such a map over 2-D tiles of (that other axis, the last axis): the
tile's loads run along the source's rows, its stores along the output's, the compiler regrouping the
tile between them (the classic tiled transpose).

Decided from the map's strides alone, checked on small instances of the dims: output axis ``a`` reads
source stride 1 where ``o_a + 1`` is in the output and both elements are read (the map's validity),
and the last axis never reads source stride 1.
"""

from __future__ import annotations

from typing import Sequence

from ..algebra import expr as ex
from ..algebra.indexmap import IndexMap


def contiguous_strides(shape: Sequence[ex.Expr]) -> tuple[ex.Expr, ...]:
    strides: list[ex.Expr] = []
    acc: ex.Expr = ex.Const(1)
    for size in reversed(shape):
        strides.append(acc)
        acc = ex.mul(acc, size)
    return tuple(reversed(strides))


def linear(coords: Sequence[ex.Expr], shape: Sequence[ex.Expr]) -> ex.Expr:
    """The flat (row-major) index of ``coords`` in a tensor of ``shape``."""
    return ex.add(*(ex.mul(c, s) for c, s in zip(coords, contiguous_strides(shape))))


def affine_strides(m: IndexMap) -> tuple[tuple[ex.Expr, ...], ex.Expr] | None:
    """(input-element stride of each output axis, offset) when ``m`` is a strided view, else None."""
    if not m.is_total() or m.bit_level:
        return None
    rank = m.out_rank
    zero = {f"o{k}": 0 for k in range(rank)}
    in_strides = contiguous_strides(m.in_shape)
    for sample in (64 * 3, 64 * 5):  # linear in the coordinates for two bindings of the dims
        dims = {d: sample + 7 * i for i, d in enumerate(sorted(set().union(*(ex.free_vars(s) for s in m.in_shape))))}
        for s in m.src:
            form = ex.linear_form(ex.substitute(s, dims))
            if form is None or any(c.denominator != 1 for c in form[0].values()):
                return None
    lin = ex.add(*(ex.mul(s, st) for s, st in zip(m.src, in_strides)))
    offset = ex.substitute(lin, zero)
    strides = []
    for k in range(rank):
        unit = dict(zero)
        unit[f"o{k}"] = 1
        strides.append(ex.add(ex.substitute(lin, unit), ex.mul(-1, offset)))
    # torch views have no negative strides (a reversed axis): such a map is a gather
    for sample in (64 * 3, 64 * 5):
        dims = {d: sample + 7 * i for i, d in enumerate(sorted(set().union(*(ex.free_vars(s) for s in m.in_shape))))}
        if any(ex.evaluate(st, dims) < 0 for st in strides):
            return None
    return tuple(strides), offset


def _strides(m: IndexMap, in_shape, out_shape, dims: dict) -> list[tuple[object, object]]:
    """Per output axis: (source stride of a step along it, whether both ends are read), over the whole
    output grid of ``dims`` (empty along an axis of one element)."""
    import torch

    sizes = [int(ex.evaluate(s, dims)) for s in out_shape]
    addr, valid = linear(m.src, in_shape), m.valid

    def at(grid: list[int], shift: int | None) -> tuple:
        env = dict(dims)
        for k, n in enumerate(grid):
            view = [1] * len(grid)
            view[k] = n
            env[f"o{k}"] = torch.arange(n).view(view) + (1 if k == shift else 0)
        ok = torch.as_tensor(ex.evaluate(valid, env)).to(bool).expand(grid)
        return torch.as_tensor(ex.evaluate(addr, env)).expand(grid), ok

    found = []
    for k in range(len(sizes)):
        grid = sizes[:k] + [max(0, sizes[k] - 1)] + sizes[k + 1:]
        a0, v0 = at(grid, None)
        a1, v1 = at(grid, k)
        found.append((a1 - a0, v0 & v1))
    return found


def transpose_axis(m: IndexMap, in_shape: Sequence[ex.Expr], out_shape: Sequence[ex.Expr],
                   instances: Sequence[dict]) -> int | None:
    """The output axis (other than the last) that reads source stride 1 wherever a step along it
    reads two elements, where the last axis never does, on every instance of ``instances`` (dims);
    None where there is none, or fewer than two instances have a step along it. An instance where no
    candidate axis steps (each of one element: CUTLASS W4A8's w13 scales [E, H/128, 2I] at H = 128,
    whose rows of 2I then read stride 1) decides nothing."""
    rank = len(out_shape)
    if rank < 2 or m.bit_level:
        return None
    candidates, seen = set(range(rank - 1)), dict.fromkeys(range(rank - 1), 0)
    for dims in instances:
        strides = _strides(m, in_shape, out_shape, dims)
        last, last_ok = strides[-1]
        candidates = {k for k in candidates if bool(((strides[k][0] == 1) | ~strides[k][1]).all())}
        if bool(((last == 1) & last_ok).any()):
            if any(bool(strides[k][1].any()) for k in candidates):
                return None
            continue  # no step along any candidate here (each one element): the instance tells nothing
        for k in candidates:  # an instance counts where both axes step between elements read (H = 1: no row)
            seen[k] += bool(strides[k][1].any()) and bool(last_ok.any())
    candidates = {k for k in candidates if seen[k] >= 2}
    return max(candidates) if candidates else None
