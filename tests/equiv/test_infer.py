"""``layoutc infer``: the nine shipped specs' reference recipes are recovered as registered ops and
families and the written specs are equivalent to them; a row order no op gives is a flagged table;
the command writes the spec and reports usage errors with exit status 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from layoutc.cli.main import main
from layoutc.equiv.compare import EquivError, equivalent
from layoutc.equiv.infer import infer
from tests.equiv import fns

TINY = Path(__file__).resolve().parent / "tiny.lyt"
# the checkpoint side of tiny.lyt: what --inputs gives infer
CONTRACT = "\n".join(line for line in TINY.read_text().splitlines() if line.startswith(("dims", "input")))
DIMS = {"E": 2, "I": 32, "H": 64}

# spec -> (--quant, --rows, --bias, --dims) of its checkpoint
SHIPPED = {
    "flashinfer_cutedsl_nvfp4": ("nvfp4", "contiguous", False, {"E": 2, "I": 128, "H": 64}),
    "flashinfer_cutlass_bf16": ("mxfp4", "contiguous", True, {"E": 2, "I": 256, "H": 256}),
    "flashinfer_cutlass_mxfp4_padded": ("mxfp4", "contiguous", True, {"E": 2, "I": 64, "H": 64}),
    "flashinfer_cutlass_mxfp8": ("mxfp4", "contiguous", True, {"E": 2, "I": 128, "H": 128}),
    "flashinfer_cutlass_nvfp4": ("nvfp4", "contiguous", False, {"E": 2, "I": 32, "H": 32}),
    "flashinfer_trtllm_bf16": ("bf16", "contiguous", False, {"E": 2, "I": 64, "H": 128}),
    "flashinfer_trtllm_fp8_block": ("fp8_block", "contiguous", False, {"E": 2, "I": 256, "H": 256}),
    "flashinfer_trtllm_mxfp4": ("mxfp4", "gpt_oss", True, {"E": 2, "I": 64, "H": 64}),
    "flashinfer_trtllm_nvfp4": ("nvfp4", "contiguous", False, {"E": 2, "I": 32, "H": 32}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_recipe_is_recovered_as_named_ops(name):
    pytest.importorskip("flashinfer")
    from layoutc.reference import cpu

    quant, rows, bias, dims = SHIPPED[name]
    result = infer(getattr(cpu, name), dims, quant=quant, rows=rows, bias=bias, spec_name=f"{name}_inferred")
    assert not result.verify_errors, "\n".join(result.verify_errors) + "\n" + result.text
    assert result.named and "table=" not in result.text, result.text
    assert result.verdict is not None and result.verdict.ok, result.verdict.report() if result.verdict else result.text
    assert result.verdict.verdict().startswith("equivalent at 4 shapes")


def test_the_small_swap_is_recovered_and_equivalent():
    result = infer(fns.good, DIMS, names=None, inputs=CONTRACT, spec_name="tiny_inferred")
    assert result.ok and result.named, result.text
    assert "swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)" in result.text
    assert "cast(w13_bias, bf16)" in result.text
    # the written text is a spec equiv accepts on its own
    assert equivalent(result.text, fns.good, DIMS).ok


def test_a_row_order_no_op_gives_is_a_flagged_table():
    result = infer(fns.shuffled_eights, DIMS, names=None, inputs=CONTRACT, spec_name="fours")
    assert not result.named
    assert f"table={fns.EIGHTS}" in result.text, result.text
    assert "review" in result.text.lower()
    assert any("written as a table" in n for n in result.notes)
    assert result.verdict is not None and result.verdict.ok, result.verdict.report()


def test_a_function_that_raises_is_a_usage_error():
    with pytest.raises(EquivError, match="raised ValueError"):
        infer(fns.raises, DIMS, names=None, inputs=CONTRACT)


def test_the_command_writes_an_equivalent_spec(tmp_path):
    contract = tmp_path / "contract.lyt"
    contract.write_text(CONTRACT + "\n")
    out = tmp_path / "inferred.lyt"
    result = CliRunner().invoke(main, ["infer", "tests.equiv.fns:good", "--dims", "E=2,I=32,H=64",
                                       "--inputs", str(contract), "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "swap_halves" in out.read_text()
    check = CliRunner().invoke(main, ["equiv", str(out), "--against", "tests.equiv.fns:good",
                                      "--dims", "E=2,I=32,H=64"], catch_exceptions=False)
    assert check.exit_code == 0 and "equivalent at 4 shapes" in check.output, check.output


@pytest.mark.parametrize("function,message", [
    ("no_such_module_xyz:convert", "cannot import no_such_module_xyz"),
    ("tests.equiv.fns", "expected MODULE:FUNCTION"),
])
def test_command_usage_errors_exit_2(tmp_path, function, message):
    contract = tmp_path / "contract.lyt"
    contract.write_text(CONTRACT + "\n")
    result = CliRunner().invoke(main, ["infer", function, "--dims", "E=2,I=32,H=64", "--inputs", str(contract)],
                                catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_ties_missing_from_the_contract_are_proposed():
    untied = "\n".join(re.sub(r"\s+(scales|bias of) .*$", "", line) for line in CONTRACT.splitlines())
    assert "scales" not in untied and "bias of" not in untied
    result = infer(fns.good, DIMS, names=None, inputs=untied, spec_name="tiny_ties")
    assert "proposed tie: scales w13_weight block 32" in result.notes
    assert "proposed tie: bias of w13_weight" in result.notes
    assert "scales w13_weight block 32" in result.text and result.ok, result.text


def _agrees_on_random_inputs(text: str, fn, dims, seeds=(0, 1)) -> None:
    """An independent check of a written spec (not equiv's decoding, which infer shares): the compiled
    spec's eager conversion and the function, bit for bit, on the same random checkpoint tensors."""
    import layoutc
    from layoutc.convert.synthckpt import synthetic_inputs
    from layoutc.algebra.dtypes import bit_view

    spec = layoutc.compile_source(text, "inferred.lyt", check_versions=False)
    for seed in seeds:
        tensors = synthetic_inputs(spec, dims, seed)
        ours = spec.convert({k: v.clone() for k, v in tensors.items()}, dims, lowering="eager")
        theirs = fn({k: v.clone() for k, v in tensors.items()})
        assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
        for name in ours:
            assert ours[name].dtype == theirs[name].dtype and ours[name].shape == theirs[name].shape, name
            assert torch.equal(bit_view(ours[name]), bit_view(theirs[name])), f"{name} differs at seed {seed}"


def test_the_written_spec_converts_as_the_function_does():
    result = infer(fns.good, DIMS, names=None, inputs=CONTRACT, spec_name="tiny_inferred")
    assert result.ok, result.text
    _agrees_on_random_inputs(result.text, fns.good, DIMS)
    _agrees_on_random_inputs(result.text, fns.good, {"E": 3, "I": 64, "H": 128})


def test_the_independent_check_fails_on_a_different_function():
    """The check above can fail: the spec inferred for the swap does not convert as the shuffled recipe."""
    result = infer(fns.good, DIMS, names=None, inputs=CONTRACT, spec_name="tiny_inferred")
    with pytest.raises(AssertionError, match="differs"):
        _agrees_on_random_inputs(result.text, fns.shifted_block, DIMS)


# -- what the written spec holds comes from the caller: a -D value, the spec name, the function's name --

EVIL = "silu; input evil : bf16[E]"


def _written_inputs(text: str) -> list[str]:
    import layoutc

    return [t.name for t in layoutc.compile_source(text, "inferred.lyt", check_versions=False).program.inputs]


def test_a_string_parameter_is_written_quoted_and_adds_nothing():
    result = infer(fns.good_with_params, DIMS, names=None, inputs=CONTRACT, params={"activation": "silu", "n": 3},
                   spec_name="tiny_params")
    assert result.ok, result.text
    assert 'param activation = "silu"' in result.text.splitlines()
    assert "param n = 3" in result.text.splitlines()
    assert _written_inputs(result.text) == ["w13_weight", "w13_weight_scale", "w13_bias"]


@pytest.mark.parametrize("value", [EVIL, 'silu" input evil', "silu\ninput evil : bf16[E]", "silu\x1b[2J"])
def test_a_hostile_parameter_value_is_refused(value):
    with pytest.raises(EquivError, match="parameter activation: the value .* which a spec string cannot hold"):
        infer(fns.good_with_params, DIMS, names=None, inputs=CONTRACT, params={"activation": value})


@pytest.mark.parametrize("name", ["x\ninput evil : bf16[E]", "x; input evil", "9lives", ""])
def test_a_hostile_spec_name_is_refused(name):
    with pytest.raises(EquivError, match="spec name .* is not an identifier"):
        infer(fns.good, DIMS, names=None, inputs=CONTRACT, spec_name=name)


def test_a_hostile_parameter_name_is_refused():
    with pytest.raises(EquivError, match="parameter name .* is not an identifier"):
        infer(fns.good_with_params, DIMS, names=None, inputs=CONTRACT, params={"a = 1\ninput evil : bf16[E]\n#": 1})


def test_a_function_name_with_a_newline_stays_in_its_comment():
    from layoutc.equiv.function_runner import Target

    target = Target(fns.good, "evil\ninput evil : bf16[E]\n# ")
    result = infer(target, DIMS, names=None, inputs=CONTRACT, spec_name="tiny_named")
    assert result.ok, result.text
    # comment() folds the whitespace: the name stays on the comment's one line
    assert result.text.splitlines()[0] == "# Inferred by layoutc infer from evil input evil : bf16[E] #", result.text
    assert _written_inputs(result.text) == ["w13_weight", "w13_weight_scale", "w13_bias"]


def test_the_command_refuses_a_hostile_define(tmp_path):
    contract = tmp_path / "contract.lyt"
    contract.write_text(CONTRACT + "\n")
    out = tmp_path / "inferred.lyt"
    result = CliRunner().invoke(main, ["infer", "tests.equiv.fns:good_with_params", "--dims", "E=2,I=32,H=64",
                                       "--inputs", str(contract), "-o", str(out), "-D", f"activation={EVIL}"],
                                catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "which a spec string cannot hold" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_a_scale_pad_the_family_does_anyway_is_left_to_it():
    """The pad multiples come from the family's own leading pad steps (sf_128x4: rows to 128, K to 4), so
    a scale's pad to 64 rows (128 covers it) is dropped, a pad to 256 (it does not) is kept."""
    from layoutc.equiv.infer_axes import Stmt, TensorChain, _Pad
    from layoutc.equiv.infer_contract import _program, vllm_contract
    from layoutc.equiv.infer_write import _harmonise, _leading_pads

    program = _program(vllm_contract("nvfp4"))
    scale = next(t for t in program.inputs if t.name == "w13_weight_scale")
    fam = Stmt("interleave({t}, sf_128x4)", "family", family="sf_128x4", op=("family", "sf_128x4", ()))
    assert _leading_pads(scale, fam.op) == {1: 128, 2: 4}
    assert _leading_pads(scale, ("family", "trtllm", (("epilogue_tile", 128),))) == {}

    def harmonised(multiple):
        chains = {"w13_weight": TensorChain("w13_weight", (), True),
                  "w13_weight_scale": TensorChain("w13_weight_scale", (_Pad(multiple, 1).stmt(1), fam), True)}
        _harmonise(program, chains)
        return [s.text for s in chains["w13_weight_scale"].statements]

    assert harmonised(64) == ["interleave({t}, sf_128x4)"]
    assert harmonised(256) == ["pad({t}, dim=1, multiple=256)", "interleave({t}, sf_128x4)"]
