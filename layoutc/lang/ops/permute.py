"""Permutations given as data: of one axis (``permute``) and of the bits within words (``permute_bits``).

``permute(t, dim=1, src=FORMULA)`` -- output row ``r`` of the axis (of size ``n``) reads input row
``FORMULA``, an integer expression in ``r``, ``n`` and the dims (``//`` and ``%`` included)::

    permute(t, dim=-2, src=32*(r//32) + 4*(r%8) + (r%32)//8, inverse=32*(r//32) + 8*(r%4) + (r%32)//4)

``block=B`` states the sizes the formula is a permutation for (``n % B == 0``; a formula of
``r // 32`` and ``r % 32`` permutes blocks of 32 rows), checked by the converter like every size rule.

``permute(t, dim=1, table=[2, 0, 3, 1])`` -- the same with a table repeated along the axis:
``src = L*(r//L) + table[r % L]`` (``L`` the table's length, ``n % L == 0``).

The formula must be a permutation: checked on small instances of the dims at compile time, and
``inverse=`` (when given) must undo it. Without ``inverse=`` the op is still invertible for the
converter (the eager inverse inverts the index vector), but its inverse has no symbolic map.

``permute_bits(t, table=[...])`` -- each little-endian word of ``len(table)`` bits (bytes along
the last axis, 8/16/32/64-bit words) has its bits permuted: ``out_bit[i] = in_bit[table[i]]``.
``permute_bits(t, word=32, src=FORMULA)`` gives the table as a formula in ``i``. This is what the
SM90 mixed-GEMM FP4 weight interleave does between its byte gathers (see ``prelude.lyt``).
"""

from __future__ import annotations

from typing import Callable, ClassVar

import attrs

from ...algebra import expr as ex
from ...algebra.indexmap import IndexMap, compose_all, out_var, reshape_map, table_map
from ...algebra.instances import small_instances
from . import torch_impl
from .conversion import BitPermutation
from .base import BinderArg, Category, Facts, Inferred, Op, OpTypeError, Requirement, TensorType, along, check_dim

#: The variables of a permute formula: the output index along the axis and the axis size.
ROW, SIZE = "r", "n"
#: The variable of a bit-table formula: the output bit.
BIT = "i"


@attrs.frozen
class IndexFormula:
    """An index formula that eager code evaluates over ``arange(n)``: rendered as a lambda."""

    expr: ex.Expr

    def source(self) -> str:
        return f"lambda {ROW}, {SIZE}, _dev: {ex.to_torch(self.expr)}"


def _periodic(table: tuple[int, ...]) -> ex.Expr:
    r = ex.Var(ROW)
    n = len(table)
    return ex.add(ex.mul(ex.floordiv(r, n), n), ex.table(table, ex.mod(r, n)))


