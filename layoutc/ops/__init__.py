"""The library of layout primitives.

Adding a primitive is one module with its op classes (``OPS``) plus its tests: the registry
below, ``layoutc ops``, the docs and the editor grammar read the classes; the verifier reads their
:class:`~layoutc.ops.base.Facts`. Packing families are not ops: they are data
(:mod:`layoutc.families`), applied with ``interleave``. Arguments are bound to op instances by
:mod:`layoutc.ops.binder`.
"""

from __future__ import annotations

from . import permute, rearrange, rows, shape, value
from .base import BinderArg, Category, Facts, Inferred, Op, OpTypeError, Requirement, TensorType

MODULES = (rows, shape, rearrange, permute, value)
REGISTRY: dict[str, type[Op]] = {cls.name: cls for module in MODULES for cls in module.OPS}
#: The ops a spec can name (the others are reached as inverses or specialisations).
PUBLIC: dict[str, type[Op]] = {n: c for n, c in REGISTRY.items() if c.public}

#: Statements the compiler expands itself (a family's chain for the tensor's role).
FAMILY_STATEMENTS = ("interleave",)
ALL_NAMES = sorted(set(PUBLIC) | set(FAMILY_STATEMENTS))

__all__ = ["REGISTRY", "PUBLIC", "BinderArg", "Category", "Facts", "Inferred", "Op", "OpTypeError", "Requirement",
           "TensorType"]
