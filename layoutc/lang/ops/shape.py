"""Shape primitives: padding (also per half of a gated w13), cropping, reshape, transpose.

``pad(x, dim, multiple=m, parts=p)`` splits axis ``dim`` into ``p`` equal parts
and zero-extends *each* to a multiple of ``m``: with ``p = 2`` on a gated
``w13 = [w1; w3]`` of ``2I`` rows this gives ``[w1, 0..; w3, 0..]``, the
per-half padding kernels need (vLLM issue 55649 padded at the end instead)::

    rows I = 3, multiple 4, parts 2:   out row  0 1 2 3 4 5 6 7
                                       in  row  0 1 2 - 3 4 5 -   (- = fill)

Sizes are in storage elements: for ``fp4x2`` weights a K padding of 128 values is
``multiple=64`` bytes along the packed axis.
"""

from __future__ import annotations

from typing import Callable, ClassVar

import attrs

from ...algebra import expr as ex
from ...algebra.indexmap import IndexMap, crop_map, equal_sizes, out_var, out_vars, pad_map, reshape_map
from . import torch_impl
from ...algebra.instances import divisions, small_instances, unaligned_instances
from .base import Category, Facts, Inferred, Op, OpTypeError, Requirement, TensorType, check_dim, with_shape


def _part_size(t: TensorType, dim: int, parts: int) -> ex.Expr:
    return ex.div(t.shape[dim], parts)


@attrs.frozen
class Pad(Op):
    dim: int = attrs.field(default=1, metadata={"kind": "dim"})
    multiple: int = attrs.field(default=1, kw_only=True, metadata={"kind": "int", "min": 1})
    parts: int = attrs.field(default=1, kw_only=True, metadata={"kind": "int", "min": 1})
    value: int = attrs.field(default=0, kw_only=True, metadata={"kind": "int", "min": 0})

    name: ClassVar[str] = "pad"
    eager: ClassVar[Callable] = staticmethod(torch_impl.pad)
    facts: ClassVar[Facts] = Facts(Category.LOGICAL, on_axis=True)
    summary: ClassVar[str] = "zero-extend each of `parts` equal parts of dim to a multiple of `multiple`"
    notes: ClassVar[str] = "`parts=2`: per-half padding of a gated w13; `value=` the fill"
    needs: ClassVar[str] = "n % parts"

    def padded_part(self, t: TensorType, dim: int) -> ex.Expr:
        return ex.round_up(_part_size(t, dim, self.parts), self.multiple)

    def infer(self, t: TensorType) -> Inferred:
        d = check_dim(t, self.dim)
        if self.value >= 1 << t.elem.bits:
            raise OpTypeError(f"pad value {self.value} does not fit a {t.elem.name} element")
        reqs = (Requirement(t.shape[d], self.parts, "size"),) if self.parts > 1 else ()
        return Inferred(with_shape(t, d, ex.mul(self.padded_part(t, d), self.parts)), reqs)

    def index_map(self, t: TensorType) -> IndexMap:
        d = check_dim(t, self.dim)
        return pad_map(t.shape, d, self.padded_part(t, d), self.parts, self.value)

    def impl(self, t):
        return self.eager, (self.dim, self.multiple, self.parts, self.value)

    def inverse(self, t):
        d = check_dim(t, self.dim)
        return Crop(d, size=_part_size(t, d, self.parts), parts=self.parts)


