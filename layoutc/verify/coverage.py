"""What the verifier proved about each tensor, and what it could not check.

A spec passes ``check`` when nothing it states is violated; but a spec that states little is
checked for little: drop every ``rows`` clause and forget a swap, and there is nothing left to
contradict. This module says, per tensor, which guarantees hold and which were not checked
because the spec does not state what they need, as warnings with the line to add it to:

* a tensor shaped like a weight's block scales (its rows, a whole fraction of its K) with no
  ``scales W block N`` tie: its sync with the weight;
* a tensor shaped like a bias of a weight (its rows, no K) with no ``bias of W`` tie;
* a weight the chain treats as gate and up (a ``gate_up`` step) with no declared row order;
* an output that declares neither a row order nor a packing, while its chain moves data;
* physical steps (reshapes, bit permutations) that no family declares: what the kernel expects
  of that arrangement is not stated, so nothing checks it.

* what sizes and parameter values the claims hold for (:func:`size_scope`): "for all sizes" when the
  spec has no size condition, else every region by name; an integer parameter a condition tests without
  declared choices is a warning (its other branches are never verified); one without choices that only
  sizes the layout (``ranks=tp_size``) is a note: the claims hold for the value given.

``check --strict`` turns these warnings into errors; the shipped specs pass it. ``explain`` prints
the per-tensor summary. Every decision reads facts, ties, declarations and index maps.
"""

from __future__ import annotations

import attrs

from ..front import ast
from ..algebra import expr as ex
from ..lang.compiler import Chain, Compiled, looks_like_scales_of
from ..front.errors import Diagnostic, Reporter
from ..algebra.regions import TooLarge, region_of, residue_gaps
from ..lang.ir import Program, TensorSpec
from ..lang.ops.base import Category
from .rowmap import declared_rows, logical_prefix, row_axis


@attrs.frozen
class TensorCoverage:
    tensor: str
    proved: tuple[str, ...]
    unchecked: tuple[str, ...]
    scope: str = "for all sizes"  # the sizes and parameter values the proved claims hold for


def _walk_conditions(items, out: list) -> None:
    for item in items:
        if isinstance(item, ast.If):
            out.append(item.cond)
            _walk_conditions(item.then, out)
            _walk_conditions(item.other, out)


def size_scope(compiled: Compiled, report: Reporter | None = None) -> str:
    """The sizes and parameter values the verifier's claims cover, in words: every size region of the
    spec (each verified on its representatives, :mod:`layoutc.algebra.regions`), and the parameter values."""
    from ..front.parse import parse
    from .rules import region_dims, region_inputs

    program = compiled.program
    regions, seen = [], set()
    gaps: list[str] = []
    for variant in compiled.variants:
        known, exprs = region_inputs(program, variant)
        gaps += [g for g in residue_gaps(program.dims, known, exprs) if g not in gaps]
        region = region_of(program, variant.present)
        if region in seen:
            continue
        seen.add(region)
        try:
            _, status = region_dims(program, variant)
        except TooLarge:
            status = "too large"
        regions.append((region, status))
    covered = [r.describe() for r, st in regions if st == "covered"]
    empty = [r.describe() for r, st in regions if st == "empty"]
    # Nested floors with more residue classes than are verified one by one: the claims cover the residues
    # verified, said exactly (docs/design.md, "Every size"); --strict refuses it.
    sizes = f"for the sizes with {'; '.join(gaps)}" if gaps else "for all sizes"
    if not program.conditions:
        scope = sizes
    else:
        scope = f"{sizes}, in every region: " + "; ".join(covered)
        if empty:
            scope += f" (no size is in {'; '.join(empty)})"
    if gaps and report is not None:
        report.warning(f"the claims are verified for {'; '.join(gaps)}: the other residues are not verified",
                       program.dim_pos[0] if program.dim_pos else None,
                       "state a divisibility that leaves few residue classes (assume I % 128 == 0)")
    try:
        tree = parse(program.source, program.filename)
    except Exception:  # noqa: BLE001 - the spec parsed once already; a second parse cannot fail differently
        return scope
    conds: list = []
    _walk_conditions(tree.items, conds)
    tested = {c.name.text for c in conds if c.name is not None}
    tested |= {n for c in conds if c.lhs is not None for n in ex.free_vars(c.lhs.expr)}
    tested |= {n for c in conds if isinstance(c.value, ast.ExprValue) for n in ex.free_vars(c.value.expr)}
    values = program.param_values
    fixed = []
    for item in tree.items:
        if not isinstance(item, ast.Param) or item.choices is not None:
            continue
        name, value = item.name.text, values.get(item.name.text)
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        fixed.append(f"{name}={value}")
        if report is not None and name in tested:
            report.warning(f"parameter {name} is tested by a condition but declares no choices: the claims are "
                           f"verified with {name}={value} only, the branches other values take are not",
                           item.pos, f"declare its values: param {name} = {value} choices [...]")
    if fixed:  # said once on the summary line, not as a located note per parameter (noise on every check)
        scope += f"; with {', '.join(fixed)} (check -D NAME=N verifies another value)"
    return scope


def _physical_unpacked(chain: Chain) -> list:
    """Steps after the logical prefix that no family packs and that move data (not value steps)."""
    prefix = logical_prefix(chain)
    return [s for s in chain.steps[len(prefix):] if s.tag is None and s.op.category is not Category.VALUE]


