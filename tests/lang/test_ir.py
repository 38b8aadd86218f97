"""Resolution: parameters applied, conditions decided or kept as guards, names checked."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

import layoutc
from layoutc.algebra import expr as ex
from layoutc.lang.ir import Guard
from layoutc.lang.resolver import parse_param_value, resolve
from layoutc.front.parse import parse
from layoutc.lang.families import prelude_sha256
from layoutc.lang.identity import spec_identity

ROOT = Path(__file__).resolve().parents[2]


def program(text: str, params=None, filename: str = "ir.lyt"):
    import textwrap

    return resolve(parse(textwrap.dedent(text).lstrip("\n"), filename), params)


PARAMS_SPEC = """
    param gated = true
    param n = 2
    param act = silu choices [silu, relu2, gelu]
    param label = "abc"
    dims E
    input w : f32[E, 8]
    if gated { swap_halves(w) } else { swap_pairs(w) }
    if act in [relu2, gelu] { interleave_rows(w, group=2) }
    if act == gelu { deinterleave(w, group=2) } else if label == abc { swap_halves(w) }
    if n != 2 { cast(w, f32) }
    if not gated { transpose(w, 0, 1); transpose(w, 0, 1) }
    if n == 3 { reshape(w, [E, 2, 4]); reshape(w, [E, 8]) }
    output w : f32[E, 8]
