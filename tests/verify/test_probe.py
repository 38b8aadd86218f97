"""Dynamic verification (layoutc check --probe) and its agreement with the static verifier."""

from __future__ import annotations

import pytest
import torch

import layoutc
from layoutc import api
from layoutc import expr as ex
from layoutc.indexmap import source_indices
from layoutc.ops import torch_impl
from layoutc.probe import ProbeRun, probe, probe_maps
from tests.helpers import SPECS

CORPUS = SPECS.parent / "tests" / "verify" / "corpus"


@pytest.mark.parametrize("name,params", [
    ("flashinfer_cutlass_bf16", {}), ("flashinfer_cutlass_mxfp8", {}),
    ("flashinfer_cutedsl_nvfp4", {"activation": "silu"}), ("flashinfer_cutedsl_nvfp4", {"activation": "relu2"}),
    ("flashinfer_trtllm_mxfp4", {}), ("flashinfer_cutlass_mxfp4_padded", {"checkpoint": "gpt_oss"}),
    ("flashinfer_trtllm_nvfp4", {"activation": "silu"}), ("flashinfer_cutlass_nvfp4", {"activation": "silu"}),
    ("flashinfer_cutlass_nvfp4", {"activation": "relu2"}), ("flashinfer_trtllm_fp8_block", {}),
    ("flashinfer_trtllm_bf16", {"activation": "silu"}),
])
@pytest.mark.slow  # over 5 s on the 2-core machine: `make test-slow`
def test_shipped_specs_pass_the_probe(name, params):
    assert probe(layoutc.compile_file(SPECS / f"{name}.lyt", params)) == []


def test_probe_decodes_each_element_to_its_source():
    spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
    dims = {"E": 2, "I": 128, "H": 128}
    src, valid = probe_maps(spec, "w13_bias", dims, present=("w13_bias", "w2_bias"))
    assert bool(valid.all())
    e, r = torch.meshgrid(torch.arange(2), torch.arange(256), indexing="ij")
    expected = e * 256 + (r + 128) % 256  # swap_halves: out row r reads row (r + I) mod 2I
    assert torch.equal(src, expected)


def test_probe_traces_single_bits_through_the_sm90_interleave():
    spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
    dims = {"E": 1, "I": 128, "H": 128}
    variant = spec.compiled.variant(())
    run = ProbeRun(spec, variant, dims)
    chain = variant.chain("w2_weight")
    # Decoding through the inverse of the bit interleave gives back the identity, byte for byte.
    src, valid, shape = run.sources(chain, 0)
    assert bool(valid.all())
    assert torch.equal(src.reshape(-1), torch.arange(src.numel()))
    # Without decoding, the interleaved bytes mix bits of four source bytes: not whole-byte moves.
    _, whole, _ = run.sources(chain, len(chain.steps))
    assert not bool(whole.all())


@pytest.mark.slow  # over 5 s on the 2-core machine: `make test-slow`
def test_a_primitive_whose_implementation_disagrees_with_its_map_is_caught(monkeypatch):
    def swap_halves(x, dim):  # broken on purpose: rotates by one row too many
        h = x.shape[dim] // 2
        return torch.roll(x, shifts=h + 1, dims=dim)

    monkeypatch.setattr(torch_impl, "swap_halves", swap_halves)
    text = (SPECS / "flashinfer_cutlass_bf16.lyt").read_text() + "\n# probe-test variant\n"
    spec = layoutc.compile_source(text, "broken_impl.lyt")  # static verification only sees the maps: passes
    findings = probe(spec)
    assert findings
    assert any("static and dynamic verification disagree" in d.message for d in findings)
    assert any("w13_weight" in d.tensors for d in findings)


@pytest.mark.slow  # over 5 s on the 2-core machine: `make test-slow`
def test_dynamic_verdict_is_independent_of_the_static_one(monkeypatch):
    # Switch the static verifier off; the probe alone must still find the desync.
    monkeypatch.setattr(api, "verify", lambda compiled: [])
    text = (CORPUS / "bias_not_swapped.lyt").read_text() + "\n# probe-only\n"
    spec = layoutc.compile_source(text, "bias_not_swapped_probe.lyt")
    findings = probe(spec)
    messages = " | ".join(d.message for d in findings)
    assert "w13_weight rows are [w3; w1] but w13_bias rows are [w1; w3]" in messages
    assert "static verifier accepted" in messages


def test_static_sources_equal_gathering_the_composed_map():
    spec = layoutc.compile_file(SPECS / "flashinfer_cutedsl_nvfp4.lyt")
    chain = spec.compiled.variant(()).chain("w13_weight_scale")
    dims = {"E": 1, "I": 64, "H": 64}
    m = chain.composed_map()
    linear, valid, _ = source_indices(m, dims)
    x = torch.arange(int(ex.evaluate(chain.source.shape[1], dims)) * 4).reshape(1, -1, 4).to(torch.int64)
    from layoutc.indexmap import gather
    out = gather(m, x, dims)
    assert torch.equal(out[valid], x.reshape(-1)[linear[valid]])
