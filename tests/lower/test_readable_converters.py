"""What an engine developer reviews: every shipped spec's generated converter has no line over 120
characters, emits no run-time check that always holds, cites the spec lines above every lowered
function (CPU gathers included), and keeps the copied run time in one marked section after the
spec's own code."""

from __future__ import annotations

import functools
import itertools
import re

import pytest

import layoutc
from layoutc.lower import pywrap
from tests.helpers import SPECS

NAMES = sorted(p.stem for p in SPECS.glob("*.lyt"))


@functools.cache
def _spec(name: str):
    return layoutc.compile_file(SPECS / f"{name}.lyt")


@pytest.mark.parametrize("name", NAMES)
def test_no_generated_line_is_longer_than_120(name):
    long = [(i, len(line)) for i, line in enumerate(_spec(name).source.splitlines(), 1) if len(line) > 120]
    assert not long, f"{name}: lines over 120 characters (line, length): {long[:5]}"


@pytest.mark.parametrize("name", NAMES)
def test_no_run_time_check_always_holds(name):
    module = _spec(name).module
    dims = module.DIMS
    samples = [dict(zip(dims, v)) for v in itertools.product(*[(1, 2, 3, 5, 16, 48, 96, 130, 4096)] * len(dims))]
    for tensor, value, multiple, message, _ in module._CONVERT_CHECKS + module._INVERSE_CHECKS:
        if multiple == 0:
            holds = all(value(**d) for d in samples)
        else:
            holds = all(value(**d) % multiple == 0 for d in samples)
        assert not holds, f"{name}: a check that always holds is emitted: {message}"


@pytest.mark.parametrize("name", NAMES)
def test_every_lowered_function_cites_the_spec_lines(name):
    source = _spec(name).source
    for m in re.finditer(r"^(?:@triton\.jit\n)?def (_gather_\w+_part|_b_\w+)\(", source, flags=re.M):
        above = list(itertools.takewhile(lambda line: line.startswith("#"),
                                         reversed(source[:m.start()].rstrip("\n").split("\n"))))  # its comment
        cites = [line for line in above if re.match(rf"# .*{re.escape(name)}\.lyt:\d+: ", line)
                 or line == "# (no statements: copied as is)"]
        assert cites, (name, m.group(1))


@pytest.mark.parametrize("name", NAMES[:2])
def test_the_copied_runtime_is_one_section_after_the_spec_code(name):
    source = _spec(name).source
    marker = source.index("# RUNTIME: copied from layoutc")
    assert source.index("def convert(") < marker and source.index("def provenance(") < marker
    assert source.count("(copied whole)") == len(re.findall(r"^# -- layoutc\.", source, flags=re.M))
    assert all(source.index(m.group(0)) > marker for m in re.finditer(r"^# -- layoutc\.\S+ \(copied whole\)",
                                                                      source, flags=re.M))


def test_wrapping_keeps_the_syntax_tree_and_refuses_to_break_strings():
    line = "    y = f(" + ", ".join(f"'a, b {i}'" for i in range(30)) + ")  # a comment, with commas, " + "x" * 40
    out = pywrap.wrap_source(line)
    assert all(len(x) <= 120 for x in out.split("\n"))
    assert pywrap.wrap(line.strip()) == pywrap.wrap_source(line.strip())
    assert "'a, b 7'" in out  # a string is never broken


def test_named_terms_take_no_name_a_kernel_binds_itself():
    from layoutc.algebra import expr as ex
    from layoutc.lower import terms, triton_emit

    o = [ex.Var(f"o{k}") for k in range(3)]
    size = ex.floordiv(ex.add(ex.Var("H"), 3), 4)
    exprs = [ex.mul(ex.add(o[0], ex.mul(o[1], size), k), ex.add(size, k)) for k in range(1, 20)]
    names = {n for n, _ in terms.name_terms(exprs, triton_emit._LOCALS | {"H"}, ex.to_triton, width=20).defs}
    assert names and not names & triton_emit._LOCALS
    assert all(n.startswith("_") for n in names)
