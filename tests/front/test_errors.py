"""Spec errors: every problem points at the source (file:line:col, the line, a caret), names the
tensor or op involved, all problems are reported together, and nothing else ever escapes.

The CLI side of the same guarantees (exit status 2, no traceback) is in test_cli.py.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import random
import re
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import Version

import layoutc
from layoutc.lang.versions import check_requires

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "specs").glob("*.lyt"))

BASE = "dims E, I, H\ninput w : f32[E, I, H]\n"
OUT = "output w : f32[E, I, H]\n"

FP4_WEIGHT = """\
dims E, I, H
input w : fp4x2[E, I, H/2]
"""


def _at(text: str, marker: str, nth: int = 0) -> tuple[int, int]:
    """(line, column) of the nth occurrence of marker in text."""
    start = -1
    for _ in range(nth + 1):
        start = text.index(marker, start + 1)
    line = text.count("\n", 0, start) + 1
    column = start - (text.rfind("\n", 0, start) + 1) + 1
    return line, column


# (id, spec text, where: marker string | (line, col) | (marker, nth), message fragments, hint fragment)
CASES = [
    # -- syntax --
    ("missing_paren", BASE + "swap_halves(w\n" + OUT, "output w", ["unexpected 'output'"], "')'"),
    ("missing_bracket", "dims E, I, H\ninput w : f32[E, I, H\n" + OUT, "output w", ["unexpected 'output'"], "']'"),
    ("stray_character", "dims E, I, H\ninput w : f32[E, I, H] @\n" + OUT, "@", ["unexpected character '@'"], "expected"),
    ("stray_character_in_statement", BASE + "swap_halves(w) !\n" + OUT, "!", ["unexpected character '!'"], None),
    ("unexpected_eof_in_call", BASE + "swap_halves(w,", (3, 14), ["unexpected end of file"], "expected"),
    ("unexpected_eof_in_shape", "dims E, I, H\ninput w : f32[", (2, 14), ["unexpected end of file"], "']'"),
    ("unexpected_eof_in_block", BASE + "if x {", (3, 6), ["unexpected end of file"], "expected"),
    ("string_in_shape", 'dims E\ninput w : f32[E, "a"]\n', '"a"', ["unexpected '\"a\"'"], None),
    # -- operations and arguments --
    ("unknown_op", BASE + "swap_halve(w)\n" + OUT, "swap_halve(", ["unknown operation 'swap_halve'"],
     "did you mean 'swap_halves'?"),
    # '~=' is a version comparison; in a size assumption it once crashed the parser (found by test-slow's fuzz)
    ("version_compare_in_assume", "assume 0 ~= 0\n" + BASE + OUT, "~=", ["'~=' compares versions"], None),
    ("version_compare_in_range", BASE + "assume 1 <= E ~= 8\n" + OUT, "~=", ["'~=' compares versions"], None),
    ("version_compare_in_condition", BASE + "if E ~= 8 { swap_halves(w) }\n" + OUT, "~=",
     ["'~=' compares versions"], None),
    ("unknown_op_far", BASE + "frobnicate(w)\n" + OUT, "frobnicate", ["unknown operation 'frobnicate'"], "swap_halves"),
    ("too_many_args", BASE + "swap_halves(w, 1, 2)\n" + OUT, "swap_halves", ["swap_halves() takes 1 argument(s)",
     "2 were given"], "swap_halves(tensor, dim=1)"),
    ("missing_arg", BASE + "transpose(w, 1)\n" + OUT, "transpose", ["transpose() is missing dim1"],
     "transpose(tensor, dim0, dim1)"),
    ("unknown_keyword", BASE + "swap_halves(w, dimm=1)\n" + OUT, "dimm", ["swap_halves() has no parameter 'dimm'"],
     "did you mean 'dim'?"),
    ("duplicate_keyword", BASE + "swap_halves(w, dim=1, dim=2)\n" + OUT, ("dim=", 1), ["dim= is given twice"], None),
    ("positional_and_keyword", BASE + "transpose(w, 1, 2, dim0=1)\n" + OUT, "dim0", ["transpose() got 'dim0' twice"],
     None),
    ("dim_out_of_range", BASE + "swap_halves(w, dim=5)\n" + OUT, "dim=5", ["dim=5 is out of range for a rank-3"], None),
    ("non_integer_argument", BASE + "swap_halves(w, dim=x)\n" + OUT, "dim=x", ["dim must be an integer, got x"], None),
    ("unknown_family", BASE + "interleave(w, sm91_mixed)\n" + OUT, "sm91_mixed",
     ["unknown packing family 'sm91_mixed'"], "did you mean 'sm90_mixed'?"),
    ("cast_to_unknown_type", BASE + "cast(w, f33)\n" + "output w : f32[E, I, H]\n", "f33",
     ["f33 is not an element type"], "did you mean 'f32'?"),
    # -- names --
    ("unknown_tensor", "dims E, I, H\ninput w13_weight : f32[E, I, H]\nswap_halves(w13_weigth)\n"
     "output w13_weight : f32[E, I, H]\n", "w13_weigth", ["unknown tensor 'w13_weigth'"],
     "did you mean 'w13_weight'?"),
    ("unknown_tensor_in_list", BASE + "swap_halves([w, v])\n" + OUT, "v])", ["unknown tensor 'v'"], None),
    ("undeclared_dim", "dims E, I\ninput w : f32[E, I, K]\noutput w : f32[E, I]\n", "K]",
     ["the shape of w uses 'K', which is not a declared dim"], "dims E, I, K"),
    ("unknown_element_type", "dims E, I, H\ninput w : f31[E, I, H]\n" + OUT, "f31",
     ["unknown element type 'f31'"], "did you mean 'f32'?"),
    ("unknown_param_in_condition", "param gated = true\n" + BASE + "if gatd { swap_halves(w) }\n" + OUT, "gatd",
     ["unknown name 'gatd' in condition"], "did you mean 'gated'?"),
    ("condition_on_nothing", BASE + "if zzz { }\n" + OUT, "zzz", ["unknown name 'zzz' in condition"],
     "conditions test parameters, optional inputs or sizes of the dims"),
    # -- sizes --
    ("shape_can_never_divide",
     "dims E, K\ninput w : fp4x2[E, 40, K/2]\ninput s : e8m0[E, 40, K/32] scales w block 32\n"
     "interleave(w, sm90_mixed); interleave(s, sm90_mixed)\n"
     "output w : fp4x2[E, 40, K/2] packing sm90_mixed\noutput s : e8m0[E, 1, K/128, 16, 16] packing sm90_mixed\n",
     "interleave(w", ["w:", "interleave(w, sm90_mixed)", "rows % 16 == 0", "rows = 40", "can never hold"], None),
    ("scale_rows_can_never_divide",
     "dims E, K\ninput w : fp4x2[E, 48, K/2]\ninput s : e8m0[E, 48, K/32] scales w block 32\n"
     "interleave(s, sm90_mixed)\n"
     "output w : fp4x2[E, 48, K/2]\noutput s : e8m0[E, 1, K/128, 16, 16] packing sm90_mixed\n",
     "interleave(s", ["s:", "rows % 64 == 0", "can never hold"], None),
    ("constant_shape_division", "dims E\ninput w : f32[E, 48/64]\noutput w : f32[E, 48/64]\n", "48/64",
     ["w: the shape [E, 48/64] needs 48 % 64 == 0", "can never hold"], None),
    ("division_by_zero", "dims E\ninput w : f32[E, E/0]\n", "0]", ["division by 0"], None),
    # -- types --
    ("view_between_widths", BASE + "view(w, bf16)\noutput w : bf16[E, I, H]\n", "view(",
     ["w: the transforms produce shape [E, I, 2*H] but the output declares [E, I, H]"], "use cast(w, bf16)"),
    ("cast_of_fp4x2", FP4_WEIGHT + "cast(w, bf16)\noutput w : bf16[E, I, H/2]\n", "cast(",
     ["w: cast(fp4x2 -> bf16): fp4x2 values have no torch conversion"], "view(..., bf16)"),
    ("cast_of_e8m0", "dims E, I, H\ninput s : e8m0[E, I, H]\ncast(s, f32)\noutput s : f32[E, I, H]\n", "cast(",
     ["s: cast(e8m0 -> f32): e8m0 values have no torch conversion"], "view(..., f32)"),
    ("cast_to_fp4x2", BASE + "cast(w, fp4x2)\noutput w : fp4x2[E, I, H]\n", "cast(",
     ["w: cast(f32 -> fp4x2)", "no torch conversion"], None),
    ("sm90_interleave_of_f32_bias", FP4_WEIGHT + "input b : f32[E, I] bias of w\ninterleave(b, sm90_mixed)\n"
     "output w : fp4x2[E, I, H/2]\noutput b : f32[E, I]\n", "sm90_mixed)",
     ["interleave(..., sm90_mixed) packs weights and scales, and this tensor is a bias"], None),
    ("sf_128x4_of_a_weight", BASE + "interleave(w, sf_128x4)\n" + OUT, "sf_128x4",
     ["interleave(..., sf_128x4) packs scales, and this tensor is a weight"], None),
    # -- outputs --
    ("output_dtype_missing_cast", BASE + "output w : bf16[E, I, H]\n", "output w",
     ["w: the transforms produce f32 but the output declares bf16"], "add cast(w, bf16)"),
    ("output_dtype_missing_view", "dims E, I, H\ninput s : e8m0[E, I, H]\noutput s : e4m3[E, I, H]\n", "output s",
     ["s: the transforms produce e8m0 but the output declares e4m3"], "add view(s, e4m3)"),
    ("output_shape_mismatch", BASE + "output w : f32[E, I, 2*H]\n", "output w",
     ["w: the transforms produce shape [E, I, H] but the output declares [E, I, 2*H]"], None),
    ("output_rank_mismatch", BASE + "output w : f32[E, I]\n", "output w",
     ["w: the transforms produce shape [E, I, H] but the output declares [E, I]"], None),
    ("input_without_output", BASE + "input v : f32[E, I, H]\n" + OUT, "input v",
     ["input v has no output declaration"], "output v : f32[E, I, H]"),
    ("output_without_input", BASE + OUT + "output v : f32[E, I, H]\n", "output v",
     ["output v has no input of the same name"], None),
    ("optional_on_one_side", BASE + "output w? : f32[E, I, H]\n", "output w",
     ["w is optional on one side only"], None),
    ("packing_declared_not_applied", BASE + "output w : f32[E, I, H] packing sf_128x4\n", "output w",
     ["w: the output declares packing sf_128x4 but no sf_128x4 packing is applied"], None),
    ("packing_applied_not_declared",
     FP4_WEIGHT + "input s : e4m3[E, I, H/16] scales w block 16\ninterleave(s, sf_128x4)\n"
     "output w : fp4x2[E, I, H/2]\noutput s : e4m3[E, round_up(I, 128), round_up(H/16, 4)]\n", "output s",
     ["s: a sf_128x4 packing is applied but the output declares no packing"], "packing sf_128x4"),
]


def _where(text, where):
    if isinstance(where, str):
        return _at(text, where)
    if isinstance(where[0], str):
        return _at(text, *where)
    return where


@pytest.mark.parametrize("case_id, text, where, fragments, hint", CASES, ids=[c[0] for c in CASES])
def test_bad_spec_is_reported_at_its_source(case_id, text, where, fragments, hint, check_points_at):
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source(text, "bad.lyt")
    err = info.value
    line, column = _where(text, where)
    assert err.errors, "a SpecError must carry at least one error"
    at = [d for d in err.errors if d.pos is not None and (d.pos.line, d.pos.column) == (line, column)]
    assert at, f"no error at {line}:{column}:\n{err.render()}"
    d = next((d for d in at if all(f in d.message for f in fragments)), None)
    assert d is not None, f"no error at {line}:{column} says {fragments}:\n{err.render()}"
    if hint is not None:
        assert d.hint is not None and hint in d.hint, f"hint {d.hint!r} lacks {hint!r}"
    rendered = err.render()
    assert str(err) == rendered
    check_points_at(rendered, "bad.lyt", line, column, text.splitlines()[line - 1])
    assert f"bad.lyt:{line}:{column}: error: {d.message}" in rendered
    if hint is not None:
        assert f"  hint: {d.hint}" in rendered
    assert "Traceback" not in rendered


def test_tensors_are_named_on_type_errors():
    text = BASE + "view(w, bf16)\noutput w : bf16[E, I, H]\n"
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source(text, "bad.lyt")
    (d,) = info.value.errors
    assert d.tensors == ("w",)


def test_output_dtype_mismatch_notes_the_last_statement():
    text = BASE + "swap_halves(w)\noutput w : bf16[E, I, H]\n"
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source(text, "bad.lyt")
    (d,) = info.value.errors
    assert [(note, pos.line, pos.column) for note, pos in d.related] == [("the last statement on this tensor", 3, 1)]
    assert "bad.lyt:3:1: note: the last statement on this tensor" in info.value.render()


@pytest.mark.parametrize("text", ["", "\n\n", "   \t\n", "# just a comment\n", ";;\n", "spec nothing\n",
                                  "# one\r# two\r# three\r"])
def test_empty_specs_are_rejected(text):
    # A file with no tensors is not a layout: a spec emptied by a bad merge (or read as one comment
    # because of its line ends) must not pass `check` and compile to a converter that does nothing.
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source(text, "empty.lyt")
    assert "declares no tensors" in info.value.render()
    assert info.value.render().startswith("empty.lyt:1:1: error:")


# -- parameters from params= (the CLI's -D) ------------------------------------------------------

NVFP4 = ROOT / "specs" / "flashinfer_cutedsl_nvfp4.lyt"


def test_unknown_parameter_has_a_hint_and_names_the_file():
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_file(NVFP4, {"activaton": "relu2"})
    (d,) = info.value.errors
    assert d.message == "unknown parameter 'activaton' (set with -D or params=)"
    # the likely one, then every valid one (a name far from all of them gets the list alone)
    assert d.hint == "did you mean 'activation'? parameters of this spec: activation, tp_size, tp_rank"
    assert info.value.render().startswith(f"{NVFP4}: error: unknown parameter 'activaton'")


def test_parameter_outside_its_choices(check_points_at):
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_file(NVFP4, {"activation": "gelu"})
    (d,) = info.value.errors
    assert "parameter 'activation' must be one of ['silu', 'relu2'], got 'gelu'" in d.message
    source = NVFP4.read_text()
    line, column = _at(source, "param activation")
    check_points_at(info.value.render(), str(NVFP4), line, column, source.splitlines()[line - 1])


def test_parameter_of_the_wrong_type(check_points_at):
    text = "param gated = true\nparam n = 4\n"
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source(text, "p.lyt", {"gated": 3, "n": "four"})
    messages = [d.message for d in info.value.errors]
    assert any("parameter 'gated' takes a bool, got 3" in m for m in messages)
    assert any("parameter 'n' takes a int, got 'four'" in m for m in messages)
    check_points_at(info.value.render(), "p.lyt", 1, 1, "param gated = true")
    check_points_at(info.value.render(), "p.lyt", 2, 1, "param n = 4")


# -- library versions ------------------------------------------------------------------------------


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


FLASHINFER = _installed("flashinfer-python")


@pytest.mark.skipif(FLASHINFER is None or Version(FLASHINFER) < Version("0.6.16"),
                    reason="needs flashinfer-python >= 0.6.16 installed")
def test_version_requirement_not_met(check_points_at):
    text = "requires flashinfer < 0.6.16\n" + BASE + OUT
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source(text, "old.lyt")
    (d,) = info.value.errors
    assert f"this layout belongs to flashinfer < 0.6.16, but flashinfer {FLASHINFER} is installed" in d.message
    check_points_at(info.value.render(), "old.lyt", 1, 1, "requires flashinfer < 0.6.16")
    # The check can be turned off (what-if compiles of old layouts).
    assert layoutc.compile_source(text, "old.lyt", check_versions=False).name == "old"
    # And a requirement the installed version meets compiles.
    assert layoutc.compile_source(f"requires flashinfer == {FLASHINFER}\n" + BASE + OUT, "ok.lyt").warnings == ()


def test_requirement_on_a_library_that_is_not_installed_is_a_warning():
    spec = layoutc.compile_source("requires no_such_library_xyz >= 1.0\n" + BASE + OUT, "w.lyt")
    (w,) = spec.warnings
    assert w.severity == "warning" and "no_such_library_xyz is not installed" in w.message
    assert w.pos.line == 1


@pytest.mark.parametrize(
    "requirement, installed, ok",
    [
        (">= 0.6.16", "0.7.4", True), (">= 0.6.16", "0.6.15", False), ("< 0.6.16", "0.7.4", False),
        ("== 0.7.4", "0.7.4", True), ("!= 0.7.4", "0.7.4", False), ("~= 0.7", "0.7.4", True),
        ("~= 0.6.16", "0.7.4", False), ("~= 0.6.16", "0.6.20", True), ("<= 0.7.4", "0.7.4", True),
        ("> 0.7.4", "0.7.4", False),
    ],
)
def test_version_comparisons(requirement, installed, ok):
    program = layoutc.compile_source(f"requires flashinfer {requirement}\n" + BASE + OUT, "v.lyt", check_versions=False).program
    diags = check_requires(program, {"flashinfer": installed})
    assert [d.severity for d in diags] == ([] if ok else ["error"])


# -- several errors at once ----------------------------------------------------------------------------


def test_several_resolution_errors_are_reported_together(check_points_at):
    text = (
        "param gated = true\n"
        "dims E, I, H\n"
        "input w : f31[E, I, H]\n"
        "input v : f32[E, I, K]\n"
        "swap_halves(u)\n"
        "if gatd { }\n"
        "output w : f32[E, I, H]\n"
    )
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source(text, "many.lyt")
    err = info.value
    rendered = err.render()
    expected = {
        _at(text, "f31"): "unknown element type 'f31'",
        _at(text, "K]"): "uses 'K'",
        _at(text, "u)"): "unknown tensor 'u'",
        _at(text, "gatd"): "unknown name 'gatd'",
    }
    for (line, column), fragment in expected.items():
        assert any(d.pos and (d.pos.line, d.pos.column) == (line, column) and fragment in d.message for d in err.errors)
        check_points_at(rendered, "many.lyt", line, column, text.splitlines()[line - 1])
    assert len(err.errors) >= 4


def test_several_type_errors_are_reported_together(check_points_at):
    text = (
        "dims E, I, H\n"
        "input a : f32[E, I, H]\n"
        "input b : fp4x2[E, I, H]\n"
        "input c : f32[E, I, H]\n"
        "input d : f32[E, I, H]\n"
        "view(a, bf16)\n"
        "cast(b, bf16)\n"
        "output a : bf16[E, I, H]\n"
        "output b : bf16[E, I, H]\n"
        "output c : f16[E, I, H]\n"
    )
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source(text, "many.lyt")
    err = info.value
    tensors = sorted(t for d in err.errors for t in d.tensors)
    assert tensors == ["a", "b", "c", "d"], err.render()
    for marker in ("view(a", "cast(b", "output c", "input d"):
        line, column = _at(text, marker)
        check_points_at(err.render(), "many.lyt", line, column, text.splitlines()[line - 1])


# -- internal exceptions must not escape -------------------------------------------------------------


# Regression: inverse_chain() used to type the inverse from the *declared* output and ran before
# check_output(), so these raised OpTypeError instead of a SpecError (found by the fuzz test below).
def _replaced(path, old, new):
    text = path.read_text()
    assert old in text, f"{path.name} no longer contains {old!r}: update this test"
    return text.replace(old, new)


@pytest.mark.parametrize(
    "text",
    [
        # cast to bf16, but the output says fp4x2: the inverse cast(fp4x2 -> f32) is a type error
        BASE + "cast(w, bf16)\noutput w : fp4x2[E, I, H]\n",
        # view f16 -> bf16, but the output says f32 (a different width)
        "dims E, I, H\ninput w : f16[E, I, H]\nview(w, bf16)\noutput w : f32[E, I, H]\n",
        # the output declares fewer axes than the transpose needs to be undone
        BASE + "transpose(w, 1, 2)\noutput w : f32[E, I]\n",
        # the shipped bf16 spec with a mis-typed fold in one output shape
        _replaced(ROOT / "specs" / "flashinfer_cutlass_bf16.lyt",
                  "e8m0[E, H/64, I/tp_size/128, 16, 16]", "e8m0[E, H/64, I/tp_size/128, 2, 16]"),
    ],
    ids=["cast_back_from_fp4x2", "view_back_from_f32", "transpose_back_rank2", "bf16_spec_bad_fold"],
)
def test_output_type_the_inverse_cannot_take_is_a_spec_error(text):
    try:
        layoutc.compile_source(text, "inv.lyt")
    except layoutc.SpecError as err:
        assert err.errors and all(d.pos is not None for d in err.errors)
        return
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"{type(exc).__name__} escaped instead of SpecError: {exc}") from None
    raise AssertionError("compiled without an error")


# -- fuzz: malformed specs raise SpecError or compile, nothing else ------------------------------------

def _code_only(text: str) -> str:
    """The spec without its comment block (one comment line kept): mutations then land in the code,
    where they are interesting, instead of the prose, where they only cost a full compile each."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return "# fuzzed\n" + "\n".join(lines) + "\n"


