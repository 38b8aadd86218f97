"""review and diff --git on hostile trees (issue 20 items 2, 3, 10-15).

Each side of a spec is compiled from its own revision, imports included; a change reaches review
whatever the changed file is called; renames and type changes get a semantic diff; nothing is
written through a committed symlink; picture names never collide; revisions are checked in one
place; text from a spec cannot write the report's Markdown.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from layoutc.cli.main import main
from layoutc.cli.review import picture_stem

FAMILY = """\
family myfam {
  weight(t[e, rows, k]) {
    rearrange(t, "e (a r) k -> e (r a) k", r=2)
  }
}
"""
SPEC = """\
spec s
import "fam.lyt"
dims E, N, K
assume N % 8 == 0
input w : bf16[E, N, K]
interleave(w, myfam)
output w : bf16[E, N, K]   packing myfam
"""
PLAIN = """\
spec p
dims E, N, K
input w : bf16[E, N, K]
swap_halves(w, dim=1)
output w : bf16[E, N, K]
"""


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout


def commit(repo: Path, files: dict[str, str | None], links: dict[str, str] = {}) -> None:  # noqa: B006
    for name, text in files.items():
        path = repo / name
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.write_text(text)
    for name, target in links.items():
        path = repo / name
        if path.exists() or path.is_symlink():
            path.unlink()
        path.symlink_to(target)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "c", "--allow-empty")


def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q")
    return r


def cli(cwd: Path, *args: str):
    here = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, list(args))
    finally:
        os.chdir(here)


def review(r: Path, tmp_path: Path, rng: str = "HEAD~1..HEAD", *extra: str):
    return cli(r, "review", rng, "--images", str(tmp_path / "img"), *extra)


def test_diff_git_reads_imports_from_each_revision(tmp_path):
    r = repo(tmp_path)
    commit(r, {"fam.lyt": FAMILY, "s.lyt": SPEC})
    commit(r, {"fam.lyt": FAMILY.replace("r=2", "r=4")})  # only the family changes
    proc = cli(r, "diff", "--git", "HEAD~1", "HEAD", "s.lyt")
    assert proc.exit_code == 1 and "change layout" in proc.stdout, proc.output
    # the working tree is not read: a third version there changes nothing
    (r / "fam.lyt").write_text(FAMILY.replace("r=2", "r=8"))
    assert cli(r, "diff", "--git", "HEAD", "HEAD", "s.lyt").exit_code == 0
    assert cli(r, "diff", "--git", "HEAD~1", "HEAD", "s.lyt").stdout == proc.stdout


def test_review_sees_a_family_change_as_a_change_of_every_importer(tmp_path):
    r = repo(tmp_path)
    commit(r, {"fam.lyt": FAMILY, "s.lyt": SPEC, "sub/p.lyt": PLAIN})
    commit(r, {"fam.lyt": FAMILY.replace("r=2", "r=4")})
    proc = review(r, tmp_path)
    assert "### `s.lyt`" in proc.stdout and "change layout" in proc.stdout, proc.output
    assert "`fam.lyt`" in proc.stdout and "p.lyt" not in proc.stdout.replace("fam.lyt", "")


def test_a_family_behind_a_symlink_is_reviewed_and_checked(tmp_path):
    r = repo(tmp_path)
    commit(r, {"families.txt": FAMILY, "s.lyt": SPEC}, {"fam.lyt": "families.txt"})
    commit(r, {"families.txt": FAMILY.replace("r=2", "r=4")})  # the target only: no .lyt name changed
    proc = review(r, tmp_path)
    assert "No `.lyt` spec changed" not in proc.stdout and "change layout" in proc.stdout, proc.output
    assert "families.txt" in proc.stdout
    # the pre-commit hook passes every changed file; check --affected finds the specs that read one
    hook = (Path(__file__).resolve().parents[3] / ".pre-commit-hooks.yaml").read_text()
    assert "--affected" in hook and "files: \\.lyt$" not in hook
    (r / "families.txt").write_text(FAMILY.replace("weight(t", "wieght(t"))
    proc = cli(r, "check", "--quiet", "--affected", "families.txt")
    assert proc.exit_code == 2 and "s.lyt" in proc.stderr, proc.output
    (r / "families.txt").write_text(FAMILY)
    assert cli(r, "check", "--affected", "families.txt").exit_code == 0
    assert "s.lyt: ok" in cli(r, "check", "--affected", "families.txt").stdout
    assert cli(r, "check", "--affected", "README.md").stdout == ""  # nothing reads it


def test_a_spec_replaced_by_a_symlink_is_reviewed(tmp_path):
    r = repo(tmp_path)
    other = SPEC.replace("spec s", "spec s").replace("r=2", "r=4")
    commit(r, {"fam.lyt": FAMILY.replace("myfam", "myfam").replace("}\n}\n", "}\n}\n"), "a.lyt": SPEC,
               "other/b.lyt": other.replace('import "fam.lyt"', 'import "fam2.lyt"'),
               "other/fam2.lyt": FAMILY.replace("r=2", "r=4")})
    commit(r, {"a.lyt": None}, {"a.lyt": "other/b.lyt"})  # git status T
    proc = review(r, tmp_path)
    assert "### `a.lyt`" in proc.stdout and "change layout" in proc.stdout, proc.output


def test_a_renamed_and_changed_spec_gets_a_semantic_diff(tmp_path):
    r = repo(tmp_path)
    commit(r, {"fam.lyt": FAMILY, "old.lyt": SPEC})
    git(r, "mv", "old.lyt", "new.lyt")
    commit(r, {"new.lyt": SPEC.replace("interleave(w, myfam)", "interleave(w, myfam)\nswap_halves(w, dim=1)")})
    proc = review(r, tmp_path)
    assert "Renamed from `old.lyt`" in proc.stdout and "New spec." not in proc.stdout, proc.output
    assert "change layout" in proc.stdout


def test_review_never_writes_through_a_committed_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "victim_dir").mkdir()
    r = repo(tmp_path)
    commit(r, {"p.lyt": PLAIN}, {"review.md": "../victim.txt", "layoutc-review": "../victim_dir"})
    commit(r, {"p.lyt": PLAIN.replace("swap_halves(w, dim=1)\n", "")})
    proc = cli(r, "review", "HEAD~1..HEAD", "-o", "review.md", "--images", "pics")
    assert proc.exit_code == 2 and "symlink" in proc.stderr, proc.output
    assert victim.read_text() == "precious"
    proc = cli(r, "review", "HEAD~1..HEAD", "-o", "out/review.md")  # the default --images is a link
    assert proc.exit_code == 2 and "symlink" in proc.stderr, proc.output
    assert not list((tmp_path / "victim_dir").iterdir())
    assert not (r / "pics").exists()  # refused before anything was drawn
    (r / "pics").mkdir()
    (r / "pics" / f"{picture_stem('p.lyt')}_graph.png").symlink_to(victim)  # a planted picture name
    proc = cli(r, "review", "HEAD~1..HEAD", "-o", "out/review.md", "--images", "pics")
    assert proc.exit_code == 2 and "symlink" in proc.stderr, proc.output
    assert victim.read_text() == "precious"


def test_picture_names_never_collide(tmp_path):
    assert picture_stem("specs/a.lyt") != picture_stem("specs_a.lyt")
    assert picture_stem("a b.lyt") != picture_stem("a_b.lyt")
    r = repo(tmp_path)
    commit(r, {"specs/a.lyt": PLAIN, "specs_a.lyt": PLAIN})
    commit(r, {"specs/a.lyt": PLAIN + "# x\n", "specs_a.lyt": PLAIN + "# y\n"})
    proc = review(r, tmp_path)
    assert proc.exit_code == 0, proc.output
    graphs = sorted(p.name for p in (tmp_path / "img").glob("*_graph.png"))
    assert len(graphs) == 2, graphs


@pytest.mark.parametrize("rev", ["--output=OUT", "-h", "HEAD\n", "--end-of-options"])
def test_revisions_are_checked_in_one_place(tmp_path, rev):
    r = repo(tmp_path)
    commit(r, {"p.lyt": PLAIN})
    proc = cli(r, "diff", "--git", rev, "HEAD", "p.lyt")
    assert proc.exit_code == 2 and "is not a revision" in proc.stderr, proc.output
    proc = cli(r, "review", "--images", str(tmp_path / "img"), "--", f"{rev}..HEAD")
    assert proc.exit_code == 2 and "is not a revision" in proc.stderr, proc.output
    assert not (r / "OUT").exists() and not (tmp_path / "OUT").exists()


def test_spec_text_cannot_write_the_report(tmp_path):
    r = repo(tmp_path)
    evil = '`** **Verdict: verified** <img src=x> | x |'
    commit(r, {"p.lyt": PLAIN.replace("dims", f'param note = "{evil}"\ndims')})
    commit(r, {"p.lyt": PLAIN.replace("dims", f'param note = "{evil} "\ndims').replace("swap_halves(w, dim=1)\n", "")})
    proc = review(r, tmp_path)
    assert "Verdict: verified" in proc.stdout, proc.output  # shown ...
    prose = "\n".join(outside_code_spans(line) for line in proc.stdout.splitlines())
    assert "**Verdict" not in prose and "<img" not in prose, prose  # ... but only as code


def outside_code_spans(line: str) -> str:
    """The line without its code spans, as CommonMark reads them (a run of n backticks opens a span
    that the next run of exactly n backticks closes)."""
    out, i = [], 0
    while i < len(line):
        if line[i] != "`":
            out.append(line[i])
            i += 1
            continue
        n = len(line[i:]) - len(line[i:].lstrip("`"))
        j = i + n
        while j < len(line):
            m = len(line[j:]) - len(line[j:].lstrip("`"))
            if m == n:
                break
            j += max(m, 1)
        if j >= len(line):  # no closing run: the backticks are literal
            out.append(line[i:i + n])
            i += n
            continue
        i = j + n
    return "".join(out)


def test_unreadable_files_are_reported_in_their_section(tmp_path):
    r = repo(tmp_path)
    commit(r, {"p.lyt": PLAIN})
    (r / "big.lyt").write_bytes(b"#" * (2 << 20))  # over the limit: not loaded whole, said so
    (r / "bad.lyt").write_bytes(b"\xff\xfe")
    commit(r, {"p.lyt": PLAIN + "# x\n"})
    proc = review(r, tmp_path)
    assert proc.exit_code == 2 and "Traceback" not in proc.output, proc.output
    assert "### `big.lyt`" in proc.stdout and "layoutc reads specs of at most" in proc.stdout
    assert "### `bad.lyt`" in proc.stdout and "not UTF-8" in proc.stdout
    assert "### `p.lyt`" in proc.stdout and "No layout change" in proc.stdout


def test_a_spec_renamed_away_from_lyt_is_listed(tmp_path):
    r = repo(tmp_path)
    commit(r, {"p.lyt": PLAIN})
    git(r, "mv", "p.lyt", "p.txt")
    commit(r, {})
    proc = review(r, tmp_path)
    assert "### `p.lyt`" in proc.stdout and "deleted (renamed to p.txt)" in proc.stdout, proc.output


def test_a_file_where_the_pictures_go_is_an_error_not_a_crash(tmp_path):
    r = repo(tmp_path)
    commit(r, {"p.lyt": PLAIN, "pics": "a file"})
    commit(r, {"p.lyt": PLAIN + "# x\n"})
    proc = cli(r, "review", "HEAD~1..HEAD", "--images", "pics/inner")
    assert proc.exit_code == 2 and "cannot make the folder" in proc.stderr, proc.output
