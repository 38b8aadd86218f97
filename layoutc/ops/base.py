"""What every layout primitive provides, and the types it works on.

A primitive is a frozen attrs class whose fields are its parameters. It states
its contract in four methods:

* :meth:`Op.infer` -- the output type for an input type, and the divisibility
  the op needs (raises :class:`OpTypeError` for what can never work);
* :meth:`Op.index_map` -- the gather that defines the op (:mod:`layoutc.indexmap`);
* :meth:`Op.impl` -- the eager torch function (:mod:`layoutc.ops.torch_impl`) and
  its arguments, the reference lowering;
* :meth:`Op.inverse` -- the op that undoes it on its image, or None.

and one classification used by the verifier: ``category`` says whether the op
changes the *logical* order of rows (a gate/up swap), is a *packing* owned by one
kernel family (a swizzle), reshapes, or changes values/labels (cast/view).
"""

from __future__ import annotations

import enum
from typing import Any, Callable, ClassVar

import attrs

from .. import expr as ex
from ..dtypes import ElemType
from ..expr import Expr
from ..indexmap import IndexMap


class Category(enum.Enum):
    LOGICAL = "logical"  # changes which logical row is where (swap, deinterleave, pad)
    PACKING = "packing"  # physical layout owned by a kernel family (swizzle, sm90 interleave)
    SHAPE = "shape"  # reshape / transpose
    VALUE = "value"  # cast (values) and view (bit relabel)


class OpTypeError(Exception):
    """An op cannot apply to a tensor of this type; the message says why."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


@attrs.frozen
class TensorType:
    elem: ElemType
    shape: tuple[Expr, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    def shape_str(self) -> str:
        return "[" + ", ".join(ex.to_str(s) for s in self.shape) + "]"

    def __str__(self) -> str:
        return f"{self.elem.name}{self.shape_str()}"


@attrs.frozen
class Requirement:
    """``value % multiple == 0``, where ``value`` is what the op calls ``what``."""

    value: Expr
    multiple: int
    what: str  # e.g. "rows" -- the name the op's contract uses for the quantity


@attrs.frozen
class WordForm:
    """A bit-level packing seen as 32-bit little-endian words (for fused lowering).

    Output word ``o`` (coordinates over ``word_shape``) is formed from four input bytes, byte
    ``t`` at input coordinates ``sources[t]`` (expressions in the word coordinates), then its
    bits are permuted: ``out_bit[i] = in_bit[table[i]]``."""

    word_shape: tuple[Expr, ...]
    sources: tuple[tuple[Expr, ...], ...]
    table: tuple[int, ...]


@attrs.frozen
class Inferred:
    type: TensorType
    requires: tuple[Requirement, ...] = ()


class Op:
    """Base class of the primitives (concrete ops are ``@attrs.frozen`` subclasses)."""

    name: ClassVar[str]
    category: ClassVar[Category]
    family: ClassVar[str | None] = None  # kernel family of a packing
    summary: ClassVar[str] = ""

    def infer(self, t: TensorType) -> Inferred:
        raise NotImplementedError

    def index_map(self, t: TensorType) -> IndexMap:
        raise NotImplementedError

    def impl(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        raise NotImplementedError

    def inverse(self, t: TensorType) -> Op | None:
        return None

    @property
    def bit_level(self) -> bool:
        return False

    @property
    def is_identity(self) -> bool:
        """True when the op leaves every tensor as it is (e.g. one tensor-parallel rank of one):
        the compiler drops it, so it costs nothing and reads as no step."""
        return False

    def args_str(self) -> str:
        fields = attrs.fields(type(self))
        return ", ".join(f"{f.name}={_fmt_arg(getattr(self, f.name))}" for f in fields)

    def __str__(self) -> str:
        return f"{self.name}({self.args_str()})"


def _fmt_arg(v: Any) -> str:
    if isinstance(v, Expr):
        return ex.to_str(v)
    if isinstance(v, ElemType):
        return v.name
    if isinstance(v, tuple):
        return "[" + ", ".join(_fmt_arg(x) for x in v) + "]"
    return str(v).lower() if isinstance(v, bool) else str(v)


# ---------------------------------------------------------------------------
# helpers shared by the ops


def check_dim(t: TensorType, dim: int) -> int:
    if not -t.rank <= dim < t.rank:
        raise OpTypeError(f"dim={dim} is out of range for a rank-{t.rank} tensor {t}")
    return dim % t.rank


def require_multiple(t: TensorType, dim: int, multiple: int, what: str) -> Requirement:
    return Requirement(t.shape[dim], multiple, what)


def along(t: TensorType, dim: int, src_of_axis: Expr, size: Expr | None = None) -> IndexMap:
    """A map that changes only axis ``dim``: ``src_of_axis`` is written in ``o{dim}``."""
    from ..indexmap import out_vars

    coords = list(out_vars(t.rank))
    coords[dim] = src_of_axis
    out_shape = list(t.shape)
    if size is not None:
        out_shape[dim] = size
    return IndexMap(t.shape, tuple(out_shape), tuple(coords))


def with_shape(t: TensorType, dim: int, size: Expr) -> TensorType:
    shape = list(t.shape)
    shape[dim] = size
    return attrs.evolve(t, shape=tuple(shape))
