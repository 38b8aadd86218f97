"""Measuring a black-box function for ``infer``: which sizes it accepts, and what each output holds.

:func:`probe_periods` finds the multiples the function requires of each dim, :func:`_sample_dims` the shapes it
is measured at, and :func:`_measure` runs it there on the self-describing inputs of
:mod:`layoutc.equiv.encoding`, giving a :class:`Sample` (per output, the input element or bit each element
holds). Kept apart from the search, which only reads samples.
"""

from __future__ import annotations

from typing import Mapping

import attrs
import torch

from ..algebra import expr as ex
from .encoding import UNEXPLAINED, Plan, observe
from .function_runner import FunctionFailed, Target
from ..algebra.indexmap import concrete_shape


# ---------------------------------------------------------------------------
# measuring


@attrs.frozen
class Sample:
    dims: dict
    plan: Plan
    codes: dict  # output name -> codes (see layoutc.equiv.compare)
    shapes: dict
    dtypes: dict


def _entries(program, dims, modes) -> list:
    out = []
    for t in program.inputs:
        out.append((t.name, concrete_shape(t.shape, dims), t.elem, modes.get(t.name, "elements"), ()))
    return out


def _zeros(program, dims) -> dict:
    return {t.name: torch.zeros(concrete_shape(t.shape, dims), dtype=t.elem.torch_dtype) for t in program.inputs}


def _contract_ok(program, env: Mapping[str, int]) -> bool:
    for t in program.inputs:
        for num, den, _ in t.divisions:
            if ex.evaluate(num, env) % ex.evaluate(den, env):
                return False
        if any(ex.evaluate(s, env) <= 0 for s in t.shape):
            return False
    return all(env.get(a.dim, 0) % a.multiple == 0 and env.get(a.dim, 0) >= a.minimum for a in program.assumptions) \
        and all(a.holds(env) for a in program.size_assumptions)


def _runs(target: Target, program, env, params) -> bool:
    try:
        target.call(_zeros(program, env), params, f"at {env}")
        return True
    except FunctionFailed:
        return False


def probe_periods(target: Target, program, given: Mapping[str, int], params) -> tuple[dict, dict]:
    """Per dim: the step between sizes the contract allows (its shapes divide), and the step between
    sizes the function accepts (a multiple of the first: ``assume`` lines when larger)."""
    contract, function = {}, {}
    for d in program.dims:
        p = next((p for p in range(1, 4097) if _contract_ok(program, {**given, d: given[d] + p})
                  and _contract_ok(program, {**given, d: given[d] + 2 * p})), 1)
        contract[d] = p
        steps = [p]
        while given[d] % (steps[-1] * 2) == 0 and steps[-1] * 2 <= 4096:
            steps.append(steps[-1] * 2)
        ok = None
        for q in reversed(steps):
            if not _runs(target, program, {**given, d: given[d] + q}, params):
                break
            ok = q
        function[d] = ok if ok is not None else steps[-1] * 2
    return contract, function


def _measure(target: Target, program, env, params, modes: dict) -> Sample:
    where = "at " + ", ".join(f"{k}={v}" for k, v in env.items())
    plan = Plan(env, _entries(program, env, modes))
    obs = observe(target, plan, params, where)
    loose = [n for n, e in plan.inputs.items() if e.mode == "elements" and n in obs.codes
             and bool((obs.codes[n] == UNEXPLAINED).any())]
    if loose:
        for n in loose:
            modes[n] = "bits"
        plan = Plan(env, _entries(program, env, modes))
        obs = observe(target, plan, params, where)
    return Sample(dict(env), plan, obs.codes, obs.shapes, obs.dtypes)


def _modes(program, dtypes: Mapping[str, torch.dtype]) -> dict:
    """Probe a tensor by its values (digits that survive a cast) where the function changes its element
    width; else by its elements' bits."""
    modes = {}
    for t in program.inputs:
        d = dtypes.get(t.name)
        if d is None:
            continue
        width = torch.empty((), dtype=d).element_size() * 8
        modes[t.name] = "elements" if width == t.elem.bits else "values"
    return modes


def _sample_dims(target, program, given, contract_p, function_p, params) -> list[dict]:
    """The given dims, every dim one step larger (a size the function accepts that is rarely a round
    number), and every dim a few steps larger with one expert: pads and groups differ between them."""
    step = {d: max(contract_p[d], function_p[d]) for d in program.dims}
    out = [dict(given)]
    for make in (lambda d, k: given[d] + k * step[d], lambda d, k: given[d] + (k + 2) * step[d]):
        for k in (1, 3, 2, 5):
            env = {d: (given[d] if d == "E" else make(d, k)) for d in program.dims}
            if len(out) == 2 and "E" in env:
                env["E"] = 1
            if env not in out and _contract_ok(program, env) and _runs(target, program, env, params):
                out.append(env)
                break
    return out
