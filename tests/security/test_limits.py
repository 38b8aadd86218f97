"""Work bounded by the spec's size: what once took minutes, gigabytes or a RecursionError is now an
error with a location (or, where the spec is legitimate, quick). Each case runs under a generous
time limit in a subprocess-free way; the limit is a hang detector, not a speed target."""

from __future__ import annotations

import signal
from contextlib import contextmanager

import pytest

import layoutc
from layoutc.algebra.expr import Var
from layoutc.limits import MAX_DIMS, MAX_INT, MAX_NESTING, MAX_OPTIONAL_INPUTS, MAX_STATEMENTS, MAX_STEPS_PER_TENSOR

HEADER = "dims E, I, H\ninput w13_weight : fp4x2[E, 2*I, H/2] rows [w1; w3]\noutput w13_weight : fp4x2[E, 2*I, H/2] rows [w1; w3]\n"


@contextmanager
def no_hang(seconds: int = 60):
    def fail(*_):
        raise AssertionError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def rejected(text: str, fragment: str, filename: str = "big.lyt") -> str:
    with no_hang(), pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source(text, filename)
    rendered = info.value.render()
    assert fragment in rendered, rendered
    assert info.value.diagnostics[0].pos is not None, rendered
    return rendered


def test_many_dims_are_sampled_within_a_budget():
    # 12 dims, each used: 4^12 combinations once; now a bounded sample, verified in seconds.
    names = [f"D{i}" for i in range(12)]
    text = (f"dims {', '.join(names)}\ninput a : u8[{', '.join(names)}]\n"
            f"output a : u8[{', '.join(names)}]\n")
    with no_hang():
        assert layoutc.compile_source(text, "dims.lyt").program.dims == tuple(names)


def test_too_many_dims_and_unused_dims():
    names = [f"D{i}" for i in range(MAX_DIMS + 1)]
    rejected(f"dims {', '.join(names)}\ninput a : u8[D0]\noutput a : u8[D0]\n", f"at most {MAX_DIMS} dims")
    rejected("dims D0, D1, D2\ninput a : u8[D0]\noutput a : u8[D0]\n", "dim D1 cannot be inferred")


@pytest.mark.parametrize("count", [MAX_STEPS_PER_TENSOR + 1, 1000])
def test_long_chains_are_refused(count):
    rejected(HEADER + "swap_halves(w13_weight, dim=1)\n" * count, f"more than {MAX_STEPS_PER_TENSOR} transforms")


def test_too_many_statements():
    body = "".join("if not w13_bias { swap_halves(w13_weight, dim=1) }\n" for _ in range(MAX_STATEMENTS + 1))
    text = HEADER.replace("output", "input w13_bias? : f32[E, 2*I] bias of w13_weight\noutput") + \
        "output w13_bias? : f32[E, 2*I]\n" + body
    rejected(text, "transform statements")


def test_ten_thousand_statements_end_quickly():
    text = HEADER + "cast(w13_weight, u8)\n" * 10_000
    rejected(text, "transform statements")


@pytest.mark.parametrize("text", [
    "dims E\nparam p = true\ninput a : u8[E]\noutput a : u8[E]\n" + "if p {\n" * 500 + "}\n" * 500,
    "dims E\ninput a : u8[E, " + "-" * 3000 + "E]\noutput a : u8[E, E]\n",
])
def test_deep_nesting_is_refused(text):
    rendered = rejected(text, f"more than {MAX_NESTING} levels")
    assert max(len(line) for line in rendered.splitlines()) < 300  # a window, not a megabyte line


@pytest.mark.parametrize("number", ["9" * 100_000, str(2**62), str(MAX_INT + 1)])
def test_huge_integers_are_refused(number):
    rejected(HEADER + f"interleave_rows(w13_weight, dim=1, group={number})\n", "is too large")
    rejected(f"dims E\ninput a : u8[E, {number}]\noutput a : u8[E, 1]\n", "is too large")


def test_parentheses_make_no_tree_depth():
    with no_hang():
        spec = layoutc.compile_source(
            "dims E\ninput a : u8[E, " + "(" * 3000 + "E" + ")" * 3000 + "]\noutput a : u8[E, E]\n", "parens.lyt")
    assert spec.program.input("a").shape == (Var("E"), Var("E"))  # the parentheses leave the plain dim


def test_integers_up_to_the_limit_are_numbers():
    spec = layoutc.compile_source(f"dims E\nassume E % {MAX_INT} == 0\ninput a : u8[E]\noutput a : u8[E]\n", "m.lyt")
    assert spec.program.assumptions[0].multiple == MAX_INT


def test_optional_inputs_and_parameter_combinations_are_bounded(tmp_path):
    opts = "".join(f"input b{i}? : f32[E, 2*I] bias of w13_weight\n" for i in range(MAX_OPTIONAL_INPUTS + 1))
    rejected(HEADER.replace("output", opts + "output"), "optional inputs")
    from click.testing import CliRunner

    from layoutc.cli.main import main

    params = "".join(f"param p{i} = true\n" for i in range(7))  # 128 combinations
    path = tmp_path / "params.lyt"
    path.write_text(params + HEADER)
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 2 and "128 parameter combinations" in result.output and "fix some with -D" in result.output
    result = CliRunner().invoke(main, ["check", str(path)] + [a for i in range(3) for a in ("-D", f"p{i}=true")])
    assert result.exit_code == 0, result.output
