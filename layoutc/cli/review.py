"""``layoutc review BASE..HEAD``: a Markdown report for a pull request touching layout specs.

For every spec whose layout may have changed between two git revisions: the semantic diff (what
moved, whether sync still holds), ``explain`` of the new version, and pictures (the transform
graph, and the layout of every tensor whose layout changed). Pictures go to a folder beside the
report.

What counts as changed is what a spec depends on, read from each revision: each side of a spec is
compiled entirely from its own commit (the spec and its imports, :class:`layoutc.front.tree.GitTree`),
and a spec is reviewed when its file, a file it imports, or a symlink on the way to either
changed, whatever that file is called (``fam.lyt -> families.txt``: a change to ``families.txt``
is a change to every spec importing ``fam.lyt``). Renames and type changes (a spec replaced by a
symlink) are followed, with a semantic diff against the old path. A file that defines families
only is checked on its own.

The reviewed tree is untrusted: nothing is written through a symlink (the report and every
picture are opened with ``O_NOFOLLOW`` in a folder that is no link), picture names are distinct
for distinct paths, and every name and message from a spec is escaped in the Markdown.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import urllib.parse
from pathlib import Path

import attrs

from ..front import ast
from ..api import CompiledSpec, compile_source
from .diff import as_markdown as diff_markdown
from .diff import diff
from ..front.errors import SpecError
from .explain import as_markdown as explain_markdown
from .explain import explain
from .gitrepo import Snapshot, changes, check_rev, spec_at, toplevel
from ..front.text import md_block, md_code, md_text
from ..front.tree import GitTree


@attrs.frozen
class Item:
    """A spec to review: its path at HEAD (or BASE when deleted), where it was at BASE, and why."""

    path: str
    old_path: str | None
    new_exists: bool
    why: str  # "" when the file itself changed, else what changed under it


def split_range(rev_range: str) -> tuple[str, str]:
    if ".." not in rev_range:
        raise ValueError("give a range BASE..HEAD")
    base, head = rev_range.split("..", 1)
    return base, head or "HEAD"


def _imports(text: str, name: str) -> list[str]:
    from ..front.parse import parse

    try:
        return [i.path.value for i in parse(text, name).items if isinstance(i, ast.Import)]
    except SpecError:
        return []  # a spec that does not parse is reviewed only when it changed itself (and then fails)


def dependencies(snap: Snapshot, path: str) -> set[str]:
    """Every repository path spec ``path`` reads at this commit: its links and file, and those of its
    imports."""
    try:
        found = spec_at(snap, path)
    except SpecError:  # not UTF-8, too large: reviewed (and reported) only when it changed itself
        return set()
    if found is None:
        return set()
    text, resolved, seen = found
    deps = set(seen)
    tree = GitTree(snap, resolved.rpartition("/")[0])
    for imp in _imports(text, path):
        try:
            deps.update(tree.read(imp).paths)
        except (ValueError, SpecError):
            continue
    return deps


def affected(base: Snapshot, head: Snapshot) -> list[Item]:
    """The specs to review, in path order."""
    changed = changes(base.commit, head.commit, head.top)
    touched = {p for c in changed for p in (c.old, c.new) if p}
    items: dict[str, Item] = {}
    for c in changed:
        if c.new and c.new.endswith(".lyt"):
            items[c.new] = Item(c.new, c.old if c.old else None, True, "")
        elif c.old and c.old.endswith(".lyt"):  # deleted, or renamed to a name that is no spec's
            items.setdefault(c.old, Item(c.old, c.old, False, f"renamed to {c.new}" if c.new else ""))
    for snap in (head, base):
        for path in sorted(p for p in snap.entries if p.endswith(".lyt")):
            if path in items:
                continue
            hit = sorted(dependencies(snap, path) & touched)
            if hit:
                exists = path in head.entries
                items[path] = Item(path, path if path in base.entries else None, exists,
                                   ", ".join(hit))
    return [items[p] for p in sorted(items)]


def picture_stem(path: str) -> str:
    """A file name from a spec's path: readable, and distinct for distinct paths (``specs/a.lyt`` and
    ``specs_a.lyt`` read alike once sanitised; the hash of the exact path tells them apart)."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.removesuffix(".lyt")).strip("._")[:80] or "spec"
    return f"{readable}-{hashlib.sha256(path.encode('utf-8', 'surrogateescape')).hexdigest()[:10]}"


def safe_folder(folder: Path) -> Path:
    """``folder``, created, when neither it nor a folder on the way inside the current folder is a
    symlink (a reviewed tree can commit ``layoutc-review -> /home/you``). ValueError otherwise."""
    absolute = Path(os.path.abspath(folder))
    cwd = Path(os.path.abspath("."))
    check = [absolute] + [p for p in absolute.parents if p != cwd and cwd in p.parents]
    for p in check:
        if p.is_symlink():
            raise ValueError(f"{p} is a symlink; review writes only into real folders (give another folder)")
    try:
        absolute.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file where the folder goes (committed as such), a read-only place
        raise ValueError(f"cannot make the folder {absolute}: {err.strerror or err}") from None
    if absolute.is_symlink() or not absolute.is_dir():
        raise ValueError(f"{absolute} is not a folder")
    return absolute


