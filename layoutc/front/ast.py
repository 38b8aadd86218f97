"""Syntax tree of a .lyt spec: frozen nodes, each with its source position."""

from __future__ import annotations

from typing import Any, Union

import attrs

from ..algebra.expr import Expr


@attrs.frozen
class Pos:
    line: int
    column: int
    end_line: int
    end_column: int

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


@attrs.frozen
class Name:
    text: str
    pos: Pos


# -- values -----------------------------------------------------------------


@attrs.frozen
class ExprValue:
    """A size/integer expression; ``a/b`` divisions are kept so their exactness can be required."""

    expr: Expr
    text: str
    pos: Pos
    divisions: tuple[tuple[Expr, Expr], ...] = ()  # (numerator, denominator) of each '/'
    multiples: tuple[tuple[Expr, Pos], ...] = ()  # round_up/ceil_div second arguments that are names (parameters)
    operands: tuple[ExprValue, ...] = ()  # of a binary operator, as written (``assume I % 64 == 0``)


@attrs.frozen
class StrValue:
    value: str
    text: str
    pos: Pos


@attrs.frozen
class BoolValue:
    value: bool
    text: str
    pos: Pos


@attrs.frozen
class EllipsisValue:
    """``...`` in a shape list: the leading axes, whatever their number (``[..., R, C]``)."""

    text: str
    pos: Pos


@attrs.frozen
class ListValue:
    items: tuple[Value, ...]
    text: str
    pos: Pos


Value = Union[ExprValue, StrValue, BoolValue, ListValue, EllipsisValue]


# -- declarations -----------------------------------------------------------


@attrs.frozen
class SpecName:
    name: Name
    pos: Pos


@attrs.frozen
class Requires:
    library: Name
    op: str
    version: str
    pos: Pos


@attrs.frozen
class Dims:
    names: tuple[Name, ...]
    pos: Pos


@attrs.frozen
class Assume:
    """``assume I % 64 == 0`` (``value`` = I, ``multiple`` = 64) or ``assume I >= 128`` (``multiple`` None,
    ``op`` and ``bound``)."""

    value: ExprValue
    multiple: ExprValue | None  # a constant once integer parameters are substituted
    pos: Pos
    op: str = "%"
    bound: ExprValue | None = None


@attrs.frozen
class Compare:
    """One comparison of an ``assume`` line: ``N != 96``, ``1 <= N`` (``lhs op rhs``)."""

    lhs: ExprValue
    op: str
    rhs: ExprValue


@attrs.frozen
class SizeAssume:
    """``assume N != 96``, ``assume 1 <= N <= 65536``, ``assume N in 64..8192``, ``assume I < 16 or I >= 64``:
    a condition on the sizes the spec accepts. One of ``alternatives`` holds ('or'); each is a
    conjunction of comparisons (a range is two)."""

    alternatives: tuple[tuple[Compare, ...], ...]
    pos: Pos
    text: str


@attrs.frozen
class Param:
    name: Name
    default: Value
    choices: ListValue | None
    pos: Pos


@attrs.frozen
class ScaleTie:
    """``scales W block 32``: this tensor holds one scale per 32 elements of W along K, W's rows.
    ``scales W block 128x128``: one scale per 128 rows x 128 K elements of W (FP8 block scales)."""

    weight: Name
    block: int
    pos: Pos
    row_block: int = 1
    along: Name | None = None  # ``scales W block 32 along K``: the dim that names the block axis (K-major weights)


@attrs.frozen
class BiasTie:
    """``bias of W``: one value per output row of W."""

    weight: Name
    pos: Pos


@attrs.frozen
class StackedRows:
    """``rows [w1; w3]``: equal shards stacked along the row axis."""

    shards: tuple[Name, ...]
    pos: Pos


@attrs.frozen
class InterleavedRows:
    """``rows interleave(w1, w3, group=1)``: shards alternate in groups of rows."""

    shards: tuple[Name, ...]
    group: int
    pos: Pos


RowLayout = Union[StackedRows, InterleavedRows]


@attrs.frozen
class Packing:
    family: Name
    pos: Pos
    more: tuple[Name, ...] = ()  # ``packing trtllm + sf_128x4``: every family the tensor carries
    args: tuple[tuple[str, Name, ExprValue], ...] = ()  # ``trtllm(epilogue_tile=64)``, ``F(w=num_warps)``: (family, key, value)

    @property
    def families(self) -> tuple[Name, ...]:
        return (self.family,) + self.more


@attrs.frozen
class TensorDecl:
    direction: str  # "input" | "output"
    name: Name
    optional: bool
    elem: Name
    shape: tuple[ExprValue, ...]
    tie: ScaleTie | BiasTie | None
    rows: RowLayout | None
    packing: Packing | None
    pos: Pos
    accepts: tuple[Name, ...] = ()  # `accepts bf16`: narrower types widened exactly on input


# -- statements ---------------------------------------------------------------


@attrs.frozen
class Arg:
    name: Name | None  # keyword, or None for a positional argument
    value: Value
    pos: Pos


@attrs.frozen
class Transform:
    op: Name
    args: tuple[Arg, ...]
    pos: Pos
    text: str  # the statement as written, for comments in generated code


@attrs.frozen
class Condition:
    kind: str  # "true" | "not" | "cmp" | "in"
    name: Name | None  # the tested name (true / not / in, and cmp with a plain name on the left)
    value: Value | None  # the right-hand side (cmp / in)
    pos: Pos
    text: str
    lhs: ExprValue | None = None  # cmp: the left-hand side
    op: str = ""  # cmp: == != < <= > >=


@attrs.frozen
class Import:
    """``import "families.lyt"``: the families another file defines (a path beside the spec)."""

    path: StrValue
    pos: Pos


@attrs.frozen
class RoleDef:
    """``weight(t: fp4x2[..., N, KB]) { ... }``: how a family packs tensors of one role. ``axes`` names
    the trailing axes (None stands for ``...``, the leading ones); the names are sizes in the body."""

    role: Name
    tensor: Name
    elem: Name | None
    axes: tuple[Name | None, ...] | None
    body: tuple[Any, ...]
    pos: Pos


@attrs.frozen
class FamilyDef:
    """``family NAME(param=default, ...) { role(...) { ... } ... }``: a packing family as data."""

    name: Name
    params: tuple[tuple[Name, int], ...]
    roles: tuple[RoleDef, ...]
    pos: Pos


@attrs.frozen
class If:
    cond: Condition
    then: tuple[Any, ...]
    other: tuple[Any, ...]
    pos: Pos


Statement = Union[SpecName, Requires, Dims, Assume, SizeAssume, Param, TensorDecl, Transform, If, Import, FamilyDef]


@attrs.frozen
class Spec:
    items: tuple[Statement, ...]
    source: str  # normalised text (newline line ends): what positions refer to
    filename: str
    sha256: str = ""  # of the text as given (a file's own bytes)
