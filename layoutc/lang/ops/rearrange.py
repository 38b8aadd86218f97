"""``rearrange``: reshape, reorder and regroup axes in one readable step (einops notation).

    rearrange(t, "... (rb ms f) (kb g) -> ... rb kb f (ms g)", ms=4, f=16, g=4)

Each side lists the axes; ``(a b)`` is one axis made of two (``a`` outer, row-major); ``...`` stands
for the leading axes left as they are (experts). Sizes come from the input shape: in every group
on the left at most one name has no size given, and it is the axis size divided by the others
(an exact division the converter checks). The right side uses the same names, each once.

The index map is ``reshape`` to the names, ``permute`` to the right side's order, ``reshape`` to
its groups: a chain of the building blocks of :mod:`layoutc.algebra.indexmap`, so composed maps simplify
the same way. The inverse is the same pattern read right to left.
"""

from __future__ import annotations

import re
from typing import Callable, ClassVar

import attrs

from ...algebra import expr as ex
from ...algebra.indexmap import IndexMap, compose_all, permute_map, reshape_map
from . import torch_impl
from .base import Category, Facts, Inferred, Op, OpTypeError, Requirement, TensorType

_TOKEN = re.compile(r"\s*(\.\.\.|\(|\)|[A-Za-z_][A-Za-z0-9_]*|\S)")


@attrs.frozen
class Pattern:
    """One side of a pattern: whether it starts with ``...`` and its axes as groups of names."""

    rest: bool
    groups: tuple[tuple[str, ...], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for g in self.groups for n in g)

    def __str__(self) -> str:
        parts = ["..."] if self.rest else []
        parts += [g[0] if len(g) == 1 else "(" + " ".join(g) + ")" for g in self.groups]
        return " ".join(parts)


def _side(text: str, where: str) -> Pattern:
    tokens = [m.group(1) for m in _TOKEN.finditer(text)]
    if "".join(tokens) != "".join(text.split()):
        raise OpTypeError(f"cannot read the {where} side of the pattern: {text.strip()!r}")
    rest, groups, i = False, [], 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "...":
            if groups or rest:
                raise OpTypeError("'...' stands for the leading axes: it comes first on each side")
            rest = True
        elif tok == "(":
            close = tokens.index(")", i) if ")" in tokens[i:] else -1
            if close < 0:
                raise OpTypeError(f"unclosed '(' on the {where} side")
            inner = tokens[i + 1:close]
            if not inner or any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", t) for t in inner):
                raise OpTypeError(f"a group holds axis names: {' '.join(tokens[i:close + 1])}")
            groups.append(tuple(inner))
            i = close
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", tok):
            groups.append((tok,))
        else:
            raise OpTypeError(f"unexpected {tok!r} on the {where} side of the pattern")
        i += 1
    return Pattern(rest, tuple(groups))


def parse_pattern(pattern: str) -> tuple[Pattern, Pattern]:
    if pattern.count("->") != 1:
        raise OpTypeError(f"a rearrange pattern is 'left -> right', got {pattern!r}")
    left, right = (_side(s, w) for s, w in zip(pattern.split("->"), ("left", "right")))
    if left.rest != right.rest:
        raise OpTypeError("'...' must be on both sides or on neither")
    for side, what in ((left, "left"), (right, "right")):
        dup = next((n for n in side.names if side.names.count(n) > 1), None)
        if dup:
            raise OpTypeError(f"axis {dup!r} appears twice on the {what} side")
    if set(left.names) != set(right.names):
        only = sorted(set(left.names) ^ set(right.names))
        raise OpTypeError(f"both sides must name the same axes; {', '.join(only)} on one side only")
    return left, right