"""


def _ops(prog):
    return [s.op for s in prog.statements]


# -- the resolved program -------------------------------------------------------


def test_program_of_a_shipped_spec():
    path = ROOT / "specs" / "flashinfer_cutlass_bf16.lyt"
    source = path.read_text()
    p = resolve(parse(source, str(path)))
    assert p.name == "flashinfer_cutlass_bf16"
    assert p.dims == ("E", "I", "H")
    assert p.text_sha256 == hashlib.sha256(source.encode()).hexdigest()
    assert p.sha256 == spec_identity(p.text_sha256, [], prelude_sha256(), p.param_values)
    assert [str(r) for r in p.requires] == ["flashinfer >= 0.6.16"]
    assert [t.name for t in p.inputs] == [t.name for t in p.outputs]
    assert p.optional_inputs == ("w13_bias", "w2_bias")
    w13, w13s, w13b = p.input("w13_weight"), p.input("w13_weight_scale"), p.input("w13_bias")
    assert (w13.role, w13s.role, w13b.role) == ("weight", "scale", "bias")
    assert w13s.tie.weight == "w13_weight" and w13s.tie.block == 32
    assert w13b.tie.kind == "bias" and w13b.tie.block is None
    assert str(w13.rows) == "[w1; w3]" and w13.packing is None
    assert w13.shape_str() == "[E, 2*I, H/2]"
    assert w13.elem.name == "fp4x2" and w13.elem.torch_dtype == torch.uint8
    out = p.output("w13_weight_scale")
    assert out.packing == "sm90_mixed" and str(out.rows) == "[w3; w1]"
    assert out.shape_text == ("E", "I/32", "H/128", "16", "16")  # 2*I/tp_size/64 with tp_size=1
    shard = p.statements[0]
    assert shard.op == "shard" and [(k, a.value) for k, a, _ in shard.keywords][-2:] == [("rank", ex.Const(0)), ("ranks", ex.Const(1))]
    swap = p.statements[2]
    assert swap.op == "swap_halves"
    assert [n for n, _ in swap.tensors] == ["w13_weight", "w13_weight_scale", "w13_bias"]
    assert [(k, a.text) for k, a, _ in swap.keywords] == [("dim", "1")]
    assert swap.guards == ()


def test_default_name_comes_from_the_file_name():
    p = program("dims E\ninput w : f32[E]\noutput w : f32[E]\n", filename="dir/some_layout.lyt")
    assert p.name == "some_layout"


def test_assumptions_and_divisions_are_recorded():
    p = program("""
        dims E, I
        assume I % 64 == 0
        input w : u8[E, I/2]
        output w : u8[E, I/2]
    """)
    (a,) = p.assumptions
    assert (a.dim, a.multiple, a.pos.line) == ("I", 64, 2)
    (num, den, pos) = p.input("w").divisions[0]
    assert (num, den, pos.line, pos.column) == (ex.Var("I"), ex.Const(2), 3, 17)


def test_packing_none_means_no_packing():
    p = program("dims E\ninput w : f32[E]\noutput w : f32[E] packing none\n")
    assert p.output("w").packing is None


# -- parameters -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("true", True), ("False", False), ("TRUE", True), ("3", 3), ("0x10", 16), ("-2", -2),
        ("relu2", "relu2"), ('"quoted"', "quoted"), (" silu ", "silu"),
    ],
)
def test_parse_param_value(text, value):
    got = parse_param_value(text)
    assert got == value and type(got) is type(value)


def test_parameter_defaults():
    p = program(PARAMS_SPEC)
    assert p.param_values == {"gated": True, "n": 2, "act": "silu", "label": "abc"}
    # gated: swap_halves; act == silu and label == abc: the else-if branch
    assert _ops(p) == ["swap_halves", "swap_halves"]


@pytest.mark.parametrize(
    "params, ops",
    [
        ({"gated": False}, ["swap_pairs", "swap_halves", "transpose", "transpose"]),
        ({"n": 3}, ["swap_halves", "swap_halves", "cast", "reshape", "reshape"]),
        ({"n": 5}, ["swap_halves", "swap_halves", "cast"]),
        ({"act": "relu2"}, ["swap_halves", "interleave_rows", "swap_halves"]),
        ({"act": "gelu"}, ["swap_halves", "interleave_rows", "deinterleave"]),
        ({"label": "xyz"}, ["swap_halves"]),
        ({"gated": False, "n": 3, "act": "gelu"},
         ["swap_pairs", "interleave_rows", "deinterleave", "cast", "transpose", "transpose", "reshape", "reshape"]),
    ],
)
def test_compile_time_conditions(params, ops):
    p = program(PARAMS_SPEC, params)
    assert _ops(p) == ops
    assert all(s.guards == () for s in p.statements)
    assert p.param_values == {**{"gated": True, "n": 2, "act": "silu", "label": "abc"}, **params}


def test_conditions_decide_the_conversion(compile_text):
    w = torch.arange(16, dtype=torch.float32).reshape(2, 8)
    default = compile_text(PARAMS_SPEC).convert({"w": w})["w"]
    assert torch.equal(default, w)  # swap_halves twice
    pairs = compile_text(PARAMS_SPEC, {"gated": False}).convert({"w": w})["w"]
    assert torch.equal(pairs, w.reshape(2, 4, 2).flip(2).reshape(2, 8).roll(4, 1))
    relu2 = compile_text(PARAMS_SPEC, {"act": "relu2"}).convert({"w": w})["w"]
    assert relu2[0].tolist() == [6, 7, 2, 3, 4, 5, 0, 1]


@pytest.mark.parametrize(
    "params, message",
    [
        ({"gated": 1}, "parameter 'gated' takes a bool"),
        ({"gated": "yes"}, "parameter 'gated' takes a bool"),
        ({"n": True}, "parameter 'n' takes a int"),
        ({"n": "three"}, "parameter 'n' takes a int"),
        ({"act": "swish"}, "must be one of ['silu', 'relu2', 'gelu'], got 'swish'"),
    ],
)
def test_bad_parameter_values_point_at_the_declaration(params, message, spec_error, spec_text, check_points_at):
    err = spec_error(PARAMS_SPEC, params)
    (d,) = err.diagnostics
    assert message in d.message
    name = next(iter(params))
    line = next(i for i, text in enumerate(spec_text(PARAMS_SPEC).splitlines(), 1) if text.startswith(f"param {name} "))
    check_points_at(err.render(), "bad.lyt", line, 1)


def test_unknown_parameter_override(spec_error):
    err = spec_error(PARAMS_SPEC, {"gatd": False})
    (d,) = err.diagnostics
    assert "unknown parameter 'gatd'" in d.message
    assert d.hint.startswith("did you mean 'gated'? parameters of this spec: ") and "gated" in d.hint.split(": ")[1]
    err = spec_error("dims E\n", {"x": 1})
    assert "parameters of this spec: none" in err.diagnostics[0].hint


# -- guards on optional tensors ------------------------------------------------------------

GUARDED = """
    param fold = true
    dims E
    input w : f32[E, 8]
    input b? : f32[E, 8]
    input c? : f32[E, 8]
    if b { swap_halves(w) } else { swap_pairs(w) }
    if not c { cast(b, bf16) } else { if fold { cast(b, f16); cast(b, bf16) } }
    output w : f32[E, 8]
    output b? : bf16[E, 8]
    output c? : f32[E, 8]
