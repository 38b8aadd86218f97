"""Torch source for plans: the one-pass lowerings on any device torch runs on (the CPU path).

``gather``: each tensor's plan as vectorised torch code, a pure function of a range of the first
axis (``name_part``): the index expressions evaluated on ``arange`` grids and one gather, driven
over chunks of experts. ``compiled``: the same part under ``torch.compile`` once over the whole
tensor (one loop, no index tensor in memory; compiling costs seconds per shape).
"""

from __future__ import annotations

from typing import Sequence

from .. import expr as ex
from .plan import Plan, affine_strides, bit_permutation_terms, linear

BIT_VIEWS = {8: "uint8", 16: "int16", 32: "int32", 64: "int64"}


def conversions(p: Plan, var: str, indent: str) -> list[str]:
    """Value conversions through the eager ops' own functions: one semantics (NaNs, bit fields)."""
    out = []
    for conv in p.conversions:
        kind, to = conv[0], conv[-1]
        if kind == "view":
            call = f"{var}.view(torch.{to.canonical})"
        elif kind == "cast":
            call = f"cast({var}, torch.{to.canonical})"
        else:
            fn = "extract_bits" if kind == "extract" else "insert_bits"
            call = f"{fn}({var}, {conv[1]}, {conv[2]}, torch.{to.canonical})"
        out.append(f"{indent}{var} = {call}")
    return out


def gather_function(p: Plan, name: str, dims: Sequence[str]) -> str:
    """Source of ``def name(x, d, compiled=False) -> Tensor`` computing ``p`` with torch ops."""
    t = ex.to_torch
    bind = [f"    {d} = d[{d!r}]" for d in dims]
    if p.pattern in ("copy", "affine"):
        lines = [f"def {name}(x, d, compiled=False):", *bind]
        if p.pattern == "copy":
            lines.append("    y = x.clone()" if not p.conversions else "    y = x")
        else:
            strides, offset = affine_strides(p.map)
            shape = ", ".join(ex.to_python(s) for s in p.out_shape)
            st = ", ".join(ex.to_python(s) for s in strides)
            lines.append("    x = x.contiguous()  # as_strided offsets count from the storage's start, not the tensor's")
            lines.append(f"    y = x.as_strided(({shape},), ({st},), x.storage_offset() + {ex.to_python(offset)})")
        lines += conversions(p, "y", "    ")
        lines.append("    return y.contiguous()")
        return "\n".join(lines) + "\n"
    args = ", ".join(["x"] + list(dims))
    shape = p.word_shape if p.pattern == "words" else p.out_shape
    rank = len(shape)
    sizes = [ex.to_python(s) for s in shape]
    part = [f"def {name}_part({args}, start, stop):", "    _dev = x.device"]
    bitwise = p.pattern == "gather" and not p.conversions
    if bitwise:
        part.append(f"    flat = x.contiguous().view(torch.{BIT_VIEWS[p.in_elem.bits]}).reshape(-1)  # move bits, whatever the type")
    else:
        part.append("    flat = x.contiguous().reshape(-1)")
    view0 = ", ".join(["-1"] + ["1"] * (rank - 1))
    part.append(f"    o0 = torch.arange(start, stop, device=_dev).view({view0})")
    for k in range(1, rank):
        view = ["1"] * rank
        view[k] = "-1"
        part.append(f"    o{k} = torch.arange({sizes[k]}, device=_dev).view({', '.join(view)})")
    part.append("    zero = " + " + ".join(f"o{k} * 0" for k in range(rank)) + "  # broadcasts to the full range")
    if p.pattern == "words":
        for b, (coords, valid) in enumerate(zip(p.word_sources, p.word_valid)):
            addr = f"({t(linear(coords, p.in_shape))}) + zero"
            if valid == ex.TRUE:
                part.append(f"    byte = flat[{addr}].to(torch.int64)")
            else:  # padding: read nothing there (its address may be past the input)
                part.append(f"    ok = ({t(valid)}) & (zero == 0)")
                part.append(f"    byte = torch.where(ok, flat[torch.where(ok, {addr}, 0)].to(torch.int64), 0)")
            part.append("    w = byte" if b == 0 else f"    w = w | (byte << {8 * b})")
        part.append("    r = torch.zeros_like(w)")
        for mask, shift in bit_permutation_terms(p.table):
            op = f"<< {shift}" if shift >= 0 else f">> {-shift}"
            part.append(f"    r = r | ((w & {mask:#x}) {op})")
        part.append("    return torch.where(r >= 2**31, r - 2**32, r).to(torch.int32)")
        store = "torch.int32"
    else:
        m = p.map
        part.append(f"    src = ({t(linear(m.src, p.in_shape))}) + zero")
        if m.is_total():
            part.append("    return flat[src]")
        else:
            part.append(f"    ok = ({t(m.valid)}) & (zero == 0)")
            part.append("    v = flat[torch.where(ok, src, 0)]")
            part.append(f"    return torch.where(ok, v, torch.as_tensor({t(m.fill)}, dtype=v.dtype))")
        store = f"torch.{BIT_VIEWS[p.in_elem.bits]}" if bitwise else f"torch.{p.in_elem.canonical}"
    per = " * ".join(f"({s})" for s in sizes[1:]) or "1"
    drive = [
        f"def {name}(x, d, compiled=False):",
        *bind,
        "    if compiled:",
        f"        y = _compiled({name}_part)({args}, 0, {sizes[0]})",
        "    else:",
        f"        y = torch.empty(({', '.join(sizes)},), dtype={store}, device=x.device)",
        f"        step = max(1, (1 << 22) // max(1, {per}))",
        f"        for start in range(0, {sizes[0]}, step):",
        f"            stop = min(start + step, {sizes[0]})",
        f"            y[start:stop] = {name}_part({args}, start, stop)",
    ]
    if p.pattern == "words":
        out = ", ".join(ex.to_python(s) for s in p.out_shape)
        drive.append(f"    return y.view(torch.uint8).reshape({out})")
    else:
        if p.conversions:
            drive += conversions(p, "y", "    ")
        else:
            drive.append(f"    y = y.view(torch.{p.out_elem.canonical})")
        drive.append("    return y")
    return "\n".join(part) + "\n\n\n" + "\n".join(drive) + "\n"


def compiled_function(name: str, gather: str) -> str:
    return (f"def {name}(x, d):\n"
            f"    return {gather}(x, d, compiled=True)  # torch.compile of the gather: one loop, compiled once per shape\n")
