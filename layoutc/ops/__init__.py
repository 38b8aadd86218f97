"""The library of layout primitives and the binder from spec arguments to op instances."""

from __future__ import annotations

import difflib
from typing import Any, Mapping, Sequence

import attrs

from .. import expr as ex
from ..dtypes import ELEMENT_TYPES
from . import rows, shape, sm90, swizzle, value
from .base import Category, Inferred, Op, OpTypeError, Requirement, TensorType

REGISTRY: dict[str, type[Op]] = {
    cls.name: cls for module in (rows, sm90, swizzle, shape, value) for cls in module.OPS
}

#: ``interleave(x, <family>)`` picks the packing of that kernel family for x's role.
INTERLEAVE_FAMILIES: dict[str, dict[str, type[Op]]] = {
    "sm90_mixed": {"weight": sm90.Sm90InterleaveWeights, "scale": sm90.Sm90FoldScales},
    "sf_128x4": {"scale": swizzle.Swizzle128x4},
}

ALL_NAMES = sorted(set(REGISTRY) | {"interleave"})

__all__ = [
    "REGISTRY",
    "Category",
    "Inferred",
    "Op",
    "OpTypeError",
    "Requirement",
    "TensorType",
    "BindError",
    "bind",
    "describe_signature",
]


class BindError(Exception):
    """Bad arguments for an op; ``arg`` is the offending argument: a positional
    index (0 = first argument after the tensor), a keyword name, or None."""

    def __init__(self, message: str, arg: int | str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.arg = arg
        self.hint = hint


@attrs.frozen
class ArgValue:
    """An argument as the binder sees it (the parser's values, positions stripped)."""

    kind: str  # "expr" | "str" | "bool" | "list"
    value: Any  # Expr | str | bool | tuple[ArgValue, ...]
    text: str


def suggest(name: str, choices: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def describe_signature(cls: type[Op]) -> str:
    parts = []
    for f in attrs.fields(cls):
        default = "" if f.default is attrs.NOTHING else f"={_fmt_default(f.default)}"
        parts.append(f"{f.name}{default}")
    return f"{cls.name}(tensor{''.join(', ' + p for p in parts)})"


def _fmt_default(v: Any) -> str:
    return "none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _convert(field: attrs.Attribute, arg: ArgValue, rank: int, dims: set[str], index: int | str) -> Any:
    kind = field.metadata.get("kind", "int")
    where = f"{field.name}={arg.text}"
    if kind in ("int", "dim"):
        if arg.kind != "expr" or not isinstance(arg.value, ex.Const):
            raise BindError(f"{field.name} must be an integer, got {arg.text}", index)
        v = arg.value.value
        if kind == "dim":
            if not -rank <= v < rank:
                raise BindError(f"{where} is out of range for a rank-{rank} tensor", index)
            return v % rank
        if v < field.metadata.get("min", -(1 << 62)):
            raise BindError(f"{field.name} must be at least {field.metadata['min']}, got {v}", index)
        return v
    if kind == "expr":
        if arg.kind != "expr":
            raise BindError(f"{field.name} must be a size expression, got {arg.text}", index)
        unknown = ex.free_vars(arg.value) - dims
        if unknown:
            raise BindError(f"{field.name}={arg.text} uses undeclared dim {sorted(unknown)[0]!r}", index)
        return arg.value
    if kind == "shape":
        if arg.kind != "list":
            raise BindError(f"{field.name} must be a list of sizes like [E, 2*I, H/2], got {arg.text}", index)
        items = []
        for item in arg.value:
            if item.kind != "expr":
                raise BindError(f"{field.name}: {item.text} is not a size expression", index)
            unknown = ex.free_vars(item.value) - dims
            if unknown:
                raise BindError(f"{field.name}: {item.text} uses undeclared dim {sorted(unknown)[0]!r}", index)
            items.append(item.value)
        return tuple(items)
    if kind == "dtype":
        name = arg.value.name if arg.kind == "expr" and isinstance(arg.value, ex.Var) else arg.value
        if not isinstance(name, str) or name not in ELEMENT_TYPES:
            raise BindError(
                f"{arg.text} is not an element type; known: {', '.join(ELEMENT_TYPES)}",
                index,
                suggest(str(name), list(ELEMENT_TYPES)),
            )
        return ELEMENT_TYPES[name]
    if kind == "bool":
        if arg.kind != "bool":
            raise BindError(f"{field.name} must be true or false, got {arg.text}", index)
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
    if name == "interleave":
        return _bind_interleave(positional, keywords, tensor, role, dims)
    cls = REGISTRY.get(name)
    if cls is None:
        raise BindError(f"unknown operation {name!r}", None, suggest(name, ALL_NAMES) or f"operations: {', '.join(ALL_NAMES)}")
    fields = attrs.fields(cls)
    values: dict[str, Any] = {}
    if len(positional) > len(fields):
        raise BindError(
            f"{name}() takes {len(fields)} argument(s) after the tensor but {len(positional)} were given",
            None,
            f"signature: {describe_signature(cls)}",
        )
    for i, (field, arg) in enumerate(zip(fields, positional)):
        values[field.name] = _convert(field, arg, tensor.rank, dims, i)
    by_name = {f.name: f for f in fields}
    for key, arg in keywords.items():
        field = by_name.get(key)
        if field is None:
            raise BindError(
                f"{name}() has no parameter {key!r}",
                key,
                suggest(key, list(by_name)) or f"signature: {describe_signature(cls)}",
            )
        if key in values:
            raise BindError(f"{name}() got {key!r} twice", key)
        values[key] = _convert(field, arg, tensor.rank, dims, key)
    missing = [f.name for f in fields if f.default is attrs.NOTHING and f.name not in values]
    if missing:
        raise BindError(f"{name}() is missing {', '.join(missing)}", None, f"signature: {describe_signature(cls)}")
    try:
        return cls(**values)
    except OpTypeError as err:
        raise BindError(err.message, None, err.hint) from None


def _bind_interleave(positional, keywords, tensor, role, dims) -> Op:
    if keywords:
        key = next(iter(keywords))
        raise BindError(f"interleave() takes only a kernel family, not {key}=", key)
    if len(positional) != 1 or positional[0].kind != "expr" or not isinstance(positional[0].value, ex.Var):
        raise BindError(
            "interleave(tensor, family) needs one kernel family name",
            None,
            f"families: {', '.join(INTERLEAVE_FAMILIES)}",
        )
    family = positional[0].value.name
    table = INTERLEAVE_FAMILIES.get(family)
    if table is None:
        raise BindError(
            f"unknown kernel family {family!r} for interleave",
            0,
            suggest(family, list(INTERLEAVE_FAMILIES)) or f"families: {', '.join(INTERLEAVE_FAMILIES)}",
        )
    kind = "scale" if role == "scale" else "weight"
    cls = table.get(kind)
    if cls is None:
        roles = " and ".join(f"{k}s" for k in table)
        raise BindError(f"interleave(..., {family}) packs {roles}, and this tensor is a {role}", 0)
    return cls()
