"""Index maps: where each output element of a layout transform comes from.

An :class:`IndexMap` ``M`` from a tensor ``X`` (shape ``in_shape``) to a tensor
``Y`` (shape ``out_shape``) is a *gather*::

    Y[o0, o1, ...] = X[src0(o), src1(o), ...]   where valid(o)
                   = fill(o)                    elsewhere (padding)

``src_k`` are integer expressions (:mod:`layoutc.expr`) in the output coordinate
variables ``o0, o1, ...`` and the dimension symbols. Worked example, ``swap_halves``
on the rows of a ``[2I, K]`` matrix (``I = 2``)::

    out row  o0 : 0 1 2 3          src0 = (o0 + I) mod 2I
    in  row     : 2 3 0 1          src1 = o1

The algebra this module provides, each law tested over whole small domains:

* **composition** -- ``compose(A, B)`` is "apply A, then B": it substitutes B's
  source expressions into A's, so ``gather(compose(A, B), x) ==
  gather(B, gather(A, x))`` and a chain of any length is one map;
* **bit granularity** -- packed 4-bit data is permuted at the bit level by some
  kernels (the SM90 mixed-GEMM FP4 interleave). A byte tensor ``[..., n]`` is
  then seen as bits ``[..., n, 8]`` (bit ``b`` of byte ``j`` = ``(x[j] >> b) & 1``);
  :func:`lift_to_bits` turns any byte-level map into the equal bit-level one so
  maps of both kinds compose;
* **evaluation** -- :func:`gather` evaluates a map on real tensors with
  broadcast ``arange`` grids (one gather, no per-element Python), which is the
  reference every lowering is checked against.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import attrs
import torch

from . import expr as ex
from .expr import Expr, Var

BITS_PER_BYTE = 8


def out_var(k: int) -> Var:
    """The coordinate variable of output axis ``k``."""
    return Var(f"o{k}")


def out_vars(rank: int) -> tuple[Var, ...]:
    return tuple(out_var(k) for k in range(rank))


@attrs.frozen
class IndexMap:
    in_shape: tuple[Expr, ...]
    out_shape: tuple[Expr, ...]
    src: tuple[Expr, ...]  # one expression per input axis, in the output coordinates
    valid: Expr = ex.TRUE  # where the output reads the input; elsewhere it is ``fill``
    fill: Expr = ex.Const(0)
    bit_level: bool = False  # shapes end with a bit axis of size 8 (bytes seen as bits)

    def __attrs_post_init__(self) -> None:
        if len(self.src) != len(self.in_shape):
            raise ValueError(f"index map has {len(self.src)} source coordinates for a rank-{len(self.in_shape)} input")

    @property
    def in_rank(self) -> int:
        return len(self.in_shape)

    @property
    def out_rank(self) -> int:
        return len(self.out_shape)

    def is_total(self) -> bool:
        """True when every output element reads an input element (no padding)."""
        return self.valid == ex.TRUE

    def describe(self, in_name: str = "in", out_name: str = "out", names: Sequence[str] | None = None) -> str:
        """``out[o0, o1] = in[(o0 + I) mod 2*I, o1]`` with optional coordinate names."""
        names = list(names) if names is not None else [f"o{k}" for k in range(self.out_rank)]
        ren = {f"o{k}": n for k, n in enumerate(names)}
        src = ", ".join(ex.to_str(ex.rename(s, ren)) for s in self.src)
        text = f"{out_name}[{', '.join(names)}] = {in_name}[{src}]"
        if not self.is_total():
            text += f" if {ex.to_str(ex.rename(self.valid, ren))} else {ex.to_str(ex.rename(self.fill, ren))}"
        return text


def identity(shape: Sequence[Expr]) -> IndexMap:
    shape = tuple(ex.as_expr(s) for s in shape)
    return IndexMap(shape, shape, out_vars(len(shape)))


def lift_to_bits(m: IndexMap) -> IndexMap:
    """The bit-level map equal to byte-level ``m``: bit ``b`` follows its byte."""
    if m.bit_level:
        return m
    bit = out_var(m.out_rank)
    pow2 = tuple(1 << b for b in range(BITS_PER_BYTE))
    fill_bit = ex.mod(ex.floordiv(m.fill, ex.table(pow2, bit)), 2) if m.fill != ex.Const(0) else m.fill
    return IndexMap(
        m.in_shape + (ex.Const(BITS_PER_BYTE),),
        m.out_shape + (ex.Const(BITS_PER_BYTE),),
        m.src + (bit,),
        m.valid,
        fill_bit,
        bit_level=True,
    )


def compose(first: IndexMap, second: IndexMap) -> IndexMap:
    """The map of "apply ``first``, then ``second``" (second's input is first's output)."""
    if first.bit_level != second.bit_level:
        first, second = lift_to_bits(first), lift_to_bits(second)
    if len(first.out_shape) != len(second.in_shape):
        raise ValueError(
            f"cannot compose: first map yields rank {len(first.out_shape)}, second expects rank {len(second.in_shape)}"
        )
    sub = {f"o{k}": s for k, s in enumerate(second.src)}
    src = tuple(ex.substitute(s, sub) for s in first.src)
    inner_valid = ex.substitute(first.valid, sub)
    valid = ex.and_(second.valid, inner_valid)
    if first.is_total():
        fill = second.fill
    elif second.is_total():
        fill = ex.substitute(first.fill, sub)
    else:
        fill = ex.where(second.valid, ex.substitute(first.fill, sub), second.fill)
    return IndexMap(first.in_shape, second.out_shape, src, valid, fill, first.bit_level)


def compose_all(maps: Sequence[IndexMap]) -> IndexMap:
    out = maps[0]
    for m in maps[1:]:
        out = compose(out, m)
    return out


def drop_bit_axis(m: IndexMap) -> IndexMap | None:
    """The byte-level map equal to a bit-level ``m``, or None if ``m`` moves bits
    between byte positions (the byte map then does not exist)."""
    if not m.bit_level:
        return m
    bit = out_var(m.out_rank - 1)
    if m.src[-1] != bit or any(bit.name in ex.free_vars(s) for s in m.src[:-1]):
        return None
    if bit.name in ex.free_vars(m.valid):
        return None
    fill = _byte_fill(m.fill, bit)
    if fill is None:
        return None
    return IndexMap(m.in_shape[:-1], m.out_shape[:-1], m.src[:-1], m.valid, fill, bit_level=False)


def _byte_fill(fill: Expr, bit: Var) -> Expr | None:
    """The byte value whose bits ``fill`` spells (the form lift_to_bits writes), or None."""
    if fill == ex.Const(0):
        return fill
    pow2 = ex.table(tuple(1 << b for b in range(BITS_PER_BYTE)), bit)
    if isinstance(fill, ex.Mod) and fill.den == ex.Const(2) and isinstance(fill.num, ex.FloorDiv) \
            and fill.num.den == pow2 and bit.name not in ex.free_vars(fill.num.num):
        return fill.num.num
    return None


def concrete_shape(shape: Sequence[Expr], dims: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(int(ex.evaluate(s, dims)) for s in shape)


def coordinate_grids(shape: Sequence[int], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """``o_k = arange(shape[k])`` shaped to broadcast along axis ``k``."""
    rank = len(shape)
    grids = {}
    for k, n in enumerate(shape):
        view = [1] * rank
        view[k] = n
        grids[f"o{k}"] = torch.arange(n, dtype=torch.int64, device=device).view(view)
    return grids


def source_indices(m: IndexMap, dims: Mapping[str, int], device: torch.device | str = "cpu"):
    """(linear source index, valid mask, fill values) over the whole output, as tensors."""
    out_shape = concrete_shape(m.out_shape, dims)
    in_shape = concrete_shape(m.in_shape, dims)
    env = dict(dims)
    env.update(coordinate_grids(out_shape, device))
    linear = torch.zeros(out_shape, dtype=torch.int64, device=device)
    stride = 1
    for k in reversed(range(len(in_shape))):
        linear = linear + torch.as_tensor(ex.evaluate(m.src[k], env), device=device) * stride
        stride *= in_shape[k]
    valid = torch.as_tensor(ex.evaluate(m.valid, env), device=device).to(torch.bool).expand(out_shape)
    fill = torch.as_tensor(ex.evaluate(m.fill, env), device=device).expand(out_shape)
    return linear, valid, fill


def bytes_to_bits(x: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(BITS_PER_BYTE, dtype=torch.uint8, device=x.device)
    return (x.unsqueeze(-1) >> shifts) & 1


def bits_to_bytes(bits: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(BITS_PER_BYTE, dtype=torch.int64, device=bits.device)
    return (bits.to(torch.int64) << shifts).sum(-1).to(torch.uint8)


def gather(m: IndexMap, x: torch.Tensor, dims: Mapping[str, int] | None = None) -> torch.Tensor:
    """Evaluate ``m`` on tensor ``x``: the reference semantics of an index map."""
    dims = dict(dims or {})
    if m.bit_level:
        if x.element_size() != 1:
            raise ValueError(f"a bit-level map needs a 1-byte tensor, got {x.dtype}")
        raw = x.contiguous().view(torch.uint8)
        out_bits = gather(attrs.evolve(m, bit_level=False), bytes_to_bits(raw), dims)
        return bits_to_bytes(out_bits).view(x.dtype)
    expected = concrete_shape(m.in_shape, dims)
    if tuple(x.shape) != expected:
        raise ValueError(f"index map expects an input of shape {list(expected)}, got {list(x.shape)}")
    linear, valid, fill = source_indices(m, dims, x.device)
    flat = x.contiguous().reshape(-1)
    if flat.numel() == 0:
        picked = torch.zeros(linear.shape, dtype=x.dtype, device=x.device)
    else:
        picked = flat[torch.where(valid, linear, torch.zeros_like(linear))]
    if m.is_total():
        return picked
    return torch.where(valid, picked, fill.to(x.dtype))


# ---------------------------------------------------------------------------
# building blocks: kernel layouts are compositions of these


def unravel(linear: Expr, shape: Sequence[Expr]) -> tuple[Expr, ...]:
    """Row-major coordinates of a linear index in ``shape`` (the outermost needs no modulo)."""
    coords: list[Expr] = []
    stride: Expr = ex.Const(1)
    for k in reversed(range(len(shape))):
        c = ex.floordiv(linear, stride)
        coords.append(c if k == 0 else ex.mod(c, shape[k]))
        stride = ex.mul(stride, shape[k])
    return tuple(reversed(coords))


def ravel(coords: Sequence[Expr], shape: Sequence[Expr]) -> Expr:
    linear: Expr = ex.Const(0)
    for c, size in zip(coords, shape):
        linear = ex.add(ex.mul(linear, size), c)
    return linear


def reshape_map(in_shape: Sequence[Expr], out_shape: Sequence[Expr]) -> IndexMap:
    """Row-major reshape: same linear order, new shape."""
    in_shape = tuple(ex.as_expr(s) for s in in_shape)
    out_shape = tuple(ex.as_expr(s) for s in out_shape)
    # Equal leading axes (experts) reshape independently: keep them as plain coordinates, so the
    # composed arithmetic stays per expert instead of running over the whole tensor.
    lead = 0
    while lead < min(len(in_shape), len(out_shape)) - 1 and in_shape[lead] == out_shape[lead]:
        lead += 1
    outs = out_vars(len(out_shape))
    linear = ravel(outs[lead:], out_shape[lead:])
    return IndexMap(in_shape, out_shape, tuple(outs[:lead]) + unravel(linear, in_shape[lead:]))


def permute_map(in_shape: Sequence[Expr], perm: Sequence[int]) -> IndexMap:
    """Output axis ``k`` is input axis ``perm[k]`` (torch ``permute`` semantics)."""
    in_shape = tuple(ex.as_expr(s) for s in in_shape)
    if sorted(perm) != list(range(len(in_shape))):
        raise ValueError(f"{list(perm)} is not a permutation of {len(in_shape)} axes")
    src: list[Expr] = [ex.Const(0)] * len(in_shape)
    for k, p in enumerate(perm):
        src[p] = out_var(k)
    return IndexMap(in_shape, tuple(in_shape[p] for p in perm), tuple(src))


def table_map(in_shape: Sequence[Expr], dim: int, values: Sequence[int]) -> IndexMap:
    """Permute axis ``dim`` by a constant table: ``out[.., i, ..] = in[.., values[i], ..]``."""
    in_shape = tuple(ex.as_expr(s) for s in in_shape)
    src = list(out_vars(len(in_shape)))
    src[dim] = ex.table(values, src[dim])
    return IndexMap(in_shape, in_shape, tuple(src))


def _resize_parts(in_shape: Sequence[Expr], dim: int, size: Expr, parts: int) -> tuple[IndexMap, Expr]:
    """Axis ``dim`` split into ``parts`` equal parts, each now ``size`` long (reading the same
    offsets of its part); also returns the offset within a part, for the padding test."""
    in_shape = tuple(ex.as_expr(s) for s in in_shape)
    part = ex.div(in_shape[dim], parts)
    o = out_var(dim)
    within = ex.mod(o, size) if parts > 1 else o
    src = list(out_vars(len(in_shape)))
    src[dim] = ex.floordiv(o, size) * part + within if parts > 1 else o
    out_shape = list(in_shape)
    out_shape[dim] = ex.mul(size, parts)
    return IndexMap(in_shape, tuple(out_shape), tuple(src)), ex.lt(within, part)


def pad_map(in_shape: Sequence[Expr], dim: int, size: Expr, parts: int = 1, fill: int = 0) -> IndexMap:
    """Split axis ``dim`` into ``parts`` equal parts and extend each to ``size`` with ``fill``."""
    m, inside = _resize_parts(in_shape, dim, size, parts)
    return attrs.evolve(m, valid=inside, fill=ex.Const(fill))


def crop_map(in_shape: Sequence[Expr], dim: int, size: Expr, parts: int = 1) -> IndexMap:
    """Keep the first ``size`` entries of each of ``parts`` equal parts of axis ``dim``."""
    return _resize_parts(in_shape, dim, size, parts)[0]


def bits_of(m: IndexMap) -> IndexMap:
    """Alias of :func:`lift_to_bits` for readable chains."""
    return lift_to_bits(m)
