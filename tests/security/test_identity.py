"""A spec's identity is everything it depends on (issue 20 items 1, 4, 5; issue 21 items 3, 4).

The spec text, every imported file's content, layoutc's prelude and the parameters: SPEC_SHA256,
the provenance stamp, the compile cache and convert's run identity all change with any of them, and
with nothing else (not the folder, not the machine).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

import layoutc
from click.testing import CliRunner

from layoutc.convert.checkpoint import convert_checkpoint
from layoutc.cli.main import main
from layoutc.guard import provenance
from layoutc.registry import Registry
from tests.helpers import ROOT, SPECS

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


def cli(*args: str, cwd: Path = ROOT):
    """The command line in this process (a subprocess costs seconds of imports on a busy machine)."""
    here = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, list(args))
    finally:
        os.chdir(here)


def _folder(root: Path, family: str = FAMILY) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "fam.lyt").write_text(family)
    (root / "s.lyt").write_text(SPEC)
    return root / "s.lyt"


def _x():
    return torch.arange(2 * 8 * 3, dtype=torch.bfloat16).reshape(2, 8, 3)


def test_an_imported_file_is_part_of_the_identity(tmp_path):
    spec = _folder(tmp_path / "a")
    first = layoutc.compile_file(spec)
    (tmp_path / "a" / "fam.lyt").write_text(FAMILY.replace("r=2", "r=4"))
    second = layoutc.compile_file(spec)
    assert second.sha256 != first.sha256
    assert f"SPEC_SHA256 = {second.sha256!r}" in second.source
    stamp = provenance(second.convert({"w": _x()})["w"])
    assert stamp["sha256"] == second.sha256
    # recorded by content: the same files elsewhere are the same spec
    elsewhere = layoutc.compile_file(_folder(tmp_path / "b" / "deeper"))
    assert elsewhere.sha256 == first.sha256


@pytest.mark.slow  # two compiles of a shipped spec: seconds on the 2-core machine
def test_the_parameters_are_part_of_the_identity():
    assert layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt", {"tp_size": 2, "tp_rank": 1}).sha256 != \
        layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt").sha256


def test_compile_file_sees_a_changed_family_in_the_same_process(tmp_path):
    spec = _folder(tmp_path)
    before = layoutc.compile_file(spec).convert({"w": _x()})["w"]
    (tmp_path / "fam.lyt").write_text(FAMILY.replace("r=2", "r=4"))
    after = layoutc.compile_file(spec).convert({"w": _x()})["w"]
    assert not torch.equal(before, after)  # the new family's layout, not the cached converter of the old
    expected = _x().reshape(2, 2, 4, 3).transpose(1, 2).reshape(2, 8, 3)
    assert torch.equal(after, expected)


@pytest.mark.slow  # a conversion: seconds on the 2-core machine
def test_a_resumed_convert_after_a_family_change_is_refused(tmp_path):
    from tests.convert.test_checkpoint import folder_digest, make_checkpoint

    folder = tmp_path / "spec"
    folder.mkdir()
    (folder / "extra.lyt").write_text(FAMILY)
    text = (SPECS / "flashinfer_cutlass_bf16.lyt").read_text()
    (folder / "bf16.lyt").write_text(text.replace("\nspec flashinfer_cutlass_bf16", '\nspec flashinfer_cutlass_bf16\n'
                                                                                      'import "extra.lyt"', 1))
    spec = layoutc.compile_file(folder / "bf16.lyt")
    assert spec.program.imports == (("extra.lyt", spec.program.imports[0][1]),)
    make_checkpoint(tmp_path / "in", spec, layers=2, shards=2)
    convert_checkpoint(spec, tmp_path / "in", tmp_path / "out")
    before = folder_digest(tmp_path / "out")
    (folder / "extra.lyt").write_text(FAMILY.replace("r=2", "r=4"))  # a family the spec imports changed
    changed = layoutc.compile_file(folder / "bf16.lyt")
    with pytest.raises(layoutc.LayoutError, match="would mix two layouts"):
        convert_checkpoint(changed, tmp_path / "in", tmp_path / "out")
    assert folder_digest(tmp_path / "out") == before


def test_a_family_file_checks_on_its_own(tmp_path):
    (tmp_path / "fam.lyt").write_text(FAMILY)
    proc = cli("check", str(tmp_path / "fam.lyt"))
    assert proc.exit_code == 0 and "families myfam" in proc.stdout, proc.output
    (tmp_path / "bad.lyt").write_text(FAMILY.replace("weight(t", "wieght(t"))
    (tmp_path / "clash.lyt").write_text(FAMILY.replace("myfam", "trtllm"))
    for name, message in (("bad.lyt", "'wieght' is not a tensor role"), ("clash.lyt", "already defined")):
        proc = cli("check", str(tmp_path / name))
        assert proc.exit_code == 2 and message in proc.stderr and f"{name}:" in proc.stderr, proc.output
        assert "Traceback" not in proc.output


def test_converters_are_byte_identical_from_any_folder(tmp_path):
    one, two = _folder(tmp_path / "one"), _folder(tmp_path / "x" / "two")
    a, b = layoutc.compile_file(one).source, layoutc.compile_file(two).source
    assert a == b and str(tmp_path) not in a
    name = "flashinfer_cutlass_bf16"
    copies = []
    for folder in (tmp_path / "a", tmp_path / "deep" / "b"):
        folder.mkdir(parents=True)
        shutil.copy(SPECS / f"{name}.lyt", folder)
        out = folder / "conv.py"
        proc = cli("compile", f"{name}.lyt", "-o", str(out), cwd=folder)
        assert proc.exit_code == 0, proc.output
        copies.append(out.read_bytes())
    by_name = cli("compile", name, cwd=tmp_path).stdout.encode()
    assert copies[0] == copies[1] == by_name == layoutc.compile_file(name).source.encode()
    assert str(ROOT).encode() not in by_name and str(tmp_path).encode() not in by_name


def test_a_shipped_spec_has_one_name_everywhere(tmp_path):
    assert layoutc.compile_file("flashinfer_cutlass_bf16").sha256 == \
        layoutc.compile_file(SPECS / "flashinfer_cutlass_bf16.lyt").sha256
    assert Registry({"fi": "flashinfer_cutlass_bf16"}).spec("fi").name == "flashinfer_cutlass_bf16"
    proc = cli("diff", "flashinfer_cutlass_bf16", "flashinfer_cutlass_bf16", cwd=tmp_path)
    assert proc.exit_code == 0 and "no layout change" in proc.stdout, proc.output
    proc = cli("check", "no_such_spec", cwd=tmp_path)
    assert proc.exit_code == 2 and "flashinfer_cutlass_bf16" in proc.stderr  # the names it knows
