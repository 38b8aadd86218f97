"""``layoutc explain``: what a spec does to each tensor, for a reviewer who cannot run the kernel.

For every output tensor: its statements (with spec lines), the whole chain as one map in
algebraic form (``out[e, r, k] = in[e, (r + I) mod 2*I, k]``), the logical row order before
and after, its ties, the divisibility it needs, and the verifier's verdict. Formats: text,
Markdown, JSON.
"""

from __future__ import annotations

import json
from typing import Any

from ..api import CompiledSpec
from ..lang.compiler import Chain
from ..lower.maptext import map_text
from ..algebra.regions import _words, region_of
from ..verify.rowmap import declared_rows
from ..front.text import md_block, md_code, md_text


def _need(k) -> str:
    """A constraint without the statement's text (the chain shows it, on the same line number)."""
    text = k.message().split(": ", 1)[1]
    if k.context.startswith("the shape"):
        return text
    op = k.context.split("(", 1)[0]
    return f"{op}: {text.split(' needs ', 1)[1] if ' needs ' in text else text}"


def _when(statement) -> str:
    """The conditions a statement is under, in words (``I == 2944``, ``not (H > 4096)``, ``w13_bias``)."""
    if statement is None:
        return ""
    return " and ".join(_words(g.key, g.present) if " " in g.key else str(g) for g in statement.guards)


def _every_branch(spec: CompiledSpec, chain: Chain) -> list[dict[str, Any]]:
    """The tensor's steps in every branch of the spec's size conditions (each optional tensor present), in
    spec order, each with the conditions it is under: a statement under ``if I == 2944`` is listed with
    its condition, whichever sizes the rest of the report is shown for."""
    program = spec.program
    every = frozenset(program.optional_inputs)
    seen: dict[tuple, dict[str, Any]] = {}
    for variant in spec.compiled.variants:
        if not every <= variant.present:
            continue
        c = next((c for c in variant.chains if c.tensor == chain.tensor), None)
        for i, s in enumerate(c.steps if c is not None else ()):
            key = (s.statement.pos if s.statement else None, str(s.op), i if s.statement is None else 0)
            if key in seen:
                continue
            seen[key] = {
                "line": s.statement.pos.line if s.statement else None,
                "statement": " ".join(s.statement.text.split()) if s.statement else "",
                "op": str(s.op),
                "kind": f"packing {s.tag.family}" if s.tag is not None else s.op.category.value,
                "when": _when(s.statement),
            }
    return sorted(seen.values(), key=lambda e: (e["line"] is None, e["line"] or 0))


def tensor_report(spec: CompiledSpec, chain: Chain) -> dict[str, Any]:
    p = spec.program
    src, dst = chain.source, chain.target
    out_type = chain.out_type
    entry: dict[str, Any] = {
        "name": chain.tensor,
        "input": f"{src.elem.name}{src.shape_str()}",
        "output": f"{dst.elem.name}{dst.shape_str()}" if dst else f"{out_type}",
        "role": src.role,
        "packing": dst.packing_text if dst else None,
        "chain": _every_branch(spec, chain),
    }
    if src.tie is not None:
        partners = [t.name for t in p.inputs if t.tie is not None and t.tie.weight == src.tie.weight and t.name != src.name]
        entry["tie"] = {"kind": src.tie.kind, "weight": src.tie.weight, "block": src.tie.block,
                        "partners": [src.tie.weight] + partners}
    else:
        tied = [t.name for t in p.inputs if t.tie is not None and t.tie.weight == src.name]
        if tied:
            entry["tie"] = {"kind": "weight", "partners": tied}
    rows_in = declared_rows(p, src, "input")
    rows_out = declared_rows(p, dst, "output") if dst else None
    entry["rows"] = {"input": str(rows_in) if rows_in else None, "output": str(rows_out) if rows_out else None}
    # An output declared once per size branch: every declaration with its condition, not only this region's.
    declared = [o for o in p.outputs + p.conditional_outputs if o.name == chain.tensor]
    if len(declared) > 1:
        entry["outputs"] = [
            {"line": o.pos.line, "when": _when(o), "rows": str(r) if (r := declared_rows(p, o, "output")) else None,
             "packing": o.packing_text}
            for o in sorted(declared, key=lambda o: o.pos.line)]
    entry["map"] = map_text(chain, dst.shape_text if dst else ())
    region = region_of(p, spec.compiled.variants[-1].present)
    if region.conditional:  # the map of one region: the one where every size condition holds
        entry["region"] = region.describe()
    entry["needs"] = [
        {"text": _need(k), "line": k.pos.line if k.pos else None, "status": k.status}
        for k in dict.fromkeys(chain.constraints)
    ]
    return entry


