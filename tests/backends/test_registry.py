"""The backend registry an engine's oracle uses instead of one conversion branch per backend."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.registry import DEFAULT, Registry, RegistryError
from tests.helpers import ROOT, SPECS, bits

DIMS = {"E": 2, "I": 128, "H": 256}


def test_check_names_every_selectable_backend_without_a_spec():
    reg = Registry({"a": SPECS / "flashinfer_cutlass_bf16.lyt"})
    with pytest.raises(RegistryError) as err:
        reg.check(["a", "trtllm_mxfp4", "marlin"])
    msg = str(err.value)
    assert "trtllm_mxfp4, marlin can be selected but have no layout spec" in msg and "registered: a" in msg
    reg.check(["a"])  # complete: no error


def test_check_compiles_and_so_verifies_every_selectable_spec(tmp_path):
    bad = tmp_path / "bad.lyt"
    text = (SPECS / "flashinfer_cutlass_bf16.lyt").read_text()
    old = "swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)"
    assert old in text
    bad.write_text(text.replace(old, "swap_halves([w13_weight, w13_weight_scale], dim=1)"))
    reg = Registry({"ok": SPECS / "flashinfer_cutlass_bf16.lyt", "desync": bad})
    reg.check(["ok"])
    with pytest.raises(layoutc.SpecError, match="w13_bias"):
        reg.check(["ok", "desync"])  # at start-up, not when the first layer loads


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(RegistryError, match="no layout spec for backend 'flashinfer_cutlas_mxfp4_bf16'"):
        DEFAULT.convert("flashinfer_cutlas_mxfp4_bf16", {})


def test_specs_compile_once_and_are_shared():
    reg = Registry({
        "a": SPECS / "flashinfer_cutedsl_nvfp4.lyt",
        "b": (SPECS / "flashinfer_cutedsl_nvfp4.lyt", {"activation": "silu"}),
        "c": (str(SPECS / "flashinfer_cutedsl_nvfp4.lyt"), {"activation": "relu2"}),
    })
    assert reg.spec("a") is reg.spec("a")
    assert reg.spec("b") is reg.spec("b") and reg.spec("b") is not reg.spec("c")
    assert reg.spec("c").params["activation"] == "relu2"
    assert reg.backends == ("a", "b", "c")


def test_convert_matches_the_spec_and_records_the_shapes_it_saw():
    reg = Registry({"bf16": SPECS / "flashinfer_cutlass_bf16.lyt"})
    spec = reg.spec("bf16")
    x = synthetic_inputs(spec, DIMS, seed=2)
    extra = dict(x, some_other_param=torch.zeros(1))  # an engine layer holds more than the MoE weights
    out = reg.convert("bf16", extra)
    want = spec.convert(x)
    assert all(torch.equal(bits(out[k]), bits(want[k])) for k in want)
    reg.convert("bf16", x)
    reg.convert("bf16", synthetic_inputs(spec, {"E": 1, "I": 128, "H": 128}, seed=2))
    keys = reg.cache_keys()
    assert len(keys) == 2 and all(k[0] == spec.sha256 for k in keys)


def test_default_registry_covers_the_shipped_specs():
    DEFAULT.check(DEFAULT.backends)
    assert {DEFAULT.spec(b).name for b in DEFAULT.backends} == {p.stem for p in SPECS.glob("*.lyt")}


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_engine_oracle_example_runs():
    proc = subprocess.run([sys.executable, "examples/engine_oracle.py"], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "converted and guarded" in proc.stdout
    assert "start-up check: backend(s) cutlass_w4a8 can be selected but have no layout spec" in proc.stdout
