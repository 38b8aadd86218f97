"""`layoutc demo` works for every shipped spec and its variants (choices of its parameters, a TP rank),
at sizes where padding pads, and for a spec a user writes. Padded outputs do not determine the unpadded
dims, so the demo hands its dims to the inverse (it failed there on five of the nine specs)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from layoutc.front import ast
from layoutc.cli.main import main
from layoutc.cli.demo import run_demo
from layoutc.lang.resolver import _value_to_python
from layoutc.front.parse import parse
from layoutc import shipped
from tests.helpers import SPECS

#: Sizes every shipped spec takes at tp_size 1 and 2; PADDING makes the padded specs pad (I=64 to 128 or 256).
DIMS = {"E": 2, "I": 256, "H": 256}
PADDING = {"E": 1, "I": 64, "H": 256}


def variants(path) -> list[dict]:
    """The default, every choice of every parameter that has choices, and rank 1 of 2 where the spec shards."""
    params = [item for item in parse(path.read_text(), str(path)).items if isinstance(item, ast.Param)]
    out = [{}]
    for p in params:
        if p.choices is not None:
            default = _value_to_python(p.default)
            out += [{p.name.text: c} for c in _value_to_python(p.choices) if c != default]
    if any(p.name.text == "tp_size" for p in params):
        out.append({"tp_size": 2, "tp_rank": 1})
    return out


# dims a spec needs beyond DIMS (vllm_cutlass_w4a8: I and H multiples of 256 per rank, so 512 at tp_size=2)
OWN_DIMS = {"vllm_cutlass_w4a8": {"E": 2, "I": 512, "H": 256}}
CASES = [(path.stem, params, dims) for path in sorted(SPECS.glob("*.lyt")) for params in variants(path)
         for dims in ([DIMS, PADDING] if "pad(" in path.read_text() and not params
                      else [OWN_DIMS.get(path.stem, DIMS)])]


def _demo(spec, dims, params):
    lines: list[str] = []
    ok = run_demo(spec, dims, 0, "cpu", params, echo=lines.append)
    return ok, "\n".join(lines)


def test_demo_of_a_padded_spec_inverts_with_the_dims():
    ok, report = _demo(SPECS / "flashinfer_trtllm_bf16.lyt", {"E": 1, "I": 64, "H": 128}, {})
    assert ok, report
    assert "inverse(convert(x)) == x bit for bit: yes" in report and "result: OK" in report


USER_SPEC = """\
spec my_padded
dims E, I, H
input w : bf16[E, I, H]
pad(w, dim=1, multiple=64)
output w : bf16[E, round_up(I, 64), H]
"""


def test_demo_of_a_padded_user_spec_from_the_command_line(tmp_path):
    path = tmp_path / "mine.lyt"
    path.write_text(USER_SPEC)
    result = CliRunner().invoke(main, ["demo", str(path), "--shape", "E=2,I=40,H=16"])
    assert result.exit_code == 0, result.output
    assert "inverse(convert(x)) == x bit for bit: yes" in result.output and "result: OK" in result.output


def test_the_variants_cover_the_parameters():
    by_spec = {}
    for name, params, _ in CASES:
        by_spec.setdefault(name, []).append(params)
    assert sorted(by_spec) == shipped.names()
    assert {"activation": "relu2"} in by_spec["flashinfer_trtllm_bf16"]
    assert {"checkpoint": "gpt_oss"} in by_spec["flashinfer_cutlass_mxfp4_padded"]
    assert all({"tp_size": 2, "tp_rank": 1} in v for v in by_spec.values())


@pytest.mark.slow  # every shipped spec and variant: a minute on the 2-core machine
@pytest.mark.parametrize("name,params,dims", CASES,
                         ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in p.items()) or 'default'}-I{d['I']}"
                              for n, p, d in CASES])
def test_demo_of_every_shipped_spec_and_variant(name, params, dims):
    ok, report = _demo(SPECS / f"{name}.lyt", dims, params)
    assert ok, report
    assert "result: OK" in report
