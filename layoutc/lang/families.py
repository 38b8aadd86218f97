"""Packing families as data.

A kernel family (FlashInfer's SM90 mixed-input GEMM, the 128x4 block-scale swizzle, TRT-LLM's
epilogue shuffles, or one a user writes for another library) packs each tensor *role* with its own
chain of transforms: the SM90 GEMM bit-interleaves weights and folds their scales. A family is
written in the spec language::

    family sm90_mixed {
      weight(t: fp4x2[..., N, KB]) { rearrange(t, "...") ; permute_bits(t, table=[...]) ; ... }
      scale(t: e8m0[..., R, C])    { rearrange(t, "... (rb ms f) (kb g) -> ... rb kb f (ms g)", ...) }
    }

``interleave(x, sm90_mixed)`` applies the chain of x's role (its tie makes it a weight, scale or
bias), ``uninterleave`` the inverse chain. The built-in families are defined this way in
``prelude.lyt``, shipped with the package; a spec can define its own or ``import "file.lyt"`` them.
The verifier knows a family by what its steps do (their index maps) and which tensors carry it,
never by its name.

This module holds the data (:class:`Family`, :class:`Role`) and loads the prelude and imports; the
compiler expands a family's chain for one tensor (:mod:`layoutc.lang.compiler`).
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from ..front import ast
from ..front.errors import Diagnostic, SpecError

ROLES = ("weight", "scale", "bias")
PRELUDE = "prelude.lyt"


@attrs.frozen
class Role:
    role: str
    tensor: str  # the body's name for the tensor it packs
    elem: str | None  # the element type it requires, if any
    axes: tuple[str | None, ...] | None  # trailing axis names (None = the leading '...'), or None
    body: tuple[Any, ...]  # ast items
    pos: ast.Pos


@attrs.frozen
class Family:
    name: str
    params: tuple[tuple[str, int], ...]  # parameters and their defaults
    roles: tuple[Role, ...]
    pos: ast.Pos
    filename: str  # where it is defined: the prelude, an imported file, or the spec itself
    source: str
    sha256: str  # of that file (a family's text is part of the identity of specs that use it)

    def role(self, name: str) -> Role | None:
        return next((r for r in self.roles if r.role == name), None)

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(r.role for r in self.roles)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.params)

    def where(self, pos: ast.Pos | None = None) -> str:
        p = pos or self.pos
        return f"{Path(self.filename).name}:{p.line}"


def from_ast(d: ast.FamilyDef, spec: ast.Spec) -> tuple[Family, list[Diagnostic]]:
    """A family from its definition, with the problems found in its shape (not yet in its body's
    ops: those are bound against each tensor the family packs)."""
    errors = []
    seen_params: set[str] = set()
    for name, _ in d.params:
        if name.text in seen_params:
            errors.append(Diagnostic("error", f"family parameter {name.text!r} is declared twice", name.pos))
        seen_params.add(name.text)
    roles = []
    for r in d.roles:
        if r.role.text not in ROLES:
            errors.append(Diagnostic("error", f"{r.role.text!r} is not a tensor role", r.role.pos,
                                     f"roles: {', '.join(ROLES)} (a tensor's tie decides its role)"))
            continue
        if any(x.role == r.role.text for x in roles):
            errors.append(Diagnostic("error", f"family {d.name.text} defines the {r.role.text} role twice", r.role.pos))
            continue
        axes = None
        if r.axes is not None:
            names = [a.text for a in r.axes if a is not None]
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup:
                errors.append(Diagnostic("error", f"axis name {dup!r} is used twice", r.pos))
            clash = next((n for n in names if n in seen_params), None)
            if clash:
                errors.append(Diagnostic("error", f"axis name {clash!r} is also a family parameter", r.pos))
            axes = tuple(None if a is None else a.text for a in r.axes)
        for item in r.body:
            if not isinstance(item, (ast.Transform, ast.If)):
                what = type(item).__name__.lower()
                errors.append(Diagnostic("error", f"a family's role body holds transforms (and 'if' on the family's "
                                                  f"parameters), not a {what}", getattr(item, "pos", r.pos)))
        roles.append(Role(r.role.text, r.tensor.text, r.elem.text if r.elem else None, axes, r.body, r.pos))
    if not roles and not errors:
        errors.append(Diagnostic("error", f"family {d.name.text} packs no role", d.pos,
                                 "define at least one of weight(t) { ... }, scale(t) { ... }, bias(t) { ... }"))
    fam = Family(d.name.text, tuple((n.text, v) for n, v in d.params), tuple(roles), d.pos, spec.filename,
                 spec.source, spec.sha256)
    return fam, errors


def families_of(spec: ast.Spec, allow_other: bool = False) -> list[Family]:
    """The families a parsed file defines; with ``allow_other`` False, anything else in it is an error
    (the prelude and imported files hold families only)."""
    out, errors = [], []
    for item in spec.items:
        if isinstance(item, ast.FamilyDef):
            fam, problems = from_ast(item, spec)
            errors += problems
            if any(f.name == fam.name for f in out):
                errors.append(Diagnostic("error", f"family {fam.name} is defined twice", item.name.pos))
            out.append(fam)
        elif not allow_other:
            errors.append(Diagnostic("error", "a file of families holds only 'family' definitions",
                                     getattr(item, "pos", None)))
    if errors:
        raise SpecError(errors, spec.filename, spec.source)
    return out


@functools.lru_cache(maxsize=1)
def prelude_text() -> str:
    return resources.files("layoutc.lang").joinpath(PRELUDE).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def prelude() -> tuple[Family, ...]:
    """The built-in families, defined in the spec language (``layoutc/lang/prelude.lyt``)."""
    from ..front.parse import parse

    return tuple(families_of(parse(prelude_text(), f"<layoutc>/{PRELUDE}")))


def prelude_sha256() -> str:
    """Part of every spec's identity: the same spec means another thing with another prelude."""
    from ..front.source import sha256

    return sha256(prelude_text())


@functools.lru_cache(maxsize=64)
def _load(name: str, text: str) -> tuple[Family, ...]:
    from ..front.parse import parse

    return tuple(families_of(parse(text, name)))


def load_import(path: str, tree) -> tuple[tuple[Family, ...], str]:
    """(families, content sha256) of ``import "path"`` read from ``tree`` (:mod:`layoutc.front.tree`).
    ValueError for a path the tree refuses, SpecError for a file with errors."""
    from ..front.source import sha256

    loaded = tree.read(path)
    return _load(loaded.name, loaded.text), sha256(loaded.text)


def is_family_file(spec: ast.Spec) -> bool:
    """A file that only defines families (one a spec imports), rather than a spec."""
    return bool(spec.items) and all(isinstance(i, ast.FamilyDef) for i in spec.items)


def check_file(spec: ast.Spec) -> list[Family]:
    """The families of a file of families, checked on their own: their shape (roles, parameters,
    axis names) and that no name is taken by the prelude, as a spec importing the file would find.
    Raises :class:`SpecError`."""
    found = families_of(spec)
    builtin = {f.name for f in prelude()}
    clashes = [Diagnostic("error", f"family {f.name} is already defined (layoutc's prelude)", f.pos,
                          "give this one another name") for f in found if f.name in builtin]
    if clashes:
        raise SpecError(clashes, spec.filename, spec.source)
    return found
