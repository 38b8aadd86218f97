"""Every size, not sampled sizes: size regions, their representatives, and what `check` says it covered.

The corpus in ``corpus/sizes/`` holds specs whose statement under a size or parameter condition breaks
a tie or the kernel's row order only in its region; each must be rejected naming the region (or the
parameter values) and the line.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from click.testing import CliRunner

import layoutc
from layoutc.algebra import expr as ex
from layoutc.cli.main import _param_domains, main
from layoutc.algebra.regions import Region, TooLarge, region_of, representatives
from tests.helpers import SPECS, expectations

SIZES = sorted((Path(__file__).parent / "corpus" / "sizes").glob("*.lyt"))


def _params_expected(path: Path) -> str | None:
    for line in path.read_text().splitlines():
        if line.startswith("# expect-params: "):
            return line.split(": ", 1)[1]
    return None


def test_the_sizes_corpus_has_a_case_per_kind_of_condition():
    names = {p.stem for p in SIZES}
    assert {"eq_on_I_undoes_the_swap", "gt_on_H_desyncs_the_scales", "ge_on_E_desyncs_the_bias",
            "else_branch_of_le", "multiple_of_256_undoes_the_swap", "lt_between_two_dims",
            "padding_boundary_of_round_up", "tp_size_8_only", "else_branch_of_ne", "range_middle_branch"} <= names


@pytest.mark.parametrize("path", SIZES, ids=lambda p: p.stem)
def test_a_statement_under_a_condition_is_rejected_in_its_region(path):
    expects, line = expectations(path)
    params = _params_expected(path)
    failures = []
    for combo in _param_domains(path, {}):
        try:
            layoutc.compile_file(path, combo)
        except layoutc.SpecError as err:
            failures.append((combo, err))
    assert failures, f"{path.name} passed for every parameter value"
    if params is not None:
        name, value = params.split("=")
        assert [c for c, _ in failures] == [c for c in _param_domains(path, {}) if str(c[name]) == value]
    for combo, err in failures:
        text = err.render()
        for fragment in expects:
            assert fragment in text, f"missing {fragment!r} in:\n{text}"
        assert any(d.pos is not None and d.pos.line == line for d in err.errors), text
        assert path.read_text().splitlines()[line - 1] in text


def test_cli_names_the_parameter_values_a_finding_holds_at():
    path = next(p for p in SIZES if p.stem == "tp_size_8_only")
    out = CliRunner().invoke(main, ["check", str(path)])
    assert out.exit_code == 2
    assert f"{path}: with tp_size=8:" in out.output and "ok (tp_size=4)" in out.output


@pytest.mark.slow  # over 3 s on the 2-core machine
def test_without_the_conditional_statement_the_corpus_specs_pass():
    # The findings come from the statement under the condition, not from the rest of the spec.
    for path in SIZES:
        _, line = expectations(path)
        lines = path.read_text().splitlines()
        del lines[line - 1]
        for combo in _param_domains(path, {}):
            layoutc.compile_source("\n".join(lines) + "\n", path.name, combo)


def _program(text: str):
    return layoutc.compile_source(text, "r.lyt", verify_spec=False).compiled


BASE = """dims E, I, H
assume I % 32 == 0
input w : bf16[E, 2*I, H] rows [w1; w3]
swap_halves(w, dim=1)
output w : bf16[E, 2*I, H] rows [w3; w1]
"""


def test_an_equality_region_is_verified_at_its_size_and_the_rest_around_it():
    compiled = _program(BASE.replace("swap_halves(w, dim=1)", "swap_halves(w, dim=1)\nif I == 2944 { cast(w, bf16) }"))
    program = compiled.program
    for variant in compiled.variants:
        region = region_of(program, variant.present)
        reps, status = representatives(program, region, program.dims, [(ex.Var("I"), 32)])
        assert status == "covered"
        if dict(region.holds)["I == 2944"]:
            assert {r["I"] for r in reps} == {2944}
        else:  # both sides of the boundary, and small sizes
            values = {r["I"] for r in reps}
            assert {2912, 2976} <= values and min(values) == 32 and 2944 not in values


def test_an_empty_region_is_reported_empty_not_verified_on_nothing():
    compiled = _program(BASE.replace("swap_halves(w, dim=1)", "swap_halves(w, dim=1)\nif I == 100 { cast(w, bf16) }"))
    program = compiled.program
    region = Region((("I == 100", True),))
    assert representatives(program, region, program.dims, [(ex.Var("I"), 32)]) == ([], "empty")


def test_a_huge_lower_bound_is_refused_before_any_allocation():
    # issue 20 item 18: `assume I >= 2147483647` allocated 34-343 GB, then exit 3.
    text = BASE.replace("assume I % 32 == 0", "assume I >= 2147483647")
    with pytest.raises(layoutc.SpecError) as err:
        layoutc.compile_source(text, "big.lyt")
    assert "MAX_REPRESENTATIVE" in err.value.render() and "big.lyt:2:" in err.value.render()


def test_the_too_large_check_counts_elements_before_evaluating():
    compiled = _program(BASE.replace("assume I % 32 == 0", "assume I >= 60000\nassume H >= 60000"))
    program = compiled.program
    with pytest.raises(TooLarge) as err:
        representatives(program, Region(()), program.dims, [], size_of=lambda env: env["I"] * env["H"] * 2)
    assert "MAX_VERIFY_ELEMENTS" in err.value.message


def test_check_says_what_the_claims_cover():
    path = next(p for p in SIZES if p.stem == "padding_boundary_of_round_up")
    lines = path.read_text().splitlines()
    _, line = expectations(path)
    lines[line - 1] = "if round_up(I, 128) > I { cast(w2_bias, bf16) }"
    src = "\n".join(lines) + "\n"
    spec = layoutc.compile_source(src, "ok.lyt")
    scope = spec.coverage[0][0].scope
    assert scope.startswith("for all sizes, in every region: ")
    assert "round_up(I, 128) <= I" in scope and "round_up(I, 128) > I" in scope
    plain = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt").coverage
    assert plain[0][0].scope == "for all sizes; with tp_size=1, tp_rank=0 (check -D NAME=N verifies another value)"
    assert plain[1] == []  # the parameters' values are on the summary line, not one note each


def test_a_parameter_tested_without_choices_is_a_coverage_warning_strict_refuses(tmp_path):
    path = tmp_path / "tp.lyt"
    src = next(p for p in SIZES if p.stem == "tp_size_8_only").read_text()
    path.write_text(src.replace("param tp_size = 1 choices [1, 2, 4, 8]", "param tp_size = 1"))
    out = CliRunner().invoke(main, ["check", str(path)])
    assert out.exit_code == 0 and "parameter tp_size is tested by a condition but declares no choices" in out.output
    strict = CliRunner().invoke(main, ["check", "--strict", str(path)])
    assert strict.exit_code == 2


LARGE_SIZES = """dims E, I, H
assume I % 32 == 0
assume H % 64 == 0
input w13 : bf16[E, 2*I, H] rows [w1; w3]
input s : f32[E, 2*I, H/32] scales w13 block 32
pad([w13, s], dim=1, multiple=128, parts=2)
swap_halves([w13, s], dim=1)
if I > 4096 { swap_halves(w13, dim=1) }
if I % 256 == 0 { swap_halves(s, dim=1) }
if H == 7168 { swap_halves([w13, s], dim=1) }
output w13 : bf16[E, 2*round_up(I, 128), H] rows [w3; w1]
output s : f32[E, 2*round_up(I, 128), H/32] rows [w3; w1]
"""


# Conditions and shapes that nest floors: ceil_div(I/32, 4) % 2 has period 256 in I (8 classes of
# multiples of 32), ceil_div(ceil_div(I, 32), 2) % 2 period 128, round_up(ceil_div(H, 64), 3) period 192
# in H (3 classes of multiples of 64): the divisors alone (32, 4, 2; 64, 3) name the wrong classes.
NESTED_SIZES = """dims E, I, H
assume I % 32 == 0
assume H % 64 == 0
input w13 : bf16[E, 2*I, H] rows [w1; w3]
input s : f32[E, 2*I, H/32] scales w13 block 32
pad([w13, s], dim=1, multiple=128, parts=2)
swap_halves([w13, s], dim=1)
if ceil_div(I/32, 4) % 2 == 1 { swap_halves(w13, dim=1) }
if ceil_div(ceil_div(I, 32), 2) % 2 == 0 { swap_halves(s, dim=1) }
if round_up(ceil_div(H, 64), 3) > ceil_div(H, 64) { swap_halves([w13, s], dim=1) }
output w13 : bf16[E, 2*round_up(I, 128), H] rows [w3; w1]
output s : f32[E, 2*round_up(I, 128), H/32] rows [w3; w1]
"""


@pytest.mark.slow  # over 3 s on the 2-core machine
@pytest.mark.parametrize("text", [LARGE_SIZES, NESTED_SIZES], ids=["padding", "nested_floors"])
def test_large_real_model_sizes_get_the_verdict_of_their_region(text):
    """Sizes up to 16k with random residues (fixed seed): the verifier's verdict on each, evaluated at that
    size alone, is the verdict of the region the size is in."""
    from layoutc.verify.rules import Verifier

    compiled = _program(text)
    program = compiled.program

    class At:  # the static facts, on the sizes given
        def __init__(self, sizes):
            self.sizes = sizes

        def axis(self, chain, dims, rows=False):
            from layoutc.verify.rowmap import axis_map
            return axis_map(chain, dims, rows)

        def samples(self, program, variant):
            return self.sizes

    verdicts = {}
    for variant in compiled.variants:
        region = region_of(program, variant.present)
        v = Verifier(compiled)
        samples, status = v.region_samples(variant)
        assert status in ("covered", "empty"), (region, status)
        if status == "empty":
            continue
        v.check_variant(variant, samples)
        verdicts[region] = bool(v.diags)
    assert set(verdicts.values()) == {True, False}  # some regions break the layout, some do not
    rng = random.Random(23)
    for _ in range(12 if text is LARGE_SIZES else 8):
        env = {"E": rng.randint(1, 4), "I": 32 * rng.randint(1, 512), "H": 64 * rng.randint(1, 256)}
        if rng.random() < 0.25:
            env["H"] = 7168
        variant = next(v for v in compiled.variants if region_of(program, v.present) ==
                       Region(tuple((c.label, c.holds(env)) for c in program.conditions)))
        v = Verifier(compiled, At([env]))
        v.check_variant(variant, [env])
        assert bool(v.diags) == verdicts[region_of(program, variant.present)], env


# -- work grows with what the spec says (issue 20 item 19) --------------------------------------


def _capped_size(e, cap: int) -> int:
    n, stack = 0, [e]
    while stack and n < cap:
        n += 1
        stack.extend(ex.children(stack.pop()))
    return n


def test_a_long_chain_is_verified_with_bounded_work(monkeypatch):
    """64 interleave_rows steps on one tensor ran over 900 s: composed into one map, the expressions grow with
    every step. Counted: the size of every expression the verifier evaluates."""
    from layoutc.verify import rowmap
    from layoutc.lang.compiler import build
    from layoutc.lang.resolver import resolve
    from layoutc.front.parse import parse
    from layoutc.verify.rules import Verifier

    lines = ["dims E, I, H", "input w : bf16[E, 2*I, H] rows [w1; w3]"]
    lines += [f"interleave_rows(w, dim=1, group={1 << (i % 6)})" for i in range(64)]
    lines += ["output w : bf16[E, 2*I, H] rows [w1; w3]"]
    compiled = build(resolve(parse("\n".join(lines) + "\n", "long.lyt")))
    sizes = []
    real = ex.evaluate

    def counted(e, env):
        sizes.append(_capped_size(e, 10_000))
        return real(e, env)

    monkeypatch.setattr(rowmap.ex, "evaluate", counted)
    v = Verifier(compiled)
    findings = v.run()
    assert findings and "the kernel expects rows [w1; w3]" in findings[0].message  # 64 steps do move rows
    assert max(sizes) < 1_000 and sum(sizes) < 2_000_000, (max(sizes), sum(sizes))


def test_stepwise_evaluation_gives_the_composed_maps(monkeypatch):
    from layoutc.verify import rowmap
    from layoutc.verify.rules import region_dims

    for name in ("flashinfer_cutlass_mxfp4_padded", "flashinfer_trtllm_fp8_block", "flashinfer_cutlass_nvfp4"):
        compiled = layoutc.compile_file(SPECS / f"{name}.lyt").compiled
        variant = compiled.variants[-1]
        env = region_dims(compiled.program, variant)[0][0]
        for chain in variant.chains:
            for rows in (False, True):
                monkeypatch.setattr(rowmap, "STEPWISE_AFTER", 99)
                composed = rowmap.axis_map(chain, env, rows)
                monkeypatch.setattr(rowmap, "STEPWISE_AFTER", 0)
                assert rowmap.axis_map(chain, env, rows) == composed, (name, chain.tensor, rows)


def test_options_multiply_variants_not_the_verifiers_work():
    """6 bool parameters and 6 optional inputs took 358 s: every parameter combination and presence variant
    evaluated every map again. Counted: axis maps evaluated, across every combination, against the distinct
    chains they make (here with 3 and 3, the same structure)."""
    from layoutc.lang.compiler import build
    from layoutc.lang.resolver import resolve
    from layoutc.front.parse import parse
    from layoutc.verify import rules as vf

    lines = ["dims E, I, H"] + [f"param p{i} = false" for i in range(3)]
    lines.append("input w : bf16[E, 2*I, H] rows [w1; w3]")
    lines += [f"input b{i}? : f32[E, 2*I] bias of w" for i in range(3)]
    every = "[w, b0, b1, b2]"
    lines += [f"if p{i} {{ swap_halves({every}, dim=1)\nswap_halves({every}, dim=1) }}" for i in range(3)]
    lines.append(f"swap_halves({every}, dim=1)")
    lines.append("output w : bf16[E, 2*I, H] rows [w3; w1]")
    lines += [f"output b{i}? : f32[E, 2*I] rows [w3; w1]" for i in range(3)]
    text = "\n".join(lines) + "\n"
    vf._STATIC_AXES.clear()
    work, keys, naive = 0, set(), 0
    for combo in range(8):
        params = {f"p{i}": bool(combo >> i & 1) for i in range(3)}
        compiled = build(resolve(parse(text, "opts.lyt"), params))
        v = vf.Verifier(compiled)
        assert v.run() == []
        work += v.work
        for variant in compiled.variants:
            reps = len(v.region_samples(variant)[0])
            for c in variant.chains:
                keys.add(vf._chain_key(c))
                naive += reps * 2
    reps = max(len(v.region_samples(x)[0]) for x in compiled.variants)
    assert work <= len(keys) * reps * 2  # once per distinct chain and sizes
    assert work * 10 < naive  # not once per combination and variant


BRANCHED = """dims E, I, H
assume I % 32 == 0
input w : bf16[E, 2*I, H] rows [w1; w3]
input b? : f32[E, 2*I] bias of w
if I > 1024 { swap_halves([w, b], dim=1) }
if I <= 1024 { swap_halves([w, b], dim=1) }
output w : bf16[E, 2*I, H] rows [w3; w1]
output b? : f32[E, 2*I] rows [w3; w1]
"""


def test_every_mutant_of_a_condition_is_rejected_at_its_boundary():
    """The mutation harness's condition operator (its comparison and its constants): each mutant moves a
    boundary by one size, and the region at the boundary catches it."""
    from layoutc.lang.compiler import build
    from layoutc.lang.resolver import resolve
    from layoutc.front.parse import parse
    from layoutc.verify.rules import Verifier
    from tests.verify.mutants import mutants

    assert Verifier(build(resolve(parse(BRANCHED, "b.lyt")))).run() == []
    conditional = [(d, t) for d, t in mutants(BRANCHED) if d.startswith("condition")]
    assert len(conditional) >= 6
    for description, text in conditional:
        findings = Verifier(build(resolve(parse(text, "m.lyt")))).run()
        assert findings, f"{description} survived"
        assert findings[0].message.startswith("at "), findings[0].message


# -- nested floors: the period that makes every floor affine (docs/design.md, "Every size") ---------


_I, _H, _f = ex.Var("I"), ex.Var("H"), ex.floordiv


@pytest.mark.parametrize("e, expected", [
    (_f(_f(_I, 3), 5), 15), (ex.ceil_div(ex.div(_I, 32), 4), 128), (ex.add(_f(_I, 3), _f(_I, 5)), 15),
    (ex.round_up(_I, 128), 128), (ex.mod(ex.ceil_div(ex.ceil_div(_I, 3), 7), 2), 42),
    (_f(ex.mul(_H, _f(_I, 3)), 6), 18), (_f(ex.mul(2, _f(_I, 3)), 6), 9),
], ids=["floor_floor", "ceil_div_of_exact", "two_floors", "round_up", "ceil_ceil_mod", "times_H", "times_2"])
def test_the_period_of_nested_floors(e, expected):
    from layoutc.algebra.periods import period

    found = period(e, "I")
    assert found is not None and found.period == expected
    values = [ex.evaluate(e, {"I": i, "H": 5}) for i in range(4 * expected)]
    steps = {values[i + expected] - values[i] for i in range(3 * expected)}
    assert len(steps) == 1  # affine within every residue class modulo the period
    assert all(len({values[i + q] - values[i] for i in range(3 * expected)}) > 1
               for q in range(1, expected) if expected % q == 0)  # and no smaller period is


NESTED_CONDITION = BASE.replace("swap_halves(w, dim=1)",
                                "swap_halves(w, dim=1)\nif ceil_div(I/32, 4) % 2 == 1 { STATEMENT }")


def test_every_residue_class_of_a_nested_floor_condition_is_a_representative():
    compiled = _program(NESTED_CONDITION.replace("STATEMENT", "cast(w, bf16)"))
    program = compiled.program
    for variant in compiled.variants:
        region = region_of(program, variant.present)
        exprs = [program.conditions[0].lhs, program.conditions[0].rhs]
        reps, status = representatives(program, region, program.dims, [(ex.Var("I"), 32)], exprs)
        assert status == "covered"
        holds = dict(region.holds)["ceil_div(I/32, 4) mod 2 == 1"]
        # period 256: the classes of I = 32..256 on the region's side, each verified
        assert {r["I"] % 256 for r in reps} == ({32, 64, 96, 128} if holds else {160, 192, 224, 0})


@pytest.mark.slow  # two compiles with every region verified: about 2 s on the 2-core machine
def test_both_sides_of_a_nested_floor_condition_are_found_and_verified():
    # Before the period analysis the sides were sampled at I = 32, 64, 96 (the divisors 32, 4, 2 alone):
    # ceil_div(I/32, 4) is even only from I = 160 on, so that region was "no sizes found" (an error).
    ok = layoutc.compile_source(NESTED_CONDITION.replace("STATEMENT", "cast(w, bf16)"), "n.lyt")
    assert "ceil_div(I/32, 4) mod 2 != 1; ceil_div(I/32, 4) mod 2 == 1" in ok.coverage[0][0].scope
    with pytest.raises(layoutc.SpecError) as err:
        layoutc.compile_source(NESTED_CONDITION.replace("STATEMENT", "swap_halves(w, dim=1)"), "n.lyt")
    text = err.value.render()
    assert "at ceil_div(I/32, 4) mod 2 == 1: w: the kernel expects rows [w3; w1]" in text and "n.lyt:6:" in text
    assert "no sizes found" not in text


WIDE = """spec wide
dims E, I, H
input w : bf16[E, 2*I, H] rows [w1; w3]
swap_halves(w, dim=1)
if ceil_div(ceil_div(I, 3), 7) % 2 == 1 { cast(w, bf16) }
output w : bf16[E, 2*I, H] rows [w3; w1]
"""


@pytest.mark.slow  # three checks: about 3 s on the 2-core machine
def test_a_nested_floor_with_too_many_classes_says_which_sizes_it_covers_and_strict_refuses(tmp_path):
    path = tmp_path / "wide.lyt"
    path.write_text(WIDE)
    out = CliRunner().invoke(main, ["check", str(path)])
    assert out.exit_code == 0
    assert "claims hold for the sizes with I = 0, 1, 21, 41 (mod 42) only, 4 of its 42 residue classes" in out.output
    assert "the other residues are not verified" in out.output
    assert CliRunner().invoke(main, ["check", "--strict", str(path)]).exit_code == 2
    # with a divisibility that leaves few classes, every class is verified: all sizes
    divisible = WIDE.replace("dims E, I, H", "dims E, I, H\nassume I % 21 == 0")
    assert layoutc.compile_source(divisible, "d.lyt").coverage[0][0].scope.startswith("for all sizes")
