"""The static verifier: tied tensors stay in sync, outputs meet the kernel contract.

Every real layout bug in the project's history (docs/design.md) produced wrong numbers with no
error. They all break one of a few checkable equations, which this module checks on every
variant of a spec (each set of present optional tensors and size conditions) before it compiles.
The rules decide from what ops declare (:class:`~layoutc.lang.ops.base.Facts`), from which steps a
family's packing made (their tags) and from index maps, never from names.

**Logical vs physical.** A tensor's chain splits into its *logical* prefix (steps no family packs
that keep the axes: swaps, interleaves, padding, slices, casts) and the rest (reshapes, kernel
packings). Logical steps must come first; then the prefix is one index map per tensor
(:mod:`layoutc.verify.rowmap`).

**Sync along ties.** A scale tensor shares its weight's rows and covers ``block`` weight
elements along K; a bias shares its weight's output rows. On concrete instances of the dims, the
logical row maps of a weight, its scales and its bias must be the same function (in block units
for 2-D block scales), and K moves must match block for block. Packing steps that only permute
rows (an epilogue shuffle) are compared the same way. A family applied to one tensor of a tie group
must be applied to every tied tensor whose role it packs, unless its chain for them only permutes
rows and the row maps already agree (a shuffle inside a block-scale row).

**Contract.** With the row order the checkpoint declares (``rows [w1; w3]``) the logical map
determines the order the kernel receives; it must be the declared one (``rows [w3; w1]``, padding
at the end of each shard).

The facts the rules read (row and K functions of a prefix) come from a :class:`Source`: the index
maps (:class:`StaticSource`), or a probe run of the converter (:mod:`layoutc.equiv.probe`). Every finding
names the tensors and points at the statements involved; all are reported together.
"""

from __future__ import annotations

import math
from typing import Iterable, Protocol, Sequence

import attrs

from ..algebra import expr as ex
from ..front.ast import Pos
from ..lang.compiler import Chain, Compiled, Step, Variant, looks_like_scales_of
from ..front.errors import Diagnostic, Reporter
from ..algebra.instances import sample_dims
from ..algebra.regions import Region, TooLarge, region_of, representatives
from ..lang.ir import Program, RowLayout
from ..lang.ops.base import Category
from .rowmap import AxisMap, axis_map, declared_rows, describe_labels, k_axis, logical_prefix, n_rows, row_axis, row_labels


class Source(Protocol):
    """Where the rules' facts about a chain come from."""

    def axis(self, chain: Chain, dims: dict, rows: bool = False) -> AxisMap: ...

    def samples(self, program: Program, variant: Variant) -> list[dict]: ...


class StaticSource:
    """Facts from the index maps (what ``check`` runs)."""

    def axis(self, chain: Chain, dims: dict, rows: bool = False) -> AxisMap:
        return axis_map(chain, dims, rows)

    def samples(self, program: Program, variant: Variant) -> list[dict]:
        return region_dims(program, variant)[0]


