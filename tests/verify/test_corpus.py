"""Regression corpus: one small spec per failure class of docs/design.md section 1.

Each file states, in its header, what the verifier must say (``# expect: ...``) and the
spec line it must point at (``# expect-line: N``). All of them must be rejected; all
shipped specs must pass.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import layoutc
from tests.helpers import ROOT, SPECS, expectations, flashinfer_case

CORPUS = sorted((Path(__file__).parent / "corpus").glob("*.lyt"))


def test_corpus_covers_every_failure_class():
    names = {p.stem for p in CORPUS}
    for required in ["scales_folded_weights_not_interleaved", "scale_not_swapped", "bias_not_swapped",
                     "gated_padded_at_end", "non_gated_two_shards", "double_swap",
                     "gpt_oss_interleaved_with_swap_halves", "view_instead_of_cast", "old_flashinfer_sm90_layout"]:
        assert required in names


#: the corpus with its cases that need FlashInfer (a `requires flashinfer` line) marked for that tier
CORPUS_CASES = [flashinfer_case(p, "requires flashinfer" in p.read_text()) for p in CORPUS]


@pytest.mark.parametrize("path", CORPUS_CASES, ids=lambda p: p.stem)
def test_corpus_spec_is_rejected_with_a_precise_message(path):
    expects, line = expectations(path)
    assert expects
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_file(path)
    err = info.value
    text = err.render()
    for fragment in expects:
        assert fragment in text, f"missing {fragment!r} in:\n{text}"
    assert any(d.pos is not None and d.pos.line == line for d in err.errors), text
    assert f"{path}:{line}:" in text
    source_line = path.read_text().splitlines()[line - 1]
    assert source_line in text  # the offending line is quoted
    assert "^" in text


@pytest.mark.parametrize("path", CORPUS_CASES, ids=lambda p: p.stem)
def test_corpus_findings_name_the_tensors(path):
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_file(path)
    for d in info.value.errors:
        if d.tensors:
            assert any(t in d.message for t in d.tensors), d.message


@pytest.mark.slow  # over 5 s on the 2-core machine: `make test-slow`
def test_cli_rejects_the_corpus_and_accepts_the_shipped_specs():
    cli = [sys.executable, "-m", "layoutc"]
    bad = subprocess.run(cli + ["check", *map(str, CORPUS)], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert f"{len(CORPUS)} specs failed" in bad.stderr
    good = subprocess.run(cli + ["check", *map(str, sorted(SPECS.glob("*.lyt")))], capture_output=True, text=True, cwd=ROOT)
    assert good.returncode == 0, good.stderr


def test_several_findings_are_reported_together():
    # bias not swapped AND scales folded for a weight that is not interleaved
    text = (Path(__file__).parent / "corpus" / "bias_not_swapped.lyt").read_text()
    text = text.replace("interleave(w13_weight, sm90_mixed); ", "")
    text = text.replace("output w13_weight       : fp4x2[E, 2*I, H/2]                 rows [w3; w1] packing sm90_mixed",
                        "output w13_weight       : fp4x2[E, 2*I, H/2]                 rows [w3; w1]")
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_source(text, "two_bugs.lyt")
    messages = " | ".join(d.message for d in info.value.errors)
    assert "w13_bias rows are [w1; w3]" in messages
    assert "w13_weight_scale is packed for sm90_mixed" in messages
