"""The static verifier: tied tensors stay in sync, outputs meet the kernel contract.

Every real layout bug in DESIGN.md section 1 produced wrong numbers with no error.
They all break one of a few checkable equations, which this module checks on every
variant of a spec (each set of present optional tensors) before it compiles.

**Logical vs physical.** A tensor's chain is split into *logical* ops (which row of
the kernel's logical view is where: gate/up swaps, interleaves, per-half padding)
and *physical* packings owned by a kernel family (SM90 interleave, 128x4 swizzle,
epilogue shuffles) plus reshapes and casts. Logical ops must come first; then the
logical part is one index map per tensor.

**Sync along ties.** A scale tensor shares its weight's rows and covers ``block``
weight elements along K; a bias shares its weight's output rows. On concrete
instances of the dims (small values that satisfy every divisibility rule), the
logical row maps of a weight, its scales and its bias must be the same function,
and K moves of the weight must be matched by its scales block for block. Tied
tensors must carry the packings their kernel family puts on each role (an SM90
interleaved weight with scales not folded for it was vLLM bug 46585).

**Contract.** With the row order the checkpoint declares (``rows [w1; w3]``) the
logical map determines the order the kernel receives; it must be the declared one
(``rows [w3; w1]``, padding at the end of each shard).

Every finding names the tensors and points at the statements involved; all
findings are reported together.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import attrs
import torch

from . import expr as ex
from .ast import Pos
from .compiler import Chain, Compiled, Step, Variant
from .instances import sample_dims
from .errors import Diagnostic
from .indexmap import compose_all, concrete_shape, source_indices
from .ir import Program, RowLayout, TensorSpec
from .ops.base import Category

#: Which tensor roles a kernel family packs. A family on one tensor of a tie group must be
#: on every tensor of these roles in the group, and on no tensor of another role.
FAMILY_ROLES = {
    "sm90_mixed": {"weight", "scale"},
    "trtllm": {"weight", "scale", "bias"},
    "sf_128x4": {"scale"},
}
#: Packings that only move whole rows (their row permutation must match across a tie group).
ROW_PACKINGS = {"shuffle_rows", "unshuffle_rows"}
#: Logical ops that need two shards (gate and up) on their axis.
TWO_SHARD_OPS = {"swap_halves", "interleave_rows", "deinterleave", "reorder_gated_rows", "swap_pairs"}


# ---------------------------------------------------------------------------
# row maps on concrete dims


@attrs.frozen
class AxisMap:
    """Where each logical output row (and K column) of a tensor comes from, on concrete dims.

    ``rows[r]`` is the source row of output row ``r`` (-1: padding); ``cols`` likewise
    along K, in K *elements* for weights (bytes x 2 for packed FP4) and in blocks for scales.
    """

    rows: tuple[int, ...]
    cols: tuple[int, ...] | None
    consistent: bool  # the map moves whole rows and whole columns, within each expert


def _row_axis(spec: TensorSpec, rank: int) -> int:
    return rank - 1 if spec.role == "bias" else rank - 2


def _prefix(chain: Chain, with_row_packings: bool) -> list[Step]:
    out = []
    for s in chain.steps:
        if s.op.category is Category.LOGICAL or s.op.category is Category.VALUE:
            out.append(s)
        elif with_row_packings and s.op.name in ROW_PACKINGS:
            out.append(s)
        else:
            break
    return out


def prefix_length(chain: Chain, with_row_packings: bool = False) -> int:
    return len(_prefix(chain, with_row_packings))


def static_sources(chain: Chain, dims: dict, upto: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]] | None:
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


def _spread(n: int, full: bool) -> torch.Tensor:
    """All of ``range(n)``, or a few positions spread over it (ends, middle, a stride)."""
    if full or n <= 12:
        return torch.arange(n)
    picks = {0, 1, n // 3, n // 2, n - 2, n - 1} | set(range(0, n, max(1, n // 5)))
    return torch.tensor(sorted(picks))


def axis_map(chain: Chain, dims: dict, with_row_packings: bool = False) -> AxisMap:
    """The logical part of ``chain`` evaluated on ``dims`` from its index maps.

    Evaluated twice on cross-sections rather than the whole domain: every row against a
    spread of columns and experts (the row function), and every column against a spread
    of rows (the K function); both also check that other axes stay where they are."""
    steps = chain.steps[: prefix_length(chain, with_row_packings)]
    spec = chain.source
    in_shape = concrete_shape(spec.shape, dims)
    rank = len(in_shape)
    ra = _row_axis(spec, rank)
    has_k = spec.role != "bias"
    if not steps:
        cols = tuple(range(in_shape[-1])) if has_k else None
        return AxisMap(tuple(range(in_shape[ra])), _elements(spec, cols) if has_k else None, True)
    m = compose_all([s.op.index_map(s.in_type) for s in steps])
    out_shape = concrete_shape(m.out_shape, dims)
    if len(out_shape) != rank:
        return AxisMap((), None, False)

    def section(full_axis: int):
        picks = [_spread(n, a == full_axis) for a, n in enumerate(out_shape)]
        env = dict(dims)
        for a, idx in enumerate(picks):
            view = [1] * rank
            view[a] = len(idx)
            env[f"o{a}"] = idx.view(view)
        shape = tuple(len(i) for i in picks)
        valid = torch.as_tensor(ex.evaluate(m.valid, env)).to(torch.bool).expand(shape)
        coords = [torch.as_tensor(ex.evaluate(e, env)).expand(shape) for e in m.src]
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

    special = {ra, rank - 1} if has_k else {ra}
    rows, ok_rows = function_of(ra)
    cols, ok_cols = None, True
    if has_k:
        raw, ok_cols = function_of(rank - 1)
        cols = _elements(spec, raw)
    return AxisMap(rows, cols, ok_rows and ok_cols)


def reduce_to_axes(spec: TensorSpec, dims: dict, linear: torch.Tensor, valid: torch.Tensor,
                   out_shape: tuple[int, ...]) -> AxisMap:
    """Row and K functions of a gather given as (source linear index, valid) per output element."""
    in_shape = concrete_shape(spec.shape, dims)
    rank = len(in_shape)
    ra = _row_axis(spec, rank)
    has_k = spec.role != "bias"
    if len(out_shape) != rank:
        return AxisMap((), None, False)
    coords, rem = [], linear
    for size in reversed(in_shape):
        coords.append(rem % size)
        rem = rem // size
    coords.reverse()
    grids = torch.meshgrid(*[torch.arange(n) for n in out_shape], indexing="ij")
    special = {ra, rank - 1} if has_k else {ra}
    consistent = all(bool(torch.all(~valid | (coords[a] == grids[a]))) for a in range(rank) if a not in special)

    def function_of(axis: int) -> tuple[tuple[int, ...], bool]:
        src = torch.where(valid, coords[axis], torch.full_like(linear, -1)).movedim(axis, 0)
        src = src.reshape(out_shape[axis], -1)
        src = src.contiguous()
        value = src.amax(dim=1) if src.shape[1] else torch.full((out_shape[axis],), -1)
        ok = bool(torch.all((src == value[:, None]) | (src == -1)))
        return tuple(value.tolist()), ok

    rows, ok_rows = function_of(ra)
    cols = None
    ok_cols = True
    if has_k:
        raw, ok_cols = function_of(rank - 1)
        cols = _elements(spec, raw)
    return AxisMap(rows, cols, consistent and ok_rows and ok_cols)


def _elements(spec: TensorSpec, cols: tuple[int, ...]) -> tuple[int, ...]:
    """K columns in elements: a packed fp4x2 byte holds elements 2j and 2j+1."""
    if spec.elem.name != "fp4x2":
        return cols
    out = []
    for c in cols:
        out += [-1, -1] if c < 0 else [2 * c, 2 * c + 1]
    return tuple(out)


# ---------------------------------------------------------------------------
# row labels: the declared logical order


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
    n_rows = len(labels)
    real = max((lab[1] + 1 for lab in labels if lab is not None), default=0)
    for names in _orderings(shards):
        per_shard_pad = real * len(names) < n_rows
        candidates = [("stacked", 1)] + ([] if per_shard_pad else [("interleaved", g) for g in _groups(n_rows, len(names))])
        for kind, group in candidates:
            layout = RowLayout(kind, tuple(names), group, Pos(0, 0, 0, 0))
            if row_labels(layout, n_rows, real) == labels:
                return str(layout) + (" with each shard padded" if per_shard_pad else "")
    tail = len(labels) - len(list(_rstrip_none(labels)))
    if 0 < tail < n_rows:
        head = describe_labels(labels[: n_rows - tail], shards)
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


def _groups(n_rows: int, n_shards: int) -> list[int]:
    out, g = [], 1
    while g * n_shards <= n_rows:
        if n_rows % (g * n_shards) == 0:
            out.append(g)
        g *= 2
    return out


# ---------------------------------------------------------------------------


class _Verifier:
    def __init__(self, compiled: Compiled):
        self.compiled = compiled
        self.program: Program = compiled.program
        self.diags: list[Diagnostic] = []

    def axis(self, chain: Chain, dims: dict, with_row_packings: bool = False) -> AxisMap:
        """Where the verdict's maps come from: the index maps (static), or a probe run (dynamic)."""
        return axis_map(chain, dims, with_row_packings)

    def error(self, message: str, pos: Pos | None, tensors: Iterable[str], hint: str | None = None,
              related: Iterable[tuple[str, Pos]] = ()) -> None:
        d = Diagnostic("error", message, pos, hint, tuple(tensors), tuple(related))
        if not any(x.message == d.message and x.pos == d.pos for x in self.diags):
            self.diags.append(d)

    # -- helpers --
    def declared_rows(self, spec: TensorSpec, side: str) -> RowLayout | None:
        """A tensor's row layout, inherited from its tied weight when it declares none."""
        table = {t.name: t for t in (self.program.inputs if side == "input" else self.program.outputs)}
        own = table.get(spec.name)
        if own is not None and own.rows is not None:
            return own.rows
        tie = self.program.input(spec.name).tie if any(t.name == spec.name for t in self.program.inputs) else None
        if tie is not None and tie.weight in table:
            return table[tie.weight].rows
        return None

    def groups(self, variant: Variant) -> list[tuple[Chain, list[Chain]]]:
        """(weight chain, tied chains) for every weight with scales or a bias in this variant."""
        by_name = {c.tensor: c for c in variant.chains}
        out = []
        for c in variant.chains:
            tied = [d for d in variant.chains if d.source.tie is not None and d.source.tie.weight == c.tensor]
            if tied:
                out.append((by_name[c.tensor], tied))
        return out

    # -- checks --
    def check_ties_declared(self) -> None:
        inputs = {t.name: t for t in self.program.inputs}
        samples = sample_dims(self.program.dims, [(ex.Var(a.dim), a.multiple) for a in self.program.assumptions]
                              + [(n, int(d.value)) for t in self.program.inputs for n, d, _ in t.divisions
                                 if isinstance(d, ex.Const)])
        for t in self.program.inputs:
            if t.tie is None or t.tie.weight not in inputs:
                continue
            w = inputs[t.tie.weight]
            wr, tr = w.shape[_row_axis(w, len(w.shape))], t.shape[_row_axis(t, len(t.shape))]
            rb = t.tie.row_block
            if rb > 1 and not _agree(ex.mul(tr, rb), wr, samples):
                self.error(f"{t.name} has {ex.to_str(tr)} rows of {rb}-row scale blocks, but its weight {w.name} "
                           f"has {ex.to_str(wr)} rows, which is {ex.to_str(ex.div(wr, rb))} blocks",
                           t.tie.pos, [t.name, w.name])
            elif rb == 1 and not _agree(wr, tr, samples):
                self.error(f"{t.name} has {ex.to_str(tr)} rows but its weight {w.name} has {ex.to_str(wr)}; "
                           f"{'scales' if t.role == 'scale' else 'a bias'} must share the weight's rows",
                           t.pos, [t.name, w.name])
            if t.role == "scale":
                k = ex.mul(w.shape[-1], 2) if w.elem.name == "fp4x2" else w.shape[-1]
                if not _agree(ex.mul(t.shape[-1], t.tie.block), k, samples):
                    self.error(
                        f"{t.name} has {ex.to_str(t.shape[-1])} scale columns, but {w.name} has "
                        f"{ex.to_str(k)} K elements, which in blocks of {t.tie.block} is {ex.to_str(ex.div(k, t.tie.block))}",
                        t.tie.pos, [t.name, w.name],
                    )

    def check_order(self, chain: Chain) -> None:
        ra = _row_axis(chain.source, len(chain.source.shape))
        for s in chain.steps:
            if s.op.category is Category.SHAPE:
                break  # axes renumbered from here on
            if s.op.name in ROW_PACKINGS and s.op.dim != ra:
                self.error(
                    f"{chain.tensor}: {s.statement.text} shuffles axis {s.op.dim}, but the kernel's epilogue shuffle "
                    f"moves rows (axis {ra} of {chain.tensor})",
                    s.statement.pos if s.statement else None, [chain.tensor], f"use dim={ra}",
                )
        seen_physical: Step | None = None
        for s in chain.steps:
            if s.op.category in (Category.PACKING, Category.SHAPE):
                seen_physical = seen_physical or s
            elif s.op.category is Category.LOGICAL and seen_physical is not None:
                self.error(
                    f"{chain.tensor}: {s.statement.text} changes the logical rows after the physical "
                    f"{seen_physical.op.name} packing; logical transforms (swaps, interleaves, padding) come first",
                    s.statement.pos if s.statement else None, [chain.tensor],
                    "move it before the packing (e.g. pad per half before the scale swizzle)",
                    [(f"{seen_physical.op.name} is applied here", seen_physical.statement.pos)]
                    if seen_physical.statement else (),
                )
                return

    def check_shards(self, chain: Chain) -> None:
        layout = self.declared_rows(chain.source, "input")
        if layout is None:
            return
        rank = len(chain.source.shape)
        ra = _row_axis(chain.source, rank)
        n = len(layout.shards)
        for s in chain.steps:
            on_rows = getattr(s.op, "dim", None) == ra
            if n == 1 and on_rows and s.op.name in TWO_SHARD_OPS:
                self.error(
                    f"{chain.tensor} has a single shard (rows {layout}), but {s.statement.text} treats its rows as "
                    f"two (gate and up); a non-gated activation keeps its one w13 shard as it is",
                    s.statement.pos if s.statement else None, [chain.tensor],
                    "guard the gate/up transforms with the activation, e.g. 'if activation != relu2 { ... }'",
                )
            if s.op.name == "shard" and on_rows and layout.kind == "stacked" and s.op.parts != n:
                self.error(
                    f"{chain.tensor} rows are {layout} ({n} shard{'s' if n > 1 else ''}), but {s.statement.text} "
                    f"slices them as {s.op.parts} part{'s' if s.op.parts > 1 else ''}; tensor parallelism takes "
                    f"rank r's slice of each shard (gate and up separately)",
                    s.statement.pos if s.statement else None, [chain.tensor], f"use shard(..., parts={n})",
                )

    def check_families(self, weight: Chain, tied: list[Chain]) -> None:
        group = [weight] + tied
        for fam, roles in FAMILY_ROLES.items():
            carriers = [c for c in group if fam in _families(c)]
            if not carriers:
                continue
            for c in group:
                has = fam in _families(c)
                if fam == "trtllm" and _row_blocked(c) and not has:
                    continue  # row shuffles stay inside a block-scale row (check_sync proves it)
                if c.source.role in roles and not has:
                    first = carriers[0]
                    step = next(s for s in first.steps if s.op.family == fam)
                    self.error(
                        f"{first.tensor} is packed for {fam} ({step.op.name}) but its tied {c.tensor} is not; "
                        f"the kernel reads both in the {fam} layout",
                        step.statement.pos if step.statement else None, [first.tensor, c.tensor],
                        f"add interleave({c.tensor}, {fam})" if fam in ("sm90_mixed", "sf_128x4")
                        else f"apply the same {fam} packing to {c.tensor}",
                    )
                elif c.source.role not in roles and has:
                    step = next(s for s in c.steps if s.op.family == fam)
                    self.error(
                        f"{c.tensor} is a {c.source.role}, which the {fam} family does not pack ({step.op.name})",
                        step.statement.pos if step.statement else None, [c.tensor],
                    )

    def check_sync(self, weight: Chain, tied: list[Chain], samples: list[dict]) -> None:
        before = len(self.diags)
        row_packed = any(s.op.name in ROW_PACKINGS for c in [weight] + tied for s in c.steps)
        for dims in samples:
            for with_packing in (False, True) if row_packed else (False,):
                wmap = self.axis(weight, dims, with_packing)
                if not self.followable(weight, wmap):
                    return
                for c in tied:
                    cmap = self.axis(c, dims, with_packing)
                    if not self.followable(c, cmap):
                        return
                    rows = _row_blocks(wmap.rows, c.source.tie.row_block) if _row_blocked(c) else wmap.rows
                    if rows is None:
                        self.report_split_blocks(weight, c, wmap, dims)
                    elif rows != cmap.rows:
                        self.report_row_desync(weight, c, attrs.evolve(wmap, rows=rows), cmap, with_packing, dims)
                    elif c.source.role == "scale" and wmap.cols is not None and cmap.cols is not None:
                        block = c.source.tie.block
                        expected = _blocks(wmap.cols, block)
                        if expected is None or expected != cmap.cols:
                            self.report_col_desync(weight, c, dims)
                if len(self.diags) > before:
                    return

    def followable(self, chain: Chain, amap: AxisMap) -> bool:
        """Logical transforms move whole rows and whole K columns within each expert; anything else
        (moving data across experts, or rows differently per column) is not a layout we can vouch for."""
        if amap.consistent:
            return True
        steps = [s for s in chain.steps if s.op.category is Category.LOGICAL]
        pos = steps[0].statement.pos if steps and steps[0].statement else chain.source.pos
        self.error(
            f"{chain.tensor}: the logical transforms move data across experts (or move rows differently "
            f"per column), which no MoE kernel layout does",
            pos, [chain.tensor], "check the dim= of the transforms: rows are dim 1 of [E, rows, K]",
        )
        return False

    def report_row_desync(self, w: Chain, c: Chain, wmap: AxisMap, cmap: AxisMap, packing: bool, dims) -> None:
        layout = self.declared_rows(w.source, "input")
        what = "rows (after the epilogue row shuffles)" if packing else "rows"
        n_w, n_c = _n_rows(w.source, dims), _n_rows(c.source, dims)
        labelled = (layout is not None and len(wmap.rows) == len(cmap.rows) and not _row_blocked(c) and n_w == n_c
                    and max(wmap.rows + cmap.rows, default=-1) < n_w)  # a mistyped tie can make them differ
        if labelled:
            labels = row_labels(layout, n_w)
            shards = layout.shards
            wl = [labels[r] if r >= 0 else None for r in wmap.rows]
            cl = [labels[r] if r >= 0 else None for r in cmap.rows]
            detail = f"{w.tensor} {what} are {describe_labels(wl, shards)} but {c.tensor} {what} are {describe_labels(cl, shards)}"
        else:
            first = next((i for i, (a, b) in enumerate(zip(wmap.rows, cmap.rows)) if a != b), None)
            at = f"; output row {first} reads row {wmap.rows[first]} of {w.tensor} but row {cmap.rows[first]} of {c.tensor}" if first is not None else ""
            detail = f"{w.tensor} and {c.tensor} {what} are permuted differently{at}"
        wsteps = _row_steps(w, packing)
        csteps = _row_steps(c, packing)
        only_w = [s for s in wsteps if not any(t.statement is s.statement and repr(t.op) == repr(s.op) for t in csteps)]
        only_c = [s for s in csteps if not any(t.statement is s.statement and repr(t.op) == repr(s.op) for t in wsteps)]
        culprit = (only_w or only_c or wsteps or csteps or [None])[0]
        pos = culprit.statement.pos if culprit is not None and culprit.statement else (c.source.pos)
        hint = None
        if only_w and not only_c and only_w[0].statement is not None:
            hint = f"apply {only_w[0].statement.op} to {c.tensor} too, e.g. {only_w[0].statement.op}([{w.tensor}, {c.tensor}], ...)"
        elif only_c and not only_w and only_c[0].statement is not None:
            hint = f"{c.tensor} gets {only_c[0].statement.op} but {w.tensor} does not"
        related = [(f"{s.op.name} on {c.tensor} only" if s in only_c else f"{s.op.name} on {w.tensor} only", s.statement.pos)
                   for s in (only_w + only_c)[1:4] if s.statement]
        self.error(f"{detail}: a {c.source.role} must follow its weight's rows", pos, [w.tensor, c.tensor], hint, related)

    def report_split_blocks(self, w: Chain, c: Chain, wmap: AxisMap, dims) -> None:
        rb = c.source.tie.row_block
        bad = next((j for j in range(len(wmap.rows) // rb)
                    if len({r // rb for r in wmap.rows[j * rb:(j + 1) * rb] if r >= 0}) > 1), None)
        steps = [s for s in w.steps if s.op.category is not Category.VALUE and s.statement]
        at = ", ".join(f"{k}={v}" for k, v in dims.items())
        if bad is None:  # the transforms leave a number of rows that is not a whole number of blocks
            where = f"they leave {len(wmap.rows)} rows (with {at}), not a whole number of blocks"
        else:
            sources = sorted({r // rb for r in wmap.rows[bad * rb:(bad + 1) * rb] if r >= 0})
            where = f"output rows {bad * rb}..{bad * rb + rb - 1} come from source blocks {sources} (with {at})"
        self.error(
            f"{w.tensor}: each row of {c.tensor} scales {rb} rows of {w.tensor}, but the transforms split those "
            f"blocks: {where}; no row of block scales can follow that",
            steps[0].statement.pos if steps else w.source.pos, [w.tensor, c.tensor],
            f"row transforms on {w.tensor} must keep {rb}-row blocks whole (e.g. halves of a multiple of {rb} rows)",
        )

    def report_col_desync(self, w: Chain, c: Chain, dims) -> None:
        k_steps = [s for s in w.steps + c.steps if s.op.category is Category.LOGICAL
                   and getattr(s.op, "dim", None) == len(s.in_type.shape) - 1]
        pos = k_steps[0].statement.pos if k_steps and k_steps[0].statement else c.source.pos
        self.error(
            f"{w.tensor} and its scales {c.tensor} move K differently: each scale column must keep covering "
            f"the same {c.source.tie.block} elements of {w.tensor}",
            pos, [w.tensor, c.tensor], "apply K-axis transforms to the scales at block granularity",
        )

    def check_contract(self, chain: Chain, samples: list[dict]) -> None:
        src_layout = self.declared_rows(chain.source, "input")
        dst_layout = self.declared_rows(chain.target, "output") if chain.target is not None else None
        if dst_layout is None:
            return
        if src_layout is None:
            self.error(f"{chain.tensor}: the output declares rows {dst_layout} but the input declares no row order",
                       chain.target.rows.pos if chain.target.rows else chain.target.pos, [chain.tensor],
                       f"declare the checkpoint order, e.g. input {chain.tensor} : ... rows [...]")
            return
        for dims in samples[:2]:
            amap = self.axis(chain, dims)
            if not self.followable(chain, amap):
                return
            n_in = _n_rows(chain.source, dims)
            src = row_labels(src_layout, n_in)
            actual = [src[r] if r >= 0 else None for r in amap.rows]
            if any(s.op.name == "shard" for s in chain.steps):
                actual = _rebased(actual)
            ra = _row_axis(chain.source, len(chain.source.shape))
            ranks = math.prod(s.op.ranks for s in chain.steps if s.op.name == "shard" and s.op.dim == ra)
            shard_real = n_in // max(1, len(src_layout.shards)) // ranks
            expected = row_labels(dst_layout, len(amap.rows), shard_real if len(dst_layout.shards) == len(src_layout.shards) else None)
            if actual != expected:
                steps = [s for s in chain.steps if s.op.category is Category.LOGICAL]
                pos = steps[-1].statement.pos if steps and steps[-1].statement else chain.target.pos
                hint = self.contract_hint(chain, src_layout, dst_layout, actual)
                self.error(
                    f"{chain.tensor}: the kernel expects rows {dst_layout}, but the transforms give "
                    f"{describe_labels(actual, src_layout.shards)} (from the checkpoint's {src_layout})",
                    pos, [chain.tensor], hint,
                    [("the output declares the kernel's order here", (chain.target.rows.pos if chain.target.rows else chain.target.pos))],
                )
                return

    def contract_hint(self, chain: Chain, src: RowLayout, dst: RowLayout, actual) -> str | None:
        names = [s.op.name for s in chain.steps if s.op.category is Category.LOGICAL]
        if src.kind == "interleaved" and "swap_halves" in names and "deinterleave" not in names:
            return ("the checkpoint rows are interleaved (gpt-oss); swap_halves swaps the first and second half of "
                    "an interleaved order. Use deinterleave then swap_halves, or swap_pairs for an interleaved output")
        if names.count("swap_halves") >= 2:
            return "swap_halves is applied twice, which undoes the swap"
        if any(lab is None for lab in actual) and any(s.op.name == "pad" and s.op.parts == 1 for s in chain.steps):
            return "gated w13 is padded per half: pad(..., parts=2) pads each shard, parts=1 pads only the end"
        return None

    # -- run --
    def samples(self, variant: Variant) -> list[dict]:
        return verification_dims(self.program, variant)

    def variants(self) -> Sequence[Variant]:
        return self.compiled.variants

    def run(self) -> list[Diagnostic]:
        self.check_ties_declared()
        for variant in self.variants():
            before = len(self.diags)
            samples = self.samples(variant)
            for c in variant.chains:
                self.check_order(c)
                self.check_shards(c)
            if len(self.diags) > before:
                continue  # the maps below would only repeat these findings
            for weight, tied in self.groups(variant):
                self.check_families(weight, tied)
                if samples:
                    self.check_sync(weight, tied, samples)
            if samples:
                for c in variant.chains:
                    self.check_contract(c, samples)
        return self.diags


def _families(c: Chain) -> tuple[str, ...]:
    return c.packings()


def _row_steps(c: Chain, packing: bool) -> list[Step]:
    return [s for s in _prefix(c, packing) if s.op.category is not Category.VALUE]


def _rebased(labels: list[tuple[str, int] | None]) -> list[tuple[str, int] | None]:
    """A tensor-parallel slice keeps rows ``[r*S, (r+1)*S)`` of each shard: number them from 0, so the
    slice is compared with the kernel's order on a local (sharded) layer."""
    first: dict[str, int] = {}
    for lab in labels:
        if lab is not None:
            first[lab[0]] = min(first.get(lab[0], lab[1]), lab[1])
    return [None if lab is None else (lab[0], lab[1] - first[lab[0]]) for lab in labels]


def _row_blocked(c: Chain) -> bool:
    return c.source.tie is not None and c.source.tie.row_block > 1


def _row_blocks(rows: tuple[int, ...], block: int) -> tuple[int, ...] | None:
    """Weight rows -> scale rows for block scales covering ``block`` rows each: every block of
    output rows must come from one source block (in any order: one scale covers them all)."""
    if len(rows) % block:
        return None
    out = []
    for j in range(len(rows) // block):
        src = {r // block for r in rows[j * block:(j + 1) * block] if r >= 0}
        if len(src) > 1:
            return None
        out.append(src.pop() if src else -1)
    return tuple(out)


def _n_rows(spec: TensorSpec, dims) -> int:
    return int(ex.evaluate(spec.shape[_row_axis(spec, len(spec.shape))], dims))


def _blocks(cols: tuple[int, ...], block: int) -> tuple[int, ...] | None:
    """Weight K elements -> scale blocks: every block of output elements must read one whole source block."""
    if len(cols) % block:
        return None
    out = []
    for j in range(len(cols) // block):
        chunk = cols[j * block:(j + 1) * block]
        if all(c < 0 for c in chunk):
            out.append(-1)
            continue
        src = chunk[0] // block if chunk[0] >= 0 else None
        if src is None or any(c < 0 or c // block != src or c % block != i for i, c in enumerate(chunk)):
            return None
        out.append(src)
    return tuple(out)


def _agree(a: ex.Expr, b: ex.Expr, samples: list[dict]) -> bool:
    same = ex.same_value(a, b)
    if same is not None:
        return same
    return all(ex.evaluate(a, s) == ex.evaluate(b, s) for s in samples)


def _pick(samples: list[dict]) -> list[dict]:
    """Two instances, with every dim at its second and at its third smallest valid value:
    the smallest one can hide a transform (a 64-row group interleave of 128 rows is the identity)."""
    if not samples:
        return []
    dims = list(samples[0])
    values = {d: sorted({s[d] for s in samples}) for d in dims}
    out = []
    for rank in (1, 2):
        want = {d: values[d][min(rank, len(values[d]) - 1)] for d in dims}
        if want in samples and want not in out:
            out.append(want)
    return out or [samples[0]]


def verification_dims(program: Program, variant: Variant) -> list[dict]:
    """The small instances a variant is verified on (every divisibility rule holds)."""
    known = [(k.value, k.multiple) for c in variant.chains for k in c.constraints]
    known += [(ex.Var(a.dim), a.multiple) for a in program.assumptions]
    return _pick(sample_dims(program.dims, known))


def verify(compiled: Compiled) -> list[Diagnostic]:
    """All sync and contract findings of a compiled spec (empty when it verifies)."""
    return _Verifier(compiled).run()
