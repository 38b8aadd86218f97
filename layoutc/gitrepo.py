"""Specs as git knows them: the text of a file at a revision, the specs a range of commits changed.

Paths are read with ``core.quotePath=false`` and NUL separators (a spec may be named ``é.lyt``);
file contents are decoded the way spec files are (:func:`layoutc.source.decode`), so a spec that
is not UTF-8 is a positioned error in review as in ``check``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from .errors import Diagnostic, SpecError
from .source import decode


def run_git(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # Bytes in, names out unquoted: git quotes non-ASCII paths ("\303\251.lyt") unless told not to.
    return subprocess.run(["git", "-c", "core.quotePath=false", *args], capture_output=True, cwd=cwd)


def git_error(out: subprocess.CompletedProcess) -> str:
    return out.stderr.decode("utf-8", "replace").strip().splitlines()[0] if out.stderr.strip() else "git failed"


def toplevel(cwd: Path) -> Path:
    out = run_git("rev-parse", "--show-toplevel", cwd=cwd)
    if out.returncode != 0:
        # git's own words ("fatal: not a git repository (or any of the parent directories)") add nothing
        raise ValueError(f"{cwd.resolve()} is not inside a git repository")
    return Path(out.stdout.decode("utf-8", "surrogateescape").strip())


def changed_specs(base: str, head: str, cwd: Path) -> list[str]:
    for rev in (base, head):
        if run_git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", cwd=cwd).returncode != 0:
            raise ValueError(f"{rev!r} is not a commit in this repository")
    out = run_git("diff", "-z", "--name-only", "--diff-filter=AMR", base, head, "--", "*.lyt", cwd=cwd)
    if out.returncode != 0:
        raise ValueError(git_error(out))
    return [p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def show(rev: str, path: str, cwd: Path) -> str | None:
    """The spec's text at ``rev`` (decoded as a spec file is: non-UTF-8 is a SpecError), or None."""
    out = run_git("show", f"{rev}:{path}", cwd=cwd)
    return decode(out.stdout, f"{path}@{rev}") if out.returncode == 0 else None


def text_at(rev: str, path: str) -> str:
    """The text of spec ``path`` at git revision ``rev``."""
    try:
        top = toplevel(Path(path).resolve().parent)
    except ValueError as err:
        raise SpecError([Diagnostic("error", str(err))], path) from None
    rel = Path(path).resolve().relative_to(top)
    shown = run_git("show", f"{rev}:{rel.as_posix()}", cwd=top)
    if shown.returncode != 0:
        raise SpecError([Diagnostic("error", f"git show {rev}:{rel}: {git_error(shown)}")], path)
    return decode(shown.stdout, f"{path}@{rev}")
