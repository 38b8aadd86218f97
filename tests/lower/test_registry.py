"""A new lowering is one module plus its registration: this test module is one.

``strided`` takes only the chains whose composed map is a copy or a strided view (one
``as_strided`` and one copy, through the torch emitter) and leaves every other chain to the
eager reference; registering it is all it takes for the CLI, ``convert(lowering=...)`` and the
generated module's table to know it.
"""

from __future__ import annotations

import attrs
import pytest
import torch
from click.testing import CliRunner

import layoutc
from layoutc.cli.main import main
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.lower import registry, torch_emit
from layoutc.lower.plan import Affine, Copy
from tests.helpers import SPECS, assert_same_bits


def _strided(ctx: registry.EmitContext, chain) -> str | None:
    p = ctx.plan(chain)
    if not isinstance(p, (Copy, Affine)):
        return None  # the eager reference converts it
    name = f"_strided_{ctx.tag(chain)}"
    return ctx.define(name, torch_emit.gather_function(p, name, ctx.dims))


STRIDED = registry.Lowering("strided", "strided views only (a test lowering)", chain=_strided)


@pytest.fixture
def strided():
    registry.register(STRIDED)
    yield STRIDED
    registry.unregister("strided")


def test_a_registered_lowering_reaches_the_converter_and_the_cli(strided, tmp_path):
    assert "strided" in registry.names()
    text = ("dims E, R\ninput w : bf16[E, R, 8]\ninput b : f32[E, R]\n"
            "transpose(w, 1, 2)\nswap_halves(b, dim=1)\n"
            "output w : bf16[E, 8, R]\noutput b : f32[E, R]\n")
    spec = layoutc.compile_source(text, "strided.lyt")
    assert "strided" in spec.module.LOWERINGS
    assert "_strided_w_0" in spec.source and "_strided_b" not in spec.source  # a swap is not a strided view
    x = {"w": torch.randn(3, 6, 8).to(torch.bfloat16), "b": torch.randn(3, 6)}
    got, want = spec.convert(x, lowering="strided"), spec.convert(x, lowering="eager")
    for k in want:
        assert_same_bits(got[k], want[k], k)
    path = tmp_path / "strided.lyt"
    path.write_text(text)
    result = CliRunner().invoke(main, ["bench", str(path), "--shape", "E=2,R=4", "--lowering", "strided", "--reps", "1"])
    assert result.exit_code == 0, result.output
    assert "layoutc (strided)" in result.output


def test_unregistered_lowerings_are_refused_by_name():
    spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_mxfp8.lyt")
    x = synthetic_inputs(spec, {"E": 1, "I": 128, "H": 128}, seed=0)
    with pytest.raises(layoutc.LayoutError, match="lowering must be one of 'auto', 'fused', 'gather'"):
        spec.convert(x, lowering="strided")


def test_auto_follows_the_registry_order():
    names = registry.names()
    assert names[0] == "auto" and names[-1] == "eager"
    cpu = [lw.name for lw in registry.lowerings() if "cpu" in lw.auto_on]
    cuda = [lw.name for lw in registry.lowerings() if "cuda" in lw.auto_on]
    assert cpu[:1] == ["gather"] and cuda[:1] == ["fused"]
    with pytest.raises(ValueError):
        registry.register(registry.Lowering("auto", "not a name"))


def test_cli_choices_are_the_registry(strided):
    for command in ("bench", "convert"):
        result = CliRunner().invoke(main, [command, "--help"])
        assert result.exit_code == 0, result.output
        for name in registry.names():
            assert name in result.output, (command, name)
    result = CliRunner().invoke(main, ["bench", str(SPECS / "flashinfer_cutlass_mxfp8.lyt"), "--lowering", "nope"])
    assert result.exit_code != 0 and "'strided'" in result.output


def test_an_unavailable_lowering_says_why(monkeypatch):
    spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_mxfp8.lyt")
    x = synthetic_inputs(spec, {"E": 1, "I": 128, "H": 128}, seed=0)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(layoutc.LayoutError, match="lowering='fused' runs Triton kernels, which need CUDA tensors"):
        spec.convert(x, lowering="fused")
    needy = registry.Lowering("needy", "needs a module that is not there", needs="layoutc_no_such_module",
                              chain=_strided)
    registry.register(needy)
    try:
        spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_mxfp8.lyt")
        with pytest.raises(layoutc.LayoutError, match="'needy' needs the module 'layoutc_no_such_module'"):
            spec.convert(x, lowering="needy")
        # 'auto' passes over a lowering whose module is missing, even one listed first for this device
        first = attrs.evolve(needy, auto_on=("cpu",)).table_entry()
        m = spec.module
        assert m._choose_lowering("auto", x, (first,) + m._LOWERINGS) == "gather"
    finally:
        registry.unregister("needy")


def test_eager_is_a_registered_lowering_the_code_generator_reads(monkeypatch):
    # The lowering that takes every chain is whichever registered one is inline, not a name codegen knows:
    # put another in eager's place and the converter writes its code, its comment and its table entry.
    def stepwise_chain(chain, filename):
        return ["# stepwise"] + registry.EAGER.inline(chain, filename)

    stepwise = attrs.evolve(registry.EAGER, name="stepwise", brief="a test's inline lowering", inline=stepwise_chain)
    table = {k: v for k, v in registry._REGISTRY.items() if k != "eager"} | {"stepwise": stepwise}
    monkeypatch.setattr(registry, "_REGISTRY", table)
    assert registry.fallback() is stepwise and registry.names()[-1] == "stepwise"
    text = "dims E, R\ninput b : f32[E, R]\nswap_halves(b, dim=1)\noutput b : f32[E, R]\n"
    spec = layoutc.compile_source(text, "stepwise.lyt")
    assert spec.module.LOWERINGS[-1] == "stepwise" and "eager" not in spec.module.LOWERINGS
    assert "else:  # stepwise: a test's inline lowering" in spec.source and "# stepwise\n" in spec.source
    assert "def swap_halves(x, dim):" in spec.source  # the functions its code calls, copied
    x = {"b": torch.randn(3, 6)}
    got, want = spec.convert(x, lowering="stepwise"), spec.convert(x, lowering="gather")
    assert_same_bits(got["b"], want["b"], "b")
    assert_same_bits(got["b"], x["b"].roll(3, 1), "b")
    # 'auto' with nothing else for these tensors takes it (the table's last entry), not a name it assumes
    no_cpu = tuple(e for e in spec.module._LOWERINGS if e[0] != "gather")
    assert spec.module._choose_lowering("auto", x, no_cpu) == "stepwise"


def test_one_inline_lowering_always_registered():
    with pytest.raises(ValueError, match="already is"):
        registry.register(attrs.evolve(registry.EAGER, name="another"))
    with pytest.raises(ValueError, match="cannot be removed"):
        registry.unregister("eager")
    with pytest.raises(ValueError, match="inline code comes with"):
        registry.register(registry.Lowering("half", "inline without its functions", inline=registry.EAGER.inline))
    assert registry.fallback() is registry.EAGER and "half" not in registry.names()
