"""The shipped specs: where they are, and finding one by name.

They are ``specs/*.lyt`` at the top of the repository; a wheel installs the same files as
package data in ``layoutc/specs/`` (see ``[tool.setuptools]`` in pyproject.toml). So a checkout,
an editable install and a wheel install all find them here, and the command line accepts a
shipped spec's name where a file is expected (``layoutc check flashinfer_cutlass_bf16``).
"""

from __future__ import annotations

from pathlib import Path


def _folder() -> Path:
    here = Path(__file__).resolve().parent
    installed = here / "specs"  # a wheel
    return installed if installed.is_dir() else here.parent / "specs"  # a checkout, an editable install


#: The folder of the shipped ``.lyt`` specs.
SPECS = _folder()


def names() -> list[str]:
    """The shipped specs' names (file names without ``.lyt``)."""
    return sorted(p.stem for p in SPECS.glob("*.lyt"))


def find(name: str) -> Path | None:
    """The shipped spec called ``name`` (``flashinfer_cutlass_bf16`` or ``flashinfer_cutlass_bf16.lyt``),
    or None. Only plain names are looked up: anything with a folder in it is a path, not a name."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    path = SPECS / (name if name.endswith(".lyt") else name + ".lyt")
    return path if path.is_file() else None


def locate(spec: str | Path) -> Path:
    """Where a spec argument points, the one rule for every command and API that takes a spec: an
    existing path is that file; otherwise a shipped spec's name (``flashinfer_cutlass_bf16``) is the
    shipped file; otherwise the path as given (reading it reports what is wrong)."""
    path = Path(spec)
    if path.exists():
        return path
    found = find(str(spec))
    return found if found is not None else path


def unknown(spec: str | Path) -> str:
    """Why ``spec`` names no spec, for a message: no such file (or a folder), and no shipped spec of that name."""
    path = Path(spec)
    if path.is_symlink():
        return "a symlink that leads to no file (a loop, or its target is missing)"
    what = "is a folder" if path.is_dir() else "no such file"
    return f"{what}, and no shipped spec has that name (shipped: {', '.join(names())})"