@attrs.frozen
class Rearrange(Op):
    pattern: str = attrs.field(metadata={"kind": "str"})
    sizes: tuple[tuple[str, ex.Expr], ...] = attrs.field(default=(), metadata={"kind": "sizes"})

    name: ClassVar[str] = "rearrange"
    eager: ClassVar[Callable] = staticmethod(torch_impl.rearrange)
    facts: ClassVar[Facts] = Facts(Category.SHAPE)
    summary: ClassVar[str] = "reshape, reorder and regroup axes: \"... (a b) c -> ... b (a c)\", a=2"
    notes: ClassVar[str] = "einops notation; `...` the leading axes"
    needs: ClassVar[str] = "the named sizes divide"

    def args_str(self) -> str:
        # as a spec writes it: rearrange(t, "... (a b) c -> ...", a=2)
        return ", ".join([repr(self.pattern).replace("'", '"')] + [f"{k}={ex.to_str(v)}" for k, v in self.sizes])

    def __attrs_post_init__(self):
        left, _ = parse_pattern(self.pattern)
        unknown = sorted({k for k, _ in self.sizes} - set(left.names))
        if unknown:
            raise OpTypeError(f"{unknown[0]}= is not an axis of the pattern {self.pattern!r}")

    def _solve(self, t: TensorType):
        """(lead shape, size of each name, requirements) for an input of type ``t``."""
        left, right = parse_pattern(self.pattern)
        given = dict(self.sizes)
        if len(left.groups) > t.rank or (not left.rest and len(left.groups) != t.rank):
            raise OpTypeError(f"the pattern's left side {left} has {len(left.groups)} axes; the tensor {t} has "
                              f"{t.rank}" + ("" if left.rest else " (start the pattern with '...' to keep leading axes)"))
        lead = t.shape[: t.rank - len(left.groups)]
        sizes: dict[str, ex.Expr] = {}
        reqs = []
        for group, axis in zip(left.groups, t.shape[len(lead):]):
            unknown = [n for n in group if n not in given]
            if len(unknown) > 1:
                raise OpTypeError(f"in ({' '.join(group)}) give the size of all but one axis "
                                  f"({', '.join(unknown)} have none)")
            known = ex.mul(*(given[n] for n in group if n in given)) if len(group) > len(unknown) else ex.Const(1)
            for n in group:
                if n in given:
                    sizes[n] = given[n]
            if unknown:
                sizes[unknown[0]] = ex.div(axis, known)
                if isinstance(known, ex.Const) and known.value > 1:  # a spec gives integers; an inverse, sizes
                    reqs.append(Requirement(axis, known.value, f"({' '.join(group)})"))
            elif ex.same_value(known, axis) is False:
                raise OpTypeError(f"({' '.join(group)}) has {ex.to_str(known)} elements but the axis has "
                                  f"{ex.to_str(axis)}")
        return lead, sizes, reqs, left, right

    def infer(self, t: TensorType) -> Inferred:
        lead, sizes, reqs, _, right = self._solve(t)
        shape = tuple(lead) + tuple(ex.mul(*(sizes[n] for n in g)) for g in right.groups)
        return Inferred(attrs.evolve(t, shape=shape), tuple(reqs))

    def _plan(self, t: TensorType):
        lead, sizes, _, left, right = self._solve(t)
        split = tuple(lead) + tuple(sizes[n] for n in left.names)
        k = len(lead)
        perm = tuple(range(k)) + tuple(k + left.names.index(n) for n in right.names)
        out = tuple(lead) + tuple(ex.mul(*(sizes[n] for n in g)) for g in right.groups)
        return split, perm, out

    def index_map(self, t: TensorType) -> IndexMap:
        split, perm, out = self._plan(t)
        return compose_all([reshape_map(t.shape, split), permute_map(split, perm),
                            reshape_map(tuple(split[i] for i in perm), out)])

    def impl(self, t: TensorType):
        split, perm, out = self._plan(t)
        return self.eager, (split, perm, out)

    def inverse(self, t: TensorType) -> Op:
        _, sizes, _, left, right = self._solve(t)
        flipped = f"{right} -> {left}"
        return Rearrange(flipped, tuple((n, sizes[n]) for n in right.names))


OPS = (Rearrange,)
