"""explain, diff, draw, review and the editor grammar, on every shipped spec."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import layoutc
from layoutc.cli.diff import diff, load_pair
from layoutc.cli.draw import draw_graph, draw_layout, small_dims
from layoutc.cli.explain import explain, render
from layoutc.verify.rules import axis_map
from tests.helpers import ROOT, SPECS

SHIPPED = [("flashinfer_cutlass_bf16", {}), ("flashinfer_cutlass_mxfp8", {}),
           ("flashinfer_cutedsl_nvfp4", {"activation": "silu"}), ("flashinfer_cutedsl_nvfp4", {"activation": "relu2"})]
IDS = [f"{n}{'-' + p['activation'] if p else ''}" for n, p in SHIPPED]
CLI = [sys.executable, "-m", "layoutc"]


def cli(*args, cwd=ROOT):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=cwd)


# -- explain ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,params", SHIPPED, ids=IDS)
def test_explain_every_shipped_spec(name, params):
    spec = layoutc.compile_file(SPECS / f"{name}.lyt", params)
    report = explain(spec)
    assert {t["name"] for t in report["tensors"]} == set(spec.input_names)
    for fmt in ("text", "markdown", "json"):
        out = render(report, fmt)
        assert spec.name in out
    data = json.loads(render(report, "json"))
    for t in data["tensors"]:
        assert t["map"].startswith(("out[", "word["))
        assert all(s["line"] for s in t["chain"])


def test_explain_states_the_composed_maps():
    spec = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
    maps = {t["name"]: t["map"] for t in explain(spec)["tensors"]}
    assert maps["w13_bias"] == "out[e, r] = in[e, (I + r) mod (2*I)]"
    assert maps["w2_weight_scale"] == "out[e, rb, kb, f, c] = in[e, f + 64*rb + 16*(c // 4), 4*kb + c mod 4]"
    assert maps["w13_weight"].startswith("word[e, r, w]")
    rows = {t["name"]: t["rows"] for t in explain(spec)["tensors"]}
    assert rows["w13_weight_scale"] == {"input": "[w1; w3]", "output": "[w3; w1]"}  # inherited through the tie


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_explain_cli():
    proc = cli("explain", "specs/flashinfer_cutedsl_nvfp4.lyt", "-D", "activation=relu2", "--format", "markdown")
    assert proc.returncode == 0, proc.stderr
    assert "#### `w13_weight`" in proc.stdout and "Copied as is." in proc.stdout
    bad = cli("explain", "specs/flashinfer_cutlass_bf16.lyt", "--tensor", "w99")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


# -- diff ---------------------------------------------------------------------------------------

BF16 = (SPECS / "flashinfer_cutlass_bf16.lyt").read_text()


def refactored() -> str:
    """Textually large, semantically empty: statements split and reordered, comments rewritten."""
    text = BF16.replace("swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)",
                        "# one tensor per statement now\nswap_halves(w13_bias, dim=1)\nswap_halves(w13_weight_scale)\n"
                        "swap_halves(w13_weight, dim=1)")
    text = text.replace("interleave(w13_weight, sm90_mixed); interleave(w13_weight_scale, sm90_mixed)\n"
                        "interleave(w2_weight, sm90_mixed);  interleave(w2_weight_scale, sm90_mixed)",
                        "interleave(w2_weight_scale, sm90_mixed)\ninterleave(w2_weight, sm90_mixed)\n"
                        "interleave(w13_weight_scale, sm90_mixed)\ninterleave(w13_weight, sm90_mixed)")
    text = re.sub(r"^# .*$", "# (rewritten comment)", text, flags=re.M)
    assert sum(a != b for a, b in zip(text.splitlines(), BF16.splitlines())) > 10
    return text


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_refactor_is_no_layout_change(tmp_path):
    old, new = load_pair(BF16, "old.lyt", refactored(), "new.lyt")
    d = diff(old, new)
    assert not d.changed and not d.findings
    (tmp_path / "old.lyt").write_text(BF16)
    (tmp_path / "new.lyt").write_text(refactored())
    proc = cli("diff", str(tmp_path / "old.lyt"), str(tmp_path / "new.lyt"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no layout change" in proc.stdout


def one_statement_per_tensor() -> str:
    return BF16.replace("swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)",
                        "swap_halves([w13_weight, w13_bias], dim=1)\nswap_halves(w13_weight_scale, dim=1)")


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_one_character_desyncs_a_scale(tmp_path):
    base = one_statement_per_tensor()
    broken = base.replace("swap_halves(w13_weight_scale, dim=1)", "swap_halves(w13_weight_scale, dim=2)")
    assert sum(a != b for a, b in zip(base, broken)) == 1
    old, new = load_pair(base, "old.lyt", broken, "new.lyt")
    d = diff(old, new)
    assert [c.tensor for c in d.changes] == ["w13_weight_scale"]
    assert d.findings and "w13_weight_scale" in " ".join(d.findings)
    assert d.changes[0].example and "came from" in d.changes[0].example
    (tmp_path / "old.lyt").write_text(base)
    (tmp_path / "new.lyt").write_text(broken)
    proc = cli("diff", str(tmp_path / "old.lyt"), str(tmp_path / "new.lyt"), "--format", "markdown")
    assert proc.returncode == 1
    assert "w13_weight_scale" in proc.stdout and "breaks" in proc.stdout


def test_diff_reports_row_order_changes():
    swapped_twice = BF16.replace("swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)",
                                 "swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)\n"
                                 "swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)")
    old, new = load_pair(BF16, "old.lyt", swapped_twice, "new.lyt")
    d = diff(old, new)
    by = {c.tensor: c for c in d.changes}
    assert "rows" in by["w13_bias"].kinds
    assert any("[w3; w1] -> [w1; w3]" in x for x in by["w13_bias"].details)


def test_diff_between_two_backends():
    old = layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt")
    new = layoutc.compile_file(SPECS / "flashinfer_cutlass_mxfp8.lyt")
    d = diff(old, new)
    kinds = {c.tensor: c.kinds for c in d.changes}
    assert "packing" in kinds["w13_weight"] and "w13_bias" not in kinds


def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def repo_with_history(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "specs").mkdir(parents=True)
    git("init", "-q", cwd=repo)
    git("config", "user.email", "t@example.com", cwd=repo)
    git("config", "user.name", "t", cwd=repo)
    (repo / "specs" / "fi.lyt").write_text(one_statement_per_tensor())
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "first", cwd=repo)
    (repo / "specs" / "fi.lyt").write_text(one_statement_per_tensor().replace(
        "swap_halves(w13_weight_scale, dim=1)", "swap_halves(w13_weight_scale, dim=2)"))
    git("commit", "-qam", "second", cwd=repo)
    return repo


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_diff_git_revisions(tmp_path):
    repo = repo_with_history(tmp_path)
    proc = subprocess.run(CLI + ["diff", "--git", "HEAD~1", "HEAD", "specs/fi.lyt"], capture_output=True, text=True,
                          cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert "w13_weight_scale" in proc.stdout


# -- draw ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,params", SHIPPED, ids=IDS)
def test_draw_every_shipped_spec(name, params, tmp_path):
    import matplotlib.image as mpimg

    spec = layoutc.compile_file(SPECS / f"{name}.lyt", params)
    layout = draw_layout(spec, "w13_weight", tmp_path / "layout.png")
    graph = draw_graph(spec, tmp_path / "graph.svg")
    img = mpimg.imread(layout)
    assert img.shape[0] > 300 and img.shape[1] > 600
    assert graph.read_text().lstrip().startswith("<?xml")


@pytest.mark.slow  # over 5 s on the 2-core machine: `make test-slow`
def test_a_desync_is_visible_in_the_picture_data(tmp_path):
    broken = layoutc.compile_source((ROOT / "examples" / "desync_scale.lyt").read_text(), "desync.lyt",
                                    verify_spec=False)
    dims = small_dims(broken)
    chains = {c.tensor: c for c in broken.compiled.variants[-1].chains}
    # the strips drawn under each panel: logical rows of weight and scale differ
    assert axis_map(chains["w13_weight"], dims).rows != axis_map(chains["w13_weight_scale"], dims).rows
    assert draw_layout(broken, "w13_weight", tmp_path / "d.png").stat().st_size > 10_000
    proc = cli("draw", "examples/desync_scale.lyt", "--tensor", "w13_weight", "-o", str(tmp_path / "x.png"))
    assert proc.returncode == 2  # verification refuses it ...
    proc = cli("draw", "examples/desync_scale.lyt", "--tensor", "w13_weight", "--no-verify", "-o", str(tmp_path / "x.png"))
    assert proc.returncode == 0  # ... unless asked to draw it anyway


# -- review -------------------------------------------------------------------------------------


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_review_of_a_pull_request(tmp_path):
    repo = repo_with_history(tmp_path)
    proc = subprocess.run(CLI + ["review", "HEAD~1..HEAD", "-o", "review.md", "--images", "pics"],
                          capture_output=True, text=True, cwd=repo)
    assert proc.returncode == 2, proc.stderr  # the change breaks sync
    report = (repo / "review.md").read_text()
    assert "### `specs/fi.lyt`" in report and "w13_weight_scale" in report
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert links and all((repo / link).is_file() for link in links)


def test_pre_commit_hook_definition():
    text = (ROOT / ".pre-commit-hooks.yaml").read_text()
    # every changed file goes to the hook: a spec reads families through imports and links of any name
    assert "id: layoutc-check" in text and "entry: layoutc check --quiet --affected" in text
    assert "files:" not in text.replace("# ", "")


# -- editor grammar -----------------------------------------------------------------------------


def test_editor_grammar_knows_the_language():
    from layoutc.algebra.dtypes import ELEMENT_TYPES
    from layoutc.cli.editor import textmate_json
    from layoutc.lang.ops import PUBLIC
    from layoutc.front.parse import parser

    committed = (ROOT / "editors" / "vscode" / "syntaxes" / "lyt.tmLanguage.json").read_text()
    assert committed == textmate_json(), "the editor grammar is stale: run make docs"
    repo = json.loads(committed)["repository"]
    keywords = set(re.search(r"\((.*)\)", repo["keyword"]["match"]).group(1).split("|"))
    types = set(re.search(r"\((.*)\)", repo["type"]["match"]).group(1).split("|"))
    calls = set(re.search(r"\(([^)]*)\)", repo["call"]["match"]).group(1).split("|"))
    language_words = {t.pattern.value for t in parser().terminals
                      if t.pattern.type == "str" and t.pattern.value.isalpha()}
    assert language_words - {"true", "false", "input", "output"} <= keywords
    assert {"family", "import"} <= keywords
    assert set(ELEMENT_TYPES) == types
    assert set(PUBLIC) | {"interleave"} == calls


# -- review by region (issue 23) ----------------------------------------------------------------

SWAP = "swap_halves([w13_weight, w13_weight_scale, w13_bias], dim=1)"


def test_a_change_confined_to_a_size_region_is_reported_with_its_region():
    branch = BF16.replace(SWAP, SWAP + "\nif I == 2944 { " + SWAP + " }")
    old, new = load_pair(BF16, "old.lyt", branch, "new.lyt")
    d = diff(old, new)
    assert d.changed, "a change confined to a branch must never be 'no layout change'"
    by = {c.tensor: c for c in d.changes}
    assert by["w13_weight"].details == ("at I == 2944: logical rows [w3; w1] -> [w1; w3]",)
    assert "w2_weight" not in by


def test_a_change_confined_to_a_parameter_branch_is_reported_with_the_value():
    branch = BF16.replace(SWAP, "if tp_size == 8 { " + SWAP + " }\n" + SWAP)
    old, new = load_pair(BF16, "old.lyt", branch, "new.lyt")
    d = diff(old, new)
    by = {c.tensor: c for c in d.changes}
    assert by["w13_bias"].details == ("with tp_size=8: logical rows [w3; w1] -> [w1; w3]",)


def test_explain_lists_every_branch_with_its_condition():
    branch = BF16.replace(SWAP, SWAP + "\nif H > 4096 { swap_halves(w2_bias, dim=1) } else { cast(w2_bias, f32) }")
    report = explain(layoutc.compile_source(branch, "b.lyt", verify_spec=False))
    w2 = next(t for t in report["tensors"] if t["name"] == "w2_bias")
    whens = {s["statement"]: s["when"] for s in w2["chain"]}
    assert whens["swap_halves(w2_bias, dim=1)"] == "H > 4096"
    assert whens["cast(w2_bias, f32)"] == "H <= 4096"
    text = render(report, "text")
    assert "[if H > 4096]" in text and "[if H <= 4096]" in text


# -- outputs declared per size branch: every declaration is compared and shown -----------------

LIBRARY = ROOT / "tests" / "library"
SHUFFLE = (LIBRARY / "prims_ts_shuffle_bias.lyt").read_text()
ELSE_ROWS = "} else {\n  output w13       : e4m3[E, 2*I, H]   rows interleave(w1, w3)\n"


SMALL = """
spec small
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


