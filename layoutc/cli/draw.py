"""``layoutc draw``: pictures of a layout on a small instance, and of a spec's transform graph.

Layout picture (like CuTe's layout prints): for the chosen tensor and, beside it, every tensor
tied to it, the first expert's output as stored in memory, each element coloured by the
input row it came from (padding in white). Below, a strip per tensor shows its *logical*
rows (physical packings removed) in the same colours: tied tensors in sync have identical
strips, so a desync is visible at a glance.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..algebra import expr as ex
from ..api import CompiledSpec
from ..lang.compiler import Chain
from ..algebra.instances import sample_dims
from ..algebra.indexmap import concrete_shape, source_indices
from ..verify.rowmap import axis_map, row_axis


def _matplotlib():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def small_dims(spec: CompiledSpec) -> dict:
    variant = spec.compiled.variants[-1]
    known = [(k.value, k.multiple) for c in variant.chains for k in c.constraints]
    known += spec.program.assumed
    found = sample_dims(spec.program.dims, known, per_dim=2)
    if not found:
        raise ValueError("no small instance satisfies this spec's size rules")
    return found[0]


def source_rows(chain: Chain, dims: dict) -> torch.Tensor:
    """Per output element of expert 0 (memory order, as [rows-ish, last axis]): its input row, -1 = padding."""
    m = chain.composed_map()
    linear, valid, _ = source_indices(m, dims)
    in_shape = concrete_shape(m.in_shape, dims)
    spec = chain.source
    rank = len(spec.shape)
    ra = row_axis(spec, rank)
    stride = 1
    for size in in_shape[ra + 1:]:
        stride *= size
    rows = (linear // stride) % in_shape[ra]
    rows = torch.where(valid, rows, torch.full_like(rows, -1))
    if m.bit_level:  # colour a byte by the source row of its bit 0
        rows = rows[..., 0]
    first = rows[0] if rows.dim() > 1 else rows
    return first.reshape(-1, first.shape[-1]) if first.dim() > 1 else first.reshape(-1, 1)


def layout_data(spec: CompiledSpec, tensor: str, dims: dict | None = None) -> dict:
    """What :func:`draw_layout` draws, as data: per tensor of the tie group, the input row of each element
    of expert 0 (memory order; -1 = padding) and its logical rows (packings removed)."""
    dims = dims or small_dims(spec)
    variant = spec.compiled.variants[-1]
    by_name = {c.tensor: c for c in variant.chains}
    main = by_name[tensor]
    weight = main.source.tie.weight if main.source.tie is not None else tensor
    group = [by_name[weight]] + [c for c in variant.chains if c.source.tie is not None and c.source.tie.weight == weight]
    panels = []
    for chain in group:
        out = chain.target
        panels.append({
            "tensor": chain.tensor,
            "type": f"{out.elem.name}{out.shape_str()}" if out else "",
            "rows": source_rows(chain, dims).tolist(),
            "logical": list(axis_map(chain, dims).rows),
        })
    n_rows = int(ex.evaluate(group[0].source.shape[row_axis(group[0].source)], dims))
    return {"spec": spec.name, "tensor": tensor, "dims": dict(dims), "input_rows": n_rows, "panels": panels}


def draw_layout(spec: CompiledSpec, tensor: str, path: str | Path, dims: dict | None = None) -> Path:
    """The picture of :func:`layout_data`: a panel per tensor of the tie group, a strip of logical rows
    under each, one colour scale (the colour bar: input row) and white for padding (the legend)."""
    return _save(layout_figure(spec, tensor, dims), path)


def _save(fig, path: str | Path) -> Path:
    plt = _matplotlib()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def layout_figure(spec: CompiledSpec, tensor: str, dims: dict | None = None):
    plt = _matplotlib()
    from matplotlib.patches import Patch

    data = layout_data(spec, tensor, dims)
    panels, n_rows = data["panels"], data["input_rows"]
    cmap = plt.get_cmap("viridis").with_extremes(under="white")
    norm = plt.Normalize(vmin=0, vmax=max(1, n_rows - 1))
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels) + 1.2, 7.5),
                             gridspec_kw={"height_ratios": [3, 1]}, squeeze=False)
    at = ", ".join(f"{k}={v}" for k, v in data["dims"].items())
    fig.suptitle(f"{spec.name}: {tensor} and its tied tensors, expert 0 ({at})")
    image = None
    for col, panel in enumerate(panels):
        rows = torch.tensor(panel["rows"], dtype=torch.float32)
        ax = axes[0][col]
        image = ax.imshow(rows.numpy(), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
        ax.set_title(f"{panel['tensor']}\n{panel['type']}", fontsize=9)
        ax.set_xlabel("last axis (memory order)")
        if rows.shape[-1] == 1:
            ax.set_xticks([0])
        ax.set_ylabel("leading axes, flattened")
        strip = torch.tensor(panel["logical"], dtype=torch.float32).reshape(1, -1)
        ax2 = axes[1][col]
        ax2.imshow(strip.numpy(), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
        ax2.set_yticks([])
        ax2.set_xlabel("logical output row (packings removed)")
    bar = fig.colorbar(image, ax=axes[:, -1].tolist() if len(panels) > 1 else axes[:, 0].tolist(), shrink=0.8,
                       extend="min", extendfrac=0.04)
    bar.set_label(f"input row of the element (0 .. {n_rows - 1})")
    fig.legend(handles=[Patch(facecolor="white", edgecolor="#555555", label="padding (no input element)")],
               loc="lower left", fontsize=8, frameon=False)
    return fig


#: Graph geometry, in data units (one column per tensor, one row per step).
BOX_W, BOX_H, LABEL_CHARS = 0.86, 0.62, 30


def _wrap(text: str, width: int = LABEL_CHARS) -> str:
    """Break a label at its commas and spaces so that it fits its box."""
    import textwrap

    out = []
    for part in text.split("\n"):
        out += textwrap.wrap(part, width, break_long_words=True, break_on_hyphens=False) or [""]
    return "\n".join(out)


def graph_layout(spec: CompiledSpec) -> dict:
    """What :func:`draw_graph` draws, as data: boxes (centre, label, kind) per tensor column, and each tie
    as a path that runs above the boxes (its own height per tie, so ties never cross a box or each other)."""
    chains = spec.compiled.variants[-1].chains
    boxes, x_of = [], {}
    depth = 0
    for x, chain in enumerate(chains):
        x_of[chain.tensor] = x
        labels = [(f"{chain.tensor}\n{chain.source.elem.name}{chain.source.shape_str()}", "input")]
        for s in chain.steps:
            line = s.statement.pos.line if s.statement else "?"
            kind = "packing" if s.tag is not None else s.op.category.value
            label = f"{s.tag.family}: {s.op.name}" if s.tag is not None else s.op.name
            labels.append((f"{label} (line {line})", kind))
        out = chain.target
        labels.append((f"out {out.elem.name}{out.shape_str()}" + (f"\n{out.packing}" if out.packing else ""), "output"))
        for i, (label, kind) in enumerate(labels):
            boxes.append({"x": x, "y": -i, "label": _wrap(label), "kind": kind, "tensor": chain.tensor})
        depth = max(depth, len(labels))
    ties = []
    for chain in chains:
        tie = chain.source.tie
        if tie is not None and tie.weight in x_of:
            level = len(ties)
            top = BOX_H / 2 + 0.25 + 0.3 * level
            a, b = x_of[tie.weight], x_of[chain.tensor]
            ties.append({"kind": tie.kind, "from": tie.weight, "to": chain.tensor,
                         "path": [(a, BOX_H / 2), (a, top), (b, top), (b, BOX_H / 2)]})
    return {"spec": spec.name, "columns": len(chains), "depth": depth, "boxes": boxes, "ties": ties}


COLOURS = {"input": "#ffffff", "output": "#f4f4f4", "logical": "#cde7ff", "packing": "#ffe1b3", "value": "#e3f5d6",
           "shape": "#eeeeee"}


def draw_graph(spec: CompiledSpec, path: str | Path) -> Path:
    """The transform graph of :func:`graph_layout`: a column per tensor, a box per statement, ties above."""
    return _save(graph_figure(spec), path)


def graph_figure(spec: CompiledSpec):
    plt = _matplotlib()
    from matplotlib.patches import FancyBboxPatch

    g = graph_layout(spec)
    top = max((p[1] for t in g["ties"] for p in t["path"]), default=BOX_H / 2) + 0.35
    fig, ax = plt.subplots(figsize=(3.2 * g["columns"], 1.1 * (g["depth"] + top) + 0.6))
    ax.set_xlim(-0.5, g["columns"] - 0.5)
    ax.set_ylim(-g["depth"] + 0.3, top)
    ax.axis("off")
    for b in g["boxes"]:
        x, y = b["x"], b["y"]
        ax.add_patch(FancyBboxPatch((x - BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H, boxstyle="round,pad=0.02",
                                    fc=COLOURS.get(b["kind"], "#ffffff"), ec="#555555", lw=0.8))
        ax.text(x, y, b["label"], ha="center", va="center", fontsize=7)
        if y < 0:
            ax.annotate("", xy=(x, y + BOX_H / 2), xytext=(x, y + 1 - BOX_H / 2),
                        arrowprops={"arrowstyle": "->", "lw": 0.8})
    for t in g["ties"]:
        xs, ys = zip(*t["path"])
        ax.plot(xs, ys, ls="--", color="#aa3333", lw=0.9)
        ax.text((xs[1] + xs[2]) / 2, ys[1] + 0.04, f"{t['kind']} of {t['from']}" if t["kind"] != "weight" else "",
                ha="center", va="bottom", fontsize=7, color="#aa3333")
    ax.set_title(f"{spec.name}: transform graph (blue logical, orange kernel packing, green value; dashed: ties)",
                 fontsize=9)
    fig.tight_layout()
    return fig
