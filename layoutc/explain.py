"""``layoutc explain``: what a spec does to each tensor, for a reviewer who cannot run the kernel.

For every output tensor: its statements (with spec lines), the whole chain as one map in
algebraic form (``out[e, r, k] = in[e, (r + I) mod 2*I, k]``), the logical row order before
and after, its ties, the divisibility it needs, and the verifier's verdict. Formats: text,
Markdown, JSON.
"""

from __future__ import annotations

import json
from typing import Any

from . import expr as ex
from .api import CompiledSpec
from .compiler import Chain
from .indexmap import IndexMap
from .lower.fused import plan as fused_plan
from .rowmap import declared_rows

ROLE_NAMES = {3: ["e", "r", "k"], 2: ["e", "r"], 1: ["r"]}


def coordinate_names(rank: int, shape_text: tuple[str, ...] = ()) -> list[str]:
    if shape_text and len(shape_text) == 5 and shape_text[-2:] == ("16", "16"):
        return ["e", "rb", "kb", "f", "c"]  # the SM90 fold's [E, R/64, K/128, 16, 16]
    return list(ROLE_NAMES.get(rank, ["e"] + [f"i{k}" for k in range(1, rank)]))


#: A composed map longer than this is printed with named subexpressions (``with p = ...``).
MAP_WIDTH = 110


def render_map(m: IndexMap, names: list[str], width: int = MAP_WIDTH) -> str:
    """``out[e, r, k] = in[...]``; a long map (a swizzled scale's runs to a kilobyte) on several lines,
    with repeated subexpressions named once (:func:`name_repeats`)."""
    ranges = ex.coordinate_ranges(m.out_shape)
    tidy = lambda e: ex.rename(ex.simplify_symbolic(e, ranges), {f"o{k}": n for k, n in enumerate(names)})  # noqa: E731
    exprs = [tidy(s) for s in m.src] + ([] if m.is_total() else [tidy(m.valid), tidy(m.fill)])

    def line(es: list[ex.Expr]) -> str:
        text = f"out[{', '.join(names)}] = in[{', '.join(ex.to_str(s) for s in es[:len(m.src)])}]"
        if not m.is_total():
            text += f" where {ex.to_str(es[-2])}, else {ex.to_str(es[-1])}"
        return text

    return name_repeats(exprs, line, set(names), width)


def name_repeats(exprs: list[ex.Expr], line, coords: set[str], width: int = MAP_WIDTH) -> str:
    """``line(exprs)``, with the definitions of :func:`factor` below it (``with A = round_up(I, 128)``)."""
    exprs, order = factor(exprs, line, coords, width)
    out = [line(exprs)]
    for i, (name, value) in enumerate(order):
        out.append(f"{'with' if i == 0 else '    '} {name} = {ex.to_str(value)}")
    return "\n".join(out)


def factor(exprs: list[ex.Expr], line, coords: set[str], width: int = MAP_WIDTH) -> tuple[list[ex.Expr], list]:
    """While a line is longer than ``width``, the subexpression whose repeats are longest in all is
    replaced by a name: sizes get capitals, expressions of the coordinates lower case. Returns the
    expressions with the names in and [(name, definition)], each definition using only names before it."""
    taken = set(coords) | {v for e in exprs for v in ex.free_vars(e)}
    upper = iter([c for c in "ABCDFGJLMNPQRSTUVWXYZ" if c not in taken])
    lower = iter([c for c in "pqstuvwxyzabdghjlmn" if c not in taken])
    local = set(coords)  # names that depend on the coordinates
    chosen: list[tuple[str, ex.Expr]] = []

    def render() -> list[str]:
        return [line(exprs)] + [f"{name} = {ex.to_str(value)}" for name, value in chosen]

    while max(len(x) for x in render()) > width:
        counts: dict[ex.Expr, int] = {}

        def walk(e: ex.Expr) -> None:
            if isinstance(e, (ex.Var, ex.Const)):
                return
            counts[e] = counts.get(e, 0) + 1
            for k in ex.children(e):
                walk(k)

        for e in exprs + [d for _, d in chosen]:
            walk(e)
        scored = [(len(ex.to_str(e)) * (n - 1), e) for e, n in counts.items() if n > 1 and len(ex.to_str(e)) >= 9]
        if not scored:
            break
        e = max(scored, key=lambda x: x[0])[1]
        name = next(lower if ex.free_vars(e) & local else upper, None)
        if name is None:
            break
        if ex.free_vars(e) & local:
            local.add(name)
        var = ex.Var(name)
        exprs = [_replace(x, e, var) for x in exprs]
        chosen = [(n, _replace(d, e, var)) for n, d in chosen] + [(name, e)]
    # Definitions in dependency order: sizes first, then each after the names it uses.
    order: list[tuple[str, ex.Expr]] = []
    pending = sorted(chosen, key=lambda nd: (nd[0] in local, nd[0]))
    while pending:
        ready = next(i for i, (_, d) in enumerate(pending)
                     if not (ex.free_vars(d) & {n for n, _ in pending}) or i == len(pending) - 1)
        order.append(pending.pop(ready))
    return exprs, order


def _replace(e: ex.Expr, target: ex.Expr, by: ex.Expr) -> ex.Expr:
    if e == target:
        return by
    kids = ex.children(e)
    if not kids:
        return e
    new = tuple(_replace(k, target, by) for k in kids)
    return e if new == kids else ex.rebuild(e, new)


