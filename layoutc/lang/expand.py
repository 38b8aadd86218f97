"""A statement becomes the ops it applies to one tensor: one primitive, or a family's chain.

``pad(t, dim=1, multiple=64)`` binds to one op. ``interleave(t, sm90_mixed)`` looks up the family,
picks the body of ``t``'s role (a tie makes a tensor a scale or a bias; a weight otherwise),
binds the role's axis names to ``t``'s trailing sizes and the family's parameters to their values,
and binds each statement of the body in turn, against the type the previous one produced. Every
op it yields carries a :class:`PackingTag` (which family, which parameters, which role, which
application): the verifier's notion of "packing" comes from these tags, never from op names.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

import attrs

from ..front import ast
from ..algebra import expr as ex
from ..front.args import ArgValue
from ..front.errors import suggest
from .families import Family, Role
from .ir import Program, Statement
from .ops import FAMILY_STATEMENTS, Op, TensorType
from .ops.binder import BindError, bind


@attrs.frozen
class PackingTag:
    """A step that is part of a kernel packing: ``family(args)`` applied to a tensor of ``role``."""

    family: str
    args: tuple[tuple[str, int], ...]  # every parameter of the family, as applied
    role: str
    instance: tuple[int, int]  # the applying statement's position: one application of the family
    origin: str  # the family's statement that made this step, with its file and line
    axes: tuple[tuple[str, ex.Expr], ...] = ()  # the role's axis names and the sizes they stand for

    def axis_name(self, size: ex.Expr) -> str | None:
        """The role's name for a size (``rows`` for ``2*I``), to word requirements the way the family does."""
        return next((n for n, e in self.axes if ex.same_value(e, size)), None)

    @property
    def key(self) -> tuple[str, tuple[tuple[str, int], ...]]:
        return self.family, self.args


class NeedCondition(Exception):
    """A family's ``if`` tests a size (``if rows >= 32`` with rows = 2*I): the compiler adds ``condition``
    to the spec's size conditions (a run-time branch, one more variant key) and builds again."""

    def __init__(self, condition):
        super().__init__(condition.label)
        self.condition = condition


class ExpandError(Exception):
    """A statement that cannot apply to this tensor: ``arg`` as in :class:`BindError`."""

    def __init__(self, message: str, arg: int | str | None = None, hint: str | None = None,
                 related: tuple[tuple[str, ast.Pos], ...] = ()):
        super().__init__(message)
        self.message, self.arg, self.hint, self.related = message, arg, hint, related


def statement_ops(st: Statement, t: Callable[[], TensorType], role: str, dims: set[str],
                  program: Program, present: frozenset[str] = frozenset()) -> Iterator[tuple[Op, PackingTag | None]]:
    """The ops ``st`` applies to a tensor of ``role``; ``t()`` is the tensor's type before the next one
    (the caller infers each op before asking for the next). ``present``: the variant's keys, which decide
    a family's conditions on sizes."""
    positional = [a for a, _ in st.positional]
    keywords = {k: a for k, a, _ in st.keywords}
    if st.op not in FAMILY_STATEMENTS:
        try:
            yield bind(st.op, positional, keywords, t(), role, dims), None
        except BindError as err:
            raise ExpandError(err.message, err.arg, err.hint) from None
        return
    yield from _family_ops(st, t, role, dims, program, positional, keywords, present)


