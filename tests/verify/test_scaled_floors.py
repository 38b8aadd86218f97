"""Maps that multiply a coordinate by a size-dependent extent and then floor (docs/design.md, "Every size"):
``((r//2) * (n/2)) // 64`` flips a pair of rows or not depending on ``I`` modulo 128, so the residue classes of
the shapes alone (no floor of ``I`` in any shape here) do not decide the claims. Their periods join the residue
analysis: every class is verified when there are few, and ``check`` names the classes verified when there are
many (a coverage warning that ``--strict`` refuses)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import layoutc
from layoutc.algebra import expr as ex
from layoutc.algebra.periods import period, scaled_floors
from layoutc.cli.main import main
from layoutc.verify.rules import region_dims, region_inputs

FLIP = "2*(r//2) + (r%2 + ((r//2)*(n/2))//64 % 2) % 2"  # rows 2p, 2p+1 swapped where floor(p*I/64) is odd

# The declared order holds where no pair flips (all I below 8, every multiple of 128) and nowhere else.
WRONG = f"""
spec scaled_floor
dims E, I, H
input w13 : e4m3[E, 2*I, H]     rows [w1; w3]
input s13 : f32[E, 2*I, H/32]   scales w13 block 32
permute([w13, s13], dim=1, src={FLIP})
output w13 : e4m3[E, 2*I, H]    rows [w1; w3]
output s13 : f32[E, 2*I, H/32]  rows [w1; w3]
"""

# The same flip as a packing on both tied tensors: right for every size.
PACKED = f"""
spec scaled_floor_packing
dims E, I, H
ASSUME
family flip_pairs {{
  weight(t[..., rows, k]) {{
    permute(t, dim=-2, src={FLIP})
  }}
  scale(t[..., rows, k]) {{
    permute(t, dim=-2, src={FLIP})
  }}
}}
input w13 : e4m3[E, 2*I, H]     rows [w1; w3]
input s13 : f32[E, 2*I, H/32]   scales w13 block 32
interleave(w13, flip_pairs)
SCALES
output w13 : e4m3[E, 2*I, H]    rows [w1; w3] packing flip_pairs
output s13 : f32[E, 2*I, H/32]  rows [w1; w3] packing flip_pairs
"""


def _spec(tmp_path, text: str, name: str):
    path = tmp_path / f"{name}.lyt"
    path.write_text(text)
    return path


def test_the_floor_of_a_coordinate_times_a_size_is_found_with_its_period():
    p, i = ex.Var("p"), ex.Var("I")
    e = (ex.Var("o2") + 4 * p * i) // 64
    assert scaled_floors([e + 1, p // 64], ["I"]) == [e]
    assert period(e, "I").period == 16  # 4*p*I passes a multiple of 64 every 16 steps of I, whatever p is
    assert scaled_floors([(4 * i) // 64], ["I"]) == []  # a shape's floor: the shapes' analysis has it


@pytest.mark.slow  # 1.5-3 s on the loaded 2-core machine: a compile and every class verified
def test_a_contract_broken_only_in_some_residue_classes_of_such_a_map_is_found(tmp_path):
    """Before: the representatives were I = 1, 2, 3, ... (no shape floors I), where no pair flips, and check said
    "claims hold for all sizes". The floor's period (128) makes I = 64 a representative: the contract fails."""
    out = CliRunner().invoke(main, ["check", str(_spec(tmp_path, WRONG, "scaled_floor"))])
    assert out.exit_code == 2, out.output
    assert "w13: the kernel expects rows [w1; w3]" in out.output


@pytest.mark.slow  # 1.5-3 s on the loaded 2-core machine: a compile and every class verified
def test_few_classes_are_each_verified_and_the_claims_hold_for_all_sizes(tmp_path):
    text = PACKED.replace("ASSUME", "assume I % 16 == 0").replace("SCALES", "interleave(s13, flip_pairs)")
    spec = layoutc.compile_source(text, "scaled_floor_packing.lyt")
    variant = spec.compiled.variants[0]
    reps, status = region_dims(spec.program, variant)
    assert status == "covered" and {d["I"] % 128 for d in reps} == set(range(0, 128, 16))  # all 8 classes
    assert any(e for e in region_inputs(spec.program, variant)[1] if scaled_floors([e], ["I"]))
    out = CliRunner().invoke(main, ["check", "--strict", str(_spec(tmp_path, text, "ok"))])
    assert out.exit_code == 0 and "claims hold for all sizes" in out.output, out.output


def test_many_classes_are_named_and_strict_refuses_them(tmp_path):
    path = _spec(tmp_path, PACKED.replace("ASSUME", "").replace("SCALES", "interleave(s13, flip_pairs)"), "many")
    loose = CliRunner().invoke(main, ["check", str(path)])
    assert loose.exit_code == 0, loose.output
    assert "claims hold for the sizes with I = 0, 1, 64, 127 (mod 128) only, 4 of its 128 residue classes" \
        in loose.output
    strict = CliRunner().invoke(main, ["check", "--strict", str(path)])
    assert strict.exit_code == 2 and "the other residues are not verified" in strict.output


def test_the_flip_on_the_weight_alone_is_a_desync(tmp_path):
    text = PACKED.replace("ASSUME", "assume I % 16 == 0").replace("SCALES", "").replace(
        "output s13 : f32[E, 2*I, H/32]  rows [w1; w3] packing flip_pairs", "output s13 : f32[E, 2*I, H/32]  rows [w1; w3]")
    out = CliRunner().invoke(main, ["check", str(_spec(tmp_path, text, "desync"))])
    assert out.exit_code == 2, out.output
    assert "but s13 rows (after the packings' row shuffles) are [w1; w3]: a scale must follow" in out.output
