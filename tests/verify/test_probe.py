"""Dynamic verification (layoutc check --probe) and its agreement with the static verifier."""

from __future__ import annotations

import pytest
import torch

import layoutc
from layoutc import api
from layoutc.verify import rowmap
from layoutc.lang.ops import REGISTRY
from layoutc.equiv.probe import ProbeRun, probe, probe_maps
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

    monkeypatch.setattr(REGISTRY["swap_halves"], "eager", staticmethod(swap_halves))  # the function it declares
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
    # static_sources (the probe's static side) against the index map's own gather: every valid
    # output element names the source element the gather puts there, and the shapes agree.
    from layoutc.algebra.indexmap import concrete_shape, gather

    spec = layoutc.compile_file(SPECS / "flashinfer_cutedsl_nvfp4.lyt")
    chain = spec.compiled.variant(()).chain("w13_weight_scale")
    dims = {"E": 1, "I": 64, "H": 64}
    linear, valid, shape = rowmap.static_sources(chain, dims, len(chain.steps))
    source = concrete_shape(chain.source.shape, dims)
    x = torch.arange(torch.Size(source).numel(), dtype=torch.int64).reshape(source)
    out = gather(chain.composed_map(), x, dims)
    assert tuple(out.shape) == tuple(shape) == tuple(linear.shape)
    assert bool(valid.any())
    assert torch.equal(out[valid], x.reshape(-1)[linear[valid]])


# Chains with a value step that drops bits: fp32 scales reduced to their exponent field (DeepGEMM's
# UE8M0), E4M3 scales re-encoded through fp16 with the sign dropped (CuTe-DSL S0E5M3). The probe
# carries its digits where they survive (in the field; in the bits that remain) instead of calling
# the layout wrong.
LOSSY = """
spec lossy_probe
dims E, N, K
input w  : e4m3[E, N, K]            rows [w1; w3]
input sf : f32[E, N, K/128]         scales w block 128
input w2  : fp4x2[E, N, K/2]
input sf2 : e4m3[E, N, K/16]        scales w2 block 16
family exp_t {
  scale(t[..., mn, k]) {
    extract_bits(t, shift=23, width=8, to=e8m0)
    transpose(t, -1, -2)
  }
}
family s0e5m3_t {
  scale(t[..., mn, k]) {
    transpose(t, -1, -2)
    cast(t, f16)
    extract_bits(t, shift=7, width=8, to=u8)
  }
}
SWAP
interleave(sf, exp_t)
interleave(sf2, s0e5m3_t)
output w   : e4m3[E, N, K]          rows ROWS
output sf  : e8m0[E, K/128, N]      rows [w1; w3] packing exp_t
output w2  : fp4x2[E, N, K/2]
output sf2 : u8[E, K/16, N]         packing s0e5m3_t
"""


def _lossy(swap: bool) -> str:
    return (LOSSY.replace("SWAP", "swap_halves(w, dim=1)" if swap else "")
            .replace("ROWS", "[w3; w1]" if swap else "[w1; w3]"))


def test_probe_follows_digits_through_lossy_value_steps():
    spec = layoutc.compile_source(_lossy(False), "lossy_probe.lyt")
    assert probe(spec) == []
    variant = spec.compiled.variant(())
    run = ProbeRun(spec, variant, {"E": 2, "N": 8, "K": 256})
    for name in ("sf", "sf2"):
        src, valid, _ = run.sources(variant.chain(name), 0)  # every element decoded back to itself
        assert bool(valid.all()) and torch.equal(src.reshape(-1), torch.arange(src.numel())), name


def test_probe_still_catches_a_broken_implementation_on_a_lossy_chain(monkeypatch):
    def transpose(x, dim0, dim1):  # broken on purpose: the rows come out reversed
        return x.transpose(dim0, dim1).flip(-1).contiguous()

    monkeypatch.setattr(REGISTRY["transpose"], "eager", staticmethod(transpose))  # the function it declares
    spec = layoutc.compile_source(_lossy(False) + "# broken transpose\n", "lossy_broken.lyt")
    findings = probe(spec, lowerings=("eager",))
    bad = {t for d in findings if "static and dynamic verification disagree" in d.message for t in d.tensors}
    assert {"sf", "sf2"} <= bad


