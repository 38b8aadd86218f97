"""Code generation grows with the distinct chains a spec makes, not with its presence variants times its
parameter combinations (issue 20 item 19: 6 bool parameters and 6 optional inputs wrote 768 kernel headers
and map texts per combination, 20 s of a 25 s compile, so ``check`` of its 64 combinations took 27 min).
The work is counted (:func:`layoutc.lower.memo.computed`), never timed; what is kept must give the bytes
generated from nothing."""

from __future__ import annotations

import inspect
import itertools

from layoutc.front.parse import parse
from layoutc.lang.compiler import build
from layoutc.lang.resolver import resolve
from layoutc.lower import codegen, memo, pywrap


def _options_spec(n: int) -> str:
    """n bool parameters, each adding two swaps of every tensor, and n optional biases (2^n variants)."""
    lines = ["dims E, I, H"] + [f"param p{i} = false choices [true, false]" for i in range(n)]
    lines.append("input w : bf16[E, 2*I, H] rows [w1; w3]")
    lines += [f"input b{i}? : f32[E, 2*I] bias of w" for i in range(n)]
    every = "[" + ", ".join(["w"] + [f"b{i}" for i in range(n)]) + "]"
    lines += [f"if p{i} {{ swap_halves({every}, dim=1)\nswap_halves({every}, dim=1) }}" for i in range(n)]
    lines.append(f"swap_halves({every}, dim=1)")
    lines.append("output w : bf16[E, 2*I, H] rows [w3; w1]")
    lines += [f"output b{i}? : f32[E, 2*I] rows [w3; w1]" for i in range(n)]
    return "\n".join(lines) + "\n"


def _combos(n: int) -> list[dict]:
    return [{f"p{i}": v for i, v in enumerate(c)} for c in itertools.product([False, True], repeat=n)]


def test_kernels_and_maps_are_written_once_per_distinct_chain():
    n = 2
    text = _options_spec(n)
    compiled = [build(resolve(parse(text, "opts.lyt"), params)) for params in _combos(n)]
    memo.clear()
    warm = [codegen.generate(c) for c in compiled]
    chains = [ch for c in compiled for v in c.variants for ch in v.chains]
    distinct = {memo.chain_key(ch) for ch in chains}
    # The weight's chain takes 1, 3 or 5 swaps (how many parameters are true), so do the biases'.
    assert len(distinct) == (n + 1) * (n + 1)
    done = memo.computed()
    for kind in ("plan", "map", "body", "gather"):
        assert done[kind] == len(distinct), kind
    assert len(chains) >= 3 * len(distinct)  # what was planned, printed and emitted before
    # What is kept gives the bytes generated from nothing: the last combination (its chains found kept,
    # under the same names) generated again with nothing kept.
    memo.clear()
    assert codegen.generate(compiled[-1]) == warm[-1]


def test_wrapping_in_parts_is_wrapping_the_whole():
    long_call = "x = f(" + ", ".join(f"argument_{i}" for i in range(30)) + ")  # " + "a comment " * 8
    in_string = 'DOC = """\n' + "a line inside a string, " * 8 + '\n"""'
    parts = [
        inspect.getsource(pywrap),
        "def g(a, b):\n    return {" + ", ".join(f"'k{i}': a + {i}" for i in range(25)) + "}\n",
        long_call,
        in_string,
        "",
        "# " + "a comment line that is far too long " * 5,
    ]
    for sep in ("\n", "\n\n"):
        memo.clear()
        whole = pywrap.wrap(sep.join(parts))
        assert pywrap.wrap_parts(parts, sep) == whole
        kept = memo.computed()["wrap"]
        assert pywrap.wrap_parts(parts, sep) == whole
        assert memo.computed()["wrap"] == kept  # the second time, every part is found
