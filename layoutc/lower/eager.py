"""Eager lowering: a chain becomes one torch call per statement (the reference lowering).

Each step calls the op's function from :mod:`layoutc.lang.ops.torch_impl` with its
arguments rendered as Python source; size expressions refer to the dims, which
generated code binds as local variables. The generated line carries the spec
line it comes from, so a reader can walk the spec and the converter side by side.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..algebra import expr as ex
from ..lang.compiler import Chain
from ..front.text import comment


def render(value: Any) -> str:
    """Python source for an op argument."""
    if isinstance(value, bool) or isinstance(value, int):
        return repr(value)
    if isinstance(value, ex.Expr):
        return ex.to_python(value)
    if isinstance(value, torch.dtype):
        return "torch." + str(value).removeprefix("torch.")
    if isinstance(value, tuple):
        inner = ", ".join(render(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if hasattr(value, "source"):  # an index formula: a lambda over an arange
        return value.source()
    raise TypeError(f"cannot render op argument {value!r}")


def evaluate_arg(a: Any, dims: dict) -> Any:
    """An op argument with concrete dims: sizes as ints, index formulas as functions."""
    if isinstance(a, ex.Expr):
        return int(ex.evaluate(a, dims))
    if isinstance(a, tuple):
        return tuple(evaluate_arg(v, dims) for v in a)
    if hasattr(a, "source"):
        return eval(a.source(), {"torch": torch, **dims})  # our own generated lambda source
    return a


def run(op, t, x: torch.Tensor, dims: dict) -> torch.Tensor:
    """One op's eager function on ``x`` (of type ``t``) with concrete dims: what the probe and tools
    use to step through a chain outside a generated converter."""
    fn, args = op.impl(t)
    return fn(x, *(evaluate_arg(a, dims) for a in args))


def functions_used(chains: list[Chain]) -> list[Callable[..., Any]]:
    seen: dict[str, Callable[..., Any]] = {}
    for c in chains:
        for s in c.steps:
            fn, _ = s.op.impl(s.in_type)
            seen.setdefault(fn.__name__, fn)
    return list(seen.values())


def emit_chain(chain: Chain, filename: str, var: str = "x") -> list[str]:
    """Source lines applying ``chain`` to the tensor in ``var``, one per step."""
    lines = []
    for s in chain.steps:
        fn, args = s.op.impl(s.in_type)
        call = f"{var} = {fn.__name__}({', '.join([var] + [render(a) for a in args])})"
        origin = f"{filename}:{s.statement.pos.line}: {s.statement.text}" if s.statement else str(s.op)
        if s.tag is not None:
            origin += f"  [{s.tag.origin}]"
        elif s.statement and s.op.name != s.statement.op:
            origin += f"  [{s.op.name}]"
        lines.append(f"{call:<48}  # {comment(origin)}")  # one escaped line, whatever the spec or file name holds
    return lines