def explain(spec: CompiledSpec, tensor: str | None = None) -> dict[str, Any]:
    p = spec.program
    variant = spec.compiled.variants[-1]  # every optional tensor present
    chains = [c for c in variant.chains if tensor is None or c.tensor == tensor]
    covered, _ = spec.coverage
    by_tensor = {c.tensor: c for c in covered}
    reports = []
    for c in chains:
        entry = tensor_report(spec, c)
        cov = by_tensor.get(c.tensor)
        entry["proved"] = list(cov.proved) if cov else []
        entry["unchecked"] = list(cov.unchecked) if cov else []
        entry["scope"] = cov.scope if cov else ""  # the sizes and parameter values the claims hold for
        reports.append(entry)
    unchecked = sum(len(t["unchecked"]) for t in reports)
    return {
        "spec": p.name,
        "file": p.filename,
        "sha256": p.sha256,
        "params": p.param_values,
        "requires": [str(r) for r in p.requires],
        "dims": list(p.dims),
        "assume": [f"{a.dim} % {a.multiple} == 0" for a in p.assumptions] + [a.text for a in p.size_assumptions],
        "verdict": "verified: types and sizes, sync along ties, kernel contract" + (
            f"; {unchecked} claim{'s' if unchecked != 1 else ''} not checked (see 'not checked' below; "
            "check --strict refuses them)" if unchecked else ""),
        "tensors": reports,
    }


def as_text(r: dict[str, Any]) -> str:
    params = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "none"
    lines = [
        f"{r['spec']}  ({r['file']}, sha256 {r['sha256'][:12]}), parameters: {params}",
        f"requires {', '.join(r['requires']) or 'nothing'}; dims {', '.join(r['dims'])}"
        + (f"; assume {', '.join(r['assume'])}" if r["assume"] else ""),
        f"verdict: {r['verdict']}",
    ]
    for t in r["tensors"]:
        lines += ["", f"{t['name']}  {t['input']} -> {t['output']}"]
        if "tie" in t:
            tie = t["tie"]
            what = {"scales": f"scales of {tie.get('weight')}, block {tie.get('block')}",
                    "bias": f"bias of {tie.get('weight')}", "weight": "weight"}[tie["kind"]]
            lines.append(f"  role     {what} (tied with {', '.join(tie['partners'])})")
        if t.get("outputs"):  # one declaration per size branch: each with its condition
            for i, o in enumerate(t["outputs"]):
                rows = f"rows {t['rows']['input']} -> {o['rows']}" if o["rows"] or t["rows"]["input"] else ""
                what = "; ".join(x for x in (rows, f"packing {o['packing'] or 'none'}") if x)
                lines.append(f"  {'output' if i == 0 else '':<8} {what}  [if {o['when']}] (line {o['line']})")
        else:
            if t["rows"]["input"] or t["rows"]["output"]:
                lines.append(f"  rows     {t['rows']['input']} -> {t['rows']['output']}")
            if t["packing"]:
                lines.append(f"  packing  {t['packing']}")
        lines.append("  chain" + ("    (none: copied as is)" if not t["chain"] else ""))
        width = max((len(s["statement"]) for s in t["chain"]), default=0)
        for s in t["chain"]:
            when = f"  [if {s['when']}]" if s.get("when") else ""
            lines.append(f"    {s['line']:>4}  {s['statement']:<{width}}  {s['op']:<34} {s['kind']}{when}")
        at = f" (at {t['region']})" if t.get("region") else ""
        lines.append(f"  map{at}\n           " + t["map"].replace("\n", "\n" + " " * 11) if at else
                     "  map      " + t["map"].replace("\n", "\n" + " " * 11))
        for i, n in enumerate(t["needs"]):
            where = f"line {n['line']}" if n["line"] else "shape"
            lines.append(f"  {'needs' if i == 0 else '':<8} {n['text']}  ({where}, {n['status']})")
        for i, what in enumerate(t.get("proved", ())):
            lines.append(f"  {'proved' if i == 0 else '':<8} {what}")
        if t.get("scope") and t.get("proved"):
            lines.append(f"  {'':<8} (claims hold {t['scope']})")
        for i, what in enumerate(t.get("unchecked", ())):
            lines.append(f"  {'not checked' if i == 0 else '':<8} {what}")
    return "\n".join(lines) + "\n"


