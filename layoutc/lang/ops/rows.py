"""Row permutations of gated weights: gate/up swaps and interleaves.

All act on one axis ``dim`` (default 1: the row axis of expert-stacked weights
``[E, rows, K]``, scales ``[E, rows, K/32]`` and biases ``[E, rows]``). With
``n`` rows and ``r`` the output row, each op's source row is:

================================  ===========================================  ==============
op                                source row of output row r                   needs
================================  ===========================================  ==============
swap_halves                       (r + n/2) mod n                              n % 2 == 0
interleave_rows(group=g)          ((r//g) mod 2)*(n/2) + (r//2g)*g + r mod g  n % 2g == 0
deinterleave(group=g)             (j//g)*2g + (r//(n/2))*g + j mod g,          n % 2g == 0
                                  j = r mod n/2
swap_pairs                        r + 1 - 2*(r mod 2)                          n % 2 == 0
reorder_gated_rows                interleave_rows(group=1)                     n % 2 == 0
================================  ===========================================  ==============

Each sees its axis as two shards, gate and up (``gate_up``): on a non-gated layer's single w13
shard the verifier rejects them. Other row orders are ``permute`` (a formula or a table); the
TRT-LLM epilogue shuffle is the ``trtllm`` family of ``prelude.lyt``.

FlashInfer sources: ``reorder_rows_for_gated_act_gemm`` (fused_moe/core.py),
``_interleave_linear_and_gate`` behind ``interleave_cute_dsl_moe_weights``
(fused_moe/prepare.py).
"""

from __future__ import annotations

from typing import Callable, ClassVar

import attrs

from ...algebra import expr as ex
from ...algebra.indexmap import IndexMap, out_var
from . import torch_impl
from .base import Category, Facts, Inferred, Op, TensorType, along, check_dim, require_multiple


def _dim_field(default: int = 1):
    return attrs.field(default=default, metadata={"kind": "dim"})


@attrs.frozen
class _RowOp(Op):
    """Shared shape logic: a permutation of axis ``dim`` needing ``n % multiple == 0``."""

    dim: int = _dim_field()

    facts: ClassVar[Facts] = Facts(Category.LOGICAL, on_axis=True, gate_up=True)
    what: ClassVar[str] = "rows"

    def multiple(self) -> int:
        return 2

    def infer(self, t: TensorType) -> Inferred:
        d = check_dim(t, self.dim)
        return Inferred(t, (require_multiple(t, d, self.multiple(), self.what),))

    def source_row(self, r: ex.Expr, n: ex.Expr) -> ex.Expr:
        raise NotImplementedError

    def index_map(self, t: TensorType) -> IndexMap:
        d = check_dim(t, self.dim)
        return along(t, d, self.source_row(out_var(d), t.shape[d]))


@attrs.frozen
class SwapHalves(_RowOp):
    name: ClassVar[str] = "swap_halves"
    eager: ClassVar[Callable] = staticmethod(torch_impl.swap_halves)
    search: ClassVar[tuple[dict, ...]] = ({},)  # what `layoutc infer` tries
    search_rank: ClassVar[int] = 0
    summary: ClassVar[str] = "[A; B] -> [B; A] along dim (w13 [w1; w3] -> [w3; w1])"
    notes: ClassVar[str] = "`out[r] = in[(r + n/2) mod n]`"
    needs: ClassVar[str] = "n % 2"

    def source_row(self, r, n):
        return ex.mod(r + ex.div(n, 2), n)

    def impl(self, t):
        return self.eager, (self.dim,)

    def inverse(self, t):
        return self


