"""Explaining one axis's movement as a short chain of registered row ops and pads (``infer`` step 2).

:class:`Stmt` and :class:`TensorChain` are the statements the search writes. :class:`AxisSearch` runs an
iterative-deepening search that peels the last row op (:func:`perm_ops`, from the ops' declared ``search``
arguments) or ``pad`` off each axis's function (output row -> input row) on all sampled shapes at once;
:func:`periodic_table` is the fallback (an explicit ``permute`` table that repeats with a period). Kept apart
from the per-tensor search, which peels packing families first and calls this per axis.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import attrs
import torch

from ..algebra import expr as ex
from ..algebra.dtypes import ELEMENT_TYPES
from ..algebra.indexmap import source_indices
from ..lang.ops import REGISTRY, TensorType


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
