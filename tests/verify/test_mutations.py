"""Mutation testing of the verifier over every shipped spec.

Each spec is mutated systematically (tests/verify/mutants.py: delete a statement or an if
block, change a number, swap a tensor for a tied sibling, drop a tensor from a list, change
an element type, reverse a declared row order). Every mutant must be rejected -- by the
verifier, or loudly by the converter's checks -- or produce outputs identical to the
original's. A mutant that compiles and converts to different bytes is a silent layout bug
the verifier let through.
"""

from __future__ import annotations

import pytest

from tests.helpers import SPECS
from tests.verify.mutation import SPEC_CASES, run, score


@pytest.mark.parametrize("name", sorted(SPEC_CASES))
def test_no_mutant_survives(name):
    outcomes = run(SPECS / f"{name}.lyt")
    killed, survived, equivalent = score(outcomes)
    assert len(outcomes) > 50
    survivors = [o for o in outcomes if o.verdict == "SURVIVED"]
    assert not survivors, "\n".join(f"{o.description}: {o.detail}" for o in survivors)
    assert killed >= 0.9 * len(outcomes)