"""


def test_optional_tensor_conditions_become_guards():
    p = program(GUARDED)
    guards = [(s.op, s.guards) for s in p.statements]
    assert guards == [
        ("swap_halves", (Guard("b", True),)),
        ("swap_pairs", (Guard("b", False),)),
        ("cast", (Guard("c", False),)),
        ("cast", (Guard("c", True),)),
        ("cast", (Guard("c", True),)),
    ]
    assert str(Guard("c", False)) == "not c"
    swap = p.statements[0]
    assert swap.applies(frozenset({"b"})) and not swap.applies(frozenset())
    # a compile-time condition inside a guard is decided now
    assert [s.op for s in program(GUARDED, {"fold": False}).statements] == ["swap_halves", "swap_pairs", "cast"]


def test_guards_decide_at_convert_time(compile_text):
    spec = compile_text(GUARDED)
    w = torch.arange(16, dtype=torch.float32).reshape(2, 8)
    b = torch.randn(2, 8)
    c = torch.randn(2, 8)
    halves = w.roll(4, 1)
    pairs = w.reshape(2, 4, 2).flip(2).reshape(2, 8)
    assert torch.equal(spec.convert({"w": w})["w"], pairs)
    assert torch.equal(spec.convert({"w": w, "b": None})["w"], pairs)
    assert torch.equal(spec.convert({"w": w, "b": b})["w"], halves)
    out = spec.convert({"w": w, "b": b, "c": c})
    assert set(out) == {"w", "b", "c"}
    assert torch.equal(out["b"], b.to(torch.float16).to(torch.bfloat16))
    assert torch.equal(spec.convert({"w": w, "b": b})["b"], b.to(torch.bfloat16))
    assert torch.equal(out["c"], c)


def test_guard_variants_are_compiled_for_every_presence_set(compile_text):
    spec = compile_text(GUARDED)
    presents = {v.present for v in spec.compiled.variants}
    assert presents == {frozenset(), frozenset({"b"}), frozenset({"c"}), frozenset({"b", "c"})}


# -- resolution errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, line, column, message",
    [
        ("param a = 1\nparam a = 2\n", 2, 7, "parameter 'a' is declared twice"),
        ("param a = true\nif a { param b = 1 }\n", 2, 8, "parameters are declared at top level"),
        ("param a = x choices [y, z]\n", 1, 11, "default 'x' of 'a' is not one of its choices"),
        ("param n = 1\nif n { }\n", 2, 4, "'if n' needs a true/false parameter"),
        ("param n = x\nif not n { }\n", 2, 4, "'if not n' needs a true/false parameter"),
        ("dims E\ninput w? : f32[E]\noutput w? : f32[E]\nif w == 3 { }\n", 4, 4, "w is a tensor"),
        ("dims E\ninput w : f32[E]\noutput w : f32[E]\nif not w { }\n", 4, 4, "'if not w' is always false"),
        ("dims E\ninput w? : f32[E]\nif w { input v : f32[E] }\noutput w? : f32[E]\n", 3, 8,
         "tensors cannot be declared under a condition on an optional tensor"),
        ("dims E\ninput w : f32[E]\nif E > 4 { input v : f32[E] }\noutput w : f32[E]\n", 3, 12,
         "inputs cannot be declared under a condition on a size (E > 4)"),
        ("dims E\ninput w? : f32[E]\nif w { spec x }\noutput w? : f32[E]\n", 3, 8, "'spec' cannot depend"),
        ("spec a\nspec b\n", 2, 1, "spec name given twice (already 'a')"),
        ("dims E, E\n", 1, 9, "dim 'E' is declared twice"),
        ("dims E\nassume I % 4 == 0\n", 2, 8, "assume names 'I', which is not a declared dim"),
        ("dims E\nassume 2*E % 4 == 0\n", 2, 8, "assume takes one dim"),
        ("dims E\ninput w : f32[E]\ninput w : f32[E]\noutput w : f32[E]\n", 3, 7, "input 'w' is declared twice"),
        ("dims E\ninput s : u8[E] scales w block 32\noutput s : u8[E]\n", 2, 24, "tied to 'w', which is not a declared input"),
        ("dims E\ninput w : f32[E]\noutput w : f32[E] packing sf128x4\n", 3, 27, "unknown packing family 'sf128x4'"),
        ("dims E\ninput w : f32[E, round_up(E, E)]\n", 2, 30, "second argument must be a positive integer"),
        ("dims E\nparam m = 0\ninput w : f32[E, round_up(E, m)]\n", 3, 30, "positive integer (a number or an integer parameter), got 0"),
        ("dims E\ninput w : f32[E]\ninput b : f32[E] bias of w\noutput w : f32[E]\noutput b : f32[E] bias of w\n",
         5, 19, "ties are declared on inputs"),
        ("dims E, I\ninput w : f32[E, I]\nswap_halves(w, dim=1, 0)\noutput w : f32[E, I]\n", 3, 23,
         "positional argument after keyword"),
        ("dims E, I\ninput w : f32[E, I]\nswap_halves(dim=1)\noutput w : f32[E, I]\n", 3, 1, "needs a tensor"),
        ("dims E, I\ninput w : f32[E, I]\nswap_halves([w, 2])\noutput w : f32[E, I]\n", 3, 17, "2 is not a tensor name"),
    ],
)
def test_resolution_errors_are_positioned(source, line, column, message, check_points_at):
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source(source, "r.lyt")
    err = info.value
    assert any(message in d.message for d in err.errors), err.render()
    check_points_at(err.render(), "r.lyt", line, column, source.splitlines()[line - 1])


def test_dims_used_but_never_declared():
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source("input w : f32[E]\noutput w : f32[E]\n", "r.lyt")
    messages = [d.message for d in info.value.errors]
    # one error for the dim (naming its other uses), one for the missing declaration
    assert messages == ["the shape of w uses 'E', which is not a declared dim; also used on line 2",
                        "no 'dims' declaration"]
    assert info.value.errors[0].hint == "declare it: dims E"


def test_a_dim_that_cannot_be_inferred():
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source("dims E, I\ninput w : f32[E, I*I]\noutput w : f32[E, I*I]\n", "r.lyt")
    (d,) = info.value.errors
    assert "dim I cannot be inferred" in d.message


SHUFFLED = "dims E, N\ninput w : u8[E, N, 4]\ninterleave(w, trtllm, epilogue_tile=128)\n"


def test_packing_parameters_are_the_kernels_contract():
    ok = layoutc.compile_source(SHUFFLED + "output w : u8[E, N, 4] packing trtllm(epilogue_tile=128)\n", "p.lyt")
    out = ok.program.output("w")
    assert out.packings == ("trtllm",) and [a[:3] for a in out.packing_args] == [("trtllm", "epilogue_tile", 128)]
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source(SHUFFLED + "output w : u8[E, N, 4] packing trtllm(epilogue_tile=64)\n", "p.lyt")
    (d,) = info.value.errors
    assert "the kernel reads the trtllm packing with epilogue_tile=64, but interleave(w, trtllm, epilogue_tile=128)" \
        in d.message and d.pos.line == 3 and d.hint == "use epilogue_tile=64"
    with pytest.raises(layoutc.SpecError, match="family trtllm has no parameter"):
        layoutc.compile_source(SHUFFLED + "output w : u8[E, N, 4] packing trtllm(tile=64)\n", "p.lyt")


def test_several_packing_families_on_one_output():
    text = ("dims E, N, K\ninput w : u8[E, N, K]\ninput s : u8[E, N, K/32] scales w block 32\n"
            "interleave([w, s], trtllm, epilogue_tile=128)\ninterleave(s, sf_128x4)\n"
            "output w : u8[E, N, K] packing trtllm\n")
    p = layoutc.compile_source(text + "output s : u8[E, round_up(N, 128), round_up(K/32, 4)] packing trtllm + sf_128x4\n",
                               "p.lyt").program
    assert p.output("s").packings == ("trtllm", "sf_128x4")
    with pytest.raises(layoutc.SpecError, match="declare it: output s : ... packing trtllm \\+ sf_128x4"):
        layoutc.compile_source(text + "output s : u8[E, round_up(N, 128), round_up(K/32, 4)] packing trtllm\n", "p.lyt")
    with pytest.raises(layoutc.SpecError, match="packing trtllm is listed twice"):
        layoutc.compile_source(text + "output s : u8[E, N, K/32] packing trtllm + trtllm\n", "p.lyt")


def test_block_scale_ties():
    text = ("dims E, N, K\ninput w : e4m3[E, N, K]\ninput s : f32[E, N/128, K/128] scales w block 128x128\n"
            "output w : e4m3[E, N, K]\noutput s : f32[E, N/128, K/128]\n")
    tie = layoutc.compile_source(text, "b.lyt").program.input("s").tie
    assert (tie.row_block, tie.block) == (128, 128)
    with pytest.raises(layoutc.SpecError, match="s has N/64 rows of 128-row scale blocks, but its weight w has N rows"):
        layoutc.compile_source(text.replace("N/128", "N/64"), "b.lyt")


def test_a_family_body_that_calls_a_family_statement_says_so(spec_error):
    # A family's body is primitives only. Calling interleave there must say that, not report
    # interleave as an unknown operation (with "did you mean 'interleave'?" as the hint).
    err = spec_error("""
        spec nested
        dims E, N, K
        family inner {
          weight(t[e, rows, k]) {
            transpose(t, 1, 2)
          }
        }
        family outer {
          weight(t[e, rows, k]) {
            interleave(t, inner)
          }
        }
        input w : bf16[E, N, K]
        interleave(w, outer)
        output w : bf16[E, K, N] packing outer
    """)
    messages = [d.message for d in err.errors]
    assert any("a family's body applies primitives, not another family (bad.lyt:10)" in m for m in messages), messages
    assert not any("unknown operation" in m for m in messages), messages
