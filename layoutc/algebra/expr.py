"""Integer index expressions: the arithmetic that index maps are written in.

An index map says, for every output coordinate, which input coordinate it reads.
Those coordinates are integer expressions over two kinds of variables:

* coordinate variables (``o0, o1, ...``), one per output axis, and
* dimension symbols (``E, I, H``) that are bound when a converter sees real tensors.

The node set is deliberately small, the same one tinygrad's index rewrite and
Triton's integer arithmetic use::

    Const(7)  Var("I")  a + b  a * b  a // b  a % b  a < b  a & b  where(c, a, b)  table(T, i)

plus ``a / b``, the *exact* division sizes are written with (``H/32``): it evaluates
like ``//`` but, its divisibility being checked separately, reads as a rational.

Constructors (``add``, ``mul``, ``floordiv``, ...) fold constants and apply only
rules that hold for every integer value, e.g. ``(64*x + y) // 64 == x + y // 64``.
Rules that need to know a variable's range (``r // 2I == 0`` when ``r < 2I``) live
in :func:`simplify`, which takes the ranges explicitly.

Expressions evaluate on Python ints or, element-wise, on integer torch tensors
(:func:`evaluate`), print readably (:func:`to_str`) or as Python source
(:func:`to_python`), and reduce to rational linear forms when they are linear
(:func:`linear_form`), which is how shapes are compared and divisibility proved.
"""

from __future__ import annotations

# One name for importers (``from layoutc import expr as ex``): the nodes, constructors and
# printing (expr_core), evaluation (expr_eval), ranges and linear forms (expr_ranges).
from .expr_core import ExprLike, Expr, Const, Var, Add, Mul, FloorDiv, Div, Mod, Lt, And, Where, Table, TRUE, as_expr, add, mul, floordiv, div, mod, lt, and_, where, table, ceil_div, round_up, children, rebuild, replace_subexpr, free_vars, substitute, to_str, to_python, to_torch, to_triton, rename
from .expr_eval import evaluate
from .expr_ranges import Bounds, bounds, simplify, LinearForm, linear_form, from_linear_form, same_value, SymBounds, sym_bounds, always_at_most, simplify_symbolic, coordinate_ranges
