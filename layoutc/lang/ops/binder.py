"""Binding a statement's arguments to an op instance: ``pad(t, dim=1, multiple=64)`` -> ``Pad(...)``.

Each op field says how its argument is read (``metadata["kind"]``): an integer, an axis
(``dim``, negative counted from the end), a size expression in the dims, a formula in the op's
own variables, a list of sizes or integers, a string, an element type. ``BinderArg`` entries of
an op class take arguments that are not fields; its ``specialize`` turns them into fields.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import attrs

from ...algebra import expr as ex
from ...front.args import ArgValue
from ...algebra.dtypes import ELEMENT_TYPES
from ...front.errors import suggest
from . import ALL_NAMES, PUBLIC
from .base import Op, OpTypeError, TensorType


class BindError(Exception):
    """Bad arguments for an op; ``arg`` is the offending argument: a positional
    index (0 = first argument after the tensor), a keyword name, or None."""

    def __init__(self, message: str, arg: int | str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.arg = arg
        self.hint = hint


def _arg_name(f: attrs.Attribute) -> str:
    """The keyword a field is written with in a spec (``inverse=`` for ``inverse_src``)."""
    return f.metadata.get("arg", f.name)


def describe_signature(cls: type[Op]) -> str:
    parts = []
    for f in list(attrs.fields(cls)) + list(cls.binder_args):
        if f.metadata.get("kind") == "sizes":
            parts.append("NAME=size...")
            continue
        default = "" if f.default is attrs.NOTHING else f"={_fmt_default(f.default)}"
        parts.append(f"{_arg_name(f)}{default}")
    return f"{cls.name}(tensor{''.join(', ' + p for p in parts)})"


def _fmt_default(v: Any) -> str:
    return "none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _int(arg: ArgValue, name: str, index: int | str) -> int:
    if arg.kind != "expr" or not isinstance(arg.value, ex.Const):
        raise BindError(f"{name} must be an integer, got {arg.text}", index)
    return arg.value.value


def _convert(field: attrs.Attribute, arg: ArgValue, rank: int, dims: set[str], index: int | str) -> Any:
    kind = field.metadata.get("kind", "int")
    name = _arg_name(field)
    where = f"{name}={arg.text}"
    if kind in ("int", "dim"):
        v = _int(arg, name, index)
        if kind == "dim":
            if not -rank <= v < rank:
                raise BindError(f"{where} is out of range for a rank-{rank} tensor", index)
            return v % rank
        if v < field.metadata.get("min", -(1 << 62)):
            raise BindError(f"{name} must be at least {field.metadata['min']}, got {v}", index)
        return v
    if kind == "expr":
        if arg.kind != "expr":
            raise BindError(f"{name} must be a size expression, got {arg.text}", index)
        unknown = ex.free_vars(arg.value) - dims
        if unknown:
            raise BindError(f"{name}={arg.text} uses undeclared dim {sorted(unknown)[0]!r}", index)
        return arg.value
    if kind == "formula":
        if arg.kind != "expr":
            raise BindError(f"{name} must be a formula, got {arg.text}", index)
        own = set(field.metadata["vars"])
        clash = sorted(own & dims)
        if clash:
            raise BindError(f"{name}={arg.text}: {clash[0]!r} is this formula's own variable but also a dim",
                            index, "rename the dim")
        unknown = ex.free_vars(arg.value) - dims - own
        if unknown:
            raise BindError(f"{name}={arg.text} uses {sorted(unknown)[0]!r}, which is neither a dim nor one of "
                            f"{', '.join(sorted(own))}", index)
        return arg.value
    if kind == "shape":
        if arg.kind != "list":
            raise BindError(f"{name} must be a list of sizes like [E, 2*I, H/2], got {arg.text}", index)
        items = []
        for item in arg.value:
            if item.kind == "ellipsis":
                raise BindError(f"{name}: '...' stands for a family role's leading axes; outside a family give "
                                f"every size", index)
            if item.kind != "expr":
                raise BindError(f"{name}: {item.text} is not a size expression", index)
            unknown = ex.free_vars(item.value) - dims
            if unknown:
                raise BindError(f"{name}: {item.text} uses undeclared dim {sorted(unknown)[0]!r}", index)
            items.append(item.value)
        return tuple(items)
    if kind == "table":
        if arg.kind != "list" or any(i.kind != "expr" or not isinstance(i.value, ex.Const) for i in arg.value):
            raise BindError(f"{name} must be a list of integers, got {arg.text}", index)
        return tuple(i.value.value for i in arg.value)
    if kind == "str":
        if arg.kind != "str":
            raise BindError(f"{name} must be a string (\"...\"), got {arg.text}", index)
        return arg.value
    if kind == "dtype":
        type_name = arg.value.name if arg.kind == "expr" and isinstance(arg.value, ex.Var) else arg.value
        if not isinstance(type_name, str) or type_name not in ELEMENT_TYPES:
            raise BindError(
                f"{arg.text} is not an element type; known: {', '.join(ELEMENT_TYPES)}",
                index,
                suggest(str(type_name), list(ELEMENT_TYPES)),
            )
        return ELEMENT_TYPES[type_name]
    if kind == "bool":
        if arg.kind != "bool":
            raise BindError(f"{name} must be true or false, got {arg.text}", index)
        return arg.value
    raise AssertionError(f"unknown parameter kind {kind}")  # pragma: no cover


def bind(
    name: str,
    positional: Sequence[ArgValue],
    keywords: Mapping[str, ArgValue],
    tensor: TensorType,
    role: str,
    dims: set[str],
) -> Op:
    """The op instance ``name(tensor, *positional, **keywords)`` for a tensor of this type and role."""
    cls = PUBLIC.get(name)
    if cls is None:
        raise BindError(f"unknown operation {name!r}", None, suggest(name, ALL_NAMES) or f"operations: {', '.join(ALL_NAMES)}")
    fields = [f for f in attrs.fields(cls) if f.metadata.get("kind") != "sizes"] + list(cls.binder_args)
    sizes_field = next((f for f in attrs.fields(cls) if f.metadata.get("kind") == "sizes"), None)
    values: dict[str, Any] = {}
    if len(positional) > len(fields):
        raise BindError(
            f"{name}() takes {len(fields)} argument(s) after the tensor but {len(positional)} were given",
            None,
            f"signature: {describe_signature(cls)}",
        )
    for i, (field, arg) in enumerate(zip(fields, positional)):
        values[field.name] = _convert(field, arg, tensor.rank, dims, i)
    by_name = {_arg_name(f): f for f in fields}
    sizes = []
    for key, arg in keywords.items():
        field = by_name.get(key)
        if field is None and sizes_field is not None:
            v = _int(arg, key, key)
            if v < 1:
                raise BindError(f"the size of axis {key} must be positive, got {v}", key)
            sizes.append((key, ex.Const(v)))
            continue
        if field is None:
            raise BindError(
                f"{name}() has no parameter {key!r}",
                key,
                suggest(key, list(by_name)) or f"signature: {describe_signature(cls)}",
            )
        if field.name in values:
            raise BindError(f"{name}() got {key!r} twice", key)
        values[field.name] = _convert(field, arg, tensor.rank, dims, key)
    if sizes_field is not None:
        values[sizes_field.name] = tuple(sizes)
    missing = [_arg_name(f) for f in fields if f.default is attrs.NOTHING and f.name not in values]
    if missing:
        raise BindError(f"{name}() is missing {', '.join(missing)}", None, f"signature: {describe_signature(cls)}")
    try:
        return cls.specialize(values, tensor)
    except OpTypeError as err:
        raise BindError(err.message, None, err.hint) from None
    except TypeError as err:  # a keyword a specialisation does not take
        raise BindError(f"{name}(): {err}", None, f"signature: {describe_signature(cls)}") from None