class Verifier:
    def __init__(self, compiled: Compiled, source: Source | None = None):
        self.compiled = compiled
        self.program: Program = compiled.program
        self.source = source or StaticSource()
        self.report = Reporter()
        self.regions: list[tuple[Region, str, int]] = []  # (region, status, representatives) per variant
        self._axes: dict = {}
        self._ident: dict[int, tuple] = {}
        self._regions: dict = {}
        self._contracts_ok: set = set()
        self.work = 0  # axis maps evaluated (cache misses): the verifier's work, counted

    def axis(self, chain: Chain, dims: dict, rows: bool = False) -> AxisMap:
        """The source's axis map, once per distinct chain and relevant sizes: variants (and, for the static
        source, the parameter combinations ``check`` compiles) share chains, so the work grows with the
        distinct chains a spec makes, not with the product of its options."""
        _, sig, relevant = self._identify(chain)
        key = (sig, rows, tuple(sorted((d, v) for d, v in dims.items() if d in relevant)))
        static = isinstance(self.source, StaticSource)
        cache = _STATIC_AXES if static else self._axes
        if key not in cache:
            self.work += 1
            if static and len(cache) >= _STATIC_AXES_MAX:
                cache.clear()
            cache[key] = self.source.axis(chain, dims, rows)
        return cache[key]

    def _identify(self, chain: Chain) -> tuple:
        """(chain, :func:`_chain_key`, the dims its maps depend on), once per chain object in this run."""
        ident = self._ident.get(id(chain))
        if ident is None or ident[0] is not chain:
            ident = self._ident[id(chain)] = (chain, _chain_key(chain), _relevant(chain))
        return ident

    @property
    def diags(self) -> list[Diagnostic]:
        return self.report.diagnostics

    def error(self, message: str, pos: Pos | None, tensors: Iterable[str], hint: str | None = None,
              related: Iterable[tuple[str, Pos]] = ()) -> None:
        self.report.error(message, pos, hint, tensors, related)

    def declared_rows(self, spec, side: str) -> RowLayout | None:
        return declared_rows(self.program, spec, side)

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
        samples = sample_dims(self.program.dims, self.program.assumed
                              + [(n, int(d.value)) for t in self.program.inputs for n, d, _ in t.divisions
                                 if isinstance(d, ex.Const)])
        for t in self.program.inputs:
            if t.tie is None or t.tie.weight not in inputs:
                continue
            w = inputs[t.tie.weight]
            wr, tr = w.shape[row_axis(w)], t.shape[row_axis(t)]
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
                k = ex.mul(w.shape[k_axis(w)], w.elem.values)  # K in values: packed elements hold several
                if not _agree(ex.mul(t.shape[k_axis(t)], t.tie.block), k, samples):
                    self.error(
                        f"{t.name} has {ex.to_str(t.shape[k_axis(t)])} scale columns, but {w.name} has "
                        f"{ex.to_str(k)} K elements, which in blocks of {t.tie.block} is {ex.to_str(ex.div(k, t.tie.block))}",
                        t.tie.pos, [t.name, w.name],
                    )

    def check_order(self, chain: Chain) -> None:
        """Logical steps first: a step that changes logical rows after a physical one (a reshape, a
        packing) acts on an arrangement the kernel's row order no longer describes."""
        loose = next((s for s in chain.steps if s.tag is None and s.op.category is Category.SHAPE), None)
        family = next((s for s in chain.steps if s.tag is not None), None)
        if loose is not None and family is not None and chain.steps.index(loose) < chain.steps.index(family):
            self.error(
                f"{chain.tensor}: {loose.statement.text} moves data physically before the {family.tag.family} "
                f"packing; a packing family packs the tensor's logical layout, so whatever the family makes of "
                f"this arrangement is not what the kernel reads",
                loose.statement.pos if loose.statement else None, [chain.tensor],
                f"make the steps part of a family (family NAME {{ ... }}) or move them after the {family.tag.family} "
                f"packing",
                [(f"the {family.tag.family} packing is applied here", family.statement.pos)] if family.statement else (),
            )
            return
        seen_physical: Step | None = None
        for s in chain.steps:
            if s.tag is not None or s.op.category is Category.SHAPE:
                seen_physical = seen_physical or s
            elif s.op.category is Category.LOGICAL and seen_physical is not None:
                what = f"{seen_physical.tag.family} packing" if seen_physical.tag else seen_physical.op.name
                self.error(
                    f"{chain.tensor}: {s.statement.text} changes the logical rows after the physical {what}; "
                    f"logical transforms (swaps, interleaves, padding) come first",
                    s.statement.pos if s.statement else None, [chain.tensor],
                    "move it before the packing (e.g. pad per half before the scale swizzle)",
                    [(f"the {what} is applied here", seen_physical.statement.pos)]
                    if seen_physical.statement else (),
                )
                return

    def check_shards(self, chain: Chain) -> None:
        layout = self.declared_rows(chain.source, "input")
        if layout is None:
            return
        ra = row_axis(chain.source)
        n = len(layout.shards)
        for s in chain.steps:
            if s.tag is not None or s.op.axis(s.in_type) != ra:
                continue
            if n == 1 and s.op.facts.gate_up:
                self.error(
                    f"{chain.tensor} has a single shard (rows {layout}), but {s.statement.text} treats its rows as "
                    f"two (gate and up); a non-gated activation keeps its one w13 shard as it is",
                    s.statement.pos if s.statement else None, [chain.tensor],
                    "guard the gate/up transforms with the activation, e.g. 'if activation != relu2 { ... }'",
                )
            parts = s.op.parts
            if s.op.facts.slice and layout.kind == "stacked" and parts != n:
                self.error(
                    f"{chain.tensor} rows are {layout} ({n} shard{'s' if n > 1 else ''}), but {s.statement.text} "
                    f"slices them as {parts} part{'s' if parts > 1 else ''}; tensor parallelism takes "
                    f"rank r's slice of each shard (gate and up separately)",
                    s.statement.pos if s.statement else None, [chain.tensor], f"use shard(..., parts={n})",
                )

    def check_families(self, weight: Chain, tied: list[Chain], samples: list[dict]) -> None:
        """A family applied to one tensor of a tie group is applied to every tied tensor whose role it
        packs, unless its chain only permutes rows and the row maps agree without it (checked by
        :meth:`check_sync`)."""
        group = [weight] + tied
        applied: dict[str, Chain] = {}
        for c in group:
            for fam in c.packings():
                applied.setdefault(fam, c)
        for fam, carrier in applied.items():
            family = self.program.family(fam)
            for c in group:
                if fam in c.packings() or family is None or c.source.role not in family.role_names:
                    continue
                steps = [s for s in carrier.steps if s.tag is not None and s.tag.family == fam]
                if _only_permutes_rows(carrier, steps) and _row_blocked(c):
                    continue  # a shuffle inside the block-scale rows: check_sync proves the blocks stay whole
                first = steps[0]
                self.error(
                    f"{carrier.tensor} is packed for {fam} but its tied {c.tensor} is not; the kernel reads both "
                    f"in the {fam} layout",
                    first.statement.pos if first.statement else None, [carrier.tensor, c.tensor],
                    f"add interleave({c.tensor}, {fam})",
                )

    def check_sync(self, weight: Chain, tied: list[Chain], samples: list[dict]) -> None:
        before = len(self.diags)
        row_packed = any(s.tag is not None and s in logical_prefix(c, rows=True)
                         for c in [weight] + tied for s in c.steps)
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
                        expected = _blocks(wmap.cols, c.source.tie.block)
                        if expected is None or expected != cmap.cols:
                            self.report_col_desync(weight, c)
                if len(self.diags) > before:
                    return

    def followable(self, chain: Chain, amap: AxisMap) -> bool:
        """Logical transforms move whole rows and whole K columns within each expert; anything else
        (moving data across experts, or rows differently per column) is not a layout we can vouch for."""
        if amap.consistent:
            return True
        steps = [s for s in chain.steps if s.op.category is Category.LOGICAL]
        shape = "[E, rows]" if chain.source.role == "bias" else "[E, rows, K]"
        hint = f"check the dim= of the transforms: rows are dim {row_axis(chain.source)} of {shape}"
        # The step that acts along an axis that is neither the rows nor K (a dim=0 on a row op): point at it.
        culprit = next((s for s in steps if s.op.facts.on_axis and s.statement is not None
                        and s.op.axis(s.in_type) not in (row_axis(chain.source, s.in_type.rank),
                                                         k_axis(chain.source, s.in_type.rank))),
                       None)
        if culprit is not None:
            st, axis = culprit.statement, culprit.op.axis(culprit.in_type)
            pos = next((p for k, _, p in st.keywords if k == "dim"), st.pos)
            what = "the expert axis" if axis == 0 else f"neither the rows nor K of {shape}"
            self.error(f"{st.op}(..., dim={axis}) acts on dim {axis}, {what}: it moves data across experts, which "
                       f"no MoE kernel layout does", pos, [chain.tensor], hint)  # one finding for all its tensors
            return False
        pos = steps[0].statement.pos if steps and steps[0].statement else chain.source.pos
        self.error(
            f"{chain.tensor}: the logical transforms move data across experts (or move rows differently "
            f"per column), which no MoE kernel layout does",
            pos, [chain.tensor], hint,
        )
        return False

    def report_row_desync(self, w: Chain, c: Chain, wmap: AxisMap, cmap: AxisMap, packing: bool, dims) -> None:
        layout = self.declared_rows(w.source, "input")
        what = "rows (after the packings' row shuffles)" if packing else "rows"
        n_w, n_c = n_rows(w.source, dims), n_rows(c.source, dims)
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
            st = only_w[0].statement
            hint = f"apply {st.op} to {c.tensor} too, e.g. {st.op}([{w.tensor}, {c.tensor}], ...)"
        elif only_c and not only_w and only_c[0].statement is not None:
            hint = f"{c.tensor} gets {only_c[0].statement.op} but {w.tensor} does not"
        related = [(f"{s.statement.op} on {c.tensor} only" if s in only_c else f"{s.statement.op} on {w.tensor} only",
                    s.statement.pos) for s in (only_w + only_c)[1:4] if s.statement]
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

    def report_col_desync(self, w: Chain, c: Chain) -> None:
        k_steps = [s for s in w.steps + c.steps if s.op.category is Category.LOGICAL
                   and s.op.axis(s.in_type) == k_axis((w if s in w.steps else c).source, len(s.in_type.shape))]
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
            hint = f"declare the checkpoint order, e.g. input {chain.tensor} : ... rows [...]"
            guess = looks_like_scales_of(chain.source, self.program) if chain.source.tie is None else None
            if guess is not None:  # a scale's rows are its weight's: the forgotten thing is the tie
                hint = (f"{chain.tensor} is shaped like the scales of {guess[0].name} but declares no tie; declare "
                        f"it: input {chain.tensor} : ... scales {guess[0].name} block {guess[1]} (its rows are then "
                        f"{guess[0].name}'s)")
            self.error(f"{chain.tensor}: the output declares rows {dst_layout} but the input declares no row order",
                       chain.target.rows.pos if chain.target.rows else chain.target.pos, [chain.tensor], hint)
            return
        ra = row_axis(chain.source)
        slices = [s for s in chain.steps if s.op.facts.slice and s.op.axis(s.in_type) == ra]
        key = (self._identify(chain)[1], str(src_layout), str(dst_layout), tuple(map(repr, samples)))
        if key in self._contracts_ok:
            return  # the same chain and orders on the same sizes in another variant: already proved
        before = len(self.diags)
        self._check_contract(chain, samples, src_layout, dst_layout, ra, slices)
        if len(self.diags) == before:
            self._contracts_ok.add(key)

    def _check_contract(self, chain: Chain, samples: list[dict], src_layout, dst_layout, ra, slices) -> None:
        for dims in samples:
            amap = self.axis(chain, dims)
            if not self.followable(chain, amap):
                return
            n_in = n_rows(chain.source, dims)
            if n_in % max(1, len(src_layout.shards)):
                continue  # sizes too small to hold the declared shards (a run-time check refuses them)
            src = row_labels(src_layout, n_in)
            if any(r >= len(src) for r in amap.rows):
                return  # rows read from past the declared row count: the tie's shape rule reports it
            actual = [src[r] if r >= 0 else None for r in amap.rows]
            if slices:
                actual = _rebased(actual)
            ranks = math.prod(s.op.ranks for s in slices)
            shard_real = n_in // max(1, len(src_layout.shards)) // ranks
            expected = row_labels(dst_layout, len(amap.rows),
                                  shard_real if len(dst_layout.shards) == len(src_layout.shards) else None)
            if actual != expected:
                steps = [s for s in chain.steps if s.op.category is Category.LOGICAL and s.tag is None]
                pos = steps[-1].statement.pos if steps and steps[-1].statement else chain.target.pos
                self.error(
                    f"{chain.tensor}: the kernel expects rows {dst_layout}, but the transforms give "
                    f"{describe_labels(actual, src_layout.shards)} (from the checkpoint's {src_layout})",
                    pos, [chain.tensor], self.contract_hint(chain, src_layout, actual),
                    [("the output declares the kernel's order here", (chain.target.rows.pos if chain.target.rows
                                                                      else chain.target.pos))],
                )
                return

    def contract_hint(self, chain: Chain, src: RowLayout, actual) -> str | None:
        """What usually causes a wrong row order, read from the steps' facts and the order obtained."""
        ra = row_axis(chain.source)
        gate_up = [s for s in chain.steps if s.tag is None and s.op.facts.gate_up and s.op.axis(s.in_type) == ra]
        moved = [s for s in chain.steps if s.tag is None and s.op.facts.gate_up and s.op.axis(s.in_type) != ra]
        if moved and chain.source.tie is None:  # e.g. an untied bias [E, rows]: its rows were taken as axis 0
            st = moved[0].statement
            return (f"{chain.tensor} declares no tie, so its rows are taken to be axis {ra}, but "
                    f"{st.op if st else moved[0].op.name} moves axis {moved[0].op.axis(moved[0].in_type)}: "
                    f"if it is a bias, declare it (bias of WEIGHT); a scale: scales WEIGHT block N")
        if src.kind == "interleaved" and gate_up and all(s.op.inverse(s.in_type) == s.op for s in gate_up):
            return ("the checkpoint rows are interleaved (gpt-oss); a transform written for stacked [w1; w3] rows "
                    "moves the wrong rows. Deinterleave first, or swap pairs for an interleaved output")
        for a, b in zip(gate_up, gate_up[1:]):
            if a.op == b.op and a.op.inverse(a.in_type) == a.op:
                return f"{a.statement.op} is applied twice, which undoes it"
        pads = [s for s in chain.steps if s.tag is None and s.op.axis(s.in_type) == ra
                and s.out_type.shape[ra] != s.in_type.shape[ra]]
        if any(lab is None for lab in actual) and pads and len(src.shards) > 1 and pads[0].op.parts == 1:
            return "a gated w13 is padded per half: pad(..., parts=2) pads each shard, parts=1 pads only the end"
        return None

    # -- run --
    def run(self) -> list[Diagnostic]:
        self.check_ties_declared()
        overall = self.report
        found: dict[tuple, tuple[Diagnostic, list[Region]]] = {}  # a finding -> the regions it occurs in
        all_regions: list[Region] = []
        for variant in self.compiled.variants:
            self.report = Reporter()
            region = region_of(self.program, variant.present)
            if region not in all_regions:
                all_regions.append(region)
            try:
                samples, status = self.region_samples(variant)
            except TooLarge as err:
                self.report.error(err.message, err.pos or _bound_pos(self.program), None)
                samples, status = [], "too large"
            self.regions.append((region, status, len(samples)))
            if status == "unfound":
                self.report.error(f"no sizes found in the region {region.describe()} to verify it on: its claims are "
                                  f"not checked there", _condition_pos(self.program, region), "state the sizes it "
                                  f"holds at with a simpler condition (a comparison of one dim with a constant)")
            self.check_variant(variant, samples)
            for d in self.report.diagnostics:
                key = (d.severity, d.message, d.pos)
                if key in found:
                    old, regions = found[key]
                    found[key] = (attrs.evolve(old, tensors=old.tensors + tuple(t for t in d.tensors
                                                                                  if t not in old.tensors)),
                                  regions + ([region] if region not in regions else []))
                else:
                    found[key] = (d, [region])
        self.report = overall
        for d, regions in found.values():
            if any(r.conditional for r in regions) and len(regions) < len(all_regions):
                where = " or ".join(r.describe() for r in regions)
                d = attrs.evolve(d, message=f"at {where}: {d.message}")
            self.report.add(d)
        return self.diags

    def region_samples(self, variant: Variant) -> tuple[list[dict], str]:
        if isinstance(self.source, StaticSource):
            key = (region_of(self.program, variant.present), frozenset(self._identify(c)[1] for c in variant.chains))
            if key not in self._regions:
                self._regions[key] = region_dims(self.program, variant)
            return self._regions[key]
        samples = self.source.samples(self.program, variant)
        if samples:
            return samples, "covered"
        return samples, region_dims(self.program, variant)[1]  # a region with no size is empty for a probe too

    def check_variant(self, variant: Variant, samples: list[dict]) -> None:
        for c in variant.chains:
            self.check_order(c)
            self.check_shards(c)
        for weight, tied in self.groups(variant):
            self.check_families(weight, tied, samples)
            if samples:
                self.check_sync(weight, tied, samples)
        if samples:
            for c in variant.chains:
                self.check_contract(c, samples)


