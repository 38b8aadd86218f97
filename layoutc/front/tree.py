"""Where a spec's imports are read from: the spec's folder on disk, or that folder at a git revision.

``import "families.lyt"`` names a file beside the importing spec. Who reads it decides what the spec
is: ``diff --git`` and ``review`` compile each side from its own revision, so an imported file is
read from the same revision as the spec, never from the working tree. Symlinks are followed as the
file system follows them (git stores a link as a blob holding its target's path), and the file
reached must stay inside the spec's folder. What a spec depends on is then recorded by content
(:mod:`layoutc.lang.identity`), not by where it was found.

A tree answers ``read(path)`` with :class:`Loaded`: the text, a name for messages, and every
repository path it went through (links and their targets), so that review can tell which specs a
changed file touches. Problems are ``ValueError`` with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import attrs

#: Links followed before a path is refused (a loop, or a chain no one would write).
MAX_LINKS = 16


@attrs.frozen
class Loaded:
    name: str  # for messages: the file as the user knows it
    text: str  # decoded as a spec file is (layoutc.front.source.decode)
    paths: tuple[str, ...] = ()  # repository paths read on the way (git trees only)


def check_import(path: str) -> PurePosixPath:
    """The import's path when it is a relative path to a ``.lyt`` file with no ``..``; else ValueError."""
    rel = PurePosixPath(path)
    if not path or rel.is_absolute() or "\\" in path or ".." in rel.parts or "" in path.split("/") \
            or not path.endswith(".lyt"):
        raise ValueError(f"import {path!r}: give a relative path to a .lyt file in the spec's folder "
                         f"(no '..', no absolute paths)")
    return rel


@attrs.frozen
class FileTree:
    """Imports from the file system, inside ``base`` (the importing spec's folder, resolved)."""

    base: Path

    @classmethod
    def beside(cls, spec_filename: str) -> "FileTree":
        """The tree of a spec file; text without a file (``<spec>``) imports from the current folder."""
        named = spec_filename and not spec_filename.startswith("<")
        return cls(Path(spec_filename).resolve().parent if named else Path.cwd().resolve())

    def read(self, path: str) -> Loaded:
        from .source import read_spec

        rel = check_import(path)
        target = (self.base / rel).resolve()
        if self.base not in target.parents:
            raise ValueError(f"import {path!r} leaves the spec's folder {self.base}")
        if not target.is_file():
            raise ValueError(f"import {path!r}: no such file {target}")
        return Loaded(str(target), read_spec(target))


class GitTree:
    """Imports from folder ``base`` (a repository path, ``""`` for the top) of a commit
    (:class:`layoutc.cli.gitrepo.Snapshot`)."""

    def __init__(self, snap, base: str):
        self.snap, self.base = snap, base

    def read(self, path: str) -> Loaded:
        from .source import decode

        rel = check_import(path)
        full = f"{self.base}/{rel.as_posix()}" if self.base else rel.as_posix()
        resolved, seen = resolve_path(self.snap, full)
        at = self.snap.commit[:12]
        if not _inside(resolved, self.base):
            raise ValueError(f"import {path!r} leaves the spec's folder {self.base or '.'} (it links to {resolved})")
        data = self.snap.blob(resolved)
        if data is None:
            raise ValueError(f"import {path!r}: no such file {resolved} at {at}")
        return Loaded(f"{resolved}@{at}", decode(data, f"{resolved}@{at}"), seen)


def _inside(path: str, folder: str) -> bool:
    return not folder or path.startswith(folder.rstrip("/") + "/")


def resolve_path(snap, path: str) -> tuple[str, tuple[str, ...]]:
    """``path`` in a commit with every symlink on the way followed (as the file system would), and
    the repository paths visited (each link, and the file reached). ValueError for a link that
    leaves the repository or an absolute one, or a loop."""
    seen: list[str] = []
    parts = path.split("/")
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not done:
                raise ValueError(f"{path}: a link leaves the repository")
            done.pop()
            continue
        current = "/".join(done + [part])
        found = snap.entry(current)
        if found is None:  # missing: the path as far as it goes
            return "/".join([current] + parts), tuple(seen + [current])
        mode, target = found
        seen.append(current)
        if mode == "120000":
            hops += 1
            if hops > MAX_LINKS:
                raise ValueError(f"{path}: more than {MAX_LINKS} symlinks (a loop?)")
            if target.startswith("/"):
                raise ValueError(f"{current} links to an absolute path ({target!r})")
            parts = target.split("/") + parts
            continue
        done.append(part)
    return "/".join(done), tuple(seen)


def _where(path: Path) -> str:
    """A path as its folder's real location plus its own name (the name itself may be a link)."""
    path = Path(os.path.abspath(path))
    return str(Path(os.path.realpath(path.parent)) / path.name)


def _link_chain(path: Path) -> tuple[set[str], bool]:
    """Every location on the way from ``path`` to the file it names (each link, then the file), and
    whether a file is reached."""
    seen = set()
    for _ in range(MAX_LINKS + 1):
        seen.add(_where(path))
        if not path.is_symlink():
            seen.add(os.path.realpath(path))
            return seen, path.is_file()
        path = Path(os.path.abspath(path)).parent / os.readlink(path)
    return seen, False


def file_dependencies(spec: Path) -> tuple[set[str], bool]:
    """(every location spec file ``spec`` reads: its links and file, and those of its imports; whether
    all of them were found). Locations are absolute, the folders resolved, as :func:`located` gives."""
    from . import ast as spec_ast
    from .errors import SpecError
    from .parse import parse
    from .source import read_spec

    deps, complete = _link_chain(spec)
    if not complete:
        return deps, False
    try:
        items = parse(read_spec(spec), str(spec)).items
    except SpecError:
        return deps, complete
    base = FileTree.beside(str(spec)).base
    for item in items:
        if isinstance(item, spec_ast.Import):
            try:
                rel = check_import(item.path.value)
            except ValueError:
                complete = False
                continue
            found, ok = _link_chain(base / rel)
            deps |= found
            complete &= ok
    return deps, complete


def located(path: Path) -> set[str]:
    """The locations a changed file stands for, to compare with :func:`file_dependencies`."""
    return {_where(path), os.path.realpath(path)}
