"""``requires flashinfer >= 0.6.16``: the library version a layout belongs to."""

from __future__ import annotations

import importlib.metadata

import attrs
from packaging.version import InvalidVersion, Version

from ..front.errors import Diagnostic
from .ir import Program

#: spec library name -> distribution name on PyPI
DISTRIBUTIONS = {"flashinfer": "flashinfer-python", "torch": "torch", "triton": "triton"}


@attrs.frozen
class NotInstalled(Diagnostic):
    """The warning for a library a spec requires that is not installed: the same for every spec that
    names it, so a command says it once, in one line (:func:`one_line`)."""

    library: str = ""

    def one_line(self) -> str:
        return (f"note: {self.library} is not installed, so 'requires {self.library} ...' lines are not checked "
                f"(pip install {distribution(self.library)})")


def distribution(library: str) -> str:
    return DISTRIBUTIONS.get(library, library)


def installed_version(library: str) -> str | None:
    try:
        return importlib.metadata.version(distribution(library))
    except importlib.metadata.PackageNotFoundError:
        return None


def satisfies(installed: str, op: str, wanted: str) -> bool:
    a, b = Version(installed), Version(wanted)
    if op == "~=":
        n = max(1, len(b.release) - 1)
        return a >= b and a.release[:n] == b.release[:n]
    return {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "==": a == b, "!=": a != b}[op]


def check_requires(program: Program, installed: dict[str, str | None] | None = None) -> list[Diagnostic]:
    """An error per requirement the installed library breaks, a warning per library not installed.

    ``installed`` overrides the lookup (library -> version or None), for tests and what-if checks.
    """
    out = []
    for req in program.requires:
        try:
            Version(req.version)
        except InvalidVersion:
            out.append(Diagnostic("error", f"{req.version!r} is not a version number", req.pos))
            continue
        have = installed.get(req.library) if installed is not None else installed_version(req.library)
        if have is None:
            out.append(NotInstalled(
                "warning", f"{req.library} is not installed, so 'requires {req}' cannot be checked", req.pos,
                f"pip install {distribution(req.library)}", library=req.library,
            ))
        elif not satisfies(have, req.op, req.version):
            out.append(Diagnostic(
                "error",
                f"this layout belongs to {req.library} {req.op} {req.version}, but {req.library} {have} is installed; "
                f"the kernels of {have} may expect a different layout",
                req.pos,
                "update the spec to the installed library's layout, or install a matching version",
            ))
    return out