def _only_permutes_rows(chain: Chain, steps: Sequence[Step]) -> bool:
    prefix = logical_prefix(chain, rows=True)
    return all(s in prefix for s in steps)


def _row_steps(c: Chain, packing: bool) -> list[Step]:
    return [s for s in logical_prefix(c, packing) if s.op.category is not Category.VALUE]


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


#: Static axis maps by chain and sizes, shared by every compile in the process (bounded).
_STATIC_AXES: dict = {}
_STATIC_AXES_MAX = 4096


def _chain_key(chain: Chain) -> tuple:
    """What a chain's static axis maps depend on: its input (shape, type, tie) and every step's op and type."""
    src = chain.source
    return (chain.tensor, repr(src.shape), src.elem.name, repr(src.tie and (src.tie.kind, src.tie.row_block)),
            src.role, tuple((repr(s.op), repr(s.in_type), s.tag is not None) for s in chain.steps))


def _relevant(chain: Chain) -> frozenset[str]:
    """The dims a chain's maps can depend on: those in its shapes."""
    names: set[str] = set()
    for shape in [chain.source.shape] + [s.out_type.shape for s in chain.steps]:
        for e in shape:
            names |= ex.free_vars(e)
    return frozenset(names)


def _bound_pos(program: Program) -> Pos | None:
    """Where a spec makes its sizes large: a lower bound, else a size condition."""
    return next((a.pos for a in program.assumptions if a.minimum > 1),
                program.conditions[0].pos if program.conditions else None)


