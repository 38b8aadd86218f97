"""Messages a newcomer meets on the first day: a likely name and the valid ones for a misspelt parameter
or tensor, the tensor whose shape is wrong blamed (not the one its misread dims contradict), divisibility
said of the dim the user gives, a missing optional library said once in one line, and `bench --device
cpu` without FlashInfer."""

from __future__ import annotations

import importlib.metadata

import pytest
from click.testing import CliRunner

import layoutc
from layoutc.cli import bench as bench_mod
from layoutc.algebra import expr as ex
from layoutc.cli.main import main
from layoutc.lang.compiler import Constraint
from tests.helpers import SPECS, spec

SMALL = {"E": 2, "I": 128, "H": 256}


def _inputs(compiled, dims=SMALL):
    from layoutc.convert.synthckpt import synthetic_inputs

    return synthetic_inputs(compiled, {k: v for k, v in dims.items() if k in compiled.program.dims}, 0)


def test_unknown_parameter_suggests_and_lists_the_valid_ones():
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt", {"tp_sise": 2})
    (d,) = info.value.errors
    assert d.hint == "did you mean 'tp_size'? parameters of this spec: tp_size, tp_rank"


def test_unexpected_tensor_suggests_the_close_name():
    x = _inputs(spec("flashinfer_cutlass_bf16"))
    x["w13_weigth"] = x.pop("w13_weight")
    with pytest.raises(layoutc.LayoutError, match=r"unexpected tensor 'w13_weigth' \(did you mean 'w13_weight'\?\)"):
        spec("flashinfer_cutlass_bf16").convert(x)


def test_explain_unknown_tensor_suggests_the_close_name():
    result = CliRunner().invoke(main, ["explain", str(SPECS / "flashinfer_cutlass_bf16.lyt"), "--tensor", "w2_wieght"])
    assert result.exit_code == 2
    assert "did you mean 'w2_weight'?" in result.output


def test_a_transposed_weight_is_blamed_not_its_scales():
    x = _inputs(spec("flashinfer_cutlass_bf16"))
    x["w13_weight"] = x["w13_weight"].transpose(1, 2).contiguous()
    with pytest.raises(layoutc.LayoutError) as info:
        spec("flashinfer_cutlass_bf16").convert(x)
    msg = str(info.value)
    assert msg.startswith("w13_weight: expected shape [E, 2*I, H/2] = [2, 256, 128], got [2, 128, 256]"), msg
    assert "from w13_weight.shape" not in msg  # the dims are read off the tensors that agree


def test_divisibility_of_a_quotient_is_said_of_the_dim():
    c = Constraint("w13_weight_scale", ex.div(ex.Var("H"), 32), 4, "scale_cols", "interleave(...) at x.lyt:3",
                   None, "runtime")
    assert "scale_cols % 4 == 0, where scale_cols = H/32 (so H must be a multiple of 128)" in c.message()


def test_h_200_is_told_what_h_must_be_a_multiple_of():
    # H=200: the first check is on k_bytes = H/2 = 100; the message says what that means for H
    x = _inputs(spec("flashinfer_cutlass_bf16"), {"E": 2, "I": 128, "H": 200})
    with pytest.raises(layoutc.LayoutError) as info:
        spec("flashinfer_cutlass_bf16").convert(x)
    msg = str(info.value)
    assert "k_bytes % 32 == 0, where k_bytes = H/2 (so H must be a multiple of 64); here it is 100" in msg, msg


@pytest.fixture
def no_flashinfer(monkeypatch):
    real = importlib.metadata.version

    def version(name):
        if name.startswith("flashinfer"):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    for m in ("flashinfer", "flashinfer.fused_moe"):
        monkeypatch.setitem(__import__("sys").modules, m, None)
    from layoutc import api

    api.clear_cache()  # warnings are part of a cached compile
    yield
    api.clear_cache()


def test_missing_flashinfer_is_said_once_in_one_line(no_flashinfer):
    specs = [str(SPECS / "flashinfer_cutlass_bf16.lyt"), str(SPECS / "flashinfer_trtllm_bf16.lyt")]
    result = CliRunner().invoke(main, ["check", *specs])
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if "flashinfer" in line and "not installed" in line]
    assert said == ["note: flashinfer is not installed, so 'requires flashinfer ...' lines are not checked "
                    "(pip install flashinfer-python)"], result.stderr
    assert "^^^" not in result.stderr and "hint:" not in result.stderr


def test_bench_on_cpu_does_not_need_flashinfer(no_flashinfer):
    compiled = spec("flashinfer_cutlass_bf16")
    r = bench_mod.bench(compiled, {"E": 1, "I": 128, "H": 256}, "cpu", reps=1)
    assert r["convert_s"] > 0 and "anchor_s" not in r
    assert "skipped: flashinfer is not installed" in bench_mod.report(r)
