"""The library of layout primitives.

Adding a primitive is one module with its op classes (``OPS``) plus its tests: the registry
below, ``layoutc ops``, the docs and the editor grammar read the classes; the verifier reads their
:class:`~layoutc.lang.ops.base.Facts`. Packing families are not ops: they are data
(:mod:`layoutc.lang.families`), applied with ``interleave``. Arguments are bound to op instances by
:mod:`layoutc.lang.ops.binder`.
"""

from __future__ import annotations

import importlib
import pkgutil

from ...front.names import CODEGEN
from .base import BinderArg, Category, Facts, Inferred, Op, OpTypeError, Requirement, TensorType

#: The package's own machinery; every other module defines ``OPS``.
_INFRASTRUCTURE = frozenset({"base", "binder", "conversion", "torch_impl"})
#: The modules of primitives, found rather than listed (a new primitive is one new module), sorted by
#: name so that the registry's order does not depend on the file system.
MODULES = tuple(importlib.import_module(f"{__name__}.{info.name}")
                for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name)
                if info.name not in _INFRASTRUCTURE)
REGISTRY: dict[str, type[Op]] = {cls.name: cls for module in MODULES for cls in module.OPS}
#: The ops a spec can name (the others are reached as inverses or specialisations).
PUBLIC: dict[str, type[Op]] = {n: c for n, c in REGISTRY.items() if c.public}



def generated_names() -> frozenset[str]:
    """Every name generated converters use that a dim could shadow: the code generator's own
    (:data:`layoutc.front.names.CODEGEN`) and the eager function of every registered op, which converters
    carry under its name. Read from the registry when called, so an op registered later is seen."""
    return CODEGEN | {cls.eager.__name__ for cls in REGISTRY.values()}


#: Statements the compiler expands itself (a family's chain for the tensor's role).
FAMILY_STATEMENTS = ("interleave",)
ALL_NAMES = sorted(set(PUBLIC) | set(FAMILY_STATEMENTS))

__all__ = ["REGISTRY", "PUBLIC", "generated_names", "BinderArg", "Category", "Facts", "Inferred", "Op", "OpTypeError",
           "Requirement", "TensorType"]
