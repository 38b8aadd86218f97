"""Writing the inferred spec: statements merged over tensors, output declarations, the spec text.

:func:`merge_statements` joins the per-tensor chains into statements on several tensors, :func:`_harmonise`
makes tied tensors' packings agree, and :func:`_write` renders the contract, ``assume`` lines, statements and
output declarations (types, row order read off the chains) and verifies the text. Kept apart from the search:
this reads only :class:`~layoutc.equiv.infer_axes.TensorChain` s.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from ..algebra import expr as ex
from .function_runner import EquivError
from ..front.text import char_name, comment, display, forbidden
from ..lang.ops.shape import Pad
from .infer_axes import Stmt, TensorChain
from .infer_tensors import _family_steps


# ---------------------------------------------------------------------------
# writing the spec


def _size_text(e: ex.Expr) -> str:
    """A size in the spec language: ``round_up`` and ``ceil_div`` for the forms the compiler makes."""
    if isinstance(e, ex.Const):
        return str(e.value)
    if isinstance(e, ex.Var):
        return e.name
    if isinstance(e, ex.Div):
        return f"{_atom(e.num)}/{_atom(e.den)}"
    if isinstance(e, ex.FloorDiv) and isinstance(e.den, ex.Const):
        m = e.den.value
        inner = ex.add(e.num, -(m - 1))
        return f"ceil_div({_size_text(inner)}, {m})"
    if isinstance(e, ex.Mul):
        consts = [a for a in e.args if isinstance(a, ex.Const)]
        rest = [a for a in e.args if not isinstance(a, ex.Const)]
        if len(consts) == 1 and len(rest) == 1 and isinstance(rest[0], ex.FloorDiv) \
                and isinstance(rest[0].den, ex.Const) and consts[0].value % rest[0].den.value == 0:
            m, k = rest[0].den.value, consts[0].value // rest[0].den.value
            up = f"round_up({_size_text(ex.add(rest[0].num, -(m - 1)))}, {m})"
            return up if k == 1 else f"{k}*{up}"
        return "*".join(_atom(a) for a in e.args)
    if isinstance(e, ex.Add):
        parts = []
        for i, a in enumerate(e.args):
            text = _size_text(a)
            if i and text.startswith("-"):
                parts.append(" - " + text[1:])
            else:
                parts.append((" + " if i else "") + text)
        return "".join(parts)
    raise EquivError(f"size {ex.to_str(e)} has no spec syntax")


def _atom(e: ex.Expr) -> str:
    text = _size_text(e)
    return f"({text})" if isinstance(e, ex.Add) else text


def merge_statements(chains: Sequence[TensorChain]) -> list[str]:
    """One line per statement, tensors that take the same statement at the same point of their chains
    together: ``swap_halves([w13_weight, w13_weight_scale], dim=1)``."""
    pending = {c.tensor: list(c.statements) for c in chains}
    lines: list[str] = []
    while any(pending.values()):
        heads: dict[str, list[str]] = {}
        for t, stmts in pending.items():
            if stmts:
                heads.setdefault(stmts[0].text, []).append(t)
        _, tensors = max(heads.items(), key=lambda kv: (-_phase(pending[kv[1][0]][0]), len(kv[1])))
        stmt = pending[tensors[0]][0]
        if stmt.kind == "table":
            lines.append("# layoutc infer: no registered op gives this row order at every sampled shape; an explicit "
                         "table follows (review it: it repeats with its length)")
        lines.append(stmt.on(tensors))
        for t in tensors:
            pending[t].pop(0)
    return lines


def _phase(st: Stmt) -> int:
    return {"row": 0, "k": 0, "table": 0, "value": 1, "family": 2, "view": 3}[st.kind]


def _harmonise(program, chains: dict[str, TensorChain]) -> None:
    """A scale padded at its end where the next family pads it anyway, and its weight not padded there:
    leave the padding to the family (the verifier compares a scale's logical rows with its weight's)."""
    for t in program.inputs:
        if t.tie is None or t.tie.weight not in chains or t.name not in chains:
            continue
        mine, theirs = chains[t.name], chains[t.tie.weight]
        weight_pads = {(s.axis, s.op) for s in theirs.statements if s.op and s.op[0] == "pad"}
        stmts = list(mine.statements)
        fam_index = next((i for i, s in enumerate(stmts) if s.kind == "family"), None)
        if fam_index is None:
            continue
        family_pads = _leading_pads(t, stmts[fam_index].op)
        keep = []
        for i, s in enumerate(stmts):
            if s.op and s.op[0] == "pad" and s.op[2] == 1 and s.axis in family_pads \
                    and all(x.kind in ("row", "k", "value") and (x.op is None or x.op[0] == "pad")
                            for x in stmts[i + 1:fam_index]):
                multiple = s.op[1]
                if family_pads[s.axis] % multiple == 0 and not any(a == s.axis and o[0] == "pad"
                                                                   for a, o in weight_pads):
                    continue
            keep.append(s)
        chains[t.name] = attrs.evolve(mine, statements=tuple(keep))


def _leading_pads(tensor, family_op) -> dict[int, int]:
    """Axis -> multiple of the whole-axis pads a family applies first (before any other step moves the
    axes), read from the family's own steps: a pad there that the statements also do is redundant."""
    if not family_op or family_op[0] != "family":
        return {}
    _, name, params = family_op
    rank = len(tensor.shape)
    try:
        steps = _family_steps(name, tensor.role, tensor.elem, [ex.Var(f"_a{k}") for k in range(rank)], dict(params))
    except Exception:  # noqa: BLE001 - the family does not apply to this tensor: nothing known about its pads
        return {}
    pads: dict[int, int] = {}
    for st in steps:
        if not isinstance(st.op, Pad):
            break
        if st.op.parts == 1:
            pads.setdefault(st.op.dim % rank, st.op.multiple)
    return pads