def as_markdown(r: dict[str, Any]) -> str:
    # Every name and value comes from the spec: code spans and prose that it cannot break out of.
    c, t_ = md_code, md_text
    params = ", ".join(c(f"{k}={v}") for k, v in r["params"].items()) or "none"
    lines = [
        f"### {c(r['spec'])}",
        "",
        f"{c(r['file'])} (sha256 {c(r['sha256'][:12])}), parameters: {params}, requires "
        f"{', '.join(c(str(q)) for q in r['requires']) or 'nothing'}, dims {c(', '.join(r['dims']))}.",
        f"Verdict: {t_(r['verdict'])}.",
    ]
    for t in r["tensors"]:
        lines += ["", f"#### {c(t['name'])}: {c(t['input'])} -> {c(t['output'])}", ""]
        facts = []
        if "tie" in t:
            facts.append(f"Tied with {', '.join(c(x) for x in t['tie']['partners'])}")
        if t.get("outputs"):  # one declaration per size branch: each with its condition
            facts += [f"{'when' if facts else 'When'} {c(o['when'])}: rows {c(str(t['rows']['input']))} -> "
                      f"{c(str(o['rows']))}, packing {c(str(o['packing'] or 'none'))} (line {o['line']})"
                      for o in t["outputs"]]
        else:
            if t["rows"]["input"] or t["rows"]["output"]:
                facts.append(f"{'rows' if facts else 'Rows'} {c(str(t['rows']['input']))} -> "
                             f"{c(str(t['rows']['output']))}")
            if t["packing"]:
                facts.append(f"{'packing' if facts else 'Packing'} {c(str(t['packing']))}")
        if facts:
            lines += ["; ".join(facts) + ".", ""]
        if t["chain"]:
            lines += ["| line | statement | primitive | kind | when |", "|---|---|---|---|---|"]
            lines += [f"| {s['line']} | {c(s['statement'], cell=True)} | {c(str(s['op']), cell=True)} | "
                      f"{t_(str(s['kind']))} | {c(s['when'], cell=True) if s.get('when') else 'always'} |"
                      for s in t["chain"]]
        else:
            lines.append("Copied as is.")
        if "\n" in t["map"]:
            lines += ["", "Map:", "", md_block(t["map"])]
        else:
            lines += ["", f"Map: {c(t['map'])}"]
        if t["needs"]:
            lines += ["", "Needs: " + "; ".join(f"{c(n['text'])} ({t_(n['status'])})" for n in t["needs"])]
        if t.get("proved"):
            lines += ["", "Proved: " + "; ".join(t_(x) for x in t["proved"])
                      + (f" (claims hold {t_(t['scope'])})" if t.get("scope") else "") + "."]
        if t.get("unchecked"):
            lines += ["", "**Not checked**: " + "; ".join(t_(x) for x in t["unchecked"]) + "."]
    return "\n".join(lines) + "\n"


def render(r: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(r, indent=2)
    if fmt == "markdown":
        return as_markdown(r)
    return as_text(r)
