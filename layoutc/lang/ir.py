"""The resolved program's data classes: :class:`Program` and what it is made of.

A :class:`Program` is a spec with its parameters applied and its names checked: typed tensor
declarations (:class:`TensorSpec`, with their :class:`RowLayout` and :class:`Tie`), the statements
(:class:`Statement`) with the run-time :class:`Guard` on optional tensors, size conditions, version
pins and assumptions. These classes are what every later stage (expand, verify, lower, the compiler)
reads; they live apart from the resolver that builds them (:mod:`layoutc.lang.resolver`) so that a
reader of a Program needs none of the resolving machinery.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import attrs

from ..front import ast
from ..algebra import expr as ex
from ..algebra.dtypes import ElemType
from ..front.args import ArgValue



@attrs.frozen
class Tie:
    kind: str  # "scales" | "bias"
    weight: str
    block: int | None  # K elements per scale (scales only)
    pos: ast.Pos
    row_block: int = 1  # weight rows per scale row (128 for 128x128 FP8 block scales)
    k_major: bool = False  # ``along K`` names the axis before the last: weight [E, K, N], scales [E, K/32, N]


@attrs.frozen
class RowLayout:
    """The logical row order a tensor declares: shards stacked or interleaved."""

    kind: str  # "stacked" | "interleaved"
    shards: tuple[str, ...]
    group: int
    pos: ast.Pos

    def __str__(self) -> str:
        if self.kind == "stacked":
            return "[" + "; ".join(self.shards) + "]"
        group = f", group={self.group}" if self.group != 1 else ""
        return f"interleave({', '.join(self.shards)}{group})"


@attrs.frozen
class TensorSpec:
    name: str
    direction: str
    elem: ElemType
    shape: tuple[ex.Expr, ...]
    shape_text: tuple[str, ...]
    optional: bool
    tie: Tie | None
    rows: RowLayout | None
    packing: str | None
    pos: ast.Pos
    divisions: tuple[tuple[ex.Expr, ex.Expr, ast.Pos], ...] = ()
    # trtllm(epilogue_tile=64), F(w=num_warps), F(g=K/32): the kernel's parameters, an int or a size expression
    packing_args: tuple[tuple[str, str, int | ex.Expr, ast.Pos], ...] = ()
    accepts: tuple[ElemType, ...] = ()  # narrower input types widened exactly to elem before the transforms
    # An output declared under size conditions (``if 2*I >= 32 { output ... }``): the variants it holds in.
    guards: tuple[Guard, ...] = ()
    # K-major ([E, K, N], GPTQ-style): K is the axis before the last and the rows are the last. A weight is
    # K-major when its scales say ``along K`` of that axis.
    k_major: bool = False

    def holds_in(self, present: frozenset[str]) -> bool:
        return all((g.key in present) == g.present for g in self.guards)

    @property
    def role(self) -> str:
        if self.tie is None:
            return "weight"
        return "scale" if self.tie.kind == "scales" else "bias"

    def shape_str(self) -> str:
        return "[" + ", ".join(self.shape_text) + "]"

    @property
    def packings(self) -> tuple[str, ...]:
        """The declared kernel packing families (``packing trtllm + sf_128x4``)."""
        return tuple(self.packing.split("+")) if self.packing else ()

    @property
    def packing_text(self) -> str | None:
        """The declared packing with its arguments, as a reviewer compares it (``trtllm(epilogue_tile=128)``)."""
        if self.packing is None:
            return None
        args = [f"{k}={v if isinstance(v, int) else ex.to_str(v, slash=True)}" for f, k, v, _ in self.packing_args
                if f in self.packings]
        return self.packing + (f"({', '.join(args)})" if args else "")


@attrs.frozen
class Guard:
    """A run-time condition a statement depends on: an optional tensor's presence (``if w13_bias``) or
    a size condition (``if I > 128``), by its key (the tensor name or the condition's label)."""

    key: str
    present: bool

    @property
    def tensor(self) -> str:  # the key of a presence guard
        return self.key

    def __str__(self) -> str:
        if self.present:
            return self.key
        return f"not ({self.key})" if " " in self.key else f"not {self.key}"


@attrs.frozen
class SizeCondition:
    """``if I > 128``: decided per call from the bound dims; ``label`` keys its variants."""

    label: str
    lhs: ex.Expr
    op: str
    rhs: ex.Expr
    pos: ast.Pos

    def holds(self, dims: Mapping[str, int]) -> bool:
        return compare(ex.evaluate(self.lhs, dims), self.op, ex.evaluate(self.rhs, dims))


def compare(a: Any, op: str, b: Any) -> bool:
    return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


@attrs.frozen
class Statement:
    op: str
    op_pos: ast.Pos
    tensors: tuple[tuple[str, ast.Pos], ...]
    positional: tuple[tuple[ArgValue, ast.Pos], ...]
    keywords: tuple[tuple[str, ArgValue, ast.Pos], ...]
    guards: tuple[Guard, ...]
    text: str
    pos: ast.Pos

    def applies(self, present: frozenset[str]) -> bool:
        return all((g.tensor in present) == g.present for g in self.guards)


@attrs.frozen
class VersionPin:
    """A `requires LIBRARY OP VERSION` line: the library versions the layout was checked against."""

    library: str
    op: str
    version: str
    pos: ast.Pos

    def __str__(self) -> str:
        return f"{self.library} {self.op} {self.version}"


@attrs.frozen
class Assumption:
    """``assume I % 64 == 0`` (a multiple) or ``assume I >= 128`` (a minimum, ``multiple`` 1)."""

    dim: str
    multiple: int
    pos: ast.Pos
    minimum: int = 1


@attrs.frozen
class SizeAssumption:
    """``assume N != 96``, ``assume 1 <= N <= 65536``, ``assume I < 16 or I >= 64``: ``condition`` (an
    expression of the dims, true (non-zero) for the sizes the spec accepts) as ``text`` says it."""

    text: str
    condition: ex.Expr
    pos: ast.Pos

    def holds(self, dims: Mapping[str, int]) -> bool:
        return bool(ex.evaluate(self.condition, dims))


def comparison(lhs: ex.Expr, op: str, rhs: ex.Expr) -> ex.Expr:
    """``lhs op rhs`` on integers as an expression (non-zero when it holds)."""
    if op == "<":
        return ex.lt(lhs, rhs)
    if op == "<=":
        return ex.lt(lhs, ex.add(rhs, 1))
    if op == ">":
        return ex.lt(rhs, lhs)
    if op == ">=":
        return ex.lt(rhs, ex.add(lhs, 1))
    if op == "==":
        return ex.and_(ex.lt(lhs, ex.add(rhs, 1)), ex.lt(rhs, ex.add(lhs, 1)))
    if op == "!=":
        return ex.add(ex.lt(lhs, rhs), ex.lt(rhs, lhs))
    raise ValueError(f"unknown comparison {op!r}")


def any_of(conditions: Iterable[ex.Expr]) -> ex.Expr:
    """Non-zero when one of ``conditions`` is."""
    out: ex.Expr | None = None
    for c in conditions:
        out = c if out is None else ex.where(out, 1, c)
    return out if out is not None else ex.Const(0)


@attrs.frozen
class Program:
    name: str
    filename: str
    source: str
    params: tuple[tuple[str, Any], ...]
    dims: tuple[str, ...]
    assumptions: tuple[Assumption, ...]
    requires: tuple[VersionPin, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    statements: tuple[Statement, ...]
    sha256: str = ""  # the spec's identity (layoutc.lang.identity): text, imported files, prelude, parameters
    dim_pos: tuple[ast.Pos, ...] = ()  # where each dim is declared
    conditions: tuple[SizeCondition, ...] = ()  # size conditions (run-time branches)
    families: tuple[Any, ...] = ()  # packing families in scope (layoutc.lang.families.Family)
    size_assumptions: tuple[SizeAssumption, ...] = ()  # assume N != 96, ranges, 'or'
    # Further declarations of outputs under size conditions (the first of each name is in ``outputs``).
    conditional_outputs: tuple[TensorSpec, ...] = ()
    text_sha256: str = ""  # of the spec file's own bytes (what sha256sum prints)
    imports: tuple[tuple[str, str], ...] = ()  # (import as written, content sha256), in order

    def output_for(self, name: str, present: frozenset[str]) -> TensorSpec | None:
        """The declaration of output ``name`` in the variant keyed by ``present`` (None where none holds)."""
        return next((o for o in self.outputs + self.conditional_outputs if o.name == name and o.holds_in(present)),
                    None)

    @property
    def assumed(self) -> list[tuple[ex.Expr, int]]:
        """Every ``assume`` line as constraints for :func:`layoutc.algebra.instances.sample_dims`: multiples
        ``(dim, m)`` and conditions ``(condition, 0)``."""
        return [(ex.Var(a.dim), a.multiple) for a in self.assumptions] + [
            (a.condition, 0) for a in self.size_assumptions]

    @property
    def short_filename(self) -> str:
        """The spec file's name without its folder: what generated code and run-time messages say, so
        that a converter does not depend on where its spec was compiled from."""
        return self.filename.replace("\\", "/").rsplit("/", 1)[-1]

    def dim_position(self, dim: str) -> ast.Pos | None:
        return self.dim_pos[self.dims.index(dim)] if dim in self.dims and self.dim_pos else None

    def input(self, name: str) -> TensorSpec:
        return next(t for t in self.inputs if t.name == name)

    def output(self, name: str) -> TensorSpec:
        return next(t for t in self.outputs if t.name == name)

    @property
    def optional_inputs(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs if t.optional)

    @property
    def variant_keys(self) -> tuple[str, ...]:
        """What a variant is keyed by: optional inputs present, size conditions that hold."""
        return self.optional_inputs + tuple(c.label for c in self.conditions)

    def family(self, name: str):
        return next((f for f in self.families if f.name == name), None)

    @property
    def param_values(self) -> dict[str, Any]:
        return dict(self.params)
