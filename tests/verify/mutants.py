"""Systematic mutants of a spec's text, for mutation testing of the verifier.

Operators (each yields (description, mutated text)):
  delete   one transform statement, or one whole ``if`` block
  number   every integer literal -> n+1, 2n, n/2, 0
  sibling  a tensor name in a transform -> another tensor of its tie group (weight/scale/bias)
  drop     one tensor from a transform's tensor list
  dtype    the element type of a declaration -> another type of the same family
  rows     the shard order of a ``rows [a; b]`` declaration reversed
  cond     the comparison of an ``if`` -> its negation and its boundary neighbours (``==`` -> ``!=``,
           ``<`` -> ``<=``), and every constant inside a condition (also by ``number``) -> n-1
"""

from __future__ import annotations

from typing import Iterator

from lark import Token, Tree

from layoutc.front.parse import parser

DTYPE_SWAPS = {"bf16": ["f32", "f16"], "f32": ["bf16"], "f16": ["bf16"], "e8m0": ["e4m3"], "e4m3": ["e8m0"],
               "fp4x2": ["u8"], "u8": ["fp4x2"]}


def _replace(text: str, start: int, end: int, new: str) -> str:
    return text[:start] + new + text[end:]


def _tie_groups(tree: Tree) -> dict[str, list[str]]:
    groups: dict[str, str] = {}
    for decl in tree.find_data("input_decl"):
        name = str(decl.children[0])
        weight = name
        for attr in decl.children[3:]:
            if isinstance(attr, Tree) and attr.data in ("scales_attr", "bias_attr"):
                weight = str(attr.children[0])
        groups[name] = weight
    members: dict[str, list[str]] = {}
    for name, weight in groups.items():
        members.setdefault(weight, []).append(name)
    return {name: [m for m in members[groups[name]] if m != name] for name in groups}


COMPARE_SWAPS = {"==": ["!="], "!=": ["=="], "<": ["<=", ">="], "<=": ["<", ">"], ">": [">=", "<="],
                 ">=": [">", "<"]}


def mutants(text: str) -> Iterator[tuple[str, str]]:
    tree = parser().parse(text)
    line_of = lambda pos: text.count("\n", 0, pos) + 1  # noqa: E731

    for node in list(tree.find_data("op_call")) + list(tree.find_data("if_stmt")):
        m = node.meta
        kind = "if block" if node.data == "if_stmt" else "statement"
        yield f"delete {kind} at line {m.line}", _replace(text, m.start_pos, m.end_pos, "")

    for tok in tree.scan_values(lambda v: isinstance(v, Token) and v.type == "INT"):
        n = int(tok)
        for new in sorted({n + 1, 2 * n, n // 2, 0} - {n}):
            yield f"number {n} -> {new} at {tok.line}:{tok.column}", _replace(text, tok.start_pos, tok.end_pos, str(new))

    siblings = _tie_groups(tree)
    for call in tree.find_data("op_call"):
        args = [c for c in call.children[1:] if isinstance(c, Tree)]
        if not args or args[0].data != "posarg":
            continue
        first = args[0].children[0]
        names = [first] if isinstance(first, Tree) and first.data == "name" else (
            [c for c in first.children if isinstance(c, Tree) and c.data == "name"] if isinstance(first, Tree) else [])
        for name in names:
            tok = name.children[0]
            for sib in siblings.get(str(tok), []):
                yield (f"tensor {tok} -> {sib} at line {tok.line}",
                       _replace(text, tok.start_pos, tok.end_pos, sib))
        if isinstance(first, Tree) and first.data == "list" and len(names) > 1:
            for i, name in enumerate(names):
                rest = [str(n.children[0]) for j, n in enumerate(names) if j != i]
                yield (f"drop {name.children[0]} from the list at line {line_of(first.meta.start_pos)}",
                       _replace(text, first.meta.start_pos, first.meta.end_pos, "[" + ", ".join(rest) + "]"))

    for decl in list(tree.find_data("input_decl")) + list(tree.find_data("output_decl")):
        elem = decl.children[2]
        for new in DTYPE_SWAPS.get(str(elem), []):
            yield f"type {elem} -> {new} at line {elem.line}", _replace(text, elem.start_pos, elem.end_pos, new)

    for rows in tree.find_data("stacked_rows"):
        shards = [str(t) for t in rows.children]
        if len(shards) > 1:
            yield (f"rows reversed at line {rows.meta.line}",
                   _replace(text, rows.meta.start_pos, rows.meta.end_pos, "[" + "; ".join(reversed(shards)) + "]"))

    for cond in tree.find_data("cond_cmp"):
        for tok in cond.scan_values(lambda v: isinstance(v, Token) and v.type == "COMPARE"):
            for new in COMPARE_SWAPS.get(str(tok), []):
                yield (f"condition {tok} -> {new} at {tok.line}:{tok.column}",
                       _replace(text, tok.start_pos, tok.end_pos, new))
        for tok in cond.scan_values(lambda v: isinstance(v, Token) and v.type == "INT"):
            n = int(tok)
            if n > 1:  # n+1, 2n, n/2 and 0 come from the number operator; the boundary's other side here
                yield (f"condition constant {n} -> {n - 1} at {tok.line}:{tok.column}",
                       _replace(text, tok.start_pos, tok.end_pos, str(n - 1)))
