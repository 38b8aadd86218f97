"""No silent fallback: a value conversion, plan pattern or walk that a lowering or an analysis has
no rule for fails when the spec is compiled, in every emitter (not lowered as another kind)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import attrs  # noqa: E402
import pytest  # noqa: E402

import layoutc  # noqa: E402
from layoutc.equiv import encoding as equiv, probe  # noqa: E402
from layoutc.lower import plan as planner  # noqa: E402
from layoutc.lower import memo, torch_emit, triton_emit  # noqa: E402
from layoutc.lang.ops import conversion as cv  # noqa: E402
from layoutc.lang.ops import value  # noqa: E402

TEXT = "dims E, N\ninput b : f32[E, N]\ncast(b, bf16)\noutput b : bf16[E, N]\n"


@attrs.frozen
class Negate(cv.Conversion):
    """A conversion no lowering was taught (it declares no eager and no kernel form)."""

    kind = "negate"

    def lossy(self, src):
        return False


def _chain(text: str = TEXT):
    return layoutc.compile_source(text, "unknown_kinds.lyt").compiled.variant(()).chain("b")


@pytest.fixture
def negating_cast(monkeypatch):
    """``cast`` declaring the unknown conversion (as a new value op that forgot its lowering would). Plans
    kept by chain content (layoutc.lower.memo) were made with the op's own code: forgotten before and after."""
    memo.clear()
    monkeypatch.setattr(value.Cast, "conversion", lambda self: Negate(self.to))
    yield
    memo.clear()


def test_a_plan_refuses_an_unknown_conversion_kind(monkeypatch):
    chain = _chain()
    monkeypatch.setattr(value.Cast, "conversion", lambda self: Negate(self.to))
    with pytest.raises(cv.UnknownKind, match="Negate"):
        planner.plan(chain)


def test_compiling_a_spec_with_an_unknown_conversion_fails(negating_cast):
    with pytest.raises(cv.UnknownKind, match="Negate"):
        layoutc.compile_source(TEXT + "# an unknown conversion\n", "unknown_kinds.lyt")


@pytest.mark.parametrize("emit", ["gather", "triton"])
def test_every_emitter_refuses_a_listed_kind_without_its_form(monkeypatch, emit):
    # Listed as a kind (the plan takes it) but without an eager or kernel form: each emitter refuses.
    chain = _chain()
    monkeypatch.setattr(value.Cast, "conversion", lambda self: Negate(self.to))
    monkeypatch.setattr(cv, "KINDS", cv.KINDS + (Negate,))
    p = planner.plan(chain)
    assert p.conversions == (Negate(p.out_elem),)
    with pytest.raises(cv.UnknownKind, match="Negate"):
        if emit == "gather":
            torch_emit.gather_function(p, "_g", ["E", "N"])
        else:
            triton_emit.body(p, "_b", ["E", "N"])


def test_every_analysis_refuses_an_unknown_conversion(monkeypatch):
    chain = _chain()  # compiled before the cast forgets its conversion; analyses read op.conversion()
    monkeypatch.setattr(value.Cast, "conversion", lambda self: Negate(self.to))
    with pytest.raises(cv.UnknownKind, match="Negate"):
        equiv.chain_mode(chain)
    with pytest.raises(cv.UnknownKind, match="Negate"):
        probe._lossy(chain)
    with pytest.raises(cv.UnknownKind, match="Negate"):
        probe._bit_field(chain)


@attrs.frozen(kw_only=True)
class Strided(planner.Plan):
    """A plan type no emitter was taught (a planner that grew a pattern and forgot its lowerings)."""

    pattern = "strided"


@pytest.mark.parametrize("emit", ["gather", "triton", "launcher", "header"])
def test_every_emitter_refuses_an_unknown_plan_type(emit):
    chain = _chain()
    p = Strided(**planner.plan(chain).shared())
    with pytest.raises(cv.UnknownKind, match="Strided"):
        if emit == "gather":
            torch_emit.gather_function(p, "_g", ["E", "N"])
        elif emit == "triton":
            triton_emit.body(p, "_b", ["E", "N"])
        elif emit == "launcher":
            triton_emit.launcher("_l", "_k", [("b", p)], ["E", "N"])
        else:
            triton_emit.header(chain, p, "unknown_kinds.lyt")
    with pytest.raises(cv.UnknownKind, match="Strided"):
        planner.index_exprs(p)


def test_each_plan_type_carries_only_its_fields():
    # a copy has no map, a gather no word sources: a reader cannot take a field of another pattern
    p = planner.plan(_chain())
    assert isinstance(p, planner.Copy) and not hasattr(p, "map") and not hasattr(p, "word_sources")
    assert {a.name for a in attrs.fields(planner.Copy)} == {a.name for a in attrs.fields(planner.Plan)}
    assert not hasattr(planner.Gather(map=None, **p.shared()), "word_sources")