def _reorders(step) -> bool:
    """A step that changes the order of the data (a permutation, a reshape, a bit move), as opposed to
    one that only pads, crops or slices an axis (it keeps the order) or converts values."""
    if step.op.category is Category.VALUE or step.op.is_identity:
        return False
    facts = step.op.facts
    if facts.on_axis and not facts.gate_up and step.in_type.shape != step.out_type.shape:
        return False  # padding, cropping, a tensor-parallel slice: the rows keep their order
    return True


def _looks_like_bias_of(t: TensorSpec, program: Program) -> TensorSpec | None:
    """A rank-(k-1) tensor with a weight's leading sizes and its rows, and no K axis."""
    if t.tie is not None or len(t.shape) < 1:
        return None
    for w in program.inputs:
        if w is t or w.tie is not None or len(w.shape) != len(t.shape) + 1:
            continue
        rows = w.shape[row_axis(w)]
        if all(ex.same_value(a, b) for a, b in zip(t.shape, w.shape[:-2] + (rows,))):
            return w
    return None


def coverage(compiled: Compiled) -> tuple[list[TensorCoverage], list[Diagnostic]]:
    """Per input tensor: what was proved, what was not checked; and the warnings that say so."""
    program = compiled.program
    report = Reporter()
    variant = compiled.variants[-1]  # every optional tensor present, every size condition holding
    chains = {c.tensor: c for c in variant.chains}
    tied_to = {t.tie.weight for t in program.inputs if t.tie is not None}
    out: list[TensorCoverage] = []
    scope = size_scope(compiled, report)
    for t in program.inputs:
        chain = chains.get(t.name)
        target = next((o for o in program.outputs if o.name == t.name), None)
        proved = ["types and shapes through every statement, and the sizes each statement needs"]
        unchecked = []
        if t.tie is not None:
            what = (f"rows and K blocks follow {t.tie.weight}" if t.tie.kind == "scales"
                    else f"rows follow {t.tie.weight}")
            proved.append(f"sync: {what}")
        elif t.name in tied_to:
            partners = [x.name for x in program.inputs if x.tie is not None and x.tie.weight == t.name]
            proved.append(f"sync: {', '.join(partners)} follow its rows")
        # Scales are recognised by shape (a weight's rows, a whole fraction of its K), not by element type:
        # E4M3 scales (NVFP4) go as untied as E8M0 ones (MXFP4), and a weight's partners are not its scales.
        scales_of = looks_like_scales_of(t, program) if t.name not in tied_to else None
        if scales_of is not None:
            weight, block = scales_of
            unchecked.append("sync with a weight")
            report.warning(f"{t.name} is shaped like the scales of {weight.name} (one per {block} values) but declares "
                           f"no tie: whether it follows {weight.name}'s rows and K blocks is not checked", t.pos,
                           f"declare it: input {t.name} : ... scales {weight.name} block {block}", [t.name])
        owner = _looks_like_bias_of(t, program) if t.elem.numeric and t.name not in tied_to else None
        if owner is not None:
            unchecked.append(f"sync with {owner.name}")
            report.warning(f"{t.name} is shaped like a bias of {owner.name} (its rows, no K) but declares no tie: "
                           f"whether it follows {owner.name}'s rows is not checked", t.pos,
                           f"declare it: input {t.name} : ... bias of {owner.name}", [t.name])
        rows_in = declared_rows(program, t, "input")
        rows_out = declared_rows(program, target, "output")
        gate_up = [s for s in (chain.steps if chain else ()) if s.op.facts.gate_up]
        if rows_in is not None and rows_out is not None:
            proved.append(f"row order: the kernel gets {rows_out} from the checkpoint's {rows_in}")
        elif gate_up:
            unchecked.append("the row order the kernel gets")
            st = gate_up[0].statement
            report.warning(f"{t.name}: {st.text if st else gate_up[0].op.name} treats its rows as gate and up, but "
                           f"{'the input' if rows_in is None else 'the output'} declares no row order: the order the "
                           f"kernel gets is not checked", (st.pos if st else t.pos),
                           "declare rows on the input (rows [w1; w3]) and the output (rows [w3; w1])", [t.name])
        if chain is not None and target is not None:
            applied = chain.packings()
            if applied:
                proved.append(f"packing: {' + '.join(applied)} as the output declares")
            moves = [s for s in chain.steps if _reorders(s)]
            if moves and target.rows is None and rows_out is None and not target.packings:
                unchecked.append("what the kernel expects of this arrangement")
                report.warning(f"output {t.name} declares neither a row order nor a packing, but its chain moves data: "
                               f"only its type and shape are checked", target.pos,
                               "declare what the kernel reads: rows [...] and/or packing FAMILY", [t.name])
            loose = _physical_unpacked(chain)
            if loose:
                st = loose[0].statement
                unchecked.append("physical steps outside a declared family")
                report.warning(f"{t.name}: {st.text if st else loose[0].op.name} moves data physically outside any "
                               f"packing family: nothing states what the kernel expects of it, so it is not checked",
                               st.pos if st else t.pos,
                               "define the steps as a family (family NAME { ROLE(t) { ... } }), apply it with "
                               "interleave and declare it on the output (packing NAME)", [t.name])
        out.append(TensorCoverage(t.name, tuple(proved), tuple(unchecked), scope))
    return out, report.diagnostics


def strict(diags: list[Diagnostic]) -> list[Diagnostic]:
    """``--strict``: every coverage warning as an error (notes stay notes)."""
    return [attrs.evolve(d, severity="error") if d.severity == "warning" else d for d in diags]