def render_words(chain: Chain) -> str | None:
    p = fused_plan(chain)
    if p.kind != "words":
        return None
    names = coordinate_names(len(p.word_shape))[:-1] + ["w"]
    ren = {f"o{k}": n for k, n in enumerate(names)}
    coords = [ex.rename(x, ren) for c in p.word_sources for x in c]
    sizes = [len(c) for c in p.word_sources]

    def line(es: list[ex.Expr]) -> str:
        parts, at = [], 0
        for t, n in enumerate(sizes):
            c = ", ".join(ex.to_str(x) for x in es[at:at + n])
            at += n
            parts.append(f"in[{c}]" + (f" << {8 * t}" if t else ""))
        return (f"word[{', '.join(names)}] (output bytes 4w..4w+3) = bits permuted by T of ("
                + " | ".join(parts) + ")")

    return name_repeats(coords, line, set(names), 160) + f"\n     T = {list(p.table)}"


def _need(k) -> str:
    """A constraint without the statement's text (the chain shows it, on the same line number)."""
    text = k.message().split(": ", 1)[1]
    if k.context.startswith("the shape"):
        return text
    op = k.context.split("(", 1)[0]
    return f"{op}: {text.split(' needs ', 1)[1] if ' needs ' in text else text}"


def tensor_report(spec: CompiledSpec, chain: Chain) -> dict[str, Any]:
    p = spec.program
    src, dst = chain.source, chain.target
    out_type = chain.out_type
    entry: dict[str, Any] = {
        "name": chain.tensor,
        "input": f"{src.elem.name}{src.shape_str()}",
        "output": f"{dst.elem.name}{dst.shape_str()}" if dst else f"{out_type}",
        "role": src.role,
        "packing": dst.packing if dst else None,
        "chain": [
            {
                "line": s.statement.pos.line if s.statement else None,
                "statement": " ".join(s.statement.text.split()) if s.statement else "",
                "op": str(s.op),
                "kind": f"packing {s.tag.family}" if s.tag is not None else s.op.category.value,
            }
            for s in chain.steps
        ],
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
    m = chain.composed_map()
    if m.bit_level:
        entry["map"] = render_words(chain) or "bit-level map (see the statements)"
    else:
        entry["map"] = render_map(m, coordinate_names(len(m.out_shape), dst.shape_text if dst else ()))
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
        reports.append(entry)
    unchecked = sum(len(t["unchecked"]) for t in reports)
    return {
        "spec": p.name,
        "file": p.filename,
        "sha256": p.sha256,
        "params": p.param_values,
        "requires": [str(r) for r in p.requires],
        "dims": list(p.dims),
        "assume": [f"{a.dim} % {a.multiple} == 0" for a in p.assumptions],
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
        if t["rows"]["input"] or t["rows"]["output"]:
            lines.append(f"  rows     {t['rows']['input']} -> {t['rows']['output']}")
        if t["packing"]:
            lines.append(f"  packing  {t['packing']}")
        lines.append("  chain" + ("    (none: copied as is)" if not t["chain"] else ""))
        width = max((len(s["statement"]) for s in t["chain"]), default=0)
        for s in t["chain"]:
            lines.append(f"    {s['line']:>4}  {s['statement']:<{width}}  {s['op']:<34} {s['kind']}")
        lines.append("  map      " + t["map"].replace("\n", "\n" + " " * 11))
        for i, n in enumerate(t["needs"]):
            where = f"line {n['line']}" if n["line"] else "shape"
            lines.append(f"  {'needs' if i == 0 else '':<8} {n['text']}  ({where}, {n['status']})")
        for i, what in enumerate(t.get("proved", ())):
            lines.append(f"  {'proved' if i == 0 else '':<8} {what}")
        for i, what in enumerate(t.get("unchecked", ())):
            lines.append(f"  {'not checked' if i == 0 else '':<8} {what}")
    return "\n".join(lines) + "\n"


def as_markdown(r: dict[str, Any]) -> str:
    params = ", ".join(f"`{k}={v}`" for k, v in r["params"].items()) or "none"
    lines = [
        f"### `{r['spec']}`",
        "",
        f"`{r['file']}` (sha256 `{r['sha256'][:12]}`), parameters: {params}, requires "
        f"{', '.join(f'`{q}`' for q in r['requires']) or 'nothing'}, dims `{', '.join(r['dims'])}`.",
        f"Verdict: {r['verdict']}.",
    ]
    for t in r["tensors"]:
        lines += ["", f"#### `{t['name']}`: `{t['input']}` -> `{t['output']}`", ""]
        facts = []
        if "tie" in t:
            facts.append(f"tied with {', '.join(f'`{x}`' for x in t['tie']['partners'])}")
        if t["rows"]["input"] or t["rows"]["output"]:
            facts.append(f"rows `{t['rows']['input']}` -> `{t['rows']['output']}`")
        if t["packing"]:
            facts.append(f"packing `{t['packing']}`")
        if facts:
            lines += ["; ".join(facts).capitalize() + ".", ""]
        if t["chain"]:
            lines += ["| line | statement | primitive | kind |", "|---|---|---|---|"]
            lines += [f"| {s['line']} | `{s['statement']}` | `{s['op']}` | {s['kind']} |" for s in t["chain"]]
        else:
            lines.append("Copied as is.")
        if "\n" in t["map"]:
            lines += ["", "Map:", "", "```", t["map"], "```"]
        else:
            lines += ["", f"Map: `{t['map']}`"]
        if t["needs"]:
            lines += ["", "Needs: " + "; ".join(f"`{n['text']}` ({n['status']})" for n in t["needs"])]
        if t.get("proved"):
            lines += ["", "Proved: " + "; ".join(t["proved"]) + "."]
        if t.get("unchecked"):
            lines += ["", "**Not checked**: " + "; ".join(t["unchecked"]) + "."]
    return "\n".join(lines) + "\n"


def render(r: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(r, indent=2)
    if fmt == "markdown":
        return as_markdown(r)
    return as_text(r)