@attrs.frozen
class InterleaveRows(_RowOp):
    group: int = attrs.field(default=1, kw_only=True, metadata={"kind": "int", "min": 1})

    name: ClassVar[str] = "interleave_rows"
    eager: ClassVar[Callable] = staticmethod(torch_impl.interleave_rows)
    search: ClassVar[tuple[dict, ...]] = tuple({"group": g} for g in (2, 4, 8, 16, 32, 64, 128, 256))  # what `layoutc infer` tries
    search_rank: ClassVar[int] = 3
    summary: ClassVar[str] = "[A; B] -> [A0, B0, A1, B1, ...] in groups of `group` rows"
    notes: ClassVar[str] = "group=64: CuTeDSL"
    needs: ClassVar[str] = "n % (2·group)"

    def multiple(self) -> int:
        return 2 * self.group

    def source_row(self, r, n):
        g = self.group
        half = ex.mod(ex.floordiv(r, g), 2)
        return half * ex.div(n, 2) + ex.floordiv(r, 2 * g) * g + ex.mod(r, g)

    def impl(self, t):
        return self.eager, (self.dim, self.group)

    def inverse(self, t):
        return Deinterleave(self.dim, group=self.group)


@attrs.frozen
class ReorderGatedRows(_RowOp):
    """FlashInfer ``reorder_rows_for_gated_act_gemm``: out[2i] = x[i], out[2i+1] = x[n/2 + i]."""

    name: ClassVar[str] = "reorder_gated_rows"
    eager: ClassVar[Callable] = staticmethod(torch_impl.interleave_rows)
    search: ClassVar[tuple[dict, ...]] = ({},)  # what `layoutc infer` tries
    search_rank: ClassVar[int] = 1
    summary: ClassVar[str] = "TRT-LLM gated-activation row order [A0, B0, A1, B1, ...]"
    notes: ClassVar[str] = "FlashInfer `reorder_rows_for_gated_act_gemm`"
    needs: ClassVar[str] = "n % 2"

    def source_row(self, r, n):
        return InterleaveRows(self.dim, group=1).source_row(r, n)

    def impl(self, t):
        return self.eager, (self.dim, 1)

    def inverse(self, t):
        return Deinterleave(self.dim, group=1)


@attrs.frozen
class Deinterleave(_RowOp):
    group: int = attrs.field(default=1, kw_only=True, metadata={"kind": "int", "min": 1})

    name: ClassVar[str] = "deinterleave"
    eager: ClassVar[Callable] = staticmethod(torch_impl.deinterleave_rows)
    search: ClassVar[tuple[dict, ...]] = tuple({"group": g} for g in (1, 2, 4, 8, 16, 32, 64, 128, 256))  # what `layoutc infer` tries
    search_rank: ClassVar[int] = 4
    summary: ClassVar[str] = "[A0, B0, A1, B1, ...] -> [A; B] (gpt-oss [g0, u0, g1, u1..] -> [g; u])"
    needs: ClassVar[str] = "n % (2·group)"

    def multiple(self) -> int:
        return 2 * self.group

    def source_row(self, r, n):
        g = self.group
        half_n = ex.div(n, 2)
        j = ex.mod(r, half_n)
        return ex.floordiv(j, g) * (2 * g) + ex.floordiv(r, half_n) * g + ex.mod(j, g)

    def impl(self, t):
        return self.eager, (self.dim, self.group)

    def inverse(self, t):
        return InterleaveRows(self.dim, group=self.group)


@attrs.frozen
class SwapPairs(_RowOp):
    name: ClassVar[str] = "swap_pairs"
    eager: ClassVar[Callable] = staticmethod(torch_impl.swap_pairs)
    search: ClassVar[tuple[dict, ...]] = ({},)  # what `layoutc infer` tries
    search_rank: ClassVar[int] = 2
    summary: ClassVar[str] = "rows (2i, 2i+1) -> (2i+1, 2i): gpt-oss [g0, u0, ..] -> [u0, g0, ..]"
    needs: ClassVar[str] = "n % 2"

    def source_row(self, r, n):
        return r + 1 - 2 * ex.mod(r, 2)

    def impl(self, t):
        return self.eager, (self.dim,)

    def inverse(self, t):
        return self


OPS = (SwapHalves, InterleaveRows, ReorderGatedRows, Deinterleave, SwapPairs)
