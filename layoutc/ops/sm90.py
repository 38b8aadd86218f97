"""The two packings of FlashInfer's SM90 mixed-input (W4A16) MoE GEMM, FlashInfer >= 0.6.16.

Both are built from the generic pieces of :mod:`layoutc.indexmap` (reshape,
permute, a table on one axis), so each reads as the few steps it is.

**Scale fold** -- ``interleave_moe_scales_for_sm90_mixed_gemm`` in
``flashinfer/fused_moe/prepare.py`` (pure torch). One-byte E8M0 scales
``[E, R, K/32]`` become ``[E, R/64, K/128, 16, 16]``::

    out[e, rb, kb, f, 4*ms + g] = in[e, 64*rb + 16*ms + f, 4*kb + g]

i.e. reshape rows to (rb, ms, f) and columns to (kb, g), then order (rb, kb, f, ms, g).
Needs R % 64 == 0 and (K/32) % 4 == 0. (Before 0.6.16 the layout was
``[E, K/128, 4R]``; specs pin the library version.)

**FP4 weight interleave** -- ``interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")``,
kernel ``interleave_fp4_weights_for_sm90_mixed_gemm_kernel`` in
``data/csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu``
(CUDA only). Per expert ``W = u8[N, K/2]``, with ``r = 16g + r8`` and byte column
``c = 32p + 16a + 8h + j`` (r8 < 8, a, h < 2, j < 4):

1. gather the little-endian word ``W[r,c] | W[r+8,c]<<8 | W[r,c+4]<<16 | W[r+8,c+4]<<24``
   (byte ``t' = tr + 2*tc`` of the word is row ``r + 8*tr``, column ``c + 4*tc``);
2. permute its bits, ``out_bit[i] = in_bit[T[i]]`` with the table below, which
   moves each FP4 value's sign bit away from its three magnitude bits;
3. store the word's 4 bytes at ``O[r + 8h, 32p + 16a + 4j : +4]``.

It is a permutation of bits, so it is an index map at bit granularity.
Needs N % 16 == 0 and K % 64 == 0 (K/2 % 32 bytes).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from .. import expr as ex
from ..indexmap import IndexMap, compose_all, lift_to_bits, out_var, permute_map, reshape_map, table_map
from . import torch_impl
from .base import Category, Inferred, Op, OpTypeError, Requirement, TensorType, WordForm

#: out_bit[i] = in_bit[SM90_FP4_BITS[i]] within one 32-bit word (from the kernel's mask/shift list).
SM90_FP4_BITS = torch_impl.SM90_FP4_BITS
FAMILY = "sm90_mixed"


def _inverse_table(table):
    inv = [0] * len(table)
    for i, s in enumerate(table):
        inv[s] = i
    return tuple(inv)


def _need_one_byte(op: str, t: TensorType, what: str) -> None:
    if t.elem.bits != 8:
        raise OpTypeError(f"{op} packs one-byte {what}; got {t.elem.name} ({t.elem.bits} bits)")


def _need_rank(op: str, t: TensorType, rank: int, layout: str) -> None:
    if t.rank < rank:
        raise OpTypeError(f"{op} needs at least {rank} axes {layout}; got {t}")


@attrs.frozen
class Sm90InterleaveWeights(Op):
    name: ClassVar[str] = "sm90_interleave_weights"
    category: ClassVar[Category] = Category.PACKING
    family: ClassVar[str] = FAMILY
    summary: ClassVar[str] = "SM90 mixed-GEMM FP4 weight bit interleave (FlashInfer >= 0.6.16)"

    @property
    def bit_level(self) -> bool:
        return True

    def infer(self, t: TensorType) -> Inferred:
        _need_rank(self.name, t, 2, "[..., N, K/2]")
        if t.elem.name not in ("fp4x2", "u8"):
            raise OpTypeError(
                f"{self.name} permutes packed FP4 (fp4x2) weights; got {t.elem.name}",
                hint="the SM90 scale fold is sm90_fold_scales (interleave(scale, sm90_mixed) picks it for tied scales)",
            )
        n, kb = t.shape[-2], t.shape[-1]
        return Inferred(t, (Requirement(n, 16, "rows"), Requirement(kb, 32, "K bytes")))

    def index_map(self, t: TensorType) -> IndexMap:
        *lead, n, kb = t.shape
        k = len(lead)
        lead = tuple(lead)
        g, p = ex.div(n, 16), ex.div(kb, 32)
        tiles = lead + (g, 2, 8, p, 2, 2, 2, 4)  # g tr r8 p a h tc j
        words_perm = tuple(range(k)) + tuple(k + d for d in (0, 2, 3, 4, 5, 7, 6, 1))  # g r8 p a h j tc tr
        words = lead + (g, 8, p, 2, 2, 4, 4)  # ... j t'   (t' = tr + 2*tc)
        word_bits = lead + (g, 8, p, 2, 2, 4, 32)
        out_fields = lead + (g, 8, p, 2, 2, 4, 4)  # g r8 p a h j t
        store_perm = tuple(range(k)) + tuple(k + d for d in (0, 4, 1, 2, 3, 5, 6))  # g h r8 p a j t
        stored = lead + (g, 2, 8, p, 2, 4, 4)
        gather_words = compose_all(
            [
                reshape_map(t.shape, tiles),
                permute_map(tiles, words_perm),
                reshape_map(tuple(tiles[i] for i in words_perm), words),
            ]
        )
        bits = lambda shape: shape + (8,)  # noqa: E731 - bit axis of a byte tensor
        permute_bits = compose_all(
            [
                reshape_map(bits(words), word_bits),
                table_map(word_bits, len(word_bits) - 1, SM90_FP4_BITS),
                reshape_map(word_bits, bits(out_fields)),
            ]
        )
        store = compose_all([permute_map(out_fields, store_perm), reshape_map(stored, t.shape)])
        return compose_all([lift_to_bits(gather_words), _as_bits(permute_bits), lift_to_bits(store)])

    def impl(self):
        return torch_impl.sm90_interleave_fp4, ()

    def inverse(self, t):
        return Sm90DeinterleaveWeights()

    def word_form(self, t: TensorType) -> WordForm:
        """The op as 32-bit words: output word ``(lead.., n, w)`` (bytes ``4w..4w+3`` of row n)
        holds the source bytes ``sources[t']`` (input coordinates), bits permuted by ``table``."""
        *lead, n, kb = t.shape
        rank = len(t.shape)
        o = [out_var(k) for k in range(rank)]
        row, word = o[-2], o[-1]
        g, h, r8 = ex.floordiv(row, 16), ex.mod(ex.floordiv(row, 8), 2), ex.mod(row, 8)
        p, a, j = ex.floordiv(word, 8), ex.mod(ex.floordiv(word, 4), 2), ex.mod(word, 4)
        sources = []
        for byte in range(4):
            tr, tc = byte % 2, byte // 2
            src_row = 16 * g + 8 * tr + r8
            src_col = 32 * p + 16 * a + 8 * h + 4 * tc + j
            sources.append(tuple(o[:-2]) + (src_row, src_col))
        return WordForm(tuple(lead) + (n, ex.div(kb, 4)), tuple(sources), SM90_FP4_BITS)


@attrs.frozen
class Sm90DeinterleaveWeights(Op):
    name: ClassVar[str] = "sm90_deinterleave_weights"
    category: ClassVar[Category] = Category.PACKING
    family: ClassVar[str] = FAMILY
    summary: ClassVar[str] = "inverse of sm90_interleave_weights"

    @property
    def bit_level(self) -> bool:
        return True

    def infer(self, t: TensorType) -> Inferred:
        return Sm90InterleaveWeights().infer(t)

    def index_map(self, t: TensorType) -> IndexMap:
        *lead, n, kb = t.shape
        k = len(lead)
        lead = tuple(lead)
        g, p = ex.div(n, 16), ex.div(kb, 32)
        stored = lead + (g, 2, 8, p, 2, 4, 4)  # g h r8 p a j t
        fields_perm = tuple(range(k)) + tuple(k + d for d in (0, 2, 3, 4, 1, 5, 6))  # g r8 p a h j t
        fields = tuple(stored[i] for i in fields_perm)
        word_bits = fields[:-1] + (32,)
        raw = fields[:-1] + (2, 2)  # ... j tc tr
        tiles_perm = tuple(range(k)) + tuple(k + d for d in (0, 7, 1, 2, 3, 4, 6, 5))  # g tr r8 p a h tc j
        load = compose_all([reshape_map(t.shape, stored), permute_map(stored, fields_perm)])
        bits = lambda shape: shape + (8,)  # noqa: E731
        unpermute_bits = compose_all(
            [
                reshape_map(bits(fields), word_bits),
                table_map(word_bits, len(word_bits) - 1, _inverse_table(SM90_FP4_BITS)),
                reshape_map(word_bits, bits(raw)),
            ]
        )
        place = compose_all(
            [permute_map(raw, tiles_perm), reshape_map(tuple(raw[i] for i in tiles_perm), t.shape)]
        )
        return compose_all([lift_to_bits(load), _as_bits(unpermute_bits), lift_to_bits(place)])

    def impl(self):
        return torch_impl.sm90_deinterleave_fp4, ()

    def inverse(self, t):
        return Sm90InterleaveWeights()


def _as_bits(m: IndexMap) -> IndexMap:
    """Mark a map written over explicit bit axes as bit-level."""
    return attrs.evolve(m, bit_level=True)


@attrs.frozen
class Sm90FoldScales(Op):
    name: ClassVar[str] = "sm90_fold_scales"
    category: ClassVar[Category] = Category.PACKING
    family: ClassVar[str] = FAMILY
    summary: ClassVar[str] = "SM90 mixed-GEMM E8M0 scale fold [.., R, K/32] -> [.., R/64, K/128, 16, 16]"

    def infer(self, t: TensorType) -> Inferred:
        _need_rank(self.name, t, 2, "[..., R, K/32]")
        _need_one_byte(self.name, t, "scales (E8M0, group 32)")
        *lead, rows, cols = t.shape
        out = tuple(lead) + (ex.div(rows, 64), ex.div(cols, 4), ex.Const(16), ex.Const(16))
        return Inferred(
            attrs.evolve(t, shape=out),
            (Requirement(rows, 64, "rows"), Requirement(cols, 4, "scale columns")),
        )

    def index_map(self, t: TensorType) -> IndexMap:
        *lead, rows, cols = t.shape
        k = len(lead)
        lead = tuple(lead)
        split = lead + (ex.div(rows, 64), 4, 16, ex.div(cols, 4), 4)  # rb ms f kb g
        perm = tuple(range(k)) + tuple(k + d for d in (0, 3, 2, 1, 4))  # rb kb f ms g
        out = self.infer(t).type.shape
        return compose_all(
            [reshape_map(t.shape, split), permute_map(split, perm), reshape_map(tuple(split[i] for i in perm), out)]
        )

    def impl(self):
        return torch_impl.sm90_fold_scales, ()

    def inverse(self, t):
        return Sm90UnfoldScales()


@attrs.frozen
class Sm90UnfoldScales(Op):
    name: ClassVar[str] = "sm90_unfold_scales"
    category: ClassVar[Category] = Category.PACKING
    family: ClassVar[str] = FAMILY
    summary: ClassVar[str] = "inverse of sm90_fold_scales"

    def infer(self, t: TensorType) -> Inferred:
        _need_rank(self.name, t, 4, "[..., R/64, K/128, 16, 16]")
        *lead, rb, kb, f, c = t.shape
        if f != ex.Const(16) or c != ex.Const(16):
            raise OpTypeError(f"{self.name} expects folded scales [..., R/64, K/128, 16, 16]; got {t}")
        return Inferred(attrs.evolve(t, shape=tuple(lead) + (ex.mul(rb, 64), ex.mul(kb, 4))))

    def index_map(self, t: TensorType) -> IndexMap:
        *lead, rb, kb, _, _ = t.shape
        k = len(lead)
        lead = tuple(lead)
        split = lead + (rb, kb, 16, 4, 4)  # rb kb f ms g
        perm = tuple(range(k)) + tuple(k + d for d in (0, 3, 2, 1, 4))  # rb ms f kb g
        out = self.infer(t).type.shape
        return compose_all(
            [reshape_map(t.shape, split), permute_map(split, perm), reshape_map(tuple(split[i] for i in perm), out)]
        )

    def impl(self):
        return torch_impl.sm90_unfold_scales, ()

    def inverse(self, t):
        return Sm90FoldScales()


OPS = (Sm90InterleaveWeights, Sm90DeinterleaveWeights, Sm90FoldScales, Sm90UnfoldScales)
