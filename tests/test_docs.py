"""The README's command samples and the pictures in docs/ are what the tools produce now (``make docs``).

tools/make_docs.py holds the one definition of every sample and picture; these tests run its check, and
check that the check itself notices a stale sample or picture (a check that cannot fail tests nothing).
Pictures are compared through the sha256 of the data they draw (docs/pictures.json), not their pixels:
PNG bytes change with the matplotlib version and the fonts installed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools import make_docs  # noqa: E402


@pytest.fixture(scope="module")
def rendered():
    """The samples as make_docs would write them (computed once: each runs a command)."""
    return make_docs.render_samples()


@pytest.mark.flashinfer
def test_readme_samples_and_pictures_are_current():
    if not make_docs.flashinfer_installed():
        # the demo sample shows what a machine with flashinfer prints (the backends it finds)
        pytest.skip("the README samples are made on a machine with flashinfer-python installed")
    problems = make_docs.stale()
    assert not problems, "\n".join(problems) + "\nrun: make docs"


def test_a_stale_sample_is_noticed(monkeypatch, rendered):
    monkeypatch.setattr(make_docs, "render_samples", lambda: rendered)
    readme = make_docs.README.read_text()
    body = make_docs.MARKER.search(readme).group("body")
    edited = readme.replace(body, body.replace("\n", "\nan edited line\n", 1), 1)
    assert edited != readme
    assert any("differs from what the command prints now" in p for p in make_docs.stale(edited))
    # a marker tools/make_docs.py does not know, and one it misses
    renamed = re.sub(r"<!-- sample: demo -->", "<!-- sample: dmeo -->", readme)
    problems = make_docs.stale(renamed)
    assert "README.md has no sample marker for 'demo'" in problems
    assert "README.md has a marker 'dmeo' that tools/make_docs.py does not know" in problems


def test_times_are_the_only_thing_blanked():
    assert make_docs.normalise("took 12.5 ms") == make_docs.normalise("took 3 ms")
    assert make_docs.normalise("E=2") != make_docs.normalise("E=3")


def test_a_picture_drawn_from_other_data_is_noticed(monkeypatch, tmp_path, rendered):
    monkeypatch.setattr(make_docs, "render_samples", lambda: rendered)
    recorded = json.loads(make_docs.PICTURES.read_text())
    assert set(recorded) == set(make_docs.PICTURE_SPECS) | {make_docs.STAGES_PICTURE}, \
        "every picture has its data's sha256 recorded"
    name = sorted(recorded)[0]
    recorded[name]["data_sha256"] = "0" * 64  # as if the spec had changed since the picture was drawn
    fake = tmp_path / "pictures.json"
    fake.write_text(json.dumps(recorded))
    monkeypatch.setattr(make_docs, "PICTURES", fake)
    assert f"docs/{name} was drawn from other data than the spec gives now" in make_docs.stale()


def test_the_data_of_a_picture_changes_with_the_spec():
    """The digest covers what is drawn: two different layouts never share one."""
    a = make_docs.digest(make_docs.picture_data("w13_scale_desync.png"))
    from layoutc.cli.draw import layout_data

    good = make_docs._compiled("specs/flashinfer_cutlass_bf16.lyt", True)
    assert make_docs.digest(layout_data(good, "w13_weight")) != a


def test_make_docs_is_a_make_target():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^docs:.*\n\t.*tools/make_docs\.py", makefile, re.M), "Makefile: docs target"