def test_a_change_confined_to_one_branchs_output_declaration_is_reported_with_its_region():
    # The else branch's output declares other rows: nothing else changes (no statement, no map).
    branch = SMALL.replace("rows interleave(w1, w3)\n}", "rows [w1; w3]\n}")
    assert branch != SMALL
    old, new = load_pair(SMALL, "old.lyt", branch, "new.lyt")
    d = diff(old, new)
    assert d.changed, "a change confined to one branch's output declaration must never be 'no layout change'"
    by = {c.tensor: c for c in d.changes}
    assert by["w13"].details == ("at 2*I < 32: output rows: interleave(w1, w3) -> [w1; w3]",)
    # and the new spec's verdict reads that branch's declaration (not the first one's)
    assert any("at 2*I < 32: w13: the kernel expects rows [w1; w3]" in f for f in d.findings)
    from layoutc.cli.diff import as_markdown
    assert "at 2\\*I \\< 32: output rows: interleave(w1, w3) -\\> \\[w1; w3\\]" in as_markdown(d)


@pytest.mark.slow  # two specs with an optional bias, every region: about 2 s on the 2-core machine
def test_a_packing_argument_changed_in_one_branch_is_reported_with_its_region():
    old, new = load_pair(SHUFFLE, "old.lyt", SHUFFLE.replace("epilogue_tile=128", "epilogue_tile=64"), "new.lyt")
    by = {c.tensor: c for c in diff(old, new).changes}
    assert ("at 2*I >= 32: output packing: trtllm(epilogue_tile=128) -> trtllm(epilogue_tile=64)"
            in by["w13"].details)
    assert all(d.startswith("at 2*I >= 32: ") for d in by["w13"].details)  # the other branch is unchanged


def test_check_reads_the_output_declaration_of_each_branch():
    branch = SHUFFLE.replace(ELSE_ROWS, ELSE_ROWS.replace("rows interleave(w1, w3)", "rows [w1; w3]"))
    with pytest.raises(layoutc.SpecError) as err:
        layoutc.compile_source(branch, "branch.lyt")
    assert "at 2*I < 32: w13: the kernel expects rows [w1; w3]" in str(err.value)
    assert "branch.lyt:30:45" in str(err.value)  # the declaration of that branch


def test_explain_shows_every_output_declaration_with_its_condition():
    report = explain(layoutc.compile_source(SHUFFLE, "s.lyt"))
    w13 = next(t for t in report["tensors"] if t["name"] == "w13")
    assert [(o["when"], o["packing"], o["line"]) for o in w13["outputs"]] == [
        ("2*I >= 32", "trtllm(epilogue_tile=128)", 27), ("2*I < 32", None, 30)]
    text = render(report, "text")
    assert "packing trtllm(epilogue_tile=128)  [if 2*I >= 32] (line 27)" in text
    assert "packing none  [if 2*I < 32] (line 30)" in text
    assert "when `2*I < 32`" in render(report, "markdown")
