"""The wheel a user installs: built from the checkout, installed (not editable) into a fresh venv that
reuses this environment's torch and layoutc's other dependencies (and nothing else: no flashinfer,
triton or matplotlib), then used from an empty folder: the shipped specs and the prelude are inside,
the CLI runs, and `layoutc demo NAME` works for every shipped spec.

Slow (a wheel build and a venv); tools/check_wheel.sh is the same check with a fresh torch from the
network, for a release.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT, SPECS

pytestmark = pytest.mark.slow

SHIPPED = sorted(p.stem for p in SPECS.glob("*.lyt"))


def _requirement_closure() -> list[importlib.metadata.Distribution]:
    """The installed distributions layoutc needs to run (the checkout's dependencies, with the extras they
    name, not layoutc's own extras), transitively."""
    from packaging.requirements import Requirement

    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    while todo:
        req = todo.pop()
        key = req.name.lower().replace("_", "-")
        if key in seen:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            continue
        extras = set(req.extras) | {""}
        for r in map(Requirement, dist.requires or []):
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras):
                todo.append(Requirement(str(r).split(";")[0]))  # its condition is met: follow it
        seen[key] = dist
    return list(seen.values())


def _dependency_site(folder: Path) -> Path:
    """A folder with links to the files of layoutc's dependencies only (torch reused, not reinstalled)."""
    folder.mkdir()
    for dist in _requirement_closure():
        base = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            if top.startswith("..") or top == "__pycache__" or top.endswith(".pth"):
                continue
            src, dst = base / top, folder / top
            if src.exists() and not dst.exists():
                dst.symlink_to(src)
    return folder


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The venv's bin folder, with the wheel built from this checkout installed."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    # no build isolation: this environment's setuptools, no network
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(work / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = (work / "dist").glob("layoutc-*.whl")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(work / "venv")], check=True, capture_output=True, timeout=300)
    site = next((work / "venv" / "lib").glob("python3*/site-packages"))
    (site / "reused.pth").write_text(str(_dependency_site(work / "deps")) + "\n")
    py = work / "venv" / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    return work / "venv" / "bin"


def _run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _clean(proc: subprocess.CompletedProcess) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "internal error" not in out and "Warning:" not in out, out


def test_every_package_folder_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "layoutc").rglob("__init__.py")}
    assert folders <= listed, f"packages missing from pyproject.toml: {sorted(folders - listed)}"


def test_the_wheel_holds_the_specs_and_the_prelude(installed):
    (wheel,) = (installed.parent.parent / "dist").glob("layoutc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"layoutc/specs/{n}.lyt" for n in SHIPPED} <= names
    assert {"layoutc/lang/prelude.lyt", "layoutc/front/grammar.lark", "layoutc/front/progress.py"} <= names
    assert not any(n.startswith(("tests/", "specs/")) for n in names)


def test_the_installed_package_is_the_wheel_and_has_no_extras(installed, tmp_path):
    code = ("import importlib.util, layoutc; print(layoutc.__file__);"
            "print([m for m in ('flashinfer', 'triton', 'matplotlib') if importlib.util.find_spec(m)])")
    proc = _run(installed, installed / "python", "-c", code, cwd=tmp_path)
    _clean(proc)
    where, extras = proc.stdout.splitlines()
    assert where.startswith(str(installed.parent)) and extras == "[]", proc.stdout


def test_the_cli_runs_from_an_empty_folder(installed, tmp_path):
    _clean(_run(installed, installed / "layoutc", "--version", cwd=tmp_path))
    proc = _run(installed, installed / "layoutc", "check", "flashinfer_cutlass_bf16", cwd=tmp_path)
    _clean(proc)
    # flashinfer is not installed: said once, in one line
    assert sum("not installed" in line for line in proc.stderr.splitlines()) == 1, proc.stderr
    _clean(_run(installed, installed / "layoutc", "compile", "flashinfer_cutlass_mxfp8", "-o", "conv.py",
                cwd=tmp_path))
    assert (tmp_path / "conv.py").is_file()
    proc = _run(installed, installed / "layoutc", "bench", "flashinfer_cutlass_bf16", "--shape", "E=1,I=128,H=256",
                "--reps", "1", cwd=tmp_path)
    _clean(proc)
    assert "anchor (vLLM-style)    skipped: flashinfer is not installed" in proc.stdout


@pytest.mark.parametrize("name", SHIPPED)
def test_demo_of_each_shipped_spec_from_an_empty_folder(installed, tmp_path, name):
    proc = _run(installed, installed / "layoutc", "demo", name, "--shape", "E=2,I=256,H=256", cwd=tmp_path)
    _clean(proc)
    assert "result: OK" in proc.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written where the user stands
