"""Integer expressions evaluated on Python ints or, element-wise, on integer torch tensors.
Part of :mod:`layoutc.algebra.expr`."""

from __future__ import annotations

from typing import Any, Mapping

from .expr_core import Add, And, Const, Div, Expr, FloorDiv, Lt, Mod, Mul, Table, Var, Where

# ---------------------------------------------------------------------------
# evaluation


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "dtype") and hasattr(x, "shape")


def evaluate(e: Expr, env: Mapping[str, Any]) -> Any:
    """Value of ``e`` with variables from ``env`` (ints or integer torch tensors).

    Tensors broadcast against each other, so passing ``arange`` grids evaluates a
    whole index map in one pass. Booleans come back as bool (tensors).
    """
    memo: dict[int, Any] = {}

    def go(x: Expr) -> Any:
        key = id(x)
        if key in memo:
            return memo[key]
        if isinstance(x, Const):
            r = x.value
        elif isinstance(x, Var):
            if x.name not in env:
                raise KeyError(f"no value for variable {x.name!r}")
            r = env[x.name]
        elif isinstance(x, Add):
            r = go(x.args[0])
            for a in x.args[1:]:
                r = r + go(a)
        elif isinstance(x, Mul):
            r = go(x.args[0])
            for a in x.args[1:]:
                r = r * go(a)
        elif isinstance(x, (FloorDiv, Div)):
            r = go(x.num) // go(x.den)
        elif isinstance(x, Mod):
            r = go(x.num) % go(x.den)
        elif isinstance(x, Lt):
            r = go(x.lhs) < go(x.rhs)
        elif isinstance(x, And):
            r = go(x.args[0])
            for a in x.args[1:]:
                v = go(a)
                r = (r & v) if (_is_tensor(r) or _is_tensor(v)) else (r and v)
        elif isinstance(x, Where):
            c, t, o = go(x.cond), go(x.then), go(x.other)
            if _is_tensor(c):
                import torch

                r = torch.where(c, t, o)
            else:
                r = t if c else o
        elif isinstance(x, Table):
            i = go(x.index)
            if _is_tensor(i):
                import torch

                # Clamped: a gather also evaluates its sources where the output is padding (masked later).
                r = torch.tensor(x.values, dtype=torch.int64, device=i.device)[i.clamp(0, len(x.values) - 1)]
            else:
                r = x.values[i]
        else:  # pragma: no cover - exhaustive over node kinds
            raise TypeError(f"unknown expression node {x!r}")
        memo[key] = r
        return r

    return go(e)
