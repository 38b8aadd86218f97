"""Size-conditioned layouts in the language (issue 23, item 4): ``assume`` with ``!=``, ranges and ``or``;
family arguments from parameters and size expressions; outputs declared under size conditions; a family's
``if`` on the sizes its role binds; a reshape's element count enforced at check time and on every call."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: the fused lowering runs on CPU

import pytest
import torch

from layoutc import api
from layoutc.front.errors import SpecError
from layoutc.algebra.instances import variant_instances
from layoutc.runtime.checks import LayoutError


def _compile(text: str, **params):
    return api.compile_source(text, "size_lang.lyt", params or None)


def _error(text: str, **params) -> str:
    with pytest.raises(SpecError) as err:
        _compile(text, **params)
    return str(err.value)


# -- assume ---------------------------------------------------------------------------------------

ASSUMES = """
spec assumes
dims E, N, K
assume N != 96
assume 1 <= K <= 65536
assume N in 64..8192
assume N < 200 or N >= 1024
input w : bf16[E, N, K]
output w : bf16[E, N, K]
"""


@pytest.mark.parametrize("n, ok", [(64, True), (96, False), (128, True), (512, False), (1024, True),
                                   (9000, False), (32, False)])
def test_assume_not_equal_ranges_and_or_are_checked_on_every_call(n, ok):
    spec = _compile(ASSUMES)
    w = torch.zeros(1, n, 4, dtype=torch.bfloat16)
    if ok:
        assert spec.convert({"w": w})["w"].shape == (1, n, 4)
    else:
        with pytest.raises(LayoutError, match=r"the spec assumes .*size_lang.lyt:\d"):
            spec.convert({"w": w})


def test_assume_conditions_hold_on_every_sampled_size():
    spec = _compile(ASSUMES)
    program = spec.program
    envs = variant_instances(program, frozenset(), program.assumed)
    assert envs and all(a.holds(env) for env in envs for a in program.size_assumptions)
    assert all(env["N"] >= 64 and env["N"] != 96 for env in envs)  # the range's lower bound starts the samples


@pytest.mark.parametrize("line, message", [
    ("assume 1 <= N >= 4", "a range compares in one direction"),
    ("assume M != 3", "assume names 'M', which is not a declared dim"),
    ("assume 1 < 2 or 3 < 4", "names no dim"),
    ("assume N/2 != 3", "without '/'"),
])
def test_bad_assume_is_a_located_error(line, message):
    text = f"dims E, N\n{line}\ninput w : bf16[E, N]\noutput w : bf16[E, N]\n"
    out = _error(text)
    assert message in out and "size_lang.lyt:2:" in out


# -- family arguments -------------------------------------------------------------------------------

FAMILY_ARG = """
spec family_arg
param tile = 128 choices [64, 128]
dims E, I, H
input w13 : e4m3[E, 2*I, H]   rows [w1; w3]
interleave(w13, trtllm, epilogue_tile=tile)
output w13 : e4m3[E, 2*I, H]   rows [w1; w3] packing trtllm(epilogue_tile=KERNEL)
"""


@pytest.mark.parametrize("tile", [64, 128])
def test_family_argument_from_a_parameter(tile):
    spec = _compile(FAMILY_ARG.replace("KERNEL", "tile"), tile=tile)
    steps = spec.compiled.variants[0].chain("w13").steps
    assert dict(steps[0].tag.args)["epilogue_tile"] == tile


def test_family_argument_from_a_parameter_that_disagrees_is_rejected():
    out = _error(FAMILY_ARG.replace("KERNEL", "2*tile"), tile=64)
    assert "the kernel reads the trtllm packing with epilogue_tile=128" in out
    assert "size_lang.lyt:6:" in out


def test_family_argument_naming_an_unknown_name_is_an_error():
    out = _error(FAMILY_ARG.replace("KERNEL", "tiles"))
    assert "'tiles'" in out and "not a declared dim" in out


FAMILY_SIZE_ARG = """
spec family_size_arg
dims E, I, H
family keep_rows(size = 1) {
  weight(t[..., rows, k]) {
    crop(t, dim=-2, size=size)
  }
}
input w : bf16[E, I + 8, H]
interleave(w, keep_rows, size=I)
output w : bf16[E, I, H]   packing keep_rows(size=SIZE)
"""


def test_family_argument_is_a_size_expression():
    spec = _compile(FAMILY_SIZE_ARG.replace("SIZE", "I"))
    w = torch.arange(2 * 12 * 3, dtype=torch.bfloat16).reshape(2, 12, 3)
    assert torch.equal(spec.convert({"w": w})["w"], w[:, :4])
    out = _error(FAMILY_SIZE_ARG.replace("SIZE", "2*I"))
    assert "the kernel reads the keep_rows packing with size=2*I, but" in out and "applies it with size=I" in out


# -- outputs under size conditions ---------------------------------------------------------------

SMALL_SHUFFLE = """
spec small_shuffle
dims E, I, H
input w13 : e4m3[E, 2*I, H]   rows [w1; w3]
reorder_gated_rows(w13, dim=1)
if 2*I >= 32 {
  interleave(w13, trtllm, epilogue_tile=128)
  output w13 : e4m3[E, 2*I, H]   rows interleave(w1, w3) packing trtllm(epilogue_tile=128)
} else {
  output w13 : e4m3[E, 2*I, H]   rows interleave(w1, w3)
}
"""


def _rows(spec, i: int, lowering: str = "gather") -> list[int]:
    w = torch.arange(2 * i, dtype=torch.int32).reshape(1, 2 * i, 1).expand(1, 2 * i, 2).contiguous()
    w = w.to(torch.uint8).view(torch.float8_e4m3fn)
    out = spec.convert({"w13": w}, lowering=lowering)["w13"]
    return out.view(torch.uint8)[0, :, 0].tolist()


def test_output_under_a_size_condition_picks_the_branch_per_call():
    spec = _compile(SMALL_SHUFFLE)
    gated = [r for p in range(8) for r in (p, 8 + p)]  # rows interleave(w1, w3) of 16 rows
    assert _rows(spec, 8) == gated  # 16 rows: no shuffle
    big = _rows(spec, 16)
    assert big != [r for p in range(16) for r in (p, 16 + p)]  # 32 rows: shuffled by the trtllm family
    assert _rows(spec, 8, "eager") == gated and _rows(spec, 16, "eager") == big


def test_output_under_a_size_condition_declaring_the_wrong_packing_is_rejected_with_its_region():
    bad = SMALL_SHUFFLE.replace("  output w13 : e4m3[E, 2*I, H]   rows interleave(w1, w3)\n}",
                                "  output w13 : e4m3[E, 2*I, H]   rows interleave(w1, w3) packing trtllm(epilogue_tile=128)\n}")
    out = _error(bad)
    assert "no trtllm packing is applied (where not (2*I >= 32))" in out and "size_lang.lyt:10:" in out


def test_output_under_a_size_condition_keeps_one_type_and_shape():
    bad = SMALL_SHUFFLE.replace("  output w13 : e4m3[E, 2*I, H]   rows interleave(w1, w3)\n}",
                                "  output w13 : e4m3[E, 2*I, 2*H]   rows interleave(w1, w3)\n}")
    assert "may change the rows and packing, not the type or shape" in _error(bad)


def test_output_declared_twice_under_overlapping_conditions_is_an_error():
    text = ("dims E, I\ninput w : bf16[E, I]\nif I > 4 { output w : bf16[E, I] }\n"
            "if I > 8 { output w : bf16[E, I] }\n")
    out = _error(text)
    assert "output 'w' is declared twice under conditions that can hold together" in out


def test_output_missing_in_one_branch_is_an_error():
    text = "dims E, I\ninput w : bf16[E, I]\nif I > 4 { output w : bf16[E, I] }\n"
    assert "w has no output declaration for these sizes" in _error(text)


# -- a family's if on the sizes it binds -----------------------------------------------------------

FAMILY_IF = """
spec family_if
dims E, I, H
family small_shuffle(block = 32) {
  weight(t[..., rows, k]) {
    if rows >= block {
      permute(t, dim=-2, src=32*(r//32) + 4*(r%8) + (r%32)//8, inverse=32*(r//32) + 8*(r%4) + (r%32)//4,
              block=32)
    }
  }
}
input w13 : e4m3[E, 2*I, H]   rows [w1; w3]
interleave(w13, small_shuffle)
output w13 : e4m3[E, 2*I, H]   rows [w1; w3] packing small_shuffle
"""


def test_family_condition_on_its_sizes_is_a_run_time_branch():
    spec = _compile(FAMILY_IF)
    assert [c.label for c in spec.program.conditions] == ["2*I >= 32"]
    assert _rows(spec, 8) == list(range(16))  # fewer than 32 rows: left as they are
    shuffled = _rows(spec, 16)
    assert shuffled[:8] == [0, 4, 8, 12, 16, 20, 24, 28]
    assert _rows(spec, 8, "eager") == list(range(16)) and _rows(spec, 16, "eager") == shuffled


@pytest.mark.slow  # torch.compile and the Triton interpreter: tens of seconds on the 2-core machine
@pytest.mark.parametrize("lowering", ["compiled", "fused"])
def test_size_branches_agree_in_the_compiled_and_fused_lowerings(lowering):
    spec = _compile(SMALL_SHUFFLE)
    assert _rows(spec, 8, lowering) == _rows(spec, 8) and _rows(spec, 16, lowering) == _rows(spec, 16)
    spec = _compile(FAMILY_IF)
    assert _rows(spec, 8, lowering) == list(range(16)) and _rows(spec, 16, lowering) == _rows(spec, 16)


def test_family_condition_on_an_unknown_name_is_an_error():
    out = _error(FAMILY_IF.replace("if rows >= block", "if rowz >= block"))
    assert "'rowz' in a family's condition is not one of its parameters nor a size its role names" in out


# -- a reshape's element count --------------------------------------------------------------------

WRONG_RESHAPE = """
spec wrong_reshape
dims E, N, K
input w  : fp4x2[E, N, K/2]
input sf : e8m0[E, N, K/32]   scales w block 32
interleave(sf, sf_128x4)
reshape(sf, [E, round_up(K/32, 128)*round_up(N, 4)])
output w  : fp4x2[E, N, K/2]
output sf : e8m0[E, round_up(K/32, 128)*round_up(N, 4)]   packing sf_128x4
"""


def test_reshape_count_right_only_for_small_sizes_is_a_located_check_error():
    out = _error(WRONG_RESHAPE)
    assert "size_lang.lyt:7:1" in out and "needs the same number of elements before and after" in out
    assert "a size the spec accepts" in out


# The counts differ only from N = 100000 on, beyond the sizes check tries: the converter refuses those.
LATE_RESHAPE = """
spec late_reshape
dims E, N, K
input w : bf16[E, N, K]
pad(w, dim=1, multiple=4)
reshape(w, [E, round_up(N, 4) + 4*(N // 100000), K])
output w : bf16[E, round_up(N, 4) + 4*(N // 100000), K]
"""


@pytest.mark.parametrize("lowering", ["gather", pytest.param("compiled", marks=pytest.mark.slow), "eager", "fused"])
def test_reshape_count_is_checked_on_every_call_in_every_lowering(lowering):
    spec = _compile(LATE_RESHAPE)
    assert spec.convert({"w": torch.ones(1, 6, 1, dtype=torch.bfloat16)}, lowering=lowering)["w"].shape == (1, 8, 1)
    with pytest.raises(LayoutError, match=r"reshape\(w, .*size_lang.lyt:6 needs the same number of elements"):
        spec.convert({"w": torch.ones(1, 100001, 1, dtype=torch.bfloat16)}, lowering=lowering)


# -- K-major weights tied to their scales -----------------------------------------------------------

K_MAJOR = """
spec k_major
dims E, N, K
input w  : e4m3[E, K, N]      rows [w1; w3]
input sf : f32[E, K/128, N]   scales w block 128 along K
swap_halves([w, sf], dim=2)
output w  : e4m3[E, K, N]     rows [w3; w1]
output sf : f32[E, K/128, N]
"""


def test_k_major_weight_tied_to_its_scales_is_verified():
    spec = _compile(K_MAJOR)
    assert spec.program.input("w").k_major and spec.program.input("sf").k_major
    w = torch.arange(256 * 8, dtype=torch.int32).reshape(1, 256, 8).to(torch.uint8).view(torch.float8_e4m3fn)
    sf = torch.arange(2 * 8, dtype=torch.float32).reshape(1, 2, 8)
    out = spec.convert({"w": w, "sf": sf})
    assert torch.equal(out["sf"], torch.cat([sf[..., 4:], sf[..., :4]], dim=2))


@pytest.mark.parametrize("change, message", [
    (("swap_halves([w, sf], dim=2)", "swap_halves(w, dim=2)"), "a scale must follow its weight's rows"),
    (("swap_halves([w, sf], dim=2)", "swap_halves([w, sf], dim=2)\nswap_halves(w, dim=1)"),
     "w and its scales sf move K differently"),
    (("input sf : f32[E, K/128, N]", "input sf : f32[E, N, K/128]"), "sf has K/128 rows but its weight w has N"),
    (("along K", "along N"), "sf has K/128 rows but its weight w has K"),
])
def test_k_major_mistakes_are_rejected(change, message):
    text = K_MAJOR.replace(*change)
    if "f32[E, N, K/128]" in text:
        text = text.replace("output sf : f32[E, K/128, N]", "output sf : f32[E, N, K/128]")
    assert message in _error(text)


def test_k_major_packed_weight_is_an_error():
    text = K_MAJOR.replace("e4m3[E, K, N]", "fp4x2[E, K, N/2]")
    assert "packs 2 values per element along the last axis" in _error(text)
