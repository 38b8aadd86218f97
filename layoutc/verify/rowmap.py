"""The logical view of a tensor: where each row (and K column) comes from, and what it is called.

This is the verifier's public face, used by it, the probe, ``explain``, ``diff``, ``draw`` and the
numerics example:

* a tensor's chain splits into a *logical* prefix (steps no family packs, that keep the tensor's
  axes: swaps, interleaves, padding, slices, casts) and the rest (reshapes, kernel packings).
  :func:`logical_prefix` chooses it from what the steps declare (their facts and packing tags);
  with ``rows=True`` it also takes the packing steps that only move whole rows (an epilogue
  shuffle), whose row order tied tensors must share too;
* :class:`AxisMap` -- the prefix's map reduced to one function of the row axis and one of the K
  axis, on concrete dims: from the index maps (:func:`axis_map`) or from any gather given as
  source indices (:func:`reduce_to_axes`, what the probe measures);
* :func:`row_labels` / :func:`describe_labels` -- a declared row order (``[w1; w3]``,
  ``interleave(w3, w1, group=64)``) as labels of rows, and back to words;
* :func:`declared_rows` -- a tensor's declared row order, inherited through its tie.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import torch

from ..algebra import expr as ex
from ..front.ast import Pos
from ..lang.compiler import Chain, Step
from ..algebra.indexmap import compose_all, concrete_shape, source_indices
from ..lang.ir import Program, RowLayout, TensorSpec
from ..lang.ops.base import Category


@attrs.frozen
class AxisMap:
    """Where each logical output row (and K column) of a tensor comes from, on concrete dims.

    ``rows[r]`` is the source row of output row ``r`` (-1: padding); ``cols`` likewise
    along K, in K *elements* for weights (bytes x 2 for packed FP4) and in blocks for scales.
    """

    rows: tuple[int, ...]
    cols: tuple[int, ...] | None
    consistent: bool  # the map moves whole rows and whole columns, within each expert


def row_axis(spec: TensorSpec, rank: int | None = None) -> int:
    """The row axis: the last of a bias ``[E, rows]``, the one before last of a weight or scale ``[E, rows, K]``,
    the last of a K-major one ``[E, K, rows]``."""
    rank = len(spec.shape) if rank is None else rank
    return rank - 1 if spec.role == "bias" or spec.k_major else rank - 2


def k_axis(spec: TensorSpec, rank: int | None = None) -> int:
    """The K axis of a weight or scale: the last, or the one before it for a K-major one ``[E, K, rows]``."""
    rank = len(spec.shape) if rank is None else rank
    return rank - 2 if spec.k_major else rank - 1


def _moves_rows_only(step: Step, row: int) -> bool:
    """A step that permutes the rows and nothing else: it acts along the row axis alone (its facts)
    and keeps the shape (no padding or slicing)."""
    return (step.op.facts.on_axis and step.op.axis(step.in_type) == row
            and step.in_type.shape == step.out_type.shape)


def logical_prefix(chain: Chain, rows: bool = False) -> list[Step]:
    """The leading steps that make the tensor's logical view; with ``rows``, continued through packing
    steps that only move whole rows."""
    out: list[Step] = []
    row = row_axis(chain.source)
    for s in chain.steps:
        if s.tag is None and s.op.category in (Category.LOGICAL, Category.VALUE) and not s.op.facts.bits:
            out.append(s)
        elif rows and s.tag is not None and (_moves_rows_only(s, row) or s.op.category is Category.VALUE):
            out.append(s)
        else:
            break
    return out


def prefix_length(chain: Chain, rows: bool = False) -> int:
    return len(logical_prefix(chain, rows))


def static_sources(chain: Chain, dims: dict, upto: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """(source linear index, valid) over the output of the first ``upto`` steps, from the index maps."""
    steps = chain.steps[:upto]
    if not steps:
        shape = concrete_shape(chain.source.shape, dims)
        n = 1
        for v in shape:
            n *= v
        return torch.arange(n).reshape(shape), torch.ones(shape, dtype=torch.bool), shape
    m = compose_all([s.op.index_map(s.in_type) for s in steps])
    linear, valid, _ = source_indices(m, dims)
    return linear, valid, concrete_shape(m.out_shape, dims)


#: Chains longer than this are evaluated step by step, not composed into one symbolic map first.
STEPWISE_AFTER = 8


def _spread(n: int, full: bool) -> torch.Tensor:
    """All of ``range(n)``, or a few positions spread over it (ends, middle, a stride)."""
    if full or n <= 12:
        return torch.arange(n)
    picks = {0, 1, n // 3, n // 2, n - 2, n - 1} | set(range(0, n, max(1, n // 5)))
    return torch.tensor(sorted(picks))


def axis_map(chain: Chain, dims: dict, rows: bool = False) -> AxisMap:
    """The logical prefix of ``chain`` evaluated on ``dims`` from its index maps.

    Evaluated on cross-sections rather than the whole domain: every row against a spread of columns
    and experts (the row function), and every column against a spread of rows (the K function);
    both also check that other axes stay where they are."""
    steps = logical_prefix(chain, rows)
    spec = chain.source
    in_shape = concrete_shape(spec.shape, dims)
    rank = len(in_shape)
    ra = row_axis(spec, rank)
    has_k = spec.role != "bias"
    if not steps:
        cols = tuple(range(in_shape[k_axis(spec, rank)])) if has_k else None
        return AxisMap(tuple(range(in_shape[ra])), _elements(spec, cols) if has_k else None, True)
    maps = [s.op.index_map(s.in_type) for s in steps]
    # A long chain is evaluated map by map on the picked coordinates: composed symbolically, its
    # expressions grow with every step that uses a coordinate twice (64 row interleaves never finish).
    stepwise = len(maps) > STEPWISE_AFTER
    m = maps[-1] if stepwise else compose_all(maps)
    out_shape = concrete_shape(m.out_shape, dims)
    if len(out_shape) != rank:
        return AxisMap((), None, False)

    def section(full_axis: int):
        picks = [_spread(n, a == full_axis) for a, n in enumerate(out_shape)]
        shape = tuple(len(i) for i in picks)
        coords = []
        for a, idx in enumerate(picks):
            view = [1] * rank
            view[a] = len(idx)
            coords.append(idx.view(view).expand(shape))
        valid = torch.ones(shape, dtype=torch.bool)
        for one in (reversed(maps) if stepwise else [m]):
            env = dict(dims)
            env.update({f"o{a}": torch.where(valid, c, torch.zeros_like(c)) for a, c in enumerate(coords)})
            valid = valid & torch.as_tensor(ex.evaluate(one.valid, env)).to(torch.bool).expand(shape)
            coords = [torch.as_tensor(ex.evaluate(e, env)).expand(shape) for e in one.src]
        return picks, valid, coords

    def function_of(axis: int):
        picks, valid, coords = section(axis)
        ok = all(bool(torch.all(~valid | (coords[a] == picks[a].view([-1 if b == a else 1 for b in range(rank)]))))
                 for a in range(rank) if a not in special)
        src = torch.where(valid, coords[axis], -1).movedim(axis, 0).contiguous()
        src = src.reshape(src.shape[0], -1)
        value = src.amax(dim=1)
        ok &= bool(torch.all((src == value[:, None]) | (src == -1)))
        return tuple(value.tolist()), ok

    ka = k_axis(spec, rank)
    special = {ra, ka} if has_k else {ra}
    row_fn, ok_rows = function_of(ra)
    cols, ok_cols = None, True
    if has_k:
        raw, ok_cols = function_of(ka)
        cols = _elements(spec, raw)
    return AxisMap(row_fn, cols, ok_rows and ok_cols)


def reduce_to_axes(spec: TensorSpec, dims: dict, linear: torch.Tensor, valid: torch.Tensor,
                   out_shape: tuple[int, ...]) -> AxisMap:
    """Row and K functions of a gather given as (source linear index, valid) per output element."""
    in_shape = concrete_shape(spec.shape, dims)
    rank = len(in_shape)
    ra = row_axis(spec, rank)
    has_k = spec.role != "bias"
    if len(out_shape) != rank:
        return AxisMap((), None, False)
    coords, rem = [], linear
    for size in reversed(in_shape):
        coords.append(rem % size)
        rem = rem // size
    coords.reverse()
    grids = torch.meshgrid(*[torch.arange(n) for n in out_shape], indexing="ij")
    ka = k_axis(spec, rank)
    special = {ra, ka} if has_k else {ra}
    consistent = all(bool(torch.all(~valid | (coords[a] == grids[a]))) for a in range(rank) if a not in special)

    def function_of(axis: int) -> tuple[tuple[int, ...], bool]:
        src = torch.where(valid, coords[axis], torch.full_like(linear, -1)).movedim(axis, 0)
        src = src.reshape(out_shape[axis], -1)
        src = src.contiguous()
        value = src.amax(dim=1) if src.shape[1] else torch.full((out_shape[axis],), -1)
        ok = bool(torch.all((src == value[:, None]) | (src == -1)))
        return tuple(value.tolist()), ok

    row_fn, ok_rows = function_of(ra)
    cols = None
    ok_cols = True
    if has_k:
        raw, ok_cols = function_of(ka)
        cols = _elements(spec, raw)
    return AxisMap(row_fn, cols, consistent and ok_rows and ok_cols)


def _elements(spec: TensorSpec, cols: tuple[int, ...]) -> tuple[int, ...]:
    """K columns in values: a packed element j holds values n*j .. n*j + n-1 (fp4x2: n = 2)."""
    n = spec.elem.values
    if n == 1:
        return cols
    out = []
    for c in cols:
        out += [-1] * n if c < 0 else [n * c + i for i in range(n)]
    return tuple(out)


def n_rows(spec: TensorSpec, dims) -> int:
    return int(ex.evaluate(spec.shape[row_axis(spec)], dims))


# ---------------------------------------------------------------------------
# row labels: the declared logical order


def declared_rows(program: Program, spec: TensorSpec | None, side: str) -> RowLayout | None:
    """A tensor's row layout on ``side`` ("input" or "output"), inherited from its tied weight when
    it declares none (scales and biases share their weight's rows)."""
    if spec is None:
        return None
    if side == "output":
        # An output may be declared once per size branch: ``spec`` is the declaration of one branch, and a
        # tied tensor inherits the rows its weight declares in that same branch (not the first declaration).
        if spec.rows is not None:
            return spec.rows
        tie = program.input(spec.name).tie if any(t.name == spec.name for t in program.inputs) else None
        if tie is None:
            return None
        weight = (program.output_for(tie.weight, frozenset(g.key for g in spec.guards if g.present))
                  or next((o for o in program.outputs if o.name == tie.weight), None))
        return weight.rows if weight is not None else None
    table = {t.name: t for t in program.inputs}
    own = table.get(spec.name)
    if own is not None and own.rows is not None:
        return own.rows
    tie = own.tie if own is not None else None
    if tie is not None and tie.weight in table:
        return table[tie.weight].rows
    return None


def row_labels(layout: RowLayout, n_rows: int, shard_size: int | None = None) -> list[tuple[str, int] | None]:
    """Label of each row: (shard name, index within the shard), or None for padding.

    ``shard_size`` is the number of real rows per shard (rows past it are padding)."""
    n = len(layout.shards)
    per = n_rows // n if n else n_rows
    real = per if shard_size is None else shard_size
    out: list[tuple[str, int] | None] = []
    for r in range(n_rows):
        if layout.kind == "stacked":
            shard, idx = r // per, r % per
        else:
            g = layout.group
            block, within = r // (n * g), r % (n * g)
            shard, idx = within // g, block * g + within % g
        out.append((layout.shards[shard], idx) if shard < n and idx < real else None)
    return out


def describe_labels(labels: Sequence[tuple[str, int] | None], shards: Sequence[str]) -> str:
    """``[w3; w1]`` / ``interleave(w3, w1, group=64)`` / ``[w3; w1] then 32 padding rows`` /
    an explicit start of the order."""
    labels = list(labels)
    count = len(labels)
    real = max((lab[1] + 1 for lab in labels if lab is not None), default=0)
    for names in _orderings(shards):
        per_shard_pad = real * len(names) < count
        candidates = [("stacked", 1)] + ([] if per_shard_pad else [("interleaved", g) for g in _groups(count, len(names))])
        for kind, group in candidates:
            layout = RowLayout(kind, tuple(names), group, Pos(0, 0, 0, 0))
            if row_labels(layout, count, real) == labels:
                return str(layout) + (" with each shard padded" if per_shard_pad else "")
    tail = len(labels) - len(list(_rstrip_none(labels)))
    if 0 < tail < count:
        head = describe_labels(labels[: count - tail], shards)
        if not head.startswith("the order"):
            return f"{head} then {tail} padding rows at the end"
    shown = ", ".join("pad" if lab is None else f"{lab[0]}[{lab[1]}]" for lab in labels[:6])
    return f"the order {shown}, ..."


def _rstrip_none(labels: list) -> list:
    out = list(labels)
    while out and out[-1] is None:
        out.pop()
    return out


def _orderings(shards: Sequence[str]) -> list[list[str]]:
    names = list(dict.fromkeys(shards))
    if len(names) == 2:
        return [names, names[::-1]]
    return [names]


def _groups(count: int, n_shards: int) -> list[int]:
    out, g = [], 1
    while g * n_shards <= count:
        if count % (g * n_shards) == 0:
            out.append(g)
        g *= 2
    return out