SPEC_TEXTS = [_code_only(p.read_text()) for p in SHIPPED]
TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|\d+|\S")
PIECES = list("()[]{},;:?=<>!%*/+-#\"\n.\\é$") + [
    "if", "else", "not", "in", "input", "output", "dims", "param", "spec", "requires", "assume", "0", "1", "64", "-1",
    "E", "I", "H", "w13_weight", "w2_weight_scale", "swap_halves", "interleave", "round_up(", "rows", "packing",
    "scales", "bias of", "block", "true", "==", ">=", "fp4x2", "e8m0", "bf16", "sm90_mixed", "sf_128x4", "[w1; w3]",
]


@contextlib.contextmanager
def _time_limit(seconds: int):
    """Turn a hang into a failure (SIGALRM; a no-op where there is none)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def _raise(signum, frame):
        raise TimeoutError(f"compile_source did not return within {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


MUTATIONS = ("del_char", "ins_char", "rep_char", "del_token", "dup_token", "rep_token", "ins_piece",
             "truncate", "shuffle_lines", "swap_lines", "del_line", "dup_line")


def mutate(text: str, rng: random.Random, count: int) -> str:
    """Apply ``count`` random mutations: characters and tokens deleted, inserted, replaced;
    the text truncated; lines shuffled, swapped, deleted, duplicated."""
    for _ in range(count):
        kind = rng.choice(MUTATIONS)
        n = len(text)
        if kind == "del_char" and n:
            i = rng.randrange(n)
            text = text[:i] + text[i + 1:]
        elif kind in ("ins_char", "ins_piece"):
            i = rng.randrange(n + 1)
            piece = rng.choice(PIECES) if kind == "ins_piece" else chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000)]))
            text = text[:i] + piece + text[i:]
        elif kind == "rep_char" and n:
            i = rng.randrange(n)
            text = text[:i] + rng.choice(PIECES) + text[i + 1:]
        elif kind in ("del_token", "dup_token", "rep_token"):
            tokens = [(m.start(), m.end()) for m in TOKEN.finditer(text)]
            if not tokens:
                continue
            a, b = rng.choice(tokens)
            if kind == "del_token":
                text = text[:a] + text[b:]
            elif kind == "dup_token":
                text = text[:b] + " " + text[a:b] + text[b:]
            else:
                c, d = rng.choice(tokens)
                text = text[:a] + text[c:d] + text[b:]
        elif kind == "truncate":
            text = text[: rng.randrange(n + 1)]
        else:
            lines = text.split("\n")
            if kind == "shuffle_lines":
                rng.shuffle(lines)
            elif len(lines) > 1:
                i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
                if kind == "swap_lines":
                    lines[i], lines[j] = lines[j], lines[i]
                elif kind == "del_line":
                    del lines[i]
                else:
                    lines.insert(j, lines[i])
            text = "\n".join(lines)
    return text


# Positions come from a seeded generator, not from Hypothesis integers: those favour small values,
# which would put most mutations into the first line of every spec.
mutated_specs = st.builds(
    lambda text, seed, count: mutate(text, random.Random(seed), count),
    st.sampled_from(SPEC_TEXTS), st.integers(0, 2**32 - 1), st.integers(1, 5),
)


def _compile_or_spec_error(text: str) -> None:
    with _time_limit(20):
        try:
            spec = layoutc.compile_source(text, "fuzz.lyt")
        except layoutc.SpecError as err:
            assert err.errors, "SpecError without an error diagnostic"
            rendered = err.render()
            assert "Traceback" not in rendered
            for d in err.diagnostics:
                if d.pos is not None:
                    assert rendered.count(f"fuzz.lyt:{d.pos.line}:{d.pos.column}: ") >= 1
            return
    assert callable(spec.convert) and isinstance(spec.source, str)


# Seeds, deadline and database come from the profile (tests/conftest.py): fixed in the fast suite, fresh in
# `make test-slow`; the alarm in _compile_or_spec_error catches real hangs.
FUZZ = settings(max_examples=150,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(mutated_specs)
@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_fuzz_mutated_specs_compile_or_raise_spec_error(text):
    _compile_or_spec_error(text)


@settings(max_examples=100)
@given(st.lists(st.sampled_from(PIECES + ["w", "x", "w13_bias?", ":", "f32[E]", "\n"]), max_size=40).map(" ".join))
def test_fuzz_token_soup_compiles_or_raises_spec_error(text):
    _compile_or_spec_error(text)
