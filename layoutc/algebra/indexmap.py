"""Index maps: where each output element of a layout transform comes from.

An :class:`IndexMap` ``M`` from a tensor ``X`` (shape ``in_shape``) to a tensor
``Y`` (shape ``out_shape``) is a *gather*::

    Y[o0, o1, ...] = X[src0(o), src1(o), ...]   where valid(o)
                   = fill(o)                    elsewhere (padding)

``src_k`` are integer expressions (:mod:`layoutc.algebra.expr`) in the output coordinate
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


def lift_to_bits(m: IndexMap, width: int = BITS_PER_BYTE) -> IndexMap:
    """The bit-level map equal to element-level ``m`` on elements of ``width`` bits: bit ``b`` follows
    its element."""
    if m.bit_level:
        return m
    bit = out_var(m.out_rank)
    pow2 = tuple(1 << b for b in range(width))
    fill_bit = ex.mod(ex.floordiv(m.fill, ex.table(pow2, bit)), 2) if m.fill != ex.Const(0) else m.fill
    return IndexMap(
        m.in_shape + (ex.Const(width),),
        m.out_shape + (ex.Const(width),),
        m.src + (bit,),
        m.valid,
        fill_bit,
        bit_level=True,
    )


def compose(first: IndexMap, second: IndexMap) -> IndexMap:
    """The map of "apply ``first``, then ``second``" (second's input is first's output). A bit-level
    map composes with an element-level one lifted to the width of the elements between them."""
    if first.bit_level and not second.bit_level:
        second = lift_to_bits(second, _width(first.out_shape[-1]))
    elif second.bit_level and not first.bit_level:
        first = lift_to_bits(first, _width(second.in_shape[-1]))
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


def _width(axis: Expr) -> int:
    if not isinstance(axis, ex.Const):
        raise ValueError(f"a bit axis has a constant size, got {ex.to_str(axis)}")
    return axis.value


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


_INT_OF_BYTES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bytes_to_bits(x: torch.Tensor) -> torch.Tensor:
    """Each element's bits along a new last axis (bit ``b`` = ``(x >> b) & 1``), for any element width."""
    width = 8 * x.element_size()
    raw = x.contiguous().view(_INT_OF_BYTES[x.element_size()])
    if width == 8:
        shifts = torch.arange(BITS_PER_BYTE, dtype=torch.uint8, device=x.device)
        return (raw.unsqueeze(-1) >> shifts) & 1
    shifts = torch.arange(width, dtype=torch.int64, device=x.device)
    return ((raw.to(torch.int64).unsqueeze(-1) >> shifts) & 1).to(torch.uint8)