@attrs.frozen
class Crop(Op):
    dim: int = attrs.field(default=1, metadata={"kind": "dim"})
    size: ex.Expr = attrs.field(default=None, kw_only=True, metadata={"kind": "expr"})
    parts: int = attrs.field(default=1, kw_only=True, metadata={"kind": "int", "min": 1})

    name: ClassVar[str] = "crop"
    eager: ClassVar[Callable] = staticmethod(torch_impl.crop)
    facts: ClassVar[Facts] = Facts(Category.LOGICAL, on_axis=True)
    summary: ClassVar[str] = "keep the first `size` entries of each of `parts` equal parts of dim"
    notes: ClassVar[str] = "the inverse of pad"
    needs: ClassVar[str] = "n % parts; size at most a part"

    def infer(self, t: TensorType) -> Inferred:
        d = check_dim(t, self.dim)
        if self.size is None:
            raise OpTypeError("crop needs size=<expression>")
        part = _part_size(t, d, self.parts)
        # Decidable only when the size is written in the part's own dims (else checked at run time).
        comparable = ex.free_vars(self.size) <= ex.free_vars(part)
        for dims in small_instances((part, self.size), [(t.shape[d], self.parts)]) if comparable else ():
            if ex.evaluate(self.size, dims) > ex.evaluate(part, dims):
                at = ", ".join(f"{k}={v}" for k, v in dims.items())
                raise OpTypeError(f"crop keeps {ex.to_str(self.size)} of each part, but a part has only "
                                  f"{ex.to_str(part)} (e.g. with {at})")
        reqs = [Requirement(t.shape[d], self.parts, "size")] if self.parts > 1 else []
        # Checked on the call's sizes as well (the check above is on small instances, or not made):
        # the fused kernels read the kept part without a bound of their own.
        keeps = ex.lt(self.size, ex.add(part, 1))
        reqs.append(Requirement(keeps, 0, f"crop's size {ex.to_str(self.size)} at most a part's {ex.to_str(part)}"))
        return Inferred(with_shape(t, d, ex.mul(self.size, self.parts)), tuple(reqs))

    def index_map(self, t: TensorType) -> IndexMap:
        return crop_map(t.shape, check_dim(t, self.dim), self.size, self.parts)

    def impl(self, t):
        return self.eager, (self.dim, self.size, self.parts)


@attrs.frozen
class Reshape(Op):
    shape: tuple[ex.Expr, ...] = attrs.field(metadata={"kind": "shape"})

    name: ClassVar[str] = "reshape"
    eager: ClassVar[Callable] = staticmethod(torch_impl.reshape)
    facts: ClassVar[Facts] = Facts(Category.SHAPE)
    summary: ClassVar[str] = "row-major reshape to a shape with the same number of elements"
    needs: ClassVar[str] = "the same number of elements"

    def infer(self, t: TensorType) -> Inferred:
        new = "[" + ", ".join(ex.to_str(s) for s in self.shape) + "]"
        before, after = ex.mul(*t.shape) if t.shape else ex.Const(1), ex.mul(*self.shape) if self.shape else ex.Const(1)
        for dims in small_instances(t.shape + self.shape):
            a, b = ex.evaluate(before, dims), ex.evaluate(after, dims)
            if a != b:
                at = ", ".join(f"{k}={v}" for k, v in dims.items())
                raise OpTypeError(f"reshape to {new} changes the number of elements of {t} (with {at}: {a} -> {b})")
        reqs = [Requirement(num, den, "size") for num, den in divisions(self.shape)]
        # Not an identity of the dims (equal_sizes probes aligned sizes, where round_up vanishes; unaligned
        # ones tell round_up(N, 128)*round_up(K/32, 4) from round_up(K/32, 128)*round_up(N, 4)): the count is
        # checked on every call, and check looks for an accepted size where it differs.
        if ex.same_value(before, after) is not True and (not equal_sizes(before, after) or any(
                ex.evaluate(before, d) != ex.evaluate(after, d) for d in unaligned_instances(t.shape + self.shape))):
            same = ex.and_(ex.lt(before, ex.add(after, 1)), ex.lt(after, ex.add(before, 1)))
            reqs.append(Requirement(same, 0, f"the same number of elements before and after ({ex.to_str(before)} "
                                             f"and {ex.to_str(after)})", everywhere=True))
        return Inferred(attrs.evolve(t, shape=self.shape), tuple(reqs))

    def index_map(self, t: TensorType) -> IndexMap:
        return reshape_map(t.shape, self.shape)

    def impl(self, t):
        return self.eager, (self.shape,)

    def inverse(self, t):
        return Reshape(t.shape)