def _inverse_table(table: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(table)
    for i, s in enumerate(table):
        inv[s] = i
    return tuple(inv)


def _check_table(table: tuple[int, ...], what: str) -> None:
    if sorted(table) != list(range(len(table))):
        missing = sorted(set(range(len(table))) - set(table))
        raise OpTypeError(f"{what} {list(table)} is not a permutation of 0..{len(table) - 1}"
                          + (f" ({missing[0]} is missing)" if missing else ""))


@attrs.frozen
class Permute(Op):
    dim: int = attrs.field(default=1, metadata={"kind": "dim"})
    src: ex.Expr | None = attrs.field(default=None, kw_only=True, metadata={"kind": "formula", "vars": (ROW, SIZE)})
    inverse_src: ex.Expr | None = attrs.field(default=None, kw_only=True,
                                              metadata={"kind": "formula", "vars": (ROW, SIZE), "arg": "inverse"})
    table: tuple[int, ...] | None = attrs.field(default=None, kw_only=True, metadata={"kind": "table"})
    block: int = attrs.field(default=1, kw_only=True, metadata={"kind": "int", "min": 1})

    name: ClassVar[str] = "permute"
    eager: ClassVar[Callable] = staticmethod(torch_impl.permute_axis)
    facts: ClassVar[Facts] = Facts(Category.LOGICAL, on_axis=True)
    summary: ClassVar[str] = "permute one axis: src=FORMULA of r (and n), or table=[...] repeated"
    notes: ClassVar[str] = ("`src=32*(r//32) + 4*(r%8) + (r%32)//8`; `inverse=` gives the inverse formula, `block=B` "
                            "says the formula permutes within blocks of B; `table=[..]` repeats along the axis")
    needs: ClassVar[str] = "a permutation on every sampled size; a table: n % len(table)"

    def __attrs_post_init__(self):
        if (self.src is None) == (self.table is None):
            raise OpTypeError("permute needs src=FORMULA or table=[...] (one of them)")
        if self.table is not None:
            _check_table(self.table, "table")
            if self.inverse_src is not None:
                raise OpTypeError("a table's inverse is known: give inverse= only with src=")

    def formula(self) -> ex.Expr:
        return self.src if self.src is not None else _periodic(self.table)

    def inverse_formula(self) -> ex.Expr | None:
        if self.table is not None:
            return _periodic(_inverse_table(self.table))
        return self.inverse_src

    def _at(self, e: ex.Expr, r: ex.Expr, n: ex.Expr) -> ex.Expr:
        return ex.substitute(e, {ROW: r, SIZE: n})

    def infer(self, t: TensorType) -> Inferred:
        d = check_dim(t, self.dim)
        n = t.shape[d]
        period = len(self.table) if self.table is not None else self.block
        reqs = (Requirement(n, period, "size"),) if period > 1 else ()
        self._check_bijection(n, reqs)
        return Inferred(t, reqs)

    def _check_bijection(self, n: ex.Expr, reqs) -> None:
        """On small instances: every output index reads an index in range, no two the same, and
        ``inverse`` undoes it."""
        import torch

        fwd, inv = self.formula(), self.inverse_formula()
        for dims in small_instances((n,), [(q.value, q.multiple) for q in reqs])[:6]:
            size = int(ex.evaluate(n, dims))
            if size == 0 or size > 1 << 16:
                continue
            r = torch.arange(size)
            env = dict(dims, **{ROW: r, SIZE: size})
            src = torch.as_tensor(ex.evaluate(fwd, env)).expand(size)
            at = ", ".join(f"{k}={v}" for k, v in dims.items()) or f"n={size}"
            bad = (src < 0) | (src >= size)
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                raise OpTypeError(f"permute: output index {i} reads {int(src[i])}, outside 0..{size - 1} (with {at})")
            counts = torch.bincount(src, minlength=size)
            if bool((counts != 1).any()):
                twice = int((counts > 1).nonzero()[0])
                who = (src == twice).nonzero().flatten().tolist()[:2]
                raise OpTypeError(f"permute: src is not a permutation: outputs {who[0]} and {who[1]} both read "
                                  f"{twice} (with {at})")
            if inv is not None:
                back = torch.as_tensor(ex.evaluate(inv, dict(env, **{ROW: src}))).expand(size)
                if not torch.equal(back, r):
                    i = int((back != r).nonzero()[0])
                    raise OpTypeError(f"permute: inverse= does not undo src= at output index {i} (with {at})")

    def index_map(self, t: TensorType) -> IndexMap:
        d = check_dim(t, self.dim)
        return along(t, d, self._at(self.formula(), out_var(d), t.shape[d]))

    def impl(self, t: TensorType):
        return self.eager, (check_dim(t, self.dim), IndexFormula(self.formula()))

    def inverse(self, t: TensorType) -> Op:
        d = check_dim(t, self.dim)
        if self.table is not None:
            return Permute(d, table=_inverse_table(self.table))
        if self.inverse_src is not None:
            return Permute(d, src=self.inverse_src, inverse_src=self.src, block=self.block)
        return InversePermute(d, src=self.src, block=self.block)


@attrs.frozen
class InversePermute(Op):
    """The inverse of a formula permutation given without ``inverse=``: eager only (it inverts the
    index vector), so it has no index map; converters use it in ``inverse()``."""

    dim: int = attrs.field(default=1, metadata={"kind": "dim"})
    src: ex.Expr = attrs.field(default=None, kw_only=True, metadata={"kind": "formula", "vars": (ROW, SIZE)})
    block: int = attrs.field(default=1, kw_only=True, metadata={"kind": "int", "min": 1})

    name: ClassVar[str] = "inverse_permute"
    eager: ClassVar[Callable] = staticmethod(torch_impl.unpermute_axis)
    public: ClassVar[bool] = False
    facts: ClassVar[Facts] = Facts(Category.LOGICAL, on_axis=True)
    summary: ClassVar[str] = "inverse of permute(src=...) without inverse=: out[src(r)] = in[r]"

    def infer(self, t: TensorType) -> Inferred:
        n = t.shape[check_dim(t, self.dim)]
        return Inferred(t, (Requirement(n, self.block, "size"),) if self.block > 1 else ())

    def index_map(self, t: TensorType) -> IndexMap:
        raise OpTypeError("this permutation's inverse has no formula: give permute(..., inverse=FORMULA)")

    def impl(self, t: TensorType):
        return self.eager, (check_dim(t, self.dim), IndexFormula(self.src))

    def inverse(self, t: TensorType) -> Op:
        return Permute(check_dim(t, self.dim), src=self.src, block=self.block)


def bit_table(word: int, formula: ex.Expr) -> tuple[int, ...]:
    return tuple(int(ex.evaluate(formula, {BIT: i})) for i in range(word))


@attrs.frozen
class PermuteBits(Op):
    table: tuple[int, ...] = attrs.field(default=None, metadata={"kind": "table"})

    name: ClassVar[str] = "permute_bits"
    eager: ClassVar[Callable] = staticmethod(torch_impl.permute_bits)
    facts: ClassVar[Facts] = Facts(Category.SHAPE, bits=True)
    binder_args: ClassVar[tuple] = (BinderArg("word", {"kind": "int", "min": 8}),
                                    BinderArg("src", {"kind": "formula", "vars": (BIT,)}))
    summary: ClassVar[str] = "permute the bits of each little-endian word: out_bit[i] = in_bit[table[i]]"
    notes: ClassVar[str] = "`word=` 8/16/32/64 bits, `src=` a formula of `i` instead of a table"
    needs: ClassVar[str] = "bytes per word divide the last axis"

    def __attrs_post_init__(self):
        if len(self.table) not in (8, 16, 32, 64):
            raise OpTypeError(f"a bit table covers a word of 8, 16, 32 or 64 bits; this one has {len(self.table)}")
        _check_table(self.table, "the bit table")

    @classmethod
    def specialize(cls, values: dict, t: TensorType) -> Op:
        formula, word = values.pop("src", None), values.pop("word", None)
        if formula is not None:
            if "table" in values:
                raise OpTypeError("give permute_bits table=[...] or word= with src=, not both")
            if word is None:
                raise OpTypeError("permute_bits(src=FORMULA) needs word= (8, 16, 32 or 64 bits)")
            values["table"] = bit_table(word, formula)
        elif word is not None and "table" in values and len(values["table"]) != word:
            raise OpTypeError(f"word={word} but the table has {len(values['table'])} entries")
        if "table" not in values:
            raise OpTypeError("permute_bits needs table=[...] (or word= and src=FORMULA of i)")
        return cls(**values)

    @property
    def word_bytes(self) -> int:
        return len(self.table) // 8

    def infer(self, t: TensorType) -> Inferred:
        if t.rank < 1:
            raise OpTypeError(f"permute_bits needs an axis of bytes, got {t}")
        if t.elem.bits != 8:
            raise OpTypeError(f"permute_bits moves the bits of one-byte elements (packed FP4, bytes); got "
                              f"{t.elem.name} ({t.elem.bits} bits)", hint="view it as bytes first: view(t, u8)")
        reqs = (Requirement(t.shape[-1], self.word_bytes, "bytes in the last axis"),) if self.word_bytes > 1 else ()
        return Inferred(t, reqs)

    def index_map(self, t: TensorType) -> IndexMap:
        *lead, n = t.shape
        lead = tuple(lead)
        w = self.word_bytes
        words = lead + (ex.div(n, w), len(self.table))  # the word's bits, bit i = byte i//8, bit i%8
        bits = t.shape + (ex.Const(8),)
        m = compose_all([reshape_map(bits, words), table_map(words, len(words) - 1, self.table),
                         reshape_map(words, bits)])
        return attrs.evolve(m, bit_level=True)

    def impl(self, t: TensorType):
        return self.eager, (self.table,)

    def word_permutation(self) -> BitPermutation:
        return BitPermutation(self.word_bytes, self.table)

    def inverse(self, t: TensorType) -> Op:
        return PermuteBits(_inverse_table(self.table))


OPS = (Permute, InversePermute, PermuteBits)