def _family_ops(st, t, role, dims, program, positional, keywords, present=frozenset()):
    if len(positional) != 1 or positional[0].kind != "expr" or not isinstance(positional[0].value, ex.Var):
        known = ", ".join(f.name for f in program.families)
        raise ExpandError(f"{st.op}(tensor, FAMILY, param=value, ...) needs one family name", None,
                          f"families: {known}")
    name = positional[0].value.name
    family = program.family(name)
    if family is None:
        known = [f.name for f in program.families]
        raise ExpandError(f"unknown packing family {name!r}", 0, suggest(name, known) or f"families: {', '.join(known)}")
    body = family.role(role)
    if body is None:
        packs = " and ".join(f"{r}s" for r in family.role_names)
        raise ExpandError(f"interleave(..., {name}) packs {packs}, and this tensor is a {role}", 0,
                          f"a tensor's role comes from its tie: 'scales W block N' makes a scale, 'bias of W' a "
                          f"bias; {name} is defined at {family.where()}")
    params = dict(family.params)
    for key, arg in keywords.items():
        if key not in params:
            raise ExpandError(f"family {name} has no parameter {key!r}", key,
                              suggest(key, list(params)) or f"parameters of {name}: {', '.join(params) or 'none'}")
        unknown = sorted(ex.free_vars(arg.value) - set(dims)) if arg.kind == "expr" else []
        if arg.kind != "expr" or unknown:
            raise ExpandError(f"{key} must be an integer or a size expression of the dims, got {arg.text}", key,
                              f"{unknown[0]!r} is neither a dim nor an integer parameter" if unknown else None)
        params[key] = arg.value.value if isinstance(arg.value, ex.Const) else arg.value
    start = t()
    if body.elem is not None and start.elem.name != body.elem:
        raise ExpandError(f"{name} packs {role}s of type {body.elem}; this one is {start.elem.name}", 0)
    local = _bind_axes(body, start, name)
    args = tuple(sorted(params.items()))
    instance = (st.pos.line, st.pos.column)
    axes = tuple((k, v) for k, v in local.items() if k != "...")
    applied = False
    for item, op in _body_ops(family, body, params, local, t, role, dims, program, present):
        origin = f"{family.where(item.pos)}: {' '.join(item.text.split())}"
        applied = True
        yield op, PackingTag(name, args, role, instance, origin, axes)
    if not applied:  # the family leaves tensors of these sizes as they are (``if rows >= 32 {...}``): still applied
        yield None, PackingTag(name, args, role, instance, f"{family.where(body.pos)}: no step for these sizes", axes)


def _bind_axes(body: Role, t: TensorType, family: str) -> dict[str, Any]:
    """The role's axis names -> the tensor's sizes; ``...`` -> the leading sizes (a tuple)."""
    if body.axes is None:
        return {}
    named = [a for a in body.axes if a is not None]
    rest = None in body.axes
    if t.rank < len(named) or (not rest and t.rank != len(named)):
        want = "[" + ", ".join("..." if a is None else a for a in body.axes) + "]"
        raise ExpandError(f"{family} packs {body.role}s shaped {want}; this one is {t}", 0)
    lead = t.shape[: t.rank - len(named)]
    out: dict[str, Any] = dict(zip(named, t.shape[len(lead):]))
    out["..."] = tuple(lead)
    return out


def _body_ops(family: Family, body: Role, params: Mapping[str, Any], local: Mapping[str, Any],
              t: Callable[[], TensorType], role: str, dims: set[str], program: Program | None = None,
              present: frozenset[str] = frozenset()):
    consts = {k: ex.as_expr(v) for k, v in params.items()}
    consts.update({k: v for k, v in local.items() if k != "..."})
    for item in _walk(body.body, consts, family, dims, program, present):
        if item.op.text in FAMILY_STATEMENTS:  # item.op is an ast.Name
            raise ExpandError(f"a family's body applies primitives, not another family ({family.where(item.pos)})")
        if not item.args or item.args[0].name is not None or item.args[0].value.text != body.tensor:
            raise ExpandError(f"{family.where(item.pos)}: the first argument of each statement of {family.name}'s "
                              f"{role} body is {body.tensor}")
        positional, keywords = [], {}
        for a in item.args[1:]:
            v = _value(a.value, consts, local.get("..."), family, item)
            if a.name is None:
                positional.append(v)
            else:
                keywords[a.name.text] = v
        try:
            op = bind(item.op.text, positional, keywords, t(), role, dims)
        except BindError as err:
            raise ExpandError(f"{family.where(item.pos)} ({family.name}, {role}): {err.message}", 0, err.hint) from None
        yield item, op


def _walk(items, env: Mapping[str, ex.Expr], family: Family, dims=frozenset(), program=None, present=frozenset()):
    for item in items:
        if isinstance(item, ast.Transform):
            yield item
        elif isinstance(item, ast.If):
            branch = item.then if _decide(item.cond, env, family, dims, program, present) else item.other
            yield from _walk(branch, env, family, dims, program, present)


