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

from . import expr as ex
from .api import CompiledSpec
from .compiler import Chain
from .instances import sample_dims
from .indexmap import concrete_shape, source_indices
from .rowmap import axis_map, row_axis


def _matplotlib():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def small_dims(spec: CompiledSpec) -> dict:
    variant = spec.compiled.variants[-1]
    known = [(k.value, k.multiple) for c in variant.chains for k in c.constraints]
    known += [(ex.Var(a.dim), a.multiple) for a in spec.program.assumptions]
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


def draw_layout(spec: CompiledSpec, tensor: str, path: str | Path, dims: dict | None = None) -> Path:
    plt = _matplotlib()
    dims = dims or small_dims(spec)
    variant = spec.compiled.variants[-1]
    by_name = {c.tensor: c for c in variant.chains}
    main = by_name[tensor]
    weight = main.source.tie.weight if main.source.tie is not None else tensor
    group = [by_name[weight]] + [c for c in variant.chains if c.source.tie is not None and c.source.tie.weight == weight]
    n_rows = int(ex.evaluate(group[0].source.shape[row_axis(group[0].source)], dims))
    cmap = plt.get_cmap("viridis").with_extremes(under="white")
    fig, axes = plt.subplots(2, len(group), figsize=(4.2 * len(group), 7.5),
                             gridspec_kw={"height_ratios": [3, 1]}, squeeze=False)
    at = ", ".join(f"{k}={v}" for k, v in dims.items())
    fig.suptitle(f"{spec.name}: {tensor} and its tied tensors, expert 0 ({at})\ncolour = input row, white = padding")
    for col, chain in enumerate(group):
        rows = source_rows(chain, dims).float()
        ax = axes[0][col]
        ax.imshow(rows.numpy(), cmap=cmap, vmin=0, vmax=max(1, n_rows - 1), aspect="auto", interpolation="nearest")
        out = chain.target
        ax.set_title(f"{chain.tensor}\n{out.elem.name}{out.shape_str() if out else ''}", fontsize=9)
        ax.set_xlabel("last axis (memory order)")
        ax.set_ylabel("leading axes, flattened")
        logical = axis_map(chain, dims)
        strip = torch.tensor([r for r in logical.rows], dtype=torch.float32).reshape(-1, 1)
        ax2 = axes[1][col]
        ax2.imshow(strip.T.numpy(), cmap=cmap, vmin=0, vmax=max(1, n_rows - 1), aspect="auto", interpolation="nearest")
        ax2.set_yticks([])
        ax2.set_xlabel("logical output row (packings removed)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_graph(spec: CompiledSpec, path: str | Path) -> Path:
    """The transform graph: a column per tensor, a box per statement, ties dashed."""
    plt = _matplotlib()
    from matplotlib.patches import FancyBboxPatch

    chains = spec.compiled.variants[-1].chains
    depth = max(len(c.steps) for c in chains) + 2
    fig, ax = plt.subplots(figsize=(3.2 * len(chains), 1.1 * depth + 1))
    ax.set_xlim(-0.5, len(chains) - 0.5)
    ax.set_ylim(-depth + 0.3, 1)
    ax.axis("off")
    colours = {"logical": "#cde7ff", "packing": "#ffe1b3", "value": "#e3f5d6", "shape": "#eeeeee"}
    x_of = {}
    for x, chain in enumerate(chains):
        x_of[chain.tensor] = x
        boxes = [(f"{chain.tensor}\n{chain.source.elem.name}{chain.source.shape_str()}", "#ffffff")]
        for s in chain.steps:
            line = s.statement.pos.line if s.statement else "?"
            kind = "packing" if s.tag is not None else s.op.category.value
            label = f"{s.tag.family}: {s.op.name}" if s.tag is not None else s.op.name
            boxes.append((f"{label}  (line {line})", colours.get(kind, "#ffffff")))
        out = chain.target
        boxes.append((f"out {out.elem.name}{out.shape_str()}" + (f"\n{out.packing}" if out.packing else ""), "#f4f4f4"))
        for i, (label, colour) in enumerate(boxes):
            y = -i
            ax.add_patch(FancyBboxPatch((x - 0.42, y - 0.3), 0.84, 0.6, boxstyle="round,pad=0.02",
                                        fc=colour, ec="#555555", lw=0.8))
            ax.text(x, y, label, ha="center", va="center", fontsize=7)
            if i:
                ax.annotate("", xy=(x, y + 0.3), xytext=(x, y + 0.7), arrowprops={"arrowstyle": "->", "lw": 0.8})
    for chain in chains:
        tie = chain.source.tie
        if tie is not None and tie.weight in x_of:
            ax.annotate("", xy=(x_of[chain.tensor] - 0.42, 0), xytext=(x_of[tie.weight] + 0.42, 0),
                        arrowprops={"arrowstyle": "-", "ls": "--", "color": "#aa3333"})
            ax.text((x_of[chain.tensor] + x_of[tie.weight]) / 2, 0.45, tie.kind, ha="center", fontsize=7, color="#aa3333")
    ax.set_title(f"{spec.name}: transform graph (blue logical, orange kernel packing, green value; dashed: ties)", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