@attrs.frozen
class Transpose(Op):
    dim0: int = attrs.field(metadata={"kind": "dim"})
    dim1: int = attrs.field(metadata={"kind": "dim"})

    name: ClassVar[str] = "transpose"
    eager: ClassVar[Callable] = staticmethod(torch_impl.transpose)
    facts: ClassVar[Facts] = Facts(Category.SHAPE)
    summary: ClassVar[str] = "swap two axes"

    def infer(self, t: TensorType) -> Inferred:
        a, b = check_dim(t, self.dim0), check_dim(t, self.dim1)
        shape = list(t.shape)
        shape[a], shape[b] = shape[b], shape[a]
        return Inferred(attrs.evolve(t, shape=tuple(shape)))

    def index_map(self, t: TensorType) -> IndexMap:
        a, b = check_dim(t, self.dim0), check_dim(t, self.dim1)
        src = list(out_vars(t.rank))
        src[a], src[b] = src[b], src[a]
        return IndexMap(t.shape, self.infer(t).type.shape, tuple(src))

    def impl(self, t):
        return self.eager, (self.dim0, self.dim1)

    def inverse(self, t):
        return self


@attrs.frozen
class Shard(Op):
    """Tensor-parallel slice: split ``dim`` into ``parts`` equal parts (2 for a gated w13: gate and up)
    and keep slice ``rank`` of ``ranks`` of each, the way engines shard MoE weights::

        out[o] = in[(o // S) * P + rank * S + o mod S],  P = n / parts,  S = P / ranks
    """

    dim: int = attrs.field(default=1, metadata={"kind": "dim"})
    rank: int = attrs.field(default=0, kw_only=True, metadata={"kind": "int", "min": 0})
    ranks: int = attrs.field(default=1, kw_only=True, metadata={"kind": "int", "min": 1})
    parts: int = attrs.field(default=1, kw_only=True, metadata={"kind": "int", "min": 1})

    name: ClassVar[str] = "shard"
    eager: ClassVar[Callable] = staticmethod(torch_impl.shard)
    facts: ClassVar[Facts] = Facts(Category.LOGICAL, on_axis=True, slice=True)
    summary: ClassVar[str] = "tensor-parallel slice `rank` of `ranks` of each of `parts` equal parts of dim"
    notes: ClassVar[str] = "`parts=2`: gate and up sliced separately; one rank of one is no step"
    needs: ClassVar[str] = "n % (parts·ranks)"

    def __attrs_post_init__(self):
        if self.rank >= self.ranks:
            raise OpTypeError(f"shard rank={self.rank} must be below ranks={self.ranks}")

    def infer(self, t: TensorType) -> Inferred:
        d = check_dim(t, self.dim)
        size = ex.div(t.shape[d], self.ranks)
        needs = self.parts * self.ranks
        return Inferred(with_shape(t, d, size), (Requirement(t.shape[d], needs, "size"),) if needs > 1 else ())

    def index_map(self, t: TensorType) -> IndexMap:
        d = check_dim(t, self.dim)
        part = ex.div(t.shape[d], self.parts)
        s = ex.div(part, self.ranks)
        o = out_var(d)
        src = list(out_vars(t.rank))
        if self.ranks > 1:  # one rank of one is the identity, kept so composed maps stay simple
            src[d] = ex.floordiv(o, s) * part + self.rank * s + ex.mod(o, s) if self.parts > 1 else self.rank * s + o
        out_shape = list(t.shape)
        out_shape[d] = ex.div(t.shape[d], self.ranks)
        return IndexMap(t.shape, tuple(out_shape), tuple(src))

    @property
    def is_identity(self) -> bool:
        return self.ranks == 1

    def inverse(self, t):
        # One rank of one is the identity; a real slice drops the other ranks' rows (like crop).
        return self if self.ranks == 1 else None

    def impl(self, t):
        return self.eager, (self.dim, self.rank, self.ranks, self.parts)


