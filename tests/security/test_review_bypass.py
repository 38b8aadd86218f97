"""A change cannot hide from review: every tool reads line ends the same way.

The attack (issue 10, case 4): a commit "rewording comments" turned ``\\nswap_halves(...)`` into
``# ...\\rswap_halves(...)``. The parser then read a comment while git, Python and review read a
statement, so review said "no layout change" and the converter stopped swapping. Now a lone CR
is a line end everywhere: the statement is a statement for the parser too.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import layoutc
from layoutc.cli.diff import diff, load_pair
from tests.helpers import ROOT, assert_same_bits
from tests.security.hostile import BODY


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


def _layer():
    return {"w": torch.arange(2 * 8 * 2, dtype=torch.float32).reshape(2, 8, 2).to(torch.bfloat16)}


def test_every_line_ending_reads_the_same():
    lf = layoutc.compile_source(BODY, "lf.lyt")
    for name, text in (("crlf", BODY.replace("\n", "\r\n")), ("cr", BODY.replace("\n", "\r"))):
        other = layoutc.compile_source(text, f"{name}.lyt")
        assert [s.text for s in other.program.statements] == [s.text for s in lf.program.statements]
        assert_same_bits(other.convert(_layer())["w"], lf.convert(_layer())["w"], name)
        assert not diff(*load_pair(BODY, "lf.lyt", text, f"{name}.lyt")).changed
    # The hash is of the file as written (sha256sum agrees), so CRLF and LF files differ there.
    assert layoutc.compile_source(BODY.replace("\n", "\r\n"), "x.lyt").sha256 != lf.sha256


def test_a_statement_after_a_carriage_return_is_a_statement():
    hidden = BODY.replace("\nswap_halves(w, dim=1)", "\n# reword comments\rswap_halves(w, dim=1)")
    spec = layoutc.compile_source(hidden, "hidden.lyt")
    assert [s.op for s in spec.program.statements] == ["swap_halves"]
    assert_same_bits(spec.convert(_layer())["w"], layoutc.compile_source(BODY, "b.lyt").convert(_layer())["w"])
    # the contract hidden the same way is still the contract
    rows = hidden.replace("] rows [w3; w1]", "]  # the kernel's order:\r rows [w3; w1]")
    assert rows != hidden
    assert str(layoutc.compile_source(rows, "rows.lyt").program.output("w").rows) == "[w3; w1]"


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_review_sees_a_change_written_with_carriage_returns(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "s.lyt").write_text(BODY)
    _git(tmp_path, "add", "s.lyt")
    _git(tmp_path, "commit", "-qm", "a spec")
    # "reword comments": the swap really is commented out, with CR line ends around the comment
    edited = BODY.replace("swap_halves(w, dim=1)\n", "# swap_halves(w, dim=1) reworded\r")
    edited = edited.replace("rows [w3; w1]", "rows [w1; w3]")
    (tmp_path / "s.lyt").write_bytes(edited.encode())
    _git(tmp_path, "commit", "-qam", "reword comments")
    proc = subprocess.run([sys.executable, "-m", "layoutc", "review", "HEAD~1..HEAD", "--images",
                           str(tmp_path / "img")], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert "tensor(s) change layout" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-m", "layoutc", "diff", "--git", "HEAD~1", "HEAD", "s.lyt"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1 and "rows" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_review_of_a_spec_with_a_non_ascii_name_and_outside_git(tmp_path):
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "layoutc", "review", "HEAD~1..HEAD"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300, env=env)
    assert proc.returncode == 2 and "not inside a git repository" in proc.stderr
    assert "usage: git" not in proc.stderr.lower() and "Traceback" not in proc.stderr
    _git(tmp_path, "init", "-q")
    (tmp_path / "é.lyt").write_text(BODY)
    _git(tmp_path, "add", "é.lyt")
    _git(tmp_path, "commit", "-qm", "one")
    (tmp_path / "é.lyt").write_text(BODY.replace("# ", "") + "# a comment\n")
    _git(tmp_path, "commit", "-qam", "two")
    proc = subprocess.run([sys.executable, "-m", "layoutc", "review", "HEAD~1..HEAD", "--images",
                           str(tmp_path / "img")], capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "`é.lyt`" in proc.stdout and "No layout change" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "layoutc", "review", "nope..HEAD"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300, env=env)
    assert proc.returncode == 2 and "'nope' is not a commit" in proc.stderr
