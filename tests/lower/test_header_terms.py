"""A kernel's header names its map's index terms (``with A = ceil_div(H/16, 4)``, ``p = k + 4*A*r``); its
body, and the CPU gather under the same header, compute each of them once under the header's name
(``_A``, ``_p``) and with the header's meaning, so a reviewer reads the body against the header."""

from __future__ import annotations

import functools
import random
import re

import pytest

import layoutc
from layoutc.algebra import expr as ex
from layoutc.lang.ops import conversion as cv
from layoutc.algebra.dtypes import ELEMENT_TYPES
from layoutc.lower import maptext, torch_emit, triton_emit
from layoutc.lower.plan import plan
from tests.helpers import SPECS, compiled

NAMES = sorted(p.stem for p in SPECS.glob("*.lyt"))
_BINDING = re.compile(r"^\s+(_[A-Za-z])(?:: tl\.constexpr)? = (.*)$")


@functools.cache
def _planned(name: str):
    spec = compiled(SPECS / f"{name}.lyt")
    chains = spec.compiled.variants[0].chains
    return spec.program.dims, [(c, p) for c in chains if (p := plan(c)).one_pass]


def _header_names(chain, p) -> list[str]:
    """The names the header's map defines (``with A = ...`` and the lines under it; not ``T = [table]``)."""
    found = (re.match(r"#\s+(?:with )?([A-Za-z]) = (.)", line) for line in triton_emit.header(chain, p, "spec.lyt"))
    return [m.group(1) for m in found if m and m.group(2) != "["]


def _bindings(lines: list[str]) -> list[tuple[str, str]]:
    """(name, Python text of its value) for each one-letter term a walk binds, in order."""
    return [m.groups() for line in lines if (m := _BINDING.match(line))]


def _walk_of_the_map(source: str) -> list[str]:
    """The lines of the walk over the map's own coordinates: the ``else`` of an ``_ALT`` choice."""
    lines = source.split("\n")
    if "    if _ALT:" in lines:
        return lines[lines.index("    else:") + 1:]
    return lines


def _check(bound: list[tuple[str, str]], terms, dims, where: str) -> None:
    names = [n for n, _ in bound]
    assert {n for n, _ in terms} <= set(names), (where, names, [n for n, _ in terms])
    rng = random.Random(0)
    for _ in range(3):
        env = {d: 64 * rng.randint(1, 9) for d in dims}
        env.update({f"o{k}": rng.randint(0, 999) for k in range(8)})
        values = dict(env)
        for name, text in bound:
            values[name] = eval(text, {}, dict(values))  # integer arithmetic, as the kernel's
        for name, whole in terms:
            assert values[name] == ex.evaluate(whole, env), (where, name, ex.to_str(whole))


def _check_chains(dims, planned) -> int:
    checked = 0
    for chain, p in planned:
        terms = triton_emit.header_terms(chain, p)
        assert [n[len(maptext.TERM_PREFIX):] for n, _ in terms] == _header_names(chain, p), chain.tensor
        if not terms:
            continue
        kernel = triton_emit.body(p, "_b", dims, terms)
        _check(_bindings(_walk_of_the_map(kernel)), terms, dims, f"{chain.tensor} kernel")
        gather = torch_emit.gather_function(p, "_g", dims, terms)
        part = gather.split("\n\n\n")[0]  # _g_part: the walk over the map's coordinates
        assert part.startswith("def _g_part(")
        _check(_bindings(part.split("\n")), terms, dims, f"{chain.tensor} gather")
        checked += 1
    return checked


#: A swizzled scale after a row swap: a map long enough that its header names six terms.
SWIZZLED = """dims E, R, K
assume K % 32 == 0
input w : fp4x2[E, R, K/2]
input s : e8m0[E, R, K/32]   scales w block 32
swap_halves([w, s], dim=1)
interleave(s, sf_128x4)
output w : fp4x2[E, R, K/2]
output s : e8m0[E, round_up(R, 128), round_up(K/32, 4)]   packing sf_128x4
"""


def test_a_swizzled_scale_body_computes_its_header_terms_under_their_names():
    spec = layoutc.compile_source(SWIZZLED, "terms.lyt", verify_spec=False)
    chain = spec.compiled.variants[0].chain("s")
    p = plan(chain)
    assert [n for n, _ in triton_emit.header_terms(chain, p)] == ["_A", "_p", "_q", "_s", "_t", "_u"]
    assert _check_chains(spec.program.dims, [(chain, p)]) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_body_computes_the_terms_its_header_names_under_those_names(name):
    assert _check_chains(*_planned(name)) or name in {"deepgemm_fp8_block", "aiter_fp8_block", "marlin_gptq_int4",
                               "flashinfer_trtllm_fp8_block"}  # specs whose maps need no names


def test_no_local_of_a_generated_function_takes_a_header_name():
    # Header terms are one letter, bound as '_' and that letter: no local the emitters or the value
    # conversions write may be one (a header's T would have been the rows walk's tile _T).
    one_letter = re.compile(r"_[A-Za-z]$")
    assert not [n for n in triton_emit._LOCALS | torch_emit._LOCALS if one_letter.match(n)]
    f32, bf16, u8 = ELEMENT_TYPES["f32"], ELEMENT_TYPES["bf16"], ELEMENT_TYPES["u8"]
    written = [*cv.Cast(bf16).kernel("v", f32), *cv.ExtractBits(u8, shift=4, width=4).kernel("v", u8),
               *cv.InsertBits(u8, shift=4, width=4).kernel("v", u8)]
    assert written and not [line for line in written if one_letter.match(line.split(" = ")[0].strip())]
