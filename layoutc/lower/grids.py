"""Broadcast grids for the planner's checks on small instances of the dims.

A plan's claim (a run reads a run, a run's sources lie fixed steps apart) is an identity between index
expressions; the planner checks it by evaluating both sides over every output coordinate of a few small
instances at once: each ``o<axis>`` becomes an ``arange`` shaped to broadcast along its axis.
"""

from __future__ import annotations

from typing import Sequence

from ..algebra import expr as ex


def grid_env(shape: Sequence[int], dims: dict) -> dict:
    """The dims and ``o0, o1, ...`` as broadcasting ``arange`` grids over ``shape``."""
    import torch

    env = dict(dims)
    for axis, n in enumerate(shape):
        view = [1] * len(shape)
        view[axis] = n
        env[f"o{axis}"] = torch.arange(n).view(view)
    return env


def evaluate(e: ex.Expr, env: dict):
    """``e`` over the grids of ``env`` (a tensor, also where ``e`` is a constant)."""
    import torch

    return torch.as_tensor(ex.evaluate(e, env))