def _condition_pos(program: Program, region: Region) -> Pos | None:
    labels = [label for label, _ in region.holds]
    return next((c.pos for c in program.conditions if c.label in labels), None)


def _elements(variant: Variant):
    """The elements the axis maps of ``variant`` evaluate on given sizes, bounded before any allocation:
    every row (or column) against a spread of at most 16 positions on each other axis (rowmap.axis_map)."""
    weights = {c.source.tie.weight for c in variant.chains if c.source.tie is not None}
    checked = [c for c in variant.chains if c.source.tie is not None or c.tensor in weights
               or c.source.rows is not None or (c.target is not None and c.target.rows is not None)]
    shapes = [c.source.shape for c in checked] + [s.out_type.shape for c in checked
                                                  for s in logical_prefix(c, rows=True)]

    terms = list({(e, len(shape)) for shape in shapes for e in shape})  # distinct extents: shapes repeat

    def size_of(env: dict) -> int:
        return max((int(ex.evaluate(e, env)) * 16 ** (rank - 1) for e, rank in terms), default=0)

    return size_of


def region_inputs(program: Program, variant: Variant) -> tuple[list[tuple[ex.Expr, int]], list[ex.Expr]]:
    """What a variant's representatives are drawn from: its divisibility rules, and the size expressions whose
    floors and conditions cut the sizes (every shape along every chain, every size condition)."""
    known = [(k.value, k.multiple) for c in variant.chains for k in c.constraints]
    known += [(ex.Var(a.dim), a.multiple) for a in program.assumptions]
    exprs = [e for c in variant.chains for shape in [c.source.shape] + [s.out_type.shape for s in c.steps]
             for e in shape] + [e for c in program.conditions for e in (c.lhs, c.rhs)]
    exprs += [e for c in variant.chains for e in _claim_floors(c, program.dims)]
    return known, exprs


