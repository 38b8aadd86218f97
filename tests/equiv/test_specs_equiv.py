"""Every shipped spec is equivalent to its reference recipe (layoutc/reference/cpu.py: FlashInfer's
helpers with CPU ports of its CUDA kernels), at four sampled shapes and every combination of optional
inputs; and a wrong recipe for a spec other than the CLI tests' is found with the spec line."""

from __future__ import annotations

import pytest

from layoutc.equiv.compare import equivalent
from layoutc.reference import cpu
from tests.helpers import SPECS

pytestmark = pytest.mark.flashinfer  # FlashInfer's own functions: the slow tier (make test-slow)
pytest.importorskip("flashinfer")

NAMES = sorted(p.stem for p in SPECS.glob("*.lyt"))


def test_every_shipped_spec_has_a_recipe():
    assert len(NAMES) == 19
    assert all(callable(getattr(cpu, n, None)) for n in NAMES)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_shipped_spec_is_equivalent_to_its_recipe(name):
    result = equivalent(SPECS / f"{name}.lyt", getattr(cpu, name))
    assert result.ok, result.report()
    assert result.verdict().startswith(("equivalent at 4 shapes", "equivalent at 8 shapes"))  # 8: optional biases
    # the sampled shapes include one that is not a multiple of the padded sizes' blocks
    assert len({tuple(sorted(s.dims.items())) for s in result.shapes}) >= 4


@pytest.mark.slow
def test_full_variant_of_the_slowest_spec():
    """The SM90 interleave of a bf16 activation layout, every optional input given. Its time (target
    under 10 s for four shapes) is measured by benchmarks/equiv_time.py, not here."""
    result = equivalent(SPECS / "flashinfer_cutlass_bf16.lyt", cpu.flashinfer_cutlass_bf16, variants="full")
    assert result.ok and len(result.shapes) == 4


def _trtllm_nvfp4_not_swapped(tensors, params=None):
    """TRT-LLM wants [w3; w1]; this recipe leaves the weight's halves in checkpoint order."""
    from layoutc.reference import recipes

    out = cpu.flashinfer_trtllm_nvfp4(tensors, params)
    fixed = dict(tensors)
    fixed["w13_weight"] = recipes.swap_w13(tensors["w13_weight"])
    # converting the pre-swapped weight undoes the recipe's own swap on the weight only
    out["w13_weight"] = cpu.flashinfer_trtllm_nvfp4(fixed, params)["w13_weight"]
    return out


def test_a_wrong_trtllm_recipe_names_the_swap_line():
    spec = SPECS / "flashinfer_trtllm_nvfp4.lyt"
    result = equivalent(spec, _trtllm_nvfp4_not_swapped, {"E": 2, "I": 32, "H": 32})
    text = result.report()
    assert not result.ok
    assert [d.tensor for d in result.first_failure.diffs] == ["w13_weight"], text
    lines = [f.line for d in result.first_failure.diffs for f in d.findings]
    assert lines and all(line is not None for line in lines), text
    stmt = spec.read_text().splitlines()[lines[0] - 1]
    assert stmt.strip() == "swap_halves([w13_weight, w13_weight_scale], dim=1)", (stmt, text)
    assert "NOT equivalent" in text