def write_file(path: Path, data: bytes) -> None:
    """Write ``path`` without following a symlink there (ELOOP is refused with the reason)."""
    safe_folder(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as err:
        if path.is_symlink():
            raise ValueError(f"{path} is a symlink; review does not write through links (delete it)") from None
        raise ValueError(f"cannot write {path}: {err.strerror or err}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _family_file(text: str, name: str) -> str | None:
    """For a file of family definitions only: what checking them says (Markdown); else None."""
    from ..lang.families import families_of
    from ..front.parse import parse

    try:
        tree = parse(text, name)
    except SpecError:
        return None
    if not tree.items or not all(isinstance(i, ast.FamilyDef) for i in tree.items):
        return None
    try:
        found = families_of(tree)
    except SpecError as err:
        return "\n".join(["A file of families; its definitions have errors:", "", md_block(err.render()), ""])
    names = ", ".join(md_code(f.name) for f in found)
    return f"A file of families ({names}); its definitions check. The specs importing it are reviewed below.\n"


def review(rev_range: str, images: Path, cwd: Path = Path("."), report_dir: Path | None = None) -> tuple[str, bool]:
    """(Markdown report, whether every changed spec compiles and verifies). Picture links are
    relative to ``report_dir`` (where the report will be written) when given."""
    from .draw import draw_graph, draw_layout

    def link(p: Path) -> str:  # URL-quoted: a file name must not end the Markdown link early
        rel = Path(os.path.relpath(p, report_dir)).as_posix() if report_dir is not None else p.as_posix()
        return urllib.parse.quote(rel)

    base_name, head_name = split_range(rev_range)
    top = toplevel(cwd)
    base, head = Snapshot(top, check_rev(base_name, top)), Snapshot(top, check_rev(head_name, top))
    items = affected(base, head)
    lines = [f"## Layout review: {md_code(f'{base_name}..{head_name}')}", ""]
    if not items:
        return "\n".join(lines + ["No `.lyt` spec changed, and no file a spec reads."]) + "\n", True
    images = safe_folder(images)
    ok = True
    with tempfile.TemporaryDirectory(prefix="layoutc-review-") as scratch:
        for item in items:
            lines += [f"### {md_code(item.path)}", ""]
            if item.why and item.new_exists:
                lines += [f"Reviewed because a file it reads changed: {md_code(item.why)}.", ""]
            if item.old_path and item.old_path != item.path:
                lines += [f"Renamed from {md_code(item.old_path)}.", ""]
            if not item.new_exists:
                lines += [f"The spec was deleted ({md_text(item.why)})." if item.why else "The spec was deleted.", ""]
                continue
            section, good = _review_one(item, base, head, Path(scratch), images, link, draw_graph, draw_layout)
            lines += section
            ok &= good
    return "\n".join(lines) + "\n", ok


def _side(snap: Snapshot, path: str | None, params=None, verify_spec=False) -> tuple[str, CompiledSpec] | None:
    """(text, compiled) of ``path`` in a commit, compiled from that commit alone; None where absent."""
    if path is None:
        return None
    found = spec_at(snap, path)
    if found is None:
        return None
    text, resolved, _ = found
    name = f"{path}@{snap.commit[:12]}"
    return text, compile_source(text, name, params, verify_spec=verify_spec,
                                tree=GitTree(snap, resolved.rpartition("/")[0]))


def _review_one(item: Item, base: Snapshot, head: Snapshot, scratch: Path, images: Path, link, draw_graph,
                draw_layout) -> tuple[list[str], bool]:
    lines: list[str] = []
    try:
        found = spec_at(head, item.path)
    except SpecError as err:
        return ["The new version cannot be read:", "", md_block(err.render()), ""], False
    if found is None:
        return ["The new version is not a file (a symlink that leaves the repository, or a loop).", ""], False
    family = _family_file(found[0], item.path)
    if family is not None:
        return [family], "errors" not in family
    try:
        new = _side(head, item.path)[1]
    except SpecError as err:
        return ["The new version does not compile:", "", md_block(err.render()), ""], False
    ok = True
    try:
        old_side = _side(base, item.old_path)
    except SpecError as err:
        lines += [f"The old version does not compile ({md_text(err.errors[0].message)}); showing the new one only.", ""]
        old_side = None
        changed_tensors = list(new.input_names)
    else:
        if old_side is None:
            lines += ["New spec.", ""]
            changed_tensors = list(new.input_names)
    if old_side is not None:
        d = diff(old_side[1], new)
        lines += [diff_markdown(d)]
        changed_tensors = [c.tensor for c in d.changes if c.tensor in new.input_names]
        ok &= not d.findings
    try:
        verified = _side(head, item.path, verify_spec=True)[1]
        lines += [explain_markdown(explain(verified))]
    except SpecError as err:
        ok = False
        lines += ["The new version fails verification:", "", md_block(err.render()), ""]
    stem = picture_stem(item.path)

    def publish(drawn: Path) -> Path:
        target = images / drawn.name
        write_file(target, drawn.read_bytes())
        return target

    graph = publish(draw_graph(new, scratch / f"{stem}_graph.png"))
    lines += [f"![transform graph]({link(graph)})", ""]
    drawn = set()
    for tensor in changed_tensors:
        chain = next(c for c in new.compiled.variants[-1].chains if c.tensor == tensor)
        weight = chain.source.tie.weight if chain.source.tie else tensor
        if weight in drawn:
            continue
        drawn.add(weight)
        safe = re.sub(r"[^A-Za-z0-9_]+", "_", weight)
        pic = publish(draw_layout(new, weight, scratch / f"{stem}_{safe}.png"))
        lines += [f"![layout of {md_text(weight)} and its tied tensors]({link(pic)})", ""]
    return lines, ok