def _decide(cond: ast.Condition, env: Mapping[str, ex.Expr], family: Family, dims=frozenset(), program=None,
            present: frozenset[str] = frozenset()) -> bool:
    """A condition in a family body, on the family's parameters and the sizes its role binds (``if rows >= 32``).
    Decided when the family is applied where parameters decide it; a condition left on the dims is a run-time
    branch of the spec (a size condition keyed by its label, as ``if 2*I >= 32`` at top level)."""
    where = family.where(cond.pos)
    if cond.kind != "cmp" or not isinstance(cond.value, ast.ExprValue):
        raise ExpandError(f"{where}: a family's conditions compare its parameters or the sizes its role names: "
                          f"if {cond.text.strip()}")
    a, b = ex.substitute(cond.lhs.expr, env), ex.substitute(cond.value.expr, env)
    from .ir import SizeCondition, compare

    if isinstance(a, ex.Const) and isinstance(b, ex.Const):
        return compare(a.value, cond.op, b.value)
    unknown = sorted((ex.free_vars(a) | ex.free_vars(b)) - set(dims))
    if unknown or program is None:
        name = unknown[0] if unknown else sorted(ex.free_vars(a) | ex.free_vars(b))[0]
        raise ExpandError(f"{where}: {name!r} in a family's condition is not one of its parameters nor a size its "
                          f"role names")
    label = f"{ex.to_str(a, slash=True)} {cond.op} {ex.to_str(b, slash=True)}"
    if not any(c.label == label for c in program.conditions):
        raise NeedCondition(SizeCondition(label, a, cond.op, b, cond.pos))
    return label in present


def _value(v: ast.Value, consts: Mapping[str, ex.Expr], lead, family: Family, item) -> ArgValue:
    """An argument of a family's statement with the family's parameters and axis names filled in."""
    if isinstance(v, ast.ExprValue):
        return ArgValue("expr", ex.substitute(v.expr, consts), v.text)
    if isinstance(v, ast.StrValue):
        return ArgValue("str", v.value, v.text)
    if isinstance(v, ast.BoolValue):
        return ArgValue("bool", v.value, v.text)
    if isinstance(v, ast.EllipsisValue):
        raise ExpandError(f"{family.where(item.pos)}: '...' goes inside a shape list: [..., R, C]")
    items: list[ArgValue] = []
    for i in v.items:
        if isinstance(i, ast.EllipsisValue):
            if lead is None:
                raise ExpandError(f"{family.where(item.pos)}: '...' needs the role's axes named with it: "
                                  f"{item.op.text}(t[..., R, C])")
            items += [ArgValue("expr", e, ex.to_str(e)) for e in lead]
        else:
            items.append(_value(i, consts, lead, family, item))
    return ArgValue("list", tuple(items), v.text)


@attrs.frozen
class AppliedStep:
    op: Op
    in_type: TensorType
    out_type: TensorType
    tag: PackingTag


def family_chain(family: str, role: str, t: TensorType, params: Mapping[str, int] | None = None,
                 dims: set[str] | frozenset[str] = frozenset(), families=None) -> list[AppliedStep]:
    """The steps ``interleave(t, family, **params)`` applies to a tensor of this type and role, outside any
    spec (tests and tools run a family by itself). ``families`` defaults to the prelude's."""
    from .families import prelude

    program = Program("family", "<family>", "", (), tuple(sorted(dims)), (), (), (), (), (),
                      families=tuple(families or prelude()))
    keywords = tuple((k, ArgValue("expr", ex.Const(v), str(v)), None) for k, v in (params or {}).items())
    st = Statement("interleave", None, (("t", None),), ((ArgValue("expr", ex.Var(family), family), None),),
                   keywords, (), f"interleave(t, {family})", ast.Pos(0, 0, 0, 0))
    out, current = [], [t]
    for op, tag in statement_ops(st, lambda: current[0], role, set(dims), program):
        if op is None:
            continue
        after = op.infer(current[0]).type
        out.append(AppliedStep(op, current[0], after, tag))
        current[0] = after
    return out
