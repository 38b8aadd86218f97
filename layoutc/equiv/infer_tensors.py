"""Explaining one tensor's measured sources (``infer`` steps 1 to 4): packing families, then axes, then values.

:func:`search_tensor` tries each combination of the prelude's packing families for the tensor's role
(:func:`_family_candidates`), inverts the family's map on the measured sources (:func:`_peel_family`), and
explains the logical residual per axis with :mod:`layoutc.equiv.infer_axes`; a changed element type becomes a
``cast`` or a ``view``. The best explanation is a :class:`~layoutc.equiv.infer_axes.TensorChain`.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Mapping, Sequence

import attrs
import torch

from ..algebra import expr as ex
from ..algebra.dtypes import ELEMENT_TYPES, ElemType, torch_dtype_name
from .encoding import UNEXPLAINED
from ..algebra.indexmap import compose_all, drop_bit_axis, lift_to_bits, source_indices
from ..lang.ops import TensorType
from .infer_axes import _U8, AxisSearch, Stmt, TensorChain, _goal, _Pad, periodic_table
from .infer_measure import Sample


# -- packings --


def _families():
    from ..lang.families import prelude

    return prelude()


def _family_candidates(role: str, out_shape: Sequence[int], elem: ElemType | None = None) -> list[tuple[str, dict]]:
    """The prelude's families with a chain for ``role``, each parameter at its default and a few common values
    (the output's last size too: a block); parameter values that give the same map are kept once."""
    out = []
    for fam in _families():
        if fam.role(role) is None:
            continue
        if not fam.params:
            out.append((fam.name, {}))
            continue
        values = []
        for name, default in fam.params:
            cands = [default] + [v for v in (64, 128, 32, 256, 16, out_shape[-1] if out_shape else 0)
                                 if v and v != default]
            values.append([(name, v) for v in dict.fromkeys(cands)])
        seen = set()
        for combo in itertools.product(*values):
            sig = _signature(fam.name, role, dict(combo), elem)
            if sig is not None and sig in seen:
                continue
            seen.add(sig)
            out.append((fam.name, dict(combo)))
    return out


def _signature(name: str, role: str, params: Mapping[str, int], elem: ElemType | None):
    """The family's map on a small fixed shape (None when it does not apply there)."""
    shape = (1, 512) if role == "bias" else (1, 512, 256)
    try:
        steps = _family_steps(name, role, elem or _U8, [ex.Const(v) for v in shape], params)
        m = compose_all([st.op.index_map(st.in_type) for st in steps])
        lin, valid, _ = source_indices(m, {})
        return (tuple(lin.shape), hash(tuple(torch.where(valid, lin, -1).reshape(-1)[::7].tolist())))
    except Exception:  # noqa: BLE001
        return None


def _family_text(name: str, params: Mapping[str, int]) -> str:
    return name + (f"({', '.join(f'{k}={v}' for k, v in params.items())})" if params else "")


def _family_steps(name: str, role: str, elem: ElemType, shape: Sequence[ex.Expr], params):
    from ..lang.expand import family_chain

    names = set().union(*(ex.free_vars(e) for e in shape)) if shape else set()
    return family_chain(name, role, TensorType(elem, tuple(shape)), params, names, _families())


def _pre_shape(name, role, elem, params, out_shape: Sequence[int], rank: int) -> tuple[int, ...] | None:
    """The input shape (of ``rank`` axes) the family maps to ``out_shape``: solved from the family's
    symbolic output shape; a size it rounds up is taken as already whole."""
    named = 1 if role == "bias" else 2
    lead = rank - named
    if lead < 0 or lead > len(out_shape):
        return None
    unknown = [ex.Var(f"_a{k}") for k in range(named)]
    shape = [ex.Const(v) for v in out_shape[:lead]] + unknown
    try:
        steps = _family_steps(name, role, elem, shape, params)
    except Exception:  # noqa: BLE001 - the family does not apply to this role/type
        return None
    outs = steps[-1].out_type.shape if steps else tuple(shape)
    if len(outs) != len(out_shape):
        return None
    env: dict[str, int] = {}
    for e, v in zip(outs, out_shape):
        names = ex.free_vars(e)
        if len(names) != 1:
            continue
        form = ex.linear_form(e)
        var = next(iter(names))
        if form is not None and var not in env:
            coef, const = form
            c = coef.get(var)
            if c:
                x = (v - const) / c
                if x.denominator == 1 and x > 0:
                    env[var] = int(x)
    for e, v in zip(outs, out_shape):  # round_up(a, m): a size already whole
        names = ex.free_vars(e)
        if len(names) == 1 and next(iter(names)) not in env and isinstance(e, ex.Mul):
            env[next(iter(names))] = v
    if len(env) != named:
        return None
    try:
        if tuple(int(ex.evaluate(e, env)) for e in outs) != tuple(out_shape):
            return None
    except Exception:  # noqa: BLE001
        return None
    return tuple(out_shape[:lead]) + tuple(env[u.name] for u in unknown)


def _peel_family(codes: torch.Tensor, bits: bool, width: int, name, role, elem, params, rank: int):
    """Undo one family on measured codes: (codes before it, its input shape) or None."""
    out_shape = tuple(codes.shape[:-1]) if bits else tuple(codes.shape)
    pre = _pre_shape(name, role, elem, params, out_shape, rank)
    if pre is None:
        return None
    try:
        steps = _family_steps(name, role, elem, [ex.Const(v) for v in pre], params)
        m = compose_all([s.op.index_map(s.in_type) for s in steps])
    except Exception:  # noqa: BLE001
        return None
    if bits:
        m = m if m.bit_level else lift_to_bits(m, width)
        in_shape = pre + (width,)
    else:
        if m.bit_level:
            m = drop_bit_axis(m)
            if m is None:
                return None
        in_shape = pre
    try:  # a family whose sizes do not divide this pre-shape (an empty group) does not apply here
        if tuple(int(ex.evaluate(s, {})) for s in m.out_shape) != tuple(codes.shape):
            return None
        linear, valid, fill = source_indices(m, {})
    except (ZeroDivisionError, RuntimeError):
        return None
    numel = math.prod(in_shape)
    placed = linear[valid]
    if placed.numel() != numel or bool((torch.bincount(placed, minlength=numel) != 1).any()):
        return None
    if bool((codes[~valid] != -(fill[~valid] + 1)).any()):
        return None
    before = torch.empty(numel, dtype=torch.int64)
    before[placed] = codes[valid]
    return before.reshape(in_shape), pre


# -- residuals --


def _element_sources(codes: torch.Tensor, bits: bool, enc) -> tuple[torch.Tensor, int] | None:
    """Codes -> (input element index or -1 for padding, padding value), when every element is a whole
    copy of one input element of its own tensor (bit b from bit b) or a constant."""
    if bits:
        w = enc.width
        local = codes - enc.offset
        real = codes >= 0
        const = (codes < 0) & (codes != UNEXPLAINED)
        ok_real = real.all(-1) & (local >= 0).all(-1) & (local < enc.size).all(-1)
        elem = torch.div(local[..., 0], w, rounding_mode="floor")
        ok_real &= (local == elem.unsqueeze(-1) * w + torch.arange(w)).all(-1)
        is_const = const.all(-1)
        if not bool((ok_real | is_const).all()):
            return None
        values = (((-codes - 1).clamp(min=0) & 1) << torch.arange(w)).sum(-1)
        pads = values[is_const]
        pad_value = int(pads[0]) if pads.numel() else 0
        if pads.numel() and not bool((pads == pad_value).all()):
            return None
        return torch.where(ok_real, elem, -1), pad_value
    local = codes - enc.offset
    real = (codes >= 0) & (local >= 0) & (local < enc.size)
    const = (codes < 0) & (codes != UNEXPLAINED)
    if not bool((real | const).all()):
        return None
    pads = -codes[const] - 1
    pad_value = int(pads[0]) if pads.numel() else 0
    if pads.numel() and not bool((pads == pad_value).all()):
        return None
    return torch.where(real, local, -1), pad_value


def _axis_functions(lin: torch.Tensor, in_shape: Sequence[int]) -> list[torch.Tensor] | None:
    """Per axis, output index -> input index (-1: all padding) when each axis moves by itself."""
    if lin.dim() != len(in_shape):
        return None
    valid = lin >= 0
    coords, rem = [], lin.clamp(min=0)
    for size in reversed(in_shape):
        coords.append(rem % size)
        rem = torch.div(rem, size, rounding_mode="floor")
    coords.reverse()
    fs = []
    for a in range(lin.dim()):
        src = torch.where(valid, coords[a], -1).movedim(a, 0).reshape(lin.shape[a], -1)
        value = src.amax(dim=1) if src.shape[1] else torch.full((lin.shape[a],), -1)
        if not bool(((src == value[:, None]) | (src == -1)).all()):
            return None
        fs.append(value)
    grids = torch.meshgrid(*[f >= 0 for f in fs], indexing="ij")
    expect = grids[0]
    for g in grids[1:]:
        expect = expect & g
    if not torch.equal(expect, valid):
        return None
    return fs


def _elem_of(dtype: torch.dtype, base: ElemType) -> ElemType | None:
    if dtype in base.accepted_torch_dtypes():
        return base
    name = torch_dtype_name(dtype)
    return next((e for e in ELEMENT_TYPES.values() if e.canonical == name), None)


class _Candidate:
    """One combination of packing families for a tensor, with the logical residual it leaves."""

    def __init__(self, tensor, samples: Sequence[Sample], combo, bits: bool, rank: int, row: int,
                 memo: dict | None = None):
        memo = {} if memo is None else memo
        self.combo = combo
        self.axes: list[AxisSearch] | None = None
        self.pad_value = 0
        self.row = row
        name, role, elem = tensor.name, tensor.role, tensor.elem
        # the smallest sample first: a combination that does not fit is rejected cheaply
        order = sorted(range(len(samples)), key=lambda i: samples[i].codes[name].numel())
        srcs: list = [None] * len(samples)
        funcs: list = [None] * len(samples)
        for i in order:
            s = samples[i]
            codes = s.codes[name]
            width = s.plan.inputs[name].width
            for j in range(len(combo) - 1, -1, -1):
                key = (i, tuple((f, tuple(sorted(p.items()))) for f, p in combo[j:]))
                if key not in memo:
                    fam, params = combo[j]
                    peeled = _peel_family(codes, bits, width, fam, role, elem, params, rank)
                    memo[key] = None if peeled is None else peeled[0]
                codes = memo[key]
                if codes is None:
                    return
            srcs[i] = _element_sources(codes, bits, s.plan.inputs[name])
            if srcs[i] is None:
                return
            funcs[i] = _axis_functions(srcs[i][0], s.plan.inputs[name].shape)
            if funcs[i] is None:
                return
        self.pad_value = srcs[0][1]
        axes = []
        for axis in range(rank):
            fs = [f[axis] for f in funcs]
            ns = [s.plan.inputs[name].shape[axis] for s in samples]
            if axis == 0 and rank > 1 and not _goal(fs, ns):
                return  # experts moved: not a layout of this kind
            axes.append(AxisSearch(fs, ns, perms=(axis == row)))
        self.axes = axes

    def statements(self, depth: int, deadline: float) -> list[Stmt] | None:
        """Logical statements (at most ``depth`` in all) before the families, or None."""
        if self.axes is None:
            return None
        stmts: list[Stmt] = []
        for axis, search in enumerate(self.axes):
            chain = search.upto(depth - len(stmts), deadline)
            if chain is None:
                return None
            for m in chain:
                st = m.stmt(axis)
                if isinstance(m, _Pad) and self.pad_value:
                    st = attrs.evolve(st, text=st.text[:-1] + f", value={self.pad_value})")
                stmts.append(attrs.evolve(st, kind="row" if axis == self.row else "k"))
        return stmts

    def table(self) -> list[Stmt] | None:
        """The fallback: row ops where they suffice, else the row permutation as a repeating table."""
        if self.axes is None:
            return None
        stmts: list[Stmt] = []
        for axis, search in enumerate(self.axes):
            chain = search.found
            if chain is None and _goal(search.fs, search.ns):
                chain = []
            if chain is None:
                table = periodic_table(search.fs) if axis == self.row else None
                if table is None:
                    return None
                stmts.append(Stmt(f"permute({{t}}, dim={axis}, table={table})", "table", axis=axis))
                continue
            stmts += [attrs.evolve(m.stmt(axis), kind="row" if axis == self.row else "k") for m in chain]
        return stmts


def search_tensor(tensor, samples: Sequence[Sample], budget: float = 30.0, prefer: Sequence[str] = ()) -> TensorChain:
    """Statements that give ``tensor``'s measured maps at every sample. ``prefer``: the packing families
    of the weight a scale is tied to, in order; of two family orders that both reproduce the scale's map
    (a row shuffle and a block interleave can commute at the sampled sizes), the one that starts as the
    weight's does is taken, so that the verifier can follow the scale's rows along its weight's."""
    name, role, elem = tensor.name, tensor.role, tensor.elem
    rank = len(tensor.shape)
    from ..verify.rowmap import row_axis

    row = row_axis(tensor)
    mode = samples[0].plan.inputs[name].mode
    bits = mode == "bits"
    out_dtype = samples[0].dtypes[name]
    out_elem = _elem_of(out_dtype, elem)
    if out_elem is None:
        return TensorChain(name, (), False, f"{name}: the function returns {out_dtype}, which no layoutc type carries")
    tail: list[Stmt] = []
    value: list[Stmt] = []
    if out_elem != elem:
        if mode == "values":
            value.append(Stmt(f"cast({{t}}, {out_elem.name})", "value"))
        elif out_elem.bits == elem.bits:
            tail.append(Stmt(f"view({{t}}, {out_elem.name})", "view"))
        else:
            return TensorChain(name, (), False, f"{name}: {elem.name} -> {out_elem.name} changes the element width "
                                                f"without converting values; not inferred")
    out_shape0 = tuple(samples[0].shapes[name])
    combos: list[list[tuple[str, dict]]] = [[]]
    singles = _family_candidates(role, out_shape0, elem)
    combos += [[f] for f in singles]
    combos += [[a, b] for a in singles for b in singles if a[0] != b[0]]
    deadline = time.perf_counter() + budget
    memo: dict = {}
    cands = [c for c in (_Candidate(tensor, samples, combo, bits, rank, row, memo) for combo in combos)
             if c.axes is not None]

    def chain_of(cand: _Candidate, stmts: list[Stmt], named: bool) -> TensorChain:
        fams = [Stmt(f"interleave({{t}}, {fam}{''.join(f', {k}={v}' for k, v in params.items())})", "family",
                     family=_family_text(fam, params), op=("family", fam, tuple(params.items())))
                for fam, params in cand.combo]
        note = "" if named else f"{name}: a row order no registered op gives; written as a table"
        return TensorChain(name, tuple(stmts + value + fams + tail), named, note)

    def rank_of(cand: _Candidate) -> tuple[int, int]:
        texts = [_family_text(fam, params) for fam, params in cand.combo]
        shared = next((i for i, (a, b) in enumerate(zip(texts, prefer)) if a != b), min(len(texts), len(prefer)))
        return len(cand.combo), -shared

    # Iterative deepening across the family combinations: every combination at 0 logical statements,
    # then at 1, ...; the first depth with a solution wins, the fewest families breaking ties (a kernel
    # packing reads better than the row ops that may happen to give the same order at one more step).
    for depth in range(5):
        best = None
        for cand in cands:
            stmts = cand.statements(depth, deadline)
            if stmts is not None and (best is None or rank_of(cand) < rank_of(best[0])):
                best = (cand, stmts)
        if best is not None:
            return chain_of(best[0], best[1], True)
        if time.perf_counter() > deadline:
            break
    for cand in cands:
        stmts = cand.table()
        if stmts is not None:
            return chain_of(cand, stmts, False)
    return TensorChain(name, (), False, f"{name}: no chain of registered ops, families or a per-axis table gives "
                                        f"the function's map; write its statements by hand")
