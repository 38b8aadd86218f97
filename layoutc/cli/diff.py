"""``layoutc diff``: a semantic diff of two specs -- composed maps and contracts, not text.

Two specs are compared tensor by tensor on small instances of the dims that satisfy both:
the whole chain of each tensor as one gather (source element of every output element,
padding included) and the value conversions, plus the declared contracts. A refactor that
leaves every map, conversion and contract identical reports "no layout change". Otherwise
each change is described (row order, K / physical packing, dtype, shape, padding, contract)
with one concrete element that moved, and the new spec's verifier verdict says whether the
tensors are still in sync.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Mapping

import attrs
import torch

from ..algebra import expr as ex
from ..api import CompiledSpec, compile_source
from ..lang.compiler import Chain
from ..algebra.instances import sample_dims
from ..algebra.indexmap import concrete_shape, lift_to_bits, source_indices
from ..verify.rowmap import axis_map, declared_rows, describe_labels, row_labels
from ..algebra.regions import Region, TooLarge, representatives
from ..front.text import md_code, md_text
from ..verify.rules import verify

#: Size regions compared at most (every truth value of the size conditions of both specs).
MAX_REGIONS = 64


@attrs.frozen
class TensorChange:
    tensor: str
    kinds: tuple[str, ...]  # "rows", "packing", "dtype", "shape", "padding", "contract", "added", "removed"
    details: tuple[str, ...]
    example: str | None = None


@attrs.frozen
class SpecDiff:
    old: str
    new: str
    changes: tuple[TensorChange, ...]
    verdict: str  # the new spec's verifier verdict
    findings: tuple[str, ...] = ()
    params: tuple[str, ...] = ()  # parameters added, removed or with another value: the diff holds at these values

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def _chains(spec: CompiledSpec) -> dict[str, Chain]:
    return {c.tensor: c for c in spec.compiled.variants[-1].chains}


def _output_at(spec: CompiledSpec, name: str, env: Mapping[str, int] | None):
    """The declaration of output ``name`` that holds at sizes ``env`` (an output may be declared once per size
    branch: ``if K % 256 == 0 { output ... } else { output ... }``); the first one without ``env``."""
    p = spec.program
    if env is not None:
        try:
            holds = {c.label for c in p.conditions if c.holds(env)}
        except (ZeroDivisionError, KeyError):
            holds = set()
        found = p.output_for(name, frozenset(p.optional_inputs) | holds)
        if found is not None:
            return found
    return next((t for t in p.outputs if t.name == name), None)


def _contract(spec: CompiledSpec, name: str, env: Mapping[str, int] | None = None) -> dict[str, str]:
    """The declared contract of ``name``: its input and, at sizes ``env``, the output declaration that holds
    there."""
    p = spec.program
    out = {}
    for side, t in (("input", next((t for t in p.inputs if t.name == name), None)),
                    ("output", _output_at(spec, name, env))):
        if t is None:
            continue
        shape = ", ".join(ex.to_str(d, slash=True) for d in t.shape)  # resolved: how it is written is no change
        out[f"{side} type"] = f"{t.elem.name}[{shape}]{'?' if t.optional else ''}"
        if t.rows is not None:
            out[f"{side} rows"] = str(t.rows)
        if t.packing is not None:
            out[f"{side} packing"] = t.packing_text
        if t.tie is not None:
            out[f"{side} tie"] = f"{t.tie.kind} {t.tie.weight}" + (f" block {t.tie.block}" if t.tie.block else "")
    return out


def _contract_changes(old: CompiledSpec, new: CompiledSpec, name: str, env=None) -> list[str]:
    ca, cb = _contract(old, name, env), _contract(new, name, env)
    return [f"{key}: {ca.get(key, '-')} -> {cb.get(key, '-')}" for key in sorted(set(ca) | set(cb))
            if ca.get(key) != cb.get(key)]


def _samples(a: Chain, b: Chain, dims: tuple[str, ...]) -> list[dict]:
    known = [(k.value, k.multiple) for k in (*a.constraints, *b.constraints)]
    found = sample_dims(dims, known, per_dim=3)
    return found[:: max(1, len(found) // 4)][:4]


def _gather_plan(chain: Chain, dims: dict, bits: bool) -> tuple[tuple[int, ...], torch.Tensor, torch.Tensor, torch.Tensor]:
    m = chain.composed_map()
    if bits:  # compare a byte-level map with a bit-level one bit for bit
        m = lift_to_bits(m)
    linear, valid, fill = source_indices(m, dims)
    return concrete_shape(m.out_shape, dims), linear, valid, fill


def _coords(linear: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(linear % size)
        linear //= size
    return list(reversed(out))


def _compare(name: str, old: CompiledSpec, new: CompiledSpec, a: Chain | None = None, b: Chain | None = None,
             envs: list[dict] | None = None, contract: bool = True) -> TensorChange | None:
    a = a if a is not None else _chains(old)[name]
    b = b if b is not None else _chains(new)[name]
    kinds: list[str] = []
    details: list[str] = []
    example = None
    ca, cb = (_contract(old, name), _contract(new, name)) if contract else ({}, {})
    for key in sorted(set(ca) | set(cb)):
        if ca.get(key) != cb.get(key):
            kinds.append("contract")
            details.append(f"{key}: {ca.get(key, '-')} -> {cb.get(key, '-')}")
    if a.out_type.elem != b.out_type.elem:
        kinds.append("dtype")
        details.append(f"output type {a.out_type.elem.name} -> {b.out_type.elem.name}")
    conv_a = [str(s.op) for s in a.steps if s.op.category.value == "value"]
    conv_b = [str(s.op) for s in b.steps if s.op.category.value == "value"]
    if conv_a != conv_b and a.out_type.elem == b.out_type.elem:
        kinds.append("dtype")
        details.append(f"value conversions {conv_a or ['none']} -> {conv_b or ['none']}")
    fams_a, fams_b = a.packings(), b.packings()
    if fams_a != fams_b:
        kinds.append("packing")
        details.append(f"kernel packings {list(fams_a) or ['none']} -> {list(fams_b) or ['none']}")
    dims = tuple(sorted(set(old.program.dims) | set(new.program.dims)))
    for env in (envs if envs is not None else _samples(a, b, dims)):
        at = ", ".join(f"{k}={v}" for k, v in env.items())
        bits = a.composed_map().bit_level or b.composed_map().bit_level
        try:
            sa, la, va, fa = _gather_plan(a, env, bits)
            sb, lb, vb, fb = _gather_plan(b, env, bits)
        except (ValueError, IndexError, RuntimeError):
            continue
        if sa != sb:
            kinds.append("shape")
            details.append(f"shape with {at}: {list(sa)} -> {list(sb)}")
            break
        moved = (va != vb) | (va & (la != lb)) | (~va & (fa != fb))
        if not bool(moved.any()):
            continue
        first = tuple(int(i) for i in moved.nonzero()[0])
        ma = a.composed_map()
        in_shape = concrete_shape((lift_to_bits(ma) if bits else ma).in_shape, env)
        unit = "bit" if bits else "element"
        show = lambda lin, ok: f"in{_coords(int(lin[first]), in_shape)}" if bool(ok[first]) else "padding"  # noqa: E731
        example = (f"with {at}, output {unit} {list(first)} came from {show(la, va)} and now from {show(lb, vb)} "
                   f"({int(moved.sum())} of {moved.numel()} {unit}s move)")
        if bool((va != vb).any()):
            kinds.append("padding")
            details.append(f"padding: {int((va != vb).sum())} {unit}s change between data and padding")
        try:
            ra, rb = axis_map(a, env), axis_map(b, env)
        except Exception:  # noqa: BLE001 - maps that are not row/K separable
            ra = rb = None
        if ra is not None and rb is not None and ra.rows != rb.rows:
            kinds.append("rows")
            layout = _declared(old, a)
            if layout is not None:
                labels = row_labels(layout, int(ex.evaluate(a.source.shape[-2 if a.source.role != 'bias' else -1], env)))
                da = describe_labels([labels[r] if r >= 0 else None for r in ra.rows], layout.shards)
                db = describe_labels([labels[r] if r >= 0 else None for r in rb.rows], layout.shards)
                details.append(f"logical rows {da} -> {db}")
            else:
                details.append("logical row order changed")
        elif ra is not None and rb is not None and ra.cols != rb.cols:
            kinds.append("rows")
            details.append("K order changed (logical columns)")
        elif "packing" not in kinds and "padding" not in kinds:
            kinds.append("packing")
            details.append("physical arrangement changed (same logical rows)")
        break
    if not kinds:
        return None
    return TensorChange(name, tuple(dict.fromkeys(kinds)), tuple(details), example)


@attrs.frozen
class _Both:
    """The size conditions and bounds of both specs, as :func:`layoutc.algebra.regions.representatives` reads them."""

    conditions: tuple
    assumptions: tuple


def _regions(old: CompiledSpec, new: CompiledSpec) -> list[tuple[Region, list[dict]]]:
    """Every region of the size conditions of both specs (each branch of either), with representatives:
    the sizes the two specs' maps are compared at. A region no size is in is left out."""
    labels: dict[str, Any] = {}
    for c in old.program.conditions + new.program.conditions:
        labels.setdefault(c.label, c)
    both = _Both(tuple(labels.values()), old.program.assumptions + new.program.assumptions)
    dims = tuple(sorted(set(old.program.dims) | set(new.program.dims)))
    assumed = [(ex.Var(x.dim), x.multiple) for x in both.assumptions]
    exprs = [e for spec in (old, new) for c in spec.compiled.variants[-1].chains
             for shape in [c.source.shape] + [st.out_type.shape for st in c.steps] for e in shape]
    exprs += [e for c in both.conditions for e in (c.lhs, c.rhs)]
    out = []
    truths = list(itertools.product((True, False), repeat=len(both.conditions)))[:MAX_REGIONS]
    for values in truths:
        region = Region(tuple((c.label, v) for c, v in zip(both.conditions, values)))
        # The divisibility each spec needs in this region: its variant there (a branch's packing may need
        # a multiple the other branch does not: those sizes are the other region's).
        holds = {label for label, v in region.holds if v}
        known = list(assumed)
        for spec in (old, new):
            key = frozenset(spec.program.optional_inputs) | {c.label for c in spec.program.conditions
                                                              if c.label in holds}
            known += [(k.value, k.multiple) for v in spec.compiled.variants if v.present == key
                      for c in v.chains for k in c.constraints]
        try:
            reps, status = representatives(both, region, dims, known, exprs, per_dim=2, budget=12)
        except TooLarge:
            continue
        if status == "covered":  # the smallest first: the example shown is read at them
            reps = sorted(reps, key=lambda env: (sum(env.values()), sorted(env.items())))
            out.append((region, reps[:: max(1, len(reps) // 4)][:4]))
    return out


def _variant_chain(spec: CompiledSpec, name: str, env: dict) -> Chain | None:
    """The chain ``spec`` converts ``name`` with at sizes ``env`` (its conditions decided there), every
    optional tensor present."""
    holds = {c.label for c in spec.program.conditions if c.holds(env)}
    key = frozenset(spec.program.optional_inputs) | holds
    variant = next((v for v in spec.compiled.variants if v.present == key), None)
    return next((c for c in variant.chains if c.tensor == name), None) if variant is not None else None


def _compare_by_region(name: str, old: CompiledSpec, new: CompiledSpec,
                       regions: list[tuple[Region, list[dict]]]) -> TensorChange | None:
    """The change of one tensor in every region: one without a region where it is the same in all of them,
    else each region's change prefixed with the region (at I == 2944: ...)."""
    # The declared contract in each region: the output declaration that holds there (one per size branch).
    by_region = [(region, _contract_changes(old, new, name, envs[0] if envs else None))
                 for region, envs in regions or [(Region(()), None)]]
    if len({tuple(d) for _, d in by_region}) <= 1:
        contract_details = by_region[0][1] if by_region else []
    else:
        contract_details = [f"at {region.describe()}: {d}" for region, ds in by_region for d in ds]
    per_region: list[tuple[Region, TensorChange | None]] = []
    for region, envs in regions or [(Region(()), None)]:
        if envs is None:
            per_region.append((region, _compare(name, old, new, contract=False)))
            continue
        found = None
        for env in envs:
            a, b = _variant_chain(old, name, env), _variant_chain(new, name, env)
            if a is None or b is None:
                continue
            found = _compare(name, old, new, a, b, [env], contract=False)
            if found is not None:
                break
        per_region.append((region, found))
    changed = [(r, c) for r, c in per_region if c is not None]
    kinds = ["contract"] if contract_details else []
    details = list(contract_details)
    example = None
    uniform = len(changed) == len(per_region) and len({(c.kinds, c.details) for _, c in changed}) == 1
    for region, change in changed:
        kinds += [k for k in change.kinds if k not in kinds]
        prefix = "" if uniform or not region.conditional else f"at {region.describe()}: "
        details += [prefix + d for d in change.details if prefix + d not in details]
        example = example or (prefix + change.example if change.example else None)
        if uniform:
            break
    if not kinds:
        return None
    return TensorChange(name, tuple(dict.fromkeys(kinds)), tuple(details), example)


def _branch_values(spec: CompiledSpec) -> dict[str, set]:
    """Per parameter, the values its branches are taken at: every choice, both truth values, and the
    constants its conditions compare it with (``if tp_size == 8``: 8; ``if tp_size > 4``: 4 and 5)."""
    from ..front import ast
    from ..verify.coverage import _walk_conditions
    from ..lang.resolver import _value_to_python
    from ..front.parse import parse

    try:
        tree = parse(spec.program.source, spec.program.filename)
    except Exception:  # noqa: BLE001 - it compiled from this text already
        return {}
    values = spec.program.param_values
    out: dict[str, set] = {}
    for item in tree.items:
        if isinstance(item, ast.Param) and item.choices is not None:
            out.setdefault(item.name.text, set()).update(_value_to_python(item.choices))
        elif isinstance(item, ast.Param) and isinstance(values.get(item.name.text), bool):
            out.setdefault(item.name.text, set()).update({True, False})
    conds: list = []
    _walk_conditions(tree.items, conds)
    for c in conds:
        if c.name is None or c.name.text not in values or isinstance(values[c.name.text], bool):
            continue
        other = _value_to_python(c.value) if c.value is not None else None
        found = other if isinstance(other, tuple) else (other,)
        for v in found:
            if type(v) is int:
                out.setdefault(c.name.text, set()).update({v, v + 1} if c.op in ("<=", ">") else
                                                          {v, v - 1} if c.op in ("<", ">=") else {v})
            elif isinstance(v, str) and not isinstance(values[c.name.text], int):
                out.setdefault(c.name.text, set()).add(v)
    return out


def _param_branch_changes(old: CompiledSpec, new: CompiledSpec, seen: set[str]) -> list[TensorChange]:
    """Changes at other parameter values than the ones compared (a branch taken only with tp_size=8),
    each named with the values: compiled from the same texts at each branch value of either spec."""
    from ..front.errors import SpecError

    base_old, base_new = old.program.param_values, new.program.param_values
    values: dict[str, set] = {}
    for spec in (old, new):
        for k, vs in _branch_values(spec).items():
            values.setdefault(k, set()).update(vs)
    out: list[TensorChange] = []
    tried = 0
    for name, vs in sorted(values.items()):
        for v in sorted(vs, key=repr):
            if base_old.get(name, v) == v and base_new.get(name, v) == v or tried >= MAX_REGIONS:
                continue
            tried += 1
            try:
                o = compile_source(old.program.source, old.program.filename,
                                   {**base_old, name: v} if name in base_old else base_old, verify_spec=False)
                n = compile_source(new.program.source, new.program.filename,
                                   {**base_new, name: v} if name in base_new else base_new, verify_spec=False)
            except SpecError:
                continue  # a value one spec does not take (outside its choices, its sizes do not divide)
            a, b = _chains(o), _chains(n)
            regions = _regions(o, n)
            for tensor in [t for t in a if t in b and t not in seen]:
                change = _compare_by_region(tensor, o, n, regions)
                if change is not None:
                    seen.add(tensor)
                    out.append(attrs.evolve(change, details=tuple(f"with {name}={v}: {d}" for d in change.details),
                                            example=f"with {name}={v}: {change.example}" if change.example else None))
    return out


def _declared(spec: CompiledSpec, chain: Chain):
    return declared_rows(spec.program, chain.source, "input")


def diff(old: CompiledSpec, new: CompiledSpec) -> SpecDiff:
    a, b = _chains(old), _chains(new)
    changes = []
    for name in [n for n in a if n not in b]:
        changes.append(TensorChange(name, ("removed",), (f"{name} is no longer converted",)))
    for name in [n for n in b if n not in a]:
        changes.append(TensorChange(name, ("added",), (f"{name} is new",)))
    regions = _regions(old, new)
    for name in [n for n in a if n in b]:
        change = _compare_by_region(name, old, new, regions)
        if change is not None:
            changes.append(change)
    changes += _param_branch_changes(old, new, {c.tensor for c in changes})
    findings = verify(new.compiled)
    verdict = "sync and contract hold" if not findings else f"the new spec breaks {len(findings)} rule(s)"
    return SpecDiff(old.program.filename, new.program.filename, tuple(changes), verdict,
                    tuple(f"line {d.pos.line}: {d.message}" if d.pos else d.message for d in findings),
                    _param_changes(old, new))


def _param_changes(old: CompiledSpec, new: CompiledSpec) -> tuple[str, ...]:
    """Parameters one spec has and the other not, or with other values: the maps are compared at the values
    shown, so a new parameter's other values are not part of the comparison, and the diff says so."""
    a, b = old.program.param_values, new.program.param_values
    out = [f"added {k} (compared at {k}={b[k]})" for k in b if k not in a]
    out += [f"removed {k} (was {k}={a[k]})" for k in a if k not in b]
    out += [f"{k}: {a[k]} -> {b[k]}" for k in a if k in b and a[k] != b[k]]
    return tuple(out)


def load_pair(old_text: str, old_name: str, new_text: str, new_name: str,
              params: Mapping[str, Any] | None = None) -> tuple[CompiledSpec, CompiledSpec]:
    """Both specs compiled without the verifier (its verdict on the new one is part of the diff)."""
    return (compile_source(old_text, old_name, params, verify_spec=False),
            compile_source(new_text, new_name, params, verify_spec=False))


def as_text(d: SpecDiff) -> str:
    if not d.changes:
        at = " at the parameter values below" if d.params else ""
        lines = [f"{d.old} -> {d.new}: no layout change{at} (every composed map, conversion and contract is identical)"]
    else:
        lines = [f"{d.old} -> {d.new}: {len(d.changes)} tensor(s) change layout"]
        for c in d.changes:
            lines.append(f"  {c.tensor}: {', '.join(c.kinds)}")
            lines += [f"    - {x}" for x in c.details]
            if c.example:
                lines.append(f"    e.g. {c.example}")
    if d.params:
        lines.append(f"  parameters: {'; '.join(d.params)}")
    lines.append(f"  verdict on {d.new}: {d.verdict}")
    lines += [f"    ! {f}" for f in d.findings]
    return "\n".join(lines) + "\n"


def as_markdown(d: SpecDiff) -> str:
    # Names, details and findings quote the specs: escaped, so a spec cannot write the report's words.
    if not d.changes:
        at = " at the parameter values below" if d.params else ""
        lines = [f"**No layout change** between {md_code(d.old)} and {md_code(d.new)}{at}: every composed map, "
                 "value conversion and contract is identical."]
    else:
        lines = [f"**{len(d.changes)} tensor(s) change layout** between {md_code(d.old)} and {md_code(d.new)}:", "",
                 "| tensor | what | details | example |", "|---|---|---|---|"]
        for c in d.changes:
            lines.append(f"| {md_code(c.tensor, cell=True)} | {md_text(', '.join(c.kinds))} | "
                         f"{'<br>'.join(md_text(x) for x in c.details)} | {md_text(c.example or '')} |")
    if d.params:
        lines += ["", "Parameters: " + "; ".join(md_code(p) for p in d.params) + (
            " (the maps are compared at these values)." if not d.changes else ".")]
    lines += ["", f"Verdict on {md_code(d.new)}: {md_text(d.verdict)}."]
    lines += [f"- {md_text(f)}" for f in d.findings]
    return "\n".join(lines) + "\n"


def as_json(d: SpecDiff) -> str:
    return json.dumps(attrs.asdict(d) | {"changed": d.changed}, indent=2)