def test_probe_finds_a_desync_through_a_lossy_scale_chain(monkeypatch):
    monkeypatch.setattr(api, "verify", lambda compiled: [])  # the probe alone
    spec = layoutc.compile_source(_lossy(True), "lossy_desync.lyt")
    messages = " | ".join(d.message for d in probe(spec, lowerings=("eager",)))
    assert "w rows are [w3; w1] but sf rows are [w1; w3]" in messages


@pytest.mark.slow
def test_a_tensor_the_probe_cannot_decode_is_said_not_an_internal_error():
    """marlin_nvfp4's scales pass a scaled cast (no inverse): the probe cannot read positions back from
    their values, says so, and leaves them to the static maps; the other tensors are still probed."""
    said: list[str] = []
    spec = layoutc.compile_file(SPECS / "marlin_nvfp4.lyt")
    assert probe(spec, progress=said.append) == []
    undecoded = [s for s in said if s.startswith("not probed")]
    assert undecoded and all("cast has no inverse" in s for s in undecoded)
    assert not any("w13_weight:" in s for s in undecoded)  # the weights are probed


# A scale that passes a scaled cast (Marlin NVFP4's `x.to(half) * 2**7`): the op declares no inverse, so the
# probe cannot read positions back from its values.
SCALED = """
spec scaled_cast
dims E, N, K
input w  : e4m3[E, N, K]
input sf : e4m3[E, N, K/16]     scales w block 16
cast(sf, f16, exp=7)
output w  : e4m3[E, N, K]
output sf : f16[E, N, K/16]
"""


@pytest.mark.slow  # compiles and probes a spec: seconds on the 2-core machine
def test_strict_probe_refuses_a_tensor_it_cannot_decode_naming_it_and_its_line():
    spec = layoutc.compile_source(SCALED, "scaled_cast.lyt")
    said: list[str] = []
    assert probe(spec, lowerings=("eager",), progress=said.append) == []  # without --strict: said, not refused
    assert any(s.startswith("not probed") and "sf: cast has no inverse" in s for s in said)
    refused = probe(spec, lowerings=("eager",), strict=True)
    assert [d.tensors for d in refused] == [("sf",)]
    assert "sf: cast has no inverse" in refused[0].message and "--strict" in refused[0].message
    assert refused[0].pos.line == 6  # the cast's line


@pytest.mark.slow  # compiles and probes the W4A8 spec: seconds on the 2-core machine
def test_probe_says_map_bits_tensors_undecodable_instead_of_disagreeing():
    # map_bits' tables scramble the values the probe encodes positions in: before, the probe read garbage
    # positions and reported "static and dynamic verification disagree" on a correct shipped spec
    spec = layoutc.compile_file(SPECS / "vllm_cutlass_w4a8.lyt")
    said: list[str] = []
    assert probe(spec, lowerings=("eager",), progress=said.append) == []
    assert any(s.startswith("not probed") and "w13_weight_packed: map_bits maps bit fields" in s for s in said)
    refused = probe(spec, lowerings=("eager",), strict=True)
    assert sorted(t for d in refused for t in d.tensors) == ["w13_weight_packed", "w2_weight_packed"]


@pytest.mark.slow  # compiles and probes a spec: seconds on the 2-core machine
def test_check_probe_strict_exits_2_on_an_undecodable_tensor(tmp_path):
    from click.testing import CliRunner
    from layoutc.cli.main import main

    path = tmp_path / "scaled_cast.lyt"
    path.write_text(SCALED)
    loose = CliRunner().invoke(main, ["check", "--probe", "-q", str(path)])
    assert loose.exit_code == 0, loose.output
    strict = CliRunner().invoke(main, ["check", "--probe", "--strict", "-q", str(path)])
    assert strict.exit_code == 2 and "scaled_cast.lyt:6" in strict.output and "sf: cast has no inverse" in strict.output
