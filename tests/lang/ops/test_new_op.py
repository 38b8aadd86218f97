"""A new primitive is one module: an op class with its facts, map, eager function and inverse.

The op below lives in this test module (its eager function too, which the generated converter
copies like the built-in ones) and is registered for the test only. Everything else -- binding,
the verifier, every lowering, the inverse, infer, explain, `layoutc ops`, the README's op table
(`make docs`) and the names a dim may not take -- works from the class: no second list to edit.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import pytest
import torch

import layoutc
from layoutc.algebra.indexmap import out_var
from layoutc.lang.ops import PUBLIC, REGISTRY
from layoutc.lang.ops.base import Category, Facts, Inferred, Op, TensorType, along, check_dim


def reverse_axis(x, dim):
    return torch.flip(x, (dim,))


@attrs.frozen
class ReverseRows(Op):
    dim: int = attrs.field(default=1, metadata={"kind": "dim"})

    name: ClassVar[str] = "reverse_rows"
    eager: ClassVar = staticmethod(reverse_axis)
    facts: ClassVar[Facts] = Facts(Category.LOGICAL, on_axis=True)
    summary: ClassVar[str] = "reverse the order along dim"
    needs: ClassVar[str] = "nothing"

    def infer(self, t: TensorType) -> Inferred:
        check_dim(t, self.dim)
        return Inferred(t)

    def index_map(self, t):
        d = check_dim(t, self.dim)
        return along(t, d, t.shape[d] - 1 - out_var(d))

    def impl(self, t):
        return reverse_axis, (self.dim,)

    def inverse(self, t):
        return self


SPEC = """spec reversed
dims E, N, K
input w : bf16[E, N, K]
input s : e8m0[E, N, K/32]  scales w block 32
reverse_rows([w, s], dim=1)
output w : bf16[E, N, K]
output s : e8m0[E, N, K/32]
"""


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(REGISTRY, ReverseRows.name, ReverseRows)
    monkeypatch.setitem(PUBLIC, ReverseRows.name, ReverseRows)


@pytest.mark.parametrize("lowering", ["eager", "gather"])
def test_a_new_op_compiles_converts_and_inverts(registered, lowering):
    spec = layoutc.compile_source(SPEC, "reversed.lyt")
    w = torch.randn(2, 8, 64).to(torch.bfloat16)
    s = torch.randint(0, 255, (2, 8, 2), dtype=torch.uint8)
    out = spec.convert({"w": w, "s": s}, lowering=lowering)
    assert torch.equal(out["w"], w.flip(1)) and torch.equal(out["s"], s.flip(1))
    back = spec.inverse(out)
    assert torch.equal(back["w"], w) and torch.equal(back["s"], s)
    assert "def reverse_axis(x, dim):" in spec.source  # copied from this module


def test_the_verifier_judges_a_new_op_by_its_facts(registered):
    # the scale left unreversed: its rows no longer follow the weight's, whatever the op is called
    with pytest.raises(layoutc.SpecError, match="w and s rows are permuted differently"):
        layoutc.compile_source(SPEC.replace("reverse_rows([w, s], dim=1)", "reverse_rows(w, dim=1)"), "r.lyt")


def test_infer_and_explain_see_a_new_op_from_its_declarations(registered, monkeypatch):
    # What infer tries comes from the ops' declared `search` arguments: no second list to edit.
    from layoutc.cli import explain
    from layoutc.equiv import infer_axes

    assert ("reverse_rows", {}) not in infer_axes.perm_ops()
    monkeypatch.setattr(ReverseRows, "search", ({},))
    monkeypatch.setattr(ReverseRows, "search_rank", 9)
    assert infer_axes.perm_ops()[-1] == ("reverse_rows", {})
    assert ReverseRows(1).parts == 1  # a declared fact with its default
    spec = layoutc.compile_source(SPEC, "reversed.lyt")
    assert "reverse_rows([w, s], dim=1)" in explain.as_text(explain.explain(spec, "w"))


def test_the_docs_and_the_reserved_names_see_a_new_op(monkeypatch):
    import sys
    from pathlib import Path

    from layoutc.front.names import identifier_problem
    from layoutc.lang.ops import generated_names

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tools import make_docs

    row = "| `reverse_rows(tensor, dim=1)` | reverse the order along dim | logical | nothing |"
    assert row not in make_docs.op_table() and identifier_problem("reverse_axis", generated_names()) is None
    readme = make_docs.README.read_text()
    table = make_docs.MARKER.search(readme[readme.index("<!-- sample: ops -->"):]).group("body")
    assert table == make_docs.op_table()  # the README holds the generated table (test_docs checks it too)
    monkeypatch.setitem(REGISTRY, ReverseRows.name, ReverseRows)
    monkeypatch.setitem(PUBLIC, ReverseRows.name, ReverseRows)
    assert row in make_docs.op_table().splitlines()  # `make docs` writes the row: the README is stale now
    assert make_docs.op_table() != table
    # the converter copies reverse_axis under its name: a dim of that name would shadow it
    assert "a name generated converters use" in identifier_problem("reverse_axis", generated_names())
    with pytest.raises(layoutc.SpecError, match="'reverse_axis' cannot be a dim"):
        layoutc.compile_source(SPEC.replace("dims E, N, K", "dims E, N, K, reverse_axis"), "r.lyt")