def _out_rows(chain, dims) -> str | None:
    """The declared output row order of a tensor that declares input rows, as the chain leaves it."""
    from ..verify.rowmap import axis_map, describe_labels, n_rows, row_labels

    rows = chain.source.rows
    if rows is None:
        return None
    amap = axis_map(chain, dims)
    n = n_rows(chain.source, dims)
    labels = row_labels(rows, n)
    actual = [labels[r] if r >= 0 else None for r in amap.rows]
    text = describe_labels(actual, rows.shards)
    text = text.replace(" with each shard padded", "")
    if " then " in text or text.startswith("the order"):
        return None
    return text


def _check_name(what: str, name: str) -> None:
    """A spec or parameter name the written spec can hold as one NAME token (the -D check)."""
    from ..lang.resolver import check_param_name

    try:
        check_param_name(name)
    except ValueError:
        raise EquivError(f"{what} {display(name)!r} is not an identifier (letters, digits and '_', "
                         f"not starting with a digit)") from None


def _param_text(name: str, value: Any) -> str:
    """``value`` as a spec literal: true/false and integers bare, anything else a quoted STRING. The
    grammar's strings have no escapes, so a value that cannot sit between quotes as one line of
    printable text (a quote, a newline, a control character, or ';', which ends a statement for the
    reader even where the parser would not) is refused rather than written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise EquivError(f"parameter {name}: {type(value).__name__} values cannot be written into a spec")
    bad = next((c for c in value if c in '";\n' or forbidden(c) or not c.isprintable()), None)
    if bad is not None:
        raise EquivError(f"parameter {name}: the value {display(value)!r} holds {char_name(bad)}, which a spec "
                         f"string cannot hold (no quotes, ';', newlines or control characters)")
    return f'"{value}"'


def _write(program, contract: str, chains: dict[str, TensorChain], assumes, params, target, envs, spec_name):
    from ..api import compile_source
    from ..lang.compiler import _Builder
    from ..front.errors import SpecError
    from ..lang.resolver import resolve
    from ..front.parse import parse

    lines_in = contract.splitlines()
    shown = "; ".join(", ".join(f"{k}={v}" for k, v in e.items()) for e in envs)
    # comment(): a function's name (or a -D value) is shown on one line and cannot end the comment
    with_params = "; with " + ", ".join(f"{k}={_param_text(k, v)}" for k, v in params.items()) if params else ""
    head = [f"# {comment(f'Inferred by layoutc infer from {target.name}')}",
            f"# {comment(f'(measured at {shown}{with_params}).')}",
            "# Review before use: every statement reproduces the function's element moves at those shapes and",
            "# equiv checked the whole spec at more; the names of the row orders are read off the maps.",
            f"spec {spec_name}", ""]
    body = [ln for ln in lines_in if ln.strip()]
    dims_lines = [ln for ln in body if ln.strip().startswith("dims ")]
    other = [ln for ln in body if not ln.strip().startswith("dims ")]
    params_lines = [f"param {k} = {_param_text(k, v)}" for k, v in params.items()]
    statements = merge_statements(list(chains.values()))
    draft = "\n".join(head + dims_lines + assumes + params_lines + other + [""] + statements) + "\n"
    program2 = resolve(parse(draft, f"{spec_name}.lyt"), {})
    builder = _Builder(program2)
    present = frozenset(program2.optional_inputs)
    outs = []
    chain_objs = {}
    for t in program2.inputs:
        if t.name not in chains:
            continue
        c = builder.chain(t, present)
        if c is None:
            errs = [d.format(f"{spec_name}.lyt", draft) for d in builder.diags.diagnostics]
            return draft, tuple(errs) or (f"{t.name}: the inferred statements do not type",)
        chain_objs[t.name] = c
    errs = [d for d in builder.diags.diagnostics if d.severity == "error"]
    if errs:
        return draft, tuple(d.format(f"{spec_name}.lyt", draft) for d in errs)
    sample = envs[0]
    for t in program2.inputs:
        if t.name not in chain_objs:
            continue
        c = chain_objs[t.name]
        typ = c.out_type
        shape = "[" + ", ".join(_size_text(s) for s in typ.shape) + "]"
        fams = [s.family for s in chains[t.name].statements if s.kind == "family"]
        decl = f"output {t.name}{'?' if t.optional else ''} : {typ.elem.name}{shape}"
        rows = _out_rows(c, sample) if t.rows is not None else None
        outs.append((decl, rows, fams))

    def render(with_rows: bool) -> str:
        lines = []
        for decl, rows, fams in outs:
            extra = ((f"   rows {rows}" if rows and with_rows else "")
                     + (f"   packing {' + '.join(fams)}" if fams else ""))
            lines.append(decl + extra)
        return draft + "\n" + "\n".join(lines) + "\n"

    last_errors: tuple[str, ...] = ()
    for with_rows in (True, False):
        text = render(with_rows)
        try:
            compile_source(text, f"{spec_name}.lyt", check_versions=False)
            return text, ()
        except SpecError as err:
            last_errors = tuple(d.format(f"{spec_name}.lyt", text) for d in err.errors)
    return render(True), last_errors