_FLOORS: dict[int, tuple[Chain, list]] = {}


def _claim_floors(chain: Chain, dims) -> list[ex.Expr]:
    """The floors of the maps the claims read (the logical prefixes, composed as :func:`axis_map` composes them)
    that multiply a coordinate by a size-dependent extent (:func:`periods.scaled_floors`): their periods join
    the shapes' in the residue classes verified, or are reported as not covered when too many."""
    from ..algebra.indexmap import compose_all
    from ..algebra.periods import scaled_floors
    from .rowmap import STEPWISE_AFTER

    hit = _FLOORS.get(id(chain))
    if hit is not None and hit[0] is chain:
        return hit[1]
    found: list[ex.Expr] = []
    for rows in (False, True):
        maps = [s.op.index_map(s.in_type) for s in logical_prefix(chain, rows)]
        for m in (maps if len(maps) > STEPWISE_AFTER else [compose_all(maps)] if maps else []):
            found += [e for e in scaled_floors([*m.src, m.valid], dims) if e not in found]
    if len(_FLOORS) > 4096:
        _FLOORS.clear()
    _FLOORS[id(chain)] = (chain, found)
    return found


def region_dims(program: Program, variant: Variant) -> tuple[list[dict], str]:
    """The representatives a variant's region is verified on (:func:`layoutc.algebra.regions.representatives`):
    ``(sizes, status)``."""
    known, exprs = region_inputs(program, variant)
    region = region_of(program, variant.present)
    return representatives(program, region, program.dims, known, exprs, size_of=_elements(variant))


def verification_dims(program: Program, variant: Variant) -> list[dict]:
    """The small instances a variant is verified on: every divisibility rule holds, every lower bound,
    and the variant's size conditions (``if I > 128``) decide as the variant says."""
    from ..algebra.instances import variant_instances

    known = [(k.value, k.multiple) for c in variant.chains for k in c.constraints]
    known += program.assumed
    return _pick(variant_instances(program, variant.present, known))


def verify(compiled: Compiled) -> list[Diagnostic]:
    """All sync and contract findings of a compiled spec (empty when it verifies)."""
    return Verifier(compiled).run()