def bits_to_bytes(bits: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`bytes_to_bits`: elements as wide as the last axis (8 bits: uint8)."""
    width = bits.shape[-1]
    shifts = torch.arange(width, dtype=torch.int64, device=bits.device)
    word = (bits.to(torch.int64) << shifts).sum(-1)
    if width == 8:
        return word.to(torch.uint8)
    if width < 64:
        word = torch.where(word >= 1 << (width - 1), word - (1 << width), word)
    return word.to(_INT_OF_BYTES[width // 8])


def gather(m: IndexMap, x: torch.Tensor, dims: Mapping[str, int] | None = None,
           dtype: torch.dtype | None = None) -> torch.Tensor:
    """Evaluate ``m`` on tensor ``x``: the reference semantics of an index map. A bit-level map's output
    elements are as wide as its output bit axis; ``dtype`` labels them (default: ``x``'s dtype when
    the width is the same, else a same-width integer)."""
    dims = dict(dims or {})
    if m.bit_level:
        width_in = _width(m.in_shape[-1])
        if width_in != 8 * x.element_size():
            raise ValueError(f"a bit-level map over {width_in}-bit elements, given {x.dtype}")
        out_bits = gather(attrs.evolve(m, bit_level=False), bytes_to_bits(x), dims)
        words = bits_to_bytes(out_bits)
        if dtype is None and words.element_size() == x.element_size():
            dtype = x.dtype
        return words.view(dtype) if dtype is not None else words
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
    # the fill is a bit pattern (pad's value=): written through a same-width integer view
    same_width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    width = 8 * x.element_size()
    fill = torch.where(fill >= 1 << (width - 1), fill - (1 << width), fill) if 8 < width < 64 else fill
    return torch.where(valid, picked.view(same_width), fill.to(same_width)).view(x.dtype)


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
    """Row-major reshape: same linear order, new shape.

    Where the reshape only splits axes and merges neighbours (``[N, KB] -> [N/16, 2, 8, KB/32, 8, 4]``),
    each group of axes gets its own arithmetic (``row = 16*g + 8*tr + r8``) instead of one linear
    index over the whole tensor: composed maps then simplify axis by axis. Equal leading axes
    (experts) are plain coordinates."""
    in_shape = tuple(ex.as_expr(s) for s in in_shape)
    out_shape = tuple(ex.as_expr(s) for s in out_shape)
    outs = out_vars(len(out_shape))
    groups = _axis_groups(in_shape, out_shape)
    if groups is None:  # no grouping: one linear index past the equal leading axes
        lead = 0
        while lead < min(len(in_shape), len(out_shape)) - 1 and in_shape[lead] == out_shape[lead]:
            lead += 1
        groups = [(range(k, k + 1), range(k, k + 1)) for k in range(lead)]
        groups.append((range(lead, len(in_shape)), range(lead, len(out_shape))))
    src: list[Expr] = []
    for ins, os_ in groups:
        linear = ravel([outs[k] for k in os_], [out_shape[k] for k in os_])
        src += unravel(linear, [in_shape[k] for k in ins]) if len(ins) > 1 else [linear]
    return IndexMap(in_shape, out_shape, tuple(src))


#: Bindings of the dims at which sizes are compared numerically (multiples of 4096 times distinct
#: primes: every exact division in a size holds there, and different polynomials differ).
_PROBES = (4096 * 1009, 4096 * 2027, 4096 * 3121)


def _size_at(e: Expr, k: int) -> int:
    return int(ex.evaluate(e, _ProbeEnv(k)))


class _ProbeEnv(dict):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def __contains__(self, name) -> bool:
        return True

    def __getitem__(self, name) -> int:
        return _PROBES[self.k] + 2 * 4096 * (sum(map(ord, name)) % 97)


def equal_sizes(a: Expr, b: Expr) -> bool:
    """``a == b`` for every binding of the dims (linear forms, else equal at a few large bindings: sizes are
    polynomials with exact divisions, so different ones differ there)."""
    return _equal_sizes(a, b)


def _equal_sizes(a: Expr, b: Expr) -> bool:
    same = ex.same_value(a, b)
    if same is not None:
        return same
    return all(_size_at(a, k) == _size_at(b, k) for k in range(len(_PROBES)))


def _axis_groups(in_shape: tuple[Expr, ...], out_shape: tuple[Expr, ...]):
    """Consecutive runs of input and output axes with equal products, each run one axis on one side
    (a split or a merge), or None when the reshape is not such a regrouping."""
    groups, i, j = [], 0, 0
    while i < len(in_shape) and j < len(out_shape):
        a, b = [i], [j]
        pa, pb = in_shape[i], out_shape[j]
        while not _equal_sizes(pa, pb):
            if _size_at(pa, 0) < _size_at(pb, 0) and a[-1] + 1 < len(in_shape):
                a.append(a[-1] + 1)
                pa = ex.mul(pa, in_shape[a[-1]])
            elif _size_at(pb, 0) < _size_at(pa, 0) and b[-1] + 1 < len(out_shape):
                b.append(b[-1] + 1)
                pb = ex.mul(pb, out_shape[b[-1]])
            else:
                return None
        if len(a) > 1 and len(b) > 1:
            return None
        groups.append((range(a[0], a[-1] + 1), range(b[0], b[-1] + 1)))
        i, j = a[-1] + 1, b[-1] + 1
    if i != len(in_shape) or j != len(out_shape):
        return None
    return groups


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

