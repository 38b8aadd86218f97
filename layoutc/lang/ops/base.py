"""What every layout primitive provides, and the types it works on.

A primitive is a frozen attrs class whose fields are its parameters. It states
its contract in four methods:

* :meth:`Op.infer` -- the output type for an input type, and the divisibility
  the op needs (raises :class:`OpTypeError` for what can never work);
* :meth:`Op.index_map` -- the gather that defines the op (:mod:`layoutc.algebra.indexmap`);
* :meth:`Op.impl` -- the eager torch function it declares (:attr:`Op.eager`, usually from
  :mod:`layoutc.lang.ops.torch_impl`) and its arguments, the reference lowering;
* :meth:`Op.inverse` -- the op that undoes it on its image, or None.

and the facts the verifier reads (:class:`Facts`, declared by every op class in its own body):
whether it changes the *logical* order of rows (a gate/up swap, padding), moves data physically
(reshape, transpose, bit permutations) or changes values/labels (cast, view); whether it acts
along one axis (``dim``), treats that axis as two shards (gate and up), keeps one
tensor-parallel rank's part of it, or moves bits within bytes. The verifier decides from these
facts and from index maps, never from an op's name. Whether a step is part of a kernel *packing*
is not a fact of the op: it is a tag on the step, set when a family's chain is applied
(:mod:`layoutc.lang.families`).
"""

from __future__ import annotations

import enum
from typing import Any, Callable, ClassVar, Mapping

import attrs

from ...algebra import expr as ex
from ...algebra.dtypes import ElemType
from ...algebra.expr import Expr
from ...algebra.indexmap import IndexMap
from .conversion import BitPermutation, Conversion


class Category(enum.Enum):
    LOGICAL = "logical"  # changes which logical row (or K column) is where: swap, deinterleave, pad, shard
    SHAPE = "shape"  # moves data physically: reshape, transpose, rearrange, bit permutations
    VALUE = "value"  # changes values or labels element by element: cast, view, bit fields


@attrs.frozen
class Facts:
    """What an op declares for the verifier (every op class sets ``facts`` in its own body)."""

    category: Category
    on_axis: bool = False  # acts along the one axis its ``dim`` names (and leaves the others alone)
    gate_up: bool = False  # sees that axis as two shards (gate and up) and moves rows between them
    slice: bool = False  # keeps one tensor-parallel rank's part of the axis (``ranks`` > 1: not invertible)
    bits: bool = False  # moves bits within bytes: its index map is bit-level

    def describe(self) -> str:
        """The category and the flags that are set, as ``layoutc ops`` and the README list them."""
        return self.category.value + "".join(f", {f}" for f in ("gate_up", "slice", "bits") if getattr(self, f))


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
    """``value % multiple == 0``, where ``value`` is what the op calls ``what``; with ``multiple`` 0,
    ``value`` is a condition that must hold (``what`` says it in words)."""

    value: Expr
    multiple: int
    what: str  # e.g. "rows" -- the name the op's contract uses for the quantity
    # A condition the op needs on every size (a reshape's element count): check looks for an accepted size
    # that breaks it and refuses the spec there, besides the check on every call.
    everywhere: bool = False

    @property
    def is_condition(self) -> bool:
        return self.multiple == 0

    def holds(self, dims: Mapping[str, int]) -> bool:
        """Whether the requirement is met at ``dims``; the one place that reads both kinds, so that no
        caller divides by the 0 of a condition."""
        value = int(ex.evaluate(self.value, dims))
        return bool(value) if self.is_condition else value % self.multiple == 0


@attrs.frozen
class BinderArg:
    """An argument an op accepts that is not one of its fields: its ``specialize`` turns it into
    fields (``permute_bits(word=32, src=FORMULA)`` into a ``table``)."""

    name: str
    metadata: dict = attrs.field(hash=False)
    default: Any = None


@attrs.frozen
class Inferred:
    type: TensorType
    requires: tuple[Requirement, ...] = ()


class Op:
    """Base class of the primitives (concrete ops are ``@attrs.frozen`` subclasses)."""

    name: ClassVar[str]
    facts: ClassVar[Facts]
    #: The eager torch function :meth:`impl` calls (``staticmethod(torch_impl.f)``, or a function of the op's
    #: own module): converters carry a copy under its name, so that name is reserved (no dim may shadow it).
    eager: ClassVar[Callable[..., Any]]
    summary: ClassVar[str] = ""
    #: For the README's op table (``make docs``, from this registry): more on what it does (an example, the
    #: library function it stands for) and the sizes it needs, in words; the checks themselves are infer's.
    notes: ClassVar[str] = ""
    needs: ClassVar[str] = ""
    binder_args: ClassVar[tuple] = ()  # arguments that are not fields (see BinderArg)
    public: ClassVar[bool] = True  # a spec can name it (else it is reached as an inverse or specialisation)
    #: Argument sets ``layoutc infer`` tries for this op when it searches row permutations, in order,
    #: and where the op's moves come in the search (lower first): empty for ops it does not try.
    search: ClassVar[tuple[dict, ...]] = ()
    search_rank: ClassVar[int] = 0

    @property
    def category(self) -> Category:
        return self.facts.category

    def axis(self, t: TensorType) -> int | None:
        """The axis an ``on_axis`` op acts along, for a tensor of type ``t`` (non-negative); None for
        every other op. An ``on_axis`` op has a ``dim`` field (tests/ops/test_registry.py)."""
        return self.dim % t.rank if self.facts.on_axis and t.rank else None

    @property
    def ranks(self) -> int:
        """Tensor-parallel ranks a ``slice`` op divides its axis among (1 for every other op)."""
        return 1

    @property
    def parts(self) -> int:
        """Equal parts of its axis the op treats separately (gate and up: 2; 1 for every other op)."""
        return 1

    def word_permutation(self) -> "BitPermutation | None":
        """For a bit-level op that permutes the bits within words of consecutive bytes along the last
        axis: its :class:`~layoutc.lang.ops.conversion.BitPermutation`."""
        return None

    def keeps_bytes(self) -> bool:
        """For a bit-level op: its output's bytes are its input's, in order (a view across element
        widths: ``u8[.., 4k] <-> i32[.., k]``), so a lowering may read both as the same bytes."""
        return False

    def conversion(self) -> "Conversion | None":
        """For a value op: what it does to each element (:mod:`layoutc.lang.ops.conversion`), the typed
        data the lowerings emit code from. A value op that declares none cannot be lowered."""
        return None

    @classmethod
    def specialize(cls, values: dict, t: TensorType) -> "Op":
        """The op for these bound arguments and this input type (an op name can stand for a
        family of classes, e.g. ``view`` changing the element width)."""
        return cls(**values)

    def infer(self, t: TensorType) -> Inferred:
        raise NotImplementedError

    def index_map(self, t: TensorType) -> IndexMap:
        raise NotImplementedError

    def impl(self, t: TensorType) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """The eager function (:attr:`eager`) and its arguments for an input of type ``t``."""
        raise NotImplementedError

    def inverse(self, t: TensorType) -> Op | None:
        return None

    @property
    def bit_level(self) -> bool:
        return self.facts.bits

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
    from ...algebra.indexmap import out_vars

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
