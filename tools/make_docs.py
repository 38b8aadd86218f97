"""``make docs``: regenerate the README's command samples, its op table and the pictures in docs/.

    python tools/make_docs.py            rewrite README.md between its sample markers, redraw docs/*.png
    python tools/make_docs.py --check    exit 1 (and say what) when README.md or a picture is stale

Every sample is the output of a command run on the repository's files, between markers in README.md:

    <!-- sample: explain -->
    ```
    ...output of the command...
    ```
    <!-- /sample -->

The table of primitives is such a sample too, written as markdown (no fence): :func:`op_table` reads
the op registry, so a new op is a new row and a stale table fails the check.
tests/test_docs.py runs the check. Text samples are compared after blanking what changes from run to
run (times in ms). A PNG's bytes depend on the matplotlib version and its fonts, so a picture is
not compared by its bytes: docs/pictures.json keeps, per picture, the sha256 of the data it draws
(:func:`layoutc.cli.draw.layout_data`, :func:`layoutc.cli.draw.graph_layout`: every pixel's input row, every
box's label and place, every tie's path); the check recomputes that data from the specs.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PICTURES = ROOT / "docs" / "pictures.json"

MARKER = re.compile(r"(<!-- sample: (?P<name>[a-z0-9_-]+) -->\n)(?P<body>.*?)(<!-- /sample -->)", re.S)


def _cli(*args: str) -> str:
    """The output (stdout and stderr) of ``layoutc ARGS`` run in-process from the repository root."""
    from click.testing import CliRunner

    from layoutc.cli.main import main

    here = os.getcwd()
    os.chdir(ROOT)
    try:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    finally:
        os.chdir(here)
    return result.output


def _spec_text() -> str:
    return (ROOT / "specs" / "flashinfer_cutlass_bf16.lyt").read_text()


def _explain() -> str:
    out = _cli("explain", "specs/flashinfer_cutlass_bf16.lyt", "--tensor", "w13_weight_scale")
    return out[out.index("w13_weight_scale  "):]  # the tensor's section, without the spec's header


def op_table() -> str:
    """The README's table of primitives, from the op registry: every op a spec can name, by category (logical,
    shape, value) in registry order, with its signature, what it does, its facts and the sizes it needs (each
    op class declares them: ``summary``, ``notes``, ``facts``, ``needs``). A new op is a new row."""
    from layoutc.lang.ops import PUBLIC, Category
    from layoutc.lang.ops.binder import describe_signature

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| op | what it does | facts | needs |", "|---|---|---|---|"]
    order = list(Category)
    for cls in sorted(PUBLIC.values(), key=lambda c: order.index(c.facts.category)):  # stable: registry order
        what = cls.summary + (f"; {cls.notes}" if cls.notes else "")
        rows.append(f"| `{describe_signature(cls)}` | {cell(what)} | {cls.facts.describe()} | {cell(cls.needs)} |")
    return "\n".join(rows) + "\n"


SAMPLES: dict[str, tuple[str | None, Callable[[], str]]] = {
    # name: (fence language, or None for markdown written as is; producer)
    "ops": (None, op_table),
    "demo": ("", lambda: _cli("demo", "specs/flashinfer_cutlass_bf16.lyt")),
    "spec": ("", _spec_text),
    "explain": ("", _explain),
    "diff": ("", lambda: _cli("diff", "specs/flashinfer_cutlass_bf16.lyt", "examples/desync_scale.lyt")),
    "check-error": ("", lambda: _cli("check", "tests/verify/corpus/bias_not_swapped.lyt")),
}

#: Pictures: file in docs/ -> (command shown in README, data function, drawing function).
PICTURE_SPECS = {
    "w13_scale_desync.png": ("layoutc draw examples/desync_scale.lyt --no-verify --tensor w13_weight -o docs/w13_scale_desync.png",
                             "examples/desync_scale.lyt", "w13_weight", False),
    "cutedsl_graph.png": ("layoutc draw specs/flashinfer_cutedsl_nvfp4.lyt --graph -o docs/cutedsl_graph.png",
                          "specs/flashinfer_cutedsl_nvfp4.lyt", None, True),
}


def normalise(text: str) -> str:
    """What may differ between two runs of the same command: times."""
    return re.sub(r"\d+(\.\d+)? ms\b", "N ms", text)


def render_samples() -> dict[str, str]:
    """Every sample as it belongs in README.md (the fenced block, without the markers)."""
    out = {}
    for name, (lang, produce) in SAMPLES.items():
        text = produce()
        if not text.endswith("\n"):
            text += "\n"
        out[name] = text if lang is None else f"```{lang}\n{text}```\n"
    return out


def _compiled(path: str, verify: bool):
    from layoutc.api import compile_source
    from layoutc.front.source import read_spec

    return compile_source(read_spec(ROOT / path), path, verify_spec=verify)


def picture_data(name: str) -> dict:
    """The data a picture draws (see the module's docstring)."""
    from layoutc.cli.draw import graph_layout, layout_data

    _, path, tensor, verify = PICTURE_SPECS[name]
    spec = _compiled(path, verify)
    return graph_layout(spec) if tensor is None else layout_data(spec, tensor)


#: docs/design.md's picture of the stages: drawn from the import graph tests/test_architecture.py reads.
STAGES_PICTURE = "stages.png"


def stage_data() -> dict:
    """The stages in layer order and every import between two of them (``a -> b``: a module of ``a``
    imports one of ``b``), read from the source as the architecture test reads it."""
    sys.path.insert(0, str(ROOT))
    from tests.test_architecture import LAYERS, import_graph, stage_of

    edges = sorted({(stage_of(m), stage_of(t)) for m, targets in import_graph().items() if m
                    for t in targets if t and stage_of(m) != stage_of(t)})
    return {"layers": [list(layer) for layer in LAYERS], "edges": [list(e) for e in edges]}


def draw_stages(data: dict, target: Path) -> None:
    """Each layer a row of boxes, lowest at the bottom; an arrow per import between stages."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    where = {}
    for row, layer in enumerate(data["layers"]):
        for col, stage in enumerate(layer):
            where[stage] = (col - (len(layer) - 1) / 2, row)
    fig, ax = plt.subplots(figsize=(9, 7))
    for a, b in data["edges"]:
        (xa, ya), (xb, yb) = where[a], where[b]
        ax.annotate("", xy=(xb, yb + 0.18), xytext=(xa, ya - 0.18),
                    arrowprops={"arrowstyle": "->", "color": "0.6", "lw": 0.7, "shrinkA": 4, "shrinkB": 4})
    for stage, (x, y) in where.items():
        folder = (ROOT / "layoutc" / stage).is_dir()
        ax.text(x, y, stage + ("/" if folder else ".py"), ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round", "fc": "#dbe9f6" if folder else "#f2f2f2", "ec": "0.4"})
    ax.set_xlim(-2.6, 2.6)
    ax.set_ylim(-0.7, len(data["layers"]) - 0.3)
    ax.axis("off")
    ax.set_title("layoutc's stages, lowest first: every import points down (make docs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)


def digest(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def flashinfer_installed() -> bool:
    try:
        importlib.metadata.version("flashinfer-python")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def stale(readme: str | None = None) -> list[str]:
    """What is out of date, in words; empty when README.md and docs/ are current."""
    readme = README.read_text() if readme is None else readme
    found = {m.group("name"): m.group("body") for m in MARKER.finditer(readme)}
    problems = [f"README.md has no sample marker for {n!r}" for n in SAMPLES if n not in found]
    problems += [f"README.md has a marker {n!r} that tools/make_docs.py does not know" for n in found if n not in SAMPLES]
    for name, body in render_samples().items():
        if name in found and normalise(found[name]) != normalise(body):
            problems.append(f"README.md sample {name!r} differs from what the command prints now")
    recorded = json.loads(PICTURES.read_text()) if PICTURES.exists() else {}
    for name in PICTURE_SPECS:
        want = recorded.get(name, {}).get("data_sha256")
        if want != digest(picture_data(name)):
            problems.append(f"docs/{name} was drawn from other data than the spec gives now")
        if not (ROOT / "docs" / name).exists():
            problems.append(f"docs/{name} is missing")
    if recorded.get(STAGES_PICTURE, {}).get("data_sha256") != digest(stage_data()):
        problems.append(f"docs/{STAGES_PICTURE} was drawn from another import graph than the source has now")
    if not (ROOT / "docs" / STAGES_PICTURE).exists():
        problems.append(f"docs/{STAGES_PICTURE} is missing")
    return problems


def write() -> None:
    from layoutc.cli.draw import draw_graph, draw_layout

    if not flashinfer_installed():
        sys.exit("make docs needs flashinfer-python (the samples show a machine with it installed): "
                 "pip install 'layoutc[flashinfer]'")
    readme = README.read_text()
    samples = render_samples()
    readme = MARKER.sub(lambda m: m.group(1) + samples.get(m.group("name"), m.group("body")) + m.group(4), readme)
    README.write_text(readme)
    recorded = {}
    for name, (command, path, tensor, verify) in PICTURE_SPECS.items():
        spec = _compiled(path, verify)
        target = ROOT / "docs" / name
        if tensor is None:
            draw_graph(spec, target)
        else:
            draw_layout(spec, tensor, target)
        recorded[name] = {"command": command, "data_sha256": digest(picture_data(name))}
    draw_stages(stage_data(), ROOT / "docs" / STAGES_PICTURE)
    recorded[STAGES_PICTURE] = {"command": "make docs", "data_sha256": digest(stage_data())}
    PICTURES.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    print(f"wrote README.md ({len(samples)} samples) and {', '.join(f'docs/{n}' for n in PICTURE_SPECS)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say what is stale (exit 1 if anything is)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.check:
        problems = stale()
        for p in problems:
            print(p)
        if problems:
            print("run: make docs")
        return 1 if problems else 0
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