@attrs.frozen
class RepeatRows(Op):
    """Each entry of one axis repeated ``times`` times in place, ``out[r] = in[r // times]``: a block
    scale broadcast to the rows it scales (DeepGEMM's SM100 weight scales, ``sf.index_select(-2,
    arange(mn) // 128)`` in ``transform_sf_into_required_layout``). Not invertible as a layout (it
    reads each entry ``times`` times), so a kernel packing, not a logical step: use it inside a family."""

    dim: int = attrs.field(default=1, metadata={"kind": "dim"})
    times: int = attrs.field(default=1, kw_only=True, metadata={"kind": "int", "min": 1})

    name: ClassVar[str] = "repeat_rows"
    eager: ClassVar[Callable] = staticmethod(torch_impl.repeat_rows)
    facts: ClassVar[Facts] = Facts(Category.SHAPE, on_axis=True)
    summary: ClassVar[str] = "repeat each entry of dim `times` times: out[r] = in[r // times]"
    notes: ClassVar[str] = "a 128-row block scale broadcast to its rows (DeepGEMM SM100)"
    needs: ClassVar[str] = "none"

    def infer(self, t: TensorType) -> Inferred:
        d = check_dim(t, self.dim)
        return Inferred(with_shape(t, d, ex.mul(t.shape[d], self.times)))

    def index_map(self, t: TensorType) -> IndexMap:
        d = check_dim(t, self.dim)
        src = list(out_vars(t.rank))
        src[d] = ex.floordiv(out_var(d), self.times)
        return IndexMap(t.shape, self.infer(t).type.shape, tuple(src))

    def impl(self, t):
        return self.eager, (self.dim, self.times)

    def inverse(self, t):
        return None


@attrs.frozen
class BlockMajorK(Op):
    """TRT-LLM's block-major K layout (FlashInfer ``convert_to_block_layout``): K split into blocks
    of ``block`` elements, the block index outermost::

        [.., R, K] -> [.., K/block, R, block]     out[.., kb, r, j] = in[.., r, kb*block + j]
    """

    block: int = attrs.field(default=128, kw_only=True, metadata={"kind": "int", "min": 1})

    name: ClassVar[str] = "block_major_k"
    eager: ClassVar[Callable] = staticmethod(torch_impl.block_major_k)
    facts: ClassVar[Facts] = Facts(Category.SHAPE)
    summary: ClassVar[str] = "[.., R, K] -> [.., K/block, R, block] (convert_to_block_layout)"
    notes: ClassVar[str] = "TRT-LLM block-major K"
    needs: ClassVar[str] = "K % block"

    def infer(self, t: TensorType) -> Inferred:
        if t.rank < 2:
            raise OpTypeError(f"block_major_k needs rows and K (rank >= 2), got {t}")
        *lead, r, k = t.shape
        shape = (*lead, ex.div(k, self.block), r, ex.Const(self.block))
        return Inferred(attrs.evolve(t, shape=shape), (Requirement(k, self.block, "K"),))

    def index_map(self, t: TensorType) -> IndexMap:
        n = t.rank
        o = out_vars(n + 1)
        src = (*o[: n - 2], o[n - 1], o[n - 2] * self.block + o[n])
        return IndexMap(t.shape, self.infer(t).type.shape, src)

    def impl(self, t):
        return self.eager, (self.block,)

    def inverse(self, t):
        return UnblockMajorK()


@attrs.frozen
class UnblockMajorK(Op):
    """Inverse of block_major_k: ``[.., K/b, R, b] -> [.., R, K]``."""

    name: ClassVar[str] = "unblock_major_k"
    eager: ClassVar[Callable] = staticmethod(torch_impl.unblock_major_k)
    facts: ClassVar[Facts] = Facts(Category.SHAPE)
    summary: ClassVar[str] = "[.., K/b, R, b] -> [.., R, K] (inverse of block_major_k)"
    needs: ClassVar[str] = "a constant block"

    def infer(self, t: TensorType) -> Inferred:
        if t.rank < 3 or not isinstance(t.shape[-1], ex.Const):
            raise OpTypeError(f"unblock_major_k needs [.., K/b, R, b] with a constant block b, got {t}")
        *lead, kb, r, b = t.shape
        return Inferred(attrs.evolve(t, shape=(*lead, r, kb * b)))

    def index_map(self, t: TensorType) -> IndexMap:
        n = t.rank  # output rank n - 1
        b = t.shape[-1]
        o = out_vars(n - 1)
        src = (*o[: n - 3], ex.floordiv(o[n - 2], b), o[n - 3], ex.mod(o[n - 2], b))
        return IndexMap(t.shape, self.infer(t).type.shape, src)

    def impl(self, t):
        return self.eager, ()

    def inverse(self, t):
        return BlockMajorK(block=int(ex.evaluate(t.shape[-1], {})))


OPS = (Pad, Crop, Reshape, Transpose, Shard, RepeatRows, BlockMajorK, UnblockMajorK)
