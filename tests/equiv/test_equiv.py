"""``layoutc equiv`` on small functions (tests/equiv/fns.py against tests/equiv/tiny.lyt): verdicts, the
findings' wording and coordinates, the adapters, and the errors a user causes."""

from __future__ import annotations

from pathlib import Path

import pytest

from layoutc.equiv.compare import EquivError, equivalent
from layoutc.testing import assert_equivalent
from tests.equiv import fns

TINY = Path(__file__).resolve().parent / "tiny.lyt"
DIMS = {"E": 2, "I": 32, "H": 64}


def test_equal_function_is_equivalent_at_four_shapes_and_both_bias_variants():
    r = equivalent(TINY, fns.good, DIMS)
    assert r.ok, r.report()
    assert r.verdict() == "equivalent at 4 shapes (2 combinations of optional inputs)"
    shapes = {tuple(sorted(s.dims.items())) for s in r.shapes}
    assert len(shapes) == 4 and tuple(sorted(DIMS.items())) in shapes
    assert {s.present for s in r.shapes} == {("w13_bias",), ()}


def test_positional_arguments_and_tuple_results():
    names = ["w13_weight", "w13_weight_scale", "w13_bias"]
    assert equivalent(TINY, fns.positional, DIMS, args=names, returns=names).ok


def test_a_function_that_converts_in_place_and_returns_nothing():
    assert equivalent(TINY, fns.in_place, DIMS).ok


def test_a_block_shifted_by_its_size_is_one_finding_with_its_offset():
    r = equivalent(TINY, fns.shifted_block, DIMS)
    text = r.report()
    assert not r.ok
    diff, = r.first_failure.diffs
    assert diff.tensor == "w13_weight_scale" and diff.differing == 2 * 8 * 2  # 2 experts, 8 rows, 2 columns
    assert len(diff.findings) == 1
    assert "w13_weight_scale[0, 0, 0]: spec reads w13_weight_scale[0, 32, 0] (moved by line 9 swap_halves)" in text
    assert "function read w13_weight_scale[0, 40, 0]" in text
    assert "input index read by the function minus the spec's: [0, +8, 0] at 32" in text


def test_fp4_nibbles_are_compared_bit_by_bit():
    r = equivalent(TINY, fns.nibbles_swapped, DIMS)
    text = r.report()
    assert "the function reads the same input element with its bits in other places" in text
    assert "function read bits 0-3 from w13_weight[0, 32, 0] bits 4-7; bits 4-7 from w13_weight[0, 32, 0] bits 0-3" in text
    assert "the spec moves no bits within elements of this tensor" in text


def test_values_are_compared_where_the_spec_casts():
    r = equivalent(TINY, fns.truncating_cast, DIMS)
    text = r.report()
    assert "w13_bias" in text and "values differ where both read the same elements" in text
    assert "spec statement: line 10 `cast(w13_bias, bf16)`" in text


def test_a_function_failing_at_other_sampled_shapes_is_a_difference():
    r = equivalent(TINY, fns.only_small_layers, DIMS)
    assert not r.ok
    assert "I > 32 is not supported" in r.report() and "where the spec converts" in r.report()


@pytest.mark.parametrize("fn,message", [
    (fns.raises, "raised ValueError: unsupported layout"),
    (fns.returns_list, "name them with --returns"),
    (fns.returns_text, "it must return a dict of tensors"),
])
def test_user_errors_are_messages(fn, message):
    with pytest.raises(EquivError, match=message):
        equivalent(TINY, fn, DIMS)


def test_dims_are_checked_against_the_spec():
    with pytest.raises(EquivError, match="--dims must give I, H"):
        equivalent(TINY, fns.good, {"E": 2})
    with pytest.raises(EquivError, match="do not fit the spec"):
        equivalent(TINY, fns.good, {"E": 2, "I": 32, "H": 48})  # H/32


def test_assert_equivalent_fails_with_the_report():
    assert_equivalent(TINY, fns.good, dims=DIMS)
    with pytest.raises(AssertionError) as info:
        assert_equivalent(TINY, fns.shifted_block, dims=DIMS)
    assert "function read w13_weight_scale[0, 40, 0]" in str(info.value)
    with pytest.raises(AssertionError, match="could not compare"):
        assert_equivalent(TINY, fns.raises, dims=DIMS)


def test_the_pytest_fixture(layoutc_equiv):
    result = layoutc_equiv(TINY, fns.good, dims=DIMS, shapes=2)
    assert result.ok and result.verdict().startswith("equivalent at 2 shapes")


def test_default_dims_when_none_are_given():
    r = equivalent(TINY, fns.good)
    assert r.ok and len({tuple(sorted(s.dims.items())) for s in r.shapes}) == 4
