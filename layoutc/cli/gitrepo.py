"""Specs as git knows them: revisions, files at a revision, what a range of commits changed.

Paths are read with ``core.quotePath=false`` and NUL separators (a spec may be named ``é.lyt``),
and given to git as literal pathspecs (``*`` in a file name is no pattern). File contents are
decoded the way spec files are (:func:`layoutc.front.source.decode`), so a spec that is not UTF-8 is a
positioned error in review as in ``check``.

Every revision a user names goes through :func:`check_rev` (one place for ``diff --git``,
``review`` and anything else that takes one): a name starting with ``-`` would be read by git as
an option (``--output=FILE`` writes a file), so it is refused before git sees it, and the
revision is resolved once to a commit id that later calls use.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import attrs

from ..front.errors import Diagnostic, SpecError
from ..limits import MAX_SOURCE_BYTES
from ..front.source import decode
from ..front.text import display


def run_git(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # Bytes in, names out unquoted: git quotes non-ASCII paths ("\303\251.lyt") unless told not to.
    return subprocess.run(["git", "-c", "core.quotePath=false", "--literal-pathspecs", *args],
                          capture_output=True, cwd=cwd)


def git_error(out: subprocess.CompletedProcess) -> str:
    return out.stderr.decode("utf-8", "replace").strip().splitlines()[0] if out.stderr.strip() else "git failed"


def toplevel(cwd: Path) -> Path:
    out = run_git("rev-parse", "--show-toplevel", cwd=cwd)
    if out.returncode != 0:
        # git's own words ("fatal: not a git repository (or any of the parent directories)") add nothing
        raise ValueError(f"{cwd.resolve()} is not inside a git repository")
    return Path(out.stdout.decode("utf-8", "surrogateescape").strip())


def check_rev(rev: str, cwd: Path) -> str:
    """The commit id of revision ``rev``, or ValueError. The one check of a user's revision."""
    if not rev or rev.startswith("-") or any(ord(c) < 32 or c == "\x7f" for c in rev) or len(rev) > 1000:
        raise ValueError(f"{display(rev)!r} is not a revision (a revision never starts with '-' and holds "
                         f"no control characters)")
    out = run_git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", cwd=cwd)
    if out.returncode != 0:
        raise ValueError(f"{display(rev)!r} is not a commit in this repository")
    return out.stdout.decode("ascii").strip()


class Snapshot:
    """The files of one commit, listed once (``git ls-tree -r``): entries, link targets, contents."""

    def __init__(self, top: Path, commit: str):
        self.top, self.commit = top, commit
        out = run_git("ls-tree", "-r", "-z", "-l", "--full-tree", commit, cwd=top)
        if out.returncode != 0:
            raise ValueError(git_error(out))
        self.entries: dict[str, tuple[str, str]] = {}
        self.sizes: dict[str, int] = {}
        self.dirs: set[str] = set()
        for record in out.stdout.split(b"\0"):
            if record:
                meta, _, name = record.partition(b"\t")
                mode, _kind, oid, size = meta.decode("ascii").split()
                path = name.decode("utf-8", "surrogateescape")
                self.entries[path] = (mode, oid)
                self.sizes[oid] = int(size) if size.isdigit() else 0
                parts = path.split("/")
                self.dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        self._blobs: dict[str, bytes] = {}

    def entry(self, path: str) -> tuple[str, str] | None:
        """(mode, object id) of ``path``, ("040000", "") for a folder, None where there is none; for a
        symlink (mode 120000) the object id is replaced by the link's target."""
        if path in self.dirs:
            return "040000", ""
        found = self.entries.get(path)
        if found is None:
            return None
        if found[0] == "120000":
            return found[0], self._read(found[1]).decode("utf-8", "surrogateescape")
        return found

    def blob(self, path: str) -> bytes | None:
        """The bytes of regular file ``path`` (no links followed), or None."""
        found = self.entries.get(path)
        if found is None or not found[0].startswith("100"):
            return None
        size = self.sizes.get(found[1], 0)
        if size > MAX_SOURCE_BYTES:  # a pull request's huge file is not loaded whole
            raise SpecError([Diagnostic("error", f"the file is {size} bytes; layoutc reads specs of at most "
                                                 f"{MAX_SOURCE_BYTES} bytes")], f"{path}@{self.commit[:12]}")
        return self._read(found[1])

    def _read(self, oid: str) -> bytes:
        if oid not in self._blobs:
            out = run_git("cat-file", "blob", oid, cwd=self.top)
            if out.returncode != 0:
                raise ValueError(f"git cat-file {oid}: {git_error(out)}")
            self._blobs[oid] = out.stdout
        return self._blobs[oid]


@attrs.frozen
class Change:
    status: str  # git's letter: A, M, D, R, C, T
    old: str | None  # the path before (None when added)
    new: str | None  # the path after (None when deleted)


def changes(base: str, head: str, top: Path) -> list[Change]:
    """Every file that changed between two commits (renames followed), whatever its name."""
    out = run_git("diff", "-z", "--no-ext-diff", "--name-status", "-M", base, head, "--", cwd=top)
    if out.returncode != 0:
        raise ValueError(git_error(out))
    fields = [f.decode("utf-8", "surrogateescape") for f in out.stdout.split(b"\0")]
    result, i = [], 0
    while i < len(fields) and fields[i]:
        status = fields[i][0]
        if status in "RC":
            result.append(Change(status, fields[i + 1], fields[i + 2]))
            i += 3
            continue
        path = fields[i + 1]
        result.append(Change(status, None if status == "A" else path, None if status == "D" else path))
        i += 2
    return result


def spec_at(snap: Snapshot, path: str) -> tuple[str, str, tuple[str, ...]] | None:
    """(text, resolved path, paths visited) of spec ``path`` in a commit, symlinks followed inside the
    repository, or None when it is not a file there. The text is decoded as a spec file is."""
    from ..front.tree import resolve_path

    try:
        resolved, seen = resolve_path(snap, path)
    except ValueError:
        return None
    data = snap.blob(resolved)
    if data is None:
        return None
    return decode(data, f"{path}@{snap.commit[:12]}"), resolved, seen


def text_at(rev: str, path: str) -> tuple[str, "object", str]:
    """(text, import tree, name) of spec file ``path`` at git revision ``rev``: the spec and what it
    imports both read from that revision."""
    from ..front.tree import GitTree

    try:
        top = toplevel(Path(path).absolute().parent if Path(path).absolute().parent.is_dir() else Path.cwd())
        commit = check_rev(rev, top)
        snap = Snapshot(top, commit)
    except ValueError as err:
        raise SpecError([Diagnostic("error", str(err))], path) from None
    given = Path(path).absolute()
    full = given.parent.resolve() / given.name  # the file itself may be a link: git follows it at rev
    if not full.is_relative_to(top.resolve()):
        raise SpecError([Diagnostic("error", f"{display(path)} is outside the repository {top}")], path)
    found = spec_at(snap, _normal(full.relative_to(top.resolve()).as_posix()))
    if found is None:
        raise SpecError([Diagnostic("error", f"{display(path)} is not a file at {display(rev)}")], path)
    text, resolved, _ = found
    return text, GitTree(snap, resolved.rpartition("/")[0]), f"{path}@{rev}"


def _normal(path: str) -> str:
    out: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if out:
                out.pop()
            continue
        out.append(part)
    return "/".join(out)
