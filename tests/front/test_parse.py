"""The parser: text -> syntax tree, with a source position on every node."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from layoutc import SpecError
from layoutc.front import ast
from layoutc.algebra import expr as ex
from layoutc.front.parse import parse

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "specs").glob("*.lyt"))

DEMO = """\
spec demo
requires flashinfer >= 0.6.16
param gated = true
param act = silu choices [silu, relu2]
dims E, I, H
assume I % 128 == 0
input w13? : fp4x2[E, 2*I, H/2] rows [w1; w3]
input s : e8m0[E, 2*I, H/32] scales w13 block 32
if gated { swap_halves(w13, dim=1) } else { swap_pairs(w13) }
if act in [silu, relu2] { cast(s, u8) }
output w13? : fp4x2[E, 2*I, H/2] rows interleave(w3, w1, group=64) packing sm90_mixed
"""


def _nodes(obj):
    """Every attrs node reachable from obj (the tree, not expressions)."""
    if isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _nodes(item)
    elif attrs.has(type(obj)) and type(obj).__module__ == ast.__name__:
        yield obj
        for f in attrs.fields(type(obj)):
            yield from _nodes(getattr(obj, f.name))


def _slice(source: str, pos: ast.Pos) -> str:
    lines = source.splitlines()
    assert pos.line == pos.end_line, pos
    return lines[pos.line - 1][pos.column - 1 : pos.end_column - 1]


# -- positions ---------------------------------------------------------------


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_node_of_shipped_specs_has_a_position(path):
    source = path.read_text()
    spec = parse(source, str(path))
    n_lines = len(source.splitlines())
    nodes = list(_nodes(spec.items))
    assert len(nodes) > 50
    kinds = set()
    for node in nodes:
        if isinstance(node, ast.Pos):
            continue
        kinds.add(type(node).__name__)
        pos = getattr(node, "pos", None)
        assert isinstance(pos, ast.Pos), f"{type(node).__name__} has no Pos: {node!r}"
        assert 1 <= pos.line <= pos.end_line <= n_lines
        assert pos.column >= 1 and pos.end_column >= 1
        assert (pos.end_line, pos.end_column) > (pos.line, pos.column), node
    # The shipped specs exercise most node kinds (a `requires` line only where a library version matters:
    # the FlashInfer specs; the backends beyond FlashInfer name no installed library).
    expected = {"SpecName", "Requires", "Dims", "TensorDecl", "Transform", "Arg", "Name", "ExprValue"}
    if not path.stem.startswith("flashinfer_"):
        expected -= {"Requires"}
    assert expected <= kinds


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_positions_of_shipped_specs_point_at_their_text(path):
    source = path.read_text()
    spec = parse(source, str(path))
    checked = 0
    for node in _nodes(spec.items):
        if isinstance(node, ast.Name):
            assert _slice(source, node.pos) == node.text
            checked += 1
        elif isinstance(node, (ast.ExprValue, ast.ListValue, ast.Transform, ast.Condition)):
            if node.pos.line == node.pos.end_line:
                assert _slice(source, node.pos) == node.text
                checked += 1
    assert checked > 30


def test_shipped_statement_positions_match_the_file():
    path = ROOT / "specs" / "flashinfer_cutlass_bf16.lyt"
    source = path.read_text()
    spec = parse(source, str(path))
    lines = source.splitlines()
    transforms = [i for i in spec.items if isinstance(i, ast.Transform)]
    # Every statement of the file, in order, at the line and column where its text starts.
    expected = []
    for n, line in enumerate(lines, 1):
        code = line.split("#", 1)[0]
        for part in code.split(";"):
            if "(" in part and not part.lstrip().startswith(("input", "output", "requires", "spec", "dims")):
                expected.append((n, code.index(part.strip(), code.index(part)) + 1, part.strip()))
    assert [(t.pos.line, t.pos.column, t.text) for t in transforms] == expected
    decls = [i for i in spec.items if isinstance(i, ast.TensorDecl)]
    for d in decls:
        assert lines[d.pos.line - 1].startswith(f"{d.direction} {d.name.text}")
        assert d.pos.column == 1


def test_exact_positions():
    spec = parse(DEMO, "demo.lyt")
    items = spec.items
    name, requires, gated, act, dims, assume, w13, s, if1, if2, out = items
    assert name.pos == ast.Pos(1, 1, 1, 10)
    assert name.name.pos == ast.Pos(1, 6, 1, 10)
    assert requires.pos == ast.Pos(2, 1, 2, 30)
    assert requires.library.pos == ast.Pos(2, 10, 2, 20)
    assert (requires.library.text, requires.op, requires.version) == ("flashinfer", ">=", "0.6.16")
    assert gated.default.pos == ast.Pos(3, 15, 3, 19)
    assert act.choices.pos == ast.Pos(4, 26, 4, 39)
    assert [n.pos.column for n in dims.names] == [6, 9, 12]
    assert assume.value.pos == ast.Pos(6, 8, 6, 9) and assume.multiple.expr == ex.Const(128)
    assert w13.name.pos == ast.Pos(7, 7, 7, 10)
    assert w13.elem.pos == ast.Pos(7, 14, 7, 19)
    assert [v.pos.column for v in w13.shape] == [20, 23, 28]
    assert w13.rows.pos == ast.Pos(7, 38, 7, 46)
    assert s.tie.pos == ast.Pos(8, 30, 8, 49) and s.tie.weight.pos == ast.Pos(8, 37, 8, 40)
    assert if1.pos.line == 9 and if1.pos.column == 1
    assert if1.cond.pos == ast.Pos(9, 4, 9, 9)
    (then,) = if1.then
    (other,) = if1.other
    assert then.op.pos == ast.Pos(9, 12, 9, 23)
    assert then.args[1].name.pos == ast.Pos(9, 29, 9, 32)
    assert then.args[1].value.pos == ast.Pos(9, 33, 9, 34)
    assert other.pos == ast.Pos(9, 45, 9, 60)
    assert if2.cond.pos == ast.Pos(10, 4, 10, 24) and if2.cond.value.pos.column == 11
    assert out.rows.pos == ast.Pos(11, 39, 11, 67)
    assert out.packing.family.pos == ast.Pos(11, 76, 11, 86)


def test_positions_across_semicolons_tabs_and_comments():
    source = "dims E # the experts\n\tinput w : f32[E]; output w : f32[E]\n# end\nswap_halves(w)  ;  cast(w, f32)\n"
    spec = parse(source, "t.lyt")
    dims, inp, outp, swap, cast = spec.items
    assert dims.pos == ast.Pos(1, 1, 1, 7)
    assert inp.pos.line == 2 and inp.pos.column == 2  # a tab is one column
    assert outp.pos.line == 2 and outp.pos.column == 20
    assert swap.pos == ast.Pos(4, 1, 4, 15)
    assert cast.pos == ast.Pos(4, 20, 4, 32)


def test_multiline_statement_spans_lines():
    spec = parse("dims E\ninput w : f32[E, 4]\nswap_halves(\n  w,\n  dim=1)\n", "m.lyt")
    t = spec.items[-1]
    assert (t.pos.line, t.pos.column, t.pos.end_line) == (3, 1, 5)
    assert t.args[0].value.pos == ast.Pos(4, 3, 4, 4)


# -- the tree ----------------------------------------------------------------


def test_tree_shapes_and_values():
    spec = parse(DEMO, "demo.lyt")
    _, _, gated, act, dims, _, w13, s, if1, if2, out = spec.items
    assert isinstance(gated.default, ast.BoolValue) and gated.default.value is True
    assert [i.text for i in act.choices.items] == ["silu", "relu2"]
    assert [n.text for n in dims.names] == ["E", "I", "H"]
    assert w13.optional and w13.direction == "input" and w13.elem.text == "fp4x2"
    assert [v.text for v in w13.shape] == ["E", "2*I", "H/2"]
    assert w13.shape[1].expr == ex.mul(2, ex.Var("I"))
    assert w13.shape[2].divisions == ((ex.Var("H"), ex.Const(2)),)
    assert isinstance(w13.rows, ast.StackedRows) and [n.text for n in w13.rows.shards] == ["w1", "w3"]
    assert isinstance(s.tie, ast.ScaleTie) and s.tie.block == 32 and not s.optional
    assert if1.cond.kind == "true" and if1.cond.name.text == "gated"
    assert if2.cond.kind == "in" and isinstance(if2.cond.value, ast.ListValue)
    assert if2.other == ()
    assert out.direction == "output" and out.optional
    assert isinstance(out.rows, ast.InterleavedRows) and out.rows.group == 64
    assert [n.text for n in out.rows.shards] == ["w3", "w1"]
    assert out.packing.family.text == "sm90_mixed"


def test_conditions_and_else_if_chains():
    spec = parse(
        "param a = x\nif a == y { } else if a != z { } else if not b { } else { }\nif c { }\n", "c.lyt"
    )
    first = spec.items[1]
    assert first.cond.kind == "cmp" and first.cond.op == "==" and first.cond.value.text == "y"
    (second,) = first.other
    assert isinstance(second, ast.If) and second.cond.kind == "cmp" and second.cond.op == "!="
    (third,) = second.other
    assert third.cond.kind == "not" and third.cond.name.text == "b"
    assert third.other == ()  # an empty else block
    assert spec.items[2].cond.kind == "true"


def test_values_strings_lists_and_functions():
    spec = parse(
        'param s = "hello world"\nparam n = -3\nparam l = [1, [2, 3], true]\n'
        "dims E, H\ninput w : f32[E, round_up(H, 128), ceil_div(H, 16), (H + 2) * 3 - 1]\n",
        "v.lyt",
    )
    s, n, lst, _, w = spec.items
    assert isinstance(s.default, ast.StrValue) and s.default.value == "hello world"
    assert ex.evaluate(n.default.expr, {}) == -3
    assert isinstance(lst.default.items[1], ast.ListValue)
    assert isinstance(lst.default.items[2], ast.BoolValue)
    env = {"E": 2, "H": 200}
    assert [ex.evaluate(v.expr, env) for v in w.shape] == [2, 256, 13, 605]


def test_interleave_rows_default_group_and_optional_marker():
    spec = parse("dims E\ninput b? : f32[E] rows interleave(w1, w3)\n", "o.lyt")
    (_, b) = spec.items
    assert b.optional and b.rows.group == 1


def test_empty_and_comment_only_sources_parse():
    assert parse("", "e.lyt").items == ()
    assert parse("# only a comment\n\n   \n;;\n", "e.lyt").items == ()


# -- errors raised while building the tree ------------------------------------


@pytest.mark.parametrize(
    "source, line, column, message",
    [
        ("dims E\ninput w : f32[E, H/0]\n", 2, 20, "division by 0"),
        ("dims E\ninput w : f32[E, roundup(E, 4)]\n", 2, 18, "unknown function 'roundup'"),
        ("dims E\ninput w : f32[E, ceil_div(E)]\n", 2, 18, "takes 2 arguments"),
        ("dims E\nassume E % 0 == 0\n", 2, 12, "positive multiple"),
        ("dims E\ninput w : f32[E]\ninput s : u8[E] scales w block 0\n", 3, 32, "positive number"),
        ("dims E\ninput s : u8[E] scales w block 32 bias of w\n", 2, 35, "already has a tie"),
        ("dims E\ninput w : f32[E] rows [a] rows [b]\n", 2, 32, "rows twice"),
        ("dims E\ninput w : f32[E] packing x packing y\n", 2, 28, "packing twice"),
    ],
)
def test_tree_errors_are_positioned(source, line, column, message, check_points_at):
    with pytest.raises(SpecError) as info:
        parse(source, "t.lyt")
    err = info.value
    assert len(err.diagnostics) == 1
    d = err.diagnostics[0]
    assert message in d.message
    assert (d.pos.line, d.pos.column) == (line, column)
    check_points_at(err.render(), "t.lyt", line, column, source.splitlines()[line - 1])


@pytest.mark.parametrize(
    "source, line, column, message",
    [
        ("dims E, I, H\ninput w : f32[E, I, H]\nswap_halves(w\noutput w : f32[E, I, H]\n", 4, 1, "unexpected 'output'"),
        ("dims E, I, H $\n", 1, 14, "unexpected character '$'"),
        ("dims E,\n", 1, 7, "unexpected end of file"),
        ("spec 3\n", 1, 6, "unexpected '3'"),
    ],
)
def test_syntax_errors_are_positioned(source, line, column, message):
    with pytest.raises(SpecError) as info:
        parse(source, "s.lyt")
    (d,) = info.value.diagnostics
    assert d.severity == "error"
    assert message in d.message
    assert (d.pos.line, d.pos.column) == (line, column)
    assert d.hint and d.hint.startswith("expected ")


def test_syntax_error_has_no_chained_lark_exception():
    with pytest.raises(SpecError) as info:
        parse("dims E $", "s.lyt")
    assert info.value.__cause__ is None and info.value.__suppress_context__
