"""``layoutc infer``: recover the index maps of a black-box conversion function and write a spec for it.

An engine migrating to layoutc has conversion code, not specs. ``infer`` runs that code on the same
self-describing inputs as ``layoutc equiv`` (:mod:`layoutc.equiv.compare`), at a few shapes, and reads back,
for every output element (bit, where bits move), the input element it holds. Then, per tensor:

1. *Packings.* The output is peeled of kernel packing families (the prelude's ``sm90_mixed``,
   ``sf_128x4``, ``trtllm(epilogue_tile)``, ``block_layout(block_k)``; one or two of them, for the
   tensor's role): the family's map at the concrete shape is inverted on the measured sources (each
   element the family places is put back), which must leave every element accounted for exactly once.
2. *Logical moves.* What remains must keep the tensor's axes and move each axis by itself (the
   experts stay). Each axis's function (output row -> input row, padding) is explained as a short
   chain of the registered row ops (``swap_halves``, ``swap_pairs``, ``reorder_gated_rows``,
   ``interleave_rows(group)``, ``deinterleave(group)``) and ``pad(multiple, parts)``, found by an
   iterative-deepening search that peels the last op, on all sampled shapes at once: the dims are
   sampled (the given ones, one period more, twice as large) so that size-dependent formulas
   (``pad`` to 64 or to 128, a 64-row group or a half) are told apart.
3. *Values.* A changed element type is a ``cast`` (values survived, bits did not) or a ``view``.
4. *Fallback.* An axis no chain explains gets an explicit ``permute(t, dim=d, table=[...])`` when its
   permutation repeats with a period at every sampled shape, flagged in a comment for the reviewer;
   anything else is reported, not guessed.

The checkpoint contract (names, element types, shapes, ties, row order) comes from ``--names vllm``
(vLLM's FusedMoE names, for ``--quant mxfp4 | nvfp4 | fp8_block | bf16``, ``--rows contiguous |
gpt_oss | single``, ``--bias``) or from ``--inputs FILE`` (a spec fragment: ``dims``, ``assume``,
``param`` and ``input`` lines). Scale ties missing there are proposed where a scale's rows follow a
weight's. Sizes the function rejects become ``assume`` lines. The output declarations (types, row
order, packings) are read off the chains. The written spec is then verified and proved equal to the
function with ``equiv``.

Importing the function's module runs its code, as with ``equiv --against``.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any, Callable, Mapping, Sequence

import attrs
import torch

from ..algebra import expr as ex
from ..algebra.dtypes import ELEMENT_TYPES, ElemType, torch_dtype_name
from .compare import UNEXPLAINED, EquivError, FunctionAborted, FunctionFailed, Plan, Result, Target, _threads, as_target, equivalent, observe
from ..algebra.indexmap import compose_all, concrete_shape, drop_bit_axis, lift_to_bits, source_indices
from ..lang.ops import REGISTRY, TensorType
from ..front.text import char_name, comment, display, forbidden
from .usercode import CALL_TIMEOUT

# ---------------------------------------------------------------------------
# the checkpoint contract

#: --names vllm: vLLM FusedMoE parameter names per checkpoint format: (weight type, scale type,
#: w13 scale shape, w2 scale shape, tie)
_VLLM = {
    "mxfp4": ("fp4x2", "e8m0", "H/32", "I/32", "block 32"),
    "nvfp4": ("fp4x2", "e4m3", "H/16", "I/16", "block 16"),
    "fp8_block": ("e4m3", "f32", None, None, "block 128x128"),
    "bf16": ("bf16", None, None, None, None),
}
QUANTS = tuple(_VLLM)
ROWS = ("contiguous", "gpt_oss", "single")


def vllm_contract(quant: str, rows: str = "contiguous", bias: bool = False) -> str:
    """The ``dims``/``input`` lines of a vLLM FusedMoE layer of this format (``rows``: w13 stored
    [w1; w3], interleaved gpt-oss style, or a single shard for non-gated activations)."""
    if quant not in _VLLM:
        raise EquivError(f"--quant {quant!r}: choose one of {', '.join(QUANTS)}")
    if rows not in ROWS:
        raise EquivError(f"--rows {rows!r}: choose one of {', '.join(ROWS)}")
    wtype, stype, s13, s2, tie = _VLLM[quant]
    r13 = "I" if rows == "single" else "2*I"
    order = {"contiguous": "rows [w1; w3]", "gpt_oss": "rows interleave(w1, w3)", "single": "rows [w1]"}[rows]
    packed = wtype == "fp4x2"
    lines = ["dims E, I, H"]
    lines.append(f"input w13_weight : {wtype}[E, {r13}, {'H/2' if packed else 'H'}]   {order}")
    if quant == "fp8_block":
        lines.append(f"input w13_weight_scale : f32[E, {r13}/128, H/128]   scales w13_weight {tie}")
    elif stype is not None:
        lines.append(f"input w13_weight_scale : {stype}[E, {r13}, {s13}]   scales w13_weight {tie}")
    if bias:
        lines.append(f"input w13_bias? : f32[E, {r13}]   bias of w13_weight")
    lines.append(f"input w2_weight : {wtype}[E, H, {'I/2' if packed else 'I'}]")
    if quant == "fp8_block":
        lines.append(f"input w2_weight_scale : f32[E, H/128, I/128]   scales w2_weight {tie}")
    elif stype is not None:
        lines.append(f"input w2_weight_scale : {stype}[E, H, {s2}]   scales w2_weight {tie}")
    if bias:
        lines.append("input w2_bias? : f32[E, H]   bias of w2_weight")
    return "\n".join(lines) + "\n"


def _program(text: str, filename: str = "<inputs>"):
    from ..front.errors import SpecError
    from ..lang.resolver import resolve
    from ..front.parse import parse

    try:
        return resolve(parse(f"spec inferred\n{text}", filename), {})
    except SpecError as err:
        raise EquivError("the input contract does not parse:\n" + "\n".join(
            d.format(filename, err.source) for d in err.diagnostics)) from None


# ---------------------------------------------------------------------------
# statements of the spec being written


@attrs.frozen
class Stmt:
    """One statement for one tensor: ``text`` with ``{t}`` where the tensor goes."""

    text: str
    kind: str  # "row" | "k" | "value" | "family" | "view" | "table"
    family: str | None = None  # "trtllm(epilogue_tile=128)" for packings
    op: Any = None  # the op instance (logical steps), for the tie harmonisation
    axis: int | None = None

    def on(self, tensors: Sequence[str]) -> str:
        t = tensors[0] if len(tensors) == 1 else "[" + ", ".join(tensors) + "]"
        return self.text.replace("{t}", t)


@attrs.frozen
class TensorChain:
    tensor: str
    statements: tuple[Stmt, ...]
    named: bool  # every statement a registered op or family (no table fallback)
    note: str = ""


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


# ---------------------------------------------------------------------------
# searching


def perm_ops() -> list[tuple[str, dict]]:
    """The row permutations infer tries, in order: each op's declared ``search`` arguments (from the
    registry, so a new op that declares them is tried without a list here)."""
    ops = sorted((c for c in REGISTRY.values() if c.search), key=lambda c: (c.search_rank, c.name))
    return [(c.name, dict(kw)) for c in ops for kw in c.search]
_U8 = ELEMENT_TYPES["u8"]


class _State:
    """The sampled functions of one axis, concatenated (one tensor op per move for all samples)."""

    __slots__ = ("cat", "lens")

    def __init__(self, cat: torch.Tensor, lens: tuple[int, ...]):
        self.cat, self.lens = cat, lens

    @classmethod
    def of(cls, fs: Sequence[torch.Tensor]) -> "_State":
        return cls(torch.cat([f.to(torch.int64) for f in fs]), tuple(len(f) for f in fs))

    def parts(self) -> list[torch.Tensor]:
        return list(torch.split(self.cat, self.lens))

    def key(self) -> tuple:
        n = len(self.cat)
        table = _mix()
        mix = table[:n] if n <= len(table) else table.repeat(n // len(table) + 1)[:n]
        return self.lens, int(((self.cat + 2) * mix).sum())


class _Perm:
    def __init__(self, name: str, kw: dict):
        self.name, self.kw = name, kw
        self.op = REGISTRY[name](0, **kw)
        self._cache: dict[int, torch.Tensor | None] = {}
        self._joint: dict[tuple[int, ...], torch.Tensor | None] = {}

    def src(self, n: int) -> torch.Tensor | None:
        """Output row -> input row of the op on an axis of ``n`` rows (None where it does not apply)."""
        if n not in self._cache:
            t = TensorType(_U8, (ex.Const(n),))
            try:
                inferred = self.op.infer(t)
                ok = all(r.holds({}) for r in inferred.requires)
                self._cache[n] = source_indices(self.op.index_map(t), {})[0] if ok else None
            except Exception:  # noqa: BLE001 - not applicable at this size
                self._cache[n] = None
        return self._cache[n]

    def peel(self, state: _State) -> _State | None:
        if state.lens not in self._joint:
            parts, off = [], 0
            for n in state.lens:
                p = self.src(n)
                if p is None:
                    parts = None
                    break
                parts.append(p + off)
                off += n
            self._joint[state.lens] = torch.cat(parts) if parts is not None else None
        p = self._joint[state.lens]
        if p is None:
            return None
        prev = torch.empty_like(state.cat)
        prev[p] = state.cat
        return _State(prev, state.lens)

    def stmt(self, axis: int) -> Stmt:
        args = "".join(f", {k}={v}" for k, v in self.kw.items())
        return Stmt(f"{self.name}({{t}}, dim={axis}{args})", "row", op=(self.name, tuple(self.kw.items())), axis=axis)


class _Pad:
    def __init__(self, multiple: int, parts: int, kept: list[torch.Tensor] | None = None):
        self.multiple, self.parts = multiple, parts
        self.kept = kept

    def peel(self, state: _State) -> _State | None:
        return _State.of(self.kept) if self.kept is not None else None

    def stmt(self, axis: int) -> Stmt:
        parts = f", parts={self.parts}" if self.parts > 1 else ""
        return Stmt(f"pad({{t}}, dim={axis}, multiple={self.multiple}{parts})", "row", op=("pad", self.multiple,
                                                                                          self.parts), axis=axis)


def _pad_moves(state: _State) -> list[_Pad]:
    """The pads that could have been applied last: per part, real rows then padding, the same count of
    real rows in every part, and a multiple (a power of two) that rounds that count up to the part."""
    if not bool((state.cat < 0).any()):
        return []
    moves = []
    fs = state.parts()
    for parts in (1, 2):
        counts, kept = [], []
        for f in fs:
            n = len(f)
            if n % parts:
                break
            segs = f.reshape(parts, n // parts)
            real = segs >= 0
            k = int(real[0].sum())
            if k == 0 or not bool(real[:, :k].all()) or bool(real[:, k:].any()):
                break
            counts.append((k, n // parts))
            kept.append(segs[:, :k].reshape(-1))
        else:
            if any(k < part for k, part in counts):
                for e in range(1, 14):
                    m = 1 << e
                    if all(-(-k // m) * m == part for k, part in counts):
                        moves.append(_Pad(m, parts, kept))
    return moves


_MIX: list[torch.Tensor] = []


def _mix() -> torch.Tensor:
    """The random weights of a search state's hash, drawn on first use: importing the module (as
    ``layoutc --help`` does) should not draw 65k random numbers."""
    if not _MIX:
        _MIX.append(torch.randint(1, 1 << 40, (1 << 16,), generator=torch.Generator().manual_seed(7)))
    return _MIX[0]


def _goal(fs, ns) -> bool:
    return all(len(f) == n and bool(torch.equal(f, torch.arange(n))) for f, n in zip(fs, ns))


class AxisSearch:
    """Iterative deepening over chains of row ops and pads that turn each sample's axis of ``ns[s]`` input
    rows into ``fs[s]`` (output row -> input row, -1 padding). ``upto(d)``: the shortest chain of at most
    ``d`` ops (in the order they apply), or None; deeper calls continue where shallower ones stopped."""

    def __init__(self, fs: list[torch.Tensor], ns: list[int], perms: bool):
        self.fs, self.ns = fs, ns
        self.moves = [_Perm(n, kw) for n, kw in perm_ops()] if perms else []
        self.searched = -1
        self.found: list | None = None
        self.goal = _State.of([torch.arange(n) for n in ns])

    def is_goal(self, state: _State) -> bool:
        return state.lens == self.goal.lens and bool(torch.equal(state.cat, self.goal.cat))

    def upto(self, depth: int, deadline: float) -> list | None:
        while self.found is None and self.searched < depth and time.perf_counter() < deadline:
            d = self.searched + 1
            seen: set = set()

            def dfs(state, left, path, seen=seen):
                if self.is_goal(state):
                    return path
                if left == 0 or time.perf_counter() > deadline:
                    return None
                key = (state.key(), left)
                if key in seen:
                    return None
                seen.add(key)
                for m in _pad_moves(state) + self.moves:
                    new = m.peel(state)
                    if new is None:
                        continue
                    found = dfs(new, left - 1, path + [m])
                    if found is not None:
                        return found
                return None

            result = dfs(_State.of(self.fs), d, [])
            if result is None and time.perf_counter() > deadline:
                return None  # unfinished: this depth was not searched through
            self.searched = d
            if result is not None:
                self.found = list(reversed(result))
        return self.found if self.found is not None and len(self.found) <= depth else None


def periodic_table(fs: list[torch.Tensor]) -> list[int] | None:
    """A table ``T`` with ``f[r] = L*(r//L) + T[r % L]`` at every sample (``permute(table=T)``), or None."""
    if any(bool((f < 0).any()) for f in fs):
        return None
    lengths = [len(f) for f in fs]
    for period in range(1, min(lengths) + 1):
        if any(n % period for n in lengths):
            continue
        base = None
        ok = True
        for f in fs:
            blocks = f.reshape(-1, period)
            offs = torch.arange(0, len(f), period).unsqueeze(1)
            table = blocks - offs
            if not bool((table == table[0]).all()):
                ok = False
                break
            t0 = table[0].tolist()
            if sorted(t0) != list(range(period)) or (base is not None and t0 != base):
                ok = False
                break
            base = t0
        if ok and base is not None:
            return base
    return None


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
            cands = [default] + [v for v in (64, 128, 32, 256, 16, out_shape[-1] if out_shape else 0) if v and v != default]
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


# ---------------------------------------------------------------------------
# writing the spec


def _size_text(e: ex.Expr) -> str:
    """A size in the spec language: ``round_up`` and ``ceil_div`` for the forms the compiler makes."""
    if isinstance(e, ex.Const):
        return str(e.value)
    if isinstance(e, ex.Var):
        return e.name
    if isinstance(e, ex.Div):
        return f"{_atom(e.num)}/{_atom(e.den)}"
    if isinstance(e, ex.FloorDiv) and isinstance(e.den, ex.Const):
        m = e.den.value
        inner = ex.add(e.num, -(m - 1))
        return f"ceil_div({_size_text(inner)}, {m})"
    if isinstance(e, ex.Mul):
        consts = [a for a in e.args if isinstance(a, ex.Const)]
        rest = [a for a in e.args if not isinstance(a, ex.Const)]
        if len(consts) == 1 and len(rest) == 1 and isinstance(rest[0], ex.FloorDiv) \
                and isinstance(rest[0].den, ex.Const) and consts[0].value % rest[0].den.value == 0:
            m, k = rest[0].den.value, consts[0].value // rest[0].den.value
            up = f"round_up({_size_text(ex.add(rest[0].num, -(m - 1)))}, {m})"
            return up if k == 1 else f"{k}*{up}"
        return "*".join(_atom(a) for a in e.args)
    if isinstance(e, ex.Add):
        parts = []
        for i, a in enumerate(e.args):
            text = _size_text(a)
            if i and text.startswith("-"):
                parts.append(" - " + text[1:])
            else:
                parts.append((" + " if i else "") + text)
        return "".join(parts)
    raise EquivError(f"size {ex.to_str(e)} has no spec syntax")


def _atom(e: ex.Expr) -> str:
    text = _size_text(e)
    return f"({text})" if isinstance(e, ex.Add) else text


def merge_statements(chains: Sequence[TensorChain]) -> list[str]:
    """One line per statement, tensors that take the same statement at the same point of their chains
    together: ``swap_halves([w13_weight, w13_weight_scale], dim=1)``."""
    pending = {c.tensor: list(c.statements) for c in chains}
    lines: list[str] = []
    while any(pending.values()):
        heads: dict[str, list[str]] = {}
        for t, stmts in pending.items():
            if stmts:
                heads.setdefault(stmts[0].text, []).append(t)
        _, tensors = max(heads.items(), key=lambda kv: (-_phase(pending[kv[1][0]][0]), len(kv[1])))
        stmt = pending[tensors[0]][0]
        if stmt.kind == "table":
            lines.append("# layoutc infer: no registered op gives this row order at every sampled shape; an explicit "
                         "table follows (review it: it repeats with its length)")
        lines.append(stmt.on(tensors))
        for t in tensors:
            pending[t].pop(0)
    return lines


def _phase(st: Stmt) -> int:
    return {"row": 0, "k": 0, "table": 0, "value": 1, "family": 2, "view": 3}[st.kind]


def _harmonise(program, chains: dict[str, TensorChain]) -> None:
    """A scale padded at its end where the next family pads it anyway, and its weight not padded there:
    leave the padding to the family (the verifier compares a scale's logical rows with its weight's)."""
    for t in program.inputs:
        if t.tie is None or t.tie.weight not in chains or t.name not in chains:
            continue
        mine, theirs = chains[t.name], chains[t.tie.weight]
        weight_pads = {(s.axis, s.op) for s in theirs.statements if s.op and s.op[0] == "pad"}
        stmts = list(mine.statements)
        fam_index = next((i for i, s in enumerate(stmts) if s.kind == "family"), None)
        if fam_index is None:
            continue
        family_pads = _leading_pads(t, stmts[fam_index].op)
        keep = []
        for i, s in enumerate(stmts):
            if s.op and s.op[0] == "pad" and s.op[2] == 1 and s.axis in family_pads \
                    and all(x.kind in ("row", "k", "value") and (x.op is None or x.op[0] == "pad")
                            for x in stmts[i + 1:fam_index]):
                multiple = s.op[1]
                if family_pads[s.axis] % multiple == 0 and not any(a == s.axis and o[0] == "pad" for a, o in weight_pads):
                    continue
            keep.append(s)
        chains[t.name] = attrs.evolve(mine, statements=tuple(keep))


def _leading_pads(tensor, family_op) -> dict[int, int]:
    """Axis -> multiple of the whole-axis pads a family applies first (before any other step moves the
    axes), read from the family's own steps: a pad there that the statements also do is redundant."""
    if not family_op or family_op[0] != "family":
        return {}
    _, name, params = family_op
    rank = len(tensor.shape)
    try:
        steps = _family_steps(name, tensor.role, tensor.elem, [ex.Var(f"_a{k}") for k in range(rank)], dict(params))
    except Exception:  # noqa: BLE001 - the family does not apply to this tensor: nothing known about its pads
        return {}
    pads: dict[int, int] = {}
    for st in steps:
        if getattr(st.op, "name", None) != "pad":
            break
        if st.op.parts == 1:
            pads.setdefault(st.op.dim % rank, st.op.multiple)
    return pads


def _out_rows(chain, dims) -> str | None:
    """The declared output row order of a tensor that declares input rows, as the chain leaves it."""
    from ..verify.rowmap import axis_map, describe_labels, n_rows, row_labels

    rows = chain.source.rows
    if rows is None:
        return None
    amap = axis_map(chain, dims)
    n = n_rows(chain.source, dims)
    labels = row_labels(rows, n)
    actual = [labels[r] if r >= 0 else None for r in amap.rows]
    text = describe_labels(actual, rows.shards)
    text = text.replace(" with each shard padded", "")
    if " then " in text or text.startswith("the order"):
        return None
    return text


@attrs.frozen
class Inferred:
    """What ``infer`` found: the spec text, per tensor whether registered ops/families explain it, notes
    for the reviewer, and the ``equiv`` verdict of the written spec against the function."""

    text: str
    chains: tuple[TensorChain, ...]
    notes: tuple[str, ...]
    samples: tuple[dict, ...]
    verdict: Result | None
    verify_errors: tuple[str, ...] = ()

    @property
    def named(self) -> bool:
        return all(c.named for c in self.chains)

    @property
    def ok(self) -> bool:
        return self.verdict is not None and self.verdict.ok and not self.verify_errors


def infer(fn: Callable[..., Any] | str | Target, dims: Mapping[str, int], names: str | None = "vllm",
          quant: str | None = None, rows: str = "contiguous", bias: bool = False, inputs: str | None = None,
          params: Mapping[str, Any] | None = None, spec_name: str = "inferred", check: bool = True,
          shapes: int = 4, progress: Callable[[str], None] | None = None, threads: int | None = 1,
          timeout: float | None = CALL_TIMEOUT, hard_exit: bool = False) -> Inferred:
    """Infer a spec for ``fn`` (see the module docstring). ``inputs``: the checkpoint contract as spec
    lines (``dims``, ``assume``, ``input`` ...); else ``names="vllm"`` with ``quant``/``rows``/``bias``.
    ``params`` are passed to the function (a ``params`` parameter) and written into the spec."""
    target = as_target(fn, timeout=timeout, hard_exit=hard_exit)
    params = dict(params or {})
    # Both are written into the spec text: a name or value that is not one token could add statements.
    _check_name("spec name", spec_name)
    for k, v in params.items():
        _check_name("parameter name", k)
        _param_text(k, v)
    say = progress or (lambda text: None)
    with _threads(threads):
        contract = _choose_contract(target, dims, names, quant, rows, bias, inputs, params, say)
        program = _program(contract)
        missing = [d for d in program.dims if d not in dims]
        if missing:
            raise EquivError(f"--dims must give {', '.join(missing)} (the contract's dims: {', '.join(program.dims)})")
        given = {d: int(dims[d]) for d in program.dims}
        if not _contract_ok(program, given):
            raise EquivError(f"the dims {given} do not fit the input shapes ({', '.join(t.shape_str() for t in program.inputs)})")
        try:
            first = target.call(_zeros(program, given), params, f"at {given}")
        except FunctionFailed as err:
            raise EquivError(f"{err}; check --dims, --quant, --rows and -D") from None
        say("probing the sizes the function accepts")
        contract_p, function_p = probe_periods(target, program, given, params)
        envs = _sample_dims(target, program, given, contract_p, function_p, params)
        say("measuring at " + "; ".join(", ".join(f"{k}={v}" for k, v in e.items()) for e in envs))
        modes = _modes(program, {k: v.dtype for k, v in first.items()})
        samples = [_measure(target, program, env, params, modes) for env in envs]
        modes_final = {n: e.mode for n, e in samples[-1].plan.inputs.items()}
        if any(modes_final[n] != s.plan.inputs[n].mode for s in samples for n in modes_final):
            samples = [_measure(target, program, env, params, dict(modes_final)) for env in envs]
        notes: list[str] = []
        # Ties first: a tie gives the tensor its role (a bias's rows are its last axis, a scale follows
        # its weight's packings), which the search below needs.
        ties = _propose_ties(program, samples)
        notes += [f"proposed tie: {n}" for _, n in ties]
        if ties:
            contract = _with_ties(contract, ties)
            program = _program(contract)
        chains: dict[str, TensorChain] = {}
        for t in program.inputs:
            if t.name not in samples[0].codes:
                notes.append(f"{t.name}: the function returns no tensor of that name; no statements written")
                continue
            say(f"searching {t.name}")
            tied = chains.get(t.tie.weight) if t.tie is not None else None
            c = search_tensor(t, samples, prefer=[st.family for st in tied.statements if st.kind == "family"]
                              if tied is not None else ())
            chains[t.name] = c
            if c.note:
                notes.append(c.note)
        _harmonise(program, chains)
        extra = sorted(set(samples[0].codes) - {t.name for t in program.inputs})
        if extra:
            notes.append(f"the function also returns {', '.join(extra)}, which has no input of its name: not in the spec")
        assumes = [f"assume {d} % {function_p[d]} == 0" for d in program.dims if function_p[d] > contract_p[d]]
        text, verify_errors = _write(program, contract, chains, assumes, params, target, envs, spec_name)
    verdict = None
    if check and text is not None and not verify_errors:
        say("checking the written spec with equiv")
        try:
            verdict = equivalent(text, target, given, params={}, shapes=shapes, threads=threads)
        except EquivError as err:
            notes.append(f"equiv could not check the written spec: {err}")
    return Inferred(text or "", tuple(chains.values()), tuple(notes), tuple(envs), verdict, tuple(verify_errors))


def _check_name(what: str, name: str) -> None:
    """A spec or parameter name the written spec can hold as one NAME token (the -D check)."""
    from ..lang.resolver import check_param_name

    try:
        check_param_name(name)
    except ValueError:
        raise EquivError(f"{what} {display(name)!r} is not an identifier (letters, digits and '_', "
                         f"not starting with a digit)") from None


def _param_text(name: str, value: Any) -> str:
    """``value`` as a spec literal: true/false and integers bare, anything else a quoted STRING. The
    grammar's strings have no escapes, so a value that cannot sit between quotes as one line of
    printable text (a quote, a newline, a control character, or ';', which ends a statement for the
    reader even where the parser would not) is refused rather than written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise EquivError(f"parameter {name}: {type(value).__name__} values cannot be written into a spec")
    bad = next((c for c in value if c in '";\n' or forbidden(c) or not c.isprintable()), None)
    if bad is not None:
        raise EquivError(f"parameter {name}: the value {display(value)!r} holds {char_name(bad)}, which a spec "
                         f"string cannot hold (no quotes, ';', newlines or control characters)")
    return f'"{value}"'


def _choose_contract(target, dims, names, quant, rows, bias, inputs, params, say) -> str:
    if inputs is not None:
        return inputs
    if names not in ("vllm", None):
        raise EquivError(f"--names {names!r}: only 'vllm' is built in; give the inputs with --inputs FILE")
    if quant is not None:
        return vllm_contract(quant, rows, bias)
    fits = []
    for q in QUANTS:
        text = vllm_contract(q, rows, bias)
        program = _program(text)
        env = {d: int(dims[d]) for d in program.dims if d in dims}
        if len(env) != len(program.dims) or not _contract_ok(program, env):
            continue
        try:
            out = target.call(_zeros(program, env), params, f"with --quant {q}")
        except FunctionAborted:
            raise  # it exited or hung: no other format will tell more
        except (FunctionFailed, EquivError):
            continue
        if {t.name for t in program.inputs if not t.optional} <= set(out):
            fits.append(q)
    if len(fits) == 1:
        say(f"checkpoint format: {fits[0]} (the only one the function accepts)")
        return vllm_contract(fits[0], rows, bias)
    if not fits:
        raise EquivError("the function accepts none of the vLLM checkpoint formats at these dims "
                         f"({', '.join(QUANTS)}); give --quant, or the inputs with --inputs FILE")
    raise EquivError(f"the function accepts several checkpoint formats ({', '.join(fits)}); choose one with --quant")


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


def _propose_ties(program, samples) -> list[tuple[str, str]]:
    """``scales W block B`` / ``bias of W`` for inputs declared without a tie whose rows follow a weight's
    (same rows, K in blocks of B): (tensor, clause)."""
    out = []
    s = samples[0]
    weights = [t for t in program.inputs if t.tie is None]
    for t in program.inputs:
        if t.tie is not None or t.name not in s.codes:
            continue
        shape = concrete_shape(t.shape, s.dims)
        for w in weights:
            if w is t or w.name not in s.codes:
                continue
            wshape = concrete_shape(w.shape, s.dims)
            if len(shape) == len(wshape) and shape[:-1] == wshape[:-1] and shape[-1] < wshape[-1]:
                k_w = wshape[-1] * w.elem.values
                if k_w % shape[-1] == 0 and _rows_follow(s, t.name, w.name):
                    out.append((t.name, f"scales {w.name} block {k_w // shape[-1]}"))
                    break
            if len(shape) == len(wshape) - 1 and shape == wshape[:-1] and _rows_follow(s, t.name, w.name):
                out.append((t.name, f"bias of {w.name}"))
                break
    return out


def _rows_follow(s: Sample, a: str, b: str) -> bool:
    """Whether outputs ``a`` and ``b`` (same leading output axes) read the same input row at each output row."""
    def rows(name):
        enc = s.plan.inputs[name]
        codes = s.codes[name]
        if enc.mode == "bits":
            first = codes[..., 0]
            codes = torch.where(first >= 0, torch.div(first - enc.offset, enc.width, rounding_mode="floor") + enc.offset,
                                -1)
        inner = math.prod(enc.shape[2:]) if len(enc.shape) > 2 else 1
        if codes.dim() < 2:
            return None
        r = torch.where(codes >= 0, torch.div(codes - enc.offset, inner, rounding_mode="floor"), -1)
        return r.reshape(*codes.shape[:2], -1)[..., 0]

    ra, rb = rows(a), rows(b)
    return ra is not None and rb is not None and ra.shape == rb.shape and torch.equal(ra, rb)


def _with_ties(contract: str, ties) -> str:
    """The contract with the proposed tie clauses on their input lines, marked for the reviewer."""
    tie_of = dict(ties)
    lines = []
    for line in contract.splitlines():
        stripped = line.strip()
        if stripped.startswith("input "):
            name = stripped.split()[1].rstrip(":").rstrip("?")
            if name in tie_of:
                code, hash_, comment = line.partition("#")
                line = f"{code.rstrip()}   {tie_of[name]}   # proposed by layoutc infer: its rows follow the weight's" \
                    + (f"; {comment.strip()}" if hash_ else "")
        lines.append(line)
    return "\n".join(lines)


def _write(program, contract: str, chains: dict[str, TensorChain], assumes, params, target, envs, spec_name):
    from ..api import compile_source
    from ..lang.compiler import _Builder
    from ..front.errors import SpecError
    from ..lang.resolver import resolve
    from ..front.parse import parse

    lines_in = contract.splitlines()
    shown = "; ".join(", ".join(f"{k}={v}" for k, v in e.items()) for e in envs)
    # comment(): a function's name (or a -D value) is shown on one line and cannot end the comment
    with_params = "; with " + ", ".join(f"{k}={_param_text(k, v)}" for k, v in params.items()) if params else ""
    head = [f"# {comment(f'Inferred by layoutc infer from {target.name}')}",
            f"# {comment(f'(measured at {shown}{with_params}).')}",
            "# Review before use: every statement reproduces the function's element moves at those shapes and",
            "# equiv checked the whole spec at more; the names of the row orders are read off the maps.",
            f"spec {spec_name}", ""]
    body = [ln for ln in lines_in if ln.strip()]
    dims_lines = [ln for ln in body if ln.strip().startswith("dims ")]
    other = [ln for ln in body if not ln.strip().startswith("dims ")]
    params_lines = [f"param {k} = {_param_text(k, v)}" for k, v in params.items()]
    statements = merge_statements(list(chains.values()))
    draft = "\n".join(head + dims_lines + assumes + params_lines + other + [""] + statements) + "\n"
    program2 = resolve(parse(draft, f"{spec_name}.lyt"), {})
    builder = _Builder(program2)
    present = frozenset(program2.optional_inputs)
    outs = []
    chain_objs = {}
    for t in program2.inputs:
        if t.name not in chains:
            continue
        c = builder.chain(t, present)
        if c is None:
            errs = [d.format(f"{spec_name}.lyt", draft) for d in builder.diags.diagnostics]
            return draft, tuple(errs) or (f"{t.name}: the inferred statements do not type",)
        chain_objs[t.name] = c
    errs = [d for d in builder.diags.diagnostics if d.severity == "error"]
    if errs:
        return draft, tuple(d.format(f"{spec_name}.lyt", draft) for d in errs)
    sample = envs[0]
    for t in program2.inputs:
        if t.name not in chain_objs:
            continue
        c = chain_objs[t.name]
        typ = c.out_type
        shape = "[" + ", ".join(_size_text(s) for s in typ.shape) + "]"
        fams = [s.family for s in chains[t.name].statements if s.kind == "family"]
        decl = f"output {t.name}{'?' if t.optional else ''} : {typ.elem.name}{shape}"
        rows = _out_rows(c, sample) if t.rows is not None else None
        outs.append((decl, rows, fams))

    def render(with_rows: bool) -> str:
        lines = []
        for decl, rows, fams in outs:
            extra = (f"   rows {rows}" if rows and with_rows else "") + (f"   packing {' + '.join(fams)}" if fams else "")
            lines.append(decl + extra)
        return draft + "\n" + "\n".join(lines) + "\n"

    last_errors: tuple[str, ...] = ()
    for with_rows in (True, False):
        text = render(with_rows)
        try:
            compile_source(text, f"{spec_name}.lyt", check_versions=False)
            return text, ()
        except SpecError as err:
            last_errors = tuple(d.format(f"{spec_name}.lyt", text) for d in err.errors)
    return render(True), last_errors
